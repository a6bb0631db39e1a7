// Fused CPU kernels of ops.h: the OpenMP drivers, the portable (scalar, compiler-vectorised) bodies
// and the run-time choice of the AVX-512 bodies (ops_avx512.cpp). The drivers own all threading:
// they split rows or elements into slices and hand each slice to a serial body of either ISA.
//
// Determinism: row reductions (dweight, dbias, bias_backward) use one contiguous slice of rows per
// thread (static split), a zeroed partial buffer per thread, and a combine in thread order, so the
// result depends only on the thread count. embedding_backward gives each thread whole columns and
// sum_squares uses fixed-size chunks, so both are independent of the thread count.
#include "kernels/cpu/ops.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "base/cpu_features.h"
#include "base/error.h"
#include "kernels/cpu/ops_avx512.h"

namespace mt::kernels {
namespace {

constexpr size_t kChunk = size_t{1} << 14;     // elements per task of the elementwise kernels
constexpr size_t kSumChunk = size_t{1} << 16;  // elements per partial of sum_squares
constexpr int kColBlock = 64;                  // columns per task of embedding_backward
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;
constexpr float kSigmoidMaxArg = 88.0f;

bool use_avx512() {
  return isa_active() == Isa::kAvx512;
}

// Calls body(tid, r0, r1) on one contiguous slice of [0, N) per thread (static split).
template <class F>
void for_thread_rows(int N, F&& body) {
#pragma omp parallel
  {
    int nt = omp_get_num_threads();
    int tid = omp_get_thread_num();
    int r0 = static_cast<int>(static_cast<int64_t>(N) * tid / nt);
    int r1 = static_cast<int>(static_cast<int64_t>(N) * (tid + 1) / nt);
    if (r0 < r1) body(tid, r0, r1);
  }
}

// Calls body(i0, i1) on chunks of kChunk elements covering [0, n).
template <class F>
void for_chunks(size_t n, F&& body) {
  const int64_t nchunks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (int64_t c = 0; c < nchunks; ++c) {
    size_t i0 = static_cast<size_t>(c) * kChunk;
    size_t i1 = i0 + kChunk < n ? i0 + kChunk : n;
    body(i0, i1);
  }
}

// dst (C) += sum over parts of part (nparts, C), each column summed in part order.
void combine_partials(float* dst, const float* part, int nparts, int C) {
#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; ++c) {
    float s = 0.0f;
    for (int t = 0; t < nparts; ++t) s += part[static_cast<size_t>(t) * C + c];
    dst[c] += s;
  }
}

// ---- portable serial bodies (same contracts as the detail::*_avx512 ones) ----

void layernorm_forward_rows(float* out, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, int N, int C, float eps) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    float* y = out + static_cast<size_t>(n) * C;
    float s = 0.0f;
    for (int c = 0; c < C; ++c) s += x[c];
    const float m = s / C;
    float v = 0.0f;
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    const float r = 1.0f / std::sqrt(v / C + eps);
    for (int c = 0; c < C; ++c) y[c] = (x[c] - m) * r * weight[c] + (bias ? bias[c] : 0.0f);
    mean[n] = m;
    rstd[n] = r;
  }
}

void layernorm_backward_rows(float* dinp, float* dweight, float* dbias, const float* dout,
                             const float* inp, const float* weight, const float* mean,
                             const float* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    const float* dy = dout + static_cast<size_t>(n) * C;
    float* dx = dinp + static_cast<size_t>(n) * C;
    const float m = mean[n], r = rstd[n];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = 0; c < C; ++c) {
      const float norm = (x[c] - m) * r;
      const float dnorm = weight[c] * dy[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
      dweight[c] += norm * dy[c];
      if (dbias) dbias[c] += dy[c];
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int c = 0; c < C; ++c) {
      const float norm = (x[c] - m) * r;
      dx[c] += (weight[c] * dy[c] - dnorm_mean - norm * dnorm_norm_mean) * r;
    }
  }
}

