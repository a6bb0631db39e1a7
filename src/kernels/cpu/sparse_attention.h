// Block-sparse self-attention (DeepSpeed's sparse_attention) with grouped-query heads, computed
// FlashAttention-style over the non-empty blocks of a layout only (layouts: sparse_layout.h).
// Query t of head h sees key s iff layout[h][t / block][s / block] and, when causal, s <= t
// (blocks above the diagonal are then skipped; the diagonal blocks are masked inside). Tensor
// conventions are attention.h's; nothing of size (T, T) is stored.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/sparse_layout.h"

namespace mt::kernels {

// The non-empty blocks of a layout, in both orders, built once per layout and reused by every
// forward and backward. Blocks larger than the kernels' 64-wide tiles are split into equal
// sub-blocks; `block` and `num_blocks` are those the kernels use.
struct SparseAttentionPlan {
  int num_heads = 0;
  int num_blocks = 0;  // nb: T = nb * block
  int block = 0;       // <= 64
  bool causal = false;
  std::vector<int> row_begin;    // (num_heads * nb + 1): CSR over (h, query block row)
  std::vector<int> row_columns;  // key block of each entry, ascending within a row
  std::vector<int> col_begin;    // (num_heads * nb + 1): CSC over (h, key block column)
  std::vector<int> col_rows;     // query block of each entry, ascending within a column

  int seq_len() const { return num_blocks * block; }
  size_t nonzero_blocks() const { return row_columns.size(); }
};

// layout: (num_heads, num_blocks, num_blocks), nonzero = the block is attended.
// causal: mask s > t (unidirectional) as well; bidirectional: no mask inside the blocks.
// REQUIRES: block <= 64, or block divisible into equal parts of at most 64.
SparseAttentionPlan sparse_attention_plan(const uint8_t* layout, int num_heads, int num_blocks,
                                          int block, bool causal);
SparseAttentionPlan sparse_attention_plan(const SparseLayout& layout, bool causal);

// qkv:  (B, T, (NH + 2*NKV) * HS) f32, as attention.h (query head h uses kv head h / (NH / NKV)).
// out:  (B, T, NH * HS) = softmax(q k^T / sqrt(HS), masked by the plan) v
// lse:  (B, NH, T) = log-sum-exp of each row of the scaled, masked scores.
// A query that sees no key (its block row of the layout is empty) gets out = 0 and lse = -inf
// (the log of an empty sum), and contributes no gradient.
// REQUIRES: plan.num_heads == NH, plan.seq_len() == T.
void sparse_attention_forward(float* out, float* lse, const float* qkv,
                              const SparseAttentionPlan& plan, int B, int T, int NH, int NKV,
                              int HS);

// dqkv: (B, T, (NH + 2*NKV) * HS) = gradient w.r.t. qkv (overwritten, all three parts; zero for
// queries that see nothing and keys nobody sees). Deterministic: one thread per (b, kv head).
// Each thread holds (NH / NKV) * T * (HS + 1) floats of scratch.
void sparse_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                               const float* lse, const SparseAttentionPlan& plan, int B, int T,
                               int NH, int NKV, int HS);

}  // namespace mt::kernels
