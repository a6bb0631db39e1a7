// SGD, AdamW with per-segment weight decay, Lamb and the OneCycle and LRRangeTest schedules
// against outside oracles: torch.optim.SGD and torch.optim.AdamW (param groups), a transcription of
// DeepSpeed's FusedLamb (deepspeed/ops/lamb/fused_lamb.py + csrc/lamb/fused_lamb_cuda_kernel.cu) and
// of DeepSpeed's OneCycle and LRRangeTest (deepspeed/runtime/lr_schedules.py). The golden numbers were printed by
//   /usr/bin/python3 tools/make_optim_golden.py
// (Debian's python3-torch 1.13, numpy 1.24) and pasted below; the inputs are formulas both sides
// evaluate the same way, so the test reads no file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/threads.h"
#include "optim/adamw.h"
#include "optim/lamb.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"

namespace mt::optim {
namespace {

// ---- golden numbers (tools/make_optim_golden.py) ----
// SGD: sizes {5, 3, 4}, weight decay {0.01, 0.0, 0.05}, grads x0.5, lr 0.1
// momentum 0.9, dampening 0.1
constexpr double kSgdMomentumParams[] = {-0.00836473517, 0.189246744, 0.375045389, -0.0518957824, -0.765068531, -0.854354858, -0.0792455748, 0.707120717, 0.656873226, 0.0964669958, -0.16127874, 0.0630527437};
constexpr double kSgdMomentumBuffer[] = {0.993882239, -0.754907191, -1.3877151, 0.0100885592, 1.37940896, 0.730987608, -1.00809908, -1.27031827, 0.441264242, 1.5207181, 0.459234118, -1.22690856};
// momentum 0.9, nesterov
constexpr double kSgdNesterovParams[] = {-0.141930535, 0.28243497, 0.55724442, -0.0473164655, -0.943149388, -0.955713272, 0.0473341644, 0.876199126, 0.603272796, -0.0980890542, -0.222123429, 0.219322413};
constexpr double kSgdNesterovBuffer[] = {1.07427824, -0.876569748, -1.53230262, 0.0541830659, 1.5463618, 0.780386448, -1.15212548, -1.39677083, 0.53831321, 1.68166709, 0.455274165, -1.38611102};
// AdamW: sizes {6, 4, 5}, weight decay {0.1, 0.0, 0.1}, lr 0.01, betas (0.9, 0.95), eps 1e-8
constexpr double kAdamWParams[] = {0.430205882, 0.249566391, -0.0189554505, -0.333199024, -0.508048534, -0.436436802, -0.117330633, 0.28054893, 0.492349684, 0.455746561, 0.221882775, -0.0759756938, -0.326698899, -0.474801123, -0.432242423};
// Lamb: sizes {6, 4, 5, 3}, weight scales {1, 0, 1000, 1e-4}, weight decay {0.01, 0, 0.1, 0.05}
// lr 0.01, betas (0.9, 0.999), eps 1e-6 outside sqrt, bias correction, no clipping, scale 1
constexpr double kLambParams[] = {0.456727952, 0.263284236, -0.0429096371, -0.354335815, -0.507054627, -0.414870769, -0.00999351032, 0.0105079403, 0.0102337999, 0.00957606174, 249.858521, -69.2374115, -355.668365, -475.318176, -371.730957, -0.000367889239, 8.68528659e-05, 0.000488381076};
constexpr double kLambExpAvg[] = {0.213187993, -0.176424026, -0.307574421, 0.0118724257, 0.31392616, 0.156077325, -0.230425149, -0.279354244, 0.0809712857, 0.322673678, 0.0916583762, -0.273636669, -0.238053322, 0.146278694, 0.316312104, 0.0229475349, -0.304035217, -0.185605705};
constexpr double kLambExpAvgSq[] = {0.00364766456, 0.00491259992, 0.00378252659, 0.0044542863, 0.00443311315, 0.00379763916, 0.00490787299, 0.0036406531, 0.00470215222, 0.00415019877, 0.00403462444, 0.00478464644, 0.00361485058, 0.0048695989, 0.00388903543, 0.00431475509, 0.00456572929, 0.0037098953};
constexpr double kLambCoeffsStep1[] = {0.374964356, 1, 9.88852978, 0.00999999978};
constexpr double kLambCoeffs[] = {0.621357918, 0.0152995503, 10, 0.00999999978};
// lr 0.02, betas (0.8, 0.99), eps 1e-4 inside sqrt, no bias correction, max_grad_norm 1.5,
// scale 2 (grad_scale 0.5 here)
constexpr double kLambClipParams[] = {0.436665922, 0.258154482, -0.0231445283, -0.341799676, -0.516358495, -0.43320927, -0.0385820381, 0.0386970565, 0.04064757, 0.0224458091, 236.450119, -65.6528397, -336.818542, -451.949463, -355.519714, -0.00169184443, 0.000737807248, 0.00227509369};
constexpr double kLambClipCoeffs[] = {0.205362767, 0.0176474452, 10, 0.00999999978};
// OneCycle at iterations -1..24: min_lr 0.01, max_lr 0.1, first 4, second 6, decay_step_size 3,
// decay_lr_rate 0.5, min_mom 0.85, max_mom 0.95, decay_mom_rate 0.02
constexpr double kOneCycleLr[] = {0.01, 0.032500000000000022, 0.055, 0.077500000000000013, 0.099999999999999992, 0.085000000000000006, 0.069999999999999993, 0.055000000000000014, 0.039999999999999994, 0.025000000000000015, 0.01, 0.0085714285714285719, 0.0075000000000000006, 0.0066666666666666671, 0.006000000000000001, 0.0054545454545454541, 0.0050000000000000001, 0.0046153846153846149, 0.0042857142857142859, 0.0040000000000000001, 0.0037499999999999999, 0.0035294117647058829, 0.0033333333333333335, 0.0031578947368421056, 0.0030000000000000001, 0.0028571428571428571};
constexpr double kOneCycleMom[] = {0.84999999999999998, 0.92499999999999993, 0.90000000000000002, 0.875, 0.84999999999999998, 0.8666666666666667, 0.8833333333333333, 0.89999999999999991, 0.91666666666666663, 0.93333333333333324, 0.94999999999999996, 0.95633333333333326, 0.96266666666666667, 0.96899999999999997, 0.97533333333333327, 0.98166666666666669, 0.98799999999999999, 0.99433333333333329, 1.0006666666666666, 1.0069999999999999, 1.0133333333333332, 1.0196666666666665, 1.026, 1.0323333333333333, 1.0386666666666666, 1.0449999999999999};
// OneCycle at iterations -1..14: min_lr 1e-4, max_lr 1e-3, first 5, second None, no decay
constexpr double kOneCycleNoDecayLr[] = {0.0001, 0.00028000000000000014, 0.00045999999999999991, 0.00064000000000000016, 0.00081999999999999987, 0.001, 0.00081999999999999987, 0.00064000000000000016, 0.00045999999999999991, 0.00028000000000000014, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001};
constexpr double kOneCycleNoDecayMom[] = {0.80000000000000004, 0.88, 0.8600000000000001, 0.84000000000000008, 0.82000000000000006, 0.80000000000000004, 0.82000000000000006, 0.84000000000000008, 0.8600000000000001, 0.88, 0.90000000000000002, 0.90000000000000002, 0.90000000000000002, 0.90000000000000002, 0.90000000000000002, 0.90000000000000002};
// OneCycle's staircase (DeepSpeed 22779f2) at iterations -1..24: the first case with 2 stairs rising
// and 3 falling; then first 5 with 4 stairs, second None (the first's count), no decay
constexpr double kOneCycleStairLr[] = {0.01, 0.01, 0.055000000000000007, 0.055000000000000007, 0.10000000000000001, 0.070000000000000007, 0.070000000000000007, 0.040000000000000001, 0.040000000000000001, 0.01, 0.01, 0.0085714285714285719, 0.0075000000000000006, 0.0066666666666666671, 0.006000000000000001, 0.0054545454545454541, 0.0050000000000000001, 0.0046153846153846149, 0.0042857142857142859, 0.0040000000000000001, 0.0037499999999999999, 0.0035294117647058829, 0.0033333333333333335, 0.0031578947368421056, 0.0030000000000000001, 0.0028571428571428571};
constexpr double kOneCycleStairMom[] = {0.84999999999999998, 0.94999999999999996, 0.89999999999999991, 0.89999999999999991, 0.84999999999999998, 0.8833333333333333, 0.8833333333333333, 0.91666666666666663, 0.91666666666666663, 0.94999999999999996, 0.94999999999999996, 0.95633333333333326, 0.96266666666666667, 0.96899999999999997, 0.97533333333333327, 0.98166666666666669, 0.98799999999999999, 0.99433333333333329, 1.0006666666666666, 1.0069999999999999, 1.0133333333333332, 1.0196666666666665, 1.026, 1.0323333333333333, 1.0386666666666666, 1.0449999999999999};
constexpr double kOneCycleStairNoneLr[] = {0.0001, 0.0001, 0.00032499999999999999, 0.00055000000000000003, 0.00077500000000000008, 0.001, 0.00077500000000000008, 0.00055000000000000003, 0.00032499999999999999, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001};
// WarmupCosineLR (lr 1e-3, DeepSpeed 22779f2: the progress clamped at 1) at iterations -1..13: total 6,
// warmup 2 linear, cos_min_ratio 0.1; then total 3 <= warmup 3 (log), iterations -1..7
constexpr double kCosinePastTotal[] = {0, 0, 0.00050000000000000001, 0.00086819805153394642, 0.00055000000000000003, 0.00023180194846605365, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001};
constexpr double kCosineNoWindow[] = {0, 0, 0.00063092975357145731, 0.001, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001};
// LRRangeTest at iterations -1..9: min_lr 0.002, step_size 3, step_rate 0.5, continuous
constexpr double kLrRangeTest[] = {0.002, 0.0023333333333333335, 0.0026666666666666666, 0.0030000000000000001, 0.0033333333333333331, 0.003666666666666667, 0.0040000000000000001, 0.004333333333333334, 0.0046666666666666662, 0.0050000000000000001, 0.005333333333333334};
// the same, staircase
constexpr double kLrRangeTestStaircase[] = {0.002, 0.002, 0.002, 0.0030000000000000001, 0.0030000000000000001, 0.0030000000000000001, 0.0040000000000000001, 0.0040000000000000001, 0.0040000000000000001, 0.0050000000000000001, 0.0050000000000000001};

constexpr int kSteps = 5;

// p0[i] = f32(scale_k * 0.5 * cos(0.7 i + 0.3)) over consecutive segments of the given sizes.
std::vector<float> init_params(const std::vector<size_t>& sizes, const std::vector<double>& scales) {
  std::vector<float> p;
  for (size_t k = 0; k < sizes.size(); ++k)
    for (size_t j = 0; j < sizes[k]; ++j) {
      const double i = static_cast<double>(p.size());
      p.push_back(static_cast<float>(scales[k] * 0.5 * std::cos(0.7 * i + 0.3)));
    }
  return p;
}

// g_t[i] = f32(sin(1.3 i + 0.7 t) * (1 + 0.1 t))
std::vector<float> grads(size_t n, int t) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i)
    g[i] = static_cast<float>(std::sin(1.3 * static_cast<double>(i) + 0.7 * t) * (1.0 + 0.1 * t));
  return g;
}

