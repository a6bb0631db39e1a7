// serve: the KV-cache generator against TransformerLM's full forward (itself verified against
// PyTorch by engine/golden_test.cpp), the sampler against softmax / top-k / top-p computed here
// from their definitions, and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "base/cpu_features.h"
#include "base/error.h"
#include "data/token_stream.h"
#include "models/transformer.h"
#include "serve/generator.h"
#include "serve/sampler.h"
#include "serve/test_util.h"
#include "tensor/allocator.h"

namespace mt::serve {
namespace {

using testing::make_model;
using testing::random_tokens;
using testing::tiny_config;
using testing::uniform;

// Logits (len, V) of TransformerLM::logits() on tokens[0, len), prepared with B = 1, T = len.
std::vector<float> full_logits(models::TransformerLM& m, const std::vector<int32_t>& tokens, int len) {
  m.prepare(1, len);
  std::vector<float> out(static_cast<size_t>(len) * m.config().vocab_size);
  m.logits(out.data(), tokens.data());
  return out;
}

// max|a - b| / max|b| over V entries: relative error at the scale of the logits.
double rel_err(std::span<const float> a, const float* b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return den > 0 ? num / den : num;
}

class GeneratorTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GeneratorTest, PrefillThenDecodeEqualsFullForwardAtEveryPosition) {
  models::ModelConfig cfg = tiny_config(GetParam());
  auto model = make_model(cfg);
  const int T = cfg.max_positions, V = cfg.vocab_size, P0 = 5;
  std::vector<int32_t> tokens = random_tokens(T, V, 11);
  std::vector<float> full = full_logits(*model, tokens, T);  // row t = last position of tokens[0, t]

  Generator gen(*model);
  EXPECT_EQ(gen.capacity(), T);
  std::vector<std::vector<float>> got;  // got[t]: the generator's logits of position t (t >= P0-1)
  std::span<const float> l = gen.prefill(std::vector<int32_t>(tokens.begin(), tokens.begin() + P0));
  ASSERT_EQ(l.size(), static_cast<size_t>(V));
  EXPECT_EQ(gen.position(), P0);
  got.resize(T);
  got[P0 - 1].assign(l.begin(), l.end());
  for (int t = P0; t < T; ++t) {
    l = gen.decode(tokens[t]);
    EXPECT_EQ(gen.position(), t + 1);
    got[t].assign(l.begin(), l.end());
  }
  for (int t = P0 - 1; t < T; ++t)
    EXPECT_LE(rel_err(got[t], full.data() + static_cast<size_t>(t) * V), 1e-4) << "position " << t;

