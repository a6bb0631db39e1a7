// y (M, N) f32 = x (M, K) · W^T [+ bias (N)] for a few rows of bf16 operands: a decode step's GEMMs
// (serve/generator.h with bf16 weights: one row per sequence). W is (N, K) row-major, each of its
// rows read once for all M rows, so the step streams the weights near memory bandwidth; oneDNN's
// bf16 matmul at M = 1 to 8 ran at 17-30 GB/s of weights here (PERF (ee)). The AVX-512 body sums
// with vdpbf16ps (pairs of products in f32); the portable one widens to f32 in 16 partial sums.
#pragma once

#include <cstddef>

#include "tensor/dtype.h"

namespace mt::kernels {

// The most rows gemv_bf16 takes (one accumulator register a row).
inline constexpr int kGemvBf16MaxRows = 8;

// REQUIRES: 1 <= M <= kGemvBf16MaxRows, N >= 1, K >= 1; bias may be nullptr. Uses the OpenMP
// threads over N.
void gemv_bf16(int M, int N, int K, const bf16_t* x, const bf16_t* w, float* y, const float* bias);

namespace detail {
// The AVX-512 body over output columns [n0, n1) (kernels/cpu/gemv_bf16_avx512.cpp).
void gemv_bf16_avx512(int M, int N, int K, const bf16_t* x, const bf16_t* w, float* y, const float* bias, int n0, int n1);
}  // namespace detail

}  // namespace mt::kernels
