#!/usr/bin/python3
"""PyTorch peer benchmark: training throughput of the same GPT-2 / LLaMA as meshtrain, on CPU.

Usage (Debian's python3-torch; only /usr/bin/python3 has torch):

    /usr/bin/python3 tools/bench_torch.py CONFIG [--batch 4] [--seq 256] [--dtype fp32|bf16]
        [--threads 2] [--steps 5] [--warmup 2] [--json] [--dropout]

CONFIG is a Hugging Face config.json (model_type 'gpt2' or 'llama'); the model comes from
tools/torch_models.py (Hugging Face layouts, plain matmul/masked_fill/softmax attention, as a
PyTorch 1.13 user would write it), initialised like Hugging Face. Training uses random tokens and
targets, torch.optim.AdamW(lr=1e-4) with the installed default foreach behaviour, fp32 master
weights; --dtype bf16 wraps forward+loss in torch.autocast("cpu", dtype=torch.bfloat16).
A timed step is forward + backward + optimizer step + zero_grad; --warmup steps run untimed first.
Prints tokens/s, or with --json one JSON object:
{"tokens_per_s", "step_seconds", "dtype", "threads", "batch", "seq", "peak_rss_bytes"}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models as tm  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("config", help="Hugging Face config.json")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--dropout", action="store_true",
                    help="train with the config's dropout keys (embd_pdrop, resid_pdrop, attn_pdrop / "
                         "attention_dropout) through torch's own F.dropout, where Hugging Face applies them")
    args = ap.parse_args()
    if args.batch < 1 or args.seq < 1 or args.threads < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("need --batch, --seq, --threads, --steps >= 1 and --warmup >= 0")

    torch.set_num_threads(args.threads)
    cfg = tm.load_config(args.config)
    limit = cfg.get("n_positions") or cfg.get("max_position_embeddings")
    if limit is not None and args.seq > limit:
        ap.error(f"--seq {args.seq} exceeds the model's {limit} positions")

    torch.manual_seed(args.seed)
    model = tm.build_model(cfg).float()
    tm.init_hf(model)
    model.train()
    if args.dropout:
        tm.DROPOUT = tm.TorchDropout()
    vocab = cfg["vocab_size"]
    tokens = torch.randint(0, vocab, (args.batch, args.seq))
    targets = torch.randint(0, vocab, (args.batch, args.seq))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def autocast():
        if args.dtype == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step() -> float:
        with autocast():
            loss = tm.lm_loss(model(tokens), targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    for _ in range(args.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    elapsed = time.perf_counter() - t0

    step_s = elapsed / args.steps
    tok_s = args.batch * args.seq / step_s
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    if args.json:
        print(json.dumps({
            "tokens_per_s": tok_s, "step_seconds": step_s, "dtype": args.dtype,
            "threads": args.threads, "batch": args.batch, "seq": args.seq,
            "peak_rss_bytes": peak_rss,
        }))
    else:
        n_params = sum(p.numel() for p in model.parameters())
        print(f"torch {torch.__version__} {cfg.get('model_type')} {n_params / 1e6:.1f}M params "
              f"{args.dtype} threads={args.threads} batch={args.batch} seq={args.seq}: "
              f"{tok_s:.1f} tokens/s, {step_s:.3f} s/step, last loss {loss:.4f}, "
              f"peak RSS {peak_rss / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
