// AVX-512 bodies of kernels/cpu/dropout.cpp: eight masks at once, the same hash on 64-bit lanes,
// so the same elements are kept as by the portable loops (DropoutMask tests both).
// GCC 12's intrinsics pass _mm512_undefined_epi32() through, which -Wmaybe-uninitialized reports.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/dropout.h"

namespace mt::kernels::detail {
namespace {

inline __m512i mix8(__m512i z) {
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), _mm512_set1_epi64(static_cast<long long>(0xbf58476d1ce4e5b9ull)));
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), _mm512_set1_epi64(static_cast<long long>(0x94d049bb133111ebull)));
  return _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
}

// Lanes kept: bits >> 32 >= threshold.
inline __mmask8 kept8(__m512i z, uint32_t threshold) {
  return _mm512_cmpge_epu64_mask(_mm512_srli_epi64(mix8(z), 32), _mm512_set1_epi64(threshold));
}

}  // namespace

// x[c] for c < n, columns col0 + c of the row whose key is rk.
void dropout_row_avx512(float* x, int n, uint64_t rk, uint64_t col0, uint32_t threshold, float scale) {
  const __m512i G = _mm512_set1_epi64(static_cast<long long>(kDropGolden));
  const __m512i G8 = _mm512_set1_epi64(static_cast<long long>(8 * kDropGolden));
  // z = rk + (col0 + c + 1) G for lanes c = 0..7, stepped by 8 G.
  __m512i z = _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(rk)),
                               _mm512_mullo_epi64(_mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(col0 + 1)),
                                                                   _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0)),
                                                  G));
  const __m256 s = _mm256_set1_ps(scale);
  int c = 0;
  for (; c + 8 <= n; c += 8, z = _mm512_add_epi64(z, G8))
    _mm256_storeu_ps(x + c, _mm256_maskz_mul_ps(kept8(z, threshold), _mm256_loadu_ps(x + c), s));
  if (c < n) {
    const __mmask8 tail = static_cast<__mmask8>((1u << (n - c)) - 1);
    _mm256_mask_storeu_ps(x + c, tail, _mm256_maskz_mul_ps(kept8(z, threshold), _mm256_maskz_loadu_ps(tail, x + c), s));
  }
}

// x[i] for i < n: row i's key rks[i], one column `col`.
void dropout_column_avx512(float* x, int n, const uint64_t* rks, uint64_t col, uint32_t threshold, float scale) {
  const __m512i add = _mm512_set1_epi64(static_cast<long long>((col + 1) * kDropGolden));
  const __m256 s = _mm256_set1_ps(scale);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512i z = _mm512_add_epi64(_mm512_loadu_si512(rks + i), add);
    _mm256_storeu_ps(x + i, _mm256_maskz_mul_ps(kept8(z, threshold), _mm256_loadu_ps(x + i), s));
  }
  if (i < n) {
    const __mmask8 tail = static_cast<__mmask8>((1u << (n - i)) - 1);
    const __m512i z = _mm512_add_epi64(_mm512_maskz_loadu_epi64(tail, rks + i), add);
    _mm256_mask_storeu_ps(x + i, tail, _mm256_maskz_mul_ps(kept8(z, threshold), _mm256_maskz_loadu_ps(tail, x + i), s));
  }
}

}  // namespace mt::kernels::detail
