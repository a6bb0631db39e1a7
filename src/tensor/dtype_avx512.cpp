// AVX-512 row converters. Compiled with -mavx512bf16 -mf16c; called only when isa_active() says so.
#include <immintrin.h>

// NOTE: GCC 12 warns falsely inside its own AVX-512 headers (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "tensor/dtype.h"

namespace mt::detail {

void convert_f32_to_bf16_avx512(bf16_t* dst, const float* src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));  // RNE, as f32_to_bf16
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), reinterpret_cast<__m256i&>(v));
  }
  if (i < n) {
    __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
    _mm256_mask_storeu_epi16(dst + i, m, reinterpret_cast<__m256i&>(v));
  }
}

void convert_bf16_to_f32_avx512(float* dst, const bf16_t* src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
  if (i < n) {
    __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    __m256i h = _mm256_maskz_loadu_epi16(m, src + i);
    _mm512_mask_storeu_ps(dst + i, m,
                          _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
}

void convert_f32_to_f16_avx512(f16_t* dst, const float* src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

void convert_f16_to_f32_avx512(float* dst, const f16_t* src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

}  // namespace mt::detail
