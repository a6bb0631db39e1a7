"""Plain-PyTorch GPT-2 and LLaMA, following Hugging Face's definitions exactly.

Shared by tools/make_golden.py (golden data for the C++ tests) and tools/bench_torch.py
(the PyTorch peer benchmark). No dependency beyond torch; runs on Debian's python3-torch 1.13.

The module trees mirror Hugging Face's, so ``model.named_parameters()`` yields the Hugging Face
names and shapes:

* ``GPT2LMHeadModel``: ``transformer.wte/wpe/h.{i}.{ln_1,attn.c_attn,attn.c_proj,ln_2,mlp.c_fc,
  mlp.c_proj}/ln_f``; Conv1D weights are ``[in, out]`` (y = x @ W + b); lm_head tied to wte
  (not a separate parameter).
* ``LlamaForCausalLM``: ``model.embed_tokens/layers.{i}.{input_layernorm,self_attn.{q,k,v,o}_proj,
  post_attention_layernorm,mlp.{gate,up,down}_proj}/norm`` and an untied ``lm_head``; nn.Linear
  weights are ``[out, in]`` (y = x @ W.T), no biases.

Parameters are created uninitialised; call ``init_params`` (the golden-data init) or
``init_hf`` (Hugging Face's normal(0, initializer_range) init) after seeding.
"""

from __future__ import annotations

import json
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def load_config(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# ----------------------------------------------------------------------------------------------
# Dropout: meshtrain's counter-based masks (src/kernels/cpu/dropout.h), written again from that
# header's definition in numpy, so the oracle applies the very masks the C++ runtime draws.
# ----------------------------------------------------------------------------------------------

_GOLDEN = 0x9E3779B97F4A7C15
SITE_EMBEDDING, SITE_ATTN_OUT, SITE_MLP_OUT, SITE_ATTN_PROBS = 0, 1, 2, 3


def _u64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.uint64)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, modulo 2^64."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> _u64(30))) * _u64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> _u64(27))) * _u64(0x94D049BB133111EB)
        return z ^ (z >> _u64(31))


def _mul_golden(x: int) -> np.ndarray:
    return _u64((int(x) * _GOLDEN) & ((1 << 64) - 1))


class DropoutMasks:
    """The masks of optimizer step ``step`` (one-based) for a micro-batch whose first sample is
    ``sample0`` of the global batch; ``seed`` is the run's (ModelOptions::seed)."""

    def __init__(self, seed: int, step: int, sample0: int = 0):
        self.step_key = _mix(_mix(_u64(seed)) ^ _u64(step))
        self.sample0 = sample0

    def _site(self, layer: int, site: int) -> np.ndarray:
        return _mix(self.step_key ^ _mul_golden(((layer << 8) | site) + 1))

    @staticmethod
    def _keep_scale(key: np.ndarray, samples: np.ndarray, T: int, cols: int, p: float) -> np.ndarray:
        """(len(samples), T, cols) float32: 0 where dropped, 1 / (1 - p) where kept."""
        p32 = np.float32(p)
        thr = int(np.floor(np.float64(p32) * 4294967296.0))
        scale = np.float32(1.0) / (np.float32(1.0) - p32)
        with np.errstate(over="ignore"):
            pos = (samples[:, None].astype(np.uint64) << _u64(32)) | np.arange(T, dtype=np.uint64)[None, :]
            row = _mix(key ^ _mix(pos + _u64(_GOLDEN)))
            cols_g = (np.arange(1, cols + 1, dtype=np.uint64) * _u64(_GOLDEN))
            bits = _mix(row[:, :, None] + cols_g[None, None, :])
        keep = (bits >> _u64(32)) >= _u64(thr)
        return np.where(keep, scale, np.float32(0.0)).astype(np.float32)

    def rows(self, x: torch.Tensor, layer: int, site: int, p: float) -> torch.Tensor:
        """x (B, T, C) through the mask of (layer, site)."""
        if p == 0:
            return x
        b, t, c = x.shape
        samples = self.sample0 + np.arange(b, dtype=np.uint64)
        m = self._keep_scale(self._site(layer, site), samples, t, c, p)
        return x * torch.from_numpy(m)

    def probs(self, w: torch.Tensor, layer: int, p: float) -> torch.Tensor:
        """Attention probabilities w (B, NH, T, T) through the mask of layer's heads."""
        if p == 0:
            return w
        b, nh, t, _ = w.shape
        site = self._site(layer, SITE_ATTN_PROBS)
        samples = self.sample0 + np.arange(b, dtype=np.uint64)
        m = np.stack([self._keep_scale(_mix(site ^ _mul_golden(h + 1)), samples, t, t, p) for h in range(nh)], axis=1)
        return w * torch.from_numpy(m)


