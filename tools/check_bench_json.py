#!/usr/bin/env python3
"""End-to-end check of `meshtrain bench --json` on the tiny models: one JSON object with the
documented keys and sane values; and bad input exits 2 with one line. Usage:
check_bench_json.py MESHTRAIN CONFIG_DIR"""
import json
import subprocess
import sys


def main() -> int:
    exe, configs = sys.argv[1], sys.argv[2]
    for model in ("tiny-gpt2", "tiny-llama"):
        for dtype in ("fp32", "bf16", "fp16"):
            out = subprocess.run([exe, "bench", f"{configs}/{model}.json", "--batch", "2", "--seq", "16",
                                  "--dtype", dtype, "--steps", "2", "--warmup", "1", "--json"],
                                 capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            j = json.loads(out.stdout)
            for key in ("tokens_per_s", "tflops", "gemm_ceiling_tflops", "peak_bytes", "loss"):
                assert key in j, f"{model} {dtype}: missing {key}"
            assert j["tokens_per_s"] > 0 and j["gemm_ceiling_tflops"] > 0, j
            assert 3.0 < j["loss"] < 6.0, f"{model} {dtype}: loss {j['loss']} not near ln(V)"
            assert j["peak_bytes"]["activations"] > 0 and j["peak_bytes"]["optimizer"] > 0, j
            print(f"ok {model} {dtype}: {j['tokens_per_s']:.0f} tokens/s loss {j['loss']:.3f}")
    bad = subprocess.run([exe, "bench", f"{configs}/missing.json"], capture_output=True, text=True)
    assert bad.returncode == 2, bad
    assert len(bad.stderr.strip().splitlines()) == 1 and "missing.json" in bad.stderr, bad.stderr
    print("ok missing config: exit 2, one line")
    return 0


if __name__ == "__main__":
    sys.exit(main())
