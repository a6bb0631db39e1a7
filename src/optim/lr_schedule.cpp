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

void lr_schedule_check(const LrScheduleConfig& c) {
  if (c.type == LrScheduleType::kLRRangeTest)
    MT_CHECK(c.lr_range_test_step_size > 0, ErrorKind::kInvalidArgument,
             "scheduler.params.lr_range_test_step_size must be positive, not " + std::to_string(c.lr_range_test_step_size));
  if (c.type != LrScheduleType::kOneCycle) return;
  MT_CHECK(c.cycle_first_step_size > 0, ErrorKind::kInvalidArgument,
           "scheduler.params.cycle_first_step_size must be positive, not " + std::to_string(c.cycle_first_step_size));
  MT_CHECK(c.cycle_second_step_size >= -1, ErrorKind::kInvalidArgument,
           "scheduler.params.cycle_second_step_size must be >= 0 (or absent), not " +
               std::to_string(c.cycle_second_step_size));
  MT_CHECK(c.decay_step_size >= 0, ErrorKind::kInvalidArgument,
           "scheduler.params.decay_step_size must be >= 0, not " + std::to_string(c.decay_step_size));
}

namespace {
// OneCycle's cycle length S = F1 + F2 (DeepSpeed's total_size, a float).
double one_cycle_total(const LrScheduleConfig& c) {
  const double first = static_cast<double>(c.cycle_first_step_size);
  const double second = c.cycle_second_step_size < 0 ? first : static_cast<double>(c.cycle_second_step_size);
  return first + second;
}

// OneCycle's _get_scale_factor at iteration i (in the cycle).
double one_cycle_scale(const LrScheduleConfig& c, int64_t i) {
  const double total = one_cycle_total(c);
  const double step_ratio = static_cast<double>(c.cycle_first_step_size) / total;
  const double b = static_cast<double>(i + 1);
  const double cycle = std::floor(1.0 + b / total);
  const double x = 1.0 + b / total - cycle;
  const bool rising = x <= step_ratio;
  const int64_t stairs = rising ? c.cycle_first_stair_count
                                : (c.cycle_second_stair_count < 0 ? c.cycle_first_stair_count : c.cycle_second_stair_count);
  if (stairs > 0) {
    // The staircase: f held flat over each of `stairs` parts of the half cycle, quantised from the
    // integer batch offset in the cycle (not from f, whose float can land just under a stair).
    const double first = static_cast<double>(c.cycle_first_step_size), second = total - first;
    const double in_cycle = std::fmod(b, total);
    const double position = in_cycle <= first ? in_cycle * static_cast<double>(stairs) / first
                                              : (total - in_cycle) * static_cast<double>(stairs) / second;
    return std::floor(position) / static_cast<double>(stairs);
  }
  return rising ? x / step_ratio : (x - 1.0) / (step_ratio - 1.0);
}

// OneCycle's decay_interval after the cycle (i >= S); 0 when there is no decay.
double one_cycle_decay_interval(const LrScheduleConfig& c, int64_t i) {
  return (static_cast<double>(i) - one_cycle_total(c) + 1.0) / static_cast<double>(c.decay_step_size);
}

double one_cycle_lr(const LrScheduleConfig& c, int64_t i) {
  if (i < 0) return c.cycle_min_lr;  // set by the constructor
  if (static_cast<double>(i) < one_cycle_total(c))
    return c.cycle_min_lr + (c.cycle_max_lr - c.cycle_min_lr) * one_cycle_scale(c, i);
  if (c.decay_step_size == 0 || c.decay_lr_rate == 0.0) return c.cycle_min_lr;
  return c.cycle_min_lr / (1.0 + c.decay_lr_rate * one_cycle_decay_interval(c, i));
}

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
    case LrScheduleType::kOneCycle: return one_cycle_lr(c, i);
    case LrScheduleType::kLRRangeTest: {
      double n = static_cast<double>(i + 1) / static_cast<double>(c.lr_range_test_step_size);
      if (c.lr_range_test_staircase) n = std::floor(n);
      return c.lr_range_test_min_lr * (1.0 + c.lr_range_test_step_rate * n);
    }
    case LrScheduleType::kWarmupCosineLR: {
      if (i < 0) return 0.0;
      double ratio;
      if (i < W) {
        ratio = c.warmup_min_ratio + warmup_gamma(c, i, W) * (1.0 - c.warmup_min_ratio);
      } else {
        // The progress clamped at 1: past total_num_steps (and where total <= W, from the warm-up's
        // end) the ratio stays at cos_min_ratio; the cosine rose back before DeepSpeed clamped it.
        const double real_last = static_cast<double>(i - W + 1);
        const double real_total = std::max<double>(1.0, static_cast<double>(c.total_num_steps - W));
        const double progress = std::min(1.0, real_last / real_total);
        const double cosine = (1.0 + std::cos(M_PI * progress)) / 2.0;
        ratio = std::max(0.0, c.cos_min_ratio + (1.0 - c.cos_min_ratio) * cosine);
      }
      return c.base_lr * ratio;
    }
  }
  return c.base_lr;
}

std::optional<double> momentum_at_iteration(const LrScheduleConfig& c, int64_t i) {
  if (c.type != LrScheduleType::kOneCycle || !c.cycle_momentum) return std::nullopt;
  if (i < 0) return c.cycle_min_mom;  // set by the constructor
  if (static_cast<double>(i) < one_cycle_total(c))
    return c.cycle_max_mom - (c.cycle_max_mom - c.cycle_min_mom) * one_cycle_scale(c, i);
  if (c.decay_step_size == 0 || c.decay_mom_rate == 0.0) return c.cycle_max_mom;
  return c.cycle_max_mom * (1.0 + c.decay_mom_rate * one_cycle_decay_interval(c, i));
}

}  // namespace mt::optim