void rmsnorm_forward_rows(float* out, float* rstd, const float* inp, const float* weight, int N,
                          int C, float eps) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    float* y = out + static_cast<size_t>(n) * C;
    float ss = 0.0f;
    for (int c = 0; c < C; ++c) ss += x[c] * x[c];
    const float r = 1.0f / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c) y[c] = x[c] * r * weight[c];
    rstd[n] = r;
  }
}

// dx = r w dy - x r^3 / C * sum(dy w x);  dweight += dy x r
void rmsnorm_backward_rows(float* dinp, float* dweight, const float* dout, const float* inp,
                           const float* weight, const float* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    const float* dy = dout + static_cast<size_t>(n) * C;
    float* dx = dinp + static_cast<size_t>(n) * C;
    const float r = rstd[n];
    float dot = 0.0f;
    for (int c = 0; c < C; ++c) {
      dot += dy[c] * weight[c] * x[c];
      dweight[c] += dy[c] * x[c] * r;
    }
    const float k = dot * r * r * r / C;
    for (int c = 0; c < C; ++c) dx[c] += r * weight[c] * dy[c] - x[c] * k;
  }
}

// silu(g) = g sigmoid(g); sigmoid and 1 - sigmoid both from e = exp(-g) to keep tails accurate.
// The exp argument is capped at kSigmoidMaxArg so that e stays finite (e * s is never inf * 0).
float exp_neg_capped(float g) {
  return std::exp(-g < kSigmoidMaxArg ? -g : kSigmoidMaxArg);
}

void swiglu_forward_rows(float* out, const float* inp, int N, int I) {
  for (int n = 0; n < N; ++n) {
    const float* g = inp + static_cast<size_t>(n) * 2 * I;
    const float* u = g + I;
    float* y = out + static_cast<size_t>(n) * I;
    for (int i = 0; i < I; ++i) y[i] = g[i] / (1.0f + exp_neg_capped(g[i])) * u[i];
  }
}

// dup = dy silu(g);  dgate = dy u s (1 + g (1 - s))
void swiglu_backward_rows(float* dinp, const float* dout, const float* inp, int N, int I) {
  for (int n = 0; n < N; ++n) {
    const float* g = inp + static_cast<size_t>(n) * 2 * I;
    const float* u = g + I;
    const float* dy = dout + static_cast<size_t>(n) * I;
    float* dg = dinp + static_cast<size_t>(n) * 2 * I;
    float* du = dg + I;
    for (int i = 0; i < I; ++i) {
      const float e = exp_neg_capped(g[i]);
      const float s = 1.0f / (1.0f + e);
      const float one_minus_s = e * s;
      du[i] = dy[i] * g[i] * s;
      dg[i] = dy[i] * u[i] * s * (1.0f + g[i] * one_minus_s);
    }
  }
}

void bias_backward_rows(float* dbias, const float* dout, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* dy = dout + static_cast<size_t>(n) * C;
    for (int c = 0; c < C; ++c) dbias[c] += dy[c];
  }
}

void cross_entropy_rows(float* loss, float* lse, float* logits, const int32_t* targets, int R,
                        int V, float grad_scale, int ld) {
  for (int r = 0; r < R; ++r) {
    float* x = logits + static_cast<size_t>(r) * ld;
    const int32_t t = targets[r];
    float mx = -INFINITY;
    for (int i = 0; i < V; ++i) mx = x[i] > mx ? x[i] : mx;
    float sum = 0.0f;
    for (int i = 0; i < V; ++i) sum += std::exp(x[i] - mx);
    const float l = mx + std::log(sum);
    lse[r] = l;
    const bool ignore = t == -100;
    loss[r] = ignore ? 0.0f : l - x[t];
    if (grad_scale == 0.0f) continue;
    if (ignore) {
      std::memset(x, 0, sizeof(float) * V);
      continue;
    }
    const float k = grad_scale / sum;
    for (int i = 0; i < V; ++i) x[i] = std::exp(x[i] - mx) * k;
    x[t] -= grad_scale;
  }
}

