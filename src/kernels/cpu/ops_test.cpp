// Tests of the fused CPU kernels (ops.h). Oracles from outside the kernels:
//   1. the portable body, for every AVX-512 body (odd sizes, N = 1, large magnitudes);
//   2. double-precision central differences of sum(dout * forward(x)), for every backward, on
//      every ISA this CPU has;
//   3. textbook formulas in double: AdamW (torch.optim.AdamW), log-sum-exp, sum of squares,
//      LayerNorm and GELU.
#include "kernels/cpu/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "base/cpu_features.h"

namespace mt::kernels {
namespace {

using Vec = std::vector<float>;

Vec random_vec(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Restores the active ISA at scope exit.
class IsaScope {
 public:
  IsaScope() : saved_(isa_active()) {}
  ~IsaScope() { isa_force(saved_); }

 private:
  Isa saved_;
};

// The ISAs this CPU can run: portable, plus AVX-512 when detected.
std::vector<Isa> isas() {
  std::vector<Isa> out = {Isa::kPortable};
  if (isa_detected() == Isa::kAvx512) out.push_back(Isa::kAvx512);
  return out;
}

void expect_close(const Vec& got, const Vec& want, double rtol, double atol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    const double g = got[i], w = want[i];
    const bool ok = std::isfinite(g) && std::fabs(g - w) <= atol + rtol * std::fabs(w);
    if (!ok) ++bad;
    EXPECT_TRUE(ok) << what << "[" << i << "]: got " << g << " want " << w;
  }
}

// Runs f once on the portable path and once on AVX-512; f returns the outputs to compare.
void compare_isas(const std::function<std::vector<Vec>()>& f, double rtol, double atol,
                  const char* what) {
  if (isa_detected() != Isa::kAvx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  IsaScope scope;
  isa_force(Isa::kPortable);
  const std::vector<Vec> want = f();
  isa_force(Isa::kAvx512);
  ASSERT_EQ(isa_active(), Isa::kAvx512);
  const std::vector<Vec> got = f();
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    SCOPED_TRACE(testing::Message() << what << " output " << k);
    expect_close(got[k], want[k], rtol, atol, what);
  }
}

double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Central differences of loss() w.r.t. every element of x (perturbed in place, in f32; the real
// step is recovered in double), compared with grad.
void check_fd(Vec& x, const Vec& grad, const std::function<double()>& loss, double h, double rtol,
              double atol, const char* what) {
  ASSERT_EQ(x.size(), grad.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float x0 = x[i];
    const float xp = static_cast<float>(x0 + h), xm = static_cast<float>(x0 - h);
    x[i] = xp;
    const double lp = loss();
    x[i] = xm;
    const double lm = loss();
    x[i] = x0;
    const double fd = (lp - lm) / (static_cast<double>(xp) - xm);
    EXPECT_NEAR(grad[i], fd, atol + rtol * std::fabs(fd)) << what << "[" << i << "]";
  }
}

const int kShapes[][2] = {{1, 1}, {3, 7}, {5, 33}, {4, 769}, {64, 768}, {1, 16}};

// ---- 1. AVX-512 against portable ----

TEST(OpsIsa, LayerNorm) {
  for (auto [N, C] : kShapes) {
    for (float mag : {1.0f, 100.0f}) {
      const Vec x = random_vec(size_t(N) * C, -mag, 3 * mag, 1), w = random_vec(C, 0.5f, 1.5f, 2),
                b = random_vec(C, -1, 1, 3), dy = random_vec(size_t(N) * C, -1, 1, 4);
      compare_isas(
          [&] {
            Vec y(x.size()), mean(N), rstd(N), dx(x.size(), 0.5f), dw(C, 0.25f), db(C, 0.0f);
            layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                              C, 1e-5f);
            layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                               mean.data(), rstd.data(), N, C);
            return std::vector<Vec>{y, mean, rstd, dx, dw, db};
          },
          2e-5, 2e-5, "layernorm");
    }
  }
}

TEST(OpsIsa, RmsNorm) {
  for (auto [N, C] : kShapes) {
    const Vec x = random_vec(size_t(N) * C, -3, 2, 5), w = random_vec(C, 0.5f, 1.5f, 6),
              dy = random_vec(size_t(N) * C, -1, 1, 7);
    compare_isas(
        [&] {
          Vec y(x.size()), rstd(N), dx(x.size(), 0.5f), dw(C, 0.25f);
          rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
          rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
          return std::vector<Vec>{y, rstd, dx, dw};
        },
        2e-5, 2e-5, "rmsnorm");
  }
}

TEST(OpsIsa, Gelu) {
  for (size_t n : {1, 7, 33, 769, 100003}) {
    Vec x = random_vec(n, -12, 12, 8);
    if (n > 2) x[0] = 80.0f, x[1] = -80.0f;
    const Vec dy = random_vec(n, -1, 1, 9);
    compare_isas(
        [&] {
          Vec y(n), dx(n);
          gelu_forward(y.data(), x.data(), n);
          gelu_backward(dx.data(), x.data(), dy.data(), n);
          return std::vector<Vec>{y, dx};
        },
        1e-5, 1e-6, "gelu");
  }
}

TEST(OpsIsa, SwiGlu) {
  for (int N : {1, 3}) {
    for (int I : {1, 7, 33, 769}) {
      Vec x = random_vec(size_t(N) * 2 * I, -20, 20, 10);
      x[0] = -90.0f;
      const Vec dy = random_vec(size_t(N) * I, -1, 1, 11);
      compare_isas(
          [&] {
            Vec y(size_t(N) * I), dx(x.size());
            swiglu_forward(y.data(), x.data(), N, I);
            swiglu_backward(dx.data(), dy.data(), x.data(), N, I);
            return std::vector<Vec>{y, dx};
          },
          1e-5, 1e-6, "swiglu");
    }
  }
}

// The fused low-precision activations against their parts in turn (round_to, the f32 kernel, a
// conversion): bit for bit, in bf16 and f16, on each ISA, across the chunks and threads' rows.
TEST(OpsLowPrecision, FusedActivationsAreTheirPartsInTurn) {
  IsaScope scope;
  for (Isa isa : isas()) {
    isa_force(isa);
    for (DType cd : {DType::kBF16, DType::kF16}) {
      for (auto [N, I] : {std::pair<int, int>{1, 7}, {3, 33}, {70, 769}, {2, 40000}}) {
        const size_t nh = size_t(N) * 2 * I, ng = size_t(N) * I, e = dtype_size(cd);
        const Vec h = random_vec(nh, -8, 8, 12), dy = random_vec(nh, -1, 1, 13);
        // GELU over all N·2I elements: the saved copy, the activation, the backward.
        Vec r = h;
        std::vector<char> want_h(nh * e), want_a(nh * e), got_h(nh * e), got_a(nh * e);
        round_to(want_h.data(), cd, r.data(), nh);
        Vec act(nh), dx(nh), got_dx(nh);
        gelu_forward(act.data(), r.data(), nh);
        convert(want_a.data(), cd, act.data(), DType::kF32, nh);
        gelu_backward(dx.data(), r.data(), dy.data(), nh);
        gelu_forward_lp(got_h.data(), got_a.data(), cd, h.data(), nh);
        gelu_backward_lp(got_dx.data(), got_h.data(), cd, dy.data(), nh);
        ASSERT_EQ(got_h, want_h) << dtype_name(cd) << " gelu saved, N " << N << " I " << I;
        ASSERT_EQ(got_a, want_a) << dtype_name(cd) << " gelu activation";
        ASSERT_EQ(got_dx, dx) << dtype_name(cd) << " gelu backward";
        // SwiGLU: rows of [gate | up].
        std::vector<char> want_sa(ng * e), got_sa(ng * e);
        Vec sy(ng), sdx(nh), got_sdx(nh);
        swiglu_forward(sy.data(), r.data(), N, I);
        convert(want_sa.data(), cd, sy.data(), DType::kF32, ng);
        swiglu_backward(sdx.data(), dy.data(), r.data(), N, I);
        std::fill(got_h.begin(), got_h.end(), 0);
        swiglu_forward_lp(got_h.data(), got_sa.data(), cd, h.data(), N, I);
        swiglu_backward_lp(got_sdx.data(), dy.data(), got_h.data(), cd, N, I);
        ASSERT_EQ(got_h, want_h) << dtype_name(cd) << " swiglu saved";
        ASSERT_EQ(got_sa, want_sa) << dtype_name(cd) << " swiglu activation";
        ASSERT_EQ(got_sdx, sdx) << dtype_name(cd) << " swiglu backward";
      }
    }
  }
}

TEST(OpsIsa, CrossEntropy) {
  for (int R : {1, 5}) {
    for (int V : {1, 7, 33, 769, 50257}) {
      for (float mag : {1.0f, 80.0f}) {
        const Vec logits = random_vec(size_t(R) * V, -mag, mag, 12);
        std::vector<int32_t> tg(R);
        for (int r = 0; r < R; ++r) tg[r] = r == 1 ? -100 : (r * 7919) % V;
        compare_isas(
            [&] {
              Vec l = logits, loss(R), lse(R);
              cross_entropy_tile(loss.data(), lse.data(), l.data(), tg.data(), R, V, 0.5f);
              return std::vector<Vec>{loss, lse, l};
            },
            1e-5, 1e-6, "cross_entropy");
      }
    }
  }
}

// Rows ld apart (the LM head's f32 tiles on whole lines, nn::lm_head_logits_ld): every kernel gives
// the dense tile's values row for row, on both ISAs, and leaves the columns past V as they were.
TEST(OpsIsa, CrossEntropyOnRowsLdApartIsTheDenseTiles) {
  const int R = 5;
  for (int V : {7, 33, 769}) {
    const int ld = (V + 15) / 16 * 16 + 16;
    const Vec dense = random_vec(size_t(R) * V, -30.0f, 30.0f, 31);
    std::vector<int32_t> tg(R);
    for (int r = 0; r < R; ++r) tg[r] = r == 1 ? -100 : (r * 7919) % V;
    auto spread = [&](const Vec& d) {
      Vec w(size_t(R) * ld, 7.0f);  // 7: the columns past V, which no kernel may touch
      for (int r = 0; r < R; ++r) std::copy_n(d.begin() + r * V, V, w.begin() + size_t(r) * ld);
      return w;
    };
    auto check = [&](const Vec& strided, const Vec& want, const char* what) {
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < ld; ++c)
          ASSERT_EQ(strided[size_t(r) * ld + c], c < V ? want[size_t(r) * V + c] : 7.0f) << what << " V " << V << " row " << r << " col " << c;
    };
    compare_isas(
        [&] {
          Vec d = dense, loss(R), lse(R), l = spread(dense), sloss(R), slse(R);
          cross_entropy_tile(loss.data(), lse.data(), d.data(), tg.data(), R, V, 0.5f);
          cross_entropy_tile(sloss.data(), slse.data(), l.data(), tg.data(), R, V, 0.5f, ld);
          EXPECT_EQ(sloss, loss);
          EXPECT_EQ(slse, lse);
          check(l, d, "cross_entropy_tile");
          const int valid = V - 2;  // two padding columns in the shard
          Vec vd = dense, vl = spread(dense), mx(R), smx(R), sum(R), ssum(R), scale(R, 0.5f);
          vp_cross_entropy_max(mx.data(), vd.data(), R, V, valid);
          vp_cross_entropy_max(smx.data(), vl.data(), R, V, valid, ld);
          EXPECT_EQ(smx, mx);
          vp_cross_entropy_exp(sum.data(), vd.data(), mx.data(), R, V, valid);
          vp_cross_entropy_exp(ssum.data(), vl.data(), mx.data(), R, V, valid, ld);
          EXPECT_EQ(ssum, sum);
          vp_cross_entropy_grad(vd.data(), sum.data(), scale.data(), R, V);
          vp_cross_entropy_grad(vl.data(), sum.data(), scale.data(), R, V, ld);
          check(vl, vd, "vp_cross_entropy");
          return std::vector<Vec>{sloss, slse, l, vl};
        },
        1e-5, 1e-6, "cross_entropy on strided rows");
  }
}

