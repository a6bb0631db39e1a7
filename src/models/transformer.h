// TransformerLM: a GPT-2- or LLaMA-family causal language model with Hugging Face parameter names,
// every parameter a view into the ParamStore's flat buffers, explicit saved activations
// (accounted as "activations") and optional full recompute per block.
//
// Usage:
//   TransformerLM model(cfg, opts);          // parameters initialised from opts.seed
//   model.prepare(B, T);                      // allocates activations for this micro-batch shape
//   float loss = model.forward(tokens, targets, loss_scale);   // loss_scale 0: no backward
//   model.backward();                         // parameter grads += d(loss * loss_scale)
#pragma once

#include <memory>
#include <vector>

#include "models/block.h"
#include "models/config.h"
#include "nn/embedding.h"
#include "nn/param_store.h"
#include "nn/workspace.h"
#include "parallel/zero/partition.h"
#include "tensor/allocator.h"

namespace mt::models {

class TransformerLM : public nn::Module {
 public:
  TransformerLM(const ModelConfig& cfg, const ModelOptions& opts);

  const ModelConfig& config() const { return cfg_; }
  const ModelOptions& options() const { return opts_; }
  nn::ParamStore& store() { return *store_; }
  parallel::TpComm& tp() { return tp_; }
  // Rows of the (padded) vocabulary on this rank: cfg.vocab_size without tensor parallelism.
  int padded_vocab() const;

  void prepare(int B, int T);
  int batch() const { return dims_.B; }
  int seq() const { return dims_.T; }

  // tokens, targets: (B, T) for the prepared shape; targets may hold -100 (ignored) and may be
  // nullptr (then the loss is 0 and no backward is possible). Returns the mean loss over the
  // non-ignored targets. loss_scale != 0 prepares backward of (mean loss * loss_scale).
  // Throws kInvalidArgument naming the first token or target out of range.
  float forward(const int32_t* tokens, const int32_t* targets, float loss_scale);
  void backward();
  // Logits (B, T, V) f32 of a forward over tokens (B, T) of the prepared shape.
  void logits(float* out, const int32_t* tokens);

  // ZeRO units in forward order (embeddings, each block, tail: final norm + untied head) and, for
  // each, the modules whose hooks bracket every use of that unit's parameters: kPreForward /
  // kPostForward around a use that only reads them, kPreBackward / kPostBackward around one that
  // also accumulates their gradients (the fused LM head does that during forward()).
  std::vector<parallel::Unit> zero_units() const;
  std::vector<std::vector<nn::Module*>> zero_unit_modules();

  // FLOPs of one training step on B*T tokens: 6 N_matmul tokens + attention (documented in PERF).
  double train_flops_per_step() const;
  // Bytes of activations saved per token (formula in docs/PERF.md) for the prepared shape.
  size_t activation_bytes() const { return acts_buffer_.bytes() + resid_buffer_.bytes(); }

 private:
  void forward_trunk(const int32_t* tokens);  // embeddings, blocks, final norm -> nfc_
  BlockActs& acts_for(int layer) { return acts_[opts_.recompute ? 0 : layer]; }
  nn::Parameter* head() const { return lm_head_ ? lm_head_->weight() : wte_->weight(); }

  ModelConfig cfg_;
  ModelOptions opts_;
  parallel::TpComm tp_;  // the tensor-parallel group (of one without tensor parallelism)
  nn::Embedding* wte_ = nullptr;
  nn::Embedding* wpe_ = nullptr;  // GPT-2 only
  std::vector<Block*> blocks_;
  nn::Module* norm_f_ = nullptr;  // LayerNorm (GPT-2) or RMSNorm (LLaMA)
  nn::Embedding* lm_head_ = nullptr;  // untied head (LLaMA), shaped like an embedding (V, C)
  std::unique_ptr<nn::ParamStore> store_;

  BlockDims dims_{};
  Buffer acts_buffer_, resid_buffer_, scratch_buffer_, tokens_buffer_;
  std::vector<BlockActs> acts_;
  BlockScratch scratch_{};
  float* resid_ = nullptr;     // (L+1, N, C) block inputs/outputs
  float* norm_mean_ = nullptr;  // (N)
  float* norm_rstd_ = nullptr;  // (N)
  void* nfc_ = nullptr;         // (N, C) cd final-norm output
  float* dnf_ = nullptr;        // (N, C) dL/d(final-norm output), from the fused LM head
  float* dres_ = nullptr;       // (rows, C) residual-stream gradient
  float* sp_full_ = nullptr;    // (N, C) sequence parallel: rows gathered from the tp group
  float* losses_ = nullptr;     // (N)
  float* rope_cos_ = nullptr;   // (T, HS/2)
  float* rope_sin_ = nullptr;
  int32_t* tokens_ = nullptr;   // (N) copy of the last forward's tokens
  int32_t* local_tokens_ = nullptr;  // (N) vocab-parallel: row in this rank's shard, or -1
  bool backward_ready_ = false;
  nn::Workspace ws_;
};

}  // namespace mt::models
