// GEMM against a double-precision triple loop, for every transposed form, each operand dtype,
// accumulate and bias.
#include "kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
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

}  // namespace
}  // namespace mt::kernels