std::vector<ParamSegment> segments_of(const std::vector<size_t>& sizes, const std::vector<float>& decays) {
  std::vector<ParamSegment> s;
  size_t off = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::string name = "p";  // NOTE: "p" + std::to_string(k) trips GCC 12's false -Wrestrict at -O3
    name += std::to_string(k);
    s.push_back({off, sizes[k], decays[k], name});
    off += sizes[k];
  }
  return s;
}

size_t total(const std::vector<size_t>& sizes) {
  size_t n = 0;
  for (size_t s : sizes) n += s;
  return n;
}

// |got - want| <= rel * |want| + abs, element by element.
void expect_close(const float* got, const double* want, size_t n, double rel, double abs, const std::string& what) {
  for (size_t i = 0; i < n; ++i)
    ASSERT_NEAR(got[i], want[i], rel * std::fabs(want[i]) + abs) << what << " element " << i;
}

// Runs kSteps steps of opt on the golden inputs; returns the final weights.
std::vector<float> run_steps(Optimizer& opt, std::vector<float> p, float lr, float grad_scale) {
  for (int t = 1; t <= kSteps; ++t) {
    std::vector<float> g = grads(p.size(), t);
    opt.step(p.data(), g.data(), nullptr, DType::kF32, lr, grad_scale);
  }
  return p;
}

