// Causal grouped-query attention on the GPU. Two implementations of one contract
// (kernels/cuda/ops.h, the CPU's kernels/cpu/attention.h):
//   - tensor cores (bf16, HS 64/128): FlashAttention-2's tiling (Dao 2023). Forward: a block owns
//     64 query rows of one head, 4 warps x 16 rows; K/V tiles of 64 keys stream through shared
//     memory (cp.async, double-buffered); S = QK^T and O += PV with mma.sync m16n8k16 (bf16 in,
//     f32 accumulate) entirely in registers; online softmax on the accumulators with the running
//     max/sum per row; saves only O and the row log-sum-exp. Backward: D = rowsum
//     (dO * O); one kernel per 64-key tile accumulates dK, dV over every query tile and every query
//     head of its kv group (no atomics: GQA sums inside the block); one kernel per 64-query tile
//     accumulates dQ. Both recompute P from the saved log-sum-exp.
//   - plain (any HS, f32 or bf16): one warp per row, the same math in scalar f32.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace mt::cuda {
namespace {

bool g_force_plain = false;

// ================= plain kernels: one warp per (b, h, row) =================
constexpr int kMaxPerLane = 8;  // HS <= 256

template <typename T>
__global__ void attn_fwd_plain_k(T* out, float* lse, const T* qkv, int B, int T_, int NH, int NKV, int HS,
                                 float scale) {
  int gw = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x & 31;
  if (gw >= B * NH * T_) return;
  int t = gw % T_, h = (gw / T_) % NH, b = gw / (T_ * NH);
  int QKV = (NH + 2 * NKV) * HS, kvh = h / (NH / NKV);
  const T* q = qkv + (static_cast<size_t>(b) * T_ + t) * QKV + static_cast<size_t>(h) * HS;
  float qr[kMaxPerLane], o[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    int d = lane + 32 * i;
    qr[i] = d < HS ? to_f(q[d]) : 0.0f;
    o[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j <= t; ++j) {
    const T* k = qkv + (static_cast<size_t>(b) * T_ + j) * QKV + static_cast<size_t>(NH + kvh) * HS;
    const T* v = k + static_cast<size_t>(NKV) * HS;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      int d = lane + 32 * i;
      if (d < HS) s += qr[i] * to_f(k[d]);
    }
    s = warp_sum(s) * scale;
    float mn = fmaxf(m, s);
    float alpha = __expf(m - mn), p = __expf(s - mn);
    l = l * alpha + p;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      int d = lane + 32 * i;
      if (d < HS) o[i] = o[i] * alpha + p * to_f(v[d]);
    }
    m = mn;
  }
  T* orow = out + (static_cast<size_t>(b) * T_ + t) * NH * HS + static_cast<size_t>(h) * HS;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    int d = lane + 32 * i;
    if (d < HS) orow[d] = from_f<T>(o[i] / l);
  }
  if (lane == 0) lse[(static_cast<size_t>(b) * NH + h) * T_ + t] = m + logf(l);
}

// D (B, NH, T) = rowsum(dout * out)
template <typename T>
__global__ void attn_bwd_dvec_k(float* dvec, const T* dout, const T* out, int B, int T_, int NH, int HS) {
  int gw = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x & 31;
  if (gw >= B * NH * T_) return;
  int t = gw % T_, h = (gw / T_) % NH, b = gw / (T_ * NH);
  size_t base = (static_cast<size_t>(b) * T_ + t) * NH * HS + static_cast<size_t>(h) * HS;
  float s = 0.0f;
  for (int d = lane; d < HS; d += 32) s += to_f(dout[base + d]) * to_f(out[base + d]);
  s = warp_sum(s);
  if (lane == 0) dvec[(static_cast<size_t>(b) * NH + h) * T_ + t] = s;
}

template <typename T>
__global__ void attn_bwd_dq_plain_k(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* dvec, int B,
                                    int T_, int NH, int NKV, int HS, float scale) {
  int gw = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x & 31;
  if (gw >= B * NH * T_) return;
  int t = gw % T_, h = (gw / T_) % NH, b = gw / (T_ * NH);
  int QKV = (NH + 2 * NKV) * HS, kvh = h / (NH / NKV);
  size_t row = (static_cast<size_t>(b) * T_ + t);
  const T* q = qkv + row * QKV + static_cast<size_t>(h) * HS;
  const T* go = dout + row * NH * HS + static_cast<size_t>(h) * HS;
  float qr[kMaxPerLane], gr[kMaxPerLane], dq[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    int d = lane + 32 * i;
    qr[i] = d < HS ? to_f(q[d]) : 0.0f;
    gr[i] = d < HS ? to_f(go[d]) : 0.0f;
    dq[i] = 0.0f;
  }
  size_t si = (static_cast<size_t>(b) * NH + h) * T_ + t;
  float L = lse[si], Dv = dvec[si];
  for (int j = 0; j <= t; ++j) {
    const T* k = qkv + (static_cast<size_t>(b) * T_ + j) * QKV + static_cast<size_t>(NH + kvh) * HS;
    const T* v = k + static_cast<size_t>(NKV) * HS;
    float s = 0.0f, dp = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      int d = lane + 32 * i;
      if (d < HS) {
        s += qr[i] * to_f(k[d]);
        dp += gr[i] * to_f(v[d]);
      }
    }
    s = warp_sum(s) * scale;
    dp = warp_sum(dp);
    float p = __expf(s - L);
    float ds = p * (dp - Dv) * scale;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      int d = lane + 32 * i;
      if (d < HS) dq[i] += ds * to_f(k[d]);
    }
  }
  T* o = dqkv + row * QKV + static_cast<size_t>(h) * HS;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    int d = lane + 32 * i;
    if (d < HS) o[d] = from_f<T>(dq[i]);
  }
}

