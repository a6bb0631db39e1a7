// Memory estimator: the bytes one rank allocates for a training step, by the allocator's categories
// (tensor/allocator.h), for ZeRO stages 0-3 — what `meshtrain estimate` prints and what the runtime's
// accounted peaks are checked against (DESIGN decision 2).
//
// Model states (P parameters cut into ZeRO units u of n_u elements, m_u of them GEMM matrices,
// s_u = ceil(n_u / N), S = sum s_u; e = bytes of the compute dtype; k = f32 optimizer states):
//   stage 0: params 4P (f32) | e P (low precision, + master 4P under optimizer); grads 4P;
//            optimizer 4kP.                                      (nn/param_store.h, optim/*.h)
//   stage>=1: master shard 4S (optimizer when low precision, else params); optimizer 4kS; grad
//            shard 4S. Views and gradient slabs are replayed allocation by allocation as
//            parallel::ZeroRuntime makes them (memory.cpp, ZeroReplay), hook by hook over a training
//            micro-batch and an optimizer step: a unit's view is 4 N s_u (f32; the padded range) or
//            e m_u + 4 (n_u - m_u) (low precision, from a 4 N s_u f32 staging buffer under comm
//            while its gather is in flight), or, where parallel::gathers_in_compute_dtype,
//            e N s_u + 4 (n_u - m_u), allocated at the gather's start, with 4 N (n_u - m_u) of f32
//            runs under comm while it is in flight; its grad slab
//            4 N s_u (grads); a reduce-scatter receives 4 s_u (comm), and on 3 or more ranks its
//            ring holds a scratch block of 4 s_u (comm) until done. Nonblocking work is taken to
//            finish only when waited for (the worst case).
//     stage 1: every view and grad slab persistent; low precision refresh_params() keeps two
//            gathers in flight (comm = the widest adjacent pair of stagings).
//     stage 2: views persistent; a grad slab lives from its unit's backward to the end of its
//            reduction: one at a time, two with overlap_comm.
//     stage 3: views of units with n_u <= stage3_param_persistence_threshold persistent; the others
//            gathered at use and freed after, and the NEXT unit in the pass's direction (one unit,
//            never more) prefetched when n <= stage3_prefetch_bucket_size and the live elements
//            (persistent ones included) + n <= stage3_max_live_parameters. Live window: two
//            adjacent units at most. Grads as stage 2.
//   Setup (StageEstimate::setup): the runtime's shards, persistent views and optimizer state,
//   made from the initial values (the seed's, or model.init_from's weights read a parameter at a
//   time): the ParamStore's whole-model buffers never exist.
// Activations and workspace: what models::TransformerLM::prepare(B, T) allocates (sizes from the
// same BlockActs / BlockScratch layouts) plus what nn::Workspace grows to in one step (GEMM
// operands in the compute dtype, the LM head's logit tiles). They do not depend on the stage.
//
// DeepSpeed's figures beside ours (model states only, per rank):
//   ZeRO paper (Rajbhandari et al. 2020, sec. 5), weights w and grads g bytes in the compute dtype,
//   K = 4k (+ 4 for the f32 master copy in mixed precision; K = 12 for mixed-precision Adam):
//     stage 0 (w+g+K)P, stage 1 (w+g)P + KP/N, stage 2 wP + (g+K)P/N, stage 3 (w+g+K)P/N.
//   DeepSpeed's estimators (mixed-precision Adam, no offload, whatever our dtype):
//     estimate_zero2_model_states_mem_needs: 4P + 16P/N (stages 1 and 2);
//     estimate_zero3_model_states_mem_needs: 4 L + 18P/N, L = the largest module's own parameters.
// Ours differs: gradients are accumulated in f32 (DeepSpeed's bf16 optimizer does that too), the
// model view keeps f32 copies of non-matrix parameters, and fp32 runs keep no second copy.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "models/block.h"
#include "models/config.h"
#include "optim/optimizer.h"
#include "parallel/pp/partition.h"
#include "parallel/pp/schedule.h"
#include "parallel/zero/partition.h"
#include "tensor/allocator.h"
#include "tensor/dtype.h"

