// Tensor parallelism (Megatron's split) against one process with the same global batch: ranks are
// threads over the local backend (the mpirun runs through `meshtrain launch` repeat a subset).
// world = tp x dp; the ranks of a tp group read the same micro-batches, dp rank d reads sequences
// d·g .. d·g+g-1 of each step. Losses, gradient norms and the final weights (gathered to the
// one-process layout, padding dropped) must equal the one-process run's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "comm/local_backend.h"
#include "engine/engine.h"
#include "engine/layout_test_util.h"

namespace mt::engine {
namespace {

struct Case {
  const char* arch;
  int tp, dp, stage;
  const char* dtype;
  bool recompute;
  bool sp = false;  // sequence parallelism
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(c.arch) + "_tp" + std::to_string(c.tp) + "_dp" + std::to_string(c.dp) + "_stage" +
         std::to_string(c.stage) + "_" + c.dtype + (c.recompute ? "_recompute" : "") + (c.sp ? "_sp" : "");
}

nlohmann::json config(const Case& k, int processes, int g) {
  auto j = layout_config(layout_model(k.arch, 2).dump().c_str(), k.dtype, processes == 1 ? 1 : processes / k.tp, g);
  if (k.recompute) j["activation_checkpointing"] = {{"enabled", true}};
  // The one process at ZeRO 1 where an fp16 layout runs ZeRO: DeepSpeed's fp16 wrapper at stage 0
  // takes a zero-gradient step as it is built, ZeRO's do not (Engine's constructor).
  const int ref_stage = std::string(k.dtype) == "fp16" && k.stage > 0 ? 1 : 0;
  j["zero_optimization"] = {{"stage", processes == 1 ? ref_stage : k.stage}, {"reduce_bucket_size", 3000},
                            {"stage3_param_persistence_threshold", 0}, {"stage3_prefetch_bucket_size", 20000}};
  if (processes > 1) j["parallel"] = {{"tp", k.tp}, {"sequence_parallel", k.sp}};
  return j;
}

// processes == 1: the reference (one process, g·dp micro-batches).
LayoutRun train(const Case& k, int processes, int g) { return layout_train(config(k, processes, g), processes, g, "tp_test"); }

class TpMatchesOneProcess : public ::testing::TestWithParam<Case> {};

TEST_P(TpMatchesOneProcess, LossesNormsAndFinalState) {
  const Case& k = GetParam();
  const int g = 2;
  LayoutRun ref = train(k, 1, g * k.dp);
  LayoutRun got = train(k, k.tp * k.dp, g);
  // fp32: the same arithmetic up to summation order (the row-parallel all-reduce sums partial
  // products in another order): 1e-5. bf16: a GEMM operand rounded from an f32 that differs in its
  // last bits moves by a bf16 ulp (4e-3): 2e-3 on losses, as for ZeRO's bf16 layouts.
  const bool bf16 = std::string(k.dtype) != "fp32";  // bf16 or fp16 (dynamic loss scale): same bounds
  const double tol = bf16 ? 2e-3 : 1e-5;
  ASSERT_EQ(ref.losses.size(), got.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], ref.losses[s], tol * std::fabs(ref.losses[s])) << "loss at step " << s + 1;
    EXPECT_NEAR(got.norms[s], ref.norms[s], (bf16 ? 2e-2 : 1e-4) * ref.norms[s]) << "grad norm at step " << s + 1;
  }
  ASSERT_EQ(ref.master.size(), got.master.size());  // padding never reaches the one-process layout
  // The weights: 1e-5 relative as a whole (fp32), and no single weight off by more than 5e-5 of
  // the largest (summation order moves single weights with near-zero gradients more).
  LayoutDiff w = layout_compare(ref.master, got.master, ref.noise);
  std::printf("%s: final weights ||dw||/||w|| %.2e, max %.2e\n", case_name({k, 0}).c_str(), w.norm_rel, w.max_rel);
  EXPECT_LE(w.norm_rel, bf16 ? 2e-3 : 1e-5) << "final weights, ||dw||/||w||";
  EXPECT_LE(w.max_rel, bf16 ? 2e-2 : 5e-5) << "final weights, max |dw| / max |w|";
  EXPECT_LE(w.noise_max, 1e-3) << "GPT-2 key bias";
  // Bytes handed to the tp collectives per step against Megatron's count: per micro-batch of N
  // tokens, 2 all-reduces of N·C in each layer's forward and 2 in its backward (+2 more when the
  // block is recomputed), one for the vocab-parallel embedding, one for the LM head's input
  // gradient, and 3 per-token floats for the cross-entropy (max; sum of exps and target logit).
  // Sequence parallel: each all-reduce becomes an all-gather (N·C/tp handed) and a reduce-scatter
  // (N·C handed), and the norms' weight gradients (2 per layer + the final one) are all-reduced;
  // the backward gathers the two saved norm outputs again (N·C/tp handed each), which are kept as
  // this rank's rows (Megatron's sharded inputs of the column-parallel layers). Those norm outputs,
  // and the final norm's rows for the head, are gathered in the compute dtype (e bytes an element);
  // everything else moves f32.
  {
    const bool gpt2 = std::string(k.arch) == "gpt2";
    const size_t N = 16, C = gpt2 ? 48 : 64, L = 2, NC = N * C, NlC = NC / static_cast<size_t>(k.tp);
    const size_t e = std::string(k.dtype) == "fp32" ? 4 : 2, f = sizeof(float);
    const size_t norm = gpt2 ? 2 * C : C;  // one norm's parameters
    const size_t fwd = k.sp ? 2 * (e * NlC + f * NC) : 2 * f * NC;
    const size_t bwd = k.sp ? 2 * f * (NlC + NC) + 2 * e * NlC + 2 * f * norm : 2 * f * NC;
    const size_t ends = k.sp ? f * NC + e * NlC + f * NC + f * NlC + f * norm : 2 * f * NC;  // embedding, head, their backward
    const size_t per_micro = L * (fwd + bwd + (k.recompute ? fwd : 0)) + ends + 3 * N * f;
    for (size_t b : got.tp_bytes) EXPECT_EQ(b, static_cast<size_t>(g) * per_micro);
    for (size_t b : ref.tp_bytes) EXPECT_EQ(b, 0u);  // one process: no collective
  }
  ASSERT_EQ(ref.exp_avg.size(), got.exp_avg.size());
  EXPECT_LE(layout_compare(ref.exp_avg, got.exp_avg, ref.noise).norm_rel, bf16 ? 2e-2 : 1e-4) << "Adam's first moment";
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, TpMatchesOneProcess,
    ::testing::Values(Case{"gpt2", 2, 1, 0, "fp32", false}, Case{"gpt2", 4, 1, 0, "fp32", false},
                      Case{"gpt2", 2, 1, 0, "fp32", true}, Case{"gpt2", 2, 1, 0, "bf16", false},
                      Case{"llama", 2, 1, 0, "fp32", false}, Case{"llama", 4, 1, 0, "fp32", true},
                      Case{"llama", 2, 1, 0, "bf16", false}, Case{"gpt2", 2, 2, 0, "fp32", false},
                      Case{"gpt2", 2, 2, 1, "fp32", false}, Case{"gpt2", 2, 2, 2, "fp32", false},
                      Case{"gpt2", 2, 2, 3, "fp32", false}, Case{"llama", 2, 2, 3, "fp32", true},
                      Case{"gpt2", 2, 1, 0, "fp32", false, true}, Case{"gpt2", 4, 1, 0, "fp32", true, true},
                      Case{"llama", 2, 1, 0, "fp32", false, true}, Case{"llama", 4, 1, 0, "bf16", false, true},
                      Case{"gpt2", 2, 2, 2, "fp32", false, true}, Case{"gpt2", 2, 2, 3, "bf16", true, true},
                      Case{"gpt2", 2, 1, 0, "fp16", false}, Case{"llama", 2, 2, 1, "fp16", true, true}),
    case_name);