double sum_squares_rows(const float* x, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

void adamw_slice(float* p, const float* grad, float* m, float* v, void* lowp, DType lowp_dtype,
                 size_t n, const detail::AdamWScalars& s) {
  for (size_t i = 0; i < n; ++i) {
    float g = grad[i] * s.grad_scale;
    if (s.l2 != 0.0f) g = std::fma(s.l2, p[i], g);  // as ATen's add(param, alpha=weight_decay)
    const float mi = s.beta1 * m[i] + s.one_minus_beta1 * g;
    const float vi = s.beta2 * v[i] + s.one_minus_beta2 * g * g;
    float pi = p[i] * s.decay;
    pi = pi - s.step_size * mi / (std::sqrt(vi) / s.bc2_sqrt + s.eps);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
  }
  if (lowp != nullptr) convert(lowp, lowp_dtype, p, DType::kF32, n);
}

}  // namespace

// ---- embedding ----

void embedding_forward(float* out, const int32_t* tokens, const void* wte, DType wte_dtype,
                       const float* wpe, int N, int T, int C, const int32_t* pos) {
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(wte_dtype);
  const char* table = static_cast<const char*>(wte);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    float* y = out + static_cast<size_t>(n) * C;
    if (tokens[n] >= 0) {
      convert(y, DType::kF32, table + static_cast<size_t>(tokens[n]) * row_bytes, wte_dtype, C);
    } else {
      for (int c = 0; c < C; ++c) y[c] = 0.0f;
    }
    if (wpe != nullptr) {
      const float* p = wpe + static_cast<size_t>(pos ? pos[n] : n % T) * C;
      for (int c = 0; c < C; ++c) y[c] += p[c];
    }
  }
}

// Each task owns a block of kColBlock columns of dwte and dwpe and walks all rows in order.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int N,
                        int T, int C, const int32_t* pos, int32_t skip) {
  const int nblocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static)
  for (int b = 0; b < nblocks; ++b) {
    const int c0 = b * kColBlock;
    const int c1 = c0 + kColBlock < C ? c0 + kColBlock : C;
    for (int n = 0; n < N; ++n) {
      const float* dy = dout + static_cast<size_t>(n) * C;
      if (dwte != nullptr && tokens[n] >= 0 && tokens[n] != skip) {
        float* dw = dwte + static_cast<size_t>(tokens[n]) * C;
        for (int c = c0; c < c1; ++c) dw[c] += dy[c];
      }
      if (dwpe != nullptr) {
        float* dp = dwpe + static_cast<size_t>(pos ? pos[n] : n % T) * C;
        for (int c = c0; c < c1; ++c) dp[c] += dy[c];
      }
    }
  }
}

// ---- LayerNorm / RMSNorm ----

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps) {
  auto body = use_avx512() ? detail::layernorm_forward_avx512 : layernorm_forward_rows;
  for_thread_rows(N, [&](int, int r0, int r1) {
    const size_t o = static_cast<size_t>(r0) * C;
    body(out + o, mean + r0, rstd + r0, inp + o, weight, bias, r1 - r0, C, eps);
  });
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  auto body = use_avx512() ? detail::layernorm_backward_avx512 : layernorm_backward_rows;
  const int P = omp_get_max_threads();
  const size_t PC = static_cast<size_t>(P) * C;
  std::vector<float> part(2 * PC, 0.0f);  // (2, P, C): dweight then dbias partials
  for_thread_rows(N, [&](int tid, int r0, int r1) {
    float* pw = part.data() + static_cast<size_t>(tid) * C;
    const size_t o = static_cast<size_t>(r0) * C;
    body(dinp + o, pw, dbias ? pw + PC : nullptr, dout + o, inp + o, weight, mean + r0, rstd + r0,
         r1 - r0, C);
  });
  combine_partials(dweight, part.data(), P, C);
  if (dbias != nullptr) combine_partials(dbias, part.data() + PC, P, C);
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps) {
  auto body = use_avx512() ? detail::rmsnorm_forward_avx512 : rmsnorm_forward_rows;
  for_thread_rows(N, [&](int, int r0, int r1) {
    const size_t o = static_cast<size_t>(r0) * C;
    body(out + o, rstd + r0, inp + o, weight, r1 - r0, C, eps);
  });
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C) {
  auto body = use_avx512() ? detail::rmsnorm_backward_avx512 : rmsnorm_backward_rows;
  const int P = omp_get_max_threads();
  std::vector<float> part(static_cast<size_t>(P) * C, 0.0f);  // (P, C)
  for_thread_rows(N, [&](int tid, int r0, int r1) {
    const size_t o = static_cast<size_t>(r0) * C;
    body(dinp + o, part.data() + static_cast<size_t>(tid) * C, dout + o, inp + o, weight, rstd + r0,
         r1 - r0, C);
  });
  combine_partials(dweight, part.data(), P, C);
}

