// Megatron-LM's GPT sample order: the document, sample and shuffle indices of its GPTDataset,
// built as megatron_order.h describes.
#include "data/megatron_order.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <string>
#include <utility>

#include "base/error.h"

namespace mt::data {

uint64_t NumpyLegacyRandom::interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  for (int s = 1; s <= 32; s *= 2) mask |= mask >> s;
  uint64_t value;
  if (max <= 0xffffffffull) {
    do {
      value = static_cast<uint64_t>(mt_()) & mask;
    } while (value > max);
  } else {
    do {
      const uint64_t hi = mt_();
      value = ((hi << 32) | static_cast<uint64_t>(mt_())) & mask;
    } while (value > max);
  }
  return value;
}

namespace {

// `epochs` copies of 0..n−1 appended, shuffled as one array (in place: no copy of a part).
void append_shuffled_epochs(std::vector<int32_t>* out, size_t n, int epochs, NumpyLegacyRandom* rng) {
  const size_t at = out->size();
  for (int e = 0; e < epochs; ++e)
    for (size_t d = 0; d < n; ++d) out->push_back(static_cast<int32_t>(d));
  rng->shuffle(out->data() + at, out->size() - at);
}

template <typename T>
void append_shuffled_range(std::vector<T>* out, uint64_t begin, uint64_t end, NumpyLegacyRandom* rng) {
  const size_t at = out->size();
  for (uint64_t i = begin; i < end; ++i) out->push_back(static_cast<T>(i));
  rng->shuffle(out->data() + at, out->size() - at);
}

}  // namespace

MegatronOrder::MegatronOrder(std::vector<int32_t> sequence_lengths, int T, uint64_t num_samples, uint32_t seed)
    : lengths_(std::move(sequence_lengths)), T_(T) {
  build(num_samples, seed);
}

void MegatronOrder::build(uint64_t num_samples, uint32_t seed) {
  MT_CHECK(T_ >= 1, ErrorKind::kInvalidArgument, "Megatron sample order: seq_length " + std::to_string(T_) + " must be >= 1");
  uint64_t S = 0;
  for (int32_t n : lengths_) S += static_cast<uint64_t>(n);
  MT_CHECK(S >= 2, ErrorKind::kInvalidArgument,
           "Megatron sample order: the dataset has " + std::to_string(S) + " tokens (Megatron needs more than 1)");
  const uint64_t T = static_cast<uint64_t>(T_);

  // Epochs: the fewest holding num_samples · T + 1 tokens (the extra token is the last target).
  // (by division: a loop of epochs ran for hours on a train_iters of 1e15 before refusing it)
  const unsigned __int128 wanted = static_cast<unsigned __int128>(num_samples) * T + 1;
  const unsigned __int128 need = (wanted + S - 1) / S;
  const uint64_t epochs = need > 0xffffffffull ? 0xffffffffull : static_cast<uint64_t>(std::max<unsigned __int128>(need, 1));
  MT_CHECK(epochs <= 0x7fffffffull && static_cast<unsigned __int128>(epochs) * lengths_.size() < (1ull << 31),
           ErrorKind::kInvalidArgument,
           "Megatron sample order: " + std::to_string(num_samples) + " samples of " + std::to_string(T_) + " tokens need " +
               std::to_string(epochs) + " epochs of " + std::to_string(lengths_.size()) +
               " sequences, more than Megatron's int32 document index holds");
  epochs_ = static_cast<int>(epochs);
  uint64_t before_final = 0;  // samples in the epochs before the last: ((E − 1)·S − 1) / T
  if (epochs_ > 1) {
    before_final = ((epochs - 1) * S - 1) / T;
    const uint64_t from_final = num_samples - before_final;
    const uint64_t per_epoch = (S - 1) / T;
    separate_final_epoch_ = from_final < static_cast<uint64_t>(0.80 * static_cast<double>(per_epoch));
  }

  NumpyLegacyRandom rng(seed);
  document_index_.clear();
  document_index_.reserve(lengths_.size() * epochs);
  if (separate_final_epoch_) {
    append_shuffled_epochs(&document_index_, lengths_.size(), epochs_ - 1, &rng);
    append_shuffled_epochs(&document_index_, lengths_.size(), 1, &rng);
  } else {
    append_shuffled_epochs(&document_index_, lengths_.size(), epochs_, &rng);
  }

  // Sample boundaries: each sample takes T + 1 tokens from where the previous one's last token was.
  const uint64_t M = (epochs * S - 1) / T;
  sample_index_.clear();
  sample_index_.reserve(2 * (M + 1));
  sample_index_.push_back(0);
  sample_index_.push_back(0);
  int64_t at = 0, offset = 0;  // position in document_index_, token within that sequence
  for (uint64_t i = 1; i <= M; ++i) {
    int64_t remaining = static_cast<int64_t>(T) + 1;
    while (remaining != 0) {
      const int64_t length = lengths_[static_cast<size_t>(document_index_[static_cast<size_t>(at)])] - offset;
      remaining -= length;
      if (remaining <= 0) {
        offset += remaining + length - 1;
        remaining = 0;
      } else {
        MT_CHECK(at + 1 < static_cast<int64_t>(document_index_.size()), ErrorKind::kInternal,
                 "Megatron sample order: sample " + std::to_string(i) + " runs past the document index");
        ++at;
        offset = 0;
      }
    }
    sample_index_.push_back(static_cast<int32_t>(at));
    sample_index_.push_back(static_cast<int32_t>(offset));
  }

  auto shuffle_into = [&](auto* out) {
    out->reserve(M);
    if (separate_final_epoch_) {
      append_shuffled_range(out, 0, before_final, &rng);
      append_shuffled_range(out, before_final, M, &rng);
    } else {
      append_shuffled_range(out, 0, M, &rng);
    }
  };
  shuffle32_.clear();
  shuffle64_.clear();
  if (M < 0xffffffffull - 1) shuffle_into(&shuffle32_);
  else shuffle_into(&shuffle64_);
  size_ = M;
}

