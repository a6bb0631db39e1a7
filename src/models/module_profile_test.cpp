// The flops profiler's module tree against textbook formulas (one process, f32):
//   forward FLOPs of the GEMMs = 2 · tokens · (parameters in GEMM weights), with GPT-2 (n_inner 4C,
//     tied head): 2 · N · (12 L C² + V C); LLaMA (GQA, untied): 2 · N · (L (C (NH + 2 NKV) HS + A C
//     + 3 C I) + V C);
//   attention core per layer = QK^T + PV over the causal pairs = 2 · 2 · B · NH · HS · T(T+1)/2;
//   so 3 x the forward = train_flops_per_step() + 6 L B A T (its T²/2 pairs per head vs T(T+1)/2)
//     - 6 N (biases and norm weights, which it counts as matmul parameters).
// And the measured latencies nest: every module's children take at most its own time.
#include "models/module_profile.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "models/tiny_model_test_util.h"
#include "models/transformer.h"

namespace mt::models {
namespace {

// A model prepared for (B, T) and its module tree, nothing timed.
struct Tree {
  std::unique_ptr<TransformerLM> model;
  ModuleProfile profile;
};

Tree tree_of(const ModelConfig& cfg, const ModelOptions& opts, int B, int T) {
  Tree t{std::make_unique<TransformerLM>(cfg, opts), {}};
  t.model->prepare(B, T);
  t.model->set_profiler(&t.profile);
  t.model->set_profiler(nullptr);
  return t;
}

double sum_kind(const ModuleProfile& p, const std::string& kind) {
  double s = 0.0;
  for (const ProfileNode& n : p.nodes())
    if (n.kind == kind) s += n.fwd_flops;
  return s;
}

int64_t store_params(TransformerLM& m) {
  std::vector<nn::Parameter*> ps;
  m.collect_parameters(ps);
  int64_t n = 0;
  for (const nn::Parameter* p : ps) n += p->numel();
  return n;
}

TEST(ModuleProfile, Gpt2FlopsAreTheTextbookFormulas) {
  const ModelConfig cfg = tiny(Arch::kGpt2);
  const int B = 2, T = 16;
  const Tree tree = tree_of(cfg, ModelOptions{}, B, T);
  const ModuleProfile& p = tree.profile;
  TransformerLM* model = tree.model.get();
  const double N = B * T, C = cfg.hidden, L = cfg.n_layer, V = cfg.vocab_size;
  EXPECT_DOUBLE_EQ(sum_kind(p, "Linear") + sum_kind(p, "LMHead"), 2.0 * N * (12.0 * L * C * C + V * C));
  // The whole T x T score matrix, as DeepSpeed's profiler counts sdpa and matmul (the masked half
  // too; the kernel computes T(T+1)/2 pairs, which train_flops_per_step and bench count).
  EXPECT_DOUBLE_EQ(sum_kind(p, "AttentionCore"), L * 2.0 * 2.0 * B * cfg.n_head * cfg.head_dim() * T * T);
  // train_flops_per_step counts 6 per token for every parameter but the positions, biases and norm
  // weights (13 C per layer, 2 C final) included, and T²/2 attention pairs per head.
  const double small = 13.0 * C * L + 2.0 * C;
  EXPECT_DOUBLE_EQ(3.0 * p.root().fwd_flops, model->train_flops_per_step() - 6.0 * N * small + 3.0 * L * 2.0 * B * C * T * T);
  EXPECT_EQ(p.root().params, store_params(*model));
  EXPECT_EQ(p.root().params, cfg.num_params());
  // One block: c_attn 2·N·C·3C, c_proj 2·N·C·C, c_fc 2·N·C·4C, mlp c_proj 2·N·4C·C; its params
  // 12C² + 13C (weights, biases, two norms).
  const ProfileNode* block = nullptr;
  for (const ProfileNode& n : p.nodes())
    if (n.name == "h.1") block = &n;
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(block->depth, 1);
  EXPECT_EQ(block->params, static_cast<int64_t>(12 * C * C + 13 * C));
  std::map<std::string, double> part;
  for (int c : block->children)
    for (int g : p.nodes()[c].children.empty() ? std::vector<int>{c} : p.nodes()[c].children)
      part[p.nodes()[c].name + "." + p.nodes()[g].name] = p.nodes()[g].fwd_flops;
  EXPECT_DOUBLE_EQ(part["attn.c_attn"], 2.0 * N * C * 3 * C);
  EXPECT_DOUBLE_EQ(part["attn.c_proj"], 2.0 * N * C * C);
  EXPECT_DOUBLE_EQ(part["mlp.c_fc"], 2.0 * N * C * 4 * C);
  EXPECT_DOUBLE_EQ(part["mlp.c_proj"], 2.0 * N * 4 * C * C);
  EXPECT_DOUBLE_EQ(part["mlp.gelu"], 0.0);
}

TEST(ModuleProfile, LlamaGqaFlops) {
  const ModelConfig cfg = tiny(Arch::kLlama);
  const int B = 2, T = 8;
  const Tree tree = tree_of(cfg, ModelOptions{}, B, T);
  const ModuleProfile& p = tree.profile;
  const double N = B * T, C = cfg.hidden, L = cfg.n_layer, V = cfg.vocab_size, HS = cfg.head_dim(), I = cfg.intermediate;
  const double A = cfg.n_head * HS, QKV = (cfg.n_head + 2.0 * cfg.n_kv_head) * HS;
  EXPECT_DOUBLE_EQ(sum_kind(p, "Linear") + sum_kind(p, "LMHead"), 2.0 * N * (L * (C * QKV + A * C + 3.0 * C * I) + V * C));
  // GQA shares k/v heads; the attention still runs NH query heads.
  EXPECT_DOUBLE_EQ(sum_kind(p, "AttentionCore"), L * 4.0 * B * A * T * T);
  EXPECT_EQ(p.root().params, cfg.num_params());
}

TEST(ModuleProfile, SparsePairsCountTheLayoutsBlocks) {
  const int nb = 4, b = 16, T = nb * b, NH = 2;
  // Lower triangle with the diagonal (every block a causal query may see): the dense count.
  std::vector<uint8_t> lower(NH * nb * nb, 0), diag(NH * nb * nb, 0);
  for (int h = 0; h < NH; ++h)
    for (int r = 0; r < nb; ++r)
      for (int c = 0; c < nb; ++c) {
        lower[(h * nb + r) * nb + c] = c <= r;
        diag[(h * nb + r) * nb + c] = c == r || c > r;  // blocks above the diagonal are skipped
      }
  auto plan_lower = kernels::sparse_attention_plan(lower.data(), NH, nb, b, true);
  auto plan_diag = kernels::sparse_attention_plan(diag.data(), NH, nb, b, true);
  EXPECT_DOUBLE_EQ(attention_pairs(T, NH, &plan_lower), attention_pairs(T, NH, nullptr));
  EXPECT_DOUBLE_EQ(attention_pairs(T, NH, nullptr), NH * T * (T + 1) / 2.0);
  EXPECT_DOUBLE_EQ(attention_pairs(T, NH, &plan_diag), NH * nb * b * (b + 1) / 2.0);
  auto plan_bi = kernels::sparse_attention_plan(diag.data(), NH, nb, b, false);  // no mask: whole blocks
  EXPECT_DOUBLE_EQ(attention_pairs(T, NH, &plan_bi), NH * (nb * (nb + 1) / 2.0) * b * b);
  EXPECT_DOUBLE_EQ(attention_core_flops(3, T, NH, 8, &plan_diag), 2.0 * 2.0 * 3 * 8 * attention_pairs(T, NH, &plan_diag));
}

TEST(ModuleProfile, SparseModelUsesThePlan) {
  const ModelConfig cfg = tiny(Arch::kGpt2);
  ModelOptions opts;
  kernels::SparsityConfig sc;
  sc.block = 8;
  kernels::FixedSparsity fixed;
  fixed.num_local_blocks = 2;
  fixed.attention = kernels::SparseDirection::kUnidirectional;
  sc.pattern = fixed;
  opts.sparse_attention = sc;
  const int B = 1, T = 32;
  const Tree tree = tree_of(cfg, opts, B, T);
  const ModuleProfile& p = tree.profile;
  const double core = sum_kind(p, "SparseAttentionCore");
  EXPECT_GT(core, 0.0);
  EXPECT_LT(core, cfg.n_layer * 2.0 * B * cfg.hidden * T * (T + 1));  // fewer pairs than dense
  EXPECT_EQ(sum_kind(p, "AttentionCore"), 0.0);
}

void expect_nested(const ModuleProfile& p) {
  for (const ProfileNode& n : p.nodes()) {
    double fwd = 0.0, bwd = 0.0;
    for (int c : n.children) {
      fwd += p.nodes()[c].fwd_seconds;
      bwd += p.nodes()[c].bwd_seconds;
    }
    EXPECT_LE(fwd, n.fwd_seconds) << n.name;
    EXPECT_LE(bwd, n.bwd_seconds) << n.name;
  }
}

class ModuleProfileTiming : public ::testing::TestWithParam<std::tuple<Arch, bool>> {};

TEST_P(ModuleProfileTiming, EveryModuleIsTimedOnceAndChildrenNest) {
  const auto [arch, recompute] = GetParam();
  const ModelConfig cfg = tiny(arch);
  ModelOptions opts;
  opts.recompute = recompute;
  TransformerLM model(cfg, opts);
  const int B = 2, T = 8;
  model.prepare(B, T);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  std::mt19937 rng(3);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(rng() % cfg.vocab_size);
    targets[i] = static_cast<int32_t>(rng() % cfg.vocab_size);
  }
  ModuleProfile p;
  model.set_profiler(&p);
  model.forward(tokens.data(), targets.data(), 1.0f);
  model.backward();
  model.set_profiler(nullptr);
  model.forward(tokens.data(), targets.data(), 1.0f);  // off: nothing recorded
  model.backward();
  for (const ProfileNode& n : p.nodes()) {
    EXPECT_EQ(n.fwd_calls, 1) << n.name;
    EXPECT_GT(n.fwd_seconds, 0.0) << n.name;
    if (n.kind == "LMHead") {
      EXPECT_EQ(n.bwd_calls, 0);  // fused: its gradients come out of its forward
    } else {
      // With recompute a block's modules run forward again inside the backward.
      const bool in_block = n.kind == "Block" || n.depth >= 2;
      EXPECT_EQ(n.bwd_calls, recompute && in_block ? 2 : 1) << n.name;
    }
  }
  expect_nested(p);
}

INSTANTIATE_TEST_SUITE_P(Archs, ModuleProfileTiming,
                         ::testing::Combine(::testing::Values(Arch::kGpt2, Arch::kLlama), ::testing::Bool()));

}  // namespace
}  // namespace mt::models
