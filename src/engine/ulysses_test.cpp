// DeepSpeed-Ulysses sequence parallelism (parallel.sp, parallel/sp/ulysses.h) against one process
// with the same global batch: ranks are threads over the local backend. world = sp x dp; the ranks
// of an sp group read the same samples and each keeps seq_length / sp tokens of every one. The
// data masks targets (-100) unevenly between the halves of a sample, so a loss that averaged each
// rank's own mean (instead of the sample's sum over its count) would differ. Losses, gradient
// norms and the final weights must equal the one-process run's; a checkpoint saved at sp 2 resumes
// on one process and the other way round.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/local_backend.h"
#include "engine/checkpoint_io.h"
#include "engine/engine.h"
#include "engine/layout_test_util.h"

namespace mt::engine {
namespace {

// layout_sample with ignored targets: about a quarter of the positions, and the whole second half
// of every third sample (a rank of an sp 2 group then holds no target at all).
void masked_sample(uint64_t k, int32_t* tok, int32_t* tgt) {
  layout_sample(k, tok, tgt);
  for (int i = 0; i < 16; ++i)
    if ((k * 7 + static_cast<uint64_t>(i) * 3) % 4 == 0 || (k % 3 == 0 && i >= 8)) tgt[i] = -100;
}

// masked_sample with documents: token 7 (data.eod_id) ends one at positions 2, 6 and 9 (even
// samples) or 5 and 12 (odd): documents that cross the sp ranks' shares (8 or 4 tokens).
void document_sample(uint64_t k, int32_t* tok, int32_t* tgt) {
  masked_sample(k, tok, tgt);
  for (int i = 0; i < 16; ++i)
    if (tok[i] == 7) tok[i] = 8;
  for (int i : k % 2 == 0 ? std::vector<int>{2, 6, 9} : std::vector<int>{5, 12}) tok[i] = 7;
}

struct Case {
  const char* arch;
  int sp, dp, stage;
  const char* dtype;
  bool recompute = false;
  // "": plain; "documents": data.reset_position_ids and reset_attention_mask; "dropout": GPT-2's
  // three rates; "tokens": loss_normalization "tokens"; "overflow": fp16 from a loss scale of 2^20,
  // whose first steps overflow (every rank of the group must skip the same ones); "curriculum": a
  // seqlen curriculum (each step's shorter samples split over the sp ranks); "sparse": DeepSpeed's
  // block-sparse attention, a layout per head (each rank plans its heads' over the whole samples).
  const char* with = "";
  int tp = 1;  // parallel.tp: each tp rank's heads split over its sp group (stop 80)
  bool megatron_sp = false;  // parallel.sequence_parallel (Megatron's, over the tp group)
  int pp = 1;  // parallel.pp: each stage's ranks in sp groups of their own (stop 80)
  int v = 1;   // parallel.virtual_stages (interleaved; the model then has pp x v layers)
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(c.arch) + "_sp" + std::to_string(c.sp) + "_dp" + std::to_string(c.dp) +
         (c.tp > 1 ? "_tp" + std::to_string(c.tp) : std::string()) + (c.megatron_sp ? "_megatron_sp" : "") +
         (c.pp > 1 ? "_pp" + std::to_string(c.pp) : std::string()) + (c.v > 1 ? "_interleaved" + std::to_string(c.v) : "") + "_stage" +
         std::to_string(c.stage) + "_" + c.dtype + (c.recompute ? "_recompute" : "") + (*c.with ? "_" : "") + c.with;
}

void PrintTo(const Case& c, std::ostream* os) { *os << case_name({c, 0}); }

nlohmann::json config(const Case& k, int processes, int g) {
  auto j = layout_config(layout_model(k.arch, std::max(2, k.pp * k.v)).dump().c_str(), k.dtype, processes == 1 ? 1 : k.dp, g);
  if (k.recompute) j["activation_checkpointing"] = {{"enabled", true}};
  // fp16: one process at the layout's stage too (DeepSpeed's fp16 wrapper at stage 0 takes a step of
  // zero gradients as it is built, ZeRO's optimizers none).
  const bool fp16 = std::string(k.dtype) == "fp16";
  j["zero_optimization"] = {{"stage", processes == 1 && !fp16 ? 0 : k.stage}, {"reduce_bucket_size", 3000}};
  if (processes > 1) j["parallel"] = {{"sp", k.sp}, {"tp", k.tp}, {"sequence_parallel", k.megatron_sp}, {"pp", k.pp}};
  if (processes > 1 && k.v > 1) {
    j["parallel"]["pipeline_schedule"] = "interleaved";
    j["parallel"]["virtual_stages"] = k.v;
  }
  const std::string with = k.with;
  if (with == "documents") j["data"] = {{"eod_id", 7}, {"reset_position_ids", true}, {"reset_attention_mask", true}};
  if (with == "dropout") {
    j["model"]["embd_pdrop"] = 0.1;
    j["model"]["resid_pdrop"] = 0.2;
    j["model"]["attn_pdrop"] = 0.15;
  }
  if (with == "tokens") j["loss_normalization"] = "tokens";
  if (with == "overflow") j["fp16"]["initial_scale_power"] = 20;  // steps 1, 2 and 4 overflow and are skipped
  if (with == "sparse")  // random blocks drawn per head: a rank that planned another head's layout differs
    j["sparse_attention"] = {{"mode", "variable"},          {"block", 4},
                             {"num_random_blocks", 1},      {"local_window_blocks", {1}},
                             {"global_block_indices", {0}}, {"different_layout_per_head", true}};
  if (with == "curriculum")  // 8, 8, 12, 12, 12, 16... tokens a sample (Megatron-DeepSpeed's tokens[:, :L])
    j["curriculum_learning"] = {{"enabled", true}, {"curriculum_type", "seqlen"}, {"min_difficulty", 8}, {"max_difficulty", 16},
                                {"schedule_type", "fixed_linear"},
                                {"schedule_config", {{"total_curriculum_step", 6}, {"difficulty_step", 4}}}};
  return j;
}

class UlyssesMatchesOneProcess : public ::testing::TestWithParam<Case> {};

TEST_P(UlyssesMatchesOneProcess, LossesNormsAndFinalState) {
  const Case& k = GetParam();
  const int g = 2;
  const LayoutSampleFn sample = std::string(k.with) == "documents" ? document_sample : masked_sample;
  LayoutRun ref = layout_train(config(k, 1, g * k.dp), 1, g * k.dp, "ulysses_test", sample);
  const int processes = k.sp * k.dp * k.tp * k.pp;
  LayoutRun got = layout_train(config(k, processes, g), processes, g, "ulysses_test", sample);
  // fp32: the same arithmetic up to summation order (the loss's sum over the group, the gradients'
  // over dp x sp): 1e-5. bf16: as the tp and ZeRO layouts' bounds.
  const bool bf16 = std::string(k.dtype) != "fp32";
  const double tol = bf16 ? 2e-3 : 1e-5;
  ASSERT_EQ(ref.losses.size(), got.losses.size());
  double worst_loss = 0.0;
  int skipped = 0;
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    worst_loss = std::max(worst_loss, std::fabs(static_cast<double>(got.losses[s]) - ref.losses[s]) / std::fabs(ref.losses[s]));
    EXPECT_NEAR(got.losses[s], ref.losses[s], tol * std::fabs(ref.losses[s])) << "loss at step " << s + 1;
    if (std::isfinite(ref.norms[s])) {
      EXPECT_NEAR(got.norms[s], ref.norms[s], (bf16 ? 2e-2 : 1e-4) * ref.norms[s]) << "grad norm at step " << s + 1;
    } else {  // an fp16 overflow: skipped by every rank of the group as by one process
      EXPECT_FALSE(std::isfinite(got.norms[s])) << "step " << s + 1 << " overflowed on one process only";
      ++skipped;
    }
  }
  if (std::string(k.with) == "curriculum" || std::string(k.with) == "sparse") {
    // The curriculum is taken (the first step trains 8 tokens a sample, not 16), the layout too.
    Case plain = k;
    plain.with = "";
    EXPECT_NE(layout_train(config(plain, 1, g * k.dp), 1, g * k.dp, "ulysses_test", sample).losses[0], ref.losses[0]);
  }
  if (std::string(k.with) == "overflow") {
    EXPECT_GE(skipped, 1) << "no step overflowed";
    EXPECT_LE(skipped, 5) << "too few steps trained";
  }
  EXPECT_NEAR(got.eval_loss, ref.eval_loss, tol * std::fabs(ref.eval_loss)) << "evaluate()";
  ASSERT_EQ(ref.master.size(), got.master.size());
  LayoutDiff w = layout_compare(ref.master, got.master, ref.noise);
  std::printf("%s: losses max rel %.2e, final weights ||dw||/||w|| %.2e, max %.2e\n", case_name({k, 0}).c_str(), worst_loss,
              w.norm_rel, w.max_rel);
  // fp32 with dropout under tp x sp: the summation order's differences pass the masks' 1/(1 - p)
  // three times a block (1.05e-5 and 8.9e-5 measured; a wrong mask moves the weights by ~1e-2).
  // Sparse attention over a share of the heads: up to 9.4e-6 and 1.7e-4 measured, as tp 2 alone
  // (7.5e-6, 1.4e-4; the same layout over dp 2: 6e-8); another head's layout gives 2.3e-2.
  const bool sparse = std::string(k.with) == "sparse";
  const double slack = sparse || (std::string(k.with) == "dropout" && k.tp > 1) ? 3.0 : 1.0;
  EXPECT_LE(w.norm_rel, bf16 ? 2e-3 : slack * 1e-5) << "final weights, ||dw||/||w||";
  EXPECT_LE(w.max_rel, bf16 ? 2e-2 : (sparse ? 8.0 : slack) * 5e-5) << "final weights, max |dw| / max |w|";
  EXPECT_LE(w.noise_max, 1e-3) << "GPT-2 key bias";
}

// LLaMA's tiny model has 8 heads over 4 kv heads (GQA): sp 2 gives each rank 4 over 2, sp 4 2 over 1.
INSTANTIATE_TEST_SUITE_P(
    Layouts, UlyssesMatchesOneProcess,
    ::testing::Values(Case{"gpt2", 2, 1, 0, "fp32"}, Case{"llama", 2, 1, 0, "fp32"}, Case{"gpt2", 2, 1, 1, "bf16"},
                      Case{"llama", 2, 1, 2, "bf16"}, Case{"llama", 2, 1, 1, "fp32", true}, Case{"gpt2", 2, 2, 2, "fp32"},
                      Case{"llama", 2, 2, 1, "fp32"}, Case{"llama", 4, 1, 0, "fp32"},
                      // stop 78: ZeRO 3 (its partitions over dp x sp), documents, dropout, "tokens".
                      Case{"llama", 2, 1, 3, "fp32"}, Case{"gpt2", 2, 2, 3, "bf16"}, Case{"llama", 2, 1, 1, "fp32", false, "documents"},
                      Case{"gpt2", 4, 1, 0, "fp32", true, "documents"}, Case{"gpt2", 2, 1, 1, "fp32", false, "dropout"},
                      Case{"gpt2", 4, 1, 3, "fp32", true, "dropout"}, Case{"llama", 2, 2, 2, "fp32", false, "tokens"},
                      // fp16 with its loss scaler (stop 80).
                      Case{"gpt2", 2, 1, 1, "fp16"}, Case{"llama", 2, 2, 3, "fp16", false, "overflow"}, Case{"llama", 2, 1, 0, "fp16"},
                      // With tp (stop 80): 2 x 2 and 2 x 2 x dp 2.
                      Case{"gpt2", 2, 1, 0, "fp32", false, "", 2}, Case{"llama", 2, 1, 1, "fp32", true, "documents", 2},
                      Case{"llama", 2, 2, 2, "bf16", false, "", 2}, Case{"gpt2", 2, 1, 3, "fp32", false, "dropout", 2},
                      Case{"llama", 2, 1, 1, "fp32", false, "", 2, true},
                      // With pp (stop 80): 2 stages of sp 2, and x dp 2, x tp 2.
                      Case{"gpt2", 2, 1, 0, "fp32", false, "", 1, false, 2}, Case{"llama", 2, 2, 1, "bf16", true, "documents", 1, false, 2},
                      Case{"gpt2", 2, 1, 0, "fp32", false, "dropout", 2, false, 2},
                      Case{"llama", 2, 1, 1, "fp32", true, "", 1, false, 2, 2},  // interleaved over 2 chunks a rank
                      // A seqlen curriculum (stop 80): alone, and over sp 4 with a pipeline.
                      Case{"llama", 2, 1, 1, "fp32", false, "curriculum"}, Case{"gpt2", 4, 1, 0, "fp32", false, "curriculum", 1, false, 2},
                      // Sparse attention (stop 80): sp 2, and tp 2 x sp 2 (a head a rank).
                      Case{"llama", 2, 1, 1, "fp32", false, "sparse"}, Case{"llama", 2, 1, 0, "fp32", true, "sparse", 2}),
    case_name);

// A layout's master weights and Adam moments (gathered to the one-process layout) after loading
// `load` (if given) and training `steps` steps; saved to `save` (if given).
struct State {
  std::vector<float> master, exp_avg;
};
State run(const nlohmann::json& cfg, int processes, int steps, const std::string& load, const std::string& save) {
  return layout_rank0<State>(processes, [&](comm::Backend& b) {
    RunConfig c = ds_config_parse(cfg, "ulysses_test", processes);
    std::shared_ptr<comm::Backend> world(&b, [](comm::Backend*) {});
    auto ctx = engine_parallel_context(c, processes > 1 ? world : nullptr);
    auto model = engine_build_model(c, ctx);
    Engine eng(c, *model, ctx);
    if (!load.empty()) checkpoint_load(eng, load);
    const int g = static_cast<int>(c.batch.gradient_accumulation_steps), dp = ctx->data_dp(), d = ctx->data_rank();
    for (int step = 0; step < steps; ++step) {
      uint64_t next = static_cast<uint64_t>(eng.global_step()) * static_cast<uint64_t>(g * dp) + static_cast<uint64_t>(d * g);
      eng.train_batch([&](int32_t* t, int32_t* y) { masked_sample(next++, t, y); });
    }
    if (!save.empty()) checkpoint_save(eng, save, 0);
    State s;
    eng.gather_master(s.master);
    for (auto& [name, v] : eng.gather_optimizer_state())
      if (name == "exp_avg") s.exp_avg = std::move(v);
    return s;
  });
}

// Weights are replicated over sp as over dp: a checkpoint of sp 2 (ZeRO 1: each rank its partition)
// resumes on one process, and one process's at sp 2; either way the run goes on as one process's.
TEST(Ulysses, CheckpointsMoveBetweenSpAndOneProcess) {
  namespace fs = std::filesystem;
  const std::string dir = fs::temp_directory_path().string() + "/mt_ulysses_test_" + std::to_string(getpid());
  fs::remove_all(dir);
  const Case k{"llama", 2, 1, 1, "fp32"};
  State one6 = run(config(k, 1, 2), 1, 6, "", "");
  State sp3 = run(config(k, 2, 2), 2, 3, "", dir + "/sp");
  State one3 = run(config(k, 1, 2), 1, 3, "", dir + "/one");
  EXPECT_LE(layout_compare(one3.master, sp3.master, {}).norm_rel, 1e-5);
  // The index names the layout: dp 1 and sp 2 (it wrote dp 2, the ZeRO group, and no sp).
  const std::string index_path = checkpoint_resolve(dir + "/sp") + "/meshtrain.index.json";
  if (std::filesystem::exists(index_path)) {
    const nlohmann::json index = nlohmann::json::parse(std::ifstream(index_path));
    EXPECT_EQ(index["layout"]["dp"], 1);
    EXPECT_EQ(index["layout"]["sp"], 2);
    EXPECT_EQ(index["layout"]["world"], 2);
  } else {
    ADD_FAILURE() << "no " << index_path;
  }
  // sp 2's checkpoint, three more steps on one process; one process's, three more at sp 2.
  State from_sp = run(config(k, 1, 2), 1, 3, checkpoint_resolve(dir + "/sp"), "");
  State from_one = run(config(k, 2, 2), 2, 3, checkpoint_resolve(dir + "/one"), "");
  for (const State* s : {&from_sp, &from_one}) {
    ASSERT_EQ(s->master.size(), one6.master.size());
    EXPECT_LE(layout_compare(one6.master, s->master, {}).norm_rel, 1e-5) << (s == &from_sp ? "sp 2 -> 1" : "1 -> sp 2");
    EXPECT_LE(layout_compare(one6.exp_avg, s->exp_avg, {}).norm_rel, 1e-4) << (s == &from_sp ? "sp 2 -> 1" : "1 -> sp 2");
  }
  fs::remove_all(dir);
}

// What the model itself refuses (a layout built without ds_config's checks): heads that do not split.
TEST(Ulysses, HeadsThatDoNotSplitAreRefusedByName) {
  auto j = layout_config(layout_model("llama", 2).dump().c_str(), "fp32", 1, 1);
  j["parallel"] = {{"sp", 8}};
  j["seq_length"] = 16;
  try {
    ds_config_parse(j, "ulysses_test", 8);
    FAIL() << "num_key_value_heads 4 over sp 8 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_attention_heads (8) and model.num_key_value_heads (4) must be divisible by 8"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mt::engine
