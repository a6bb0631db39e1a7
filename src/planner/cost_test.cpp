// The cost model (planner/cost.h) against textbook counts: a block's forward GEMMs are
// 24·N·C² for GPT-2 (Narayanan et al. 2021, Megatron-LM's FLOPs formula) and 8·N·C² + 6·N·C·I for
// LLaMA (QKV and output 4·2·N·C², SwiGLU's three projections 3·2·N·C·I), timed at a calibration
// whose lines are given here.
#include "planner/cost.h"

#include <gtest/gtest.h>

#include <array>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"

#include "optim/zero_one_adam.h"
#include "planner/memory.h"

namespace mt::planner {
namespace {

Calibration synthetic() {
  Calibration c;
  c.fits["gemm bf16"] = LinearFit{0.0, 1e-12};
  c.fits["gemm f32"] = LinearFit{0.0, 2e-12};
  c.fits["memory"] = LinearFit{0.0, 0.0};
  c.fits["adamw"] = LinearFit{0.0, 1e-9};
  return c;
}

StepShape tiny(models::Arch arch) {
  StepShape s;
  s.model.arch = arch;
  s.model.vocab_size = 100;
  s.model.hidden = 64;
  s.model.n_layer = 2;
  s.model.n_head = 4;
  s.model.n_kv_head = 4;
  s.model.intermediate = arch == models::Arch::kGpt2 ? 256 : 176;
  s.model.max_positions = 32;
  s.model.tie_embeddings = arch == models::Arch::kGpt2;
  s.micro_batch = 2;
  s.seq_length = 8;
  s.compute = DType::kBF16;
  return s;
}

TEST(CostModel, BlockGemmFlopsAreTheTextbookCounts) {
  const double N = 16, C = 64;
  EXPECT_DOUBLE_EQ(block_gemm_flops(tiny(models::Arch::kGpt2)), 24 * N * C * C);
  EXPECT_DOUBLE_EQ(block_gemm_flops(tiny(models::Arch::kLlama)), 8 * N * C * C + 6 * N * C * 176);
}

TEST(CostModel, BlockTimesAreGemmsAndAttentionAtTheCalibratedRates) {
  StepShape s = tiny(models::Arch::kGpt2);
  Calibration cal = synthetic();
  ZeroStepCosts c = zero_step_costs(s, cal);
  ASSERT_EQ(c.forward.size(), 4u);  // embeddings, two blocks, tail
  // Attention's core: QK^T and PV over the causal pairs, 2·2·B·HS·NH·T(T+1)/2, at the f32 rate.
  const double att = 2.0 * 2 * 2 * 16 * 4 * (8 * 9 / 2);
  const double fwd = 1e-12 * 24 * 16 * 64 * 64 + 2e-12 * att;
  EXPECT_NEAR(c.forward[1], fwd, 1e-18);
  EXPECT_NEAR(c.backward[2], 2 * fwd, 1e-18);
  // The head: N×C×V at the bf16 rate (one rank: the vocabulary unpadded), twice in its backward.
  EXPECT_NEAR(c.forward[3], 1e-12 * 2 * 16 * 64 * 100, 1e-18);
  EXPECT_NEAR(c.head_backward, 2 * c.forward[3], 1e-18);

  // One rank, stage 1, free memory traffic: the simulated step is the passes and the update.
  ZeroStepSpec spec;
  spec.units = model_units(s.model);
  spec.schedule.stage = 1;
  spec.low_precision = true;
  spec.tied_head = true;
  size_t P = 0;
  for (const parallel::Unit& u : spec.units) P += u.numel;
  SimReport r = simulate(zero_step_program(spec, c));
  double passes = c.head_backward;
  for (size_t u = 0; u < c.forward.size(); ++u) passes += c.forward[u] + c.backward[u];
  EXPECT_NEAR(r.makespan, passes + 1e-9 * static_cast<double>(P), 1e-15);

  // The blocks' own elementwise kernels, where calibrated, by elements: two norms and two residual
  // adds over N·C, GELU over N·G (the memory rate's 8 bytes an element forward, its own line
  // backward); bf16 casts of the norms' outputs, attention's output and the activation at the memory
  // rate, (4 + 2)·(2·N·C + N·A) bytes forward and (4 + 2)·(2·N·C + N·A + N·G) backward. In bf16
  // GELU is fused with the saved pre-activation: 4 bytes read and 2 + 2 written an element. The
  // saved q, k, v rounded to bf16 in place (read 4, write 4 + 2 bytes an element), and in the
  // backward their f32 copy (read 2, write 4) and the attention output's bf16 copy again (read 4,
  // write 2). Recompute adds the forward to the backward.
  cal.fits["memory"] = {0.0, 1e-11};
  for (const char* f : {"layernorm forward", "layernorm backward", "rmsnorm forward", "rmsnorm backward",
                        "gelu backward", "swiglu forward", "swiglu backward", "add"})
    cal.fits[f] = {0.0, std::string(f).find("backward") != std::string::npos ? 3e-10 : 1e-10};
  cal.fits["adamw bf16"] = {0.0, 2e-9};
  const double NC = 16 * 64, NG = 16 * 256, NA = 16 * 64;
  const double casts_f = 1e-11 * 6 * (2 * NC + NA), casts_b = 1e-11 * 6 * (2 * NC + NA + NG);
  const double NQKV = 16 * 192;
  const double saved_f = 1e-11 * 10 * NQKV, saved_b = 1e-11 * 6 * (NQKV + NA);
  const double elem_f = 2 * 1e-10 * NC + 2 * 1e-10 * NC + 1e-11 * 8 * NG + casts_f + saved_f;
  const double elem_b = 2 * 3e-10 * NC + 2 * 1e-10 * NC + 3e-10 * NG + casts_b + saved_b;
  c = zero_step_costs(s, cal);
  EXPECT_NEAR(c.forward[1], fwd + elem_f, 1e-15);
  EXPECT_NEAR(c.backward[1], 2 * fwd + elem_b, 1e-15);
  // The update writing the bf16 copy, and the norm's read and zero_grad's write: 8 bytes.
  EXPECT_NEAR(c.optimizer_per_element, 2e-9 + 8e-11, 1e-20);
  // Under ZeRO the update writes the f32 master alone (the refresh converts, in the step program).
  s.zero_stage = 1;
  EXPECT_NEAR(zero_step_costs(s, cal).optimizer_per_element, 1e-9 + 8e-11, 1e-20);
  s.zero_stage = 0;
  s.recompute = true;
  EXPECT_NEAR(zero_step_costs(s, cal).backward[1], 2 * fwd + elem_b + fwd + elem_f, 1e-15);
  s.recompute = false;

  // Tensor parallelism over 2 ranks: the block's GEMMs are this rank's half (24·N·C²/2), the head's
  // its half of the vocabulary (256 padded rows / 2), and each pass makes the tp group's blocking
  // collectives of N·C floats: a block two all-reduces forward and two backward, the embedding
  // one forward, the loss two of N floats, the head's backward one.
  {
    cal = synthetic();
    cal.fits["all_reduce"] = {1e-6, 1e-9};
    StepShape t = tiny(models::Arch::kGpt2);
    t.tp = 2;
    const ZeroStepCosts h = zero_step_costs(t, cal);
    const double att2 = 2.0 * 2 * 2 * 16 * 2 * (8 * 9 / 2);  // NH/2 heads
    EXPECT_NEAR(h.forward[1], 1e-12 * 12 * 16 * 64 * 64 + 2e-12 * att2, 1e-18);
    EXPECT_NEAR(h.forward[3], 1e-12 * 2 * 16 * 64 * 128, 1e-18);
    const double ar = 1e-6 + 1e-9 * 4 * 16 * 64;
    EXPECT_EQ(h.tp_forward[1], (std::vector<double>{ar, ar}));
    EXPECT_EQ(h.tp_backward[2], (std::vector<double>{ar, ar}));
    EXPECT_EQ(h.tp_forward[0], (std::vector<double>{ar}));
    EXPECT_TRUE(h.tp_backward[0].empty());
    EXPECT_EQ(h.tp_forward[3], (std::vector<double>{1e-6 + 1e-9 * 4 * 16, 1e-6 + 1e-9 * 4 * 16}));
    EXPECT_EQ(h.tp_head_backward, (std::vector<double>{ar}));
    // Recompute runs the block's forward again inside its backward, its two all-reduces with it.
    t.recompute = true;
    const ZeroStepCosts r = zero_step_costs(t, cal);
    EXPECT_EQ(r.tp_backward[2], (std::vector<double>{ar, ar, ar, ar}));
    EXPECT_EQ(r.tp_forward[2], (std::vector<double>{ar, ar}));
    EXPECT_TRUE(r.tp_backward[0].empty());
    EXPECT_EQ(r.tp_head_backward, (std::vector<double>{ar}));
    // Sequence parallelism: each all-reduce is an all-gather and a reduce-scatter of N/tp rows, and
    // the backward gathers the two saved norm outputs again (Block::backward, DESIGN-NOTES 68)
    // before the norms' weight gradients are all-reduced (2 norms of 2·C for GPT-2). The norms'
    // outputs (and the final norm's rows for the head) are gathered in the compute dtype, bf16
    // here: 2 bytes an element; the output gradient's rows and the reductions move f32.
    cal.fits["all_gather"] = {2e-6, 1e-9};
    cal.fits["reduce_scatter"] = {3e-6, 1e-9};
    t.recompute = false;
    t.sequence_parallel = true;
    const ZeroStepCosts q = zero_step_costs(t, cal);
    const double ag = 2e-6 + 1e-9 * 4 * 8 * 64, rs = 3e-6 + 1e-9 * 4 * 8 * 64, norms = 1e-6 + 1e-9 * 4 * 4 * 64;
    const double agc = 2e-6 + 1e-9 * 2 * 8 * 64;
    EXPECT_EQ(q.tp_forward[1], (std::vector<double>{agc, rs, agc, rs}));
    EXPECT_EQ(q.tp_backward[1], (std::vector<double>{ag, agc, rs, ag, agc, rs, norms}));
    const double loss = 1e-6 + 1e-9 * 4 * 16;
    EXPECT_EQ(q.tp_forward[3], (std::vector<double>{agc, loss, loss}));
    // f32: every gather moves 4 bytes an element.
    t.compute = DType::kF32;
    const ZeroStepCosts f = zero_step_costs(t, cal);
    EXPECT_EQ(f.tp_forward[1], (std::vector<double>{ag, rs, ag, rs}));
    EXPECT_EQ(f.tp_backward[1], (std::vector<double>{ag, ag, rs, ag, ag, rs, norms}));
    EXPECT_EQ(f.tp_forward[3], (std::vector<double>{ag, loss, loss}));
  }
  cal = synthetic();

  // The ZeRO passes at their own kernels' rates where calibrated, and one rank's collectives, local
  // copies, at the copy's (each byte read and written); older calibrations: the memory rate.
  {
    Calibration m = synthetic();
    m.fits["memory"] = {0.0, 1e-11};
    ZeroStepCosts old = zero_step_costs(s, m);
    EXPECT_DOUBLE_EQ(old.all_gather(1000), 1e-11 * 2 * 1000);
    EXPECT_DOUBLE_EQ(old.reduce_scatter(1000), 1e-11 * 2 * 1000);
    EXPECT_DOUBLE_EQ(old.sum_seconds(4000), 1e-11 * 3 * 4000);
    m.fits["copy"] = {0.0, 2e-12};
    m.fits["zero"] = {0.0, 3e-12};
    m.fits["convert"] = {0.0, 4e-12};
    m.fits["add"] = {0.0, 5e-10};
    const ZeroStepCosts own = zero_step_costs(s, m);
    EXPECT_DOUBLE_EQ(own.all_gather(1000), 2e-12 * 2 * 1000);
    EXPECT_DOUBLE_EQ(own.reduce_scatter(1000), 2e-12 * 2 * 1000);
    EXPECT_DOUBLE_EQ(own.zero_seconds(4000), 3e-12 * 4000);
    EXPECT_DOUBLE_EQ(own.convert_seconds(4000), 4e-12 * 1.5 * 4000);
    EXPECT_DOUBLE_EQ(own.sum_seconds(4000), 5e-10 * 1000);  // by elements
  }

  // A family the calibration lacks is named.
  cal.fits.erase("gemm f32");
  EXPECT_THROW(zero_step_costs(s, cal), Error);
}

// offload_optimizer nvme: the update of n elements in k sub-groups of g, the first read, update and
// write in a row, then k - 1 steps of the slower of the update and the disk's 16 g bytes at the
// mixed rate.
// Dropout's passes at the calibrated "dropout" line by elements (models/block.cpp): each residual
// branch's N·C rows forward, their gradient masked again and copied (16 bytes an element at the
// memory rate) backward; the attention probabilities' causal half, B·NH·T(T+1)/2, once forward and
// twice backward; the embeddings' sum both ways. Without the line: 8 bytes an element.
// Ulysses over 2 ranks (StepShape::usp): a block's GEMMs on half the rows, attention on all T for
// half the heads (half the FLOPs), and the sp group's all-to-alls as its passes' blocking
// collectives, by the bytes a rank sends: forward q, k, v and the output; backward the output
// twice and q, k, v (the forward's two first under recompute); the loss's two all-reduces. A
// calibration without an all_to_all line prices one as all_gather of a rank's n-th.
TEST(CostModel, UlyssesHalvesTheRowsAndHeadsAndAddsItsAllToAlls) {
  Calibration cal = synthetic();
  cal.world = 2;
  cal.fits["all_to_all"] = LinearFit{1e-5, 1e-9};
  cal.fits["all_reduce"] = LinearFit{2e-5, 0.0};
  cal.fits["all_gather"] = LinearFit{3e-6, 4e-9};
  cal.fits["attention forward"] = LinearFit{0.0, 1e-11};
  cal.fits["attention backward"] = LinearFit{0.0, 3e-11};
  StepShape one = tiny(models::Arch::kLlama);
  one.compute = DType::kF32;
  one.model.n_kv_head = 2;
  StepShape two = one;
  two.usp = 2;
  two.world = 2;
  const ZeroStepCosts a = zero_step_costs(one, cal), b = zero_step_costs(two, cal);
  const double N = 2.0 * 8 / 2, QKV = (4 + 2 * 2) * 16, A = 4 * 16;  // this rank's rows; the full widths
  const double qkv = 1e-5 + 1e-9 * 4 * N * QKV, att = 1e-5 + 1e-9 * 4 * N * A;
  EXPECT_TRUE(a.sp_forward.empty());
  EXPECT_TRUE(b.tp_forward.empty());
  ASSERT_EQ(b.sp_forward.size(), 4u);
  EXPECT_TRUE(b.sp_forward[0].empty());
  for (size_t u = 1; u <= 2; ++u) {
    ASSERT_EQ(b.sp_forward[u].size(), 2u);
    EXPECT_DOUBLE_EQ(b.sp_forward[u][0], qkv);
    EXPECT_DOUBLE_EQ(b.sp_forward[u][1], att);
    ASSERT_EQ(b.sp_backward[u].size(), 3u);
    EXPECT_DOUBLE_EQ(b.sp_backward[u][0], att);
    EXPECT_DOUBLE_EQ(b.sp_backward[u][1], att);
    EXPECT_DOUBLE_EQ(b.sp_backward[u][2], qkv);
  }
  ASSERT_EQ(b.sp_forward[3].size(), 2u);
  EXPECT_DOUBLE_EQ(b.sp_forward[3][0], 2e-5);
  // Free memory traffic and linear lines without a call's cost: half the rows and half the heads
  // are half of every FLOP, so half the block.
  EXPECT_NEAR(b.forward[1], a.forward[1] / 2, 1e-12 * a.forward[1]);
  EXPECT_NEAR(b.backward[1], a.backward[1] / 2, 1e-12 * a.backward[1]);
  two.recompute = true;
  const ZeroStepCosts r = zero_step_costs(two, cal);
  ASSERT_EQ(r.sp_backward[1].size(), 5u);
  EXPECT_DOUBLE_EQ(r.sp_backward[1][0], qkv);
  EXPECT_DOUBLE_EQ(r.sp_backward[1][4], qkv);
  cal.fits.erase("all_to_all");
  EXPECT_DOUBLE_EQ(zero_step_costs(two, cal).sp_forward[1][0], 3e-6 + 4e-9 * 4 * N * QKV / 2);
  // With tp 2 (stop 80): each rank's tp share of the heads exchanged (half the widths), the tp
  // collectives in their own lists; the heads must split over tp x sp.
  cal.fits["all_to_all"] = LinearFit{1e-5, 1e-9};
  two.recompute = false;
  two.tp = 2;
  two.model.n_kv_head = 4;
  const ZeroStepCosts t = zero_step_costs(two, cal);
  const double QKV2 = (4 + 2 * 4) * 16 / 2.0, A2 = A / 2;
  ASSERT_EQ(t.sp_forward[1].size(), 2u);
  EXPECT_DOUBLE_EQ(t.sp_forward[1][0], 1e-5 + 1e-9 * 4 * N * QKV2);
  EXPECT_DOUBLE_EQ(t.sp_forward[1][1], 1e-5 + 1e-9 * 4 * N * A2);
  ASSERT_EQ(t.tp_forward[1].size(), 2u);  // the block's two all-reduces over tp
  EXPECT_EQ(t.sp_forward[3].size(), 2u);
  two.model.n_kv_head = 2;  // 2 kv heads over tp 2 x sp 2
  EXPECT_THROW(zero_step_costs(two, cal), Error);
}

TEST(CostModel, DropoutPassesAreTheMasksAtTheCalibratedRate) {
  StepShape s = tiny(models::Arch::kGpt2);
  Calibration cal = synthetic();
  cal.fits["memory"] = {0.0, 1e-11};
  const ZeroStepCosts plain = zero_step_costs(s, cal);
  cal.fits["dropout"] = {0.0, 7e-10};
  EXPECT_EQ(zero_step_costs(s, cal).forward[1], plain.forward[1]);  // no dropout asked: no pass
  s.model.embd_pdrop = 0.1f;
  s.model.resid_pdrop = 0.1f;
  s.model.attn_pdrop = 0.1f;
  const double NC = 16 * 64, probs = 2 * 4 * (8 * 9 / 2);
  ZeroStepCosts c = zero_step_costs(s, cal);
  EXPECT_NEAR(c.forward[1] - plain.forward[1], 7e-10 * (2 * NC + probs), 1e-15);
  EXPECT_NEAR(c.backward[1] - plain.backward[1], 7e-10 * (2 * NC + 2 * probs) + 1e-11 * 16 * NC, 1e-15);
  EXPECT_NEAR(c.forward[0] - plain.forward[0], 7e-10 * NC, 1e-15);
  EXPECT_NEAR(c.backward[0] - plain.backward[0], 7e-10 * NC, 1e-15);
  cal.fits.erase("dropout");
  c = zero_step_costs(s, cal);
  EXPECT_NEAR(c.forward[1] - plain.forward[1], 1e-11 * 8 * (2 * NC + probs), 1e-15);
}

// The attention a run computes. Documents (data.reset_attention_mask) price their share of the
// causal kernel's tiles, its core and the dropout of its probabilities; a sparse layout prices its
// pairs, counted here by hand, at the sparse kernel's lines of the nearest calibrated block (else
// at the dense kernel's), a tp rank its heads' share.
TEST(CostModel, DocumentsAndSparseLayoutsPriceTheAttentionTheyCompute) {
  StepShape s = tiny(models::Arch::kGpt2);
  s.seq_length = 64;
  s.model.max_positions = 64;
  Calibration cal = synthetic();
  cal.fits["attention forward"] = {0.0, 3e-12};
  cal.fits["attention backward"] = {0.0, 5e-12};
  cal.fits["dropout"] = {0.0, 7e-10};
  const ZeroStepCosts causal = zero_step_costs(s, cal);
  // B 2, HS 16, NH 4: 2·2·B·HS·NH·T(T+1)/2.
  const double att = 2.0 * 2 * 2 * 16 * 4 * (64 * 65 / 2);
  s.attention_share = 0.25;
  ZeroStepCosts c = zero_step_costs(s, cal);
  EXPECT_NEAR(causal.forward[1] - c.forward[1], 0.75 * 3e-12 * att, 1e-15);
  EXPECT_NEAR(causal.backward[1] - c.backward[1], 0.75 * 5e-12 * att, 1e-15);
  EXPECT_EQ(c.forward[3], causal.forward[3]);  // the head is not attention
  s.model.attn_pdrop = 0.1f;
  const double probs = 2.0 * 4 * (64 * 65 / 2);
  const ZeroStepCosts dropped = zero_step_costs(s, cal);
  EXPECT_NEAR(dropped.forward[1] - c.forward[1], 0.25 * 7e-10 * probs, 1e-15);
  EXPECT_NEAR(dropped.backward[1] - c.backward[1], 0.25 * 2 * 7e-10 * probs, 1e-15);
  s.model.attn_pdrop = 0.0f;
  // With the calibration's split of the kernel's time (a query tile's fixed work and a pair's),
  // documents keep every query tile: T 64 is one tile of 64 x 64 pairs a head, so the share the
  // run keeps is (a + 4096 b 0.25) / (a + 4096 b) of the causal time, not 0.25 of it.
  cal.fits["attention forward query tile"] = {0.0, 2e-6};
  cal.fits["attention forward pair"] = {0.0, 1e-9};
  cal.fits["attention backward query tile"] = {0.0, 3e-6};
  cal.fits["attention backward pair"] = {0.0, 2e-9};
  const double kept_f = (2e-6 + 4096 * 1e-9 * 0.25) / (2e-6 + 4096 * 1e-9),
               kept_b = (3e-6 + 4096 * 2e-9 * 0.25) / (3e-6 + 4096 * 2e-9);
  const ZeroStepCosts split = zero_step_costs(s, cal);
  EXPECT_NEAR(causal.forward[1] - split.forward[1], (1 - kept_f) * 3e-12 * att, 1e-15);
  EXPECT_NEAR(causal.backward[1] - split.backward[1], (1 - kept_b) * 5e-12 * att, 1e-15);
  s.attention_share = 1.0;
  EXPECT_EQ(zero_step_costs(s, cal).forward[1], causal.forward[1]);  // causal: the line as it was
  // T 256: four query tiles a head and 64^2 (1 + 2 + 3 + 4) = 40960 causal pairs.
  s.seq_length = 256;
  s.model.max_positions = 256;
  const ZeroStepCosts causal256 = zero_step_costs(s, cal);
  s.attention_share = 0.25;
  const ZeroStepCosts split256 = zero_step_costs(s, cal);
  const double att256 = 2.0 * 2 * 2 * 16 * 4 * (256 * 257 / 2);
  const double kept256 = (4 * 2e-6 + 40960 * 1e-9 * 0.25) / (4 * 2e-6 + 40960 * 1e-9);
  EXPECT_NEAR(causal256.forward[1] - split256.forward[1], (1 - kept256) * 3e-12 * att256, 1e-14);
  s.seq_length = 64;
  s.model.max_positions = 64;
  s.attention_share = 1.0;
  // Grouped-query heads (2 kv heads for 4): the backward's fixed work, a kv head's key tiles, is
  // half of it a query head; the forward's is whole.
  StepShape g = s;
  g.model.arch = models::Arch::kLlama;  // (GPT-2 has a kv head each)
  g.model.tie_embeddings = false;
  g.model.n_kv_head = 2;
  const ZeroStepCosts g_causal = zero_step_costs(g, cal);
  g.attention_share = 0.25;
  const ZeroStepCosts g_split = zero_step_costs(g, cal);
  const double g_kept_b = (0.5 * 3e-6 + 4096 * 2e-9 * 0.25) / (0.5 * 3e-6 + 4096 * 2e-9);
  EXPECT_NEAR(g_causal.backward[1] - g_split.backward[1], (1 - g_kept_b) * 5e-12 * att, 1e-15);
  EXPECT_NEAR(g_causal.forward[1] - g_split.forward[1], (1 - kept_f) * 3e-12 * att, 1e-15);
  for (const char* f : {"attention forward query tile", "attention forward pair", "attention backward query tile", "attention backward pair"})
    cal.fits.erase(f);
  s.attention_share = 0.0;
  EXPECT_THROW(zero_step_costs(s, cal), Error);
  s.attention_share = 1.0;

  // Four blocks of 16 a head: the diagonal (16·17/2 causal pairs each) and key blocks 0 and 1 of
  // query blocks 1 and 3 (256 each): 4·136 + 2·256 = 1056 pairs a head, 4224 for the four.
  std::vector<uint8_t> layout(4 * 4 * 4, 0);
  for (int h = 0; h < 4; ++h)
    for (auto [r, k] : {std::pair{0, 0}, {1, 1}, {2, 2}, {3, 3}, {1, 0}, {3, 1}}) layout[(h * 4 + r) * 4 + k] = 1;
  s.sparse = std::make_shared<kernels::SparseAttentionPlan>(kernels::sparse_attention_plan(layout.data(), 4, 4, 16, true));
  const double sparse = 2.0 * 2 * 2 * 16 * 4224;
  c = zero_step_costs(s, cal);  // no sparse lines: the dense kernel's
  EXPECT_NEAR(causal.forward[1] - c.forward[1], 3e-12 * (att - sparse), 1e-15);
  EXPECT_NEAR(causal.backward[1] - c.backward[1], 5e-12 * (att - sparse), 1e-15);
  cal.fits["sparse attention forward b16"] = {0.0, 11e-12};
  cal.fits["sparse attention backward b16"] = {0.0, 13e-12};
  cal.fits["sparse attention forward b64"] = {0.0, 1e-12};
  cal.fits["sparse attention backward b64"] = {0.0, 1e-12};
  c = zero_step_costs(s, cal);
  EXPECT_NEAR(c.forward[1] - causal.forward[1], 11e-12 * sparse - 3e-12 * att, 1e-15);
  EXPECT_NEAR(c.backward[1] - causal.backward[1], 13e-12 * sparse - 5e-12 * att, 1e-15);
  // Tensor parallelism: each rank computes its heads' pairs; with heads 2 and 3 on the diagonal
  // alone (4·136 = 544 pairs each), rank 0's heads 0 and 1 (2·1056) are the step's.
  for (int h = 2; h < 4; ++h)
    for (auto [r, k] : {std::pair{1, 0}, {3, 1}}) layout[(h * 4 + r) * 4 + k] = 0;
  s.sparse = std::make_shared<kernels::SparseAttentionPlan>(kernels::sparse_attention_plan(layout.data(), 4, 4, 16, true));
  s.tp = 2;
  for (const char* c : {"all_reduce", "all_gather", "reduce_scatter"}) cal.fits[c] = {0.0, 0.0};
  const ZeroStepCosts tp_sparse = zero_step_costs(s, cal);
  s.sparse = nullptr;
  const ZeroStepCosts tp_causal = zero_step_costs(s, cal);
  EXPECT_NEAR(tp_sparse.forward[1] - tp_causal.forward[1], 11e-12 * 2.0 * 2 * 2 * 16 * 2112 - 3e-12 * att / 2, 1e-15);
  s.tp = 1;
  // Ulysses likewise (stop 80): sp rank 0 attends for heads 0 and 1 over the whole samples.
  cal.fits["all_to_all"] = {0.0, 0.0};
  s.usp = 2;
  s.sparse = std::make_shared<kernels::SparseAttentionPlan>(kernels::sparse_attention_plan(layout.data(), 4, 4, 16, true));
  const ZeroStepCosts usp_sparse = zero_step_costs(s, cal);
  s.sparse = nullptr;
  const ZeroStepCosts usp_causal = zero_step_costs(s, cal);
  EXPECT_NEAR(usp_sparse.forward[1] - usp_causal.forward[1], 11e-12 * 2.0 * 2 * 2 * 16 * 2112 - 3e-12 * att / 2, 1e-15);
  s.usp = 1;
  // The nearest block: the smallest calibrated one at least as wide, else the widest; a line
  // without its backward is not one.
  cal.fits["sparse attention forward b32"] = {0.0, 1e-12};
  EXPECT_EQ(sparse_attention_line(cal, 8), 16);
  EXPECT_EQ(sparse_attention_line(cal, 16), 16);
  EXPECT_EQ(sparse_attention_line(cal, 32), 64);
  EXPECT_EQ(sparse_attention_line(cal, 100), 64);
  EXPECT_EQ(sparse_attention_line(synthetic(), 16), 0);
}

// A tiny GPT-2 block (N 16, C 64) widened against one at the bf16 line (synthetic(): f32 at 2e-12
// a flop, bf16 at 1e-12, "convert" 1e-10 a byte): the f32 line, and 6 bytes an element of every
// operand widened. Returns the forward's and backward's widened elements and the forward's flops.
std::array<double, 3> expect_block_widened(const ZeroStepCosts& wide, const ZeroStepCosts& native) {
  // QKV (N x C, 3C x C), output (N x C, C x C), MLP (N x C, 4C x C), (N x 4C, C x 4C).
  const double N = 16, C = 64;
  const double forward_elems = N * C + 3 * C * C + N * C + C * C + N * C + 4 * C * C + N * 4 * C + 4 * C * C;
  // dX widens dY (N x out) and W, dW widens dY and X, for each of the four.
  const double backward_elems = (2 * N * 3 * C + 3 * C * C + N * C) + (2 * N * C + C * C + N * C) +
                                (2 * N * 4 * C + 4 * C * C + N * C) + (2 * N * C + 4 * C * C + N * 4 * C);
  const double flops = 24 * N * C * C;
  EXPECT_NEAR(wide.forward[1] - native.forward[1], (2e-12 - 1e-12) * flops + 6e-10 * forward_elems, 1e-15);
  EXPECT_NEAR(wide.backward[1] - native.backward[1], (2e-12 - 1e-12) * 2 * flops + 6e-10 * backward_elems, 1e-15);
  return {forward_elems, backward_elems, flops};
}

// fp16 on this machine: oneDNN has no f16 matmul without AVX512-FP16, so every GEMM widens both
// operands to f32 (6 bytes an element at the "convert" line) and runs at the f32 line. The LM head,
// run in tiles of rows, widens its weight once and each tile's rows once (nn::lm_head_widened), and
// rounds dlogits in place (8 bytes an element: 8/6 of a widened one). A described cluster's
// devices multiply f16 as bf16.
TEST(CostModel, Fp16IsWidenedToF32WhereTheMachineHasNoF16Matmul) {
  StepShape s = tiny(models::Arch::kGpt2);
  Calibration cal = synthetic();
  cal.fits["convert"] = {0.0, 1e-10};
  const ZeroStepCosts bf16 = zero_step_costs(s, cal);
  s.compute = DType::kF16;
  ZeroStepCosts c = zero_step_costs(s, cal);
  const double C = 64;
  const auto [forward_elems, backward_elems, flops] = expect_block_widened(c, bf16);
  // No convert line: the memory rate.
  cal.fits.erase("convert");
  cal.fits["memory"] = {0.0, 3e-11};
  const ZeroStepCosts at_memory = zero_step_costs(s, cal);
  s.compute = DType::kBF16;
  const ZeroStepCosts bf16_memory = zero_step_costs(s, cal);
  EXPECT_NEAR(at_memory.forward[1] - bf16_memory.forward[1], (2e-12 - 1e-12) * flops + 1.8e-10 * forward_elems, 1e-14);
  // The head in two tiles (V 100, f32 logits of at most 64 MiB are 167,772 rows; N = 21,000 x 8):
  // the weight widened once, not once a tile's GEMM.
  cal = synthetic();
  cal.fits["convert"] = {0.0, 1e-10};
  s.micro_batch = 21000;
  s.compute = DType::kF16;
  c = zero_step_costs(s, cal);
  const double rows = 168000, V = 100;
  EXPECT_NEAR(c.forward.back(), 2e-12 * 2 * rows * C * V + 6e-10 * (rows * C + V * C), 1e-12);
  EXPECT_NEAR(c.head_backward, 2e-12 * 4 * rows * C * V + 8e-10 * rows * V, 1e-12);
  // A machine with an f16 matmul, and a described cluster: f16 at the bf16 line, nothing widened.
  for (bool cluster : {false, true}) {
    Calibration native = cal;
    (cluster ? native.has_network : native.f16_native) = true;
    s.compute = DType::kF16;
    c = zero_step_costs(s, native);
    s.compute = DType::kBF16;
    EXPECT_EQ(c.forward[1], zero_step_costs(s, native).forward[1]) << cluster;
  }
}

// bf16 on a machine without a bf16 matmul (an AVX2 CPU; Calibration::bf16_native false): gemm
// widens both operands to f32 as it does f16's, the head's too (its GEMMs are kernels::gemm calls on
// bf16 operands; only f16 keeps f32 copies of its own), and the blocks keep bf16's in-situ factor,
// which the calibration measured against this same sum. It was priced as a bf16 matmul on any CPU
// (stop 76's note; stop 77).
TEST(CostModel, Bf16IsWidenedToF32WhereTheCalibrationFoundNoBf16Matmul) {
  StepShape s = tiny(models::Arch::kGpt2);
  s.compute = DType::kBF16;
  Calibration cal = synthetic();
  cal.fits["convert"] = {0.0, 1e-10};
  const ZeroStepCosts native = zero_step_costs(s, cal);
  cal.bf16_native = false;
  const ZeroStepCosts wide = zero_step_costs(s, cal);
  const double N = 16, C = 64, V = 100;
  expect_block_widened(wide, native);
  // The head: logits = x W^T widens x (N x C) and W (V x C); dx = dlogits W and dW = dlogits^T x
  // widen dlogits (N x V) twice, W and x.
  EXPECT_NEAR(wide.forward.back() - native.forward.back(), (2e-12 - 1e-12) * 2 * N * C * V + 6e-10 * (N * C + V * C), 1e-15);
  EXPECT_NEAR(wide.head_backward - native.head_backward,
              (2e-12 - 1e-12) * 4 * N * C * V + 6e-10 * (2 * N * V + V * C + N * C), 1e-15);
  // bf16's own in-situ factor scales the widened blocks, not f32's.
  cal.fits["in situ forward gpt2 bf16"] = {0.0, 3.0};
  cal.fits["in situ forward gpt2 f32"] = {0.0, 5.0};
  EXPECT_NEAR(zero_step_costs(s, cal).forward[1], 3.0 * wide.forward[1], 1e-15);
  // A calibration with a bf16 matmul, and a described cluster, multiply bf16 as it is.
  cal.fits.erase("in situ forward gpt2 bf16");
  cal.fits.erase("in situ forward gpt2 f32");
  Calibration cluster = cal;
  cluster.has_network = true;
  Calibration cluster_native = cluster;
  cluster_native.bf16_native = true;
  EXPECT_EQ(zero_step_costs(s, cluster).forward[1], zero_step_costs(s, cluster_native).forward[1]);
  EXPECT_EQ(zero_step_costs(s, cluster).head_backward, zero_step_costs(s, cluster_native).head_backward);
}

// The update is the run's optimizer at its own calibrated line (the bf16-copy variant at stage 0 in
// low precision), the shard's norm read and zero_grad write beside it; a calibration without the
// line (older, or a described cluster) prices it at AdamW's.
TEST(CostModel, TheUpdateIsTheRunsOptimizerAtItsOwnLine) {
  optim::OptimizerSpec spec;
  EXPECT_EQ(update_kind(spec), UpdateKind::kAdamW);
  for (const char* t : {"Adam", "adamw", "OneBitAdam", "ZeroOneAdam"}) {
    spec.type = t;
    EXPECT_EQ(update_kind(spec), UpdateKind::kAdamW) << t;
  }
  for (const char* t : {"Lamb", "OneBitLamb"}) {
    spec.type = t;
    EXPECT_EQ(update_kind(spec), UpdateKind::kLamb) << t;
  }
  spec.type = "SGD";
  EXPECT_EQ(update_kind(spec), UpdateKind::kSgd);
  spec.momentum = 0.9;
  EXPECT_EQ(update_kind(spec), UpdateKind::kSgdMomentum);

  Calibration cal = synthetic();
  cal.fits["memory"] = {0.0, 1e-11};
  cal.fits["adamw bf16"] = {0.0, 2e-9};
  cal.fits["lamb"] = {0.0, 3e-9};
  cal.fits["lamb bf16"] = {0.0, 4e-9};
  cal.fits["sgd"] = {0.0, 5e-10};
  cal.fits["sgd momentum"] = {0.0, 7e-10};
  cal.fits["sgd momentum bf16"] = {0.0, 8e-10};
  StepShape s = tiny(models::Arch::kGpt2);
  s.micro_batch = 2;
  s.seq_length = 8;
  auto update = [&](UpdateKind u, DType dt, int stage) {
    s.update = u;
    s.compute = dt;
    s.zero_stage = stage;
    return zero_step_costs(s, cal).optimizer_per_element;
  };
  // (synthetic() has none of the blocks' own kernels, so the norm's read and zero_grad's write
  // are not added here: BlockTimesAreGemmsAndAttentionAtTheCalibratedRates prices them.)
  EXPECT_DOUBLE_EQ(update(UpdateKind::kLamb, DType::kF32, 0), 3e-9);
  EXPECT_DOUBLE_EQ(update(UpdateKind::kLamb, DType::kBF16, 0), 4e-9);
  EXPECT_DOUBLE_EQ(update(UpdateKind::kLamb, DType::kBF16, 2), 3e-9);  // ZeRO: the f32 master alone
  EXPECT_DOUBLE_EQ(update(UpdateKind::kSgdMomentum, DType::kBF16, 0), 8e-10);
  EXPECT_DOUBLE_EQ(update(UpdateKind::kSgd, DType::kF32, 0), 5e-10);
  EXPECT_DOUBLE_EQ(update(UpdateKind::kSgd, DType::kBF16, 0), 5e-10);  // no bf16 line: its f32 one
  EXPECT_DOUBLE_EQ(update(UpdateKind::kAdamW, DType::kBF16, 0), 2e-9);
  // 1-bit LAMB past its warm-up: its own line; without it, its warm-up's (LAMB's).
  cal.fits["onebitlamb compressed"] = {0.0, 6e-9};
  EXPECT_DOUBLE_EQ(update(UpdateKind::kOneBitLambCompressed, DType::kF32, 0), 6e-9);
  EXPECT_DOUBLE_EQ(update(UpdateKind::kOneBitAdamCompressed, DType::kF32, 0), 1e-9);  // no line: AdamW's
  cal.fits.erase("onebitlamb compressed");
  EXPECT_DOUBLE_EQ(update(UpdateKind::kOneBitLambCompressed, DType::kBF16, 0), 4e-9);
  cal.fits.erase("lamb");
  cal.fits.erase("lamb bf16");
  EXPECT_DOUBLE_EQ(update(UpdateKind::kLamb, DType::kF32, 0), 1e-9);  // no line: AdamW's
  EXPECT_DOUBLE_EQ(update(UpdateKind::kLamb, DType::kBF16, 0), 2e-9);
  // The compressed exchange over two ranks at its calibrated line (a calibration without it: the
  // all-reduce's); none in the warm-up.
  s.world = 2;
  s.update = UpdateKind::kAdamW;
  cal.world = 2;
  cal.fits["all_reduce"] = {1e-5, 1e-9};
  EXPECT_FALSE(zero_step_costs(s, cal).onebit_exchange);
  s.update = UpdateKind::kOneBitAdamCompressed;
  EXPECT_DOUBLE_EQ(zero_step_costs(s, cal).onebit_exchange(4e6), 1e-5 + 4e-3);
  cal.fits["onebit_all_reduce"] = {2e-5, 3e-9};
  EXPECT_DOUBLE_EQ(zero_step_costs(s, cal).onebit_exchange(4e6), 2e-5 + 1.2e-2);
}

// 0/1 Adam's steps, counted by hand from DeepSpeed's rules (zoadam.py; state step s = t + 1),
// var_freeze_step 6, var_update_scaler 2, local_step_scaler 1, local_step_clipper 2. Updates 1-6
// (s 2-7) are phase 1: a variance step where s % var_interval == 0, the interval doubling after
// every 2nd variance step: t 1, 2 (interval 1 -> 2), 3, 5 (-> 4) are variance steps, t 4 and 6
// compressed-gradient ones. From t 7 the variance is frozen: a sync where s % local_interval == 0,
// the interval doubling after every step up to 2: t 7 (s 8) syncs, then s odd steps are local.
TEST(CostModel, ZeroOneAdamsStepsAreCountedAsItsPolicyMakesThem) {
  optim::OptimizerSpec spec;
  spec.type = "ZeroOneAdam";
  spec.var_freeze_step = 6;
  spec.var_update_scaler = 2;
  spec.local_step_scaler = 1;
  spec.local_step_clipper = 2;
  auto share = [](const std::vector<std::pair<UpdateKind, double>>& mix, UpdateKind k) {
    for (const auto& [u, w] : mix)
      if (u == k) return w;
    return 0.0;
  };
  const auto all = zero_one_mix(spec, 1, 12);
  EXPECT_EQ(all.size(), 4u);
  EXPECT_DOUBLE_EQ(share(all, UpdateKind::kAdamW), 4.0 / 12);             // t 1, 2, 3, 5
  EXPECT_DOUBLE_EQ(share(all, UpdateKind::kZeroOneCompressed), 2.0 / 12); // t 4, 6
  EXPECT_DOUBLE_EQ(share(all, UpdateKind::kZeroOneSync), 3.0 / 12);       // t 7, 9, 11
  EXPECT_DOUBLE_EQ(share(all, UpdateKind::kZeroOneLocal), 3.0 / 12);      // t 8, 10, 12
  // Steps 3-12 (what plan --validate measures of a 12-step run): t 1 and 2 left out.
  const auto window = zero_one_mix(spec, 3, 12);
  EXPECT_DOUBLE_EQ(share(window, UpdateKind::kAdamW), 2.0 / 10);
  EXPECT_DOUBLE_EQ(share(window, UpdateKind::kZeroOneLocal), 3.0 / 10);
  // Steps 1-3: variance steps alone; a kind with no step is left out.
  const auto first = zero_one_mix(spec, 1, 3);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].first, UpdateKind::kAdamW);
  EXPECT_DOUBLE_EQ(first[0].second, 1.0);
  EXPECT_THROW(zero_one_mix(spec, 0, 3), Error);
  EXPECT_THROW(zero_one_mix(spec, 4, 3), Error);
  // DeepSpeed's defaults over 1000 steps (var_freeze_step 100000, var_update_scaler 16): 16
  // variance steps at each interval, doubling: s 2-17 (interval 1), 18-48 (2), 52-112 (4),
  // 120-240 (8), 256-496 (16), 512-992 (32), the next at s 1024 (t 1023): 96, the rest compressed.
  spec.var_freeze_step = 100000;
  spec.var_update_scaler = 16;
  const auto defaults = zero_one_mix(spec, 1, 1000);
  ASSERT_EQ(defaults.size(), 2u);
  EXPECT_DOUBLE_EQ(share(defaults, UpdateKind::kAdamW), 0.096);
  EXPECT_DOUBLE_EQ(share(defaults, UpdateKind::kZeroOneCompressed), 0.904);
}

