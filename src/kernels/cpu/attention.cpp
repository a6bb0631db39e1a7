// Causal grouped-query attention, FlashAttention-2 style (Dao 2023): a tiling driver plus a table
// of tile primitives (attention_avx512.h), portable here, AVX-512 in attention_avx512.cpp.
//
// Forward, per (b, h, query tile), over the key tiles it can see, with m, l running per query:
//   S = Q K^T;  m' = max(m, c*max S);  P = 2^(c*S - m');  l = l*2^(m - m') + sum P;
//   O = O*2^(m - m') + P V;  at the end O /= l, lse = (m + log2 l) * ln 2;  c = log2(e)/sqrt(HS).
// The forward holds S transposed (keys x queries): Q is transposed once per query tile, key tiles
// are only packed, never transposed, and the softmax runs down columns with no horizontal reduction.
// Backward, per (b, kv head): one thread owns the kv head's dK, dV and its query heads' dQ, so the
// sums over query heads need no atomics and are deterministic. D = rowsum(dO * O); per key tile
// (outer), query head, query tile (inner), recomputing P from lse:
//   dV += P^T dO;  dP = dO V^T;  dS = P * (dP - D) / sqrt(HS);  dK += dS^T Q;  dQ += dS K.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "base/cpu_features.h"
#include "base/error.h"
#include "kernels/cpu/attention_tiles.h"

