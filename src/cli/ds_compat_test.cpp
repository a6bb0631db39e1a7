// DeepSpeed compatibility end to end (issue 12): every real ds_config of tests/fixtures/ds_configs
// that passes `config check` bare trains a tiny model through `--deepspeed`, as it is; legacy
// curriculum learning truncates sequences the way Megatron-DeepSpeed does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_test_util.h"

namespace fs = std::filesystem;

namespace {

std::string dir() {
  static std::string d = mt::cli::testing::make_test_dir("mt_ds_compat_test");
  return d;
}

int run(const std::string& args, std::string* out = nullptr, std::string* err = nullptr) {
  return mt::cli::testing::run_meshtrain(dir(), args, out, err);
}

// A tiny GPT-2 as a Hugging Face config.json (what --model takes) and the chain dataset.
void tiny_model_and_data() {
  static bool done = [] {
    std::ofstream(dir() + "/config.json") << R"({"model_type": "gpt2", "vocab_size": 97, "n_positions": 64,
      "n_embd": 32, "n_layer": 2, "n_head": 2})";
    mt::cli::testing::write_chain_dataset(dir() + "/train", 64);
    return true;
  }();
  (void)done;
}

TEST(DeepSpeedFixtures, EveryValidRealConfigTrainsThroughDashDashDeepspeed) {
  tiny_model_and_data();
  int trained = 0, refused = 0;
  for (const auto& e : fs::directory_iterator(std::string(MT_SOURCE_DIR) + "/tests/fixtures/ds_configs")) {
    if (e.path().extension() != ".json") continue;
    const std::string f = e.path().string(), name = e.path().stem().string();
    std::string err;
    if (run("config check " + f, nullptr, &err) != 0) {  // refused: one line naming the key
      EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << name << ": " << err;
      EXPECT_NE(err.find("meshtrain: error: "), std::string::npos) << name << ": " << err;
      ++refused;
      continue;
    }
    // The file as it is; only its batch is made tiny where it asks for thousands of sequences a
    // step (a speed matter for the test, not a change of what the file means).
    nlohmann::json ds = nlohmann::json::parse(std::ifstream(f));
    std::string sets = " --set train_iters=2 --set seq_length=64 --set save_dir=" + dir() + "/ckpt-" + name;
    auto big = [&](const char* k, int64_t most) { return ds.contains(k) && ds[k].is_number() && ds[k].get<int64_t>() > most; };
    if (big("train_batch_size", 8) || big("train_micro_batch_size_per_gpu", 8) || big("gradient_accumulation_steps", 8))
      sets += " --set train_batch_size=2 --set train_micro_batch_size_per_gpu=2 --set gradient_accumulation_steps=1";
    // ZeRO-Infinity's swap goes to the test's directory, not to the file's /nvme_data.
    if (ds.contains("zero_optimization"))
      for (const char* k : {"offload_optimizer", "offload_param"})
        if (ds["zero_optimization"].contains(k) && ds["zero_optimization"][k].value("device", "") == "nvme")
          sets += std::string(" --set zero_optimization.") + k + ".nvme_path=" + dir() + "/swap-" + name;
    std::string out;
    EXPECT_EQ(run("train --deepspeed " + f + " --model " + dir() + "/config.json --data " + dir() + "/train" + sets, &out,
                  &err),
              0)
        << name << ": " << err;
    EXPECT_NE(out.find("step 2/2"), std::string::npos) << name << ": " << out << err;
    ++trained;
  }
  EXPECT_GE(trained, 15);
  std::printf("ds_config fixtures: %d trained through --deepspeed, %d refused by key\n", trained, refused);
}

