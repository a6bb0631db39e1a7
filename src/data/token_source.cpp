// One dataset or Megatron's blend of several, each part a TokenStream; see token_source.h.
#include "data/token_source.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <unistd.h>

#include "base/error.h"

namespace mt::data {

TokenSource::TokenSource(const std::vector<TokenSourcePart>& parts, const TokenSourceOptions& options)
    : options_(options) {
  const std::string& name = options_.name;
  MT_CHECK(!parts.empty(), ErrorKind::kInvalidArgument, name + ": no dataset");
  MT_CHECK(parts.size() == 1 || options_.blend, ErrorKind::kInternal, name + ": several datasets need a blend");
  const uint64_t T = static_cast<uint64_t>(options_.seq_length);
  for (const TokenSourcePart& given : parts) {
    Part p;
    p.prefix = given.prefix;
    p.tokens = std::make_unique<IndexedDataset>(given.prefix);
    uint64_t first = 0, end = p.tokens->num_sequences();
    std::string share;  // the split's sequences, as messages name them
    if (options_.split >= 0 && !options_.split_weights.empty()) {
      const auto range = megatron_split_sequences(options_.split_weights, end, options_.split);
      MT_CHECK(range && range->end > range->first, ErrorKind::kInvalidArgument,
               name + (name == "data.split" ? ": it leaves " : ": data.split leaves ") + (options_.split == 0 ? "training" : options_.split == 1 ? "validation" : "test") + " no sequences of the " +
                   std::to_string(end) + " in " + given.prefix);
      first = range->first;
      end = range->end;
      share = " (sequences " + std::to_string(first) + " to " + std::to_string(end - 1) + " by data.split)";
    }
    auto start_of = [&](uint64_t s) {
      return s < p.tokens->num_sequences() ? p.tokens->sequence_start(s) : p.tokens->total_tokens();
    };
    const uint64_t tokens = start_of(end) - start_of(first);
    // Shorter than one sample, every sample was the same few tokens cycled (trained and saved, exit 0).
    MT_CHECK(tokens >= T + 1, ErrorKind::kInvalidArgument,
             name + ": " + given.prefix + share + " has " + std::to_string(tokens) + " tokens, fewer than seq_length + 1 (" +
                 std::to_string(T + 1) + "): every sample would repeat it");
    p.stream = std::make_unique<TokenStream>(*p.tokens, options_.seq_length, options_.shuffle, options_.seed, first, end);
    if (!given.mask_prefix.empty()) {
      p.mask = std::make_unique<IndexedDataset>(given.mask_prefix);
      p.stream->set_loss_mask(p.mask.get());
    }
    parts_.push_back(std::move(p));
  }
  const uint64_t N = options_.num_samples;
  if (!options_.blend) {
    if (options_.megatron_order) parts_[0].stream->set_megatron_order(N);
    return;
  }
  std::vector<double> weights;
  if (options_.weighted) {
    std::vector<double> given;
    for (const TokenSourcePart& p : parts) {
      MT_CHECK(p.weight > 0.0, ErrorKind::kInvalidArgument,
               name + ": " + p.prefix + "'s weight " + std::to_string(p.weight) + " must be > 0 (Megatron's BlendedDataset asserts it)");
      given.push_back(p.weight);
    }
    MT_CHECK(numpy_sum(given) > 0.0 && std::isfinite(numpy_sum(given)), ErrorKind::kInvalidArgument,
             name + ": the blend's weights sum to " + std::to_string(numpy_sum(given)) + " (they must add up to a finite number)");
    weights = megatron_normalize(given);
    size_ = 0;
    for (size_t d = 0; d < parts_.size(); ++d) {
      size_ += megatron_blend_share(weights[d], N);
      if (options_.megatron_order) parts_[d].stream->set_megatron_order(megatron_blend_build(weights[d], N));
    }
    weights = megatron_normalize(weights);
  } else {
    // Megatron's blend without weights: one epoch of each part, weighted by its samples.
    uint64_t total = 0;
    for (Part& p : parts_) {
      if (options_.megatron_order) p.stream->set_megatron_order(0);
      const uint64_t samples = options_.megatron_order ? p.stream->megatron_order()->size() : (p.stream->num_tokens() - 1) / T;
      weights.push_back(static_cast<double>(samples));
      total += samples;
    }
    size_ = std::min(N, total);
    MT_CHECK(N <= total, ErrorKind::kInvalidArgument,
             name + ": a blend without weights is one epoch of each dataset, " + std::to_string(total) +
                 " samples of seq_length; the run draws " + std::to_string(N) + ": give each dataset a weight");
    weights = megatron_normalize(weights);
  }
  const double memory = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  MT_CHECK(memory <= 0 || static_cast<double>(size_) * 10.0 <= memory / 2, ErrorKind::kInvalidArgument,
           name + ": the blend's index of " + std::to_string(size_) + " samples (the samples the run draws) needs " +
               std::to_string(static_cast<int64_t>(static_cast<double>(size_) * 10.0 / 1073741824.0)) +
               " GiB, more than half of this machine's memory");
  blend_ = std::make_unique<MegatronBlend>(weights, size_);
}

std::pair<size_t, uint64_t> TokenSource::locate(uint64_t k) const {
  if (!blend_) return {0, k};
  MT_CHECK(k < size_, ErrorKind::kInvalidArgument,
           options_.name + ": sample " + std::to_string(k) + " is past the blend's " + std::to_string(size_) +
               " (built for the samples the run draws)");
  return {static_cast<size_t>(blend_->dataset(k)), blend_->sample(k)};
}

void TokenSource::sample(uint64_t k, int32_t* inputs, int32_t* targets) {
  auto [part, j] = locate(k);
  parts_[part].stream->sample(j, inputs, targets);
  if (options_.eod_mask >= 0)
    for (int i = 0; i < options_.seq_length; ++i)
      if (inputs[i] == options_.eod_mask) targets[i] = -100;
}

uint64_t TokenSource::token_position(uint64_t k, uint64_t j) {
  auto [part, local] = locate(k);
  return parts_[part].stream->token_position(local, j);
}

}  // namespace mt::data
