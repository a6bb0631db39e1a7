// GEMM through oneDNN's matmul primitive: f32, and bf16/f16 operands with f32 accumulation and an
// f32 result. Every transposed form backward needs is a stride choice, not a copy. Primitives are
// created once per shape and cached.
#pragma once

#include <cstddef>
#include <utility>

#include "tensor/dtype.h"

namespace mt::kernels {

// C (M, N) f32  =  op(A) (M, K) · op(B) (K, N)  [+ bias (N) f32]        (accumulate == false)
// C (M, N) f32 +=  op(A) (M, K) · op(B) (K, N)                          (accumulate == true)
// A and B have dtype ab_dtype (f32, bf16 or f16), row-major with leading dimensions lda / ldb:
//   trans_a == false: A is stored (M, K);  trans_a == true: A is stored (K, M), op(A) = A^T.
//   trans_b == false: B is stored (K, N);  trans_b == true: B is stored (N, K), op(B) = B^T.
// Uses all OpenMP threads. REQUIRES: bias == nullptr when accumulate.
void gemm(int M, int N, int K, const void* A, int lda, bool trans_a, const void* B, int ldb,
          bool trans_b, float* C, int ldc, DType ab_dtype, bool accumulate,
          const float* bias = nullptr);

// The GEMM ceiling of this process: C (M, N) = A (M, K) · B^T with ab_dtype operands, timed for
// at least `seconds` (and 3 calls) after one untimed call. TFLOP/s. Used by `meshtrain bench` and
// the flops profiler's MFU, with the model's MLP up-projection shape (B·T, I, C).
double gemm_ceiling_tflops(int M, int N, int K, DType ab_dtype, double seconds = 0.3);

// oneDNN's scratchpad: every primitive runs on one region of this process, grown to the largest
// need so far (user scratchpad mode; mapped outside the allocator, in whole 4 KiB pages).
// gemm_scratch_bytes: the bytes gemm's call of this shape and form needs, with ldb dense
// (trans_b ? K : N) and lda and ldc as given (0: dense, trans_a ? M : K and N), page-rounded;
// creates no primitive. gemm_scratch_held: the region's size now.
// With threads > 0, the need on that many OpenMP threads (oneDNN sizes its per-thread buffers by them).
size_t gemm_scratch_bytes(int M, int N, int K, bool trans_a, bool trans_b, DType ab_dtype, bool accumulate,
                          bool bias = false, int threads = 0, int lda = 0, int ldc = 0);
size_t gemm_scratch_held();

// Where oneDNN has no matmul for ab_dtype (f16 without AVX512-FP16), gemm widens A (M x K) and B
// (K x N) to f32 into two regions of the calling thread, each grown to its largest copy and kept:
// gemm_widen_bytes gives the pages a call of this shape needs in each ({0, 0} where the dtype is
// multiplied as it is); gemm_widen_held the calling thread's two regions now. gemm_widen_pages:
// the same for a machine that widens, whatever this one does (a plan for another machine's).
std::pair<size_t, size_t> gemm_widen_bytes(int M, int N, int K, DType ab_dtype);
std::pair<size_t, size_t> gemm_widen_pages(int M, int N, int K);
size_t gemm_widen_held();
// Whether oneDNN multiplies ab_dtype here as it is (f32 always; f16 only with AVX512-FP16).
bool gemm_native(DType ab_dtype);

// Number of distinct primitives created so far (to test that primitives are reused).
int gemm_primitive_count();

}  // namespace mt::kernels
