// The AVX-512 BF16 body of gemv_bf16 (compiled with -mavx512bf16; called after isa_active()).
#include <immintrin.h>

// GCC 12's _mm512_reduce_add_ps reads an undefined upper half it then discards ("may be used
// uninitialized" under -Werror).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/cpu/gemv_bf16.h"

namespace mt::kernels::detail {

void gemv_bf16_avx512(int M, int N, int K, const bf16_t* x, const bf16_t* w, float* y, const float* bias, int n0, int n1) {
  const int full = K / 32 * 32;
  const __mmask32 tail = K > full ? static_cast<__mmask32>((1ull << (K - full)) - 1) : 0;
  for (int n = n0; n < n1; ++n) {
    const bf16_t* wr = w + static_cast<size_t>(n) * K;
    // Two accumulators a row (even and odd chunks): one chain of vdpbf16ps held a row to about
    // 26 GB/s of weights a thread.
    __m512 acc[kGemvBf16MaxRows], acc2[kGemvBf16MaxRows];
    for (int m = 0; m < M; ++m) acc[m] = acc2[m] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 64 <= full; k += 64) {
      const __m512i wv = _mm512_loadu_si512(wr + k), wv2 = _mm512_loadu_si512(wr + k + 32);
      for (int m = 0; m < M; ++m) {
        const bf16_t* xr = x + static_cast<size_t>(m) * K + k;
        acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_loadu_si512(xr), (__m512bh)wv);
        acc2[m] = _mm512_dpbf16_ps(acc2[m], (__m512bh)_mm512_loadu_si512(xr + 32), (__m512bh)wv2);
      }
    }
    for (; k < full; k += 32) {
      const __m512i wv = _mm512_loadu_si512(wr + k);
      for (int m = 0; m < M; ++m) {
        const __m512i xv = _mm512_loadu_si512(x + static_cast<size_t>(m) * K + k);
        acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)xv, (__m512bh)wv);
      }
    }
    for (int m = 0; m < M; ++m) acc[m] = _mm512_add_ps(acc[m], acc2[m]);
    if (tail) {  // the last K mod 32 elements, the rest of the register zero
      const __m512i wv = _mm512_maskz_loadu_epi16(tail, wr + full);
      for (int m = 0; m < M; ++m) {
        const __m512i xv = _mm512_maskz_loadu_epi16(tail, x + static_cast<size_t>(m) * K + full);
        acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)xv, (__m512bh)wv);
      }
    }
    const float b = bias ? bias[n] : 0.0f;
    for (int m = 0; m < M; ++m) y[static_cast<size_t>(m) * N + n] = _mm512_reduce_add_ps(acc[m]) + b;
  }
}

}  // namespace mt::kernels::detail
