// AVX-512 tile primitives of the flash attention (contracts in attention_avx512.h). The two
// products are register-blocked: 4 rows x 4 zmm (64 floats) of accumulators, one broadcast per row
// and one load per zmm for each step of the contraction, so the loops run near FMA throughput.
// exp2 is a Cephes-style polynomial (rel. error ~2e-7) with the exponent applied by vscalefps;
// transposes go through registers 16x16 at a time (unpack, shuffle, two 128-bit lane shuffles).
#include "kernels/cpu/attention_avx512.h"

// NOTE: GCC 12 reports its own _mm512_undefined_ps() (`__m512 __Y = __Y;`) as maybe-uninitialized
// once intrinsics are inlined at -O3; the warning points into the header, so silence it there.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cmath>

namespace mt::kernels::detail {
namespace {

constexpr int kLd = kAttnTile;
constexpr float kLog2e = 1.4426950408889634f;

// The argument is <= 0 by construction (a score less the running max or the log-sum-exp); a fused
// multiply-add's residue can leave it a hair above, which is clamped to 0 (with a masked score's
// huge residue it overflowed to +inf: DESIGN-NOTES 90).
inline __m512 exp2_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-127.0f)), _mm512_setzero_ps());
  __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(x, n);  // [-0.5, 0.5]
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

inline __mmask16 tail_mask(int n) {
  if (n >= 16) return 0xFFFF;
  if (n <= 0) return 0;
  return static_cast<__mmask16>((1u << n) - 1);
}

// S (R, 16*NV) = Q (R, HS) · Kt (HS, 16*NV).
template <int R, int NV>
void scores_block(float* S, const float* Q, int ldq, const float* Kt, int HS) {
  __m512 acc[R][NV];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int d = 0; d < HS; ++d) {
    __m512 k[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) k[v] = _mm512_loadu_ps(Kt + d * kLd + 16 * v);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      __m512 q = _mm512_set1_ps(Q[r * ldq + d]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(q, k[v], acc[r][v]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(S + r * kLd + 16 * v, acc[r][v]);
}

// C (R, 16*NV masked) = C * alpha + sum_{k in [kb, ke)} A[r*sa_r + k*sa_k] * X[k].
template <int R, int NV>
void accumulate_block(float* C, int ldc, const float* A, int sa_r, int sa_k, const float* X,
                      int ldx, int kb, int ke, const __mmask16* mask, const float* alpha) {
  __m512 acc[R][NV];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    __m512 s = _mm512_set1_ps(alpha != nullptr ? alpha[r] : 1.0f);
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      acc[r][v] = _mm512_mul_ps(s, _mm512_maskz_loadu_ps(mask[v], C + r * ldc + 16 * v));
  }
  for (int k = kb; k < ke; ++k) {
    __m512 x[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) x[v] = _mm512_maskz_loadu_ps(mask[v], X + k * ldx + 16 * v);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      __m512 a = _mm512_set1_ps(A[r * sa_r + k * sa_k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(a, x[v], acc[r][v]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(C + r * ldc + 16 * v, mask[v], acc[r][v]);
}

using ScoresFn = void (*)(float*, const float*, int, const float*, int);
using AccumulateFn = void (*)(float*, int, const float*, int, int, const float*, int, int, int,
                              const __mmask16*, const float*);

// [R - 1][NV - 1]
template <int R>
constexpr ScoresFn kScoresRow[4] = {scores_block<R, 1>, scores_block<R, 2>, scores_block<R, 3>,
                                    scores_block<R, 4>};
constexpr const ScoresFn* kScores[4] = {kScoresRow<1>, kScoresRow<2>, kScoresRow<3>, kScoresRow<4>};
template <int R>
constexpr AccumulateFn kAccumulateRow[4] = {accumulate_block<R, 1>, accumulate_block<R, 2>,
                                            accumulate_block<R, 3>, accumulate_block<R, 4>};
constexpr const AccumulateFn* kAccumulate[4] = {kAccumulateRow<1>, kAccumulateRow<2>,
                                                kAccumulateRow<3>, kAccumulateRow<4>};

int visible(int i, int cols, int diag) {
  return std::clamp(i + diag + 1, 0, cols);
}

// out[e][a] = in[a][e] for a 16x16 block held in registers.
void transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  // u[4g + c], 128-bit lane L: column 4L + c of rows 4g..4g+3
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
    u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    __m512 v = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);  // lanes 0, 2 of rows 0-7
    __m512 w = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);  // lanes 1, 3 of rows 0-7
    __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
    __m512 w2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
    r[c] = _mm512_shuffle_f32x4(v, v2, 0x88);
    r[4 + c] = _mm512_shuffle_f32x4(w, w2, 0x88);
    r[8 + c] = _mm512_shuffle_f32x4(v, v2, 0xDD);
    r[12 + c] = _mm512_shuffle_f32x4(w, w2, 0xDD);
  }
}

}  // namespace

void attn_transpose_avx512(float* Xt, const float* X, int ldx, int n, int HS) {
  for (int a0 = 0; a0 < n; a0 += 16) {
    for (int e0 = 0; e0 < HS; e0 += 16) {
      const __mmask16 mask = tail_mask(HS - e0);
      __m512 r[16];
      for (int a = 0; a < 16; ++a)
        r[a] =
            a0 + a < n ? _mm512_maskz_loadu_ps(mask, X + (a0 + a) * ldx + e0) : _mm512_setzero_ps();
      transpose16(r);
      for (int e = 0; e < std::min(16, HS - e0); ++e)
        _mm512_storeu_ps(Xt + (e0 + e) * kLd + a0, r[e]);
    }
  }
}

