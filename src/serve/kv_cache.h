// KvCache: the keys (after RoPE) and values of every layer for `slots` independent sequences, and
// causal attention of new query rows over them. The cache is accounted as activations, the score
// rows as workspace.
//
// Layout, per slot s and layer l:  k (capacity, NKV * HS),  v (capacity, NKV * HS)  f32; row t
// holds position t. Attending from one query costs O(position): decoding never re-runs the prompt.
// Slots let one batch of query rows come from different sequences at different positions (the
// continuous batching of serve/scheduler.h): row i attends over its own slot's rows [0, pos[i]].
#pragma once

#include <vector>

#include "tensor/allocator.h"

namespace mt::serve {

class KvCache {
 public:
  KvCache() = default;
  // REQUIRES: every argument positive, NH % NKV == 0.
  KvCache(int L, int capacity, int NH, int NKV, int HS, int slots = 1);

  int capacity() const { return capacity_; }
  int slots() const { return slots_; }
  size_t bytes() const { return cache_.bytes() + scores_.bytes(); }

  // Copies the k and v heads of n packed rows qkv (n, (NH + 2 NKV) HS) into slot s, layer l, rows
  // [pos, pos + n). REQUIRES: 0 <= s < slots, 0 <= pos, pos + n <= capacity.
  void store(int s, int l, int pos, int n, const float* qkv);

  // out (n, NH * HS) = softmax(q k^T / sqrt(HS)) v for the query heads of the n packed rows qkv,
  // row i at position pos + i of slot s attending over that slot's layer-l rows [0, pos + i].
  // Query head h uses kv head h / (NH / NKV) (Hugging Face's repeat_kv). REQUIRES: store(s, l,
  // pos, n, qkv) was called.
  void attend(float* out, int s, int l, int pos, int n, const float* qkv);

  // As attend, for n rows from any slots: row i is position pos[i] of slot slot[i] (stored) and
  // attends over that slot's rows [0, pos[i]]. One parallel region for all rows and heads.
  void attend_rows(float* out, int l, int n, const float* qkv, const int* slot, const int* pos);

 private:
  float* k(int s, int l) const {
    return cache_.as<float>() + (static_cast<size_t>(s) * L_ + l) * 2 * layer_floats_;
  }
  float* v(int s, int l) const { return k(s, l) + layer_floats_; }

  int L_ = 0, capacity_ = 0, NH_ = 0, NKV_ = 0, HS_ = 0, slots_ = 0;
  int score_rows_ = 0;       // threads that can attend at once (one score row each)
  size_t layer_floats_ = 0;  // capacity * NKV * HS
  Buffer cache_;             // (slots, L, 2, capacity, NKV * HS)
  Buffer scores_;            // (score_rows, capacity)
  std::vector<int> row_slot_, row_pos_;  // attend()'s rows, as attend_rows takes them
};

}  // namespace mt::serve