constexpr double kRel = 1e-6;
constexpr double kAbs = 1e-9;

// ---- SGD vs torch.optim.SGD ----

const std::vector<size_t> kSgdSizes = {5, 3, 4};
const std::vector<float> kSgdDecays = {0.01f, 0.0f, 0.05f};

TEST(Sgd, MomentumDampeningWeightDecayMatchesTorch) {
  SgdConfig c;
  c.lr = 0.1;
  c.momentum = 0.9;
  c.dampening = 0.1;
  Sgd opt(total(kSgdSizes), segments_of(kSgdSizes, kSgdDecays), c);
  std::vector<float> p = run_steps(opt, init_params(kSgdSizes, {1, 1, 1}), 0.1f, 0.5f);
  expect_close(p.data(), kSgdMomentumParams, p.size(), kRel, kAbs, "params");
  ASSERT_EQ(opt.state().size(), 1u);
  EXPECT_EQ(opt.state()[0].name, "momentum_buffer");
  expect_close(opt.state()[0].data, kSgdMomentumBuffer, p.size(), kRel, kAbs, "momentum_buffer");
  EXPECT_EQ(opt.step_count(), kSteps);
}

TEST(Sgd, NesterovMatchesTorch) {
  SgdConfig c;
  c.lr = 0.1;
  c.momentum = 0.9;
  c.nesterov = true;
  Sgd opt(total(kSgdSizes), segments_of(kSgdSizes, kSgdDecays), c);
  std::vector<float> p = run_steps(opt, init_params(kSgdSizes, {1, 1, 1}), 0.1f, 0.5f);
  expect_close(p.data(), kSgdNesterovParams, p.size(), kRel, kAbs, "params");
  expect_close(opt.state()[0].data, kSgdNesterovBuffer, p.size(), kRel, kAbs, "momentum_buffer");
}

TEST(Sgd, PlainSgdHasNoStateAndIsTheTextbookStep) {
  SgdConfig c;
  Sgd opt(3, single_segment(3, 0.0f), c);
  EXPECT_TRUE(opt.state().empty());
  std::vector<float> p = {1.0f, 2.0f, 3.0f}, g = {0.5f, -1.0f, 2.0f};
  opt.step(p.data(), g.data(), nullptr, DType::kF32, 0.25f);
  EXPECT_FLOAT_EQ(p[0], 1.0f - 0.125f);
  EXPECT_FLOAT_EQ(p[1], 2.25f);
  EXPECT_FLOAT_EQ(p[2], 2.5f);
  EXPECT_FALSE(opt.has_betas());
  EXPECT_THROW(opt.set_betas(0.9, 0.99), Error);
}

