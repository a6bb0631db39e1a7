// Loads and stores of a vector's lanes k, plain where k holds every lane. The AVX-512 passes mask
// each vector so that one loop covers a tail; on this project's AMD EPYC (Zen 4) a masked load or
// store with a run-time mask streams at 55-70 % of a plain one's rate even with every lane set
// (docs/PERF.md (cc)), so a whole vector goes plain and only a tail masked. The values are the
// same either way. Include only from files built with the AVX-512 flags (*_avx512.cpp).
#pragma once

#include <immintrin.h>

namespace mt::avx512 {

inline __m512 load_ps(__mmask16 k, const float* p) {
  return k == static_cast<__mmask16>(0xffff) ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(k, p);
}
inline void store_ps(float* p, __mmask16 k, __m512 v) {
  if (k == static_cast<__mmask16>(0xffff)) _mm512_storeu_ps(p, v);
  else _mm512_mask_storeu_ps(p, k, v);
}
inline __m512d load_pd(__mmask8 k, const double* p) {
  return k == static_cast<__mmask8>(0xff) ? _mm512_loadu_pd(p) : _mm512_maskz_loadu_pd(k, p);
}
inline void store_pd(double* p, __mmask8 k, __m512d v) {
  if (k == static_cast<__mmask8>(0xff)) _mm512_storeu_pd(p, v);
  else _mm512_mask_storeu_pd(p, k, v);
}
// 16 lanes of 16 bits (bf16, f16).
inline __m256i load_epi16(__mmask16 k, const void* p) {
  return k == static_cast<__mmask16>(0xffff) ? _mm256_loadu_si256(static_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi16(k, p);
}
inline void store_epi16(void* p, __mmask16 k, __m256i v) {
  if (k == static_cast<__mmask16>(0xffff)) _mm256_storeu_si256(static_cast<__m256i*>(p), v);
  else _mm256_mask_storeu_epi16(p, k, v);
}

}  // namespace mt::avx512
