// Training samples as windows of the concatenated token stream, in order (wrapping around) or
// shuffled per epoch with a SplitMix64-driven Fisher–Yates permutation; see token_stream.h.
#include "data/token_stream.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "base/error.h"

namespace mt::data {

namespace {

// SplitMix64's output function: a bijection of 64-bit values.
uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, m), m >= 1: rejects the 2^64 mod m smallest draws so every residue is equally
// likely.
uint64_t uniform_below(uint64_t m, uint64_t* state) {
  uint64_t threshold = (0 - m) % m;  // 2^64 mod m
  uint64_t r;
  do {
    r = splitmix64_next(state);
  } while (r < threshold);
  return r % m;
}

}  // namespace

uint64_t splitmix64_next(uint64_t* state) {
  *state += 0x9E3779B97F4A7C15ull;
  return splitmix64_mix(*state);
}

std::vector<uint64_t> sample_permutation(uint64_t n, uint64_t seed, uint64_t epoch) {
  std::vector<uint64_t> perm(n);
  for (uint64_t i = 0; i < n; ++i) perm[i] = i;
  uint64_t state = splitmix64_mix(splitmix64_mix(seed) + epoch);
  for (uint64_t i = n; i > 1; --i) {
    uint64_t j = uniform_below(i, &state);
    std::swap(perm[i - 1], perm[j]);
  }
  return perm;
}

TokenStream::TokenStream(const IndexedDataset& dataset, int T, bool shuffle, uint64_t seed, uint64_t first_sequence,
                         uint64_t end_sequence)
    : dataset_(dataset), T_(T), shuffle_(shuffle), seed_(seed) {
  MT_CHECK(T >= 1, ErrorKind::kInvalidArgument,
           dataset.prefix() + ": token stream seq_length " + std::to_string(T) + " must be >= 1");
  first_ = first_sequence;
  end_ = std::min(end_sequence, dataset.num_sequences());
  MT_CHECK(first_ <= end_, ErrorKind::kInvalidArgument,
           dataset.prefix() + ": sequences [" + std::to_string(first_sequence) + ", " + std::to_string(end_) + ") are no range");
  base_ = first_ < dataset.num_sequences() ? dataset.sequence_start(first_) : dataset.total_tokens();
  S_ = (end_ < dataset.num_sequences() ? dataset.sequence_start(end_) : dataset.total_tokens()) - base_;
  const bool whole = first_ == 0 && end_ == dataset.num_sequences();
  MT_CHECK(S_ >= 1, ErrorKind::kInvalidArgument,
           dataset.prefix() + (whole ? std::string(": dataset has no tokens to sample from")
                                     : ": sequences [" + std::to_string(first_) + ", " + std::to_string(end_) + ") hold no tokens to sample from"));
  samples_per_epoch_ = std::max<uint64_t>(1, (S_ - 1) / static_cast<uint64_t>(T));
}

void TokenStream::set_megatron_order(uint64_t num_samples) {
  MT_CHECK(seed_ <= 0xffffffffull, ErrorKind::kInvalidArgument,
           dataset_.prefix() + ": Megatron's sample order takes a seed in [0, 2^32 - 1] (numpy's RandomState), not " +
               std::to_string(seed_));
  const double bytes = MegatronOrder::index_bytes(end_ - first_, S_, T_, num_samples);
  const double memory = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  MT_CHECK(memory <= 0 || bytes <= memory / 2, ErrorKind::kInvalidArgument,
           dataset_.prefix() + ": Megatron's order for " + std::to_string(num_samples) + " samples (train_iters x train_batch_size) "
           "needs " + std::to_string(static_cast<int64_t>(bytes / 1073741824.0)) + " GiB of indices, more than half of this "
           "machine's " + std::to_string(static_cast<int64_t>(memory / 1073741824.0)) + " GiB");
  std::vector<int32_t> lengths(end_ - first_);
  for (uint64_t i = 0; i < lengths.size(); ++i) lengths[i] = static_cast<int32_t>(dataset_.sequence_length(first_ + i));
  megatron_ = std::make_unique<MegatronOrder>(std::move(lengths), T_, num_samples, static_cast<uint32_t>(seed_));
}

uint64_t TokenStream::token_position(uint64_t k, uint64_t j) {
  if (!megatron_) return base_ + (window_start(k) + j) % S_;
  for (const MegatronPiece& p : megatron_->pieces(k)) {
    if (j < static_cast<uint64_t>(p.length))
      return dataset_.sequence_start(first_ + p.sequence) + static_cast<uint64_t>(p.offset) + j;
    j -= static_cast<uint64_t>(p.length);
  }
  MT_CHECK(false, ErrorKind::kInvalidArgument, dataset_.prefix() + ": token " + std::to_string(j) + " past a sample");
  return 0;
}

void TokenStream::read_pieces(const IndexedDataset& ds, uint64_t k, int32_t* out) const {
  for (const MegatronPiece& p : megatron_->pieces(k)) {
    ds.read_stream(dataset_.sequence_start(first_ + p.sequence) + static_cast<uint64_t>(p.offset), static_cast<uint64_t>(p.length),
                   out);
    out += p.length;
  }
}

