// The models against PyTorch: tools/make_golden.py (Debian's python3-torch) builds the same tiny
// GPT-2 and LLaMA from configs/models/tiny-*.json and writes inputs, initial weights, logits, loss,
// every gradient and the weights after AdamW steps. fp32 must agree to 1e-4 relative; bf16 and f16
// compute within the tolerances stated below.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/scratch_dir.h"
#include "checkpoint/safetensors.h"
#include "comm/local_backend.h"
#include "data/classification.h"
#include "engine/golden_test_util.h"
#include "engine/hf_config.h"
#include "engine/hf_weights.h"
#include "engine/ds_config.h"
#include "engine/engine.h"
#include "models/transformer.h"
#include "nn/tp_split.h"
#include "parallel/context.h"

namespace mt::engine {
namespace {

using testing::Golden;
using testing::load_golden;
using testing::rel_err;
using testing::cosine;
using testing::make_model;

class GoldenTest : public ::testing::TestWithParam<std::string> {};

// The production engine over the golden model: one micro-batch of the golden shape per step.
RunConfig golden_run_config(const Golden& g, const std::string& name, nlohmann::json extra) {
  const auto& md = g.file->metadata();
  nlohmann::json j = {{"model", std::string(MT_SOURCE_DIR) + "/configs/models/" + name + ".json"},
                      {"seq_length", g.T}, {"train_micro_batch_size_per_gpu", g.B}, {"gradient_accumulation_steps", 1},
                      {"optimizer", {{"type", "AdamW"},
                                     {"params", {{"lr", std::stod(md.at("lr"))},
                                                 {"betas", {std::stod(md.at("beta1")), std::stod(md.at("beta2"))}},
                                                 {"eps", std::stod(md.at("eps"))},
                                                 {"weight_decay", std::stod(md.at("weight_decay"))}}}}}};
  j.update(extra);
  return ds_config_parse(j, "golden " + name);
}

TEST_P(GoldenTest, Fp32LogitsLossAndEveryGradient) {
  Golden g = load_golden(GetParam());
  auto m = make_model(g, DType::kF32, false);
  std::vector<float> logits(static_cast<size_t>(g.B) * g.T * g.cfg.vocab_size);
  m->logits(logits.data(), g.tokens.data());
  EXPECT_LE(rel_err(logits.data(), g.file->read_f32("logits")), 1e-4);

  m->store().zero_grad();
  float loss = m->forward(g.tokens.data(), g.targets.data(), 1.0f);
  float ref = g.file->read_f32("loss")[0];
  EXPECT_LE(std::fabs(loss - ref) / std::fabs(ref), 1e-4) << loss << " vs " << ref;
  m->backward();
  int checked = 0;
  for (nn::Parameter* p : m->store().parameters()) {
    std::vector<float> gref = g.file->read_f32("grad." + p->name, p->shape);
    EXPECT_LE(rel_err(p->grad, gref), 1e-4) << p->name;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(m->store().parameters().size()));
  EXPECT_GT(checked, 10);
}

TEST_P(GoldenTest, RecomputeGivesIdenticalGradients) {
  Golden g = load_golden(GetParam());
  auto a = make_model(g, DType::kF32, false);
  auto b = make_model(g, DType::kF32, true);
  EXPECT_LT(b->activation_bytes(), a->activation_bytes());
  for (auto* m : {a.get(), b.get()}) {
    m->store().zero_grad();
    m->forward(g.tokens.data(), g.targets.data(), 1.0f);
    m->backward();
  }
  for (size_t i = 0; i < a->store().numel(); ++i)
    ASSERT_EQ(a->store().grad()[i], b->store().grad()[i]) << "element " << i;
}

TEST_P(GoldenTest, Fp32AdamWStepsMatchPyTorch) {
  Golden g = load_golden(GetParam());
  auto m = make_model(g, DType::kF32, false);
  RunConfig rc = golden_run_config(g, GetParam(), nlohmann::json::object());
  Engine eng(rc, *m);
  std::vector<float> ref_losses = g.file->read_f32("step_losses");
  ASSERT_EQ(static_cast<int>(ref_losses.size()), g.steps);
  for (int s = 0; s < g.steps; ++s) {
    float loss = eng.forward_backward(g.tokens.data(), g.targets.data());
    StepResult st = eng.step();
    EXPECT_FALSE(st.skipped);
    EXPECT_LE(std::fabs(loss - ref_losses[s]) / std::fabs(ref_losses[s]), 1e-4) << "step " << s;
  }
  // NOTE: an element whose gradient is zero in exact arithmetic (GPT-2's key bias: softmax is
  // invariant to adding q.b_k to a whole row) has a gradient of rounding noise (~1e-10) in PyTorch
  // as here, and Adam's m/sqrt(v) turns noise into +-lr steps of arbitrary sign. Such elements
  // (0 < |grad| < 1e-6 max|grad| of their tensor at step 0, under 1%) are left out; every other element must
  // match to 1e-4.
  int excluded = 0;
  for (nn::Parameter* p : m->store().parameters()) {
    std::vector<float> after = g.file->read_f32("after." + p->name, p->shape);
    std::vector<float> grad0 = g.file->read_f32("grad." + p->name, p->shape);
    double gmax = 0;
    for (float x : grad0) gmax = std::max(gmax, std::fabs(static_cast<double>(x)));
    std::vector<float> mine(p->master, p->master + after.size());
    for (size_t i = 0; i < after.size(); ++i) {
      if (grad0[i] != 0.0f && std::fabs(grad0[i]) < 1e-6 * gmax) {
        mine[i] = after[i];
        ++excluded;
      }
    }
    EXPECT_LE(rel_err(mine.data(), after), 1e-4) << p->name;
  }
  EXPECT_LE(excluded, static_cast<int>(m->store().numel() / 100));
}

// Low-precision compute (bf16 or f16 GEMM operands, f32 everything else) against the f32 oracle:
// loss within 2e-2 relative, every gradient with cosine similarity >= 0.99 and norm-relative error
// <= 0.1 (bf16 keeps 8 mantissa bits: ~4e-3 per rounding, accumulated over the layers).
void check_low_precision(const Golden& g, DType dt) {
  auto m = make_model(g, dt, false);
  m->store().zero_grad();
  float loss = m->forward(g.tokens.data(), g.targets.data(), 1.0f);
  float ref = g.file->read_f32("loss")[0];
  EXPECT_LE(std::fabs(loss - ref) / std::fabs(ref), 2e-2) << dtype_name(dt);
  m->backward();
  for (nn::Parameter* p : m->store().parameters()) {
    std::vector<float> gref = g.file->read_f32("grad." + p->name, p->shape);
    EXPECT_GE(cosine(p->grad, gref), 0.99) << dtype_name(dt) << " " << p->name;
    EXPECT_LE(rel_err(p->grad, gref), 0.1) << dtype_name(dt) << " " << p->name;
  }
}

TEST_P(GoldenTest, Bf16WithinTolerance) { check_low_precision(load_golden(GetParam()), DType::kBF16); }
TEST_P(GoldenTest, F16WithinTolerance) { check_low_precision(load_golden(GetParam()), DType::kF16); }

TEST_P(GoldenTest, F16OverflowIsDetectedAndTheStepSkipped) {
  Golden g = load_golden(GetParam());
  auto m = make_model(g, DType::kF16, false);
  // A dynamic scale of 2^127: the scaled gradients overflow f32.
  RunConfig rc = golden_run_config(g, GetParam(), {{"fp16", {{"enabled", true}, {"initial_scale_power", 127}}}});
  Engine eng(rc, *m);
  std::vector<float> before(m->store().master(), m->store().master() + m->store().numel());
  eng.forward_backward(g.tokens.data(), g.targets.data());
  StepResult st = eng.step();
  EXPECT_TRUE(st.skipped);
  EXPECT_FALSE(std::isfinite(st.grad_norm));
  for (size_t i = 0; i < before.size(); ++i) ASSERT_EQ(before[i], m->store().master()[i]);
}

// Sequence classification against Hugging Face's *ForSequenceClassification (tools/make_golden.py,
// cls-*.safetensors): rows of different lengths laid out by the production batcher
// (data::classification_batch: the example, then padding, the label at its last token) give the
// golden padded tokens; the model's logits at the pooled positions, the loss and every gradient
// (score.weight included) equal PyTorch's, which pools by HF's own rule (first pad minus one).
// Each problem_type: cross-entropy over 3 classes; regression (MSELoss of one value,
// cls-regression-*); multi-label (BCEWithLogitsLoss over 3 labels, cls-multi-label-*), their
// values reaching the head as the batcher's rows of TransformerLM::set_label_values, past a first
// row of 5 (a later micro-batch of a step).
TEST_P(GoldenTest, ClassificationLogitsLossAndEveryGradient) {
  for (const std::string prefix : {"cls-", "cls-regression-", "cls-multi-label-"}) {
    SCOPED_TRACE(prefix);
    Golden g = load_golden(prefix + GetParam());
    const int L = g.cfg.num_labels;
    const bool valued = g.cfg.problem_type != models::ProblemType::kSingleLabel;
    ASSERT_EQ(L, prefix == "cls-regression-" ? 1 : 3);
    ASSERT_EQ(g.cfg.problem_type, prefix == "cls-"              ? models::ProblemType::kSingleLabel
                                  : prefix == "cls-regression-" ? models::ProblemType::kRegression
                                                                : models::ProblemType::kMultiLabel);
    const int32_t pad = std::stoi(g.file->metadata().at("pad"));
    const std::vector<int32_t> lengths = g.file->read_i32("lengths"), labels = g.file->read_i32("labels");
    const std::vector<float> values = valued ? g.file->read_f32("values") : std::vector<float>{};
    std::vector<data::ClassificationExample> ex(g.B);
    std::vector<const data::ClassificationExample*> rows;
    for (int b = 0; b < g.B; ++b) {
      ex[b].tokens.assign(g.tokens.begin() + static_cast<ptrdiff_t>(b) * g.T,
                          g.tokens.begin() + static_cast<ptrdiff_t>(b) * g.T + lengths[b]);
      ex[b].label = valued ? 0 : labels[b];
      if (valued) ex[b].values.assign(values.begin() + b * L, values.begin() + (b + 1) * L);
      rows.push_back(&ex[b]);
    }
    constexpr int kFirstRow = 5;
    std::vector<float> table(static_cast<size_t>(kFirstRow + g.B) * L, -7.0f);
    std::vector<int32_t> tokens(static_cast<size_t>(g.B) * g.T), targets(tokens.size());
    data::classification_batch(rows.data(), g.B, g.T, pad, tokens.data(), targets.data(),
                               valued ? table.data() + kFirstRow * L : nullptr, L, kFirstRow);
    EXPECT_EQ(tokens, g.tokens);
    auto m = make_model(g, DType::kF32, false);
    if (valued) m->set_label_values(table.data(), kFirstRow + g.B);
    std::vector<float> logits(tokens.size() * L);
    m->logits(logits.data(), tokens.data());
    const std::vector<float> ref = g.file->read_f32("pooled_logits");
    std::vector<float> pooled;
    for (int b = 0; b < g.B; ++b)
      for (int k = 0; k < L; ++k)
        pooled.push_back(logits[(static_cast<size_t>(b) * g.T + data::classification_pool(ex[b], g.T, pad)) * L + k]);
    EXPECT_LE(rel_err(pooled.data(), ref), 1e-4);
    m->store().zero_grad();
    const float loss = m->forward(tokens.data(), targets.data(), 1.0f);
    const float want = g.file->read_f32("loss")[0];
    EXPECT_LE(std::fabs(loss - want) / want, 1e-4) << loss << " vs " << want;
    m->backward();
    int checked = 0;
    for (nn::Parameter* p : m->store().parameters()) {
      EXPECT_LE(rel_err(p->grad, g.file->read_f32("grad." + p->name, p->shape)), 1e-4) << p->name;
      ++checked;
    }
    EXPECT_EQ(checked, static_cast<int>(m->store().parameters().size()));
    EXPECT_NE(m->store().find("score.weight"), nullptr);
    EXPECT_EQ(m->store().find("lm_head.weight"), nullptr);
    // bf16 and f16 compute (f16 with a loss scale of 1024, as its scaler runs it: the head's dlogits
    // converted to the compute dtype after the loss): check_low_precision's tolerances.
    for (const auto& [dt, scale] : {std::pair<DType, float>{DType::kBF16, 1.0f}, {DType::kF16, 1024.0f}}) {
      auto low = make_model(g, dt, false);
      if (valued) low->set_label_values(table.data(), kFirstRow + g.B);
      low->store().zero_grad();
      const float l = low->forward(tokens.data(), targets.data(), scale);
      EXPECT_LE(std::fabs(l - want) / want, 2e-2) << dtype_name(dt);
      low->backward();
      for (nn::Parameter* p : low->store().parameters()) {
        std::vector<float> mine(p->grad, p->grad + p->numel());
        for (float& x : mine) x /= scale;
        const std::vector<float> gref = g.file->read_f32("grad." + p->name, p->shape);
        EXPECT_GE(cosine(mine.data(), gref), 0.99) << dtype_name(dt) << " " << p->name;
        EXPECT_LE(rel_err(mine.data(), gref), 0.1) << dtype_name(dt) << " " << p->name;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenTest, ::testing::Values("tiny-gpt2", "tiny-llama"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) if (c == '-') c = '_';
                           return s;
                         });

// Dropout against PyTorch applying the same masks (tools/torch_models.py's DropoutMasks, written
// from kernels/cpu/dropout.h's definition): GPT-2 with embd 0.1, resid 0.2 and attn 0.3, LLaMA with
// attention_dropout 0.25. The loss and every gradient of step 1's masks, the same with recompute
// (the recomputed forward draws them again), the engine's AdamW steps (step k draws step k's
// masks), and evaluation (no origin set) without dropout: the plain golden file's loss.
// The golden file's loss and every gradient (1e-4) from one forward and backward of a model with
// these documents, without and with recompute (bit for bit between the two); setup runs on each
// model before its forward.
void expect_loss_and_grads(const Golden& g, const models::ModelOptions::Documents& docs,
                           const std::function<void(models::TransformerLM&)>& setup) {
  const float ref = g.file->read_f32("loss")[0];
  std::vector<float> grads;
  for (bool recompute : {false, true}) {
    auto m = make_model(g, DType::kF32, recompute, docs);
    m->store().zero_grad();
    setup(*m);
    const float loss = m->forward(g.tokens.data(), g.targets.data(), 1.0f);
    EXPECT_LE(std::fabs(loss - ref) / std::fabs(ref), 1e-4) << loss << " vs " << ref << (recompute ? " (recompute)" : "");
    m->backward();
    for (nn::Parameter* p : m->store().parameters())
      EXPECT_LE(rel_err(p->grad, g.file->read_f32("grad." + p->name, p->shape)), 1e-4) << p->name;
    if (!recompute) {
      grads.assign(m->store().grad(), m->store().grad() + m->store().numel());
    } else {
      for (size_t i = 0; i < grads.size(); ++i) ASSERT_EQ(grads[i], m->store().grad()[i]) << "recompute, element " << i;
    }
  }
}

// The engine's AdamW steps over the golden batch: the file's step_losses (1e-4); pairs: the
// attention pairs each step reports (-1: none counted).
void expect_engine_steps(const Golden& g, const std::string& name, const models::ModelOptions::Documents& docs,
                         double pairs = -1.0) {
  auto m = make_model(g, DType::kF32, false, docs);
  Engine eng(golden_run_config(g, name, nlohmann::json::object()), *m);
  std::vector<float> ref_losses = g.file->read_f32("step_losses");
  ASSERT_EQ(static_cast<int>(ref_losses.size()), g.steps);
  for (int s = 0; s < g.steps; ++s) {
    const float loss = eng.forward_backward(g.tokens.data(), g.targets.data());
    const StepResult r = eng.step();
    EXPECT_FALSE(r.skipped);
    EXPECT_EQ(r.attention_pairs, pairs) << "step " << s;
    EXPECT_LE(std::fabs(loss - ref_losses[s]) / std::fabs(ref_losses[s]), 1e-4) << "step " << s;
  }
}

class GoldenDropout : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenDropout, LossEveryGradientAndStepsMatchPyTorch) {
  Golden g = load_golden("dropout-" + GetParam());
  ASSERT_TRUE(g.cfg.attn_pdrop > 0.0f);
  const float ref = g.file->read_f32("loss")[0];
  expect_loss_and_grads(g, {}, [](models::TransformerLM& m) {
    ASSERT_TRUE(m.has_dropout());
    m.set_dropout_origin(1, 0);
  });
  {  // evaluation: a forward without an origin drops nothing
    auto m = make_model(g, DType::kF32, false);
    Golden plain = load_golden(GetParam());
    const float eval = m->forward(g.tokens.data(), g.targets.data(), 0.0f);
    const float plain_loss = plain.file->read_f32("loss")[0];
    EXPECT_LE(std::fabs(eval - plain_loss) / plain_loss, 1e-4) << eval << " vs " << plain_loss;
    EXPECT_GT(std::fabs(eval - ref) / ref, 1e-3);
  }
  expect_engine_steps(g, GetParam(), {});
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenDropout, ::testing::Values("tiny-gpt2", "tiny-llama"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) if (c == '-') c = '_';
                           return s;
                         });

// LLaMA with a pad_token_id (Hugging Face's LlamaModel: nn.Embedding's padding_idx) against PyTorch
// (tools/make_golden.py's make_padding_golden): the id at the first and the middle position of each
// row. The loss and every gradient, its row of embed_tokens 0 (it was trained), with and without
// recompute, and the engine's AdamW steps.
TEST(GoldenPadding, LlamasPadTokenRowTakesNoGradientAsPyTorchs) {
  Golden g = load_golden("padding-tiny-llama");
  ASSERT_EQ(g.cfg.padding_idx, 7);
  ASSERT_GE(std::count(g.tokens.begin(), g.tokens.end(), 7), 2 * g.B);
  const std::vector<float> ref = g.file->read_f32("grad.model.embed_tokens.weight");
  for (int c = 0; c < g.cfg.hidden; ++c) ASSERT_EQ(ref[static_cast<size_t>(7 * g.cfg.hidden + c)], 0.0f) << c;
  expect_loss_and_grads(g, {}, [](models::TransformerLM&) {});
  expect_engine_steps(g, "tiny-llama", {});  // the config file's name; the model is g.cfg's
  {  // a random initialisation leaves the row 0 (LlamaPreTrainedModel._init_weights)
    models::TransformerLM m(g.cfg, {});
    m.store().init(3);
    const nn::Parameter* wte = m.store().find("model.embed_tokens.weight");
    ASSERT_NE(wte, nullptr);
    for (int r : {6, 7, 8}) {
      double sum = 0.0;
      for (int c = 0; c < g.cfg.hidden; ++c) sum += std::fabs(wte->master[static_cast<size_t>(r * g.cfg.hidden + c)]);
      if (r == 7) EXPECT_EQ(sum, 0.0);
      else EXPECT_GT(sum, 0.0) << r;
    }
  }
}

// LLaMA with Hugging Face's rope_scaling against PyTorch (tools/make_golden.py's make_rope_golden:
// transformers' "llama3" bands at the tiny model's scale, "linear", and "yarn" with its scaled cos
// and sin): the frequencies, the logits,
// the loss and every gradient (with and without recompute) and the engine's AdamW steps. The weights
// and batch are tiny-llama's, so the unscaled model's gradients are shown to be far off (the scaling
// matters at this scale). config.json written by export reads back to the same scaling.
class GoldenRope : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenRope, ScaledRotaryFrequenciesMatchTransformers) {
  Golden g = load_golden("rope-" + GetParam() + "-tiny-llama");
  ASSERT_EQ(g.cfg.rope_scaling.type, GetParam());
  const std::vector<float> ref = g.file->read_f32("inv_freq");
  const std::vector<float> mine = models::rope_inv_freq(g.cfg);
  ASSERT_EQ(mine.size(), ref.size());
  for (size_t j = 0; j < ref.size(); ++j) EXPECT_NEAR(mine[j], ref[j], 1e-6 * ref[j]) << j;
  std::vector<float> logits(static_cast<size_t>(g.B) * g.T * g.cfg.vocab_size);
  make_model(g, DType::kF32, false)->logits(logits.data(), g.tokens.data());
  EXPECT_LE(rel_err(logits.data(), g.file->read_f32("logits")), 1e-4);
  expect_loss_and_grads(g, {}, [](models::TransformerLM&) {});
  expect_engine_steps(g, "tiny-llama", {});
  {  // the same weights without the scaling: q_proj's gradient is tens of percent off
    Golden plain = load_golden("tiny-llama");
    const std::string q = "grad.model.layers.0.self_attn.q_proj.weight";
    EXPECT_GT(rel_err(plain.file->read_f32(q).data(), g.file->read_f32(q)), 0.1);
  }
  {  // export's config.json reads back to the same model
    const nlohmann::json j = hf_config_to_json(g.cfg);
    ASSERT_TRUE(j.contains("rope_scaling")) << j.dump();
    EXPECT_EQ(j["rope_scaling"]["rope_type"], GetParam());
    EXPECT_EQ(hf_config_parse(j, "exported").rope_scaling, g.cfg.rope_scaling);
  }
  if (GetParam() == "llama3") {  // the real Llama 3.1 8B and Llama 3.2 1B frequencies (head_dim 128)
    for (auto [key, factor] : {std::pair<const char*, double>{"inv_freq.llama31", 8.0}, {"inv_freq.llama32", 32.0}}) {
      models::ModelConfig c = g.cfg;
      c.hidden = 128 * 4;
      c.rope_theta = 500000.0f;
      c.rope_scaling = {"llama3", factor, 1.0, 4.0, 8192};
      const std::vector<float> want = g.file->read_f32(key), got = models::rope_inv_freq(c);
      ASSERT_EQ(got.size(), 64u);
      for (size_t j = 0; j < want.size(); ++j) EXPECT_NEAR(got[j], want[j], 1e-6 * want[j]) << key << " " << j;
    }
  }
  if (GetParam() == "yarn") {  // cos and sin scaled; Qwen2.5's 4x and DeepSeek's mscale form, untruncated
    EXPECT_FLOAT_EQ(models::rope_attention_scale(g.cfg), g.file->read_f32("attention_factor")[0]);
    EXPECT_GT(models::rope_attention_scale(g.cfg), 1.1f);
    models::ModelConfig qwen = g.cfg, deepseek = g.cfg;
    qwen.hidden = 128 * 4;
    qwen.rope_theta = 1000000.0f;
    qwen.max_positions = 131072;
    qwen.rope_scaling = {"yarn", 4.0, 1.0, 4.0, 32768};
    deepseek.hidden = 64 * 4;
    deepseek.rope_theta = 10000.0f;
    deepseek.max_positions = 163840;
    deepseek.rope_scaling = {"yarn", 40.0, 1.0, 4.0, 4096};
    deepseek.rope_scaling.mscale = 0.707;
    deepseek.rope_scaling.mscale_all_dim = 1.0;
    deepseek.rope_scaling.truncate = false;
    for (const auto& [key, c] : {std::pair<std::string, const models::ModelConfig*>{"qwen25", &qwen}, {"mscale", &deepseek}}) {
      c->validate();
      const std::vector<float> want = g.file->read_f32("inv_freq." + key), got = models::rope_inv_freq(*c);
      ASSERT_EQ(got.size(), want.size()) << key;
      for (size_t j = 0; j < want.size(); ++j) EXPECT_NEAR(got[j], want[j], 1e-6 * want[j]) << key << " " << j;
      EXPECT_FLOAT_EQ(models::rope_attention_scale(*c), g.file->read_f32("attention_factor." + key)[0]) << key;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GoldenRope, ::testing::Values("llama3", "linear", "yarn"), [](const auto& info) { return info.param; });

// Qwen2 (q/k/v biases, none on o_proj) and LLaMA with attention_bias (all four) against PyTorch
// (tools/make_golden.py's make_bias_golden, biases drawn at 0.1 randn): the logits, the loss and
// every gradient, biases included (with and without recompute), and the engine's AdamW steps; the
// parameter count is the file's; export's config.json reads back to the same model.
class GoldenBias : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenBias, AttentionBiasesMatchPyTorch) {
  Golden g = load_golden(GetParam() + "-tiny-llama");
  const bool qwen2 = GetParam() == "qwen2";
  ASSERT_TRUE(g.cfg.qkv_bias);
  ASSERT_EQ(g.cfg.o_bias, !qwen2);
  EXPECT_EQ(g.cfg.model_type, qwen2 ? "qwen2" : "llama");
  auto m = make_model(g, DType::kF32, false);
  std::vector<float> logits(static_cast<size_t>(g.B) * g.T * g.cfg.vocab_size);
  m->logits(logits.data(), g.tokens.data());
  EXPECT_LE(rel_err(logits.data(), g.file->read_f32("logits")), 1e-4);
  int64_t file_params = 0, biases = 0;
  for (const checkpoint::StTensorInfo& t : g.file->tensors())
    if (t.name.starts_with("param.")) {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      file_params += n;
      biases += t.name.ends_with("_proj.bias") ? 1 : 0;
    }
  EXPECT_EQ(biases, g.cfg.n_layer * (qwen2 ? 3 : 4));
  EXPECT_EQ(g.cfg.num_params(), file_params);
  EXPECT_EQ(static_cast<int64_t>(m->store().numel()), file_params);
  expect_loss_and_grads(g, {}, [](models::TransformerLM&) {});
  expect_engine_steps(g, "tiny-llama", {});
  const nlohmann::json j = hf_config_to_json(g.cfg);
  EXPECT_EQ(j["model_type"], qwen2 ? "qwen2" : "llama");
  const models::ModelConfig back = hf_config_parse(j, "exported");
  EXPECT_EQ(back.qkv_bias, g.cfg.qkv_bias);
  EXPECT_EQ(back.o_bias, g.cfg.o_bias);
  EXPECT_EQ(back.num_params(), g.cfg.num_params());
}

INSTANTIATE_TEST_SUITE_P(Variants, GoldenBias, ::testing::Values("qwen2", "attention-bias"), [](const auto& info) {
  std::string s = info.param;
  for (char& c : s) if (c == '-') c = '_';
  return s;
});

// Documents packed into a sample (Megatron's reset_position_ids and reset_attention_mask) against
// PyTorch given Megatron's position ids and attention mask as get_ltor_masks_and_position_ids builds
// them (tools/torch_models.py's Documents): the batch holds the end-of-document id at the first
// token, twice in a row and at the last token. Each flag alone and both: the loss and every
// gradient, the same with recompute (bit for bit), the engine's AdamW steps, and the plain model's
// gradients on the same tokens apart (the masks matter).
class GoldenDocuments : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(GoldenDocuments, LossEveryGradientAndStepsMatchPyTorch) {
  const auto& [variant, name] = GetParam();
  Golden g = load_golden("documents-" + variant + name);
  const auto& md = g.file->metadata();
  const models::ModelOptions::Documents docs{std::stoi(md.at("eod")), md.at("reset_position_ids") == "1",
                                             md.at("reset_attention_mask") == "1"};
  ASSERT_TRUE(docs.on());
  ASSERT_EQ(docs.positions, variant != "attention-");
  ASSERT_EQ(docs.attention, variant != "positions-");
  ASSERT_EQ(g.tokens[static_cast<size_t>(g.T)], docs.eod) << "row 1 begins with the end-of-document id";
  expect_loss_and_grads(g, docs, [](models::TransformerLM&) {});
  {  // without documents the same batch trains something else (LLaMA's positions alone move its
     // loss by 4e-5 at this initialisation, its gradients by far more)
    auto m = make_model(g, DType::kF32, false);
    m->store().zero_grad();
    m->forward(g.tokens.data(), g.targets.data(), 1.0f);
    m->backward();
    double apart = 0.0;
    for (nn::Parameter* p : m->store().parameters())
      apart = std::max(apart, rel_err(p->grad, g.file->read_f32("grad." + p->name, p->shape)));
    EXPECT_GT(apart, 1e-2) << "the documents change nothing in this batch";
  }
  // The step's attention pairs (its FLOPs in the metrics): by hand, row 0's documents of 5, 7 and 4
  // tokens and row 1's of 1, 7, 1 and 7 give 15 + 28 + 10 + 1 + 28 + 1 + 28 = 111 of the causal 272.
  expect_engine_steps(g, name, docs, docs.attention ? 111.0 : -1.0);
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenDocuments,
                         ::testing::Combine(::testing::Values("", "positions-", "attention-"),
                                            ::testing::Values("tiny-gpt2", "tiny-llama")),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param) + std::get<1>(info.param);
                           if (std::get<0>(info.param).empty()) s = "both-" + s;
                           for (char& c : s) if (c == '-') c = '_';
                           return s;
                         });

