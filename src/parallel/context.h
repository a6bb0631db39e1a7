// ParallelContext (DESIGN decision 7): the mesh (tp x dp x pp, Megatron's order) and this rank's
// groups along it, passed explicitly to whatever builds or runs the model; no global state.
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
  std::chrono::milliseconds timeout = comm::kDefaultTimeout;

  int rank() const { return world->rank(); }
  int tp() const { return mesh.tp(); }
  int dp() const { return mesh.dp(); }
  int pp() const { return mesh.pp(); }
  int tp_rank() const { return groups.tp->rank(); }
  int dp_rank() const { return groups.dp->rank(); }
  int pp_rank() const { return groups.pp->rank(); }
};

// Splits `world` (every rank calls this: collective) into tp x dp x pp with dp = world / (tp pp).
// world null: one process. Throws kInvalidArgument when tp*pp does not divide the world size.
std::shared_ptr<ParallelContext> make_parallel_context(std::shared_ptr<comm::Backend> world, int tp = 1, int pp = 1,
                                                       bool sequence_parallel = false,
                                                       std::chrono::milliseconds timeout = comm::kDefaultTimeout);

}  // namespace mt::parallel
