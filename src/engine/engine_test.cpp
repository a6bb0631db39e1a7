// The engine: gradient accumulation equals the larger micro-batch, the f16 loss scaler skips
// overflowing steps and backs off, NaN losses stop the run with a message, LR follows the schedule.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "meshtrain/meshtrain.h"  // the public header compiles on its own and is what users include

namespace mt::engine {
namespace {

nlohmann::json tiny(int micro, int gas) {
  auto j = nlohmann::json::parse(R"({
    "model": {"model_type": "gpt2", "vocab_size": 97, "n_positions": 32, "n_embd": 48, "n_layer": 2, "n_head": 4},
    "seq_length": 16, "train_iters": 10,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.1}}
  })");
  j["train_micro_batch_size_per_gpu"] = micro;
  j["gradient_accumulation_steps"] = gas;
  return j;
}

void fill(std::vector<int32_t>& tok, std::vector<int32_t>& tgt, int seed) {
  for (size_t i = 0; i < tok.size(); ++i) {
    tok[i] = static_cast<int32_t>((i * 31 + seed * 7) % 97);
    tgt[i] = static_cast<int32_t>((i * 17 + seed * 3 + 1) % 97);
  }
}

TEST(Engine, GradientAccumulationMatchesTheLargerMicroBatch) {
  RunConfig a = ds_config_parse(tiny(2, 1), "a");
  RunConfig b = ds_config_parse(tiny(1, 2), "b");
  auto ma = engine_build_model(a);
  auto mb = engine_build_model(b);
  Engine ea(a, *ma), eb(b, *mb);
  std::vector<int32_t> tok(32), tgt(32);
  for (int s = 0; s < 3; ++s) {
    fill(tok, tgt, s);
    StepResult ra = ea.train_batch([&](int32_t* t, int32_t* g) {
      std::copy(tok.begin(), tok.end(), t);
      std::copy(tgt.begin(), tgt.end(), g);
    });
    int half = 0;
    StepResult rb = eb.train_batch([&](int32_t* t, int32_t* g) {
      std::copy(tok.begin() + half * 16, tok.begin() + half * 16 + 16, t);
      std::copy(tgt.begin() + half * 16, tgt.begin() + half * 16 + 16, g);
      ++half;
    });
    EXPECT_NEAR(ra.loss, rb.loss, 1e-5 * std::fabs(ra.loss));
    EXPECT_NEAR(ra.grad_norm, rb.grad_norm, 1e-4 * ra.grad_norm);
  }
  for (size_t i = 0; i < ma->store().numel(); ++i)
    ASSERT_NEAR(ma->store().master()[i], mb->store().master()[i], 1e-5) << i;
}

TEST(Engine, F16LossScalerSkipsOverflowsAndBacksOff) {
  auto j = tiny(2, 1);
  j["fp16"] = {{"enabled", true}, {"initial_scale_power", 40}, {"hysteresis", 1}, {"loss_scale_window", 1000}};
  RunConfig c = ds_config_parse(j, "f16");
  auto m = engine_build_model(c);
  Engine e(c, *m);
  std::vector<int32_t> tok(32), tgt(32);
  fill(tok, tgt, 0);
  std::vector<float> before(m->store().master(), m->store().master() + m->store().numel());
  StepResult first = e.train_batch([&](int32_t* t, int32_t* g) {
    std::copy(tok.begin(), tok.end(), t);
    std::copy(tgt.begin(), tgt.end(), g);
  });
  EXPECT_TRUE(first.skipped);  // 2^40 overflows f16 gradients
  EXPECT_EQ(first.loss_scale, std::ldexp(1.0, 40));
  EXPECT_EQ(e.loss_scaler().scale(), std::ldexp(1.0, 39));
  for (size_t i = 0; i < before.size(); ++i) ASSERT_EQ(before[i], m->store().master()[i]);
  int skipped = 1;
  for (int s = 0; s < 40 && e.applied_steps() == 0; ++s) {
    StepResult r = e.train_batch([&](int32_t* t, int32_t* g) {
      std::copy(tok.begin(), tok.end(), t);
      std::copy(tgt.begin(), tgt.end(), g);
    });
    skipped += r.skipped;
  }
  EXPECT_EQ(e.applied_steps(), 1);
  EXPECT_GT(skipped, 5);
  EXPECT_LT(e.loss_scaler().scale(), std::ldexp(1.0, 20));
  EXPECT_EQ(e.global_step(), skipped + 1);
}