// document_bounds: positions and key starts by hand (Megatron's rule: the EOD belongs to the
// document it ends; positions after it count from 0).
TEST(Documents, BoundsByHand) {
  const std::vector<int32_t> tokens = {7, 5, 3, 5, 5, 1,  5, 2, 2, 2, 2, 5};
  std::vector<int32_t> pos(tokens.size()), ks(tokens.size());
  models::document_bounds(tokens.data(), 2, 6, 5, pos.data(), ks.data());
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 0, 1, 0, 0,  0, 0, 1, 2, 3, 4}));
  EXPECT_EQ(ks, (std::vector<int32_t>{0, 0, 2, 2, 4, 5,  0, 1, 1, 1, 1, 1}));
}

// The whole model's names for a config, as the model registers them (every layer, the head), and
// the tensors of a file that the model does not read: a layer past num_hidden_layers and a bias the
// config has none of were dropped without a word (from_pretrained says "Some weights ... were not
// used"); transformers' buffers and a tied lm_head.weight are no such tensors.
TEST(ParameterNames, AFilesTensorsTheModelDoesNotReadAreNamed) {
  models::ModelConfig l = hf_config_load(std::string(MT_SOURCE_DIR) + "/configs/models/tiny-llama.json");
  models::ModelConfig g = hf_config_load(std::string(MT_SOURCE_DIR) + "/configs/models/tiny-gpt2.json");
  models::ModelConfig cls = l;
  cls.num_labels = 3;
  for (const models::ModelConfig& c : {l, g, cls}) {
    models::ModelConfig three = c;
    three.n_layer = 3;
    models::TransformerLM m(three, {});
    std::vector<std::string> want;
    for (const nn::Parameter* p : m.store().parameters()) want.push_back(p->name);
    EXPECT_EQ(hf_model_tensor_names(three), want);
  }
  const ScratchDir dir("mt_hf_unused");
  models::TransformerLM m(l, {});
  hf_weights_save(m.store(), dir.file("model.safetensors"), DType::kF32);
  std::vector<std::string> names;
  for (const nn::Parameter* p : m.store().parameters()) names.push_back(p->name);
  EXPECT_TRUE(hf_unused_tensors(dir.path(), names, false).empty());
  std::vector<checkpoint::StTensorOut> out;
  for (const nn::Parameter* p : m.store().parameters()) out.push_back({p->name, DType::kF32, p->shape, p->master});
  const std::vector<float> bias(64, 0.0f);
  out.push_back({"model.layers.2.input_layernorm.weight", DType::kF32, {64}, bias.data()});
  out.push_back({"model.layers.0.self_attn.q_proj.bias", DType::kF32, {64}, bias.data()});
  out.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", DType::kF32, {8}, bias.data()});
  checkpoint::safetensors_write(dir.file("model.safetensors"), out, {{"format", "pt"}});
  std::vector<std::string> unused = hf_unused_tensors(dir.path(), hf_model_tensor_names(l), false);
  std::sort(unused.begin(), unused.end());
  EXPECT_EQ(unused, (std::vector<std::string>{"model.layers.0.self_attn.q_proj.bias", "model.layers.2.input_layernorm.weight"}));
  // the model still loads what it reads, as before
  models::TransformerLM again(l, {});
  hf_weights_load_path(again.store(), dir.path());
  EXPECT_EQ(again.store().find("lm_head.weight")->master[5], m.store().find("lm_head.weight")->master[5]);
  // a tied model's lm_head.weight is the token table again
  EXPECT_EQ(hf_unused_tensors(dir.path(), {"model.embed_tokens.weight"}, true).size(), out.size() - 3);
}

