// AVX-512 bodies of the fused CPU kernels (declared in ops_avx512.h, driven by ops.cpp). Serial:
// each call works on one slice. Tails are handled with masked loads and stores.
//
// exp: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, e^r by its degree-7 Taylor polynomial
// (truncation < 6e-9 relative), then 2^n applied with vscalefps, which gives inf, denormals and 0
// at the ends of the range; ~2 ulp. GELU and SiLU use only sigmoid-shaped forms built from exp:
//   0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)),   1 - tanh(u)^2 = 4 s (1 - s),   1 - s = e s
// which keep relative accuracy in both tails (no 1 - tanh cancellation).
//
// NOTE: no inline functions or templates shared with the portable TU live here (see the header);
// helpers are in an anonymous namespace.
// NOTE: GCC 12's AVX-512 headers trip -W(maybe-)uninitialized on their own _mm512_undefined_*()
// placeholders (GCC PR105593) once inlined; the warnings are false positives, silenced here only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "kernels/cpu/ops_avx512.h"

#include <immintrin.h>

#include "base/avx512_lanes.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace mt::kernels::detail {
namespace {

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;
// exp arguments of the sigmoid forms are capped here so e stays finite and e * s never is inf * 0
// (s is then ~6e-39 instead of 0: the same to any tolerance).
constexpr float kSigmoidMaxArg = 88.0f;

inline __mmask16 tail_mask(size_t r) {
  return static_cast<__mmask16>((1u << r) - 1u);
}

inline __m512 exp512(__m512 x) {
  // Clamp keeps n finite (exp(-104) and below round to 0, exp(89) overflows to inf); the operand
  // order of max/min lets a NaN x pass through.
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// Returns gelu(x); *grad (if non-null) receives d gelu / dx.
inline __m512 gelu512(__m512 x, __m512* grad) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 x2 = _mm512_mul_ps(x, x);
  const __m512 ku = _mm512_mul_ps(_mm512_set1_ps(kGeluK), x);
  const __m512 u = _mm512_mul_ps(ku, _mm512_fmadd_ps(_mm512_set1_ps(kGeluA), x2, one));
  const __m512 e = exp512(
      _mm512_min_ps(_mm512_set1_ps(kSigmoidMaxArg), _mm512_mul_ps(_mm512_set1_ps(-2.0f), u)));
  const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, e));
  if (grad != nullptr) {
    // s + 2 x s (1 - s) k (1 + 3 a x^2)
    const __m512 du = _mm512_mul_ps(_mm512_set1_ps(kGeluK),
                                    _mm512_fmadd_ps(_mm512_set1_ps(3.0f * kGeluA), x2, one));
    const __m512 t = _mm512_mul_ps(_mm512_mul_ps(_mm512_add_ps(x, x), s), _mm512_mul_ps(e, s));
    *grad = _mm512_fmadd_ps(t, du, s);
  }
  return _mm512_mul_ps(x, s);
}

// e = exp(-g), s = sigmoid(g) = 1 / (1 + e), 1 - s = e s.
inline __m512 sigmoid512(__m512 g, __m512* one_minus_s) {
  const __m512 e =
      exp512(_mm512_min_ps(_mm512_set1_ps(kSigmoidMaxArg), _mm512_sub_ps(_mm512_setzero_ps(), g)));
  const __m512 s = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
  if (one_minus_s != nullptr) *one_minus_s = _mm512_mul_ps(e, s);
  return s;
}

