// The fp16 loss scaler, with DeepSpeed's rules exactly, mapped from ds_config's fp16 block:
//   initial scale 2^initial_scale_power, scale_factor 2, scale_window = loss_scale_window,
//   delayed_shift = hysteresis, min_scale = min_loss_scale, consecutive_hysteresis.
// DeepSpeed has three scalers, told apart by two flags (ds_config sets them as its engine picks):
//   ZeRO 1-3 (loss_scaler.py, DynamicLossScaler.update_scale): hysteresis, and an error at
//   min_scale (raise_error_at_min_scale);
//   ZeRO 0 with FusedAdam, OneBitAdam or ZeroOneAdam (fused_optimizer.py, FP16_Optimizer):
//   hysteresis, and the scale held at min_scale while steps are skipped;
//   ZeRO 0 with any other optimizer (unfused_optimizer.py, FP16_UnfusedOptimizer): no hysteresis
//   (honour_hysteresis false), held at min_scale.
// A static scale (fp16.loss_scale > 0) never changes.
// update(overflow), called once per optimizer step after the overflow check:
//   overflow:  if delayed_shift == 1 or hysteresis left == 1 (or hysteresis not honoured): at
//              min_scale -> error (when raise_error_at_min_scale), else scale = max(scale / 2,
//              min_scale); otherwise hysteresis left -= 1. last_overflow_iter = iter.
//   no overflow: if consecutive_hysteresis: hysteresis left = delayed_shift.
//              stable = iter - last_overflow_iter - 1; if stable > 0 and stable % scale_window
//              == 0: hysteresis left = delayed_shift and scale *= 2 (the first raise after
//              scale_window good steps is at the next one: DeepSpeed's "stable interval").
//   iter += 1.
#pragma once

#include <cstdint>

namespace mt::optim {

struct LossScalerConfig {
  bool dynamic = true;
  double static_scale = 1.0;     // used when !dynamic
  int initial_scale_power = 16;  // DeepSpeed's default
  int64_t scale_window = 1000;
  int hysteresis = 2;
  double min_scale = 1.0;
  bool consecutive_hysteresis = false;
  bool raise_error_at_min_scale = true;
  bool honour_hysteresis = true;
};

struct LossScalerState {
  double scale = 1.0;
  int64_t iter = 0;
  int64_t last_overflow_iter = -1;
  int hysteresis_left = 1;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& config);

  double scale() const { return state_.scale; }
  bool dynamic() const { return config_.dynamic; }
  // Applies DeepSpeed's rule for one step. Throws kNumerical ("loss scale already at minimum")
  // where DeepSpeed raises.
  void update(bool overflow);
  const LossScalerState& state() const { return state_; }
  void set_state(const LossScalerState& state) { state_ = state; }

 private:
  LossScalerConfig config_;
  LossScalerState state_;
};

}  // namespace mt::optim
