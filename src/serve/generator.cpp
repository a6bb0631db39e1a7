#include "serve/generator.h"

#include <algorithm>
#include <cstring>

#include "base/cpu_features.h"
#include "base/error.h"
#include "base/log.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemv_bf16.h"
#include "kernels/cpu/ops.h"

namespace mt::serve {
namespace {

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

}  // namespace

// y (M, out) = x (M, in) · W + b, W stored (in, out) (GPT-2 Conv1D) or (out, in) (nn.Linear, then
// Y = X W^T + b). b may be nullptr. With bf16 matrices the rows are rounded to bf16 first.
void Generator::linear(float* y, const float* x, int M, int in, int out, const void* w, bool out_in, const float* b) {
  if (weights_ == DType::kF32) {
    kernels::gemm(M, out, in, x, in, false, w, out_in ? in : out, out_in, y, out, DType::kF32, false, b);
    return;
  }
  // The bf16 copies are all (out, in) (pack_bf16 transposes GPT-2's Conv1D ones).
  (void)out_in;
  const size_t n = static_cast<size_t>(M) * static_cast<size_t>(in);
  if (xb_.size() < n) xb_.resize(n);
  convert_f32_to_bf16(xb_.data(), x, n);
  if (M <= kernels::kGemvBf16MaxRows) {  // a decode step: each weight row read once for every row
    kernels::gemv_bf16(M, out, in, xb_.data(), static_cast<const bf16_t*>(w), y, b);
    return;
  }
  kernels::gemm(M, out, in, xb_.data(), in, false, w, in, true, y, out, DType::kBF16, false, b);
}

void Generator::pack_bf16() {
  const size_t C = C_, V = cfg_.vocab_size;
  const size_t per_layer = C * QKV_ + A_ * C + C * H_ + G_ * C;
  packed_ = Buffer((per_layer * cfg_.n_layer + V * C) * sizeof(bf16_t), MemCategory::kParams);
  bf16_t* p = packed_.as<bf16_t>();
  // Each matrix as (out, in) rows: GPT-2's Conv1D (in, out) transposed, LLaMA's as they are.
  auto copy = [&p, this](const void* src, size_t in, size_t out) {
    const float* f = static_cast<const float*>(src);
    if (gpt2_) {
#pragma omp parallel for schedule(static)
      for (size_t o = 0; o < out; ++o)
        for (size_t i = 0; i < in; ++i) p[o * in + i] = f32_to_bf16(f[i * out + o]);
    } else {
      convert_f32_to_bf16(p, f, in * out);
    }
    const void* at = p;
    p += in * out;
    return at;
  };
  for (LayerWeights& w : layers_) {
    w.qkv_w = copy(w.qkv_w, C, QKV_);
    w.proj_w = copy(w.proj_w, A_, C);
    w.up_w = copy(w.up_w, C, H_);
    w.down_w = copy(w.down_w, G_, C);
  }
  convert_f32_to_bf16(p, static_cast<const float*>(head_), V * C);  // (V, C) in every model
  head_ = p;
  p += V * C;
  weights_ = DType::kBF16;
}

Generator::Generator(models::TransformerLM& model, const GeneratorOptions& options)
    : model_(model), cfg_(model.config()), prefill_chunk_(options.prefill_chunk) {
  const int P = cfg_.max_positions;
  const int capacity = options.capacity == 0 ? P : options.capacity;
  MT_CHECK(capacity > 0 && capacity <= P, ErrorKind::kInvalidArgument,
           "generator: capacity " + std::to_string(capacity) + " must be in [1, " +
               std::to_string(P) + "] (the model's max_positions)");
  MT_CHECK(prefill_chunk_ > 0, ErrorKind::kInvalidArgument,
           "generator: prefill_chunk must be positive, got " + std::to_string(prefill_chunk_));
  MT_CHECK(options.slots > 0, ErrorKind::kInvalidArgument,
           "generator: slots must be positive, got " + std::to_string(options.slots));
  gpt2_ = cfg_.arch == models::Arch::kGpt2;
  C_ = cfg_.hidden; NH_ = cfg_.n_head; NKV_ = cfg_.n_kv_head; HS_ = cfg_.head_dim();
  QKV_ = (NH_ + 2 * NKV_) * HS_; A_ = NH_ * HS_;
  H_ = gpt2_ ? cfg_.intermediate : 2 * cfg_.intermediate;
  G_ = cfg_.intermediate;
  MT_CHECK(options.weights == DType::kF32 || options.weights == DType::kBF16, ErrorKind::kInvalidArgument,
           std::string("generator: weights in ") + dtype_name(options.weights) + " are not supported (f32, bf16)");
  bind_weights();
  // bf16 weights need AVX512-BF16: without it the GEMV runs its portable body and oneDNN widens
  // each matrix to f32 at every prefill (several times slower than f32 weights).
  if (options.weights == DType::kBF16 && isa_active() != Isa::kAvx512)
    log_warning("generator: bf16 weights need AVX512-BF16, which this CPU lacks (or MT_ISA=portable): f32 weights used");
  else if (options.weights == DType::kBF16)
    pack_bf16();
  cache_ = KvCache(cfg_.n_layer, capacity, NH_, NKV_, HS_, options.slots);
  pos_.assign(options.slots, 0);

  const size_t V = cfg_.vocab_size, half = static_cast<size_t>(capacity) * (HS_ / 2);
  const size_t rope = gpt2_ ? 0 : 2 * align16(half), S = options.slots;
  fixed_ = Buffer((align16(S * V) + align16(C_) + rope) * sizeof(float), MemCategory::kWorkspace);
  logits_ = fixed_.as<float>();
  final_row_ = logits_ + align16(S * V);
  if (!gpt2_) {
    rope_cos_ = final_row_ + align16(C_);
    rope_sin_ = rope_cos_ + align16(half);
    // Row t of the table is position t, exactly as TransformerLM's (T, HS/2) table.
    models::rope_tables(cfg_, rope_cos_, rope_sin_, capacity);
  }
  ensure_rows(1);
}

const float* Generator::weight(const std::string& name, std::vector<int64_t> shape) const {
  const nn::Parameter* p = model_.store().find(name);
  MT_CHECK(p != nullptr, ErrorKind::kInternal, "generator: the model has no parameter " + name);
  MT_CHECK(p->shape == shape, ErrorKind::kInternal,
           "generator: " + name + " has shape " + shape_str(p->shape) + ", expected " + shape_str(shape));
  return p->master;
}

void Generator::bind_weights() {
  const int64_t C = C_, V = cfg_.vocab_size, I = cfg_.intermediate, A = A_, KV = NKV_ * HS_;
  layers_.resize(cfg_.n_layer);
  if (gpt2_) {
    wte_ = weight("transformer.wte.weight", {V, C});
    head_ = wte_;
    wpe_ = weight("transformer.wpe.weight", {cfg_.max_positions, C});
    norm_f_w_ = weight("transformer.ln_f.weight", {C});
    norm_f_b_ = weight("transformer.ln_f.bias", {C});
    for (int l = 0; l < cfg_.n_layer; ++l) {
      const std::string b = "transformer.h." + std::to_string(l) + ".";
      LayerWeights& w = layers_[l];
      w.norm1_w = weight(b + "ln_1.weight", {C});
      w.norm1_b = weight(b + "ln_1.bias", {C});
      w.qkv_w = weight(b + "attn.c_attn.weight", {C, QKV_});
      w.qkv_b = weight(b + "attn.c_attn.bias", {QKV_});
      w.proj_w = weight(b + "attn.c_proj.weight", {A, C});
      w.proj_b = weight(b + "attn.c_proj.bias", {C});
      w.norm2_w = weight(b + "ln_2.weight", {C});
      w.norm2_b = weight(b + "ln_2.bias", {C});
      w.up_w = weight(b + "mlp.c_fc.weight", {C, I});
      w.up_b = weight(b + "mlp.c_fc.bias", {I});
      w.down_w = weight(b + "mlp.c_proj.weight", {I, C});
      w.down_b = weight(b + "mlp.c_proj.bias", {C});
    }
    return;
  }
  wte_ = weight("model.embed_tokens.weight", {V, C});
  head_ = cfg_.tie_embeddings ? wte_ : weight("lm_head.weight", {V, C});
  norm_f_w_ = weight("model.norm.weight", {C});
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    LayerWeights& w = layers_[l];
    w.norm1_w = weight(b + "input_layernorm.weight", {C});
    // q|k|v and gate|up are registered consecutively: one (QKV, C) and one (2I, C) matrix.
    const float* q = weight(b + "self_attn.q_proj.weight", {A, C});
    w.qkv_w = q;
    MT_INTERNAL_CHECK(weight(b + "self_attn.k_proj.weight", {KV, C}) == q + A * C);
    MT_INTERNAL_CHECK(weight(b + "self_attn.v_proj.weight", {KV, C}) == q + (A + KV) * C);
    if (cfg_.qkv_bias) {  // Qwen2: q|k|v's biases are registered consecutively too, one (QKV) vector
      w.qkv_b = weight(b + "self_attn.q_proj.bias", {A});
      MT_INTERNAL_CHECK(weight(b + "self_attn.k_proj.bias", {KV}) == w.qkv_b + A);
      MT_INTERNAL_CHECK(weight(b + "self_attn.v_proj.bias", {KV}) == w.qkv_b + A + KV);
    }
    w.proj_w = weight(b + "self_attn.o_proj.weight", {C, A});
    if (cfg_.o_bias) w.proj_b = weight(b + "self_attn.o_proj.bias", {C});
    w.norm2_w = weight(b + "post_attention_layernorm.weight", {C});
    const float* gate = weight(b + "mlp.gate_proj.weight", {I, C});
    w.up_w = gate;
    MT_INTERNAL_CHECK(weight(b + "mlp.up_proj.weight", {I, C}) == gate + I * C);
    w.down_w = weight(b + "mlp.down_proj.weight", {C, I});
  }
}

