#include "serve/scheduler.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "base/error.h"
#include "base/fault.h"

namespace mt::serve {

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::kStop: return "stop";
    case Finish::kLength: return "length";
    case Finish::kTimeout: return "timeout";
    case Finish::kCancelled: return "cancelled";
    case Finish::kError: return "error";
    case Finish::kNone: break;
  }
  return "none";
}

std::vector<int32_t> Generation::wait(size_t have, std::chrono::milliseconds wait, bool* done, bool until_done) {
  std::unique_lock<std::mutex> lock(mu_);
  token_waiter_ = !until_done;
  cv_.wait_for(lock, wait, [&] { return (!until_done && tokens_.size() > have) || finish_ != Finish::kNone; });
  *done = finish_ != Finish::kNone;
  if (tokens_.size() <= have) return {};
  return std::vector<int32_t>(tokens_.begin() + static_cast<std::ptrdiff_t>(have), tokens_.end());
}

void Generation::cancel(Finish why) {
  int expected = 0;
  cancel_.compare_exchange_strong(expected, static_cast<int>(why));
}

Finish Generation::finish() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finish_;
}

std::string Generation::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

double Generation::time_to_first_token() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (tokens_.empty()) return 0.0;
  return std::chrono::duration<double>(first_token_ - submitted_).count();
}

std::vector<TokenLogprobs> Generation::logprobs(size_t from) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (from >= logprobs_.size()) return {};
  return std::vector<TokenLogprobs>(logprobs_.begin() + static_cast<std::ptrdiff_t>(from), logprobs_.end());
}

std::vector<TokenLogprobs> Generation::stop_logprobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_logprobs_;
}

bool Generation::ended_on_a_stop_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ended_on_stop_id_;
}

std::vector<TokenLogprobs> Generation::prompt_logprobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return prompt_logprobs_;
}

void Generation::push(int32_t id, TokenLogprobs* lp) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (tokens_.empty()) first_token_ = Clock::now();
    tokens_.push_back(id);
    if (lp != nullptr) logprobs_.push_back(std::move(*lp));
    wake = token_waiter_;
  }
  if (wake) cv_.notify_all();
}

void Generation::end(Finish why, std::string error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finish_ != Finish::kNone) return;
    finish_ = why;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

Scheduler::Scheduler(Generator& generator, const SchedulerOptions& options)
    : gen_(generator), options_(options) {
  MT_CHECK(options.max_queue >= 0, ErrorKind::kInvalidArgument, "scheduler: max_queue must be >= 0");
  for (int s = gen_.slots() - 1; s >= 0; --s) free_slots_.push_back(s);
  totals_.slots = gen_.slots();
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    draining_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int Scheduler::capacity() const { return gen_.capacity(); }

std::shared_ptr<Generation> Scheduler::submit(GenerationRequest request) {
  const int n = static_cast<int>(request.prompt.size());
  MT_CHECK(n > 0, ErrorKind::kInvalidArgument, "the prompt is empty");
  MT_CHECK(n <= gen_.capacity(), ErrorKind::kInvalidArgument,
           "the prompt has " + std::to_string(n) + " tokens; the context holds " + std::to_string(gen_.capacity()));
  MT_CHECK(n < gen_.capacity() || request.max_new_tokens == 0, ErrorKind::kInvalidArgument,
           "the prompt has " + std::to_string(n) + " tokens; the context of " + std::to_string(gen_.capacity()) +
               " leaves no room for an answer");
  for (int32_t id : request.prompt)
    MT_CHECK(id >= 0 && id < gen_.vocab_size(), ErrorKind::kInvalidArgument,
             "prompt token " + std::to_string(id) + " is outside the vocabulary");
  MT_CHECK(request.sample_below >= 1, ErrorKind::kInvalidArgument, "sample_below must be >= 1");
  MT_CHECK(request.max_new_tokens >= 0, ErrorKind::kInvalidArgument,
           "max_tokens must be at least 0, got " + std::to_string(request.max_new_tokens));
  if (request.prompt_logprobs)  // each is scored over the ids that can be drawn
    for (int32_t id : request.prompt)
      MT_CHECK(id < request.sample_below, ErrorKind::kInvalidArgument,
               "prompt token " + std::to_string(id) + " is past the tokenizer's ids (" + std::to_string(request.sample_below) + ")");
  MT_CHECK(request.logprobs >= -1 && request.logprobs <= 1000, ErrorKind::kInvalidArgument,
           "logprobs must be from 0 to 1000 (or -1: none), got " + std::to_string(request.logprobs));
  sampling_options_validate(request.sampling);
  MT_CHECK(request.min_tokens >= 0, ErrorKind::kInvalidArgument, "min_tokens must be >= 0");
  if (request.min_tokens > 0) {  // the stop ids are banned that long: something else must be drawable
    std::vector<int32_t> banned;
    for (int32_t id : request.stop_ids)
      if (id >= 0 && id < std::min(request.sample_below, gen_.vocab_size())) banned.push_back(id);
    std::sort(banned.begin(), banned.end());
    banned.erase(std::unique(banned.begin(), banned.end()), banned.end());
    MT_CHECK(static_cast<int>(banned.size()) < std::min(request.sample_below, gen_.vocab_size()), ErrorKind::kInvalidArgument,
             "min_tokens: every id that can be drawn is a stop id");
  }
  for (const auto& [id, b] : request.sampling.logit_bias)
    MT_CHECK(id < gen_.vocab_size(), ErrorKind::kInvalidArgument,
             "logit_bias names token " + std::to_string(id) + ", outside the vocabulary");
  auto g = std::make_shared<Generation>();
  g->prompt_tokens_ = n;
  g->submitted_ = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (static_cast<int>(queue_.size()) >= options_.max_queue) {  // cancelled entries (a refused request's) leave first
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (it->first->cancel_.load() != 0) {
          it->first->end(static_cast<Finish>(it->first->cancel_.load()));
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      if (queue_.empty() && active_count_ == 0) idle_cv_.notify_all();
    }
    if (draining_ || static_cast<int>(queue_.size()) >= options_.max_queue) return nullptr;
    queue_.emplace_back(g, std::move(request));
  }
  cv_.notify_all();
  return g;
}

void Scheduler::drain() {
  draining_ = true;
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && active_count_ == 0; });
}

