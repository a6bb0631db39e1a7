// Dropout in every layout against one process with the same global batch (the masks are keyed by
// the sample's place in the global batch, the layer, the position and the feature or head:
// kernels/cpu/dropout.h): data parallelism with ZeRO 0-3, tensor and sequence parallelism (a
// rank's rows and heads), pipelines (a stage's layers, micro-batches run out of order), recompute
// (the forward's masks drawn again) and their mixes train the one-process run's losses and weights.
// The math itself is checked against PyTorch in golden_test (GoldenDropout).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "base/cpu_features.h"
#include "engine/layout_test_util.h"
#include "kernels/cpu/dropout.h"

namespace mt::engine {
namespace {

struct Case {
  const char* arch;
  int tp, pp, dp, stage;
  bool recompute;
  bool sp = false;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(c.arch) + "_tp" + std::to_string(c.tp) + "_pp" + std::to_string(c.pp) + "_dp" + std::to_string(c.dp) +
         "_stage" + std::to_string(c.stage) + (c.recompute ? "_recompute" : "") + (c.sp ? "_sp" : "");
}

nlohmann::json config(const Case& k, int processes, int g, bool dropout = true) {
  auto j = layout_config(layout_model(k.arch, 4).dump().c_str(), "fp32", processes == 1 ? 1 : processes / (k.tp * k.pp), g);
  if (dropout && std::string(k.arch) == "gpt2") {
    j["model"]["embd_pdrop"] = 0.1;
    j["model"]["resid_pdrop"] = 0.2;
    j["model"]["attn_pdrop"] = 0.3;
  } else if (dropout) {
    j["model"]["attention_dropout"] = 0.3;
  }
  if (k.recompute) j["activation_checkpointing"] = {{"enabled", true}};
  j["zero_optimization"] = {{"stage", processes == 1 ? 0 : k.stage}, {"reduce_bucket_size", 3000},
                            {"stage3_param_persistence_threshold", 0}, {"stage3_prefetch_bucket_size", 20000}};
  if (processes > 1) j["parallel"] = {{"tp", k.tp}, {"pp", k.pp}, {"sequence_parallel", k.sp}};
  return j;
}

class DropoutLayouts : public ::testing::TestWithParam<Case> {};

TEST_P(DropoutLayouts, TrainTheOneProcessRun) {
  const Case& k = GetParam();
  const int g = k.pp > 1 ? 4 : 2;  // a pipeline's micro-batches: more than its stages
  const int dp = k.dp;
  LayoutRun ref = layout_train(config(k, 1, g * dp), 1, g * dp, "dropout_test");
  LayoutRun got = layout_train(config(k, k.tp * k.pp * dp, g), k.tp * k.pp * dp, g, "dropout_test");
  // The reference does drop: it trains other weights than the same run without dropout.
  LayoutRun plain = layout_train(config(k, 1, g * dp, false), 1, g * dp, "dropout_test");
  ASSERT_EQ(ref.losses.size(), got.losses.size());
  EXPECT_GT(layout_compare(plain.master, ref.master, ref.noise).norm_rel, 1e-2) << "dropout changed nothing";
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * std::fabs(ref.losses[s])) << "loss at step " << s + 1;
    EXPECT_NEAR(got.norms[s], ref.norms[s], 1e-4 * ref.norms[s]) << "grad norm at step " << s + 1;
  }
  LayoutDiff w = layout_compare(ref.master, got.master, ref.noise);
  std::printf("%s: final weights ||dw||/||w|| %.2e, max %.2e\n", case_name({k, 0}).c_str(), w.norm_rel, w.max_rel);
  EXPECT_LE(w.norm_rel, 1e-5) << "final weights, ||dw||/||w||";
  EXPECT_LE(w.max_rel, 5e-5) << "final weights, max |dw| / max |w|";
  // Evaluation drops nothing, in every layout alike.
  EXPECT_NEAR(got.eval_loss, ref.eval_loss, 1e-5 * std::fabs(ref.eval_loss));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DropoutLayouts,
    ::testing::Values(Case{"gpt2", 1, 1, 2, 0, false}, Case{"gpt2", 1, 1, 2, 3, true}, Case{"gpt2", 2, 1, 1, 0, false},
                      Case{"gpt2", 2, 1, 1, 0, true, true}, Case{"gpt2", 2, 1, 2, 1, false, true},
                      Case{"gpt2", 1, 2, 1, 0, false}, Case{"gpt2", 2, 2, 1, 1, true, true},
                      Case{"llama", 2, 1, 1, 0, false}, Case{"llama", 1, 2, 2, 1, true}),
    case_name);

