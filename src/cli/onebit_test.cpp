// OneBitAdam end to end under `meshtrain launch` on 2 and 4 ranks (a tiny GPT-2 on a generated
// dataset): the warm-up steps equal AdamW bit for bit; ZeroOneAdam's first variance steps equal
// AdamW without bias correction and OneBitLamb's warm-up Lamb without it (2 ranks); after the freeze the bytes each step sends
// (metrics' comm_bytes, the comms logger's counters) are at least 16x fewer than a warm-up step's;
// a resume from a checkpoint saved mid-compression (worker and server errors in it) continues the
// uninterrupted run bit for bit; the comms_logger block prints DeepSpeed's summary.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_test_util.h"

namespace {

std::string dir() {
  static std::string d = mt::cli::testing::make_test_dir("mt_onebit_test");
  return d;
}

std::string write_config(const std::string& name, const nlohmann::json& extra) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "model": {"model_type": "gpt2", "vocab_size": 97, "n_positions": 32, "n_embd": 48, "n_layer": 2, "n_head": 4},
    "seq_length": 16, "train_iters": 8, "train_batch_size": 4, "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": "auto", "comm_timeout": 30,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}}, "gradient_clipping": 1.0,
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2, "warmup_max_lr": 0.01}},
    "steps_per_print": 1, "save_interval": 5, "keep_last": 0
  })");
  j["data"] = {{"train", dir() + "/train"}, {"valid", dir() + "/train"}, {"shuffle", true}};
  j["save_dir"] = dir() + "/ckpt-" + name;
  j["eval_interval"] = 4;
  j["eval_iters"] = 2;
  if (extra.is_object()) j.update(extra);
  std::string path = dir() + "/" + name + ".json";
  std::ofstream(path) << j.dump();
  return path;
}

int run(const std::string& args, std::string* out = nullptr, std::string* err = nullptr) {
  return mt::cli::testing::run_meshtrain(dir(), args, out, err);
}

std::vector<double> values(const std::string& metrics, const std::string& key) {
  return mt::cli::testing::metric_values(metrics, key);
}

const nlohmann::json kOneBit = {{"optimizer",
                                 {{"type", "OneBitAdam"},
                                  {"params", {{"lr", 0.01}, {"weight_decay", 0.01}, {"freeze_step", 3},
                                              {"comm_backend_name", "mpi"}, {"cuda_aware", false}}}}}};

TEST(OneBitMpi, WarmupIsAdamWThenCompressedBytesAndResume) {
  mt::cli::testing::write_chain_dataset(dir() + "/train", 30);
  for (int n : {2, 4}) {
    const std::string N = std::to_string(n), launch = "launch -n " + N + " -- train ";
    std::string err;
    ASSERT_EQ(run(launch + write_config("adamw" + N, {}) + " --metrics " + dir() + "/adamw" + N + ".jsonl", nullptr, &err), 0)
        << err;
    nlohmann::json ob = kOneBit;
    ob["comms_logger"] = {{"enabled", true}, {"prof_all", true}};
    std::string out;
    ASSERT_EQ(run(launch + write_config("onebit" + N, ob) + " --metrics " + dir() + "/onebit" + N + ".jsonl", &out, &err), 0)
        << err;
    const auto la = values(dir() + "/adamw" + N + ".jsonl", "loss"), lo = values(dir() + "/onebit" + N + ".jsonl", "loss");
    const auto ba = values(dir() + "/adamw" + N + ".jsonl", "comm_bytes"), bo = values(dir() + "/onebit" + N + ".jsonl", "comm_bytes");
    ASSERT_EQ(la.size(), 8u);
    ASSERT_EQ(lo.size(), 8u);
    ASSERT_EQ(bo.size(), 8u);
    // freeze_step 3: updates 1-2 are Adam's (DeepSpeed's calls 2-3): the loss of steps 1-3 (step 3
    // reads the weights after update 2); compressed from update 3 on.
    for (int s = 0; s < 3; ++s) EXPECT_EQ(la[s], lo[s]) << "n " << n << " step " << s + 1;
    EXPECT_NE(la[3], lo[3]) << "n " << n;
    for (int s = 0; s < 2; ++s) EXPECT_EQ(ba[s], bo[s]) << "n " << n << " step " << s + 1;
    for (int s = 2; s < 8; ++s) {
      EXPECT_GT(bo[s], 0.0);
      EXPECT_GE(ba[s] / bo[s], 16.0) << "n " << n << " step " << s + 1 << ": " << ba[s] << " vs " << bo[s];
    }
    EXPECT_NE(out.find("comms summary"), std::string::npos) << out;
    EXPECT_NE(out.find("all_to_all"), std::string::npos) << out;
    EXPECT_NE(out.find("busbw_avg (Gbps)"), std::string::npos) << out;
    // Resumed from step 5 (two compressed steps in): steps 6-8 as the uninterrupted run.
    ASSERT_EQ(run(launch + write_config("resumed" + N, kOneBit) + " --resume " + dir() + "/ckpt-onebit" + N +
                      "/step-5 --metrics " + dir() + "/resumed" + N + ".jsonl",
                  nullptr, &err),
              0)
        << err;
    const auto lr = values(dir() + "/resumed" + N + ".jsonl", "loss");
    ASSERT_EQ(lr.size(), 3u);
    for (int s = 0; s < 3; ++s) EXPECT_EQ(lr[s], lo[5 + s]) << "n " << n << " resumed step " << s + 6;
    const auto vo = values(dir() + "/onebit" + N + ".jsonl", "val_loss"), vr = values(dir() + "/resumed" + N + ".jsonl", "val_loss");
    ASSERT_FALSE(vr.empty());
    EXPECT_EQ(vr.back(), vo.back());
  }
}

