// ModelConfig: the architecture of a GPT-2- or LLaMA-family causal LM, in Hugging Face's terms
// (engine/hf_config.h reads it from a config.json with HF's field names).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/sparse_layout.h"
#include "parallel/context.h"
#include "tensor/dtype.h"

namespace mt::models {

enum class Arch { kGpt2, kLlama };

// Hugging Face's config.problem_type for a sequence classifier: what the pooled logits are trained
// against (its *ForSequenceClassification loss): one class of num_labels by softmax cross-entropy;
// num_labels real values by the mean squared error (MSELoss: STS-B, num_labels 1); num_labels
// independent yes/no labels by the mean binary cross-entropy of their logits (BCEWithLogitsLoss).
enum class ProblemType { kSingleLabel, kRegression, kMultiLabel };
const char* problem_type_name(ProblemType p);  // Hugging Face's: "single_label_classification", ...

// Hugging Face's rope_scaling (transformers 5: rope_parameters) for LLaMA: how the rotary
// frequencies are scaled from the default 1 / rope_theta^(2j/HS) (transformers'
// modeling_rope_utils, all in f32):
//   "default"  none;
//   "linear"   every frequency divided by factor (position interpolation);
//   "dynamic"  dynamic NTK: the default frequencies at every position below max_position_embeddings,
//              and here no position reaches it (seq_length and the generators' capacity are bounded
//              by it), so the default table exactly;
//   "llama3"   Llama 3.1/3.2's: wavelengths above original_max_position_embeddings / low_freq_factor
//              divided by factor, below original / high_freq_factor kept, the band between blended.
//   "yarn"     YaRN (Qwen2.5's long context, DeepSeek's): frequencies turning fewer than beta_slow
//              times over the original context divided by factor, more than beta_fast times kept,
//              a linear ramp over the dims between; cos and sin scaled by attention_factor (given,
//              or 0.1 ln(factor) + 1, or with mscale and mscale_all_dim the ratio of that at each).
// Other types (longrope, ntk) are refused where the config is read (engine/hf_config.cpp).
struct RopeScaling {
  std::string type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  int64_t original_max_positions = 0;  // llama3, yarn: original_max_position_embeddings (yarn: 0 = max_position_embeddings)
  // yarn: attention_factor (0: derived), beta_fast/beta_slow, mscale/mscale_all_dim (0: absent),
  // truncate (the correction range's floor and ceil).
  double attention_factor = 0.0, beta_fast = 32.0, beta_slow = 1.0, mscale = 0.0, mscale_all_dim = 0.0;
  bool truncate = true;
  bool operator==(const RopeScaling&) const = default;
};

struct ModelConfig {
  Arch arch = Arch::kGpt2;
  int vocab_size = 0;      // V   (vocab_size)
  int hidden = 0;          // C   (n_embd / hidden_size)
  int n_layer = 0;         // L   (n_layer / num_hidden_layers)
  int n_head = 0;          // NH  (n_head / num_attention_heads)
  int n_kv_head = 0;       // NKV (num_key_value_heads; = NH for GPT-2)
  int intermediate = 0;    // I   (n_inner or 4C / intermediate_size)
  int max_positions = 0;   // n_positions / max_position_embeddings
  float norm_eps = 1e-5f;  // layer_norm_epsilon / rms_norm_eps
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;  // LLaMA's rope_scaling (see RopeScaling)
  // LLaMA-family attention biases: Qwen2 (model_type "qwen2") has q/k/v biases and none on o_proj;
  // LLaMA's attention_bias true has all four.
  bool qkv_bias = false, o_bias = false;
  // Hugging Face's model_type of a LLaMA-family model ("llama", "qwen2"): what export writes.
  std::string model_type;
  // config.json's bos_token_id and eos_token_id as given (-1 / empty: none): not the architecture,
  // carried so that export writes them back (Llama 3.x Instruct ends at any of three eos ids).
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  bool eos_is_list = false;  // eos_token_id was a list (written back as one)
  bool tie_embeddings = true;
  float init_std = 0.02f;  // initializer_range
  // Dropout probabilities as the Hugging Face config gives them (GPT-2's embd_pdrop, resid_pdrop,
  // attn_pdrop; LLaMA's attention_dropout as attn_pdrop), absent: 0. Training applies them where
  // Hugging Face does (the embeddings' sum, each residual branch's output, the attention
  // probabilities; TransformerLM::set_dropout_origin); evaluation and inference do not.
  float embd_pdrop = 0.0f, resid_pdrop = 0.0f, attn_pdrop = 0.0f;
  // LLaMA's pad_token_id as Hugging Face's LlamaModel uses it: the padding_idx of nn.Embedding, a
  // row of the token table that the lookup sends no gradient (a tied head still does) and that a
  // random initialisation leaves 0 (LlamaPreTrainedModel._init_weights). A negative id counts from
  // the end, as nn.Embedding's; stored here as the row. -1: none (GPT2Model has no padding_idx).
  int padding_idx = -1;
  // > 0: sequence classification (HF's GPT2ForSequenceClassification / LlamaForSequenceClassification):
  // the head is "score.weight" (num_labels, C), no bias, in place of the LM head; the loss is the
  // cross-entropy of the score at each target that is not -100 (the pooled, last non-pad token).
  int num_labels = 0;
  ProblemType problem_type = ProblemType::kSingleLabel;  // problem_type (with num_labels > 0)

