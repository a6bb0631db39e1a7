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
#include "comm/onebit_reference_test_util.h"
#include "optim/onebit_adam.h"
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

// What OneBitSync does (parallel/grad_sync.cpp): the compressed all-reduce with this rank's errors,
// of the flat buffer as one tensor (DeepSpeed's fp16 optimizer and 1-bit LAMB) or of each
// parameter tensor on its own (1-bit and 0/1 Adam in fp32).
std::vector<std::pair<size_t, size_t>> tensor_spans(bool per_tensor) {
  if (!per_tensor) return {{0, kN}};
  std::vector<std::pair<size_t, size_t>> out;
  for (const ParamSegment& s : segments()) out.emplace_back(s.offset, s.numel);
  return out;
}
struct Compressed : StateExchange {
  comm::Backend& b;
  comm::OneBitPlan plan;
  std::vector<float> we, se;
  Compressed(comm::Backend& backend, bool per_tensor)
      : b(backend), plan(tensor_spans(per_tensor), backend.size()), we(plan.worker_error_len, 0.0f), se(plan.server_error_len, 0.0f) {}
  void average(float* buf, size_t) override { comm::compressed_all_reduce(b, buf, plan, we.data(), se.data()); }
  void reset_errors() override {
    std::fill(we.begin(), we.end(), 0.0f);
    std::fill(se.begin(), se.end(), 0.0f);
  }
};

// DeepSpeed's compressed_allreduce (comm/onebit_reference_test_util.h) in double, on each tensor.
struct RefCompressed {
  bool per_tensor = false;
  std::vector<std::vector<Vec>> we, se;  // per tensor, per rank
  void operator()(std::vector<Vec>& x) {
    const auto spans = tensor_spans(per_tensor);
    we.resize(spans.size());
    se.resize(spans.size());
    for (size_t k = 0; k < spans.size(); ++k) {
      std::vector<Vec> part(x.size());
      for (size_t r = 0; r < x.size(); ++r)
        part[r].assign(x[r].begin() + static_cast<std::ptrdiff_t>(spans[k].first),
                       x[r].begin() + static_cast<std::ptrdiff_t>(spans[k].first + spans[k].second));
      comm::testing::ds_compressed_allreduce(part, we[k], se[k]);
      for (size_t r = 0; r < x.size(); ++r)
        std::copy(part[r].begin(), part[r].end(), x[r].begin() + static_cast<std::ptrdiff_t>(spans[k].first));
    }
  }
  void reset() {
    for (auto& t : we)
      for (Vec& e : t) std::fill(e.begin(), e.end(), 0.0);
    for (auto& t : se)
      for (Vec& e : t) std::fill(e.begin(), e.end(), 0.0);
  }
};

// Runs `steps` updates of Opt on every rank; returns each rank's parameters after each step.
template <typename Opt, typename Config>
std::vector<std::vector<std::vector<float>>> run_ranks(const Config& config, int steps, bool per_tensor = false) {
  std::vector<std::vector<std::vector<float>>> out(kRanks, std::vector<std::vector<float>>(steps));
  std::vector<std::vector<float>> grads(kRanks);
  auto errs = comm::run_local_ranks(kRanks, [&](comm::Backend& b) {
    Opt opt(kN, segments(), config);
    Compressed ex(b, per_tensor);
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

// 1-bit Adam on two ranks, its momentum compressed tensor by tensor (DeepSpeed in fp32) and as one
// flat buffer (DeepSpeed's fp16 optimizer), against DeepSpeed's step and compressed_allreduce.
TEST(OneBitOptimizers, OneBitAdamTwoRanksMatchesDeepSpeedsStep) {
  for (bool per_tensor : {true, false}) {
    OneBitAdamConfig c;
    c.bias_correction = false;
    c.freeze_step = 4;
    const int steps = 9;
    auto got = run_ranks<OneBitAdam>(c, steps, per_tensor);
    testing::OneBitAdamRef ref;
    ref.freeze_step = 4;
    ref.segs = ref_segments();
    std::vector<float> p0 = initial_params();
    ref.p = std::vector<Vec>(kRanks, Vec(p0.begin(), p0.end()));
    ref.m = ref.v = std::vector<Vec>(kRanks, Vec(kN, 0.0));
    RefCompressed avg;
    avg.per_tensor = per_tensor;
    for (int t = 1; t <= steps; ++t) {
      ref.step(ref_grads(t), static_cast<float>(lr_at(t)), [&](std::vector<Vec>& x) { avg(x); });
      for (int r = 0; r < kRanks; ++r)
        for (size_t i = 0; i < kN; ++i)
          ASSERT_NEAR(got[r][t - 1][i], ref.p[r][i], 5e-5 * (1.0 + std::fabs(ref.p[r][i])))
              << (per_tensor ? "per tensor" : "flat") << " rank " << r << " t " << t << " i " << i;
    }
  }
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
