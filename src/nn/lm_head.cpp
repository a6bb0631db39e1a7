#include "nn/lm_head.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops.h"

namespace mt::nn {
namespace {

// One tile of logits (r, V) of this shard: the loss of each row over the whole (distributed)
// vocabulary, and, when training, dlogits = (softmax - onehot) * grad_scale in place.
void vocab_parallel_tile(const LmHeadArgs& a, float* loss, float* logits, int ld, const int32_t* targets, int r) {
  const int V = a.V, valid = a.valid < 0 ? a.V : a.valid;
  std::vector<float> mx(static_cast<size_t>(r)), st(2 * static_cast<size_t>(r)), sum(static_cast<size_t>(r)),
      scale(static_cast<size_t>(r));
  // The target's logit, where this shard holds it (before the logits turn into exps).
  for (int i = 0; i < r; ++i) {
    int t = targets[i] - a.v0;
    st[2 * i + 1] = targets[i] != -100 && t >= 0 && t < valid ? logits[static_cast<size_t>(i) * ld + t] : 0.0f;
  }
  kernels::vp_cross_entropy_max(mx.data(), logits, r, V, valid, ld);
  a.reduce_max(mx.data(), mx.size());
  kernels::vp_cross_entropy_exp(sum.data(), logits, mx.data(), r, V, valid, ld);
  for (int i = 0; i < r; ++i) st[2 * i] = sum[static_cast<size_t>(i)];
  a.reduce_sum(st.data(), st.size());  // sums of exps and target logits, in one all-reduce
  for (int i = 0; i < r; ++i) {
    const bool ignored = targets[i] == -100;
    const double lse = std::log(static_cast<double>(st[2 * i])) + mx[static_cast<size_t>(i)];
    loss[i] = ignored ? 0.0f : static_cast<float>(lse - st[2 * i + 1]);
    sum[static_cast<size_t>(i)] = st[2 * i];
    scale[static_cast<size_t>(i)] = ignored ? 0.0f : a.grad_scale;
  }
  if (a.grad_scale == 0.0f) return;
  kernels::vp_cross_entropy_grad(logits, sum.data(), scale.data(), r, V, ld);  // softmax * scale
  for (int i = 0; i < r; ++i) {
    const int t = targets[i] - a.v0;
    if (targets[i] != -100 && t >= 0 && t < valid) logits[static_cast<size_t>(i) * ld + t] -= a.grad_scale;
  }
}

// One tile of logits (r, V) of a value loss (kMeanSquared, kBinaryCrossEntropy): each row's loss
// over its V columns against row targets[i] of a.values, and, when training, dlogits = dloss/dz *
// grad_scale in place (0 on ignored rows). In double: V is a classifier's few labels.
void value_loss_tile(const LmHeadArgs& a, float* loss, float* logits, int ld, const int32_t* targets, int r) {
  const int V = a.V;
  for (int i = 0; i < r; ++i) {
    float* z = logits + static_cast<size_t>(i) * ld;
    if (targets[i] == -100) {
      loss[i] = 0.0f;
      if (a.grad_scale != 0.0f) std::fill(z, z + V, 0.0f);
      continue;
    }
    MT_CHECK(a.values != nullptr && targets[i] >= 0 && targets[i] < a.value_rows, ErrorKind::kInvalidArgument,
             "LM head: target " + std::to_string(targets[i]) + " names no row of the " + std::to_string(a.value_rows) +
                 " label values");
    const float* y = a.values + static_cast<size_t>(targets[i]) * V;
    double sum = 0.0;
    for (int c = 0; c < V; ++c) {
      const double zc = z[c], yc = y[c];
      double dz;
      if (a.loss == HeadLoss::kMeanSquared) {
        sum += (zc - yc) * (zc - yc);
        dz = 2.0 * (zc - yc);
      } else {  // torch's stable form; d/dz = sigmoid(z) - y
        sum += std::max(zc, 0.0) - zc * yc + std::log1p(std::exp(-std::fabs(zc)));
        dz = 1.0 / (1.0 + std::exp(-zc)) - yc;
      }
      if (a.grad_scale != 0.0f) z[c] = static_cast<float>(dz / V * a.grad_scale);
    }
    loss[i] = static_cast<float>(sum / V);
  }
}

}  // namespace

int lm_head_tile_rows(int N, int V, int tile_rows) {
  // Default tile: f32 logits of at most 64 MiB, split into equal tiles (a GEMM with a short K is
  // slow, and dW is re-read and re-written once per tile, so fewer, even tiles are faster).
  int R = tile_rows;
  if (R <= 0) {
    size_t budget_rows = std::max<size_t>(1, (size_t{64} << 20) / (4 * static_cast<size_t>(V)));
    size_t tiles = (static_cast<size_t>(N) + budget_rows - 1) / budget_rows;
    R = static_cast<int>((static_cast<size_t>(N) + tiles - 1) / tiles);
  }
  return std::min(R, N);
}

int lm_head_operand_ld(int V, DType dtype) {
  if (dtype == DType::kF16) return V;  // widened to dense f32 where oneDNN has no f16 matmul (here)
  const int es = static_cast<int>(dtype_size(dtype)), per_line = 64 / es;
  int ld = (V + per_line - 1) / per_line * per_line;
  // A stride of a multiple of 256 bytes (LLaMA's 32000 in bf16, 50304 in either) lands the rows on
  // the same cache sets: one line more (PERF (dd): 10-25 % on the two GEMMs).
  if (static_cast<int64_t>(ld) * es % 256 == 0) ld += per_line;
  return ld;
}

bool lm_head_widened(DType dtype) { return dtype == DType::kF16 && !kernels::gemm_native(dtype); }

int lm_head_logits_ld(int V, DType dtype) { return dtype == DType::kF32 ? lm_head_operand_ld(V, dtype) : V; }

double lm_head_cross_entropy(const LmHeadArgs& a, Workspace& ws) {
  const int R = lm_head_tile_rows(a.N, a.V, a.tile_rows);
  size_t es = dtype_size(a.dtype);
  // f32: the logits' rows on 64-byte lines (lm_head_operand_ld), dlogits in place (the logits GEMM
  // runs 5-10 % slower into the padded stride, the two that read dlogits 20-35 % faster). bf16: the
  // f32 logits dense (their GEMM ran 5-10 % slower into padded rows, and twice as slow at a stride
  // of 50272) and the bf16 copy of dlogits on whole lines. f16: both dense (lm_head_operand_ld).
  // Padding columns are never read. (The tile's rows are counted at V: a padded tile is over its
  // 64 MiB by the padding.)
  const int ldl = lm_head_logits_ld(a.V, a.dtype);
  float* logits = static_cast<float*>(ws.get(WorkSlot::kLmHeadLogits, static_cast<size_t>(R) * ldl * 4));
  const int ld = lm_head_operand_ld(a.V, a.dtype);
  // f16 where oneDNN has no f16 matmul (lm_head_widened): the weight is widened to f32 once a call
  // and each tile's rows once, the three GEMMs run in f32, and dlogits are the f32 logits rounded
  // to f16 in place. These are the values kernels::gemm's own widening gave (f16 is exact in f32),
  // which widened the whole weight again in every tile's logits and dX, and dlogits twice.
  const bool wide = lm_head_widened(a.dtype);
  const DType gd = wide ? DType::kF32 : a.dtype;  // the GEMMs' operand dtype
  float* w32 = nullptr;
  if (wide) {
    w32 = static_cast<float*>(ws.get(WorkSlot::kLmHeadWeight, static_cast<size_t>(a.V) * a.C * 4));
    convert(w32, DType::kF32, a.w, a.dtype, static_cast<size_t>(a.V) * a.C);
  }
  const void* w = wide ? static_cast<const void*>(w32) : a.w;
  void* dl = a.dtype == DType::kF32 || wide
                 ? static_cast<void*>(logits)
                 : ws.get(WorkSlot::kLmHeadOperand, static_cast<size_t>(R) * ld * es);
  float* x32 = wide ? static_cast<float*>(ws.get(WorkSlot::kLmHeadOperand, static_cast<size_t>(R) * a.C * 4)) : nullptr;
  float* lse = static_cast<float*>(ws.get(WorkSlot::kLmHeadLse, static_cast<size_t>(R) * 4));
  double total = 0.0;
  for (int r0 = 0; r0 < a.N; r0 += R) {
    int r = std::min(R, a.N - r0);
    const char* x = static_cast<const char*>(a.x) + static_cast<size_t>(r0) * a.C * es;
    if (wide) {
      convert(x32, DType::kF32, x, a.dtype, static_cast<size_t>(r) * a.C);
      x = reinterpret_cast<const char*>(x32);
    }
    // logits (r, V) = x (r, C) w^T
    kernels::gemm(r, a.V, a.C, x, a.C, false, w, a.C, true, logits, ldl, gd, false);
    if (a.loss != HeadLoss::kCrossEntropy) {
      value_loss_tile(a, a.losses + r0, logits, ldl, a.targets + r0, r);
    } else if (a.reduce_sum) {
      vocab_parallel_tile(a, a.losses + r0, logits, ldl, a.targets + r0, r);
    } else {
      kernels::cross_entropy_tile(a.losses + r0, lse, logits, a.targets + r0, r, a.V, a.grad_scale, ldl);
    }
    for (int i = 0; i < r; ++i) total += a.losses[r0 + i];
    if (a.grad_scale == 0.0f) continue;
    if (wide) {
      round_to(nullptr, a.dtype, logits, static_cast<size_t>(r) * a.V);  // ldl == ld == V
    } else if (a.dtype != DType::kF32 && ld == a.V) {
      convert(dl, a.dtype, logits, DType::kF32, static_cast<size_t>(r) * a.V);
    } else if (a.dtype != DType::kF32) {  // a row at a time, over the threads (a row is below convert's own split)
#pragma omp parallel for schedule(static) if (r > 1)
      for (int i = 0; i < r; ++i)
        convert(static_cast<char*>(dl) + static_cast<size_t>(i) * ld * es, a.dtype, logits + static_cast<size_t>(i) * ldl,
                DType::kF32, static_cast<size_t>(a.V));
    }
    // dx (r, C) = dlogits (r, V) w (V, C);  dw (V, C) += dlogits^T (V, r) x (r, C)
    kernels::gemm(r, a.C, a.V, dl, ld, false, w, a.C, false, a.dx + static_cast<size_t>(r0) * a.C,
                  a.C, gd, false);
    kernels::gemm(a.V, a.C, r, dl, ld, true, x, a.C, false, a.dw, a.C, gd, true);
  }
  return total;
}

void lm_head_logits(float* logits, const void* x, const void* w, DType dtype, int N, int C, int V) {
  kernels::gemm(N, V, C, x, C, false, w, C, true, logits, V, dtype, false);
}

}  // namespace mt::nn