template <typename T>
__global__ void attn_bwd_dkv_plain_k(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* dvec,
                                     int B, int T_, int NH, int NKV, int HS, float scale) {
  int gw = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x & 31;
  if (gw >= B * NKV * T_) return;
  int j = gw % T_, kvh = (gw / T_) % NKV, b = gw / (T_ * NKV);
  int QKV = (NH + 2 * NKV) * HS, G = NH / NKV;
  size_t krow = static_cast<size_t>(b) * T_ + j;
  const T* k = qkv + krow * QKV + static_cast<size_t>(NH + kvh) * HS;
  const T* v = k + static_cast<size_t>(NKV) * HS;
  float kr[kMaxPerLane], vr[kMaxPerLane], dk[kMaxPerLane], dv[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    int d = lane + 32 * i;
    kr[i] = d < HS ? to_f(k[d]) : 0.0f;
    vr[i] = d < HS ? to_f(v[d]) : 0.0f;
    dk[i] = dv[i] = 0.0f;
  }
  for (int g = 0; g < G; ++g) {
    int h = kvh * G + g;
    for (int t = j; t < T_; ++t) {
      size_t row = static_cast<size_t>(b) * T_ + t;
      const T* q = qkv + row * QKV + static_cast<size_t>(h) * HS;
      const T* go = dout + row * NH * HS + static_cast<size_t>(h) * HS;
      float s = 0.0f, dp = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        int d = lane + 32 * i;
        if (d < HS) {
          s += to_f(q[d]) * kr[i];
          dp += to_f(go[d]) * vr[i];
        }
      }
      s = warp_sum(s) * scale;
      dp = warp_sum(dp);
      size_t si = (static_cast<size_t>(b) * NH + h) * T_ + t;
      float p = __expf(s - lse[si]);
      float ds = p * (dp - dvec[si]) * scale;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        int d = lane + 32 * i;
        if (d < HS) {
          dv[i] += p * to_f(go[d]);
          dk[i] += ds * to_f(q[d]);
        }
      }
    }
  }
  T* ok = dqkv + krow * QKV + static_cast<size_t>(NH + kvh) * HS;
  T* ov = ok + static_cast<size_t>(NKV) * HS;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    int d = lane + 32 * i;
    if (d < HS) {
      ok[d] = from_f<T>(dk[i]);
      ov[d] = from_f<T>(dv[i]);
    }
  }
}

// ================= tensor-core kernels (bf16, mma.sync m16n8k16) =================
// Every block has 4 warps (128 threads) and works on 64 x 64 tiles; each warp owns 16 rows of the
// block's tile. Shared-memory tiles are 64 rows of D bf16, row stride LD = D + 8 elements
// (16 B of padding: 8 consecutive rows of an ldmatrix start in distinct 4-bank groups, so ldmatrix
// and the 16-byte cp.async writes are free of bank conflicts).
//
// Fragment layouts of mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA), with
// g = lane / 4 (group), t = lane % 4 (thread in group); registers hold bf16 pairs, the lower
// column/k index in the low 16 bits:
//   A (16 x 16, row major): a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9],
//                           a3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8, "col"):      b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]
//   C (16 x 8, f32):        c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]
// ldmatrix.x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i, and register i of lane l
// gets matrix i's row l/4, columns 2(l%4), 2(l%4)+1 (with .trans: rows 2(l%4), 2(l%4)+1 of
// column l/4).
//   - A operand from a row-major smem tile X (rows m, cols k) at (m0, k0): lane l points at
//     row m0 + (l & 15), col k0 + (l >> 4) * 8 -> matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7),
//     (rows 0-7, k 8-15), (rows 8-15, k 8-15) = a0, a1, a2, a3.           [offset a_off]
//   - B operand where B[k][n] = X[n][k] (X row-major with rows n, e.g. K for S = Q K^T), two n8
//     tiles n0, n0+8 at k0: lane l points at row n0 + (l & 7) + ((l >> 4) << 3),
//     col k0 + ((l >> 3) & 1) * 8 -> r0, r1 = (b0, b1) of tile n0, r2, r3 = (b0, b1) of tile
//     n0+8.                                                               [offset b_off]
//   - B operand where B[k][n] = X[k][n] (X row-major with rows k, e.g. V for O = P V), two n8
//     tiles n0, n0+8 at k0, with .trans: lane l points at row k0 + (l & 15), col n0 + (l >> 4) * 8
//     (the same per-lane offset as the A operand) -> matrices (k 0-7, n 0-7), (k 8-15, n 0-7),
//     (k 0-7, n 8-15), (k 8-15, n 8-15), transposed: r0, r1 = (b0, b1) of tile n0, r2, r3 of
//     tile n0+8.                                                          [offset a_off]
//   - C -> A reuse: the accumulators of the 16 x 64 tile are 8 n8 tiles c[j][0..3]; the A operand
//     of k16 step kk is a0 = pack(c[2kk][0], c[2kk][1]), a1 = pack(c[2kk][2], c[2kk][3]),
//     a2 = pack(c[2kk+1][0], c[2kk+1][1]), a3 = pack(c[2kk+1][2], c[2kk+1][3]).
constexpr int kTile = 64, kThreads = 128;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

