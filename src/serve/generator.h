// Generator: autoregressive inference with a KV cache over a TransformerLM, in f32, for one or
// more independent sequences ("slots").
//
// It reads the model's f32 master weights in place through their Hugging Face names (GPT-2's
// Conv1D weights (in, out), LLaMA's nn.Linear weights (out, in)), so it always sees the model's
// current weights and needs no prepare(). The math is TransformerLM's, row by row: GPT-2 (learned
// positions, LayerNorm, GELU tanh, tied head) and LLaMA (RoPE rotate_half, RMSNorm, SwiGLU, GQA,
// untied head). Keys (after RoPE) and values of every position are kept (serve/kv_cache.h), so a
// decode step runs the GEMMs on one row and attends in O(position). A chunk at position 0 (a
// prompt's first) attends with training's tiled kernel (kernels/cpu/attention.h).
//
//   serve::Generator gen(model);
//   std::span<const float> logits = gen.prefill(prompt);   // (V) of the prompt's last position
//   logits = gen.decode(next_id);                          // (V) of next_id's position
//   std::vector<int32_t> ids = gen.generate(prompt, 64, {.temperature = 0.8f, .top_p = 0.95f});
//
// With options.slots = S the generator holds S sequences, each with its own cache rows and
// position. decode_batch() appends one token to each of several slots in one pass: the GEMMs run
// on all their rows together, so the weights are read once a step for every sequence (the
// continuous batching of serve/scheduler.h); each row attends over its own slot.
//
//   gen.prefill(0, a); gen.prefill(1, b);
//   std::span<const float> rows = gen.decode_batch({0, 1}, {ta, tb});   // (2, V)
//
// NOTE: the model must outlive the generator; the generator is not thread-safe (its kernels use
// all OpenMP threads).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "models/transformer.h"
#include "serve/kv_cache.h"
#include "serve/sampler.h"
#include "tensor/allocator.h"

namespace mt::serve {

struct GeneratorOptions {
  int capacity = 0;         // positions the cache holds; 0 = the model's max_positions
  int prefill_chunk = 512;  // a prompt runs in chunks of at most this many rows (bounds scratch)
  int slots = 1;            // sequences held at once (each has capacity positions of cache)
  // kBF16: the matrices (attention, MLP, the head) are copied to bf16 at construction and the
  // GEMMs run on bf16 operands (each row rounded to bf16 on its way in; f32 accumulation and
  // output): half the bytes a decode step reads. A snapshot: later changes to the model's weights
  // are not seen. Embeddings, norms, biases, the KV cache and attention stay f32.
  DType weights = DType::kF32;
};

class Generator {
 public:
  // Throws kInvalidArgument when options.capacity exceeds the model's max_positions (n_positions /
  // max_position_embeddings), prefill_chunk < 1 or slots < 1.
  explicit Generator(models::TransformerLM& model, const GeneratorOptions& options = {});

  int capacity() const { return cache_.capacity(); }
  int slots() const { return cache_.slots(); }
  // Tokens in slot s's cache = the position of its next token.
  int position(int slot = 0) const { return pos_.at(slot); }
  int vocab_size() const { return cfg_.vocab_size; }
  DType weights() const { return weights_; }  // the GEMMs' matrices (f32 where bf16 was asked of a CPU without AVX512-BF16)
  size_t cache_bytes() const { return cache_.bytes(); }

  void reset(int slot = 0) { pos_.at(slot) = 0; }  // forgets slot's sequence

  // Starts a new sequence in slot: runs prompt at positions [0, n) and returns the logits (V) of
  // its last position, valid until the next prefill/decode. Throws kInvalidArgument (nothing
  // changed) when the slot does not exist, the prompt is empty, longer than capacity() or holds an
  // id outside [0, V).
  std::span<const float> prefill(int slot, const std::vector<int32_t>& prompt);
  // The same, calling each(i, logits (V) of position i) for every position but the last, in order
  // (the distribution of prompt token i + 1: echo's prompt logprobs). The head runs on a block of
  // rows at a time (kScoreRows), so no (n, V) logits are held.
  std::span<const float> prefill(int slot, const std::vector<int32_t>& prompt,
                                 const std::function<void(int, std::span<const float>)>& each);
  std::span<const float> prefill(const std::vector<int32_t>& prompt) { return prefill(0, prompt); }
  // Appends token at position(slot) and returns its logits (V). Throws kInvalidArgument (nothing
  // changed) when the context is full or the token is outside [0, V).
  std::span<const float> decode(int slot, int32_t token);
  std::span<const float> decode(int32_t token) { return decode(0, token); }
  // Appends tokens[i] to slot slots[i] for every i in one pass and returns the logits (n, V), row i
  // for slots[i], valid until the next prefill/decode. Throws kInvalidArgument (nothing changed)
  // when the spans differ in size or are empty, a slot repeats or does not exist, its context is
  // full, or a token is outside [0, V).
  std::span<const float> decode_batch(std::span<const int> slots, std::span<const int32_t> tokens);

