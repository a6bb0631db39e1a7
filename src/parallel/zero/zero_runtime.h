// ZeroRuntime: ZeRO stages 1, 2 and 3 (Rajbhandari et al. 2020; DeepSpeed's zero_optimization)
// over a model's flat parameter buffers, cut into units (partition.h) whose modules' hooks tell it
// when each unit's parameters are read and when its gradients are produced.
//
// Per rank it owns, for its shard (S elements): the f32 master weights, the f32 gradients (the
// reduced, accumulated gradients of its pieces) — the optimizer runs over these two — and for the
// model, each unit's "view": a slab with the unit's weights in the layout the layers read
// (Parameter::compute / master; GEMM weights in the compute dtype, the rest f32) and a gradient
// slab (the unit's padded flat range, f32) the layers accumulate into.
//   stage 1: views and gradient slabs persist; gradients are reduce-scattered unit by unit during
//            the backward of the last micro-batch of a step (none on the others).
//   stage 2: views persist; a unit's gradient slab lives from its kPreBackward to the end of its
//            reduce-scatter, after every micro-batch (as DeepSpeed does), so at most two are live.
//   stage 3: also the views: a unit is gathered (all_gather of the f32 master pieces, then cast)
//            before each use and freed after, except units of at most persistence_threshold
//            elements, which stay; the next unit in the pass's direction is prefetched when it
//            fits prefetch_elems and the live window max_live_elems.
// After the optimizer updates the master shard, refresh_params() all-gathers the views that
// persist (stages 1 and 2, and stage 3's persistent units).
//
// The ParamStore's own full buffers are released at construction (after this rank's pieces were
// copied from them), so the model can only run through the hooks from then on.
//
// Collectives: every rank calls the same collectives in the same order because every rank runs
// the same hooks in the same order (same model, same micro-batch count). Overlap: reductions and
// prefetches are nonblocking and polled at every hook; with overlap_comm false each waits at once.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <cstddef>
#include <memory>
#include <vector>

#include "comm/backend.h"
#include "io/aio.h"
#include "nn/module.h"
#include "nn/param_store.h"
#include "optim/swapped_adamw.h"
#include "parallel/zero/partition.h"
#include "parallel/zero/schedule.h"
#include "tensor/allocator.h"

namespace mt::parallel {

// The schedule's knobs (stage, overlap, prefetch, persistence, live window) and the collectives'
// timeout.
struct ZeroOptions : ZeroScheduleOptions {
  std::chrono::milliseconds timeout = comm::kDefaultTimeout;
  // offload_param device "nvme" (ZeRO-Infinity, stage 3): the f32 master and gradient shards live
  // in swap_dir (params.swp, grads.swp), one 4 KiB-aligned record per unit piece. A unit's master
  // piece is read from disk when the schedule starts its gather (prefetch included) and
  // all-gathered when it is used; each reduced gradient piece is added to its record (read, add,
  // write) and written behind; the optimizer (optim::SwappedAdamW) streams both in sub-groups of
  // whole records. Empty: in memory.
  std::string swap_dir;
  io::AioOptions aio;
  io::Env* env = nullptr;  // null: the real filesystem
  // A store built without buffers (models::ModelOptions::deferred_init): the initial values of
  // flat elements [begin, end), asked unit by unit.
  std::function<void(size_t begin, size_t end, float* dst)> initial_values;
};

class ZeroRuntime : private ZeroEffects {
 public:
  // units / modules: the model's zero_units() and zero_unit_modules(). group: the data-parallel
  // group (its size is the partition's world). Copies this rank's pieces from the store, releases
  // the store's buffers and installs the hooks.
  ZeroRuntime(nn::ParamStore& store, std::vector<Unit> units, const std::vector<std::vector<nn::Module*>>& modules,
              comm::Backend& group, const ZeroOptions& options);
  ~ZeroRuntime();
  ZeroRuntime(const ZeroRuntime&) = delete;
  ZeroRuntime& operator=(const ZeroRuntime&) = delete;

  const ZeroPartition& partition() const { return part_; }
  const ZeroOptions& options() const { return opts_; }
  float* master() const { return master_.as<float>(); }
  float* grad() const { return grad_.as<float>(); }

  // Before each micro-batch's backward: whether it is the last of the step (stage 1 reduces then).
  void set_last_micro_batch(bool last);
  // After each micro-batch's backward: launches what is left and waits for every reduction.
  void finish_backward();
  // Zeroes the gradient shard (and stage 1's gradient slabs): after the optimizer step.
  void zero_grad();
  // After the optimizer updated master(): the persistent views follow (collective).
  void refresh_params();

  // Collective: rank `root` receives the full flat buffer (total() elements) assembled from every
  // rank's shard buffer `shard` (S elements); other ranks pass flat = nullptr.
  void gather_flat(float* flat, const float* shard, int root);
  // Local: this rank's pieces of a full flat buffer into `shard` (every rank holds flat).
  void scatter_flat(float* shard, const float* flat) const { part_.flat_to_shard(shard, flat); }