void Generator::ensure_rows(int n) {
  if (n <= rows_cap_) return;
  const size_t N = n;
  const size_t floats = 3 * align16(N * C_) + align16(N * QKV_) + align16(N * A_) +
                        align16(N * H_) + align16(N * G_) + 2 * align16(N) + align16(N * NH_);
  rows_ = Buffer(floats * sizeof(float), MemCategory::kWorkspace);
  float* p = rows_.as<float>();
  auto take = [&p](size_t count) { float* q = p; p += align16(count); return q; };
  x_ = take(N * C_); n_ = take(N * C_); f_ = take(N * C_);
  qkv_ = take(N * QKV_); att_ = take(N * A_); h_ = take(N * H_); act_ = take(N * G_);
  mean_ = take(N); rstd_ = take(N); lse_ = take(N * NH_);
  rows_cap_ = n;
}

void Generator::check_token(int32_t token, int position) const {
  MT_CHECK(token >= 0 && token < cfg_.vocab_size, ErrorKind::kInvalidArgument,
           "generator: token " + std::to_string(token) + " at position " + std::to_string(position) +
               " is outside the vocabulary [0, " + std::to_string(cfg_.vocab_size) + ")");
}

void Generator::check_slot(int slot) const {
  MT_CHECK(slot >= 0 && slot < slots(), ErrorKind::kInvalidArgument,
           "generator: slot " + std::to_string(slot) + " outside [0, " + std::to_string(slots()) + ")");
}

