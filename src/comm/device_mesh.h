// DeviceMesh: pure rank <-> coordinates math for tp x dp x pp, in Megatron's order (tp innermost,
// then dp, then pp):  rank = tp_rank + tp * (dp_rank + dp * pp_rank).
// So a tp group is tp consecutive ranks (one host's cores or GPUs), a dp group strides by tp, a pp
// group by tp*dp. No communication here: make_process_groups (process_groups.h) splits a Backend
// along these groups, and the planner uses the same math.
#pragma once

#include <string>
#include <vector>

namespace mt::comm {

enum class MeshDim { kTp = 0, kDp = 1, kPp = 2 };
const char* mesh_dim_name(MeshDim dim);  // "tp", "dp", "pp"

struct MeshCoord {
  int tp = 0;
  int dp = 0;
  int pp = 0;
  int operator[](MeshDim dim) const;
  bool operator==(const MeshCoord&) const = default;
};

class DeviceMesh {
 public:
  // REQUIRES: tp, dp, pp >= 1 and world == tp*dp*pp (else kInvalidArgument naming all four).
  DeviceMesh(int world, int tp, int dp, int pp);

  int world() const { return world_; }
  int size(MeshDim dim) const;
  int tp() const { return tp_; }
  int dp() const { return dp_; }
  int pp() const { return pp_; }

  MeshCoord coord(int rank) const;
  int rank(const MeshCoord& c) const;
  // The ranks of the group along `dim` that holds `rank` (ordered by their coordinate on dim).
  std::vector<int> group_ranks(MeshDim dim, int rank) const;
  // Every group along `dim`, each ordered as group_ranks; the i-th is group_index(dim, r) == i.
  std::vector<std::vector<int>> groups(MeshDim dim) const;
  // Which of groups(dim) holds `rank`.
  int group_index(MeshDim dim, int rank) const;
  std::string to_string() const;  // "world 8 = tp 2 x dp 2 x pp 2"

 private:
  void check_rank(int rank) const;
  int world_, tp_, dp_, pp_;
};

}  // namespace mt::comm
