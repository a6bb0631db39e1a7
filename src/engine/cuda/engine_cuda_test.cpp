// The GPU model and engine against two oracles: PyTorch's golden data (tools/make_golden.py: loss,
// every gradient, AdamW steps) and the CPU backend (same configuration, same seed: losses and
// weights). Also: recompute, checkpoints through the host, memory accounting, no cudaMalloc in a
// steady loop. Skipped where no CUDA device is visible; run on a GPU by scripts/gpu-check.sh.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "engine/ds_config.h"
#include "engine/engine.h"
#include "engine/golden_test_util.h"
#include "engine/hf_config.h"
#include "engine/hf_weights.h"
#include "kernels/cuda/device.h"
#include "models/device_lm.h"

namespace mt::engine {
namespace {

bool have_gpu() { return cuda::available(); }
#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

using testing::Golden;
using testing::load_golden;
using testing::cosine;
std::unique_ptr<models::TransformerLM> golden_model(const Golden& g, DType dt, bool recompute = false) {
  return testing::make_model(g, dt, recompute);
}
double rel_max(const float* a, const std::vector<float>& b) { return testing::rel_err(a, b); }

class GpuGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuGolden, Fp32LossAndEveryGradientMatchPyTorch) {
  REQUIRE_GPU();
  Golden g = load_golden(GetParam());
  auto m = golden_model(g, DType::kF32);
  auto dev = models::make_cuda_lm(*m);
  float loss = dev->forward(g.tokens.data(), g.targets.data(), 1.0f);
  float ref = g.file->read_f32("loss")[0];
  EXPECT_LE(std::fabs(loss - ref) / std::fabs(ref), 1e-4) << loss << " vs " << ref;
  dev->backward();
  std::vector<float> grads(m->store().numel());
  dev->store_grads(grads.data());
  for (nn::Parameter* p : m->store().parameters()) {
    std::vector<float> gref = g.file->read_f32("grad." + p->name, p->shape);
    EXPECT_LE(rel_max(grads.data() + p->offset, gref), 1e-4) << p->name;
  }
}

TEST_P(GpuGolden, Bf16WithinTheCpuTolerances) {
  REQUIRE_GPU();
  Golden g = load_golden(GetParam());
  auto m = golden_model(g, DType::kBF16);
  auto dev = models::make_cuda_lm(*m);
  float loss = dev->forward(g.tokens.data(), g.targets.data(), 1.0f);
  float ref = g.file->read_f32("loss")[0];
  EXPECT_LE(std::fabs(loss - ref) / std::fabs(ref), 2e-2);
  dev->backward();
  std::vector<float> grads(m->store().numel());
  dev->store_grads(grads.data());
  for (nn::Parameter* p : m->store().parameters()) {
    std::vector<float> gref = g.file->read_f32("grad." + p->name, p->shape);
    EXPECT_GE(cosine(grads.data() + p->offset, gref), 0.99) << p->name;
    EXPECT_LE(rel_max(grads.data() + p->offset, gref), 0.1) << p->name;
  }
}

TEST_P(GpuGolden, Fp32AdamWStepsMatchPyTorch) {
  REQUIRE_GPU();
  Golden g = load_golden(GetParam());
  auto m = golden_model(g, DType::kF32);
  auto dev = models::make_cuda_lm(*m);
  const auto& md = g.file->metadata();
  kernels::AdamWParams p;
  p.lr = std::stof(md.at("lr"));
  p.beta1 = std::stof(md.at("beta1"));
  p.beta2 = std::stof(md.at("beta2"));
  p.eps = std::stof(md.at("eps"));
  std::vector<optim::ParamSegment> segs{{0, m->store().numel(), std::stof(md.at("weight_decay")), "all"}};
  std::vector<float> ref_losses = g.file->read_f32("step_losses");
  for (int s = 0; s < g.steps; ++s) {
    dev->zero_grad();
    float loss = dev->forward(g.tokens.data(), g.targets.data(), 1.0f);
    dev->backward();
    p.step = s + 1;
    dev->adamw_step(segs, p);
    EXPECT_LE(std::fabs(loss - ref_losses[s]) / std::fabs(ref_losses[s]), 1e-4) << "step " << s;
  }
  std::vector<float> master(m->store().numel());
  dev->store_master(master.data());
  // Elements whose exact gradient is zero (GPT-2's key bias) carry rounding noise that Adam turns
  // into +-lr steps: left out as in the CPU golden test.
  for (nn::Parameter* prm : m->store().parameters()) {
    std::vector<float> after = g.file->read_f32("after." + prm->name, prm->shape);
    std::vector<float> grad0 = g.file->read_f32("grad." + prm->name, prm->shape);
    double gmax = 0;
    for (float x : grad0) gmax = std::max(gmax, std::fabs(static_cast<double>(x)));
    std::vector<float> mine(master.begin() + prm->offset, master.begin() + prm->offset + after.size());
    for (size_t i = 0; i < after.size(); ++i)
      if (grad0[i] != 0.0f && std::fabs(grad0[i]) < 1e-6 * gmax) mine[i] = after[i];
    EXPECT_LE(rel_max(mine.data(), after), 1e-4) << prm->name;
  }
}

TEST_P(GpuGolden, RecomputeGivesTheSameGradients) {
  REQUIRE_GPU();
  Golden g = load_golden(GetParam());
  std::vector<float> ga, gb;
  for (bool rc : {false, true}) {
    auto m = golden_model(g, DType::kF32, rc);
    auto dev = models::make_cuda_lm(*m);
    dev->forward(g.tokens.data(), g.targets.data(), 1.0f);
    dev->backward();
    std::vector<float>& out = rc ? gb : ga;
    out.resize(m->store().numel());
    dev->store_grads(out.data());
  }
  // Same kernels on the same inputs; only the embedding's atomics may reorder.
  EXPECT_LE(rel_max(gb.data(), ga), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Models, GpuGolden, ::testing::Values("tiny-gpt2", "tiny-llama"), [](const auto& info) {
  std::string s = info.param;
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
});

// ---- the engine on the GPU against the engine on the CPU ----
// Head size 64 so bf16 runs the tensor-core attention; T not a multiple of 64; odd vocabulary.
nlohmann::json run_config(const std::string& arch, const std::string& device, bool bf16, int stage = 0) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "seq_length": 100, "train_iters": 6, "seed": 7,
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.003, "warmup_num_steps": 3}}
  })");
  if (arch == "gpt2")
    j["model"] = {{"model_type", "gpt2"}, {"vocab_size", 1001}, {"n_positions", 128}, {"n_embd", 128},
                  {"n_layer", 2}, {"n_head", 2}};
  else
    j["model"] = {{"model_type", "llama"}, {"vocab_size", 1001}, {"max_position_embeddings", 128},
                  {"hidden_size", 256}, {"intermediate_size", 344}, {"num_hidden_layers", 2},
                  {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"tie_word_embeddings", false}};
  j["device"] = device;
  if (bf16) j["bf16"] = {{"enabled", true}};
  if (stage) j["zero_optimization"] = {{"stage", stage}};
  return j;
}

