// The model under tensor parallelism, beside the code: each rank built with a tp group holds
// exactly its slice of the one-process model's weights (same seed, keyed on names), its vocabulary
// padding is zero, and its forward gives the one-process logits and loss (gathered / reduced over
// the group). Ranks are threads over the local backend.
#include "models/transformer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "comm/local_backend.h"
#include "models/tiny_model_test_util.h"
#include "nn/tp_split.h"

namespace mt::models {
namespace {

// ZeRO-Infinity's deferred initialisation: a model built without buffers gives, for any range of
// its flat elements (inside a parameter, across several, the whole), exactly init()'s values.
TEST(DeferredInit, InitValuesEqualTheStoresInitialisation) {
  for (Arch arch : {Arch::kGpt2, Arch::kLlama}) {
    ModelOptions o;
    o.seed = 77;
    TransformerLM full(tiny(arch), o);
    o.deferred_init = true;
    TransformerLM lazy(tiny(arch), o);
    EXPECT_TRUE(lazy.store().released());
    EXPECT_EQ(lazy.store().master(), nullptr);
    const size_t n = full.store().numel();
    ASSERT_EQ(lazy.store().numel(), n);
    for (auto [a, b] : {std::pair<size_t, size_t>{0, n}, {3, 17}, {n / 3, n / 2}, {n - 5, n}, {1000, 1001}}) {
      std::vector<float> v(b - a, -1.0f);
      lazy.init_values(a, b, v.data());
      for (size_t i = a; i < b; ++i) ASSERT_EQ(v[i - a], full.store().master()[i]) << i;
    }
  }
}

// Documents packed into a sample (ModelOptions::documents, both switches) over several attention
// tiles at a head size of 64: the packed batch's loss and gradients equal those of every document
// run alone as its own sequence (positions from 0, causal), each divided by the whole batch's count
// of targets. The model alone is PyTorch's (engine/golden_test.cpp); this is the production tiling
// (T 160, documents crossing the 64-wide tiles, one ending on a tile's last row) in fp32 and bf16.
TEST(Documents, APackedBatchIsEachDocumentOnItsOwn) {
  const int T = 160, B = 2;
  const int32_t eod = 3;
  const std::vector<std::vector<int>> ends = {{63, 100, 159}, {0, 20, 130}};  // positions of the EOD tokens
  std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(4 + (i * 37 + i / 7) % 90);
    targets[i] = static_cast<int32_t>(4 + (i * 53 + 11) % 90);
  }
  for (int b = 0; b < B; ++b)
    for (int t : ends[b]) tokens[static_cast<size_t>(b) * T + t] = eod;
  for (Arch arch : {Arch::kGpt2, Arch::kLlama})
    for (DType dt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(std::string(arch == Arch::kGpt2 ? "gpt2 " : "llama ") + dtype_name(dt));
      ModelConfig cfg = tiny(arch);
      cfg.hidden = 128;
      cfg.n_head = 2;
      cfg.n_kv_head = arch == Arch::kGpt2 ? 2 : 1;  // head size 64
      cfg.max_positions = T;
      ModelOptions o;
      o.compute_dtype = dt;
      o.seed = 5;
      TransformerLM alone(cfg, o);
      o.documents = {eod, true, true};
      TransformerLM packed(cfg, o);
      packed.prepare(B, T);
      packed.store().zero_grad();
      const float loss = packed.forward(tokens.data(), targets.data(), 1.0f);
      packed.backward();
      alone.store().zero_grad();
      const double count = static_cast<double>(B) * T;
      alone.set_loss_denominator(count);
      double sum = 0.0;
      for (int b = 0; b < B; ++b) {
        int start = 0;
        std::vector<int> cuts = ends[b];
        if (cuts.back() != T - 1) cuts.push_back(T - 1);
        for (int end : cuts) {
          const int n = end + 1 - start;
          alone.prepare(1, n);
          const size_t at = static_cast<size_t>(b) * T + start;
          sum += alone.forward(tokens.data() + at, targets.data() + at, 1.0f);
          alone.backward();
          start = end + 1;
        }
      }
      const double tol = dt == DType::kF32 ? 1e-5 : 2e-2;
      EXPECT_TRUE(std::isfinite(loss));
      EXPECT_NEAR(loss, sum, tol * sum);
      double num = 0.0, den = 0.0;
      for (size_t i = 0; i < packed.store().numel(); ++i) {
        const double a = packed.store().grad()[i], r = alone.store().grad()[i];
        ASSERT_TRUE(std::isfinite(a)) << "element " << i;
        num = std::max(num, std::fabs(a - r));
        den = std::max(den, std::fabs(r));
      }
      EXPECT_LE(num / den, tol) << "gradients";
    }
}

// What a layer adds to the saved activations, per token, against the textbook count (PERF.md's
// "Activation memory, explained"): in f32 the norms' statistics (mean and rstd for LayerNorm, rstd
// for RMSNorm), the residual after attention, attention's output and its log-sum-exp (NH a token);
// in the compute dtype the GEMMs' inputs (the two norms' outputs, the activation) and the GEMM
// outputs the backward reads (q, k, v after RoPE, the MLP's pre-activation), as PyTorch's autocast
// and Megatron keep them; plus the residual stream's copy at the new block boundary (f32).
// N = 64 rows keeps every piece a multiple of the 64-byte alignment.
TEST(ActivationMemory, ALayerSavesTheTextbookSetInTheComputeDtype) {
  for (Arch arch : {Arch::kGpt2, Arch::kLlama}) {
    for (DType cd : {DType::kF32, DType::kBF16, DType::kF16}) {
      ModelConfig cfg = tiny(arch);
      ModelOptions o;
      o.compute_dtype = cd;
      const int B = 2, T = 32;
      TransformerLM two(cfg, o);
      two.prepare(B, T);
      cfg.n_layer = 3;
      TransformerLM three(cfg, o);
      three.prepare(B, T);
      const size_t C = 32, NH = 4, HS = 8, stats = arch == Arch::kGpt2 ? 4 : 2;
      const size_t QKV = (NH + 2 * static_cast<size_t>(cfg.n_kv_head)) * HS, A = NH * HS;
      const size_t H = arch == Arch::kGpt2 ? 128 : 2 * 64, G = arch == Arch::kGpt2 ? 128 : 64;
      const size_t e = dtype_size(cd);
      const size_t per_token = 4 * (stats + C + A + NH) + e * (2 * C + QKV + H + G) + 4 * C;
      EXPECT_EQ(three.activation_bytes() - two.activation_bytes(), per_token * B * T)
          << (arch == Arch::kGpt2 ? "gpt2 " : "llama ") << dtype_name(cd);
    }
  }
}

TEST(PaddedVocab, MegatronsRule) {
  ModelConfig c = tiny(Arch::kGpt2);
  c.vocab_size = 50257;
  EXPECT_EQ(padded_vocab(c, 1, 128), 50257);  // nothing to split
  EXPECT_EQ(padded_vocab(c, 2, 128), 50432);  // a multiple of 256
  EXPECT_EQ(padded_vocab(c, 4, 128), 50688);  // of 512
  EXPECT_EQ(padded_vocab(c, 8, 1), 50264);
}

class TpModel : public ::testing::TestWithParam<std::tuple<Arch, int, bool>> {};

TEST_P(TpModel, ShardsAreSlicesAndTheForwardIsTheOneProcessForward) {
  const auto [arch, tp, sp] = GetParam();
  const ModelConfig cfg = tiny(arch);
  ModelOptions one_opts;
  one_opts.seed = 77;
  TransformerLM one(cfg, one_opts);
  const int B = 2, T = 8, N = B * T;
  one.prepare(B, T);
  std::vector<int32_t> tok(N), tgt(N);
  for (int i = 0; i < N; ++i) {
    tok[i] = (i * 37 + 5) % cfg.vocab_size;
    tgt[i] = i == 3 ? -100 : (i * 11 + 2) % cfg.vocab_size;
  }
  std::vector<float> ref_logits(static_cast<size_t>(N) * cfg.vocab_size);
  one.logits(ref_logits.data(), tok.data());
  const float ref_loss = one.forward(tok.data(), tgt.data(), 0.0f);

  auto errors = comm::run_local_ranks(tp, [&](comm::Backend& b) {
    auto ctx = parallel::make_parallel_context(std::shared_ptr<comm::Backend>(&b, [](comm::Backend*) {}), tp, 1, sp);
    ModelOptions o = one_opts;
    o.parallel = ctx;
    o.vocab_divisible = 8;
    TransformerLM shard(cfg, o);
    const auto& mine = shard.store().parameters();
    ASSERT_EQ(mine.size(), one.store().parameters().size());
    for (size_t i = 0; i < mine.size(); ++i) {
      const nn::Parameter* p = mine[i];
      const nn::Parameter* full = one.store().parameters()[i];
      ASSERT_EQ(p->name, full->name);
      std::vector<float> want(static_cast<size_t>(p->numel()));
      nn::tp_extract(want.data(), full->master, p->global_shape, p->split, p->place);  // padding: 0
      for (size_t k = 0; k < want.size(); ++k) ASSERT_EQ(p->master[k], want[k]) << p->name << " element " << k;
    }
    shard.prepare(B, T);
    std::vector<float> logits(ref_logits.size());
    shard.logits(logits.data(), tok.data());
    for (size_t i = 0; i < logits.size(); ++i) ASSERT_NEAR(logits[i], ref_logits[i], 1e-5f) << "logit " << i;
    EXPECT_NEAR(shard.forward(tok.data(), tgt.data(), 0.0f), ref_loss, 1e-5f * std::fabs(ref_loss));
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

INSTANTIATE_TEST_SUITE_P(Layouts, TpModel,
                         ::testing::Values(std::make_tuple(Arch::kGpt2, 2, false), std::make_tuple(Arch::kGpt2, 4, true),
                                           std::make_tuple(Arch::kLlama, 2, false), std::make_tuple(Arch::kLlama, 2, true)));

}  // namespace
}  // namespace mt::models