  // The same against the last position of a forward prepared for each prefix length.
  for (int len : {P0, P0 + 1, T / 2 + 3, T - 1, T}) {
    std::vector<float> f = full_logits(*model, tokens, len);
    EXPECT_LE(rel_err(got[len - 1], f.data() + static_cast<size_t>(len - 1) * V), 1e-4) << "prefix " << len;
  }
}

// bf16 weights (serve --dtype bf16): the training model's f32 logits at every position, within
// bf16's rounding of the weights and each GEMM's input rows (8 mantissa bits: ~4e-3 a rounding),
// through a prefill of 20 rows (oneDNN's bf16 GEMM) and decodes of one row and of three
// sequences together (gemv_bf16); the greedy token agrees where the f32 top two are apart.
TEST_P(GeneratorTest, Bf16WeightsAreTheF32LogitsWithinBf16Rounding) {
  models::ModelConfig cfg = tiny_config(GetParam());
  auto model = make_model(cfg);
  const int T = cfg.max_positions, V = cfg.vocab_size, P0 = 20;
  std::vector<int32_t> tokens = random_tokens(T, V, 17);
  std::vector<float> full = full_logits(*model, tokens, T);
  Generator gen(*model, {.slots = 3, .weights = DType::kBF16});
  EXPECT_EQ(gen.weights(), isa_active() == Isa::kAvx512 ? DType::kBF16 : DType::kF32);  // f32 without AVX512-BF16
  auto check = [&](std::span<const float> got, int t) {
    const float* want = full.data() + static_cast<size_t>(t) * V;
    EXPECT_LE(rel_err(got, want), 3e-2) << "position " << t;
    std::vector<float> sorted(want, want + V);
    std::sort(sorted.rbegin(), sorted.rend());
    if (sorted[0] - sorted[1] > 0.05f * (std::fabs(sorted[0]) + 1.0f)) {
      EXPECT_EQ(argmax(got), argmax(std::span<const float>(want, static_cast<size_t>(V)))) << "position " << t;
    }
  };
  check(gen.prefill(0, std::vector<int32_t>(tokens.begin(), tokens.begin() + P0)), P0 - 1);
  for (int s = 1; s < 3; ++s) gen.prefill(s, std::vector<int32_t>(tokens.begin(), tokens.begin() + P0));
  for (int t = P0; t < T; ++t) {
    if (t % 2 == 0) {
      check(gen.decode(0, tokens[t]), t);
      for (int s = 1; s < 3; ++s) gen.decode(s, tokens[t]);
    } else {
      const std::vector<int> slots = {0, 1, 2};
      const std::vector<int32_t> next(3, tokens[t]);
      std::span<const float> rows = gen.decode_batch(slots, next);
      for (int s = 0; s < 3; ++s) check(rows.subspan(static_cast<size_t>(s) * V, V), t);
    }
  }
  // A snapshot: the copies do not follow the model's weights; f32 weights in another dtype refused.
  EXPECT_THROW(Generator(*model, {.weights = DType::kF16}), Error);
}

TEST_P(GeneratorTest, LongPrefillEqualsShortPrefillPlusDecodesAndChunkedPrefill) {
  models::ModelConfig cfg = tiny_config(GetParam());
  auto model = make_model(cfg);
  const int n = cfg.max_positions - 3;
  std::vector<int32_t> tokens = random_tokens(n, cfg.vocab_size, 12);
  std::vector<float> full = full_logits(*model, tokens, n);
  const float* want = full.data() + static_cast<size_t>(n - 1) * cfg.vocab_size;

  Generator gen(*model);
  std::span<const float> l = gen.prefill(random_tokens(9, cfg.vocab_size, 99));  // then start over
  l = gen.prefill(tokens);
  std::vector<float> long_prefill(l.begin(), l.end());
  EXPECT_EQ(gen.position(), n);
  EXPECT_LE(rel_err(long_prefill, want), 1e-4);

  gen.prefill(std::vector<int32_t>(tokens.begin(), tokens.begin() + 3));
  for (int t = 3; t < n; ++t) l = gen.decode(tokens[t]);
  EXPECT_LE(rel_err(l, long_prefill.data()), 1e-4);

  for (int chunk : {1, 7}) {  // a prompt run in chunks attends over the earlier chunks' cache
    Generator chunked(*model, {.capacity = 0, .prefill_chunk = chunk});
    EXPECT_LE(rel_err(chunked.prefill(tokens), long_prefill.data()), 1e-4) << "chunk " << chunk;
  }
  // A smaller capacity is allowed.
  Generator small(*model, {.capacity = n});
  EXPECT_EQ(small.capacity(), n);
  EXPECT_LE(rel_err(small.prefill(tokens), want), 1e-4);
}

TEST_P(GeneratorTest, ErrorsLeaveTheSequenceIntact) {
  models::ModelConfig cfg = tiny_config(GetParam());
  auto model = make_model(cfg);
  const int T = cfg.max_positions, V = cfg.vocab_size;
  std::vector<int32_t> tokens = random_tokens(T, V, 13);
  std::vector<float> full = full_logits(*model, tokens, T);
  Generator gen(*model);

  auto expect_invalid = [](auto&& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      std::string msg = e.what();
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  };
  expect_invalid([&] { gen.prefill({}); }, "empty prompt");
  expect_invalid([&] { gen.prefill(std::vector<int32_t>(T + 1, 0)); }, "does not fit");
  expect_invalid([&] { gen.prefill({1, 2, V}); }, "outside the vocabulary");
  expect_invalid([&] { Generator g(*model, {.capacity = T + 1}); }, "capacity");

  gen.prefill(std::vector<int32_t>(tokens.begin(), tokens.begin() + T - 2));
  expect_invalid([&] { gen.decode(-1); }, "token -1 at position " + std::to_string(T - 2));
  expect_invalid([&] { gen.decode(V); }, "outside the vocabulary");
  EXPECT_EQ(gen.position(), T - 2);
  gen.decode(tokens[T - 2]);
  std::span<const float> l = gen.decode(tokens[T - 1]);
  EXPECT_LE(rel_err(l, full.data() + static_cast<size_t>(T - 1) * V), 1e-4);
  EXPECT_EQ(gen.position(), T);
  expect_invalid([&] { gen.decode(0); }, "context is full");
  EXPECT_EQ(gen.position(), T);
  gen.reset();
  EXPECT_EQ(gen.position(), 0);
  l = gen.decode(tokens[0]);  // a sequence may also start with decode
  EXPECT_LE(rel_err(l, full.data()), 1e-4);
}

TEST_P(GeneratorTest, GenerateGreedyStopTokenAndFullContext) {
  models::ModelConfig cfg = tiny_config(GetParam());
  auto model = make_model(cfg);
  std::vector<int32_t> prompt = random_tokens(4, cfg.vocab_size, 14);
  Generator gen(*model);

  std::vector<int32_t> want;
  std::span<const float> l = gen.prefill(prompt);
  for (int i = 0; i < 6; ++i) {
    want.push_back(argmax(l));
    if (i < 5) l = gen.decode(want.back());
  }
  EXPECT_EQ(gen.generate(prompt, 6, {.temperature = 0.0f}), want);
  EXPECT_EQ(gen.generate(prompt, 0, {.temperature = 0.0f}), std::vector<int32_t>{});
  // Stopping at the third greedy token (included) unless an earlier one is the same id.
  auto stopped = gen.generate(prompt, 6, {.temperature = 0.0f}, want[2]);
  size_t first = std::find(want.begin(), want.end(), want[2]) - want.begin();
  EXPECT_EQ(stopped, std::vector<int32_t>(want.begin(), want.begin() + first + 1));
  // The context fills: prompt and answer hold max_positions, as serve and vLLM count them (the id
  // drawn from the last position's logits went past it, stop 73); the last id is not decoded.
  auto all = gen.generate(prompt, 1000, {.temperature = 1.0f, .seed = 3});
  EXPECT_EQ(all.size(), static_cast<size_t>(cfg.max_positions) - prompt.size());
  EXPECT_EQ(gen.position(), cfg.max_positions - 1);
  // Seeded sampling is reproducible.
  SamplingOptions o{.temperature = 1.3f, .top_k = 20, .top_p = 0.9f, .seed = 42};
  EXPECT_EQ(gen.generate(prompt, 12, o), gen.generate(prompt, 12, o));
  EXPECT_THROW(gen.generate(prompt, -1, o), Error);
}

// Several sequences in one generator, decoded a step at a time together (continuous batching),
// give each sequence the logits a generator of its own gives it, at every step: each row attends
// over its own slot at its own position, and the batched GEMMs change nothing but the row count.
TEST_P(GeneratorTest, DecodeBatchEqualsEachSequenceAlone) {
  models::ModelConfig cfg = tiny_config(GetParam());
  auto model = make_model(cfg);
  const int V = cfg.vocab_size, S = 3;
  Generator batch(*model, {.slots = S});
  EXPECT_EQ(batch.slots(), S);
  std::vector<std::unique_ptr<Generator>> alone;
  std::vector<std::vector<int32_t>> next(S);
  for (int s = 0; s < S; ++s) {
    alone.push_back(std::make_unique<Generator>(*model));
    std::vector<int32_t> prompt = random_tokens(2 + 5 * s, V, 20 + s);  // lengths 2, 7, 12
    std::span<const float> a = alone[s]->prefill(prompt);
    std::vector<float> want(a.begin(), a.end());
    EXPECT_LE(rel_err(batch.prefill(s, prompt), want.data()), 1e-6) << "slot " << s;
    next[s] = random_tokens(12, V, 40 + s);
  }
  for (int step = 0; step < 12; ++step) {
    // Slot 1 sits out the odd steps: a batch is any subset of the slots, in any order.
    std::vector<int> slots = step % 2 ? std::vector<int>{2, 0} : std::vector<int>{2, 0, 1};
    std::vector<int32_t> tokens;
    for (int s : slots) tokens.push_back(next[s][step]);
    std::span<const float> rows = batch.decode_batch(slots, tokens);
    ASSERT_EQ(rows.size(), slots.size() * V);
    for (size_t i = 0; i < slots.size(); ++i) {
      std::span<const float> a = alone[slots[i]]->decode(tokens[i]);
      EXPECT_LE(rel_err(rows.subspan(i * V, V), a.data()), 1e-5) << "step " << step << " slot " << slots[i];
      EXPECT_EQ(batch.position(slots[i]), alone[slots[i]]->position());
    }
  }
  const std::vector<int> dup = {0, 0}, one = {0}, bad = {S};
  const std::vector<int32_t> two = {1, 2}, t1 = {1};
  EXPECT_THROW(batch.decode_batch(dup, two), Error);
  EXPECT_THROW(batch.decode_batch(one, two), Error);
  EXPECT_THROW(batch.decode_batch(bad, t1), Error);
  EXPECT_THROW(batch.prefill(S, {1}), Error);
  EXPECT_THROW(Generator(*model, {.slots = 0}), Error);
}

INSTANTIATE_TEST_SUITE_P(Models, GeneratorTest, ::testing::Values("tiny-gpt2", "tiny-llama"),
                         [](const auto& info) { return info.param == "tiny-gpt2" ? "Gpt2" : "Llama"; });

TEST(Generator, CacheIsAccountedAsActivations) {
  auto model = make_model(tiny_config("tiny-llama"));
  size_t before = Allocator::global().stats().current[static_cast<int>(MemCategory::kActivations)];
  Generator gen(*model);
  size_t after = Allocator::global().stats().current[static_cast<int>(MemCategory::kActivations)];
  // L * 2 (k, v) * capacity * NKV * HS floats.
  EXPECT_EQ(after - before, 2u * 2 * 64 * 2 * 16 * sizeof(float));
}

// ---- sampling ----

TEST(Sampler, GreedyIsArgmaxWithTiesToTheLowestId) {
  std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
  EXPECT_EQ(argmax(logits), 1);
  Sampler greedy({.temperature = 0.0f});
  EXPECT_EQ(greedy.sample(logits), 1);
  uint64_t s = 3;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> l(1000);
    for (float& x : l) x = static_cast<float>(uniform(&s) * 8 - 4);
    int32_t best = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    EXPECT_EQ(greedy.sample(l), best);
  }
}