// ---- GELU (tanh approximation) ----

void gelu_forward(float* out, const float* inp, size_t n) {
  if (use_avx512()) {
    for_chunks(
        n, [&](size_t i0, size_t i1) { detail::gelu_forward_avx512(out + i0, inp + i0, i1 - i0); });
    return;
  }
  for_chunks(n, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) {
      const float x = inp[i];
      out[i] = 0.5f * x * (1.0f + std::tanh(kGeluK * (x + kGeluA * x * x * x)));
    }
  });
}

// d/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 a x^2)
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  if (use_avx512()) {
    for_chunks(n, [&](size_t i0, size_t i1) {
      detail::gelu_backward_avx512(dinp + i0, inp + i0, dout + i0, i1 - i0);
    });
    return;
  }
  for_chunks(n, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) {
      const float x = inp[i];
      const float t = std::tanh(kGeluK * (x + kGeluA * x * x * x));
      const float du = kGeluK * (1.0f + 3.0f * kGeluA * x * x);
      dinp[i] = (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du) * dout[i];
    }
  });
}

// ---- SwiGLU ----

void swiglu_forward(float* out, const float* inp, int N, int I) {
  auto body = use_avx512() ? detail::swiglu_forward_avx512 : swiglu_forward_rows;
  for_thread_rows(N, [&](int, int r0, int r1) {
    body(out + static_cast<size_t>(r0) * I, inp + static_cast<size_t>(r0) * 2 * I, r1 - r0, I);
  });
}

void swiglu_backward(float* dinp, const float* dout, const float* inp, int N, int I) {
  auto body = use_avx512() ? detail::swiglu_backward_avx512 : swiglu_backward_rows;
  for_thread_rows(N, [&](int, int r0, int r1) {
    const size_t o2 = static_cast<size_t>(r0) * 2 * I;
    body(dinp + o2, dout + static_cast<size_t>(r0) * I, inp + o2, r1 - r0, I);
  });
}

// ---- The activation in low precision, fused with the saved roundings ----

namespace {

// Per thread: f32 scratch of n floats (reused across calls; the kernels run inside OpenMP teams).
float* thread_scratch(size_t n, int which) {
  thread_local std::vector<float> buf[2];
  if (buf[which].size() < n) buf[which].resize(n);
  return buf[which].data();
}

char* at(void* p, DType cd, size_t i) { return static_cast<char*>(p) + i * dtype_size(cd); }
const char* at(const void* p, DType cd, size_t i) { return static_cast<const char*>(p) + i * dtype_size(cd); }

}  // namespace

void gelu_forward_lp(void* h_cd, void* act_cd, DType cd, const float* h, size_t n) {
  MT_CHECK(cd == DType::kBF16 || cd == DType::kF16, ErrorKind::kInvalidArgument, "gelu_forward_lp: bf16 or f16");
  if (use_avx512()) {
    for_chunks(n, [&](size_t i0, size_t i1) {
      detail::gelu_forward_lp_avx512(at(h_cd, cd, i0), at(act_cd, cd, i0), cd == DType::kBF16, h + i0, i1 - i0);
    });
    return;
  }
  for_chunks(n, [&](size_t i0, size_t i1) {
    const size_t m = i1 - i0;
    float* x = thread_scratch(m, 0);
    std::memcpy(x, h + i0, m * sizeof(float));
    round_to(at(h_cd, cd, i0), cd, x, m);  // the chunk is below round_to's threading threshold
    gelu_forward(x, x, m);                 // nested in this team's chunk: one thread
    convert(at(act_cd, cd, i0), cd, x, DType::kF32, m);
  });
}