// Megatron's vocab-parallel cross-entropy: the vocabulary split over S shards, each padded to a
// multiple of 16 (+ 3 padding columns on the last), with the group's reductions done by hand,
// gives the loss and dlogits of the whole-vocabulary tile (cross_entropy_tile) on both ISAs.
TEST(OpsIsa, VocabParallelCrossEntropyEqualsTheWholeTile) {
  const int R = 5;
  for (int V : {7, 33, 769}) {
    for (int S : {2, 4}) {
      const Vec logits = random_vec(size_t(R) * V, -30.0f, 30.0f, 21);
      std::vector<int32_t> tg(R);
      for (int r = 0; r < R; ++r) tg[r] = r == 1 ? -100 : (r * 7919) % V;
      compare_isas(
          [&] {
            Vec whole = logits, loss(R), lse(R);
            cross_entropy_tile(loss.data(), lse.data(), whole.data(), tg.data(), R, V, 0.5f);
            const int Vl = ((V + S - 1) / S + 3 + 15) / 16 * 16;  // local columns, some of them padding
            std::vector<Vec> shard(S, Vec(size_t(R) * Vl, 1e30f));  // padding holds garbage
            for (int s = 0; s < S; ++s)
              for (int r = 0; r < R; ++r)
                for (int c = 0; c < Vl && s * Vl + c < V; ++c) shard[s][size_t(r) * Vl + c] = logits[size_t(r) * V + s * Vl + c];
            auto valid = [&](int s) { return std::max(0, std::min(Vl, V - s * Vl)); };
            Vec mx(R, -INFINITY), sum(R, 0.0f), part(R), scale(R);
            for (int s = 0; s < S; ++s) {
              vp_cross_entropy_max(part.data(), shard[s].data(), R, Vl, valid(s));
              for (int r = 0; r < R; ++r) mx[r] = std::max(mx[r], part[r]);
            }
            for (int s = 0; s < S; ++s) {
              vp_cross_entropy_exp(part.data(), shard[s].data(), mx.data(), R, Vl, valid(s));
              for (int r = 0; r < R; ++r) sum[r] += part[r];
            }
            Vec dl(size_t(R) * V, 0.0f), ploss(R);
            for (int r = 0; r < R; ++r) {
              scale[r] = tg[r] == -100 ? 0.0f : 0.5f;
              ploss[r] = tg[r] == -100 ? 0.0f : std::log(sum[r]) + mx[r] - logits[size_t(r) * V + tg[r]];
            }
            for (int s = 0; s < S; ++s) {
              vp_cross_entropy_grad(shard[s].data(), sum.data(), scale.data(), R, Vl);
              for (int r = 0; r < R; ++r)
                for (int c = 0; c < Vl; ++c) {
                  if (c >= valid(s)) {
                    EXPECT_EQ(shard[s][size_t(r) * Vl + c], 0.0f) << "padding column";
                    continue;
                  }
                  dl[size_t(r) * V + s * Vl + c] = shard[s][size_t(r) * Vl + c];
                }
            }
            for (int r = 0; r < R; ++r)
              if (tg[r] != -100) dl[size_t(r) * V + tg[r]] -= 0.5f;
            for (int r = 0; r < R; ++r) EXPECT_NEAR(ploss[r], loss[r], 1e-4f * (1.0f + std::fabs(loss[r]))) << "row " << r;
            for (size_t i = 0; i < dl.size(); ++i) EXPECT_NEAR(dl[i], whole[i], 1e-6f) << "dlogit " << i;
            return std::vector<Vec>{ploss, dl};
          },
          1e-5, 1e-6, "vp_cross_entropy");
    }
  }
}

