#include "kernels/cuda/ops.h"

#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cuda/common.cuh"

namespace mt::cuda {
namespace {

// ---- embedding ----
template <typename T>
__global__ void embedding_fwd_k(float* out, const int32_t* tokens, const T* wte, const float* wpe, int N, int T_,
                                int C) {
  size_t total = static_cast<size_t>(N) * C;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total; i += size_t{gridDim.x} * blockDim.x) {
    int n = static_cast<int>(i / C), c = static_cast<int>(i % C);
    float v = to_f(wte[static_cast<size_t>(tokens[n]) * C + c]);
    if (wpe) v += wpe[static_cast<size_t>(n % T_) * C + c];
    out[i] = v;
  }
}

// One block per distinct token: its positions' rows summed in position order, then added once
// (deterministic, no atomics). buckets: positions (N) grouped by token, token (U), start (U + 1).
__global__ void embedding_bwd_wte_k(float* dwte, const float* dout, const int32_t* buckets, int U, int N, int C) {
  const int32_t* pos = buckets;
  const int32_t* tok = buckets + N;
  const int32_t* start = buckets + N + U;
  int u = blockIdx.x;
  int b = start[u], e = start[u + 1];
  float* row = dwte + static_cast<size_t>(tok[u]) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float s = 0.0f;
    for (int i = b; i < e; ++i) s += dout[static_cast<size_t>(pos[i]) * C + c];
    row[c] += s;
  }
}

__global__ void embedding_bwd_wpe_k(float* dwpe, const float* dout, int N, int T_, int C) {
  size_t total = static_cast<size_t>(T_) * C;
  int B = N / T_;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total; i += size_t{gridDim.x} * blockDim.x) {
    float s = 0.0f;
    for (int b = 0; b < B; ++b) s += dout[static_cast<size_t>(b) * T_ * C + i];
    dwpe[i] += s;
  }
}

// ---- column reductions in a fixed order (weight and bias gradients) ----
// partial[chunk][c] (two outputs) = sum over the chunk's rows of f(n, c); then out[c] += sum over
// chunks. Block (32 columns x 8 row lanes).
constexpr int kColLanes = 8;

inline int col_chunks(int N) { return std::max(1, std::min(256, (N + 63) / 64)); }

template <typename F>
__global__ void colreduce_partial_k(float* partial, int N, int C, int rows_per_chunk, F f) {
  __shared__ float s0[kColLanes][33], s1[kColLanes][33];
  int c = blockIdx.x * 32 + threadIdx.x;
  int chunk = blockIdx.y;
  int n0 = chunk * rows_per_chunk, n1 = min(N, n0 + rows_per_chunk);
  float a = 0.0f, b = 0.0f;
  if (c < C)
    for (int n = n0 + threadIdx.y; n < n1; n += kColLanes) f(n, c, a, b);
  s0[threadIdx.y][threadIdx.x] = a;
  s1[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float ta = 0.0f, tb = 0.0f;
    for (int i = 0; i < kColLanes; ++i) {
      ta += s0[i][threadIdx.x];
      tb += s1[i][threadIdx.x];
    }
    size_t chunks = gridDim.y;
    partial[static_cast<size_t>(chunk) * C + c] = ta;
    partial[(chunks + chunk) * static_cast<size_t>(C) + c] = tb;
  }
}

// out_q[c] += sum over k < G of partial[q][k][c] for q < 3 (null outputs skipped), in a fixed order:
// 16 row lanes each sum a strided share, then lane 0 sums the 16. Blocks (32 columns x 16), grid
// (columns / 32, 3). (One thread per column summing all G serially was latency-bound: 0.1-0.4 ms.)
constexpr int kFinalLanes = 16;
__global__ void colsum_final_k(float* o0, float* o1, float* o2, const float* partial, int G, int C) {
  __shared__ float red[kFinalLanes][33];
  int q = blockIdx.y;
  float* out = q == 0 ? o0 : (q == 1 ? o1 : o2);
  if (out == nullptr) return;
  int c = blockIdx.x * 32 + threadIdx.x;
  float t = 0.0f;
  if (c < C) {
#pragma unroll 4
    for (int k = threadIdx.y; k < G; k += kFinalLanes) t += partial[(static_cast<size_t>(q) * G + k) * C + c];
  }
  red[threadIdx.y][threadIdx.x] = t;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float s = 0.0f;
    for (int i = 0; i < kFinalLanes; ++i) s += red[i][threadIdx.x];
    out[c] += s;
  }
}

void colsum_final(float* o0, float* o1, float* o2, const float* partial, int G, int C) {
  colsum_final_k<<<dim3((C + 31) / 32, 3), dim3(32, kFinalLanes), 0, cu_stream()>>>(o0, o1, o2, partial, G, C);
  MT_LAUNCH_CHECK("colsum_final");
}

template <typename F>
void colreduce(float* out0, float* out1, int N, int C, F f) {
  int chunks = col_chunks(N);
  int rows = (N + chunks - 1) / chunks;
  float* partial = static_cast<float*>(scratch(size_t{2} * chunks * C * sizeof(float)));
  dim3 grid((C + 31) / 32, chunks);
  colreduce_partial_k<<<grid, dim3(32, kColLanes), 0, cu_stream()>>>(partial, N, C, rows, f);
  MT_LAUNCH_CHECK("colreduce_partial");
  colsum_final(out0, out1, nullptr, partial, chunks, C);
}

