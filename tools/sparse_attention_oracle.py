#!/usr/bin/env python3
"""PyTorch oracle of the block-sparse attention (src/kernels/cpu/sparse_attention.h), run by
src/kernels/cpu/sparse_attention_test.cpp as

    /usr/bin/python3 tools/sparse_attention_oracle.py IN OUT

Dense attention in float64 with the elementwise mask expanded from the block layout (and s <= t
when causal); gradients by autograd of loss = sum(out * dout). A query whose mask row is empty gets
out = 0, lse = -inf and no gradient (the kernel's documented convention).

IN (little-endian): int32 B, T, NH, NKV, HS, block, causal, 0; uint8 layout (NH, T/block, T/block)
padded with zeros to a multiple of 4 bytes; float32 qkv (B, T, (NH + 2*NKV) * HS); float32 dout
(B, T, NH * HS).
OUT: float64 out (B, T, NH * HS), lse (B, NH, T), dqkv (B, T, (NH + 2*NKV) * HS).
"""
import array
import math
import struct
import sys

import torch


def floats(data, offset, count):
    a = array.array("f")
    a.frombytes(data[offset:offset + 4 * count])
    return torch.tensor(a, dtype=torch.float64)


def main(path_in, path_out):
    with open(path_in, "rb") as f:
        data = f.read()
    B, T, NH, NKV, HS, block, causal, _ = struct.unpack_from("<8i", data, 0)
    nb = T // block
    offset = 32
    layout = torch.tensor(list(data[offset:offset + NH * nb * nb]), dtype=torch.bool)
    layout = layout.reshape(NH, nb, nb)
    offset += (NH * nb * nb + 3) // 4 * 4
    C3 = (NH + 2 * NKV) * HS
    qkv = floats(data, offset, B * T * C3).reshape(B, T, C3).requires_grad_(True)
    offset += 4 * B * T * C3
    dout = floats(data, offset, B * T * NH * HS).reshape(B, T, NH * HS)

    def heads(x, n):  # (B, T, n*HS) -> (B, n, T, HS)
        return x.reshape(B, T, n, HS).transpose(1, 2)

    group = NH // NKV
    q = heads(qkv[..., :NH * HS], NH)
    k = heads(qkv[..., NH * HS:(NH + NKV) * HS], NKV).repeat_interleave(group, dim=1)
    v = heads(qkv[..., (NH + NKV) * HS:], NKV).repeat_interleave(group, dim=1)

    mask = layout.repeat_interleave(block, dim=1).repeat_interleave(block, dim=2)  # (NH, T, T)
    if causal:
        mask = mask & torch.ones(T, T, dtype=torch.bool).tril()
    empty = ~mask.any(dim=-1)  # (NH, T)
    # Empty rows see everything here (finite softmax), then are zeroed: no NaN reaches autograd.
    visible = mask | empty[..., None]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(HS)
    scores = scores.masked_fill(~visible, -math.inf)
    keep = (~empty)[..., None].to(torch.float64)
    out = (torch.softmax(scores, dim=-1) * keep) @ v  # (B, NH, T, HS)
    lse = torch.logsumexp(scores, dim=-1).masked_fill(empty, -math.inf)
    out = out.transpose(1, 2).reshape(B, T, NH * HS)
    (out * dout).sum().backward()

    with open(path_out, "wb") as f:
        for t in (out, lse, qkv.grad):
            f.write(array.array("d", t.detach().reshape(-1).tolist()).tobytes())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
