// The memory estimator's pure parts: the units match the model's own, ZeRO stage 0-3 formulas
// against hand-computed numbers on a tiny partition, DeepSpeed's formulas, and the largest
// micro-batch search on its boundary. The stage-0 estimate against the allocator's measured peaks of
// a real engine step lives in cli/estimate_test.cpp (the engine is above this layer).
#include "planner/memory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/mpi_backend.h"
#include "models/transformer.h"
#include "kernels/cpu/gemm.h"
#include "nn/lm_head.h"

namespace mt::planner {
namespace {

models::ModelConfig tiny_model(const std::string& arch) {
  models::ModelConfig m;
  if (arch == "gpt2") {  // configs/models/tiny-gpt2.json
    m.arch = models::Arch::kGpt2;
    m.vocab_size = 97; m.hidden = 48; m.n_layer = 2; m.n_head = 4; m.n_kv_head = 4;
    m.intermediate = 192; m.max_positions = 32;
  } else {  // configs/models/tiny-llama.json
    m.arch = models::Arch::kLlama;
    m.vocab_size = 101; m.hidden = 64; m.n_layer = 2; m.n_head = 4; m.n_kv_head = 2;
    m.intermediate = 176; m.max_positions = 64; m.tie_embeddings = false;
  }
  return m;
}

MemoryInput tiny_input(const std::string& arch, DType dtype, int world) {
  MemoryInput in;
  in.model = tiny_model(arch);
  in.micro_batch = 3;
  in.seq_length = 16;
  in.compute_dtype = dtype;
  in.optimizer_states = 2;
  in.world = world;
  return in;
}

TEST(ModelUnits, MatchTheModelsOwnCount) {
  for (const char* arch : {"gpt2", "llama"}) {
    models::ModelConfig m = tiny_model(arch);
    std::vector<parallel::Unit> units = model_units(m);
    ASSERT_EQ(units.size(), static_cast<size_t>(m.n_layer) + 2);
    size_t total = 0;
    for (const parallel::Unit& u : units) {
      EXPECT_EQ(u.offset, total);
      total += u.numel;
    }
    EXPECT_EQ(total, static_cast<size_t>(m.num_params())) << arch;
    // The embeddings unit: wte (V, C) is a matrix, GPT-2's wpe is not.
    size_t VC = static_cast<size_t>(m.vocab_size) * m.hidden;
    EXPECT_EQ(units[0].matrix_numel, VC);
    // DeepSpeed's largest layer: the token table (V, C) or the first MLP projection (C, I) + bias.
    size_t CI = static_cast<size_t>(m.hidden) * m.intermediate;
    EXPECT_EQ(largest_module_params(m), std::max(VC, std::string(arch) == "gpt2" ? CI + m.intermediate : CI));
    // The runtime cuts the same units (a plan and a run cannot disagree).
    models::TransformerLM model(m, models::ModelOptions{});
    std::vector<parallel::Unit> run = model.zero_units();
    ASSERT_EQ(run.size(), units.size());
    for (size_t u = 0; u < units.size(); ++u) {
      EXPECT_EQ(run[u].name, units[u].name);
      EXPECT_EQ(run[u].offset, units[u].offset);
      EXPECT_EQ(run[u].numel, units[u].numel);
      EXPECT_EQ(run[u].matrix_numel, units[u].matrix_numel);
    }
  }
}

// A sequence classifier's head is score.weight (num_labels, C), whatever tie_word_embeddings says:
// the units are the runtime's, and a GPT-2 classifier's last pipeline stage holds no copy of the
// token table (the planner gave it one: V x C of phantom parameters, grads and optimizer states).
TEST(ModelUnits, AClassifiersHeadIsItsScoreWeight) {
  for (const char* arch : {"gpt2", "llama"}) {
    models::ModelConfig m = tiny_model(arch);
    m.num_labels = 3;
    const std::vector<parallel::Unit> units = model_units(m);
    models::TransformerLM model(m, models::ModelOptions{});
    const std::vector<parallel::Unit> run = model.zero_units();
    ASSERT_EQ(run.size(), units.size()) << arch;
    for (size_t u = 0; u < units.size(); ++u) {
      EXPECT_EQ(run[u].name, units[u].name);
      EXPECT_EQ(run[u].numel, units[u].numel) << arch << " " << units[u].name;
      EXPECT_EQ(run[u].matrix_numel, units[u].matrix_numel);
    }
    const size_t norm = std::string(arch) == "gpt2" ? 2u * m.hidden : static_cast<size_t>(m.hidden);
    EXPECT_EQ(units.back().numel, norm + 3u * m.hidden) << arch;
    MemoryInput in = tiny_input(arch, DType::kF32, 1);
    in.model = m;
    in.chunks = {{1, 2}};
    in.first_stage = false;
    in.pp = 2;
    in.pp_rank = 1;
    const std::vector<parallel::Unit> last = stage_units(in);
    ASSERT_EQ(last.size(), 2u) << arch;  // the block and the tail
    EXPECT_EQ(last[0].name, "h.1");
    EXPECT_EQ(last[1].numel, units.back().numel);
  }
}

// Three units, world 4, hand-computed (not through the partition code):
//   A n=10 m=8: s=3, N s=12     B n=7 m=6: s=2, N s=8     C n=5 m=0: s=2, N s=8.   S=7, P=22.
std::vector<parallel::Unit> tiny_units() {
  return {{"A", 0, 10, 8}, {"B", 10, 7, 6}, {"C", 17, 5, 0}};
}

TEST(ModelStateMemory, Stage0IsTheParamStore) {
  ZeroKnobs z;
  MemoryBreakdown f = model_state_memory(tiny_units(), 0, 4, 4, 2, z);
  EXPECT_EQ(f[MemCategory::kParams], 88u);       // 4 P
  EXPECT_EQ(f[MemCategory::kGrads], 88u);        // 4 P
  EXPECT_EQ(f[MemCategory::kOptimizer], 176u);   // 2 * 4 P
  EXPECT_EQ(f[MemCategory::kComm], 0u);
  MemoryBreakdown b = model_state_memory(tiny_units(), 0, 4, 2, 2, z);
  EXPECT_EQ(b[MemCategory::kParams], 44u);       // 2 P compute copy
  EXPECT_EQ(b[MemCategory::kOptimizer], 264u);   // 4 P master + 8 P states
  // communication_data_type bf16: every bucket's 2-byte staging, 2 P (none on one rank).
  z.comm_dtype = DType::kBF16;
  EXPECT_EQ(model_state_memory(tiny_units(), 0, 4, 4, 2, z)[MemCategory::kComm], 44u);
  EXPECT_EQ(model_state_memory(tiny_units(), 0, 1, 4, 2, z)[MemCategory::kComm], 0u);
}

// The units as the runtime uses them: A the embeddings (and the tied head), B a block, C the tail.
// Views: f32 4 N s (A 48, B 32, C 32); bf16 2 m + 4 (n - m), each part at least one element
// (A 16 + 8, B 12 + 4, C 2 + 20). Grad slabs 4 N s; reduce-scatter receive 4 s (A 12, B 8, C 8),
// and the ring's scratch block beside it on 4 ranks (comm::ring_reduce_scatter_scratch_bytes).
TEST(ModelStateMemory, TheRingsScratchIsABlockFromThreeRanksOn) {
  EXPECT_EQ(comm::ring_reduce_scatter_scratch_bytes(2, 12, false), 0u);
  EXPECT_EQ(comm::ring_reduce_scatter_scratch_bytes(3, 12, false), 12u);
  EXPECT_EQ(comm::ring_reduce_scatter_scratch_bytes(8, 12, false), 12u);
  EXPECT_EQ(comm::ring_reduce_scatter_scratch_bytes(2, 12, true), 12u);
  EXPECT_EQ(comm::ring_reduce_scatter_scratch_bytes(4, 12, true), 24u);
  // Stage 1, f32, one reduction at a time: A's receive and scratch on 4 ranks, the receive alone on 2.
  ZeroKnobs z;
  EXPECT_EQ(model_state_memory(tiny_units(), 1, 4, 4, 2, z)[MemCategory::kComm], 12u + 12u);
  // world 2: A n=10 s=5: a receive of 20, no scratch.
  EXPECT_EQ(model_state_memory(tiny_units(), 1, 2, 4, 2, z)[MemCategory::kComm], 20u);
}

TEST(ModelStateMemory, Stage1KeepsEverySlab) {
  ZeroKnobs z;
  MemoryBreakdown b = model_state_memory(tiny_units(), 1, 4, 2, 2, z);
  EXPECT_EQ(b[MemCategory::kParams], 24u + 16u + 22u);
  EXPECT_EQ(b[MemCategory::kOptimizer], 28u + 56u);         // master 4 S + 2 states 4 S
  EXPECT_EQ(b[MemCategory::kGrads], 28u + 48u + 32u + 32u);  // shard + every grad slab 4 N s
  // refresh_params() keeps two f32 gathers in flight: the widest neighbours, A + B.
  EXPECT_EQ(b[MemCategory::kComm], 48u + 32u);
  // f32: views 4 N s = 112 and the master shard 4 S = 28 under params; no master under optimizer;
  // comm: one receive buffer and its ring's scratch at a time, A's the largest.
  MemoryBreakdown f = model_state_memory(tiny_units(), 1, 4, 4, 2, z);
  EXPECT_EQ(f[MemCategory::kParams], 112u + 28u);
  EXPECT_EQ(f[MemCategory::kOptimizer], 56u);
  EXPECT_EQ(f[MemCategory::kComm], 12u + 12u);
}

// Units that are mostly GEMM weights gather in the compute dtype (parallel::gathers_in_compute_dtype)
// straight into a view that is an image of the padded unit, 2 N s bytes, and stage only their other
// elements' f32 runs, 4 N (n - m). On 4 ranks A (n=40, m=36, s=10): view 80 + 16, staging 64; B
// (n=40, m=38): view 80 + 8, staging 32; C (n=8, m=0) as before: view 2 + 32, f32 staging 4 x 8.
// Stage 1 keeps every view; its refresh keeps two gathers in flight, A + B = 96, above a reduction's
// receive and scratch (40 + 40).
TEST(ModelStateMemory, MostlyGemmUnitsGatherIntoAnImageOfTheUnit) {
  const std::vector<parallel::Unit> units = {{"A", 0, 40, 36}, {"B", 40, 40, 38}, {"C", 80, 8, 0}};
  ZeroKnobs z;
  MemoryBreakdown b = model_state_memory(units, 1, 4, 2, 2, z);
  EXPECT_EQ(b[MemCategory::kParams], 96u + 88u + 34u);
  EXPECT_EQ(b[MemCategory::kComm], 64u + 32u);
  EXPECT_EQ(model_state_memory(units, 1, 4, 4, 2, z)[MemCategory::kComm], 40u + 40u);  // f32: a receive and its scratch
}

TEST(ModelStateMemory, Stage2KeepsOneGradSlabOrTwoWithOverlap) {
  ZeroKnobs z;
  MemoryBreakdown b = model_state_memory(tiny_units(), 2, 4, 2, 2, z);
  EXPECT_EQ(b[MemCategory::kParams], 62u);
  // Backward order: head (A), C, B, A. A's slab gathers the head's and the table's gradients and
  // is reduced once at the end (stop 74; it was reduced after each use): it is held beside C's and
  // B's, 48 + 32.
  EXPECT_EQ(b[MemCategory::kGrads], 28u + 80u);
  EXPECT_EQ(b[MemCategory::kComm], 80u);  // the refresh's two gathers in flight, A + B
  // overlap_comm: a reduction still in flight when the next unit's slab is made: C's beside B's,
  // with A's held, 48 + 32 + 32.
  z.overlap_comm = true;
  b = model_state_memory(tiny_units(), 2, 4, 2, 2, z);
  EXPECT_EQ(b[MemCategory::kGrads], 28u + 112u);
  EXPECT_EQ(model_state_memory(tiny_units(), 2, 4, 4, 2, z)[MemCategory::kComm], (12u + 12u) + (8u + 8u));
  // communication_data_type bf16 (f32 run): a reduction holds its slab rounded to 2 N s, a 2 s
  // receive buffer and as much scratch (A 24 + 6 + 6, C 16 + 4 + 4): the two in flight, A + C.
  z.comm_dtype = DType::kBF16;
  EXPECT_EQ(model_state_memory(tiny_units(), 2, 4, 4, 2, z)[MemCategory::kComm], 36u + 24u);
  z.comm_dtype = DType::kF32;
  // SGD without momentum: no optimizer state, the master shard only.
  EXPECT_EQ(model_state_memory(tiny_units(), 2, 4, 2, 0, z)[MemCategory::kOptimizer], 28u);
}

TEST(ModelStateMemory, Stage3WindowFollowsTheKnobs) {
  ZeroKnobs z;
  z.param_persistence_threshold = 5;  // C (n=5) persistent: 32 bytes in f32
  z.max_live_parameters = 1000;
  z.prefetch_bucket_size = 1000;      // A + B live together (forward), B + A (backward)
  MemoryBreakdown f = model_state_memory(tiny_units(), 3, 4, 4, 2, z);
  EXPECT_EQ(f[MemCategory::kParams], 28u + 32u + 48u + 32u);
  EXPECT_EQ(f[MemCategory::kGrads], 28u + 80u);  // A's slab held through the backward, beside one other
  EXPECT_EQ(f[MemCategory::kOptimizer], 56u);
  z.max_live_parameters = 16;  // C's 5 are live too: A (10) + B (7) do not fit: one at a time
  EXPECT_EQ(model_state_memory(tiny_units(), 3, 4, 4, 2, z)[MemCategory::kParams], 28u + 32u + 48u);
  z.max_live_parameters = 1000;
  z.prefetch_bucket_size = 6;  // neither B (7) nor A (10) can be prefetched
  EXPECT_EQ(model_state_memory(tiny_units(), 3, 4, 4, 2, z)[MemCategory::kParams], 28u + 32u + 48u);
  z.param_persistence_threshold = 0;  // nothing persistent; C (5) prefetched behind B: 32 + 32
  EXPECT_EQ(model_state_memory(tiny_units(), 3, 4, 4, 2, z)[MemCategory::kParams], 28u + 64u);
  // bf16: a prefetch lands in f32 staging (comm; these units are not gathers_in_compute_dtype's); the
  // view is built at use, so one view at a time
  // beside persistent C (22): A's 24. Comm: B's staging (32) behind a B receive and its scratch
  // (8 + 8), then A's (48) behind B's receive and scratch: 64.
  z.param_persistence_threshold = 5;
  z.prefetch_bucket_size = 1000;
  MemoryBreakdown b = model_state_memory(tiny_units(), 3, 4, 2, 2, z);
  EXPECT_EQ(b[MemCategory::kParams], 22u + 24u);
  EXPECT_EQ(b[MemCategory::kComm], 48u + 8u + 8u);
  EXPECT_EQ(b[MemCategory::kOptimizer], 84u);
}

TEST(ModelStateMemory, SetupMakesTheShardsWithoutTheWholeStore) {
  // P = 22 over 4 ranks: pieces 3 + 2 + 2 (S = 7), padded views 12 + 8 + 8, stage 2, f32, AdamW.
  ZeroKnobs z;
  MemoryBreakdown setup;
  model_state_memory(tiny_units(), 2, 4, 4, 2, z, true, &setup);  // shards from the initial values
  EXPECT_EQ(setup[MemCategory::kParams], 28u + 112u);  // master 4 S + views
  EXPECT_EQ(setup[MemCategory::kGrads], 28u);
  EXPECT_EQ(setup[MemCategory::kOptimizer], 56u);
}

TEST(EstimateStage, DeepSpeedFormulas) {
  MemoryInput in = tiny_input("gpt2", DType::kBF16, 4);
  double P = static_cast<double>(in.model.num_params());
  // Mixed-precision Adam: K = 12.
  EXPECT_EQ(estimate_stage(in, 0).ds_paper_bytes, static_cast<size_t>(16 * P));
  EXPECT_EQ(estimate_stage(in, 1).ds_paper_bytes, static_cast<size_t>(4 * P + 12 * P / 4));
  EXPECT_EQ(estimate_stage(in, 2).ds_paper_bytes, static_cast<size_t>(2 * P + 14 * P / 4));
  EXPECT_EQ(estimate_stage(in, 3).ds_paper_bytes, static_cast<size_t>(16 * P / 4));
  EXPECT_EQ(estimate_stage(in, 0).ds_estimator_bytes, 0u);
  EXPECT_EQ(estimate_stage(in, 2).ds_estimator_bytes, static_cast<size_t>(4 * P) + static_cast<size_t>(16 * P) / 4);
  // Stage 0 does not depend on the world; stage 3 model states shrink with it.
  MemoryInput one = in;
  one.world = 1;
  EXPECT_EQ(estimate_stage(one, 0).ours.total(), estimate_stage(in, 0).ours.total());
  EXPECT_LT(estimate_stage(in, 3).ours[MemCategory::kOptimizer], estimate_stage(one, 3).ours[MemCategory::kOptimizer]);
  in.world = 0;
  EXPECT_THROW(estimate_stage(in, 0), Error);
}

TEST(LargestMicroBatch, BoundaryAndMonotone) {
  MemoryInput in = tiny_input("llama", DType::kBF16, 2);
  for (int stage = 0; stage <= 3; ++stage) {
    in.micro_batch = 5;
    size_t at5 = estimate_stage(in, stage).ours.total();
    EXPECT_EQ(largest_micro_batch(in, stage, at5), 5) << stage;       // exactly the total of B=5
    EXPECT_EQ(largest_micro_batch(in, stage, at5 - 1), 4) << stage;   // one byte less
    in.micro_batch = 1;
    EXPECT_EQ(largest_micro_batch(in, stage, estimate_stage(in, stage).ours.total() - 1), 0);
    int prev = 0;
    for (size_t budget = 1 << 20; budget <= (size_t{64} << 20); budget += 3 << 20) {
      int b = largest_micro_batch(in, stage, budget, 4096);
      EXPECT_GE(b, prev);
      prev = b;
    }
  }
  EXPECT_EQ(largest_micro_batch(in, 0, size_t{1} << 40, 7), 7);  // capped
}

}  // namespace
// libnbc's in-place ring all-reduce receives ceil(count / p) elements at a time into its buffer's
// start: that much, in whole pages, is what it touches; nothing on one rank.
TEST(LibnbcAllreduce, TouchesOneSegmentInWholePages) {
  EXPECT_EQ(libnbc_allreduce_touched(1000, 4, 1), 0u);
  EXPECT_EQ(libnbc_allreduce_touched(1000, 4, 2), 4096u);               // 2000 bytes
  EXPECT_EQ(libnbc_allreduce_touched(3 * 1024 * 1024, 4, 3), 4194304u); // 1 Mi elements of 4 bytes
  EXPECT_EQ(libnbc_allreduce_touched(3 * 1024 * 1024 + 1, 2, 3), 2101248u);  // 1 Mi + 1 of 2 bytes: 513 pages
}

// f16 where the devices have no f16 matmul: the LM head holds its weight (V x C) and a tile's rows
// (R x C) in f32 in the workspace, not the f16 dlogits copy (R x V), and gemm's widening regions
// hold the blocks' copies. The answer is the plan's (MemoryInput::f16_native, the calibration's or
// a described cluster's), not the planning host's, unless none is given.
TEST(StepMemory, F16HeadWidenedWhereThePlansDevicesHaveNoF16Matmul) {
  MemoryInput in = tiny_input("gpt2", DType::kF16, 1);
  const size_t V = 97, C = 48, R = 3 * 16;  // one tile
  in.f16_native = 1;
  const MemoryBreakdown native = step_memory(in);
  EXPECT_EQ(gemm_widen_bytes(in), 0u);
  in.f16_native = 0;
  const MemoryBreakdown wide = step_memory(in);
  EXPECT_GT(gemm_widen_bytes(in), 0u);
  const auto ws = static_cast<size_t>(MemCategory::kWorkspace);
  const int64_t added = static_cast<int64_t>(wide.bytes[ws]) - static_cast<int64_t>(native.bytes[ws]);
  EXPECT_EQ(added, static_cast<int64_t>(V * C * 4 + R * C * 4) - static_cast<int64_t>(R * V * 2));  // made, and not
  in.f16_native = -1;  // this host's oneDNN
  EXPECT_EQ(step_memory(in).bytes[ws], nn::lm_head_widened(DType::kF16) ? wide.bytes[ws] : native.bytes[ws]);
}

}  // namespace mt::planner

