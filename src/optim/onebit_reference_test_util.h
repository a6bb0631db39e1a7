// Test oracle for 1-bit Adam, 0/1 Adam and 1-bit LAMB: DeepSpeed's step() of OnebitAdam
// (deepspeed/runtime/fp16/onebit/adam.py), ZeroOneAdam (.../onebit/zoadam.py) and OnebitLamb
// (.../onebit/lamb.py) written again in
// double, in DeepSpeed's own step numbers (its first call only allocates) and its own form of the
// update (weight decay inside the update, every rank's state side by side). `avg` stands for the
// compressed all-reduce: every rank's buffer in, the average out on every rank (the identity on
// one rank; the formula of comm/onebit.h on more, written by the caller). A variance step or the
// warm-up takes the exact mean of the ranks' gradients (the full-precision all-reduce).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "optim/optimizer.h"

namespace mt::optim::testing {

using Vec = std::vector<double>;
using Avg = std::function<void(std::vector<Vec>& per_rank)>;

struct RefSegment {
  size_t offset, numel;
  double wd;
};

// The tests' model: three tensors, a weight (decayed), a zero-initialised bias (not decayed), a
// second weight; 72 elements.
constexpr size_t kModelNumel = 72;
inline std::vector<ParamSegment> model_segments() { return {{0, 40, 0.01f, "w1"}, {40, 8, 0.0f, "b1"}, {48, 24, 0.01f, "w2"}}; }
inline std::vector<RefSegment> model_ref_segments() { return {{0, 40, 0.01}, {40, 8, 0.0}, {48, 24, 0.01}}; }

inline std::vector<float> randn(size_t n, uint32_t seed, float sigma) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

inline std::vector<float> model_initial_params() {
  std::vector<float> p = randn(kModelNumel, 7, 0.5f);
  for (size_t i = 40; i < 48; ++i) p[i] = 0.0f;
  return p;
}

// A learning rate that changes every step (0/1 Adam sums them).
inline double lr_at(int t) { return 0.01 * (1.0 + 0.1 * t); }

inline Vec mean_over_ranks(const std::vector<Vec>& x) {
  Vec out(x[0].size(), 0.0);
  for (const Vec& r : x)
    for (size_t i = 0; i < out.size(); ++i) out[i] += r[i] / static_cast<double>(x.size());
  return out;
}

struct ZeroOneRef {
  // config
  double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  int64_t var_freeze_step = 6, var_update_scaler = 2, local_step_scaler = 1, local_step_clipper = 2;
  std::vector<RefSegment> segs;
  // state, per rank
  std::vector<Vec> p, m, v, cb;
  double lrs = 0.0;
  int64_t s = 1;  // DeepSpeed's state step after its allocating first call
  int64_t var_interval = 1, var_counter = 0, local_interval = 1, local_counter = 0;
  bool freeze = false;
  char last_kind = ' ';  // V variance, C compressed gradient, L local, S sync

