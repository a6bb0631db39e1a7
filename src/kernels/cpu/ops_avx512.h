// Private to kernels/cpu: the AVX-512 bodies of the kernels in ops.h. Each body is serial and works
// on one slice (a range of rows or of elements) handed out by the OpenMP driver in ops.cpp, which
// calls it only when isa_active() == Isa::kAvx512. Pointers are already offset to the slice.
//
// NOTE: this header is included by both the portable and the AVX-512 translation units, so it must
// hold declarations and plain structs only: an inline function here would be compiled twice with
// different flags and the linker could hand the AVX-512 copy to the portable path.
#pragma once

#include "kernels/cpu/ops.h"

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace mt::kernels::detail {

// Per-row kernels over N rows. Row reductions (dweight, dbias) accumulate into the given buffers,
// which the driver sets to this thread's zeroed partial sums (C) and combines in thread order.
void layernorm_forward_avx512(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int N, int C, float eps);
void layernorm_backward_avx512(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const float* mean,
                               const float* rstd, int N, int C);
void rmsnorm_forward_avx512(float* out, float* rstd, const float* inp, const float* weight, int N,
                            int C, float eps);
void rmsnorm_backward_avx512(float* dinp, float* dweight, const float* dout, const float* inp,
                             const float* weight, const float* rstd, int N, int C);
void swiglu_forward_avx512(float* out, const float* inp, int N, int I);
void swiglu_backward_avx512(float* dinp, const float* dout, const float* inp, int N, int I);
void bias_backward_avx512(float* dbias, const float* dout, int N, int C);
void cross_entropy_tile_avx512(float* loss, float* lse, float* logits, const int32_t* targets,
                               int R, int V, float grad_scale, int ld);
void vp_cross_entropy_max_avx512(float* rowmax, const float* logits, int R, int V, int valid, int ld);
void vp_cross_entropy_exp_avx512(float* sumexp, float* logits, const float* rowmax, int R, int V, int valid, int ld);

// Elementwise kernels over n contiguous elements.
void gelu_forward_avx512(float* out, const float* inp, size_t n);
void gelu_backward_avx512(float* dinp, const float* inp, const float* dout, size_t n);
// ops.h's *_lp kernels in one pass (bf16: true for bf16, false for f16).
void gelu_forward_lp_avx512(void* h_cd, void* act_cd, bool bf16, const float* h, size_t n);
void gelu_backward_lp_avx512(float* dinp, const void* h_cd, bool bf16, const float* dout, size_t n);
void swiglu_forward_lp_avx512(void* h_cd, void* act_cd, bool bf16, const float* h, int N, int I);
void swiglu_backward_lp_avx512(float* dinp, const float* dout, const void* h_cd, bool bf16, int N, int I);
void add_forward_avx512(float* out, const float* a, const float* b, size_t n);
void add_inplace_avx512(float* acc, const float* x, size_t n);
void scale_inplace_avx512(float* x, float s, size_t n);
double sum_squares_avx512(const float* x, size_t n);

// AdamW with the per-step scalars folded once by the driver (PyTorch computes them in double and
// the tensor ops see them as f32):
//   g = grad * grad_scale;  m = beta1 m + (1-beta1) g;  v = beta2 v + (1-beta2) g^2
//   p = p * decay;  p = p - step_size * m / (sqrt(v) / bc2_sqrt + eps)
// with decay = 1 - lr wd, step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t).
using AdamWScalars = ::mt::kernels::AdamWScalars;
// lowp (n elements of lowp_dtype) may be nullptr.
void adamw_update_avx512(float* master, const float* grad, float* m, float* v, void* lowp,
                         DType lowp_dtype, size_t n, const AdamWScalars& s);

// ops.h's LAMB passes (one chunk each).
::mt::kernels::LambSums lamb_moments_avx512(float* m, float* v, const float* grad, const float* master, size_t n,
                                            const ::mt::kernels::LambScalars& s);
void lamb_apply_avx512(float* master, const float* m, const float* v, void* lowp, DType lowp_dtype, size_t n,
                       float scale, const ::mt::kernels::LambScalars& s);
::mt::kernels::OneBitLambSums onebit_lamb_refresh_avx512(float* m, float* v_fresh, const float* m_last, const float* v,
                                                         const float* master, size_t n,
                                                         const ::mt::kernels::OneBitLambScalars& s);

}  // namespace mt::kernels::detail