TEST(Sampler, TopK1IsGreedyAtAnyTemperature) {
  std::vector<float> tied = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
  for (float temp : {0.01f, 0.5f, 1.0f, 10.0f, 1000.0f}) {
    Sampler s({.temperature = temp, .top_k = 1, .seed = 9});
    for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(tied), 1) << "T " << temp;
    // Logits that differ by less than the rounding of exp((l - max) / T) at high T.
    std::vector<float> close = {1.0f, 1.0f + 1e-6f, 1.0f};
    EXPECT_EQ(s.sample(close), 1) << "T " << temp;
  }
}

TEST(Sampler, TinyTopPKeepsOnlyTheTopToken) {
  std::vector<float> logits = {0.5f, 2.0f, 1.99f, -1.0f, 1.5f};
  for (float top_p : {0.0f, 1e-6f, 0.1f}) {
    Sampler s({.temperature = 1.0f, .top_p = top_p, .seed = 1});
    std::vector<double> probs;
    s.distribution(logits, probs);
    EXPECT_EQ(probs, (std::vector<double>{0, 1, 0, 0, 0})) << "top_p " << top_p;
    for (int i = 0; i < 100; ++i) EXPECT_EQ(s.sample(logits), 1);
  }
}

// softmax(logits / T) restricted to `kept` and renormalised: the textbook oracle.
std::vector<double> restricted_softmax(const std::vector<float>& logits, float temp, const std::vector<int>& kept) {
  std::vector<double> p(logits.size(), 0.0);
  double total = 0;
  for (int i : kept) total += p[i] = std::exp(static_cast<double>(logits[i]) / temp);
  for (double& x : p) x /= total;
  return p;
}

