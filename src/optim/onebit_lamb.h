// OneBitLamb: 1-bit LAMB (Li et al. 2021, arXiv:2104.06069; DeepSpeed's OnebitLamb, read from
// deepspeed/runtime/fp16/onebit/lamb.py) over one flat span, one LAMB coefficient per segment (a
// DeepSpeed param). Step numbers: DeepSpeed's first step() only allocates, so its state step s of
// our update t is s = t + 1: updates t < max(freeze_step, 2) are the warm-up (DeepSpeed's steps
// s = 2..freeze_step), later ones compressed. No bias correction (DeepSpeed's OnebitLamb has none). g the gradient (times grad_scale), wd the segment's weight decay.
//
// Warm-up (g all-reduced): LAMB, exactly our Lamb (optim/lamb.h) with bias_correction false:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  u = m / (sqrt(v) + eps) + wd p
//   c = ||p|| / ||u|| clipped to [min_coeff, max_coeff] (1 if a norm is 0);  p -= lr c u
//   per segment, when c != 1: c_freeze = coeff_beta c_freeze + (1 - coeff_beta) c
//   at s == freeze_step: v_fresh = v
// Compression (g the rank's own; v frozen):
//   first compressed step, per segment k: r_k = ||m_k|| / sqrt(numel_k); scaling_k = mean(r) / r_k
//   m_last = m;  m = (b1 m + (1 - b1) g) scaling;  m = avg(m) (the compressed all-reduce of the
//   whole span);  m /= scaling
//   g~ = (m - b1 m_last) / (1 - b1);  v_fresh = b2 v_fresh + (1 - b2) g~^2
//   u' = m / (sqrt(v) + eps);  u = u' + wd p
//   f = max_i (sqrt(v) + eps) / (sqrt(v_fresh) + eps);  if wd > 0: q = min(1, ||u'|| / ||u||),
//   f = f q + (1 - q);  f clipped to [factor_min, factor_max], then to
//   [last (1 - factor_threshold), last (1 + factor_threshold)];  last = f
//   p -= lr (c_freeze f) u
// NOTE: a segment whose momentum is all zero at the first compressed step gets scaling 1 (DeepSpeed
// divides by zero there).
#pragma once

#include <cstdint>
#include <vector>

#include "optim/lamb.h"
#include "optim/optimizer.h"
#include "tensor/allocator.h"

namespace mt::optim {

struct OneBitLambConfig {
  LambConfig lamb;  // lr, betas, eps, max_coeff, min_coeff (bias_correction off, no clipping)
  int64_t freeze_step = 100000;
  double coeff_beta = 0.9;
  double factor_max = 4.0, factor_min = 0.5, factor_threshold = 0.1;
};

class OneBitLamb : public Optimizer {
 public:
  OneBitLamb(size_t numel, std::vector<ParamSegment> segments, const OneBitLambConfig& config);

  const char* type_name() const override { return "OneBitLamb"; }
  void step(float* master, const float* grad, void* lowp, DType lowp_dtype, float lr,
            float grad_scale = 1.0f) override;
  void set_momentum(double momentum) override { lamb_.set_momentum(momentum); }
  bool has_betas() const override { return true; }
  void set_betas(double beta1, double beta2) override { lamb_.set_betas(beta1, beta2); }
  std::vector<StateBuffer> state() const override;  // "exp_avg", "exp_avg_sq", "exp_avg_sq_fresh"
  // Per segment: "lamb_coeff_freeze", "last_factor", "scaling_coeff".
  std::vector<ScalarState> scalar_state() override;
  // Update t is a compressed one.
  bool compressed_at(int64_t t) const { return t >= std::max<int64_t>(config_.freeze_step, 2); }
  bool wants_local_gradients() const override { return compressed_at(step_ + 1); }
  void set_exchange(StateExchange* exchange) override { exchange_ = exchange; }
  // Per segment: the coefficient the last step used (DeepSpeed's get_lamb_coeffs()).
  const std::vector<double>& lamb_coeffs() const { return coeffs_; }
  const std::vector<double>& lamb_coeff_freeze() const { return coeff_freeze_; }

 private:
  void compressed_step(float* master, const float* grad, float lr, float grad_scale);
  void segment_update(size_t k, float* master, float lr);

  OneBitLambConfig config_;
  Lamb lamb_;             // m, v and the warm-up
  Buffer v_fresh_;        // the variance kept fresh from reconstructed gradients
  Buffer m_last_;         // workspace: the momentum before this compressed step
  std::vector<double> coeff_freeze_, last_factor_, scaling_, coeffs_;
  StateExchange* exchange_ = nullptr;
};

}  // namespace mt::optim