uint64_t TokenStream::window_start(uint64_t k) {
  MT_CHECK(!megatron_, ErrorKind::kInternal, dataset_.prefix() + ": a Megatron-order sample is not one window");
  uint64_t T = static_cast<uint64_t>(T_);
  if (!shuffle_) {
    // (k·T) mod S without overflow.
    return static_cast<uint64_t>((static_cast<unsigned __int128>(k % S_) * T) % S_);
  }
  uint64_t epoch = k / samples_per_epoch_;
  if (!have_perm_ || perm_epoch_ != epoch) {
    perm_ = sample_permutation(samples_per_epoch_, seed_, epoch);
    perm_epoch_ = epoch;
    have_perm_ = true;
  }
  // perm · T + T + 1 <= n·T + 1 <= S when n = (S − 1) / T; 0 when n was raised to 1.
  return perm_[k % samples_per_epoch_] * T;
}

void TokenStream::set_loss_mask(const IndexedDataset* mask) {
  MT_CHECK(!mask || mask->total_tokens() == dataset_.total_tokens(), ErrorKind::kInvalidArgument,
           (mask ? mask->prefix() : std::string()) + ": loss mask has " + std::to_string(mask ? mask->total_tokens() : 0) +
               " values for " + std::to_string(dataset_.total_tokens()) + " tokens of " + dataset_.prefix());
  if (mask) {
    // A mask of zeros only over the stream's tokens trains nothing: every step's loss and gradient
    // were 0 and the run exited 0 (PyTorch's and Megatron's mean over no tokens is NaN). Read until
    // the first trained token: at once for a real mask, the whole of it only for the refused one.
    std::vector<int32_t> buf(std::min<uint64_t>(S_, uint64_t{1} << 20));
    bool trained = false;
    for (uint64_t at = 0; at < S_ && !trained; at += buf.size()) {
      const uint64_t n = std::min<uint64_t>(buf.size(), S_ - at);
      mask->read_stream(base_ + at, n, buf.data());
      trained = std::any_of(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n), [](int32_t v) { return v != 0; });
    }
    MT_CHECK(trained, ErrorKind::kInvalidArgument,
             mask->prefix() + ": the loss mask is 0 on all " + std::to_string(S_) + " tokens " +
                 (first_ > 0 || end_ < dataset_.num_sequences() ? "of the split's share of " : "of ") + dataset_.prefix() +
                 ": nothing would be trained (are the records' responses empty?)");
  }
  mask_ = mask;
}

// A loss mask is one 0 or 1 a token (tokenize writes them): 2 or -1 trained as 1 without a word
// (stop 73).
void TokenStream::check_mask_value(int32_t v, uint64_t sample) const {
  MT_CHECK(v == 0 || v == 1, ErrorKind::kInvalidArgument,
           mask_->prefix() + ": loss mask value " + std::to_string(v) + " in sample " + std::to_string(sample) +
               " is not 0 or 1 (one 0/1 value a token)");
}

void TokenStream::read_wrapped(const IndexedDataset& ds, uint64_t position, uint64_t count, int32_t* out) const {
  while (count > 0) {
    uint64_t n = std::min(count, S_ - position);
    ds.read_stream(base_ + position, n, out);
    out += n;
    count -= n;
    position = 0;
  }
}

void TokenStream::sample(uint64_t k, int32_t* inputs, int32_t* targets) {
  if (megatron_) {
    const size_t T = static_cast<size_t>(T_);
    buf_.resize(T + 1);
    read_pieces(dataset_, k, buf_.data());
    std::memcpy(inputs, buf_.data(), T * sizeof(int32_t));
    std::memcpy(targets, buf_.data() + 1, T * sizeof(int32_t));
    if (mask_) {  // the mask of target i is that of the sample's token i + 1
      read_pieces(*mask_, k, buf_.data());
      for (size_t i = 0; i < T; ++i) {
        check_mask_value(buf_[i + 1], k);
        if (buf_[i + 1] == 0) targets[i] = -100;
      }
    }
    return;
  }
  uint64_t start = window_start(k);
  uint64_t T = static_cast<uint64_t>(T_);
  read_wrapped(dataset_, start, T, inputs);
  std::memcpy(targets, inputs + 1, (T - 1) * sizeof(int32_t));
  read_wrapped(dataset_, (start + T) % S_, 1, targets + T - 1);
  if (mask_) {  // the mask of target i is that of stream position start + 1 + i
    mask_buf_.resize(T);
    read_wrapped(*mask_, (start + 1) % S_, T, mask_buf_.data());
    for (uint64_t i = 0; i < T; ++i) {
      check_mask_value(mask_buf_[i], k);
      if (mask_buf_[i] == 0) targets[i] = -100;
    }
  }
}

void TokenStream::batch(uint64_t first, int B, int32_t* inputs, int32_t* targets) {
  MT_CHECK(B >= 0, ErrorKind::kInvalidArgument,
           dataset_.prefix() + ": token stream batch size " + std::to_string(B) + " is negative");
  for (int b = 0; b < B; ++b) {
    size_t row = static_cast<size_t>(b) * static_cast<size_t>(T_);
    sample(first + static_cast<uint64_t>(b), inputs + row, targets + row);
  }
}

}  // namespace mt::data
