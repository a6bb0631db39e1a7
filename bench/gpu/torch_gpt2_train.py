#!/usr/bin/env python3
"""The peer a user would pick: GPT-2 training in PyTorch on the same GPU, for meshtrain's
`bench --device cuda`. GPT-2 124M (HF's architecture: tied head, gelu tanh, LayerNorm eps 1e-5),
bf16 autocast, scaled_dot_product_attention (flash), fused AdamW, gradient clipping 1.0; eager and
torch.compile. Prints one JSON line per mode: median step time and tokens/s over timed steps.

Usage: torch_gpt2_train.py [--batch 16] [--seq 1024] [--steps 20] [--modes eager,compile]
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(s, C, NH):
        super().__init__()
        s.NH = NH
        s.ln_1 = nn.LayerNorm(C, eps=1e-5)
        s.c_attn = nn.Linear(C, 3 * C)
        s.c_proj = nn.Linear(C, C)
        s.ln_2 = nn.LayerNorm(C, eps=1e-5)
        s.c_fc = nn.Linear(C, 4 * C)
        s.mlp_proj = nn.Linear(4 * C, C)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.c_attn(s.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.NH, C // s.NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + s.mlp_proj(F.gelu(s.c_fc(s.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, V=50257, P=1024, C=768, L=12, NH=12):
        super().__init__()
        s.wte = nn.Embedding(V, C)
        s.wpe = nn.Embedding(P, C)
        s.h = nn.ModuleList([Block(C, NH) for _ in range(L)])
        s.ln_f = nn.LayerNorm(C, eps=1e-5)
        for n, p in s.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if n.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(s, idx, targets):
        T = idx.shape[1]
        x = s.wte(idx) + s.wpe(torch.arange(T, device=idx.device))
        for b in s.h:
            x = b(x)
        logits = F.linear(s.ln_f(x), s.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def run(mode, args):
    torch.manual_seed(0)
    dev = "cuda"
    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if mode == "compile" else model
    x = torch.randint(0, 50257, (args.batch, args.seq), device=dev)
    y = torch.roll(x, -1, 1)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    s = statistics.median(times)
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"peer": f"pytorch {torch.__version__} {mode}", "batch": args.batch, "seq": args.seq,
                      "params": n, "step_seconds": s, "tokens_per_s": args.batch * args.seq / s,
                      "loss": float(loss), "peak_bytes": torch.cuda.max_memory_allocated()}), flush=True)
    del model, opt, fwd
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--modes", default="eager,compile")
    args = ap.parse_args()
    for m in args.modes.split(","):
        run(m, args)


if __name__ == "__main__":
    main()