// Megatron-DeepSpeed's legacy curriculum: a step at difficulty L trains on tokens[:, :L]. With one
// unshuffled sample per step, step 1 at L = 8 of seq_length 16 sees exactly the window a
// seq_length-8 run's step 1 sees: the same loss and gradient norm, bit for bit.
TEST(CurriculumLearning, AStepTrainsOnTheFirstDifficultyTokens) {
  tiny_model_and_data();
  auto cfg = [](const std::string& name, const nlohmann::json& extra) {
    nlohmann::json j = {{"model", dir() + "/config.json"},
                        {"data", {{"train", dir() + "/train"}, {"shuffle", false}}},
                        {"seq_length", 16},
                        {"train_iters", 4},
                        {"train_micro_batch_size_per_gpu", 1},
                        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                        {"steps_per_print", 1}};
    j.update(extra);
    std::string path = dir() + "/" + name + ".json";
    std::ofstream(path) << j.dump();
    return path;
  };
  const nlohmann::json curriculum = {
      {"curriculum_learning",
       {{"enabled", true}, {"curriculum_type", "seqlen"}, {"min_difficulty", 8}, {"max_difficulty", 16},
        {"schedule_type", "fixed_discrete"}, {"schedule_config", {{"difficulty", {8, 12, 16}}, {"max_step", {1, 2}}}}}}};
  std::string err;
  const std::string m_cur = dir() + "/cur.jsonl", m_short = dir() + "/short.jsonl", m_full = dir() + "/full.jsonl";
  ASSERT_EQ(run("train " + cfg("cur", curriculum) + " --metrics " + m_cur, nullptr, &err), 0) << err;
  ASSERT_EQ(run("train " + cfg("short", {{"seq_length", 8}}) + " --metrics " + m_short, nullptr, &err), 0) << err;
  ASSERT_EQ(run("train " + cfg("full", nlohmann::json::object()) + " --metrics " + m_full, nullptr, &err), 0) << err;
  using mt::cli::testing::metric_values;
  EXPECT_EQ(metric_values(m_cur, "curriculum_seqlen"), (std::vector<double>{8, 12, 16, 16}));
  EXPECT_EQ(metric_values(m_cur, "loss")[0], metric_values(m_short, "loss")[0]);
  EXPECT_EQ(metric_values(m_cur, "grad_norm")[0], metric_values(m_short, "grad_norm")[0]);
  EXPECT_NE(metric_values(m_cur, "loss")[0], metric_values(m_full, "loss")[0]);  // not the whole sample
  EXPECT_TRUE(metric_values(m_full, "curriculum_seqlen").empty());
  // The flops profiler counts the profiled step's own length: step 3 trains 16 tokens as the whole
  // run does, and its MACs are the whole run's (it counted step 2's 12, stop 74).
  auto macs = [&](const std::string& name, const nlohmann::json& extra) {
    nlohmann::json with_profile = extra;
    const std::string report = dir() + "/" + name + "-flops.txt";
    with_profile["flops_profiler"] = {{"enabled", true}, {"profile_step", 2}, {"output_file", report}};
    std::string e;
    EXPECT_EQ(run("train " + cfg(name, with_profile), nullptr, &e), 0) << e;
    const std::string text = mt::cli::testing::slurp(report);
    const size_t at = text.find("fwd MACs per GPU:");
    return at == std::string::npos ? text : text.substr(at, text.find('\n', at) - at);
  };
  const std::string cur_macs = macs("cur-fp", curriculum), full_macs = macs("full-fp", nlohmann::json::object());
  EXPECT_EQ(cur_macs.rfind("fwd MACs per GPU:", 0), 0u) << cur_macs;
  EXPECT_EQ(cur_macs, full_macs);
}

// min_difficulty 4 with difficulty_step 8 gave 0 tokens at step 1 (DeepSpeed's older rounding) and
// was refused; DeepSpeed now raises it to the first multiple of the step, 8, and so does meshtrain
// (stop 74). A max_difficulty past seq_length is refused before training.
TEST(CurriculumLearning, AScheduleStartsAtMinDifficultysFirstMultipleAndTooLongIsRefused) {
  tiny_model_and_data();
  nlohmann::json j = {{"model", dir() + "/config.json"},
                      {"data", {{"train", dir() + "/train"}}},
                      {"seq_length", 16},
                      {"train_iters", 4},
                      {"train_micro_batch_size_per_gpu", 1},
                      {"curriculum_learning",
                       {{"enabled", true}, {"curriculum_type", "seqlen"}, {"min_difficulty", 4}, {"max_difficulty", 16},
                        {"schedule_type", "fixed_linear"},
                        {"schedule_config", {{"total_curriculum_step", 100}, {"difficulty_step", 8}}}}}};
  std::ofstream(dir() + "/empty.json") << j.dump();
  std::string err;
  const std::string metrics = dir() + "/empty.jsonl";
  std::filesystem::remove(metrics);
  ASSERT_EQ(run("train " + dir() + "/empty.json --metrics " + metrics, nullptr, &err), 0) << err;
  EXPECT_EQ(mt::cli::testing::metric_values(metrics, "curriculum_seqlen"), (std::vector<double>{8, 8, 8, 8}));
  j["curriculum_learning"]["max_difficulty"] = 32;
  j["curriculum_learning"]["min_difficulty"] = 8;
  std::ofstream(dir() + "/long.json") << j.dump();
  EXPECT_EQ(run("train " + dir() + "/long.json", nullptr, &err), 2);
  EXPECT_NE(err.find("curriculum_learning.max_difficulty (32) exceeds seq_length (16)"), std::string::npos) << err;
}