Scheduler::Stats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = totals_;
  s.queued = static_cast<int>(queue_.size());
  s.active = active_count_;
  return s;
}

// The count falls and the sequence ends in one critical section: whoever sees the end (a client
// that then reads stats() or /health, or drain()) sees the count without it. Lock order: the
// scheduler's mutex, then the generation's (nothing takes them the other way round).
void Scheduler::retire(Generation& g, Finish why, std::string error) {
  std::lock_guard<std::mutex> lock(mu_);
  --active_count_;
  g.end(why, std::move(error));
  if (queue_.empty() && active_count_ == 0) idle_cv_.notify_all();
}

bool Scheduler::take(Active& a, std::span<const float> logits) {
  int32_t id;
  TokenLogprobs lp;
  const std::span<const float> drawn = logits.first(std::min(logits.size(), static_cast<size_t>(a.req.sample_below)));
  try {
    id = a.sampler.sample(drawn, a.produced < a.req.min_tokens ? std::span<const int32_t>(a.req.stop_ids)
                                                                : std::span<const int32_t>());
    // The model's log-probability (over its whole vocabulary, as Hugging Face and vLLM report it;
    // it was over the drawable ids, up to log(V / tokenizer ids) higher, stop 75).
    if (a.req.logprobs >= 0) lp = token_logprobs(logits, id, a.req.logprobs, drawn.size());
  } catch (const std::exception& e) {
    retire(*a.gen, Finish::kError, e.what());
    return false;
  }
  const bool stop_id = std::find(a.req.stop_ids.begin(), a.req.stop_ids.end(), id) != a.req.stop_ids.end();
  if (stop_id && std::find(a.req.returned_stop_ids.begin(), a.req.returned_stop_ids.end(), id) == a.req.returned_stop_ids.end()) {
    {
      std::lock_guard<std::mutex> lock(a.gen->mu_);
      a.gen->ended_on_stop_id_ = true;
      if (a.req.logprobs >= 0) a.gen->stop_logprobs_.assign(1, std::move(lp));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++totals_.generated_tokens;  // drawn, as the answer's usage counts it (vLLM's counters too)
    }
    retire(*a.gen, Finish::kStop);
    return false;
  }
  a.gen->push(id, a.req.logprobs >= 0 ? &lp : nullptr);
  a.last = id;
  ++a.produced;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++totals_.generated_tokens;
  }
  if (stop_id) {  // a returned one: the answer's last token
    retire(*a.gen, Finish::kStop);
    return false;
  }
  // The context holds the prompt and the answer (vLLM's max_model_len): the token that fills it is
  // the last (one more was drawn, past what an explicit max_tokens may ask).
  if (a.produced >= a.req.max_new_tokens || gen_.position(a.slot) + 1 >= gen_.capacity()) {
    retire(*a.gen, Finish::kLength);
    return false;
  }
  return true;
}

