// DeviceMesh: Megatron's rank order, rank = tp_rank + tp * (dp_rank + dp * pp_rank).
#include "comm/device_mesh.h"

#include "base/error.h"

namespace mt::comm {

const char* mesh_dim_name(MeshDim dim) {
  switch (dim) {
    case MeshDim::kTp: return "tp";
    case MeshDim::kDp: return "dp";
    case MeshDim::kPp: return "pp";
  }
  return "?";
}

int MeshCoord::operator[](MeshDim dim) const {
  return dim == MeshDim::kTp ? tp : dim == MeshDim::kDp ? dp : pp;
}

DeviceMesh::DeviceMesh(int world, int tp, int dp, int pp) : world_(world), tp_(tp), dp_(dp), pp_(pp) {
  MT_CHECK(tp >= 1 && dp >= 1 && pp >= 1 && static_cast<long>(tp) * dp * pp == world,
           ErrorKind::kInvalidArgument,
           "device mesh: world " + std::to_string(world) + " != tp " + std::to_string(tp) +
               " x dp " + std::to_string(dp) + " x pp " + std::to_string(pp) +
               " (each must be >= 1)");
}

int DeviceMesh::size(MeshDim dim) const {
  return dim == MeshDim::kTp ? tp_ : dim == MeshDim::kDp ? dp_ : pp_;
}

void DeviceMesh::check_rank(int rank) const {
  MT_CHECK(rank >= 0 && rank < world_, ErrorKind::kInvalidArgument,
           "device mesh: rank " + std::to_string(rank) + " is outside " + to_string());
}

MeshCoord DeviceMesh::coord(int rank) const {
  check_rank(rank);
  return MeshCoord{rank % tp_, (rank / tp_) % dp_, rank / (tp_ * dp_)};
}

int DeviceMesh::rank(const MeshCoord& c) const {
  MT_CHECK(c.tp >= 0 && c.tp < tp_ && c.dp >= 0 && c.dp < dp_ && c.pp >= 0 && c.pp < pp_,
           ErrorKind::kInvalidArgument,
           "device mesh: coordinate (tp " + std::to_string(c.tp) + ", dp " + std::to_string(c.dp) +
               ", pp " + std::to_string(c.pp) + ") is outside " + to_string());
  return c.tp + tp_ * (c.dp + dp_ * c.pp);
}

std::vector<int> DeviceMesh::group_ranks(MeshDim dim, int rank) const {
  MeshCoord c = coord(rank);
  std::vector<int> out;
  for (int i = 0; i < size(dim); ++i) {
    MeshCoord m = c;
    (dim == MeshDim::kTp ? m.tp : dim == MeshDim::kDp ? m.dp : m.pp) = i;
    out.push_back(this->rank(m));
  }
  return out;
}

int DeviceMesh::group_index(MeshDim dim, int rank) const {
  MeshCoord c = coord(rank);
  // Number the groups by the remaining two coordinates, inner one fastest.
  switch (dim) {
    case MeshDim::kTp: return c.dp + dp_ * c.pp;
    case MeshDim::kDp: return c.tp + tp_ * c.pp;
    case MeshDim::kPp: return c.tp + tp_ * c.dp;
  }
  return 0;
}

std::vector<std::vector<int>> DeviceMesh::groups(MeshDim dim) const {
  std::vector<std::vector<int>> out(world_ / size(dim));
  for (int r = 0; r < world_; ++r) {
    auto& g = out[group_index(dim, r)];
    if (g.empty()) g = group_ranks(dim, r);
  }
  return out;
}

std::string DeviceMesh::to_string() const {
  return "world " + std::to_string(world_) + " = tp " + std::to_string(tp_) + " x dp " +
         std::to_string(dp_) + " x pp " + std::to_string(pp_);
}

}  // namespace mt::comm