namespace mt::planner {

// DeepSpeed's zero_optimization stage-3 knobs (elements), with DeepSpeed's defaults.
struct ZeroKnobs {
  int64_t param_persistence_threshold = 100000;   // stage3_param_persistence_threshold
  int64_t max_live_parameters = 1000000000;       // stage3_max_live_parameters
  int64_t prefetch_bucket_size = 50000000;        // stage3_prefetch_bucket_size
  // overlap_comm: a gradient reduction is left in flight while the next unit's backward runs, so
  // its receive buffer and (stages 2-3) gradient slab may still be live when the next are made.
  bool overlap_comm = false;
  // communication_data_type: bf16/f16 reductions stage the gradients in 2 bytes (stage 0: every
  // bucket until the step's reduction ends; stages 1-3: the unit's slab and its receive buffer).
  DType comm_dtype = DType::kF32;
  // offload_optimizer device "nvme" (stages 1-3): the optimizer state is swapped in sub-groups of
  // sub_group_size elements, swap_buffers of them resident (optim/swapped_adamw.h).
  bool optimizer_nvme = false;
  int64_t sub_group_size = 1000000000;
  int swap_buffers = 4;
  // offload_param device "nvme" (stage 3, with optimizer_nvme): the f32 master and gradient shards
  // on disk, one aligned record per unit piece (parallel/zero/zero_runtime.h); the model built
  // without its flat buffers; each gather reads its piece into a comm buffer, each reduction sums
  // into a comm record written behind (two in flight); the optimizer's slots hold 4 states.
  bool param_nvme = false;
  // More than one micro-batch a step (gradient_accumulation_steps > 1): with param_nvme and f32
  // reductions, a later micro-batch reads the piece's record back beside the one it received into.
  bool accumulation = false;
  // reduce_bucket_size (stage 0, elements): the data-parallel all-reduce's buckets
  // (parallel::grad_bucket_ranges).
  int64_t reduce_bucket_size = 500000000;
  // Stage 0 with a 1-bit optimizer over more than one rank (parallel/grad_sync's OneBitSync): its
  // compressed exchange's worker and server error buffers, f32 optimizer bytes made with the
  // gradient sync, before the optimizer's states (onebit_error_bytes; estimate_stage fills them
  // from MemoryInput::onebit).
  size_t onebit_worker_errors = 0, onebit_server_errors = 0;
  // Stage 0: workspace the optimizer keeps from its construction (1-bit LAMB's momentum copy).
  size_t optimizer_workspace = 0;
};

// The optimizer swap of a span of `span` elements with `states` f32 states (optim/swapped_adamw.h):
// the resident slot buffers (accounted optimizer bytes) and the bytes its swap files hold.
struct OptimizerSwap {
  size_t resident = 0;      // slot_buffers x slot_bytes
  size_t slot_bytes = 0, slot_buffers = 0;
  uint64_t disk = 0;
  size_t sub_groups = 0;
};
OptimizerSwap optimizer_swap(size_t span, int states, int64_t sub_group_size, int buffers);
// The same with offload_param nvme: the span is the unit pieces (pieces[u] elements each, records
// at 4 KiB-aligned offsets, cut at sub_group_size), the slots hold master, gradients and moments;
// disk: the moments' files and the master and gradient files.
OptimizerSwap param_swap(const std::vector<size_t>& pieces, int64_t sub_group_size, int buffers);

struct MemoryInput {
  models::ModelConfig model;
  int micro_batch = 1;    // B (train_micro_batch_size_per_gpu)
  int seq_length = 1;     // T
  DType compute_dtype = DType::kF32;
  bool recompute = false;  // activation_checkpointing: one block's saved activations
  int optimizer_states = 2;  // k: f32 state buffers per parameter
  int world = 1;             // N: data-parallel ranks
  ZeroKnobs zero;
  // Tensor parallelism: this rank's shard of every layer (local widths, its rows of the padded
  // vocabulary); sequence parallelism: its N/tp rows of the residual stream, plus the gathered rows.
  int tp = 1;
  bool sequence_parallel = false;
  int vocab_divisible = 128;
  // DeepSpeed-Ulysses (parallel.sp): the usp ranks of a group share each micro-batch, seq_length /
  // usp tokens a rank outside attention, all seq_length for heads / usp inside it (models::BlockDims
  // usp), between all-to-alls through two comm buffers (parallel::UlyssesComm). `world` then counts
  // every rank the model states are sharded and the gradients reduced over: dp x usp.
  int usp = 1;
  // Pipeline parallelism: this rank's stage, as models::TransformerLM builds it — the layer ranges
  // of its chunks (empty: every layer), whether it holds the embedding and the head (a tied token
  // table is held on both), and the activation slots its schedule keeps (micro-batches in flight).
  // ZeRO's reduction then runs once after the schedule (stages 0-1 only).
  std::vector<std::pair<int, int>> chunks;
  bool first_stage = true, last_stage = true;
  int slots = 1;
  int grads_in_flight = 0;  // gradient buffers the rank holds at once (parallel::pp::max_grads_in_flight)
  int pp = 1, pp_rank = 0;
  bool pipeline() const { return !chunks.empty(); }
  // OpenMP threads of each rank (0: this process's): oneDNN sizes a GEMM's scratchpad by them.
  int threads = 0;
  // models::ModelOptions::documents on: each slot holds the micro-batch's positions and key starts.
  bool documents = false;
  // A 1-bit optimizer (OneBitAdam, ZeroOneAdam, OneBitLamb: stage 0, no tp or pp). Over world > 1
  // ranks its compressed exchange keeps worker and server errors (comm::OneBitPlan) over each
  // parameter tensor on its own (kPerTensor: fp32 1-bit and 0/1 Adam) or over the one flat buffer
  // (kFlat: under fp16, and 1-bit LAMB). 1-bit LAMB also keeps a copy of the momentum (workspace,
  // 4 bytes a parameter).
  enum class OneBit { kNone, kPerTensor, kFlat };
  OneBit onebit = OneBit::kNone;
  // The exchange's kept scratch (StageEstimate::exchange) is held while a gradient all-reduce's
  // temporaries are (StageEstimate::mpi): a 0/1 Adam run with a variance step after its first
  // exchange (planner::zero_one_variance_after_exchange). Otherwise the all-reduces come before
  // any exchange (1-bit Adam's and LAMB's warm-up) and the larger of the two counts.
  bool exchange_beside_all_reduce = false;
  bool optimizer_momentum_copy = false;
  // Whether the devices multiply f16 as it is: -1 as this host's oneDNN does (kernels::gemm_native);
  // 0 or 1 as the plan's calibration says (a described cluster's devices do). Where they do not,
  // an f16 run's GEMMs widen their operands and its LM head holds its weight in f32 (f16_widened).
  int f16_native = -1;
  // The same for bf16 (-1: this host's oneDNN; 0 or 1: the calibration's Calibration::bf16_native).
  // Where the devices do not, every GEMM of a bf16 run widens its operands, the head's too.
  int bf16_native = -1;
};

// Whether `in`'s f16 GEMMs are widened to f32 (nn::lm_head_widened where the host decides).
bool f16_widened(const MemoryInput& in);

// The 1-bit exchange's worker and server errors in bytes for `in`'s model over `world` ranks (0 for
// one rank or no 1-bit optimizer): comm::OneBitPlan over the model's parameter tensors, as
// parallel/grad_sync's OneBitSync builds it.
std::pair<size_t, size_t> onebit_error_bytes(const MemoryInput& in, int world);
// The scratch its exchange keeps (comm::compressed_all_reduce_scratch_bytes of that plan), in bytes.
size_t onebit_scratch_bytes(const MemoryInput& in, int world);

// One block the model makes or frees (a Buffer), in the order it does.
struct BlockEvent {
  MemCategory category = MemCategory::kWorkspace;
  size_t bytes = 0;
  bool release = false;
};

// Bytes per rank, each category at its own peak (the sum is an upper bound on the total peak).
struct MemoryBreakdown {
  std::array<size_t, kMemCategoryCount> bytes{};
  size_t& operator[](MemCategory c) { return bytes[static_cast<int>(c)]; }
  size_t operator[](MemCategory c) const { return bytes[static_cast<int>(c)]; }
  size_t total() const;
};

struct StageEstimate {
  int stage = 0;
  MemoryBreakdown ours;   // steady state: the peaks of training steps
  MemoryBreakdown setup;  // model-state categories while the engine is built (with init_from the
                          // ParamStore's full buffers beside the runtime's shards); stage 0: = ours
  size_t ds_paper_bytes = 0;      // ZeRO paper, model states
  size_t ds_estimator_bytes = 0;  // DeepSpeed's estimate_zero2/3 function; 0 for stage 0 (none)
  uint64_t disk_bytes = 0;        // offload to nvme: the rank's swap files
  size_t comm_low = 0;  // overlap_comm: the comm peak when every reduction finishes as early as it
                        // can (ours[kComm] is the larger of that and finishing only when waited for)
  size_t grads_low = 0;  // the same for the gradients (a unit's slab is freed when its reduction finishes)
  // Every block of the rank (model states through setup and two steps, the model's activations and
  // workspace) replayed through the allocator's rules (FootprintReplay): the allocator's peaks with
  // its kept blocks (held) and in the OS's units, whole pages (mapped). What the process holds
  // beyond `mapped` (its binary, libraries, threads, MPI's own buffers) is the calibration's
  // process constant (planner::Calibration::process_bytes).
  size_t held = 0, mapped = 0;
  // MPI's own temporary buffers at their largest (outside the allocator): libnbc's in-place ring
  // all-reduce of the stage-0 gradient buckets and of tensor parallelism's activations
  // (libnbc_allreduce_touched).
  size_t mpi = 0;
  // The 1-bit exchange's scratch, kept by the thread from its first exchange on (outside the
  // allocator: comm::compressed_all_reduce_scratch_bytes of the run's plan; onebit_scratch_bytes).
  size_t exchange = 0;
  bool exchange_beside_mpi = false;  // MemoryInput::exchange_beside_all_reduce
  // oneDNN's scratchpad region (kernels::gemm_scratch_held, outside the allocator): the largest need
  // of the rank's GEMMs (gemm_scratch_bytes).
  size_t gemm_scratch = 0;
  // f16 GEMMs where oneDNN has none (kernels::gemm_widen_bytes): the two f32 regions the operands
  // are widened into, each the largest copy of the rank's GEMMs (0 where the dtype is native).
  size_t gemm_widen = 0;
  // What the process holds beyond the allocator's mapped peak that the estimate predicts: MPI's
  // temporaries and the exchange's scratch (summed where they meet, else the larger), oneDNN's
  // scratchpad and the widened operands.
  size_t outside_allocator() const {
    const size_t comm = exchange_beside_mpi ? mpi + exchange : std::max(mpi, exchange);
    return comm + gemm_scratch + gemm_widen;
  }
};

// The largest oneDNN scratchpad among the GEMMs a training step of the rank makes, as nn::Linear,
// nn::LinearGroup and nn::lm_head_cross_entropy call kernels::gemm: each block's projections at
// this rank's widths (forward, the input's gradient, the weight's gradient) and the head's tiles.
size_t gemm_scratch_bytes(const MemoryInput& in);
size_t gemm_widen_bytes(const MemoryInput& in);

// The bytes libnbc's ring all-reduce (the algorithm comm::mpi_init selects) touches of the
// temporary buffer it mallocs for an in-place all-reduce of `count` elements of `elem_bytes` over
// p ranks: every round receives one segment, ceil(count / p) elements, at the buffer's start, in
// whole 4 KiB pages (measured: 0.96 of a 16 and a 41 MiB segment beyond stage 1's process on two
// ranks; the malloc'd chunk is not 2 MiB-aligned, so its huge pages do not round it up). 0 for
// p = 1.
size_t libnbc_allreduce_touched(size_t count, size_t elem_bytes, int p);

// f32 state buffers per parameter of spec's optimizer: Adam/AdamW/Lamb and 1-bit Adam 2, 0/1 Adam
// and 1-bit LAMB 3 (the momentum accumulator; the variance kept fresh), SGD 1 with momentum
// else 0 (optim/*.h state()).
int optimizer_state_count(const optim::OptimizerSpec& spec);

// The ZeRO units of cfg in forward order, as models::TransformerLM::zero_units() cuts them
// (embeddings, one per block, tail), counted from metadata-only modules: nothing is allocated.
// tp > 1: the units of one tensor-parallel rank's shard (every rank's are the same size).
std::vector<parallel::Unit> model_units(const models::ModelConfig& cfg, int tp = 1, int vocab_divisible = 128);
// The same dimensions TransformerLM::prepare computes (this rank's widths under tp).
// T: whole samples' tokens; under Ulysses (usp > 1) each rank's T / usp of them.
models::BlockDims block_dims(const models::ModelConfig& cfg, int B, int T, int tp = 1, bool sp = false, int usp = 1);
// The units of in's rank: its pipeline stage's part of the model (model_units without a pipeline).
std::vector<parallel::Unit> stage_units(const MemoryInput& in);
// The pipeline partition's input by parameter counts (whole tensors), as the engine cuts stages for
// parallel.partition "parameters" and "uniform": a block's, the embedding's (token table and
// positions) and the head's (final norm and the token table or untied head).
parallel::pp::PartitionInput pipeline_partition_input(const models::ModelConfig& cfg, int stages);
// Pipeline rank q's share of `in` (built without a pipeline) under `spec` with stage bounds
// `bounds` (S + 1 entries; chunk c of rank q is virtual stage c·pp + q): its layer ranges, whether it
// holds the embedding and the head, the activation slots its schedule keeps and the gradients it
// sends back.
MemoryInput pipeline_rank_input(MemoryInput in, const parallel::pp::ScheduleSpec& spec, const std::vector<int>& bounds, int q);
// Largest number of parameters one module holds itself (DeepSpeed's largest_layer_params).
size_t largest_module_params(const models::ModelConfig& cfg);

// Model states (params, grads, optimizer, comm) of one rank at `stage` over explicit units (the
// first is the embeddings, the last the tail, blocks between), the steady-state peaks of training;
// *setup (if given) gets the peaks while the engine is built. tied_head: the LM head is the token
// embedding (unit 0), else the tail's own matrix.
// pipeline: the reduction runs once after the schedule's backwards (stage <= 1).
// early_completion: a reduction in flight finishes at the first hook after its launch (else only
// when waited for).
// REQUIRES: 0 <= stage <= 3, world >= 1, compute_bytes 2 or 4 (4: fp32, no separate master),
// at least two units (one with a pipeline).
// step_blocks: the model's blocks, replayed after setup into *footprint (if given) with every
// model-state block.
MemoryBreakdown model_state_memory(const std::vector<parallel::Unit>& units, int stage, int world,
                                   size_t compute_bytes, int optimizer_states, const ZeroKnobs& zero,
                                   bool tied_head = true, MemoryBreakdown* setup = nullptr, bool pipeline = false,
                                   bool early_completion = false, const std::vector<BlockEvent>* step_blocks = nullptr,
                                   FootprintReplay* footprint = nullptr);
// The model's own blocks of one step for the micro-batch shape of in, in the order they are made:
// TransformerLM::prepare's activations and scratch, nn::Workspace's slots (the GEMM operand slot's
// growths free the smaller one), the pipeline executor's and sequence parallelism's comm buffers.
std::vector<BlockEvent> step_blocks(const MemoryInput& in);
// Activations and workspace of one step for the micro-batch shape of in: step_blocks' peaks.
MemoryBreakdown step_memory(const MemoryInput& in);

// Throws kInvalidArgument for a bad input (world < 1, B or T < 1, stage outside 0..3).
StageEstimate estimate_stage(const MemoryInput& in, int stage);

// The largest micro-batch B (1..max_batch) whose estimate at `stage` is within budget_bytes, with
// every smaller B within it too; 0 when B = 1 does not fit. in.micro_batch is ignored.
int largest_micro_batch(const MemoryInput& in, int stage, size_t budget_bytes, int max_batch = 1 << 20);

}  // namespace mt::planner
