// ProcessGroups: the tp, dp and pp groups of one rank, split from the world Backend along a
// DeviceMesh. Every rank of the world must call make_process_groups (it runs three splits).
#pragma once

#include <memory>

#include "comm/backend.h"
#include "comm/device_mesh.h"

namespace mt::comm {

struct ProcessGroups {
  std::shared_ptr<Backend> tp, dp, pp;
  Backend& group(MeshDim dim) const;
};

// REQUIRES: mesh.world() == world.size(). Group rank i along dim is mesh coordinate i on dim.
// A split blocks without a deadline (MPI_Comm_split): the world first meets at a barrier within
// `timeout`, so a rank that never comes is named (CommTimeout) instead of hanging every other.
ProcessGroups make_process_groups(Backend& world, const DeviceMesh& mesh,
                                  std::chrono::milliseconds timeout = kDefaultTimeout);

}  // namespace mt::comm