  // One DeepSpeed step: g[r] is rank r's own gradient.
  void step(const std::vector<Vec>& g, double lr, const Avg& avg) {
    ++s;
    const size_t n = p.size(), N = p[0].size();
    if (!freeze) {
      if (s % var_interval == 0) {
        const Vec gm = mean_over_ranks(g);
        for (size_t r = 0; r < n; ++r)
          for (size_t i = 0; i < N; ++i) {
            v[r][i] = b2 * v[r][i] + (1 - b2) * gm[i] * gm[i];
            m[r][i] = b1 * m[r][i] + (1 - b1) * gm[i];
          }
        last_kind = 'V';
      } else {
        std::vector<Vec> c = g;
        avg(c);
        for (size_t r = 0; r < n; ++r)
          for (size_t i = 0; i < N; ++i) m[r][i] = b1 * m[r][i] + (1 - b1) * c[r][i];
        last_kind = 'C';
      }
    } else {
      for (size_t r = 0; r < n; ++r)
        for (size_t i = 0; i < N; ++i) m[r][i] = b1 * m[r][i] + (1 - b1) * g[r][i];
      lrs += lr;
      last_kind = 'L';
    }
    for (size_t r = 0; r < n; ++r)
      for (const RefSegment& sg : segs)
        for (size_t i = sg.offset; i < sg.offset + sg.numel; ++i) {
          double u = m[r][i] / (std::sqrt(v[r][i]) + eps);
          if (sg.wd > 0) u += sg.wd * p[r][i];
          p[r][i] += -lr * u;
          if (freeze) cb[r][i] += -lr * u;
        }
    if (freeze && s % local_interval == 0) {
      for (size_t r = 0; r < n; ++r)
        for (size_t i = 0; i < N; ++i) {
          p[r][i] -= cb[r][i];
          cb[r][i] *= std::sqrt(v[r][i]) + eps;
        }
      avg(cb);
      for (size_t r = 0; r < n; ++r)
        for (size_t i = 0; i < N; ++i) {
          m[r][i] = -cb[r][i] / lrs;
          p[r][i] += cb[r][i] / (std::sqrt(v[r][i]) + eps);
          cb[r][i] = 0.0;
        }
      lrs = 0.0;
      last_kind = 'S';
    }
    if (!freeze) {
      if (s % var_interval == 0 && ++var_counter == var_update_scaler) {
        var_counter = 0;
        var_interval *= 2;
      }
    } else if (++local_counter == local_step_scaler) {
      local_counter = 0;
      local_interval = std::min(local_step_clipper, local_interval * 2);
    }
    if (s > var_freeze_step) freeze = true;
  }
};

// DeepSpeed's OnebitAdam (onebit/adam.py) with bias_correction false, its own arithmetic: calls
// s = 1 (allocates only), then Adam on the mean gradient while not frozen, freezing once s >=
// freeze_step (checked after the update); frozen, each rank's momentum is updated with its own
// gradient and averaged by `avg`. The update is m / (sqrt(v) + eps) + wd p, times lr.
struct OneBitAdamRef {
  double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  int64_t freeze_step = 3;
  std::vector<RefSegment> segs;
  std::vector<Vec> p, m, v;
  int64_t s = 1;
  bool freeze = false;
  int warmup_updates = 0;

  void step(const std::vector<Vec>& g, double lr, const Avg& avg) {
    ++s;
    const size_t n = p.size(), N = p[0].size();
    if (!freeze) {
      const Vec gm = mean_over_ranks(g);
      for (size_t r = 0; r < n; ++r)
        for (size_t i = 0; i < N; ++i) {
          m[r][i] = b1 * m[r][i] + (1 - b1) * gm[i];
          v[r][i] = b2 * v[r][i] + (1 - b2) * gm[i] * gm[i];
        }
      ++warmup_updates;
    } else {
      for (size_t r = 0; r < n; ++r)
        for (size_t i = 0; i < N; ++i) m[r][i] = b1 * m[r][i] + (1 - b1) * g[r][i];
      avg(m);
    }
    for (size_t r = 0; r < n; ++r)
      for (const RefSegment& sg : segs)
        for (size_t i = sg.offset; i < sg.offset + sg.numel; ++i)
          p[r][i] -= lr * (m[r][i] / (std::sqrt(v[r][i]) + eps) + sg.wd * p[r][i]);
    if (!freeze && s >= freeze_step) freeze = true;
  }
};

struct OneBitLambRef {
  double b1 = 0.9, b2 = 0.999, eps = 1e-8, max_coeff = 10.0, min_coeff = 0.01;
  int64_t freeze_step = 4;
  double coeff_beta = 0.9, factor_max = 4.0, factor_min = 0.5, factor_threshold = 0.1;
  std::vector<RefSegment> segs;
  std::vector<Vec> p, m, v, vf;
  Vec coeff_freeze, last_factor, scaling;  // per segment
  Vec coeffs;                              // per segment, the last step's
  bool has_scaling = false;
  int64_t s = 1;
  bool freeze = false;

  static double norm(const Vec& x, size_t b, size_t e) {
    double q = 0;
    for (size_t i = b; i < e; ++i) q += x[i] * x[i];
    return std::sqrt(q);
  }