void gelu_backward_lp(float* dinp, const void* h_cd, DType cd, const float* dout, size_t n) {
  MT_CHECK(cd == DType::kBF16 || cd == DType::kF16, ErrorKind::kInvalidArgument, "gelu_backward_lp: bf16 or f16");
  if (use_avx512()) {
    for_chunks(n, [&](size_t i0, size_t i1) {
      detail::gelu_backward_lp_avx512(dinp + i0, at(h_cd, cd, i0), cd == DType::kBF16, dout + i0, i1 - i0);
    });
    return;
  }
  for_chunks(n, [&](size_t i0, size_t i1) {
    const size_t m = i1 - i0;
    float* x = thread_scratch(m, 0);
    convert(x, DType::kF32, at(h_cd, cd, i0), cd, m);
    gelu_backward(dinp + i0, x, dout + i0, m);
  });
}

void swiglu_forward_lp(void* h_cd, void* act_cd, DType cd, const float* h, int N, int I) {
  MT_CHECK(cd == DType::kBF16 || cd == DType::kF16, ErrorKind::kInvalidArgument, "swiglu_forward_lp: bf16 or f16");
  const size_t row = 2 * static_cast<size_t>(I);
  if (use_avx512()) {
    for_thread_rows(N, [&](int, int r0, int r1) {
      detail::swiglu_forward_lp_avx512(at(h_cd, cd, static_cast<size_t>(r0) * row), at(act_cd, cd, static_cast<size_t>(r0) * I),
                                       cd == DType::kBF16, h + static_cast<size_t>(r0) * row, r1 - r0, I);
    });
    return;
  }
  auto body = swiglu_forward_rows;
  for_thread_rows(N, [&](int, int r0, int r1) {
    float* x = thread_scratch(row, 0);
    float* y = thread_scratch(static_cast<size_t>(I), 1);
    for (int r = r0; r < r1; ++r) {
      std::memcpy(x, h + static_cast<size_t>(r) * row, row * sizeof(float));
      round_to(at(h_cd, cd, static_cast<size_t>(r) * row), cd, x, row);
      body(y, x, 1, I);
      convert(at(act_cd, cd, static_cast<size_t>(r) * I), cd, y, DType::kF32, static_cast<size_t>(I));
    }
  });
}

void swiglu_backward_lp(float* dinp, const float* dout, const void* h_cd, DType cd, int N, int I) {
  MT_CHECK(cd == DType::kBF16 || cd == DType::kF16, ErrorKind::kInvalidArgument, "swiglu_backward_lp: bf16 or f16");
  const size_t row = 2 * static_cast<size_t>(I);
  if (use_avx512()) {
    for_thread_rows(N, [&](int, int r0, int r1) {
      detail::swiglu_backward_lp_avx512(dinp + static_cast<size_t>(r0) * row, dout + static_cast<size_t>(r0) * I,
                                        at(h_cd, cd, static_cast<size_t>(r0) * row), cd == DType::kBF16, r1 - r0, I);
    });
    return;
  }
  auto body = swiglu_backward_rows;
  for_thread_rows(N, [&](int, int r0, int r1) {
    float* x = thread_scratch(row, 0);
    for (int r = r0; r < r1; ++r) {
      convert(x, DType::kF32, at(h_cd, cd, static_cast<size_t>(r) * row), cd, row);
      body(dinp + static_cast<size_t>(r) * row, dout + static_cast<size_t>(r) * I, x, 1, I);
    }
  });
}

// ---- RoPE (portable only: a small share of the step) ----

// As Hugging Face: inv_freq = 1 / theta ** (arange(0, HS, 2).float() / HS), all in f32.
std::vector<float> rope_default_inv_freq(int HS, float theta) {
  const int H = HS / 2;
  std::vector<float> inv_freq(H);
  for (int j = 0; j < H; ++j) {
    const float e = static_cast<float>(2 * j) / static_cast<float>(HS);
    inv_freq[j] = 1.0f / std::pow(theta, e);
  }
  return inv_freq;
}