inline float row_sum(const float* x, int C) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  int c = 0;
  for (; c + 32 <= C; c += 32) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + c));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(x + c + 16));
  }
  for (; c < C; c += 16) {
    const __mmask16 m = C - c >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(C - c);
    a0 = _mm512_add_ps(a0, _mm512_maskz_loadu_ps(m, x + c));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

// The row passes over C features (the norms, the bias gradient) keep the masked forms: a row of
// C floats is in the cache, where the plain forms' branch costs more than the mask (layernorm's
// backward ran 18 % slower with it); the streaming passes below take base/avx512_lanes.h's. The
// norms' forward passes are instantiated for C a multiple of 16 as well (row_mask: whole masks the
// compiler sees, so plain loads and stores with no branch; layernorm's forward 15 % faster, its
// backward so instantiated 8 % slower, so not).
inline __mmask16 mask_at(int c, int C) {
  return C - c >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(static_cast<size_t>(C - c));
}

// mask_at in a row pass instantiated for C a multiple of 16 (kAligned): every mask whole and known
// to the compiler, which then loads and stores plain (PERF (cc)), with no branch.
template <bool kAligned>
inline __mmask16 row_mask(int c, int C) {
  return kAligned ? static_cast<__mmask16>(0xffff) : mask_at(c, C);
}

}  // namespace

// ---- LayerNorm ----

template <bool kAligned>
void layernorm_forward_rows(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int N, int C, float eps) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    float* y = out + static_cast<size_t>(n) * C;
    const float m = row_sum(x, C) / C;
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    for (int c = 0; c < C; c += 16) {
      const __mmask16 k = row_mask<kAligned>(c, C);
      const __m512 d = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, x + c), vm);
      acc = _mm512_fmadd_ps(d, d, acc);
    }
    const float r = 1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / C + eps);
    const __m512 vr = _mm512_set1_ps(r);
    for (int c = 0; c < C; c += 16) {
      const __mmask16 k = row_mask<kAligned>(c, C);
      const __m512 norm = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + c), vm), vr);
      const __m512 b = bias ? _mm512_maskz_loadu_ps(k, bias + c) : _mm512_setzero_ps();
      _mm512_mask_storeu_ps(y + c, k,
                            _mm512_fmadd_ps(norm, _mm512_maskz_loadu_ps(k, weight + c), b));
    }
    mean[n] = m;
    rstd[n] = r;
  }
}

void layernorm_forward_avx512(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int N, int C, float eps) {
  if (C % 16 == 0)
    layernorm_forward_rows<true>(out, mean, rstd, inp, weight, bias, N, C, eps);
  else
    layernorm_forward_rows<false>(out, mean, rstd, inp, weight, bias, N, C, eps);
}

void layernorm_backward_avx512(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const float* mean,
                               const float* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    const float* dy = dout + static_cast<size_t>(n) * C;
    float* dx = dinp + static_cast<size_t>(n) * C;
    const __m512 vm = _mm512_set1_ps(mean[n]);
    const __m512 vr = _mm512_set1_ps(rstd[n]);
    __m512 a_dn = _mm512_setzero_ps(), a_dnn = _mm512_setzero_ps();
    for (int c = 0; c < C; c += 16) {
      const __mmask16 k = mask_at(c, C);
      const __m512 g = _mm512_maskz_loadu_ps(k, dy + c);
      const __m512 norm = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + c), vm), vr);
      const __m512 dnorm = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, weight + c), g);
      a_dn = _mm512_add_ps(a_dn, dnorm);
      a_dnn = _mm512_fmadd_ps(dnorm, norm, a_dnn);
      _mm512_mask_storeu_ps(dweight + c, k,
                            _mm512_fmadd_ps(norm, g, _mm512_maskz_loadu_ps(k, dweight + c)));
      if (dbias)
        _mm512_mask_storeu_ps(dbias + c, k, _mm512_add_ps(g, _mm512_maskz_loadu_ps(k, dbias + c)));
    }
    const __m512 dn_mean = _mm512_set1_ps(_mm512_reduce_add_ps(a_dn) / C);
    const __m512 dnn_mean = _mm512_set1_ps(_mm512_reduce_add_ps(a_dnn) / C);
    for (int c = 0; c < C; c += 16) {
      const __mmask16 k = mask_at(c, C);
      const __m512 g = _mm512_maskz_loadu_ps(k, dy + c);
      const __m512 norm = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + c), vm), vr);
      __m512 t = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(k, weight + c), g, dn_mean);
      t = _mm512_fnmadd_ps(norm, dnn_mean, t);
      _mm512_mask_storeu_ps(dx + c, k, _mm512_fmadd_ps(t, vr, _mm512_maskz_loadu_ps(k, dx + c)));
    }
  }
}