double MegatronOrder::index_bytes(uint64_t num_sequences, uint64_t tokens, int T, uint64_t num_samples) {
  const double t = static_cast<double>(tokens), n = static_cast<double>(num_samples) * T + 1;
  const double epochs = std::max(1.0, std::ceil(n / std::max(t, 1.0)));
  const double built = epochs * t / T;  // M
  return epochs * static_cast<double>(num_sequences) * 4 + built * 8 + built * (built < 4294967294.0 ? 4 : 8);
}

std::vector<MegatronPiece> MegatronOrder::pieces(uint64_t k) const {
  MT_CHECK(k < size(), ErrorKind::kInvalidArgument,
           "Megatron sample order: sample " + std::to_string(k) + " of " + std::to_string(size()) + " built");
  const uint64_t s = sample_of(k);
  const int64_t first = sample_index_[2 * s], first_offset = sample_index_[2 * s + 1];
  const int64_t last = sample_index_[2 * s + 2], last_offset = sample_index_[2 * s + 3];
  std::vector<MegatronPiece> out;
  int64_t total = 0;
  for (int64_t i = first; i <= last; ++i) {
    const uint64_t seq = static_cast<uint64_t>(document_index_[static_cast<size_t>(i)]);
    const int64_t offset = i == first ? first_offset : 0;
    const int64_t length = i < last ? lengths_[seq] - offset : last_offset + 1 - offset;
    if (length > 0) out.push_back({seq, offset, length});
    total += length;
  }
  MT_CHECK(total == static_cast<int64_t>(T_) + 1, ErrorKind::kInternal,
           "Megatron sample order: sample " + std::to_string(s) + " holds " + std::to_string(total) + " tokens, not " +
               std::to_string(T_ + 1));
  return out;
}

double numpy_sum(const std::vector<double>& values) {
  // numpy's pairwise_sum over [begin, begin + n).
  auto pairwise = [&](auto&& self, size_t begin, size_t n) -> double {
    if (n < 8) {
      double res = 0.0;
      for (size_t i = 0; i < n; ++i) res += values[begin + i];
      return res;
    }
    if (n <= 128) {
      double r[8];
      for (size_t j = 0; j < 8; ++j) r[j] = values[begin + j];
      size_t i = 8;
      for (; i < n - n % 8; i += 8)
        for (size_t j = 0; j < 8; ++j) r[j] += values[begin + i + j];
      double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
      for (; i < n; ++i) res += values[begin + i];
      return res;
    }
    size_t half = n / 2;
    half -= half % 8;
    return self(self, begin, half) + self(self, begin + half, n - half);
  };
  return pairwise(pairwise, 0, values.size());
}