TEST(OpsIsa, AdamW) {
  AdamWParams p;
  p.lr = 1e-2f;
  p.weight_decay = 0.1f;
  p.step = 3;
  p.grad_scale = 0.5f;
  for (size_t n : {1, 7, 33, 769, 100003}) {
    const Vec w = random_vec(n, -1, 1, 13), g = random_vec(n, -2, 2, 14),
              m0 = random_vec(n, -0.1f, 0.1f, 15), v0 = random_vec(n, 0, 0.01f, 16);
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      compare_isas(
          [&] {
            Vec master = w, m = m0, v = v0, lowp(n);
            std::vector<uint16_t> lp16(n);
            void* lp = dt == DType::kF32 ? static_cast<void*>(lowp.data()) : lp16.data();
            adamw_update(master.data(), g.data(), m.data(), v.data(), lp, dt, n, p);
            // lowp is exactly the RNE rounding of this run's master (master itself may differ from
            // the other ISA's by an ulp, which can move lowp by one of its own ulps).
            for (size_t i = 0; i < n; ++i) {
              const uint16_t want =
                  dt == DType::kBF16 ? f32_to_bf16(master[i]).bits : f32_to_f16(master[i]).bits;
              const bool ok = dt == DType::kF32 ? lowp[i] == master[i] : lp16[i] == want;
              EXPECT_TRUE(ok) << dtype_name(dt) << "[" << i << "]";
            }
            return std::vector<Vec>{master, m, v};
          },
          1e-6, 1e-7, "adamw");
    }
  }
}

