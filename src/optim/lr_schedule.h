// Learning-rate schedules as DeepSpeed defines them (deepspeed/runtime/lr_schedules.py):
//   WarmupLR:       lr = min + (max - min) * gamma, gamma = log(i + 1) / log(W) ("log") or i / W
//                   ("linear") for i < W, else 1; W = max(2, warmup_num_steps).
//   WarmupDecayLR:  as WarmupLR, then gamma = max(0, (total - i) / max(1, total - W)).
//   WarmupCosineLR: ratio of the optimizer's lr: warm-up from warmup_min_ratio to 1 as above, then
//                   max(0, cos_min_ratio + (1 - cos_min_ratio) (1 + cos(pi p)) / 2), p = min(1, (i - W + 1) /
//                   max(1, total - W)): at cos_min_ratio from total_num_steps on (DeepSpeed's clamp).
//   OneCycle:       (lr_schedules.py OneCycle, the version with _get_scale_factor) F1 =
//                   cycle_first_step_size, F2 = cycle_second_step_size (None -> F1), S = F1 + F2,
//                   r = F1 / S. In the cycle, i < S: with b = i + 1, x = 1 + b/S - floor(1 + b/S),
//                   f = x / r if x <= r else (x - 1) / (r - 1);
//                   lr = min_lr + (max_lr - min_lr) f;  mom = max_mom - (max_mom - min_mom) f.
//                   After it, i >= S: with n = (i - S + 1) / decay_step_size,
//                   lr = min_lr / (1 + decay_lr_rate n)  (min_lr if decay_step_size or the rate is 0);
//                   mom = max_mom (1 + decay_mom_rate n)  (max_mom if decay_step_size or the rate is 0).
//                   At i = -1 (construction) lr = min_lr and mom = cycle_min_mom (NOTE: not the
//                   formula's max_mom at f = 0). A stair count K > 0 (cycle_first_stair_count for
//                   the rising half, cycle_second_stair_count, None -> the first, for the falling)
//                   holds f in steps: with c = b mod S, f = floor(c K / F1) / K while c <= F1, else
//                   floor((S - c) K / F2) / K, lr and momentum alike. With cycle_momentum DeepSpeed sets the optimizer's betas to
//                   (mom, 0.99): beta2 is pinned to kOneCycleBeta2 from construction on, and only for
//                   optimizers whose defaults have betas (Adam, AdamW, Lamb; not torch's SGD, where
//                   it warns "cycle_momentum is disabled" and leaves momentum alone).
//   LRRangeTest:    (lr_schedules.py LRRangeTest) lr = lr_range_test_min_lr (1 + step_rate n), n =
//                   (i + 1) / step_size, or its floor with lr_range_test_staircase; at i = -1
//                   (construction) min_lr, as the formula gives. The lr rises from min_lr without
//                   bound: the test of Smith's "disciplined approach" that finds where training diverges.
// i is DeepSpeed's last_batch_iteration: -1 before the first scheduler step (WarmupLR/DecayLR give
// min_lr there, WarmupCosineLR gives 0), and DeepSpeed steps the scheduler after each optimizer
// step, so optimizer step k (1-based) runs with i = k - 2. lr_at(k) returns exactly that.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace mt::optim {

enum class LrScheduleType { kConstant, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR, kOneCycle, kLRRangeTest };

// The beta2 DeepSpeed's OneCycle gives Adam-like optimizers while it cycles momentum.
constexpr double kOneCycleBeta2 = 0.99;

struct LrScheduleConfig {
  LrScheduleType type = LrScheduleType::kConstant;
  double base_lr = 1e-3;        // the optimizer's lr (WarmupCosineLR scales it; constant uses it)
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 1e-3;
  int64_t warmup_num_steps = 1000;
  bool warmup_log = true;       // warmup_type "log" (default) or "linear"
  int64_t total_num_steps = 0;  // WarmupDecayLR, WarmupCosineLR
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 1e-4;
  // OneCycle (DeepSpeed's argument defaults; cycle_min_lr and cycle_max_lr have none there)
  double cycle_min_lr = 0.0;
  double cycle_max_lr = 0.0;
  double decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000;
  int64_t cycle_second_step_size = -1;    // -1: None, i.e. cycle_first_step_size
  int64_t cycle_first_stair_count = 0;    // 0: no staircase
  int64_t cycle_second_stair_count = -1;  // -1: None (the first's)
  int64_t decay_step_size = 0;            // 0: no post-cycle decay
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
  // LRRangeTest (DeepSpeed's argument defaults)
  double lr_range_test_min_lr = 1e-3;
  int64_t lr_range_test_step_size = 2000;
  double lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
};

// Parses "log" / "linear"; throws kInvalidArgument naming `where` otherwise.
bool lr_warmup_type_is_log(const std::string& type, const std::string& where);

// Throws kInvalidArgument (naming scheduler.params.<key>) for a OneCycle config DeepSpeed could not
// run: cycle_first_step_size <= 0 or cycle_second_step_size < -1 (its formulas divide by zero); or
// an LRRangeTest with lr_range_test_step_size <= 0 (likewise).
void lr_schedule_check(const LrScheduleConfig& config);

// The learning rate of the scheduler at DeepSpeed iteration i (i >= -1).
double lr_at_iteration(const LrScheduleConfig& config, int64_t i);
// The learning rate used by optimizer step k (1-based): lr_at_iteration(k - 2).
inline double lr_for_step(const LrScheduleConfig& config, int64_t k) {
  return lr_at_iteration(config, k - 2);
}

// OneCycle with cycle_momentum: the momentum (beta1 of Adam/Lamb) at DeepSpeed iteration i
// (i >= -1); nullopt for every other schedule, which leaves momentum alone.
std::optional<double> momentum_at_iteration(const LrScheduleConfig& config, int64_t i);
// The momentum used by optimizer step k (1-based): momentum_at_iteration(k - 2).
inline std::optional<double> momentum_for_step(const LrScheduleConfig& config, int64_t k) {
  return momentum_at_iteration(config, k - 2);
}

}  // namespace mt::optim
