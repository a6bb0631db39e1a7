// GradSync (DESIGN decision 9, after flashlight's Reducer): how one rank's gradients become the
// data-parallel gradients, and which part of the optimizer state it holds. The engine talks only
// to this interface (no branches on the ZeRO stage):
//   local     one data-parallel rank: nothing to reduce; the optimizer spans the whole buffers
//   bucketed  stage 0 on more ranks: all-reduce in buckets during the last micro-batch's backward
//   zero      stages 1-3: partitioned master/optimizer state (and gradients, parameters)
//   onebit    stage 0 with a 1-bit optimizer (OneBitAdam, ZeroOneAdam, OneBitLamb): bucketed
//             all-reduce for the steps that want averaged gradients (the warm-up, 0/1 Adam's
//             variance steps); otherwise no gradient communication (the optimizer wants local
//             gradients) and the optimizer averages its state through this sync's compressed all-reduce
//             (comm/onebit.h), which keeps this rank's worker and server error buffers
// Later: offloaded (NVMe) implementations.
// The 1-bit case needs two things of the interface: bind() (the sync learns its optimizer, and
// hands it the exchange) and grads_local() (the gradients of this step are the rank's own, so the
// engine agrees over dp on an overflow); rank_state() is what only this rank holds (checkpoints).
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "comm/backend.h"
#include "nn/param_store.h"
#include "optim/optimizer.h"
#include "parallel/zero/partition.h"
#include "parallel/zero/zero_runtime.h"

namespace mt::parallel {

struct GradSyncOptions {
  int stage = 0;                       // zero_optimization.stage
  size_t bucket_elems = 500'000'000;   // reduce_bucket_size (stage 0)
  bool overlap_comm = false;
  ZeroOptions zero;                    // stages 1-3
  bool onebit = false;                 // a 1-bit optimizer (stage 0 only)
  bool onebit_per_tensor = false;      // its exchange compresses each parameter tensor on its own
  DType comm_dtype = DType::kF32;      // communication_data_type (stage 0; stages 1-3: zero.comm_dtype)
  std::chrono::milliseconds timeout = comm::kDefaultTimeout;
};

class GradSync {
 public:
  virtual ~GradSync() = default;
  virtual const char* kind() const = 0;  // "local", "bucketed", "zero"

  // The optimizer's span on this rank: the whole local flat buffers, or this rank's dp shard.
  virtual float* master() const = 0;
  virtual float* grad() const = 0;
  virtual size_t numel() const = 0;
  // Where the optimizer writes the low-precision compute copy as it updates (null: after_update
  // refreshes it), and its dtype.
  virtual void* compute() const { return nullptr; }
  virtual DType compute_dtype() const { return DType::kF32; }
  // The span is this rank's part of a dp partition (a norm over it sums over dp).
  virtual bool sharded() const { return false; }
  // The segments of the whole local buffer mapped onto the span.
  virtual std::vector<optim::ParamSegment> span_segments(const std::vector<optim::ParamSegment>& all) const { return all; }

  virtual void begin_backward(bool last_micro_batch) { (void)last_micro_batch; }
  virtual void end_backward(bool last_micro_batch) { (void)last_micro_batch; }
  // After the optimizer updated master(), or after a load: parameters as the next forward reads them.
  virtual void after_update() {}
  virtual void zero_grad() = 0;
  // span (numel()) -> the whole local flat buffer on dp rank 0 (dst ignored elsewhere); collective.
  virtual void gather(float* dst, const float* span) = 0;
  // local (the whole local flat buffer, on every rank) -> span.
  virtual void scatter(float* span, const float* local) const = 0;

  virtual const ZeroRuntime* zero() const { return nullptr; }
  virtual ZeroRuntime* zero() { return nullptr; }

  // The optimizer this sync serves (called once, after both are built).
  virtual void bind(optim::Optimizer& optimizer) { (void)optimizer; }
  // This step's grad() holds the rank's own gradients, not their dp average.
  virtual bool grads_local() const { return false; }
  // State only this rank holds (not a part of the span's buffers): saved per rank.
  virtual std::vector<optim::StateBuffer> rank_state() const { return {}; }
};

// units / modules: the model's zero_units() and zero_unit_modules() (bucket launch points, ZeRO
// units). dp: the data-parallel group.
std::unique_ptr<GradSync> make_grad_sync(nn::ParamStore& store, const std::vector<Unit>& units,
                                         const std::vector<std::vector<nn::Module*>>& modules, comm::Backend& dp,
                                         const GradSyncOptions& options);

}  // namespace mt::parallel