template <typename T>
struct BiasGradF {
  const T* dout;
  int C;
  __device__ void operator()(int n, int c, float& a, float&) const { a += to_f(dout[static_cast<size_t>(n) * C + c]); }
};

struct LnGradF {  // a += dout * xhat (weight), b += dout (bias)
  const float *dout, *inp, *mean, *rstd;
  int C;
  __device__ void operator()(int n, int c, float& a, float& b) const {
    size_t i = static_cast<size_t>(n) * C + c;
    float xhat = (inp[i] - mean[n]) * rstd[n];
    a += dout[i] * xhat;
    b += dout[i];
  }
};

struct RmsGradF {  // a += dout * x * rstd
  const float *dout, *inp, *rstd;
  int C;
  __device__ void operator()(int n, int c, float& a, float&) const {
    size_t i = static_cast<size_t>(n) * C + c;
    a += dout[i] * inp[i] * rstd[n];
  }
};

// ---- norms: one warp per row ----
// LayerNorm forward with the row in registers (C <= 32 kL): one read of the row, all its loads in
// flight at once, then the mean, the variance about it and the output.
template <typename T, int kL>
__global__ void layernorm_fwd_reg_k(T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                                    const float* __restrict__ inp, const float* __restrict__ w,
                                    const float* __restrict__ b, int N, int C, float eps) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (row >= N) return;
  const float* x = inp + static_cast<size_t>(row) * C;
  float v[kL];
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kL; ++i) {
    int c = lane + 32 * i;
    v[i] = c < C ? x[c] : 0.0f;
    s += v[i];
  }
  float m = warp_sum(s) / C;
  float q = 0.0f;
#pragma unroll
  for (int i = 0; i < kL; ++i) {
    int c = lane + 32 * i;
    float d = c < C ? v[i] - m : 0.0f;
    q += d * d;
  }
  float r = rsqrtf(warp_sum(q) / C + eps);
  T* o = out + static_cast<size_t>(row) * C;
#pragma unroll
  for (int i = 0; i < kL; ++i) {
    int c = lane + 32 * i;
    if (c < C) {
      float y = (v[i] - m) * r * w[c];
      if (b) y += b[c];
      o[c] = from_f<T>(y);
    }
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    rstd[row] = r;
  }
}

template <typename T>
__global__ void layernorm_fwd_k(T* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                                int N, int C, float eps) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (row >= N) return;
  const float* x = inp + static_cast<size_t>(row) * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += x[c];
  float m = warp_sum(s) / C;
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float d = x[c] - m;
    v += d * d;
  }
  float r = rsqrtf(warp_sum(v) / C + eps);
  T* o = out + static_cast<size_t>(row) * C;
  for (int c = lane; c < C; c += 32) {
    float y = (x[c] - m) * r * w[c];
    if (b) y += b[c];
    o[c] = from_f<T>(y);
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    rstd[row] = r;
  }
}

__global__ void layernorm_bwd_k(float* dinp, const float* dout, const float* inp, const float* w, const float* mean,
                                const float* rstd, int N, int C) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (row >= N) return;
  size_t base = static_cast<size_t>(row) * C;
  float m = mean[row], r = rstd[row];
  float a = 0.0f, bsum = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float dn = dout[base + c] * w[c];
    a += dn;
    bsum += dn * (inp[base + c] - m) * r;
  }
  a = warp_sum(a) / C;
  bsum = warp_sum(bsum) / C;
  for (int c = lane; c < C; c += 32) {
    float xhat = (inp[base + c] - m) * r;
    float dn = dout[base + c] * w[c];
    dinp[base + c] += r * (dn - a - xhat * bsum);
  }
}

// LayerNorm backward in one pass over the rows (C <= 32 * kLnLanes): each warp owns rows and loads a
// row's dout, inp and dinp into registers with every load issued before the first use (one memory
// latency a row, not one a column: the kernel is latency-bound otherwise); the columns' weight/bias
// gradient sums (and, if asked, the column sums of the updated dinp: the next bias gradient down the
// stack) accumulate in the warp's own slice of shared memory; the block then sums its warps in a
// fixed order into partial[q][block][C] for colsum_final. Also writes dinp's copy in TC (the next
// GEMM's input).
constexpr int kLnLanes = 32;  // the most columns per lane (C <= 1024)
constexpr int kLnWarps = 8;
template <typename TC, int kL>  // kL: columns per lane, ceil(C / 32) rounded up to a multiple of 8
__global__ void __launch_bounds__(256, 2) layernorm_bwd_fused_k(float* __restrict__ dinp, TC* __restrict__ copy,
                                                               float* __restrict__ partial, const float* __restrict__ dout,
                                                               const float* __restrict__ inp,
                                                               const float* __restrict__ w,
                                                               const float* __restrict__ mean,
                                                               const float* __restrict__ rstd, int N, int C, bool colsum) {
  extern __shared__ float acc[];  // [warp][3][C]: this warp's sums of dout * xhat, dout, new dinp
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, nw = blockDim.x / 32;
  float* mine = acc + static_cast<size_t>(warp) * 3 * C;
  for (int c = lane; c < 3 * C; c += 32) mine[c] = 0.0f;
  __syncwarp();
  for (int row = blockIdx.x * nw + warp; row < N; row += gridDim.x * nw) {
    size_t base = static_cast<size_t>(row) * C;
    float go[kL], xh[kL], dv[kL];
#pragma unroll
    for (int i = 0; i < kL; ++i) {
      int c = lane + 32 * i;
      go[i] = c < C ? dout[base + c] : 0.0f;
      xh[i] = c < C ? inp[base + c] : 0.0f;
      dv[i] = c < C ? dinp[base + c] : 0.0f;
    }
    float m = mean[row], r = rstd[row];
    float a = 0.0f, bsum = 0.0f;
#pragma unroll
    for (int i = 0; i < kL; ++i) {
      int c = lane + 32 * i;
      xh[i] = (xh[i] - m) * r;
      float dn = c < C ? go[i] * w[c] : 0.0f;
      a += dn;
      bsum += dn * xh[i];
    }
    a = warp_sum(a) / C;
    bsum = warp_sum(bsum) / C;
#pragma unroll
    for (int i = 0; i < kL; ++i) {
      int c = lane + 32 * i;
      if (c < C) {
        float d = dv[i] + r * (go[i] * w[c] - a - xh[i] * bsum);
        dinp[base + c] = d;
        if (copy) copy[base + c] = from_f<TC>(d);
        mine[c] += go[i] * xh[i];
        mine[C + c] += go[i];
        mine[2 * C + c] += d;
      }
    }
  }
  __syncthreads();
  const int G = gridDim.x;
  for (int q = 0; q < (colsum ? 3 : 2); ++q)
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      float t = 0.0f;
      for (int k = 0; k < nw; ++k) t += acc[(static_cast<size_t>(k) * 3 + q) * C + c];
      partial[(static_cast<size_t>(q) * G + blockIdx.x) * C + c] = t;
    }
}