// LAMB's two passes (optim/lamb.cpp's chunks) on both ISAs, against the textbook in double: the
// moments, the sums of p^2 and u^2, the update by a scale, the compute-dtype copy; both eps modes,
// lengths with and without a tail.
TEST(OpsIsa, Lamb) {
  for (bool inside : {false, true})
    for (size_t n : {1, 7, 33, 769, 16384}) {
      const Vec w = random_vec(n, -1, 1, 23), g = random_vec(n, -2, 2, 24), m0 = random_vec(n, -0.1f, 0.1f, 25),
                v0 = random_vec(n, 0, 0.01f, 26);
      LambScalars s;
      s.grad_scale = 0.5f;
      s.beta1 = 0.9f;
      s.beta2 = 0.99f;
      s.eps = 1e-6f;
      s.weight_decay = 0.05f;
      s.eps_inside_sqrt = inside;
      const float scale = 3e-3f;
      // The textbook, in double.
      std::vector<double> mt(n), vt(n), pt(n);
      double wsum = 0.0, usum = 0.0;
      for (size_t i = 0; i < n; ++i) {
        const double gi = double(g[i]) * s.grad_scale;
        mt[i] = double(s.beta1) * m0[i] + (1.0 - double(s.beta1)) * gi;
        vt[i] = double(s.beta2) * v0[i] + (1.0 - double(s.beta2)) * gi * gi;
        const double denom = inside ? std::sqrt(vt[i] + s.eps) : std::sqrt(vt[i]) + s.eps;
        const double u = mt[i] / denom + double(s.weight_decay) * w[i];
        wsum += double(w[i]) * w[i];
        usum += u * u;
        pt[i] = w[i] - double(scale) * u;
      }
      for (DType dt : {DType::kF32, DType::kBF16}) {
        auto run = [&] {
              Vec master = w, m = m0, v = v0, lowp(n);
              std::vector<uint16_t> lp16(n);
              void* lp = dt == DType::kF32 ? static_cast<void*>(lowp.data()) : lp16.data();
              const LambSums sums = lamb_moments(m.data(), v.data(), g.data(), master.data(), n, s);
              EXPECT_NEAR(sums.w, wsum, 1e-9 * wsum);
              EXPECT_NEAR(sums.u, usum, 1e-5 * usum);
              lamb_apply(master.data(), m.data(), v.data(), lp, dt, n, scale, s);
              for (size_t i = 0; i < n; ++i) {
                EXPECT_NEAR(m[i], mt[i], 1e-6) << i;
                EXPECT_NEAR(v[i], vt[i], 1e-7) << i;
                EXPECT_NEAR(master[i], pt[i], 2e-6) << i;
                const bool ok = dt == DType::kF32 ? lowp[i] == master[i] : lp16[i] == f32_to_bf16(master[i]).bits;
                EXPECT_TRUE(ok) << dtype_name(dt) << "[" << i << "]";
              }
              return std::vector<Vec>{master, m, v, Vec{float(sums.w), float(sums.u)}};
        };
        run();  // the textbook on this machine's ISA, then the two ISAs against each other
        compare_isas(run, 1e-5, 1e-6, "lamb");
      }
    }
}

