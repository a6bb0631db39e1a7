// The fused LM head and cross-entropy against the textbook formulas in double: loss = lse - the
// target's logit, dlogits = (softmax - onehot) · scale, dX = dlogits W, dW += dlogits^T X. In
// tiles (one, and three of 3, 3 and 1 rows), in f32, bf16 and f16 (operands rounded for the
// reference too; the runtime also rounds dlogits to the dtype, so its values carry its rounding),
// over an odd vocabulary (37: f32 logits' rows padded to 48 and the bf16 copy's to 64 elements,
// lm_head_logits_ld and lm_head_operand_ld; f16's dense).
#include "nn/lm_head.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "kernels/cpu/gemm.h"

namespace mt::nn {
namespace {

TEST(LmHead, OperandRowsStartOnWholeLines) {
  EXPECT_EQ(lm_head_operand_ld(50257, DType::kBF16), 50272);
  EXPECT_EQ(lm_head_operand_ld(50257, DType::kF16), 50257);  // widened to dense f32 here
  EXPECT_EQ(lm_head_operand_ld(32000, DType::kBF16), 32032);  // 64000 bytes: a multiple of 256, one line more
  EXPECT_EQ(lm_head_operand_ld(50304, DType::kF32), 50320);
  EXPECT_EQ(lm_head_operand_ld(50304, DType::kBF16), 50336);
  EXPECT_EQ(lm_head_operand_ld(37, DType::kBF16), 64);
  EXPECT_EQ(lm_head_operand_ld(37, DType::kF32), 48);
  EXPECT_EQ(lm_head_logits_ld(37, DType::kF32), 48);
  EXPECT_EQ(lm_head_logits_ld(37, DType::kBF16), 37);
}

struct Reference {
  std::vector<double> loss, dx, dw;
};

// x (N, C), w (V, C) as the runtime reads them (already rounded in low precision); dw starts at dw0.
// round: the compute dtype dlogits are rounded to (f32: none).
Reference reference(const std::vector<float>& x, const std::vector<float>& w, const std::vector<int32_t>& t,
                    const std::vector<float>& dw0, int N, int C, int V, double scale, DType round) {
  Reference r;
  r.loss.assign(N, 0.0);
  r.dx.assign(static_cast<size_t>(N) * C, 0.0);
  r.dw.assign(dw0.begin(), dw0.end());
  for (int i = 0; i < N; ++i) {
    std::vector<double> z(V);
    double mx = -1e300;
    for (int v = 0; v < V; ++v) {
      double s = 0.0;
      for (int c = 0; c < C; ++c) s += static_cast<double>(x[static_cast<size_t>(i) * C + c]) * w[static_cast<size_t>(v) * C + c];
      z[v] = s;
      mx = std::max(mx, s);
    }
    double sum = 0.0;
    for (int v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
    const double lse = mx + std::log(sum);
    if (t[i] == -100) continue;
    r.loss[i] = lse - z[t[i]];
    for (int v = 0; v < V; ++v) {
      double d = (std::exp(z[v] - lse) - (v == t[i] ? 1.0 : 0.0)) * scale;
      if (round == DType::kBF16) d = bf16_to_f32(f32_to_bf16(static_cast<float>(d)));
      if (round == DType::kF16) d = f16_to_f32(f32_to_f16(static_cast<float>(d)));
      for (int c = 0; c < C; ++c) {
        r.dx[static_cast<size_t>(i) * C + c] += d * w[static_cast<size_t>(v) * C + c];
        r.dw[static_cast<size_t>(v) * C + c] += d * x[static_cast<size_t>(i) * C + c];
      }
    }
  }
  return r;
}

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double a : v) m = std::max(m, std::fabs(a));
  return m;
}

TEST(LmHead, TilesInF32AndBf16AreTheTextbookFormulas) {
  const int N = 7, C = 20, V = 37;
  const double scale = 0.25;
  std::mt19937 g(11);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(N) * C), w(static_cast<size_t>(V) * C), dw0(w.size());
  for (float& a : x) a = n01(g);
  for (float& a : w) a = 0.5f * n01(g);
  for (float& a : dw0) a = 0.1f * n01(g);
  std::vector<int32_t> t = {3, 36, -100, 0, 17, 17, 5};
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    const bool lowp = dt != DType::kF32;
    std::vector<float> xr = x, wr = w;
    std::vector<uint16_t> xb(x.size()), wb(w.size());  // the 2-byte operands
    auto round = [&](float v, uint16_t* bits) {
      if (dt == DType::kBF16) return *bits = f32_to_bf16(v).bits, bf16_to_f32(bf16_t{*bits});
      return *bits = f32_to_f16(v).bits, f16_to_f32(f16_t{*bits});
    };
    if (lowp) {
      for (size_t i = 0; i < x.size(); ++i) xr[i] = round(x[i], &xb[i]);
      for (size_t i = 0; i < w.size(); ++i) wr[i] = round(w[i], &wb[i]);
    }
    const Reference ref = reference(xr, wr, t, dw0, N, C, V, scale, dt);
    for (int tile_rows : {0, 3}) {
      std::vector<float> dx(static_cast<size_t>(N) * C, -1.0f), dw = dw0, losses(N, -1.0f);
      LmHeadArgs a;
      a.x = lowp ? static_cast<const void*>(xb.data()) : xr.data();
      a.w = lowp ? static_cast<const void*>(wb.data()) : wr.data();
      a.dtype = dt;
      a.targets = t.data();
      a.N = N, a.C = C, a.V = V;
      a.grad_scale = static_cast<float>(scale);
      a.dx = dx.data();
      a.dw = dw.data();
      a.losses = losses.data();
      a.tile_rows = tile_rows;
      Workspace ws;
      const double total = lm_head_cross_entropy(a, ws);
      double want_total = 0.0;
      for (int i = 0; i < N; ++i) {
        EXPECT_NEAR(losses[i], ref.loss[i], 1e-4 * std::max(1.0, std::fabs(ref.loss[i]))) << "row " << i;
        want_total += ref.loss[i];
      }
      EXPECT_NEAR(total, want_total, 1e-3);
      // bf16, f16: dlogits rounded by both; a value near a rounding tie may round the other way
      // from the GEMM's f32 logits (one step of the dtype: 2^-8 of it in bf16).
      const double tol = lowp ? 1e-2 : 1e-5;
      const double sx = max_abs(ref.dx), sw = max_abs(ref.dw);
      for (size_t i = 0; i < dx.size(); ++i) ASSERT_NEAR(dx[i], ref.dx[i], tol * sx) << dtype_name(dt) << " tiles " << tile_rows << " dx " << i;
      for (size_t i = 0; i < dw.size(); ++i) ASSERT_NEAR(dw[i], ref.dw[i], tol * sw) << dtype_name(dt) << " tiles " << tile_rows << " dw " << i;
    }
  }
}