template <typename T>
__global__ void rmsnorm_fwd_k(T* out, float* rstd, const float* inp, const float* w, int N, int C, float eps) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (row >= N) return;
  const float* x = inp + static_cast<size_t>(row) * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += x[c] * x[c];
  float r = rsqrtf(warp_sum(s) / C + eps);
  T* o = out + static_cast<size_t>(row) * C;
  for (int c = lane; c < C; c += 32) o[c] = from_f<T>(x[c] * r * w[c]);
  if (lane == 0) rstd[row] = r;
}

__global__ void rmsnorm_bwd_k(float* dinp, const float* dout, const float* inp, const float* w, const float* rstd,
                              int N, int C) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (row >= N) return;
  size_t base = static_cast<size_t>(row) * C;
  float r = rstd[row];
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += dout[base + c] * w[c] * inp[base + c];
  s = warp_sum(s) / C;
  for (int c = lane; c < C; c += 32)
    dinp[base + c] += r * (dout[base + c] * w[c] - inp[base + c] * r * r * s);
}

// ---- activations ----
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)

__device__ __forceinline__ float gelu_f(float x) {
  float u = kGeluK * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float gelu_grad(float x) {
  float u = kGeluK * (x + 0.044715f * x * x * x);
  float th = tanhf(u);
  float du = kGeluK * (1.0f + 3.0f * 0.044715f * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

// 16 bytes of T: elementwise kernels load and store whole vectors where the pointers allow.
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kW = 16 / sizeof(T);
  T v[kW];
};
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Elements [0, nv * W) as vectors when kVec, the rest one by one.
template <typename T, bool kVec>
__global__ void gelu_fwd_k(T* out, const T* inp, size_t n) {
  constexpr int W = Vec16<T>::kW;
  size_t stride = size_t{gridDim.x} * blockDim.x, t0 = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  size_t nv = kVec ? n / W : 0;
  for (size_t i = t0; i < nv; i += stride) {
    Vec16<T> x = reinterpret_cast<const Vec16<T>*>(inp)[i], y;
#pragma unroll
    for (int k = 0; k < W; ++k) y.v[k] = from_f<T>(gelu_f(to_f(x.v[k])));
    reinterpret_cast<Vec16<T>*>(out)[i] = y;
  }
  for (size_t i = nv * W + t0; i < n; i += stride) out[i] = from_f<T>(gelu_f(to_f(inp[i])));
}

template <typename T, bool kVec>
__global__ void gelu_bwd_k(T* dinp, const T* inp, const T* dout, size_t n) {
  constexpr int W = Vec16<T>::kW;
  size_t stride = size_t{gridDim.x} * blockDim.x, t0 = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  size_t nv = kVec ? n / W : 0;
  for (size_t i = t0; i < nv; i += stride) {
    Vec16<T> x = reinterpret_cast<const Vec16<T>*>(inp)[i], d = reinterpret_cast<const Vec16<T>*>(dout)[i], y;
#pragma unroll
    for (int k = 0; k < W; ++k) y.v[k] = from_f<T>(to_f(d.v[k]) * gelu_grad(to_f(x.v[k])));
    reinterpret_cast<Vec16<T>*>(dinp)[i] = y;
  }
  for (size_t i = nv * W + t0; i < n; i += stride) dinp[i] = from_f<T>(to_f(dout[i]) * gelu_grad(to_f(inp[i])));
}

// GELU backward over rows (N, H) with the bias gradient fused: each thread owns W = 16 / sizeof(T)
// adjacent columns, sums their dinp over the block's rows in order, and writes partial[block][H] for
// colsum_final (deterministic). Needs H % W == 0, H / W <= 1024 and 16-byte aligned rows.
// kGelu false: the bias gradient of dout alone (bias_backward's vectorised path; dinp, inp unused).
template <typename T, bool kGelu = true>
__global__ void gelu_bwd_bias_k(T* dinp, float* partial, const T* inp, const T* dout, int N, int H) {
  constexpr int W = Vec16<T>::kW;
  const int j = threadIdx.x, HV = H / W;
  const int rows = (N + gridDim.x - 1) / gridDim.x, n0 = blockIdx.x * rows, n1 = min(N, n0 + rows);
  float acc[W];
#pragma unroll
  for (int k = 0; k < W; ++k) acc[k] = 0.0f;
  if (j < HV) {
#pragma unroll 4
    for (int n = n0; n < n1; ++n) {
      size_t i = static_cast<size_t>(n) * HV + j;
      Vec16<T> d = reinterpret_cast<const Vec16<T>*>(dout)[i];
      if constexpr (kGelu) {
        Vec16<T> x = reinterpret_cast<const Vec16<T>*>(inp)[i], y;
#pragma unroll
        for (int k = 0; k < W; ++k) {
          y.v[k] = from_f<T>(to_f(d.v[k]) * gelu_grad(to_f(x.v[k])));
          acc[k] += to_f(y.v[k]);  // the stored (rounded) value, as a separate bias_backward would read it
        }
        reinterpret_cast<Vec16<T>*>(dinp)[i] = y;
      } else {
#pragma unroll
        for (int k = 0; k < W; ++k) acc[k] += to_f(d.v[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < W; ++k) partial[static_cast<size_t>(blockIdx.x) * H + j * W + k] = acc[k];
  }
}

template <typename T>
__global__ void swiglu_fwd_k(T* out, const T* inp, int N, int I) {
  size_t total = static_cast<size_t>(N) * I;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total; i += size_t{gridDim.x} * blockDim.x) {
    size_t n = i / I, j = i % I;
    float g = to_f(inp[n * 2 * I + j]), u = to_f(inp[n * 2 * I + I + j]);
    float sg = 1.0f / (1.0f + __expf(-g));
    out[i] = from_f<T>(g * sg * u);
  }
}

template <typename T>
__global__ void swiglu_bwd_k(T* dinp, const T* dout, const T* inp, int N, int I) {
  size_t total = static_cast<size_t>(N) * I;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total; i += size_t{gridDim.x} * blockDim.x) {
    size_t n = i / I, j = i % I;
    float g = to_f(inp[n * 2 * I + j]), u = to_f(inp[n * 2 * I + I + j]), d = to_f(dout[i]);
    float sg = 1.0f / (1.0f + __expf(-g));
    float silu = g * sg;
    dinp[n * 2 * I + j] = from_f<T>(d * u * sg * (1.0f + g * (1.0f - sg)));
    dinp[n * 2 * I + I + j] = from_f<T>(d * silu);
  }
}

// ---- RoPE (rotate_half pairs j and j + HS/2) ----
template <typename T>
__global__ void rope_k(T* qkv, const float* cos, const float* sin, int N, int T_, int NH, int NKV, int HS,
                       float dir) {
  int H = HS / 2, heads = NH + NKV, QKV = (NH + 2 * NKV) * HS;
  size_t total = static_cast<size_t>(N) * heads * H;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total; i += size_t{gridDim.x} * blockDim.x) {
    int j = static_cast<int>(i % H);
    size_t rest = i / H;
    int hh = static_cast<int>(rest % heads);
    int n = static_cast<int>(rest / heads);
    int t = n % T_;
    T* x = qkv + static_cast<size_t>(n) * QKV + static_cast<size_t>(hh) * HS;
    float c = cos[static_cast<size_t>(t) * H + j], s = dir * sin[static_cast<size_t>(t) * H + j];
    float a = to_f(x[j]), b = to_f(x[j + H]);
    x[j] = from_f<T>(a * c - b * s);
    x[j + H] = from_f<T>(b * c + a * s);
  }
}

// ---- elementwise ----
template <typename D, typename S>
__global__ void convert_k(D* dst, const S* src, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    dst[i] = from_f<D>(to_f(src[i]));
}

__global__ void add_inplace_k(float* acc, const float* x, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    acc[i] += x[i];
}

template <typename T>
__global__ void add_bias_k(T* d, const float* bias, int M, int N, int ld) {
  size_t total = static_cast<size_t>(M) * N;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total; i += size_t{gridDim.x} * blockDim.x) {
    size_t r = i / N, c = i % N;
    d[r * ld + c] = from_f<T>(to_f(d[r * ld + c]) + bias[c]);
  }
}

// ---- cross-entropy: one block per row ----
// Stores 4 consecutive values of T (16 or 8 bytes; the caller checked the alignment).
__device__ __forceinline__ void store4(float* d, float a, float b, float c, float e) {
  *reinterpret_cast<float4*>(d) = make_float4(a, b, c, e);
}
__device__ __forceinline__ void store4(bf16* d, float a, float b, float c, float e) {
  __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, e);
  uint2 u;
  u.x = *reinterpret_cast<uint32_t*>(&lo);
  u.y = *reinterpret_cast<uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(d) = u;
}

