// Scheduler: continuous batching of concurrent generations over one multi-slot Generator.
//
// Requests queue (bounded); one engine thread owns the generator. Each iteration it admits queued
// requests into free slots (a prefill each, whose first token is drawn at once), then runs one
// decode step for every active sequence together (Generator::decode_batch: the GEMMs read the
// weights once for all of them) and draws each sequence's next token with its own sampler. A
// sequence ends at a stop token (not returned), at max_new_tokens or a full context ("length"),
// at its deadline ("timeout"), when its caller cancels it (a client gone, a stop string matched),
// or on an error; its slot is free for the next request at the following iteration.
//
//   Scheduler sched(gen, {.max_queue = 64});
//   std::shared_ptr<Generation> g = sched.submit(std::move(request));   // nullptr: queue full
//   std::vector<int32_t> ids; bool done = false;
//   while (!done) for (int32_t id : g->wait(ids.size(), 100ms, &done)) ids.push_back(id);
//
// Thread-safety: submit/drain/stats from any thread; a Generation is shared by the engine thread
// and its caller.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "serve/generator.h"
#include "serve/sampler.h"

namespace mt::serve {

using Clock = std::chrono::steady_clock;

struct GenerationRequest {
  std::vector<int32_t> prompt;           // not empty, at most the generator's capacity
  int max_new_tokens = 16;               // >= 0
  SamplingOptions sampling;
  std::vector<int32_t> stop_ids;         // ends the sequence ("stop"); the id is not returned
  // Of stop_ids, those returned as the sequence's last token (vLLM's include_stop_str_in_output
  // writes a stop id that is not special); with logprobs their entry is in logprobs(), not
  // stop_logprobs().
  std::vector<int32_t> returned_stop_ids;
  int32_t sample_below = INT32_MAX;      // ids >= this are never drawn: a model vocabulary padded
                                         // past its tokenizer's, which cannot decode them (>= 1)
  Clock::time_point deadline = Clock::time_point::max();
  // vLLM's min_tokens: the stop ids are not drawn before this many tokens.
  int min_tokens = 0;
  // OpenAI's logprobs: -1 none; k >= 0: each drawn token's log-probability under the model (over
  // the ids below sample_below) and the k most likely ids' (Generation::logprobs).
  int logprobs = -1;
  // echo's prompt logprobs: each prompt token after the first, with the `logprobs` most likely ids
  // at its position (Generation::prompt_logprobs); the prompt's ids must be below sample_below.
  // max_new_tokens may be 0: the prompt runs (and is scored), nothing is drawn ("length").
  bool prompt_logprobs = false;
};

enum class Finish { kNone, kStop, kLength, kTimeout, kCancelled, kError };
const char* finish_name(Finish f);  // "stop", "length", "timeout", "cancelled", "error"

class Generation {
 public:
  // Waits until the sequence has more than `have` tokens (or, when until_done, until it has ended),
  // or `wait` passes; returns the tokens from index `have` on and sets *done when the sequence has
  // ended (and all its tokens are in what was returned). The engine wakes only waiters whose
  // condition holds: a caller that needs only the end (until_done) is not woken at every token.
  std::vector<int32_t> wait(size_t have, std::chrono::milliseconds wait, bool* done, bool until_done = false);
  // Asks the engine to end the sequence (at its next iteration) with `why` (kCancelled or kStop).
  void cancel(Finish why = Finish::kCancelled);
  Finish finish() const;
  std::string error() const;
  int prompt_tokens() const { return prompt_tokens_; }
  // GenerationRequest::logprobs' entries, one per token pushed; prompt_logprobs' one per prompt token
  // after the first. Complete once the sequence has ended.
  // (from: the entries of the tokens from that index on, which a stream sends as they come.)
  std::vector<TokenLogprobs> logprobs(size_t from = 0) const;
  std::vector<TokenLogprobs> prompt_logprobs() const;
  // With logprobs: the stop id that ended the sequence (not pushed: no text), with its
  // log-probability; empty when it ended otherwise. An evaluation's last token may be the model's
  // end of text (vLLM lists it too).
  std::vector<TokenLogprobs> stop_logprobs() const;
  // Whether a stop id that was not returned ended the sequence (it was drawn: a count of the
  // tokens made includes it).
  bool ended_on_a_stop_id() const;
  // Seconds from submit to the first token (prefill included); 0 before it.
  double time_to_first_token() const;

 private:
  friend class Scheduler;
  void push(int32_t id, TokenLogprobs* lp = nullptr);
  void end(Finish why, std::string error = "");

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool token_waiter_ = false;  // a caller waits for the next token (not only for the end)
  std::vector<int32_t> tokens_;
  std::vector<TokenLogprobs> logprobs_, prompt_logprobs_, stop_logprobs_;
  bool ended_on_stop_id_ = false;
  Finish finish_ = Finish::kNone;
  std::string error_;
  std::atomic<int> cancel_{0};  // a Finish value; 0 = none
  int prompt_tokens_ = 0;
  Clock::time_point submitted_, first_token_;
};

struct SchedulerOptions {
  int max_queue = 64;  // requests waiting for a slot; submit refuses beyond it
};

class Scheduler {
 public:
  // Starts the engine thread. The generator must outlive the scheduler and be used by nothing else.
  Scheduler(Generator& generator, const SchedulerOptions& options = {});
  ~Scheduler();  // cancels what is left and joins
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. Returns nullptr when the queue is full or the scheduler is draining (the
  // server answers 503). Throws kInvalidArgument, queueing nothing, for an empty or too-long prompt,
  // a token outside the vocabulary, max_new_tokens < 0 or invalid sampling options.
  std::shared_ptr<Generation> submit(GenerationRequest request);

  // Refuses new requests from now on and returns once every queued and active one has ended.
  void drain();
  bool draining() const { return draining_.load(); }
  int capacity() const;  // the context a prompt must fit (the generator's)

  struct Stats {
    int queued = 0, active = 0, slots = 0;
    uint64_t prompt_tokens = 0, generated_tokens = 0;  // totals
    uint64_t decode_steps = 0, decode_rows = 0;        // rows / steps = mean batch
  };
  Stats stats() const;

 private:
  struct Active {
    std::shared_ptr<Generation> gen;
    GenerationRequest req;
    Sampler sampler;
    int slot = 0;
    int produced = 0;
    int32_t last = 0;
  };
  void loop();
  // Draws from logits for a; ends it when the draw or the context says so. Returns true when it
  // goes on.
  bool take(Active& a, std::span<const float> logits);
  // Ends an admitted sequence and takes it off the active count, both under mu_.
  void retire(Generation& g, Finish why, std::string error = "");

  Generator& gen_;
  SchedulerOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::pair<std::shared_ptr<Generation>, GenerationRequest>> queue_;
  std::vector<Active> active_;  // engine thread only
  std::vector<int> free_slots_;  // engine thread only
  int active_count_ = 0;         // guarded by mu_
  std::atomic<bool> draining_{false};
  bool stop_ = false;
  Stats totals_;  // guarded by mu_ (counters only)
  std::thread thread_;
};

}  // namespace mt::serve
