// The layout search (issue 14): every layout of a job's processes that the cost model can time,
// each checked against the memory budget first (planner/memory.h, the replay `estimate` prints),
// then timed by simulating its step program (planner/program.h with planner/cost.h's times), and
// ranked by predicted step time. The global batch (train_batch_size) is fixed: a layout splits it
// into data-parallel ranks × micro-batches × accumulation steps, so every layout trains the same
// samples per step and step time orders them as tokens/s does.
//
// Searched, where the caller leaves them free: the ZeRO stage (0-3), the micro-batch B with its
// accumulation (every divisor of the rank's share of the batch), and recompute (activation
// checkpointing), and the processes' split into tensor-parallel ranks × data-parallel ranks (the
// tp group's collectives inside each block's passes, planner/cost.h) or pipeline stages ×
// data-parallel ranks (each stage cut as the engine cuts it, its program the schedule's own,
// planner/program.h; the schedule itself, 1F1B or interleaved over v chunks a rank), or all three
// (each stage's tp collectives inside its passes), with sequence parallelism on or off. Rejected with
// the reason: layouts over the budget, shares that do not
// divide the batch, tp not dividing the model, and what the runtime refuses (a pipeline with ZeRO
// 2-3). Pure: the calibration comes from the caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/zero/schedule.h"
#include "planner/calibrate.h"
#include "planner/cost.h"
#include "planner/memory.h"
#include "planner/program.h"

