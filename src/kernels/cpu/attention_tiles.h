// What the tiling drivers of the flash attentions share (attention.cpp, sparse_attention.cpp): the
// table of tile primitives for the active ISA (contracts in attention_avx512.h), per-thread
// scratch, row packing and the dims check.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/dropout.h"

namespace mt::kernels::detail {

struct AttnTileOps {
  decltype(&attn_transpose_avx512) transpose;
  decltype(&attn_scores_avx512) scores;
  decltype(&attn_softmax_fwd_avx512) softmax_fwd;
  decltype(&attn_softmax_bwd_avx512) softmax_bwd;
  decltype(&attn_accumulate_avx512) accumulate;
};

// The AVX-512 bodies when isa_active() is kAvx512, else the portable ones (attention.cpp).
AttnTileOps attn_tile_ops();

// Throws InvalidArgument naming `where` unless B, T >= 0, NH, NKV, HS > 0 and NH % NKV == 0.
void attn_check_dims(const char* where, int B, int T, int NH, int NKV, int HS);

// The backward's first step for kv head kvh of batch row b: D (group, T) = rowsum(dO * O) of its
// query heads, and their dQ rows of dqkv zeroed.
void attn_backward_begin(float* D, float* dqkv, const float* out, const float* dout, int b, int kvh,
                         int T, int NH, int NKV, int HS);

inline constexpr float kAttnLog2e = 1.4426950408889634f;

// 64-byte aligned scratch for one thread.
class AttnScratch {
 public:
  explicit AttnScratch(size_t n) : buf_(n + 16, 0.0f) {}
  float* data() {
    auto p = reinterpret_cast<uintptr_t>(buf_.data());
    return reinterpret_cast<float*>((p + 63) & ~uintptr_t{63});
  }

 private:
  std::vector<float> buf_;
};

// dst (n, HS) contiguous = src (n, HS; row stride ld). Tiles are packed before the products: rows
// kilobytes apart in qkv would each cost a TLB entry.
inline void attn_pack_rows(float* dst, const float* src, int ld, int n, int HS) {
  for (int j = 0; j < n; ++j)
    std::memcpy(dst + j * HS, src + static_cast<long>(j) * ld, sizeof(float) * HS);
}

// dst (n, HS; row stride ld) = src (n, HS) contiguous.
inline void attn_unpack_rows(float* dst, int ld, const float* src, int n, int HS) {
  for (int j = 0; j < n; ++j)
    std::memcpy(dst + static_cast<long>(j) * ld, src + j * HS, sizeof(float) * HS);
}

// One tile's dropout on the probabilities (kernels/cpu/attention.h's AttnDropout, resolved to a
// head and sample); null: none.
struct AttnDropTile {
  uint64_t head_key = 0;
  const DropRate* rate = nullptr;
  uint64_t sample = 0;
  int q0 = 0, j0 = 0;  // the tile's first query and key positions
};

// Documents (attention.h's kstart) within a tile: query i of the tile sees no key before ks[i], a
// position within the sample; the tile's keys start at position j0. Null ks: none.
struct AttnDocTile {
  const int32_t* ks = nullptr;
  int j0 = 0;
};

// The first key position of the key tiles a query tile visits: with documents, the tile of its
// first query's document start (a later query's document starts no earlier), else 0. The forward
// starts its key loop there and the backward stops its query loop where a query tile's is past the
// key tile: both visit the tiles that hold a (query, key) pair some query sees
// (attention_tile_pairs counts them).
inline int attn_first_key(const int32_t* ks, int tile) { return ks ? ks[0] / tile * tile : 0; }

// A masked score: finite, so that a query whose keys in a tile are all masked keeps a finite
// running max (an infinite one would give -inf - -inf), and a power of two, so that its product
// with the scale is exact and such a tile's exponents, score x scale less the max, are exactly 0
// with or without a fused multiply-add (-1e30 left the FMA's residue, up to +1e21, and the AVX-512
// exp overflowed to +inf at head sizes 16, 48, 64, 80: NaN outputs). Next to a key the query sees,
// its probability is 2^-126 or less (the exp's clamp), and the online softmax rescales the
// all-masked tiles' sums by as little once the query meets one.
inline constexpr float kAttnMaskedScore = -0x1p100f;

// Sets the scores of keys before their query's document start to kAttnMaskedScore: S (rows
// queries, cols keys) with element (i, j) at S[i * rs + j * cs].
inline void attn_mask_documents(float* S, int rs, int cs, int rows, int cols, const AttnDocTile& doc) {
  for (int i = 0; i < rows; ++i) {
    const int lim = std::min(cols, doc.ks[i] - doc.j0);
    for (int j = 0; j < lim; ++j) S[static_cast<long>(i) * rs + static_cast<long>(j) * cs] = kAttnMaskedScore;
  }
}

// One thread's buffers for a forward.
struct AttnForwardTiles {
  AttnScratch scratch;
  float* Qt;     // (HS, kAttnTile): the query tile, transposed
  float* O;      // (kAttnTile, HS): unnormalised output rows
  float* St;     // (kAttnTile keys, kAttnTile queries): scores, then P^T
  float* m;      // (kAttnTile): running max, log2 units
  float* l;      // (kAttnTile): running sum
  float* alpha;  // (kAttnTile): this tile's rescaling
  float* Kp;     // (kAttnTile, HS): the key tile, packed
  float* Vp;     // (kAttnTile, HS): the value tile, packed