TEST(ParameterNames, MatchHuggingFace) {
  models::ModelConfig cfg = hf_config_load(std::string(MT_SOURCE_DIR) + "/configs/models/gpt2-124m.json");
  cfg.n_layer = 1;
  models::TransformerLM gpt2(cfg, {});
  ASSERT_NE(gpt2.store().find("transformer.h.0.attn.c_attn.weight"), nullptr);
  EXPECT_EQ(gpt2.store().find("transformer.h.0.attn.c_attn.weight")->shape, (Shape{768, 2304}));
  EXPECT_NE(gpt2.store().find("transformer.wpe.weight"), nullptr);
  EXPECT_NE(gpt2.store().find("transformer.ln_f.bias"), nullptr);
  EXPECT_EQ(gpt2.store().find("lm_head.weight"), nullptr);  // tied
  models::ModelConfig l = hf_config_load(std::string(MT_SOURCE_DIR) + "/configs/models/tiny-llama.json");
  models::TransformerLM llama(l, {});
  EXPECT_NE(llama.store().find("model.layers.0.self_attn.q_proj.weight"), nullptr);
  EXPECT_NE(llama.store().find("model.layers.1.mlp.down_proj.weight"), nullptr);
  EXPECT_NE(llama.store().find("lm_head.weight"), nullptr);
  EXPECT_EQ(static_cast<int64_t>(llama.store().numel()), l.num_params());
  models::ModelConfig full = hf_config_load(std::string(MT_SOURCE_DIR) + "/configs/models/gpt2-124m.json");
  EXPECT_EQ(full.num_params(), 124439808);  // GPT-2 small, as Hugging Face counts it
}

