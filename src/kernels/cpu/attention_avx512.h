// Tile primitives of the flash attention in attention.cpp. The tiling driver (attention.cpp) calls
// them through a table: the portable bodies live in attention.cpp, the AVX-512 bodies in
// attention_avx512.cpp (compiled with AVX-512 flags, called only when isa_active() says so).
//
// A tile pairs up to kAttnTile query rows (positions q0...) with up to kAttnTile keys (j0...);
// query i of the tile may see key j of the tile iff j <= i + diag, diag = q0 - j0. Score tiles are
// (kAttnTile, kAttnTile) row-major. Exponentials are base 2: c = log2(e) / sqrt(HS).
// Band (lo, hi): for row r, the columns (or terms) k with max(0, r + lo) <= k < min(n, r + hi + 1).
#pragma once

namespace mt::kernels::detail {

inline constexpr int kAttnTile = 64;
inline constexpr int kAttnNoLimit = 1 << 29;  // an unbounded side of a band

// Xt (HS, kAttnTile) = X (n, HS; row stride ldx)^T; columns [n, n rounded up to 16) are zeroed.
// REQUIRES: n <= kAttnTile.
void attn_transpose_avx512(float* Xt, const float* X, int ldx, int n, int HS);

// S (rows, kAttnTile) = A (rows, HS; row stride lda) · Bt (HS, kAttnTile), guaranteed on the band
// (lo, hi) of width n = cols; other entries are unspecified. Bt columns up to cols rounded up to 16
// are read.
void attn_scores_avx512(float* S, const float* A, int lda, const float* Bt, int rows, int cols,
                        int HS, int lo, int hi);

// Online-softmax step of the forward pass on a transposed score tile St (keys, kAttnTile): column
// i is query i. Per query i < queries (m, l, alpha: (kAttnTile)):
//   m_new = max(m, c * max over visible j of St[j][i]);  alpha = 2^(m - m_new) (1 if m_new = -inf)
//   St[j][i] := 2^(c * St[j][i] - m_new) if visible, else 0, for every key j visible to some query
//   of i's 16-aligned column group;  l = l*alpha + sum_j St[j][i];  m = m_new.
void attn_softmax_fwd_avx512(float* St, float* m, float* l, float* alpha, int keys, int queries,
                             int diag, float c);

// Backward softmax on one tile S, dP (rows = queries, columns = keys), per row i (lse natural-log):
//   S_i := P_i = 2^(c*S_i - lse_i*log2(e)),  dP_i := dS_i = scale * P_i * (dP_i - D_i),
// both 0 where not visible, up to cols rounded up to 16.
void attn_softmax_bwd_avx512(float* S, float* dP, const float* lse, const float* D, int rows,
                             int cols, int diag, float c, float scale);

// C (rows, HS; row stride ldc) = C * alpha (per row; alpha == nullptr: 1)
//                                + sum_k A[r*sa_r + k*sa_k] * X (K, HS; row stride ldx)[k]
// over the band (lo, hi) of width K. Entries of A inside the band of any row of the same 4-row
// block must be readable; those outside the row's own band must be 0.
void attn_accumulate_avx512(float* C, int ldc, const float* A, int sa_r, int sa_k, const float* X,
                            int ldx, int rows, int K, int HS, int lo, int hi, const float* alpha);

}  // namespace mt::kernels::detail