  // prefill(prompt), then up to max_new_tokens draws, each fed back by decode. Returns the new
  // ids; they end early after stop_token (included) or when the context is full (capacity() -
  // prompt.size() + 1 ids at most). Throws as prefill does, or for invalid options.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int max_new_tokens,
                                const SamplingOptions& options,
                                std::optional<int32_t> stop_token = std::nullopt);

 private:
  struct LayerWeights {  // views of the master weights (matrices: f32, or the bf16 copies); b* are GPT-2's biases
    const float *norm1_w, *norm1_b;  // (C)
    const void* qkv_w;               // GPT-2 c_attn (C, QKV) + (QKV) | LLaMA q|k|v (QKV, C)
    const float* qkv_b;
    const void* proj_w;              // GPT-2 c_proj (A, C) + (C)     | LLaMA o_proj (C, A)
    const float* proj_b;
    const float *norm2_w, *norm2_b;  // (C)
    const void* up_w;                // GPT-2 c_fc (C, H) + (H)       | LLaMA gate|up (H, C)
    const float* up_b;
    const void* down_w;              // GPT-2 c_proj (G, C) + (C)     | LLaMA down_proj (C, G)
    const float* down_b;
  };
  // y (M, out) = x (M, in) · W + b with the matrices' dtype (W stored (in, out), or (out, in)).
  void linear(float* y, const float* x, int M, int in, int out, const void* w, bool out_in, const float* b);
  // The bf16 copies of the matrices (GeneratorOptions::weights).
  void pack_bf16();
  const float* weight(const std::string& name, std::vector<int64_t> shape) const;
  void bind_weights();
  void check_token(int32_t token, int position) const;
  void check_slot(int slot) const;
  void ensure_rows(int n);
  // Runs tokens (n) of one slot at positions [pos_[slot], + n) (chunk), caching their keys and
  // values; leaves the logits of the last one in logits_. REQUIRES: they fit the capacity.
  void forward_chunk(int slot, const int32_t* tokens, int n,
                     const std::function<void(int, std::span<const float>)>* each = nullptr, int last_scored = 0);
  // Runs token i at position pos_[slots[i]] of slot slots[i] for i < n; leaves logits (n, V).
  void forward_rows(const int* slots, const int32_t* tokens, int n);
  // x (n, C) += layer l's attention and MLP. Rows are a chunk of `slot` at [pos0, pos0 + n) when
  // row_slot == nullptr, else row i is position row_pos[i] of slot row_slot[i].
  void block_forward(int l, int n, int slot, int pos0, const int* row_slot, const int* row_pos);

  models::TransformerLM& model_;
  models::ModelConfig cfg_;
  int C_, NH_, NKV_, HS_, QKV_, A_, H_, G_;  // widths as in models::BlockDims
  bool gpt2_;
  const float* wte_ = nullptr;   // (V, C)
  const float* wpe_ = nullptr;   // (max_positions, C), GPT-2
  const void* head_ = nullptr;   // (V, C): wte (tied) or lm_head.weight (or its bf16 copy)
  DType weights_ = DType::kF32;  // the matrices' dtype
  Buffer packed_;                // their bf16 copies
  std::vector<bf16_t> xb_;       // a GEMM's rows in bf16
  const float* norm_f_w_ = nullptr;
  const float* norm_f_b_ = nullptr;  // GPT-2
  std::vector<LayerWeights> layers_;

  KvCache cache_;
  std::vector<int> pos_;  // per slot
  std::vector<int> row_pos_;
  int prefill_chunk_;
  Buffer fixed_;  // workspace: logits (slots, V), final-norm row (C), RoPE tables (capacity, HS/2) x 2
  float* logits_ = nullptr;
  static constexpr int kScoreRows = 16;  // prompt rows the head runs on at once for prefill's each
  std::vector<float> score_rows_;        // (kScoreRows, V), made at the first scored prefill
  float* final_row_ = nullptr;
  float* rope_cos_ = nullptr;
  float* rope_sin_ = nullptr;
  // Workspace for up to rows_cap_ rows: x, n, f (C); qkv (QKV); att (A); h (H); act (G);
  // mean, rstd (1); lse (NH).
  Buffer rows_;
  int rows_cap_ = 0;
  float *x_ = nullptr, *n_ = nullptr, *f_ = nullptr, *qkv_ = nullptr, *att_ = nullptr;
  float *h_ = nullptr, *act_ = nullptr, *mean_ = nullptr, *rstd_ = nullptr, *lse_ = nullptr;
};

}  // namespace mt::serve
