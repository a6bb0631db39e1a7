// Generator: autoregressive inference with a KV cache over a TransformerLM, batch 1, in f32.
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
// NOTE: the model must outlive the generator; one generator serves one sequence at a time and is
// not thread-safe (its kernels use all OpenMP threads).
#pragma once

#include <cstdint>
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
};

class Generator {
 public:
  // Throws kInvalidArgument when options.capacity exceeds the model's max_positions (n_positions /
  // max_position_embeddings) or prefill_chunk < 1.
  explicit Generator(models::TransformerLM& model, const GeneratorOptions& options = {});

  int capacity() const { return cache_.capacity(); }
  int position() const { return pos_; }  // tokens in the cache = position of the next token
  int vocab_size() const { return cfg_.vocab_size; }
  size_t cache_bytes() const { return cache_.bytes(); }

  void reset() { pos_ = 0; }  // forgets the sequence; the next decode is at position 0

  // Starts a new sequence: runs prompt at positions [0, n) and returns the logits (V) of its last
  // position, valid until the next prefill/decode. Throws kInvalidArgument (nothing changed) when
  // the prompt is empty, longer than capacity() or holds an id outside [0, V).
  std::span<const float> prefill(const std::vector<int32_t>& prompt);
  // Appends token at position() and returns its logits (V). Throws kInvalidArgument (nothing
  // changed) when the context is full or the token is outside [0, V).
  std::span<const float> decode(int32_t token);

  // prefill(prompt), then up to max_new_tokens draws, each fed back by decode. Returns the new
  // ids; they end early after stop_token (included) or when the context is full (capacity() -
  // prompt.size() + 1 ids at most). Throws as prefill does, or for invalid options.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int max_new_tokens,
                                const SamplingOptions& options,
                                std::optional<int32_t> stop_token = std::nullopt);

 private:
  struct LayerWeights {  // f32 views of the master weights; b* are GPT-2's biases (else nullptr)
    const float *norm1_w, *norm1_b;  // (C)
    const float *qkv_w, *qkv_b;      // GPT-2 c_attn (C, QKV) + (QKV) | LLaMA q|k|v (QKV, C)
    const float *proj_w, *proj_b;    // GPT-2 c_proj (A, C) + (C)     | LLaMA o_proj (C, A)
    const float *norm2_w, *norm2_b;  // (C)
    const float *up_w, *up_b;        // GPT-2 c_fc (C, H) + (H)       | LLaMA gate|up (H, C)
    const float *down_w, *down_b;    // GPT-2 c_proj (G, C) + (C)     | LLaMA down_proj (C, G)
  };
  const float* weight(const std::string& name, std::vector<int64_t> shape) const;
  void bind_weights();
  void check_token(int32_t token, int position) const;
  void ensure_rows(int n);
  // Runs tokens (n) at positions [pos_, pos_ + n), caching their keys and values; leaves the
  // final-norm logits of the last one in logits_. REQUIRES: pos_ + n <= capacity().
  void forward(const int32_t* tokens, int n);
  void block_forward(int l, int n);

  models::TransformerLM& model_;
  models::ModelConfig cfg_;
  int C_, NH_, NKV_, HS_, QKV_, A_, H_, G_;  // widths as in models::BlockDims
  bool gpt2_;
  const float* wte_ = nullptr;   // (V, C)
  const float* wpe_ = nullptr;   // (max_positions, C), GPT-2
  const float* head_ = nullptr;  // (V, C): wte (tied) or lm_head.weight
  const float* norm_f_w_ = nullptr;
  const float* norm_f_b_ = nullptr;  // GPT-2
  std::vector<LayerWeights> layers_;

  KvCache cache_;
  int pos_ = 0;
  int prefill_chunk_;
  Buffer fixed_;  // workspace: logits (V), final-norm row (C), RoPE tables (capacity, HS/2) x 2
  float* logits_ = nullptr;
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