template <int D>
struct Tc {
  static constexpr int LD = D + 8;            // smem row stride (elements)
  static constexpr int kElems = kTile * LD;   // elements of one smem tile
  static constexpr int kBytes = kElems * 2;   // bytes of one smem tile
  static constexpr int kFwdSmem = 5 * kBytes;                        // Q, (K, V) x 2 stages
  static constexpr int kDqSmem = 6 * kBytes;                         // Q, dO, (K, V) x 2 stages
  static constexpr int kDkvSmem = 6 * kBytes + 2 * 2 * kTile * 4;    // K, V, (Q, dO) x 2, (lse, D) x 2
  // The backward kernels reload the A operands that do not change over the loop (Q in dQ, K/V in
  // dK/dV) from smem with ldmatrix rather than keep them in registers: at D = 64 that fits 3
  // blocks an SM (168 registers, no spills) instead of 2, and the backward ran 5% faster on an H200
  // (6.44 against 6.68-6.83 ms a GPT-2 124M step, one run); at D = 128 3 blocks would spill.
  static constexpr int kBwdBlocks = D <= 64 ? 3 : 2;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte async copy global -> shared; zero-fills the 16 bytes when !valid (src is not read then,
// but must still be a valid address).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// One step of a double buffer: where a next stage exists, `issue` starts its copies and the wait
// leaves only that group in flight; at the last step everything is waited for. Then the barrier
// that makes this stage's tiles visible to the whole block.
template <typename Issue>
__device__ __forceinline__ void next_stage(bool more, Issue&& issue) {
  if (more) {
    issue();
    cp_commit();
    cp_wait<1>();
  } else {
    cp_wait<0>();
  }
  __syncthreads();
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// c += a b (16x8x16, bf16 in, f32 accumulate).
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two floats -> bf16x2 register (lo in the low half).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Per-lane ldmatrix byte offsets inside a tile (see the layout notes above).
template <int D>
__device__ __forceinline__ uint32_t a_off(int lane) {
  return static_cast<uint32_t>(((lane & 15) * Tc<D>::LD + (lane >> 4) * 8) * 2);
}
template <int D>
__device__ __forceinline__ uint32_t b_off(int lane) {
  return static_cast<uint32_t>((((lane & 7) + ((lane >> 4) << 3)) * Tc<D>::LD + ((lane >> 3) & 1) * 8) * 2);
}
// Byte offset of element (r, c) of a tile.
template <int D>
__host__ __device__ constexpr uint32_t toff(int r, int c) {
  return static_cast<uint32_t>((r * Tc<D>::LD + c) * 2);
}

// Async copy of rows [r0, r0 + 64) of one head (D wide, row stride `stride` elements, starting at
// `base`) into a padded smem tile at `dst`; rows past T are zero-filled. All 128 threads call it.
template <int D>
__device__ __forceinline__ void load_tile(uint32_t dst, const bf16* base, size_t stride, int r0, int T_) {
  constexpr int kVec = D / 8;  // 16-byte vectors per row
#pragma unroll
  for (int it = 0; it < kTile * kVec / kThreads; ++it) {
    int i = threadIdx.x + it * kThreads;
    int r = i / kVec, c = (i % kVec) * 8;
    int row = r0 + r;
    bool ok = row < T_;
    const bf16* src = base + static_cast<size_t>(ok ? row : 0) * stride + c;
    cp_async16(dst + toff<D>(r, c), src, ok);
  }
}

// A fragments (16 x D: D/16 k16 steps) of rows [m0, m0+16) of a smem tile.
template <int D>
__device__ __forceinline__ void load_a(uint32_t (&f)[D / 16][4], uint32_t tile, uint32_t aoff, int m0) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) ldsm_x4(f[kk], tile + aoff + toff<D>(m0, kk * 16));
}

// acc (16 x 64) += A (16 x D, fragments) X^T, X = 64 rows x D of a smem tile (B[k][n] = X[n][k]).
template <int D>
__device__ __forceinline__ void mma_abt(float (&acc)[8][4], const uint32_t (&a)[D / 16][4], uint32_t x, uint32_t boff) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t r[4];
      ldsm_x4(r, x + boff + toff<D>(np * 16, kk * 16));
      mma16816(acc[2 * np], a[kk], r[0], r[1]);
      mma16816(acc[2 * np + 1], a[kk], r[2], r[3]);
    }
  }
}
// Same with A read from rows [m0, m0+16) of smem tile `at` step by step (lower register use).
template <int D>
__device__ __forceinline__ void mma_abt_s(float (&acc)[8][4], uint32_t at, uint32_t aoff, int m0, uint32_t x,
                                          uint32_t boff) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    ldsm_x4(a, at + aoff + toff<D>(m0, kk * 16));
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t r[4];
      ldsm_x4(r, x + boff + toff<D>(np * 16, kk * 16));
      mma16816(acc[2 * np], a, r[0], r[1]);
      mma16816(acc[2 * np + 1], a, r[2], r[3]);
    }
  }
}
// acc (16 x D) += P (16 x 64, A fragments of 4 k16 steps) X, X = 64 rows x D of a smem tile
// (B[k][n] = X[k][n], ldmatrix.trans).
template <int D>
__device__ __forceinline__ void mma_ab(float (&acc)[D / 8][4], const uint32_t (&p)[4][4], uint32_t x, uint32_t aoff) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t r[4];
      ldsm_x4_t(r, x + aoff + toff<D>(kk * 16, dp * 16));
      mma16816(acc[2 * dp], p[kk], r[0], r[1]);
      mma16816(acc[2 * dp + 1], p[kk], r[2], r[3]);
    }
  }
}
// C fragments of a 16 x 64 f32 tile -> A fragments of its 4 k16 steps (layout notes above).
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4][4], const float (&c)[8][4]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    a[j / 2][(j & 1) * 2 + 0] = pack_bf16(c[j][0], c[j][1]);
    a[j / 2][(j & 1) * 2 + 1] = pack_bf16(c[j][2], c[j][3]);
  }
}
template <int N>
__device__ __forceinline__ void zero(float (&c)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.0f;
}
// Writes rows g, g+8 of a 16 x D f32 C-fragment tile as bf16 (times `mul0`/`mul1`) to
// row0/row1 pointers (nullptr: row not written).
template <int D>
__device__ __forceinline__ void store_rows(bf16* row0, bf16* row1, const float (&c)[D / 8][4], int t, float mul0,
                                           float mul1) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    if (row0) *reinterpret_cast<__nv_bfloat162*>(row0 + n * 8 + 2 * t) = __floats2bfloat162_rn(c[n][0] * mul0, c[n][1] * mul0);
    if (row1) *reinterpret_cast<__nv_bfloat162*>(row1 + n * 8 + 2 * t) = __floats2bfloat162_rn(c[n][2] * mul1, c[n][3] * mul1);
  }
}