// DeepSpeed's sparse_attention block in a training run: the fixed layout changes what is trained
// (a query no longer sees every earlier block), the dense layout is the causal attention, and tensor
// parallelism, which gives each rank whole heads with their own layouts, equals one process.
TEST(SparseAttention, TrainsAndEveryLayoutEqualsOneProcess) {
  tiny_model_and_data();
  auto cfg = [](const std::string& name, const nlohmann::json& extra) {
    nlohmann::json j = {{"model", {{"model_type", "gpt2"}, {"vocab_size", 97}, {"n_positions", 64}, {"n_embd", 32},
                                   {"n_layer", 2}, {"n_head", 4}}},
                        {"data", {{"train", dir() + "/train"}}},
                        {"seq_length", 64},
                        {"train_iters", 3},
                        {"train_batch_size", 4},
                        {"train_micro_batch_size_per_gpu", 2},
                        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                        {"steps_per_print", 1}};
    j.update(extra);
    std::string path = dir() + "/" + name + ".json";
    std::ofstream(path) << j.dump();
    return path;
  };
  const nlohmann::json fixed = {{"sparse_attention",
                                 {{"mode", "fixed"}, {"block", 8}, {"num_local_blocks", 4}, {"num_global_blocks", 1},
                                  {"different_layout_per_head", true}, {"num_different_global_patterns", 4},
                                  {"attention", "unidirectional"}}}};
  const nlohmann::json dense = {{"sparse_attention", {{"mode", "dense"}, {"block", 16}}}};
  using mt::cli::testing::metric_values;
  auto losses = [&](const std::string& name, const std::string& cmd) {
    std::string err;
    const std::string m = dir() + "/" + name + ".jsonl";
    fs::remove(m);
    EXPECT_EQ(run(cmd + " --metrics " + m, nullptr, &err), 0) << name << ": " << err;
    return metric_values(m, "loss");
  };
  const auto causal = losses("causal", "train " + cfg("causal", nlohmann::json::object()));
  const auto one = losses("fixed1", "train " + cfg("fixed1", fixed));
  const auto tp2 = losses("fixed-tp2", "launch -n 2 -- train " + cfg("fixed-tp2", fixed) + " --set parallel.tp=2");
  const auto dp2 = losses("fixed-dp2", "launch -n 2 -- train " + cfg("fixed-dp2", fixed));
  const auto all = losses("dense", "train " + cfg("dense", dense));
  ASSERT_EQ(one.size(), 3u);
  ASSERT_EQ(tp2.size(), 3u);
  ASSERT_EQ(dp2.size(), 3u);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_NE(one[0], causal[0]);  // the layout is applied
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(tp2[i], one[i], 1e-5 * one[i]) << "tp2 step " << i + 1;
    EXPECT_NEAR(dp2[i], one[i], 1e-5 * one[i]) << "dp2 step " << i + 1;
    EXPECT_NEAR(all[i], causal[i], 1e-5 * causal[i]) << "dense layout step " << i + 1;
  }
}

