// Shared by the layout tests (zero_test, tp_test): the training keys of a 10-step run on a tiny
// model, and the deterministic sample k of its data.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/local_backend.h"
#include "engine/ds_config.h"
#include "engine/engine.h"
#include "nn/param_store.h"

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
  if (dtype == "fp16") j["fp16"] = {{"enabled", true}, {"initial_scale_power", 12}};
  return j;
}

// The layout tests' tiny models as {"model": {...}} with `layers` blocks: GPT-2 (C 48, 4 heads) or
// LLaMA (C 64, 8 heads over 4 kv heads, untied head).
inline nlohmann::json layout_model(const std::string& arch, int layers) {
  nlohmann::json m = arch == "gpt2"
                         ? nlohmann::json{{"model_type", "gpt2"}, {"vocab_size", 97}, {"n_positions", 32}, {"n_embd", 48},
                                          {"n_layer", layers}, {"n_head", 4}}
                         : nlohmann::json{{"model_type", "llama"}, {"vocab_size", 97}, {"hidden_size", 64},
                                          {"intermediate_size", 96}, {"num_hidden_layers", layers},
                                          {"num_attention_heads", 8}, {"num_key_value_heads", 4},
                                          {"max_position_embeddings", 32}, {"tie_word_embeddings", false}};
  return nlohmann::json{{"model", m}};
}

inline void layout_sample(uint64_t k, int32_t* tok, int32_t* tgt) {
  for (int i = 0; i < 16; ++i) {
    tok[i] = static_cast<int32_t>((k * 131 + static_cast<uint64_t>(i) * 29 + (k * k) % 13) % 97);
    tgt[i] = static_cast<int32_t>((k * 71 + static_cast<uint64_t>(i) * 37 + 5) % 97);
  }
}

// GPT-2's key bias: its gradient is zero in exact arithmetic (softmax is invariant to adding
// q.b_k to a whole row), so what it gets is rounding noise, which Adam's m/sqrt(v) turns into steps
// of arbitrary size; another summation order moves it differently. [begin, end) ranges of the
// one-process layout, which the layout tests compare separately.
inline std::vector<std::pair<size_t, size_t>> layout_key_bias_ranges(const nn::ParamStore& store) {
  std::vector<std::pair<size_t, size_t>> out;
  for (const nn::Parameter* p : store.parameters())
    if (p->name.ends_with("attn.c_attn.bias")) {
      size_t C = static_cast<size_t>(p->global_numel() / 3);
      out.emplace_back(p->global_offset + C, p->global_offset + 2 * C);
    }
  return out;
}

struct LayoutDiff {
  double norm_rel = 0.0;   // ||got - ref|| / ||ref||
  double max_rel = 0.0;    // max |got - ref| / max |ref|
  double noise_max = 0.0;  // max |got - ref| over the noise ranges (GPT-2's key bias)
};

// got against ref (the one-process layout), the noise ranges (layout_key_bias_ranges) apart.
inline LayoutDiff layout_compare(const std::vector<float>& ref, const std::vector<float>& got,
                                 const std::vector<std::pair<size_t, size_t>>& noise) {
  LayoutDiff d;
  double scale = 0.0, worst = 0.0, num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    double e = static_cast<double>(got[i]) - ref[i];
    bool in_noise = std::any_of(noise.begin(), noise.end(), [i](auto n) { return i >= n.first && i < n.second; });
    if (in_noise) {
      d.noise_max = std::max(d.noise_max, std::fabs(e));
      continue;
    }
    scale = std::max(scale, static_cast<double>(std::fabs(ref[i])));
    worst = std::max(worst, std::fabs(e));
    num += e * e;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  d.norm_rel = std::sqrt(num / den);
  d.max_rel = worst / scale;
  return d;
}

// Runs fn on `world` ranks (threads over the local backend) and returns rank 0's result; rethrows
// the first rank's exception.
template <typename Result>
Result layout_rank0(int world, const std::function<Result(comm::Backend&)>& fn) {
  Result out;
  std::mutex mu;
  auto errors = comm::run_local_ranks(world, [&](comm::Backend& b) {
    Result mine = fn(b);
    if (b.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out = std::move(mine);
    }
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

// What a layout test compares of a 10-step run (rank 0's; the state in the one-process layout).
struct LayoutRun {
  std::vector<float> losses;
  std::vector<double> norms;
  std::vector<size_t> tp_bytes;        // per step, rank 0's
  std::vector<float> master, exp_avg;  // gathered on rank 0
  std::vector<std::pair<size_t, size_t>> noise;  // GPT-2's key bias (layout_key_bias_ranges)
  float eval_loss = 0.0f;              // evaluate() of sample 1000 after training
};

// Trains `cfg` (a layout_config) for 10 steps on `processes` ranks (threads over the local
// backend; 1: one process): dp rank d reads samples step·g·dp + d·g ... of each step, every rank of
// a tp group, Ulysses group or pipeline the same ones. sample: layout_sample or another of its form.
using LayoutSampleFn = void (*)(uint64_t, int32_t*, int32_t*);
inline LayoutRun layout_train(const nlohmann::json& cfg, int processes, int g, const char* where,
                              LayoutSampleFn sample = layout_sample) {
  return layout_rank0<LayoutRun>(processes, [&](comm::Backend& b) {
    RunConfig c = ds_config_parse(cfg, where, processes);
    std::shared_ptr<comm::Backend> world(&b, [](comm::Backend*) {});
    auto ctx = engine_parallel_context(c, processes > 1 ? world : nullptr);
    auto model = engine_build_model(c, ctx);
    Engine eng(c, *model, ctx);
    LayoutRun mine;
    const int dp = ctx->data_dp(), d = ctx->data_rank();
    for (int step = 0; step < 10; ++step) {
      uint64_t next = static_cast<uint64_t>(step) * static_cast<uint64_t>(g * dp) + static_cast<uint64_t>(d * g);
      StepResult r = eng.train_batch([&](int32_t* t, int32_t* y) { sample(next++, t, y); });
      mine.losses.push_back(r.loss);
      mine.norms.push_back(r.grad_norm);
      mine.tp_bytes.push_back(r.tp_comm_bytes);
    }
    std::vector<int32_t> t(16), y(16);
    sample(1000, t.data(), y.data());
    mine.eval_loss = eng.evaluate(t.data(), y.data());
    eng.gather_master(mine.master);
    for (auto& [name, v] : eng.gather_optimizer_state())
      if (name == "exp_avg") mine.exp_avg = std::move(v);
    mine.noise = layout_key_bias_ranges(model->store());
    return mine;
  });
}

}  // namespace mt::engine
