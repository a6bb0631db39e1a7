// Step programs from the runtime's own decisions (issue 14, DESIGN decisions 6-8): a data-parallel
// ZeRO step (stages 1-3) as a SimProgram, built by driving parallel::ZeroSchedule — the object that
// decides, in the real runtime, when each unit is gathered, prefetched, freed and reduce-scattered
// — with effects that emit instructions instead of buffers and collectives. The memory estimator
// drives the same schedule with byte counts (planner/memory.cpp), so the three cannot disagree on
// what happens when.
//
// Instructions per effect, as parallel::ZeroRuntime performs them:
//   start_gather       an asynchronous all_gather of the unit (piece bytes per rank)
//   finish_gather      its wait, then the conversion to the compute dtype (bf16/f16: a memory-bound
//                      pass over the unit) — compute
//   begin_grad_slab    zeroing the unit's f32 gradient slab — compute
//   launch_reduce      an asynchronous reduce_scatter of the slab (piece bytes per rank)
//   complete_reduce    its wait, then the sum into the shard — compute
// and around them the passes' compute: each unit's forward between its pre- and post-forward
// hooks, the head's backward (its own hook pair, as TransformerLM runs it), each unit's backward
// between its backward hooks; after the last micro-batch the optimizer over the shard, then the
// refresh's gathers (stages 1-2: every view; stage 3: the persistent ones).
//
// oldest_reduce_done() is false: a reduction completes where the schedule must wait for it. With
// SimOptions::progress the simulator lets it move meanwhile (a progress thread, or polling that
// keeps up); without, it moves only at its wait (MPI inside the wait alone).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "parallel/pp/schedule.h"
#include "parallel/zero/partition.h"
#include "parallel/zero/schedule.h"
#include "planner/sim.h"

