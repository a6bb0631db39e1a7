// The loss scaler on a scripted sequence of overflows, and the LR schedules at chosen steps, each
// expected value worked out by hand from DeepSpeed's rules (quoted in the headers).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/error.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"

namespace mt::optim {
namespace {

TEST(LossScaler, FollowsDeepSpeedOnAScriptedSequence) {
  LossScalerConfig c;  // ZeRO's DynamicLossScaler
  c.initial_scale_power = 4;  // 16
  c.scale_window = 3;
  c.hysteresis = 2;
  c.min_scale = 2;
  LossScaler s(c);
  EXPECT_EQ(s.scale(), 16);
  s.update(true);   // iter 0: hysteresis 2 -> 1, scale stays
  EXPECT_EQ(s.scale(), 16);
  EXPECT_EQ(s.state().hysteresis_left, 1);
  s.update(true);   // iter 1: hysteresis 1 -> halve
  EXPECT_EQ(s.scale(), 8);
  s.update(false);  // iter 2: stable interval 2-1-1 = 0
  s.update(false);  // iter 3: 1
  s.update(false);  // iter 4: 2
  EXPECT_EQ(s.scale(), 8);  // the old rule, (iter - last) % window, raised here
  s.update(false);  // iter 5: 3 % 3 == 0 -> hysteresis reset to 2, scale 16
  EXPECT_EQ(s.scale(), 16);
  EXPECT_EQ(s.state().hysteresis_left, 2);
  s.update(true);   // iter 6: hysteresis 2 -> 1
  s.update(true);   // iter 7: halve to 8
  s.update(true);   // iter 8: hysteresis still 1 (not reset without a window) -> 4
  s.update(true);   // iter 9: -> 2 (min)
  EXPECT_EQ(s.scale(), 2);
  EXPECT_THROW(s.update(true), Error);  // at min_scale: DeepSpeed's ZeRO scaler raises
  // Without overflows the first raise comes after window + 1 good steps, then every window:
  // DeepSpeed's stable interval, (iter - last_overflow_iter) - 1 with last_overflow_iter -1.
  LossScaler fresh(c);
  std::vector<double> scales;
  for (int i = 0; i < 8; ++i) {
    fresh.update(false);
    scales.push_back(fresh.scale());
  }
  EXPECT_EQ(scales, (std::vector<double>{16, 16, 16, 32, 32, 32, 64, 64}));
}

// ZeRO stage 0: FP16_Optimizer (FusedAdam, OneBitAdam, ZeroOneAdam) holds the minimum scale and
// skips on; FP16_UnfusedOptimizer (Lamb, torch's Adam, SGD) also ignores hysteresis.
TEST(LossScaler, StageZerosWrappersHoldTheMinimumAndTheUnfusedOneHasNoHysteresis) {
  LossScalerConfig c;
  c.initial_scale_power = 3;  // 8
  c.scale_window = 100;
  c.hysteresis = 2;
  c.min_scale = 2;
  c.raise_error_at_min_scale = false;
  LossScaler fused(c);
  for (int i = 0; i < 6; ++i) fused.update(true);  // 8, 8 (hysteresis), 4, 2, 2, 2: no error
  EXPECT_EQ(fused.scale(), 2);
  c.honour_hysteresis = false;
  LossScaler unfused(c);
  unfused.update(true);  // halved at the first overflow
  EXPECT_EQ(unfused.scale(), 4);
}

TEST(LossScaler, ConsecutiveHysteresisResetsOnEveryGoodStep) {
  LossScalerConfig c;
  c.initial_scale_power = 3;
  c.scale_window = 100;
  c.hysteresis = 2;
  c.consecutive_hysteresis = true;
  LossScaler s(c);
  s.update(true);   // 2 -> 1
  s.update(false);  // reset to 2
  s.update(true);   // 2 -> 1, no halving
  EXPECT_EQ(s.scale(), 8);
  s.update(true);   // halve
  EXPECT_EQ(s.scale(), 4);
}

TEST(LossScaler, StaticScaleNeverMoves) {
  LossScalerConfig c;
  c.dynamic = false;
  c.static_scale = 128;
  LossScaler s(c);
  for (int i = 0; i < 5; ++i) s.update(i % 2 == 0);
  EXPECT_EQ(s.scale(), 128);
}

TEST(LrSchedule, WarmupLRLogAndLinear) {
  LrScheduleConfig c;
  c.type = LrScheduleType::kWarmupLR;
  c.warmup_min_lr = 0.0;
  c.warmup_max_lr = 1.0;
  c.warmup_num_steps = 10;
  EXPECT_DOUBLE_EQ(lr_for_step(c, 1), 0.0);  // iteration -1: min_lr
  EXPECT_DOUBLE_EQ(lr_for_step(c, 2), 0.0);  // iteration 0: log(1) = 0
  EXPECT_NEAR(lr_for_step(c, 3), std::log(2.0) / std::log(10.0), 1e-15);
  EXPECT_DOUBLE_EQ(lr_at_iteration(c, 10), 1.0);
  c.warmup_log = false;
  EXPECT_DOUBLE_EQ(lr_at_iteration(c, 4), 0.4);
}

TEST(LrSchedule, WarmupDecayAndCosine) {
  LrScheduleConfig c;
  c.type = LrScheduleType::kWarmupDecayLR;
  c.warmup_min_lr = 0.0;
  c.warmup_max_lr = 2.0;
  c.warmup_num_steps = 10;
  c.total_num_steps = 30;
  c.warmup_log = false;
  EXPECT_DOUBLE_EQ(lr_at_iteration(c, 20), 2.0 * 10.0 / 20.0);
  EXPECT_DOUBLE_EQ(lr_at_iteration(c, 40), 0.0);
  c.type = LrScheduleType::kWarmupCosineLR;
  c.base_lr = 2.0;
  c.warmup_min_ratio = 0.5;
  c.cos_min_ratio = 0.1;
  EXPECT_DOUBLE_EQ(lr_at_iteration(c, -1), 0.0);
  EXPECT_DOUBLE_EQ(lr_at_iteration(c, 5), 2.0 * (0.5 + 0.5 * 0.5));
  // i = 19: real_last = 10 of real_total = 20 -> cos(pi/2) = 0 -> ratio 0.1 + 0.9 * 0.5
  EXPECT_NEAR(lr_at_iteration(c, 19), 2.0 * 0.55, 1e-12);
  EXPECT_THROW(lr_warmup_type_is_log("cubic", "scheduler.params.warmup_type"), Error);
}

}  // namespace
}  // namespace mt::optim
