#include "kernels/cpu/gemv_bf16.h"

#include <algorithm>

#include <omp.h>

#include "base/cpu_features.h"
#include "base/error.h"

namespace mt::kernels {

void gemv_bf16(int M, int N, int K, const bf16_t* x, const bf16_t* w, float* y, const float* bias) {
  MT_CHECK(M >= 1 && M <= kGemvBf16MaxRows && N >= 1 && K >= 1, ErrorKind::kInvalidArgument,
           "gemv_bf16: M " + std::to_string(M) + " (1 to " + std::to_string(kGemvBf16MaxRows) + "), N " + std::to_string(N) +
               ", K " + std::to_string(K));
  const bool avx512 = isa_active() == Isa::kAvx512;
  // Blocks of output columns over the threads, four a thread at least (64 columns at most: each
  // reads its weight rows once).
  const int threads = std::max(1, omp_get_max_threads());
  const int block = std::clamp((N + 4 * threads - 1) / (4 * threads), 8, 64);
  const int blocks = (N + block - 1) / block;
#pragma omp parallel for schedule(static)
  for (int b = 0; b < blocks; ++b) {
    const int n0 = b * block, n1 = std::min(N, n0 + block);
    if (avx512) {
      detail::gemv_bf16_avx512(M, N, K, x, w, y, bias, n0, n1);
      continue;
    }
    for (int n = n0; n < n1; ++n) {
      const bf16_t* wr = w + static_cast<size_t>(n) * K;
      for (int m = 0; m < M; ++m) {
        const bf16_t* xr = x + static_cast<size_t>(m) * K;
        // 16 partial sums the compiler can keep in vectors (one in-order sum was a scalar chain).
        float part[16] = {};
        int k = 0;
        for (; k + 16 <= K; k += 16)
          for (int j = 0; j < 16; ++j) part[j] += bf16_to_f32(xr[k + j]) * bf16_to_f32(wr[k + j]);
        float s = 0.0f;
        for (; k < K; ++k) s += bf16_to_f32(xr[k]) * bf16_to_f32(wr[k]);
        for (float p : part) s += p;
        y[static_cast<size_t>(m) * N + n] = s + (bias ? bias[n] : 0.0f);
      }
    }
  }
}

}  // namespace mt::kernels