  // validate()'s bounds, far past any model trained (DESIGN-NOTES 76).
  static constexpr int kMaxLayers = 1 << 20;
  static constexpr double kMaxParams = 281474976710656.0;  // 2^48
  // A micro-batch's activations: tokens x n_embd x layers, and tokens x vocab (the logits).
  static constexpr double kMaxActivationValues = 1125899906842624.0;  // 2^50

  int head_dim() const { return hidden / n_head; }  // HS
  int64_t num_params() const;                       // N, counted from the formula
  void validate() const;  // throws kInvalidArgument naming the HF field that is wrong
  std::string describe() const;  // "gpt2 L=12 C=768 NH=12 V=50257 (124.4M params)"
};

// The rotary frequencies of a LLaMA model, HS/2 of them, as transformers computes them for its
// rope_theta and rope_scaling (f32): the table kernels::rope_table builds from.
std::vector<float> rope_inv_freq(const ModelConfig& cfg);
// The factor transformers scales cos and sin by (yarn's attention_factor; 1 for the other types).
float rope_attention_scale(const ModelConfig& cfg);
// cos and sin (T, HS/2) of positions 0..T-1: kernels::rope_table of rope_inv_freq, times
// rope_attention_scale, as transformers' rotary embedding returns them.
void rope_tables(const ModelConfig& cfg, float* cos, float* sin, int T);

// Rows of the token table under tensor parallelism tp: the vocabulary padded to a multiple of
// divisible x tp (Megatron's make_vocab_size_divisible_by); the vocabulary itself with tp = 1.
inline int padded_vocab(const ModelConfig& cfg, int tp, int divisible) {
  if (tp == 1) return cfg.vocab_size;
  int m = divisible * tp;
  return (cfg.vocab_size + m - 1) / m * m;
}

// Whether the head is the token table (GPT-2's tied LM head): not for a sequence classifier, whose
// head is score.weight whatever tie_word_embeddings says.
inline bool head_is_token_table(const ModelConfig& cfg) { return cfg.tie_embeddings && cfg.num_labels == 0; }

// Rows of the head's weight (and of its logits) on one rank of a tp group: a sequence classifier's
// num_labels (its score head is replicated over the group), else the rank's share of the padded
// vocabulary.
inline int head_rows_per_rank(const ModelConfig& cfg, int tp, int divisible) {
  return cfg.num_labels > 0 ? cfg.num_labels : padded_vocab(cfg, tp, divisible) / tp;
}

struct ModelOptions {
  DType compute_dtype = DType::kF32;
  bool recompute = false;  // full activation checkpointing per block
  uint64_t seed = 1234;
  // The layout this rank's part of the model belongs to (null: one process, the whole model).
  std::shared_ptr<parallel::ParallelContext> parallel;
  // Megatron's make_vocab_size_divisible_by: under tensor parallelism the vocabulary is padded to
  // a multiple of this times tp (padding rows are zero and their logits never counted).
  int vocab_divisible = 128;
  // Pipeline parallelism: the layer boundaries of the pp·v virtual stages (pp·v + 1 entries, from
  // parallel/pp/partition.h); this rank builds the chunks of virtual stages c·pp + (its pp rank),
  // the embedding with stage 0 and the final norm + head with the last. Empty: every layer.
  std::vector<int> pipeline_bounds;
  // DeepSpeed's sparse_attention: every layer's attention computes only the layout's blocks
  // (kernels/cpu/sparse_layout.h), causal inside them (a decoder). num_heads is the model's.
  std::optional<kernels::SparsityConfig> sparse_attention;
  // ZeRO-Infinity (offload_param nvme): the ParamStore allocates no flat buffers and nothing is
  // initialised here; the ZeRO runtime writes each unit's initial values (init_values) straight to
  // its swap, so the whole model is never in memory (DeepSpeed's zero.Init).
  bool deferred_init = false;
  // Documents packed into a sample, as Megatron's get_ltor_masks_and_position_ids: after each
  // token `eod` a new document starts. positions (reset_position_ids): a token's position counts
  // from its document's start (GPT-2's position table, LLaMA's RoPE); attention
  // (reset_attention_mask): a token attends only within its document. The end-of-document token
  // belongs to the document it ends. Training and evaluation alike.
  struct Documents {
    int32_t eod = -1;
    bool positions = false, attention = false;
    bool on() const { return eod >= 0 && (positions || attention); }
  } documents;
};

// Documents::on's positions and key starts of a micro-batch (B, T): pos[b, t] = t - start and
// kstart[b, t] = start, where start is 0 or one past the last eod at a position before t.
void document_bounds(const int32_t* tokens, int B, int T, int32_t eod, int32_t* pos, int32_t* kstart);

}  // namespace mt::models
