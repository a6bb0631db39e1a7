#include "engine/curriculum.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace mt::engine {

int64_t curriculum_difficulty(const CurriculumConfig& c, int64_t step) {
  if (c.schedule_type == "fixed_discrete") {
    for (size_t i = 0; i < c.max_step.size(); ++i)
      if (step <= c.max_step[i]) return c.difficulty[i];
    return c.difficulty.back();
  }
  const double r = c.schedule_type == "fixed_root" ? c.root_degree : 1.0;
  const double frac = std::pow(static_cast<double>(step) / static_cast<double>(c.total_curriculum_step), 1.0 / r);
  auto d = static_cast<int64_t>(
      std::floor(frac * static_cast<double>(c.max_difficulty - c.min_difficulty) + static_cast<double>(c.min_difficulty)));
  d -= d % c.difficulty_step;
  // deepspeedai/DeepSpeed's scheduler (since its PR #8334) raises the floor to the first multiple of
  // difficulty_step at or above min_difficulty: min 12 with step 8 trains 16 at first, where the
  // older rounding gave 8, below min_difficulty (and min 8 with step 16 gave 0, which was refused).
  const int64_t step_size = c.difficulty_step;
  d = std::max(d, (c.min_difficulty + step_size - 1) / step_size * step_size);
  return std::min(d, c.max_difficulty);
}

int64_t CurriculumSchedule::at(int64_t step) {
  if (step == done_ && step > 0) return current_;  // asked again (the flops profiler's step is prepared before it runs)
  MT_CHECK(step > done_, ErrorKind::kInternal, "curriculum schedule asked for an earlier step");
  for (int64_t s = done_ + 1; s <= step; ++s)
    if (current_ < c_.max_difficulty) current_ = curriculum_difficulty(c_, s);
  done_ = step;
  return current_;
}

}  // namespace mt::engine
