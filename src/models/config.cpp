#include "models/config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "base/error.h"
#include "kernels/cpu/ops.h"

namespace mt::models {

int64_t ModelConfig::num_params() const {
  int64_t C = hidden, V = vocab_size, HS = head_dim(), I = intermediate;
  int64_t qkv = (static_cast<int64_t>(n_head) + 2 * n_kv_head) * HS;
  int64_t A = static_cast<int64_t>(n_head) * HS;
  int64_t per_layer, rest;
  if (arch == Arch::kGpt2) {
    per_layer = 2 * C + C * qkv + qkv + A * C + C + 2 * C + C * I + I + I * C + C;
    rest = V * C + static_cast<int64_t>(max_positions) * C + 2 * C;
  } else {
    per_layer = C + C * qkv + A * C + C + 3 * C * I + (qkv_bias ? qkv : 0) + (o_bias ? C : 0);
    rest = V * C + C + (tie_embeddings || num_labels > 0 ? 0 : V * C);
  }
  if (num_labels > 0) rest += static_cast<int64_t>(num_labels) * C;  // score.weight
  return per_layer * n_layer + rest;
}

void ModelConfig::validate() const {
  auto need = [](bool ok, const char* field, const std::string& why) {
    MT_CHECK(ok, ErrorKind::kInvalidArgument, std::string("model.") + field + ": " + why);
  };
  need(vocab_size > 0, "vocab_size", "must be positive");
  need(hidden > 0, arch == Arch::kGpt2 ? "n_embd" : "hidden_size", "must be positive");
  need(n_layer > 0, arch == Arch::kGpt2 ? "n_layer" : "num_hidden_layers", "must be positive");
  need(n_head > 0 && hidden % n_head == 0, arch == Arch::kGpt2 ? "n_head" : "num_attention_heads",
       "must be positive and divide the hidden size");
  need(n_kv_head > 0 && n_head % n_kv_head == 0, "num_key_value_heads",
       "must be positive and divide num_attention_heads");
  need(intermediate > 0, arch == Arch::kGpt2 ? "n_inner" : "intermediate_size", "must be positive");
  need(max_positions > 0, arch == Arch::kGpt2 ? "n_positions" : "max_position_embeddings",
       "must be positive");
  need(norm_eps > 0 && std::isfinite(norm_eps), arch == Arch::kGpt2 ? "layer_norm_epsilon" : "rms_norm_eps",
       "must be positive and finite");
  // Hugging Face draws N(0, initializer_range^2): a negative one is no distribution, and an
  // infinite one makes every weight infinite.
  need(init_std >= 0 && std::isfinite(init_std), "initializer_range", "must be >= 0 and finite");
  for (auto [p, key] : {std::pair<float, const char*>{embd_pdrop, "embd_pdrop"}, {resid_pdrop, "resid_pdrop"},
                        {attn_pdrop, arch == Arch::kGpt2 ? "attn_pdrop" : "attention_dropout"}})
    need(p >= 0 && p < 1, key, "a dropout probability must be in [0, 1)");
  need(arch == Arch::kGpt2 || (rope_theta > 0 && std::isfinite(rope_theta)), "rope_theta",
       "must be positive and finite");
  need(arch == Arch::kGpt2 || head_dim() % 2 == 0, "num_attention_heads",
       "RoPE needs an even head dimension");
  if (arch == Arch::kLlama) {
    const RopeScaling& rs = rope_scaling;
    need(rs.type == "default" || rs.type == "linear" || rs.type == "dynamic" || rs.type == "llama3" || rs.type == "yarn",
         "rope_scaling", "rope_type '" + rs.type + "' is not supported (default, linear, dynamic, llama3, yarn)");
    need(rs.type == "default" || (rs.factor > 0 && std::isfinite(rs.factor)), "rope_scaling",
         "factor must be positive and finite");
    if (rs.type == "llama3") {
      need(rs.original_max_positions > 0, "rope_scaling", "original_max_position_embeddings must be positive");
      need(rs.low_freq_factor > 0 && std::isfinite(rs.low_freq_factor) && std::isfinite(rs.high_freq_factor) &&
               rs.high_freq_factor > rs.low_freq_factor,
           "rope_scaling", "needs 0 < low_freq_factor < high_freq_factor (the band between them is blended)");
    }
    if (rs.type == "yarn") {
      need(rs.original_max_positions >= 0, "rope_scaling", "original_max_position_embeddings must be positive");
      for (auto [v, k] : {std::pair<double, const char*>{rs.attention_factor, "attention_factor"}, {rs.beta_fast, "beta_fast"},
                          {rs.beta_slow, "beta_slow"}, {rs.mscale, "mscale"}, {rs.mscale_all_dim, "mscale_all_dim"}})
        need(v >= 0 && std::isfinite(v), "rope_scaling", std::string(k) + " must be a finite number >= 0");
      // transformers 4 takes factor as max_position_embeddings / original_max_position_embeddings
      // where the latter is given (DeepSeek's configs, where the two agree); transformers 5 takes
      // factor as given. Where they differ the model is not one model.
      if (rs.original_max_positions > 0) {
        const double ratio = static_cast<double>(max_positions) / static_cast<double>(rs.original_max_positions);
        char buf[160];
        std::snprintf(buf, sizeof buf, "%g (transformers 5's) and max_position_embeddings / original_max_position_embeddings = %g",
                      rs.factor, ratio);
        need(std::fabs(ratio - rs.factor) <= 1e-9 * rs.factor, "rope_scaling",
             std::string("yarn's factor is ") + buf +
                 " (transformers 4's) disagree: set max_position_embeddings to factor x original_max_position_embeddings (" +
                 std::to_string(static_cast<int64_t>(std::llround(rs.factor * static_cast<double>(rs.original_max_positions)))) + ")");
      }
    }
  }
  need(arch == Arch::kLlama || tie_embeddings, "tie_word_embeddings",
       "GPT-2 with an untied head is not supported");
  need(padding_idx >= -1 && padding_idx < vocab_size, "pad_token_id", "must be an id of the vocabulary");
  need(padding_idx < 0 || arch == Arch::kLlama, "pad_token_id", "a padding row is LLaMA's (GPT-2's embedding has none)");
  need(num_labels >= 0, "num_labels", "must be >= 0 (0: a causal LM)");
  // A softmax over one class has nothing to learn (it trained with loss 0 and exited 0).
  need(num_labels != 1 || problem_type != ProblemType::kSingleLabel, "num_labels",
       "1 with problem_type \"single_label_classification\" is a softmax over one class; one label is \"regression\"");
  // Bounds far past any model trained that keep the counts in bytes (int64 and size_t: the
  // estimate's replay, the allocator's) from overflowing, and the skeleton the estimate builds
  // (a unit a layer) from asking for more memory than exists. Counted in double: num_params()
  // itself overflows first.
  need(n_layer <= kMaxLayers, arch == Arch::kGpt2 ? "n_layer" : "num_hidden_layers",
       "must be at most " + std::to_string(kMaxLayers));
  const double C = hidden, I = intermediate, L = n_layer, V = vocab_size;
  const double approx = L * (4.0 * C * C + 3.0 * C * I) + 2.0 * V * C;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g", approx);
  MT_CHECK(approx <= kMaxParams, ErrorKind::kInvalidArgument,
           std::string("model: about ") + buf + " parameters, more than the 2^48 (2.8e14) the runtime's byte counts hold");
}

const char* problem_type_name(ProblemType p) {
  switch (p) {
    case ProblemType::kRegression: return "regression";
    case ProblemType::kMultiLabel: return "multi_label_classification";
    default: return "single_label_classification";
  }
}

// transformers' _compute_linear_scaling_rope_parameters and _compute_llama3_parameters, step by
// step in f32 as torch computes them on a float32 tensor (a Python float operand is taken in f32).
std::vector<float> rope_inv_freq(const ModelConfig& cfg) {
  std::vector<float> f = kernels::rope_default_inv_freq(cfg.head_dim(), cfg.rope_theta);
  const RopeScaling& rs = cfg.rope_scaling;
  if (rs.type == "linear") {
    for (float& x : f) x /= static_cast<float>(rs.factor);
  } else if (rs.type == "llama3") {
    const float factor = static_cast<float>(rs.factor), low = static_cast<float>(rs.low_freq_factor);
    const double old_len = static_cast<double>(rs.original_max_positions);
    const float low_wavelen = static_cast<float>(old_len / rs.low_freq_factor);
    const float high_wavelen = static_cast<float>(old_len / rs.high_freq_factor);
    const float band = static_cast<float>(rs.high_freq_factor - rs.low_freq_factor);
    const float two_pi = static_cast<float>(2.0 * M_PI);
    for (float& x : f) {
      const float wavelen = two_pi / x;
      float y = wavelen > low_wavelen ? x / factor : x;  // long wavelengths: interpolated
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      if (medium) {  // the band between: blended by how many turns fit in the original context
        const float smooth = (static_cast<float>(old_len) / wavelen - low) / band;
        y = (1.0f - smooth) * y / factor + smooth * y;
      }
      x = y;
    }
  }
  if (rs.type == "yarn") {  // _compute_yarn_parameters: the correction range in double, the ramp in f32
    const int dim = cfg.head_dim(), H = dim / 2;
    const double base = static_cast<double>(cfg.rope_theta);
    const double old_len = static_cast<double>(rs.original_max_positions > 0 ? rs.original_max_positions : cfg.max_positions);
    auto correction_dim = [&](double turns) { return dim * std::log(old_len / (turns * 2.0 * M_PI)) / (2.0 * std::log(base)); };
    double low = correction_dim(rs.beta_fast > 0 ? rs.beta_fast : 32.0), high = correction_dim(rs.beta_slow > 0 ? rs.beta_slow : 1.0);
    if (rs.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;
    const float lo = static_cast<float>(low), span = static_cast<float>(high - low), factor = static_cast<float>(rs.factor);
    for (int j = 0; j < H; ++j) {
      const float pos_freq = std::pow(cfg.rope_theta, static_cast<float>(2 * j) / static_cast<float>(dim));
      const float ramp = std::clamp((static_cast<float>(j) - lo) / span, 0.0f, 1.0f);
      const float extrapolation = 1.0f - ramp;
      f[static_cast<size_t>(j)] = 1.0f / (factor * pos_freq) * (1.0f - extrapolation) + 1.0f / pos_freq * extrapolation;
    }
  }
  // "dynamic": the default frequencies below max_position_embeddings (RopeScaling).
  return f;
}

float rope_attention_scale(const ModelConfig& cfg) {
  const RopeScaling& rs = cfg.rope_scaling;
  if (cfg.arch != Arch::kLlama || rs.type != "yarn") return 1.0f;
  if (rs.attention_factor > 0) return static_cast<float>(rs.attention_factor);
  auto mscale = [&](double m) { return rs.factor <= 1 ? 1.0 : 0.1 * m * std::log(rs.factor) + 1.0; };
  if (rs.mscale > 0 && rs.mscale_all_dim > 0) return static_cast<float>(mscale(rs.mscale) / mscale(rs.mscale_all_dim));
  return static_cast<float>(mscale(1.0));
}

void rope_tables(const ModelConfig& cfg, float* cos, float* sin, int T) {
  const int HS = cfg.head_dim();
  kernels::rope_table(cos, sin, T, HS, rope_inv_freq(cfg).data());
  const float scale = rope_attention_scale(cfg);
  if (scale == 1.0f) return;
  const size_t n = static_cast<size_t>(T) * static_cast<size_t>(HS / 2);
  for (size_t i = 0; i < n; ++i) cos[i] *= scale, sin[i] *= scale;
}

std::string ModelConfig::describe() const {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s L=%d C=%d NH=%d NKV=%d I=%d V=%d (%.1fM params)",
                arch == Arch::kGpt2 ? "gpt2" : model_type.empty() ? "llama" : model_type.c_str(), n_layer, hidden, n_head, n_kv_head,
                intermediate, vocab_size, static_cast<double>(num_params()) / 1e6);
  if (num_labels > 0 && problem_type == ProblemType::kRegression)
    return std::string(buf) + ", regression of " + std::to_string(num_labels) + (num_labels == 1 ? " value" : " values");
  if (num_labels > 0 && problem_type == ProblemType::kMultiLabel)
    return std::string(buf) + ", multi-label classifier of " + std::to_string(num_labels) + " labels";
  if (num_labels > 0) return std::string(buf) + ", classifier of " + std::to_string(num_labels) + " labels";
  return buf;
}

void document_bounds(const int32_t* tokens, int B, int T, int32_t eod, int32_t* pos, int32_t* kstart) {
  for (int b = 0; b < B; ++b) {
    const size_t row = static_cast<size_t>(b) * static_cast<size_t>(T);
    int start = 0;
    for (int t = 0; t < T; ++t) {
      pos[row + t] = t - start;
      kstart[row + t] = start;
      if (tokens[row + t] == eod) start = t + 1;
    }
  }
}

}  // namespace mt::models
