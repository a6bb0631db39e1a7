#!/usr/bin/env python3
"""The planner against published large-scale runs (issue 14): `meshtrain plan --cluster` predicts the
step of each published row's layout, and the per-GPU TFLOP/s it implies is set against the published
figure, both counted the same way (Megatron's model FLOPs: every GEMM of the forward and backward,
attention's scores as if not causal, no recompute).

--table sc21 (DGX A100 80GB): Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM" (SC'21), Table 1, weak scaling, as the paper's scripts ran it
(Megatron-LM's examples/sc21/run_table_1.sh and CONFIG.sh): tp, pp, the micro-batch and the
interleaved schedule's layers per virtual stage by row, dp = GPUs / (tp pp), full recompute,
Megatron's dropout (0.1) and clip-grad 1.0, ZeRO 0. The scripts' fp16 (static loss scale) is priced
as bf16, at the same tensor-core rate and bytes. The step is the one with the gradient all-reduce
beside the backward for the rows run with torch DDP (--DDP-impl torch, the first four), and the one
without it for those run with Megatron's local DDP, which reduced after the whole forward and backward.
The count is the paper's own, F = 96 B s l h^2 (1 + s / 6h + V / 16lh) per iteration.

--table llama3 (DGX H100): "The Llama 3 Herd of Models" (Meta, 2024), Table 4, the 405B pre-training
layouts without context parallelism: tp 8, pp 16, dp = GPUs / 128, sequences of 8192, 16M tokens a
step, bf16, no activation checkpointing, an interleaved schedule whose virtual stages the paper does
not give (each of 1, 2 and 4 is planned and the fastest taken, as the micro-batch split is). The
count is NVIDIA's formula for this model (NeMo's Llama 3.1 405B recipe): per token
12 l h^2 (1 + g/a + s/h) + 18 l F h + 6 V h, with the model's 8 KV heads (2.15e16 per sequence; the
recipe's text writes g/a = 16/128, 2.17e16). Meta does not give its own.

Where our runtime needs more memory than the published run fits in, the row is timed anyway and its
memory column says "over".
Usage: tools/megatron_compare.py [--meshtrain build/ci/meshtrain] [--table sc21|llama3] [--cluster FILE] [--check DOC]"""
import argparse
import json
import os
import subprocess
import sys

CLUSTERS = {"sc21": "configs/clusters/dgx-a100-80gb.json", "llama3": "configs/clusters/dgx-h100.json"}
# Which predicted step is the published run's. Llama 3's sharded data parallelism overlaps its
# reductions: the step with it (the same figure for these pipelined rows, whose reduction follows
# the last micro-batch). SC'21: by row (below). torch DDP all-reduces buckets as the backward
# passes them: the step with progress. Megatron's local DDP all-reduced the gradients after the
# whole forward-backward (train_step's 'backward-params-all-reduce'): the step without.
STEP = {"llama3": "step_progress_s", "torch": "step_progress_s", "local": "step_s"}

# (config, GPUs, published TFLOP/s per GPU, --DDP-impl); the configs carry the model, tp, pp, the
# micro-batch, the virtual stages and the batch, as run_table_1.sh gives them.
SC21 = [("configs/megatron/gpt-1.7b.json", 32, 137, "torch"), ("configs/megatron/gpt-3.6b.json", 64, 138, "torch"),
        ("configs/megatron/gpt-7.5b.json", 128, 142, "torch"), ("configs/megatron/gpt-18.4b.json", 256, 135, "torch"),
        ("configs/megatron/gpt-39.1b.json", 512, 138, "local"), ("configs/megatron/gpt-76.1b.json", 1024, 140, "local"),
        ("configs/megatron/gpt-145.6b.json", 1536, 148, "local"), ("configs/megatron/gpt-310.1b.json", 1920, 155, "local"),
        ("configs/megatron/gpt-529.6b.json", 2520, 163, "local"), ("configs/megatron/gpt-1008b.json", 3072, 163, "local")]
# Table 4's third row (16,384 GPUs, context parallelism 16, sequences of 131,072) has no counterpart:
# the runtime has no context parallelism.
LLAMA3 = [("configs/llama3/llama3-405b.json", 8192, 430, "llama3"), ("configs/llama3/llama3-405b.json", 16384, 400, "llama3")]


def sc21_flops(cfg):
    m = cfg["model"]
    h, l, V, s, B = m["n_embd"], m["n_layer"], m["vocab_size"], cfg["seq_length"], cfg["train_batch_size"]
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)), f"{(12 * l * h * h + (V + s) * h) / 1e9:.1f}B (h {h}, l {l})"


