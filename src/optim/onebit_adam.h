// OneBitAdam: 1-bit Adam (Tang et al. 2021, arXiv:2102.02888; DeepSpeed's OnebitAdam) over one flat
// span. Two stages:
//   warm-up, updates 1..W with W = max(freeze_step, 2) - 1: Adam on the averaged gradients
//     (exactly AdamW's kernel: the gradient sync all-reduces them as for any optimizer). DeepSpeed's
//     first step() only allocates and it freezes once its step count reaches freeze_step, so its
//     warm-up is these W updates (its calls 2..max(freeze_step, 2)): our update t is its call t + 1;
//   compression, later updates: the variance v is frozen after update W; each rank updates the
//     momentum with its own gradient, m = beta1 m + (1 - beta1) g_local, and the momentum is
//     averaged over the data-parallel ranks by the StateExchange (a 1-bit compressed all-reduce
//     with error feedback, comm/onebit.h); then
//       p = p (1 - lr wd) - lr / bc1(t) · m / (sqrt(v) / sqrt(bc2(W)) + eps)
//     with bc(t) = 1 - beta^t (1 when bias_correction is false).
// NOTE: DeepSpeed's OnebitAdam takes bias_correction (default true) but never applies it: its update
// is m / (sqrt(v) + eps). We apply it when true so that the warm-up is AdamW exactly;
// bias_correction false gives DeepSpeed's arithmetic. DeepSpeed's first step() only sets up its
// buffers (no update); here every step updates (so every update is one step earlier).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "optim/adamw.h"
#include "optim/optimizer.h"
#include "tensor/allocator.h"

namespace mt::optim {

struct OneBitAdamConfig {
  AdamWConfig adam;
  int64_t freeze_step = 100000;
  bool bias_correction = true;
};

class OneBitAdam : public Optimizer {
 public:
  OneBitAdam(size_t numel, std::vector<ParamSegment> segments, const OneBitAdamConfig& config);

  const char* type_name() const override { return "OneBitAdam"; }
  void step(float* master, const float* grad, void* lowp, DType lowp_dtype, float lr,
            float grad_scale = 1.0f) override;
  void set_momentum(double momentum) override { config_.adam.beta1 = static_cast<float>(momentum); }
  bool has_betas() const override { return true; }
  void set_betas(double beta1, double beta2) override;
  std::vector<StateBuffer> state() const override;  // "exp_avg", "exp_avg_sq"
  // Updates of full-precision Adam before the freeze: max(freeze_step, 2) - 1, as DeepSpeed.
  int64_t warmup_updates() const { return std::max<int64_t>(config_.freeze_step, 2) - 1; }
  // After the warm-up (the frozen state follows from step_count(), saved in checkpoints).
  bool frozen() const { return step_ >= warmup_updates(); }
  bool wants_local_gradients() const override { return frozen(); }
  void set_exchange(StateExchange* exchange) override { exchange_ = exchange; }
  const OneBitAdamConfig& config() const { return config_; }

 private:
  void compressed_step(float* master, const float* grad, void* lowp, DType lowp_dtype, float lr, float grad_scale);

  OneBitAdamConfig config_;
  std::vector<DecayRun> runs_;
  Buffer m_, v_;
  StateExchange* exchange_ = nullptr;
};

}  // namespace mt::optim
