// Fused CUDA kernels with the contracts of kernels/cpu/ops.h and kernels/cpu/attention.h, over
// device pointers, on the compute stream (device.h). Where the CPU kernel's activations are f32,
// the GPU kernel takes them in a compute dtype `dt` (f32 or bf16) given per call: "T" below.
// Statistics (mean, rstd, lse, losses), the residual stream and every gradient of a parameter stay
// f32. Reductions over rows (LayerNorm/RMSNorm weight grads, bias grads, sums of squares) run in
// a fixed order, and so does the embedding's weight gradient (tokens bucketed on the host): results
// are deterministic for a given shape, run after run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/ops.h"  // AdamWParams
#include "tensor/dtype.h"

namespace mt::cuda {

// out (N,C) f32 = wte[tokens[n]] + (wpe ? wpe[n % T] : 0); wte in wte_dtype, wpe f32.
void embedding_forward(float* out, const int32_t* tokens, const void* wte, DType wte_dtype,
                       const float* wpe, int N, int T, int C);
// The host side of the embedding's backward: positions grouped by token (counting sort, position
// order kept), as `out` = positions (N), distinct tokens (U), starts (U + 1); returns U.
int embedding_buckets(const int32_t* tokens, int N, int V, std::vector<int32_t>& out);
// dwte[tokens[n]] += dout[n] from the device copy of embedding_buckets' output, one block per
// distinct token summing its rows in position order (deterministic: no atomics);
// dwpe[t] += sum_b dout[b, t] (dwpe may be nullptr).
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* buckets, int unique,
                        int N, int T, int C);

// out (N,C) T =; mean, rstd (N) = (mean may be nullptr for RMSNorm). bias may be nullptr.
void layernorm_forward(void* out, DType dt, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C, float eps);
// dinp +=, dweight +=, dbias += (nullable); dout f32. Fused extras for the layer below (nullable):
// dinp_copy = the updated dinp in copy_dtype (the next GEMM's input), dinp_colsum += its column
// sums (the next bias gradient). One pass over the rows where C <= 1024.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C, void* dinp_copy = nullptr, DType copy_dtype = DType::kBF16,
                        float* dinp_colsum = nullptr);
void rmsnorm_forward(void* out, DType dt, float* rstd, const float* inp, const float* weight,
                     int N, int C, float eps);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C);

void gelu_forward(void* out, const void* inp, DType dt, size_t n);                    // out =
void gelu_backward(void* dinp, const void* inp, const void* dout, DType dt, size_t n);  // dinp =
// dinp (N, H) = gelu'(inp) * dout and dbias (H) += its column sums, in one pass where H allows.
void gelu_backward_bias(void* dinp, float* dbias, const void* inp, const void* dout, DType dt, int N, int H);
void swiglu_forward(void* out, const void* inp, DType dt, int N, int I);               // (N,I) =
void swiglu_backward(void* dinp, const void* dout, const void* inp, DType dt, int N, int I);  // (N,2I) =

// In place on a packed qkv (B, T, (NH + 2 NKV) HS) of dtype dt; cos/sin (T, HS/2) f32.
void rope_forward(void* qkv, DType dt, const float* cos, const float* sin, int B, int T, int NH,
                  int NKV, int HS);
void rope_backward(void* dqkv, DType dt, const float* cos, const float* sin, int B, int T, int NH,
                   int NKV, int HS);

void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n);
void add_inplace(float* acc, const float* x, size_t n);  // acc += x
// dbias (C) += column sums of dout (N, C) of dtype dt.
void bias_backward(float* dbias, const void* dout, DType dt, int N, int C);
// d (M, N) of dtype dt with leading dimension ld += bias (N) on every row.
void add_bias(void* d, DType dt, const float* bias, int M, int N, int ld);

// Softmax cross-entropy on a tile of logits (R, V) of dtype logits_dtype (f32, or bf16 as the bf16
// head GEMM writes them, like PyTorch's autocast) with leading dimension ld_logits; the arithmetic
// is f32. loss (R) = lse - logits[target] (0 for target -100); lse (R) = row log-sum-exp
// (nullable). If grad_scale != 0: dlogits (R, V) of dtype dl_dtype, leading dimension ld_dl,
// receives (softmax - onehot(target)) * grad_scale (zero rows for ignored targets); it may be the
// logits themselves (same dtype and leading dimension: in place).
void cross_entropy_tile(float* loss, float* lse, const void* logits, DType logits_dtype, int ld_logits,
                        const int32_t* targets, int R, int V, float grad_scale, void* dlogits,
                        DType dl_dtype, int ld_dl);

// AdamW over one flat span, the CPU kernel's formula (kernels/cpu/ops.h); lowp nullable.
void adamw_update(float* master, const float* grad, float* m, float* v, void* lowp,
                  DType lowp_dtype, size_t n, const kernels::AdamWParams& params);
// Sum of squares in double; waits for the result. Non-finite if any element is.
double sum_squares(const float* x, size_t n);

// Causal attention with grouped-query heads (the contract of kernels/cpu/attention.h) on a packed
// qkv of dtype dt: out (B, T, NH HS) T =, lse (B, NH, T) f32 =. Tensor cores (bf16, HS 64 or 128)
// tile by tile with an online softmax, FlashAttention-2 style: O(T) saved; other shapes and f32
// use a plain kernel with the same contract.
void attention_forward(void* out, float* lse, const void* qkv, DType dt, int B, int T, int NH,
                       int NKV, int HS);
// dqkv (B, T, (NH + 2 NKV) HS) T = (all three parts). dout, out: (B, T, NH HS) T.
void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                        const float* lse, DType dt, int B, int T, int NH, int NKV, int HS);
// Force the plain attention kernels (tests compare both paths).
void set_attention_plain(bool plain);

// Test and benchmark helpers: uniform(-1, 1) values from a counter-based generator.
void fill_random_bf16(void* dst, size_t n, uint64_t seed);

}  // namespace mt::cuda
