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
#include "kernels/cpu/attention_avx512.h"

namespace mt::kernels {
namespace {

using namespace detail;

constexpr int kLd = kAttnTile;
constexpr float kLog2e = 1.4426950408889634f;

// ---- portable tile primitives (same contracts as the _avx512 ones) ----

// 2^x for x <= 0 (clamped at -126), Cephes exp2f polynomial; plain code GCC can vectorise.
inline float exp2_poly(float x) {
  x = std::max(x, -126.0f);
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

struct TileOps {
  decltype(&attn_transpose_avx512) transpose;
  decltype(&attn_scores_avx512) scores;
  decltype(&attn_softmax_fwd_avx512) softmax_fwd;
  decltype(&attn_softmax_bwd_avx512) softmax_bwd;
  decltype(&attn_accumulate_avx512) accumulate;
};

TileOps tile_ops() {
  if (isa_active() == Isa::kAvx512)
    return {attn_transpose_avx512, attn_scores_avx512, attn_softmax_fwd_avx512,
            attn_softmax_bwd_avx512, attn_accumulate_avx512};
  return {transpose_portable, scores_portable, softmax_fwd_portable, softmax_bwd_portable,
          accumulate_portable};
}

// ---- driver ----

// 64-byte aligned scratch for one thread.
class Scratch {
 public:
  explicit Scratch(size_t n) : buf_(n + 16, 0.0f) {}
  float* data() {
    auto p = reinterpret_cast<uintptr_t>(buf_.data());
    return reinterpret_cast<float*>((p + 63) & ~uintptr_t{63});
  }

 private:
  std::vector<float> buf_;
};

// dst (n, HS) contiguous = src (n, HS; row stride ld). Tiles are packed before the products: rows
// kilobytes apart in qkv would each cost a TLB entry.
void pack_rows(float* dst, const float* src, int ld, int n, int HS) {
  for (int j = 0; j < n; ++j)
    std::memcpy(dst + j * HS, src + static_cast<long>(j) * ld, sizeof(float) * HS);
}

void check_dims(const char* where, int B, int T, int NH, int NKV, int HS) {
  MT_CHECK(B >= 0 && T >= 0 && NH > 0 && NKV > 0 && HS > 0 && NH % NKV == 0,
           ErrorKind::kInvalidArgument,
           std::string(where) + ": bad dims B=" + std::to_string(B) + " T=" + std::to_string(T) +
               " NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV) +
               " HS=" + std::to_string(HS) + " (REQUIRES NH % NKV == 0)");
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int NKV,
                       int HS) {
  check_dims("attention_forward", B, T, NH, NKV, HS);
  const TileOps ops = tile_ops();
  const int C3 = (NH + 2 * NKV) * HS;
  const int group = NH / NKV;
  const int nqt = (T + kAttnTile - 1) / kAttnTile;
  const float c = kLog2e / std::sqrt(static_cast<float>(HS));
  const long units = static_cast<long>(B) * NH * nqt;
#pragma omp parallel
  {
    const size_t tile_hs = static_cast<size_t>(HS) * kLd;
    Scratch scratch(4 * tile_hs + kAttnTile * kLd + 3 * kAttnTile);
    float* Qt = scratch.data();       // (HS, kLd): the query tile, transposed
    float* O = Qt + tile_hs;          // (kAttnTile, HS): unnormalised output rows
    float* St = O + tile_hs;          // (kAttnTile keys, kLd queries): scores, then P^T
    float* m = St + kAttnTile * kLd;  // (kAttnTile): running max, log2 units
    float* l = m + kAttnTile;         // (kAttnTile): running sum
    float* alpha = l + kAttnTile;     // (kAttnTile): this tile's rescaling
    float* Kp = alpha + kAttnTile;    // (kAttnTile, HS): the key tile, packed
    float* Vp = Kp + tile_hs;         // (kAttnTile, HS): the value tile, packed
#pragma omp for schedule(dynamic, 1)
    for (long u = 0; u < units; ++u) {
      const int qt = nqt - 1 - static_cast<int>(u % nqt);  // longest tiles first
      const int h = static_cast<int>(u / nqt % NH);
      const int b = static_cast<int>(u / nqt / NH);
      const int q0 = qt * kAttnTile, rows = std::min(kAttnTile, T - q0);
      const long row0 = static_cast<long>(b) * T;
      ops.transpose(Qt, qkv + (row0 + q0) * C3 + h * HS, C3, rows, HS);
      std::fill(O, O + rows * HS, 0.0f);
      std::fill(m, m + kAttnTile, -INFINITY);
      std::fill(l, l + kAttnTile, 0.0f);
      for (int j0 = 0; j0 < q0 + rows; j0 += kAttnTile) {
        const int cols = std::min(kAttnTile, T - j0), diag = q0 - j0;
        const float* K = qkv + (row0 + j0) * C3 + (NH + h / group) * HS;
        const float* V = K + NKV * HS;
        pack_rows(Kp, K, C3, cols, HS);
        pack_rows(Vp, V, C3, cols, HS);
        ops.scores(St, Kp, HS, Qt, cols, rows, HS, -diag, kAttnNoLimit);
        ops.softmax_fwd(St, m, l, alpha, cols, rows, diag, c);
        ops.accumulate(O, HS, St, 1, kLd, Vp, HS, rows, cols, HS, -kAttnNoLimit, diag, alpha);
      }
      for (int i = 0; i < rows; ++i) {
        float* o = out + (row0 + q0 + i) * NH * HS + h * HS;
        const float inv = 1.0f / l[i];
        for (int d = 0; d < HS; ++d) o[d] = O[i * HS + d] * inv;
        lse[(static_cast<long>(b) * NH + h) * T + q0 + i] = m[i] / kLog2e + std::log(l[i]);
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int NH, int NKV, int HS) {
  check_dims("attention_backward", B, T, NH, NKV, HS);
  const TileOps ops = tile_ops();
  const int C3 = (NH + 2 * NKV) * HS;
  const int C = NH * HS;
  const int group = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const float c = scale * kLog2e;
  const long units = static_cast<long>(B) * NKV;
#pragma omp parallel
  {
    const size_t tile_hs = static_cast<size_t>(HS) * kLd;
    Scratch scratch(7 * tile_hs + 2 * kAttnTile * kLd + static_cast<size_t>(group) * T);
    float* Kt = scratch.data();        // (HS, kLd)
    float* Vt = Kt + tile_hs;          // (HS, kLd)
    float* dK = Vt + tile_hs;          // (kAttnTile, HS)
    float* dV = dK + tile_hs;          // (kAttnTile, HS)
    float* S = dV + tile_hs;           // (kAttnTile, kLd): scores, then P
    float* dP = S + kAttnTile * kLd;   // (kAttnTile, kLd): dP, then dS
    float* Kp = dP + kAttnTile * kLd;  // (kAttnTile, HS): the key tile, packed
    float* Qp = Kp + tile_hs;          // (kAttnTile, HS): the query tile, packed
    float* dOp = Qp + tile_hs;         // (kAttnTile, HS): its output gradient, packed
    float* D = dOp + tile_hs;          // (group, T): rowsum(dO * O)
#pragma omp for schedule(dynamic, 1)
    for (long u = 0; u < units; ++u) {
      const int b = static_cast<int>(u / NKV), kvh = static_cast<int>(u % NKV);
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
      for (int j0 = 0; j0 < T; j0 += kAttnTile) {
        const int cols = std::min(kAttnTile, T - j0);
        const long kofs = (row0 + j0) * C3 + (NH + kvh) * HS;
        const long vofs = kofs + NKV * HS;
        ops.transpose(Kt, qkv + kofs, C3, cols, HS);
        ops.transpose(Vt, qkv + vofs, C3, cols, HS);
        pack_rows(Kp, qkv + kofs, C3, cols, HS);
        std::fill(dK, dK + cols * HS, 0.0f);
        std::fill(dV, dV + cols * HS, 0.0f);
        for (int g = 0; g < group; ++g) {
          const int h = kvh * group + g;
          for (int q0 = j0; q0 < T; q0 += kAttnTile) {
            const int rows = std::min(kAttnTile, T - q0), diag = q0 - j0;
            const long qofs = (row0 + q0) * C3 + h * HS;
            pack_rows(Qp, qkv + qofs, C3, rows, HS);
            pack_rows(dOp, dout + (row0 + q0) * C + h * HS, C, rows, HS);
            const float* lse_q = lse + (static_cast<long>(b) * NH + h) * T + q0;
            ops.scores(S, Qp, HS, Kt, rows, cols, HS, -kAttnNoLimit, diag);
            ops.scores(dP, dOp, HS, Vt, rows, cols, HS, -kAttnNoLimit, diag);
            ops.softmax_bwd(S, dP, lse_q, D + static_cast<long>(g) * T + q0, rows, cols, diag, c,
                            scale);
            ops.accumulate(dV, HS, S, 1, kLd, dOp, HS, cols, rows, HS, -diag, kAttnNoLimit,
                           nullptr);
            ops.accumulate(dK, HS, dP, 1, kLd, Qp, HS, cols, rows, HS, -diag, kAttnNoLimit,
                           nullptr);
            ops.accumulate(dqkv + qofs, C3, dP, kLd, 1, Kp, HS, rows, cols, HS, -kAttnNoLimit, diag,
                           nullptr);
          }
        }
        for (int j = 0; j < cols; ++j) {
          std::memcpy(dqkv + kofs + j * C3, dK + j * HS, sizeof(float) * HS);
          std::memcpy(dqkv + vofs + j * C3, dV + j * HS, sizeof(float) * HS);
        }
      }
    }
  }
}

}  // namespace mt::kernels