TEST(Sampler, FrequenciesMatchTheWarpedSoftmaxWithin3Sigma) {
  // Ranked by logit: id 1 (2.0), 4 (1.5), 0 (1.0), 2 (0.5), 3 (-1.0). At T = 1 the probabilities
  // are .445 .270 .164 .099 .022: top_p 0.8 keeps {1, 4, 0} (mass before id 0 is .715 < .8, before
  // id 2 .879). After top_k 4 at T 0.8 (renormalised .504 .270 .145 .078), top_p 0.7 keeps {1, 4}.
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
  struct Case {
    SamplingOptions o;
    std::vector<int> kept;
  };
  const std::vector<Case> cases = {
      {{.temperature = 1.0f, .seed = 1}, {0, 1, 2, 3, 4}},
      {{.temperature = 0.6f, .seed = 2}, {0, 1, 2, 3, 4}},
      {{.temperature = 2.5f, .seed = 3}, {0, 1, 2, 3, 4}},
      {{.temperature = 1.5f, .top_k = 3, .seed = 4}, {1, 4, 0}},
      {{.temperature = 1.0f, .top_p = 0.8f, .seed = 5}, {1, 4, 0}},
      {{.temperature = 0.8f, .top_k = 4, .top_p = 0.7f, .seed = 6}, {1, 4}},
      {{.temperature = 1.0f, .top_k = 5, .top_p = 1.0f, .seed = 7}, {0, 1, 2, 3, 4}},
  };
  const int n = 20000;
  for (const Case& c : cases) {
    std::string what = "T " + std::to_string(c.o.temperature) + " top_k " + std::to_string(c.o.top_k) +
                       " top_p " + std::to_string(c.o.top_p);
    std::vector<double> p = restricted_softmax(logits, c.o.temperature, c.kept);
    Sampler s(c.o);
    std::vector<double> dist;
    s.distribution(logits, dist);
    for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(dist[i], p[i], 1e-12) << what << " id " << i;
    std::vector<int> count(logits.size(), 0);
    for (int k = 0; k < n; ++k) ++count[s.sample(logits)];
    for (size_t i = 0; i < p.size(); ++i) {
      double sigma = std::sqrt(n * p[i] * (1 - p[i]));
      EXPECT_LE(std::fabs(count[i] - n * p[i]), 3 * sigma + (p[i] == 0 ? 0 : 1e-9))
          << what << " id " << i << ": " << count[i] << " draws, expected " << n * p[i];
    }
  }
}