// Attention biases (stop 75) under tp: Qwen2's q/k/v biases split by heads with their weights
// (tp 2 x dp 2, ZeRO 3, sequence parallelism), LLaMA's attention_bias adding o_proj's bias once
// after the row-parallel reduction (tp 2, ZeRO 2): each run equals the one process's, whose
// biases did train.
TEST(TpBias, SplitQkvBiasesAndARowParallelBiasTrainTheOneProcessRun) {
  for (const auto& [k, keys] : {std::pair<Case, nlohmann::json>{Case{"llama", 2, 2, 3, "fp32", false, true},
                                                                 {{"model_type", "qwen2"}}},
                                {Case{"llama", 2, 1, 2, "fp32", true}, {{"attention_bias", true}}}}) {
    SCOPED_TRACE(keys.dump());
    auto cfg = [&](int processes, int g) {
      nlohmann::json j = config(k, processes, g);
      j["model"].update(keys);
      return j;
    };
    const int g = 2;
    const LayoutRun ref = layout_train(cfg(1, g * k.dp), 1, g * k.dp, "tp_test");
    const LayoutRun got = layout_train(cfg(k.tp * k.dp, g), k.tp * k.dp, g, "tp_test");
    ASSERT_EQ(ref.losses.size(), got.losses.size());
    for (size_t s = 0; s < ref.losses.size(); ++s)
      EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * std::fabs(ref.losses[s])) << "loss at step " << s + 1;
    ASSERT_EQ(ref.master.size(), got.master.size());
    EXPECT_LE(layout_compare(ref.master, got.master, ref.noise).norm_rel, 1e-5);
    const RunConfig rc = ds_config_parse(cfg(1, g * k.dp), "tp_test", 1);
    models::TransformerLM probe(rc.model, {});
    const nn::Parameter* b = probe.store().find("model.layers.1.self_attn.k_proj.bias");
    ASSERT_NE(b, nullptr);
    double moved = 0.0;  // zeros at the initialisation
    for (int64_t i = 0; i < b->numel(); ++i) moved += std::fabs(ref.master[b->global_offset + static_cast<size_t>(i)]);
    EXPECT_GT(moved, 0.0);
  }
}

