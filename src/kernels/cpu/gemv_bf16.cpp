#include "kernels/cpu/gemv_bf16.h"

#include <algorithm>

#include "base/cpu_features.h"
#include "base/error.h"

namespace mt::kernels {

void gemv_bf16(int M, int N, int K, const bf16_t* x, const bf16_t* w, float* y, const float* bias) {
  MT_CHECK(M >= 1 && M <= kGemvBf16MaxRows && N >= 1 && K >= 1, ErrorKind::kInvalidArgument,
           "gemv_bf16: M " + std::to_string(M) + " (1 to " + std::to_string(kGemvBf16MaxRows) + "), N " + std::to_string(N) +
               ", K " + std::to_string(K));
  const bool avx512 = isa_active() == Isa::kAvx512;
  // Blocks of 64 output columns over the threads: each reads 64 weight rows.
  constexpr int kBlock = 64;
  const int blocks = (N + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int b = 0; b < blocks; ++b) {
    const int n0 = b * kBlock, n1 = std::min(N, n0 + kBlock);
    if (avx512) {
      detail::gemv_bf16_avx512(M, N, K, x, w, y, bias, n0, n1);
      continue;
    }
    for (int n = n0; n < n1; ++n) {
      const bf16_t* wr = w + static_cast<size_t>(n) * K;
      for (int m = 0; m < M; ++m) {
        const bf16_t* xr = x + static_cast<size_t>(m) * K;
        float s = 0.0f;
        for (int k = 0; k < K; ++k) s += bf16_to_f32(xr[k]) * bf16_to_f32(wr[k]);
        y[static_cast<size_t>(m) * N + n] = s + (bias ? bias[n] : 0.0f);
      }
    }
  }
}

}  // namespace mt::kernels
