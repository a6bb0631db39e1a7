// LAMB exactly as DeepSpeed's FusedLamb (You et al. 2019, arXiv:1904.00962), read from
// deepspeed/ops/lamb/fused_lamb.py and csrc/lamb/fused_lamb_cuda_kernel.cu (deepspeedai/DeepSpeed,
// commit e5d277f). Per segment (one parameter tensor, a DeepSpeed param), in f32, with t the step
// (1-based), wd the segment's weight decay and g = grad * s:
//   m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
//   m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t)   (bias_correction; else m_hat = m, v_hat = v)
//   denom = sqrt(v_hat) + eps          (eps_inside_sqrt: sqrt(v_hat + eps))
//   u = m_hat / denom + wd * p         (L2-style decay inside the update, p before this step)
//   w_norm = ||p||_2, u_norm = ||u||_2 over the segment
//   coeff = 1 if w_norm == 0 or u_norm == 0 (e.g. zero-initialised biases on step 1), else
//           w_norm / u_norm, then min(., max_coeff), then max(., min_coeff)   (in that order)
//   p = p - lr * coeff * u
// microsoft/DeepSpeed's older kernel (0c1913d6), which meshtrain followed until stop 74, left m and
// v uncorrected and took step_size = lr sqrt(1 - b2^t) / (1 - b1^t): the trust ratio, taken of the
// uncorrected update, then scaled the whole update by the correction (4.5 % off at step 1).
// lamb_coeffs() returns each segment's coeff of the last step (get_lamb_coeffs()).
//
// Gradient scale s. FusedLamb divides the gradients by a combined scale: the caller's `scale`
// (the loss scale) times clip = (grad_norm / scale + 1e-6) / max_grad_norm when max_grad_norm > 0
// and clip > 1. Here s = grad_scale, and with max_grad_norm > 0 the norm is the global L2 norm of
// grad * grad_scale over the whole span: clip = (norm + 1e-6) / max_grad_norm, s = grad_scale / clip
// when clip > 1. NOTE: DeepSpeed only takes that path when the caller passes grad_norms, which its
// engine never does (FP16_UnfusedOptimizer passes scale=loss_scale*clip from `gradient_clipping`;
// the fp32 path calls step() bare), so a ds_config with optimizer.params.max_grad_norm > 0 for Lamb
// fails in DeepSpeed with a TypeError (None / float); its clipping is `gradient_clipping`, which
// reaches this optimizer through grad_scale.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "optim/optimizer.h"
#include "tensor/allocator.h"
#include "tensor/dtype.h"

namespace mt::optim {

// FusedLamb's arguments and defaults.
struct LambConfig {
  double lr = 1e-3;
  bool bias_correction = true;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  bool eps_inside_sqrt = false;
  double weight_decay = 0.0;  // reported only; each segment carries its own
  double max_grad_norm = 0.0;
  double max_coeff = 10.0;
  double min_coeff = 0.01;
};

class Lamb : public Optimizer {
 public:
  // The trust ratio is taken per segment: pass one segment per parameter tensor.
  Lamb(size_t numel, std::vector<ParamSegment> segments, const LambConfig& config);

  const char* type_name() const override { return "Lamb"; }
  void step(float* master, const float* grad, void* lowp, DType lowp_dtype, float lr,
            float grad_scale = 1.0f) override;
  void set_momentum(double momentum) override;  // beta1
  bool has_betas() const override { return true; }
  void set_betas(double beta1, double beta2) override;
  std::vector<StateBuffer> state() const override;  // "exp_avg", "exp_avg_sq"
  const LambConfig& config() const { return config_; }
  // Per segment: the trust ratio (lamb coefficient) used by the last step.
  const std::vector<float>& lamb_coeffs() const { return coeffs_; }
  // Called with each segment's sums of p^2 and u^2 before the trust ratios are taken: where a
  // segment is this rank's piece of a tensor split over tensor-parallel ranks, the engine makes them
  // the whole tensor's (the ratio of a piece is another update than one process's: stop 73).
  using SegmentSums = std::function<void(std::vector<double>& w, std::vector<double>& u)>;
  void set_segment_sums(SegmentSums f) { segment_sums_ = std::move(f); }

 private:
  // A piece of one segment: one task of the parallel loops.
  struct Chunk {
    size_t segment, offset, numel;
  };

  LambConfig config_;
  std::vector<Chunk> chunks_;
  std::vector<double> w_part_, u_part_;  // per chunk: sum p^2, sum u^2 (summed in chunk order)
  std::vector<float> coeffs_;            // per segment
  SegmentSums segment_sums_;
  Buffer m_, v_;
};

}  // namespace mt::optim
