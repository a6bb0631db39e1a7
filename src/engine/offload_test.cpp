// ZeRO-Infinity's offload_optimizer device "nvme": the AdamW moments swapped to disk in
// sub-groups. The run must equal the same run in memory bit for bit (the update is the same
// elementwise kernel on the same elements), at every ZeRO stage, on 1 and 2 ranks, pipelined or
// not; its keys parse as DeepSpeed's and what it cannot do is refused by key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "engine/layout_test_util.h"

namespace mt::engine {
namespace {

const char* kGpt2 = R"({"model": {"model_type": "gpt2", "vocab_size": 97, "n_positions": 32, "n_embd": 48, "n_layer": 3, "n_head": 4}})";

std::string swap_root() {
  return std::string(MT_GOLDEN_DIR) + "/../offload_test-" + std::to_string(::getpid());
}

nlohmann::json config(int stage, int dp, const std::string& dtype, bool nvme, bool pipeline) {
  auto j = layout_config(kGpt2, dtype, dp, 1);
  j["zero_optimization"] = {{"stage", stage}};
  if (nvme) {
    j["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", swap_root()}, {"buffer_count", 3},
                                                   {"pipeline_read", pipeline}, {"pipeline_write", pipeline}};
    j["zero_optimization"]["sub_group_size"] = 5000;  // several sub-groups, a ragged last one
    j["aio"] = {{"block_size", 8192}, {"queue_depth", 4}, {"thread_count", 2}};
  }
  return j;
}

void expect_same(const LayoutRun& a, const LayoutRun& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t s = 0; s < a.losses.size(); ++s) {
    EXPECT_EQ(a.losses[s], b.losses[s]) << what << " step " << s;
    EXPECT_EQ(a.norms[s], b.norms[s]) << what << " step " << s;
  }
  ASSERT_EQ(a.master.size(), b.master.size()) << what;
  ASSERT_FALSE(a.master.empty());
  EXPECT_EQ(std::memcmp(a.master.data(), b.master.data(), a.master.size() * 4), 0) << what;
  ASSERT_EQ(a.exp_avg.size(), b.exp_avg.size()) << what;
  EXPECT_EQ(std::memcmp(a.exp_avg.data(), b.exp_avg.data(), a.exp_avg.size() * 4), 0) << what;
  EXPECT_EQ(a.eval_loss, b.eval_loss) << what;
}

TEST(NvmeOffload, OptimizerOnDiskEqualsInMemoryBitForBit) {
  for (int dp : {1, 2})
    for (int stage : {1, 2, 3}) {
      const std::string what = "dp " + std::to_string(dp) + " stage " + std::to_string(stage);
      LayoutRun mem = layout_train(config(stage, dp, "fp32", false, false), dp, 1, "memory");
      LayoutRun disk = layout_train(config(stage, dp, "fp32", true, stage != 2), dp, 1, "nvme");
      expect_same(mem, disk, what);
      // The swap files exist where DeepSpeed puts them, one folder per rank.
      for (int r = 0; r < dp; ++r)
        EXPECT_TRUE(std::filesystem::exists(swap_root() + "/zero_stage_" + std::to_string(stage) + "/optimizer/rank" +
                                            std::to_string(r) + "/exp_avg.swp"))
            << what;
    }
  LayoutRun mem = layout_train(config(3, 1, "bf16", false, false), 1, 1, "memory bf16");
  LayoutRun disk = layout_train(config(3, 1, "bf16", true, true), 1, 1, "nvme bf16");
  expect_same(mem, disk, "bf16 stage 3");
  std::filesystem::remove_all(swap_root());
}