class TorchDropout:
    """PyTorch's own dropout (its generator) at the same places: the peer benchmark's."""

    def rows(self, x: torch.Tensor, layer: int, site: int, p: float) -> torch.Tensor:
        return F.dropout(x, p, training=True) if p > 0 else x

    def probs(self, w: torch.Tensor, layer: int, p: float) -> torch.Tensor:
        return F.dropout(w, p, training=True) if p > 0 else w


# The masks of the forward being run (None: no dropout, as evaluation).
DROPOUT: DropoutMasks | TorchDropout | None = None


class Documents:
    """Documents packed into a sample, as Megatron-LM's get_ltor_masks_and_position_ids builds its
    masks (written from that function's definition): after each ``eod`` token of ``tokens`` [B, T]
    a document starts. ``reset_position_ids``: positions after an EOD count again from 0;
    ``reset_attention_mask``: rows after an EOD see no key up to it. ``position_ids`` [B, T] long;
    ``mask`` [B, 1, T, T] bool, True where a query sees a key (causal included)."""

    def __init__(self, tokens: torch.Tensor, eod: int, reset_position_ids: bool,
                 reset_attention_mask: bool):
        b, t = tokens.shape
        mask = torch.tril(torch.ones((b, t, t))).view(b, 1, t, t)
        pos = torch.arange(t, dtype=torch.long).unsqueeze(0).repeat(b, 1)
        for i in range(b):
            prev = 0
            for k in [int(x) for x in torch.nonzero(tokens[i] == eod).flatten()]:
                if reset_attention_mask:
                    mask[i, 0, k + 1:, :k + 1] = 0
                if reset_position_ids:
                    pos[i, k + 1:] -= k + 1 - prev
                    prev = k + 1
        self.position_ids = pos
        self.mask = mask > 0.5


# Set around a forward: its tokens' documents (Megatron's masks and positions); None: one sequence.
DOCUMENTS: Documents | None = None


# ----------------------------------------------------------------------------------------------
# GPT-2
# ----------------------------------------------------------------------------------------------


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """HF ``NewGELUActivation``: the tanh approximation of GELU."""
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
    return 0.5 * x * (1.0 + torch.tanh(inner))


class Conv1D(nn.Module):
    """HF ``Conv1D``: a linear layer with the weight stored as ``[in, out]``."""

    def __init__(self, nx: int, nf: int):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.empty(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class LayerNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n))
        self.bias = nn.Parameter(torch.empty(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.size(-1),), self.weight, self.bias, self.eps)


class GPT2Attention(nn.Module):
    def __init__(self, cfg: dict, layer: int = 0):
        super().__init__()
        self.layer = layer
        self.attn_pdrop = float(cfg.get("attn_pdrop", 0.0))
        self.resid_pdrop = float(cfg.get("resid_pdrop", 0.0))
        self.n_embd = cfg["n_embd"]
        self.n_head = cfg["n_head"]
        self.head_dim = self.n_embd // self.n_head
        self.c_attn = Conv1D(self.n_embd, 3 * self.n_embd)
        self.c_proj = Conv1D(self.n_embd, self.n_embd)
        n_pos = cfg["n_positions"]
        self.register_buffer(
            "bias", torch.tril(torch.ones(n_pos, n_pos, dtype=torch.bool)).view(1, 1, n_pos, n_pos),
            persistent=False)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_head, self.head_dim).permute(0, 2, 1, 3)  # [B, nh, T, hs]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(v.size(-1))
        causal = self.bias[:, :, :t, :t] if DOCUMENTS is None else DOCUMENTS.mask
        w = w.masked_fill(~causal, torch.finfo(w.dtype).min)
        w = F.softmax(w, dim=-1)
        if DROPOUT is not None:
            w = DROPOUT.probs(w, self.layer, self.attn_pdrop)
        y = torch.matmul(w, v)  # [B, nh, T, hs]
        y = y.permute(0, 2, 1, 3).contiguous().view(b, t, c)
        y = self.c_proj(y)
        if DROPOUT is not None:
            y = DROPOUT.rows(y, self.layer, SITE_ATTN_OUT, self.resid_pdrop)
        return y


