// GCC 12's AVX-512 headers trip -W(maybe-)uninitialized on their own _mm512_undefined_*()
// placeholders once inlined (GCC PR105593, as in kernels/cpu/ops_avx512.cpp): silenced here only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "comm/onebit_avx512.h"

#include <immintrin.h>

#include "base/avx512_lanes.h"

#include <array>

namespace mt::comm::detail {
namespace {

// Byte b with its bits in reverse order: a compare mask has element j at bit j, a packed byte has
// its first element in the most significant bit.
constexpr std::array<uint8_t, 256> kReversed = [] {
  std::array<uint8_t, 256> t{};
  for (int b = 0; b < 256; ++b) {
    int r = 0;
    for (int j = 0; j < 8; ++j) r |= ((b >> j) & 1) << (7 - j);
    t[static_cast<size_t>(b)] = static_cast<uint8_t>(r);
  }
  return t;
}();

inline __mmask16 tail_mask(size_t r) { return static_cast<__mmask16>((1u << r) - 1u); }

}  // namespace

void onebit_pack_avx512(uint8_t* bits, const float* x, size_t len) {
  const __m512 zero = _mm512_setzero_ps();
  for (size_t i = 0; i < len; i += 16) {
    const __mmask16 k = len - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(len - i);
    // Not less than zero (NaN included: unordered compares true), the lanes past the end clear.
    const unsigned m = static_cast<unsigned>(_mm512_mask_cmp_ps_mask(k, avx512::load_ps(k, x + i), zero, _CMP_NLT_UQ));
    bits[i / 8] = kReversed[m & 0xffu];
    if (len - i > 8) bits[i / 8 + 1] = kReversed[m >> 8];
  }
}

void onebit_unpack_avx512(float* y, const uint8_t* bits, size_t len, float scale, bool add) {
  const __m512 pos = _mm512_set1_ps(scale), neg = _mm512_set1_ps(-scale);
  for (size_t i = 0; i < len; i += 16) {
    const __mmask16 k = len - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(len - i);
    const unsigned hi = len - i > 8 ? kReversed[bits[i / 8 + 1]] : 0u;
    const __m512 v = _mm512_mask_blend_ps(static_cast<__mmask16>(kReversed[bits[i / 8]] | (hi << 8)), neg, pos);
    avx512::store_ps(y + i, k, add ? _mm512_add_ps(avx512::load_ps(k, y + i), v) : v);
  }
}

double onebit_sum_squares_avx512(const float* x, size_t len) {
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  for (size_t i = 0; i < len; i += 16) {
    const __mmask16 k = len - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(len - i);
    const __m512 v = avx512::load_ps(k, x + i);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v)), hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
    a0 = _mm512_fmadd_pd(lo, lo, a0);
    a1 = _mm512_fmadd_pd(hi, hi, a1);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
}

double onebit_add_squares_avx512(float* e, const float* x, size_t real, size_t len) {
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();  // as onebit_sum_squares_avx512
  for (size_t i = 0; i < len; i += 16) {
    const __mmask16 k = len - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(len - i);
    const __mmask16 kx = i >= real ? static_cast<__mmask16>(0) : real - i >= 16 ? k : static_cast<__mmask16>(k & tail_mask(real - i));
    const __m512 v = _mm512_add_ps(avx512::load_ps(kx, x + i), avx512::load_ps(k, e + i));
    avx512::store_ps(e + i, k, v);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v)), hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
    a0 = _mm512_fmadd_pd(lo, lo, a0);
    a1 = _mm512_fmadd_pd(hi, hi, a1);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
}

void onebit_pack_feedback_avx512(uint8_t* bits, float* e, size_t len, float s) {
  const __m512 zero = _mm512_setzero_ps(), pos = _mm512_set1_ps(s), neg = _mm512_set1_ps(-s);
  for (size_t i = 0; i < len; i += 16) {
    const __mmask16 k = len - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(len - i);
    const __m512 v = avx512::load_ps(k, e + i);
    const unsigned m = static_cast<unsigned>(_mm512_mask_cmp_ps_mask(k, v, zero, _CMP_NLT_UQ));  // as onebit_pack_avx512
    bits[i / 8] = kReversed[m & 0xffu];
    if (len - i > 8) bits[i / 8 + 1] = kReversed[m >> 8];
    // e - (e < 0 ? -s : s): the ordered less-than, as the scalar compare (NaN: not less, minus s).
    const __mmask16 below = _mm512_mask_cmp_ps_mask(k, v, zero, _CMP_LT_OQ);
    avx512::store_ps(e + i, k, _mm512_sub_ps(v, _mm512_mask_blend_ps(below, pos, neg)));
  }
}

}  // namespace mt::comm::detail