// Forward. Block = 64 query rows of head h (query tiles in reverse order: the longest first);
// warp w owns rows q0 + 16w .. +15; thread (g, t) owns rows g and g+8 of its warp's 16.
// K/V tiles (64 keys) are double-buffered with cp.async; S, P and O stay in registers.
template <int D>
__global__ void __launch_bounds__(kThreads, 2) attn_fwd_tc_k(bf16* out, float* lse, const bf16* qkv, int T_, int NH,
                                                          int NKV, float scale) {
  using C = Tc<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = smem_u32(smem);
  auto sK = [&](int s) { return sQ + (1 + 2 * s) * C::kBytes; };
  auto sV = [&](int s) { return sQ + (2 + 2 * s) * C::kBytes; };
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint32_t aoff = a_off<D>(lane), boff = b_off<D>(lane);
  const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int q0 = qt * kTile, kvh = h / (NH / NKV);
  const size_t QKV = static_cast<size_t>(NH + 2 * NKV) * D;
  const bf16* rows = qkv + static_cast<size_t>(b) * T_ * QKV;
  const bf16* kbase = rows + static_cast<size_t>(NH + kvh) * D;
  const bf16* vbase = rows + static_cast<size_t>(NH + NKV + kvh) * D;
  const float sl2 = scale * kLog2e;

  load_tile<D>(sQ, rows + static_cast<size_t>(h) * D, QKV, q0, T_);
  load_tile<D>(sK(0), kbase, QKV, 0, T_);
  load_tile<D>(sV(0), vbase, QKV, 0, T_);
  cp_commit();

  uint32_t qf[D / 16][4];
  float o[D / 8][4];
  zero(o);
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // m in log2 units (scaled score * log2 e)
  const int lr0 = warp * 16 + g, lr1 = lr0 + 8;                 // local rows of this thread

  for (int kt = 0; kt <= qt; ++kt) {
    const int st = kt & 1;
    next_stage(kt < qt, [&] {
      load_tile<D>(sK(st ^ 1), kbase, QKV, (kt + 1) * kTile, T_);
      load_tile<D>(sV(st ^ 1), vbase, QKV, (kt + 1) * kTile, T_);
    });
    if (kt == 0) load_a<D>(qf, sQ, aoff, warp * 16);

    float s[8][4];
    zero(s);
    mma_abt<D>(s, qf, sK(st), boff);  // S (16 x 64) = Q_w K^T, raw (unscaled)

    if (kt == qt) {  // diagonal tile: q0 == k0, mask key > query (also masks every key >= T of a row < T)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          int col = j * 8 + 2 * t + e;
          if (col > lr0) s[j][e] = -INFINITY;
          if (col > lr1) s[j][2 + e] = -INFINITY;
        }
      }
    }
    // Online softmax on the accumulators; a row is spread over the 4 threads of a quad.
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
      mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // Key 0 is never masked and the first tile processed is kt = 0, so the new max is finite.
    const float mn0 = fmaxf(m0, mx0 * sl2), mn1 = fmaxf(m1, mx1 * sl2);
    const float al0 = exp2f(m0 - mn0), al1 = exp2f(m1 - mn1);  // 0 on the first tile (m = -inf)
    m0 = mn0;
    m1 = mn1;
    float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      s[j][0] = exp2f(fmaf(s[j][0], sl2, -mn0));
      s[j][1] = exp2f(fmaf(s[j][1], sl2, -mn0));
      s[j][2] = exp2f(fmaf(s[j][2], sl2, -mn1));
      s[j][3] = exp2f(fmaf(s[j][3], sl2, -mn1));
      rs0 += s[j][0] + s[j][1];
      rs1 += s[j][2] + s[j][3];
    }
    l0 = l0 * al0 + rs0;  // per-thread partial sums; the quad reduces them at the end
    l1 = l1 * al1 + rs1;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= al0;
      o[n][1] *= al0;
      o[n][2] *= al1;
      o[n][3] *= al1;
    }
    uint32_t pa[4][4];
    c_to_a(pa, s);
    mma_ab<D>(o, pa, sV(st), aoff);  // O_w += P V
    __syncthreads();                 // stage st is overwritten by the next iteration's prefetch
  }

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const int r0 = q0 + lr0, r1 = q0 + lr1;
  const size_t OS = static_cast<size_t>(NH) * D;
  bf16* ob = out + static_cast<size_t>(b) * T_ * OS + static_cast<size_t>(h) * D;
  store_rows<D>(r0 < T_ ? ob + r0 * OS : nullptr, r1 < T_ ? ob + r1 * OS : nullptr, o, t, 1.0f / l0, 1.0f / l1);
  if (t == 0) {
    float* lb = lse + (static_cast<size_t>(b) * NH + h) * T_;
    if (r0 < T_) lb[r0] = m0 * kLn2 + logf(l0);
    if (r1 < T_) lb[r1] = m1 * kLn2 + logf(l1);
  }
}