// The logit processors against their definitions worked by hand (vLLM's order: logit_bias, the
// repetition penalty over the prompt and the drawn ids, then frequency and presence over the drawn
// ones; min_p after top-k and top-p), the distribution checked exactly and the draws that follow.
TEST(Sampler, PenaltiesBiasAndMinPAreTheirDefinitions) {
  const std::vector<float> logits = {1.0f, 2.0f, -0.5f, 0.5f};
  auto dist = [&](Sampler& s, std::span<const int32_t> banned = {}) {
    std::vector<double> d;
    s.distribution(logits, d, banned);
    return d;
  };
  auto softmax = [](std::vector<double> z, double temp) {
    double m = *std::max_element(z.begin(), z.end()), total = 0;
    for (double& x : z) total += x = std::exp((x - m) / temp);
    for (double& x : z) x /= total;
    return z;
  };
  auto near = [](const std::vector<double>& a, const std::vector<double>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-7) << i;
  };
  {  // repetition 2 over the prompt {1, 2}: 2.0 -> 1.0 (positive: divided), -0.5 -> -1.0 (multiplied)
    Sampler s({.temperature = 0.7f, .repetition_penalty = 2.0f});
    const std::vector<int32_t> prompt = {1, 2, 1};
    s.set_prompt(prompt);
    near(dist(s), softmax({1.0, 1.0, -1.0, 0.5}, 0.7));
  }
  {  // OpenAI's: logit -= count · frequency + presence over the drawn ids; greedy draws follow it
    Sampler s({.temperature = 0.0f, .frequency_penalty = 0.6f, .presence_penalty = 0.5f});
    EXPECT_EQ(s.sample(logits), 1);  // 2.0 the largest
    EXPECT_EQ(s.sample(logits), 0);  // id 1: 2.0 - 0.6 - 0.5 = 0.9 < 1.0
    EXPECT_EQ(s.sample(logits), 1);  // id 0: 1.0 - 1.1 = -0.1; id 1 0.9
    EXPECT_EQ(s.sample(logits), 3);  // id 1: 2.0 - 1.2 - 0.5 = 0.3 < 0.5
  }
  {  // logit_bias added: -100 bans in practice, +3 lifts id 2 to 2.5
    Sampler s({.temperature = 1.0f, .logit_bias = {{1, -100.0f}, {2, 3.0f}}});
    near(dist(s), softmax({1.0, -98.0, 2.5, 0.5}, 1.0));
    Sampler g({.temperature = 0.0f, .logit_bias = {{3, 1.6f}}});
    EXPECT_EQ(g.sample(logits), 3);  // 0.5 + 1.6 = 2.1 > 2.0
  }
  {  // min_p 0.3 at T 1: probabilities .50 .18 .04 .30 of the largest's 1, .37, .08, .22 relative:
     // ids 1 (1) and 0 (.368) kept, 3 (.223) and 2 (.082) dropped; renormalised
    Sampler s({.temperature = 1.0f, .min_p = 0.3f});
    const double a = std::exp(1.0), b = std::exp(2.0);
    near(dist(s), {a / (a + b), b / (a + b), 0, 0});
  }
  {  // banned ids (min_tokens' stop ids) are never drawn, greedy or not; all banned is an error
    Sampler s({.temperature = 0.0f});
    const std::vector<int32_t> banned = {1};
    EXPECT_EQ(s.sample(logits, banned), 0);
    Sampler t({.temperature = 5.0f, .seed = 3});
    for (int i = 0; i < 200; ++i) EXPECT_NE(t.sample(logits, banned), 1);
    const std::vector<int32_t> all = {0, 1, 2, 3};
    EXPECT_THROW(t.sample(logits, all), Error);
  }
  {  // the order: logit_bias before the repetition penalty, (2 + 1) / 2 for id 1, not 2 / 2 + 1
    Sampler s({.temperature = 1.0f, .logit_bias = {{1, 1.0f}}, .repetition_penalty = 2.0f});
    const std::vector<int32_t> prompt = {1};
    s.set_prompt(prompt);
    near(dist(s), softmax({1.0, 1.5, -0.5, 0.5}, 1.0));
  }
  {  // typical_p (HF's TypicalLogitsWarper), on p = 1/2, 1/4, 1/8, 1/8: entropy 1.75 ln 2, the ids'
     // |-log p - H| 0.75, 0.25, 1.25, 1.25 (x ln 2); ranked 1, 0, then 2 and 3, cumulative .25 .75 .875 1.
     // typical_p 0.5: one ranked id below it, so the cut is the second: {1, 0} kept, renormalised;
     // 0.2: none below, the first alone: {1}; 0.8: {1, 0, 2, 3}: 2 and 3 tie at the cut.
    const std::vector<float> pow2 = {static_cast<float>(std::log(0.5)), static_cast<float>(std::log(0.25)),
                                     static_cast<float>(std::log(0.125)), static_cast<float>(std::log(0.125))};
    auto typical = [&](float mass) {
      Sampler s({.temperature = 1.0f, .typical_p = mass});
      std::vector<double> d;
      s.distribution(pow2, d);
      return d;
    };
    near(typical(0.5f), {2.0 / 3, 1.0 / 3, 0, 0});
    near(typical(0.2f), {0, 1, 0, 0});
    near(typical(0.8f), {0.5, 0.25, 0.125, 0.125});
    EXPECT_THROW(Sampler({.typical_p = 0.0f}), Error);
  }
  // Neutral values draw the same ids as no processor at all.
  Sampler plain({.temperature = 1.3f, .top_p = 0.9f, .seed = 21});
  Sampler neutral({.temperature = 1.3f, .top_p = 0.9f, .seed = 21, .repetition_penalty = 1.0f, .frequency_penalty = 0.0f});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(plain.sample(logits), neutral.sample(logits));
  EXPECT_THROW(Sampler({.repetition_penalty = 0.0f}), Error);
  EXPECT_THROW(Sampler({.frequency_penalty = 2.5f}), Error);
  EXPECT_THROW(Sampler({.min_p = 1.5f}), Error);
  EXPECT_THROW(Sampler({.logit_bias = {{0, 101.0f}}}), Error);
}