// Hugging Face weights read a tensor at a time (HfWeights): a sharded set (an index and two files)
// gives each parameter the single file's values, and so do the flat ranges ZeRO's runtime asks for
// (weight_initial_values, ranges cutting parameters anywhere). A missing tensor, one the index puts in
// the wrong file, or a wrong shape fails when the weights are opened, naming the tensor and the file.
// An export in fp16 of a weight past its range wrote inf (and meshtrain could not load its own
// export): refused naming the tensor and element.
TEST(HfWeights, AnFp16ExportPastTheRangeIsRefused) {
  models::TransformerLM m(hf_config_load(std::string(MT_SOURCE_DIR) + "/configs/models/tiny-llama.json"), models::ModelOptions{});
  nn::Parameter* p = m.store().parameters().front();
  p->master[3] = 1e5f;
  const std::string f = ::testing::TempDir() + "/mt_f16_range_" + std::to_string(::getpid()) + ".safetensors";
  try {
    hf_weights_save(m.store(), f, DType::kF16);
    ADD_FAILURE() << "written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p->name + " element 3 is 100000.000000, past fp16's range"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(hf_weights_save(m.store(), f, DType::kBF16));
  std::filesystem::remove(f);
}

TEST(HfWeights, ShardedSetsAndFlatRangesGiveTheFilesValues) {
  const std::string d = ::testing::TempDir() + "/mt_hf_weights_" + std::to_string(::getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  models::ModelConfig cfg = hf_config_load(std::string(MT_SOURCE_DIR) + "/configs/models/tiny-llama.json");
  models::ModelOptions so;
  so.seed = 5;
  models::TransformerLM src(cfg, so);
  hf_weights_save(src.store(), d + "/one.safetensors", DType::kF32);
  // The same tensors in two files and an index.
  std::vector<checkpoint::StTensorOut> a, b;
  nlohmann::json wm;
  const auto& ps = src.store().parameters();
  for (size_t i = 0; i < ps.size(); ++i) {
    (i % 2 ? b : a).push_back({ps[i]->name, DType::kF32, ps[i]->shape, ps[i]->master});
    wm[ps[i]->name] = i % 2 ? "b.safetensors" : "a.safetensors";
  }
  checkpoint::safetensors_write(d + "/a.safetensors", a, {});
  checkpoint::safetensors_write(d + "/b.safetensors", b, {});
  {
    std::ofstream(d + "/model.safetensors.index.json") << nlohmann::json{{"weight_map", wm}}.dump();
  }
  models::TransformerLM dst(cfg, {});
  hf_weights_load_path(dst.store(), d);
  for (size_t i = 0; i < ps.size(); ++i) {
    const nn::Parameter* q = dst.store().parameters()[i];
    for (int64_t k = 0; k < q->numel(); ++k) ASSERT_EQ(q->master[k], ps[i]->master[k]) << q->name << " " << k;
  }
  // Ranges of every size, cutting parameters at arbitrary points, in order as the runtime asks.
  auto values = weight_initial_values(std::make_shared<HfWeights>(d + "/model.safetensors.index.json", dst.store()),
                                  dst.store(), [](size_t, size_t, float*) { FAIL() << "every tensor is in the file"; });
  const size_t P = dst.store().numel();
  std::vector<float> flat(P, -1.0f);
  for (size_t at = 0, n = 1; at < P; at += n, n = n * 3 + 7) values(at, std::min(P, at + n), flat.data() + at);
  for (size_t i = 0; i < P; ++i) ASSERT_EQ(flat[i], src.store().master()[i]) << i;

  auto error_of = [&](const std::string& path) {
    try {
      HfWeights w(path, dst.store());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // The index names a file that lacks the tensor.
  wm[ps[0]->name] = "b.safetensors";
  std::ofstream(d + "/bad-index.json") << nlohmann::json{{"weight_map", wm}}.dump();
  std::string e = error_of(d + "/bad-index.json");
  EXPECT_NE(e.find("b.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find(ps[0]->name), std::string::npos) << e;
  // An entry that is not a file name is said so (it read "is not in the weight_map").
  wm[ps[0]->name] = 5;
  std::ofstream(d + "/bad-index.json") << nlohmann::json{{"weight_map", wm}}.dump();
  e = error_of(d + "/bad-index.json");
  EXPECT_NE(e.find("weight_map[\"" + ps[0]->name + "\"] is 5, not a shard's file name"), std::string::npos) << e;
  wm[ps[0]->name] = "a.safetensors";
  // One file lacking a tensor; one holding a tensor of the wrong shape.
  checkpoint::safetensors_write(d + "/short.safetensors", a, {});
  e = error_of(d + "/short.safetensors");
  EXPECT_NE(e.find("short.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find(ps[1]->name), std::string::npos) << e;
  std::vector<checkpoint::StTensorOut> wrong = a;
  for (auto& t : b) wrong.push_back(t);
  wrong[0].shape = {wrong[0].shape[0] * wrong[0].shape[1]};
  checkpoint::safetensors_write(d + "/wrong.safetensors", wrong, {});
  e = error_of(d + "/wrong.safetensors");
  EXPECT_NE(e.find("has shape [" + std::to_string(ps[0]->numel()) + "]"), std::string::npos) << e;
  // A tensor of an integer type: refused when opened, not while the runtime makes its shards.
  std::vector<int32_t> ints(static_cast<size_t>(ps[0]->numel()), 1);
  std::vector<checkpoint::StTensorOut> typed = a;
  for (auto& t : b) typed.push_back(t);
  checkpoint::safetensors_write(d + "/typed.safetensors", typed, {});
  {
    // Rewrite the first tensor's dtype in the header: F32 -> I32 (same width, same offsets).
    std::fstream f(d + "/typed.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    uint64_t n = 0;
    f.read(reinterpret_cast<char*>(&n), 8);
    std::string header(n, ' ');
    f.read(header.data(), static_cast<std::streamsize>(n));
    nlohmann::json h = nlohmann::json::parse(header);
    h[ps[0]->name]["dtype"] = "I32";
    std::string out = h.dump();
    ASSERT_LE(out.size(), header.size());
    out.resize(header.size(), ' ');
    f.seekp(8);
    f.write(out.data(), static_cast<std::streamsize>(out.size()));
  }
  e = error_of(d + "/typed.safetensors");
  EXPECT_NE(e.find("'" + ps[0]->name + "' has dtype I32, expected a float type"), std::string::npos) << e;
  std::filesystem::remove_all(d);
}

// Under tensor parallelism each rank's parameters are slices of the file's tensors: GPT-2's c_attn
// split by columns in three parts (q, k, v), the projections by rows, the embedding by vocabulary
// rows with padding. HfWeights reads a slice run by run and a range of it alone (never the whole
// tensor, DESIGN-NOTES 71): every range gives the slice tp_extract cuts from the whole tensor,
// padding zero, in f32 and bf16 files alike. A range is read in one read here (its runs lie within
// 64 KiB of each other: a column split's row parts are read together, DESIGN-NOTES 74, not one
// read a row), and reads no more than the file bytes from its first element to its last.
TEST(HfWeights, TensorParallelSlicesAndRangesAreTheWholeTensorsSlices) {
  const std::string d = ::testing::TempDir() + "/mt_hf_tp_" + std::to_string(::getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  for (const char* model : {"tiny-gpt2", "tiny-llama"}) {
    models::ModelConfig cfg = hf_config_load(std::string(MT_SOURCE_DIR) + "/configs/models/" + model + ".json");
    models::ModelOptions so;
    so.seed = 9;
    models::TransformerLM full(cfg, so);
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const std::string file = d + "/" + model + "-" + dtype_name(dt) + ".safetensors";
      hf_weights_save(full.store(), file, dt);
      auto errors = comm::run_local_ranks(2, [&](comm::Backend& b) {
        models::ModelOptions o = so;
        o.parallel = parallel::make_parallel_context(std::shared_ptr<comm::Backend>(&b, [](comm::Backend*) {}), 2, 1, false);
        o.vocab_divisible = 8;
        models::TransformerLM shard(cfg, o);
        HfWeights w(file, shard.store());
        for (size_t i = 0; i < shard.store().parameters().size(); ++i) {
          const nn::Parameter* p = shard.store().parameters()[i];
          std::vector<float> whole(static_cast<size_t>(full.store().parameters()[i]->numel()));
          std::memcpy(whole.data(), full.store().parameters()[i]->master, whole.size() * sizeof(float));
          if (dt != DType::kF32)  // the file holds the values rounded
            for (float& v : whole) v = bf16_to_f32(f32_to_bf16(v));
          std::vector<float> want(static_cast<size_t>(p->numel()));
          nn::tp_extract(want.data(), whole.data(), p->global_shape, p->split, p->place);
          std::vector<float> got(want.size(), -1.0f);
          ASSERT_TRUE(w.read(*p, got.data()));
          ASSERT_EQ(got, want) << p->name << " rank " << b.rank();
          const size_t n = want.size();
          for (auto [lo, hi] : {std::pair<size_t, size_t>{0, n}, {1, n / 2 + 3}, {n / 3, n - 1}, {n - 1, n}, {5, 6}}) {
            if (lo >= hi || hi > n) continue;
            std::vector<float> part(hi - lo, -1.0f);
            const size_t before = w.bytes_read(), reads = w.reads();
            ASSERT_TRUE(w.read_range(*p, lo, hi, part.data()));
            // The file bytes spanned by the range's elements (less its padding), in one read.
            size_t first = SIZE_MAX, last = 0;
            nn::tp_for_each_run(p->global_shape, p->split, p->place, [&](int64_t local, int64_t global, int64_t len) {
              const int64_t a = std::max<int64_t>(local, static_cast<int64_t>(lo)), b = std::min<int64_t>(local + len, static_cast<int64_t>(hi));
              if (a >= b) return;
              first = std::min(first, static_cast<size_t>(global + (a - local)));
              last = std::max(last, static_cast<size_t>(global + (b - local)));
            });
            EXPECT_LE(w.bytes_read() - before, first < last ? (last - first) * dtype_size(dt) : 0) << p->name;
            EXPECT_LE(w.reads() - reads, 1u) << p->name << " [" << lo << ", " << hi << ")";
            for (size_t k = lo; k < hi; ++k) ASSERT_EQ(part[k - lo], want[k]) << p->name << " [" << lo << ", " << hi << ") " << k;
          }
        }
      });
      for (auto& e : errors)
        if (e) std::rethrow_exception(e);
    }
  }
  std::filesystem::remove_all(d);
}

}  // namespace
}  // namespace mt::engine
