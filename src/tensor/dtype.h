// Element types: f32, bf16 and f16, with scalar round-to-nearest-even conversions and vectorised
// row converters (AVX-512 when the CPU has it, portable otherwise).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace mt {

enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "f32", "bf16", "f16"
DType dtype_from_name(const std::string& name);  // accepts f32/fp32/float32, bf16/bfloat16, f16/fp16/float16

struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

inline float bf16_to_f32(bf16_t v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest, ties to even; NaN stays NaN (quiet), inf stays inf.
inline bf16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}

float f16_to_f32(f16_t v);
f16_t f32_to_f16(float f);  // round to nearest even; overflow -> inf; NaN preserved

// Row converters over n contiguous elements (split over the OpenMP threads when n is large).
// dst and src must not overlap.
void convert_f32_to_bf16(bf16_t* dst, const float* src, size_t n);
void convert_bf16_to_f32(float* dst, const bf16_t* src, size_t n);
void convert_f32_to_f16(f16_t* dst, const float* src, size_t n);
void convert_f16_to_f32(float* dst, const f16_t* src, size_t n);
// Generic: converts n elements between any two dtypes (a copy when they are equal).
void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n);
// x (n f32) rounded to dtype's precision in place, and the same values in dtype written to dst
// (bf16 or f16): a saved activation and the f32 values the forward goes on with, in one pass over
// memory (each block of x is rounded in cache). dst nullptr: x is rounded alone.
void round_to(void* dst, DType dtype, float* x, size_t n);
// memcpy and memset(0) split over the OpenMP threads when large (one thread's copy reaches a fifth
// of the memory bandwidth here). dst and src must not overlap.
void copy_bytes(void* dst, const void* src, size_t bytes);
void zero_bytes(void* dst, size_t bytes);

namespace detail {
void convert_f32_to_bf16_avx512(bf16_t* dst, const float* src, size_t n);
void convert_bf16_to_f32_avx512(float* dst, const bf16_t* src, size_t n);
void convert_f32_to_f16_avx512(f16_t* dst, const float* src, size_t n);
void convert_f16_to_f32_avx512(float* dst, const f16_t* src, size_t n);
}  // namespace detail

}  // namespace mt
