#!/usr/bin/python3
"""The peer of bench/attention_bench.cpp's documents rows: PyTorch eager attention (Hugging Face's
eager path: scores, masked_fill, softmax, probabilities times values) forward + backward under
Megatron's document mask (reset_attention_mask) or the causal one, f32, B = 1, 12 heads of 64.

Usage (Debian's python3-torch, which has no scaled_dot_product_attention):

    OMP_NUM_THREADS=2 /usr/bin/python3 tools/bench_attention_peer.py [--T 4096] [--docs 2048 512 100]

Prints one line per mask: the median of --reps timed forward + backward passes in ms.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch


def mask_of(T: int, D: int | None) -> torch.Tensor:
    """[T, T] bool, True where a query sees a key: causal, within documents of D tokens if D."""
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    if D is None:
        return causal
    doc = torch.arange(T) // D
    return causal & (doc[:, None] == doc[None, :])


def time_one(T: int, D: int | None, reps: int) -> float:
    g = torch.Generator().manual_seed(1)
    NH, HS = 12, 64
    q, k, v = (torch.rand(1, NH, T, HS, generator=g).mul_(2).sub_(1).requires_grad_() for _ in range(3))
    dout = torch.rand(1, NH, T, HS, generator=g)
    mask = mask_of(T, D)
    times = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(HS)
        w = w.masked_fill(~mask, torch.finfo(w.dtype).min)
        y = torch.matmul(torch.softmax(w, dim=-1), v)
        y.backward(dout)
        times.append(time.perf_counter() - t0)
        q.grad = k.grad = v.grad = None
    return statistics.median(times[1:]) * 1e3  # the first pass warms the allocator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--docs", type=int, nargs="*", default=[2048, 512, 100])
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"causal T={a.T}: {time_one(a.T, None, a.reps):.0f} ms")
    for D in a.docs:
        print(f"documents T={a.T} D={D}: {time_one(a.T, D, a.reps):.0f} ms")


if __name__ == "__main__":
    main()