def llama_flops(cfg):
    m = cfg["model"]
    h, l, V, F = m["hidden_size"], m["num_hidden_layers"], m["vocab_size"], m["intermediate_size"]
    a, g, s, B = m["num_attention_heads"], m["num_key_value_heads"], cfg["seq_length"], cfg["train_batch_size"]
    per_token = 12 * l * h * h * (1 + g / a + s / h) + 18 * l * F * h + 6 * V * h
    params = (l * (2 * h * h + 2 * h * h * g // a + 3 * h * F) + 2 * V * h) / 1e9
    return B * s * per_token, f"{params:.1f}B (h {h}, l {l})"


def plan(a, path, gpus, extra, step):
    out = subprocess.run([a.meshtrain, "plan", path, "--cluster", CLUSTERS[a.table], "--procs", str(gpus), "--search-batch",
                          "--top", "1000", "--json"] + extra, capture_output=True, text=True)
    if out.returncode != 0:
        return None, out.stderr.strip().replace("meshtrain: error: ", "")
    # The fastest split by the table's step (the search's own order breaks near-ties by memory).
    ranked = sorted(json.loads(out.stdout).get("ranked", []), key=lambda r: r[step])
    return (ranked[0] if ranked else None), ""


def as_published(a, path, gpus, cfg):
    """The configuration's own layout and split, priced (SC'21: the scripts give them). Returns
    (prediction, over the devices' memory, why)."""
    out = subprocess.run([a.meshtrain, "plan", path, "--cluster", CLUSTERS[a.table], "--procs", str(gpus), "--json"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return None, False, out.stderr.strip().replace("meshtrain: error: ", "")
    best = json.loads(out.stdout)
    dp = gpus // cfg["parallel"]["tp"] // cfg["parallel"].get("pp", 1)
    best["micro_batch"] = cfg["train_micro_batch_size_per_gpu"]
    best["accumulation"] = cfg["train_batch_size"] // dp // best["micro_batch"]
    memory = json.load(open(CLUSTERS[a.table]))["memory_gib"]
    return best, best["memory_bytes"] > memory * 2**30, ""


def fastest(a, path, gpus, variants, step):
    """The fastest predicted of the variants (lists of plan arguments), within the devices' memory if
    any fits, else over it (timed with an unbounded budget). Returns (best, over, variant, why)."""
    for over, budget in ((False, []), (True, ["--memory", "1048576"])):
        found, why = [], ""
        for v in variants:
            best, err = plan(a, path, gpus, v + budget, step)
            if best is not None:
                found.append((best[step], best, v))
            elif err:
                why = err
        if found:
            found.sort(key=lambda t: t[0])
            return found[0][1], over, found[0][2], ""
    return None, False, None, why


def main():
    ap = argparse.ArgumentParser()
    # The ci build's (scripts/test.sh) or the release preset's (the README's "Build by hand").
    default = next((b for b in ("build/ci/meshtrain", "build/release/meshtrain") if os.path.exists(b)), "build/ci/meshtrain")
    ap.add_argument("--meshtrain", default=default)
    ap.add_argument("--table", choices=sorted(CLUSTERS), default="sc21")
    ap.add_argument("--cluster", help="another description than the table's (a what-if)")
    ap.add_argument("--check", metavar="DOC", help="fail unless every line printed (the rows and the summary) is in DOC "
                    "verbatim: the published page and the planner agree")
    a = ap.parse_args()
    if a.cluster:
        CLUSTERS[a.table] = a.cluster
    rows = SC21 if a.table == "sc21" else LLAMA3
    count = sc21_flops if a.table == "sc21" else llama_flops
    # Llama 3's schedule is an interleaved one, its virtual stages unknown: each is planned.
    variants = [["--set", "parallel.pipeline_schedule=1f1b", "--set", "parallel.virtual_stages=1"]] + [
        ["--set", "parallel.pipeline_schedule=interleaved", "--set", f"parallel.virtual_stages={v}"] for v in (2, 4)]
    lines = []

    def emit(line):
        lines.append(line)
        print(line)

    emit("| model | tp x pp x dp | GPUs | batch | chosen split | our memory a GPU | predicted step | predicted TFLOP/s a GPU | published | error |")
    emit("|---|---|---|---|---|---|---|---|---|---|")
    errors = []
    for path, gpus, published, ddp in rows:
        cfg = json.load(open(path))
        tp, pp, B = cfg["parallel"]["tp"], cfg["parallel"].get("pp", 1), cfg["train_batch_size"]
        if a.table == "sc21":
            best, over, why = as_published(a, path, gpus, cfg)
            v = cfg["parallel"].get("virtual_stages", 1)
            variant = ["--set", "parallel.pipeline_schedule=interleaved", "--set", f"parallel.virtual_stages={v}"] if v > 1 else None
        else:
            best, over, variant, why = fastest(a, path, gpus, variants, STEP[ddp])
        if best is None:
            emit(f"| {path} | {tp} x {pp} x {gpus // tp // pp} | {gpus} | {B} | our runtime refuses it: {why} | | | | {published} | |")
            continue
        step = best[STEP[ddp]]
        flops, name = count(cfg)
        tflops = flops / step / gpus / 1e12
        err = tflops / published - 1
        errors.append(abs(err))
        split = f"B {best['micro_batch']} x {best['accumulation']}"
        if variant and variant[1].endswith("interleaved"):
            split += f", {variant[3].split('=')[1]} virtual stages"
        emit(f"| {name} | {tp} x {pp} x {gpus // tp // pp} | {gpus} | {B} | {split} "
              f"| {best['memory_bytes'] / 2**30:.0f} GiB{' (over)' if over else ''} | {step:.3f} s | {tflops:.0f} | {published} | {100 * err:+.1f}% |")
    if errors:
        errors.sort()
        print()
        n = len(errors)
        median = (errors[(n - 1) // 2] + errors[n // 2]) / 2
        emit(f"median absolute error {100 * median:.1f}% (of {n} rows), worst {100 * errors[-1]:.1f}%")
    if a.check:
        doc = open(a.check).read().splitlines()
        missing = [line for line in lines if line not in doc]
        for line in missing:
            print(f"{a.check} lacks this line of `tools/megatron_compare.py --table {a.table}` (rerun it and update the page):\n  {line}",
                  file=sys.stderr)
        return 1 if missing else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