__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load4(const bf16* p) {
  uint2 u = *reinterpret_cast<const uint2*>(p);
  float2 lo = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&u.x));
  float2 hi = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&u.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// L: the logits' type (f32, or bf16 as a bf16 GEMM writes them); T: the gradient's. kVec: the
// logits and dl rows are aligned to four elements with leading dimensions a multiple of 4, so the
// first V / 4 * 4 columns go four at a time, the rest one by one.
template <typename L, typename T, bool kVec>
__global__ void cross_entropy_k(float* loss, float* lse_out, const L* logits, int ldl, const int32_t* targets,
                                int V, float grad_scale, T* dl, int ldd) {
  int r = blockIdx.x;
  const L* x = logits + static_cast<size_t>(r) * ldl;
  int tgt = targets[r];
  // The target's logit is read before the reductions' barriers: dl may be the logits themselves
  // (in place), and past the barriers other threads overwrite them with the gradient.
  float xt = tgt >= 0 && threadIdx.x == 0 ? to_f(x[tgt]) : 0.0f;
  // One pass for the max and the sum (online: the sum rescaled when the max grows), then the
  // gradient pass: the logits are read twice, not three times.
  const int V4 = kVec ? V / 4 : 0;
  float m = -INFINITY, s = 0.0f;
#pragma unroll 4
  for (int q = threadIdx.x; q < V4; q += blockDim.x) {
    float4 v = load4(x + 4 * q);
    float m4 = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
    if (m4 > m) {
      s *= __expf(m - m4);
      m = m4;
    }
    s += __expf(v.x - m) + __expf(v.y - m) + __expf(v.z - m) + __expf(v.w - m);
  }
  for (int v = V4 * 4 + threadIdx.x; v < V; v += blockDim.x) {
    float xv = to_f(x[v]);
    if (xv > m) {
      s = s * __expf(m - xv) + 1.0f;
      m = xv;
    } else {
      s += __expf(xv - m);
    }
  }
  float mx = block_max(m);
  s = block_sum(m == -INFINITY ? 0.0f : s * __expf(m - mx));
  float lse = mx + logf(s);
  if (threadIdx.x == 0) {
    loss[r] = tgt < 0 ? 0.0f : lse - xt;
    if (lse_out) lse_out[r] = lse;
  }
  if (grad_scale == 0.0f) return;
  T* d = dl + static_cast<size_t>(r) * ldd;
  const float gs = tgt < 0 ? 0.0f : grad_scale;
#pragma unroll 4
  for (int q = threadIdx.x; q < V4; q += blockDim.x) {
    float4 v = load4(x + 4 * q);
    int c = 4 * q;
    store4(d + c, (__expf(v.x - lse) - (c == tgt ? 1.0f : 0.0f)) * gs,
           (__expf(v.y - lse) - (c + 1 == tgt ? 1.0f : 0.0f)) * gs, (__expf(v.z - lse) - (c + 2 == tgt ? 1.0f : 0.0f)) * gs,
           (__expf(v.w - lse) - (c + 3 == tgt ? 1.0f : 0.0f)) * gs);
  }
  for (int v = V4 * 4 + threadIdx.x; v < V; v += blockDim.x) {
    float g = (__expf(to_f(x[v]) - lse) - (v == tgt ? 1.0f : 0.0f)) * gs;
    d[v] = from_f<T>(g);
  }
}

