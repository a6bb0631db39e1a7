// meshtrain train end to end: a tiny GPT-2 on a generated indexed dataset; stopping and resuming
// from a checkpoint continues the loss curve bit for bit; bad input exits 2 with one line.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/indexed_dataset.h"

namespace fs = std::filesystem;

namespace {

std::string dir() {
  static std::string d = [] {
    std::string p = ::testing::TempDir() + "/mt_train_test";
    fs::remove_all(p);
    fs::create_directories(p);
    return p;
  }();
  return d;
}

void write_dataset(const std::string& prefix, int docs) {
  mt::data::IndexedDatasetWriter w(prefix, 97);
  for (int d = 0; d < docs; ++d) {
    std::vector<int32_t> seq;
    int32_t tok = d % 97;
    for (int i = 0; i < 40; ++i) {  // a deterministic chain: next = 5 cur + 3 (mod 97), learnable
      seq.push_back(tok);
      tok = (tok * 5 + 3) % 97;
    }
    w.add_sequence(seq);
    w.end_document();
  }
  w.finalize();
}

std::string write_config(const std::string& name, const nlohmann::json& extra) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "model": {"model_type": "gpt2", "vocab_size": 97, "n_positions": 32, "n_embd": 48, "n_layer": 2, "n_head": 4},
    "seq_length": 16, "train_iters": 6, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "gradient_clipping": 1.0,
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 2, "warmup_max_lr": 0.01, "total_num_steps": 6}},
    "steps_per_print": 1, "save_interval": 3
  })");
  j["data"] = {{"train", dir() + "/train"}, {"valid", dir() + "/train"}, {"shuffle", true}};
  j["save_dir"] = dir() + "/ckpt-" + name;
  j["eval_interval"] = 3;
  j["eval_iters"] = 2;
  if (extra.is_object()) j.update(extra);
  std::string path = dir() + "/" + name + ".json";
  std::ofstream(path) << j.dump();
  return path;
}

int run(const std::string& args, std::string* err = nullptr) {
  std::string errfile = dir() + "/stderr.txt";
  int rc = std::system((std::string(MT_MESHTRAIN_BIN) + " " + args + " > " + dir() + "/stdout.txt 2> " + errfile).c_str());
  if (err) {
    std::ifstream f(errfile);
    std::stringstream ss;
    ss << f.rdbuf();
    *err = ss.str();
  }
  return WEXITSTATUS(rc);
}

std::vector<double> losses(const std::string& metrics) {
  std::vector<double> out;
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

TEST(Train, ResumeContinuesTheLossCurveBitForBit) {
  write_dataset(dir() + "/train", 30);
  std::string cfg = write_config("a", nlohmann::json::object());
  ASSERT_EQ(run("train " + cfg + " --metrics " + dir() + "/full.jsonl"), 0);
  std::vector<double> full = losses(dir() + "/full.jsonl");
  ASSERT_EQ(full.size(), 6u);
  EXPECT_LT(full[5], full[0]);
  ASSERT_TRUE(fs::exists(dir() + "/ckpt-a/step-3/model.safetensors"));
  ASSERT_EQ(run("train " + cfg + " --resume " + dir() + "/ckpt-a/step-3 --set save_dir=" + dir() +
                "/ckpt-b --metrics " + dir() + "/resumed.jsonl"), 0);
  std::vector<double> resumed = losses(dir() + "/resumed.jsonl");
  ASSERT_EQ(resumed.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(resumed[i], full[3 + i]) << "step " << 4 + i;
}

TEST(Train, BadInputIsOneLineAndExitTwo) {
  std::string err;
  EXPECT_EQ(run("train " + dir() + "/missing.json", &err), 2);
  EXPECT_NE(err.find("missing.json"), std::string::npos);
  std::string cfg = write_config("c", {{"zero_optimization", {{"stage", 3}}}});
  EXPECT_EQ(run("train " + cfg, &err), 2);
  EXPECT_NE(err.find("zero_optimization.stage"), std::string::npos) << err;
  cfg = write_config("d", {{"data", {{"train", dir() + "/nothing"}}}});
  EXPECT_EQ(run("train " + cfg, &err), 2);
  EXPECT_NE(err.find("nothing"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

}  // namespace

namespace {

TEST(Tokenize, TextToIndexedDatasetAndEncodeDecodeRoundTrip) {
  std::string txt = dir() + "/corpus.txt";
  std::ofstream(txt) << "The cat sat on the mat.\nIt was happy.\n\nThe dog sat on the log.\n\nCats and dogs.\n";
  ASSERT_EQ(run("tokenize " + txt + " -o " + dir() + "/corpus --train-bpe 270"), 0);
  mt::data::IndexedDataset ds(dir() + "/corpus");
  EXPECT_EQ(ds.num_documents(), 3u);
  std::ofstream(dir() + "/in.jsonl") << "\"The cat sat on the log.\"\n\"caf\\u00e9 \\ud83d\\ude00\"\n";
  ASSERT_EQ(run("tokenizer encode " + dir() + "/corpus.tokenizer.json < " + dir() + "/in.jsonl"), 0);
  fs::copy_file(dir() + "/stdout.txt", dir() + "/ids.jsonl", fs::copy_options::overwrite_existing);
  ASSERT_EQ(run("tokenizer decode " + dir() + "/corpus.tokenizer.json < " + dir() + "/ids.jsonl"), 0);
  std::ifstream out(dir() + "/stdout.txt");
  std::string a, b;
  std::getline(out, a);
  std::getline(out, b);
  EXPECT_EQ(nlohmann::json::parse(a).get<std::string>(), "The cat sat on the log.");
  EXPECT_EQ(nlohmann::json::parse(b).get<std::string>(), "caf\xc3\xa9 \xf0\x9f\x98\x80");
  std::string err;
  EXPECT_EQ(run("tokenize " + dir() + "/absent.txt -o " + dir() + "/x --train-bpe 300", &err), 2);
  EXPECT_NE(err.find("absent.txt"), std::string::npos);
}

}  // namespace
