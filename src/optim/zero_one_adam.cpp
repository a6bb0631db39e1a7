// ZeroOneAdam: see zero_one_adam.h.
#include "optim/zero_one_adam.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "base/error.h"
#include "kernels/cpu/ops.h"

namespace mt::optim {

bool ZeroOnePolicy::frozen_at(int64_t t) const { return t > std::max<int64_t>(config_.var_freeze_step, 1); }

ZeroOnePolicy::Kind ZeroOnePolicy::kind(int64_t t) const {
  const int64_t s = t + 1;  // DeepSpeed's state step
  if (frozen_at(t)) return s % local_interval_ == 0 ? Kind::kSync : Kind::kLocal;
  return s % var_interval_ == 0 ? Kind::kVariance : Kind::kCompressedGradient;
}

void ZeroOnePolicy::advance(int64_t t) {
  const int64_t s = t + 1;
  if (!frozen_at(t)) {
    if (s % var_interval_ == 0 && ++var_counter_ == config_.var_update_scaler) {
      var_counter_ = 0;
      var_interval_ *= 2;
    }
  } else if (++local_counter_ == config_.local_step_scaler) {
    local_counter_ = 0;
    // min(clipper, 2 x interval), without doubling past int64 (a clipper above 2^62).
    local_interval_ = local_interval_ > config_.local_step_clipper / 2 ? config_.local_step_clipper : local_interval_ * 2;
  }
}

void ZeroOnePolicy::restore(int64_t t) {
  var_interval_ = local_interval_ = 1;
  var_counter_ = local_counter_ = 0;
  for (int64_t k = 1; k <= t; ++k) advance(k);
}

ZeroOneAdamConfig zero_one_checked(ZeroOneAdamConfig c) {
  MT_CHECK(c.var_freeze_step >= 0, ErrorKind::kInvalidArgument, "optimizer.params.var_freeze_step: must be >= 0");
  // 0 is DeepSpeed's too: its counter (incremented first) never equals it, so the interval stays 1.
  MT_CHECK(c.var_update_scaler >= 0, ErrorKind::kInvalidArgument, "optimizer.params.var_update_scaler: must be >= 0");
  MT_CHECK(c.local_step_scaler >= 0, ErrorKind::kInvalidArgument, "optimizer.params.local_step_scaler: must be >= 0");
  MT_CHECK(c.local_step_clipper >= 1, ErrorKind::kInvalidArgument, "optimizer.params.local_step_clipper: must be >= 1");
  c.adam.bias_correction = false;
  return c;
}

ZeroOneAdam::ZeroOneAdam(size_t numel, std::vector<ParamSegment> segments, const ZeroOneAdamConfig& config)
    : Optimizer(numel, segments),
      config_(zero_one_checked(config)),
      adam_(numel, std::move(segments), config_.adam),
      runs_(decay_runs(segments_)),
      u_(numel * 4, MemCategory::kOptimizer),
      policy_(config_) {
  std::fill_n(u_.as<float>(), numel, 0.0f);
}

bool ZeroOneAdam::wants_local_gradients() const {
  return policy_.kind(step_ + 1) != ZeroOnePolicy::Kind::kVariance;
}

void ZeroOneAdam::step(float* master, const float* grad, void* lowp, DType lowp_dtype, float lr, float grad_scale) {
  const int64_t t = ++step_;
  switch (policy_.kind(t)) {
    case ZeroOnePolicy::Kind::kVariance:
      adam_.step(master, grad, lowp, lowp_dtype, lr, grad_scale);
      lowp = nullptr;  // written by the kernel
      break;
    case ZeroOnePolicy::Kind::kCompressedGradient:
      phase1_step(master, grad, lr, grad_scale);
      break;
    case ZeroOnePolicy::Kind::kLocal:
    case ZeroOnePolicy::Kind::kSync:
      phase2_step(master, grad, lr, grad_scale, policy_.kind(t) == ZeroOnePolicy::Kind::kSync);
      break;
  }
  // The last update of phase 1: the errors held compressed gradients (DeepSpeed zeroes them).
  if (!policy_.frozen_at(t) && policy_.frozen_at(t + 1) && exchange_) exchange_->reset_errors();
  policy_.advance(t);
  if (lowp) convert(lowp, lowp_dtype, master, DType::kF32, numel_);
}

void ZeroOneAdam::phase1_step(float* master, const float* grad, float lr, float grad_scale) {
  float* m = adam_.exp_avg();
  const float* v = adam_.exp_avg_sq();
  float* avg = u_.as<float>();  // zero in phase 1: scratch for the averaged gradient
  const size_t n = numel_;
#pragma omp parallel for simd schedule(static) if (parallel: n > kParallelElements)
  for (size_t i = 0; i < n; ++i) avg[i] = grad[i] * grad_scale;
  if (exchange_) exchange_->average(avg, numel_);
  const float b1 = adam_.config().beta1, omb1 = static_cast<float>(1.0 - static_cast<double>(b1));
#pragma omp parallel for simd schedule(static) if (parallel: n > kParallelElements)
  for (size_t i = 0; i < n; ++i) {
    m[i] = b1 * m[i] + omb1 * avg[i];
    avg[i] = 0.0f;
  }
  kernels::AdamWParams p;
  p.lr = lr;
  p.beta1 = b1;
  p.beta2 = adam_.config().beta2;
  p.eps = adam_.config().eps;
  p.step = int64_t{1} << 40;  // no bias correction
  for (const DecayRun& r : runs_) {
    p.weight_decay = r.weight_decay;
    const kernels::AdamWScalars s = kernels::adamw_scalars(p);
    float* w = master + r.offset;
    const size_t rn = r.numel;
#pragma omp parallel for simd schedule(static) if (parallel: rn > kParallelElements)
    for (size_t i = 0; i < rn; ++i) {
      const size_t k = r.offset + i;
      w[i] = w[i] * s.decay - s.step_size * m[k] / (std::sqrt(v[k]) / s.bc2_sqrt + s.eps);
    }
  }
}

void ZeroOneAdam::phase2_step(float* master, const float* grad, float lr, float grad_scale, bool sync) {
  float* m = adam_.exp_avg();
  const float* v = adam_.exp_avg_sq();
  float* u = u_.as<float>();
  const float b1 = adam_.config().beta1, omb1 = static_cast<float>(1.0 - static_cast<double>(b1));
  const float eps = adam_.config().eps;
  const size_t n = numel_;
#pragma omp parallel for simd schedule(static) if (parallel: n > kParallelElements)
  for (size_t i = 0; i < n; ++i) m[i] = b1 * m[i] + omb1 * (grad[i] * grad_scale);
  lrs_[0] += static_cast<double>(lr);
  for (const DecayRun& r : runs_) {
    const float wd = r.weight_decay;
    const size_t r0 = r.offset, r1 = r.offset + r.numel;
#pragma omp parallel for simd schedule(static) if (parallel: r.numel > kParallelElements)
    for (size_t i = r0; i < r1; ++i) {
      float step = m[i] / (std::sqrt(v[i]) + eps);
      if (wd > 0.0f) step += wd * master[i];
      const float d = lr * step;
      master[i] -= d;
      u[i] -= d;
    }
  }
  if (!sync) return;
#pragma omp parallel for simd schedule(static) if (parallel: n > kParallelElements)
  for (size_t i = 0; i < n; ++i) {
    master[i] += -u[i];
    u[i] *= std::sqrt(v[i]) + eps;
  }
  if (exchange_) exchange_->average(u, numel_);
  const float lrs = static_cast<float>(lrs_[0]);
#pragma omp parallel for simd schedule(static) if (parallel: n > kParallelElements)
  for (size_t i = 0; i < n; ++i) {
    m[i] = -(u[i] / lrs);
    master[i] += u[i] / (std::sqrt(v[i]) + eps);
    u[i] = 0.0f;
  }
  lrs_[0] = 0.0;
}

void ZeroOneAdam::set_step_count(int64_t step) {
  step_ = step;
  adam_.set_step_count(step);
  policy_.restore(step);
}

std::vector<StateBuffer> ZeroOneAdam::state() const {
  return {{"exp_avg", adam_.exp_avg(), numel_}, {"exp_avg_sq", adam_.exp_avg_sq(), numel_},
          {"momentum_accumulator", u_.as<float>(), numel_}};
}

std::vector<StateBuffer> ZeroOneAdam::rank_local_state() const {
  return {{"exp_avg", adam_.exp_avg(), numel_}, {"momentum_accumulator", u_.as<float>(), numel_}};
}

std::vector<ScalarState> ZeroOneAdam::scalar_state() { return {{"lrs", &lrs_}}; }

}  // namespace mt::optim