// dK, dV for 64 keys (k0 = 64 blockIdx.x) of kv head kvh: every query head of the group, every
// query tile at or after the keys' tile. Warp w owns keys k0 + 16w .. +15 (thread: keys g, g+8).
// Per step (head h, query tile q0), in registers: S^T = K_w Q^T (16 x 64), P^T = exp(S^T scale -
// lse[q]), dV_w += P^T dO, dP^T = V_w dO^T, dS^T = P^T (dP^T - D[q]) scale, dK_w += dS^T Q.
// Q, dO, lse and D tiles are double-buffered with cp.async.
template <int D>
__global__ void __launch_bounds__(kThreads, Tc<D>::kBwdBlocks) attn_bwd_dkv_tc_k(bf16* dqkv, const bf16* dout, const bf16* qkv,
                                                              const float* lse, const float* dvec, int T_, int NH,
                                                              int NKV, float scale) {
  using C = Tc<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sK = smem_u32(smem), sV = sK + C::kBytes;
  auto sQ = [&](int s) { return sK + (2 + 2 * s) * C::kBytes; };
  auto sdO = [&](int s) { return sK + (3 + 2 * s) * C::kBytes; };
  float* sL = reinterpret_cast<float*>(smem + 6 * C::kBytes);  // [2][64] lse, then [2][64] D
  float* sDv = sL + 2 * kTile;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint32_t aoff = a_off<D>(lane), boff = b_off<D>(lane);
  const int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int k0 = kt * kTile, G = NH / NKV;
  const size_t QKV = static_cast<size_t>(NH + 2 * NKV) * D, OS = static_cast<size_t>(NH) * D;
  const bf16* rows = qkv + static_cast<size_t>(b) * T_ * QKV;
  const bf16* grows = dout + static_cast<size_t>(b) * T_ * OS;
  const int nq = (T_ + kTile - 1) / kTile, per_head = nq - kt, iters = G * per_head;
  const float sl2 = scale * kLog2e;

  // Issues the loads of step `it` (head h = kvh G + it / per_head, query tile kt + it % per_head)
  // into stage s.
  auto issue = [&](int it, int s) {
    const int h = kvh * G + it / per_head, q0 = (kt + it % per_head) * kTile;
    load_tile<D>(sQ(s), rows + static_cast<size_t>(h) * D, QKV, q0, T_);
    load_tile<D>(sdO(s), grows + static_cast<size_t>(h) * D, OS, q0, T_);
    const int i = threadIdx.x & 63, q = q0 + i;
    const bool ok = q < T_;
    const size_t si = (static_cast<size_t>(b) * NH + h) * T_ + (ok ? q : 0);
    if (threadIdx.x < 64) cp_async4(smem_u32(sL + s * kTile + i), lse + si, ok);
    else cp_async4(smem_u32(sDv + s * kTile + i), dvec + si, ok);
  };

  load_tile<D>(sK, rows + static_cast<size_t>(NH + kvh) * D, QKV, k0, T_);
  load_tile<D>(sV, rows + static_cast<size_t>(NH + NKV + kvh) * D, QKV, k0, T_);
  issue(0, 0);
  cp_commit();

  float dk[D / 8][4], dv[D / 8][4];
  zero(dk);
  zero(dv);
  const int lk0 = warp * 16 + g, lk1 = lk0 + 8;  // local keys of this thread

  for (int it = 0; it < iters; ++it) {
    const int st = it & 1;
    next_stage(it + 1 < iters, [&] { issue(it + 1, st ^ 1); });
    const int q0 = (kt + it % per_head) * kTile;
    const float* L = sL + st * kTile;
    const float* Dq = sDv + st * kTile;

    float p[8][4];  // S^T, then P^T
    zero(p);
    mma_abt_s<D>(p, sK, aoff, warp * 16, sQ(st), boff);
    const bool need_mask = q0 == k0 || q0 + kTile > T_;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 lq = *reinterpret_cast<const float2*>(L + j * 8 + 2 * t);  // queries j*8+2t, +1
      const float la = lq.x * kLog2e, lb = lq.y * kLog2e;
      p[j][0] = exp2f(fmaf(p[j][0], sl2, -la));
      p[j][1] = exp2f(fmaf(p[j][1], sl2, -lb));
      p[j][2] = exp2f(fmaf(p[j][2], sl2, -la));
      p[j][3] = exp2f(fmaf(p[j][3], sl2, -lb));
      if (need_mask) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int lq_ = q0 - k0 + j * 8 + 2 * t + e;  // query index relative to k0
          const bool qok = q0 + j * 8 + 2 * t + e < T_;
          if (!qok || lk0 > lq_) p[j][e] = 0.0f;
          if (!qok || lk1 > lq_) p[j][2 + e] = 0.0f;
        }
      }
    }
    {
      uint32_t pa[4][4];
      c_to_a(pa, p);
      mma_ab<D>(dv, pa, sdO(st), aoff);  // dV_w += P^T dO
    }
    float dp[8][4];  // dP^T
    zero(dp);
    mma_abt_s<D>(dp, sV, aoff, warp * 16, sdO(st), boff);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 dq = *reinterpret_cast<const float2*>(Dq + j * 8 + 2 * t);
      p[j][0] = p[j][0] * (dp[j][0] - dq.x) * scale;
      p[j][1] = p[j][1] * (dp[j][1] - dq.y) * scale;
      p[j][2] = p[j][2] * (dp[j][2] - dq.x) * scale;
      p[j][3] = p[j][3] * (dp[j][3] - dq.y) * scale;
    }
    {
      uint32_t da[4][4];
      c_to_a(da, p);
      mma_ab<D>(dk, da, sQ(st), aoff);  // dK_w += dS^T Q
    }
    __syncthreads();  // stage st is overwritten by the next iteration's prefetch
  }

  const int j0 = k0 + lk0, j1 = k0 + lk1;
  bf16* kb = dqkv + static_cast<size_t>(b) * T_ * QKV + static_cast<size_t>(NH + kvh) * D;
  bf16* vb = kb + static_cast<size_t>(NKV) * D;
  store_rows<D>(j0 < T_ ? kb + j0 * QKV : nullptr, j1 < T_ ? kb + j1 * QKV : nullptr, dk, t, 1.0f, 1.0f);
  store_rows<D>(j0 < T_ ? vb + j0 * QKV : nullptr, j1 < T_ ? vb + j1 * QKV : nullptr, dv, t, 1.0f, 1.0f);
}