// ---- AdamW ----
using AdamScalars = kernels::AdamWScalars;

template <typename T>
__global__ void adamw_k(float* p, const float* grad, float* m, float* v, T* lowp, size_t n, AdamScalars s) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    float g = grad[i] * s.grad_scale;
    if (s.l2 != 0.0f) g = fmaf(s.l2, p[i], g);
    float mi = s.beta1 * m[i] + s.one_minus_beta1 * g;
    float vi = s.beta2 * v[i] + s.one_minus_beta2 * g * g;
    float pi = p[i] * s.decay;
    pi = pi - s.step_size * mi / (sqrtf(vi) / s.bc2_sqrt + s.eps);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (lowp) lowp[i] = from_f<T>(pi);
  }
}

// ---- sum of squares: fixed grid, fixed order ----
constexpr int kSumBlocks = 1024;
__global__ void sumsq_partial_k(double* partial, const float* x, size_t n) {
  double s = 0.0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    double v = x[i];
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
__global__ void sumsq_final_k(double* out, const double* partial, int n) {
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}
__global__ void fill_random_bf16_k(bf16* dst, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    float u = (hash32(seed * 0x9e3779b97f4a7c15ULL + i) >> 8) * (1.0f / 16777216.0f);
    dst[i] = __float2bfloat16_rn(2.0f * u - 1.0f);
  }
}

constexpr unsigned kThreads = 256;
constexpr int kRowsPerBlock = 8;  // warps per block in the row kernels

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const void* wte, DType wte_dtype, const float* wpe, int N,
                       int T, int C) {
  size_t n = static_cast<size_t>(N) * C;
  MT_DISPATCH(wte_dtype, W, embedding_fwd_k<<<grid_for(n, kThreads), kThreads, 0, cu_stream()>>>(
                                out, tokens, static_cast<const W*>(wte), wpe, N, T, C));
  MT_LAUNCH_CHECK("embedding_forward");
}

