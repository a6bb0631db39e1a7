#include "optim/adamw.h"

#include <cmath>
#include <utility>

#include "kernels/cpu/ops.h"

namespace mt::optim {

AdamW::AdamW(size_t numel, const AdamWConfig& config)
    : AdamW(numel, single_segment(numel, config.weight_decay), config) {}

AdamW::AdamW(size_t numel, std::vector<ParamSegment> segments, const AdamWConfig& config)
    : Optimizer(numel, std::move(segments)),
      config_(config),
      runs_(decay_runs(segments_)),
      m_(numel * 4, MemCategory::kOptimizer),
      v_(numel * 4, MemCategory::kOptimizer) {}

void AdamW::step(float* master, const float* grad, void* lowp, DType lowp_dtype, float lr,
                 float grad_scale) {
  ++step_;
  kernels::AdamWParams p = adamw_step_params(config_, lr, step_, grad_scale);
  const size_t esz = dtype_size(lowp_dtype);
  for (const DecayRun& r : runs_) {
    p.weight_decay = r.weight_decay;
    void* lp = lowp ? static_cast<char*>(lowp) + r.offset * esz : nullptr;
    kernels::adamw_update(master + r.offset, grad + r.offset, m_.as<float>() + r.offset,
                          v_.as<float>() + r.offset, lp, lowp_dtype, r.numel, p);
  }
}

kernels::AdamWParams adamw_step_params(const AdamWConfig& config, float lr, int64_t step, float grad_scale) {
  kernels::AdamWParams p;
  p.lr = lr;
  p.beta1 = config.beta1;
  p.beta2 = config.beta2;
  p.eps = config.eps;
  p.step = step;
  p.grad_scale = grad_scale;
  p.bias_correction = config.bias_correction;
  p.l2 = config.l2;
  return p;
}

void AdamW::set_momentum(double momentum) { config_.beta1 = static_cast<float>(momentum); }

void AdamW::set_betas(double beta1, double beta2) {
  config_.beta1 = static_cast<float>(beta1);
  config_.beta2 = static_cast<float>(beta2);
}

std::vector<StateBuffer> AdamW::state() const {
  return {{"exp_avg", m_.as<float>(), numel_}, {"exp_avg_sq", v_.as<float>(), numel_}};
}

double grad_norm(const float* grad, size_t numel) {
  return std::sqrt(kernels::sum_squares(grad, numel));
}

}  // namespace mt::optim
