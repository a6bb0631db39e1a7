// make_process_groups: one split per mesh dim, color = the group's index, key = the coordinate.
#include "comm/process_groups.h"

namespace mt::comm {

Backend& ProcessGroups::group(MeshDim dim) const {
  return dim == MeshDim::kTp ? *tp : dim == MeshDim::kDp ? *dp : *pp;
}

ProcessGroups make_process_groups(Backend& world, const DeviceMesh& mesh, std::chrono::milliseconds timeout) {
  MT_CHECK(mesh.world() == world.size(), ErrorKind::kInvalidArgument,
           "process groups: " + mesh.to_string() + " but the " + world.name() + " world has " +
               std::to_string(world.size()) + " ranks");
  BarrierOptions arrive;
  arrive.timeout = timeout;
  arrive.tag = "process groups";
  world.barrier(arrive)->wait();
  const int r = world.rank();
  const MeshCoord c = mesh.coord(r);
  ProcessGroups g;
  g.tp = world.split(mesh.group_index(MeshDim::kTp, r), c.tp);
  g.dp = world.split(mesh.group_index(MeshDim::kDp, r), c.dp);
  g.pp = world.split(mesh.group_index(MeshDim::kPp, r), c.pp);
  return g;
}

}  // namespace mt::comm