struct TrainRun {
  std::vector<float> losses, norms, master;
};

TrainRun train(const nlohmann::json& j, int steps) {
  RunConfig c = ds_config_parse(j, "test");
  auto model = engine_build_model(c);
  Engine eng(c, *model);
  TrainRun r;
  size_t n = static_cast<size_t>(c.batch.micro_batch_per_gpu * c.seq_length);
  std::vector<int32_t> tok(n), tgt(n);
  int micro = 0;
  for (int s = 0; s < steps; ++s) {
    StepResult st = eng.train_batch([&](int32_t* t, int32_t* g) {
      for (size_t i = 0; i < n; ++i) {
        t[i] = static_cast<int32_t>((i * 131 + micro * 71 + i / 7) % c.model.vocab_size);
        g[i] = (i % 37 == 5) ? -100 : static_cast<int32_t>((i * 31 + micro * 13 + 3) % c.model.vocab_size);
      }
      ++micro;
    });
    r.losses.push_back(st.loss);
    r.norms.push_back(static_cast<float>(st.grad_norm));
  }
  eng.gather_master(r.master);
  return r;
}

class GpuEngine : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuEngine, Fp32TrainingMatchesTheCpuEngine) {
  REQUIRE_GPU();
  TrainRun cpu = train(run_config(GetParam(), "cpu", false), 6);
  TrainRun gpu = train(run_config(GetParam(), "cuda", false), 6);
  for (size_t s = 0; s < cpu.losses.size(); ++s) {
    EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 1e-4 * std::fabs(cpu.losses[s])) << "step " << s;
    EXPECT_NEAR(gpu.norms[s], cpu.norms[s], 1e-3 * cpu.norms[s]) << "step " << s;
  }
  EXPECT_LE(rel_max(gpu.master.data(), cpu.master), 1e-4);
}