// f16 where oneDNN has no f16 matmul: the head widens its weight once a call into its own f32 slot
// and runs f32 GEMMs, so kernels::gemm's widening regions (the calling thread's) never hold it.
// Before, each of the 4 tiles' logits and dX GEMMs widened the whole weight there again. (The
// values are TilesInF32AndBf16AreTheTextbookFormulas' f16 case.)
TEST(LmHead, WidenedF16HeadWidensItsWeightOnceOutsideTheGemmRegions) {
  if (!lm_head_widened(DType::kF16)) GTEST_SKIP() << "oneDNN multiplies f16 here (AVX512-FP16)";
  const int N = 64, C = 32, V = 1000;
  std::vector<uint16_t> x(static_cast<size_t>(N) * C), w(static_cast<size_t>(V) * C);
  std::mt19937 g(3);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  for (auto& b : x) b = f32_to_f16(n01(g)).bits;
  for (auto& b : w) b = f32_to_f16(0.1f * n01(g)).bits;
  std::vector<int32_t> t(N);
  for (int i = 0; i < N; ++i) t[i] = (i * 37) % V;
  std::vector<float> dx(x.size()), dw(w.size(), 0.0f), losses(N);
  size_t held = 1;
  std::thread([&] {  // a fresh thread: regions of its own, empty
    LmHeadArgs a;
    a.x = x.data(), a.w = w.data(), a.dtype = DType::kF16, a.targets = t.data();
    a.N = N, a.C = C, a.V = V, a.grad_scale = 1.0f / N;
    a.dx = dx.data(), a.dw = dw.data(), a.losses = losses.data(), a.tile_rows = 16;
    Workspace ws;
    lm_head_cross_entropy(a, ws);
    held = kernels::gemm_widen_held();
  }).join();
  EXPECT_EQ(held, 0u);
  for (float l : losses) EXPECT_TRUE(std::isfinite(l) && l > 0.0f);
}

}  // namespace
}  // namespace mt::nn