// Whether a variance step follows an exchange (a compressed-gradient step) within a run: the
// closed form against the optimizer's policy stepped through, over scalers, freeze steps and run
// lengths (DeepSpeed's defaults at once: var_update_scaler 16, first compressed at update 18, the
// next variance step at 19).
TEST(CostModel, ZeroOneAdamsVarianceAfterAnExchangeIsItsPolicys) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (int64_t vfs : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{4}, int64_t{5}, int64_t{6}, int64_t{40}, kMax})
    for (int64_t vus : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{16}, kMax})
      for (int64_t last : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{6}, int64_t{18},
                           int64_t{19}, int64_t{50}}) {
        optim::OptimizerSpec spec;
        spec.type = "ZeroOneAdam";
        spec.var_freeze_step = vfs;
        spec.var_update_scaler = vus;
        optim::ZeroOneAdamConfig c;
        c.var_freeze_step = vfs;
        c.var_update_scaler = vus;
        optim::ZeroOnePolicy policy(c);
        bool exchanged = false, expect = false;
        for (int64_t t = 1; t <= last; ++t) {
          const optim::ZeroOnePolicy::Kind k = policy.kind(t);
          expect = expect || (exchanged && k == optim::ZeroOnePolicy::Kind::kVariance);
          exchanged = exchanged || k == optim::ZeroOnePolicy::Kind::kCompressedGradient;
          policy.advance(t);
        }
        EXPECT_EQ(zero_one_variance_after_exchange(spec, last), expect) << "vfs " << vfs << " vus " << vus << " last " << last;
      }
  optim::OptimizerSpec ds;
  ds.type = "ZeroOneAdam";
  ds.var_freeze_step = 100000;
  ds.var_update_scaler = 16;
  EXPECT_FALSE(zero_one_variance_after_exchange(ds, 18));
  EXPECT_TRUE(zero_one_variance_after_exchange(ds, 19));
  EXPECT_TRUE(zero_one_variance_after_exchange(ds, kMax));
}