class GPT2MLP(nn.Module):
    def __init__(self, cfg: dict, layer: int = 0):
        super().__init__()
        self.layer = layer
        self.resid_pdrop = float(cfg.get("resid_pdrop", 0.0))
        c = cfg["n_embd"]
        inner = cfg.get("n_inner") or 4 * c
        self.c_fc = Conv1D(c, inner)
        self.c_proj = Conv1D(inner, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.c_proj(gelu_new(self.c_fc(x)))
        if DROPOUT is not None:
            y = DROPOUT.rows(y, self.layer, SITE_MLP_OUT, self.resid_pdrop)
        return y


class GPT2Block(nn.Module):
    def __init__(self, cfg: dict, layer: int = 0):
        super().__init__()
        c, eps = cfg["n_embd"], cfg.get("layer_norm_epsilon", 1e-5)
        self.ln_1 = LayerNorm(c, eps)
        self.attn = GPT2Attention(cfg, layer)
        self.ln_2 = LayerNorm(c, eps)
        self.mlp = GPT2MLP(cfg, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        c = cfg["n_embd"]
        self.wte = nn.Embedding(cfg["vocab_size"], c)
        self.wpe = nn.Embedding(cfg["n_positions"], c)
        self.h = nn.ModuleList(GPT2Block(cfg, i) for i in range(cfg["n_layer"]))
        self.embd_pdrop = float(cfg.get("embd_pdrop", 0.0))
        self.ln_f = LayerNorm(c, cfg.get("layer_norm_epsilon", 1e-5))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.size(1)
        pos = torch.arange(t, dtype=torch.long, device=tokens.device).unsqueeze(0)
        if DOCUMENTS is not None:
            pos = DOCUMENTS.position_ids  # Hugging Face's position_ids argument
        x = self.wte(tokens) + self.wpe(pos)
        if DROPOUT is not None:
            x = DROPOUT.rows(x, 0, SITE_EMBEDDING, self.embd_pdrop)
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        assert cfg.get("activation_function", "gelu_new") == "gelu_new"
        assert cfg.get("tie_word_embeddings", True)
        self.config = cfg
        self.transformer = GPT2Model(cfg)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.transformer(tokens)
        return F.linear(h, self.transformer.wte.weight)  # tied lm_head: h @ wte.T


# ----------------------------------------------------------------------------------------------
# LLaMA
# ----------------------------------------------------------------------------------------------


class LlamaRMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * x.to(input_dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling=None, device=None) -> torch.Tensor:
    """HF's modeling_rope_utils: the default inverse frequencies, then rope_scaling's "linear"
    (divided by factor), "llama3" (Llama 3.1's wavelength bands) or "yarn" (its correction ramp;
    the scaling must name original_max_position_embeddings), fp32 as transformers computes them;
    "dynamic" below max_position_embeddings is the default."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        inv_freq = torch.where(medium, blended, scaled)
    elif kind == "yarn":
        # transformers' _compute_yarn_parameters: frequencies that turn fewer than beta_slow times
        # over the original context are divided by factor, more than beta_fast times kept, the dims
        # between ramped linearly (floor/ceil of the correction range unless truncate is false).
        factor = scaling["factor"]
        old_len = scaling["original_max_position_embeddings"]
        beta_fast = scaling.get("beta_fast") or 32
        beta_slow = scaling.get("beta_slow") or 1

        def correction_dim(turns):
            return (head_dim * math.log(old_len / (turns * 2 * math.pi))) / (2 * math.log(theta))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32, device=device) - low) / (high - low), 0, 1)
        pos_freqs = theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
        extrapolation = 1 - ramp
        inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    elif kind not in ("default", "dynamic"):
        raise ValueError(f"rope_type {kind} is not transcribed here")
    return inv_freq


def rope_attention_factor(scaling=None) -> float:
    """yarn's scale of cos and sin (transformers' attention_factor): given, or 0.1 ln(factor) + 1
    (with mscale and mscale_all_dim, the ratio of that at each); 1 for the other types."""
    scaling = scaling or {}
    if scaling.get("rope_type", scaling.get("type")) != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return scaling["attention_factor"]
    factor = scaling["factor"]

    def mscale(m=1):
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return float(mscale(scaling["mscale"]) / mscale(scaling["mscale_all_dim"]))
    return mscale()


def rope_cos_sin(head_dim: int, t: int, theta: float, device=None, scaling=None):
    """HF ``LlamaRotaryEmbedding`` (rope_scaling as rope_inv_freq), positions 0..t-1, fp32."""
    inv_freq = rope_inv_freq(head_dim, theta, scaling, device)
    pos = torch.arange(t, device=device).float()
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, hs]
    scale = rope_attention_factor(scaling)
    return emb.cos() * scale, emb.sin() * scale


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    cos = cos.to(q.dtype)
    sin = sin.to(q.dtype)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, nkv, T, hs] -> [B, nkv*n_rep, T, hs]; query head h uses kv head h // n_rep."""
    if n_rep == 1:
        return x
    b, nkv, t, hs = x.shape
    return x[:, :, None, :, :].expand(b, nkv, n_rep, t, hs).reshape(b, nkv * n_rep, t, hs)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: dict, layer: int = 0):
        super().__init__()
        self.layer = layer
        self.attention_dropout = float(cfg.get("attention_dropout", 0.0))
        h = cfg["hidden_size"]
        self.n_head = cfg["num_attention_heads"]
        self.n_kv = cfg.get("num_key_value_heads") or self.n_head
        self.head_dim = cfg.get("head_dim") or h // self.n_head
        self.theta = float(cfg.get("rope_theta", 10000.0))
        self.rope_scaling = cfg.get("rope_scaling")
        # Qwen2Attention: q/k/v with biases, o_proj without; LlamaAttention: attention_bias on all four.
        qwen2 = cfg.get("model_type") == "qwen2"
        qkv_bias = qwen2 or bool(cfg.get("attention_bias", False))
        o_bias = not qwen2 and bool(cfg.get("attention_bias", False))
        self.q_proj = nn.Linear(h, self.n_head * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(self.n_head * self.head_dim, h, bias=o_bias)
        self._rope_cache = {}

    def _cos_sin(self, t: int, device):
        key = (t, str(device))
        if key not in self._rope_cache:
            self._rope_cache[key] = rope_cos_sin(self.head_dim, t, self.theta, device, self.rope_scaling)
        return self._rope_cache[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        cos, sin = self._cos_sin(t, x.device)
        if DOCUMENTS is not None:  # Hugging Face's position_ids: each row's angles, [B, 1, T, hs]
            cos = cos[DOCUMENTS.position_ids].unsqueeze(1)
            sin = sin[DOCUMENTS.position_ids].unsqueeze(1)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k = repeat_kv(k, self.n_head // self.n_kv)
        v = repeat_kv(v, self.n_head // self.n_kv)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        if DOCUMENTS is not None:
            causal = DOCUMENTS.mask
        w = w.masked_fill(~causal, torch.finfo(w.dtype).min)
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        if DROPOUT is not None:
            w = DROPOUT.probs(w, self.layer, self.attention_dropout)
        y = torch.matmul(w, v)  # [B, nh, T, hs]
        y = y.transpose(1, 2).contiguous().view(b, t, self.n_head * self.head_dim)
        return self.o_proj(y)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        h, i = cfg["hidden_size"], cfg["intermediate_size"]
        assert cfg.get("hidden_act", "silu") == "silu"
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: dict, layer: int = 0):
        super().__init__()
        h, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.self_attn = LlamaAttention(cfg, layer)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = LlamaRMSNorm(h, eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        h = cfg["hidden_size"]
        # Hugging Face's LlamaModel: the pad_token_id row is nn.Embedding's padding_idx
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], h, cfg.get("pad_token_id"))
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i) for i in range(cfg["num_hidden_layers"]))
        self.norm = LlamaRMSNorm(h, cfg.get("rms_norm_eps", 1e-6))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        assert not cfg.get("tie_word_embeddings", False), "tied LLaMA embeddings not supported"
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(tokens))