int embedding_buckets(const int32_t* tokens, int N, int V, std::vector<int32_t>& out) {
  std::vector<int32_t> count(static_cast<size_t>(V) + 1, 0);
  for (int n = 0; n < N; ++n) ++count[static_cast<size_t>(tokens[n]) + 1];
  int U = 0;
  for (int v = 0; v < V; ++v) {
    U += count[static_cast<size_t>(v) + 1] > 0;
    count[static_cast<size_t>(v) + 1] += count[static_cast<size_t>(v)];
  }
  out.assign(static_cast<size_t>(N) + 2 * static_cast<size_t>(U) + 1, 0);
  int32_t* pos = out.data();
  int32_t* tok = pos + N;
  int32_t* start = tok + U;
  std::vector<int32_t> fill(count.begin(), count.end() - 1);
  for (int n = 0; n < N; ++n) pos[fill[static_cast<size_t>(tokens[n])]++] = n;  // position order within a token
  int u = 0;
  for (int v = 0; v < V; ++v)
    if (count[static_cast<size_t>(v) + 1] > count[static_cast<size_t>(v)]) {
      tok[u] = v;
      start[u] = count[static_cast<size_t>(v)];
      ++u;
    }
  start[U] = N;
  return U;
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* buckets, int unique, int N, int T,
                        int C) {
  if (unique > 0) {
    embedding_bwd_wte_k<<<unique, std::min(256, (C + 31) / 32 * 32), 0, cu_stream()>>>(dwte, dout, buckets, unique, N,
                                                                                       C);
    MT_LAUNCH_CHECK("embedding_backward");
  }
  if (dwpe) {
    size_t m = static_cast<size_t>(T) * C;
    embedding_bwd_wpe_k<<<grid_for(m, kThreads), kThreads, 0, cu_stream()>>>(dwpe, dout, N, T, C);
    MT_LAUNCH_CHECK("embedding_backward wpe");
  }
}

void layernorm_forward(void* out, DType dt, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps) {
  unsigned g = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  int lanes = ((C + 31) / 32 + 7) / 8 * 8;
  MT_DISPATCH(dt, T, {
    auto* o = static_cast<T*>(out);
    if (lanes == 8)
      layernorm_fwd_reg_k<T, 8><<<g, 32 * kRowsPerBlock, 0, cu_stream()>>>(o, mean, rstd, inp, weight, bias, N, C, eps);
    else if (lanes == 16)
      layernorm_fwd_reg_k<T, 16><<<g, 32 * kRowsPerBlock, 0, cu_stream()>>>(o, mean, rstd, inp, weight, bias, N, C, eps);
    else if (lanes == 24)
      layernorm_fwd_reg_k<T, 24><<<g, 32 * kRowsPerBlock, 0, cu_stream()>>>(o, mean, rstd, inp, weight, bias, N, C, eps);
    else if (lanes == 32)
      layernorm_fwd_reg_k<T, 32><<<g, 32 * kRowsPerBlock, 0, cu_stream()>>>(o, mean, rstd, inp, weight, bias, N, C, eps);
    else
      layernorm_fwd_k<<<g, 32 * kRowsPerBlock, 0, cu_stream()>>>(o, mean, rstd, inp, weight, bias, N, C, eps);
  });
  MT_LAUNCH_CHECK("layernorm_forward");
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C, void* dinp_copy,
                        DType copy_dtype, float* dinp_colsum) {
  if (C <= 32 * kLnLanes && dweight != nullptr) {
    int G = std::max(1, std::min((N + kLnWarps - 1) / kLnWarps, 264));
    float* partial = static_cast<float*>(scratch(size_t{3} * G * C * sizeof(float)));
    size_t smem = size_t{kLnWarps} * 3 * C * sizeof(float);
    bool cs = dinp_colsum != nullptr;
    int lanes = ((C + 31) / 32 + 7) / 8 * 8;
    auto launch = [&](auto* copy) {
      using TC = std::remove_pointer_t<decltype(copy)>;
      auto k = lanes == 8    ? layernorm_bwd_fused_k<TC, 8>
               : lanes == 16 ? layernorm_bwd_fused_k<TC, 16>
               : lanes == 24 ? layernorm_bwd_fused_k<TC, 24>
                             : layernorm_bwd_fused_k<TC, 32>;
      static bool attr = [&] {  // over 48 KB of shared memory for C > 512
        MT_CUDA_CHECK(cudaFuncSetAttribute(layernorm_bwd_fused_k<TC, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           kLnWarps * 3 * 32 * kLnLanes * 4));
        MT_CUDA_CHECK(cudaFuncSetAttribute(layernorm_bwd_fused_k<TC, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           kLnWarps * 3 * 32 * kLnLanes * 4));
        MT_CUDA_CHECK(cudaFuncSetAttribute(layernorm_bwd_fused_k<TC, 24>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           kLnWarps * 3 * 32 * kLnLanes * 4));
        MT_CUDA_CHECK(cudaFuncSetAttribute(layernorm_bwd_fused_k<TC, 32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           kLnWarps * 3 * 32 * kLnLanes * 4));
        return true;
      }();
      (void)attr;
      k<<<G, 32 * kLnWarps, smem, cu_stream()>>>(dinp, copy, partial, dout, inp, weight, mean, rstd, N, C, cs);
    };
    if (dinp_copy == nullptr || copy_dtype == DType::kF32)
      launch(static_cast<float*>(dinp_copy));
    else
      MT_DISPATCH(copy_dtype, T, launch(static_cast<T*>(dinp_copy)));
    MT_LAUNCH_CHECK("layernorm_backward");
    colsum_final(dweight, dbias, dinp_colsum, partial, G, C);
    return;
  }
  colreduce(dweight, dbias, N, C, LnGradF{dout, inp, mean, rstd, C});
  unsigned g = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  layernorm_bwd_k<<<g, 32 * kRowsPerBlock, 0, cu_stream()>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  MT_LAUNCH_CHECK("layernorm_backward");
  if (dinp_copy) cuda::convert(dinp_copy, copy_dtype, dinp, DType::kF32, static_cast<size_t>(N) * C);
  if (dinp_colsum) bias_backward(dinp_colsum, dinp, DType::kF32, N, C);
}

