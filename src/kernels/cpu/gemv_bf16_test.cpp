// gemv_bf16 against the textbook sum in double of the same bf16 values, on both ISAs (the AVX-512
// body's full 32-element chunks and its masked tail, every row count 1-8, a bias and none).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/cpu_features.h"
#include "base/error.h"
#include "kernels/cpu/gemv_bf16.h"

namespace mt::kernels {
namespace {

TEST(GemvBf16, EveryRowCountAndTailIsTheSumOfTheBf16Products) {
  uint64_t state = 9;
  auto uniform = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<double>(state >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  };
  struct IsaGuard {  // the ISA forced back whatever an ASSERT leaves
    Isa saved = isa_active();
    ~IsaGuard() { isa_force(saved); }
  } guard;
  for (Isa isa : {Isa::kPortable, Isa::kAvx512}) {
    if (isa == Isa::kAvx512 && isa_detected() != Isa::kAvx512) continue;
    isa_force(isa);
    for (int K : {1, 31, 32, 64, 100, 127, 768}) {
      for (int M = 1; M <= kGemvBf16MaxRows; ++M) {
        const int N = 70;  // two blocks of output columns, the second short
        std::vector<bf16_t> x(static_cast<size_t>(M) * K), w(static_cast<size_t>(N) * K);
        for (bf16_t& v : x) v = f32_to_bf16(uniform());
        for (bf16_t& v : w) v = f32_to_bf16(uniform());
        std::vector<float> bias(N), y(static_cast<size_t>(M) * N, NAN);
        for (float& b : bias) b = uniform();
        for (const bool with_bias : {false, true}) {
          gemv_bf16(M, N, K, x.data(), w.data(), y.data(), with_bias ? bias.data() : nullptr);
          for (int m = 0; m < M; ++m)
            for (int n = 0; n < N; ++n) {
              double want = with_bias ? bias[n] : 0.0, scale = std::fabs(want);
              for (int k = 0; k < K; ++k) {
                const double p = static_cast<double>(bf16_to_f32(x[static_cast<size_t>(m) * K + k])) *
                                 bf16_to_f32(w[static_cast<size_t>(n) * K + k]);
                want += p;
                scale += std::fabs(p);
              }
              ASSERT_NEAR(y[static_cast<size_t>(m) * N + n], want, 1e-6 * scale + 1e-7)
                  << isa_name(isa) << " K " << K << " M " << M << " n " << n;
            }
        }
      }
    }
  }
  isa_force(guard.saved);
  std::vector<bf16_t> one(8);
  std::vector<float> out(8);
  EXPECT_THROW(gemv_bf16(kGemvBf16MaxRows + 1, 1, 1, one.data(), one.data(), out.data(), nullptr), Error);
}

}  // namespace
}  // namespace mt::kernels