// Adam without bias correction (DeepSpeed's bias_correction false): the device step took the CPU
// optimizer's other parameters by hand and left this one at true.
TEST_P(GpuEngine, Fp32WithoutBiasCorrectionMatchesTheCpuEngine) {
  REQUIRE_GPU();
  nlohmann::json cpu_cfg = run_config(GetParam(), "cpu", false), gpu_cfg = run_config(GetParam(), "cuda", false);
  for (nlohmann::json* j : {&cpu_cfg, &gpu_cfg}) (*j)["optimizer"]["params"]["bias_correction"] = false;
  TrainRun cpu = train(cpu_cfg, 6), with = train(run_config(GetParam(), "cpu", false), 6);
  TrainRun gpu = train(gpu_cfg, 6);
  EXPECT_GT(rel_max(cpu.master.data(), with.master), 1e-3);  // the key changes what is trained
  EXPECT_LE(rel_max(gpu.master.data(), cpu.master), 1e-4);
}

TEST_P(GpuEngine, Bf16TrainingFollowsTheCpuEngine) {
  REQUIRE_GPU();
  TrainRun cpu = train(run_config(GetParam(), "cpu", true), 6);
  TrainRun gpu = train(run_config(GetParam(), "cuda", true), 6);
  // bf16 GEMM inputs on both; the GPU also keeps its saved activations in bf16 (the CPU in f32).
  for (size_t s = 0; s < cpu.losses.size(); ++s)
    EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 2e-2 * std::fabs(cpu.losses[s])) << "step " << s;
  EXPECT_LT(gpu.losses.back(), gpu.losses.front());
}

TEST_P(GpuEngine, TwoRunsAreBitwiseEqual) {
  // Every reduction runs in a fixed order (the embedding's too): a second run in the same process,
  // on reused pool blocks, repeats the first bit for bit, in fp32 and bf16.
  REQUIRE_GPU();
  for (bool bf16 : {false, true}) {
    TrainRun a = train(run_config(GetParam(), "cuda", bf16), 4);
    TrainRun b = train(run_config(GetParam(), "cuda", bf16), 4);
    for (size_t s = 0; s < a.losses.size(); ++s) {
      EXPECT_EQ(a.losses[s], b.losses[s]) << "step " << s << (bf16 ? " bf16" : " fp32");
      EXPECT_EQ(a.norms[s], b.norms[s]) << "step " << s << (bf16 ? " bf16" : " fp32");
    }
    ASSERT_EQ(a.master.size(), b.master.size());
    size_t differ = 0;
    for (size_t i = 0; i < a.master.size(); ++i) differ += a.master[i] != b.master[i];
    EXPECT_EQ(differ, 0u) << (bf16 ? "bf16" : "fp32");
  }
}