namespace mt::planner {

struct ZeroStepSpec {
  std::vector<parallel::Unit> units;  // the model's zero_units(), in order (one tp rank's shard)
  int world = 1;                      // data-parallel ranks
  // Tensor-parallel ranks (consecutive: rank = d·tp + t); the ZeRO collectives run over the dp group
  // of equal t, the costs' tp collectives over the tp group of equal d.
  int tp = 1;
  // DeepSpeed-Ulysses: each dp group's ranks (world = dp x usp of them) in sp groups of usp
  // adjacent coordinates (rank (g·usp + j)·tp + t), over which the passes' blocking all-to-alls
  // (ZeroStepCosts::sp_forward/sp_backward) run; the ZeRO collectives over the whole dp group.
  int usp = 1;
  // schedule.stage 0: no ZeRO schedule; on more than one rank the gradients are all-reduced in
  // buckets of bucket_elems cut from the buffer's end (parallel/dp/grad_buckets.h), each launched
  // at the first unit's post-backward hook below which it lies, during the last micro-batch
  // (waited for at once without overlap_comm), the rest at the backward's end.
  parallel::ZeroScheduleOptions schedule;
  size_t bucket_elems = 500'000'000;  // reduce_bucket_size (stage 0)
  int micro_batches = 1;              // gradient_accumulation_steps
  // One rank for all: every rank runs the same list, so where nothing else sets them apart (no
  // cores shared between ranks: a described cluster, or a machine with a core for every thread)
  // each collective's members issue it at the same time on free streams, and one rank's timeline
  // is every rank's. The program is then that rank alone, its collectives (priced for their
  // groups by the costs) over a group of one. The times are the same as the whole program's
  // (ZeroProgram.OneRankStandsForAllWhereNothingSetsThemApart), for a program a world smaller.
  bool one_rank = false;
  bool tied_head = true;              // the head's backward hooks are unit 0's (tied) or the last unit's
  bool low_precision = false;         // bf16/f16 compute: each gather converts the piece into the view
                                      // (parallel::gathers_in_compute_dtype), or the f32 unit at its use
  // ZeRO-3 with offload_param nvme (ZeroRuntime's swap; optim/swapped_adamw.h asynchronous): the
  // master shard and the gradient records live on disk in one record per unit piece (records of at
  // most sub_group_size, rounded to 1024 elements), the optimizer streams sub-groups of whole
  // records through the disk on a thread of its own, persistent units' sub-groups first. A step in
  // the steady state, as this rank sees it from one optimizer step to the next:
  //   - the optimizer thread (stream 2): per sub-group the slower of its update and its disk traffic,
  //     16 bytes an element read (master, gradient, moments) and then 12 written (master, moments) at
  //     the disk's read and write rates; a sub-group counts as written once the next one is (the
  //     last at the thread's end);
  //   - the refresh, then each gather: wait until the sub-groups holding the unit's piece are written
  //     (wait_master), read the piece off the disk (stream 1), at the gather's finish wait for it and
  //     all_gather it (blocking; one rank: the piece is the unit);
  //   - each completed reduction: wait for the unit's earlier gradient write, read the record back
  //     when this step wrote it before (a later micro-batch, or the head's reduction of the same
  //     unit) and sum, write it behind (stream 1), at most two writes in flight;
  //     the backward's end waits for every write;
  //   - the step ends waiting for the optimizer thread (the engine's wait before the next update).
  bool param_nvme = false;
  size_t sub_group_size = 1'000'000'000;
};

// Seconds for each instruction. Collective times take the bytes each rank sends or receives
// (the unit's piece, 4 bytes an element).
struct ZeroStepCosts {
  std::vector<double> forward, backward;  // per unit, one micro-batch
  double head_backward = 0.0;             // the head's backward (its own hook pair)
  std::function<double(double bytes)> all_gather, reduce_scatter;
  std::function<double(double bytes)> all_reduce;  // stage 0 on more than one rank
  std::function<double(double bytes)> send_recv;   // one message between two ranks (pipelines)
  // Tensor parallelism: per unit, the seconds of each blocking tp-group collective its forward and
  // backward make (empty: none); the unit's compute is split evenly around them.
  std::vector<std::vector<double>> tp_forward, tp_backward;
  std::vector<double> tp_head_backward;
  // Ulysses: likewise the sp group's blocking collectives (its all-to-alls, the loss's sums), after
  // the unit's tp collectives.
  std::vector<std::vector<double>> sp_forward, sp_backward;
  double memory_per_byte = 0.0;           // memory-bound passes without a rate of their own below
  // The ZeRO passes' own kernels (calibrate's "copy", "zero" and "convert" by bytes read and
  // written, "add" by elements); 0: the memory rate (older calibrations, described clusters).
  double copy_per_byte = 0.0, zero_per_byte = 0.0, convert_per_byte = 0.0, sum_per_element = 0.0;
  // A copy of `bytes` (read and written: one rank's all_gather or reduce_scatter).
  double copy_seconds(double bytes) const { return (copy_per_byte > 0 ? copy_per_byte : memory_per_byte) * 2.0 * bytes; }
  double zero_seconds(double bytes) const { return (zero_per_byte > 0 ? zero_per_byte : memory_per_byte) * bytes; }
  // The compute-dtype copy of f32_bytes: 4 bytes read and 2 written an element.
  double convert_seconds(double f32_bytes) const {
    return (convert_per_byte > 0 ? convert_per_byte : memory_per_byte) * 1.5 * f32_bytes;
  }
  // One f32 buffer added into another (kernels::add_inplace): two read, one written.
  double sum_seconds(double f32_bytes) const {
    return sum_per_element > 0 ? sum_per_element * f32_bytes / 4.0 : memory_per_byte * 3.0 * f32_bytes;
  }
  // One data-parallel rank (ZeroRuntime's local gathers and reductions): a unit's gradient slab of
  // at most cache_bytes stays in the last-level cache from its zeroing through the weight
  // gradients' accumulation to its reduction, so its zeroing, its reduction's copy and the sum into
  // the shard run at the calibration's hot lines ("zero hot", "copy hot", "add hot"); 0: never.
  double cache_bytes = 0.0;
  double hot_copy_per_byte = 0.0, hot_zero_per_byte = 0.0, hot_sum_per_element = 0.0;
  // Per unit, what its backward saves when its slab was zeroed just before it in the cache (stage 2
  // and 3 zero each unit's slab at its pre-backward hook): the weight-gradient GEMMs read and write
  // their f32 accumulation (8 bytes a weight) at the hot copy's rate instead of the memory rate
  // that the backward's time (Calibration::gemm_backward_seconds) assumes. Empty: none.
  std::vector<double> hot_backward_saving;
  double optimizer_per_element = 0.0;     // the update over this rank's shard
  // A 1-bit optimizer past its warm-up (stage 0): its momentum's compressed exchange of a buffer of
  // that many f32 bytes (comm::compressed_all_reduce), after the backward and in place of the
  // gradients' all-reduce. Unset: the warm-up's all-reduce.
  std::function<double(double bytes)> onebit_exchange;
  // The gradients stay on their rank (OneBitSync::grads_local: a 1-bit optimizer past its warm-up,
  // 0/1 Adam's steps but its variance steps): no all-reduce in the backward. (Over more than one
  // rank; onebit_exchange may be unset, as in 0/1 Adam's local steps.)
  bool local_gradients = false;
  // The update of n elements where it is not n x optimizer_per_element (offload_optimizer nvme: the
  // moments' swap, planner/cost.h); null: that product.
  std::function<double(double elements)> optimizer;
  double optimizer_seconds(double n) const { return optimizer ? optimizer(n) : optimizer_per_element * n; }
  // The disk (offload_param nvme): seconds per byte read, written, and read and written together.
  double disk_read_per_byte = 0.0, disk_write_per_byte = 0.0, disk_mixed_per_byte = 0.0;
  double update_per_element = 0.0;  // the update alone, without the norm's and zero_grad's passes
  double disk_interference = 0.0;   // compute seconds lost per disk byte moved beside it (SimProgram)
};

// A pipeline step (engine::Engine::train_pipeline): pp stages, each replicated over dp data-parallel
// ranks (rank = q·dp + d). Each rank runs its schedule's own instruction list (parallel::pp::
// build_schedule) with every chunk's forward and backward summed from the per-unit costs over its
// layers, each unit's tensor-parallel collectives included (a stage's tp ranks block on them
// together, so one rank stands for its tp group) (the embedding on virtual stage 0; the last stage's forward carries the fused LM head's
// backward GEMMs, which the runtime computes there), and boundary_bytes messages at send_recv.
// After the schedule: the tied token table's gradient (tied_elems) exchanged between the first and
// last stage (each sends, receives, and waits for its send) and summed; the stage's data-parallel reduction of its stage_params[q] gradients
// (ZeRO 0: blocking all-reduces in buckets of bucket_elems; ZeRO 1: a reduce-scatter, then the
// refresh's all-gather after the update and, in low precision, its conversion of the stage's
// parameters); the update over the rank's parameters or shard.
struct PipelineStepSpec {
  parallel::pp::ScheduleSpec schedule;
  std::vector<int> bounds;           // S + 1 layer bounds of the virtual stages
  std::vector<size_t> stage_params;  // elements per pipeline rank
  int dp = 1;
  int zero_stage = 0;                // 0 or 1 (the runtime's pipeline takes no other)
  bool low_precision = false;        // ZeRO 1: the refresh converts the stage's parameters to the compute dtype
  size_t bucket_elems = 500'000'000;
  double boundary_bytes = 0.0;       // one activation (or its gradient) between stages
  size_t tied_elems = 0;             // the tied token table (0: untied)
  // One data-parallel replica for all (ZeroStepSpec::one_rank's reason): the pp ranks of replica 0,
  // each stage's reductions (priced for dp ranks) over a group of one.
  bool one_replica = false;
  // The ranks share cores (SimProgram::host_cores): each pass's tp collectives are instructions of
  // their own (SimOp::fixed; the compute split evenly around them, as a zero program's), since
  // their calibrated time is already the one the host's sharing gives them; one compute
  // instruction a pass otherwise.
  bool shared_cores = false;
};
SimProgram pipeline_step_program(const PipelineStepSpec& spec, const ZeroStepCosts& costs);
// The same into `into`, whose instruction lists are cleared and refilled in place: a search builds
// pipelines of tens of thousands of instructions a rank, and allocating each afresh (its pages
// faulted in, then unmapped) was a third of a 64-process search at thousands of micro-batches.
void pipeline_step_program(const PipelineStepSpec& spec, const ZeroStepCosts& costs, SimProgram& into);

// One optimizer step of every rank; all ranks run the same list (one group of `world` ranks).
// Stage 0 is parallel/grad_sync's local (one rank) or bucketed implementation.
SimProgram zero_step_program(const ZeroStepSpec& spec, const ZeroStepCosts& costs);

}  // namespace mt::planner
