#include "serve/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "base/error.h"
#include "data/token_stream.h"

namespace mt::serve {

void sampling_options_validate(const SamplingOptions& o) {
  MT_CHECK(o.temperature >= 0.0f && std::isfinite(o.temperature), ErrorKind::kInvalidArgument,
           "sampling: temperature must be finite and >= 0 (0 = greedy), got " + std::to_string(o.temperature));
  MT_CHECK(o.top_k >= 0, ErrorKind::kInvalidArgument,
           "sampling: top_k must be >= 0 (0 = no limit), got " + std::to_string(o.top_k));
  MT_CHECK(o.top_p >= 0.0f && o.top_p <= 1.0f, ErrorKind::kInvalidArgument,
           "sampling: top_p must be in [0, 1], got " + std::to_string(o.top_p));
  MT_CHECK(o.repetition_penalty > 0.0f && std::isfinite(o.repetition_penalty), ErrorKind::kInvalidArgument,
           "sampling: repetition_penalty must be finite and > 0 (1 = none), got " + std::to_string(o.repetition_penalty));
  for (auto [v, name] : {std::pair<float, const char*>{o.frequency_penalty, "frequency_penalty"}, {o.presence_penalty, "presence_penalty"}})
    MT_CHECK(v >= -2.0f && v <= 2.0f, ErrorKind::kInvalidArgument,
             std::string("sampling: ") + name + " must be in [-2, 2], got " + std::to_string(v));
  MT_CHECK(o.min_p >= 0.0f && o.min_p <= 1.0f, ErrorKind::kInvalidArgument,
           "sampling: min_p must be in [0, 1], got " + std::to_string(o.min_p));
  MT_CHECK(o.typical_p > 0.0f && o.typical_p <= 1.0f, ErrorKind::kInvalidArgument,
           "sampling: typical_p must be in (0, 1], got " + std::to_string(o.typical_p));
  for (const auto& [id, b] : o.logit_bias)
    MT_CHECK(id >= 0 && b >= -100.0f && b <= 100.0f, ErrorKind::kInvalidArgument,
             "sampling: logit_bias of token " + std::to_string(id) + " must be in [-100, 100], got " + std::to_string(b));
}

int32_t argmax(std::span<const float> logits) {
  MT_INTERNAL_CHECK(!logits.empty());
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t id, int top, size_t candidates) {
  const size_t V = logits.size();
  const size_t C = candidates == 0 ? V : std::min(candidates, V);
  MT_INTERNAL_CHECK(id >= 0 && static_cast<size_t>(id) < V && top >= 0);
  double m = -INFINITY;
  for (size_t i = 0; i < V; ++i) {
    MT_CHECK(!std::isnan(logits[i]) && logits[i] < INFINITY, ErrorKind::kNumerical,
             "logprobs: logit " + std::to_string(i) + " is " + std::to_string(logits[i]));
    m = std::max(m, static_cast<double>(logits[i]));
  }
  MT_CHECK(m > -INFINITY, ErrorKind::kNumerical, "logprobs: every logit is -inf");
  double sum = 0.0;  // in double: the normaliser of tens of thousands of terms
  for (size_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(logits[i]) - m);
  const double lse = m + std::log(sum);
  TokenLogprobs t;
  t.id = id;
  t.logprob = static_cast<float>(static_cast<double>(logits[id]) - lse);
  const size_t k = std::min(static_cast<size_t>(top), C);
  if (k > 0) {
    std::vector<int32_t> ids(C);
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (size_t i = 0; i < k; ++i)
      t.top.emplace_back(ids[i], static_cast<float>(static_cast<double>(logits[ids[i]]) - lse));
  }
  return t;
}

Sampler::Sampler(const SamplingOptions& options) : options_(options), state_(options.seed) {
  sampling_options_validate(options);
}

void Sampler::set_prompt(std::span<const int32_t> prompt) {
  for (int32_t id : prompt) {
    if (id < 0) continue;
    if (static_cast<size_t>(id) >= seen_.size()) seen_.resize(static_cast<size_t>(id) + 1, 0);
    seen_[static_cast<size_t>(id)] = 1;
  }
}

bool Sampler::adjusts() const {
  return !options_.logit_bias.empty() || options_.repetition_penalty != 1.0f || options_.frequency_penalty != 0.0f ||
         options_.presence_penalty != 0.0f;
}

std::span<const float> Sampler::adjust(std::span<const float> logits, std::span<const int32_t> banned) {
  if (!adjusts() && banned.empty()) return logits;
  adjusted_.assign(logits.begin(), logits.end());
  const size_t V = logits.size();
  for (const auto& [id, b] : options_.logit_bias)
    if (static_cast<size_t>(id) < V) adjusted_[static_cast<size_t>(id)] += b;
  if (options_.repetition_penalty != 1.0f)
    for (size_t i = 0; i < std::min(V, seen_.size()); ++i)
      if (seen_[i]) {
        float& z = adjusted_[i];
        z = z > 0.0f ? z / options_.repetition_penalty : z * options_.repetition_penalty;
      }
  if (options_.frequency_penalty != 0.0f || options_.presence_penalty != 0.0f)
    for (size_t i = 0; i < std::min(V, drawn_count_.size()); ++i)
      if (drawn_count_[i] > 0)
        adjusted_[i] -= static_cast<float>(drawn_count_[i]) * options_.frequency_penalty + options_.presence_penalty;
  size_t left = V;
  for (int32_t id : banned)
    if (id >= 0 && static_cast<size_t>(id) < V && adjusted_[static_cast<size_t>(id)] > -INFINITY) {
      adjusted_[static_cast<size_t>(id)] = -INFINITY;
      --left;
    }
  MT_CHECK(left > 0, ErrorKind::kInvalidArgument, "sampling: every id is banned (min_tokens' stop ids)");
  return adjusted_;
}

double Sampler::warp(std::span<const float> logits) {
  const size_t V = logits.size();
  MT_CHECK(V > 0, ErrorKind::kInvalidArgument, "sampling: empty logits");
  float m = -INFINITY;
  for (size_t i = 0; i < V; ++i) {
    MT_CHECK(logits[i] < INFINITY, ErrorKind::kNumerical,
             "sampling: logit " + std::to_string(i) + " is " + std::to_string(logits[i]));
    m = std::max(m, logits[i]);
  }
  MT_CHECK(m > -INFINITY, ErrorKind::kNumerical, "sampling: every logit is -inf");
  if (options_.temperature == 0.0f) {
    kept_.assign(1, argmax(logits));
    weights_.assign(1, 1.0);
    return 1.0;
  }
  const int V32 = static_cast<int>(V);
  const bool top_k = options_.top_k > 0 && options_.top_k < V32;
  const bool top_p = options_.top_p < 1.0f;
  kept_.resize(V);
  std::iota(kept_.begin(), kept_.end(), 0);
  auto ranks_before = [&logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (top_k) {
    std::partial_sort(kept_.begin(), kept_.begin() + options_.top_k, kept_.end(), ranks_before);
    kept_.resize(options_.top_k);
  } else if (top_p) {
    std::sort(kept_.begin(), kept_.end(), ranks_before);
  }
  // p_i ∝ exp((l_i - max) / T), in double so that the top-p boundary is not a rounding artefact.
  const double inv_t = 1.0 / options_.temperature;
  weights_.resize(kept_.size());
  double total = 0.0;
  for (size_t i = 0; i < kept_.size(); ++i) {
    weights_[i] = std::exp((static_cast<double>(logits[kept_[i]]) - m) * inv_t);
    total += weights_[i];
  }
  if (top_p) {
    const double limit = static_cast<double>(options_.top_p) * total;
    double before = 0.0;
    size_t keep = 0;
    while (keep < kept_.size() && (keep == 0 || before < limit)) before += weights_[keep++];
    kept_.resize(keep);
    weights_.resize(keep);
    total = before;
  }
  if (options_.min_p > 0.0f) {  // the largest weight is exp(0) = 1 (its logit is the max)
    const double floor = static_cast<double>(options_.min_p) * *std::max_element(weights_.begin(), weights_.end());
    size_t w = 0;
    total = 0.0;
    for (size_t i = 0; i < kept_.size(); ++i)
      if (weights_[i] >= floor) {
        kept_[w] = kept_[i];
        weights_[w++] = weights_[i];
        total += weights_[i];
      }
    kept_.resize(w);
    weights_.resize(w);
  }
  if (options_.typical_p < 1.0f && kept_.size() > 1) {
    // Hugging Face's TypicalLogitsWarper over the kept distribution: each id's |-log p - H|,
    // ranked closest first (ties by id); the cut where the ranked mass first reaches typical_p.
    const size_t n = kept_.size();
    std::vector<double> shifted(n);
    double entropy = 0.0;
    for (size_t i = 0; i < n; ++i) {
      const double p = weights_[i] / total;
      if (p > 0.0) entropy -= p * std::log(p);
    }
    for (size_t i = 0; i < n; ++i) {
      const double p = weights_[i] / total;
      shifted[i] = p > 0.0 ? std::fabs(-std::log(p) - entropy) : INFINITY;
    }
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return shifted[a] < shifted[b]; });
    size_t last = 0;  // HF: the count of ranked ids whose cumulative mass is below typical_p
    double cum = 0.0;
    for (size_t r = 0; r < n; ++r) {
      cum += weights_[order[r]] / total;
      if (cum < static_cast<double>(options_.typical_p)) last = r + 1;
    }
    last = std::min(last, n - 1);
    const double limit = shifted[order[last]];
    size_t w = 0;
    total = 0.0;
    for (size_t i = 0; i < n; ++i)
      if (shifted[i] <= limit) {
        kept_[w] = kept_[i];
        weights_[w++] = weights_[i];
        total += weights_[i];
      }
    kept_.resize(w);
    weights_.resize(w);
  }
  return total;
}