// The count goes an interval at a time (a loop over 1e9 steps took seconds): it agrees with the
// optimizer's own policy, stepped through, over configurations that reach every rule (the variance
// interval never doubling, doubling at every variance step or later; the sync interval fixed,
// doubling to a clipper that is not a power of two, or at once clipped), and over any window.
TEST(CostModel, ZeroOneAdamsCountAgreesWithItsPolicyStepByStep) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();  // "never", as a configuration may say it
  for (int64_t vfs : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{5}, int64_t{13}, kMax})
    for (int64_t vus : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{16}, kMax})
      for (int64_t lss : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{5}, kMax})
        for (int64_t lsc : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{7}, int64_t{16}, kMax}) {
          optim::OptimizerSpec spec;
          spec.type = "ZeroOneAdam";
          spec.var_freeze_step = vfs;
          spec.var_update_scaler = vus;
          spec.local_step_scaler = lss;
          spec.local_step_clipper = lsc;
          optim::ZeroOneAdamConfig c;
          c.var_freeze_step = vfs;
          c.var_update_scaler = vus;
          c.local_step_scaler = lss;
          c.local_step_clipper = lsc;
          std::vector<optim::ZeroOnePolicy::Kind> kind(1);  // kind[t], t from 1
          optim::ZeroOnePolicy policy(c);
          for (int64_t t = 1; t <= 90; ++t) {
            kind.push_back(policy.kind(t));
            policy.advance(t);
          }
          for (int64_t first : {1, 3, 8})
            for (int64_t last = first; last <= 90; last += 7) {
              std::array<int, 4> n{};
              for (int64_t t = first; t <= last; ++t) ++n[static_cast<size_t>(kind[static_cast<size_t>(t)])];
              const UpdateKind as[] = {UpdateKind::kAdamW, UpdateKind::kZeroOneCompressed, UpdateKind::kZeroOneLocal,
                                       UpdateKind::kZeroOneSync};
              std::vector<std::pair<UpdateKind, double>> want;
              for (size_t k = 0; k < 4; ++k)
                if (n[k] > 0) want.emplace_back(as[k], static_cast<double>(n[k]) / static_cast<double>(last - first + 1));
              EXPECT_EQ(zero_one_mix(spec, first, last), want)
                  << "var_freeze_step " << vfs << " var_update_scaler " << vus << " local_step_scaler " << lss
                  << " local_step_clipper " << lsc << " steps " << first << "-" << last;
            }
        }
  // A run of 1e15 steps is counted at once; a clipper past 2^62 doubles to it without overflow.
  optim::OptimizerSpec spec;
  spec.type = "ZeroOneAdam";
  spec.var_freeze_step = 1000;
  spec.local_step_scaler = 1;
  spec.local_step_clipper = std::numeric_limits<int64_t>::max();
  double sum = 0.0;
  for (const auto& [u, w] : zero_one_mix(spec, 1, 1'000'000'000'000'000)) sum += w;
  EXPECT_DOUBLE_EQ(sum, 1.0);
  // What the optimizer refuses, the plan does, by the key.
  spec.local_step_clipper = 0;
  try {
    zero_one_mix(spec, 1, 10);
    ADD_FAILURE() << "local_step_clipper 0 taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.params.local_step_clipper"), std::string::npos) << e.what();
  }
}