# ----------------------------------------------------------------------------------------------
# Construction and initialisation
# ----------------------------------------------------------------------------------------------


class ForSequenceClassification(nn.Module):
    """Hugging Face's GPT2ForSequenceClassification / LlamaForSequenceClassification: the trunk
    (``transformer`` / ``model``), a bias-free ``score`` Linear(C, num_labels) on every position,
    pooled at the last non-pad token exactly as HF finds it (transformers' current rule): the
    largest index whose token is not pad_token_id, 0 when every token is pad (an earlier HF took
    the first pad token's index minus 1; the two differ where the text holds the pad id)."""

    def __init__(self, cfg: dict, num_labels: int, pad_token_id: int):
        super().__init__()
        self.config = cfg
        self.pad_token_id = pad_token_id
        if cfg.get("model_type") == "gpt2":
            self.transformer = GPT2Model(cfg)
        else:
            self.model = LlamaModel(cfg)
        self.score = nn.Linear(cfg.get("n_embd") or cfg["hidden_size"], num_labels, bias=False)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        trunk = self.transformer if hasattr(self, "transformer") else self.model
        logits = self.score(trunk(tokens))  # (B, T, num_labels)
        non_pad = torch.ne(tokens, self.pad_token_id).int()
        last = (torch.arange(tokens.shape[-1]) * non_pad).argmax(-1)
        pooled = logits[torch.arange(tokens.shape[0]), last]
        return logits, pooled