void rmsnorm_forward(void* out, DType dt, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps) {
  unsigned g = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  MT_DISPATCH(dt, T, rmsnorm_fwd_k<<<g, 32 * kRowsPerBlock, 0, cu_stream()>>>(static_cast<T*>(out), rstd, inp,
                                                                                weight, N, C, eps));
  MT_LAUNCH_CHECK("rmsnorm_forward");
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
  colreduce(dweight, nullptr, N, C, RmsGradF{dout, inp, rstd, C});
  unsigned g = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  rmsnorm_bwd_k<<<g, 32 * kRowsPerBlock, 0, cu_stream()>>>(dinp, dout, inp, weight, rstd, N, C);
  MT_LAUNCH_CHECK("rmsnorm_backward");
}

void gelu_forward(void* out, const void* inp, DType dt, size_t n) {
  bool vec = aligned16(out) && aligned16(inp);
  MT_DISPATCH(dt, T, {
    size_t work = vec ? n / Vec16<T>::kW + n % Vec16<T>::kW : n;
    if (vec)
      gelu_fwd_k<T, true><<<grid_for(work, kThreads), kThreads, 0, cu_stream()>>>(static_cast<T*>(out),
                                                                                 static_cast<const T*>(inp), n);
    else
      gelu_fwd_k<T, false><<<grid_for(work, kThreads), kThreads, 0, cu_stream()>>>(static_cast<T*>(out),
                                                                                  static_cast<const T*>(inp), n);
  });
  MT_LAUNCH_CHECK("gelu_forward");
}

void gelu_backward(void* dinp, const void* inp, const void* dout, DType dt, size_t n) {
  bool vec = aligned16(dinp) && aligned16(inp) && aligned16(dout);
  MT_DISPATCH(dt, T, {
    size_t work = vec ? n / Vec16<T>::kW + n % Vec16<T>::kW : n;
    auto* d = static_cast<T*>(dinp);
    auto* x = static_cast<const T*>(inp);
    auto* g = static_cast<const T*>(dout);
    if (vec)
      gelu_bwd_k<T, true><<<grid_for(work, kThreads), kThreads, 0, cu_stream()>>>(d, x, g, n);
    else
      gelu_bwd_k<T, false><<<grid_for(work, kThreads), kThreads, 0, cu_stream()>>>(d, x, g, n);
  });
  MT_LAUNCH_CHECK("gelu_backward");
}

void gelu_backward_bias(void* dinp, float* dbias, const void* inp, const void* dout, DType dt, int N, int H) {
  int W = static_cast<int>(16 / dtype_size(dt));
  if (H % W != 0 || H / W > 1024 || !aligned16(dinp) || !aligned16(inp) || !aligned16(dout)) {
    gelu_backward(dinp, inp, dout, dt, static_cast<size_t>(N) * H);
    bias_backward(dbias, dinp, dt, N, H);
    return;
  }
  // Blocks of at least 16 rows, up to 8 per SM: enough warps to hide tanh's latency (264 blocks of
  // 62 rows ran at a third of the memory bandwidth).
  int G = std::max(1, std::min((N + 15) / 16, 132 * 8));
  float* partial = static_cast<float*>(scratch(static_cast<size_t>(G) * H * sizeof(float)));
  unsigned threads = static_cast<unsigned>((H / W + 31) / 32 * 32);
  MT_DISPATCH(dt, T, gelu_bwd_bias_k<T><<<G, threads, 0, cu_stream()>>>(static_cast<T*>(dinp), partial,
                                                                      static_cast<const T*>(inp),
                                                                      static_cast<const T*>(dout), N, H));
  MT_LAUNCH_CHECK("gelu_backward_bias");
  colsum_final(dbias, nullptr, nullptr, partial, G, H);
}

void swiglu_forward(void* out, const void* inp, DType dt, int N, int I) {
  size_t n = static_cast<size_t>(N) * I;
  MT_DISPATCH(dt, T, swiglu_fwd_k<<<grid_for(n, kThreads), kThreads, 0, cu_stream()>>>(
                         static_cast<T*>(out), static_cast<const T*>(inp), N, I));
  MT_LAUNCH_CHECK("swiglu_forward");
}

void swiglu_backward(void* dinp, const void* dout, const void* inp, DType dt, int N, int I) {
  size_t n = static_cast<size_t>(N) * I;
  MT_DISPATCH(dt, T, swiglu_bwd_k<<<grid_for(n, kThreads), kThreads, 0, cu_stream()>>>(
                         static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp), N, I));
  MT_LAUNCH_CHECK("swiglu_backward");
}

void rope_forward(void* qkv, DType dt, const float* cos, const float* sin, int B, int T, int NH, int NKV, int HS) {
  size_t n = static_cast<size_t>(B) * T * (NH + NKV) * (HS / 2);
  MT_DISPATCH(dt, X, rope_k<<<grid_for(n, kThreads), kThreads, 0, cu_stream()>>>(static_cast<X*>(qkv), cos, sin,
                                                                                 B * T, T, NH, NKV, HS, 1.0f));
  MT_LAUNCH_CHECK("rope_forward");
}

void rope_backward(void* dqkv, DType dt, const float* cos, const float* sin, int B, int T, int NH, int NKV, int HS) {
  size_t n = static_cast<size_t>(B) * T * (NH + NKV) * (HS / 2);
  MT_DISPATCH(dt, X, rope_k<<<grid_for(n, kThreads), kThreads, 0, cu_stream()>>>(static_cast<X*>(dqkv), cos, sin,
                                                                                 B * T, T, NH, NKV, HS, -1.0f));
  MT_LAUNCH_CHECK("rope_backward");
}