void rope_table(float* cos, float* sin, int T, int HS, float theta) {
  rope_table(cos, sin, T, HS, rope_default_inv_freq(HS, theta).data());
}

void rope_table(float* cos, float* sin, int T, int HS, const float* inv_freq) {
  const int H = HS / 2;
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; ++t) {
    for (int j = 0; j < H; ++j) {
      const float a = static_cast<float>(t) * inv_freq[j];
      cos[static_cast<size_t>(t) * H + j] = std::cos(a);
      sin[static_cast<size_t>(t) * H + j] = std::sin(a);
    }
  }
}

namespace {
// Rotates the first NH + NKV heads of every row by +angle (dir = 1) or -angle (dir = -1).
void rope_apply(float* qkv, const float* cos, const float* sin, int B, int T, int NH, int NKV,
                int HS, float dir, const int32_t* pos) {
  const int H = HS / 2;
  const int row = (NH + 2 * NKV) * HS;
  const int64_t rows = static_cast<int64_t>(B) * T;
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < rows; ++bt) {
    const int t = pos ? pos[bt] : static_cast<int>(bt % T);
    const float* c = cos + static_cast<size_t>(t) * H;
    const float* s = sin + static_cast<size_t>(t) * H;
    for (int h = 0; h < NH + NKV; ++h) {
      float* x = qkv + static_cast<size_t>(bt) * row + static_cast<size_t>(h) * HS;
      for (int j = 0; j < H; ++j) {
        const float x0 = x[j], x1 = x[j + H], sn = dir * s[j];
        x[j] = x0 * c[j] - x1 * sn;
        x[j + H] = x1 * c[j] + x0 * sn;
      }
    }
  }
}
}  // namespace

void rope_forward(float* qkv, const float* cos, const float* sin, int B, int T, int NH, int NKV,
                  int HS, const int32_t* pos) {
  rope_apply(qkv, cos, sin, B, T, NH, NKV, HS, 1.0f, pos);
}

void rope_backward(float* dqkv, const float* cos, const float* sin, int B, int T, int NH, int NKV,
                   int HS, const int32_t* pos) {
  rope_apply(dqkv, cos, sin, B, T, NH, NKV, HS, -1.0f, pos);
}

// ---- elementwise ----

