// ParallelContext (DESIGN decision 7): the mesh (tp x dp x pp, Megatron's order) and this rank's
// groups along it, passed explicitly to whatever builds or runs the model; no global state.
// DeepSpeed-Ulysses sequence parallelism (parallel.sp, parallel/sp/ulysses.h) sits between tp and
// dp as Megatron puts context parallelism (tp-cp-dp-pp): the mesh's dp dimension is DeepSpeed's
// "sequence data parallel" group of dp x sp ranks (gradients and ZeRO partitions go over it), its
// coordinate sp_rank + sp * data_rank; the sp group is sp consecutive coordinates of it. The
// ranks of an sp group read the same samples (data_dp(), data_rank()).
// A context of one process has groups of one (local backends), so code never branches on "is
// there a group".
#pragma once

#include <chrono>
#include <memory>

#include "comm/backend.h"
#include "comm/device_mesh.h"
#include "comm/process_groups.h"

namespace mt::parallel {

struct ParallelContext {
  std::shared_ptr<comm::Backend> world;
  comm::DeviceMesh mesh{1, 1, 1, 1};
  comm::ProcessGroups groups;
  bool sequence_parallel = false;
  std::shared_ptr<comm::Backend> sp_group;  // Ulysses: this rank's sp group (of one without)
  std::chrono::milliseconds timeout = comm::kDefaultTimeout;

  int rank() const { return world->rank(); }
  int tp() const { return mesh.tp(); }
  // dp x sp: the ranks that reduce gradients and hold ZeRO partitions.
  int dp() const { return mesh.dp(); }
  int pp() const { return mesh.pp(); }
  int tp_rank() const { return groups.tp->rank(); }
  int dp_rank() const { return groups.dp->rank(); }
  int pp_rank() const { return groups.pp->rank(); }
  int sp() const { return sp_group ? sp_group->size() : 1; }
  int sp_rank() const { return sp_group ? sp_group->rank() : 0; }
  // The data-parallel replicas that read different samples (dp without sp), and this rank's.
  int data_dp() const { return dp() / sp(); }
  int data_rank() const { return dp_rank() / sp(); }
};

// Splits `world` (every rank calls this: collective) into tp x dp x pp with dp = world / (tp pp)
// (dp x sp of them with Ulysses, sp consecutive dp coordinates a group).
// world null: one process. Throws kInvalidArgument when tp*sp*pp does not divide the world size.
std::shared_ptr<ParallelContext> make_parallel_context(std::shared_ptr<comm::Backend> world, int tp = 1, int pp = 1,
                                                       bool sequence_parallel = false,
                                                       std::chrono::milliseconds timeout = comm::kDefaultTimeout,
                                                       int sp = 1);

}  // namespace mt::parallel