#ifdef MT_NCCL
TEST_P(GpuEngine, NcclOneRankEqualsTheRunWithout) {
  // comm_backend "nccl" on one GPU: the gradient all-reduce over one rank runs (NCCL's path,
  // bootstrap included) and leaves the training bit for bit as it was.
  REQUIRE_GPU();
  nlohmann::json j = run_config(GetParam(), "cuda", true);
  TrainRun plain = train(j, 3);
  j["comm_backend"] = "nccl";
  TrainRun nccl = train(j, 3);
  for (size_t s = 0; s < plain.losses.size(); ++s) EXPECT_EQ(nccl.losses[s], plain.losses[s]) << "step " << s;
  EXPECT_EQ(nccl.master, plain.master);
}
#endif

TEST_P(GpuEngine, BackwardReportsEachGradientRangeOnceALayerAtATime) {
  // set_grad_ready: the ranges the gradient all-reduce starts on during the backward, descending and
  // adjacent, covering the buffer once: the last layer with the final norm (and an untied head),
  // each layer, then the embeddings. The gradients are those of a backward without the hook.
  REQUIRE_GPU();
  RunConfig c = ds_config_parse(run_config(GetParam(), "cuda", true), "test");
  auto model = engine_build_model(c);
  auto lm = models::make_cuda_lm(*model);
  const size_t P = model->store().numel(), n = static_cast<size_t>(c.batch.micro_batch_per_gpu * c.seq_length);
  std::vector<int32_t> tok(n), tgt(n);
  for (size_t i = 0; i < n; ++i) {
    tok[i] = static_cast<int32_t>((i * 131 + i / 7) % c.model.vocab_size);
    tgt[i] = static_cast<int32_t>((i * 31 + 3) % c.model.vocab_size);
  }
  std::vector<float> plain(P), hooked(P);
  lm->forward(tok.data(), tgt.data(), 1.0f);
  lm->backward();
  lm->store_grads(plain.data());
  lm->zero_grad();
  std::vector<std::pair<size_t, size_t>> ranges;
  lm->set_grad_ready([&](size_t off, size_t count) { ranges.emplace_back(off, count); });
  for (int rep = 0; rep < 2; ++rep) {  // every backward reports anew
    ranges.clear();
    lm->zero_grad();
    lm->forward(tok.data(), tgt.data(), 1.0f);
    lm->backward();
    ASSERT_EQ(ranges.size(), static_cast<size_t>(c.model.n_layer) + 1) << "one range per layer, then the embeddings";
    size_t end = P;
    for (auto [off, count] : ranges) {
      EXPECT_EQ(off + count, end) << "ranges descend without gaps or overlaps";
      EXPECT_GT(count, 0u);
      end = off;
    }
    EXPECT_EQ(end, 0u);
  }
  lm->store_grads(hooked.data());
  EXPECT_EQ(hooked, plain);
  lm->set_grad_ready({});
  ranges.clear();
  lm->forward(tok.data(), tgt.data(), 1.0f);
  lm->backward();
  EXPECT_TRUE(ranges.empty());
}

TEST_P(GpuEngine, ZeroStagesOnOneGpuEqualStageZero) {
  REQUIRE_GPU();
  TrainRun s0 = train(run_config(GetParam(), "cuda", true, 0), 3);
  for (int stage : {1, 2, 3}) {
    TrainRun s = train(run_config(GetParam(), "cuda", true, stage), 3);
    for (size_t i = 0; i < s0.losses.size(); ++i) EXPECT_NEAR(s.losses[i], s0.losses[i], 1e-6 * s0.losses[i]);
  }
}

