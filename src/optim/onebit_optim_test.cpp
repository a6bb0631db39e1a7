// OneBitAdam, ZeroOneAdam and OneBitLamb on one rank (the exchange the identity) against the double oracle
// written from DeepSpeed's step() (onebit_reference_test_util.h); the 0/1 Adam step policy as pure
// logic; the scalar state and set_step_count resume the run exactly. Two ranks:
// src/parallel/onebit_optim_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "optim/onebit_adam.h"
#include "optim/onebit_lamb.h"
#include "optim/onebit_reference_test_util.h"
#include "optim/zero_one_adam.h"

namespace mt::optim {
namespace {

using testing::Vec;

constexpr size_t kN = testing::kModelNumel;
std::vector<ParamSegment> segments() { return testing::model_segments(); }
std::vector<testing::RefSegment> ref_segments() { return testing::model_ref_segments(); }
std::vector<float> initial_params() { return testing::model_initial_params(); }
using testing::lr_at;
using testing::randn;

// The identity exchange, counting its calls.
struct Identity : StateExchange {
  int calls = 0, resets = 0;
  void average(float*, size_t) override { ++calls; }
  void reset_errors() override { ++resets; }
};

void expect_near(const float* got, const Vec& want, double tol, const std::string& what) {
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::fabs(want[i]))) << what << " [" << i << "]";
}


ZeroOneAdamConfig zo_config() {
  ZeroOneAdamConfig c;
  c.adam.beta1 = 0.9f;
  c.adam.beta2 = 0.999f;
  c.adam.eps = 1e-8f;
  c.var_freeze_step = 6;
  c.var_update_scaler = 2;
  c.local_step_scaler = 1;
  c.local_step_clipper = 2;
  return c;
}

