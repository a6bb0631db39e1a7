// KvCache: the keys (after RoPE) and values of every layer for one sequence (batch 1), and causal
// attention of new query rows over them. The cache is accounted as activations, the score rows as
// workspace.
//
// Layout, per layer l:  k (capacity, NKV * HS),  v (capacity, NKV * HS)  f32; row t holds position
// t. Attending from one query costs O(position): decoding never re-runs the prompt.
#pragma once

#include "tensor/allocator.h"

namespace mt::serve {

class KvCache {
 public:
  KvCache() = default;
  // REQUIRES: every argument positive, NH % NKV == 0.
  KvCache(int L, int capacity, int NH, int NKV, int HS);

  int capacity() const { return capacity_; }
  size_t bytes() const { return cache_.bytes() + scores_.bytes(); }

  // Copies the k and v heads of n packed rows qkv (n, (NH + 2 NKV) HS) into layer l's rows
  // [pos, pos + n). REQUIRES: 0 <= pos, pos + n <= capacity.
  void store(int l, int pos, int n, const float* qkv);

  // out (n, NH * HS) = softmax(q k^T / sqrt(HS)) v for the query heads of the n packed rows qkv,
  // row i at position pos + i attending over layer l's cache rows [0, pos + i]. Query head h uses
  // kv head h / (NH / NKV) (Hugging Face's repeat_kv). REQUIRES: store(l, pos, n, qkv) was called.
  void attend(float* out, int l, int pos, int n, const float* qkv);

 private:
  float* k(int l) const { return cache_.as<float>() + 2 * static_cast<size_t>(l) * layer_floats_; }
  float* v(int l) const { return k(l) + layer_floats_; }

  int L_ = 0, capacity_ = 0, NH_ = 0, NKV_ = 0, HS_ = 0;
  int score_rows_ = 0;       // threads that can attend at once (one score row each)
  size_t layer_floats_ = 0;  // capacity * NKV * HS
  Buffer cache_;             // (L, 2, capacity, NKV * HS)
  Buffer scores_;            // (score_rows, capacity)
};

}  // namespace mt::serve
