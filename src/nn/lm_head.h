// The LM head fused with softmax cross-entropy (the Liger/"chunked CE" scheme): rows are processed
// in tiles of R; for each tile the logits (R, V) are computed by one GEMM, turned into losses and,
// in training, into dlogits in place, which immediately give dX for the tile and accumulate dW. No
// more than one tile of logits ever exists, and the head's backward is done during forward.
#pragma once

#include <cstdint>
#include <functional>

#include "nn/workspace.h"
#include "tensor/dtype.h"

namespace mt::nn {

// What the head's logits are trained against. kCrossEntropy: the softmax over the V columns and the
// target column. kMeanSquared and kBinaryCrossEntropy (a sequence classifier's regression and
// multi-label problems, Hugging Face's MSELoss and BCEWithLogitsLoss): a row's target t names row t
// of `values` (V reals: the values, or the 0/1 labels), and its loss is the mean over the V columns
// of (z - y)^2, or of max(z, 0) - z y + log(1 + exp(-|z|)).
enum class HeadLoss { kCrossEntropy, kMeanSquared, kBinaryCrossEntropy };

struct LmHeadArgs {
  const void* x = nullptr;  // (N, C) compute dtype: final-norm output
  const void* w = nullptr;  // (V, C) compute dtype: logits = x w^T
  DType dtype = DType::kF32;
  const int32_t* targets = nullptr;  // (N), -100 = ignored
  int N = 0, C = 0, V = 0;
  float grad_scale = 0.0f;  // 0: loss only; else dloss is scaled by it (1/count * loss scale)
  float* dx = nullptr;      // (N, C) f32 =   (when grad_scale != 0)
  float* dw = nullptr;      // (V, C) f32 +=  (when grad_scale != 0)
  float* losses = nullptr;  // (N) f32 = per-row loss (0 for ignored rows)
  int tile_rows = 0;        // 0: equal tiles of f32 logits of at most 64 MiB each
  HeadLoss loss = HeadLoss::kCrossEntropy;
  const float* values = nullptr;  // (value_rows, V): kMeanSquared / kBinaryCrossEntropy's targets
  int64_t value_rows = 0;
  // Vocabulary-parallel (Megatron's vocab_parallel_cross_entropy): w holds rows [v0, v0 + V) of the
  // padded vocabulary, of which the first `valid` are real words (-1: all); padding columns are
  // never counted. Per tile, reduce_max and then reduce_sum combine per-row values over the
  // tensor-parallel group (the row max; the sum of exponentials and the target's logit), so every
  // rank gets the whole loss; dx is then this shard's partial sum, which the caller all-reduces.
  int v0 = 0, valid = -1;
  std::function<void(float*, size_t)> reduce_max, reduce_sum;
};

// The rows of lm_head_cross_entropy's tiles of N rows over V vocabulary rows (tile_rows 0: the default).
int lm_head_tile_rows(int N, int V, int tile_rows = 0);

// The row stride, in elements, of the tile's dlogits as the two GEMMs that read them see it: V
// rounded up to whole 64-byte lines of the compute dtype (the f32 logits themselves in f32, a bf16
// copy in bf16), one line more where that is a multiple of 256 bytes. From rows of an odd length (GPT-2's 50257) oneDNN ran dW += dlogits^T X at about
// half its rate in bf16 and both dX = dlogits W and dW at 65-80 % in f32 (PERF (dd)). f16: V (where
// oneDNN has no f16 matmul, as here, the head's dlogits are its f32 logits rounded in place:
// lm_head_widened).
int lm_head_operand_ld(int V, DType dtype);
// The row stride of the tile's f32 logits: lm_head_operand_ld in f32 (dlogits in place), V in low
// precision (the logits GEMM runs slower into a padded stride).
int lm_head_logits_ld(int V, DType dtype);

// Whether lm_head_cross_entropy runs its GEMMs in f32 on widened copies: f16 where oneDNN has no
// f16 matmul (no AVX512-FP16). It then holds the weight in f32 (V, C) (WorkSlot::kLmHeadWeight) and
// a tile's rows in f32 (R, C) (kLmHeadOperand, which holds no dlogits copy: dlogits are the logits
// rounded in place), and kernels::gemm widens nothing of the head's.
bool lm_head_widened(DType dtype);

// Returns the sum of the per-row losses.
double lm_head_cross_entropy(const LmHeadArgs& args, Workspace& ws);

// Full logits (N, V) f32 = x w^T (for evaluation and generation).
void lm_head_logits(float* logits, const void* x, const void* w, DType dtype, int N, int C, int V);

}  // namespace mt::nn
