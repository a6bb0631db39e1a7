// Fused CPU kernels for transformer training, forward and backward side by side (llm.c style:
// plain functions over raw pointers, outputs first, explicit dims). Every kernel has a portable
// body and, where it pays, an AVX-512 body chosen at run time by isa_active() (base/cpu_features.h).
//
// Conventions:
//   - N = B*T rows; C channels; all activations and gradients are f32 and contiguous.
//   - "+=" in a contract means the kernel accumulates into the output; "=" means it overwrites.
//   - Kernels use all OpenMP threads; results are deterministic for a fixed thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "tensor/dtype.h"

namespace mt::kernels {

// ---- embedding ----
// out[n,:] (=) = wte[tokens[n],:] + (wpe ? wpe[p(n),:] : 0), p(n) = pos ? pos[n] : n % T
// wte: (V, C) of dtype wte_dtype (f32/bf16/f16); wpe: (>=T, C) f32 or nullptr; pos: null, or (N)
// positions in [0, T) (documents' own positions: Megatron's reset_position_ids).
// REQUIRES: tokens[n] < V (checked by the caller); a negative token gives a zero row plus wpe
// (a vocabulary-parallel shard that does not hold the token).
void embedding_forward(float* out, const int32_t* tokens, const void* wte, DType wte_dtype,
                       const float* wpe, int N, int T, int C, const int32_t* pos = nullptr);
// dwte[tokens[n],:] += dout[n,:] for tokens[n] >= 0 and tokens[n] != skip (nn.Embedding's
// padding_idx; -1: none); dwpe[p(n),:] += dout[n,:] (either may be nullptr).
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int N,
                        int T, int C, const int32_t* pos = nullptr, int32_t skip = -1);

// ---- LayerNorm: y = (x - mean) * rstd * weight + bias, rstd = 1/sqrt(var + eps) (biased var) ----
// out (N,C) =, mean (N) =, rstd (N) =; bias may be nullptr.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps);
// dinp (N,C) +=, dweight (C) +=, dbias (C) += (may be nullptr).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);

// ---- RMSNorm (LLaMA): y = x * rstd * weight, rstd = 1/sqrt(mean(x^2) + eps) ----
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps);
// dinp (N,C) +=, dweight (C) +=
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C);

// ---- GELU, tanh approximation (GPT-2's "gelu_new"):
//      y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ----
void gelu_forward(float* out, const float* inp, size_t n);                      // out =
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);  // dinp =

// ---- SwiGLU (LLaMA MLP): inp row = [gate (I) | up (I)], out = silu(gate) * up ----
void swiglu_forward(float* out, const float* inp, int N, int I);  // out (N,I) =
// dinp (N, 2I) =
void swiglu_backward(float* dinp, const float* dout, const float* inp, int N, int I);

// ---- The MLP's activation in low precision (cd bf16 or f16), fused with the roundings the block
// saves (models/block.h, DESIGN-NOTES 69): each is what round_to, the f32 kernel above and a
// conversion give in turn, element for element, but a row or a chunk at a time in cache, so the
// f32 values between them never go to memory. ----
// h (n) f32 in; h_cd = h rounded to cd (the saved pre-activation), act_cd = gelu(that) in cd.
void gelu_forward_lp(void* h_cd, void* act_cd, DType cd, const float* h, size_t n);
// dinp (n) = gelu'(h) dout, h read from its compute-dtype copy.
void gelu_backward_lp(float* dinp, const void* h_cd, DType cd, const float* dout, size_t n);
// h (N, 2I) f32 in; h_cd (N, 2I) = h rounded; act_cd (N, I) = swiglu(that) in cd.
void swiglu_forward_lp(void* h_cd, void* act_cd, DType cd, const float* h, int N, int I);
// dinp (N, 2I) = swiglu_backward(dout, h), h read from its compute-dtype copy (N, 2I).
void swiglu_backward_lp(float* dinp, const float* dout, const void* h_cd, DType cd, int N, int I);