namespace mt::kernels {
namespace {

using namespace detail;

constexpr int kLd = kAttnTile;
constexpr float kLog2e = kAttnLog2e;

// ---- portable tile primitives (same contracts as the _avx512 ones) ----

// 2^x for x <= 0 (clamped to [-126, 0]), Cephes exp2f polynomial; plain code GCC can vectorise.
inline float exp2_poly(float x) {
  x = std::min(std::max(x, -126.0f), 0.0f);
  float n = (x + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 * 2^23 trick)
  float f = x - n;
  float p = 1.535336188319500e-4f;
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.0f;
  return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

int visible(int i, int cols, int diag) {
  return std::clamp(i + diag + 1, 0, cols);
}

void transpose_portable(float* Xt, const float* X, int ldx, int n, int HS) {
  const int width = (n + 15) / 16 * 16;
  for (int d = 0; d < HS; ++d) {
    float* xt = Xt + d * kLd;
    for (int j = 0; j < n; ++j) xt[j] = X[j * ldx + d];
    std::fill(xt + n, xt + width, 0.0f);
  }
}

void scores_portable(float* S, const float* A, int lda, const float* Bt, int rows, int cols, int HS,
                     int lo, int hi) {
  for (int r = 0; r < rows; ++r) {
    const int jb = std::max(0, r + lo), je = std::min(cols, r + hi + 1);
    float* s = S + r * kLd;
    std::fill(s + jb, s + std::max(jb, je), 0.0f);
    for (int d = 0; d < HS; ++d) {
      const float a = A[r * lda + d];
      const float* bt = Bt + d * kLd;
      for (int j = jb; j < je; ++j) s[j] += a * bt[j];
    }
  }
}

// Column-wise online softmax (St is keys x queries), row by row so the inner loops vectorise.
void softmax_fwd_portable(float* St, float* m, float* l, float* alpha, int keys, int queries,
                          int diag, float c) {
  float m_new[kAttnTile], sum[kAttnTile];
  std::fill(m_new, m_new + queries, -INFINITY);
  std::fill(sum, sum + queries, 0.0f);
  for (int j = 0; j < keys; ++j) {
    const float* s = St + j * kLd;
    for (int i = std::max(0, j - diag); i < queries; ++i) m_new[i] = std::max(m_new[i], s[i] * c);
  }
  for (int i = 0; i < queries; ++i) {
    m_new[i] = std::max(m[i], m_new[i]);
    alpha[i] = m_new[i] == -INFINITY ? 1.0f : std::exp2(m[i] - m_new[i]);
  }
  for (int j = 0; j < keys; ++j) {
    float* s = St + j * kLd;
    const int ib = std::clamp(j - diag, 0, queries);
    std::fill(s, s + ib, 0.0f);
    for (int i = ib; i < queries; ++i) {
      s[i] = exp2_poly(s[i] * c - m_new[i]);
      sum[i] += s[i];
    }
  }
  for (int i = 0; i < queries; ++i) {
    l[i] = l[i] * alpha[i] + sum[i];
    m[i] = m_new[i];
  }
}

void softmax_bwd_portable(float* S, float* dP, const float* lse, const float* D, int rows, int cols,
                          int diag, float c, float scale) {
  const int width = (cols + 15) / 16 * 16;
  for (int i = 0; i < rows; ++i) {
    float* s = S + i * kLd;
    float* dp = dP + i * kLd;
    int n = visible(i, cols, diag);
    float lse2 = lse[i] * kLog2e;
    for (int j = 0; j < n; ++j) {
      s[j] = exp2_poly(s[j] * c - lse2);
      dp[j] = scale * s[j] * (dp[j] - D[i]);
    }
    std::fill(s + n, s + width, 0.0f);
    std::fill(dp + n, dp + width, 0.0f);
  }
}

void accumulate_portable(float* C, int ldc, const float* A, int sa_r, int sa_k, const float* X,
                         int ldx, int rows, int K, int HS, int lo, int hi, const float* alpha) {
  for (int r = 0; r < rows; ++r) {
    float* c = C + r * ldc;
    if (alpha != nullptr)
      for (int d = 0; d < HS; ++d) c[d] *= alpha[r];
    int kb = std::max(0, r + lo), ke = std::min(K, r + hi + 1);
    for (int k = kb; k < ke; ++k) {
      float a = A[r * sa_r + k * sa_k];
      const float* x = X + k * ldx;
      for (int d = 0; d < HS; ++d) c[d] += a * x[d];
    }
  }
}

}  // namespace

namespace detail {

AttnTileOps attn_tile_ops() {
  if (isa_active() == Isa::kAvx512)
    return {attn_transpose_avx512, attn_scores_avx512, attn_softmax_fwd_avx512,
            attn_softmax_bwd_avx512, attn_accumulate_avx512};
  return {transpose_portable, scores_portable, softmax_fwd_portable, softmax_bwd_portable,
          accumulate_portable};
}

void attn_check_dims(const char* where, int B, int T, int NH, int NKV, int HS) {
  MT_CHECK(B >= 0 && T >= 0 && NH > 0 && NKV > 0 && HS > 0 && NH % NKV == 0,
           ErrorKind::kInvalidArgument,
           std::string(where) + ": bad dims B=" + std::to_string(B) + " T=" + std::to_string(T) +
               " NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV) +
               " HS=" + std::to_string(HS) + " (REQUIRES NH % NKV == 0)");
}

void attn_backward_begin(float* D, float* dqkv, const float* out, const float* dout, int b, int kvh,
                         int T, int NH, int NKV, int HS) {
  const int C = NH * HS, C3 = (NH + 2 * NKV) * HS, group = NH / NKV;
  const long row0 = static_cast<long>(b) * T;
  for (int g = 0; g < group; ++g) {
    const int h = kvh * group + g;
    for (int t = 0; t < T; ++t) {
      const float* o = out + (row0 + t) * C + h * HS;
      const float* dout_row = dout + (row0 + t) * C + h * HS;
      float sum = 0.0f;
      for (int d = 0; d < HS; ++d) sum += o[d] * dout_row[d];
      D[static_cast<long>(g) * T + t] = sum;
      float* dq = dqkv + (row0 + t) * C3 + h * HS;
      std::fill(dq, dq + HS, 0.0f);
    }
  }
}

AttnForwardTiles::AttnForwardTiles(int HS)
    : scratch(4 * static_cast<size_t>(HS) * kLd + kAttnTile * kLd + 3 * kAttnTile) {
  const size_t tile_hs = static_cast<size_t>(HS) * kLd;
  Qt = scratch.data();
  O = Qt + tile_hs;
  St = O + tile_hs;
  m = St + kAttnTile * kLd;
  l = m + kAttnTile;
  alpha = l + kAttnTile;
  Kp = alpha + kAttnTile;
  Vp = Kp + tile_hs;
}

void AttnForwardTiles::start(int rows, int HS) {
  std::fill(O, O + rows * HS, 0.0f);
  std::fill(m, m + kAttnTile, -INFINITY);
  std::fill(l, l + kAttnTile, 0.0f);
}

void AttnForwardTiles::finish(float* out, int ldo, float* lse, int rows, int HS) const {
  for (int i = 0; i < rows; ++i) {
    float* o = out + static_cast<long>(i) * ldo;
    if (l[i] == 0.0f) {
      std::fill(o, o + HS, 0.0f);
      lse[i] = -INFINITY;
      continue;
    }
    const float inv = 1.0f / l[i];
    for (int d = 0; d < HS; ++d) o[d] = O[i * HS + d] * inv;
    lse[i] = m[i] / kLog2e + std::log(l[i]);
  }
}

void AttnForwardTiles::add_keys(const AttnTileOps& ops, int keys, int queries, int diag, int HS,
                                float c, const AttnDropTile* drop, const AttnDocTile* doc) {
  ops.scores(St, Kp, HS, Qt, keys, queries, HS, -diag, kAttnNoLimit);
  if (doc) attn_mask_documents(St, 1, kLd, queries, keys, *doc);  // St is keys x queries
  ops.softmax_fwd(St, m, l, alpha, keys, queries, diag, c);
  // Dropout after the running sums took the probabilities: l normalises the undropped row.
  if (drop) dropout_tile(St, kLd, true, queries, keys, drop->head_key, *drop->rate, drop->sample, drop->q0, drop->j0);
  ops.accumulate(O, HS, St, 1, kLd, Vp, HS, queries, keys, HS, -kAttnNoLimit, diag, alpha);
}

AttnBackwardTiles::AttnBackwardTiles(int HS, size_t d_size)
    : scratch(7 * static_cast<size_t>(HS) * kLd + 2 * kAttnTile * kLd + 2 * kAttnTile + d_size) {
  const size_t tile_hs = static_cast<size_t>(HS) * kLd;
  Kt = scratch.data();
  Vt = Kt + tile_hs;
  dK = Vt + tile_hs;
  dV = dK + tile_hs;
  S = dV + tile_hs;
  dP = S + kAttnTile * kLd;
  Kp = dP + kAttnTile * kLd;
  Qp = Kp + tile_hs;
  dOp = Qp + tile_hs;
  lse_t = dOp + tile_hs;
  D_t = lse_t + kAttnTile;
  D = D_t + kAttnTile;
}

void AttnBackwardTiles::load_keys(const AttnTileOps& ops, const float* K, const float* V, int ld,
                                  int cols, int HS) {
  ops.transpose(Kt, K, ld, cols, HS);
  ops.transpose(Vt, V, ld, cols, HS);
  attn_pack_rows(Kp, K, ld, cols, HS);
  std::fill(dK, dK + cols * HS, 0.0f);
  std::fill(dV, dV + cols * HS, 0.0f);
}

void AttnBackwardTiles::add_queries(const AttnTileOps& ops, const float* lse, const float* D_rows,
                                    int rows, int cols, int diag, int HS, float c, float scale,
                                    const AttnDropTile* drop, const AttnDocTile* doc) {
  ops.scores(S, Qp, HS, Kt, rows, cols, HS, -kAttnNoLimit, diag);
  if (doc) attn_mask_documents(S, kLd, 1, rows, cols, *doc);
  ops.scores(dP, dOp, HS, Vt, rows, cols, HS, -kAttnNoLimit, diag);
  // Dropout: the dropped probabilities' gradient (dO v^T) ⊙ M / (1 - p), then P ⊙ M / (1 - p) for dV.
  if (drop) dropout_tile(dP, kLd, false, rows, cols, drop->head_key, *drop->rate, drop->sample, drop->q0, drop->j0);
  ops.softmax_bwd(S, dP, lse, D_rows, rows, cols, diag, c, scale);
  if (drop) dropout_tile(S, kLd, false, rows, cols, drop->head_key, *drop->rate, drop->sample, drop->q0, drop->j0);
  ops.accumulate(dV, HS, S, 1, kLd, dOp, HS, cols, rows, HS, -diag, kAttnNoLimit, nullptr);
  ops.accumulate(dK, HS, dP, 1, kLd, Qp, HS, cols, rows, HS, -diag, kAttnNoLimit, nullptr);
}

void AttnBackwardTiles::store_keys(float* dK_out, float* dV_out, int ld, int cols, int HS) const {
  attn_unpack_rows(dK_out, ld, dK, cols, HS);
  attn_unpack_rows(dV_out, ld, dV, cols, HS);
}

}  // namespace detail

// ---- drivers ----

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int NKV,
                       int HS, const AttnDropout* drop, const int32_t* kstart) {
  attn_check_dims("attention_forward", B, T, NH, NKV, HS);
  const AttnTileOps ops = attn_tile_ops();
  const int C3 = (NH + 2 * NKV) * HS;
  const int group = NH / NKV;
  const int nqt = (T + kAttnTile - 1) / kAttnTile;
  const float c = kLog2e / std::sqrt(static_cast<float>(HS));
  const long units = static_cast<long>(B) * NH * nqt;
#pragma omp parallel
  {
    AttnForwardTiles tiles(HS);
#pragma omp for schedule(dynamic, 1)
    for (long u = 0; u < units; ++u) {
      const int qt = nqt - 1 - static_cast<int>(u % nqt);  // longest tiles first
      const int h = static_cast<int>(u / nqt % NH);
      const int b = static_cast<int>(u / nqt / NH);
      const int q0 = qt * kAttnTile, rows = std::min(kAttnTile, T - q0);
      const long row0 = static_cast<long>(b) * T;
      ops.transpose(tiles.Qt, qkv + (row0 + q0) * C3 + h * HS, C3, rows, HS);
      tiles.start(rows, HS);
      // Documents: key tiles wholly before the tile's first query's document are skipped (a later
      // query's document starts no earlier).
      const int32_t* ks = kstart ? kstart + row0 + q0 : nullptr;
      for (int j0 = attn_first_key(ks, kAttnTile); j0 < q0 + rows; j0 += kAttnTile) {
        const int cols = std::min(kAttnTile, T - j0), diag = q0 - j0;
        const float* K = qkv + (row0 + j0) * C3 + (NH + h / group) * HS;
        const float* V = K + NKV * HS;
        attn_pack_rows(tiles.Kp, K, C3, cols, HS);
        attn_pack_rows(tiles.Vp, V, C3, cols, HS);
        AttnDropTile dt;
        if (drop && drop->rate.active())
          dt = {drop_head_key(drop->site_key, static_cast<uint32_t>(drop->head0 + h)), &drop->rate, drop->sample0 + b, q0, j0};
        const AttnDocTile doc{ks, j0};
        tiles.add_keys(ops, cols, rows, diag, HS, c, dt.rate ? &dt : nullptr, ks && ks[rows - 1] > j0 ? &doc : nullptr);
      }
      tiles.finish(out + (row0 + q0) * NH * HS + h * HS, NH * HS,
                   lse + (static_cast<long>(b) * NH + h) * T + q0, rows, HS);
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int NH, int NKV, int HS, const AttnDropout* drop,
                        const int32_t* kstart) {
  attn_check_dims("attention_backward", B, T, NH, NKV, HS);
  const AttnTileOps ops = attn_tile_ops();
  const int C3 = (NH + 2 * NKV) * HS;
  const int C = NH * HS;
  const int group = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const float c = scale * kLog2e;
  const long units = static_cast<long>(B) * NKV;
#pragma omp parallel
  {
    AttnBackwardTiles tiles(HS, static_cast<size_t>(group) * T);
    float *dP = tiles.dP, *Kp = tiles.Kp, *Qp = tiles.Qp, *dOp = tiles.dOp, *D = tiles.D;
#pragma omp for schedule(dynamic, 1)
    for (long u = 0; u < units; ++u) {
      const int b = static_cast<int>(u / NKV), kvh = static_cast<int>(u % NKV);
      const long row0 = static_cast<long>(b) * T;
      attn_backward_begin(D, dqkv, out, dout, b, kvh, T, NH, NKV, HS);
      for (int j0 = 0; j0 < T; j0 += kAttnTile) {
        const int cols = std::min(kAttnTile, T - j0);
        const long kofs = (row0 + j0) * C3 + (NH + kvh) * HS;
        const long vofs = kofs + NKV * HS;
        tiles.load_keys(ops, qkv + kofs, qkv + vofs, C3, cols, HS);
        for (int g = 0; g < group; ++g) {
          const int h = kvh * group + g;
          for (int q0 = j0; q0 < T; q0 += kAttnTile) {
            const int rows = std::min(kAttnTile, T - q0), diag = q0 - j0;
            // Documents: this query tile's first query (and so every later one) starts its
            // document after the key tile.
            const int32_t* ks = kstart ? kstart + row0 + q0 : nullptr;
            if (attn_first_key(ks, kAttnTile) > j0) break;
            const long qofs = (row0 + q0) * C3 + h * HS;
            attn_pack_rows(Qp, qkv + qofs, C3, rows, HS);
            attn_pack_rows(dOp, dout + (row0 + q0) * C + h * HS, C, rows, HS);
            const float* lse_q = lse + (static_cast<long>(b) * NH + h) * T + q0;
            AttnDropTile dt;
            if (drop && drop->rate.active())
              dt = {drop_head_key(drop->site_key, static_cast<uint32_t>(drop->head0 + h)), &drop->rate, drop->sample0 + b, q0, j0};
            const AttnDocTile doc{ks, j0};
            tiles.add_queries(ops, lse_q, D + static_cast<long>(g) * T + q0, rows, cols, diag, HS, c,
                              scale, dt.rate ? &dt : nullptr, ks && ks[rows - 1] > j0 ? &doc : nullptr);
            ops.accumulate(dqkv + qofs, C3, dP, kLd, 1, Kp, HS, rows, cols, HS, -kAttnNoLimit, diag,
                           nullptr);
          }
        }
        tiles.store_keys(dqkv + kofs, dqkv + vofs, C3, cols, HS);
      }
    }
  }
}

double attention_tile_pairs(int T, const int32_t* kstart) {
  MT_CHECK(T >= 1, ErrorKind::kInvalidArgument, "attention_tile_pairs: T must be positive");
  double pairs = 0.0;
  for (int q0 = 0; q0 < T; q0 += kAttnTile) {
    const int rows = std::min(kAttnTile, T - q0);
    for (int j0 = attn_first_key(kstart ? kstart + q0 : nullptr, kAttnTile); j0 < q0 + rows; j0 += kAttnTile)
      pairs += static_cast<double>(rows) * std::min(kAttnTile, T - j0);
  }
  return pairs;
}

}  // namespace mt::kernels
