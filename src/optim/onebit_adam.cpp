#include "optim/onebit_adam.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/cpu/ops.h"

namespace mt::optim {
namespace {

// No bias correction: t so large that 1 - beta^t is 1 in double.
constexpr int64_t kNoBiasCorrection = int64_t{1} << 40;

}  // namespace

OneBitAdam::OneBitAdam(size_t numel, std::vector<ParamSegment> segments, const OneBitAdamConfig& config)
    : Optimizer(numel, std::move(segments)),
      config_(config),
      runs_(decay_runs(segments_)),
      m_(numel * 4, MemCategory::kOptimizer),
      v_(numel * 4, MemCategory::kOptimizer) {}

void OneBitAdam::step(float* master, const float* grad, void* lowp, DType lowp_dtype, float lr, float grad_scale) {
  if (frozen()) {
    ++step_;
    compressed_step(master, grad, lowp, lowp_dtype, lr, grad_scale);
    return;
  }
  ++step_;
  kernels::AdamWParams p;
  p.lr = lr;
  p.beta1 = config_.adam.beta1;
  p.beta2 = config_.adam.beta2;
  p.eps = config_.adam.eps;
  p.step = config_.bias_correction ? step_ : kNoBiasCorrection;
  p.grad_scale = grad_scale;
  const size_t esz = dtype_size(lowp_dtype);
  for (const DecayRun& r : runs_) {
    p.weight_decay = r.weight_decay;
    void* lp = lowp ? static_cast<char*>(lowp) + r.offset * esz : nullptr;
    kernels::adamw_update(master + r.offset, grad + r.offset, m_.as<float>() + r.offset, v_.as<float>() + r.offset,
                          lp, lowp_dtype, r.numel, p);
  }
}

void OneBitAdam::compressed_step(float* master, const float* grad, void* lowp, DType lowp_dtype, float lr,
                                 float grad_scale) {
  float* m = m_.as<float>();
  const float* v = v_.as<float>();
  const float b1 = config_.adam.beta1, omb1 = static_cast<float>(1.0 - static_cast<double>(b1));
  const size_t n = numel_;
#pragma omp parallel for simd schedule(static) if (parallel: n > kParallelElements)
  for (size_t i = 0; i < n; ++i) m[i] = b1 * m[i] + omb1 * (grad[i] * grad_scale);
  if (exchange_) exchange_->average(m, numel_);
  kernels::AdamWParams p;
  p.lr = lr;
  p.beta1 = b1;
  p.beta2 = config_.adam.beta2;
  p.eps = config_.adam.eps;
  p.step = config_.bias_correction ? step_ : kNoBiasCorrection;
  kernels::AdamWParams frozen_at = p;
  frozen_at.step = config_.bias_correction ? warmup_updates() : kNoBiasCorrection;
  const float bc2_sqrt = kernels::adamw_scalars(frozen_at).bc2_sqrt;
  for (const DecayRun& r : runs_) {
    p.weight_decay = r.weight_decay;
    const kernels::AdamWScalars s = kernels::adamw_scalars(p);
    float* w = master + r.offset;
    const float* mr = m + r.offset;
    const float* vr = v + r.offset;
    const size_t rn = r.numel;
#pragma omp parallel for simd schedule(static) if (parallel: rn > kParallelElements)
    for (size_t i = 0; i < rn; ++i) w[i] = w[i] * s.decay - s.step_size * mr[i] / (std::sqrt(vr[i]) / bc2_sqrt + s.eps);
    if (lowp) convert(static_cast<char*>(lowp) + r.offset * dtype_size(lowp_dtype), lowp_dtype, w, DType::kF32, r.numel);
  }
}

void OneBitAdam::set_betas(double beta1, double beta2) {
  config_.adam.beta1 = static_cast<float>(beta1);
  config_.adam.beta2 = static_cast<float>(beta2);
}

std::vector<StateBuffer> OneBitAdam::state() const {
  return {{"exp_avg", m_.as<float>(), numel_}, {"exp_avg_sq", v_.as<float>(), numel_}};
}

}  // namespace mt::optim