// ---- RMSNorm ----

template <bool kAligned>
void rmsnorm_forward_rows(float* out, float* rstd, const float* inp, const float* weight, int N,
                            int C, float eps) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    float* y = out + static_cast<size_t>(n) * C;
    __m512 acc = _mm512_setzero_ps();
    for (int c = 0; c < C; c += 16) {
      const __m512 v = _mm512_maskz_loadu_ps(row_mask<kAligned>(c, C), x + c);
      acc = _mm512_fmadd_ps(v, v, acc);
    }
    const float r = 1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / C + eps);
    const __m512 vr = _mm512_set1_ps(r);
    for (int c = 0; c < C; c += 16) {
      const __mmask16 k = row_mask<kAligned>(c, C);
      const __m512 xn = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + c), vr);
      _mm512_mask_storeu_ps(y + c, k, _mm512_mul_ps(xn, _mm512_maskz_loadu_ps(k, weight + c)));
    }
    rstd[n] = r;
  }
}

void rmsnorm_forward_avx512(float* out, float* rstd, const float* inp, const float* weight, int N,
                            int C, float eps) {
  if (C % 16 == 0)
    rmsnorm_forward_rows<true>(out, rstd, inp, weight, N, C, eps);
  else
    rmsnorm_forward_rows<false>(out, rstd, inp, weight, N, C, eps);
}

void rmsnorm_backward_avx512(float* dinp, float* dweight, const float* dout, const float* inp,
                             const float* weight, const float* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    const float* dy = dout + static_cast<size_t>(n) * C;
    float* dx = dinp + static_cast<size_t>(n) * C;
    const float r = rstd[n];
    const __m512 vr = _mm512_set1_ps(r);
    __m512 acc = _mm512_setzero_ps();
    for (int c = 0; c < C; c += 16) {
      const __mmask16 k = mask_at(c, C);
      const __m512 g = _mm512_maskz_loadu_ps(k, dy + c);
      const __m512 xv = _mm512_maskz_loadu_ps(k, x + c);
      acc = _mm512_fmadd_ps(_mm512_mul_ps(g, _mm512_maskz_loadu_ps(k, weight + c)), xv, acc);
      _mm512_mask_storeu_ps(
          dweight + c, k,
          _mm512_fmadd_ps(_mm512_mul_ps(g, xv), vr, _mm512_maskz_loadu_ps(k, dweight + c)));
    }
    const __m512 vk = _mm512_set1_ps(_mm512_reduce_add_ps(acc) * r * r * r / C);
    for (int c = 0; c < C; c += 16) {
      const __mmask16 k = mask_at(c, C);
      const __m512 g = _mm512_maskz_loadu_ps(k, dy + c);
      const __m512 t = _mm512_mul_ps(_mm512_mul_ps(vr, _mm512_maskz_loadu_ps(k, weight + c)), g);
      const __m512 d = _mm512_fnmadd_ps(_mm512_maskz_loadu_ps(k, x + c), vk, t);
      _mm512_mask_storeu_ps(dx + c, k, _mm512_add_ps(d, _mm512_maskz_loadu_ps(k, dx + c)));
    }
  }
}


// ---- SwiGLU ----

void swiglu_forward_avx512(float* out, const float* inp, int N, int I) {
  for (int n = 0; n < N; ++n) {
    const float* g = inp + static_cast<size_t>(n) * 2 * I;
    const float* u = g + I;
    float* y = out + static_cast<size_t>(n) * I;
    for (int i = 0; i < I; i += 16) {
      const __mmask16 k = mask_at(i, I);
      const __m512 gv = avx512::load_ps(k, g + i);
      const __m512 silu = _mm512_mul_ps(gv, sigmoid512(gv, nullptr));
      avx512::store_ps(y + i, k, _mm512_mul_ps(silu, avx512::load_ps(k, u + i)));
    }
  }
}