TEST(Sgd, RejectsWhatTorchRejects) {
  SgdConfig c;
  c.nesterov = true;  // without momentum
  EXPECT_THROW(Sgd(4, single_segment(4, 0.0f), c), Error);
  c.momentum = 0.9;
  c.dampening = 0.1;  // nesterov with dampening
  EXPECT_THROW(Sgd(4, single_segment(4, 0.0f), c), Error);
  c = SgdConfig{};
  c.momentum = -0.5;
  EXPECT_THROW(Sgd(4, single_segment(4, 0.0f), c), Error);
  c = SgdConfig{};
  c.lr = -1.0;
  EXPECT_THROW(Sgd(4, single_segment(4, 0.0f), c), Error);
  c = SgdConfig{};
  EXPECT_THROW(Sgd(4, single_segment(4, -0.1f), c), Error);
}

// ---- AdamW with per-segment weight decay vs torch.optim.AdamW with two param groups ----

TEST(AdamWSegments, PerSegmentWeightDecayMatchesTorchParamGroups) {
  const std::vector<size_t> sizes = {6, 4, 5};
  AdamWConfig c{0.01f, 0.9f, 0.95f, 1e-8f, 0.5f};  // c.weight_decay is not used with segments
  AdamW opt(total(sizes), segments_of(sizes, {0.1f, 0.0f, 0.1f}), c);
  std::vector<float> p = run_steps(opt, init_params(sizes, {1, 1, 1}), 0.01f, 1.0f);
  expect_close(p.data(), kAdamWParams, p.size(), kRel, kAbs, "params");
  std::vector<StateBuffer> st = opt.state();
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].name, "exp_avg");
  EXPECT_EQ(st[0].data, opt.exp_avg());
  EXPECT_EQ(st[1].name, "exp_avg_sq");
  EXPECT_EQ(st[1].data, opt.exp_avg_sq());
}

TEST(AdamWSegments, EqualDecaysMergeIntoOneRun) {
  std::vector<ParamSegment> s = segments_of({3, 0, 4, 2}, {0.1f, 0.0f, 0.1f, 0.1f});
  std::vector<DecayRun> runs = decay_runs(s);
  ASSERT_EQ(runs.size(), 1u);  // the empty segment does not split the run
  EXPECT_EQ(runs[0].numel, 9u);
  runs = decay_runs(segments_of({3, 4, 2}, {0.1f, 0.0f, 0.1f}));
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[1].offset, 3u);
  EXPECT_EQ(runs[1].weight_decay, 0.0f);
}

TEST(AdamWSegments, UniformSegmentsEqualTheOneSpanConstructorBitForBit) {
  const std::vector<size_t> sizes = {6, 4, 5};
  AdamWConfig c{0.01f, 0.9f, 0.95f, 1e-8f, 0.1f};
  AdamW one(total(sizes), c);
  AdamW segs(total(sizes), segments_of(sizes, {0.1f, 0.1f, 0.1f}), c);
  std::vector<float> a = run_steps(one, init_params(sizes, {1, 1, 1}), 0.01f, 0.5f);
  std::vector<float> b = run_steps(segs, init_params(sizes, {1, 1, 1}), 0.01f, 0.5f);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

TEST(AdamWSegments, SetBetasAndMomentum) {
  AdamW opt(4, AdamWConfig{});
  EXPECT_TRUE(opt.has_betas());
  opt.set_betas(0.85, kOneCycleBeta2);
  EXPECT_FLOAT_EQ(opt.config().beta1, 0.85f);
  EXPECT_FLOAT_EQ(opt.config().beta2, 0.99f);
  opt.set_momentum(0.9);
  EXPECT_FLOAT_EQ(opt.config().beta1, 0.9f);
}

// ---- Lamb vs DeepSpeed's FusedLamb ----

const std::vector<size_t> kLambSizes = {6, 4, 5, 3};
const std::vector<double> kLambScales = {1.0, 0.0, 1000.0, 1e-4};  // segment 1 starts all zero
const std::vector<float> kLambDecays = {0.01f, 0.0f, 0.1f, 0.05f};

TEST(Lamb, MatchesDeepSpeedFusedLamb) {
  LambConfig c;
  c.lr = 0.01;
  c.eps = 1e-6;
  Lamb opt(total(kLambSizes), segments_of(kLambSizes, kLambDecays), c);
  std::vector<float> p = init_params(kLambSizes, kLambScales);
  for (int t = 1; t <= kSteps; ++t) {
    std::vector<float> g = grads(p.size(), t);
    opt.step(p.data(), g.data(), nullptr, DType::kF32, 0.01f, 1.0f);
    if (t == 1) {
      // Segment 1's weights are zero: DeepSpeed's trust ratio falls back to 1 (not w/u = 0 -> 0.01).
      std::vector<float> coeffs = opt.lamb_coeffs();
      expect_close(coeffs.data(), kLambCoeffsStep1, coeffs.size(), kRel, 0.0, "step-1 lamb coeffs");
      EXPECT_EQ(coeffs[1], 1.0f);
    }
  }
  expect_close(p.data(), kLambParams, p.size(), kRel, kAbs, "params");
  std::vector<StateBuffer> st = opt.state();
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].name, "exp_avg");
  expect_close(st[0].data, kLambExpAvg, p.size(), kRel, kAbs, "exp_avg");
  expect_close(st[1].data, kLambExpAvgSq, p.size(), kRel, kAbs, "exp_avg_sq");
  std::vector<float> coeffs = opt.lamb_coeffs();
  expect_close(coeffs.data(), kLambCoeffs, coeffs.size(), kRel, 0.0, "lamb coeffs");
  EXPECT_EQ(coeffs[2], 10.0f);   // clamped to max_coeff
  EXPECT_EQ(coeffs[3], 0.01f);   // clamped to min_coeff
}

