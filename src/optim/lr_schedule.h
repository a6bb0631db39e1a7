// Learning-rate schedules as DeepSpeed defines them (deepspeed/runtime/lr_schedules.py):
//   WarmupLR:       lr = min + (max - min) * gamma, gamma = log(i + 1) / log(W) ("log") or i / W
//                   ("linear") for i < W, else 1; W = max(2, warmup_num_steps).
//   WarmupDecayLR:  as WarmupLR, then gamma = max(0, (total - i) / max(1, total - W)).
//   WarmupCosineLR: ratio of the optimizer's lr: warm-up from warmup_min_ratio to 1 as above, then
//                   max(0, cos_min_ratio + (1 - cos_min_ratio) (1 + cos(pi (i - W + 1) / (total - W))) / 2).
// i is DeepSpeed's last_batch_iteration: -1 before the first scheduler step (WarmupLR/DecayLR give
// min_lr there, WarmupCosineLR gives 0), and DeepSpeed steps the scheduler after each optimizer
// step, so optimizer step k (1-based) runs with i = k - 2. lr_at(k) returns exactly that.
#pragma once

#include <cstdint>
#include <string>

namespace mt::optim {

enum class LrScheduleType { kConstant, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };

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
};

// Parses "log" / "linear"; throws kInvalidArgument naming `where` otherwise.
bool lr_warmup_type_is_log(const std::string& type, const std::string& where);

// The learning rate of the scheduler at DeepSpeed iteration i (i >= -1).
double lr_at_iteration(const LrScheduleConfig& config, int64_t i);
// The learning rate used by optimizer step k (1-based): lr_at_iteration(k - 2).
inline double lr_for_step(const LrScheduleConfig& config, int64_t k) {
  return lr_at_iteration(config, k - 2);
}

}  // namespace mt::optim
