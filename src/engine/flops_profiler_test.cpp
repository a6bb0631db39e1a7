// The flops profiler's report and config block: a real step of a tiny GPT-2 through the engine,
// its report parsed back (module latencies fit in the step's forward latency, shares of params and
// MACs over the blocks, embedding and head add up to 100%, FLOPs = 3 x forward), module_depth and
// top_modules change what is printed, and the block's keys are DeepSpeed's with its defaults.
#include "engine/flops_profiler.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/engine.h"

namespace mt::engine {
namespace {

nlohmann::json tiny_config(const nlohmann::json& profiler) {
  auto j = nlohmann::json::parse(R"({
    "model": {"model_type": "gpt2", "vocab_size": 97, "n_positions": 32, "n_embd": 48, "n_layer": 2, "n_head": 4},
    "seq_length": 16, "train_iters": 3, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}
  })");
  j["flops_profiler"] = profiler;
  return j;
}

// "1.23 M" / "4.56 GMACs" / "7.890 ms" / "12.00%" -> the number in base units (seconds, counts).
double parse_value(const std::string& text) {
  std::istringstream in(text);
  double v = 0.0;
  std::string unit;
  in >> v >> unit;
  if (unit == "s") return v;
  if (unit == "ms") return v * 1e-3;
  if (unit == "us") return v * 1e-6;
  const std::string prefixes = "KMGTP";
  size_t k = unit.empty() ? std::string::npos : prefixes.find(unit[0]);
  return k == std::string::npos ? v : v * std::pow(1000.0, static_cast<double>(k + 1));
}

// The value of a summary line "label: value".
double summary_value(const std::string& report, const std::string& label) {
  size_t at = report.find("\n" + label + ":");
  EXPECT_NE(at, std::string::npos) << label;
  if (at == std::string::npos) return NAN;
  size_t end = report.find('\n', at + 1);
  std::string l = report.substr(at + 1, end - at - 1);
  return parse_value(l.substr(label.size() + 1));
}

// A detailed-profile line's fields: "name (Kind): P = p% params, M = m% MACs, fwd F = f% latency,
// R, bwd ...".
struct Row {
  int depth = 0;
  std::string name;
  double params = 0, params_pct = 0, macs = 0, macs_pct = 0, fwd = 0, fwd_pct = 0, bwd = 0;
};

std::vector<Row> detailed_rows(const std::string& report) {
  static const std::regex kRow(
      R"(^( *)(\S+) \((\w+)\): ([\d.]+(?: \w+)?) = ([\d.]+)% params, ([\d.]+ \w+) = ([\d.]+)% MACs, )"
      R"(fwd ([\d.]+ \w+) = ([\d.]+)% latency, [^,]+, bwd ([\d.]+ \w+) = ([\d.]+)% latency)");
  std::vector<Row> rows;
  size_t at = report.find("Detailed profile per GPU");
  if (at == std::string::npos) return rows;
  std::istringstream in(report.substr(at));
  std::string l;
  std::smatch m;
  while (std::getline(in, l)) {
    if (!std::regex_search(l, m, kRow)) continue;
    Row r;
    r.depth = static_cast<int>(m[1].length()) / 2;
    r.name = m[2];
    r.params = parse_value(m[4]);
    r.params_pct = std::stod(m[5]);
    r.macs = parse_value(m[6]);
    r.macs_pct = std::stod(m[7]);
    r.fwd = parse_value(m[8]);
    r.fwd_pct = std::stod(m[9]);
    r.bwd = parse_value(m[10]);
    rows.push_back(r);
  }
  return rows;
}

struct ProfiledStep {
  std::string report;
  double step_flops = 0.0;
};