// The mask's rate and independence, by the textbook: a kept fraction within 5 standard deviations
// of 1 - p, the kept elements scaled by exactly 1 / (1 - p), two sites (and two steps) drawing
// masks that agree no more than independent ones would.
TEST(DropoutMask, KeepsOneMinusPAndSitesAreIndependent) {
  const size_t rows = 512;
  const int C = 1024;
  const double n = static_cast<double>(rows) * C;
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const kernels::DropRate rate(p);
    std::vector<float> a(rows * C, 1.0f), b(rows * C, 1.0f), c(rows * C, 1.0f);
    const uint64_t step1 = kernels::drop_step_key(1234, 1), step2 = kernels::drop_step_key(1234, 2);
    kernels::dropout_rows(a.data(), rows, C, kernels::drop_site_key(step1, 3, kernels::kDropMlpOut), rate, 0, 0, 16);
    kernels::dropout_rows(b.data(), rows, C, kernels::drop_site_key(step1, 3, kernels::kDropAttnOut), rate, 0, 0, 16);
    kernels::dropout_rows(c.data(), rows, C, kernels::drop_site_key(step2, 3, kernels::kDropMlpOut), rate, 0, 0, 16);
    double kept = 0, both_ab = 0, both_ac = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(a[i] == 0.0f || a[i] == rate.scale) << i;
      kept += a[i] != 0.0f;
      both_ab += a[i] != 0.0f && b[i] != 0.0f;
      both_ac += a[i] != 0.0f && c[i] != 0.0f;
    }
    const double q = 1.0 - p, sd = std::sqrt(n * q * (1 - q));
    EXPECT_NEAR(kept, n * q, 5 * sd) << "p " << p;
    const double sd2 = std::sqrt(n * q * q * (1 - q * q));
    EXPECT_NEAR(both_ab, n * q * q, 5 * sd2) << "p " << p << ": two sites";
    EXPECT_NEAR(both_ac, n * q * q, 5 * sd2) << "p " << p << ": two steps";
    EXPECT_FLOAT_EQ(rate.scale, 1.0f / (1.0f - p));
  }
  // Rows placed by their global position: rows 16-31 of a call from row 0 are a call from row 16.
  const kernels::DropRate rate(0.5f);
  std::vector<float> whole(32 * 8, 1.0f), half(16 * 8, 1.0f);
  kernels::dropout_rows(whole.data(), 32, 8, 77, rate, 5, 0, 16);
  kernels::dropout_rows(half.data(), 16, 8, 77, rate, 5, 16, 16);
  for (size_t i = 0; i < half.size(); ++i) EXPECT_EQ(half[i], whole[16 * 8 + i]) << i;
  // Ulysses' shares: positions 8-15 of samples 5 and 6 (t0 8, T 8) are those rows of the whole call.
  std::vector<float> share(16 * 8, 1.0f);
  kernels::dropout_rows(share.data(), 16, 8, 77, rate, 5, 0, 8, 8);
  for (size_t r = 0; r < 16; ++r)
    for (size_t c = 0; c < 8; ++c) EXPECT_EQ(share[r * 8 + c], whole[((r / 8) * 16 + 8 + r % 8) * 8 + c]) << r << " " << c;
  EXPECT_THROW(kernels::DropRate(1.0f), Error);
  EXPECT_THROW(kernels::DropRate(-0.1f), Error);
}

// The AVX-512 bodies keep exactly the elements the portable loops keep: rows of odd widths (the
// vector tails), and attention tiles in both orientations.
TEST(DropoutMask, VectorAndPortableBodiesKeepTheSameElements) {
  if (isa_detected() != Isa::kAvx512) GTEST_SKIP() << "no AVX-512 here";
  const kernels::DropRate rate(0.3f);
  auto run = [&](Isa isa) {
    isa_force(isa);
    std::vector<float> out;
    for (int C : {1, 7, 8, 13, 64}) {
      std::vector<float> x(9 * static_cast<size_t>(C));
      for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f + static_cast<float>(i);
      kernels::dropout_rows(x.data(), 9, C, 4242, rate, 3, 5, 4);
      out.insert(out.end(), x.begin(), x.end());
    }
    for (bool keys_major : {false, true}) {
      std::vector<float> t(64 * 64);
      for (size_t i = 0; i < t.size(); ++i) t[i] = 1.0f + static_cast<float>(i % 97);
      kernels::dropout_tile(t.data(), 64, keys_major, 61, 37, 99, rate, 2, 128, 64);
      out.insert(out.end(), t.begin(), t.end());
    }
    isa_force(isa_detected());
    return out;
  };
  const std::vector<float> vec = run(Isa::kAvx512), portable = run(Isa::kPortable);
  ASSERT_EQ(vec.size(), portable.size());
  for (size_t i = 0; i < vec.size(); ++i) ASSERT_EQ(vec[i], portable[i]) << i;
}

}  // namespace
}  // namespace mt::engine