void swiglu_backward_avx512(float* dinp, const float* dout, const float* inp, int N, int I) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int n = 0; n < N; ++n) {
    const float* g = inp + static_cast<size_t>(n) * 2 * I;
    const float* u = g + I;
    const float* dy = dout + static_cast<size_t>(n) * I;
    float* dg = dinp + static_cast<size_t>(n) * 2 * I;
    float* du = dg + I;
    for (int i = 0; i < I; i += 16) {
      const __mmask16 k = mask_at(i, I);
      const __m512 gv = avx512::load_ps(k, g + i);
      const __m512 d = avx512::load_ps(k, dy + i);
      __m512 oms;
      const __m512 s = sigmoid512(gv, &oms);
      avx512::store_ps(du + i, k, _mm512_mul_ps(d, _mm512_mul_ps(gv, s)));
      const __m512 dus = _mm512_mul_ps(_mm512_mul_ps(d, avx512::load_ps(k, u + i)), s);
      avx512::store_ps(dg + i, k, _mm512_mul_ps(dus, _mm512_fmadd_ps(gv, oms, one)));
    }
  }
}

// ---- bias ----

void bias_backward_avx512(float* dbias, const float* dout, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* dy = dout + static_cast<size_t>(n) * C;
    for (int c = 0; c < C; c += 16) {
      const __mmask16 k = mask_at(c, C);
      _mm512_mask_storeu_ps(
          dbias + c, k,
          _mm512_add_ps(_mm512_maskz_loadu_ps(k, dbias + c), _mm512_maskz_loadu_ps(k, dy + c)));
    }
  }
}


// ---- cross-entropy ----

void cross_entropy_tile_avx512(float* loss, float* lse, float* logits, const int32_t* targets,
                               int R, int V, float grad_scale, int ld) {
  for (int r = 0; r < R; ++r) {
    float* x = logits + static_cast<size_t>(r) * ld;
    const int32_t t = targets[r];
    const bool ignore = t == -100;
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < V; i += 16) {
      const __mmask16 k = mask_at(i, V);
      vmax = _mm512_mask_max_ps(vmax, k, vmax, avx512::load_ps(k, x + i));
    }
    const float mx = _mm512_reduce_max_ps(vmax);
    const __m512 vm = _mm512_set1_ps(mx);
    const bool keep = grad_scale != 0.0f && !ignore;  // store exp(x - max) for the gradient
    const float x_t = ignore ? 0.0f : x[t];
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < V; i += 16) {
      const __mmask16 k = mask_at(i, V);
      const __m512 e =
          _mm512_maskz_mov_ps(k, exp512(_mm512_sub_ps(avx512::load_ps(k, x + i), vm)));
      acc = _mm512_add_ps(acc, e);
      if (keep) avx512::store_ps(x + i, k, e);
    }
    const float sum = _mm512_reduce_add_ps(acc);
    const float l = mx + std::log(sum);
    lse[r] = l;
    loss[r] = ignore ? 0.0f : l - x_t;
    if (grad_scale == 0.0f) continue;
    if (ignore) {
      std::memset(x, 0, sizeof(float) * V);
      continue;
    }
    const __m512 vk = _mm512_set1_ps(grad_scale / sum);
    for (int i = 0; i < V; i += 16) {
      const __mmask16 k = mask_at(i, V);
      avx512::store_ps(x + i, k, _mm512_mul_ps(avx512::load_ps(k, x + i), vk));
    }
    x[t] -= grad_scale;
  }
}

void vp_cross_entropy_max_avx512(float* rowmax, const float* logits, int R, int V, int valid, int ld) {
  for (int r = 0; r < R; ++r) {
    const float* x = logits + static_cast<size_t>(r) * ld;
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < valid; i += 16) {
      const __mmask16 k = mask_at(i, valid);
      vmax = _mm512_mask_max_ps(vmax, k, vmax, avx512::load_ps(k, x + i));
    }
    rowmax[r] = _mm512_reduce_max_ps(vmax);
  }
}

