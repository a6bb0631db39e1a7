#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target: small valid inputs built from the file formats'
descriptions (not by meshtrain's own writers), one directory per target.

Usage: fuzz/make_seeds.py OUTDIR   -> OUTDIR/{safetensors,indexed_dataset,tokenizer,ds_config,chat_template}/
The input layout of each target is described at the top of fuzz/<target>_fuzz.cpp.
"""
import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, data bytes)] -> the file's bytes (header padded to 8)."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    f32 = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    yield "f32_bf16", safetensors([("x.weight", "F32", [2, 3], f32), ("y", "BF16", [2], b"\xc0\x3f\x00\xc0")],
                                  {"format": "pt"})
    yield "empty", safetensors([])
    yield "all_dtypes", safetensors([
        ("f16", "F16", [2], b"\x00\x3c\x00\xc0"), ("f64", "F64", [1], struct.pack("<d", 0.5)),
        ("i32", "I32", [2], struct.pack("<2i", 7, -1)), ("i64", "I64", [1], struct.pack("<q", 3)),
        ("i16", "I16", [1, 1], b"\x01\x00"), ("i8", "I8", [2], b"\x01\xff"), ("u8", "U8", [3], b"abc"),
        ("b", "BOOL", [1], b"\x01"), ("scalar", "F32", [], struct.pack("<f", 9)),
        ("none", "F32", [0, 4], b"")])


# Megatron .idx: magic, version 1, dtype code, S, D, lengths int32[S], pointers int64[S],
# document_indices int64[D] (+ optional modes int8[S]).
DTYPE_SIZE = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}


def megatron_idx(code, lengths, doc_indices, modes=None):
    out = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(lengths), len(doc_indices))
    out += struct.pack("<%di" % len(lengths), *lengths)
    pointer, pointers = 0, []
    for n in lengths:
        pointers.append(pointer)
        pointer += n * DTYPE_SIZE[code]
    out += struct.pack("<%dq" % len(lengths), *pointers)
    out += struct.pack("<%dq" % len(doc_indices), *doc_indices)
    if modes is not None:
        out += bytes(modes)
    return out


def indexed_dataset_seeds():
    derived_bin = b"\x01"  # flags: the .bin gets the bytes the lengths claim
    for code in range(1, 9):
        yield "dtype%d" % code, derived_bin + megatron_idx(code, [3, 1, 4], [0, 2, 3])
    yield "empty_document", derived_bin + megatron_idx(8, [2, 5], [0, 1, 1, 2])
    yield "no_sequences", derived_bin + megatron_idx(8, [], [0])
    yield "multimodal", derived_bin + megatron_idx(4, [2, 2], [0, 2], modes=[0, 1])
    yield "short_bin", bytes([2 * 5]) + megatron_idx(8, [3, 2], [0, 2])  # .bin of 5 bytes


def bytes_to_unicode():
    """GPT-2's byte -> printable character map (openai/gpt-2 src/encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def small_bpe():
    """A byte-level vocabulary with a few merges: (vocab {text: id}, merges ["a b"])."""
    m = bytes_to_unicode()
    vocab = {m[b]: b for b in range(256)}
    merges = []
    for left, right in [(" ", "t"), ("h", "e"), (" t", "he"), ("i", "n"), (" ", "c"), ("a", "t"), (" c", "at"),
                        ("'", "s"), ("4", "2")]:
        l, r = "".join(m[c] for c in left.encode()), "".join(m[c] for c in right.encode())
        merges.append(l + " " + r)
        vocab.setdefault(l + r, len(vocab))
    return vocab, merges


def tokenizer_seeds():
    vocab, merges = small_bpe()
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    eot = len(vocab)
    hf = {"version": "1.0", "truncation": None, "padding": None,
          "added_tokens": [{"id": eot, "content": "<|endoftext|>", "special": True}],
          "normalizer": None, "pre_tokenizer": byte_level, "post_processor": byte_level, "decoder": byte_level,
          "model": {"type": "BPE", "vocab": vocab, "merges": merges}}
    yield "hf", b"\x00" + json.dumps(hf).encode()
    hf["model"]["merges"] = [m.split(" ") for m in merges]
    hf["added_tokens"] = []
    yield "hf_pair_merges", b"\x00" + json.dumps(hf, ensure_ascii=False).encode()
    gpt2_vocab = dict(vocab, **{"<|endoftext|>": eot})
    yield "gpt2", (b"\x01" + json.dumps(gpt2_vocab).encode() + b"\x00" +
                   ("#version: 0.2\n" + "\n".join(merges) + "\n").encode())


def chat_template_seeds():
    yield "chatml", (b"{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                     b"{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    yield "generation", (b"{%- for m in messages %}{{ m.role }}: {% if m.role == 'assistant' %}{% generation %}"
                         b"{{ m.content | trim }}{{ eos_token }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n"
                         b"{%- endfor %}")
    yield "namespace_tools", (b"{{ bos_token }}{% set ns = namespace(n=0) %}{% for m in messages %}"
                              b"{% if m.tool_calls is defined %}{{ m.tool_calls[0].function.arguments | tojson(indent=2) }}"
                              b"{% set ns.n = ns.n + 1 %}{% elif m.role not in ['user', 'system', 'assistant'] %}"
                              b"{{ raise_exception('bad role ' ~ m.role) }}{% else %}{{ m['content'][:3] }}{% endif %}"
                              b"{% endfor %}{{ ns.n }}{{ tools | map(attribute='name') | join(',') }}")
    yield "macro_messages", (b"{% macro turn(r, c='') -%}[{{ r | upper }}]{{ c }}{%- endmacro %}"
                             b"{% for m in messages if m.content %}{{ turn(m.role, m.content) }}{% endfor %}"
                             b"\x00" + json.dumps([{"role": "user", "content": "a"},
                                                   {"role": "assistant", "content": "b"}]).encode())


def ds_config_seeds():
    def text(name):
        with open(os.path.join(ROOT, name), "rb") as f:
            return f.read()
    tiny_gpt2 = json.loads(text("configs/models/tiny-gpt2.json"))
    tiny_llama = json.loads(text("configs/models/tiny-llama.json"))
    yield "demo", text("configs/demo.json")
    yield "llama_inline", json.dumps({"model": tiny_llama, "seq_length": 16, "train_batch_size": 4,
                                      "gradient_accumulation_steps": 2}).encode()
    yield "model_path_auto", json.dumps({
        "model": "configs/models/tiny-gpt2.json", "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
        "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "hysteresis": 2},
        "optimizer": {"type": "Adam", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                 "weight_decay": "auto", "adam_w_mode": True}},
        "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10,
                                                            "warmup_type": "linear"}},
        "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "none"}, "overlap_comm": True},
        "activation_checkpointing": {"partition_activations": False, "number_checkpoints": 2},
        "parallel": {"dp": 1, "tp": 1}, "data": {"train": "d/train", "shuffle": False, "seed": 7},
        "wandb": {"enabled": False}, "train_iter": 5}).encode()
    overrides = ["seq_length=8", "optimizer.params.lr=0.01", "data.train=data/x", "bf16.enabled=true"]
    yield "overrides", (json.dumps({"model": tiny_gpt2, "train_micro_batch_size_per_gpu": 1}).encode() + b"\x00" +
                        b"\x00".join(o.encode() for o in overrides))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    targets = {"safetensors": safetensors_seeds, "indexed_dataset": indexed_dataset_seeds,
               "tokenizer": tokenizer_seeds, "ds_config": ds_config_seeds, "chat_template": chat_template_seeds}
    for target, seeds in targets.items():
        d = os.path.join(sys.argv[1], target)
        os.makedirs(d, exist_ok=True)
        for name, data in seeds():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