// Lamb under tp: the trust ratio of a split tensor is the whole tensor's (each rank took its
// piece's, 2.5 % of the update off one process's, exit 0: stop 73). betas (0.9, 0.95) keep the
// ratios inside [min_coeff, max_coeff], where a piece's ratio shows; with the defaults most are
// pinned at min_coeff, which hid it.
TEST(TpLamb, ASplitTensorsTrustRatioIsTheWholeTensors) {
  for (const Case& k : {Case{"gpt2", 2, 1, 0, "fp32", false}, Case{"llama", 2, 1, 0, "fp32", false, true}}) {
    auto lamb = [&](int processes, int g) {
      nlohmann::json j = config(k, processes, g);
      j["optimizer"] = {{"type", "Lamb"}, {"params", {{"lr", 1e-2}, {"betas", {0.9, 0.95}}, {"weight_decay", 0.01}}}};
      return layout_train(j, processes, g, "tp_lamb");
    };
    LayoutRun ref = lamb(1, 2), got = lamb(k.tp, 2);
    ASSERT_EQ(ref.losses.size(), got.losses.size());
    for (size_t s = 0; s < ref.losses.size(); ++s)
      EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * std::fabs(ref.losses[s])) << k.arch << " loss at step " << s + 1;
    ASSERT_EQ(ref.master.size(), got.master.size());
    const LayoutDiff w = layout_compare(ref.master, got.master, ref.noise);
    std::printf("%s Lamb tp %d: final weights ||dw||/||w|| %.2e, max %.2e\n", k.arch, k.tp, w.norm_rel, w.max_rel);
    EXPECT_LE(w.norm_rel, 1e-5) << k.arch << ": final weights, ||dw||/||w||";
    EXPECT_LE(w.max_rel, 5e-5) << k.arch << ": final weights, max |dw| / max |w|";
  }
}

// LLaMA's pad_token_id (nn.Embedding's padding_idx) under vocabulary parallelism, sequence
// parallelism and ZeRO 3 (tp 2 x dp 2): the row lies in the second shard (make_vocab_size_divisible_by
// 1: 49 rows a shard, the row 60 its 11th), and the run equals the one process's. The row, 0 from
// the initialisation, is 0 after 10 steps in both: the lookup sends it nothing, decay keeps 0.
TEST(TpPadding, ThePaddingRowTrainsNothingInTheShardThatHoldsIt) {
  constexpr int kPad = 60;
  bool seen = false;  // the rows' tokens hold the id
  for (uint64_t k = 0; k < 40 && !seen; ++k) {
    std::vector<int32_t> t(16), y(16);
    layout_sample(k, t.data(), y.data());
    seen = std::find(t.begin(), t.end(), kPad) != t.end();
  }
  ASSERT_TRUE(seen);
  const Case k{"llama", 2, 2, 3, "fp32", false, true};
  auto cfg = [&](int processes, int g) {
    nlohmann::json j = config(k, processes, g);
    j["model"]["pad_token_id"] = kPad;
    if (processes > 1) j["parallel"]["make_vocab_size_divisible_by"] = 1;
    return j;
  };
  const LayoutRun ref = layout_train(cfg(1, 4), 1, 4, "tp_test");
  const LayoutRun got = layout_train(cfg(4, 2), 4, 2, "tp_test");
  ASSERT_EQ(ref.losses.size(), got.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * std::fabs(ref.losses[s])) << "loss at step " << s + 1;
  ASSERT_EQ(ref.master.size(), got.master.size());
  EXPECT_LE(layout_compare(ref.master, got.master, ref.noise).norm_rel, 1e-5);
  const RunConfig rc = ds_config_parse(cfg(1, 4), "tp_test", 1);
  models::TransformerLM probe(rc.model, {});
  const nn::Parameter* wte = probe.store().find("model.embed_tokens.weight");
  ASSERT_NE(wte, nullptr);
  const size_t C = static_cast<size_t>(rc.model.hidden), row = wte->global_offset + kPad * C;
  for (const LayoutRun* r : {&ref, &got}) {
    double pad = 0.0, next = 0.0;
    for (size_t c = 0; c < C; ++c) {
      pad += std::fabs(r->master[row + c]);
      next += std::fabs(r->master[row + C + c]);
    }
    EXPECT_EQ(pad, 0.0) << (r == &ref ? "one process" : "tp 2 x dp 2");
    EXPECT_GT(next, 0.0);
  }
}

TEST(TpConfig, RefusesASplitThatIsNotWholeHeadsNamingTheKey) {
  Case k{"llama", 8, 1, 0, "fp32", false};  // 4 kv heads over 8 ranks
  try {
    train(k, 8, 1);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_key_value_heads (4) is not divisible by parallel.tp (8)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt::engine