std::vector<double> megatron_normalize(const std::vector<double>& weights) {
  const double sum = numpy_sum(weights);
  std::vector<double> out;
  for (double w : weights) out.push_back(w / sum);
  return out;
}

MegatronBlend::MegatronBlend(const std::vector<double>& weights, uint64_t size) {
  MT_CHECK(!weights.empty() && weights.size() < 32767, ErrorKind::kInvalidArgument,
           "Megatron blend: " + std::to_string(weights.size()) + " datasets (1 to 32766)");
  std::vector<int64_t> taken(weights.size(), 0);
  dataset_.resize(size);
  sample_.resize(size);
  for (uint64_t k = 0; k < size; ++k) {
    const double at = std::max(static_cast<double>(k), 1.0);
    size_t best = 0;
    double best_error = weights[0] * at - static_cast<double>(taken[0]);
    for (size_t d = 1; d < weights.size(); ++d) {
      const double error = weights[d] * at - static_cast<double>(taken[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    dataset_[k] = static_cast<int16_t>(best);
    sample_[k] = static_cast<uint64_t>(taken[best]++);
  }
}

uint64_t megatron_blend_share(double w, uint64_t size) {
  return static_cast<uint64_t>(std::ceil(static_cast<double>(size) * w));
}

uint64_t megatron_blend_build(double w, uint64_t size) {
  return static_cast<uint64_t>(std::ceil(static_cast<double>(megatron_blend_share(w, size)) * (1.0 + 0.005)));
}

std::vector<double> megatron_split_parse(const std::string& text) {
  std::vector<double> out;
  for (size_t i = 0; i < text.size();) {
    if (!std::isdigit(static_cast<unsigned char>(text[i])) && text[i] != '.') {
      // Megatron's findall("[.0-9]+") drops a minus: "2,-1" trained as "2,1" without a word (stop 73).
      MT_CHECK(!(text[i] == '-' && i + 1 < text.size() && (std::isdigit(static_cast<unsigned char>(text[i + 1])) || text[i + 1] == '.')),
               ErrorKind::kInvalidArgument, "\"" + text + "\": a weight is negative (each is a share, 0 or more)");
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && (std::isdigit(static_cast<unsigned char>(text[j])) || text[j] == '.')) ++j;
    double v = 0.0;
    auto [end, ec] = std::from_chars(text.data() + i, text.data() + j, v);
    MT_CHECK(ec == std::errc() && end == text.data() + j, ErrorKind::kInvalidArgument,
             "\"" + text + "\": \"" + text.substr(i, j - i) + "\" is not a number");
    out.push_back(v);
    i = j;
  }
  MT_CHECK(!out.empty() && out.size() <= 3, ErrorKind::kInvalidArgument,
           "\"" + text + "\": Megatron's split is up to three weights (train, validation, test), such as \"969,30,1\"");
  out.resize(3, 0.0);
  MT_CHECK(out[0] + out[1] + out[2] > 0.0, ErrorKind::kInvalidArgument, "\"" + text + "\": the weights sum to 0");
  return out;
}

std::optional<SequenceRange> megatron_split_sequences(const std::vector<double>& weights, uint64_t n, int which) {
  MT_CHECK(which >= 0 && static_cast<size_t>(which) < weights.size(), ErrorKind::kInvalidArgument,
           "split " + std::to_string(which) + " of " + std::to_string(weights.size()));
  const std::vector<double> w = megatron_normalize(weights);
  double lo = 0.0;
  for (int i = 0; i < which; ++i) lo += w[static_cast<size_t>(i)];
  const double hi = lo + w[static_cast<size_t>(which)];
  if (hi <= lo) return std::nullopt;
  const double N = static_cast<double>(n);
  return SequenceRange{static_cast<uint64_t>(std::nearbyint(lo * N)), static_cast<uint64_t>(std::nearbyint(hi * N))};
}

}  // namespace mt::data