void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n) {
  if (dst_dtype == src_dtype) {
    if (dst != src) copy_on_device(dst, src, n * dtype_size(dst_dtype));
    return;
  }
  MT_DISPATCH(dst_dtype, D,
              MT_DISPATCH(src_dtype, S,
                          convert_k<<<grid_for(n, kThreads), kThreads, 0, cu_stream()>>>(
                              static_cast<D*>(dst), static_cast<const S*>(src), n)));
  MT_LAUNCH_CHECK("convert");
}

void add_inplace(float* acc, const float* x, size_t n) {
  add_inplace_k<<<grid_for(n, kThreads), kThreads, 0, cu_stream()>>>(acc, x, n);
  MT_LAUNCH_CHECK("add_inplace");
}

void bias_backward(float* dbias, const void* dout, DType dt, int N, int C) {
  const int W = static_cast<int>(16 / dtype_size(dt));
  if (C % W == 0 && C / W <= 1024 && aligned16(dout)) {
    // 16-byte loads, W columns a thread, blocks of at least 32 rows (the scalar column reduction
    // read 2 bytes a lane and ran at half the memory bandwidth: 47 us for GPT-2's qkv bias).
    const int G = std::max(1, std::min((N + 31) / 32, 132 * 4));
    float* partial = static_cast<float*>(scratch(static_cast<size_t>(G) * C * sizeof(float)));
    const unsigned threads = static_cast<unsigned>((C / W + 31) / 32 * 32);
    MT_DISPATCH(dt, T, gelu_bwd_bias_k<T, false><<<G, threads, 0, cu_stream()>>>(nullptr, partial, nullptr,
                                                                                static_cast<const T*>(dout), N, C));
    MT_LAUNCH_CHECK("bias_backward");
    colsum_final(dbias, nullptr, nullptr, partial, G, C);
    return;
  }
  MT_DISPATCH(dt, T, colreduce(dbias, nullptr, N, C, BiasGradF<T>{static_cast<const T*>(dout), C}));
}

void add_bias(void* d, DType dt, const float* bias, int M, int N, int ld) {
  size_t n = static_cast<size_t>(M) * N;
  MT_DISPATCH(dt, T, add_bias_k<<<grid_for(n, kThreads), kThreads, 0, cu_stream()>>>(static_cast<T*>(d), bias, M, N,
                                                                                     ld));
  MT_LAUNCH_CHECK("add_bias");
}

void cross_entropy_tile(float* loss, float* lse, const void* logits, DType logits_dtype, int ld_logits,
                        const int32_t* targets, int R, int V, float grad_scale, void* dlogits, DType dl_dtype, int ld_dl) {
  const size_t la = logits_dtype == DType::kF32 ? 16 : 8, da = dl_dtype == DType::kF32 ? 16 : 8;
  auto aligned = [](const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  bool vec = aligned(logits, la) && ld_logits % 4 == 0 && (grad_scale == 0.0f || (aligned(dlogits, da) && ld_dl % 4 == 0));
  MT_DISPATCH(logits_dtype, L, MT_DISPATCH(dl_dtype, T, {
    const L* x = static_cast<const L*>(logits);
    if (vec)
      cross_entropy_k<L, T, true><<<R, 512, 0, cu_stream()>>>(loss, lse, x, ld_logits, targets, V, grad_scale,
                                                            static_cast<T*>(dlogits), ld_dl);
    else
      cross_entropy_k<L, T, false><<<R, 512, 0, cu_stream()>>>(loss, lse, x, ld_logits, targets, V, grad_scale,
                                                             static_cast<T*>(dlogits), ld_dl);
  }));
  MT_LAUNCH_CHECK("cross_entropy_tile");
}

void adamw_update(float* master, const float* grad, float* m, float* v, void* lowp, DType lowp_dtype, size_t n,
                  const kernels::AdamWParams& params) {
  const AdamScalars s = kernels::adamw_scalars(params);  // exactly the CPU kernel's constants
  unsigned g = grid_for(n, kThreads, 132 * 16);
  if (lowp == nullptr) {
    adamw_k<float><<<g, kThreads, 0, cu_stream()>>>(master, grad, m, v, nullptr, n, s);
  } else {
    MT_DISPATCH(lowp_dtype, T, adamw_k<T><<<g, kThreads, 0, cu_stream()>>>(master, grad, m, v, static_cast<T*>(lowp),
                                                                           n, s));
  }
  MT_LAUNCH_CHECK("adamw_update");
}

double sum_squares(const float* x, size_t n) {
  double* part = static_cast<double*>(scratch((kSumBlocks + 1) * sizeof(double)));
  sumsq_partial_k<<<kSumBlocks, kThreads, 0, cu_stream()>>>(part, x, n);
  MT_LAUNCH_CHECK("sum_squares");
  sumsq_final_k<<<1, kThreads, 0, cu_stream()>>>(part + kSumBlocks, part, kSumBlocks);
  MT_LAUNCH_CHECK("sum_squares final");
  double out = 0.0;
  copy_to_host(&out, part + kSumBlocks, sizeof out);
  return out;
}

void fill_random_bf16(void* dst, size_t n, uint64_t seed) {
  fill_random_bf16_k<<<grid_for(n, kThreads), kThreads, 0, cu_stream()>>>(static_cast<bf16*>(dst), n, seed);
  MT_LAUNCH_CHECK("fill_random_bf16");
}

}  // namespace mt::cuda