std::span<const float> Generator::prefill(int slot, const std::vector<int32_t>& prompt) {
  return prefill(slot, prompt, nullptr);
}

std::span<const float> Generator::prefill(int slot, const std::vector<int32_t>& prompt,
                                          const std::function<void(int, std::span<const float>)>& each) {
  check_slot(slot);
  const int n = static_cast<int>(prompt.size());
  MT_CHECK(n > 0, ErrorKind::kInvalidArgument, "generator: empty prompt");
  MT_CHECK(prompt.size() <= static_cast<size_t>(capacity()), ErrorKind::kInvalidArgument,
           "generator: prompt of " + std::to_string(prompt.size()) +
               " tokens does not fit the context of " + std::to_string(capacity()));
  for (int i = 0; i < n; ++i) check_token(prompt[i], i);
  ensure_rows(std::min(n, prefill_chunk_));
  pos_[slot] = 0;
  for (int i = 0; i < n; i += prefill_chunk_)
    forward_chunk(slot, prompt.data() + i, std::min(prefill_chunk_, n - i), each ? &each : nullptr, n - 2);
  return {logits_, static_cast<size_t>(cfg_.vocab_size)};
}

std::span<const float> Generator::decode(int slot, int32_t token) {
  return decode_batch(std::span<const int>(&slot, 1), std::span<const int32_t>(&token, 1));
}