// ---- RoPE, Hugging Face LLaMA convention (rotate_half: dim j pairs with j + HS/2) ----
// Table: inv_freq[j] = 1 / theta^(2j/HS) computed in f32; cos/sin (T, HS/2) = cos/sin(t*inv_freq[j]).
void rope_table(float* cos, float* sin, int T, int HS, float theta);
// The same table from given frequencies inv_freq (HS/2 of them: models::rope_inv_freq, which
// applies Hugging Face's rope_scaling), all in f32.
void rope_table(float* cos, float* sin, int T, int HS, const float* inv_freq);
// Hugging Face's default frequencies, 1 / theta^(2j/HS) in f32 (j < HS/2).
std::vector<float> rope_default_inv_freq(int HS, float theta);
// In place on the q and k heads of a packed qkv buffer (B, T, (NH + 2*NKV) * HS): the first NH
// heads are q, the next NKV are k, the last NKV are v (untouched). Position of row (b,t) is t, or
// pos[b*T + t] where pos (B*T, each in [0, T)) is given (Megatron's reset_position_ids).
//   x'[j] = x[j] cos - x[j+H] sin;  x'[j+H] = x[j+H] cos + x[j] sin   (H = HS/2)
void rope_forward(float* qkv, const float* cos, const float* sin, int B, int T, int NH, int NKV,
                  int HS, const int32_t* pos = nullptr);
// The transpose of rope_forward (rotation by -angle), in place on dqkv of the same layout.
void rope_backward(float* dqkv, const float* cos, const float* sin, int B, int T, int NH, int NKV,
                   int HS, const int32_t* pos = nullptr);

// ---- elementwise ----
void add_forward(float* out, const float* a, const float* b, size_t n);  // out = a + b
void add_inplace(float* acc, const float* x, size_t n);                  // acc += x
void scale_inplace(float* x, float s, size_t n);                         // x *= s
// dbias (C) += sum over rows of dout (N, C)
void bias_backward(float* dbias, const float* dout, int N, int C);

// ---- softmax cross-entropy on one tile of logits (the LM head calls this per tile) ----
// logits (R, V) f32 with rows ld apart (0: V, dense), targets (R) with -100 meaning "ignore".
// lse (R) = logsumexp of each row; loss (R) = lse - logits[target] (0 for ignored rows).
// If grad_scale != 0: logits is overwritten with dlogits = (softmax - onehot(target)) * grad_scale
// (a zero row for ignored rows).
void cross_entropy_tile(float* loss, float* lse, float* logits, const int32_t* targets, int R,
                        int V, float grad_scale, int ld = 0);

// ---- vocabulary-parallel cross-entropy (Megatron's), per tile of this shard's logits (R, V) ----
// Rows ld apart (0: V), as cross_entropy_tile's.
// Columns >= valid are vocabulary padding: never counted, their dlogits are 0.
// Phase 1: rowmax (R) = max over the valid columns (then reduced MAX over the tp group).
void vp_cross_entropy_max(float* rowmax, const float* logits, int R, int V, int valid, int ld = 0);
// Phase 2, with the group's row max: sumexp (R) = sum of exp(logit - rowmax) over the valid
// columns (then reduced SUM); logits overwritten with exp(logit - rowmax) (padding 0).
void vp_cross_entropy_exp(float* sumexp, float* logits, const float* rowmax, int R, int V, int valid, int ld = 0);
// Phase 3, with the group's sums: logits (holding the exps) scaled by scale[r] / sum[r] per row
// (scale[r] = 0 zeroes an ignored row). The caller subtracts scale[r] at the target's column.
void vp_cross_entropy_grad(float* logits, const float* sumexp, const float* scale, int R, int V, int ld = 0);

