// `meshtrain calibrate` end to end: the JSON it writes, its reuse on the same binary and machine,
// and the collectives' lines under `meshtrain launch -n 2`.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "cli/cli_test_util.h"

namespace {

std::string dir() {
  static std::string d = mt::cli::testing::make_test_dir("mt_calibrate_test");
  return d;
}

nlohmann::json load(const std::string& path) { return nlohmann::json::parse(mt::cli::testing::slurp(path)); }

TEST(Calibrate, WritesTheFitsAndReusesThemOnTheSameMachine) {
  const std::string cal = dir() + "/cal.json";
  std::string out, err;
  ASSERT_EQ(mt::cli::testing::run_meshtrain(dir(), "calibrate --quick -o " + cal, &out, &err), 0) << err;
  EXPECT_NE(out.find("calibrated 1 rank(s)"), std::string::npos) << out;
  nlohmann::json j = load(cal);
  EXPECT_EQ(j["world"], 1);
  EXPECT_TRUE(j["fingerprint"].contains("binary_mtime"));
  for (const char* family : {"gemm f32", "gemm bf16", "memory", "adamw"}) {
    ASSERT_TRUE(j["fits"].contains(family)) << j.dump();
    EXPECT_GT(j["fits"][family]["per_unit_s"].get<double>(), 0.0) << family;
  }
  EXPECT_FALSE(j["fits"].contains("all_reduce"));
  EXPECT_EQ(j["points"].size(), 12u);
  // Same binary, machine, threads and ranks: reused, not measured again.
  ASSERT_EQ(mt::cli::testing::run_meshtrain(dir(), "calibrate --quick -o " + cal, &out, &err), 0) << err;
  EXPECT_NE(out.find("calibration up to date"), std::string::npos) << out;
  // Another fingerprint (as after a rebuild): measured again.
  j["fingerprint"]["binary_mtime"] = 1;
  std::ofstream(cal) << j.dump();
  ASSERT_EQ(mt::cli::testing::run_meshtrain(dir(), "calibrate --quick -o " + cal, &out, &err), 0) << err;
  EXPECT_NE(out.find("calibrated 1 rank(s)"), std::string::npos) << out;
  EXPECT_NE(load(cal)["fingerprint"]["binary_mtime"], 1);
}

TEST(Calibrate, TwoRanksTimeEveryCollective) {
  const std::string cal = dir() + "/cal2.json";
  std::string out, err;
  ASSERT_EQ(mt::cli::testing::run_meshtrain(dir(), "launch -n 2 -- calibrate --quick -o " + cal, &out, &err), 0) << err;
  const nlohmann::json j = load(cal);
  EXPECT_EQ(j["world"], 2);
  for (const char* family : {"all_reduce", "all_gather", "reduce_scatter", "send_recv"}) {
    ASSERT_TRUE(j["fits"].contains(family)) << j.dump();
    EXPECT_GT(j["fits"][family]["per_unit_s"].get<double>(), 0.0) << family;
  }
}

}  // namespace