std::span<const float> Generator::decode_batch(std::span<const int> slots, std::span<const int32_t> tokens) {
  const int n = static_cast<int>(slots.size());
  MT_CHECK(n > 0 && tokens.size() == slots.size(), ErrorKind::kInvalidArgument,
           "generator: decode_batch needs one token per slot, got " + std::to_string(tokens.size()) +
               " tokens for " + std::to_string(slots.size()) + " slots");
  std::vector<char> seen(this->slots(), 0);
  for (int i = 0; i < n; ++i) {
    const int s = slots[i];
    check_slot(s);
    MT_CHECK(!seen[s], ErrorKind::kInvalidArgument, "generator: slot " + std::to_string(s) + " appears twice in a batch");
    seen[s] = 1;
    MT_CHECK(pos_[s] < capacity(), ErrorKind::kInvalidArgument,
             "generator: the context is full (" + std::to_string(capacity()) + " tokens) in slot " +
                 std::to_string(s) + "; reset() or prefill() a shorter sequence");
    check_token(tokens[i], pos_[s]);
  }
  ensure_rows(n);
  forward_rows(slots.data(), tokens.data(), n);
  return {logits_, static_cast<size_t>(n) * cfg_.vocab_size};
}

void Generator::forward_chunk(int slot, const int32_t* tokens, int n,
                              const std::function<void(int, std::span<const float>)>* each, int last_scored) {
  const int pos = pos_[slot];
  MT_INTERNAL_CHECK(n > 0 && n <= rows_cap_ && pos + n <= capacity());
  // wpe rows [pos, pos + n): embedding_forward adds wpe[i % T] to row i, so T = n.
  kernels::embedding_forward(x_, tokens, wte_, DType::kF32,
                             wpe_ ? wpe_ + static_cast<size_t>(pos) * C_ : nullptr, n, n, C_);
  for (int l = 0; l < cfg_.n_layer; ++l) block_forward(l, n, slot, pos, nullptr, nullptr);
  pos_[slot] += n;
  if (each != nullptr && pos <= last_scored) {  // every row's logits, a block of rows at a time
    if (gpt2_) {
      kernels::layernorm_forward(n_, mean_, rstd_, x_, norm_f_w_, norm_f_b_, n, C_, cfg_.norm_eps);
    } else {
      kernels::rmsnorm_forward(n_, rstd_, x_, norm_f_w_, n, C_, cfg_.norm_eps);
    }
    const size_t V = static_cast<size_t>(cfg_.vocab_size);
    score_rows_.resize(static_cast<size_t>(kScoreRows) * V);
    const int rows = std::min(n, last_scored - pos + 1);
    for (int r0 = 0; r0 < rows; r0 += kScoreRows) {
      const int r = std::min(kScoreRows, rows - r0);
      linear(score_rows_.data(), n_ + static_cast<size_t>(r0) * C_, r, C_, cfg_.vocab_size, head_, /*out_in=*/true, nullptr);
      for (int i = 0; i < r; ++i)
        (*each)(pos + r0 + i, std::span<const float>(score_rows_.data() + static_cast<size_t>(i) * V, V));
    }
  }
  // Final norm and head on the last row only.
  const float* last = x_ + static_cast<size_t>(n - 1) * C_;
  if (gpt2_) {
    kernels::layernorm_forward(final_row_, mean_, rstd_, last, norm_f_w_, norm_f_b_, 1, C_, cfg_.norm_eps);
  } else {
    kernels::rmsnorm_forward(final_row_, rstd_, last, norm_f_w_, 1, C_, cfg_.norm_eps);
  }
  linear(logits_, final_row_, 1, C_, cfg_.vocab_size, head_, /*out_in=*/true, nullptr);
}

void Generator::forward_rows(const int* slots, const int32_t* tokens, int n) {
  MT_INTERNAL_CHECK(n > 0 && n <= rows_cap_);
  row_pos_.resize(n);
  for (int i = 0; i < n; ++i) row_pos_[i] = pos_[slots[i]];
  kernels::embedding_forward(x_, tokens, wte_, DType::kF32, nullptr, n, n, C_);
  if (wpe_)  // each row's own position
    for (int i = 0; i < n; ++i)
      kernels::add_inplace(x_ + static_cast<size_t>(i) * C_, wpe_ + static_cast<size_t>(row_pos_[i]) * C_, C_);
  for (int l = 0; l < cfg_.n_layer; ++l) block_forward(l, n, -1, -1, slots, row_pos_.data());
  for (int i = 0; i < n; ++i) ++pos_[slots[i]];
  if (gpt2_) {
    kernels::layernorm_forward(n_, mean_, rstd_, x_, norm_f_w_, norm_f_b_, n, C_, cfg_.norm_eps);
  } else {
    kernels::rmsnorm_forward(n_, rstd_, x_, norm_f_w_, n, C_, cfg_.norm_eps);
  }
  linear(logits_, n_, n, C_, cfg_.vocab_size, head_, /*out_in=*/true, nullptr);
}

