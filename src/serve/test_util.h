// Shared by serve/'s tests: the tiny models (with noisy weights, so positions matter) and tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/token_stream.h"
#include "models/transformer.h"

namespace mt::serve::testing {

// The JSON events of a server-sent-event body, [DONE] excluded; *done set when it came last.
inline std::vector<nlohmann::json> sse_events(const std::string& body, bool* done) {
  std::vector<nlohmann::json> out;
  *done = false;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos);
    const std::string data = body.substr(pos + 6, end - pos - 6);
    pos = end + 2;
    if (data == "[DONE]") {
      *done = pos == body.size();
      continue;
    }
    out.push_back(nlohmann::json::parse(data));
  }
  return out;
}

// configs/models/tiny-gpt2.json and tiny-llama.json (the JSON readers live in engine/, above us).
inline models::ModelConfig tiny_config(const std::string& name) {
  models::ModelConfig c;
  if (name == "tiny-gpt2") {
    c.arch = models::Arch::kGpt2;
    c.vocab_size = 97; c.hidden = 48; c.n_layer = 2; c.n_head = 4; c.n_kv_head = 4;
    c.intermediate = 4 * 48; c.max_positions = 32; c.norm_eps = 1e-5f; c.tie_embeddings = true;
  } else {
    c.arch = models::Arch::kLlama;
    c.vocab_size = 101; c.hidden = 64; c.n_layer = 2; c.n_head = 4; c.n_kv_head = 2;
    c.intermediate = 176; c.max_positions = 64; c.norm_eps = 1e-5f; c.rope_theta = 10000.0f;
    c.tie_embeddings = false;
  }
  return c;
}

inline double uniform(uint64_t* state) {  // [0, 1)
  return static_cast<double>(data::splitmix64_next(state) >> 11) * 0x1.0p-53;
}

// A model whose every parameter (norm weights and biases included) is its seeded init plus
// uniform noise of +-0.15, so attention is far from uniform and positions matter.
inline std::unique_ptr<models::TransformerLM> make_model(const models::ModelConfig& cfg) {
  models::ModelOptions opts;
  opts.seed = 77;
  auto m = std::make_unique<models::TransformerLM>(cfg, opts);
  uint64_t state = 5;
  for (nn::Parameter* p : m->store().parameters())
    for (int64_t i = 0; i < p->numel(); ++i) p->master[i] += static_cast<float>(0.3 * (uniform(&state) - 0.5));
  m->store().sync_compute();
  return m;
}

inline std::vector<int32_t> random_tokens(int n, int V, uint64_t seed) {
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(data::splitmix64_next(&seed) % static_cast<uint64_t>(V));
  return t;
}

}  // namespace mt::serve::testing
