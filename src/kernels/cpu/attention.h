// Causal self-attention with grouped-query heads, computed tile by tile with an online softmax
// (FlashAttention, Dao et al. 2022): no (T, T) matrix is stored; forward saves only the output and
// the row log-sum-exp (O(T) per head), backward recomputes the scores tile by tile.
#pragma once

namespace mt::kernels {

// qkv:  (B, T, (NH + 2*NKV) * HS) f32 — per row: NH query heads, then NKV key heads, then NKV
//       value heads, each HS wide. Query head h attends with kv head h / (NH / NKV)
//       (Hugging Face's repeat_kv). REQUIRES: NH % NKV == 0.
// out:  (B, T, NH * HS) =   softmax(q k^T / sqrt(HS), causal) v
// lse:  (B, NH, T) =        log-sum-exp of each row of the scaled, masked scores
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int NKV,
                       int HS);

// dqkv: (B, T, (NH + 2*NKV) * HS) = gradient w.r.t. qkv (overwritten, all three parts).
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int NH, int NKV, int HS);

}  // namespace mt::kernels