// 1-bit LAMB's refresh after the exchange (optim/onebit_lamb.cpp's chunks) on both ISAs, against
// the textbook in double: m unscaled, the fresh variance, the sums of u^2 and prelim^2, the largest
// ratio; with and without weight decay, lengths with and without a tail.
TEST(OpsIsa, OneBitLambRefresh) {
  for (float wd : {0.0f, 0.05f})
    for (size_t n : {1, 7, 33, 769, 16384}) {
      const Vec w = random_vec(n, -1, 1, 33), m0 = random_vec(n, -0.1f, 0.1f, 34), ml = random_vec(n, -0.1f, 0.1f, 35),
                v = random_vec(n, 0, 0.01f, 36), vf0 = random_vec(n, 0, 0.01f, 37);
      OneBitLambScalars s;
      s.scale = 1.25f;
      s.beta1 = 0.9f;
      s.beta2 = 0.99f;
      s.one_minus_beta1 = static_cast<float>(1.0 - 0.9);
      s.one_minus_beta2 = static_cast<float>(1.0 - 0.99);
      s.eps = 1e-6f;
      s.weight_decay = wd;
      std::vector<double> mt(n), vft(n);
      double usum = 0.0, psum = 0.0, rmax = -1e300;
      for (size_t i = 0; i < n; ++i) {
        mt[i] = double(m0[i]) / s.scale;
        const double g = (mt[i] - double(ml[i]) * s.beta1) / double(s.one_minus_beta1);
        vft[i] = double(s.beta2) * vf0[i] + double(s.one_minus_beta2) * g * g;
        const double denom = std::sqrt(double(v[i])) + s.eps;
        const double prelim = mt[i] / denom, u = prelim + double(wd) * w[i];
        usum += u * u;
        psum += prelim * prelim;
        rmax = std::max(rmax, denom / (std::sqrt(vft[i]) + s.eps));
      }
      // The textbook on this machine's ISA; then both ISAs element for element (the kernel's
      // operations are the portable loop's, unfused; the sums, in another order, each against the
      // textbook).
      auto run = [&] {
        Vec m = m0, vf = vf0;
        const OneBitLambSums sums = onebit_lamb_refresh(m.data(), vf.data(), ml.data(), v.data(), w.data(), n, s);
        EXPECT_NEAR(sums.u, usum, 1e-5 * usum);
        EXPECT_NEAR(sums.prelim, psum, 1e-5 * psum);
        EXPECT_NEAR(sums.ratio_max, rmax, 1e-5 * rmax);
        for (size_t i = 0; i < n; ++i) {
          EXPECT_NEAR(m[i], mt[i], 1e-7) << i;
          EXPECT_NEAR(vf[i], vft[i], 1e-5 * vft[i] + 1e-9) << i;
        }
        return std::vector<Vec>{m, vf, Vec{sums.ratio_max}};
      };
      run();
      compare_isas(run, 0.0, 0.0, "onebit_lamb_refresh");
    }
  // eps 0 with a zero variance: the ratio 0/0 is NaN there, and the max skips it on either ISA.
  {
    const size_t n = 40;
    Vec m(n, 0.01f), vf(n, 0.01f), ml(n, 0.0f), v(n, 0.01f), w(n, 1.0f);
    v[5] = 0.04f;  // lane 5's largest ratio, 2, in the first vector
    v[37] = 0.0f;  // lane 5's 0/0 in the last (a NaN there replaced the lane's max)
    vf[37] = 0.0f;
    m[37] = 0.0f;
    OneBitLambScalars s;
    s.eps = 0.0f;
    s.beta1 = 0.0f;  // g = m: v_fresh stays 0 where m is
    s.one_minus_beta1 = 1.0f;
    s.beta2 = 1.0f;
    s.one_minus_beta2 = 0.0f;
    compare_isas(
        [&] {
          Vec mm = m, vv = vf;
          const OneBitLambSums sums = onebit_lamb_refresh(mm.data(), vv.data(), ml.data(), v.data(), w.data(), n, s);
          EXPECT_FALSE(std::isnan(sums.ratio_max));
          EXPECT_FLOAT_EQ(sums.ratio_max, 2.0f);
          return std::vector<Vec>{Vec{sums.ratio_max}};
        },
        0.0, 0.0, "onebit_lamb_refresh eps 0");
    }
}

TEST(OpsIsa, ElementwiseAndReductions) {
  for (size_t n : {1, 7, 33, 769, 100003}) {
    const Vec a = random_vec(n, -3, 3, 17), b = random_vec(n, -3, 3, 18);
    compare_isas(
        [&] {
          Vec out(n), acc = a, sc = a;
          add_forward(out.data(), a.data(), b.data(), n);
          add_inplace(acc.data(), b.data(), n);
          scale_inplace(sc.data(), -1.5f, n);
          const double ss = sum_squares(a.data(), n);
          return std::vector<Vec>{out, acc, sc, Vec{static_cast<float>(ss)}};
        },
        1e-6, 0.0, "elementwise");
  }
  for (auto [N, C] : kShapes) {
    const Vec dy = random_vec(size_t(N) * C, -1, 1, 19);
    compare_isas(
        [&] {
          Vec db(C, 1.0f);
          bias_backward(db.data(), dy.data(), N, C);
          return std::vector<Vec>{db};
        },
        1e-6, 1e-6, "bias_backward");
  }
}

// ---- 2. finite differences, on every ISA ----

