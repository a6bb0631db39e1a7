// DeepSpeed's legacy curriculum learning (the top-level `curriculum_learning` block,
// deepspeed/runtime/data_pipeline/curriculum_scheduler.py), curriculum_type "seqlen" as
// Megatron-DeepSpeed applies it: each step trains on the first `difficulty` tokens of every
// sample. The difficulty follows the schedule from min_difficulty until it first reaches
// max_difficulty, and stays there.
//   fixed_linear / fixed_root (root_degree r):
//     d(s) = floor((s / total_curriculum_step)^(1/r) * (max - min) + min),
//     minus d(s) mod difficulty_step, at least the first multiple of difficulty_step at or above
//     min (deepspeedai/DeepSpeed's PR #8334), at most max
//   fixed_discrete: difficulty[i] for the first i with s <= max_step[i], else difficulty.back()
//     (max_step increasing: refused otherwise)
// s is the 1-based step about to run (DeepSpeed updates with global_steps + 1 in forward).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mt::engine {

struct CurriculumConfig {
  bool enabled = false;
  int64_t min_difficulty = 0, max_difficulty = 0;
  std::string schedule_type;  // "fixed_linear", "fixed_root" or "fixed_discrete"
  int64_t total_curriculum_step = 0, difficulty_step = 1;
  double root_degree = 1.0;
  std::vector<int64_t> difficulty, max_step;  // fixed_discrete
};

// The schedule's value at step s (no state).
int64_t curriculum_difficulty(const CurriculumConfig& c, int64_t step);

// DeepSpeed's update rule: current moves to the schedule's value while it is below max.
class CurriculumSchedule {
 public:
  explicit CurriculumSchedule(CurriculumConfig c) : c_(std::move(c)), current_(c_.min_difficulty) {}
  // The difficulty of step s (1-based); steps must not go backwards (the same step again is answered).
  int64_t at(int64_t step);

 private:
  CurriculumConfig c_;
  int64_t current_;
  int64_t done_ = 0;  // steps applied
};

}  // namespace mt::engine