void Scheduler::loop() {
  std::vector<int> slots;
  std::vector<int32_t> tokens;
  for (;;) {
    std::vector<std::pair<std::shared_ptr<Generation>, GenerationRequest>> admit;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !active_.empty() || (!queue_.empty() && !free_slots_.empty()); });
      if (stop_) {
        for (auto& q : queue_) q.first->end(Finish::kCancelled, "the server is shutting down");
        queue_.clear();
        for (Active& a : active_) a.gen->end(Finish::kCancelled, "the server is shutting down");
        active_.clear();
        active_count_ = 0;
        idle_cv_.notify_all();
        return;
      }
      while (!queue_.empty() && admit.size() < free_slots_.size()) {
        admit.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      active_count_ += static_cast<int>(admit.size());
    }
    const Clock::time_point now = Clock::now();
    // Admit: a prefill each; the first token is drawn from the prompt's last logits.
    for (auto& [g, req] : admit) {
      if (g->cancel_.load() != 0 || now >= req.deadline) {
        retire(*g, g->cancel_.load() != 0 ? static_cast<Finish>(g->cancel_.load()) : Finish::kTimeout);
        continue;
      }
      const int slot = free_slots_.back();
      free_slots_.pop_back();
      Sampler sampler(req.sampling);
      sampler.set_prompt(req.prompt);  // repetition_penalty counts the prompt's ids
      Active a{g, std::move(req), std::move(sampler), slot, 0, 0};
      bool goes_on = false;
      try {
        std::span<const float> logits;
        if (a.req.prompt_logprobs) {  // each prompt token after the first, from the position before it
          const std::vector<int32_t>& p = a.req.prompt;
          const size_t below = static_cast<size_t>(a.req.sample_below);
          std::vector<TokenLogprobs> scored;
          logits = gen_.prefill(slot, p, [&](int i, std::span<const float> row) {
            scored.push_back(token_logprobs(row, p[static_cast<size_t>(i) + 1], std::max(a.req.logprobs, 0),
                                            std::min(row.size(), below)));
          });
          std::lock_guard<std::mutex> lock(g->mu_);
          g->prompt_logprobs_ = std::move(scored);
        } else {
          logits = gen_.prefill(slot, a.req.prompt);
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          totals_.prompt_tokens += a.req.prompt.size();
        }
        if (a.req.max_new_tokens == 0) retire(*g, Finish::kLength);  // the prompt scored, nothing drawn
        else goes_on = take(a, logits);
      } catch (const std::exception& e) {
        retire(*g, Finish::kError, e.what());
      }
      if (goes_on) {
        active_.push_back(std::move(a));
      } else {
        free_slots_.push_back(slot);
      }
    }
    // Cancellations and deadlines end a sequence before its next step.
    const Clock::time_point t = Clock::now();
    auto ended = [&](Active& a) {
      const int c = a.gen->cancel_.load();
      if (c != 0) retire(*a.gen, static_cast<Finish>(c));
      else if (t >= a.req.deadline) retire(*a.gen, Finish::kTimeout);
      return c != 0 || t >= a.req.deadline;
    };
    for (size_t i = 0; i < active_.size();) {
      if (ended(active_[i])) {
        free_slots_.push_back(active_[i].slot);
        active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    // One decode step for every active sequence.
    if (!active_.empty()) {
      // Test seam: a slow model (a request stays in flight for the signal tests).
      static const bool slow = fault_active("serve.slow_decode");
      if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      slots.clear();
      tokens.clear();
      for (const Active& a : active_) {
        slots.push_back(a.slot);
        tokens.push_back(a.last);
      }
      const size_t V = static_cast<size_t>(gen_.vocab_size());
      try {
        std::span<const float> rows = gen_.decode_batch(slots, tokens);
        {
          std::lock_guard<std::mutex> lock(mu_);
          ++totals_.decode_steps;
          totals_.decode_rows += slots.size();
        }
        for (size_t i = 0; i < active_.size();) {
          // active_ is in the order of slots: row i is active_[i] until one is erased, so index
          // the rows by the position at the time of the step.
          const size_t row = static_cast<size_t>(std::find(slots.begin(), slots.end(), active_[i].slot) - slots.begin());
          if (!take(active_[i], rows.subspan(row * V, V))) {
            free_slots_.push_back(active_[i].slot);
            active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(i));
          } else {
            ++i;
          }
        }
      } catch (const std::exception& e) {
        for (Active& a : active_) {
          retire(*a.gen, Finish::kError, e.what());
          free_slots_.push_back(a.slot);
        }
        active_.clear();
      }
    }
  }
}

}  // namespace mt::serve
