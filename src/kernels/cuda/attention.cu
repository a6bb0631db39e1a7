// Causal grouped-query attention on the GPU. Two implementations of one contract
// (kernels/cuda/ops.h, the CPU's kernels/cpu/attention.h):
//   - tensor cores (bf16, HS 64/128): FlashAttention-2's tiling (Dao 2023). Forward: a block owns
//     64 query rows of one head, 4 warps x 16 rows; K/V tiles of 64 keys stream through shared
//     memory; S = QK^T and O += PV on WMMA bf16 fragments with f32 accumulation; online softmax
//     with the running max/sum per row; saves only O and the row log-sum-exp. Backward: D = rowsum
//     (dO * O); one kernel per 64-key tile accumulates dK, dV over every query tile and every query
//     head of its kv group (no atomics: GQA sums inside the block); one kernel per 64-query tile
//     accumulates dQ. Both recompute P from the saved log-sum-exp.
//   - plain (any HS, f32 or bf16): one warp per row, the same math in scalar f32.
#include <mma.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace mt::cuda {
namespace {

using namespace nvcuda;

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

// ================= tensor-core kernels (bf16) =================
constexpr int kBr = 64, kBc = 64, kWarps = 4;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBc = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragBr = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

template <int D>
struct Tc {
  static constexpr int LDK = D + 8;    // bf16 tiles (Q, K, V, dO), padded rows
  static constexpr int LDS = kBc + 4;  // f32 scores per warp
  static constexpr int LDP = kBc + 8;  // bf16 probabilities per warp
  static constexpr int LDO = D + 4;    // f32 output accumulator per warp
  static constexpr int kTile = kBr * LDK * 2;  // bytes of one bf16 tile
  static constexpr int kS = 16 * LDS * 4, kP = 16 * LDP * 2, kO = 16 * LDO * 4;
  static constexpr int kFwdSmem = 3 * kTile + kWarps * (kS + kP + kO);
  static constexpr int kDkvSmem = 4 * kTile + 2 * kBr * 4 + kWarps * (kS + 2 * kP + kO);
  static constexpr int kDqSmem = 4 * kTile + kWarps * (kS + kP + kO);
};

// Copies rows [r0, r0 + 64) of one head (D wide, row stride `stride` elements, starting at
// `base`) into a padded smem tile; rows past T are zero.
template <int D>
__device__ void load_tile(bf16* tile, const bf16* base, size_t stride, int r0, int T_) {
  constexpr int kVec = D / 8;  // 16-byte vectors per row
  for (int i = threadIdx.x; i < kBr * kVec; i += blockDim.x) {
    int r = i / kVec, c = (i % kVec) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r0 + r < T_) v = *reinterpret_cast<const uint4*>(base + static_cast<size_t>(r0 + r) * stride + c);
    *reinterpret_cast<uint4*>(tile + r * Tc<D>::LDK + c) = v;
  }
}