void vp_cross_entropy_exp_avx512(float* sumexp, float* logits, const float* rowmax, int R, int V, int valid, int ld) {
  for (int r = 0; r < R; ++r) {
    float* x = logits + static_cast<size_t>(r) * ld;
    const __m512 vm = _mm512_set1_ps(rowmax[r]);
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < valid; i += 16) {
      const __mmask16 k = mask_at(i, valid);
      const __m512 e = _mm512_maskz_mov_ps(k, exp512(_mm512_sub_ps(avx512::load_ps(k, x + i), vm)));
      acc = _mm512_add_ps(acc, e);
      avx512::store_ps(x + i, k, e);
    }
    for (int i = valid; i < V; ++i) x[i] = 0.0f;
    sumexp[r] = _mm512_reduce_add_ps(acc);
  }
}

// ---- elementwise ----

void gelu_forward_avx512(float* out, const float* inp, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, gelu512(_mm512_loadu_ps(inp + i), nullptr));
  if (i < n) {
    const __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(out + i, k, gelu512(_mm512_maskz_loadu_ps(k, inp + i), nullptr));
  }
}

void gelu_backward_avx512(float* dinp, const float* inp, const float* dout, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(n - i);
    __m512 grad;
    gelu512(avx512::load_ps(k, inp + i), &grad);
    avx512::store_ps(dinp + i, k, _mm512_mul_ps(grad, avx512::load_ps(k, dout + i)));
  }
}

namespace {

// 16 f32 lanes to the compute dtype (round to nearest even, as f32_to_bf16 and f32_to_f16) and back.
inline __m256i to_cd(__m512 v, bool bf16) {
  if (bf16) {
    __m256bh b = _mm512_cvtneps_pbh(v);
    return reinterpret_cast<__m256i&>(b);
  }
  return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
}

inline __m512 from_cd(__m256i h, bool bf16) {
  if (bf16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  return _mm512_cvtph_ps(h);
}

// The pre-activation's 16 lanes rounded: stored to the saved copy, returned in f32.
inline __m512 round_store(uint16_t* saved, const float* h, __mmask16 k, bool bf16) {
  const __m256i r = to_cd(avx512::load_ps(k, h), bf16);
  avx512::store_epi16(saved, k, r);
  return from_cd(r, bf16);
}

}  // namespace

void gelu_forward_lp_avx512(void* h_cd, void* act_cd, bool bf16, const float* h, size_t n) {
  auto* hc = static_cast<uint16_t*>(h_cd);
  auto* ac = static_cast<uint16_t*>(act_cd);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(n - i);
    const __m512 x = round_store(hc + i, h + i, k, bf16);
    avx512::store_epi16(ac + i, k, to_cd(gelu512(x, nullptr), bf16));
  }
}

void gelu_backward_lp_avx512(float* dinp, const void* h_cd, bool bf16, const float* dout, size_t n) {
  const auto* hc = static_cast<const uint16_t*>(h_cd);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(n - i);
    __m512 grad;
    gelu512(from_cd(avx512::load_epi16(k, hc + i), bf16), &grad);
    avx512::store_ps(dinp + i, k, _mm512_mul_ps(grad, avx512::load_ps(k, dout + i)));
  }
}

void swiglu_forward_lp_avx512(void* h_cd, void* act_cd, bool bf16, const float* h, int N, int I) {
  for (int n = 0; n < N; ++n) {
    const float* g = h + static_cast<size_t>(n) * 2 * I;
    uint16_t* gc = static_cast<uint16_t*>(h_cd) + static_cast<size_t>(n) * 2 * I;
    uint16_t* y = static_cast<uint16_t*>(act_cd) + static_cast<size_t>(n) * I;
    for (int i = 0; i < I; i += 16) {
      const __mmask16 k = mask_at(i, I);
      const __m512 gv = round_store(gc + i, g + i, k, bf16);
      const __m512 uv = round_store(gc + I + i, g + I + i, k, bf16);
      const __m512 silu = _mm512_mul_ps(gv, sigmoid512(gv, nullptr));
      avx512::store_epi16(y + i, k, to_cd(_mm512_mul_ps(silu, uv), bf16));
    }
  }
}

