#!/usr/bin/python3
"""Write PyTorch golden data for the meshtrain tests (one safetensors file per tiny model).

Usage (Debian's python3-torch; only /usr/bin/python3 has torch):

    /usr/bin/python3 tools/make_golden.py --configs configs/models --out OUTDIR \
        [--batch 2 --seq 16 --steps 3]

For configs/models/tiny-gpt2.json and tiny-llama.json (Hugging Face config.json fields) this builds
the model (tools/torch_models.py, Hugging Face layouts) in fp32, seeds torch.manual_seed(1234),
initialises every parameter (embeddings and LLaMA's lm_head N(0, 0.2), other matrices
N(0, 0.02), norm weights 1 + 0.1*randn, biases 0.1*randn), draws a batch, and writes
OUTDIR/<name>.safetensors with:

    tokens        I32 [B,T]   random ids in [0, V)
    targets       I32 [B,T]   random ids, targets[0][3] = -100 (ignored)
    param.<hf>    F32         initial weights, Hugging Face names and shapes
    logits        F32 [B,T,V] from the initial weights
    loss          F32 [1]     mean cross-entropy over non-ignored positions
    grad.<hf>     F32         d loss / d param (tied GPT-2 wte: both uses)
    step_losses   F32 [K]     AdamW(lr=1e-3, betas=(0.9,0.95), eps=1e-8, wd=0.1), same batch each
                              step; loss before each update (step_losses[0] == loss)
    after.<hf>    F32         weights after the K steps
    __metadata__  config (JSON string), batch, seq, steps, lr, beta1, beta2, eps, weight_decay

The safetensors file is written by hand: u64 LE header length, space-padded JSON header (multiple
of 8 bytes), then the tensors' little-endian bytes packed contiguously in header order.
Single-threaded and deterministic.

It also writes padding-tiny-llama.safetensors: tiny-llama with pad_token_id 7 (LlamaModel's
nn.Embedding padding_idx), the id planted at the first and middle position of each row; and
rope-llama3 / rope-linear / rope-yarn-tiny-llama.safetensors: tiny-llama with a rope_scaling
(ROPE_VARIANTS), with its rotary frequencies as inv_freq (F32 [head_dim/2]); and
qwen2-tiny-llama / attention-bias-tiny-llama.safetensors: tiny-llama's sizes as Qwen2 (q/k/v
biases) and with LLaMA's attention_bias (BIAS_VARIANTS).

It also writes OUTDIR/engine-gpt2/, the acceptance data of the training engine: a Hugging Face
model directory (config.json; model.safetensors with the gpt2 hub checkpoint's bare-trunk names,
"h.0.attn.c_attn.weight", and its "h.N.attn.bias" mask buffers), a Megatron indexed dataset
train.bin/.idx (uint16 tokens, several documents) written here from the format's definition, and
expected.json: the losses of ENGINE_STEPS AdamW steps over that stream as `meshtrain train` samples
it without shuffle (sample k = stream tokens [k*T, k*T+T+1)), micro-batch ENGINE_MICRO,
gradient accumulation ENGINE_ACCUM (loss/accum per micro-batch), clip_grad_norm_(1.0).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models as tm  # noqa: E402
from ds_schedules import LRRangeTest, OneCycle  # noqa: E402

MODELS = ("tiny-gpt2", "tiny-llama")
SEED = 1234
LR, BETA1, BETA2, EPS, WEIGHT_DECAY = 1e-3, 0.9, 0.95, 1e-8, 0.1
IGNORE_POS = (0, 3)

_DTYPES = {torch.float32: ("F32", "<f4"), torch.int32: ("I32", "<i4")}


def write_safetensors(path: str, tensors: dict[str, torch.Tensor],
                      metadata: dict[str, str]) -> None:
    """Write ``tensors`` (F32/I32, in dict order) and string ``metadata`` as safetensors."""
    header: dict = {}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        tag, np_dtype = _DTYPES[t.dtype]
        data = t.detach().contiguous().cpu().numpy().astype(np_dtype, copy=False).tobytes()
        header[name] = {"dtype": tag, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for data in blobs:
            f.write(data)
    os.replace(tmp, path)


def make_golden(cfg: dict, batch: int, seq: int, steps: int, plant=None) -> tuple[dict, dict]:
    """Tensors and metadata of one golden file; plant(tokens) edits the drawn tokens in place."""
    model = tm.build_model(cfg).float()
    torch.manual_seed(SEED)
    tm.init_params(model)
    vocab = cfg["vocab_size"]
    tokens = torch.randint(0, vocab, (batch, seq), dtype=torch.int64)
    if plant is not None:
        plant(tokens)
    targets = torch.randint(0, vocab, (batch, seq), dtype=torch.int64)
    targets[IGNORE_POS] = -100

    params = dict(model.named_parameters())
    out: dict[str, torch.Tensor] = {
        "tokens": tokens.to(torch.int32),
        "targets": targets.to(torch.int32),
    }
    for name, p in params.items():
        out["param." + name] = p.detach().clone()

    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(BETA1, BETA2), eps=EPS,
                            weight_decay=WEIGHT_DECAY)
    step_losses = []
    for k in range(max(steps, 1)):
        opt.zero_grad(set_to_none=True)
        logits = model(tokens)
        loss = tm.lm_loss(logits, targets)
        loss.backward()
        if k == 0:
            out["logits"] = logits.detach().clone()
            out["loss"] = loss.detach().reshape(1).clone()
            for name, p in params.items():
                out["grad." + name] = p.grad.detach().clone()
        if k < steps:
            step_losses.append(loss.item())
            opt.step()
    out["step_losses"] = torch.tensor(step_losses, dtype=torch.float32)
    for name, p in params.items():
        out["after." + name] = p.detach().clone()

    metadata = {
        "config": json.dumps(cfg),
        "batch": str(batch), "seq": str(seq), "steps": str(steps),
        "lr": repr(LR), "beta1": repr(BETA1), "beta2": repr(BETA2), "eps": repr(EPS),
        "weight_decay": repr(WEIGHT_DECAY),
    }
    return out, metadata


# Dropout's golden files: the tiny models with these probabilities (each site its own, so a mask
# drawn at the wrong site fails), trained as make_golden does with meshtrain's masks
# (tm.DropoutMasks: seed SEED, step k + 1, the batch's first sample 0).
DROPOUT_KEYS = {"gpt2": {"embd_pdrop": 0.1, "resid_pdrop": 0.2, "attn_pdrop": 0.3},
                "llama": {"attention_dropout": 0.25}}


def make_dropout_golden(cfg: dict, batch: int, seq: int, steps: int) -> tuple[dict, dict]:
    c = dict(cfg)
    c.update(DROPOUT_KEYS[cfg["model_type"]])

    class Masks:  # make_golden's forward k (k = 0, 1, ...) is optimizer step k + 1
        def __init__(self):
            self.k = 0

        def next(self):
            self.k += 1
            tm.DROPOUT = tm.DropoutMasks(SEED, self.k, 0)

    masks = Masks()
    # make_golden runs logits = model(tokens) once per step: set the step's masks before each.
    return make_golden_around_forward(c, batch, seq, steps, lambda tokens: masks.next(), _clear_dropout)


def _clear_dropout():
    tm.DROPOUT = None


def make_golden_around_forward(cfg: dict, batch: int, seq: int, steps: int, before, after,
                               plant=None) -> tuple[dict, dict]:
    """make_golden with before(tokens) run before each forward of the model and after() after it."""
    real_build = tm.build_model

    def build(cfg_):
        model = real_build(cfg_)
        fwd = model.forward

        def forward(tokens):
            before(tokens)
            try:
                return fwd(tokens)
            finally:
                after()
        model.forward = forward
        return model

    tm.build_model = build
    try:
        return make_golden(cfg, batch, seq, steps, plant)
    finally:
        tm.build_model = real_build
        after()


# Documents' golden files (Megatron's reset_position_ids / reset_attention_mask): make_golden's
# batch with DOC_EOD at DOC_ENDS (row, positions), and nowhere else: a document ending at the first
# token, two EODs in a row and one at the last token. Each forward gets tm.Documents of its tokens.
DOC_EOD = 5
DOC_ENDS = {0: (4, 11), 1: (0, 7, 8, 15)}
DOC_VARIANTS = {"": (True, True), "positions-": (True, False), "attention-": (False, True)}


# LLaMA with a pad_token_id (Hugging Face's LlamaModel: nn.Embedding's padding_idx), the id planted
# in both rows of the batch (and in the middle, where later positions attend to it): its row of
# embed_tokens gets no gradient, and AdamW's steps leave it decayed only.
PAD_ID = 7


def make_padding_golden(cfg: dict, batch: int, seq: int, steps: int) -> tuple[dict, dict]:
    c = dict(cfg)
    c["pad_token_id"] = PAD_ID

    def plant(tokens):
        tokens[:, 0] = PAD_ID
        tokens[:, seq // 2] = PAD_ID

    return make_golden(c, batch, seq, steps, plant)


# LLaMA with Hugging Face's rope_scaling (transformers' modeling_rope_utils, transcribed in
# tools/torch_models.py's rope_inv_freq): Llama 3.1's "llama3" bands at the tiny model's scale
# (head_dim 16: one frequency kept, one blended, six divided) and "linear". The same seed, weights
# and batch as tiny-llama's golden, so only the rotary table differs. The llama3 file also holds
# the frequencies of the real Llama 3.1 8B (factor 8) and Llama 3.2 1B (factor 32) configs.
ROPE_VARIANTS = {
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32},
    "linear": {"type": "linear", "factor": 4.0},
    # yarn at the tiny model's scale: max_position_embeddings 64 = factor x 16 (where transformers
    # 4 and 5 agree), beta_slow 0.25 so that the ramp blends two of the eight frequencies.
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_slow": 0.25},
}

# yarn's frequencies and cos/sin scale of real configs (head_dim, rope_theta, rope_scaling): Qwen2.5's
# recommended 4x (with max_position_embeddings 131072), and DeepSeek's form with mscale and
# mscale_all_dim, untruncated.
YARN_REAL = {
    "qwen25": (128, 1000000.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    "mscale": (64, 10000.0, {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                             "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": False}),
}


def make_rope_golden(cfg: dict, batch: int, seq: int, steps: int, variant: str) -> tuple[dict, dict]:
    c = dict(cfg)
    c["rope_scaling"] = ROPE_VARIANTS[variant]
    out, metadata = make_golden(c, batch, seq, steps)
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    out["inv_freq"] = tm.rope_inv_freq(head_dim, float(c.get("rope_theta", 10000.0)), c["rope_scaling"])
    if variant == "llama3":
        for key, factor in (("llama31", 8.0), ("llama32", 32.0)):
            real = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192}
            out["inv_freq." + key] = tm.rope_inv_freq(128, 500000.0, real)
    if variant == "yarn":
        out["attention_factor"] = torch.tensor([tm.rope_attention_factor(c["rope_scaling"])], dtype=torch.float32)
        for key, (hd, theta, real) in YARN_REAL.items():
            out["inv_freq." + key] = tm.rope_inv_freq(hd, theta, real)
            out["attention_factor." + key] = torch.tensor([tm.rope_attention_factor(real)], dtype=torch.float32)
    return out, metadata


# Qwen2 (Qwen2ForCausalLM: LLaMA with biases on q, k and v, none on o_proj) and LLaMA with
# attention_bias (all four): tiny-llama's sizes, the biases drawn as every bias here (0.1 randn).
BIAS_VARIANTS = {"qwen2": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": False},
                 "attention-bias": {"attention_bias": True}}


def make_bias_golden(cfg: dict, batch: int, seq: int, steps: int, variant: str) -> tuple[dict, dict]:
    c = dict(cfg)
    c.update(BIAS_VARIANTS[variant])
    return make_golden(c, batch, seq, steps)


def make_documents_golden(cfg: dict, batch: int, seq: int, steps: int, positions: bool,
                          attention: bool) -> tuple[dict, dict]:
    def plant(tokens):
        tokens[tokens == DOC_EOD] = DOC_EOD + 1
        for row, ends in DOC_ENDS.items():
            for t in ends:
                if row < tokens.shape[0] and t < tokens.shape[1]:
                    tokens[row, t] = DOC_EOD

    def before(tokens):
        tm.DOCUMENTS = tm.Documents(tokens, DOC_EOD, positions, attention)

    def after():
        tm.DOCUMENTS = None

    out, metadata = make_golden_around_forward(cfg, batch, seq, steps, before, after, plant)
    metadata.update({"eod": str(DOC_EOD), "reset_position_ids": str(int(positions)),
                     "reset_attention_mask": str(int(attention))})
    return out, metadata


ENGINE_STEPS, ENGINE_MICRO, ENGINE_ACCUM, ENGINE_SEQ = 5, 2, 2, 16
CLS_LABELS, CLS_SEQ, CLS_LENGTHS = 3, 16, (16, 9, 5, 12)  # one row without padding


def make_cls_golden(cfg: dict, problem: str = "single_label_classification") -> tuple[dict, dict]:
    """Sequence classification (Hugging Face's *ForSequenceClassification): rows of CLS_LENGTHS
    tokens right-padded with pad = vocab_size - 1 (two rows hold it in their text too), pooled at
    the last non-pad token by HF's rule; the pooled logits, the loss and every gradient. The loss is
    HF's for the problem_type: cross-entropy over CLS_LABELS classes; regression, MSELoss of one
    value (squeezed, as HF does for num_labels 1); multi-label, BCEWithLogitsLoss over CLS_LABELS
    0/1 labels."""
    vocab = cfg["vocab_size"]
    pad = vocab - 1
    num_labels = 1 if problem == "regression" else CLS_LABELS
    model = tm.ForSequenceClassification(cfg, num_labels, pad).float()
    torch.manual_seed(SEED + 1)
    tm.init_params(model)
    B = len(CLS_LENGTHS)
    tokens = torch.full((B, CLS_SEQ), pad, dtype=torch.int64)
    for b, n in enumerate(CLS_LENGTHS):
        tokens[b, :n] = torch.randint(0, vocab - 1, (n,))
    # Texts that hold the pad id: row 2 ends with it (HF pools at the token before), row 3 has it
    # inside (HF pools at its last token, not before the first pad).
    tokens[2, CLS_LENGTHS[2] - 1] = pad
    tokens[3, 4] = pad
    labels = torch.randint(0, CLS_LABELS, (B,))
    _, pooled = model(tokens)
    values = None
    if problem == "regression":  # STS-B-like values in [0, 5]
        values = torch.rand(B, 1) * 5.0
        loss = torch.nn.functional.mse_loss(pooled.squeeze(), values.squeeze())
    elif problem == "multi_label_classification":
        values = (torch.rand(B, CLS_LABELS) < 0.5).float()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(pooled, values)
    else:
        loss = torch.nn.functional.cross_entropy(pooled, labels)
    loss.backward()
    out = {"tokens": tokens.to(torch.int32), "lengths": torch.tensor(CLS_LENGTHS, dtype=torch.int32),
           "labels": labels.to(torch.int32), "pooled_logits": pooled.detach().clone(),
           "loss": loss.detach().reshape(1).clone()}
    if values is not None:
        out["values"] = values.clone()
    for name, p in model.named_parameters():
        out["param." + name] = p.detach().clone()
        out["grad." + name] = p.grad.detach().clone()
    c = dict(cfg)
    c["num_labels"] = num_labels
    c["problem_type"] = problem
    return out, {"config": json.dumps(c), "batch": str(B), "seq": str(CLS_SEQ), "steps": "0", "pad": str(pad)}


def write_indexed_dataset(prefix: str, docs: list[list[int]]) -> None:
    """Megatron MMIDIDX version 1, uint16 tokens (dtype code 8), one sequence per document."""
    sizes = np.array([len(d) for d in docs], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1].astype(np.int64) * 2)]).astype(np.int64)
    doc_idx = np.arange(len(docs) + 1, dtype=np.int64)
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(np.array(d, dtype=np.uint16).tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", 8))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(sizes.tobytes())
        f.write(pointers.tobytes())
        f.write(doc_idx.tobytes())


def make_engine_golden(cfg: dict, out: str) -> list[float]:
    """HF directory + dataset + expected losses of ENGINE_STEPS steps (see the module doc)."""
    os.makedirs(out, exist_ok=True)
    model = tm.build_model(cfg).float()
    torch.manual_seed(SEED + 1)
    tm.init_params(model)
    n_pos = cfg["n_positions"]
    weights = {}
    for name, p in model.named_parameters():
        weights[name.removeprefix("transformer.")] = p.detach().clone()
    for i in range(cfg["n_layer"]):
        weights[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n_pos, n_pos)).view(1, 1, n_pos, n_pos)
    write_safetensors(os.path.join(out, "model.safetensors"), weights, {"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)

    gen = torch.Generator().manual_seed(SEED + 2)
    vocab = cfg["vocab_size"]
    docs = [torch.randint(0, vocab, (int(n),), generator=gen).tolist() for n in (97, 150, 61, 120)]
    write_indexed_dataset(os.path.join(out, "train"), docs)
    stream = torch.tensor([t for d in docs for t in d], dtype=torch.int64)
    T = ENGINE_SEQ
    assert (ENGINE_STEPS * ENGINE_MICRO * ENGINE_ACCUM) * T + 1 <= len(stream)

    init = {n: p.detach().clone() for n, p in model.named_parameters()}

    def run(make_opt, sched_factory=None) -> list[float]:
        """ENGINE_STEPS steps from the initial weights; the scheduler steps after the optimizer."""
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(init[n])
        opt = make_opt()
        sched = sched_factory(opt) if sched_factory else None
        losses, k = [], 0
        for _ in range(ENGINE_STEPS):
            opt.zero_grad(set_to_none=True)
            total = 0.0
            for _ in range(ENGINE_ACCUM):
                rows = [stream[(k + b) * T:(k + b) * T + T + 1] for b in range(ENGINE_MICRO)]
                k += ENGINE_MICRO
                batch = torch.stack(rows)
                loss = tm.lm_loss(model(batch[:, :-1]), batch[:, 1:])
                (loss / ENGINE_ACCUM).backward()
                total += loss.item()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if sched:
                sched.step()
            losses.append(total / ENGINE_ACCUM)
        return losses

    losses = run(lambda: torch.optim.AdamW(model.parameters(), lr=LR, betas=(BETA1, BETA2), eps=EPS,
                                           weight_decay=WEIGHT_DECAY))

    # Variants through other optimizers, schedules and weight-decay groups. "config" is what the
    # meshtrain run config adds; "no_weight_decay": "hf" is Hugging Face Trainer's rule.
    def hf_groups(wd):
        no = [p for n, p in model.named_parameters()
              if n.endswith(".bias") or "ln_" in n or "norm" in n]
        yes = [p for n, p in model.named_parameters()
               if not (n.endswith(".bias") or "ln_" in n or "norm" in n)]
        return [{"params": yes, "weight_decay": wd}, {"params": no, "weight_decay": 0.0}]

    one_cycle = dict(cycle_min_lr=1e-3, cycle_max_lr=1e-2, cycle_first_step_size=2,
                     cycle_second_step_size=3, cycle_min_mom=0.85, cycle_max_mom=0.95)
    variants = {
        "adamw_onecycle_hf_no_decay": {
            "config": {"optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95],
                                                                 "eps": 1e-8, "weight_decay": 0.1}},
                       "scheduler": {"type": "OneCycle", "params": one_cycle},
                       "no_weight_decay": "hf"},
            "losses": run(lambda: torch.optim.AdamW(hf_groups(0.1), lr=1e-2, betas=(0.9, 0.95), eps=1e-8),
                          lambda opt: OneCycle(opt, **one_cycle)),
        },
        # DeepSpeed's LRRangeTest: the lr rises from min_lr each step (continuous), or each
        # lr_range_test_step_size steps (staircase); the optimizer's own lr is replaced.
        "sgd_lr_range_test": {
            "config": {"optimizer": {"type": "SGD", "params": {"lr": 0.5, "momentum": 0.9}},
                       "scheduler": {"type": "LRRangeTest",
                                     "params": {"lr_range_test_min_lr": 0.02, "lr_range_test_step_size": 1,
                                                "lr_range_test_step_rate": 1.5}}},
            "losses": run(lambda: torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9),
                          lambda opt: LRRangeTest(opt, lr_range_test_min_lr=0.02, lr_range_test_step_size=1,
                                                  lr_range_test_step_rate=1.5)),
        },
        "adamw_lr_range_test_staircase": {
            "config": {"optimizer": {"type": "AdamW", "params": {"lr": 0.5, "betas": [0.9, 0.95], "eps": 1e-8,
                                                                 "weight_decay": 0.1}},
                       "scheduler": {"type": "LRRangeTest",
                                     "params": {"lr_range_test_min_lr": 1e-3, "lr_range_test_step_size": 2,
                                                "lr_range_test_step_rate": 4.0, "lr_range_test_staircase": True}}},
            "losses": run(lambda: torch.optim.AdamW(model.parameters(), lr=0.5, betas=(0.9, 0.95), eps=1e-8,
                                                    weight_decay=0.1),
                          lambda opt: LRRangeTest(opt, lr_range_test_min_lr=1e-3, lr_range_test_step_size=2,
                                                  lr_range_test_step_rate=4.0, lr_range_test_staircase=True)),
        },
        # Adam's L2 decay: DeepSpeed's Adam with adam_w_mode false (FusedAdam's L2 mode) is
        # torch.optim.Adam's weight_decay, the decay added to the gradient before the moments; a
        # decay of 0.5 at lr 1e-2 steers each small weight's update by its sign, far from AdamW's.
        "adam_l2": {
            "config": {"optimizer": {"type": "Adam", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8,
                                                                "weight_decay": 0.5, "adam_w_mode": False}}},
            "losses": run(lambda: torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8,
                                                   weight_decay=0.5)),
        },
        # torch_adam: torch.optim.Adam itself, over Hugging Face Trainer's two decay groups.
        "adam_l2_torch_hf_no_decay": {
            "config": {"optimizer": {"type": "Adam", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8,
                                                                "weight_decay": 0.5, "adam_w_mode": False,
                                                                "torch_adam": True}},
                       "no_weight_decay": "hf"},
            "losses": run(lambda: torch.optim.Adam(hf_groups(0.5), lr=1e-2, betas=(0.9, 0.95), eps=1e-8)),
        },
        "sgd_nesterov": {
            "config": {"optimizer": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9,
                                                               "nesterov": True, "weight_decay": 0.01}}},
            "losses": run(lambda: torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                                                  weight_decay=0.01)),
        },
    }
    expected = {"losses": losses, "seq_length": T, "micro_batch": ENGINE_MICRO,
                "gradient_accumulation_steps": ENGINE_ACCUM, "lr": LR, "betas": [BETA1, BETA2],
                "eps": EPS, "weight_decay": WEIGHT_DECAY, "gradient_clipping": 1.0, "variants": variants}
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2)
    return losses


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--configs", required=True, help="folder with tiny-gpt2.json, tiny-llama.json")
    ap.add_argument("--out", required=True, help="output folder (created if missing)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    if args.seq <= IGNORE_POS[1] or args.batch < 1 or args.steps < 0:
        ap.error("need --batch >= 1, --seq >= 4, --steps >= 0")

    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    os.makedirs(args.out, exist_ok=True)
    for name in MODELS:
        cfg = tm.load_config(os.path.join(args.configs, name + ".json"))
        limit = cfg.get("n_positions") or cfg.get("max_position_embeddings")
        if limit is not None and args.seq > limit:
            ap.error(f"--seq {args.seq} exceeds {name}'s {limit} positions")
        tensors, metadata = make_golden(cfg, args.batch, args.seq, args.steps)
        path = os.path.join(args.out, name + ".safetensors")
        write_safetensors(path, tensors, metadata)
        print(f"wrote {path}: {len(tensors)} tensors, loss {tensors['loss'].item():.6f}, "
              f"step_losses {[round(x, 6) for x in tensors['step_losses'].tolist()]}")
    for name in MODELS:
        cfg = tm.load_config(os.path.join(args.configs, name + ".json"))
        tensors, metadata = make_dropout_golden(cfg, args.batch, args.seq, args.steps)
        path = os.path.join(args.out, "dropout-" + name + ".safetensors")
        write_safetensors(path, tensors, metadata)
        print(f"wrote {path}: dropout, loss {tensors['loss'].item():.6f}, "
              f"step_losses {[round(x, 6) for x in tensors['step_losses'].tolist()]}")
    for name in MODELS:
        cfg = tm.load_config(os.path.join(args.configs, name + ".json"))
        for prefix, (positions, attention) in DOC_VARIANTS.items():
            tensors, metadata = make_documents_golden(cfg, args.batch, args.seq, args.steps, positions, attention)
            path = os.path.join(args.out, "documents-" + prefix + name + ".safetensors")
            write_safetensors(path, tensors, metadata)
            print(f"wrote {path}: documents, loss {tensors['loss'].item():.6f}")
    cfg = tm.load_config(os.path.join(args.configs, "tiny-llama.json"))
    tensors, metadata = make_padding_golden(cfg, args.batch, args.seq, args.steps)
    path = os.path.join(args.out, "padding-tiny-llama.safetensors")
    write_safetensors(path, tensors, metadata)
    print(f"wrote {path}: padding_idx {PAD_ID}, loss {tensors['loss'].item():.6f}")
    for variant in BIAS_VARIANTS:
        tensors, metadata = make_bias_golden(cfg, args.batch, args.seq, args.steps, variant)
        path = os.path.join(args.out, variant + "-tiny-llama.safetensors")
        write_safetensors(path, tensors, metadata)
        print(f"wrote {path}: {variant}, loss {tensors['loss'].item():.6f}")
    for variant in ROPE_VARIANTS:
        tensors, metadata = make_rope_golden(cfg, args.batch, args.seq, args.steps, variant)
        path = os.path.join(args.out, "rope-" + variant + "-tiny-llama.safetensors")
        write_safetensors(path, tensors, metadata)
        print(f"wrote {path}: rope_scaling {variant}, loss {tensors['loss'].item():.6f}")
    for name in MODELS:
        cfg = tm.load_config(os.path.join(args.configs, name + ".json"))
        for prefix, problem in (("cls-", "single_label_classification"), ("cls-regression-", "regression"),
                                ("cls-multi-label-", "multi_label_classification")):
            tensors, metadata = make_cls_golden(cfg, problem)
            path = os.path.join(args.out, prefix + name + ".safetensors")
            write_safetensors(path, tensors, metadata)
            print(f"wrote {path}: classification ({problem}), loss {tensors['loss'].item():.6f}")
    cfg = tm.load_config(os.path.join(args.configs, "tiny-gpt2.json"))
    losses = make_engine_golden(cfg, os.path.join(args.out, "engine-gpt2"))
    print(f"wrote {os.path.join(args.out, 'engine-gpt2')}: losses {[round(x, 6) for x in losses]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