TEST(Lamb, ClippingEpsInsideSqrtNoBiasCorrectionMatchDeepSpeed) {
  LambConfig c;
  c.lr = 0.02;
  c.beta1 = 0.8;
  c.beta2 = 0.99;
  c.eps = 1e-4;
  c.eps_inside_sqrt = true;
  c.bias_correction = false;
  c.max_grad_norm = 1.5;
  Lamb opt(total(kLambSizes), segments_of(kLambSizes, kLambDecays), c);
  std::vector<float> p = run_steps(opt, init_params(kLambSizes, kLambScales), 0.02f, 0.5f);
  expect_close(p.data(), kLambClipParams, p.size(), kRel, kAbs, "params");
  std::vector<float> coeffs = opt.lamb_coeffs();
  expect_close(coeffs.data(), kLambClipCoeffs, coeffs.size(), kRel, 0.0, "lamb coeffs");
}

TEST(Lamb, ZeroWeightsAndZeroGradientsKeepCoefficientOne) {
  Lamb opt(8, segments_of({5, 3}, {0.1f, 0.1f}), LambConfig{});
  std::vector<float> p(8, 0.0f), g(8, 0.0f);
  for (int i = 0; i < 5; ++i) g[i] = 1.0f;  // segment 0: zero weights, non-zero update
  opt.step(p.data(), g.data(), nullptr, DType::kF32, 0.1f);
  EXPECT_EQ(opt.lamb_coeffs()[0], 1.0f);
  EXPECT_EQ(opt.lamb_coeffs()[1], 1.0f);  // both norms zero
  for (int i = 5; i < 8; ++i) EXPECT_EQ(p[i], 0.0f);
  // Step 1: m = 0.1, v = 0.001, step_size = lr sqrt(0.001) / 0.1, u = 0.1 / (sqrt(0.001) + 1e-8).
  const double u = 0.1 / (std::sqrt(0.001) + 1e-8);
  EXPECT_NEAR(p[0], -0.1 * std::sqrt(0.001) / 0.1 * u, 1e-6);
}

TEST(Lamb, ResultDoesNotDependOnThreadCountAndFillsLowp) {
  const std::vector<size_t> sizes = {40000, 7, 50000};  // segments over several chunks
  const size_t n = total(sizes);
  std::vector<float> out[2];
  std::vector<uint16_t> lowp(n);
  const int saved = threads_get();
  for (int k = 0; k < 2; ++k) {
    threads_set(k == 0 ? 1 : 2);
    std::fill(lowp.begin(), lowp.end(), uint16_t{0});  // each run writes every element
    Lamb opt(n, segments_of(sizes, {0.01f, 0.0f, 0.01f}), LambConfig{});
    std::vector<float> p = init_params(sizes, {1, 1, 1});
    for (int t = 1; t <= 2; ++t) {
      std::vector<float> g = grads(n, t);
      opt.step(p.data(), g.data(), lowp.data(), DType::kBF16, 0.01f, 0.5f);
    }
    out[k] = p;
  }
  threads_set(saved);
  EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), n * 4), 0);
  for (size_t i = 0; i < n; i += 997)
    ASSERT_EQ(lowp[i], f32_to_bf16(out[1][i]).bits) << "element " << i;
}

// The 1-bit optimizers past their warm-up (one rank: no exchange) run their own loops over the
// threads and 1-bit LAMB's refresh in chunks: the same values on one thread and on two, and the
// compute-dtype copy of every element.
TEST(OneBitOptimizers, CompressedPhaseDoesNotDependOnThreadCount) {
  const std::vector<size_t> sizes = {40000, 7, 50000};  // over several chunks and past the threads' threshold
  const size_t n = total(sizes);
  const int saved = threads_get();
  for (const char* type : {"OneBitAdam", "ZeroOneAdam", "OneBitLamb"}) {
    OptimizerSpec spec;
    spec.type = type;
    spec.freeze_step = 2;
    spec.var_freeze_step = 2;
    std::vector<float> out[2];
    std::vector<uint16_t> lowp(n);
    for (int k = 0; k < 2; ++k) {
      threads_set(k == 0 ? 1 : 2);
      std::fill(lowp.begin(), lowp.end(), uint16_t{0});
      auto opt = make_optimizer(spec, n, segments_of(sizes, {0.01f, 0.0f, 0.01f}));
      std::vector<float> p = init_params(sizes, {1, 1, 1});
      for (int t = 1; t <= 6; ++t) {
        std::vector<float> g = grads(n, t);
        opt->step(p.data(), g.data(), lowp.data(), DType::kBF16, 0.01f, 0.5f);
      }
      out[k] = p;
    }
    EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), n * 4), 0) << type;
    for (size_t i = 0; i < n; i += 997) ASSERT_EQ(lowp[i], f32_to_bf16(out[1][i]).bits) << type << " element " << i;
  }
  threads_set(saved);
}

