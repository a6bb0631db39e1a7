// Cluster descriptions (planner/cluster.h): the shipped JSONs parse, a bad one is refused by key,
// and the calibration they make times GEMMs by the stated efficiency curve and collectives by the
// textbook ring over the link the group's placement uses (intra-host when it fits in one host).
#include "planner/cluster.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "base/error.h"
#include "models/tiny_model_test_util.h"
#include "planner/cost.h"

namespace mt::planner {
namespace {

nlohmann::json load(const std::string& name) {
  std::ifstream f(std::string(MT_SOURCE_DIR) + "/configs/clusters/" + name);
  return nlohmann::json::parse(f);
}

TEST(Cluster, TheShippedDescriptionsParse) {
  const ClusterSpec a = parse_cluster(load("dgx-a100-80gb.json"), "a100");
  EXPECT_EQ(a.devices_per_host, 8);
  EXPECT_EQ(a.peak_bf16_tflops, 312);
  EXPECT_EQ(a.memory_gib, 80);
  const ClusterSpec h = parse_cluster(load("dgx-h100.json"), "h100");
  EXPECT_EQ(h.peak_bf16_tflops, 989);
  EXPECT_GT(h.inter_gbs, a.inter_gbs);
}

TEST(Cluster, AMissingOrBadFigureIsRefusedByKey) {
  nlohmann::json j = load("dgx-a100-80gb.json");
  j["inter_host"].erase("gbs");
  try {
    parse_cluster(j, "c.json");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("c.json inter_host: 'gbs' must be a positive number"), std::string::npos) << e.what();
  }
  j = load("dgx-a100-80gb.json");
  j["link_efficiency"] = 1.5;
  EXPECT_THROW(parse_cluster(j, "c.json"), Error);
  for (double devices : {2.5, 1e12}) {  // were read as 2, and as an overflowed int
    j = load("dgx-a100-80gb.json");
    j["devices_per_host"] = devices;
    try {
      parse_cluster(j, "c.json");
      FAIL() << devices << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'devices_per_host' must be a whole number of devices"), std::string::npos) << e.what();
    }
  }
}

// The cluster of the tests: round figures.
ClusterSpec round_cluster() {
  nlohmann::json j = load("dgx-a100-80gb.json");
  j["peak_tflops"] = {{"bf16", 100}, {"f32", 10}};
  j["gemm"] = {{"efficiency", 0.5}, {"half_efficiency_gflop", 2}};
  j["intra_host"] = {{"gbs", 200}, {"latency_us", 4}};
  j["inter_host"] = {{"gbs", 20}, {"latency_us", 8}};
  j["link_efficiency"] = 0.5;
  return parse_cluster(j, "round");
}

TEST(Cluster, GemmsFollowTheEfficiencyCurve) {
  const Calibration cal = cluster_calibration(round_cluster());
  // F flops at 100 TFLOP/s x 0.5 x F / (F + 2e9): (F + 2e9) / 5e13 seconds.
  const double F = 2.0 * 4096 * 4096 * 4096;
  EXPECT_NEAR(cal.gemm_seconds(4096, 4096, 4096, DType::kBF16), (F + 2e9) / 5e13, 1e-12);
  EXPECT_NEAR(cal.gemm_seconds(4096, 4096, 4096, DType::kF32), (F + 2e9) / 5e12, 1e-12);
}

TEST(Cluster, CollectivesAreRingsOverTheLinkTheirPlacementUses) {
  const Calibration cal = cluster_calibration(round_cluster());
  const double b = 64e6, intra = 100e9, inter = 10e9;  // the links at 50%
  // 8 adjacent ranks: one host.
  EXPECT_NEAR(cal.collective_seconds("all_reduce", b, 8, 1), 2 * 7 * 4e-6 + 2 * 7.0 / 8 * b / intra, 1e-12);
  EXPECT_NEAR(cal.collective_seconds("all_gather", b, 8, 1), 7 * (4e-6 + b / intra), 1e-12);
  EXPECT_NEAR(cal.collective_seconds("reduce_scatter", b, 4, 2), 3 * (4e-6 + b / intra), 1e-12);
  // 4 ranks 8 apart (a dp group beside tp 8), or 16 adjacent ones: across hosts.
  EXPECT_NEAR(cal.collective_seconds("all_reduce", b, 4, 8), 2 * 3 * 8e-6 + 2 * 3.0 / 4 * b / inter, 1e-12);
  EXPECT_NEAR(cal.collective_seconds("all_reduce", b, 16, 1), 2 * 15 * 8e-6 + 2 * 15.0 / 16 * b / inter, 1e-12);
  EXPECT_NEAR(cal.collective_seconds("send_recv", b, 2, 64), 8e-6 + b / inter, 1e-12);
  EXPECT_EQ(cal.collective_seconds("all_reduce", b, 1, 1), 0.0);
  EXPECT_THROW(cal.collective_seconds("broadcast", b, 2, 1), Error);
}

// A machine calibrated over several hosts: a group within one host takes the "intra" line, one
// across hosts the "inter" line, and a family without shaped lines the world's.
TEST(Cluster, AMeasuredCalibrationTimesEachGroupAtItsShapesLine) {
  Calibration cal;
  cal.fits["all_reduce"] = LinearFit{0.0, 3e-9};
  cal.fits["all_reduce intra"] = LinearFit{1e-6, 1e-9};
  cal.fits["all_reduce inter"] = LinearFit{1e-5, 1e-8};
  cal.fits["all_gather"] = LinearFit{0.0, 2e-9};
  EXPECT_EQ(cal.collective_seconds("all_reduce", 1e6, 2, 1), 3e-3);  // one host: the world's line
  cal.ranks_per_host = 2;
  EXPECT_DOUBLE_EQ(cal.collective_seconds("all_reduce", 1e6, 2, 1), 1e-6 + 1e-3);  // a tp pair in a host
  EXPECT_DOUBLE_EQ(cal.collective_seconds("all_reduce", 1e6, 2, 2), 1e-5 + 1e-2);  // a dp pair across hosts
  EXPECT_DOUBLE_EQ(cal.collective_seconds("all_gather", 1e6, 2, 2), 2e-3);         // no shaped line
}

// Timed on a world of 8, a smaller group is priced at the ring's share of the world's line: a
// rank of an all_reduce moves 2(n-1)/n of the buffer, of an all_gather n-1 times its bytes.
TEST(Cluster, AGroupSmallerThanTheCalibratedWorldMovesTheRingsShareOfIt) {
  Calibration cal;
  cal.world = 8;
  cal.fits["all_reduce"] = LinearFit{7e-6, 1e-9};
  cal.fits["all_gather"] = LinearFit{7e-6, 2e-9};
  cal.fits["send_recv"] = LinearFit{1e-6, 1e-10};
  const double world_ar = 7e-6 + 1e-9 * 1e6, world_ag = 7e-6 + 2e-9 * 1e6;
  EXPECT_DOUBLE_EQ(cal.collective_seconds("all_reduce", 1e6, 8, 1), world_ar);
  EXPECT_DOUBLE_EQ(cal.collective_seconds("all_reduce", 1e6, 4, 1), world_ar * (2 * 3.0 / 4) / (2 * 7.0 / 8));
  EXPECT_DOUBLE_EQ(cal.collective_seconds("all_reduce", 1e6, 2, 4), world_ar * 1.0 / (2 * 7.0 / 8));
  EXPECT_DOUBLE_EQ(cal.collective_seconds("all_gather", 1e6, 2, 4), world_ag / 7);
  EXPECT_DOUBLE_EQ(cal.collective_seconds("all_gather", 1e6, 4, 1), world_ag * 3 / 7);
  EXPECT_EQ(cal.collective_seconds("all_reduce", 1e6, 1, 1), 0.0);
  EXPECT_DOUBLE_EQ(cal.collective_seconds("send_recv", 1e6, 2, 4), 1e-6 + 1e-4);  // a pair, as timed
  // A size timed as such takes its own line, at any stride (one host).
  cal.fits["all_reduce g4"] = LinearFit{2e-6, 5e-10};
  EXPECT_DOUBLE_EQ(cal.collective_seconds("all_reduce", 1e6, 4, 1), 2e-6 + 5e-4);
  EXPECT_DOUBLE_EQ(cal.collective_seconds("all_reduce", 1e6, 4, 2), 2e-6 + 5e-4);
  EXPECT_DOUBLE_EQ(cal.collective_seconds("all_reduce", 1e6, 2, 1), world_ar * 1.0 / (2 * 7.0 / 8));
}

TEST(Cluster, TheCostModelPutsTheTpGroupInTheHostAndTheDpGroupAcrossHosts) {
  const Calibration cal = cluster_calibration(round_cluster());
  StepShape s;
  s.model = models::tiny(models::Arch::kGpt2);  // C = 32, 4 heads: tp 8 splits only the MLP evenly
  s.model.n_head = 8;
  s.model.n_kv_head = 8;
  s.model.vocab_size = 1024;
  s.micro_batch = 2;
  s.seq_length = 16;
  s.compute = DType::kBF16;
  s.tp = 8;
  s.world = 4;
  const ZeroStepCosts c = zero_step_costs(s, cal);
  // A block's forward: two all-reduces of N x C f32 over the 8 tp ranks of a host.
  const double full = 4.0 * 2 * 16 * 32;
  ASSERT_EQ(c.tp_forward[1].size(), 2u);
  EXPECT_NEAR(c.tp_forward[1][0], cal.collective_seconds("all_reduce", full, 8, 1), 1e-15);
  EXPECT_LT(c.tp_forward[1][0], 2 * 7 * 4e-6 + 2 * 7.0 / 8 * full / 100e9 + 1e-15);
  // The dp group: 4 ranks 8 apart, across hosts.
  EXPECT_NEAR(c.all_reduce(1e6), 2 * 3 * 8e-6 + 2 * 3.0 / 4 * 1e6 / 10e9, 1e-15);
  EXPECT_NEAR(c.send_recv(1e6), 8e-6 + 1e6 / 10e9, 1e-15);
}

}  // namespace
}  // namespace mt::planner
