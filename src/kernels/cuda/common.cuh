// Device helpers shared by the .cu files of kernels/cuda/: dtype dispatch, loads/stores converting
// to and from f32, warp and block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "base/error.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.h"
#include "tensor/dtype.h"

namespace mt::cuda {

using bf16 = __nv_bfloat16;

inline cudaStream_t cu_stream() { return static_cast<cudaStream_t>(stream()); }

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets it.
template <typename V>
__device__ V block_sum(V v) {
  __shared__ V part[32];
  __syncthreads();  // part may still be read by a previous call
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  V t = 0;
  for (int i = 0; i < nw; ++i) t += part[i];  // fixed order: deterministic
  return t;
}
__device__ __forceinline__ float block_max(float v) {
  __shared__ float part[32];
  __syncthreads();
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float t = -INFINITY;
  for (int i = 0; i < nw; ++i) t = fmaxf(t, part[i]);
  return t;
}

inline unsigned grid_for(size_t n, unsigned threads, unsigned cap = 65535u * 16) {
  size_t g = (n + threads - 1) / threads;
  if (g == 0) g = 1;
  return static_cast<unsigned>(g < cap ? g : cap);
}

}  // namespace mt::cuda

// MT_DISPATCH(dtype, T, body): runs body with T = float or __nv_bfloat16.
#define MT_DISPATCH(dtype, T, ...)                                                              \
  switch (dtype) {                                                                              \
    case ::mt::DType::kF32: {                                                                   \
      using T = float;                                                                          \
      __VA_ARGS__;                                                                              \
      break;                                                                                    \
    }                                                                                           \
    case ::mt::DType::kBF16: {                                                                  \
      using T = __nv_bfloat16;                                                                  \
      __VA_ARGS__;                                                                              \
      break;                                                                                    \
    }                                                                                           \
    default:                                                                                    \
      throw ::mt::Error(::mt::ErrorKind::kNotSupported, "cuda kernels: f16 activations are not implemented (use bf16)"); \
  }