namespace mt::planner {
namespace {

// bf16 where the plan's devices have no bf16 matmul (an AVX2 CPU: Calibration::bf16_native false):
// every GEMM widens its operands, the LM head's too (f16 runs keep the head's own f32 copies
// instead). The answer is the plan's, not this host's: the calibration took bf16 as native on any
// CPU and the estimate asked this host's oneDNN (stop 76's note; stop 77).
TEST(StepMemory, Bf16WidenedWhereThePlansDevicesHaveNoBf16Matmul) {
  MemoryInput in = tiny_input("gpt2", DType::kBF16, 1);
  in.model.vocab_size = 4096;  // the head's weight (V x C) the largest operand of the step
  const size_t V = 4096, C = static_cast<size_t>(in.model.hidden), R = 3 * 16;
  in.bf16_native = 1;
  EXPECT_EQ(gemm_widen_bytes(in), 0u);
  const MemoryBreakdown native = step_memory(in);
  in.bf16_native = 0;
  auto pages = [](size_t bytes) { return (bytes + 4095) / 4096 * 4096; };
  // A: the largest row operand, at most the head's dlogits (R x V) of its dW = dlogits^T x; B: the
  // head's weight (V x C), the largest of the B operands.
  const size_t widened = gemm_widen_bytes(in);
  EXPECT_GE(widened, pages(V * C * 4));
  EXPECT_LE(widened, pages(V * C * 4) + pages(R * V * 4));
  EXPECT_EQ(step_memory(in).total(), native.total());  // outside the allocator: the stage's row
  EXPECT_EQ(estimate_stage(in, 0).gemm_widen, widened);
  // f16 without an f16 matmul skips the head: its blocks' operands alone, far below the head's.
  in.compute_dtype = DType::kF16;
  in.f16_native = 0;
  EXPECT_LT(gemm_widen_bytes(in), pages(V * C * 4));
  // The host decides where the plan says nothing.
  in.compute_dtype = DType::kBF16;
  in.bf16_native = -1;
  EXPECT_EQ(gemm_widen_bytes(in), kernels::gemm_native(DType::kBF16) ? 0u : widened);
}

}  // namespace
}  // namespace mt::planner
