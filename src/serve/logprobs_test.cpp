// Log-probabilities against PyTorch: the golden files' models (tools/make_golden.py: tiny GPT-2 and
// LLaMA, their weights and PyTorch's logits over two rows of tokens) served through the scheduler
// with echo's prompt logprobs and a greedy draw's: each prompt token's log-probability and its
// position's top-3 are PyTorch's log-softmax, and the drawn token is PyTorch's argmax.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "serve/generator.h"
#include "serve/scheduler.h"
#include "serve/test_util.h"

namespace mt::serve {
namespace {

class LogprobsGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(LogprobsGolden, PromptAndDrawnTokensArePyTorchsLogSoftmax) {
  checkpoint::SafetensorsFile f(std::string(MT_GOLDEN_DIR) + "/" + GetParam() + ".safetensors");
  const bool rope = GetParam().starts_with("rope-");  // tiny-llama with a rope_scaling
  const bool variant = GetParam() != "tiny-gpt2" && GetParam() != "tiny-llama";  // tiny-llama's sizes
  models::ModelConfig cfg = testing::tiny_config(variant ? "tiny-llama" : GetParam());
  // The golden file's config is the one test_util.h writes out by hand (and its rope_scaling: the
  // generator's rotary table must be the scaled one; the unscaled one is off by up to 6e-3 here).
  const nlohmann::json golden_cfg = nlohmann::json::parse(f.metadata().at("config"));
  ASSERT_EQ(golden_cfg.value("vocab_size", 0), cfg.vocab_size);
  ASSERT_EQ(rope, golden_cfg.contains("rope_scaling"));
  if (rope) {
    const nlohmann::json& rs = golden_cfg["rope_scaling"];
    cfg.rope_scaling.type = rs.value("rope_type", rs.value("type", std::string()));
    cfg.rope_scaling.factor = rs.at("factor").get<double>();
    cfg.rope_scaling.low_freq_factor = rs.value("low_freq_factor", 1.0);
    cfg.rope_scaling.high_freq_factor = rs.value("high_freq_factor", 4.0);
    cfg.rope_scaling.original_max_positions = rs.value("original_max_position_embeddings", 0);
    cfg.rope_scaling.beta_slow = rs.value("beta_slow", 1.0);  // yarn's (its cos and sin scaled too)
    cfg.validate();
  }
  // Qwen2's q/k/v biases, LLaMA's attention_bias (all four): the generator adds them.
  if (golden_cfg.value("model_type", std::string()) == "qwen2") cfg.qkv_bias = true;
  if (golden_cfg.value("attention_bias", false)) cfg.qkv_bias = cfg.o_bias = true;
  models::ModelOptions opts;
  models::TransformerLM model(cfg, opts);
  for (nn::Parameter* p : model.store().parameters()) {
    const std::vector<float> w = f.read_f32("param." + p->name, p->shape);
    std::copy(w.begin(), w.end(), p->master);
  }
  model.store().sync_compute();
  const int B = std::stoi(f.metadata().at("batch")), T = std::stoi(f.metadata().at("seq")), V = cfg.vocab_size;
  const std::vector<int32_t> tokens = f.read_i32("tokens");
  const std::vector<float> logits = f.read_f32("logits");  // (B, T, V), PyTorch's
  Generator gen(model, {.prefill_chunk = 5, .slots = 2});     // chunks of 5: scored across chunk edges
  Scheduler sched(gen);
  auto reference = [&](int b, int t) {  // log-softmax of PyTorch's logits at row b, position t, in double
    const float* z = logits.data() + (static_cast<size_t>(b) * T + t) * V;
    const double m = *std::max_element(z, z + V);
    double sum = 0.0;
    for (int v = 0; v < V; ++v) sum += std::exp(z[v] - m);
    std::vector<double> out(static_cast<size_t>(V));
    for (int v = 0; v < V; ++v) out[static_cast<size_t>(v)] = z[v] - m - std::log(sum);
    return out;
  };
  for (int b = 0; b < B; ++b) {
    SCOPED_TRACE(b);
    GenerationRequest r;
    r.prompt.assign(tokens.begin() + static_cast<ptrdiff_t>(b) * T, tokens.begin() + static_cast<ptrdiff_t>(b + 1) * T);
    r.max_new_tokens = 1;
    r.sampling.temperature = 0.0f;
    r.logprobs = 3;
    r.prompt_logprobs = true;
    auto g = sched.submit(r);
    ASSERT_TRUE(g);
    bool done = false;
    while (!done) g->wait(0, std::chrono::milliseconds(50), &done, true);
    const std::vector<TokenLogprobs> prompt = g->prompt_logprobs();
    ASSERT_EQ(prompt.size(), static_cast<size_t>(T - 1));
    auto expect_top = [&](const TokenLogprobs& got, const std::vector<double>& want) {
      std::vector<int32_t> order(static_cast<size_t>(V));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return want[x] > want[y]; });
      ASSERT_EQ(got.top.size(), 3u);
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(got.top[k].first, order[k]) << k;
        EXPECT_NEAR(got.top[k].second, want[static_cast<size_t>(order[k])], 1e-4) << k;
      }
    };
    for (int t = 1; t < T; ++t) {
      const std::vector<double> want = reference(b, t - 1);
      EXPECT_EQ(prompt[t - 1].id, r.prompt[t]);
      EXPECT_NEAR(prompt[t - 1].logprob, want[static_cast<size_t>(r.prompt[t])], 1e-4) << t;
      expect_top(prompt[t - 1], want);
    }
    const std::vector<TokenLogprobs> drawn = g->logprobs();
    ASSERT_EQ(drawn.size(), 1u);
    const std::vector<double> last = reference(b, T - 1);
    EXPECT_EQ(drawn[0].id, static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin()));
    EXPECT_NEAR(drawn[0].logprob, *std::max_element(last.begin(), last.end()), 1e-4);
    expect_top(drawn[0], last);
    // The same draw as a stop id: nothing pushed, the id and its value kept as the stop's.
    r.stop_ids = {drawn[0].id};
    auto s = sched.submit(r);
    ASSERT_TRUE(s);
    done = false;
    while (!done) s->wait(0, std::chrono::milliseconds(50), &done, true);
    EXPECT_EQ(s->finish(), Finish::kStop);
    EXPECT_TRUE(s->logprobs().empty());
    ASSERT_EQ(s->stop_logprobs().size(), 1u);
    EXPECT_EQ(s->stop_logprobs()[0].id, drawn[0].id);
    EXPECT_EQ(s->stop_logprobs()[0].logprob, drawn[0].logprob);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, LogprobsGolden,
                         ::testing::Values("tiny-gpt2", "tiny-llama", "rope-llama3-tiny-llama", "rope-linear-tiny-llama",
                                           "rope-yarn-tiny-llama", "qwen2-tiny-llama", "attention-bias-tiny-llama"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) if (c == '-') c = '_';
                           return s;
                         });

}  // namespace
}  // namespace mt::serve
