// communication_data_type: data-parallel gradients rounded to bf16/f16 and summed in that type on
// the wire. At every ZeRO stage on 2 ranks the weights stay within 16-bit rounding of the
// one-process run and are measurably not the f32-wire weights of that stage (the path is taken);
// GradBuckets' exact rounding is checked in parallel/dp/grad_buckets_test.cpp.
#include <gtest/gtest.h>

#include <string>

#include "engine/layout_test_util.h"

namespace mt::engine {
namespace {

const char* kGpt2 = R"({"model": {"model_type": "gpt2", "vocab_size": 97, "n_positions": 32, "n_embd": 48, "n_layer": 3, "n_head": 4}})";

nlohmann::json wire_config(int stage, const char* comm) {
  auto j = layout_config(kGpt2, "fp32", 2, 1);
  j["zero_optimization"] = {{"stage", stage}, {"reduce_bucket_size", 3000}};
  if (comm) j["communication_data_type"] = comm;
  return j;
}

TEST(CommDtype, SixteenBitWireAtEveryStage) {
  auto one = layout_config(kGpt2, "fp32", 1, 2);  // the same global batch of 2 in one process
  LayoutRun ref = layout_train(one, 1, 2, "one");
  for (int stage : {0, 1, 2, 3}) {
    LayoutRun f32 = layout_train(wire_config(stage, "fp32"), 2, 1, "f32 wire");
    const LayoutDiff f32_vs_one = layout_compare(ref.master, f32.master, ref.noise);
    EXPECT_LT(f32_vs_one.norm_rel, 1e-5) << "stage " << stage;
    for (const char* comm : {"bf16", "fp16"}) {
      LayoutRun z = layout_train(wire_config(stage, comm), 2, 1, comm);
      const LayoutDiff vs_f32 = layout_compare(f32.master, z.master, ref.noise);
      const LayoutDiff vs_one = layout_compare(ref.master, z.master, ref.noise);
      EXPECT_GT(vs_f32.norm_rel, 10 * f32_vs_one.norm_rel) << comm << " stage " << stage << ": the 16-bit wire changes nothing";
      // Adam turns the rounding of each gradient (2^-9 relative in bf16, 2^-12 in fp16) into
      // weight differences of ~2e-3 (bf16) and ~6e-4 (fp16) of ||w|| after 10 steps.
      EXPECT_LT(vs_one.norm_rel, std::string(comm) == "bf16" ? 4e-3 : 1.5e-3) << comm << " stage " << stage;
      for (size_t s = 0; s < ref.losses.size(); ++s)
        EXPECT_NEAR(z.losses[s], ref.losses[s], 2e-3) << comm << " stage " << stage << " step " << s;
    }
  }
  // Stages 0 and 1 reduce each gradient once per step (the accumulated slab), so they round alike;
  // stages 2 and 3 reduce the tied GPT-2 table twice (after the head, after the embedding).
  for (const char* comm : {"bf16", "fp16"}) {
    LayoutRun s0 = layout_train(wire_config(0, comm), 2, 1, comm);
    LayoutRun s1 = layout_train(wire_config(1, comm), 2, 1, comm);
    EXPECT_LT(layout_compare(s0.master, s1.master, ref.noise).norm_rel, 1e-5) << comm;
  }
}

// With Ulysses (parallel.sp 2: the two ranks hold halves of each sample, and their partial weight
// gradients are summed) DeepSpeed reduces in seq_parallel_communication_data_type, fp32 unless
// given, whatever communication_data_type says. communication_data_type "bf16" alone reduced in
// bf16 here before.
TEST(CommDtype, UlyssesReducesInTheSequenceParallelType) {
  LayoutRun ref = layout_train(layout_config(kGpt2, "fp32", 1, 2), 1, 2, "one");
  for (int stage : {0, 2}) {
    auto sp2 = [stage](const char* comm, const char* seq) {
      auto j = layout_config(kGpt2, "fp32", 1, 2);
      j["parallel"] = {{"sp", 2}};
      j["zero_optimization"] = {{"stage", stage}, {"reduce_bucket_size", 3000}};
      if (comm) j["communication_data_type"] = comm;
      if (seq) j["seq_parallel_communication_data_type"] = seq;
      return j;
    };
    LayoutRun f32 = layout_train(sp2(nullptr, nullptr), 2, 2, "sp 2");
    const LayoutDiff f32_vs_one = layout_compare(ref.master, f32.master, ref.noise);
    EXPECT_LT(f32_vs_one.norm_rel, 1e-5) << "stage " << stage;
    LayoutRun dp_key = layout_train(sp2("bf16", nullptr), 2, 2, "communication_data_type bf16");
    EXPECT_LT(layout_compare(f32.master, dp_key.master, ref.noise).norm_rel, 1e-6)
        << "stage " << stage << ": communication_data_type changed the Ulysses reduction";
    LayoutRun seq = layout_train(sp2("fp32", "bf16"), 2, 2, "seq_parallel_communication_data_type bf16");
    EXPECT_GT(layout_compare(f32.master, seq.master, ref.noise).norm_rel, 10 * f32_vs_one.norm_rel)
        << "stage " << stage << ": seq_parallel_communication_data_type bf16 changes nothing";
    EXPECT_LT(layout_compare(ref.master, seq.master, ref.noise).norm_rel, 4e-3) << "stage " << stage;
  }
}

TEST(CommDtype, ParsedRefusedAndResolved) {
  auto j = wire_config(0, "bfp16");
  EXPECT_EQ(ds_config_parse(j, "t", 2).comm_dtype, DType::kBF16);
  j["communication_data_type"] = "FP16";
  RunConfig c = ds_config_parse(j, "t", 2);
  EXPECT_EQ(c.comm_dtype, DType::kF16);
  EXPECT_EQ(ds_config_parse(ds_config_resolved(c), "resolved", 2).comm_dtype, DType::kF16);
  j["optimizer"] = {{"type", "OneBitAdam"}, {"params", {{"lr", 1e-3}, {"freeze_step", 2}}}};
  try {
    ds_config_parse(j, "t", 2);
    ADD_FAILURE() << "OneBitAdam with a 16-bit wire was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("communication_data_type: 'fp16' with optimizer.type OneBitAdam"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mt::engine