// DeepSpeed's fp16 wrappers outside ZeRO (FP16_Optimizer, FP16_UnfusedOptimizer) step the optimizer
// once with zero gradients as they are built, at its own lr: AdamW's decoupled decay p (1 - lr wd)
// and a step count of 1 (the first real update's bias correction is step 2's); torch's SGD sees
// the gradient wd p, its first momentum buffer, and steps p (1 - lr wd) too. ZeRO's stages and bf16
// take none.
// Before, no run took it: every fp16 stage-0 run trained another first update than DeepSpeed's.
TEST(Engine, F16AtStageZeroTakesDeepSpeedsZeroGradientStepAsItIsBuilt) {
  struct Case {
    const char* dtype;
    int stage;
    bool adam_w_mode;
    bool steps;
  };
  for (const Case& k : {Case{"fp16", 0, true, true}, Case{"fp16", 0, false, true}, Case{"fp16", 1, true, false},
                        Case{"bf16", 0, true, false}}) {
    SCOPED_TRACE(std::string(k.dtype) + " stage " + std::to_string(k.stage) + (k.adam_w_mode ? " AdamW" : " SGD"));
    auto j = tiny(2, 1);
    j[k.dtype] = {{"enabled", true}};
    j["zero_optimization"] = {{"stage", k.stage}};
    const double lr = k.adam_w_mode ? 0.001 : 0.01, wd = 0.1;
    j["optimizer"] = k.adam_w_mode
                         ? nlohmann::json{{"type", "AdamW"}, {"params", {{"lr", lr}, {"weight_decay", wd}}}}
                         : nlohmann::json{{"type", "SGD"}, {"params", {{"lr", lr}, {"weight_decay", wd}, {"momentum", 0.9}}}};
    RunConfig c = ds_config_parse(j, "init-step");
    auto m = engine_build_model(c);
    // (At ZeRO 1 the weights live in the engine's shards: its step count says it.)
    std::vector<float> before;
    if (k.stage == 0) before.assign(m->store().master(), m->store().master() + m->store().numel());
    Engine e(c, *m);
    if (k.adam_w_mode) {
      EXPECT_EQ(e.optimizer().step_count(), k.steps ? 1 : 0);
    }
    for (size_t i = 0; i < before.size(); ++i) {
      const double p = before[i];
      // AdamW: m = v = 0, so only the decoupled decay; SGD (torch's): the gradient is wd p, the
      // first momentum buffer that gradient, the step lr wd p.
      const double want = k.steps ? p * (1.0 - lr * wd) : p;
      ASSERT_NEAR(m->store().master()[i], want, 1e-6 * std::fabs(p) + 1e-9) << "element " << i;
    }
  }
}

// Adam's L2 mode (adam_w_mode false, stop 77) in that zero-gradient step: the gradient is wd p, so
// Adam's first update moves each weight by lr wd p / (|wd p| + eps), about lr toward 0 (FusedAdam's
// L2 mode under DeepSpeed's FP16_Optimizer does the same).
TEST(Engine, F16AtStageZeroTakesTheZeroGradientStepWithAdamsL2Decay) {
  auto j = tiny(2, 1);
  j["fp16"] = {{"enabled", true}};
  const double lr = 0.001, wd = 0.1;
  j["optimizer"] = {{"type", "Adam"}, {"params", {{"lr", lr}, {"weight_decay", wd}, {"adam_w_mode", false}}}};
  RunConfig c = ds_config_parse(j, "init-step-l2");
  auto m = engine_build_model(c);
  const std::vector<float> before(m->store().master(), m->store().master() + m->store().numel());
  const char* fp16 = static_cast<const char*>(m->store().compute());
  const std::vector<char> weights(fp16, fp16 + m->store().numel() * 2);
  Engine e(c, *m);
  EXPECT_EQ(e.optimizer().step_count(), 1);
  // The fp16 weights stay as built until the first real step copies the masters to them, as the
  // wrappers step only their fp32 groups (they were rewritten here: step 1's forward ran on moved
  // weights).
  const char* after = static_cast<const char*>(m->store().compute());
  EXPECT_TRUE(std::equal(weights.begin(), weights.end(), after));
  size_t moved = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    const double p = before[i], g = wd * p;
    const double want = p - lr * g / (std::fabs(g) + 1e-8);
    ASSERT_NEAR(m->store().master()[i], want, 1e-6 * std::fabs(p) + 1e-8) << "element " << i;
    if (std::fabs(p) > 1e-3) moved += std::fabs(m->store().master()[i] - p * (1.0 - lr * wd)) > 1e-4;
  }
  EXPECT_GT(moved, before.size() / 4);  // not AdamW's p (1 - lr wd)
}

