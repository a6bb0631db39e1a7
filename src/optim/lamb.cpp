#include "optim/lamb.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/cpu/ops.h"

namespace mt::optim {
namespace {

constexpr size_t kChunk = size_t{1} << 14;  // elements per task

}  // namespace

Lamb::Lamb(size_t numel, std::vector<ParamSegment> segments, const LambConfig& config)
    : Optimizer(numel, std::move(segments)),
      config_(config),
      coeffs_(segments_.size(), 1.0f),
      m_(numel * 4, MemCategory::kOptimizer),
      v_(numel * 4, MemCategory::kOptimizer) {
  for (size_t s = 0; s < segments_.size(); ++s)
    for (size_t i = 0; i < segments_[s].numel; i += kChunk)
      chunks_.push_back({s, segments_[s].offset + i, std::min(kChunk, segments_[s].numel - i)});
  w_part_.resize(chunks_.size());
  u_part_.resize(chunks_.size());
}

void Lamb::step(float* master, const float* grad, void* lowp, DType lowp_dtype, float lr,
                float grad_scale) {
  ++step_;
  float s = grad_scale;
  if (config_.max_grad_norm > 0.0) {
    const double norm = std::sqrt(kernels::sum_squares(grad, numel_)) * std::fabs(static_cast<double>(grad_scale));
    const double clip = (norm + 1e-6) / config_.max_grad_norm;
    if (clip > 1.0) s = static_cast<float>(grad_scale / clip);
  }
  // DeepSpeed's kernel (deepspeedai/DeepSpeed csrc/lamb/fused_lamb_cuda_kernel.cu) divides m and v
  // by their bias corrections, so the trust ratio is taken of the corrected update and the step is
  // lr; microsoft/DeepSpeed's older one folded sqrt(bc2) / bc1 into the step size, which meshtrain
  // followed until stop 74 (4.5 % off at step 1, a probe). In f32, as fused_lamb_cuda computes them.
  const float step_size = lr;
  kernels::LambScalars ks;
  if (config_.bias_correction) {
    const float b1 = static_cast<float>(config_.beta1), b2 = static_cast<float>(config_.beta2);
    ks.bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), static_cast<double>(step_)));
    ks.bias_correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), static_cast<double>(step_)));
  }
  ks.grad_scale = s;
  ks.beta1 = static_cast<float>(config_.beta1);
  ks.beta2 = static_cast<float>(config_.beta2);
  ks.eps = static_cast<float>(config_.eps);
  ks.eps_inside_sqrt = config_.eps_inside_sqrt;
  float* m = m_.as<float>();
  float* v = v_.as<float>();
  const int64_t nchunks = static_cast<int64_t>(chunks_.size());

  // Pass 1: moments, and the per-chunk sums of p^2 and u^2.
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (int64_t c = 0; c < nchunks; ++c) {
    const Chunk& ch = chunks_[static_cast<size_t>(c)];
    kernels::LambScalars cs = ks;
    cs.weight_decay = segments_[ch.segment].weight_decay;
    const kernels::LambSums sums = kernels::lamb_moments(m + ch.offset, v + ch.offset, grad + ch.offset,
                                                         master + ch.offset, ch.numel, cs);
    w_part_[static_cast<size_t>(c)] = sums.w;
    u_part_[static_cast<size_t>(c)] = sums.u;
  }

  // The trust ratio of each segment, its chunks summed in order (independent of thread count).
  std::vector<double> wseg(segments_.size(), 0.0), useg(segments_.size(), 0.0);
  for (size_t c = 0; c < chunks_.size(); ++c) {
    wseg[chunks_[c].segment] += w_part_[c];
    useg[chunks_[c].segment] += u_part_[c];
  }
  if (segment_sums_) segment_sums_(wseg, useg);
  const float max_coeff = static_cast<float>(config_.max_coeff);
  const float min_coeff = static_cast<float>(config_.min_coeff);
  for (size_t k = 0; k < segments_.size(); ++k) {
    const float w_norm = static_cast<float>(std::sqrt(wseg[k]));
    const float u_norm = static_cast<float>(std::sqrt(useg[k]));
    float coeff = 1.0f;
    if (w_norm != 0.0f && u_norm != 0.0f) {
      coeff = w_norm / u_norm;
      if (coeff > max_coeff) coeff = max_coeff;
      if (coeff < min_coeff) coeff = min_coeff;
    }
    coeffs_[k] = coeff;
  }

  // Pass 2: the update (and the compute-dtype copy, each chunk as it is updated).
  const size_t esz = dtype_size(lowp_dtype);
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (int64_t c = 0; c < nchunks; ++c) {
    const Chunk& ch = chunks_[static_cast<size_t>(c)];
    kernels::LambScalars cs = ks;
    cs.weight_decay = segments_[ch.segment].weight_decay;
    kernels::lamb_apply(master + ch.offset, m + ch.offset, v + ch.offset,
                        lowp != nullptr ? static_cast<char*>(lowp) + ch.offset * esz : nullptr, lowp_dtype, ch.numel,
                        step_size * coeffs_[ch.segment], cs);
  }
}

void Lamb::set_momentum(double momentum) { config_.beta1 = momentum; }

void Lamb::set_betas(double beta1, double beta2) {
  config_.beta1 = beta1;
  config_.beta2 = beta2;
}

std::vector<StateBuffer> Lamb::state() const {
  return {{"exp_avg", m_.as<float>(), numel_}, {"exp_avg_sq", v_.as<float>(), numel_}};
}

}  // namespace mt::optim
