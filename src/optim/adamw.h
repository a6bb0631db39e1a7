// AdamW over one flat span of parameters (decoupled weight decay; PyTorch's torch.optim.AdamW):
// the moments are two flat f32 buffers (category optimizer) and one fused kernel call updates the
// f32 master weights, the moments and the low-precision compute copy in a single pass.
// Weight decay may differ per parameter segment (torch's param groups): each maximal run of
// segments with equal decay is one kernel call, so equal decay everywhere stays one call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/ops.h"
#include "optim/optimizer.h"
#include "tensor/allocator.h"
#include "tensor/dtype.h"

namespace mt::optim {

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  bool bias_correction = true;  // DeepSpeed's Adam/AdamW params.bias_correction
  bool l2 = false;  // Adam's L2 decay (adam_w_mode false, torch.optim.Adam): kernels::AdamWParams::l2
};

class AdamW : public Optimizer {
 public:
  // One segment over [0, numel) with config.weight_decay.
  AdamW(size_t numel, const AdamWConfig& config);
  // Per-segment weight decay (config.weight_decay is not used). Throws kInvalidArgument unless
  // segments cover [0, numel) in order.
  AdamW(size_t numel, std::vector<ParamSegment> segments, const AdamWConfig& config);

  const char* type_name() const override { return "AdamW"; }
  // One step. grad_scale multiplies the gradients first (1/loss_scale, clipping coefficient).
  // lowp (nullable) receives the updated weights in lowp_dtype.
  void step(float* master, const float* grad, void* lowp, DType lowp_dtype, float lr,
            float grad_scale = 1.0f) override;
  int64_t step_count() const override { return step_; }
  void set_step_count(int64_t step) override { step_ = step; }  // when restoring a checkpoint
  void set_momentum(double momentum) override;  // beta1
  bool has_betas() const override { return true; }
  void set_betas(double beta1, double beta2) override;
  std::vector<StateBuffer> state() const override;  // "exp_avg", "exp_avg_sq"
  const AdamWConfig& config() const { return config_; }
  float* exp_avg() const { return m_.as<float>(); }
  float* exp_avg_sq() const { return v_.as<float>(); }

 private:
  AdamWConfig config_;
  std::vector<DecayRun> runs_;
  Buffer m_, v_;
};

// The fused kernel's parameters for step `step` of `config` (the caller sets weight_decay per run).
kernels::AdamWParams adamw_step_params(const AdamWConfig& config, float lr, int64_t step, float grad_scale);

// Global L2 norm of a flat gradient span; non-finite when any element is (the overflow check).
double grad_norm(const float* grad, size_t numel);

}  // namespace mt::optim
