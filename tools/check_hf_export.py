#!/usr/bin/python3
"""Loads a `meshtrain export --hf` directory into the Hugging Face-faithful PyTorch models of
tools/torch_models.py and prints the loss on a stream of tokens, for src/cli/train_test.cpp.

The safetensors file is parsed here from the format's definition (u64 LE header length, JSON
header, raw little-endian data; F32/BF16/F16), every tensor is loaded with load_state_dict(strict=
True) (a missing, extra or misshapen tensor fails), and config.json builds the model.

Usage: check_hf_export.py DIR TOKENS_JSON B T
  TOKENS_JSON: a JSON list of B*(T+1) token ids, row b = tokens[b*(T+1) : (b+1)*(T+1)]; inputs are
  each row's first T, targets its last T. Prints {"loss": float, "torch_dtype": str}.
       check_hf_export.py DIR PROMPT_JSON --greedy N [--stop ID]
  Greedy decoding by full re-forward (no cache): N new ids after the prompt (a JSON list of ids),
  ending early after ID. Prints {"ids": [...]}.
"""
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models as tm  # noqa: E402


def read_safetensors(path: str) -> dict:
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        buf = data[b:e]
        shape = info["shape"]
        if info["dtype"] == "F32":
            t = torch.from_numpy(np.frombuffer(buf, dtype="<f4").copy())
        elif info["dtype"] == "F16":
            t = torch.from_numpy(np.frombuffer(buf, dtype="<f2").copy()).float()
        elif info["dtype"] == "BF16":
            u = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            t = torch.from_numpy(u.view(np.float32).copy())
        else:
            raise ValueError(f"{name}: unexpected dtype {info['dtype']}")
        out[name] = t.reshape(shape)
    return out


def main() -> int:
    d, tokens_json = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    model = tm.build_model(cfg).float()
    model.load_state_dict(read_safetensors(os.path.join(d, "model.safetensors")), strict=True)
    if sys.argv[3] == "--greedy":
        n = int(sys.argv[4])
        stop = int(sys.argv[6]) if len(sys.argv) > 6 and sys.argv[5] == "--stop" else None
        with open(tokens_json) as f:
            ids = json.load(f)
        new = []
        with torch.no_grad():
            for _ in range(n):
                logits = model(torch.tensor([ids + new], dtype=torch.int64))[0, -1]
                new.append(int(torch.argmax(logits).item()))
                if new[-1] == stop:
                    break
        print(json.dumps({"ids": new}))
        return 0
    B, T = int(sys.argv[3]), int(sys.argv[4])
    with open(tokens_json) as f:
        toks = torch.tensor(json.load(f), dtype=torch.int64).reshape(B, T + 1)
    with torch.no_grad():
        loss = tm.lm_loss(model(toks[:, :-1]), toks[:, 1:])
    print(json.dumps({"loss": loss.item(), "torch_dtype": cfg.get("torch_dtype")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