// peak_tflops: the peak MFU is taken against (0: none, MFU not reported).
ProfiledStep profile_one_step(const nlohmann::json& profiler, double peak_tflops = 0.25) {
  RunConfig c = ds_config_parse(tiny_config(profiler), "test");
  auto model = engine_build_model(c);
  Engine eng(c, *model);
  std::vector<int32_t> tok(32), tgt(32);
  for (size_t i = 0; i < tok.size(); ++i) {
    tok[i] = static_cast<int32_t>((i * 31) % 97);
    tgt[i] = static_cast<int32_t>((i * 17 + 1) % 97);
  }
  auto next = [&](int32_t* t, int32_t* g) {
    std::copy(tok.begin(), tok.begin() + 32, t);
    std::copy(tgt.begin(), tgt.begin() + 32, g);
  };
  eng.train_batch(next);  // warm-up
  models::ModuleProfile p;
  model->set_profiler(&p);
  StepResult r = eng.train_batch(next);
  model->set_profiler(nullptr);
  ProfiledStep out;
  FlopsProfileStep ps = flops_profile_step(eng, r);
  ps.peak_tflops = peak_tflops;
  ps.peak_what = "test peak";
  out.report = flops_profiler_report(p, ps, c.flops_profiler);
  out.step_flops = model->train_flops_per_step() * 2;  // two micro-batches
  return out;
}

TEST(FlopsProfiler, ReportNumbersAddUp) {
  // A test peak of 1 GFLOP/s: MFU is printed to 0.1 %, and this tiny model's step on a loaded
  // 2-core machine (ctest -j2 beside MPI tests) rounded to 0.0 % of 0.25 TFLOP/s.
  ProfiledStep s = profile_one_step({{"enabled", true}}, 1.0);
  const std::string& rep = s.report;
  EXPECT_NE(rep.find("Profile of step 2"), std::string::npos) << rep;
  const double fwd_latency = summary_value(rep, "fwd latency");
  const double fwd_flops = summary_value(rep, "fwd flops per GPU");
  EXPECT_GT(fwd_latency, 0.0);
  EXPECT_DOUBLE_EQ(summary_value(rep, "batch size per GPU"), 2.0);
  EXPECT_NEAR(summary_value(rep, "params per GPU"), summary_value(rep, "params of model"), 0.01e3);
  // One micro-batch's, as DeepSpeed reports them (the two micro-batches' were summed): 3 x forward
  // = train_flops_per_step + the diagonal (T(T+1)/2 vs T²/2 pairs: 6 L B C T) - the biases and norm
  // weights it counts (6 N (13 C L + 2 C)), plus the masked half of the score matrix that
  // DeepSpeed's attention rules count (T² pairs, not T(T+1)/2: 3 · 4 B C L T(T-1)/2); printed to 3
  // digits.
  const double per_micro = 6.0 * 2 * 2 * 48 * 16 - 6.0 * 32 * (13.0 * 48 * 2 + 2 * 48);
  const double masked = 3.0 * 4.0 * 2 * 48 * 2 * (16.0 * 15.0 / 2.0);
  EXPECT_NEAR(3.0 * fwd_flops, s.step_flops / 2 + per_micro + masked, 0.005 * s.step_flops);
  EXPECT_NEAR(summary_value(rep, "fwd MACs per GPU"), fwd_flops / 2, 0.005 * fwd_flops);
  std::vector<Row> rows = detailed_rows(rep);
  ASSERT_GT(rows.size(), 10u) << rep;
  EXPECT_EQ(rows[0].name, "model");
  EXPECT_LE(rows[0].fwd, fwd_latency + 1e-6);
  double params_pct = 0, macs_pct = 0, fwd_pct = 0, fwd = 0;
  for (const Row& r : rows)
    if (r.depth == 1) {
      params_pct += r.params_pct;
      macs_pct += r.macs_pct;
      fwd_pct += r.fwd_pct;
      fwd += r.fwd;
    }
  EXPECT_NEAR(params_pct, 100.0, 0.05);
  EXPECT_NEAR(macs_pct, 100.0, 0.05);
  EXPECT_LE(fwd_pct, 100.0 + 0.05);
  EXPECT_LE(fwd, fwd_latency + 1e-5);
  EXPECT_NE(rep.find("LMHead"), std::string::npos);
  // MFU = the step's FLOPS per GPU over the given peak (1 TFLOP/s), printed to 0.1 %.
  const double flops_per_gpu = summary_value(rep, "FLOPS per GPU = 3 * fwd flops per GPU / iter latency");
  EXPECT_NEAR(summary_value(rep, "peak FLOPS per GPU (test peak)"), 1e12, 1e9);
  // (Printed to 0.1 %: a step slowed by a loaded machine below 0.05 % of the test peak prints 0.0 %,
  // which a check of mfu > 0 took for a failure in CI, stop 77; the speed is not what is tested.)
  const double mfu = summary_value(rep, "MFU = FLOPS per GPU / peak FLOPS per GPU");
  EXPECT_GE(mfu, 0.0);
  EXPECT_NEAR(mfu, 100.0 * flops_per_gpu / 1e12, 0.06 + 0.01 * mfu) << rep;
  // A "peak" the step beat (a ceiling timed on a loaded machine) is said, not printed as an MFU
  // above 100 % (a probe saw 168 %, stop 74). Here 1 MFLOP/s.
  const std::string beaten = profile_one_step({{"enabled", true}}, 1e-6).report;
  EXPECT_EQ(beaten.find("MFU = FLOPS per GPU / peak FLOPS per GPU"), std::string::npos) << beaten;
  EXPECT_NE(beaten.find("not reported: the step ran at "), std::string::npos) << beaten;
  // Without a measured peak MFU is said to be missing, not made up.
  std::string none = profile_one_step({{"enabled", true}}, 0.0).report;
  EXPECT_NE(none.find("\nMFU:"), std::string::npos);
  EXPECT_NE(none.find("not reported: no peak was measured"), std::string::npos) << none;
}

