// ZeroOneAdam and OneBitLamb on 2 ranks (threads over the local backend), their exchange the real
// compressed all-reduce (comm/onebit.h), against the double oracle of
// optim/onebit_reference_test_util.h with the compressed average written from onebit.h's formula.
// Each rank has its own gradients; the steps that want averaged gradients get their exact mean.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <random>

#include "comm/local_backend.h"
#include "comm/onebit.h"
#include "optim/onebit_lamb.h"
#include "optim/onebit_reference_test_util.h"
#include "optim/zero_one_adam.h"

namespace mt::optim {
namespace {

using testing::Vec;
constexpr int kRanks = 2;
constexpr size_t kN = testing::kModelNumel;
std::vector<ParamSegment> segments() { return testing::model_segments(); }
std::vector<testing::RefSegment> ref_segments() { return testing::model_ref_segments(); }
std::vector<float> initial_params() { return testing::model_initial_params(); }
using testing::lr_at;
using testing::randn;

std::vector<float> grad_of(int rank, int t) { return randn(kN, 1000 * static_cast<uint32_t>(rank) + static_cast<uint32_t>(t), 1.0f); }

// What OneBitSync does (parallel/grad_sync.cpp): the compressed all-reduce with this rank's errors.
struct Compressed : StateExchange {
  comm::Backend& b;
  std::vector<float> we, se;
  explicit Compressed(comm::Backend& backend)
      : b(backend), we(kN, 0.0f), se(comm::OneBitLayout(kN, backend.size()).chunk, 0.0f) {}
  void average(float* buf, size_t n) override { comm::compressed_all_reduce(b, buf, n, we.data(), se.data()); }
  void reset_errors() override {
    std::fill(we.begin(), we.end(), 0.0f);
    std::fill(se.begin(), se.end(), 0.0f);
  }
};

// onebit.h's compressed average in double, every rank's errors kept here.
struct RefCompressed {
  comm::OneBitLayout L{kN, kRanks};
  std::vector<Vec> we = std::vector<Vec>(kRanks, Vec(kN, 0.0)), se = std::vector<Vec>(kRanks, Vec(L.chunk, 0.0));
  static double sign_scale(Vec& c, size_t b, size_t e, Vec& err) {  // c <- Q(c), err <- c - Q(c)
    double sq = 0;
    for (size_t i = b; i < e; ++i) sq += c[i] * c[i];
    const double s = e > b ? std::sqrt(sq / static_cast<double>(e - b)) : 0.0;
    for (size_t i = b; i < e; ++i) {
      const double q = c[i] < 0 ? -s : s;
      err[i - b] = c[i] - q;
      c[i] = q;
    }
    return s;
  }
  void operator()(std::vector<Vec>& x) {
    std::vector<Vec> q(kRanks);
    for (int w = 0; w < kRanks; ++w) {
      q[w] = x[w];
      for (size_t i = 0; i < kN; ++i) q[w][i] += we[w][i];
      for (int r = 0; r < kRanks; ++r) {
        Vec err(L.end(r) - L.begin(r));
        sign_scale(q[w], L.begin(r), L.end(r), err);
        for (size_t i = 0; i < err.size(); ++i) we[w][L.begin(r) + i] = err[i];
      }
    }
    Vec out(kN, 0.0);
    for (int r = 0; r < kRanks; ++r) {
      for (size_t i = L.begin(r); i < L.end(r); ++i) {
        double a = 0;
        for (int w = 0; w < kRanks; ++w) a += q[w][i];
        out[i] = a / kRanks + se[r][i - L.begin(r)];
      }
      Vec err(L.end(r) - L.begin(r));
      sign_scale(out, L.begin(r), L.end(r), err);
      for (size_t i = 0; i < err.size(); ++i) se[r][i] = err[i];
    }
    for (Vec& r : x) r = out;
  }
  void reset() {
    for (Vec& e : we) std::fill(e.begin(), e.end(), 0.0);
    for (Vec& e : se) std::fill(e.begin(), e.end(), 0.0);
  }
};

// Runs `steps` updates of Opt on every rank; returns each rank's parameters after each step.
template <typename Opt, typename Config>
std::vector<std::vector<std::vector<float>>> run_ranks(const Config& config, int steps) {
  std::vector<std::vector<std::vector<float>>> out(kRanks, std::vector<std::vector<float>>(steps));
  std::vector<std::vector<float>> grads(kRanks);
  auto errs = comm::run_local_ranks(kRanks, [&](comm::Backend& b) {
    Opt opt(kN, segments(), config);
    Compressed ex(b);
    opt.set_exchange(&ex);
    std::vector<float> p = initial_params();
    for (int t = 1; t <= steps; ++t) {
      std::vector<float> g = grad_of(b.rank(), t);
      if (!opt.wants_local_gradients()) {  // the full-precision all-reduce's mean
        std::vector<float> g0 = grad_of(0, t), g1 = grad_of(1, t);
        for (size_t i = 0; i < kN; ++i) g[i] = (g0[i] + g1[i]) * 0.5f;
      }
      opt.step(p.data(), g.data(), nullptr, DType::kF32, static_cast<float>(lr_at(t)));
      out[b.rank()][t - 1] = p;
    }
  });
  for (auto& e : errs) EXPECT_EQ(e, nullptr);
  return out;
}

std::vector<Vec> ref_grads(int t) {
  std::vector<Vec> g(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    std::vector<float> f = grad_of(r, t);
    g[r] = Vec(f.begin(), f.end());
  }
  return g;
}

TEST(OneBitOptimizers, ZeroOneAdamTwoRanksMatchesDeepSpeedsStep) {
  ZeroOneAdamConfig c;
  c.var_freeze_step = 6;
  c.var_update_scaler = 2;
  c.local_step_scaler = 1;
  c.local_step_clipper = 2;
  const int steps = 12;
  auto got = run_ranks<ZeroOneAdam>(c, steps);
  testing::ZeroOneRef ref;
  ref.segs = ref_segments();
  std::vector<float> p0 = initial_params();
  ref.p = std::vector<Vec>(kRanks, Vec(p0.begin(), p0.end()));
  ref.m = ref.v = ref.cb = std::vector<Vec>(kRanks, Vec(kN, 0.0));
  RefCompressed avg;
  for (int t = 1; t <= steps; ++t) {
    const bool freezing = !ref.freeze;
    ref.step(ref_grads(t), static_cast<float>(lr_at(t)), [&](std::vector<Vec>& x) { avg(x); });
    if (freezing && ref.freeze) avg.reset();  // DeepSpeed zeroes the errors at the freeze
    for (int r = 0; r < kRanks; ++r)
      for (size_t i = 0; i < kN; ++i)
        ASSERT_NEAR(got[r][t - 1][i], ref.p[r][i], 5e-5 * (1.0 + std::fabs(ref.p[r][i])))
            << "rank " << r << " t " << t << " (" << ref.last_kind << ") i " << i;
  }
  // Local steps leave the ranks apart; a sync brings them together (to rounding: each rank undoes
  // its own local steps by subtracting their sum, as DeepSpeed does).
  auto gap = [&](int t) {
    float g = 0.0f;
    for (size_t i = 0; i < kN; ++i) g = std::max(g, std::fabs(got[0][t - 1][i] - got[1][t - 1][i]));
    return g;
  };
  EXPECT_EQ(ref.last_kind, 'L');
  EXPECT_GT(gap(steps), 1e-4f);
  EXPECT_LT(gap(steps - 1), 1e-6f);
}

TEST(OneBitOptimizers, OneBitLambTwoRanksMatchesDeepSpeedsStep) {
  OneBitLambConfig c;
  c.freeze_step = 4;
  const int steps = 10;
  auto got = run_ranks<OneBitLamb>(c, steps);
  testing::OneBitLambRef ref;
  ref.segs = ref_segments();
  std::vector<float> p0 = initial_params();
  ref.p = std::vector<Vec>(kRanks, Vec(p0.begin(), p0.end()));
  ref.m = ref.v = ref.vf = std::vector<Vec>(kRanks, Vec(kN, 0.0));
  RefCompressed avg;
  for (int t = 1; t <= steps; ++t) {
    ref.step(ref_grads(t), static_cast<float>(lr_at(t)), [&](std::vector<Vec>& x) { avg(x); });
    for (int r = 0; r < kRanks; ++r)
      for (size_t i = 0; i < kN; ++i)
        ASSERT_NEAR(got[r][t - 1][i], ref.p[r][i], 5e-5 * (1.0 + std::fabs(ref.p[r][i]))) << "rank " << r << " t " << t << " i " << i;
    EXPECT_EQ(got[0][t - 1], got[1][t - 1]) << "t " << t;  // the momentum exchange keeps them equal
  }
}

}  // namespace
}  // namespace mt::optim
