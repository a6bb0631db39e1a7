// Shared by the attention tests (attention_test, sparse_attention_test): shapes, random inputs, an
// ISA override for a scope, errors, and the naive double-precision forward under any mask.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "base/cpu_features.h"

namespace mt::kernels {

struct Shape {
  int B, T, NH, NKV, HS;
  int c3() const { return (NH + 2 * NKV) * HS; }
  size_t qkv_size() const { return static_cast<size_t>(B) * T * c3(); }
  size_t out_size() const { return static_cast<size_t>(B) * T * NH * HS; }
  size_t lse_size() const { return static_cast<size_t>(B) * NH * T; }
};

inline std::string shape_name(const Shape& s) {
  return "B" + std::to_string(s.B) + "_T" + std::to_string(s.T) + "_NH" + std::to_string(s.NH) +
         "_NKV" + std::to_string(s.NKV) + "_HS" + std::to_string(s.HS);
}

// Forces an ISA for the scope, restores the previous one after.
class IsaScope {
 public:
  explicit IsaScope(Isa isa) : saved_(isa_active()) { isa_force(isa); }
  ~IsaScope() { isa_force(saved_); }

 private:
  Isa saved_;
};

// Portable, plus AVX-512 where the CPU has it.
inline std::vector<Isa> attention_test_isas() {
  std::vector<Isa> out = {Isa::kPortable};
  if (isa_detected() == Isa::kAvx512) out.push_back(Isa::kAvx512);
  return out;
}

inline std::vector<float> random_vector(size_t n, unsigned seed, float amplitude = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-amplitude, amplitude);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

// max |a - b| / max |b|  (norm-wise relative error)
template <typename A>
double rel_error(const std::vector<A>& a, const std::vector<double>& b) {
  double num = 0.0, den = 1e-30;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / den;
}

inline bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

// d loss / d x_i by central differences, for every i; loss() reads x, which is left as it was.
inline std::vector<double> central_differences(std::vector<double>& x,
                                               const std::function<double()>& loss,
                                               double eps = 1e-5) {
  std::vector<double> fd(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double up = loss();
    x[i] = x0 - eps;
    const double down = loss();
    x[i] = x0;
    fd[i] = (up - down) / (2 * eps);
  }
  return fd;
}

// visible(h, i, j): query i of head h sees key j.
using AttentionMask = std::function<bool(int h, int i, int j)>;

inline bool causal_mask(int, int i, int j) {
  return j <= i;
}

// Naive attention in double. out: (B, T, NH*HS), lse: (B, NH, T). A query that sees no key gets
// out = 0 and lse = -inf.
inline void reference_forward(std::vector<double>& out, std::vector<double>& lse,
                              const std::vector<double>& qkv, const Shape& s,
                              const AttentionMask& visible = causal_mask) {
  const int C3 = s.c3(), group = s.NH / s.NKV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.HS));
  out.assign(s.out_size(), 0.0);
  lse.assign(s.lse_size(), 0.0);
  std::vector<double> p(s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h) {
      const int kvh = h / group;
      auto row = [&](int t, int head) {
        return &qkv[(static_cast<size_t>(b) * s.T + t) * C3 + head * s.HS];
      };
      for (int i = 0; i < s.T; ++i) {
        double mx = -INFINITY;
        for (int j = 0; j < s.T; ++j) {
          if (!visible(h, i, j)) continue;
          double dot = 0.0;
          for (int d = 0; d < s.HS; ++d) dot += row(i, h)[d] * row(j, s.NH + kvh)[d];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int j = 0; j < s.T; ++j)
          if (visible(h, i, j)) sum += std::exp(p[j] - mx);
        double* o = &out[(static_cast<size_t>(b) * s.T + i) * s.NH * s.HS + h * s.HS];
        for (int j = 0; j < s.T; ++j) {
          if (!visible(h, i, j)) continue;
          const double w = std::exp(p[j] - mx) / sum;
          for (int d = 0; d < s.HS; ++d) o[d] += w * row(j, s.NH + s.NKV + kvh)[d];
        }
        const size_t at = (static_cast<size_t>(b) * s.NH + h) * s.T + i;
        lse[at] = sum > 0 ? mx + std::log(sum) : -INFINITY;
      }
    }
}

}  // namespace mt::kernels
