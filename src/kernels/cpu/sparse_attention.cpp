// Block-sparse flash attention (sparse_attention.h): the FlashAttention-2 recurrences of
// attention.cpp (see its header comment), run over the plan's blocks with attention.cpp's tile
// primitives (attention_tiles.h).
//
// Forward, per (b, h, query block row): the row's key blocks, up to 64 keys' worth at a time, are
// packed side by side into one key tile; blocks are all visible except a causal diagonal block,
// which is the last of its row, so the tile's band is diag = its offset in the tile.
// Backward, per (b, kv head) (one thread owns dK, dV and its query heads' dQ: deterministic sums):
// per key block column, its query blocks, up to 64 rows at a time, are packed into one query tile;
// a causal diagonal block is the first of its column (diag = 0); dQ is added block by block into a
// packed per-thread (group, T, HS) buffer, copied into dqkv once per unit.
#include "kernels/cpu/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"
#include "kernels/cpu/attention_tiles.h"

namespace mt::kernels {
namespace {

using namespace detail;

constexpr int kLd = kAttnTile;

std::string dims(int a, int b) {
  return std::to_string(a) + " vs " + std::to_string(b);
}

void check_plan(const char* where, const SparseAttentionPlan& plan, int B, int T, int NH, int NKV,
                int HS) {
  attn_check_dims(where, B, T, NH, NKV, HS);
  MT_CHECK(
      plan.num_heads == NH, ErrorKind::kInvalidArgument,
      std::string(where) + ": the plan's heads do not match NH (" + dims(plan.num_heads, NH) + ")");
  MT_CHECK(plan.seq_len() == T, ErrorKind::kInvalidArgument,
           std::string(where) + ": the plan's length num_blocks * block does not match T (" +
               dims(plan.seq_len(), T) + ")");
}

}  // namespace

SparseAttentionPlan sparse_attention_plan(const uint8_t* layout, int num_heads, int num_blocks,
                                          int block, bool causal) {
  MT_CHECK(num_heads > 0 && num_blocks > 0 && block > 0, ErrorKind::kInvalidArgument,
           "sparse_attention_plan: bad layout dims heads=" + std::to_string(num_heads) +
               " blocks=" + std::to_string(num_blocks) + " block=" + std::to_string(block));
  const int parts = (block + kAttnTile - 1) / kAttnTile;
  MT_CHECK(block % parts == 0, ErrorKind::kNotSupported,
           "sparse_attention_plan: block " + std::to_string(block) +
               " does not split into equal parts of at most " + std::to_string(kAttnTile));
  SparseAttentionPlan plan;
  plan.num_heads = num_heads;
  plan.num_blocks = num_blocks * parts;
  plan.block = block / parts;
  plan.causal = causal;
  const int nb = plan.num_blocks;
  const size_t lines = static_cast<size_t>(num_heads) * nb;
  plan.row_begin.assign(lines + 1, 0);
  plan.col_begin.assign(lines + 1, 0);
  std::vector<int> col_count(lines, 0);
  for (int h = 0; h < num_heads; ++h)
    for (int r = 0; r < nb; ++r) {
      const uint8_t* row = layout + (static_cast<size_t>(h) * num_blocks + r / parts) * num_blocks;
      for (int c = 0; c < (causal ? r + 1 : nb); ++c)
        if (row[c / parts] != 0) {
          plan.row_columns.push_back(c);
          ++col_count[static_cast<size_t>(h) * nb + c];
        }
      plan.row_begin[static_cast<size_t>(h) * nb + r + 1] =
          static_cast<int>(plan.row_columns.size());
    }
  // CSC by counting: entries visited in (h, r) order land in each column in ascending r.
  for (size_t i = 0; i < lines; ++i) plan.col_begin[i + 1] = plan.col_begin[i] + col_count[i];
  plan.col_rows.resize(plan.row_columns.size());
  std::vector<int> next(plan.col_begin.begin(), plan.col_begin.end() - 1);
  for (int h = 0; h < num_heads; ++h)
    for (int r = 0; r < nb; ++r) {
      const size_t line = static_cast<size_t>(h) * nb + r;
      for (int k = plan.row_begin[line]; k < plan.row_begin[line + 1]; ++k)
        plan.col_rows[next[static_cast<size_t>(h) * nb + plan.row_columns[k]]++] = r;
    }
  return plan;
}

SparseAttentionPlan sparse_attention_plan(const SparseLayout& layout, bool causal) {
  return sparse_attention_plan(layout.blocks.data(), layout.num_heads, layout.num_blocks,
                               layout.block, causal);
}

void sparse_attention_forward(float* out, float* lse, const float* qkv,
                              const SparseAttentionPlan& plan, int B, int T, int NH, int NKV,
                              int HS) {
  check_plan("sparse_attention_forward", plan, B, T, NH, NKV, HS);
  const AttnTileOps ops = attn_tile_ops();
  const int C3 = (NH + 2 * NKV) * HS;
  const int group = NH / NKV;
  const int nb = plan.num_blocks, blk = plan.block, per_tile = kAttnTile / blk;
  const float c = kAttnLog2e / std::sqrt(static_cast<float>(HS));
  const long units = static_cast<long>(B) * NH * nb;
#pragma omp parallel
  {
    AttnForwardTiles tiles(HS);  // Kp, Vp: the row's key and value blocks, side by side
#pragma omp for schedule(dynamic, 1)
    for (long u = 0; u < units; ++u) {
      const int r = nb - 1 - static_cast<int>(u % nb);  // causal rows grow: longest first
      const int h = static_cast<int>(u / nb % NH);
      const int b = static_cast<int>(u / nb / NH);
      const int q0 = r * blk;
      const long row0 = static_cast<long>(b) * T;
      ops.transpose(tiles.Qt, qkv + (row0 + q0) * C3 + h * HS, C3, blk, HS);
      tiles.start(blk, HS);
      const size_t line = static_cast<size_t>(h) * nb + r;
      const int end = plan.row_begin[line + 1];
      for (int k0 = plan.row_begin[line]; k0 < end; k0 += per_tile) {
        const int n = std::min(per_tile, end - k0), cols = n * blk;
        for (int i = 0; i < n; ++i) {
          const long j0 = row0 + static_cast<long>(plan.row_columns[k0 + i]) * blk;
          const float* K = qkv + j0 * C3 + (NH + h / group) * HS;
          attn_pack_rows(tiles.Kp + i * blk * HS, K, C3, blk, HS);
          attn_pack_rows(tiles.Vp + i * blk * HS, K + NKV * HS, C3, blk, HS);
        }
        const bool on_diagonal = plan.causal && plan.row_columns[k0 + n - 1] == r;
        const int diag = on_diagonal ? (n - 1) * blk : kAttnNoLimit;
        tiles.add_keys(ops, cols, blk, diag, HS, c);
      }
      tiles.finish(out + (row0 + q0) * NH * HS + h * HS, NH * HS,
                   lse + (static_cast<long>(b) * NH + h) * T + q0, blk, HS);
    }
  }
}

void sparse_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                               const float* lse, const SparseAttentionPlan& plan, int B, int T,
                               int NH, int NKV, int HS) {
  check_plan("sparse_attention_backward", plan, B, T, NH, NKV, HS);
  const AttnTileOps ops = attn_tile_ops();
  const int C3 = (NH + 2 * NKV) * HS;
  const int C = NH * HS;
  const int group = NH / NKV;
  const int nb = plan.num_blocks, blk = plan.block, per_tile = kAttnTile / blk;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const float c = scale * kAttnLog2e;
  const long units = static_cast<long>(B) * NKV;
#pragma omp parallel
  {
    AttnBackwardTiles tiles(HS, static_cast<size_t>(group) * T);  // Qp...D_t: gathered blocks
    float *dP = tiles.dP, *Kp = tiles.Kp, *Qp = tiles.Qp, *dOp = tiles.dOp, *D = tiles.D;
    float *lse_t = tiles.lse_t, *D_t = tiles.D_t;
    // (group, T, HS): dQ of the unit's query heads, rows packed rather than C3 apart in dqkv: each
    // (query block, key block) pair adds to 16..64 of them.
    AttnScratch dq_scratch(static_cast<size_t>(group) * T * HS);
    float* dQ = dq_scratch.data();
#pragma omp for schedule(dynamic, 1)
    for (long u = 0; u < units; ++u) {
      const int b = static_cast<int>(u / NKV), kvh = static_cast<int>(u % NKV);
      const long row0 = static_cast<long>(b) * T;
      attn_backward_begin(D, dqkv, out, dout, b, kvh, T, NH, NKV, HS);
      std::fill(dQ, dQ + static_cast<size_t>(group) * T * HS, 0.0f);
      for (int jb = 0; jb < nb; ++jb) {
        const int j0 = jb * blk;
        const long kofs = (row0 + j0) * C3 + (NH + kvh) * HS;
        const long vofs = kofs + NKV * HS;
        tiles.load_keys(ops, qkv + kofs, qkv + vofs, C3, blk, HS);
        for (int g = 0; g < group; ++g) {
          const int h = kvh * group + g;
          const size_t line = static_cast<size_t>(h) * nb + jb;
          const int end = plan.col_begin[line + 1];
          for (int k0 = plan.col_begin[line]; k0 < end; k0 += per_tile) {
            const int n = std::min(per_tile, end - k0), rows = n * blk;
            for (int i = 0; i < n; ++i) {
              const int q0 = plan.col_rows[k0 + i] * blk;
              attn_pack_rows(Qp + i * blk * HS, qkv + (row0 + q0) * C3 + h * HS, C3, blk, HS);
              attn_pack_rows(dOp + i * blk * HS, dout + (row0 + q0) * C + h * HS, C, blk, HS);
              std::copy_n(lse + (static_cast<long>(b) * NH + h) * T + q0, blk, lse_t + i * blk);
              std::copy_n(D + static_cast<long>(g) * T + q0, blk, D_t + i * blk);
            }
            const int diag = plan.causal && plan.col_rows[k0] == jb ? 0 : kAttnNoLimit;
            tiles.add_queries(ops, lse_t, D_t, rows, blk, diag, HS, c, scale);
            for (int i = 0; i < n; ++i) {
              float* dq = dQ + (static_cast<size_t>(g) * T + plan.col_rows[k0 + i] * blk) * HS;
              ops.accumulate(dq, HS, dP + i * blk * kLd, kLd, 1, Kp, HS, blk, blk, HS,
                             -kAttnNoLimit, i == 0 ? diag : kAttnNoLimit, nullptr);
            }
          }
        }
        tiles.store_keys(dqkv + kofs, dqkv + vofs, C3, blk, HS);
      }
      for (int g = 0; g < group; ++g)
        attn_unpack_rows(dqkv + row0 * C3 + (kvh * group + g) * HS, C3,
                         dQ + static_cast<size_t>(g) * T * HS, T, HS);
    }
  }
}

}  // namespace mt::kernels