// dQ for 64 query rows of head h (query tiles in reverse order: the longest first); warp w owns
// rows q0 + 16w .. +15. Per key tile (double-buffered K, V): S = Q_w K^T, P = exp(S scale - lse),
// dP = dO_w V^T, dS = P (dP - D) scale, dQ_w += dS K, all in registers.
template <int D>
__global__ void __launch_bounds__(kThreads, Tc<D>::kBwdBlocks) attn_bwd_dq_tc_k(bf16* dqkv, const bf16* dout, const bf16* qkv,
                                                             const float* lse, const float* dvec, int T_, int NH,
                                                             int NKV, float scale) {
  using C = Tc<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = smem_u32(smem), sdO = sQ + C::kBytes;
  auto sK = [&](int s) { return sQ + (2 + 2 * s) * C::kBytes; };
  auto sV = [&](int s) { return sQ + (3 + 2 * s) * C::kBytes; };
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint32_t aoff = a_off<D>(lane), boff = b_off<D>(lane);
  const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int q0 = qt * kTile, kvh = h / (NH / NKV);
  const size_t QKV = static_cast<size_t>(NH + 2 * NKV) * D, OS = static_cast<size_t>(NH) * D;
  const bf16* rows = qkv + static_cast<size_t>(b) * T_ * QKV;
  const bf16* kbase = rows + static_cast<size_t>(NH + kvh) * D;
  const bf16* vbase = rows + static_cast<size_t>(NH + NKV + kvh) * D;
  const float sl2 = scale * kLog2e;

  load_tile<D>(sQ, rows + static_cast<size_t>(h) * D, QKV, q0, T_);
  load_tile<D>(sdO, dout + static_cast<size_t>(b) * T_ * OS + static_cast<size_t>(h) * D, OS, q0, T_);
  load_tile<D>(sK(0), kbase, QKV, 0, T_);
  load_tile<D>(sV(0), vbase, QKV, 0, T_);
  cp_commit();

  const int lr0 = warp * 16 + g, lr1 = lr0 + 8;  // local rows of this thread
  const int r0 = q0 + lr0, r1 = q0 + lr1;
  const size_t si = (static_cast<size_t>(b) * NH + h) * T_;
  // Rows >= T: any finite value (their results are never written).
  const float L0 = r0 < T_ ? lse[si + r0] * kLog2e : 0.0f, L1 = r1 < T_ ? lse[si + r1] * kLog2e : 0.0f;
  const float D0 = r0 < T_ ? dvec[si + r0] : 0.0f, D1 = r1 < T_ ? dvec[si + r1] : 0.0f;

  float dq[D / 8][4];
  zero(dq);

  for (int kt = 0; kt <= qt; ++kt) {
    const int st = kt & 1;
    next_stage(kt < qt, [&] {
      load_tile<D>(sK(st ^ 1), kbase, QKV, (kt + 1) * kTile, T_);
      load_tile<D>(sV(st ^ 1), vbase, QKV, (kt + 1) * kTile, T_);
    });
    float p[8][4];  // S, then P, then dS
    zero(p);
    mma_abt_s<D>(p, sQ, aoff, warp * 16, sK(st), boff);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      p[j][0] = exp2f(fmaf(p[j][0], sl2, -L0));
      p[j][1] = exp2f(fmaf(p[j][1], sl2, -L0));
      p[j][2] = exp2f(fmaf(p[j][2], sl2, -L1));
      p[j][3] = exp2f(fmaf(p[j][3], sl2, -L1));
    }
    if (kt == qt) {  // diagonal tile (q0 == k0): key > query -> 0 (covers every key >= T of a row < T)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = j * 8 + 2 * t + e;
          if (col > lr0) p[j][e] = 0.0f;
          if (col > lr1) p[j][2 + e] = 0.0f;
        }
      }
    }
    float dp[8][4];
    zero(dp);
    mma_abt_s<D>(dp, sdO, aoff, warp * 16, sV(st), boff);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      p[j][0] = p[j][0] * (dp[j][0] - D0) * scale;
      p[j][1] = p[j][1] * (dp[j][1] - D0) * scale;
      p[j][2] = p[j][2] * (dp[j][2] - D1) * scale;
      p[j][3] = p[j][3] * (dp[j][3] - D1) * scale;
    }
    uint32_t da[4][4];
    c_to_a(da, p);
    mma_ab<D>(dq, da, sK(st), aoff);  // dQ_w += dS K
    __syncthreads();                  // stage st is overwritten by the next iteration's prefetch
  }

  bf16* qb = dqkv + static_cast<size_t>(b) * T_ * QKV + static_cast<size_t>(h) * D;
  store_rows<D>(r0 < T_ ? qb + r0 * QKV : nullptr, r1 < T_ ? qb + r1 * QKV : nullptr, dq, t, 1.0f, 1.0f);
}