void swiglu_backward_lp_avx512(float* dinp, const float* dout, const void* h_cd, bool bf16, int N, int I) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int n = 0; n < N; ++n) {
    const uint16_t* gc = static_cast<const uint16_t*>(h_cd) + static_cast<size_t>(n) * 2 * I;
    const float* dy = dout + static_cast<size_t>(n) * I;
    float* dg = dinp + static_cast<size_t>(n) * 2 * I;
    float* du = dg + I;
    for (int i = 0; i < I; i += 16) {
      const __mmask16 k = mask_at(i, I);
      const __m512 gv = from_cd(avx512::load_epi16(k, gc + i), bf16);
      const __m512 uv = from_cd(avx512::load_epi16(k, gc + I + i), bf16);
      const __m512 d = avx512::load_ps(k, dy + i);
      __m512 oms;
      const __m512 s = sigmoid512(gv, &oms);
      avx512::store_ps(du + i, k, _mm512_mul_ps(d, _mm512_mul_ps(gv, s)));
      const __m512 dus = _mm512_mul_ps(_mm512_mul_ps(d, uv), s);
      avx512::store_ps(dg + i, k, _mm512_mul_ps(dus, _mm512_fmadd_ps(gv, oms, one)));
    }
  }
}

void add_forward_avx512(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(n - i);
    avx512::store_ps(
        out + i, k,
        _mm512_add_ps(avx512::load_ps(k, a + i), avx512::load_ps(k, b + i)));
  }
}

void add_inplace_avx512(float* acc, const float* x, size_t n) {
  add_forward_avx512(acc, acc, x, n);
}

void scale_inplace_avx512(float* x, float s, size_t n) {
  const __m512 vs = _mm512_set1_ps(s);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(n - i);
    avx512::store_ps(x + i, k, _mm512_mul_ps(avx512::load_ps(k, x + i), vs));
  }
}

// Squares and sums in double: each f32 lane is widened before the multiply, so no overflow.
double sum_squares_avx512(const float* x, size_t n) {
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(n - i);
    const __m512 v = avx512::load_ps(k, x + i);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
    a0 = _mm512_fmadd_pd(lo, lo, a0);
    a1 = _mm512_fmadd_pd(hi, hi, a1);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
}

// ---- AdamW ----

namespace {

// 16 lanes of p to lowp[i..] in lowp_dtype (RNE), k the lanes to write.
inline void store_lowp16(void* lowp, DType lowp_dtype, size_t i, __mmask16 k, __m512 p) {
  if (lowp_dtype == DType::kBF16) {
    const __m256bh h = _mm512_cvtneps_pbh(p);  // RNE, as f32_to_bf16
    __m256i bits;
    std::memcpy(&bits, &h, sizeof(bits));
    avx512::store_epi16(static_cast<uint16_t*>(lowp) + i, k, bits);
  } else if (lowp_dtype == DType::kF16) {
    avx512::store_epi16(static_cast<uint16_t*>(lowp) + i, k, _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  } else {
    avx512::store_ps(static_cast<float*>(lowp) + i, k, p);
  }
}

}  // namespace

void adamw_update_avx512(float* master, const float* grad, float* m, float* v, void* lowp,
                         DType lowp_dtype, size_t n, const AdamWScalars& s) {
  const __m512 gs = _mm512_set1_ps(s.grad_scale);
  const __m512 b1 = _mm512_set1_ps(s.beta1), omb1 = _mm512_set1_ps(s.one_minus_beta1);
  const __m512 b2 = _mm512_set1_ps(s.beta2), omb2 = _mm512_set1_ps(s.one_minus_beta2);
  const __m512 decay = _mm512_set1_ps(s.decay), step = _mm512_set1_ps(s.step_size);
  const __m512 bc2 = _mm512_set1_ps(s.bc2_sqrt), eps = _mm512_set1_ps(s.eps);
  const bool l2 = s.l2 != 0.0f;
  const __m512 l2v = _mm512_set1_ps(s.l2);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(n - i);
    __m512 g = _mm512_mul_ps(avx512::load_ps(k, grad + i), gs);
    if (l2) g = _mm512_fmadd_ps(l2v, avx512::load_ps(k, master + i), g);
    const __m512 mi = _mm512_fmadd_ps(b1, avx512::load_ps(k, m + i), _mm512_mul_ps(omb1, g));
    const __m512 vi = _mm512_fmadd_ps(b2, avx512::load_ps(k, v + i),
                                      _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2), eps);
    __m512 p = _mm512_mul_ps(avx512::load_ps(k, master + i), decay);
    p = _mm512_sub_ps(p, _mm512_div_ps(_mm512_mul_ps(step, mi), denom));
    avx512::store_ps(m + i, k, mi);
    avx512::store_ps(v + i, k, vi);
    avx512::store_ps(master + i, k, p);
    if (lowp != nullptr) store_lowp16(lowp, lowp_dtype, i, k, p);
  }
}

