#!/usr/bin/env python3
"""The peer's side of bench/data_bench.cpp's BM_megatron_order_build: the work Megatron-LM's
GPTDataset does to build its indices for the same corpus (1M sequences of 1-1999 tokens drawn as
the benchmark draws them is not reproduced bit for bit; the sizes are the same), timed here: the
document index's numpy shuffle, the sample index (Megatron's compiled helper when --helpers DIR
holds its helpers_cpp module, built from megatron/core/datasets/helpers.cpp; skipped otherwise),
and the shuffle index's numpy shuffle. Prints seconds per part, the best of --repeat runs.

Usage: bench_megatron_indices.py [--helpers DIR] [--repeat N]
"""
import argparse
import sys
import time

import numpy

parser = argparse.ArgumentParser()
parser.add_argument("--helpers", default="")
parser.add_argument("--repeat", type=int, default=3)
args = parser.parse_args()
helpers = None
if args.helpers:
    sys.path.insert(0, args.helpers)
    import helpers_cpp as helpers  # noqa: E402

T = 2048
sizes = numpy.random.RandomState(7).randint(1, 2000, size=1_000_000).astype(numpy.int32)
tokens = int(sizes.sum())
for tenths in (10, 25):
    samples = int(tokens * tenths / 10) // T
    epochs = 1
    while epochs * tokens < samples * T + 1:
        epochs += 1
    best = {}
    for _ in range(args.repeat):
        rng = numpy.random.RandomState(1234)
        t0 = time.perf_counter()
        doc = numpy.tile(numpy.arange(len(sizes), dtype=numpy.int32), epochs)
        rng.shuffle(doc)
        t1 = time.perf_counter()
        if helpers is not None:
            sample_index = helpers.build_sample_idx_int32(sizes, doc, T, epochs, tokens, True, 1) \
                if hasattr(helpers, "build_sample_idx_int32") else helpers.build_sample_idx(sizes, doc, T, epochs, tokens, True, 1)
            built = sample_index.shape[0] - 1
        else:
            built = (epochs * tokens - 1) // T
        t2 = time.perf_counter()
        order = numpy.arange(built, dtype=numpy.uint32)
        rng.shuffle(order)
        t3 = time.perf_counter()
        for name, secs in (("document shuffle", t1 - t0), ("sample index", t2 - t1), ("sample shuffle", t3 - t2),
                           ("total", t3 - t0)):
            best[name] = min(best.get(name, secs), secs)
    parts = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in best.items())
    print(f"{tenths / 10:.1f} epochs ({samples} samples, {epochs} epoch(s) built): {parts}"
          + ("" if helpers is not None else " (sample index not timed: no --helpers)"))
