#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace mt::optim {

bool lr_warmup_type_is_log(const std::string& type, const std::string& where) {
  if (type == "log") return true;
  if (type == "linear") return false;
  throw Error(ErrorKind::kInvalidArgument, where + ": warmup_type must be \"log\" or \"linear\", not \"" + type + "\"");
}

namespace {
// Warm-up fraction in [0, 1) for i < W, as DeepSpeed computes it.
double warmup_gamma(const LrScheduleConfig& c, int64_t i, int64_t W) {
  if (c.warmup_log) return std::log(static_cast<double>(i + 1)) / std::log(static_cast<double>(W));
  return static_cast<double>(i) / static_cast<double>(W);
}
}  // namespace

double lr_at_iteration(const LrScheduleConfig& c, int64_t i) {
  const int64_t W = std::max<int64_t>(2, c.warmup_num_steps);
  switch (c.type) {
    case LrScheduleType::kConstant: return c.base_lr;
    case LrScheduleType::kWarmupLR:
    case LrScheduleType::kWarmupDecayLR: {
      if (i < 0) return c.warmup_min_lr;
      double gamma;
      if (i < W) {
        gamma = warmup_gamma(c, i, W);
      } else if (c.type == LrScheduleType::kWarmupLR) {
        gamma = 1.0;
      } else {
        gamma = std::max(0.0, static_cast<double>(c.total_num_steps - i) /
                                  std::max<double>(1.0, static_cast<double>(c.total_num_steps - W)));
      }
      return c.warmup_min_lr + (c.warmup_max_lr - c.warmup_min_lr) * gamma;
    }
    case LrScheduleType::kWarmupCosineLR: {
      if (i < 0) return 0.0;
      double ratio;
      if (i < W) {
        ratio = c.warmup_min_ratio + warmup_gamma(c, i, W) * (1.0 - c.warmup_min_ratio);
      } else {
        double real_last = static_cast<double>(i - W + 1);
        double real_total = static_cast<double>(c.total_num_steps - W);
        double cosine = (1.0 + std::cos(M_PI * real_last / real_total)) / 2.0;
        ratio = std::max(0.0, c.cos_min_ratio + (1.0 - c.cos_min_ratio) * cosine);
      }
      return c.base_lr * ratio;
    }
  }
  return c.base_lr;
}

}  // namespace mt::optim