// ---- LAMB ----

namespace {

// a0 += x[0:8]^2, a1 += x[8:16]^2, in double (each product exact).
inline void add_squares16(__m512 x, __m512d& a0, __m512d& a1) {
  const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x)), hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));
  a0 = _mm512_fmadd_pd(lo, lo, a0);
  a1 = _mm512_fmadd_pd(hi, hi, a1);
}

// u = m_hat / denom + wd p of 16 lanes (ops.h's lamb_moments): bc holds bias_correction1 and 2.
inline __m512 lamb_direction16(__m512 mi, __m512 vi, __m512 p, __m512 eps, __m512 wd, const __m512 bc[2], bool inside) {
  const __m512 mh = _mm512_div_ps(mi, bc[0]), vh = _mm512_div_ps(vi, bc[1]);
  const __m512 denom = inside ? _mm512_sqrt_ps(_mm512_add_ps(vh, eps)) : _mm512_add_ps(_mm512_sqrt_ps(vh), eps);
  return _mm512_fmadd_ps(wd, p, _mm512_div_ps(mh, denom));
}

}  // namespace

::mt::kernels::LambSums lamb_moments_avx512(float* m, float* v, const float* grad, const float* master, size_t n,
                                            const ::mt::kernels::LambScalars& s) {
  const __m512 gs = _mm512_set1_ps(s.grad_scale), b1 = _mm512_set1_ps(s.beta1), omb1 = _mm512_set1_ps(1.0f - s.beta1),
               b2 = _mm512_set1_ps(s.beta2), omb2 = _mm512_set1_ps(1.0f - s.beta2), eps = _mm512_set1_ps(s.eps),
               wd = _mm512_set1_ps(s.weight_decay);
  const __m512 bc[2] = {_mm512_set1_ps(s.bias_correction1), _mm512_set1_ps(s.bias_correction2)};
  __m512d w0 = _mm512_setzero_pd(), w1 = _mm512_setzero_pd(), u0 = _mm512_setzero_pd(), u1 = _mm512_setzero_pd();
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(n - i);
    const __m512 g = _mm512_mul_ps(avx512::load_ps(k, grad + i), gs);
    const __m512 p = avx512::load_ps(k, master + i);
    const __m512 mi = _mm512_fmadd_ps(b1, avx512::load_ps(k, m + i), _mm512_mul_ps(omb1, g));
    const __m512 vi = _mm512_fmadd_ps(b2, avx512::load_ps(k, v + i), _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
    avx512::store_ps(m + i, k, mi);
    avx512::store_ps(v + i, k, vi);
    // The lanes past the tail are zero (eps 0 would make them 0/0).
    const __m512 u = _mm512_maskz_mov_ps(k, lamb_direction16(mi, vi, p, eps, wd, bc, s.eps_inside_sqrt));
    add_squares16(p, w0, w1);
    add_squares16(u, u0, u1);
  }
  return {_mm512_reduce_add_pd(_mm512_add_pd(w0, w1)), _mm512_reduce_add_pd(_mm512_add_pd(u0, u1))};
}