// ---- checkpoints: state() and step_count() resume any optimizer exactly ----

TEST(OptimizerState, SavingAndRestoringStateResumesBitForBit) {
  const std::vector<size_t> sizes = {6, 4, 5, 3};
  const size_t n = total(sizes);
  for (const char* type : {"AdamW", "SGD", "Lamb"}) {
    OptimizerSpec spec;
    spec.type = type;
    spec.momentum = 0.9;
    auto make = [&] { return make_optimizer(spec, n, segments_of(sizes, {0.01f, 0.0f, 0.1f, 0.05f})); };
    std::unique_ptr<Optimizer> straight = make(), first = make(), resumed = make();
    std::vector<float> p = init_params(sizes, {1, 1, 1, 1}), q = p;
    for (int t = 1; t <= kSteps; ++t) {
      std::vector<float> g = grads(n, t);
      straight->step(p.data(), g.data(), nullptr, DType::kF32, 0.01f);
      if (t <= 2) first->step(q.data(), g.data(), nullptr, DType::kF32, 0.01f);
      if (t == 2) {  // "checkpoint": copy the state buffers and the step count
        std::vector<StateBuffer> from = first->state(), to = resumed->state();
        ASSERT_EQ(from.size(), to.size()) << type;
        for (size_t k = 0; k < from.size(); ++k) {
          ASSERT_EQ(from[k].name, to[k].name);
          std::memcpy(to[k].data, from[k].data, from[k].numel * 4);
        }
        resumed->set_step_count(first->step_count());
      }
      if (t > 2) resumed->step(q.data(), g.data(), nullptr, DType::kF32, 0.01f);
    }
    EXPECT_EQ(std::memcmp(p.data(), q.data(), n * 4), 0) << type;
    EXPECT_EQ(resumed->step_count(), kSteps) << type;
  }
}

// ---- the factory ----

TEST(MakeOptimizer, BuildsEachTypeAndRefusesOthers) {
  OptimizerSpec spec;
  for (auto [type, name] : {std::pair{"AdamW", "AdamW"}, {"adam", "AdamW"}, {"SGD", "SGD"}, {"Lamb", "Lamb"}}) {
    spec.type = type;
    EXPECT_STREQ(make_optimizer(spec, 4, single_segment(4, 0.0f))->type_name(), name) << type;
  }
  spec.type = "Adagrad";
  try {
    make_optimizer(spec, 4, single_segment(4, 0.0f));
    ADD_FAILURE() << "Adagrad accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotSupported);
  }
}

// Adam's L2 decay (DeepSpeed's Adam with adam_w_mode false, torch.optim.Adam's weight_decay; refused
// until stop 77): g = grad * scale + wd p, then Adam's moments and step with no decoupled decay,
// computed here in double. 37 elements: the vector kernel's lanes and its tail; two segments, the
// second without decay (Hugging Face's no-decay group).
TEST(AdamL2, AddsTheDecayToTheGradient) {
  const size_t n = 37, n1 = 20;
  OptimizerSpec spec;
  spec.type = "Adam";
  spec.adam_w_mode = false;
  spec.lr = 0.01;
  spec.weight_decay = 0.5;
  spec.beta1 = 0.9;
  spec.beta2 = 0.95;
  spec.eps = 1e-8;
  const std::vector<ParamSegment> segs = {{0, n1, 0.5f, "decay"}, {n1, n - n1, 0.0f, "no_decay"}};
  const double scale = 0.5;
  auto init = [](size_t i) { return 0.05f * static_cast<float>(i) - 0.9f; };
  auto grad = [](size_t i, int t) { return 0.01f * std::sin(0.7f * static_cast<float>(i + 1) * static_cast<float>(t)); };
  auto four_steps = [&](const OptimizerSpec& sp) {
    auto o = make_optimizer(sp, n, segs);
    std::vector<float> w(n), g(n);
    for (size_t i = 0; i < n; ++i) w[i] = init(i);
    for (int t = 1; t <= 4; ++t) {
      for (size_t i = 0; i < n; ++i) g[i] = grad(i, t);
      o->step(w.data(), g.data(), nullptr, DType::kF32, 0.01f, static_cast<float>(scale));
    }
    return w;
  };
  const std::vector<float> p = four_steps(spec);
  std::vector<double> pd(n), m(n, 0.0), v(n, 0.0);
  for (size_t i = 0; i < n; ++i) pd[i] = init(i);
  for (int t = 1; t <= 4; ++t) {
    const double bc1 = 1.0 - std::pow(0.9, t), bc2 = 1.0 - std::pow(0.95, t);
    for (size_t i = 0; i < n; ++i) {
      const double gi = grad(i, t) * scale + (i < n1 ? 0.5 * pd[i] : 0.0);
      m[i] = 0.9 * m[i] + 0.1 * gi;
      v[i] = 0.95 * v[i] + 0.05 * gi * gi;
      pd[i] -= 0.01 / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + 1e-8);
    }
  }
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], pd[i], 2e-6) << i;
  // AdamW's decoupled decay moves the decayed weights elsewhere (the flag is read); the undecayed
  // segment is the same step either way.
  spec.type = "AdamW";
  spec.adam_w_mode = true;
  const std::vector<float> q = four_steps(spec);
  EXPECT_GT(std::fabs(q[0] - p[0]), 1e-2);
  EXPECT_EQ(q[n - 1], p[n - 1]);
  // The flag is Adam's alone: type AdamW with adam_w_mode false is AdamW, as DeepSpeed's engine
  // builds it.
  spec.adam_w_mode = false;
  EXPECT_EQ(four_steps(spec), q);
}