// ZeRO-Infinity at stage 3: master weights, gradients and moments all on disk. Every unit's master
// piece is read back for its gather, every reduced gradient is summed on its record, the clipping
// norm is taken as the gradients go out — and the run is still the in-memory run bit for bit:
// 1 and 2 ranks, 2 micro-batches a step (the gradient records are read, added to and rewritten),
// units gathered at use or persistent, with and without overlap_comm, fp32 and bf16.
TEST(NvmeOffload, ParametersGradientsAndOptimizerOnDiskEqualInMemory) {
  struct Case {
    int dp;
    const char* dtype;
    bool overlap;
    int64_t persistence;
  };
  for (Case k : {Case{1, "fp32", false, 0}, Case{2, "fp32", true, 0}, Case{2, "bf16", false, 0},
                 Case{2, "fp32", false, 100000}, Case{1, "bf16", true, 100000},
                 Case{1, "bf16", false, 0}}) {  // one rank, bf16: views converted from the piece read
    const std::string what = "dp " + std::to_string(k.dp) + " " + k.dtype + (k.overlap ? " overlap" : "") +
                             " persistence " + std::to_string(k.persistence);
    auto cfg = [&](bool nvme) {
      auto j = layout_config(kGpt2, k.dtype, k.dp, 2);
      j["zero_optimization"] = {{"stage", 3}, {"overlap_comm", k.overlap},
                                {"stage3_param_persistence_threshold", k.persistence}};
      if (nvme) {
        j["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", swap_root()},
                                                       {"pipeline_read", true}, {"pipeline_write", true}};
        j["zero_optimization"]["offload_param"] = {{"device", "nvme"}, {"nvme_path", swap_root()}};
        j["zero_optimization"]["sub_group_size"] = 6000;
        j["aio"] = {{"block_size", 8192}, {"thread_count", 2}};
      }
      return j;
    };
    LayoutRun mem = layout_train(cfg(false), k.dp, 2, "memory");
    LayoutRun disk = layout_train(cfg(true), k.dp, 2, "nvme");
    expect_same(mem, disk, what);
    EXPECT_TRUE(std::filesystem::exists(swap_root() + "/zero_stage_3/param/rank0/params.swp")) << what;
    EXPECT_TRUE(std::filesystem::exists(swap_root() + "/zero_stage_3/param/rank0/grads.swp")) << what;
  }
  std::filesystem::remove_all(swap_root());
}

