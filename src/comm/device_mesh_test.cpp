// DeviceMesh: Megatron's order checked by hand on 2x2x2, round trips and group partitions on
// every factorisation of 12, and the mesh's process groups split from a local world.
#include "comm/device_mesh.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "comm/local_backend.h"
#include "comm/process_groups.h"

namespace mt::comm {

TEST(DeviceMesh, MegatronOrderByHand) {
  DeviceMesh m(8, 2, 2, 2);
  EXPECT_EQ(m.coord(0), (MeshCoord{0, 0, 0}));
  EXPECT_EQ(m.coord(1), (MeshCoord{1, 0, 0}));  // tp innermost
  EXPECT_EQ(m.coord(2), (MeshCoord{0, 1, 0}));  // then dp
  EXPECT_EQ(m.coord(5), (MeshCoord{1, 0, 1}));  // then pp
  EXPECT_EQ(m.group_ranks(MeshDim::kTp, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(m.group_ranks(MeshDim::kDp, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.group_ranks(MeshDim::kPp, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(m.groups(MeshDim::kDp),
            (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
}

TEST(DeviceMesh, RoundTripAndPartitionsForEveryLayoutOf12) {
  for (int tp = 1; tp <= 12; ++tp)
    for (int dp = 1; dp <= 12; ++dp) {
      if (12 % (tp * dp)) continue;
      DeviceMesh m(12, tp, dp, 12 / (tp * dp));
      for (int r = 0; r < 12; ++r) EXPECT_EQ(m.rank(m.coord(r)), r);
      for (MeshDim d : {MeshDim::kTp, MeshDim::kDp, MeshDim::kPp}) {
        std::set<int> seen;
        auto groups = m.groups(d);
        EXPECT_EQ(static_cast<int>(groups.size()), 12 / m.size(d));
        for (size_t i = 0; i < groups.size(); ++i)
          for (size_t k = 0; k < groups[i].size(); ++k) {
            int r = groups[i][k];
            EXPECT_TRUE(seen.insert(r).second) << "rank twice along " << mesh_dim_name(d);
            EXPECT_EQ(m.group_index(d, r), static_cast<int>(i));
            EXPECT_EQ(m.coord(r)[d], static_cast<int>(k));
          }
        EXPECT_EQ(seen.size(), 12u);
      }
    }
}

TEST(DeviceMesh, RejectsBadSizes) {
  EXPECT_THROW(DeviceMesh(8, 3, 2, 1), Error);
  EXPECT_THROW(DeviceMesh(0, 0, 1, 1), Error);
  DeviceMesh m(4, 1, 4, 1);
  EXPECT_THROW(m.coord(4), Error);
}

TEST(ProcessGroups, SplitsTheLocalWorldAlongTheMesh) {
  DeviceMesh mesh(8, 2, 2, 2);
  auto errors = run_local_ranks(8, [&](Backend& world) {
    ProcessGroups g = make_process_groups(world, mesh);
    for (MeshDim d : {MeshDim::kTp, MeshDim::kDp, MeshDim::kPp}) {
      Backend& b = g.group(d);
      std::vector<int> expect = mesh.group_ranks(d, world.rank());
      ASSERT_EQ(b.size(), static_cast<int>(expect.size()));
      EXPECT_EQ(b.rank(), mesh.coord(world.rank())[d]);
      // The group's members are who the mesh says: gather the world ranks.
      float me = static_cast<float>(world.rank());
      std::vector<float> got(b.size());
      b.all_gather(got.data(), &me, 1, DType::kF32, {})->wait();
      for (size_t i = 0; i < expect.size(); ++i) EXPECT_EQ(got[i], static_cast<float>(expect[i]));
    }
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace mt::comm