// A 1-bit optimizer against its full-precision twin on 2 ranks: the losses of the first `same`
// steps equal, the bytes of every step in `compressed` (1-based) are >= 16x fewer, and a resume
// from step `resume_at` continues the uninterrupted run bit for bit.
void check_against_twin(const std::string& name, const nlohmann::json& twin, const nlohmann::json& onebit, int iters,
                        int same, const std::vector<int>& compressed, int resume_at) {
  mt::cli::testing::write_chain_dataset(dir() + "/train", 30);
  const std::string launch = "launch -n 2 -- train ", m = dir() + "/" + name;
  nlohmann::json extra = {{"train_iters", iters}, {"save_interval", resume_at}};
  nlohmann::json a = twin, b = onebit;
  a.update(extra);
  b.update(extra);
  std::string err;
  ASSERT_EQ(run(launch + write_config(name + "-twin", a) + " --metrics " + m + "-twin.jsonl", nullptr, &err), 0) << err;
  ASSERT_EQ(run(launch + write_config(name, b) + " --metrics " + m + ".jsonl", nullptr, &err), 0) << err;
  const auto la = values(m + "-twin.jsonl", "loss"), lo = values(m + ".jsonl", "loss");
  const auto ba = values(m + "-twin.jsonl", "comm_bytes"), bo = values(m + ".jsonl", "comm_bytes");
  ASSERT_EQ(la.size(), static_cast<size_t>(iters));
  ASSERT_EQ(lo.size(), static_cast<size_t>(iters));
  ASSERT_EQ(bo.size(), static_cast<size_t>(iters));
  for (int s = 0; s < same; ++s) EXPECT_EQ(la[s], lo[s]) << name << " step " << s + 1;
  EXPECT_NE(la[iters - 1], lo[iters - 1]) << name;
  for (int s : compressed) {
    EXPECT_GT(bo[s - 1], 0.0);
    EXPECT_GE(ba[s - 1] / bo[s - 1], 16.0) << name << " step " << s << ": " << ba[s - 1] << " vs " << bo[s - 1];
  }
  for (int s = 1; s <= iters; ++s) {
    if (std::find(compressed.begin(), compressed.end(), s) == compressed.end()) {
      EXPECT_EQ(ba[s - 1], bo[s - 1]) << name << " step " << s << " is a full-precision step";
    }
  }
  ASSERT_EQ(run(launch + write_config(name + "-resumed", b) + " --resume " + dir() + "/ckpt-" + name + "/step-" +
                    std::to_string(resume_at) + " --metrics " + m + "-resumed.jsonl",
                nullptr, &err),
            0)
      << err;
  const auto lr = values(m + "-resumed.jsonl", "loss");
  ASSERT_EQ(lr.size(), static_cast<size_t>(iters - resume_at));
  for (int s = resume_at; s < iters; ++s) EXPECT_EQ(lr[s - resume_at], lo[s]) << name << " resumed step " << s + 1;
  const auto vo = values(m + ".jsonl", "val_loss"), vr = values(m + "-resumed.jsonl", "val_loss");
  ASSERT_FALSE(vr.empty());
  EXPECT_EQ(vr.back(), vo.back());
}