template <int D>
void fwd_tc(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int NKV, float scale) {
  static bool attr = [] {
    MT_CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_tc_k<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, Tc<D>::kFwdSmem));
    return true;
  }();
  (void)attr;
  dim3 grid((T + kTile - 1) / kTile, NH, B);
  attn_fwd_tc_k<D><<<grid, kThreads, Tc<D>::kFwdSmem, cu_stream()>>>(out, lse, qkv, T, NH, NKV, scale);
  MT_LAUNCH_CHECK("attention_forward (tensor cores)");
}

template <int D>
void bwd_tc(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* dvec, int B, int T, int NH,
            int NKV, float scale) {
  static bool attr = [] {
    MT_CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkv_tc_k<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, Tc<D>::kDkvSmem));
    MT_CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_tc_k<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, Tc<D>::kDqSmem));
    return true;
  }();
  (void)attr;
  int nt = (T + kTile - 1) / kTile;
  attn_bwd_dkv_tc_k<D><<<dim3(nt, NKV, B), kThreads, Tc<D>::kDkvSmem, cu_stream()>>>(dqkv, dout, qkv, lse, dvec, T,
                                                                                    NH, NKV, scale);
  MT_LAUNCH_CHECK("attention_backward dK/dV (tensor cores)");
  attn_bwd_dq_tc_k<D><<<dim3(nt, NH, B), kThreads, Tc<D>::kDqSmem, cu_stream()>>>(dqkv, dout, qkv, lse, dvec, T, NH,
                                                                                 NKV, scale);
  MT_LAUNCH_CHECK("attention_backward dQ (tensor cores)");
}

