// AdamW over one flat span of parameters (decoupled weight decay; PyTorch's torch.optim.AdamW):
// the moments are two flat f32 buffers (category optimizer) and one fused kernel call updates the
// f32 master weights, the moments and the low-precision compute copy in a single pass.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/allocator.h"
#include "tensor/dtype.h"

namespace mt::optim {

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

class AdamW {
 public:
  AdamW(size_t numel, const AdamWConfig& config);

  // One step. grad_scale multiplies the gradients first (1/loss_scale, clipping coefficient).
  // lowp (nullable) receives the updated weights in lowp_dtype.
  void step(float* master, const float* grad, void* lowp, DType lowp_dtype, float lr,
            float grad_scale = 1.0f);
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t step) { step_ = step; }  // when restoring a checkpoint
  const AdamWConfig& config() const { return config_; }
  float* exp_avg() const { return m_.as<float>(); }
  float* exp_avg_sq() const { return v_.as<float>(); }

 private:
  size_t numel_;
  AdamWConfig config_;
  Buffer m_, v_;
  int64_t step_ = 0;
};

// Global L2 norm of a flat gradient span; non-finite when any element is (the overflow check).
double grad_norm(const float* grad, size_t numel);

}  // namespace mt::optim