// DeepSpeed's Adam/AdamW with "bias_correction": false (FusedAdam): the textbook step without the
// 1 - beta^t factors, p = p (1 - lr wd) - lr m / (sqrt(v) + eps), computed here in double.
TEST(AdamWNoBiasCorrection, IsTheTextbookStepWithoutCorrection) {
  const size_t n = 7;
  OptimizerSpec spec;
  spec.type = "AdamW";
  spec.lr = 0.01;
  spec.weight_decay = 0.1;
  spec.beta1 = 0.8;
  spec.beta2 = 0.9;
  spec.eps = 1e-6;
  spec.bias_correction = false;
  auto opt = make_optimizer(spec, n, single_segment(n, 0.1f));
  std::vector<float> p(n), g(n);
  std::vector<double> pd(n), m(n, 0.0), v(n, 0.0);
  for (size_t i = 0; i < n; ++i) pd[i] = p[i] = 0.25f * static_cast<float>(i) - 0.7f;
  for (int t = 1; t <= 4; ++t) {
    for (size_t i = 0; i < n; ++i) g[i] = std::sin(0.7f * static_cast<float>(i + 1) * static_cast<float>(t));
    opt->step(p.data(), g.data(), nullptr, DType::kF32, 0.01f, 1.0f);
    for (size_t i = 0; i < n; ++i) {
      const double gi = g[i];
      m[i] = 0.8 * m[i] + 0.2 * gi;
      v[i] = 0.9 * v[i] + 0.1 * gi * gi;
      pd[i] = pd[i] * (1.0 - 0.01 * 0.1) - 0.01 * m[i] / (std::sqrt(v[i]) + 1e-6);
    }
  }
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], pd[i], 2e-6) << i;
  // ...and it differs from the corrected step (the flag is read).
  auto uncorrected = make_optimizer(spec, n, single_segment(n, 0.1f));
  spec.bias_correction = true;
  auto corrected = make_optimizer(spec, n, single_segment(n, 0.1f));
  std::vector<float> q(n, 0.5f), gq(n, 1.0f);
  std::vector<float> r = q;
  corrected->step(q.data(), gq.data(), nullptr, DType::kF32, 0.01f, 1.0f);
  uncorrected->step(r.data(), gq.data(), nullptr, DType::kF32, 0.01f, 1.0f);
  EXPECT_GT(std::fabs(q[0] - r[0]), 1e-4);
}