namespace mt::planner {

struct Layout {
  int dp = 1, tp = 1, pp = 1;
  int stage = 0;
  int micro_batch = 1, accumulation = 1;
  bool recompute = false;
  // A pipeline's schedule (pp > 1): GPipe, 1F1B, or interleaved over virtual_stages model chunks a
  // rank (parallel.pipeline_schedule and parallel.virtual_stages).
  parallel::pp::ScheduleKind schedule = parallel::pp::ScheduleKind::k1F1B;
  int virtual_stages = 1;
  bool sequence_parallel = false;  // Megatron's, over the tp group (tp > 1)
  // DeepSpeed-Ulysses (parallel.sp; with tp and pp): usp ranks share each micro-batch, dp x usp ranks
  // the ZeRO states and the gradients' reduction (planner/cost.h StepShape::usp).
  int usp = 1;
  std::string describe() const;  // "dp 2, tp 2 sp, pp 2 interleaved x 2, ZeRO 1, B 4 x 2, recompute"; "dp 1, Ulysses 2, ..." 
};

// The job: what every layout shares (the configuration's model, sequence, dtype, optimizer and
// ZeRO knobs), its processes and global batch, and its own layout (the fixed values of what is not
// searched).
struct PlanJob {
  MemoryInput memory;                  // estimate_input's reading; its layout fields are replaced per layout
  parallel::ZeroScheduleOptions schedule;  // overlap_comm, stage-3 knobs, comm dtype (stage: per layout)
  // The gradients' reduction dtype of Ulysses layouts (seq_parallel_communication_data_type, as
  // DeepSpeed takes it with sp > 1); schedule.comm_dtype is the others' (communication_data_type).
  DType usp_comm_dtype = DType::kF32;
  bool overlap_comm_given = true;      // false: overlap_comm is each stage's default (DeepSpeed's: on at stage 3)
  size_t bucket_elems = 500'000'000;   // reduce_bucket_size (stage 0)
  int procs = 1;
  int64_t global_batch = 1;            // train_batch_size: samples per optimizer step
  Layout base;                         // the configuration's own layout
  // Pipelines (pp > 1): the configuration's schedule and virtual stages, which every pipeline takes
  // unless the search varies them (SearchSpace::schedule; its micro-batches are each layout's
  // accumulation), and how layers are cut ("parameters", "uniform", or "time": the run measures its
  // layers at start-up; the plan cuts by the cost model's times the same way).
  parallel::pp::ScheduleKind schedule_kind = parallel::pp::ScheduleKind::k1F1B;
  int virtual_stages = 1;
  std::string partition = "parameters";
  // zero_optimization.offload_optimizer or offload_param set (any device): ZeRO stage 1-3 only. On
  // CPU ranks device "cpu" changes nothing (the state already lives in host memory); "nvme" for the
  // optimizer adds the moments' swap (planner/cost.h); offload_param "nvme" is refused. Set for
  // 16-bit master weights too, which need the same stages.
  bool offload = false;
  // Ranks sharing a host's cores (plan on a machine with fewer cores than processes x threads):
  // host_cores > 0 makes the simulator share them among the ranks computing at once. Each rank
  // runs `threads` threads; ranks_per_host consecutive ranks share a host (tp innermost, then dp,
  // then pp, as the runtime's grid).
  double host_cores = 0.0;
  int threads = 1;
  int ranks_per_host = 0;  // 0: every rank on one host
  bool sequence_parallel_forced = false;  // partition_activations: every tp > 1 layout is sequence parallel
  // The attention the run computes: StepShape::attention_share (documents) and sparse (sparse_attention).
  double attention_share = 1.0;
  int attention_samples = 0;  // the samples attention_share was read from (0: none, causal)
  std::shared_ptr<const kernels::SparseAttentionPlan> sparse = nullptr;
  UpdateKind update = UpdateKind::kAdamW;  // the optimizer's update (StepShape::update)
  // Steps that differ by their update (update_mix over the run's steps: 1-bit Adam's and LAMB's
  // warm-up and compressed phase, 0/1 Adam's four kinds): each kind's share; the prediction is the
  // mean step, each kind's step simulated with `update` set to it. Empty: every step is `update`'s.
  // mix_of names the optimizer ("1-bit Adam", "1-bit LAMB", "0/1 Adam").
  std::vector<std::pair<UpdateKind, double>> update_mix;
  std::string mix_of;
  // Simulate every rank even where one stands for all (ZeroStepSpec::one_rank): for the test that
  // they agree.
  bool whole_program = false;
  // Simulate every micro-batch even where the steady state's line gives a long step (time_one): for
  // the test that they agree.
  bool every_micro_batch = false;
  // What the runtime refuses of this configuration's layouts, beside the model's shape: each
  // family or stage it takes out is named among the rejected (the search ranked them, and plan
  // --validate's run of one failed "did not train").
  bool curriculum = false;         // curriculum_learning (a pipeline runs it since stop 75)
  int64_t curriculum_gcd = 0;      // its lengths' gcd (engine::curriculum_lengths_gcd): Ulysses' sp must divide it
  bool cuda_replicas = false;      // device "cuda" over several processes: dp only, ZeRO 0
  bool sixteen_bit_master = false;  // bf16/fp16 master weights: ZeRO 1-3 (DeepSpeed's assert)
  // Why the runtime runs no Ulysses layout of this configuration (ds_config's check_ulysses: offload
  // to nvme, a 1-bit optimizer, ...); empty: it runs them where usp divides T and the heads.
  std::string ulysses_refused;
};

// What the search may change (false: the base's value).
struct SearchSpace {
  bool parallel = false;   // dp x tp x pp, and those x Ulysses' sp
  bool stage = false;
  bool batch = false;      // micro-batch and accumulation, their product fixed by the global batch
  // Without batch: the accumulation the configuration fixed (its micro-batch then the rank's share
  // over it); 0: the configuration's micro-batch is fixed (job.base.micro_batch), the accumulation
  // the share over it.
  int fixed_accumulation = 0;
  bool recompute = false;
  // A pipeline's schedule: the configuration's non-interleaved one (1F1B where it names
  // interleaved) and Megatron's interleaved one over 2, 3, ... model chunks a rank, as many as
  // give every chunk a layer.
  bool schedule = false;
  // With parallel: sequence parallelism on and off for tp > 1 (on only where the configuration's
  // activation_checkpointing.partition_activations turns it on whatever parallel says).
};

struct Prediction {
  double step = 0.0;           // seconds: MPI moves a nonblocking collective only inside its wait
  double step_progress = 0.0;  // seconds if it moved beside compute (a progress thread)
  double forward = 0.0, backward = 0.0;  // one micro-batch's passes (compute only)
  double compute = 0.0, comm = 0.0;      // rank 0's compute and communication-stream seconds (no progress)
  double blocked = 0.0, streams = 0.0;   // rank 0's waits, and its own streams' busy seconds (disk, optimizer thread)
  size_t memory = 0;           // bytes per rank at its peak: max(training step, engine setup)
  size_t memory_train = 0;     // bytes per rank in training steps (every category at its peak)
  std::vector<size_t> memory_by_stage;  // the same per pipeline rank (one entry without a pipeline)
  // The process's peak as the kernel counts it (VmHWM): the calibration's process constant plus the
  // allocator's footprint over setup and training (StageEstimate::mapped) and MPI's temporaries
  // (StageEstimate::mpi), the largest pipeline rank's; 0 when the calibration has no constant (a described cluster). With one, the search's
  // memory budget applies to this.
  size_t process = 0;
  std::vector<size_t> process_by_stage;
  std::vector<int> bounds;     // the pipeline's virtual stages' layer bounds (empty without one)
  double tokens_per_s = 0.0;   // global batch x T / step
  // The step's figures were read off the line through steps of fewer micro-batches, the last of
  // them steady_from (0: every micro-batch simulated; search.cpp's time_one).
  int steady_from = 0;
};

// The predicted step and memory of one layout (a pipeline's: its largest stage's memory). Throws
// kNotSupported for a pipeline with ZeRO 2-3
// or cut by time, and kInvalidArgument when the layout does not split the job's batch, tp does not
// divide the model or its schedule cannot run.
Prediction predict_layout(const PlanJob& job, const Layout& layout, const Calibration& cal);
// What predict_layout refuses before timing anything, with the same messages.
void check_layout(const PlanJob& job, const Layout& layout);

struct RankedLayout {
  Layout layout;
  Prediction prediction;
};

// Steps predicted within this fraction of each other are ties: the cost model's error is several
// per cent, so a smaller difference does not tell two layouts apart, and the one with less memory
// has more headroom (DESIGN-NOTES 47).
inline constexpr double kTieBand = 0.01;
// The most micro-batches a step the simulator runs (each is simulated).
inline constexpr int64_t kMaxAccumulation = 65536;
// Orders layouts fastest first in bands: the fastest not yet placed and every layout predicted
// within kTieBand of it, less memory first within the band (equal memory: faster first).
void rank_layouts(std::vector<RankedLayout>& ranked);

struct SearchResult {
  std::vector<RankedLayout> ranked;  // feasible layouts, by rank_layouts: fastest first, ties (kTieBand) less memory first
  std::vector<std::string> rejected; // one line per rejected family or layout group, with why
  int considered = 0;                // layouts enumerated (feasible or not)
};

// Layouts for job.procs processes within budget bytes per rank. Every feasible layout is ranked
// (the caller prints the top k).
SearchResult search_layouts(const PlanJob& job, const SearchSpace& space, size_t budget, const Calibration& cal);

}  // namespace mt::planner
