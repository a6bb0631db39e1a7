// Causal self-attention with grouped-query heads, computed tile by tile with an online softmax
// (FlashAttention, Dao et al. 2022): no (T, T) matrix is stored; forward saves only the output and
// the row log-sum-exp (O(T) per head), backward recomputes the scores tile by tile.
#pragma once

#include <cstdint>

#include "kernels/cpu/dropout.h"

namespace mt::kernels {

// Dropout on the attention probabilities (Hugging Face's attn_dropout / attention_dropout), as
// torch applies it after the softmax: out = (P ⊙ M / (1 - p)) v, the mask M of kernels/cpu/dropout.h
// (head key drop_head_key(site_key, head0 + h), sample sample0 + b). The backward makes the same
// mask: dP = (dO v^T) ⊙ M / (1 - p), dV = (P ⊙ M / (1 - p))^T dO, and D = rowsum(dO ⊙ O) as without.
struct AttnDropout {
  uint64_t site_key = 0;
  DropRate rate;
  uint64_t sample0 = 0;
  int head0 = 0;  // this rank's first head among the model's (tensor parallelism)
};

// qkv:  (B, T, (NH + 2*NKV) * HS) f32 — per row: NH query heads, then NKV key heads, then NKV
//       value heads, each HS wide. Query head h attends with kv head h / (NH / NKV)
//       (Hugging Face's repeat_kv). REQUIRES: NH % NKV == 0.
// out:  (B, T, NH * HS) =   softmax(q k^T / sqrt(HS), causal) v
// lse:  (B, NH, T) =        log-sum-exp of each row of the scaled, masked scores
// kstart: null, or (B, T): query (b, t) sees only keys at positions j with kstart[b, t] <= j <= t
// (documents packed into one sample: Megatron's reset_attention_mask). REQUIRES: 0 <= kstart[b, t]
// <= t, and non-decreasing in t. Key tiles no query of a tile sees are skipped.
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int NKV,
                       int HS, const AttnDropout* drop = nullptr, const int32_t* kstart = nullptr);

// dqkv: (B, T, (NH + 2*NKV) * HS) = gradient w.r.t. qkv (overwritten, all three parts).
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int NH, int NKV, int HS,
                        const AttnDropout* drop = nullptr, const int32_t* kstart = nullptr);

// The (query, key) pairs of the tiles attention_forward and attention_backward compute for one
// head of one sequence of length T: every tile that holds a pair some query sees, whole (rows x
// cols), the diagonal's included. kstart: null (causal: T = 64 n gives 64^2 n(n+1)/2), or the
// sequence's (T) key starts as attention_forward takes them. The cost model prices documents by
// its ratio to the causal count (planner::StepShape::attention_share).
double attention_tile_pairs(int T, const int32_t* kstart = nullptr);

}  // namespace mt::kernels