TEST(MakeOptimizer, SegmentsMustCoverTheSpanInOrder) {
  OptimizerSpec spec;
  try {
    make_optimizer(spec, 10, {{0, 4, 0.0f, "a"}, {5, 5, 0.0f, "b"}});  // gap at 4
    ADD_FAILURE() << "gap accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'b'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_optimizer(spec, 10, {{0, 4, 0.0f, "a"}}), Error);  // short
  EXPECT_NO_THROW(make_optimizer(spec, 10, {{0, 4, 0.0f, "a"}, {4, 6, 0.1f, "b"}}));
}

// ---- OneCycle vs DeepSpeed's OneCycle ----

// The golden traces' OneCycle: min_lr 0.01, max_lr 0.1, first 4, second 6, decay_step_size 3,
// decay_lr_rate 0.5, min_mom 0.85, max_mom 0.95, decay_mom_rate 0.02 (tools/make_optim_golden.py).
LrScheduleConfig one_cycle_with_decay() {
  return LrScheduleConfig{.type = LrScheduleType::kOneCycle, .cycle_min_lr = 0.01, .cycle_max_lr = 0.1,
                          .decay_lr_rate = 0.5, .cycle_first_step_size = 4, .cycle_second_step_size = 6,
                          .decay_step_size = 3, .cycle_min_mom = 0.85, .cycle_max_mom = 0.95, .decay_mom_rate = 0.02};
}

TEST(OneCycle, LrAndMomentumMatchDeepSpeedThroughCycleAndDecay) {
  const LrScheduleConfig c = one_cycle_with_decay();
  EXPECT_NO_THROW(lr_schedule_check(c));
  for (int64_t i = -1; i < 25; ++i) {
    const size_t k = static_cast<size_t>(i + 1);
    EXPECT_NEAR(lr_at_iteration(c, i), kOneCycleLr[k], 1e-12 * kOneCycleLr[k]) << "iteration " << i;
    std::optional<double> m = momentum_at_iteration(c, i);
    ASSERT_TRUE(m.has_value());
    EXPECT_NEAR(*m, kOneCycleMom[k], 1e-12 * kOneCycleMom[k]) << "iteration " << i;
    EXPECT_EQ(lr_for_step(c, i + 2), lr_at_iteration(c, i));
    EXPECT_EQ(*momentum_for_step(c, i + 2), *m);
  }
}

TEST(OneCycle, SecondStepNoneAndNoDecayMatchDeepSpeed) {
  LrScheduleConfig c;
  c.type = LrScheduleType::kOneCycle;
  c.cycle_min_lr = 1e-4;
  c.cycle_max_lr = 1e-3;
  c.cycle_first_step_size = 5;
  for (int64_t i = -1; i < 15; ++i) {
    const size_t k = static_cast<size_t>(i + 1);
    EXPECT_NEAR(lr_at_iteration(c, i), kOneCycleNoDecayLr[k], 1e-12 * kOneCycleNoDecayLr[k]) << "iteration " << i;
    EXPECT_NEAR(*momentum_at_iteration(c, i), kOneCycleNoDecayMom[k], 1e-12) << "iteration " << i;
  }
}

// The stair counts hold lr and momentum flat over parts of each half cycle (they were read and not
// used: the schedule moved every step).
TEST(OneCycle, StairCountsMatchDeepSpeedsStaircase) {
  LrScheduleConfig c = one_cycle_with_decay();
  c.cycle_first_stair_count = 2;
  c.cycle_second_stair_count = 3;
  for (int64_t i = -1; i < 25; ++i) {
    const size_t k = static_cast<size_t>(i + 1);
    EXPECT_NEAR(lr_at_iteration(c, i), kOneCycleStairLr[k], 1e-12 * kOneCycleStairLr[k]) << "iteration " << i;
    EXPECT_NEAR(*momentum_at_iteration(c, i), kOneCycleStairMom[k], 1e-12) << "iteration " << i;
  }
  LrScheduleConfig d;
  d.type = LrScheduleType::kOneCycle;
  d.cycle_min_lr = 1e-4;
  d.cycle_max_lr = 1e-3;
  d.cycle_first_step_size = 5;
  d.cycle_first_stair_count = 4;
  for (int64_t i = -1; i < 15; ++i)
    EXPECT_NEAR(lr_at_iteration(d, i), kOneCycleStairNoneLr[i + 1], 1e-12 * kOneCycleStairNoneLr[i + 1]) << "iteration " << i;
}

// ---- WarmupCosineLR vs DeepSpeed's WarmupCosineLR ----

// Past total_num_steps the lr stays at cos_min_ratio (it rose back up the cosine), and a total at or
// below the warm-up's leaves the floor from the warm-up's end (it was refused: a division by zero).
TEST(WarmupCosineLR, HoldsTheFloorPastTotalNumStepsAsDeepSpeed) {
  LrScheduleConfig c;
  c.type = LrScheduleType::kWarmupCosineLR;
  c.base_lr = 1e-3;
  c.total_num_steps = 6;
  c.warmup_num_steps = 2;
  c.cos_min_ratio = 0.1;
  c.warmup_log = false;
  for (int64_t i = -1; i < 14; ++i)
    EXPECT_NEAR(lr_at_iteration(c, i), kCosinePastTotal[i + 1], 1e-15) << "iteration " << i;
  c.total_num_steps = 3;
  c.warmup_num_steps = 3;
  c.warmup_log = true;
  for (int64_t i = -1; i < 8; ++i)
    EXPECT_NEAR(lr_at_iteration(c, i), kCosineNoWindow[i + 1], 1e-15) << "iteration " << i;
}

// ---- LRRangeTest vs DeepSpeed's LRRangeTest ----

TEST(LrRangeTest, ContinuousAndStaircaseMatchDeepSpeed) {
  LrScheduleConfig c{.type = LrScheduleType::kLRRangeTest, .lr_range_test_min_lr = 0.002, .lr_range_test_step_size = 3,
                     .lr_range_test_step_rate = 0.5};
  for (const bool staircase : {false, true}) {
    c.lr_range_test_staircase = staircase;
    const double* want = staircase ? kLrRangeTestStaircase : kLrRangeTest;
    for (int64_t i = -1; i < 10; ++i) {
      EXPECT_NEAR(lr_at_iteration(c, i), want[i + 1], 1e-15) << "iteration " << i << (staircase ? " staircase" : "");
    }
    EXPECT_FALSE(momentum_at_iteration(c, 3).has_value());
  }
  EXPECT_NO_THROW(lr_schedule_check(c));
  c.lr_range_test_step_size = 0;  // DeepSpeed divides by it
  EXPECT_THROW(lr_schedule_check(c), Error);
}

TEST(OneCycle, MomentumOnlyWhenCycled) {
  LrScheduleConfig c;
  c.type = LrScheduleType::kWarmupLR;
  EXPECT_FALSE(momentum_at_iteration(c, 3).has_value());
  c.type = LrScheduleType::kOneCycle;
  c.cycle_momentum = false;
  EXPECT_FALSE(momentum_for_step(c, 3).has_value());
}

TEST(OneCycle, CheckRefusesWhatDeepSpeedCannotRun) {
  LrScheduleConfig c;
  c.type = LrScheduleType::kOneCycle;
  c.cycle_first_step_size = 0;
  EXPECT_THROW(lr_schedule_check(c), Error);
  c.cycle_first_step_size = 10;
  c.cycle_second_step_size = -2;
  EXPECT_THROW(lr_schedule_check(c), Error);
  c.cycle_second_step_size = 0;  // ramp up only: DeepSpeed runs it
  EXPECT_NO_THROW(lr_schedule_check(c));
}

}  // namespace
}  // namespace mt::optim
