#!/usr/bin/env python3
"""The PyTorch peer of `meshtrain serve`'s decoding: GPT-2 (tools/torch_models.py, Hugging Face's
definition) with a KV cache, greedy, f32, eager, as Hugging Face's generate() runs it on a CPU:
a prompt is prefilled, then each step runs the new token of every sequence in the batch through
the model, appending keys and values to the cache. Prints decode tokens/s for each batch size
(all sequences in a batch at the same position, the best case for a static batch).

  /usr/bin/python3 tools/decode_peer.py configs/models/gpt2-124m.json --batch 1,8 --prompt 16 --decode 32 --threads 2
"""
from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

from torch_models import GPT2LMHeadModel, gelu_new, init_hf, load_config


@torch.no_grad()
def step(model, tokens, pos0, cache):
    """Runs tokens (B, t) at positions [pos0, pos0 + t); cache[l] = (k, v) of (B, nh, pos0, hs)."""
    tr = model.transformer
    b, t = tokens.shape
    pos = torch.arange(pos0, pos0 + t).unsqueeze(0)
    x = tr.wte(tokens) + tr.wpe(pos)
    for l, blk in enumerate(tr.h):
        a = blk.attn
        q, k, v = a.c_attn(blk.ln_1(x)).split(a.n_embd, dim=2)
        q, k, v = a._split_heads(q), a._split_heads(k), a._split_heads(v)
        if cache[l] is not None:
            k = torch.cat([cache[l][0], k], dim=2)
            v = torch.cat([cache[l][1], v], dim=2)
        cache[l] = (k, v)
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(a.head_dim)
        if t > 1:
            w = w.masked_fill(~a.bias[:, :, pos0:pos0 + t, :pos0 + t], torch.finfo(w.dtype).min)
        y = torch.matmul(F.softmax(w, dim=-1), v).permute(0, 2, 1, 3).reshape(b, t, a.n_embd)
        x = x + a.c_proj(y)
        x = x + blk.mlp.c_proj(gelu_new(blk.mlp.c_fc(blk.ln_2(x))))
    h = tr.ln_f(x[:, -1:, :])
    return F.linear(h, tr.wte.weight)[:, -1, :]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--decode", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = load_config(args.config)
    model = GPT2LMHeadModel(cfg)
    init_hf(model)
    model.eval()
    out = []
    for B in [int(b) for b in args.batch.split(",")]:
        prompt = torch.randint(0, cfg["vocab_size"], (B, args.prompt))
        cache = [None] * cfg["n_layer"]
        logits = step(model, prompt, 0, cache)  # warm-up prefill
        cache = [None] * cfg["n_layer"]
        logits = step(model, prompt, 0, cache)
        t0 = time.perf_counter()
        for i in range(args.decode):
            nxt = logits.argmax(dim=-1, keepdim=True)
            logits = step(model, nxt, args.prompt + i, cache)
        dt = time.perf_counter() - t0
        out.append({"batch": B, "decode_tokens_per_s": B * args.decode / dt, "ms_per_step": dt / args.decode * 1e3})
        print(f"torch {torch.__version__} batch {B}: {B * args.decode / dt:.1f} tokens/s "
              f"({dt / args.decode * 1e3:.1f} ms a step)", flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