TEST(ZeroOnePolicy, KindsFollowDeepSpeedsCounters) {
  ZeroOneAdamConfig c = zo_config();
  ZeroOnePolicy p(c);
  std::string kinds;
  for (int64_t t = 1; t <= 12; ++t) {
    const auto k = p.kind(t);
    kinds += k == ZeroOnePolicy::Kind::kVariance ? 'V' : k == ZeroOnePolicy::Kind::kCompressedGradient ? 'C'
             : k == ZeroOnePolicy::Kind::kLocal                                                    ? 'L'
                                                                                                   : 'S';
    p.advance(t);
  }
  // DeepSpeed steps s = 2..13: intervals 1,1 | 2 (s 4-6) | 4 (s 7) then frozen; local interval 1, then 2.
  EXPECT_EQ(kinds, "VVVCVCSLSLSL");
  // Defaults: 16 variance steps at interval 1, then every other step; the interval doubles after 16 more.
  ZeroOnePolicy d(ZeroOneAdamConfig{});
  int variance = 0;
  for (int64_t t = 1; t <= 16 + 32 + 64; ++t) {
    variance += d.kind(t) == ZeroOnePolicy::Kind::kVariance;
    d.advance(t);
  }
  EXPECT_EQ(variance, 48);
  EXPECT_EQ(d.var_interval(), 8);
  ZeroOnePolicy r(ZeroOneAdamConfig{});
  r.restore(16 + 32 + 64);
  EXPECT_EQ(r.var_interval(), 8);
  // var_update_scaler 0 and local_step_scaler 0 (refused before): DeepSpeed's counters never equal
  // them, so every step before the freeze is a variance step and every later one a sync.
  ZeroOneAdamConfig z = zo_config();
  z.var_update_scaler = 0;
  z.local_step_scaler = 0;
  EXPECT_NO_THROW(ZeroOneAdam(kN, segments(), z));
  ZeroOnePolicy zp(z);
  std::string zk;
  for (int64_t t = 1; t <= 10; ++t) {
    zk += zp.kind(t) == ZeroOnePolicy::Kind::kVariance ? 'V' : zp.kind(t) == ZeroOnePolicy::Kind::kSync ? 'S' : '?';
    zp.advance(t);
  }
  EXPECT_EQ(zk, "VVVVVVSSSS");
  // A clipper past 2^62 (any int64 is taken): the interval doubles to it and stays, where doubling
  // first overflowed past 2^62 (a negative interval).
  ZeroOneAdamConfig big = zo_config();
  big.var_freeze_step = 1;
  big.local_step_clipper = std::numeric_limits<int64_t>::max();
  ZeroOnePolicy bp(big);
  bp.restore(80);
  EXPECT_EQ(bp.local_interval(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(bp.kind(81), ZeroOnePolicy::Kind::kLocal);
}

TEST(ZeroOneAdam, OneRankMatchesDeepSpeedsStep) {
  ZeroOneAdam opt(kN, segments(), zo_config());
  Identity ex;
  opt.set_exchange(&ex);
  std::vector<float> p = initial_params();
  testing::ZeroOneRef ref;
  ref.segs = ref_segments();
  ref.p = {Vec(p.begin(), p.end())};
  ref.m = ref.v = ref.cb = {Vec(kN, 0.0)};
  const float scale = 0.5f;
  std::string kinds;
  for (int t = 1; t <= 12; ++t) {
    std::vector<float> g = randn(kN, 100 + static_cast<uint32_t>(t), 1.0f);
    const bool local = opt.wants_local_gradients();
    opt.step(p.data(), g.data(), nullptr, DType::kF32, static_cast<float>(lr_at(t)), scale);
    std::vector<Vec> gd = {Vec(kN)};
    for (size_t i = 0; i < kN; ++i) gd[0][i] = static_cast<double>(g[i]) * scale;
    ref.step(gd, static_cast<double>(static_cast<float>(lr_at(t))), [](std::vector<Vec>&) {});
    kinds += ref.last_kind;
    EXPECT_EQ(local, ref.last_kind != 'V') << "t " << t;
    expect_near(p.data(), ref.p[0], 2e-5, "params t " + std::to_string(t));
    expect_near(opt.state()[0].data, ref.m[0], 2e-4, "exp_avg t " + std::to_string(t));
    expect_near(opt.state()[2].data, ref.cb[0], 2e-5, "momentum_accumulator t " + std::to_string(t));
  }
  EXPECT_EQ(kinds, "VVVCVCSLSLSL");
  EXPECT_EQ(ex.calls, 2 + 3);  // C steps and S steps
  EXPECT_EQ(ex.resets, 1);     // at the end of phase 1
}

// A copy of the state, the step count and the scalar state continue the run bit for bit.
template <typename Opt, typename Config>
void check_resume(const Config& config, int split, int total) {
  Opt a(kN, segments(), config), b(kN, segments(), config);
  std::vector<float> pa = initial_params(), pb;
  for (int t = 1; t <= total; ++t) {
    if (t == split + 1) {
      pb = pa;
      for (size_t k = 0; k < a.state().size(); ++k)
        std::copy(a.state()[k].data, a.state()[k].data + kN, b.state()[k].data);
      for (size_t k = 0; k < a.scalar_state().size(); ++k) *b.scalar_state()[k].values = *a.scalar_state()[k].values;
      b.set_step_count(a.step_count());
    }
    std::vector<float> g = randn(kN, 300 + static_cast<uint32_t>(t), 1.0f);
    a.step(pa.data(), g.data(), nullptr, DType::kF32, static_cast<float>(lr_at(t)));
    if (t > split) {
      b.step(pb.data(), g.data(), nullptr, DType::kF32, static_cast<float>(lr_at(t)));
      for (size_t i = 0; i < kN; ++i) ASSERT_EQ(pa[i], pb[i]) << "t " << t << " i " << i;
    }
  }
}

TEST(ZeroOneAdam, ResumeMidLocalStepsIsExact) { check_resume<ZeroOneAdam>(zo_config(), 8, 12); }

// DeepSpeed's warm-up is max(freeze_step, 2) - 1 Adam updates (its first call only allocates and
// it freezes once its step count reaches freeze_step): our update t is its call t + 1. OneBitAdam
// froze after freeze_step updates, one more than DeepSpeed, and freeze_step 0 compressed its first
// update with a variance of zero (m / eps: the loss went to 1e7 and NaN).
TEST(OneBitAdam, OneRankMatchesDeepSpeedsStep) {
  for (int64_t freeze : {0, 1, 2, 3, 5}) {
    OneBitAdamConfig c;
    c.adam.beta1 = 0.9f;
    c.adam.beta2 = 0.999f;
    c.adam.eps = 1e-8f;
    c.bias_correction = false;  // DeepSpeed's arithmetic
    c.freeze_step = freeze;
    OneBitAdam opt(kN, segments(), c);
    Identity ex;
    opt.set_exchange(&ex);
    std::vector<float> p = initial_params();
    testing::OneBitAdamRef ref;
    ref.freeze_step = freeze;
    ref.segs = ref_segments();
    ref.p = {Vec(p.begin(), p.end())};
    ref.m = ref.v = {Vec(kN, 0.0)};
    for (int t = 1; t <= 8; ++t) {
      std::vector<float> g = randn(kN, 300 + static_cast<uint32_t>(t), 1.0f);
      EXPECT_EQ(opt.wants_local_gradients(), ref.freeze) << "freeze_step " << freeze << " t " << t;
      opt.step(p.data(), g.data(), nullptr, DType::kF32, static_cast<float>(lr_at(t)));
      ref.step({Vec(g.begin(), g.end())}, static_cast<double>(static_cast<float>(lr_at(t))), [](std::vector<Vec>&) {});
      expect_near(p.data(), ref.p[0], 2e-5, "freeze_step " + std::to_string(freeze) + " params t " + std::to_string(t));
    }
    EXPECT_EQ(ref.warmup_updates, std::max<int>(static_cast<int>(freeze), 2) - 1);
    EXPECT_EQ(ex.calls, 8 - ref.warmup_updates) << "freeze_step " << freeze;
  }
}

OneBitLambConfig lamb_config() {
  OneBitLambConfig c;
  c.lamb.beta1 = 0.9;
  c.lamb.beta2 = 0.999;
  c.lamb.eps = 1e-8;
  c.lamb.max_coeff = 10.0;
  c.lamb.min_coeff = 0.01;
  c.freeze_step = 4;
  return c;
}

TEST(OneBitLamb, OneRankMatchesDeepSpeedsStep) {
  OneBitLamb opt(kN, segments(), lamb_config());
  Identity ex;
  opt.set_exchange(&ex);
  std::vector<float> p = initial_params();
  testing::OneBitLambRef ref;
  ref.segs = ref_segments();
  ref.p = {Vec(p.begin(), p.end())};
  ref.m = ref.v = ref.vf = {Vec(kN, 0.0)};
  for (int t = 1; t <= 10; ++t) {
    // Gradients that drift so the fresh variance moves away from the frozen one.
    std::vector<float> g = randn(kN, 200 + static_cast<uint32_t>(t), 1.0f + 0.3f * static_cast<float>(t));
    const bool local = opt.wants_local_gradients();
    opt.step(p.data(), g.data(), nullptr, DType::kF32, static_cast<float>(lr_at(t)));
    std::vector<Vec> gd = {Vec(g.begin(), g.end())};
    const bool was_frozen = ref.freeze;
    ref.step(gd, static_cast<double>(static_cast<float>(lr_at(t))), [](std::vector<Vec>&) {});
    EXPECT_EQ(local, was_frozen) << "t " << t;
    expect_near(p.data(), ref.p[0], 2e-5, "params t " + std::to_string(t));
    expect_near(opt.state()[2].data, ref.vf[0], 2e-4, "exp_avg_sq_fresh t " + std::to_string(t));
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_NEAR(opt.lamb_coeffs()[k], ref.coeffs[k], 1e-5 * (1 + ref.coeffs[k])) << "t " << t << " k " << k;
      EXPECT_NEAR(opt.lamb_coeff_freeze()[k], ref.coeff_freeze[k], 1e-6) << "t " << t << " k " << k;
    }
  }
  EXPECT_EQ(ex.calls, 7);  // updates 4..10 (DeepSpeed's steps 5..11)
  // The bias is zero on step 1: its coefficient is 1 and left out of the average.
  EXPECT_GT(opt.lamb_coeff_freeze()[1], 0.0);
}

TEST(OneBitLamb, ResumeMidCompressionIsExact) { check_resume<OneBitLamb>(lamb_config(), 6, 10); }

}  // namespace
}  // namespace mt::optim