template <int D>
__global__ void __launch_bounds__(128) attn_fwd_tc_k(bf16* out, float* lse, const bf16* qkv, int T_, int NH, int NKV,
                                                      float scale) {
  using C = Tc<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sK = sQ + kBr * C::LDK;
  bf16* sV = sK + kBr * C::LDK;
  int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  unsigned char* wbase = smem + 3 * C::kTile + warp * (C::kS + C::kP + C::kO);
  float* sS = reinterpret_cast<float*>(wbase);
  bf16* sP = reinterpret_cast<bf16*>(wbase + C::kS);
  float* sO = reinterpret_cast<float*>(wbase + C::kS + C::kP);

  int qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int q0 = qt * kBr, kvh = h / (NH / NKV);
  size_t QKV = static_cast<size_t>(NH + 2 * NKV) * D;
  const bf16* rows = qkv + static_cast<size_t>(b) * T_ * QKV;
  load_tile<D>(sQ, rows + static_cast<size_t>(h) * D, QKV, q0, T_);
  for (int i = lane; i < 16 * C::LDO; i += 32) sO[i] = 0.0f;
  int rr = lane >> 1, half = lane & 1;  // softmax: two lanes per row, 32 columns each
  int qi = q0 + warp * 16 + rr;
  float m = -INFINITY, l = 0.0f;

  for (int kt = 0; kt <= qt; ++kt) {
    int k0 = kt * kBc;
    __syncthreads();
    load_tile<D>(sK, rows + static_cast<size_t>(NH + kvh) * D, QKV, k0, T_);
    load_tile<D>(sV, rows + static_cast<size_t>(NH + NKV + kvh) * D, QKV, k0, T_);
    __syncthreads();
    // S (16 x 64) = Q_w K^T
#pragma unroll
    for (int nb = 0; nb < kBc / 16; ++nb) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        FragA a;
        FragBc bm;
        wmma::load_matrix_sync(a, sQ + (warp * 16) * C::LDK + kk * 16, C::LDK);
        wmma::load_matrix_sync(bm, sK + (nb * 16) * C::LDK + kk * 16, C::LDK);
        wmma::mma_sync(acc, a, bm, acc);
      }
      wmma::store_matrix_sync(sS + nb * 16, acc, C::LDS, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax over this tile's 64 keys.
    float s[32];
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      int col = half * 32 + c;
      float v = sS[rr * C::LDS + col] * scale;
      if (k0 + col > qi) v = -INFINITY;
      s[c] = v;
      mx = fmaxf(mx, v);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    float mn = fmaxf(m, mx);
    float alpha = __expf(m - mn);
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      float p = __expf(s[c] - mn);
      sum += p;
      sP[rr * C::LDP + half * 32 + c] = __float2bfloat16_rn(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = mn;
#pragma unroll 8
    for (int d = 0; d < D / 2; ++d) sO[rr * C::LDO + half * (D / 2) + d] *= alpha;
    __syncwarp();
    // O_w (16 x D) += P (16 x 64) V (64 x D)
#pragma unroll
    for (int nd = 0; nd < D / 16; ++nd) {
      FragC acc;
      wmma::load_matrix_sync(acc, sO + nd * 16, C::LDO, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) {
        FragA a;
        FragBr bm;
        wmma::load_matrix_sync(a, sP + kk * 16, C::LDP);
        wmma::load_matrix_sync(bm, sV + (kk * 16) * C::LDK + nd * 16, C::LDK);
        wmma::mma_sync(acc, a, bm, acc);
      }
      wmma::store_matrix_sync(sO + nd * 16, acc, C::LDO, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (qi < T_) {
    float inv = 1.0f / l;
    bf16* o = out + (static_cast<size_t>(b) * T_ + qi) * NH * D + static_cast<size_t>(h) * D;
    for (int d = 0; d < D / 2; ++d) o[half * (D / 2) + d] = __float2bfloat16_rn(sO[rr * C::LDO + half * (D / 2) + d] * inv);
    if (half == 0) lse[(static_cast<size_t>(b) * NH + h) * T_ + qi] = m + logf(l);
  }
}

// dK, dV for 64 keys of one kv head: every query head of the group, every query tile at or
// after the keys' tile.
template <int D>
__global__ void __launch_bounds__(128) attn_bwd_dkv_tc_k(bf16* dqkv, const bf16* dout, const bf16* qkv,
                                                          const float* lse, const float* dvec, int T_, int NH, int NKV,
                                                          float scale) {
  using C = Tc<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);
  bf16* sV = sK + kBr * C::LDK;
  bf16* sQ = sV + kBr * C::LDK;
  bf16* sdO = sQ + kBr * C::LDK;
  float* sL = reinterpret_cast<float*>(smem + 4 * C::kTile);
  float* sD = sL + kBr;
  int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  unsigned char* wbase = smem + 4 * C::kTile + 2 * kBr * 4 + warp * (C::kS + 2 * C::kP + C::kO);
  float* sS = reinterpret_cast<float*>(wbase);
  bf16* sP = reinterpret_cast<bf16*>(wbase + C::kS);
  bf16* sdS = reinterpret_cast<bf16*>(wbase + C::kS + C::kP);
  float* sOut = reinterpret_cast<float*>(wbase + C::kS + 2 * C::kP);

  int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  int k0 = kt * kBc, G = NH / NKV;
  size_t QKV = static_cast<size_t>(NH + 2 * NKV) * D, OS = static_cast<size_t>(NH) * D;
  const bf16* rows = qkv + static_cast<size_t>(b) * T_ * QKV;
  const bf16* grows = dout + static_cast<size_t>(b) * T_ * OS;
  load_tile<D>(sK, rows + static_cast<size_t>(NH + kvh) * D, QKV, k0, T_);
  load_tile<D>(sV, rows + static_cast<size_t>(NH + NKV + kvh) * D, QKV, k0, T_);
  FragC dK[D / 16], dV[D / 16];
#pragma unroll
  for (int i = 0; i < D / 16; ++i) {
    wmma::fill_fragment(dK[i], 0.0f);
    wmma::fill_fragment(dV[i], 0.0f);
  }
  int rr = lane >> 1, half = lane & 1;
  int kj = k0 + warp * 16 + rr;  // this lane's key
  int nq = (T_ + kBr - 1) / kBr;
  for (int g = 0; g < G; ++g) {
    int h = kvh * G + g;
    for (int qt = kt; qt < nq; ++qt) {
      int q0 = qt * kBr;
      __syncthreads();
      load_tile<D>(sQ, rows + static_cast<size_t>(h) * D, QKV, q0, T_);
      load_tile<D>(sdO, grows + static_cast<size_t>(h) * D, OS, q0, T_);
      for (int i = threadIdx.x; i < kBr; i += blockDim.x) {
        bool ok = q0 + i < T_;
        size_t si = (static_cast<size_t>(b) * NH + h) * T_ + q0 + i;
        sL[i] = ok ? lse[si] : INFINITY;
        sD[i] = ok ? dvec[si] : 0.0f;
      }
      __syncthreads();
      // S^T (16 keys x 64 queries) = K_w Q^T
#pragma unroll
      for (int nb = 0; nb < kBr / 16; ++nb) {
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          FragA a;
          FragBc bm;
          wmma::load_matrix_sync(a, sK + (warp * 16) * C::LDK + kk * 16, C::LDK);
          wmma::load_matrix_sync(bm, sQ + (nb * 16) * C::LDK + kk * 16, C::LDK);
          wmma::mma_sync(acc, a, bm, acc);
        }
        wmma::store_matrix_sync(sS + nb * 16, acc, C::LDS, wmma::mem_row_major);
      }
      __syncwarp();
      float p[32];
#pragma unroll
      for (int c = 0; c < 32; ++c) {
        int col = half * 32 + c;
        int qi = q0 + col;
        float v = (kj <= qi && qi < T_) ? __expf(sS[rr * C::LDS + col] * scale - sL[col]) : 0.0f;
        p[c] = v;
        sP[rr * C::LDP + col] = __float2bfloat16_rn(v);
      }
      __syncwarp();
      // dV_w += P^T (16 x 64) dO (64 x D)
#pragma unroll
      for (int nd = 0; nd < D / 16; ++nd) {
#pragma unroll
        for (int kk = 0; kk < kBr / 16; ++kk) {
          FragA a;
          FragBr bm;
          wmma::load_matrix_sync(a, sP + kk * 16, C::LDP);
          wmma::load_matrix_sync(bm, sdO + (kk * 16) * C::LDK + nd * 16, C::LDK);
          wmma::mma_sync(dV[nd], a, bm, dV[nd]);
        }
      }
      // dP^T (16 x 64) = V_w dO^T
#pragma unroll
      for (int nb = 0; nb < kBr / 16; ++nb) {
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          FragA a;
          FragBc bm;
          wmma::load_matrix_sync(a, sV + (warp * 16) * C::LDK + kk * 16, C::LDK);
          wmma::load_matrix_sync(bm, sdO + (nb * 16) * C::LDK + kk * 16, C::LDK);
          wmma::mma_sync(acc, a, bm, acc);
        }
        wmma::store_matrix_sync(sS + nb * 16, acc, C::LDS, wmma::mem_row_major);
      }
      __syncwarp();
#pragma unroll
      for (int c = 0; c < 32; ++c) {
        int col = half * 32 + c;
        float ds = p[c] * (sS[rr * C::LDS + col] - sD[col]) * scale;
        sdS[rr * C::LDP + col] = __float2bfloat16_rn(ds);
      }
      __syncwarp();
      // dK_w += dS^T (16 x 64) Q (64 x D)
#pragma unroll
      for (int nd = 0; nd < D / 16; ++nd) {
#pragma unroll
        for (int kk = 0; kk < kBr / 16; ++kk) {
          FragA a;
          FragBr bm;
          wmma::load_matrix_sync(a, sdS + kk * 16, C::LDP);
          wmma::load_matrix_sync(bm, sQ + (kk * 16) * C::LDK + nd * 16, C::LDK);
          wmma::mma_sync(dK[nd], a, bm, dK[nd]);
        }
      }
    }
  }
  // Write dK then dV through the per-warp f32 staging area.
  size_t krow = static_cast<size_t>(b) * T_ + kj;
  for (int which = 0; which < 2; ++which) {
    __syncwarp();
#pragma unroll
    for (int nd = 0; nd < D / 16; ++nd)
      wmma::store_matrix_sync(sOut + nd * 16, which == 0 ? dK[nd] : dV[nd], C::LDO, wmma::mem_row_major);
    __syncwarp();
    if (kj < T_) {
      bf16* o = dqkv + krow * QKV + static_cast<size_t>(NH + which * NKV + kvh) * D;
      for (int d = 0; d < D / 2; ++d) o[half * (D / 2) + d] = __float2bfloat16_rn(sOut[rr * C::LDO + half * (D / 2) + d]);
    }
  }
}

// dQ for 64 query rows of one head.
template <int D>
__global__ void __launch_bounds__(128) attn_bwd_dq_tc_k(bf16* dqkv, const bf16* dout, const bf16* qkv,
                                                         const float* lse, const float* dvec, int T_, int NH, int NKV,
                                                         float scale) {
  using C = Tc<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sdO = sQ + kBr * C::LDK;
  bf16* sK = sdO + kBr * C::LDK;
  bf16* sV = sK + kBr * C::LDK;
  int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  unsigned char* wbase = smem + 4 * C::kTile + warp * (C::kS + C::kP + C::kO);
  float* sS = reinterpret_cast<float*>(wbase);
  bf16* sdS = reinterpret_cast<bf16*>(wbase + C::kS);
  float* sOut = reinterpret_cast<float*>(wbase + C::kS + C::kP);

  int qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int q0 = qt * kBr, kvh = h / (NH / NKV);
  size_t QKV = static_cast<size_t>(NH + 2 * NKV) * D, OS = static_cast<size_t>(NH) * D;
  const bf16* rows = qkv + static_cast<size_t>(b) * T_ * QKV;
  load_tile<D>(sQ, rows + static_cast<size_t>(h) * D, QKV, q0, T_);
  load_tile<D>(sdO, dout + static_cast<size_t>(b) * T_ * OS + static_cast<size_t>(h) * D, OS, q0, T_);
  int rr = lane >> 1, half = lane & 1;
  int qi = q0 + warp * 16 + rr;
  size_t si = (static_cast<size_t>(b) * NH + h) * T_ + qi;
  float L = qi < T_ ? lse[si] : INFINITY, Dv = qi < T_ ? dvec[si] : 0.0f;
  FragC dQ[D / 16];
#pragma unroll
  for (int i = 0; i < D / 16; ++i) wmma::fill_fragment(dQ[i], 0.0f);

  for (int kt = 0; kt <= qt; ++kt) {
    int k0 = kt * kBc;
    __syncthreads();
    load_tile<D>(sK, rows + static_cast<size_t>(NH + kvh) * D, QKV, k0, T_);
    load_tile<D>(sV, rows + static_cast<size_t>(NH + NKV + kvh) * D, QKV, k0, T_);
    __syncthreads();
#pragma unroll
    for (int nb = 0; nb < kBc / 16; ++nb) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        FragA a;
        FragBc bm;
        wmma::load_matrix_sync(a, sQ + (warp * 16) * C::LDK + kk * 16, C::LDK);
        wmma::load_matrix_sync(bm, sK + (nb * 16) * C::LDK + kk * 16, C::LDK);
        wmma::mma_sync(acc, a, bm, acc);
      }
      wmma::store_matrix_sync(sS + nb * 16, acc, C::LDS, wmma::mem_row_major);
    }
    __syncwarp();
    float p[32];
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      int col = half * 32 + c;
      p[c] = (k0 + col <= qi && qi < T_) ? __expf(sS[rr * C::LDS + col] * scale - L) : 0.0f;
    }
    __syncwarp();
    // dP (16 x 64) = dO_w V^T