// DeepSpeed's csv_monitor (here inside monitor_config, as LLaMA-Factory's configs carry it): one
// CSV per event named as DeepSpeed names it, stepped in samples, at the points DeepSpeed's engine
// writes them: the loss at the samples before its step (it was after), the lr after the scheduler
// has stepped (the next step's: the step's own was written), values as Python's repr (0.0003,
// not to_chars' 3e-04).
TEST(CsvMonitor, WritesDeepSpeedsEventFiles) {
  tiny_model_and_data();
  nlohmann::json j = {{"model", dir() + "/config.json"},
                      {"data", {{"train", dir() + "/train"}}},
                      {"seq_length", 16},
                      {"train_iters", 3},
                      {"train_batch_size", 4},
                      {"train_micro_batch_size_per_gpu", 2},
                      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.0003}}}}},
                      {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 4}, {"warmup_max_lr", 0.0003},
                                                                        {"warmup_type", "linear"}}}}},
                      {"monitor_config", {{"enabled", true}, {"tag", "DeepSpeedMonitor"},
                                          {"csv_monitor", {{"enabled", true}, {"output_path", dir() + "/csv"}, {"job_name", "job"}}}}}};
  std::ofstream(dir() + "/csv.json") << j.dump();
  std::string err;
  const std::string m = dir() + "/csv.jsonl";
  ASSERT_EQ(run("train " + dir() + "/csv.json --metrics " + m, nullptr, &err), 0) << err;
  EXPECT_EQ(err.find("monitor_config"), std::string::npos) << "implemented, not warned about: " << err;
  const std::string loss_csv = mt::cli::testing::slurp(dir() + "/csv/job/Train_Samples_train_loss.csv");
  const std::vector<double> loss = mt::cli::testing::metric_values(m, "loss");
  ASSERT_EQ(loss.size(), 3u);
  std::istringstream in(loss_csv);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "step,train_loss\r");
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(std::getline(in, line)) << loss_csv;
    EXPECT_EQ(line.substr(0, line.find(',')), std::to_string(4 * i));  // samples before the step
    EXPECT_NEAR(std::stod(line.substr(line.find(',') + 1)), loss[i], 1e-6 * loss[i]);
  }
  // WarmupLR linear over 4 steps to 3e-4 (DeepSpeed's iterations -1, 0, 1, 2: steps 1-3 train at
  // 0, 0, 7.5e-05); written after each step, the next step's: 0, 7.5e-05, 0.00015 at samples 4, 8,
  // 12 (the step's own was written: 0, 0, 7.5e-05).
  EXPECT_EQ(mt::cli::testing::slurp(dir() + "/csv/job/Train_Samples_lr.csv"),
            "step,lr\r\n4,0.0\r\n8,7.5e-05\r\n12,0.00015\r\n");
  EXPECT_FALSE(fs::exists(dir() + "/csv/job/Train_Samples_loss_scale.csv"));  // fp16 only
  // Off when monitor_config is off, whatever csv_monitor says.
  j["monitor_config"]["enabled"] = false;
  j["monitor_config"]["csv_monitor"]["job_name"] = "off";
  std::ofstream(dir() + "/csv-off.json") << j.dump();
  ASSERT_EQ(run("train " + dir() + "/csv-off.json", nullptr, &err), 0) << err;
  EXPECT_FALSE(fs::exists(dir() + "/csv/off"));
  // A full disk (the loss file is /dev/full: every write ENOSPC): the rows were lost without a word
  // (checked before the stream was flushed), exit 0; now one line, and the run goes on.
  j["monitor_config"]["enabled"] = true;
  j["monitor_config"]["csv_monitor"]["job_name"] = "full";
  fs::create_directories(dir() + "/csv/full");
  fs::create_symlink("/dev/full", dir() + "/csv/full/Train_Samples_train_loss.csv");
  std::ofstream(dir() + "/csv-full.json") << j.dump();
  ASSERT_EQ(run("train " + dir() + "/csv-full.json", nullptr, &err), 0) << err;
  EXPECT_NE(err.find("warning: csv_monitor: cannot write " + dir() + "/csv/full/Train_Samples_train_loss.csv at step 0 (No space "
                     "left on device); the run goes on without it"),
            std::string::npos)
      << err;
  // An output_path that is a file: bad input, said before any work (exit 1 after the model).
  std::ofstream(dir() + "/csv-file") << "x";
  j["monitor_config"]["csv_monitor"]["output_path"] = dir() + "/csv-file";
  std::ofstream(dir() + "/csv-bad.json") << j.dump();
  EXPECT_EQ(run("train " + dir() + "/csv-bad.json", nullptr, &err), 2) << err;
  EXPECT_NE(err.find("csv_monitor: cannot create " + dir() + "/csv-file/full"), std::string::npos) << err;
  EXPECT_EQ(err.find("model "), std::string::npos) << err;
}

}  // namespace