// 1-bit Adam's and 1-bit LAMB's steps: max(freeze_step, 2) - 1 warm-up updates (AdamW's, LAMB's),
// then compressed ones; the other optimizers' steps are all alike (no mix).
TEST(CostModel, OneBitOptimizersStepsAreTheirWarmUpsAndCompressedOnes) {
  optim::OptimizerSpec spec;
  spec.type = "OneBitLamb";
  spec.freeze_step = 5;
  using Mix = std::vector<std::pair<UpdateKind, double>>;
  EXPECT_EQ(update_mix(spec, 1, 10), (Mix{{UpdateKind::kLamb, 0.4}, {UpdateKind::kOneBitLambCompressed, 0.6}}));
  EXPECT_EQ(update_mix(spec, 3, 4), (Mix{{UpdateKind::kLamb, 1.0}}));
  EXPECT_EQ(update_mix(spec, 5, 8), (Mix{{UpdateKind::kOneBitLambCompressed, 1.0}}));
  spec.type = "onebitadam";
  spec.freeze_step = 0;  // as 2: one warm-up update
  EXPECT_EQ(update_mix(spec, 1, 4), (Mix{{UpdateKind::kAdamW, 0.25}, {UpdateKind::kOneBitAdamCompressed, 0.75}}));
  spec.freeze_step = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(update_mix(spec, 1, 4), (Mix{{UpdateKind::kAdamW, 1.0}}));
  spec.type = "AdamW";
  EXPECT_TRUE(update_mix(spec, 1, 4).empty());
  spec.type = "ZeroOneAdam";
  EXPECT_EQ(update_mix(spec, 1, 4), zero_one_mix(spec, 1, 4));
}

