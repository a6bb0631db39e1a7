// Dropout by a counter-based mask: whether an element is kept is a hash of where it is — the run's
// seed, the step, the layer and site, the sample's place in the global batch, its position and
// its feature (or, in attention, its head, query and key) — never of a generator's state. So every
// layout (data, tensor, sequence or pipeline parallel, micro-batches, recompute) and a resumed run
// draw exactly the one-process run's mask, and the backward makes it again instead of keeping it
// (DESIGN-NOTES 78). tools/torch_models.py reimplements it for the PyTorch oracle.
//
// The hash is splitmix64's finalizer (mix64). With G = 0x9e3779b97f4a7c15:
//   step key   mix64(mix64(seed) ^ step)
//   site key   mix64(step_key ^ ((layer << 8 | site) + 1) * G)       sites: kDropEmbedding (layer 0),
//                                                                    kDropAttnOut, kDropMlpOut,
//                                                                    kDropAttnProbs (per block)
//   head key   mix64(site_key ^ (head + 1) * G)                      attention's probabilities only
//   row key    mix64(key ^ mix64(((sample << 32) | t) + G))          t: the (query) position
//   bits       mix64(row_key + (col + 1) * G)                        col: the feature, or the key position
// An element is kept when bits >> 32 >= threshold, threshold = floor(p · 2^32), and a kept one is
// multiplied by scale = 1 / (1 - p) (float), as torch.nn.functional.dropout does in training.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mt::kernels {

inline constexpr uint64_t kDropGolden = 0x9e3779b97f4a7c15ull;
enum DropSite : uint32_t { kDropEmbedding = 0, kDropAttnOut = 1, kDropMlpOut = 2, kDropAttnProbs = 3 };

inline uint64_t drop_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline uint64_t drop_step_key(uint64_t seed, uint64_t step) { return drop_mix(drop_mix(seed) ^ step); }
inline uint64_t drop_site_key(uint64_t step_key, uint32_t layer, uint32_t site) {
  return drop_mix(step_key ^ ((static_cast<uint64_t>(layer) << 8 | site) + 1) * kDropGolden);
}
inline uint64_t drop_head_key(uint64_t site_key, uint32_t head) {
  return drop_mix(site_key ^ (static_cast<uint64_t>(head) + 1) * kDropGolden);
}
inline uint64_t drop_row_key(uint64_t key, uint64_t sample, uint64_t t) {
  return drop_mix(key ^ drop_mix(((sample << 32) | t) + kDropGolden));
}
inline bool drop_keep(uint64_t row_key, uint64_t col, uint32_t threshold) {
  return static_cast<uint32_t>(drop_mix(row_key + (col + 1) * kDropGolden) >> 32) >= threshold;
}

// p in [0, 1): the threshold and the kept elements' scale.
struct DropRate {
  uint32_t threshold = 0;
  float scale = 1.0f;
  float p = 0.0f;
  DropRate() = default;
  explicit DropRate(float prob);
  bool active() const { return p > 0.0f; }
};

// Rows of a (rows, C) tensor in place: row r is position t = t0 + (row0 + r) % T of sample
// sample0 + (row0 + r) / T; dropped elements become 0, kept ones are scaled. The same call on the
// gradient is dropout's backward. t0: where T tokens of each sample begin in it (Ulysses' share).
void dropout_rows(float* x, size_t rows, int C, uint64_t key, const DropRate& rate, uint64_t sample0, size_t row0, int T,
                  size_t t0 = 0);

// A tile of attention probabilities (or their gradient) in place: element (i, j) is query
// q0 + i and key j0 + j of one head (head_key: drop_head_key) of sample `sample`; at x[i·ld + j],
// or x[j·ld + i] when `keys_major` (the forward's transposed tile).
void dropout_tile(float* x, int ld, bool keys_major, int queries, int keys, uint64_t head_key, const DropRate& rate,
                  uint64_t sample, int q0, int j0);

}  // namespace mt::kernels