// var_update_scaler 2: variance steps (DeepSpeed's s = t + 1) at t = 1, 2, 3, 5; compressed
// gradients at 4, 6; frozen after 6; local_step_scaler 1, clipper 2: syncs at 7, 9, local steps
// (no communication) at 8, 10. The checkpoint at 8 holds a half-accumulated momentum.
TEST(OneBitMpi, ZeroOneAdamVarianceStepsAreAdamThenCompressedAndLocalStepsAndResume) {
  nlohmann::json twin = {{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.01}, {"bias_correction", false}}}}}};
  nlohmann::json zo = {{"optimizer",
                        {{"type", "ZeroOneAdam"},
                         {"params", {{"lr", 0.01}, {"weight_decay", 0.01}, {"var_freeze_step", 6}, {"var_update_scaler", 2},
                                     {"local_step_scaler", 1}, {"local_step_clipper", 2}, {"comm_backend_name", "mpi"}}}}}};
  check_against_twin("zoadam", twin, zo, 10, 4, {4, 6, 7, 8, 9, 10}, 8);
}

// freeze_step 4: Lamb updates 1-3 (DeepSpeed's steps 2-4), compressed from update 4 on.
TEST(OneBitMpi, OneBitLambWarmupIsLambThenCompressedAndResume) {
  nlohmann::json twin = {{"optimizer", {{"type", "Lamb"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.01}, {"bias_correction", false}}}}}};
  nlohmann::json ob = {{"optimizer",
                        {{"type", "OneBitLamb"},
                         {"params", {{"lr", 0.01}, {"weight_decay", 0.01}, {"freeze_step", 4}, {"comm_backend_name", "mpi"}}}}}};
  check_against_twin("onebitlamb", twin, ob, 8, 4, {4, 5, 6, 7, 8}, 5);
}

TEST(OneBitMpi, RefusedWithZeroStagesAndOtherBackends) {
  mt::cli::testing::write_chain_dataset(dir() + "/train", 30);
  nlohmann::json z = kOneBit;
  z["zero_optimization"] = {{"stage", 1}};
  std::string err;
  EXPECT_EQ(run("train " + write_config("zero", z), nullptr, &err), 2);
  EXPECT_NE(err.find("zero_optimization.stage 1 with optimizer.type OneBitAdam"), std::string::npos) << err;
  for (const char* type : {"ZeroOneAdam", "OneBitLamb"}) {
    nlohmann::json o = z;
    o["optimizer"] = {{"type", type}, {"params", {{"lr", 0.01}}}};
    EXPECT_EQ(run("train " + write_config(std::string("zero-") + type, o), nullptr, &err), 2);
    EXPECT_NE(err.find(std::string("zero_optimization.stage 1 with optimizer.type ") + type), std::string::npos) << err;
  }
  nlohmann::json nccl = kOneBit;
  nccl["optimizer"]["params"]["comm_backend_name"] = "gloo";
  EXPECT_EQ(run("train " + write_config("nccl", nccl), nullptr, &err), 2);
  EXPECT_NE(err.find("optimizer.params.comm_backend_name: \"gloo\" is not a DeepSpeed backend"), std::string::npos) << err;
  // DeepSpeed's Ascend backend is one of its names: refused as not supported here, not as unknown.
  nccl["optimizer"]["params"]["comm_backend_name"] = "hccl";
  EXPECT_EQ(run("train " + write_config("hccl", nccl), nullptr, &err), 2);
  EXPECT_NE(err.find("\"hccl\" (DeepSpeed's backend for Ascend NPUs) is not supported here"), std::string::npos) << err;
}

}  // namespace