void add_forward(float* out, const float* a, const float* b, size_t n) {
  const bool v = use_avx512();
  for_chunks(n, [&](size_t i0, size_t i1) {
    if (v) return detail::add_forward_avx512(out + i0, a + i0, b + i0, i1 - i0);
    for (size_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
  });
}

void add_inplace(float* acc, const float* x, size_t n) {
  const bool v = use_avx512();
  for_chunks(n, [&](size_t i0, size_t i1) {
    if (v) return detail::add_inplace_avx512(acc + i0, x + i0, i1 - i0);
    for (size_t i = i0; i < i1; ++i) acc[i] += x[i];
  });
}

void scale_inplace(float* x, float s, size_t n) {
  const bool v = use_avx512();
  for_chunks(n, [&](size_t i0, size_t i1) {
    if (v) return detail::scale_inplace_avx512(x + i0, s, i1 - i0);
    for (size_t i = i0; i < i1; ++i) x[i] *= s;
  });
}

void bias_backward(float* dbias, const float* dout, int N, int C) {
  auto body = use_avx512() ? detail::bias_backward_avx512 : bias_backward_rows;
  const int P = omp_get_max_threads();
  std::vector<float> part(static_cast<size_t>(P) * C, 0.0f);  // (P, C)
  for_thread_rows(N, [&](int tid, int r0, int r1) {
    body(part.data() + static_cast<size_t>(tid) * C, dout + static_cast<size_t>(r0) * C, r1 - r0,
         C);
  });
  combine_partials(dbias, part.data(), P, C);
}

// ---- cross-entropy ----

// NOTE: lse is written for ignored rows too (it is the row's log-sum-exp either way); only loss
// and dlogits are zeroed for them.
void cross_entropy_tile(float* loss, float* lse, float* logits, const int32_t* targets, int R,
                        int V, float grad_scale, int ld) {
  if (ld == 0) ld = V;
  auto body = use_avx512() ? detail::cross_entropy_tile_avx512 : cross_entropy_rows;
  for_thread_rows(R, [&](int, int r0, int r1) {
    body(loss + r0, lse + r0, logits + static_cast<size_t>(r0) * ld, targets + r0, r1 - r0, V,
         grad_scale, ld);
  });
}

void vp_cross_entropy_max(float* rowmax, const float* logits, int R, int V, int valid, int ld) {
  if (ld == 0) ld = V;
  const bool v = use_avx512();
  for_thread_rows(R, [&](int, int r0, int r1) {
    if (v) return detail::vp_cross_entropy_max_avx512(rowmax + r0, logits + static_cast<size_t>(r0) * ld, r1 - r0, V, valid, ld);
    for (int r = r0; r < r1; ++r) {
      const float* x = logits + static_cast<size_t>(r) * ld;
      float m = -INFINITY;
      for (int i = 0; i < valid; ++i) m = std::max(m, x[i]);
      rowmax[r] = m;
    }
  });
}

void vp_cross_entropy_exp(float* sumexp, float* logits, const float* rowmax, int R, int V, int valid, int ld) {
  if (ld == 0) ld = V;
  const bool v = use_avx512();
  for_thread_rows(R, [&](int, int r0, int r1) {
    if (v)
      return detail::vp_cross_entropy_exp_avx512(sumexp + r0, logits + static_cast<size_t>(r0) * ld, rowmax + r0,
                                                 r1 - r0, V, valid, ld);
    for (int r = r0; r < r1; ++r) {
      float* x = logits + static_cast<size_t>(r) * ld;
      float sum = 0.0f;
      for (int i = 0; i < V; ++i) {
        x[i] = i < valid ? std::exp(x[i] - rowmax[r]) : 0.0f;
        sum += x[i];
      }
      sumexp[r] = sum;
    }
  });
}

void vp_cross_entropy_grad(float* logits, const float* sumexp, const float* scale, int R, int V, int ld) {
  if (ld == 0) ld = V;
  for_thread_rows(R, [&](int, int r0, int r1) {
    const bool v = use_avx512();
    for (int r = r0; r < r1; ++r) {
      float* x = logits + static_cast<size_t>(r) * ld;
      const float k = scale[r] / sumexp[r];
      if (v) {
        detail::scale_inplace_avx512(x, k, static_cast<size_t>(V));
      } else {
        for (int i = 0; i < V; ++i) x[i] *= k;
      }
    }
  });
}

// ---- AdamW ----

// The per-step scalars are computed in double and rounded to f32 once, as PyTorch's
// _single_tensor_adamw / _multi_tensor_adamw do with Python floats. lowp_dtype kF32 is a copy.
AdamWScalars adamw_scalars(const AdamWParams& params) {
  const double t = static_cast<double>(params.step);
  const double bc1 = params.bias_correction ? 1.0 - std::pow(static_cast<double>(params.beta1), t) : 1.0;
  const double bc2 = params.bias_correction ? 1.0 - std::pow(static_cast<double>(params.beta2), t) : 1.0;
  AdamWScalars s;
  s.grad_scale = params.grad_scale;
  s.beta1 = params.beta1;
  s.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(params.beta1));
  s.beta2 = params.beta2;
  s.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(params.beta2));
  s.decay = params.l2 ? 1.0f : static_cast<float>(1.0 - static_cast<double>(params.lr) * params.weight_decay);
  s.l2 = params.l2 ? params.weight_decay : 0.0f;
  s.step_size = static_cast<float>(params.lr / bc1);
  s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.eps = params.eps;
  return s;
}