bool use_tc(DType dt, int HS) { return !g_force_plain && dt == DType::kBF16 && (HS == 64 || HS == 128); }

}  // namespace

void set_attention_plain(bool plain) { g_force_plain = plain; }

void attention_forward(void* out, float* lse, const void* qkv, DType dt, int B, int T, int NH, int NKV, int HS) {
  MT_CHECK(NKV > 0 && NH % NKV == 0 && HS <= 32 * kMaxPerLane, ErrorKind::kInvalidArgument,
           "cuda attention: needs NH % NKV == 0 and head size <= 256");
  float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  if (use_tc(dt, HS)) {
    auto* o = static_cast<bf16*>(out);
    auto* q = static_cast<const bf16*>(qkv);
    if (HS == 64) fwd_tc<64>(o, lse, q, B, T, NH, NKV, scale);
    else fwd_tc<128>(o, lse, q, B, T, NH, NKV, scale);
    return;
  }
  size_t warps = static_cast<size_t>(B) * NH * T;
  MT_DISPATCH(dt, X, attn_fwd_plain_k<X><<<grid_for(warps * 32, 256, 1u << 30), 256, 0, cu_stream()>>>(
                         static_cast<X*>(out), lse, static_cast<const X*>(qkv), B, T, NH, NKV, HS, scale));
  MT_LAUNCH_CHECK("attention_forward");
}

void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse, DType dt,
                        int B, int T, int NH, int NKV, int HS) {
  MT_CHECK(NKV > 0 && NH % NKV == 0 && HS <= 32 * kMaxPerLane, ErrorKind::kInvalidArgument,
           "cuda attention: needs NH % NKV == 0 and head size <= 256");
  float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  size_t rows = static_cast<size_t>(B) * NH * T;
  float* dvec = static_cast<float*>(scratch(rows * sizeof(float)));
  MT_DISPATCH(dt, X, attn_bwd_dvec_k<X><<<grid_for(rows * 32, 256, 1u << 30), 256, 0, cu_stream()>>>(
                         dvec, static_cast<const X*>(dout), static_cast<const X*>(out), B, T, NH, HS));
  MT_LAUNCH_CHECK("attention_backward D");
  if (use_tc(dt, HS)) {
    auto* g = static_cast<bf16*>(dqkv);
    auto* go = static_cast<const bf16*>(dout);
    auto* q = static_cast<const bf16*>(qkv);
    if (HS == 64) bwd_tc<64>(g, go, q, lse, dvec, B, T, NH, NKV, scale);
    else bwd_tc<128>(g, go, q, lse, dvec, B, T, NH, NKV, scale);
    return;
  }
  size_t kv_rows = static_cast<size_t>(B) * NKV * T;
  MT_DISPATCH(dt, X,
              attn_bwd_dq_plain_k<X><<<grid_for(rows * 32, 256, 1u << 30), 256, 0, cu_stream()>>>(
                  static_cast<X*>(dqkv), static_cast<const X*>(dout), static_cast<const X*>(qkv), lse, dvec, B, T, NH,
                  NKV, HS, scale);
              MT_LAUNCH_CHECK("attention_backward dQ");
              attn_bwd_dkv_plain_k<X><<<grid_for(kv_rows * 32, 256, 1u << 30), 256, 0, cu_stream()>>>(
                  static_cast<X*>(dqkv), static_cast<const X*>(dout), static_cast<const X*>(qkv), lse, dvec, B, T, NH,
                  NKV, HS, scale));
  MT_LAUNCH_CHECK("attention_backward dK/dV");
}

}  // namespace mt::cuda