TEST(OpsFd, Embedding) {
  IsaScope scope;
  const int V = 11, C = 7, T = 3, N = 6;
  const std::vector<int32_t> tok = {3, 0, 10, 3, 5, 3};
  for (Isa isa : isas()) {
    isa_force(isa);
    Vec wte = random_vec(size_t(V) * C, -1, 1, 20), wpe = random_vec(size_t(T) * C, -1, 1, 21);
    const Vec dy = random_vec(size_t(N) * C, -1, 1, 22);
    Vec out(size_t(N) * C), dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
    auto loss = [&] {
      embedding_forward(out.data(), tok.data(), wte.data(), DType::kF32, wpe.data(), N, T, C);
      return dot(dy, out);
    };
    embedding_backward(dwte.data(), dwpe.data(), dy.data(), tok.data(), N, T, C);
    check_fd(wte, dwte, loss, 1e-2, 1e-4, 1e-5, "dwte");
    check_fd(wpe, dwpe, loss, 1e-2, 1e-4, 1e-5, "dwpe");
    // Low-precision tables read as their f32 values.
    for (DType dt : {DType::kBF16, DType::kF16}) {
      std::vector<uint16_t> lp(wte.size());
      convert(lp.data(), dt, wte.data(), DType::kF32, wte.size());
      Vec wte_f(wte.size()), got(out.size());
      convert(wte_f.data(), DType::kF32, lp.data(), dt, wte.size());
      embedding_forward(got.data(), tok.data(), lp.data(), dt, nullptr, N, T, C);
      for (int n = 0; n < N; ++n)
        for (int c = 0; c < C; ++c) EXPECT_EQ(got[n * C + c], wte_f[tok[n] * C + c]);
    }
  }
}

TEST(OpsFd, LayerNorm) {
  IsaScope scope;
  for (Isa isa : isas()) {
    isa_force(isa);
    for (int C : {7, 33}) {
      const int N = 3;
      Vec x = random_vec(size_t(N) * C, -2, 2, 23), w = random_vec(C, 0.5f, 1.5f, 24),
          b = random_vec(C, -1, 1, 25);
      const Vec dy = random_vec(x.size(), -1, 1, 26);
      Vec y(x.size()), mean(N), rstd(N), dx(x.size(), 0.0f), dw(C, 0.0f), db(C, 0.0f);
      auto loss = [&] {
        layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                          1e-5f);
        return dot(dy, y);
      };
      loss();
      layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                         mean.data(), rstd.data(), N, C);
      check_fd(x, dx, loss, 1e-2, 5e-3, 2e-3, "ln dx");
      check_fd(w, dw, loss, 1e-2, 5e-3, 2e-3, "ln dw");
      check_fd(b, db, loss, 1e-2, 5e-3, 2e-3, "ln db");
    }
  }
}

TEST(OpsFd, RmsNorm) {
  IsaScope scope;
  for (Isa isa : isas()) {
    isa_force(isa);
    for (int C : {7, 33}) {
      const int N = 3;
      Vec x = random_vec(size_t(N) * C, -2, 2, 27), w = random_vec(C, 0.5f, 1.5f, 28);
      const Vec dy = random_vec(x.size(), -1, 1, 29);
      Vec y(x.size()), rstd(N), dx(x.size(), 0.0f), dw(C, 0.0f);
      auto loss = [&] {
        rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
        return dot(dy, y);
      };
      loss();
      rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
      check_fd(x, dx, loss, 1e-2, 5e-3, 2e-3, "rms dx");
      check_fd(w, dw, loss, 1e-2, 5e-3, 2e-3, "rms dw");
    }
  }
}

TEST(OpsFd, GeluAndSwiGlu) {
  IsaScope scope;
  for (Isa isa : isas()) {
    isa_force(isa);
    const size_t n = 37;
    Vec x = random_vec(n, -5, 5, 30);
    const Vec dy = random_vec(n, -1, 1, 31);
    Vec y(n), dx(n);
    auto gelu_loss = [&] {
      gelu_forward(y.data(), x.data(), n);
      return dot(dy, y);
    };
    gelu_backward(dx.data(), x.data(), dy.data(), n);
    check_fd(x, dx, gelu_loss, 1e-3, 2e-3, 1e-4, "gelu dx");

    const int N = 2, I = 19;
    Vec xs = random_vec(size_t(N) * 2 * I, -6, 6, 32);
    const Vec dys = random_vec(size_t(N) * I, -1, 1, 33);
    Vec ys(dys.size()), dxs(xs.size());
    auto swiglu_loss = [&] {
      swiglu_forward(ys.data(), xs.data(), N, I);
      return dot(dys, ys);
    };
    swiglu_backward(dxs.data(), dys.data(), xs.data(), N, I);
    check_fd(xs, dxs, swiglu_loss, 1e-3, 2e-3, 1e-4, "swiglu dx");
  }
}

TEST(OpsFd, Rope) {
  const int B = 2, T = 3, NH = 2, NKV = 1, HS = 8;
  const size_t n = size_t(B) * T * (NH + 2 * NKV) * HS;
  Vec cos(size_t(T) * HS / 2), sin(cos.size());
  rope_table(cos.data(), sin.data(), T, HS, 10000.0f);
  Vec x = random_vec(n, -1, 1, 34);
  const Vec dy = random_vec(n, -1, 1, 35);
  Vec y(n), dx = dy;
  auto loss = [&] {
    y = x;
    rope_forward(y.data(), cos.data(), sin.data(), B, T, NH, NKV, HS);
    return dot(dy, y);
  };
  rope_backward(dx.data(), cos.data(), sin.data(), B, T, NH, NKV, HS);
  check_fd(x, dx, loss, 1e-2, 1e-4, 1e-5, "rope dx");
  // Table: HF's inv_freq = 1 / theta^(2j/HS); position 0 is the identity.
  for (int j = 0; j < HS / 2; ++j) {
    EXPECT_EQ(cos[j], 1.0f);
    EXPECT_EQ(sin[j], 0.0f);
    const double ang = 2.0 / std::pow(10000.0, 2.0 * j / HS);
    EXPECT_NEAR(cos[2 * HS / 2 + j], std::cos(ang), 1e-6);
    EXPECT_NEAR(sin[2 * HS / 2 + j], std::sin(ang), 1e-6);
  }
}