std::vector<std::string> aggregated_lines(const std::string& rep, const std::string& starts) {
  std::vector<std::string> out;
  size_t a = rep.find("Aggregated profile"), b = rep.find("Detailed profile");
  std::istringstream in(rep.substr(a, b == std::string::npos ? std::string::npos : b - a));
  std::string l;
  while (std::getline(in, l))
    if (l.rfind(starts, 0) == 0) out.push_back(l);
  return out;
}

TEST(FlopsProfiler, ModuleDepthAndTopModulesChooseWhatIsPrinted) {
  // Depths of the tree: 0 model, 1 blocks/embedding/norm/head, 2 norms/attention/MLP, 3 their parts.
  // DeepSpeed prints depths 0 to module_depth - 1 (range(depth)), and with -1 all but the deepest.
  std::string all = profile_one_step({{"enabled", true}, {"detailed", false}}).report;
  EXPECT_EQ(aggregated_lines(all, "depth ").size(), 3u) << all;
  EXPECT_EQ(all.find("Detailed profile"), std::string::npos);
  std::string two = profile_one_step({{"enabled", true}, {"module_depth", 2}, {"top_modules", 3}}).report;
  EXPECT_EQ(aggregated_lines(two, "depth ").size(), 2u) << two;
  std::string none = profile_one_step({{"enabled", true}, {"module_depth", -2}, {"detailed", false}}).report;
  EXPECT_EQ(aggregated_lines(none, "depth ").size(), 0u) << none;
  EXPECT_NE(two.find("Detailed profile"), std::string::npos);
  // Depth 1 of top_modules 1: only the biggest kind (the blocks); of 3: three kinds.
  auto params_line = [](const std::string& rep, int depth) {
    std::vector<std::string> p = aggregated_lines(rep, "    params");
    return p.size() > static_cast<size_t>(depth) ? p[depth] : std::string();
  };
  std::string one_kind = params_line(all, 1), three_kinds = params_line(two, 1);
  EXPECT_NE(one_kind.find("Block "), std::string::npos) << one_kind;
  EXPECT_EQ(std::count(one_kind.begin(), one_kind.end(), ','), 0) << one_kind;
  EXPECT_EQ(std::count(three_kinds.begin(), three_kinds.end(), ','), 2) << three_kinds;
}