// 0/1 Adam's steps at their lines: the compressed-gradient step, the local step and the sync at
// their own ("zerooneadam ..."; without them AdamW's), and over two ranks each but the local step
// exchanges, all three keep the gradients local and scale them back (8 bytes an element at the
// memory rate).
TEST(CostModel, ZeroOneAdamsStepsAtTheirLines) {
  Calibration cal = synthetic();  // AdamW 1e-9 s an element
  cal.fits["memory"] = {0.0, 1e-11};
  cal.fits["zerooneadam compressed"] = {0.0, 3e-9};
  cal.fits["zerooneadam local"] = {0.0, 2e-9};
  cal.fits["zerooneadam sync"] = {0.0, 5e-9};
  StepShape s = tiny(models::Arch::kGpt2);
  auto costs = [&](UpdateKind u) {
    s.update = u;
    return zero_step_costs(s, cal);
  };
  EXPECT_DOUBLE_EQ(costs(UpdateKind::kZeroOneCompressed).optimizer_per_element, 3e-9);
  EXPECT_DOUBLE_EQ(costs(UpdateKind::kZeroOneLocal).optimizer_per_element, 2e-9);
  EXPECT_DOUBLE_EQ(costs(UpdateKind::kZeroOneSync).optimizer_per_element, 5e-9);
  EXPECT_FALSE(costs(UpdateKind::kZeroOneSync).local_gradients);  // one rank: nothing to keep local
  cal.fits.erase("zerooneadam sync");
  EXPECT_DOUBLE_EQ(costs(UpdateKind::kZeroOneSync).optimizer_per_element, 1e-9);
  s.world = 2;
  cal.world = 2;
  cal.fits["all_reduce"] = {1e-5, 1e-9};
  cal.fits["onebit_all_reduce"] = {2e-5, 3e-9};
  for (UpdateKind u : {UpdateKind::kZeroOneCompressed, UpdateKind::kZeroOneLocal, UpdateKind::kZeroOneSync}) {
    const ZeroStepCosts c = costs(u);
    EXPECT_TRUE(c.local_gradients);
    EXPECT_EQ(static_cast<bool>(c.onebit_exchange), u != UpdateKind::kZeroOneLocal);
  }
  EXPECT_DOUBLE_EQ(costs(UpdateKind::kZeroOneLocal).optimizer_per_element, 2e-9 + 8e-11);
  EXPECT_DOUBLE_EQ(costs(UpdateKind::kZeroOneCompressed).onebit_exchange(4e6), 2e-5 + 1.2e-2);
  EXPECT_FALSE(costs(UpdateKind::kAdamW).local_gradients);  // the variance step all-reduces
}

