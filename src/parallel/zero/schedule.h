// ZeroSchedule: the decisions of ZeRO stages 1-3 — when a unit's view is gathered, prefetched,
// kept or freed, when its gradient slab is made and reduce-scattered, what a step's refresh
// gathers — as a pure state machine over the units, with every effect delegated to ZeroEffects.
//
// The runtime (zero_runtime.h) implements the effects with buffers and collectives; the memory
// estimator (planner/memory.cpp) implements them as byte counts. Both drive this one schedule, so
// an estimate and a run cannot disagree on what is live when (DESIGN: the planner and the runtime
// share the pure files).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "parallel/zero/partition.h"
#include "tensor/dtype.h"

namespace mt::parallel {

struct ZeroScheduleOptions {
  int stage = 1;                           // 1, 2 or 3
  bool overlap_comm = true;                // keep one reduction in flight behind compute
  size_t prefetch_elems = 50'000'000;      // stage3_prefetch_bucket_size
  size_t persistence_threshold = 100'000;  // stage3_param_persistence_threshold
  size_t max_live_elems = 1'000'000'000;   // stage3_max_live_parameters
  // communication_data_type: gradients are reduce-scattered in f32, or rounded to bf16/f16 and
  // summed in that type (a send staging of the unit and a 2-byte receive buffer per reduction).
  DType comm_dtype = DType::kF32;
};

// What the schedule asks for. Unit indices are those of the partition's units.
class ZeroEffects {
 public:
  virtual ~ZeroEffects() = default;
  virtual void start_gather(size_t u) = 0;   // make u's gather target and launch its all_gather
  virtual void finish_gather(size_t u) = 0;  // complete it (if launched), build and bind u's view
  virtual void cancel_gather(size_t u) = 0;  // complete it and drop what it gathered (stale)
  virtual void free_view(size_t u) = 0;      // unbind and free u's view
  virtual void begin_grad_slab(size_t u) = 0;  // a zeroed gradient slab for u, bound
  virtual void launch_reduce(size_t u) = 0;    // reduce_scatter u's slab into a receive buffer
  // Completes the oldest reduction (add into the gradient shard); free_slab: drop u's slab too.
  virtual void complete_reduce(size_t u, bool free_slab) = 0;
  // Whether the oldest reduction has completed, without blocking (false: unknown or not yet).
  virtual bool oldest_reduce_done() { return false; }
  virtual void progress() {}  // lets nonblocking work advance (MPI progresses inside MPI_Test)
};

class ZeroSchedule {
 public:
  ZeroSchedule(const std::vector<Unit>& units, const ZeroScheduleOptions& options, ZeroEffects& effects);

  bool persistent(size_t u) const;
  // Construction: persistent views are built (the caller fills their gather targets from the full
  // store before), stage 1's gradient slabs made.
  void construct();
  // Hooks around every use of a unit: pre/post, forward (reads) or backward (accumulates grads).
  void on_hook(size_t u, bool pre, bool forward);
  void set_last_micro_batch(bool last) { last_micro_ = last; }
  void finish_backward();  // after each micro-batch's backward
  void refresh();          // after the optimizer step: persistent views follow the master shard

  size_t live_elems() const { return live_elems_; }
  size_t peak_live_elems() const { return peak_live_elems_; }

 private:
  struct State {
    bool gathering = false, live = false, counted = false;
    int refs = 0;
  };
  void count_live(size_t u);
  void start_gather(size_t u);
  void finish_gather(size_t u);
  void acquire(size_t u);
  void release(size_t u);
  void maybe_prefetch(size_t u);
  void begin_grads(size_t u);
  void reduce_grads(size_t u);
  void wait_reductions(size_t keep);

  const std::vector<Unit>& units_;
  ZeroScheduleOptions opts_;
  ZeroEffects& fx_;
  std::vector<State> state_;
  std::deque<size_t> pending_;  // units whose reduction is in flight, oldest first
  bool last_micro_ = true, backward_phase_ = false;
  std::vector<bool> reduced_;  // stage 1: units reduced during this step's last micro-batch
  // Stages 2-3: the embeddings' unit (the token table, and a tied head's use of it) and the tail
  // (the final norm and an untied head) are used more than once in a backward; their slab gathers
  // every use and is reduced once: the tail when the backward moves on, the embeddings at its end.
  std::vector<bool> deferred_;
  void reduce_deferred_tail(size_t now);
  size_t live_elems_ = 0, peak_live_elems_ = 0;
};

}  // namespace mt::parallel