TEST(Sampler, SameSeedSameSequence) {
  std::vector<float> logits(50);
  uint64_t s = 8;
  for (float& x : logits) x = static_cast<float>(uniform(&s) * 4);
  auto draw = [&](uint64_t seed) {
    Sampler sm({.temperature = 1.2f, .top_k = 30, .top_p = 0.95f, .seed = seed});
    std::vector<int32_t> ids;
    for (int i = 0; i < 200; ++i) ids.push_back(sm.sample(logits));
    return ids;
  };
  EXPECT_EQ(draw(123), draw(123));
  EXPECT_NE(draw(123), draw(124));
}

TEST(Sampler, InvalidOptionsAndLogits) {
  EXPECT_THROW(Sampler({.temperature = -1.0f}), Error);
  EXPECT_THROW(Sampler({.temperature = NAN}), Error);
  EXPECT_THROW(Sampler({.top_k = -2}), Error);
  EXPECT_THROW(Sampler({.top_p = 1.5f}), Error);
  try {
    Sampler({.top_p = -0.1f});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos);
  }
  Sampler s({});
  std::vector<float> nan = {0.0f, NAN};
  EXPECT_THROW(s.sample(nan), Error);
  std::vector<float> masked = {-INFINITY, 0.0f, -INFINITY};
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(masked), 1);
}

}  // namespace
}  // namespace mt::serve