def build_model(cfg: dict) -> nn.Module:
    """The causal LM for ``cfg["model_type"]`` ('gpt2', 'llama' or 'qwen2': Qwen2ForCausalLM is
    LlamaForCausalLM with q/k/v biases), fp32, uninitialised."""
    kind = cfg.get("model_type")
    if kind == "gpt2":
        return GPT2LMHeadModel(cfg)
    if kind in ("llama", "qwen2"):
        return LlamaForCausalLM(cfg)
    raise ValueError(f"unsupported model_type {kind!r}")


# Input and output embeddings (LLaMA's untied lm_head too, so its logits are not flat either).
EMBEDDING_NAMES = ("transformer.wte.weight", "transformer.wpe.weight", "model.embed_tokens.weight",
                   "lm_head.weight")


def _is_norm(name: str) -> bool:
    return any(s in name for s in ("ln_1.", "ln_2.", "ln_f.", "layernorm.", "model.norm."))


@torch.no_grad()
def init_params(model: nn.Module) -> None:
    """Golden-data init (every parameter matters), in ``named_parameters`` order from the global
    RNG: embeddings (EMBEDDING_NAMES) normal(0, 0.2); other matrices normal(0, 0.02); norm
    weights 1 + 0.1*randn; biases (LayerNorm's included) 0.1*randn."""
    for name, p in model.named_parameters():
        if name in EMBEDDING_NAMES:
            p.copy_(torch.randn(p.shape) * 0.2)
        elif name.endswith(".bias"):
            p.copy_(torch.randn(p.shape) * 0.1)
        elif _is_norm(name):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape))
        else:
            p.copy_(torch.randn(p.shape) * 0.02)


@torch.no_grad()
def init_hf(model: nn.Module) -> None:
    """Hugging Face's init: matrices normal(0, initializer_range), biases 0, norm weights 1."""
    std = float(model.config.get("initializer_range", 0.02))
    for name, p in model.named_parameters():
        if name.endswith(".bias"):
            p.zero_()
        elif _is_norm(name):
            p.fill_(1.0)
        else:
            p.normal_(0.0, std)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over positions whose target is not -100."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1).long(),
                           ignore_index=-100)