// ---- optimizer: AdamW over one flat span (Loshchilov & Hutter; PyTorch's torch.optim.AdamW) ----
//   g = grad * grad_scale
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p = p - lr * wd * p  (decoupled decay, applied before the update as PyTorch does)
//   p = p - lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
// master, m, v updated in place; if lowp != nullptr it receives p converted to lowp_dtype (RNE).
struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;  // t, 1-based, for bias correction
  float grad_scale = 1.0f;
  bool bias_correction = true;  // false: DeepSpeed's FusedAdam(bias_correction=False), bc1 = bc2 = 1
  // Adam's L2 decay (torch.optim.Adam's weight_decay; DeepSpeed's FusedAdam and DeepSpeedCPUAdam
  // with adam_w_mode false): weight_decay p is added to the scaled gradient before the moments,
  // and the weights are not decayed apart.
  bool l2 = false;
};
void adamw_update(float* master, const float* grad, float* m, float* v, void* lowp,
                  DType lowp_dtype, size_t n, const AdamWParams& params);
// The per-step constants every AdamW kernel (CPU and CUDA) applies, derived in double once:
//   m = beta1 m + one_minus_beta1 g;  v = beta2 v + one_minus_beta2 g^2  (g = grad * grad_scale + l2 p)
//   p = p * decay - step_size * m / (sqrt(v) / bc2_sqrt + eps)
// (AdamW: l2 0, decay 1 - lr weight_decay; Adam's L2 mode: l2 weight_decay, decay 1.)
struct AdamWScalars {
  float grad_scale;
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float decay;
  float l2;
  float step_size;
  float bc2_sqrt;
  float eps;
};
AdamWScalars adamw_scalars(const AdamWParams& params);

// LAMB (optim/lamb.cpp, DeepSpeed's FusedLamb), its two passes over n elements of one segment, each
// called per chunk by the optimizer (which sums the chunks' norms per segment). With
//   g = grad * grad_scale;  m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   u = m_hat / denom + weight_decay p   (m_hat = m / bias_correction1, v_hat = v / bias_correction2;
//                                          denom: sqrt(v_hat + eps) if eps_inside_sqrt, else sqrt(v_hat) + eps)
// lamb_moments writes m and v and returns the sums of p^2 and u^2 (in double); lamb_apply then
// takes p = p - scale u (u from the m and v it wrote) and, if lowp != nullptr, writes p's copy in
// lowp_dtype (RNE).
struct LambScalars {
  float grad_scale = 1.0f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool eps_inside_sqrt = false;
  // 1 - beta^step, or 1 without bias correction: DeepSpeed's kernel divides m and v by them (LAMB's
  // Algorithm 2); it folded them into the step size before, which the trust ratio then undid.
  float bias_correction1 = 1.0f, bias_correction2 = 1.0f;
};
struct LambSums {
  double w = 0.0, u = 0.0;  // sum of p^2, sum of u^2
};
LambSums lamb_moments(float* m, float* v, const float* grad, const float* master, size_t n, const LambScalars& s);
void lamb_apply(float* master, const float* m, const float* v, void* lowp, DType lowp_dtype, size_t n, float scale,
                const LambScalars& s);

// 1-bit LAMB's refresh of n elements of one segment after its momentum exchange
// (optim/onebit_lamb.cpp, DeepSpeed's OnebitLamb), per element:
//   m = m / scale;  g = (m - m_last beta1) / one_minus_beta1;  v_fresh = beta2 v_fresh + one_minus_beta2 g^2
//   denom = sqrt(v) + eps;  prelim = m / denom;  u = prelim + weight_decay p  (weight_decay > 0)
// returning the sums of u^2 and prelim^2 (double) and the largest denom / (sqrt(v_fresh) + eps)
// (-inf for n = 0).
struct OneBitLambScalars {
  float scale = 1.0f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float one_minus_beta1 = 0.1f, one_minus_beta2 = 0.001f;  // the caller's rounding of 1 - beta
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};
struct OneBitLambSums {
  double u = 0.0, prelim = 0.0;
  float ratio_max = -std::numeric_limits<float>::infinity();
};
OneBitLambSums onebit_lamb_refresh(float* m, float* v_fresh, const float* m_last, const float* v, const float* master,
                                   size_t n, const OneBitLambScalars& s);

// ---- reductions ----
// Sum of squares in double (deterministic for a fixed thread count). Non-finite if any x is
// non-finite: this is the cheap overflow check of the f16 path.
double sum_squares(const float* x, size_t n);

}  // namespace mt::kernels
