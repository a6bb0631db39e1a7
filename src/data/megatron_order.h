// Megatron-LM's GPT sample order (megatron/core/datasets/gpt_dataset.py, GPTDataset over every
// sequence of one indexed dataset): the samples a Megatron run with the same data, seq_length,
// number of samples and seed trains on, in the same order.
//
// Megatron builds three arrays from numpy.random.RandomState(seed), in this order of draws:
//   epochs E: the fewest with E · S >= N·T + 1 tokens (S the dataset's tokens, N the samples the
//     run draws, T seq_length); the samples they hold, M = (E·S − 1) / T.
//   separate final epoch: E > 1 and the last epoch's share of N, N − ((E−1)·S − 1) / T, is below
//     int(0.8 · ((S − 1) / T)).
//   document_index: the sequence ids 0..n−1 repeated E times and shuffled, or, with a separate
//     final epoch, the first E − 1 repeats shuffled and then the last one shuffled on its own;
//   sample_index: M + 1 (position in document_index, offset) pairs, sample i being the T + 1
//     tokens from entry i through entry i + 1's offset, inclusive (consecutive samples share one
//     token: the last target of one is the first input of the next), read across sequences;
//   shuffle_index: 0..M−1 shuffled, or, with a separate final epoch, 0..P−1 shuffled
//     (P = ((E−1)·S − 1) / T) followed by P..M−1 shuffled on its own.
// Global sample k of the run is sample_index's sample shuffle_index[k]. Shuffles are numpy's
// legacy RandomState.shuffle: Fisher–Yates from the last element down, each j drawn by
// random_interval (the smallest all-ones mask over i, MT19937 words rejected until <= i).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"

namespace mt::data {

// numpy.random.RandomState(seed)'s MT19937 stream and its legacy 1-D shuffle.
class NumpyLegacyRandom {
 public:
  // numpy's integer seeding (mt19937_seed): the same words as std::mt19937(seed).
  explicit NumpyLegacyRandom(uint32_t seed) : mt_(seed) {}
  // Uniform in [0, max]: numpy's random_interval.
  uint64_t interval(uint64_t max);
  // RandomState.shuffle of a 1-D array of n elements.
  template <typename T>
  void shuffle(T* v, size_t n) {
    for (size_t i = n; i > 1; --i) {
      const uint64_t j = interval(i - 1);
      std::swap(v[i - 1], v[j]);
    }
  }
  template <typename T>
  void shuffle(std::vector<T>& v) {
    shuffle(v.data(), v.size());
  }

 private:
  std::mt19937 mt_;
};

// One sample's tokens: pieces of sequences, in order, T + 1 tokens together.
struct MegatronPiece {
  uint64_t sequence;  // sequence id in the indexed dataset
  int64_t offset;     // first token within it
  int64_t length;     // tokens taken
};

class MegatronOrder {
 public:
  // The bytes the indices of num_samples samples over these sequences take (a run checks them
  // against the machine's memory before building them).
  static double index_bytes(uint64_t num_sequences, uint64_t tokens, int T, uint64_t num_samples);

  // Over sequences 0..n−1 of these lengths (a split's, renumbered from 0).
  // num_samples 0 is Megatron's None: one epoch.
  // REQUIRES: T >= 1, sequence_lengths' sum >= 2 (Megatron asserts > 1 tokens).
  MegatronOrder(std::vector<int32_t> sequence_lengths, int T, uint64_t num_samples, uint32_t seed);

  int num_epochs() const { return epochs_; }
  bool separate_final_epoch() const { return separate_final_epoch_; }
  // Samples built (M >= num_samples): global samples [0, size()) exist.
  uint64_t size() const { return size_; }
  // The sample global sample k reads (shuffle_index[k]). REQUIRES: k < size().
  uint64_t sample_of(uint64_t k) const { return shuffle32_.empty() ? shuffle64_[k] : shuffle32_[k]; }
  // Global sample k's pieces, T + 1 tokens in all. REQUIRES: k < size().
  std::vector<MegatronPiece> pieces(uint64_t k) const;

  const std::vector<int32_t>& document_index() const { return document_index_; }
  // (M + 1) pairs (position in document_index, offset), flattened: both fit 32 bits, as the
  // document index is refused past 2^31 entries and sequence lengths are int32.
  const std::vector<int32_t>& sample_index() const { return sample_index_; }

 private:
  void build(uint64_t num_samples, uint32_t seed);

  std::vector<int32_t> lengths_;
  int T_;
  int epochs_ = 1;
  bool separate_final_epoch_ = false;
  std::vector<int32_t> document_index_;
  std::vector<int32_t> sample_index_;
  // The shuffle index in 32 bits when M < 2^32 - 1, as Megatron keeps it (uint32), else in 64: the
  // indices of a billion-sample run are gigabytes a rank.
  std::vector<uint32_t> shuffle32_;
  std::vector<uint64_t> shuffle64_;
  uint64_t size_ = 0;
};

// numpy.sum of a float64 array as numpy adds it (pairwise: blocks of 8 partial sums below 128
// elements, halves above), and Megatron's normalize (each weight over that sum).
double numpy_sum(const std::vector<double>& values);
std::vector<double> megatron_normalize(const std::vector<double>& weights);

// Megatron's BlendedDataset index (helpers.cpp's build_blending_indices): global sample k comes
// from the dataset whose share is furthest behind its weight, w_d · max(k, 1) − taken_d (the first
// such on ties), as that dataset's next sample. Weights as given (normalised by the caller).
class MegatronBlend {
 public:
  MegatronBlend(const std::vector<double>& weights, uint64_t size);
  uint64_t size() const { return dataset_.size(); }
  int dataset(uint64_t k) const { return dataset_[k]; }
  uint64_t sample(uint64_t k) const { return sample_[k]; }

 private:
  std::vector<int16_t> dataset_;
  std::vector<uint64_t> sample_;
};

// The samples a weighted blend of `size` asks of a dataset of normalised weight w: Megatron's
// ceil(size · w) (the blend's share), and the mid-level dataset's build, that share times
// 1 + 0.005 rounded up (its mid_level_dataset_surplus).
uint64_t megatron_blend_share(double w, uint64_t size);
uint64_t megatron_blend_build(double w, uint64_t size);

// Megatron's --split ("969,30,1"): the numbers in the text (runs of digits and dots), padded with
// zeros to three (train, validation, test). Refused: more than three, one that is not a number, a
// sum of zero.
std::vector<double> megatron_split_parse(const std::string& text);

// Split `which` (0 train, 1 validation, 2 test) of n sequences, as Megatron's
// BlendedMegatronDatasetBuilder cuts one dataset: the weights divided by their sum, book-ends the
// running sums from 0, and split i the sequences [round(lo·n), round(hi·n)) with Python's round
// (half to even); none where hi <= lo.
struct SequenceRange {
  uint64_t first = 0, end = 0;
};
std::optional<SequenceRange> megatron_split_sequences(const std::vector<double>& weights, uint64_t n, int which);

}  // namespace mt::data