  explicit AttnForwardTiles(int HS);
  // Starts a query tile of `rows` queries: O = 0, m = -inf, l = 0.
  void start(int rows, int HS);
  // The online-softmax step over `keys` keys in Kp, Vp for the `queries` queries in Qt; query i
  // sees key j iff j <= i + diag (kAttnNoLimit: all).
  // doc: queries do not see keys before their document's start.
  void add_keys(const AttnTileOps& ops, int keys, int queries, int diag, int HS, float c,
                const AttnDropTile* drop = nullptr, const AttnDocTile* doc = nullptr);
  // out (rows, HS; row stride ldo) = O / l,  lse (rows) = (m + log2 l) ln 2; a query that saw no
  // key (l = 0) gets out = 0 and lse = -inf.
  void finish(float* out, int ldo, float* lse, int rows, int HS) const;
};

// One thread's buffers for a backward; D holds d_size floats.
struct AttnBackwardTiles {
  AttnScratch scratch;
  float* Kt;     // (HS, kAttnTile): the key tile, transposed
  float* Vt;     // (HS, kAttnTile)
  float* dK;     // (kAttnTile, HS)
  float* dV;     // (kAttnTile, HS)
  float* S;      // (kAttnTile, kAttnTile): scores, then P
  float* dP;     // (kAttnTile, kAttnTile): dP, then dS
  float* Kp;     // (kAttnTile, HS): the key tile, packed
  float* Qp;     // (kAttnTile, HS): the query tile, packed
  float* dOp;    // (kAttnTile, HS): its output gradient, packed
  float* lse_t;  // (kAttnTile): its lse, where gathered
  float* D_t;    // (kAttnTile): its D, where gathered
  float* D;      // (d_size): rowsum(dO * O)

  AttnBackwardTiles(int HS, size_t d_size);
  // Starts a key tile: Kt, Vt, Kp from K, V (cols, HS; row stride ld); dK = dV = 0.
  void load_keys(const AttnTileOps& ops, const float* K, const float* V, int ld, int cols, int HS);
  // For `rows` queries in Qp, dOp (their lse and D given) against the key tile: P and dS
  // (left in dP for the caller's dQ += dS K) and dV += P^T dO, dK += dS^T Q. Query i sees key j iff
  // j <= i + diag.
  void add_queries(const AttnTileOps& ops, const float* lse, const float* D_rows, int rows,
                   int cols, int diag, int HS, float c, float scale, const AttnDropTile* drop = nullptr,
                   const AttnDocTile* doc = nullptr);
  // K, V gradient rows (cols, HS; row stride ld) = dK, dV.
  void store_keys(float* dK_out, float* dV_out, int ld, int cols, int HS) const;
};

}  // namespace mt::kernels::detail