TEST(FlopsProfiler, RecomputeFactorEntersTheBackwardFlops) {
  std::string rep = profile_one_step({{"enabled", true}, {"recompute_fwd_factor", 1.0}, {"detailed", false}}).report;
  EXPECT_NE(rep.find("bwd FLOPS per GPU = 3 * fwd flops per GPU / bwd latency"), std::string::npos) << rep;
  EXPECT_NE(rep.find("FLOPS per GPU = 4 * fwd flops per GPU / iter latency"), std::string::npos) << rep;
}

TEST(FlopsProfiler, ConfigKeysDefaultsAndRefusals) {
  RunConfig d = ds_config_parse(tiny_config(nlohmann::json::object()), "t");
  EXPECT_FALSE(d.flops_profiler.enabled);
  EXPECT_EQ(d.flops_profiler.profile_step, 1);
  EXPECT_EQ(d.flops_profiler.module_depth, -1);
  EXPECT_EQ(d.flops_profiler.top_modules, 1);
  EXPECT_TRUE(d.flops_profiler.detailed);
  EXPECT_EQ(d.flops_profiler.recompute_fwd_factor, 0.0);
  EXPECT_EQ(d.flops_profiler.output_file, "");
  for (const auto& w : d.warnings) EXPECT_EQ(w.find("flops_profiler"), std::string::npos) << w;
  RunConfig f = ds_config_parse(tiny_config({{"enabled", true}, {"profile_step", 2}, {"module_depth", 2}, {"top_modules", 3},
                                             {"detailed", false}, {"output_file", nullptr}, {"recompute_fwd_factor", 0.5}}),
                                "t");
  EXPECT_TRUE(f.flops_profiler.enabled);
  EXPECT_EQ(f.flops_profiler.profile_step, 2);
  EXPECT_EQ(f.flops_profiler.module_depth, 2);
  EXPECT_EQ(f.flops_profiler.top_modules, 3);
  EXPECT_FALSE(f.flops_profiler.detailed);
  EXPECT_EQ(f.flops_profiler.output_file, "");
  EXPECT_EQ(f.flops_profiler.recompute_fwd_factor, 0.5);
  auto refused = [](const nlohmann::json& block, const std::string& key) {
    try {
      ds_config_parse(tiny_config(block), "t");
      ADD_FAILURE() << "accepted " << block.dump();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("flops_profiler." + key), std::string::npos) << e.what();
    }
  };
  // DeepSpeed reads module_depth and top_modules without a check (they were refused here).
  EXPECT_NO_THROW(ds_config_parse(tiny_config({{"module_depth", -2}, {"top_modules", 0}}), "t"));
  refused({{"top_modules", -1}}, "top_modules");
  refused({{"recompute_fwd_factor", -1}}, "recompute_fwd_factor");
  refused({{"detailed", 1}}, "detailed");
  // Megatron-DeepSpeed's configs say -1 (DeepSpeed never reaches it): accepted, nothing profiled.
  RunConfig never = ds_config_parse(tiny_config({{"enabled", true}, {"profile_step", -1}}), "t");
  ASSERT_FALSE(never.warnings.empty());
  EXPECT_NE(never.warnings.back().find("flops_profiler.profile_step (-1)"), std::string::npos) << never.warnings.back();
  RunConfig late = ds_config_parse(tiny_config({{"enabled", true}, {"profile_step", 4}}), "t");
  ASSERT_FALSE(late.warnings.empty());
  EXPECT_NE(late.warnings.back().find("flops_profiler.profile_step"), std::string::npos);
  RunConfig typo = ds_config_parse(tiny_config({{"enabled", true}, {"top_module", 2}}), "t");
  ASSERT_FALSE(typo.warnings.empty());
  EXPECT_NE(typo.warnings.back().find("did you mean 'top_modules'"), std::string::npos) << typo.warnings.back();
}

TEST(FlopsProfiler, WritesTheOutputFileCreatingItsDirectory) {
  std::string dir = ::testing::TempDir() + "/mt_flops_profiler_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  FlopsProfilerConfig c;
  c.output_file = dir + "/sub/profile.txt";
  EXPECT_EQ(flops_profiler_write("hello\n", c), c.output_file);
  std::ifstream f(c.output_file);
  std::string l;
  std::getline(f, l);
  EXPECT_EQ(l, "hello");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mt::engine
