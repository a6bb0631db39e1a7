#include "serve/kv_cache.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"

namespace mt::serve {

KvCache::KvCache(int L, int capacity, int NH, int NKV, int HS, int slots)
    : L_(L), capacity_(capacity), NH_(NH), NKV_(NKV), HS_(HS), slots_(slots) {
  MT_INTERNAL_CHECK(L > 0 && capacity > 0 && NH > 0 && NKV > 0 && HS > 0 && NH % NKV == 0 && slots > 0);
  layer_floats_ = static_cast<size_t>(capacity) * NKV * HS;
  cache_ = Buffer(2 * static_cast<size_t>(slots) * L * layer_floats_ * sizeof(float), MemCategory::kActivations);
  score_rows_ = std::max(1, omp_get_max_threads());
  scores_ = Buffer(static_cast<size_t>(score_rows_) * capacity * sizeof(float), MemCategory::kWorkspace);
}

void KvCache::store(int s, int l, int pos, int n, const float* qkv) {
  MT_INTERNAL_CHECK(s >= 0 && s < slots_ && l >= 0 && l < L_ && pos >= 0 && n >= 0 && pos + n <= capacity_);
  const size_t KV = static_cast<size_t>(NKV_) * HS_, Q = static_cast<size_t>(NH_) * HS_;
  const size_t QKV = Q + 2 * KV;
  for (int i = 0; i < n; ++i) {
    const float* row = qkv + i * QKV;
    std::memcpy(k(s, l) + (pos + i) * KV, row + Q, KV * sizeof(float));
    std::memcpy(v(s, l) + (pos + i) * KV, row + Q + KV, KV * sizeof(float));
  }
}

void KvCache::attend(float* out, int s, int l, int pos, int n, const float* qkv) {
  MT_INTERNAL_CHECK(s >= 0 && s < slots_ && pos >= 0 && n >= 0 && pos + n <= capacity_);
  row_slot_.assign(n, s);
  row_pos_.resize(n);
  for (int i = 0; i < n; ++i) row_pos_[i] = pos + i;
  attend_rows(out, l, n, qkv, row_slot_.data(), row_pos_.data());
}

void KvCache::attend_rows(float* out, int l, int n, const float* qkv, const int* slot, const int* pos) {
  MT_INTERNAL_CHECK(l >= 0 && l < L_ && n >= 0);
  for (int i = 0; i < n; ++i)
    MT_INTERNAL_CHECK(slot[i] >= 0 && slot[i] < slots_ && pos[i] >= 0 && pos[i] < capacity_);
  const int HS = HS_, group = NH_ / NKV_;
  const size_t KV = static_cast<size_t>(NKV_) * HS, A = static_cast<size_t>(NH_) * HS;
  const size_t QKV = A + 2 * KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int tasks = NH_ * n;
  const int threads = std::max(1, std::min({score_rows_, omp_get_max_threads(), tasks}));
#pragma omp parallel num_threads(threads)
  {
    float* s = scores_.as<float>() + static_cast<size_t>(omp_get_thread_num()) * capacity_;
#pragma omp for schedule(static)
    for (int task = 0; task < tasks; ++task) {
      const int i = task / NH_, h = task % NH_;
      const int keys = pos[i] + 1;
      const float* kc = k(slot[i], l);
      const float* vc = v(slot[i], l);
      const float* q = qkv + i * QKV + static_cast<size_t>(h) * HS;
      const size_t kv_off = static_cast<size_t>(h / group) * HS;
      float m = -INFINITY;
      for (int j = 0; j < keys; ++j) {
        const float* kj = kc + j * KV + kv_off;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int c = 0; c < HS; ++c) dot += q[c] * kj[c];
        s[j] = dot * scale;
        m = std::max(m, s[j]);
      }
      float sum = 0.0f;
      for (int j = 0; j < keys; ++j) {
        s[j] = std::exp(s[j] - m);
        sum += s[j];
      }
      float* o = out + i * A + static_cast<size_t>(h) * HS;
      std::fill(o, o + HS, 0.0f);
      for (int j = 0; j < keys; ++j) {
        const float* vj = vc + j * KV + kv_off;
        for (int c = 0; c < HS; ++c) o[c] += s[j] * vj[c];
      }
      const float inv = 1.0f / sum;
      for (int c = 0; c < HS; ++c) o[c] *= inv;
    }
  }
}

}  // namespace mt::serve