TEST(CostModel, TheOptimizersSwapPipelinesItsSubGroupsThroughTheDisk) {
  Calibration cal = synthetic();  // AdamW 1e-9 s an element
  StepShape s = tiny(models::Arch::kGpt2);
  s.optimizer_nvme = true;
  s.sub_group_size = 1000;
  EXPECT_THROW(zero_step_costs(s, cal), Error);  // no disk rates
  cal.disk_read_gbs = 2.0;
  cal.disk_write_gbs = 1.0;
  cal.disk_mixed_gbs = 1.6;
  const ZeroStepCosts c = zero_step_costs(s, cal);
  const double u = c.optimizer_per_element;
  EXPECT_NEAR(u, 1e-9, 1e-18);
  // 4000 elements: 4 sub-groups of 1000; the disk's 16 000 bytes a step (10 us) outlast the update (1 us).
  const double g = 1000;
  EXPECT_NEAR(c.optimizer_seconds(4000), 8 * g / 2e9 + u * g + 8 * g / 1e9 + 3 * 16 * g / 1.6e9, 1e-15);
  // One sub-group: read, update, write in a row.
  EXPECT_NEAR(c.optimizer_seconds(500), 8 * 500 / 2e9 + u * 500 + 8 * 500 / 1e9, 1e-15);
  // 2500 elements: 3 sub-groups of 833.3.
  const double h = 2500.0 / 3;
  EXPECT_NEAR(c.optimizer_seconds(2500), 8 * h / 2e9 + u * h + 8 * h / 1e9 + 2 * 16 * h / 1.6e9, 1e-15);
  // The disk slows compute (calibrate --io's k): an update of 2e-8 s an element outlasts the
  // transfer, and runs at 1 / (1 + k·mixed) of its speed while the disk's 16·g bytes stream:
  // k = 1 s/GB, 1.6 GB/s mixed: 10 us of transfer at 1/2.6 speed, so 3.846 us of the 20 us
  // update done then, 16.154 us after: 26.154 us a sub-group where it took 20.
  cal.fits["adamw"].per_unit = 2e-8;
  const double slow_u = zero_step_costs(s, cal).optimizer_per_element;
  EXPECT_NEAR(zero_step_costs(s, cal).optimizer_seconds(4000), 8 * g / 2e9 + slow_u * g + 8 * g / 1e9 + 3 * slow_u * g, 1e-15);
  cal.disk_interference_s_per_byte = 1e-9;
  const double beside = 10e-6 + (slow_u * g - 10e-6 / 2.6);
  EXPECT_NEAR(beside, 26.154e-6, 1e-9);
  EXPECT_NEAR(zero_step_costs(s, cal).optimizer_seconds(4000), 8 * g / 2e9 + slow_u * g + 8 * g / 1e9 + 3 * beside, 1e-15);
  // A disk that outlasts the update still sets the pace: 3 x 10 us, as without the interference.
  cal.fits["adamw"].per_unit = 1e-9;
  EXPECT_NEAR(zero_step_costs(s, cal).optimizer_seconds(4000), 8 * g / 2e9 + u * g + 8 * g / 1e9 + 3 * 16 * g / 1.6e9, 1e-15);
  s.optimizer_nvme = false;
  EXPECT_NEAR(zero_step_costs(s, cal).optimizer_seconds(4000), 4000 * u, 1e-15);
}

}  // namespace
}  // namespace mt::planner
