// Training samples from an indexed dataset. All sequences concatenated (documents included, no
// separator added) form one token stream of S = total_tokens() tokens. A sample of length T is a
// window of T + 1 stream tokens: inputs are its first T, targets its last T (shifted by one).
//
// Without shuffle, global sample k is the window starting at stream position (k·T) mod S; the
// stream repeats from its start when it ends, so a window may wrap around.
// With shuffle, an epoch is n = max(1, (S − 1) / T) samples; global sample k lies in epoch
// e = k / n and is the window starting at perm_e[k mod n] · T, where
// perm_e = sample_permutation(n, seed, e). Each window then lies inside the stream (only a stream
// shorter than T + 1 wraps).
// In Megatron's order (set_megatron_order), global sample k is Megatron-LM's GPTDataset sample k
// for the same sequences, T, number of samples and seed (megatron_order.h): T + 1 tokens read from
// pieces of sequences in a shuffled document order.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "data/indexed_dataset.h"
#include "data/megatron_order.h"

namespace mt::data {

// SplitMix64 (Steele, Lea, Flood 2014; the generator of Vigna's xoshiro seeding): advances *state
// by 0x9E3779B97F4A7C15 and returns the mixed value. Portable: the same numbers on every platform.
uint64_t splitmix64_next(uint64_t* state);

// A permutation of [0, n), deterministic in (n, seed, epoch) on every platform:
//   state = mix(mix(seed) + epoch), mix being the SplitMix64 output function;
//   perm = identity; for i = n−1 down to 1: j = uniform(i + 1); swap(perm[i], perm[j])
// (Fisher–Yates), uniform(m) drawing r = splitmix64_next(&state) until r >= 2^64 mod m (rejection,
// no modulo bias) and returning r mod m.
std::vector<uint64_t> sample_permutation(uint64_t n, uint64_t seed, uint64_t epoch);

// NOTE: not thread-safe; sample() caches the permutation of the epoch last used. It reads the
// dataset through its mapping and keeps a reference to it: the dataset must outlive the stream.
class TokenStream {
 public:
  // The stream is sequences [first_sequence, end_sequence) of the dataset (a Megatron split: see
  // megatron_split_sequences), by default all of them; positions below count from the first one's
  // first token, except token_position's, which are the dataset's.
  // REQUIRES: T >= 1, the range holds >= 1 token.
  TokenStream(const IndexedDataset& dataset, int T, bool shuffle, uint64_t seed, uint64_t first_sequence = 0,
              uint64_t end_sequence = UINT64_MAX);

  int seq_length() const { return T_; }
  uint64_t num_tokens() const { return S_; }
  uint64_t num_samples_per_epoch() const { return samples_per_epoch_; }

  // Optional loss mask: a dataset aligned with the whole dataset token for token (the same total length),
  // holding 1 where the token is trained and 0 where it is not (SFT prompts). A target whose mask
  // is 0 becomes -100 (ignored by the loss). nullptr removes it. The mask must outlive the stream.
  void set_loss_mask(const IndexedDataset* mask);

  // Megatron-LM's GPTDataset order for a run that draws num_samples samples, seeded with the
  // stream's seed (which must fit in 32 bits, as numpy's RandomState requires). Global samples past
  // those Megatron builds are refused.
  void set_megatron_order(uint64_t num_samples);
  const MegatronOrder* megatron_order() const { return megatron_.get(); }

  // Stream position of the first token of global sample k (meshtrain's orders only).
  uint64_t window_start(uint64_t k);
  // The dataset's stream position of token j (0 <= j <= T) of global sample k's T + 1 tokens:
  // input j for j < T, target j − 1 for j >= 1.
  uint64_t token_position(uint64_t k, uint64_t j);
  // inputs (T), targets (T) of global sample k.
  void sample(uint64_t k, int32_t* inputs, int32_t* targets);
  // inputs (B, T), targets (B, T): samples [first, first + B), row b = sample first + b.
  void batch(uint64_t first, int B, int32_t* inputs, int32_t* targets);

 private:
  // out[0, count) = stream tokens from position, wrapping around the end of the stream.
  void check_mask_value(int32_t v, uint64_t sample) const;
  void read_wrapped(const IndexedDataset& ds, uint64_t position, uint64_t count, int32_t* out) const;
  // out[0, T] = global sample k's T + 1 tokens of ds, in Megatron's order.
  void read_pieces(const IndexedDataset& ds, uint64_t k, int32_t* out) const;

  const IndexedDataset& dataset_;
  const IndexedDataset* mask_ = nullptr;
  std::vector<int32_t> mask_buf_;
  int T_;
  bool shuffle_;
  uint64_t seed_;
  uint64_t first_ = 0, end_ = 0;  // the sequences streamed
  uint64_t base_ = 0;             // the dataset's stream position of sequence first_
  uint64_t S_ = 0;                // tokens in them
  uint64_t samples_per_epoch_;
  bool have_perm_ = false;
  uint64_t perm_epoch_ = 0;
  std::vector<uint64_t> perm_;  // (samples_per_epoch_) sample_permutation of perm_epoch_
  std::unique_ptr<MegatronOrder> megatron_;
  std::vector<int32_t> buf_;  // (T + 1) a Megatron-order sample
};

}  // namespace mt::data
