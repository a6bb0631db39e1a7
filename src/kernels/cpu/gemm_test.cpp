// GEMM against a double-precision triple loop, for every transposed form, each operand dtype,
// accumulate and bias.
#include "kernels/cpu/gemm.h"

#include "base/file_io.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

namespace mt::kernels {
namespace {

struct Case {
  int M, N, K;
  bool ta, tb;
};

void run_case(const Case& c, DType dt, bool accumulate, bool with_bias) {
  std::mt19937 rng(c.M * 131 + c.N * 7 + c.K);
  std::normal_distribution<float> nd;
  int lda = (c.ta ? c.M : c.K) + 3, ldb = (c.tb ? c.K : c.N) + 1, ldc = c.N + 2;
  int arows = c.ta ? c.K : c.M, brows = c.tb ? c.N : c.K;
  std::vector<float> a(static_cast<size_t>(arows) * lda), b(static_cast<size_t>(brows) * ldb);
  for (auto& x : a) x = nd(rng);
  for (auto& x : b) x = nd(rng);
  // Round operands to the dtype so the reference sees the same inputs.
  std::vector<char> a_lp(a.size() * dtype_size(dt)), b_lp(b.size() * dtype_size(dt));
  convert(a_lp.data(), dt, a.data(), DType::kF32, a.size());
  convert(b_lp.data(), dt, b.data(), DType::kF32, b.size());
  convert(a.data(), DType::kF32, a_lp.data(), dt, a.size());
  convert(b.data(), DType::kF32, b_lp.data(), dt, b.size());
  std::vector<float> bias(c.N), out(static_cast<size_t>(c.M) * ldc);
  for (auto& x : bias) x = nd(rng);
  for (auto& x : out) x = nd(rng);
  std::vector<float> before = out;
  gemm(c.M, c.N, c.K, a_lp.data(), lda, c.ta, b_lp.data(), ldb, c.tb, out.data(), ldc, dt,
       accumulate, with_bias ? bias.data() : nullptr);
  for (int i = 0; i < c.M; ++i) {
    for (int j = 0; j < c.N; ++j) {
      double ref = accumulate ? before[i * ldc + j] : (with_bias ? bias[j] : 0.0);
      for (int k = 0; k < c.K; ++k) {
        double av = c.ta ? a[k * lda + i] : a[i * lda + k];
        double bv = c.tb ? b[j * ldb + k] : b[k * ldb + j];
        ref += av * bv;
      }
      ASSERT_NEAR(out[i * ldc + j], ref, 1e-4 * (1 + std::sqrt(c.K)) * (1 + std::fabs(ref)))
          << "M=" << c.M << " N=" << c.N << " K=" << c.K << " ta=" << c.ta << " tb=" << c.tb
          << " dtype=" << dtype_name(dt) << " at " << i << "," << j;
    }
  }
}

TEST(Gemm, AllTransposesDtypesAccumulateBias) {
  const Case cases[] = {{1, 1, 1, false, false}, {7, 5, 3, false, true}, {33, 17, 65, true, false},
                        {64, 48, 96, true, true}, {3, 129, 31, false, false}};
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (const Case& c : cases) {
      run_case(c, dt, false, false);
      run_case(c, dt, true, false);
      run_case(c, dt, false, true);
    }
}

TEST(Gemm, PrimitivesAreReused) {
  std::vector<float> a(64 * 64, 1.0f), b(64 * 64, 1.0f), c(64 * 64);
  gemm(64, 64, 64, a.data(), 64, false, b.data(), 64, false, c.data(), 64, DType::kF32, false);
  int n = gemm_primitive_count();
  for (int i = 0; i < 5; ++i)
    gemm(64, 64, 64, a.data(), 64, false, b.data(), 64, false, c.data(), 64, DType::kF32, false);
  EXPECT_EQ(gemm_primitive_count(), n);
  EXPECT_FLOAT_EQ(c[0], 64.0f);
}

// oneDNN's scratchpad (user mode): the primitives share one region, grown to the largest need, and
// gemm_scratch_bytes answers each call's need before it runs. In library mode each primitive of
// Debian's oneDNN held its own for its lifetime, so the process grew by the sum of the needs.
TEST(Gemm, PrimitivesShareOneScratchpadRegionOfTheLargestNeed) {
  // Weight-gradient GEMMs (A transposed, accumulating) of a 512-wide model's layers over 1024 rows.
  const int shapes[][3] = {{512, 2048, 1024}, {512, 1536, 1024}, {512, 512, 1024}, {2048, 512, 1024}, {512, 4096, 1024},
                           {768, 1536, 1024}};
  size_t sum = 0, most = 0;
  for (auto& s : shapes) {
    const size_t need = gemm_scratch_bytes(s[0], s[1], s[2], true, false, DType::kBF16, true);
    sum += need, most = std::max(most, need);
  }
  if (sum < (size_t{4} << 20)) GTEST_SKIP() << "this CPU's bf16 matmul needs little scratchpad (" << sum << " bytes)";
  const size_t held_before = gemm_scratch_held();
  std::vector<std::vector<uint16_t>> a, b;
  std::vector<std::vector<float>> c;
  for (auto& s : shapes) {  // operands first, touched, so the RSS below is the primitives' own
    a.emplace_back(static_cast<size_t>(s[2]) * s[0], 0x3f80), b.emplace_back(static_cast<size_t>(s[2]) * s[1], 0x3f80);
    c.emplace_back(static_cast<size_t>(s[0]) * s[1], 0.0f);
  }
  const double rss0 = static_cast<double>(process_rss_bytes());
  for (int round = 0; round < 2; ++round)
    for (size_t i = 0; i < a.size(); ++i) {
      const auto& s = shapes[i];
      gemm(s[0], s[1], s[2], a[i].data(), s[0], true, b[i].data(), s[1], false, c[i].data(), s[1], DType::kBF16, true);
    }
  const double grown = static_cast<double>(process_rss_bytes()) - rss0;
  EXPECT_FLOAT_EQ(c[0][0], 2.0f * 1024);  // ones: each call adds K
  EXPECT_EQ(gemm_scratch_held(), std::max(held_before, most));
  std::printf("  needs: sum %.2f MiB, largest %.2f MiB; the process grew %.2f MiB\n", sum / 1048576.0,
              most / 1048576.0, grown / 1048576.0);
  EXPECT_LT(grown, static_cast<double>(sum - most) + (size_t{1} << 20) * 0.5);
}

}  // namespace
}  // namespace mt::kernels
