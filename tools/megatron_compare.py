#!/usr/bin/env python3
"""The planner against published Megatron-LM runs (issue 14): for each row of Narayanan et al.,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (SC'21), Table 1,
that the cost model can time (pipeline size 1), `meshtrain plan --cluster` predicts the step of
the row's layout (tp as published, dp = GPUs / tp, recompute, ZeRO 0, the micro-batch split chosen by
--search-batch), and the per-GPU TFLOP/s is computed with the paper's own count,
F = 96 B s l h^2 (1 + s / 6h + V / 16lh) per iteration, against the published figure.
Usage: tools/megatron_compare.py [--meshtrain build/ci/meshtrain] [--cluster configs/clusters/dgx-a100-80gb.json]"""
import argparse
import json
import subprocess
import sys

# (config, GPUs, published TFLOP/s per GPU); the configs carry hidden size, layers, heads, tp, batch.
ROWS = [("configs/megatron/gpt-1.7b.json", 32, 137), ("configs/megatron/gpt-3.6b.json", 64, 138),
        ("configs/megatron/gpt-7.5b.json", 128, 142), ("configs/megatron/gpt-18.4b.json", 256, 135)]
# Rows with pipelines (tp x pp together), not in the cost model yet.
NOT_MODELLED = [("39.1B", 8, 2, 512, 138), ("76.1B", 8, 4, 1024, 140), ("145.6B", 8, 8, 1536, 148),
                ("310.1B", 8, 16, 1920, 155), ("529.6B", 8, 35, 2520, 163), ("1008.0B", 8, 64, 3072, 163)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", default="build/ci/meshtrain")
    ap.add_argument("--cluster", default="configs/clusters/dgx-a100-80gb.json")
    a = ap.parse_args()
    print(f"| model | tp x dp | GPUs | batch | chosen split | predicted step | predicted TFLOP/s a GPU | published | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    errors = []
    for path, gpus, published in ROWS:
        cfg = json.load(open(path))
        m = cfg["model"]
        h, l, V, s, B, tp = m["n_embd"], m["n_layer"], m["vocab_size"], cfg["seq_length"], cfg["train_batch_size"], cfg["parallel"]["tp"]
        out = subprocess.run([a.meshtrain, "plan", path, "--cluster", a.cluster, "--procs", str(gpus), "--search-batch",
                              "--top", "1", "--json"], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"| {path} | failed: {out.stderr.strip()} |")
            continue
        best = json.loads(out.stdout)["ranked"][0]
        step = best["step_progress_s"]  # NCCL moves the gradient all-reduce beside the backward
        flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
        tflops = flops / step / gpus / 1e12
        err = tflops / published - 1
        errors.append(abs(err))
        params = (12 * l * h * h + (V + s) * h) / 1e9
        print(f"| {params:.1f}B (h {h}, l {l}) | {tp} x {gpus // tp} | {gpus} | {B} | B {best['micro_batch']} x {best['accumulation']} "
              f"| {step:.3f} s | {tflops:.0f} | {published} | {100 * err:+.1f}% |")
    for name, tp, pp, gpus, published in NOT_MODELLED:
        print(f"| {name} | {tp} x pp {pp} x dp {gpus // tp // pp} | {gpus} | | not modelled (tp x pp) | | | {published} | |")
    if errors:
        errors.sort()
        print(f"\nmedian absolute error {100 * errors[len(errors) // 2]:.1f}% (of {len(errors)} rows), worst {100 * errors[-1]:.1f}%")


if __name__ == "__main__":
    sys.exit(main())