void lamb_apply_avx512(float* master, const float* m, const float* v, void* lowp, DType lowp_dtype, size_t n,
                       float scale, const ::mt::kernels::LambScalars& s) {
  const __m512 eps = _mm512_set1_ps(s.eps), wd = _mm512_set1_ps(s.weight_decay), sc = _mm512_set1_ps(scale);
  const __m512 bc[2] = {_mm512_set1_ps(s.bias_correction1), _mm512_set1_ps(s.bias_correction2)};
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(n - i);
    const __m512 p = avx512::load_ps(k, master + i);
    const __m512 u = lamb_direction16(avx512::load_ps(k, m + i), avx512::load_ps(k, v + i), p, eps, wd, bc,
                                      s.eps_inside_sqrt);
    const __m512 q = _mm512_fnmadd_ps(sc, u, p);
    avx512::store_ps(master + i, k, q);
    if (lowp != nullptr) store_lowp16(lowp, lowp_dtype, i, k, q);
  }
}

::mt::kernels::OneBitLambSums onebit_lamb_refresh_avx512(float* m, float* v_fresh, const float* m_last, const float* v,
                                                         const float* master, size_t n,
                                                         const ::mt::kernels::OneBitLambScalars& s) {
  // The portable loop's operations in its order, each rounded on its own: the _round_ forms are
  // builtins the compiler does not contract into fused multiply-adds (plain _mm512_add_ps and
  // _mm512_mul_ps are vector operators, which -ffp-contract=fast fuses): the same values.
  const __m512 sc = _mm512_set1_ps(s.scale), b1 = _mm512_set1_ps(s.beta1), omb1 = _mm512_set1_ps(s.one_minus_beta1),
               b2 = _mm512_set1_ps(s.beta2), omb2 = _mm512_set1_ps(s.one_minus_beta2), eps = _mm512_set1_ps(s.eps),
               wd = _mm512_set1_ps(s.weight_decay), lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const bool decay = s.weight_decay > 0.0f;
  constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  __m512d u0 = _mm512_setzero_pd(), u1 = _mm512_setzero_pd(), p0 = _mm512_setzero_pd(), p1 = _mm512_setzero_pd();
  __m512 rmax = lowest;
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(n - i);
    const __m512 mi = _mm512_div_ps(avx512::load_ps(k, m + i), sc);
    const __m512 g = _mm512_div_ps(_mm512_sub_round_ps(mi, _mm512_mul_round_ps(avx512::load_ps(k, m_last + i), b1, kRne), kRne), omb1);
    const __m512 vf = _mm512_add_round_ps(_mm512_mul_round_ps(b2, avx512::load_ps(k, v_fresh + i), kRne),
                                          _mm512_mul_round_ps(_mm512_mul_round_ps(omb2, g, kRne), g, kRne), kRne);
    avx512::store_ps(m + i, k, mi);
    avx512::store_ps(v_fresh + i, k, vf);
    const __m512 denom = _mm512_add_ps(_mm512_sqrt_ps(avx512::load_ps(k, v + i)), eps);
    // The lanes past the tail are zero (eps 0 would make them 0/0) and leave the max alone.
    const __m512 prelim = _mm512_maskz_div_ps(k, mi, denom);
    const __m512 u =
        decay ? _mm512_add_round_ps(prelim, _mm512_mul_round_ps(wd, avx512::load_ps(k, master + i), kRne), kRne) : prelim;
    // The max skips a NaN ratio (0/0 where eps is 0), as std::max(max, NaN) does.
    const __m512 ratio = _mm512_div_ps(denom, _mm512_add_ps(_mm512_sqrt_ps(vf), eps));
    rmax = _mm512_mask_max_ps(rmax, k & _mm512_cmp_ps_mask(ratio, ratio, _CMP_ORD_Q), rmax, ratio);
    add_squares16(u, u0, u1);
    add_squares16(prelim, p0, p1);
  }
  ::mt::kernels::OneBitLambSums out;
  out.u = _mm512_reduce_add_pd(_mm512_add_pd(u0, u1));
  out.prelim = _mm512_reduce_add_pd(_mm512_add_pd(p0, p1));
  out.ratio_max = _mm512_reduce_max_ps(rmax);
  return out;
}

}  // namespace mt::kernels::detail
