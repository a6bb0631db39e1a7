// serve/scheduler: concurrent requests batched over the slots give each request what a generator
// of its own gives it (greedy and seeded sampling), and every way a sequence ends: stop token,
// max_new_tokens, full context, cancellation, deadline; a full queue and draining refuse; an ended
// sequence is off the active count when its end is seen.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "base/error.h"
#include "serve/generator.h"
#include "serve/scheduler.h"
#include "serve/test_util.h"

namespace mt::serve {
namespace {

using testing::make_model;
using testing::random_tokens;
using testing::tiny_config;

std::vector<int32_t> collect(Generation& g) {
  std::vector<int32_t> ids;
  bool done = false;
  while (!done)
    for (int32_t id : g.wait(ids.size(), std::chrono::milliseconds(50), &done)) ids.push_back(id);
  return ids;
}

// tiny-llama with a context of 4096: long enough that a request is still running when we look.
models::ModelConfig long_llama() {
  models::ModelConfig cfg = tiny_config("tiny-llama");
  cfg.max_positions = 4096;
  return cfg;
}

GenerationRequest greedy(int prompt_tokens, int vocab, uint64_t seed, int max_new_tokens) {
  GenerationRequest q;
  q.prompt = random_tokens(prompt_tokens, vocab, seed);
  q.max_new_tokens = max_new_tokens;
  q.sampling.temperature = 0.0f;
  return q;
}

TEST(Scheduler, ConcurrentRequestsEqualEachGeneratedAlone) {
  for (const char* name : {"tiny-gpt2", "tiny-llama"}) {
    SCOPED_TRACE(name);
    models::ModelConfig cfg = tiny_config(name);
    auto model = make_model(cfg);
    Generator gen(*model, {.slots = 3});
    Generator alone(*model);
    Scheduler sched(gen, {.max_queue = 16});
    // Seven requests on three slots: some wait, and join the batch as others end.
    std::vector<GenerationRequest> reqs;
    for (int r = 0; r < 7; ++r) {
      GenerationRequest q;
      q.prompt = random_tokens(1 + 3 * r % 9, cfg.vocab_size, 100 + r);
      q.max_new_tokens = 4 + 3 * r;
      q.sampling = r % 2 ? SamplingOptions{.temperature = 0.9f, .top_k = 30, .top_p = 0.95f, .seed = 7u + r}
                         : SamplingOptions{.temperature = 0.0f};
      reqs.push_back(q);
    }
    std::vector<std::shared_ptr<Generation>> gens;
    for (const GenerationRequest& q : reqs) gens.push_back(sched.submit(q));
    for (size_t r = 0; r < reqs.size(); ++r) {
      ASSERT_NE(gens[r], nullptr);
      const std::vector<int32_t> got = collect(*gens[r]);
      const std::vector<int32_t> want = alone.generate(reqs[r].prompt, reqs[r].max_new_tokens, reqs[r].sampling);
      EXPECT_EQ(got, want) << "request " << r;
      EXPECT_EQ(gens[r]->finish(), Finish::kLength);
      EXPECT_EQ(gens[r]->prompt_tokens(), static_cast<int>(reqs[r].prompt.size()));
    }
    const Scheduler::Stats st = sched.stats();
    EXPECT_EQ(st.active, 0);
    EXPECT_EQ(st.queued, 0);
    EXPECT_GT(st.decode_steps, 0u);
    // Batching happened: steps ran more than one sequence on average.
    EXPECT_GT(st.decode_rows, st.decode_steps);
    uint64_t generated = 0;
    for (const GenerationRequest& q : reqs) generated += q.max_new_tokens;
    EXPECT_EQ(st.generated_tokens, generated);
  }
}

TEST(Scheduler, EachWayASequenceEnds) {
  models::ModelConfig cfg = tiny_config("tiny-gpt2");
  auto model = make_model(cfg);
  Generator gen(*model, {.slots = 2});
  Generator alone(*model);
  Scheduler sched(gen, {.max_queue = 8});
  GenerationRequest q;
  q.prompt = random_tokens(5, cfg.vocab_size, 3);
  q.max_new_tokens = 10;
  q.sampling.temperature = 0.0f;
  const std::vector<int32_t> greedy = alone.generate(q.prompt, 10, q.sampling);

  // A stop id ends the sequence before it: the ids up to its first occurrence.
  GenerationRequest stop = q;
  stop.stop_ids = {greedy[3]};
  auto g = sched.submit(stop);
  const size_t first = std::find(greedy.begin(), greedy.end(), greedy[3]) - greedy.begin();
  EXPECT_EQ(collect(*g), std::vector<int32_t>(greedy.begin(), greedy.begin() + first));
  EXPECT_EQ(g->finish(), Finish::kStop);
  // Ids at or above sample_below (a vocabulary padded past the tokenizer's) are never drawn: with
  // greedy's first id excluded, the first is the best of those below it, and the sequence runs on
  // (it used to end there, with nothing).
  ASSERT_GT(greedy[0], 0);
  GenerationRequest below = q;
  below.sample_below = greedy[0];
  g = sched.submit(below);
  const std::vector<int32_t> got = collect(*g);
  std::span<const float> first_logits = alone.prefill(q.prompt);
  const int32_t best_below = static_cast<int32_t>(
      std::max_element(first_logits.begin(), first_logits.begin() + greedy[0]) - first_logits.begin());
  ASSERT_EQ(got.size(), 10u);
  EXPECT_EQ(got[0], best_below);
  for (int32_t id : got) EXPECT_LT(id, greedy[0]);
  EXPECT_EQ(g->finish(), Finish::kLength);
  {  // Its log-probabilities are the model's, over the whole vocabulary (as Hugging Face's and vLLM's);
     // they were over the drawable ids alone (stop 75); the top ids are drawable ones.
    GenerationRequest scored = below;
    scored.logprobs = 2;
    g = sched.submit(scored);
    collect(*g);
    double m = -INFINITY, sum = 0.0;
    for (float z : first_logits) m = std::max(m, static_cast<double>(z));
    for (float z : first_logits) sum += std::exp(z - m);
    const std::vector<TokenLogprobs> lps = g->logprobs();
    ASSERT_FALSE(lps.empty());
    EXPECT_EQ(lps[0].id, best_below);
    EXPECT_NEAR(lps[0].logprob, first_logits[static_cast<size_t>(best_below)] - m - std::log(sum), 1e-5);
    for (const auto& [id, value] : lps[0].top) EXPECT_LT(id, greedy[0]);
  }
  // A full context ends it by length: capacity - prompt ids, prompt and answer filling it as vLLM's
  // max_model_len counts them (one more was drawn, stop 73).
  GenerationRequest full = q;
  full.max_new_tokens = 1000;
  g = sched.submit(full);
  EXPECT_EQ(collect(*g).size(), static_cast<size_t>(cfg.max_positions) - q.prompt.size());
  EXPECT_EQ(g->finish(), Finish::kLength);
  EXPECT_GT(g->time_to_first_token(), 0.0);
  // A deadline already past: timeout, nothing generated.
  GenerationRequest late = q;
  late.deadline = Clock::now() - std::chrono::seconds(1);
  g = sched.submit(late);
  EXPECT_TRUE(collect(*g).empty());
  EXPECT_EQ(g->finish(), Finish::kTimeout);
  // Cancelled before it runs.
  g = sched.submit(q);
  g->cancel();
  collect(*g);
  EXPECT_TRUE(g->finish() == Finish::kCancelled || g->finish() == Finish::kLength);  // it may have run already
  // Bad requests are refused before they queue.
  GenerationRequest empty = q;
  empty.prompt.clear();
  EXPECT_THROW(sched.submit(empty), Error);
  GenerationRequest longp = q;
  longp.prompt.assign(cfg.max_positions + 1, 1);
  EXPECT_THROW(sched.submit(longp), Error);
  GenerationRequest badtok = q;
  badtok.prompt = {cfg.vocab_size};
  EXPECT_THROW(sched.submit(badtok), Error);
  GenerationRequest negative = q;
  negative.max_new_tokens = -1;
  EXPECT_THROW(sched.submit(negative), Error);
  {  // max_new_tokens 0: the prompt runs, nothing is drawn ("length")
    GenerationRequest zero = q;
    zero.max_new_tokens = 0;
    auto g = sched.submit(zero);
    ASSERT_TRUE(g);
    EXPECT_TRUE(collect(*g).empty());
    EXPECT_EQ(g->finish(), Finish::kLength);
  }
  GenerationRequest banned = q;  // min_tokens with every id a stop id: nothing could be drawn
  banned.min_tokens = 1;
  for (int32_t id = 0; id < cfg.vocab_size; ++id) banned.stop_ids.push_back(id);
  EXPECT_THROW(sched.submit(banned), Error);
  GenerationRequest badtemp = q;
  badtemp.sampling.temperature = -1.0f;
  EXPECT_THROW(sched.submit(badtemp), Error);
  // Draining refuses new requests and returns when nothing is left.
  sched.drain();
  EXPECT_TRUE(sched.draining());
  EXPECT_EQ(sched.submit(q), nullptr);
}

// One slot and a queue of one: while a long generation holds the slot and one request waits, a
// third is refused; cancelling the first lets the waiting one run.
TEST(Scheduler, AFullQueueRefuses) {
  const models::ModelConfig cfg = long_llama();
  auto model = make_model(cfg);
  Generator gen(*model, {.capacity = 4096, .slots = 1});
  Scheduler sched(gen, {.max_queue = 1});
  const GenerationRequest q = greedy(3, cfg.vocab_size, 9, 4000);
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto a = sched.submit(q);
    ASSERT_NE(a, nullptr);
    bool done = false;
    while (a->wait(0, std::chrono::milliseconds(50), &done).empty() && !done) {
    }
    auto b = sched.submit(q);  // waits for the slot
    ASSERT_NE(b, nullptr);
    auto c = sched.submit(q);
    const bool a_running = a->finish() == Finish::kNone;
    a->cancel();
    b->cancel();
    collect(*a);
    collect(*b);
    EXPECT_EQ(a->finish(), Finish::kCancelled);
    if (!a_running) continue;  // the machine was slow enough for a to finish: look again
    EXPECT_EQ(c, nullptr);
    return;
  }
  ADD_FAILURE() << "the first request never stayed running long enough to fill the queue";
}

// A sequence is off the active count by the time its end is seen: the engine used to signal the end
// first and lower the count only after the rest of its iteration, so a client (or /health) that
// looked at once still counted it. Here the rest of that iteration is a long prefill: x runs, a and
// b queue behind it and are admitted together; a ends at its first token, then b's 3000-token
// prompt fills its slot. Whoever waits on a must then see x and b active, not three.
TEST(Scheduler, AnEndedSequenceIsOffTheCountWhenItsEndIsSeen) {
  const models::ModelConfig cfg = long_llama();
  auto model = make_model(cfg);
  Generator gen(*model, {.capacity = 4096, .slots = 3});
  Scheduler sched(gen, {.max_queue = 8});
  const GenerationRequest x = greedy(3000, cfg.vocab_size, 11, 1000), a = greedy(4, cfg.vocab_size, 12, 1),
                          b = greedy(3000, cfg.vocab_size, 13, 1000);
  auto gx = sched.submit(x);
  ASSERT_NE(gx, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the engine is in x's prefill
  auto ga = sched.submit(a);
  auto gb = sched.submit(b);
  ASSERT_NE(ga, nullptr);
  ASSERT_NE(gb, nullptr);
  EXPECT_EQ(collect(*ga).size(), 1u);
  const int active = sched.stats().active;
  EXPECT_EQ(ga->finish(), Finish::kLength);
  const bool others_running = gx->finish() == Finish::kNone && gb->finish() == Finish::kNone;
  gx->cancel();
  gb->cancel();
  collect(*gx);
  collect(*gb);
  if (others_running) EXPECT_EQ(active, 2);
  else EXPECT_LE(active, 2);
  sched.drain();
  EXPECT_EQ(sched.stats().active, 0);
}

}  // namespace
}  // namespace mt::serve
