#include "nn/param_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"

namespace mt::nn {

ParamStore::ParamStore(Module& root, DType compute_dtype, bool allocate) : compute_dtype_(compute_dtype) {
  root.collect_parameters(params_);
  for (Parameter* p : params_) {
    p->offset = numel_;
    numel_ += static_cast<size_t>(p->numel());
    p->global_offset = global_numel_;
    global_numel_ += static_cast<size_t>(p->global_numel());
  }
  bool lowp = compute_dtype != DType::kF32;
  if (!allocate) {
    for (Parameter* p : params_) {
      p->master = nullptr;
      p->grad = nullptr;
      p->compute = nullptr;
      p->compute_dtype = (lowp && p->is_matrix) ? compute_dtype : DType::kF32;
    }
    released_ = true;
    return;
  }
  master_ = Buffer(numel_ * 4, lowp ? MemCategory::kOptimizer : MemCategory::kParams);
  grad_ = Buffer(numel_ * 4, MemCategory::kGrads);
  if (lowp) compute_ = Buffer(numel_ * dtype_size(compute_dtype), MemCategory::kParams);
  for (Parameter* p : params_) {
    p->master = master() + p->offset;
    p->grad = grad() + p->offset;
    p->compute_dtype = (lowp && p->is_matrix) ? compute_dtype : DType::kF32;
    p->compute = (lowp && p->is_matrix)
                     ? static_cast<void*>(compute_.as<char>() + p->offset * dtype_size(compute_dtype))
                     : static_cast<void*>(p->master);
  }
}

void ParamStore::set_global_layout(const std::function<size_t(const std::string&)>& offset_of, size_t total) {
  for (Parameter* p : params_) {
    p->global_offset = offset_of(p->name);
    MT_CHECK(p->global_offset + static_cast<size_t>(p->global_numel()) <= total, ErrorKind::kInternal,
             p->name + ": outside the one-process layout");
  }
  global_numel_ = total;
}

Parameter* ParamStore::find(const std::string& name) const {
  for (Parameter* p : params_)
    if (p->name == name) return p;
  return nullptr;
}

namespace {
// SplitMix64: a counter-based generator, so element i's value does not depend on thread order.
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Standard normal by Box-Muller from two counter-derived uniforms.
float normal_at(uint64_t seed, uint64_t i) {
  uint64_t a = splitmix64(seed ^ (2 * i)), b = splitmix64(seed ^ (2 * i + 1));
  double u1 = (static_cast<double>(a >> 11) + 1.0) / 9007199254740993.0;
  double u2 = static_cast<double>(b >> 11) / 9007199254740992.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}
}  // namespace

void ParamStore::init(uint64_t seed) {
  MT_CHECK(!released_, ErrorKind::kInternal, "ParamStore::init: the store holds no buffers");
  init_values(seed, 0, numel_, master());
  sync_compute();
}

void ParamStore::init_values(uint64_t seed, size_t begin, size_t end, float* dst) const {
  for (Parameter* p : params_) {
    const int64_t n = p->numel();
    const int64_t a = std::max<int64_t>(0, static_cast<int64_t>(begin) - static_cast<int64_t>(p->offset));
    const int64_t b = std::min<int64_t>(n, static_cast<int64_t>(end) - static_cast<int64_t>(p->offset));
    if (a >= b) continue;
    float* w = dst + (static_cast<int64_t>(p->offset) - static_cast<int64_t>(begin));  // element 0 of p
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the name
    for (char c : p->name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
    uint64_t pseed = splitmix64(seed ^ h);
    std::memset(w + a, 0, static_cast<size_t>(b - a) * sizeof(float));  // padding stays 0
    if (p->init == Init::kZeros) continue;
    tp_for_each_run(p->global_shape, p->split, p->place, [&](int64_t lo, int64_t go, int64_t len) {
      const int64_t lo2 = std::max(lo, a), hi2 = std::min(lo + len, b);  // the run within [a, b)
      if (lo2 >= hi2) return;
      if (p->init == Init::kOnes) {
        for (int64_t i = lo2; i < hi2; ++i) w[i] = 1.0f;
        return;
      }
#pragma omp parallel for schedule(static)
      for (int64_t i = lo2; i < hi2; ++i) w[i] = p->init_std * normal_at(pseed, static_cast<uint64_t>(go + (i - lo)));
      if (p->zero_row >= 0) {  // nn.Embedding's padding_idx: its row is filled with 0
        const int64_t cols = p->global_shape.size() > 1 ? p->global_shape[1] : 1;
        for (int64_t i = lo2; i < hi2; ++i)
          if ((go + (i - lo)) / cols == p->zero_row) w[i] = 0.0f;
      }
    });
  }
}

void ParamStore::zero_grad() {
  if (!released_) std::memset(grad_.data(), 0, numel_ * 4);
}

void ParamStore::release_buffers() {
  master_ = Buffer();
  grad_ = Buffer();
  compute_ = Buffer();
  released_ = true;
}

void ParamStore::sync_compute() {
  if (released_ || !compute_.bytes()) return;
  convert(compute_.data(), compute_dtype_, master_.data(), DType::kF32, numel_);
}

}  // namespace mt::nn