TEST_P(GpuEngine, CheckpointStateRoundTripsThroughTheHost) {
  REQUIRE_GPU();
  // 4 uninterrupted steps vs 2 steps, state to the host, a fresh engine loading it, 2 more.
  nlohmann::json j = run_config(GetParam(), "cuda", false);
  TrainRun full = train(j, 4);
  RunConfig c = ds_config_parse(j, "test");
  size_t n = static_cast<size_t>(c.batch.micro_batch_per_gpu * c.seq_length);
  auto batch_fn = [&](int& micro) {
    return [&, n](int32_t* t, int32_t* g) {
      for (size_t i = 0; i < n; ++i) {
        t[i] = static_cast<int32_t>((i * 131 + micro * 71 + i / 7) % c.model.vocab_size);
        g[i] = (i % 37 == 5) ? -100 : static_cast<int32_t>((i * 31 + micro * 13 + 3) % c.model.vocab_size);
      }
      ++micro;
    };
  };
  int micro = 0;
  std::vector<float> master;
  std::vector<std::pair<std::string, std::vector<float>>> state;
  int64_t opt_steps = 0;
  {
    auto model = engine_build_model(c);
    Engine eng(c, *model);
    for (int s = 0; s < 2; ++s) eng.train_batch(batch_fn(micro));
    eng.gather_master(master);
    state = eng.gather_optimizer_state();
    opt_steps = eng.optimizer().step_count();
  }
  auto model = engine_build_model(c);
  Engine eng(c, *model);
  eng.load_master(master.data());
  for (auto& [name, v] : state) eng.load_optimizer_state(name, v.data());
  eng.optimizer().set_step_count(opt_steps);
  eng.set_counters(2, 2);
  std::vector<float> losses;
  for (int s = 0; s < 2; ++s) losses.push_back(eng.train_batch(batch_fn(micro)).loss);
  EXPECT_EQ(losses[0], full.losses[2]);
  EXPECT_EQ(losses[1], full.losses[3]);
}

TEST_P(GpuEngine, MemoryIsAccountedAndTheLoopDoesNotAllocate) {
  REQUIRE_GPU();
  RunConfig c = ds_config_parse(run_config(GetParam(), "cuda", true), "test");
  auto model = engine_build_model(c);
  Engine eng(c, *model);
  size_t P = model->store().numel();
  MemStats m = eng.memory_stats();
  // bf16 compute copy, and the LM head's bf16 copy padded to a multiple of 64 rows
  size_t Vp = (static_cast<size_t>(c.model.vocab_size) + 63) / 64 * 64;
  EXPECT_EQ(m.current[static_cast<int>(MemCategory::kParams)], P * 2 + Vp * static_cast<size_t>(c.model.hidden) * 2);
  EXPECT_EQ(m.current[static_cast<int>(MemCategory::kGrads)], P * 4);
  EXPECT_EQ(m.current[static_cast<int>(MemCategory::kOptimizer)], P * 12);  // master, m, v
  EXPECT_GT(m.current[static_cast<int>(MemCategory::kActivations)], 0u);
  size_t n = static_cast<size_t>(c.batch.micro_batch_per_gpu * c.seq_length);
  auto fn = [&](int32_t* t, int32_t* g) {
    for (size_t i = 0; i < n; ++i) t[i] = g[i] = static_cast<int32_t>(i % 97);
  };
  eng.train_batch(fn);
  eng.train_batch(fn);
  int64_t mallocs = cuda::DeviceAllocator::global().device_mallocs();
  for (int s = 0; s < 3; ++s) eng.train_batch(fn);
  EXPECT_EQ(cuda::DeviceAllocator::global().device_mallocs(), mallocs);
}

INSTANTIATE_TEST_SUITE_P(Archs, GpuEngine, ::testing::Values("gpt2", "llama"));

TEST(GpuConfig, WhatTheGpuLacksIsRefusedByKey) {
  nlohmann::json j = run_config("gpt2", "cuda", false);
  j["fp16"] = {{"enabled", true}};
  EXPECT_THROW(ds_config_parse(j, "t"), Error);
  j = run_config("gpt2", "cuda", false);
  j["optimizer"] = {{"type", "Lamb"}, {"params", {{"lr", 0.001}}}};
  try {
    ds_config_parse(j, "t");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.type"), std::string::npos) << e.what();
  }
  j = run_config("gpt2", "gpu", false);
  EXPECT_THROW(ds_config_parse(j, "t"), Error);
}

}  // namespace
}  // namespace mt::engine