void adamw_update(float* master, const float* grad, float* m, float* v, void* lowp,
                  DType lowp_dtype, size_t n, const AdamWParams& params) {
  const AdamWScalars s = adamw_scalars(params);
  const size_t esz = dtype_size(lowp_dtype);
  const bool vec = use_avx512();
  for_chunks(n, [&](size_t i0, size_t i1) {
    void* lp = lowp ? static_cast<char*>(lowp) + i0 * esz : nullptr;
    if (vec) {
      detail::adamw_update_avx512(master + i0, grad + i0, m + i0, v + i0, lp, lowp_dtype, i1 - i0,
                                  s);
    } else {
      adamw_slice(master + i0, grad + i0, m + i0, v + i0, lp, lowp_dtype, i1 - i0, s);
    }
  });
}

// ---- LAMB ----

namespace {

inline float lamb_direction(float m, float v, float p, const LambScalars& s) {
  const float mh = m / s.bias_correction1, vh = v / s.bias_correction2;
  const float denom = s.eps_inside_sqrt ? std::sqrt(vh + s.eps) : std::sqrt(vh) + s.eps;
  return mh / denom + s.weight_decay * p;
}

}  // namespace

LambSums lamb_moments(float* m, float* v, const float* grad, const float* master, size_t n, const LambScalars& s) {
  if (use_avx512()) return detail::lamb_moments_avx512(m, v, grad, master, n, s);
  LambSums sums;
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] * s.grad_scale;
    const float p = master[i];
    const float mi = s.beta1 * m[i] + (1.0f - s.beta1) * g;
    const float vi = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float u = lamb_direction(mi, vi, p, s);
    sums.u += static_cast<double>(u) * u;
    sums.w += static_cast<double>(p) * p;
  }
  return sums;
}

void lamb_apply(float* master, const float* m, const float* v, void* lowp, DType lowp_dtype, size_t n, float scale,
                const LambScalars& s) {
  if (use_avx512()) return detail::lamb_apply_avx512(master, m, v, lowp, lowp_dtype, n, scale, s);
  for (size_t i = 0; i < n; ++i) master[i] = master[i] - scale * lamb_direction(m[i], v[i], master[i], s);
  if (lowp != nullptr) convert(lowp, lowp_dtype, master, DType::kF32, n);
}

OneBitLambSums onebit_lamb_refresh(float* m, float* v_fresh, const float* m_last, const float* v, const float* master,
                                   size_t n, const OneBitLambScalars& s) {
  if (use_avx512()) return detail::onebit_lamb_refresh_avx512(m, v_fresh, m_last, v, master, n, s);
  const float omb1 = s.one_minus_beta1, omb2 = s.one_minus_beta2;
  OneBitLambSums out;
  for (size_t i = 0; i < n; ++i) {
    m[i] /= s.scale;
    const float g = (m[i] - m_last[i] * s.beta1) / omb1;
    v_fresh[i] = s.beta2 * v_fresh[i] + omb2 * g * g;
    const float denom = std::sqrt(v[i]) + s.eps;
    const float prelim = m[i] / denom;
    const float u = s.weight_decay > 0.0f ? prelim + s.weight_decay * master[i] : prelim;
    out.u += static_cast<double>(u) * u;
    out.prelim += static_cast<double>(prelim) * prelim;
    out.ratio_max = std::max(out.ratio_max, denom / (std::sqrt(v_fresh[i]) + s.eps));
  }
  return out;
}

// ---- reductions ----

double sum_squares(const float* x, size_t n) {
  auto body = use_avx512() ? detail::sum_squares_avx512 : sum_squares_rows;
  const int64_t nchunks = static_cast<int64_t>((n + kSumChunk - 1) / kSumChunk);
  std::vector<double> part(static_cast<size_t>(nchunks));
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (int64_t c = 0; c < nchunks; ++c) {
    const size_t i0 = static_cast<size_t>(c) * kSumChunk;
    const size_t i1 = i0 + kSumChunk < n ? i0 + kSumChunk : n;
    part[c] = body(x + i0, i1 - i0);
  }
  double s = 0.0;
  for (double p : part) s += p;
  return s;
}

}  // namespace mt::kernels
