#include "tensor/dtype.h"

#include <omp.h>

#include "base/cpu_features.h"
#include "base/error.h"

namespace mt {

size_t dtype_size(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  if (name == "f32" || name == "fp32" || name == "float32" || name == "F32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16" || name == "BF16") return DType::kBF16;
  if (name == "f16" || name == "fp16" || name == "float16" || name == "F16") return DType::kF16;
  throw Error(ErrorKind::kInvalidArgument, "unknown dtype '" + name + "' (expected f32, bf16 or f16)");
}

float f16_to_f32(f16_t v) {
  uint32_t h = v.bits;
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        mant <<= 1;
        ++e;
      } while ((mant & 0x400u) == 0);
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

f16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return f16_t{static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu))};
  if (abs >= 0x477ff000u) return f16_t{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to >= 65520
  if (abs < 0x38800000u) {  // result is subnormal (or zero) in f16
    if (abs < 0x33000000u) return f16_t{static_cast<uint16_t>(sign)};  // < 2^-25: rounds to 0
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // value / 2^-24 = mant * 2^(exp - 126); shift is 14..24 here
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return f16_t{static_cast<uint16_t>(sign | half)};
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  uint32_t h = ((rounded >> 13) - ((127 - 15) << 10));
  return f16_t{static_cast<uint16_t>(sign | h)};
}

namespace {

// Runs body(begin, end) over [0, n) split into contiguous chunks, one per OpenMP thread when n is
// large enough to pay for the fork (the activation casts of a step are 1-50 M elements).
template <typename Body>
void parallel_chunks(size_t n, Body body) {
  constexpr size_t kMinPerThread = size_t{1} << 16;
  int threads = omp_get_max_threads();
  if (n < 2 * kMinPerThread || threads <= 1 || omp_in_parallel()) {
    body(size_t{0}, n);
    return;
  }
#pragma omp parallel
  {
    size_t t = static_cast<size_t>(omp_get_thread_num()), nt = static_cast<size_t>(omp_get_num_threads());
    size_t chunk = (n + nt - 1) / nt;
    size_t b = t * chunk, e = b + chunk < n ? b + chunk : n;
    if (b < e) body(b, e);
  }
}

}  // namespace

void convert_f32_to_bf16(bf16_t* dst, const float* src, size_t n) {
  bool vec = isa_active() == Isa::kAvx512;
  parallel_chunks(n, [&](size_t b, size_t e) {
    if (vec) return detail::convert_f32_to_bf16_avx512(dst + b, src + b, e - b);
    for (size_t i = b; i < e; ++i) dst[i] = f32_to_bf16(src[i]);
  });
}

void convert_bf16_to_f32(float* dst, const bf16_t* src, size_t n) {
  bool vec = isa_active() == Isa::kAvx512;
  parallel_chunks(n, [&](size_t b, size_t e) {
    if (vec) return detail::convert_bf16_to_f32_avx512(dst + b, src + b, e - b);
    for (size_t i = b; i < e; ++i) dst[i] = bf16_to_f32(src[i]);
  });
}

void convert_f32_to_f16(f16_t* dst, const float* src, size_t n) {
  bool vec = isa_active() == Isa::kAvx512;
  parallel_chunks(n, [&](size_t b, size_t e) {
    if (vec) return detail::convert_f32_to_f16_avx512(dst + b, src + b, e - b);
    for (size_t i = b; i < e; ++i) dst[i] = f32_to_f16(src[i]);
  });
}

void convert_f16_to_f32(float* dst, const f16_t* src, size_t n) {
  bool vec = isa_active() == Isa::kAvx512;
  parallel_chunks(n, [&](size_t b, size_t e) {
    if (vec) return detail::convert_f16_to_f32_avx512(dst + b, src + b, e - b);
    for (size_t i = b; i < e; ++i) dst[i] = f16_to_f32(src[i]);
  });
}

namespace {

// round_to over one element type: each block of 2048 (8 KiB of f32) is written to dst and read
// back into x while in L1.
template <typename T>
void round_blocks(T* dst, float* x, size_t n, void (*to_t)(T*, const float*, size_t),
                  void (*to_f32)(float*, const T*, size_t), T (*one_to_t)(float), float (*one_to_f32)(T)) {
  const bool vec = isa_active() == Isa::kAvx512;
  parallel_chunks(n, [&](size_t b, size_t e) {
    constexpr size_t kBlock = 2048;
    for (size_t i = b; i < e; i += kBlock) {
      const size_t m = e - i < kBlock ? e - i : kBlock;
      T own[kBlock];  // dst nullptr: x alone is rounded, through a block of the thread's stack
      T* to = dst != nullptr ? dst + i : own;
      if (vec) {
        to_t(to, x + i, m);
        to_f32(x + i, to, m);
      } else {
        for (size_t k = 0; k < m; ++k) x[i + k] = one_to_f32(to[k] = one_to_t(x[i + k]));
      }
    }
  });
}

}  // namespace

void round_to(void* dst, DType dtype, float* x, size_t n) {
  MT_CHECK(dtype == DType::kBF16 || dtype == DType::kF16, ErrorKind::kInvalidArgument,
           "round_to: the destination must be bf16 or f16");
  if (dtype == DType::kBF16)
    round_blocks<bf16_t>(static_cast<bf16_t*>(dst), x, n, detail::convert_f32_to_bf16_avx512,
                         detail::convert_bf16_to_f32_avx512, f32_to_bf16, bf16_to_f32);
  else
    round_blocks<f16_t>(static_cast<f16_t*>(dst), x, n, detail::convert_f32_to_f16_avx512,
                        detail::convert_f16_to_f32_avx512, f32_to_f16, f16_to_f32);
}

void copy_bytes(void* dst, const void* src, size_t bytes) {
  parallel_chunks(bytes / 4, [&](size_t b, size_t e) {
    const size_t hi = e == bytes / 4 ? bytes : 4 * e;  // the tail's odd bytes with the last chunk
    std::memcpy(static_cast<char*>(dst) + 4 * b, static_cast<const char*>(src) + 4 * b, hi - 4 * b);
  });
}

void zero_bytes(void* dst, size_t bytes) {
  parallel_chunks(bytes / 4, [&](size_t b, size_t e) {
    const size_t hi = e == bytes / 4 ? bytes : 4 * e;
    std::memset(static_cast<char*>(dst) + 4 * b, 0, hi - 4 * b);
  });
}

void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n) {
  if (dst_dtype == src_dtype) {
    copy_bytes(dst, src, n * dtype_size(dst_dtype));
    return;
  }
  if (src_dtype == DType::kF32) {
    if (dst_dtype == DType::kBF16)
      return convert_f32_to_bf16(static_cast<bf16_t*>(dst), static_cast<const float*>(src), n);
    return convert_f32_to_f16(static_cast<f16_t*>(dst), static_cast<const float*>(src), n);
  }
  if (dst_dtype == DType::kF32) {
    if (src_dtype == DType::kBF16)
      return convert_bf16_to_f32(static_cast<float*>(dst), static_cast<const bf16_t*>(src), n);
    return convert_f16_to_f32(static_cast<float*>(dst), static_cast<const f16_t*>(src), n);
  }
  // bf16 <-> f16: through f32 in chunks.
  float tmp[1024];
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  for (size_t i = 0; i < n; i += 1024) {
    size_t m = n - i < 1024 ? n - i : 1024;
    convert(tmp, DType::kF32, s + i * 2, src_dtype, m);
    convert(d + i * 2, dst_dtype, tmp, DType::kF32, m);
  }
}

}  // namespace mt