// x (n, C) += attention and MLP of layer l, as models::Block::forward does for these rows.
void Generator::block_forward(int l, int n, int slot, int pos0, const int* row_slot, const int* row_pos) {
  const LayerWeights& w = layers_[l];
  const float eps = cfg_.norm_eps;
  const size_t NC = static_cast<size_t>(n) * C_;
  const bool out_in = !gpt2_;
  if (gpt2_) {
    kernels::layernorm_forward(n_, mean_, rstd_, x_, w.norm1_w, w.norm1_b, n, C_, eps);
  } else {
    kernels::rmsnorm_forward(n_, rstd_, x_, w.norm1_w, n, C_, eps);
  }
  linear(qkv_, n_, n, C_, QKV_, w.qkv_w, out_in, w.qkv_b);
  const size_t half = HS_ / 2;
  if (row_slot == nullptr) {
    if (!gpt2_)  // row i is position pos0 + i: start the tables at row pos0
      kernels::rope_forward(qkv_, rope_cos_ + pos0 * half, rope_sin_ + pos0 * half, 1, n, NH_, NKV_, HS_);
    cache_.store(slot, l, pos0, n, qkv_);
    if (pos0 == 0) {
      // Nothing cached before these rows: the tiled (flash) kernel of training does the same math.
      kernels::attention_forward(att_, lse_, qkv_, 1, n, NH_, NKV_, HS_);
    } else {
      cache_.attend(att_, slot, l, pos0, n, qkv_);
    }
  } else {
    for (int i = 0; i < n; ++i) {
      float* row = qkv_ + static_cast<size_t>(i) * QKV_;
      const size_t off = row_pos[i] * half;
      if (!gpt2_) kernels::rope_forward(row, rope_cos_ + off, rope_sin_ + off, 1, 1, NH_, NKV_, HS_);
      cache_.store(row_slot[i], l, row_pos[i], 1, row);
    }
    cache_.attend_rows(att_, l, n, qkv_, row_slot, row_pos);
  }
  linear(f_, att_, n, A_, C_, w.proj_w, out_in, w.proj_b);
  kernels::add_inplace(x_, f_, NC);

  if (gpt2_) {
    kernels::layernorm_forward(n_, mean_, rstd_, x_, w.norm2_w, w.norm2_b, n, C_, eps);
    linear(h_, n_, n, C_, H_, w.up_w, out_in, w.up_b);
    kernels::gelu_forward(act_, h_, static_cast<size_t>(n) * G_);
  } else {
    kernels::rmsnorm_forward(n_, rstd_, x_, w.norm2_w, n, C_, eps);
    linear(h_, n_, n, C_, H_, w.up_w, out_in, nullptr);
    kernels::swiglu_forward(act_, h_, n, G_);
  }
  linear(f_, act_, n, G_, C_, w.down_w, out_in, w.down_b);
  kernels::add_inplace(x_, f_, NC);
}

std::vector<int32_t> Generator::generate(const std::vector<int32_t>& prompt, int max_new_tokens,
                                         const SamplingOptions& options,
                                         std::optional<int32_t> stop_token) {
  MT_CHECK(max_new_tokens >= 0, ErrorKind::kInvalidArgument,
           "generator: max_new_tokens must be >= 0, got " + std::to_string(max_new_tokens));
  Sampler sampler(options);
  std::vector<int32_t> out;
  if (max_new_tokens == 0) return out;
  std::span<const float> logits = prefill(prompt);
  for (;;) {
    const int32_t id = sampler.sample(logits);
    out.push_back(id);
    if (static_cast<int>(out.size()) == max_new_tokens || (stop_token && id == *stop_token) ||
        pos_[0] + 1 >= capacity())  // the context holds the prompt and the answer
      return out;
    logits = decode(id);
  }
}

}  // namespace mt::serve