  void step(const std::vector<Vec>& g, double lr, const Avg& avg) {
    ++s;
    const size_t n = p.size(), N = p[0].size(), K = segs.size();
    coeff_freeze.resize(K, 0.0);
    last_factor.resize(K, 1.0);
    coeffs.assign(K, 1.0);
    if (!freeze) {
      const Vec gm = mean_over_ranks(g);
      for (size_t r = 0; r < n; ++r) {
        for (size_t i = 0; i < N; ++i) {
          m[r][i] = b1 * m[r][i] + (1 - b1) * gm[i];
          v[r][i] = b2 * v[r][i] + (1 - b2) * gm[i] * gm[i];
        }
        if (s == freeze_step) vf[r] = v[r];
        for (size_t k = 0; k < K; ++k) {
          const RefSegment& sg = segs[k];
          Vec u(N, 0.0);
          for (size_t i = sg.offset; i < sg.offset + sg.numel; ++i)
            u[i] = m[r][i] / (std::sqrt(v[r][i]) + eps) + sg.wd * p[r][i];
          const double wn = norm(p[r], sg.offset, sg.offset + sg.numel), un = norm(u, sg.offset, sg.offset + sg.numel);
          double c = 1.0;
          if (wn != 0 && un != 0) c = std::max(std::min(wn / un, max_coeff), min_coeff);
          if (r == 0) {
            if (c != 1.0) coeff_freeze[k] = coeff_beta * coeff_freeze[k] + (1 - coeff_beta) * c;
            coeffs[k] = c;
          }
          for (size_t i = sg.offset; i < sg.offset + sg.numel; ++i) p[r][i] -= lr * c * u[i];
        }
      }
    } else {
      if (!has_scaling) {
        Vec ms(K);
        double sum = 0;
        for (size_t k = 0; k < K; ++k) {
          ms[k] = norm(m[0], segs[k].offset, segs[k].offset + segs[k].numel) / std::sqrt(static_cast<double>(segs[k].numel));
          sum += ms[k];
        }
        scaling.resize(K);
        for (size_t k = 0; k < K; ++k) scaling[k] = sum / static_cast<double>(K) / ms[k];
        has_scaling = true;
      }
      const std::vector<Vec> last = m;
      for (size_t r = 0; r < n; ++r)
        for (size_t k = 0; k < K; ++k)
          for (size_t i = segs[k].offset; i < segs[k].offset + segs[k].numel; ++i)
            m[r][i] = (b1 * m[r][i] + (1 - b1) * g[r][i]) * scaling[k];
      avg(m);
      for (size_t r = 0; r < n; ++r)
        for (size_t k = 0; k < K; ++k) {
          const RefSegment& sg = segs[k];
          const size_t b = sg.offset, e = sg.offset + sg.numel;
          Vec pre(N, 0.0), u(N, 0.0);
          double fmax = -1e300;
          for (size_t i = b; i < e; ++i) {
            m[r][i] /= scaling[k];
            const double gr = (m[r][i] - last[r][i] * b1) / (1 - b1);
            vf[r][i] = b2 * vf[r][i] + (1 - b2) * gr * gr;
            const double d = std::sqrt(v[r][i]) + eps;
            pre[i] = m[r][i] / d;
            u[i] = sg.wd > 0 ? pre[i] + sg.wd * p[r][i] : pre[i];
            fmax = std::max(fmax, d / (std::sqrt(vf[r][i]) + eps));
          }
          double f = fmax;
          if (sg.wd > 0) {
            const double q = std::min(1.0, norm(pre, b, e) / norm(u, b, e));
            f = f * q + (1 - q);
          }
          f = std::min(f, factor_max);
          f = std::max(f, factor_min);
          // every rank holds the same m, v, vf, p after the exchange: one last_factor per segment
          const double last_f = last_factor[k];
          f = std::min(f, last_f * (1 + factor_threshold));
          f = std::max(f, last_f * (1 - factor_threshold));
          if (r + 1 == n) last_factor[k] = f;
          const double c = coeff_freeze[k] * f;
          if (r == 0) coeffs[k] = c;
          for (size_t i = b; i < e; ++i) p[r][i] -= lr * c * u[i];
        }
    }
    if (!freeze && s >= freeze_step) freeze = true;
  }
};

}  // namespace mt::optim::testing