TEST(Engine, ScheduleStepsOnlyOnAppliedStepsAndNaNLossStops) {
  auto j = tiny(2, 1);
  j["scheduler"] = {{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 0.0}, {"warmup_max_lr", 0.01}, {"warmup_num_steps", 4}, {"warmup_type", "linear"}}}};
  RunConfig c = ds_config_parse(j, "lr");
  auto m = engine_build_model(c);
  Engine e(c, *m);
  std::vector<int32_t> tok(32), tgt(32);
  fill(tok, tgt, 1);
  std::vector<double> lrs;
  for (int s = 0; s < 4; ++s)
    lrs.push_back(e.train_batch([&](int32_t* t, int32_t* g) {
      std::copy(tok.begin(), tok.end(), t);
      std::copy(tgt.begin(), tgt.end(), g);
    }).lr);
  EXPECT_EQ(lrs, (std::vector<double>{0.0, 0.0, 0.0025, 0.005}));  // DeepSpeed's i = k - 2
  m->store().master()[0] = NAN;
  m->store().sync_compute();
  try {
    e.forward_backward(tok.data(), tgt.data());
    FAIL() << "NaN loss accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kNumerical);
    EXPECT_NE(std::string(err.what()).find("step 5"), std::string::npos) << err.what();
  }
}

// DeepSpeed's contract: initialize, then loss = forward; backward; step. Split calls give exactly
// the numbers of train_batch, out-of-order calls are refused, and the step reports its timings.
TEST(Engine, ForwardBackwardStepContract) {
  RunConfig c = ds_config_parse(tiny(1, 2), "c");
  auto m1 = engine_build_model(c);
  auto m2 = engine_build_model(c);
  std::unique_ptr<Engine> split = initialize(c, *m1);
  Engine whole(c, *m2);
  std::vector<int32_t> tok(16), tgt(16);
  for (int s = 0; s < 3; ++s) {
    int micro = 0;
    StepResult a = whole.train_batch([&](int32_t* t, int32_t* g) {
      fill(tok, tgt, s * 2 + micro++);
      std::copy(tok.begin(), tok.end(), t);
      std::copy(tgt.begin(), tgt.end(), g);
    });
    for (int k = 0; k < 2; ++k) {
      fill(tok, tgt, s * 2 + k);
      split->forward(tok.data(), tgt.data());
      if (k == 0) {
        EXPECT_THROW(split->forward(tok.data(), tgt.data()), Error);  // backward first
      }
      split->backward();
    }
    StepResult b = split->step();
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
    EXPECT_GT(b.forward_seconds, 0.0);
    EXPECT_GT(b.backward_seconds, 0.0);
  }
  EXPECT_THROW(split->backward(), Error);  // no forward pending
  EXPECT_THROW(split->step(), Error);      // nothing accumulated
  for (size_t i = 0; i < m1->store().numel(); ++i) ASSERT_EQ(m1->store().master()[i], m2->store().master()[i]) << i;
}

// fp16.fp16_master_weights_and_grads / bf16.bf16_master_weights_and_grads (DeepSpeed, ZeRO 1-3):
// after every step each master weight is a 16-bit value, and the run differs from f32 masters.
TEST(Engine, SixteenBitMasterWeightsHoldSixteenBitValues) {
  for (const char* block : {"fp16", "bf16"}) {
    const DType d = std::string(block) == "fp16" ? DType::kF16 : DType::kBF16;
    auto j = tiny(2, 1);
    j["zero_optimization"] = {{"stage", 1}};
    j[block] = {{"enabled", true}, {std::string(block) + "_master_weights_and_grads", true}};
    RunConfig on = ds_config_parse(j, "on");
    ASSERT_EQ(on.master_dtype, d) << block;
    j[block] = {{"enabled", true}};
    RunConfig off = ds_config_parse(j, "off");
    auto m_on = engine_build_model(on);
    auto m_off = engine_build_model(off);
    Engine e_on(on, *m_on), e_off(off, *m_off);
    std::vector<int32_t> tok(32), tgt(32);
    StepResult r_on, r_off;
    for (int s = 0; s < 3; ++s) {
      fill(tok, tgt, s);
      auto feed = [&](int32_t* t, int32_t* g) {
        std::copy(tok.begin(), tok.end(), t);
        std::copy(tgt.begin(), tgt.end(), g);
      };
      r_on = e_on.train_batch(feed);
      r_off = e_off.train_batch(feed);
    }
    EXPECT_NE(r_on.loss, r_off.loss) << block;
    std::vector<float> scratch;
    const float* w = e_on.span_state("master", scratch);  // one rank: the span is the whole model
    size_t not16 = 0;
    for (size_t i = 0; i < m_on->store().numel(); ++i) {
      uint16_t h;
      float back;
      convert(&h, d, w + i, DType::kF32, 1);
      convert(&back, DType::kF32, &h, d, 1);
      not16 += back != w[i];
    }
    EXPECT_EQ(not16, 0u) << block;
    // DeepSpeed asserts ZeRO stage 1-3.
    j[block] = {{"enabled", true}, {std::string(block) + "_master_weights_and_grads", true}};
    j["zero_optimization"] = {{"stage", 0}};
    EXPECT_THROW(ds_config_parse(j, "stage0"), Error) << block;
  }
}

}  // namespace
}  // namespace mt::engine