#pragma unroll
    for (int nb = 0; nb < kBc / 16; ++nb) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        FragA a;
        FragBc bm;
        wmma::load_matrix_sync(a, sdO + (warp * 16) * C::LDK + kk * 16, C::LDK);
        wmma::load_matrix_sync(bm, sV + (nb * 16) * C::LDK + kk * 16, C::LDK);
        wmma::mma_sync(acc, a, bm, acc);
      }
      wmma::store_matrix_sync(sS + nb * 16, acc, C::LDS, wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      int col = half * 32 + c;
      sdS[rr * C::LDP + col] = __float2bfloat16_rn(p[c] * (sS[rr * C::LDS + col] - Dv) * scale);
    }
    __syncwarp();
    // dQ_w += dS (16 x 64) K (64 x D)
#pragma unroll
    for (int nd = 0; nd < D / 16; ++nd) {
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) {
        FragA a;
        FragBr bm;
        wmma::load_matrix_sync(a, sdS + kk * 16, C::LDP);
        wmma::load_matrix_sync(bm, sK + (kk * 16) * C::LDK + nd * 16, C::LDK);
        wmma::mma_sync(dQ[nd], a, bm, dQ[nd]);
      }
    }
  }
  __syncwarp();
#pragma unroll
  for (int nd = 0; nd < D / 16; ++nd) wmma::store_matrix_sync(sOut + nd * 16, dQ[nd], C::LDO, wmma::mem_row_major);
  __syncwarp();
  if (qi < T_) {
    bf16* o = dqkv + (static_cast<size_t>(b) * T_ + qi) * QKV + static_cast<size_t>(h) * D;
    for (int d = 0; d < D / 2; ++d) o[half * (D / 2) + d] = __float2bfloat16_rn(sOut[rr * C::LDO + half * (D / 2) + d]);
  }
}

template <int D>
void fwd_tc(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int NKV, float scale) {
  static bool attr = [] {
    MT_CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_tc_k<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, Tc<D>::kFwdSmem));
    return true;
  }();
  (void)attr;
  dim3 grid((T + kBr - 1) / kBr, NH, B);
  attn_fwd_tc_k<D><<<grid, 32 * kWarps, Tc<D>::kFwdSmem, cu_stream()>>>(out, lse, qkv, T, NH, NKV, scale);
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
  int nt = (T + kBr - 1) / kBr;
  attn_bwd_dkv_tc_k<D><<<dim3(nt, NKV, B), 32 * kWarps, Tc<D>::kDkvSmem, cu_stream()>>>(dqkv, dout, qkv, lse, dvec, T,
                                                                                       NH, NKV, scale);
  MT_LAUNCH_CHECK("attention_backward dK/dV (tensor cores)");
  attn_bwd_dq_tc_k<D><<<dim3(nt, NH, B), 32 * kWarps, Tc<D>::kDqSmem, cu_stream()>>>(dqkv, dout, qkv, lse, dvec, T, NH,
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
