// The AVX-512 bodies of comm/onebit.cpp's passes (built with the AVX-512 flags; called only where
// base/cpu_features.h's isa_active() is kAvx512). Each takes one block of a buffer.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mt::comm::detail {

// onebit_pack of len elements (bits: ceil(len / 8) bytes, written whole).
void onebit_pack_avx512(uint8_t* bits, const float* x, size_t len);
// onebit_unpack of len elements into y, or added to y (add).
void onebit_unpack_avx512(float* y, const uint8_t* bits, size_t len, float scale, bool add);
// The sum of x^2 in double.
double onebit_sum_squares_avx512(const float* x, size_t len);
// e (len) = x + e for its first `real` elements and 0 + e past them, and then the sum of the new
// e^2 in double: onebit_sum_squares_avx512's value, in one pass.
double onebit_add_squares_avx512(float* e, const float* x, size_t real, size_t len);
// onebit_pack of e (len), then e -= (e < 0 ? -s : s), in one pass.
void onebit_pack_feedback_avx512(uint8_t* bits, float* e, size_t len, float s);

}  // namespace mt::comm::detail
