#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"

namespace mt::optim {

LossScaler::LossScaler(const LossScalerConfig& config) : config_(config) {
  state_.scale = config.dynamic ? std::ldexp(1.0, config.initial_scale_power) : config.static_scale;
  state_.hysteresis_left = config.hysteresis;
}

void LossScaler::update(bool overflow) {
  if (!config_.dynamic) return;
  LossScalerState& s = state_;
  if (overflow) {
    if (config_.hysteresis == 1 || s.hysteresis_left == 1 || !config_.honour_hysteresis) {
      if (s.scale == config_.min_scale && config_.raise_error_at_min_scale) {
        throw Error(ErrorKind::kNumerical,
                    "fp16 loss scale already at its minimum (" + std::to_string(config_.min_scale) +
                        ") and the gradients still overflow; cannot decrease the scale further");
      }
      s.scale = std::max(s.scale / 2.0, config_.min_scale);
    } else {
      s.hysteresis_left -= 1;
    }
    s.last_overflow_iter = s.iter;
  } else {
    if (config_.consecutive_hysteresis) s.hysteresis_left = config_.hysteresis;
    const int64_t stable = s.iter - s.last_overflow_iter - 1;
    if (stable > 0 && stable % config_.scale_window == 0) {
      s.hysteresis_left = config_.hysteresis;
      s.scale *= 2.0;
    }
  }
  s.iter += 1;
}

}  // namespace mt::optim
