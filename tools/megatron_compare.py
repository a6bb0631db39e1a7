#!/usr/bin/env python3
"""The planner against published large-scale runs (issue 14): `meshtrain plan --cluster` predicts the
step of each published row's layout, and the per-GPU TFLOP/s it implies is set against the published
figure, both counted the same way (Megatron's model FLOPs: every GEMM of the forward and backward,
attention's scores as if not causal, no recompute).

--table sc21 (DGX A100 80GB): Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM" (SC'21), Table 1, weak scaling. tp and pp as published,
dp = GPUs / (tp pp), 1F1B, recompute, ZeRO 0, the micro-batch split chosen by --search-batch within the
devices' memory. The count is the paper's own, F = 96 B s l h^2 (1 + s / 6h + V / 16lh) per iteration.

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
import subprocess
import sys

CLUSTERS = {"sc21": "configs/clusters/dgx-a100-80gb.json", "llama3": "configs/clusters/dgx-h100.json"}
# Which predicted step is the published run's. Megatron-LM of SC'21 (its default `--DDP-impl local`)
# all-reduces the gradients after the whole forward-backward (train_step's
# 'backward-params-all-reduce'), so nothing moves them beside the backward: the step without
# progress. Llama 3's sharded data parallelism overlaps its reductions: the step with it (the same
# figure for these pipelined rows, whose reduction follows the last micro-batch).
STEP = {"sc21": "step_s", "llama3": "step_progress_s"}

# (config, GPUs, published TFLOP/s per GPU); the configs carry the model, tp, pp and the batch.
SC21 = [("configs/megatron/gpt-1.7b.json", 32, 137), ("configs/megatron/gpt-3.6b.json", 64, 138),
        ("configs/megatron/gpt-7.5b.json", 128, 142), ("configs/megatron/gpt-18.4b.json", 256, 135),
        ("configs/megatron/gpt-39.1b.json", 512, 138), ("configs/megatron/gpt-76.1b.json", 1024, 140),
        ("configs/megatron/gpt-145.6b.json", 1536, 148), ("configs/megatron/gpt-310.1b.json", 1920, 155),
        ("configs/megatron/gpt-529.6b.json", 2520, 163), ("configs/megatron/gpt-1008b.json", 3072, 163)]
# Table 4's third row (16,384 GPUs, context parallelism 16, sequences of 131,072) has no counterpart:
# the runtime has no context parallelism.
LLAMA3 = [("configs/llama3/llama3-405b.json", 8192, 430), ("configs/llama3/llama3-405b.json", 16384, 400)]


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


def plan(a, path, gpus, extra):
    out = subprocess.run([a.meshtrain, "plan", path, "--cluster", CLUSTERS[a.table], "--procs", str(gpus), "--search-batch",
                          "--top", "1000", "--json"] + extra, capture_output=True, text=True)
    if out.returncode != 0:
        return None, out.stderr.strip().replace("meshtrain: error: ", "")
    # The fastest split by the table's step (the search's own order breaks near-ties by memory).
    ranked = sorted(json.loads(out.stdout).get("ranked", []), key=lambda r: r[STEP[a.table]])
    return (ranked[0] if ranked else None), ""


def fastest(a, path, gpus, variants):
    """The fastest predicted of the variants (lists of plan arguments), within the devices' memory if
    any fits, else over it (timed with an unbounded budget). Returns (best, over, variant, why)."""
    for over, budget in ((False, []), (True, ["--memory", "1048576"])):
        found, why = [], ""
        for v in variants:
            best, err = plan(a, path, gpus, v + budget)
            if best is not None:
                found.append((best[STEP[a.table]], best, v))
            elif err:
                why = err
        if found:
            found.sort(key=lambda t: t[0])
            return found[0][1], over, found[0][2], ""
    return None, False, None, why


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", default="build/ci/meshtrain")
    ap.add_argument("--table", choices=sorted(CLUSTERS), default="sc21")
    ap.add_argument("--cluster", help="another description than the table's (a what-if)")
    ap.add_argument("--check", metavar="DOC", help="fail unless every line printed (the rows and the summary) is in DOC "
                    "verbatim: the published page and the planner agree")
    a = ap.parse_args()
    if a.cluster:
        CLUSTERS[a.table] = a.cluster
    rows = SC21 if a.table == "sc21" else LLAMA3
    count = sc21_flops if a.table == "sc21" else llama_flops
    # The published schedule: 1F1B for SC'21; for Llama 3 an interleaved one, virtual stages unknown.
    variants = [[]] if a.table == "sc21" else [
        ["--set", "parallel.pipeline_schedule=1f1b", "--set", "parallel.virtual_stages=1"]] + [
        ["--set", "parallel.pipeline_schedule=interleaved", "--set", f"parallel.virtual_stages={v}"] for v in (2, 4)]
    lines = []

    def emit(line):
        lines.append(line)
        print(line)

    emit("| model | tp x pp x dp | GPUs | batch | chosen split | our memory a GPU | predicted step | predicted TFLOP/s a GPU | published | error |")
    emit("|---|---|---|---|---|---|---|---|---|---|")
    errors = []
    for path, gpus, published in rows:
        cfg = json.load(open(path))
        tp, pp, B = cfg["parallel"]["tp"], cfg["parallel"].get("pp", 1), cfg["train_batch_size"]
        best, over, variant, why = fastest(a, path, gpus, variants)
        if best is None:
            emit(f"| {path} | {tp} x {pp} x {gpus // tp // pp} | {gpus} | {B} | our runtime refuses it: {why} | | | | {published} | |")
            continue
        step = best[STEP[a.table]]
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
