// Shared by the layout tests (zero_test, tp_test): the training keys of a 10-step run on a tiny
// model, and the deterministic sample k of its data.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace mt::engine {

// model_json: {"model": {...}}; g micro-batches of 1 x 16 tokens per data-parallel rank.
inline nlohmann::json layout_config(const char* model_json, const std::string& dtype, int dp, int g) {
  auto j = nlohmann::json::parse(model_json);
  j["seq_length"] = 16;
  j["train_iters"] = 10;
  j["train_micro_batch_size_per_gpu"] = 1;
  j["gradient_accumulation_steps"] = g;
  j["train_batch_size"] = g * dp;
  j["gradient_clipping"] = 0.5;  // the clip uses the global norm: a wrong norm changes the weights
  j["no_weight_decay"] = "hf";
  j["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.1}}}};
  if (dtype == "bf16") j["bf16"] = {{"enabled", true}};
  return j;
}

inline void layout_sample(uint64_t k, int32_t* tok, int32_t* tgt) {
  for (int i = 0; i < 16; ++i) {
    tok[i] = static_cast<int32_t>((k * 131 + static_cast<uint64_t>(i) * 29 + (k * k) % 13) % 97);
    tgt[i] = static_cast<int32_t>((k * 71 + static_cast<uint64_t>(i) * 37 + 5) % 97);
  }
}

}  // namespace mt::engine
