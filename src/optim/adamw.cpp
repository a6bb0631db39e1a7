#include "optim/adamw.h"

#include <cmath>

#include "kernels/cpu/ops.h"

namespace mt::optim {

AdamW::AdamW(size_t numel, const AdamWConfig& config)
    : numel_(numel),
      config_(config),
      m_(numel * 4, MemCategory::kOptimizer),
      v_(numel * 4, MemCategory::kOptimizer) {}

void AdamW::step(float* master, const float* grad, void* lowp, DType lowp_dtype, float lr,
                 float grad_scale) {
  ++step_;
  kernels::AdamWParams p;
  p.lr = lr;
  p.beta1 = config_.beta1;
  p.beta2 = config_.beta2;
  p.eps = config_.eps;
  p.weight_decay = config_.weight_decay;
  p.step = step_;
  p.grad_scale = grad_scale;
  kernels::adamw_update(master, grad, m_.as<float>(), v_.as<float>(), lowp, lowp_dtype, numel_, p);
}

double grad_norm(const float* grad, size_t numel) {
  return std::sqrt(kernels::sum_squares(grad, numel));
}

}  // namespace mt::optim