void attn_scores_avx512(float* S, const float* A, int lda, const float* Bt, int rows, int cols,
                        int HS, int lo, int hi) {
  for (int r0 = 0; r0 < rows; r0 += 4) {
    const int R = std::min(4, rows - r0);
    const int jb = std::max(0, r0 + lo), je = std::min(cols, r0 + R - 1 + hi + 1);
    if (jb >= je) continue;
    const int vb = jb / 16, nv = (je + 15) / 16 - vb;
    kScores[R - 1][nv - 1](S + r0 * kLd + 16 * vb, A + r0 * lda, lda, Bt + 16 * vb, HS);
  }
}

void attn_softmax_fwd_avx512(float* St, float* m, float* l, float* alpha, int keys, int queries,
                             int diag, float c) {
  const __m512 vc = _mm512_set1_ps(c);
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int i0 = 0; i0 < queries; i0 += 16) {
    const __mmask16 qmask = tail_mask(queries - i0);
    const int jend = std::min(keys, i0 + 15 + diag + 1);  // keys some query of the group sees
    const __m512i last_key = _mm512_add_epi32(lane, _mm512_set1_epi32(i0 + diag));  // i + diag
    auto seen = [&](int j) {
      return static_cast<__mmask16>(
          _mm512_mask_cmpge_epi32_mask(qmask, last_key, _mm512_set1_epi32(j)));
    };
    __m512 mx = neg_inf;
    for (int j = 0; j < jend; ++j)
      mx = _mm512_mask_max_ps(mx, seen(j), mx, _mm512_loadu_ps(St + j * kLd + i0));
    const __m512 m_old = _mm512_loadu_ps(m + i0);
    const __m512 m_new = _mm512_max_ps(m_old, _mm512_mul_ps(mx, vc));
    const __mmask16 empty = _mm512_cmp_ps_mask(m_new, neg_inf, _CMP_EQ_OQ);
    const __m512 a =
        _mm512_mask_blend_ps(empty, exp2_ps(_mm512_sub_ps(m_old, m_new)), _mm512_set1_ps(1.0f));
    const __m512 neg = _mm512_sub_ps(_mm512_setzero_ps(), m_new);
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < jend; ++j) {
      float* s = St + j * kLd + i0;
      __m512 p =
          _mm512_maskz_mov_ps(seen(j), exp2_ps(_mm512_fmadd_ps(_mm512_loadu_ps(s), vc, neg)));
      _mm512_storeu_ps(s, p);
      sum = _mm512_add_ps(sum, p);
    }
    _mm512_storeu_ps(m + i0, m_new);
    _mm512_storeu_ps(alpha + i0, a);
    _mm512_storeu_ps(l + i0, _mm512_fmadd_ps(_mm512_loadu_ps(l + i0), a, sum));
  }
}

void attn_softmax_bwd_avx512(float* S, float* dP, const float* lse, const float* D, int rows,
                             int cols, int diag, float c, float scale) {
  const int nvec = (cols + 15) / 16;
  const __m512 vc = _mm512_set1_ps(c);
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int i = 0; i < rows; ++i) {
    float* s = S + i * kLd;
    float* dp = dP + i * kLd;
    int n = visible(i, cols, diag);
    __m512 neg = _mm512_set1_ps(-lse[i] * kLog2e);
    __m512 d = _mm512_set1_ps(D[i]);
    for (int v = 0; v < nvec; ++v) {
      __mmask16 mk = tail_mask(n - 16 * v);
      __m512 p =
          _mm512_maskz_mov_ps(mk, exp2_ps(_mm512_fmadd_ps(_mm512_loadu_ps(s + 16 * v), vc, neg)));
      __m512 ds = _mm512_maskz_mul_ps(mk, p, _mm512_sub_ps(_mm512_loadu_ps(dp + 16 * v), d));
      _mm512_storeu_ps(s + 16 * v, p);
      _mm512_storeu_ps(dp + 16 * v, _mm512_mul_ps(ds, vscale));
    }
  }
}

void attn_accumulate_avx512(float* C, int ldc, const float* A, int sa_r, int sa_k, const float* X,
                            int ldx, int rows, int K, int HS, int lo, int hi, const float* alpha) {
  for (int c0 = 0; c0 < HS; c0 += 64) {
    int w = std::min(64, HS - c0);
    int nv = (w + 15) / 16;
    __mmask16 mask[4];
    for (int v = 0; v < 4; ++v) mask[v] = tail_mask(w - 16 * v);
    for (int r0 = 0; r0 < rows; r0 += 4) {
      int R = std::min(4, rows - r0);
      int kb = std::max(0, r0 + lo);
      int ke = std::min(K, r0 + R - 1 + hi + 1);
      if (kb >= ke && alpha == nullptr) continue;
      kAccumulate[R - 1][nv - 1](C + r0 * ldc + c0, ldc, A + r0 * sa_r, sa_r, sa_k, X + c0, ldx, kb,
                                 ke, mask, alpha != nullptr ? alpha + r0 : nullptr);
    }
  }
}

}  // namespace mt::kernels::detail