TEST(OpsFd, Bias) {
  IsaScope scope;
  for (Isa isa : isas()) {
    isa_force(isa);
    const int N = 5, C = 7;
    const Vec x = random_vec(size_t(N) * C, -1, 1, 36), dy = random_vec(x.size(), -1, 1, 37);
    Vec bias = random_vec(C, -1, 1, 38), y(x.size()), db(C, 0.0f);
    auto loss = [&] {  // y = x + bias (broadcast over rows), with the forward add kernel
      for (int r = 0; r < N; ++r) add_forward(y.data() + r * C, x.data() + r * C, bias.data(), C);
      return dot(dy, y);
    };
    bias_backward(db.data(), dy.data(), N, C);
    check_fd(bias, db, loss, 1e-2, 1e-4, 1e-5, "dbias");
  }
}

TEST(OpsFd, CrossEntropy) {
  IsaScope scope;
  for (Isa isa : isas()) {
    isa_force(isa);
    const int R = 3, V = 21;
    const float gs = 0.25f;
    Vec logits = random_vec(size_t(R) * V, -4, 4, 39);
    const std::vector<int32_t> tg = {5, -100, 20};
    Vec loss(R), lse(R);
    Vec dl = logits;
    cross_entropy_tile(loss.data(), lse.data(), dl.data(), tg.data(), R, V, gs);
    auto total = [&] {
      Vec l = logits;
      cross_entropy_tile(loss.data(), lse.data(), l.data(), tg.data(), R, V, 0.0f);
      double s = 0.0;
      for (float v : loss) s += v;
      return s * gs;
    };
    check_fd(logits, dl, total, 1e-2, 5e-3, 1e-4, "dlogits");
  }
}

// ---- 3. textbook formulas ----

TEST(OpsTextbook, AdamWOneStep) {
  IsaScope scope;
  AdamWParams p;
  p.lr = 3e-3f;
  p.beta1 = 0.9f;
  p.beta2 = 0.95f;
  p.eps = 1e-8f;
  p.weight_decay = 0.1f;
  p.step = 4;
  p.grad_scale = 0.125f;
  const size_t n = 1000;
  const Vec w = random_vec(n, -1, 1, 40), g = random_vec(n, -4, 4, 41),
            m0 = random_vec(n, -0.1f, 0.1f, 42), v0 = random_vec(n, 0, 0.02f, 43);
  for (Isa isa : isas()) {
    isa_force(isa);
    for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
      Vec master = w, m = m0, v = v0, lp32(n);
      std::vector<uint16_t> lp16(n);
      void* lp = dt == DType::kF32 ? static_cast<void*>(lp32.data()) : lp16.data();
      adamw_update(master.data(), g.data(), m.data(), v.data(), lp, dt, n, p);
      for (size_t i = 0; i < n; ++i) {
        // torch.optim.AdamW: decay first, then Adam with bias correction, all in double here.
        const double gi = double(g[i]) * p.grad_scale;
        const double mi = p.beta1 * double(m0[i]) + (1.0 - p.beta1) * gi;
        const double vi = p.beta2 * double(v0[i]) + (1.0 - p.beta2) * gi * gi;
        double pi = double(w[i]) - double(p.lr) * p.weight_decay * w[i];
        const double mh = mi / (1.0 - std::pow(double(p.beta1), double(p.step)));
        const double vh = vi / (1.0 - std::pow(double(p.beta2), double(p.step)));
        pi -= double(p.lr) * mh / (std::sqrt(vh) + p.eps);
        // Tolerances are relative to the size of the terms (m and p can cancel).
        const double m_scale = p.beta1 * std::fabs(m0[i]) + (1.0 - p.beta1) * std::fabs(gi);
        const double upd = p.lr * mh / (std::sqrt(vh) + p.eps);
        ASSERT_NEAR(m[i], mi, 1e-6 * m_scale + 1e-12) << i;
        ASSERT_NEAR(v[i], vi, 1e-6 * std::fabs(vi) + 1e-15) << i;
        ASSERT_NEAR(master[i], pi, 1e-6 * (std::fabs(w[i]) + std::fabs(upd)) + 1e-9) << i;
        if (dt == DType::kBF16) {
          ASSERT_EQ(lp16[i], f32_to_bf16(master[i]).bits) << i;
        } else if (dt == DType::kF16) {
          ASSERT_EQ(lp16[i], f32_to_f16(master[i]).bits) << i;
        } else {
          ASSERT_EQ(lp32[i], master[i]) << i;
        }
      }
    }
    Vec master = w, m = m0, v = v0;  // lowp may be nullptr
    adamw_update(master.data(), g.data(), m.data(), v.data(), nullptr, DType::kBF16, n, p);
    EXPECT_NE(master, w);
  }
}