int32_t Sampler::sample(std::span<const float> raw, std::span<const int32_t> banned) {
  const std::span<const float> logits = adjust(raw, banned);
  const double total = warp(logits);
  const int32_t id = draw(total);
  if (options_.frequency_penalty != 0.0f || options_.presence_penalty != 0.0f) {
    if (static_cast<size_t>(id) >= drawn_count_.size()) drawn_count_.resize(static_cast<size_t>(id) + 1, 0);
    ++drawn_count_[static_cast<size_t>(id)];
  }
  if (options_.repetition_penalty != 1.0f) set_prompt(std::span<const int32_t>(&id, 1));
  return id;
}

int32_t Sampler::draw(double total) {
  if (kept_.size() == 1) return kept_[0];
  // u uniform in [0, total): 53 random bits.
  const double u = static_cast<double>(data::splitmix64_next(&state_) >> 11) * 0x1.0p-53 * total;
  double cum = 0.0;
  size_t last = 0;
  for (size_t i = 0; i < kept_.size(); ++i) {
    if (weights_[i] <= 0.0) continue;
    cum += weights_[i];
    last = i;
    if (u < cum) return kept_[i];
  }
  return kept_[last];  // u rounded up to the total
}

void Sampler::distribution(std::span<const float> raw, std::vector<double>& probs, std::span<const int32_t> banned) {
  const std::span<const float> logits = adjust(raw, banned);
  const double total = warp(logits);
  probs.assign(logits.size(), 0.0);
  for (size_t i = 0; i < kept_.size(); ++i) probs[kept_[i]] = weights_[i] / total;
}

}  // namespace mt::serve