  // offload_param nvme: master() and grad() are null; the shards are in these files, laid out by
  // swap_records() (span elements of each unit piece at its record's offset).
  bool swapped() const { return swap_ != nullptr; }
  // A start that failed (the engine's, or its resume): removes the swap files this runtime created,
  // whose reserved space counted against the next run on the filesystem. Never throws.
  void discard_swap_files() noexcept;
  // offload_param nvme: the parameter and gradient traffic since the last call (gathers' piece
  // reads, gradient records read and written, and the time the step blocked on them); zeros
  // otherwise. Resets the counters.
  io::AsyncIo::Stats take_swap_io_stats();
  // Each unit piece cut into records of at most max_elems (rounded down to 1024 elements, 4 KiB of
  // f32): the pieces' file layout is unchanged, the optimizer's sub-groups can be smaller than a unit.
  std::vector<optim::SwapRecord> swap_records(size_t max_elems = SIZE_MAX) const;
  // Indices into swap_records(max_elems) of the records of persistent units (gathered as a step ends).
  std::vector<size_t> persistent_records(size_t max_elems = SIZE_MAX) const;
  io::File* master_file() const;
  io::File* grad_file() const;
  // The whole master shard from / to disk (checkpoints); write_master then refresh_params().
  void read_master(float* shard) const;
  // Shard elements [begin, begin + n) of the master from disk (one unit's record cached between
  // calls: reading a unit in parts reads it once).
  void read_master_range(size_t begin, size_t n, float* dst) const;
  void write_master(const float* shard);
  // The same, the shard's elements [begin, begin + n) given by fill, one unit piece at a time.
  void write_master_from(const std::function<void(size_t begin, size_t n, float* dst)>& fill);
  // offload_param nvme with an asynchronous optimizer step: called with shard elements [begin,
  // end) before the master is read or written there (end SIZE_MAX: all of it), so each gather reads
  // its piece only once the step has written it back; the step is the next forward's neighbour.
  void set_master_wait(std::function<void(size_t begin, size_t end)> wait) { master_wait_ = std::move(wait); }
  // The gradient norm's ranges of the shard (each inside one unit piece): the runtime takes
  // optim::grad_norm of each once its gradient is final (the last micro-batch's reduction), so
  // the engine sums the same values as over an in-memory shard.
  void set_norm_ranges(std::vector<std::pair<size_t, size_t>> ranges);
  const std::vector<double>& range_norms() const;

  // Elements of parameters currently held in views (for the live-window tests).
  size_t live_param_elems() const { return schedule_.live_elems(); }
  size_t peak_live_param_elems() const { return schedule_.peak_live_elems(); }

 private:
  struct View;
  // ZeroEffects: what the schedule asks for, with buffers and collectives.
  void start_gather(size_t u) override;
  void finish_gather(size_t u) override;
  void cancel_gather(size_t u) override;
  void free_view(size_t u) override;
  void begin_grad_slab(size_t u) override;
  void launch_reduce(size_t u) override;
  void complete_reduce(size_t u, bool free_slab) override;
  bool oldest_reduce_done() override;
  void progress() override;

  void bind_params(size_t u);
  // Low precision where gathers_in_compute_dtype: the view's lowp is an image of the unit, gathered
  // in place; the other elements travel in f32 runs.
  bool image_view(size_t u) const;
  void alloc_lowp_view(size_t u);
  void pack_other(size_t u, size_t k, const float* vals, float* out) const;
  void unpack_other(size_t u);
  // offload_param nvme on a one-rank group with a low-precision compute dtype: the piece read from
  // disk is the whole unit, and the views are converted from it (no all_gather, no staging copy).
  bool piece_is_unit() const { return swap_ && group_.size() == 1 && cd_ != DType::kF32; }
  void unbind_params(size_t u);

  nn::ParamStore& store_;
  ZeroPartition part_;
  comm::Backend& group_;
  ZeroOptions opts_;
  DType cd_;
  std::vector<std::vector<nn::Parameter*>> params_;  // per unit
  Buffer master_, grad_;
  std::vector<std::unique_ptr<View>> views_;
  struct PendingReduce {
    Buffer recv;  // s elements of comm_dtype
    io::AlignedBuffer record;  // offload_param nvme, f32: the receive buffer is the gradient record
    Buffer send;  // comm_dtype != f32: the unit's slab rounded to it
    std::unique_ptr<comm::Work> work;
  };
  std::deque<PendingReduce> pending_;  // in the schedule's order
  ZeroSchedule schedule_;
  struct Swap;
  std::unique_ptr<Swap> swap_;
  bool last_micro_ = true;
  std::function<void(size_t, size_t)> master_wait_;
  void wait_master(size_t begin, size_t end) const {
    if (master_wait_) master_wait_(begin, end);
  }
};

}  // namespace mt::parallel