TEST(OpsTextbook, CrossEntropyLogSumExp) {
  IsaScope scope;
  const int R = 4, V = 1003;
  Vec logits = random_vec(size_t(R) * V, -80, 80, 44);
  logits[5] = 80.0f;
  const std::vector<int32_t> tg = {5, -100, 1002, 0};
  for (Isa isa : isas()) {
    isa_force(isa);
    Vec l = logits, loss(R), lse(R);
    cross_entropy_tile(loss.data(), lse.data(), l.data(), tg.data(), R, V, 1.0f);
    for (int r = 0; r < R; ++r) {
      const float* x = logits.data() + size_t(r) * V;
      double mx = x[0];
      for (int i = 0; i < V; ++i) mx = std::max(mx, double(x[i]));
      double s = 0.0;
      for (int i = 0; i < V; ++i) s += std::exp(x[i] - mx);
      const double want_lse = mx + std::log(s);
      EXPECT_NEAR(lse[r], want_lse, 1e-6 * std::fabs(want_lse));
      double row_sum = 0.0;
      for (int i = 0; i < V; ++i) {
        ASSERT_TRUE(std::isfinite(l[size_t(r) * V + i]));
        row_sum += l[size_t(r) * V + i];
      }
      if (tg[r] == -100) {
        EXPECT_EQ(loss[r], 0.0f);
        for (int i = 0; i < V; ++i) ASSERT_EQ(l[size_t(r) * V + i], 0.0f);
      } else {
        EXPECT_NEAR(loss[r], want_lse - x[tg[r]], 1e-5 * std::max(1.0, want_lse - x[tg[r]]));
        EXPECT_NEAR(row_sum, 0.0, 1e-5);  // softmax sums to one
      }
    }
  }
}

TEST(OpsTextbook, SumSquares) {
  IsaScope scope;
  const size_t n = 300007;  // several chunks and a tail
  Vec x = random_vec(n, -3, 3, 45);
  double want = 0.0;
  for (float v : x) want += double(v) * v;
  for (Isa isa : isas()) {
    isa_force(isa);
    EXPECT_NEAR(sum_squares(x.data(), n), want, 1e-12 * want);
    EXPECT_EQ(sum_squares(x.data(), 0), 0.0);
    Vec big = {3e38f, -3e38f, 1.0f};  // squares overflow f32 but not double
    EXPECT_TRUE(std::isfinite(sum_squares(big.data(), big.size())));
    for (size_t pos : {size_t(0), size_t(70000), n - 1}) {
      Vec y = x;
      y[pos] = std::numeric_limits<float>::infinity();
      EXPECT_FALSE(std::isfinite(sum_squares(y.data(), n))) << pos;
      y[pos] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_FALSE(std::isfinite(sum_squares(y.data(), n))) << pos;
    }
  }
}

TEST(OpsTextbook, LayerNormAndGeluInDouble) {
  IsaScope scope;
  const int N = 4, C = 769;
  const Vec x = random_vec(size_t(N) * C, 5, 9, 46), w = random_vec(C, 0.5f, 1.5f, 47);
  const size_t n = 4001;
  const Vec xg = random_vec(n, -10, 10, 48);
  for (Isa isa : isas()) {
    isa_force(isa);
    Vec y(x.size()), mean(N), rstd(N);
    layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), nullptr, N, C, 1e-5f);
    for (int r = 0; r < N; ++r) {
      double m = 0.0, v = 0.0;
      for (int c = 0; c < C; ++c) m += x[r * C + c];
      m /= C;
      for (int c = 0; c < C; ++c) v += (x[r * C + c] - m) * (x[r * C + c] - m);
      const double rs = 1.0 / std::sqrt(v / C + 1e-5);
      EXPECT_NEAR(mean[r], m, 1e-6 * std::fabs(m));
      EXPECT_NEAR(rstd[r], rs, 1e-5 * rs);
      for (int c = 0; c < C; ++c)
        ASSERT_NEAR(y[r * C + c], (x[r * C + c] - m) * rs * w[c], 2e-5) << r << "," << c;
    }
    Vec yg(n);
    gelu_forward(yg.data(), xg.data(), n);
    for (size_t i = 0; i < n; ++i) {
      const double v = xg[i];
      const double want =
          0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
      ASSERT_NEAR(yg[i], want, 1e-6 + 2e-6 * std::fabs(want)) << xg[i];
    }
  }
}

TEST(OpsTextbook, DeterministicReductions) {
  const int N = 257, C = 769;
  const Vec x = random_vec(size_t(N) * C, -2, 2, 49), w = random_vec(C, 0.5f, 1.5f, 50),
            dy = random_vec(x.size(), -1, 1, 51);
  Vec y(x.size()), mean(N), rstd(N);
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), nullptr, N, C, 1e-5f);
  auto run = [&] {
    Vec dx(x.size(), 0.0f), dw(C, 0.0f), db(C, 0.0f), db2(C, 0.0f);
    layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                       rstd.data(), N, C);
    bias_backward(db2.data(), dy.data(), N, C);
    return std::vector<Vec>{dx, dw, db, db2};
  };
  EXPECT_EQ(run(), run());
}

}  // namespace
}  // namespace mt::kernels