// Ulysses (parallel.sp 2: the ZeRO group is dp x sp) with ZeRO-Infinity (stop 80; refused before):
// the moments on disk at stages 1-3, and at stage 3 the parameters and gradients too, each rank
// its own folder; still the in-memory Ulysses run bit for bit.
TEST(NvmeOffload, UlyssesOnDiskEqualsInMemoryBitForBit) {
  auto cfg = [](int stage, bool nvme, bool params) {
    auto j = config(stage, 1, "fp32", nvme, true);
    j["parallel"] = {{"sp", 2}};
    if (params) {
      j["zero_optimization"]["offload_param"] = {{"device", "nvme"}, {"nvme_path", swap_root()}};
      j["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
    }
    return j;
  };
  for (int stage : {1, 2, 3}) {
    const std::string what = "sp 2 stage " + std::to_string(stage);
    LayoutRun mem = layout_train(cfg(stage, false, false), 2, 1, "memory");
    LayoutRun disk = layout_train(cfg(stage, true, false), 2, 1, "nvme");
    expect_same(mem, disk, what);
    for (int r = 0; r < 2; ++r)
      EXPECT_TRUE(std::filesystem::exists(swap_root() + "/zero_stage_" + std::to_string(stage) + "/optimizer/rank" +
                                          std::to_string(r) + "/exp_avg.swp"))
          << what;
  }
  LayoutRun mem = layout_train(cfg(3, false, false), 2, 1, "memory");
  LayoutRun disk = layout_train(cfg(3, true, true), 2, 1, "nvme params");
  expect_same(mem, disk, "sp 2 stage 3, parameters on disk");
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(std::filesystem::exists(swap_root() + "/zero_stage_3/param/rank" + std::to_string(r) + "/params.swp"));
  std::filesystem::remove_all(swap_root());
}

std::string error_of(const nlohmann::json& j) {
  try {
    ds_config_parse(j, "cfg.json", 1);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(NvmeOffload, DeepSpeedKeysReadResolvedAndRefusedByKey) {
  auto j = config(2, 1, "fp32", true, true);
  j["aio"]["single_submit"] = true;
  RunConfig c = ds_config_parse(j, "cfg.json", 1);
  EXPECT_EQ(c.zero.offload_optimizer, "nvme");
  EXPECT_EQ(c.zero.optimizer_nvme_path, swap_root());
  EXPECT_EQ(c.zero.optimizer_buffer_count, 3);
  EXPECT_TRUE(c.zero.pipeline_read && c.zero.pipeline_write);
  EXPECT_EQ(c.zero.sub_group_size, 5000);
  EXPECT_EQ(c.aio.block_size, 8192);
  EXPECT_EQ(c.aio.queue_depth, 4);
  EXPECT_EQ(c.aio.thread_count, 2);
  EXPECT_TRUE(c.aio.single_submit);
  RunConfig back = ds_config_parse(ds_config_resolved(c), "resolved", 1);
  EXPECT_EQ(back.zero.optimizer_nvme_path, swap_root());
  EXPECT_EQ(back.zero.sub_group_size, 5000);
  EXPECT_EQ(back.aio.block_size, 8192);
  EXPECT_TRUE(back.aio.single_submit);
  // DeepSpeed's defaults: 4 buffers, no pipelining, 1 MiB blocks, depth 8, one thread.
  j = config(2, 1, "fp32", false, false);
  j["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", "/x"}};
  c = ds_config_parse(j, "cfg.json", 1);
  EXPECT_EQ(c.zero.optimizer_buffer_count, 4);
  EXPECT_FALSE(c.zero.pipeline_read || c.zero.pipeline_write);
  EXPECT_EQ(c.zero.sub_group_size, 1000000000);
  EXPECT_EQ(c.aio.block_size, 1048576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.thread_count, 1);
  const std::pair<std::function<void(nlohmann::json&)>, std::string> refusals[] = {
      {[](nlohmann::json& k) { k["zero_optimization"]["offload_optimizer"].erase("nvme_path"); },
       "zero_optimization.offload_optimizer.nvme_path: device 'nvme' needs the swap directory"},
      {[](nlohmann::json& k) { k["zero_optimization"]["offload_optimizer"]["buffer_count"] = 1; },
       "zero_optimization.offload_optimizer.buffer_count must be 2 to 64"},
      {[](nlohmann::json& k) { k["optimizer"] = {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}; },
       "zero_optimization.offload_optimizer.device 'nvme' with optimizer.type SGD"},
      {[](nlohmann::json& k) {
         k["zero_optimization"]["stage"] = 3;
         k["zero_optimization"]["offload_optimizer"]["device"] = "cpu";
         k["zero_optimization"]["offload_param"] = {{"device", "nvme"}, {"nvme_path", "/x"}};
       },
       "zero_optimization.offload_param.device 'nvme' needs zero_optimization.offload_optimizer.device 'nvme'"},
      {[](nlohmann::json& k) {
         k["zero_optimization"]["stage"] = 3;
         k["zero_optimization"]["offload_param"] = {{"device", "nvme"}};
       },
       "zero_optimization.offload_param.nvme_path: device 'nvme' needs the swap directory"},
      {[](nlohmann::json& k) {
         k["zero_optimization"]["stage"] = 3;
         k["zero_optimization"]["offload_param"] = {{"device", "nvme"}, {"nvme_path", "/x"}};
         k["bf16"] = {{"enabled", true}, {"bf16_master_weights_and_grads", true}};
       },
       "zero_optimization.offload_param.device 'nvme' with 16-bit master weights"},
      {[](nlohmann::json& k) { k["aio"] = {{"use_gds", true}}; }, "aio.use_gds: GPUDirect Storage is not supported"},
      {[](nlohmann::json& k) { k["aio"] = {{"block_size", 1000}}; }, "aio.block_size must be a multiple of 4096"},
      {[](nlohmann::json& k) { k["aio"] = {{"queue_depth", 0}}; }, "aio.queue_depth must be 1 to 4096"},
      {[](nlohmann::json& k) { k["zero_optimization"]["sub_group_size"] = 0; }, "zero_optimization.sub_group_size must be positive"},
      {[](nlohmann::json& k) { k["zero_optimization"]["stage"] = 0; }, "offload_optimizer needs stage 1, 2 or 3"},
  };
  for (const auto& [edit, want] : refusals) {
    nlohmann::json k = j;
    edit(k);
    const std::string err = error_of(k);
    EXPECT_NE(err.find(want), std::string::npos) << want << "\n got: " << err;
  }
  // Without nvme, sub_group_size tunes nothing: one warning line.
  j = config(2, 1, "fp32", false, false);
  j["zero_optimization"]["sub_group_size"] = 1e8;
  c = ds_config_parse(j, "cfg.json", 1);
  EXPECT_TRUE(std::any_of(c.warnings.begin(), c.warnings.end(),
                          [](const std::string& w) { return w.find("zero_optimization.sub_group_size") != std::string::npos; }));
}

}  // namespace
}  // namespace mt::engine
