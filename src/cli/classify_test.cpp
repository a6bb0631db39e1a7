// Sequence classification end to end through the binary: `train` with "task": "classification"
// (validation accuracy, the top-k checkpoints by val_acc, the epoch progress lines), `predict`
// (its accuracy equals the run's last val_acc), two data-parallel ranks equal to one process, and
// bad input as one line with exit code 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include "base/file_io.h"
#include "cli/cli_test_util.h"
#include "data/token_stream.h"
#include "data/tokenizer.h"
#include "engine/checkpoint_io.h"

namespace fs = std::filesystem;

namespace {

std::string dir() {
  static std::string d = mt::cli::testing::make_test_dir("mt_classify_test");
  return d;
}

int run(const std::string& args, std::string* out = nullptr, std::string* err = nullptr) {
  return mt::cli::testing::run_meshtrain(dir(), args, out, err);
}

// A sentence of 3 to 7 words of a small vocabulary drawn from seed; counts[w] += each word's uses.
std::string random_sentence(uint64_t* seed, std::map<std::string, int>* counts) {
  static const std::vector<std::string> words = {"the", "cat", "dog", "sat", "on", "mat", "log", "bird", "sang", "tree"};
  std::string s;
  const int len = 3 + static_cast<int>(mt::data::splitmix64_next(seed) % 5);
  for (int i = 0; i < len; ++i) {
    const std::string& w = words[mt::data::splitmix64_next(seed) % words.size()];
    ++(*counts)[w];
    s += (i ? " " : "") + w;
  }
  return s;
}

// Sentence pairs over a small vocabulary; label 1 when both or neither sentence holds "cat" (a
// rule a small model learns in a few hundred steps), as strings, as CLUE's files have them.
void write_records(const std::string& path, int n, uint64_t seed) {
  std::ofstream f(path);
  for (int i = 0; i < n; ++i) {
    std::map<std::string, int> ca, cb;
    const std::string a = random_sentence(&seed, &ca), b = random_sentence(&seed, &cb);
    f << nlohmann::json{{"id", i}, {"sentence1", a}, {"sentence2", b}, {"label", (ca["cat"] > 0) == (cb["cat"] > 0) ? "1" : "0"}}.dump()
      << "\n";
  }
}

std::string setup() {
  static bool done = false;
  if (!done) {
    write_records(dir() + "/train.jsonl", 1200, 1);
    write_records(dir() + "/dev.jsonl", 200, 2);
    std::string corpus = mt::cli::testing::slurp(dir() + "/train.jsonl");
    mt::data::Tokenizer::train(corpus, 300).save_json(dir() + "/tok.json");
    done = true;
  }
  return dir();
}

std::string write_config(const std::string& name, const nlohmann::json& extra) {
  nlohmann::json j = {
      {"task", "classification"},
      {"model", {{"model_type", "gpt2"}, {"vocab_size", 300}, {"n_positions", 48}, {"n_embd", 64}, {"n_layer", 2}, {"n_head", 4}}},
      {"data", {{"train", setup() + "/train.jsonl"}, {"valid", dir() + "/dev.jsonl"}, {"tokenizer", dir() + "/tok.json"},
                {"texta_name", "sentence1"}, {"textb_name", "sentence2"}, {"label_name", "label"}, {"id_name", "id"}}},
      {"seq_length", 48},
      {"num_train_epochs", 4},
      {"train_micro_batch_size_per_gpu", 16},
      {"gradient_clipping", 1.0},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 2e-3}, {"weight_decay", 0.1}}}}},
      {"scheduler", {{"type", "WarmupDecayLR"}, {"params", {{"warmup_num_steps", 3}, {"total_num_steps", 300}}}}},
      {"eval_interval", 50},
      {"save_interval", 100},
      {"steps_per_print", 25},
      {"save_dir", dir() + "/run-" + name},
      {"model_checkpoint", {{"monitor", "val_acc"}, {"mode", "max"}, {"save_top_k", 2}}}};
  j.update(extra);
  const std::string path = dir() + "/" + name + ".json";
  std::ofstream(path) << j.dump();
  return path;
}

// The same pairs with a value (regression: the "cat"s in the first sentence plus half the "dog"s
// in the second, as numbers and, every third, a string of one) and with a set of labels
// (multi-label: which of cat, dog, bird the pair holds, by name and, every third, by index).
void write_value_records(const std::string& values, const std::string& sets, int n, uint64_t seed) {
  std::ofstream fv(values), fs(sets);
  for (int i = 0; i < n; ++i) {
    std::map<std::string, int> ca, cb;
    const std::string a = random_sentence(&seed, &ca), b = random_sentence(&seed, &cb);
    const double v = ca["cat"] + 0.5 * cb["dog"];
    nlohmann::json label = v;
    if (i % 3 == 0) label = std::to_string(v);
    fv << nlohmann::json{{"id", i}, {"sentence1", a}, {"sentence2", b}, {"label", label}}.dump() << "\n";
    nlohmann::json set = nlohmann::json::array();
    if (ca["cat"] + cb["cat"] > 0) set.push_back(i % 3 == 0 ? nlohmann::json(0) : nlohmann::json("cat"));
    if (ca["dog"] + cb["dog"] > 0) set.push_back("dog");
    if (ca["bird"] + cb["bird"] > 0) set.push_back(i % 3 == 0 ? nlohmann::json(2) : nlohmann::json("bird"));
    fs << nlohmann::json{{"id", i}, {"sentence1", a}, {"sentence2", b}, {"label", set}}.dump() << "\n";
  }
}

// A run's keys for a regression or multi-label problem on those records.
nlohmann::json value_task(const std::string& problem) {
  static bool done = false;
  if (!done) {
    setup();
    write_value_records(dir() + "/train-values.jsonl", dir() + "/train-sets.jsonl", 1200, 1);
    write_value_records(dir() + "/dev-values.jsonl", dir() + "/dev-sets.jsonl", 200, 2);
    done = true;
  }
  const bool reg = problem == "regression";
  nlohmann::json data = {{"train", dir() + (reg ? "/train-values.jsonl" : "/train-sets.jsonl")},
                         {"valid", dir() + (reg ? "/dev-values.jsonl" : "/dev-sets.jsonl")},
                         {"tokenizer", dir() + "/tok.json"}, {"texta_name", "sentence1"}, {"textb_name", "sentence2"}};
  if (!reg) data["labels"] = {"cat", "dog", "bird"};
  nlohmann::json model = {{"model_type", "gpt2"}, {"vocab_size", 300}, {"n_positions", 48}, {"n_embd", 64},
                          {"n_layer", 2}, {"n_head", 4}, {"problem_type", problem}};
  if (!reg) model["num_labels"] = 3;
  return {{"data", data}, {"model", model}};
}

// Trains `problem` on the value records as run `name` (save_dir run-NAME, metrics NAME.jsonl),
// keeping the save_top_k best by `monitor` (mode max) over `epochs` epochs; false (and *err) when
// the run fails.
bool train_value_task(const std::string& name, const std::string& problem, const std::string& monitor, int top_k,
                      int epochs, std::string* out, std::string* err) {
  nlohmann::json j = value_task(problem);
  j["model_checkpoint"] = {{"monitor", monitor}, {"mode", "max"}, {"save_top_k", top_k}};
  j["num_train_epochs"] = epochs;
  const int rc = run("train " + write_config(name, j) + " --metrics " + dir() + "/" + name + ".jsonl", out, err);
  EXPECT_EQ(rc, 0) << *err;
  return rc == 0;
}

TEST(Classify, TrainsKeepsTheTopKAndPredictsWhatValidationMeasured) {
  const std::string cfg = write_config("a", nlohmann::json::object());
  std::string out, err;
  ASSERT_EQ(run("train " + cfg + " --metrics " + dir() + "/a.jsonl", &out, &err), 0) << err;
  // 1200 records / 16 = 75 steps an epoch, 4 epochs.
  EXPECT_NE(err.find("1200 training records"), std::string::npos) << err;
  EXPECT_NE(err.find("300 steps = 4.00 epochs of 75 steps"), std::string::npos) << err;
  // Lightning's progress line.
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(Epoch 3: 100% 75/75 \[\d\d:\d\d<\d\d:\d\d, [0-9.]+it/s, loss=[0-9.e-]+\])")))
      << out;
  const std::vector<double> acc = mt::cli::testing::metric_values(dir() + "/a.jsonl", "val_acc");
  ASSERT_EQ(acc.size(), 6u);  // steps 50, 100, ..., 300
  EXPECT_GT(acc.back(), 0.8) << "the rule is learnable: accuracy well above chance";
  // The two best by val_acc are kept, listed best first, and no other.
  nlohmann::json top = nlohmann::json::parse(mt::cli::testing::slurp(dir() + "/run-a/top_k/top_k.json"));
  ASSERT_EQ(top["best"].size(), 2u);
  std::vector<double> sorted = acc;
  std::sort(sorted.rbegin(), sorted.rend());
  EXPECT_DOUBLE_EQ(top["best"][0]["val_acc"].get<double>(), sorted[0]);
  EXPECT_DOUBLE_EQ(top["best"][1]["val_acc"].get<double>(), sorted[1]);
  int dirs = 0;
  for (const auto& e : fs::directory_iterator(dir() + "/run-a/top_k")) dirs += e.is_directory();
  EXPECT_EQ(dirs, 2);
  for (const auto& e : top["best"]) EXPECT_TRUE(fs::exists(e["path"].get<std::string>()));
  // predict over the validation records gives the accuracy the run measured at its last step. A
  // file named as a fixed temporary beside the output (pred.json.tmp: another run's, the user's) is
  // left alone: predict wrote OUTPUT.tmp and renamed it over the output, taking that file.
  { std::ofstream(dir() + "/pred.json.tmp") << "mine"; }
  ASSERT_EQ(run("predict " + dir() + "/run-a " + dir() + "/dev.jsonl -o " + dir() + "/pred.json", &out, &err), 0) << err;
  EXPECT_EQ(mt::cli::testing::slurp(dir() + "/pred.json.tmp"), "mine");
  char want[64];
  std::snprintf(want, sizeof want, "accuracy %.4f on the 200", acc.back());
  EXPECT_NE(err.find(want), std::string::npos) << err;
  // -o naming a directory: one line before any record is predicted (it predicted every record, then
  // failed with a filesystem error and left DIR.tmp behind).
  fs::create_directories(dir() + "/pred-dir");
  EXPECT_EQ(run("predict " + dir() + "/run-a " + dir() + "/dev.jsonl -o " + dir() + "/pred-dir", &out, &err), 2) << err;
  EXPECT_NE(err.find("pred-dir: is a directory; give a file"), std::string::npos) << err;
  // A label field no record has, named on the command line: refused (no accuracy, exit 0 before).
  EXPECT_EQ(run("predict " + dir() + "/run-a " + dir() + "/dev.jsonl -o " + dir() + "/nope.json --label-name nope", &out, &err), 2);
  EXPECT_NE(err.find("--label-name 'nope': no record of"), std::string::npos) << err;
  EXPECT_EQ(run("predict " + dir() + "/run-a " + dir() + "/dev.jsonl -o " + dir() + "/nope.json --id-name nope", &out, &err), 2);
  EXPECT_NE(err.find("--id-name 'nope': no record of"), std::string::npos) << err;
  for (const auto& e : fs::directory_iterator(dir()))  // no temporary of it (pred-dir.tmp.XXXXXX)
    EXPECT_EQ(e.path().filename().string().rfind("pred-dir.tmp", 0), std::string::npos) << e.path();
  std::ifstream p(dir() + "/pred.json"), truth(dir() + "/dev.jsonl");
  std::string line, record;
  int n = 0;
  double tp = 0, fp = 0, fn = 0, tn = 0;  // label 1 positive
  while (std::getline(p, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j["id"], std::to_string(n));
    ASSERT_EQ(j["probabilities"].size(), 2u);
    EXPECT_NEAR(j["probabilities"][0].get<double>() + j["probabilities"][1].get<double>(), 1.0, 1e-9);
    EXPECT_EQ(j["label"].get<int>(), j["probabilities"][1].get<double>() > j["probabilities"][0].get<double>() ? 1 : 0);
    ASSERT_TRUE(std::getline(truth, record));
    const bool actual = nlohmann::json::parse(record)["label"] == "1", predicted = j["label"].get<int>() == 1;
    (actual ? (predicted ? tp : fn) : (predicted ? fp : tn)) += 1;
    ++n;
  }
  EXPECT_EQ(n, 200);
  // GLUE's F1 (MRPC, QQP) and Matthews' correlation (CoLA) at the last step are the textbook
  // formulas over those predictions: 2TP / (2TP + FP + FN) and
  // (TP·TN − FP·FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)).
  const std::vector<double> f1 = mt::cli::testing::metric_values(dir() + "/a.jsonl", "val_f1"),
                            mcc = mt::cli::testing::metric_values(dir() + "/a.jsonl", "val_mcc");
  ASSERT_EQ(f1.size(), 6u);
  ASSERT_EQ(mcc.size(), 6u);
  EXPECT_NEAR(f1.back(), 2 * tp / (2 * tp + fp + fn), 1e-12) << tp << " " << fp << " " << fn << " " << tn;
  EXPECT_NEAR(mcc.back(), (tp * tn - fp * fn) / std::sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)), 1e-12);
  EXPECT_GT(mcc.back(), 0.5);
}

// Fine-tuning a causal LM as a classifier: {"init_from": checkpoint, "num_labels": 2} takes the
// architecture and trunk from the LM, score.weight starts fresh (one warning); the classifier
// The run's label names go into the export's id2label (it wrote LABEL_i), and predict prints a
// Hugging Face directory's names; GLUE's unlabelled test rows (label -1) are predicted (the file
// was refused: "label -1 is outside [0, 2)"), and refused in training data by name.
TEST(Classify, LabelNamesTravelAndUnlabelledRowsArePredicted) {
  const std::string cfg = write_config("named", {{"num_train_epochs", 1}, {"model_checkpoint", {{"save_top_k", 0}}}});
  nlohmann::json j = nlohmann::json::parse(mt::cli::testing::slurp(cfg));
  j["data"]["labels"] = {"zero", "one"};
  j["data"]["train"] = dir() + "/named-train.jsonl";
  j["data"]["valid"] = dir() + "/named-dev.jsonl";
  for (const char* part : {"train", "dev"}) {
    std::ifstream in(dir() + "/" + part + ".jsonl");
    std::ofstream o(dir() + "/named-" + part + ".jsonl");
    for (std::string line; std::getline(in, line);) {
      nlohmann::json r = nlohmann::json::parse(line);
      r["label"] = r["label"] == "1" ? "one" : "zero";
      o << r.dump() << "\n";
    }
  }
  std::ofstream(cfg) << j.dump();
  std::string out, err;
  ASSERT_EQ(run("train " + cfg, &out, &err), 0) << err;
  ASSERT_EQ(run("export " + dir() + "/run-named --hf " + dir() + "/named-hf", &out, &err), 0) << err;
  nlohmann::json hf = nlohmann::json::parse(mt::cli::testing::slurp(dir() + "/named-hf/config.json"));
  EXPECT_EQ(hf["id2label"], (nlohmann::json{{"0", "zero"}, {"1", "one"}}));
  EXPECT_EQ(hf["label2id"], (nlohmann::json{{"zero", 0}, {"one", 1}}));
  {
    std::ofstream t(dir() + "/glue-test.jsonl");
    t << R"({"id": 7, "sentence1": "the cat sat", "sentence2": "a dog", "label": -1})" << "\n";
    t << R"({"id": 8, "sentence1": "the dog sat", "sentence2": "a dog", "label": "one"})" << "\n";
  }
  ASSERT_EQ(run("predict " + dir() + "/named-hf " + dir() + "/glue-test.jsonl -o " + dir() + "/named.json --tokenizer " + dir() +
                    "/tok.json --texta-name sentence1 --textb-name sentence2",
                &out, &err),
            0)
      << err;
  std::ifstream p(dir() + "/named.json");
  std::string line;
  int n = 0;
  while (std::getline(p, line)) {
    const nlohmann::json r = nlohmann::json::parse(line);
    EXPECT_TRUE(r["label"] == "zero" || r["label"] == "one") << line;
    ++n;
  }
  EXPECT_EQ(n, 2);
  EXPECT_NE(err.find("on the 1 with a label"), std::string::npos) << err;
  // In training data an unlabelled row is an error naming it.
  j["data"]["train"] = dir() + "/glue-test.jsonl";
  j["save_dir"] = dir() + "/run-named-bad";
  std::ofstream(cfg) << j.dump();
  EXPECT_EQ(run("train " + cfg, &out, &err), 2);
  EXPECT_NE(err.find("glue-test.jsonl:1: label -1 (an unlabelled row, as GLUE's test splits mark them)"), std::string::npos) << err;
}

// A LLaMA classifier whose config gives a pad_token_id (its padding row) pads and pools with it, as
// LlamaForSequenceClassification pools at config.pad_token_id, and the export says that id (it
// padded with the end-of-text id and wrote that: a reload froze another row).
TEST(Classify, ALlamaClassifierPadsWithItsPaddingRow) {
  setup();
  const std::string cfg = write_config(
      "llama-pad", {{"model", {{"model_type", "llama"}, {"vocab_size", 300}, {"hidden_size", 32}, {"intermediate_size", 64},
                               {"num_hidden_layers", 1}, {"num_attention_heads", 2}, {"max_position_embeddings", 48},
                               {"num_labels", 2}, {"pad_token_id", 7}}},
                    {"num_train_epochs", 1}, {"model_checkpoint", {{"save_top_k", 0}}}});
  std::string out, err;
  ASSERT_EQ(run("train " + cfg, &out, &err), 0) << err;
  ASSERT_EQ(run("export " + dir() + "/run-llama-pad --hf " + dir() + "/llama-pad-hf", &out, &err), 0) << err;
  nlohmann::json hf = nlohmann::json::parse(mt::cli::testing::slurp(dir() + "/llama-pad-hf/config.json"));
  EXPECT_EQ(hf["architectures"][0], "LlamaForSequenceClassification");
  EXPECT_EQ(hf["pad_token_id"], 7);
}

// exported with --hf is a Hugging Face *ForSequenceClassification directory that predict reads
// to the same answers.
TEST(Classify, FromACausalLmCheckpointAndBackOutAsHuggingFace) {
  setup();
  mt::cli::testing::write_chain_dataset(dir() + "/chain", 40);
  nlohmann::json lm = {{"model", {{"model_type", "gpt2"}, {"vocab_size", 300}, {"n_positions", 48}, {"n_embd", 64},
                                  {"n_layer", 2}, {"n_head", 4}}},
                       {"data", {{"train", dir() + "/chain"}, {"tokenizer", dir() + "/tok.json"}}}, {"seq_length", 32}, {"train_iters", 4},
                       {"train_micro_batch_size_per_gpu", 4}, {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
                       {"save_dir", dir() + "/lm"}, {"save_interval", 4}};
  std::ofstream(dir() + "/lm.json") << lm.dump();
  std::string out, err;
  ASSERT_EQ(run("train " + dir() + "/lm.json", &out, &err), 0) << err;
  const std::string cfg = write_config("ft", {{"model", {{"init_from", dir() + "/lm"}, {"num_labels", 2}}},
                                              {"num_train_epochs", 1}, {"model_checkpoint", {{"save_top_k", 0}}}});
  ASSERT_EQ(run("train " + cfg, &out, &err), 0) << err;
  EXPECT_NE(err.find("has no score.weight (a causal LM): the classification head starts from its initial values"),
            std::string::npos) << err;
  EXPECT_NE(err.find("classifier of 2 labels"), std::string::npos) << err;
  ASSERT_EQ(run("export " + dir() + "/run-ft --hf " + dir() + "/ft-hf", &out, &err), 0) << err;
  nlohmann::json hf = nlohmann::json::parse(mt::cli::testing::slurp(dir() + "/ft-hf/config.json"));
  EXPECT_EQ(hf["architectures"][0], "GPT2ForSequenceClassification");
  EXPECT_EQ(hf["id2label"].size(), 2u);
  // The pad id as Hugging Face's classifiers need it: without one they refuse a batch of two.
  EXPECT_EQ(hf["pad_token_id"], mt::data::Tokenizer::load(dir() + "/tok.json").eot_id());
  std::string a, b;
  ASSERT_EQ(run("predict " + dir() + "/run-ft " + dir() + "/dev.jsonl -o " + dir() + "/p1.json", &out, &err), 0) << err;
  ASSERT_EQ(run("predict " + dir() + "/ft-hf " + dir() + "/dev.jsonl -o " + dir() + "/p2.json --tokenizer " + dir() +
                    "/tok.json --texta-name sentence1 --textb-name sentence2 --batch 7",
                &out, &err),
            0)
      << err;
  std::ifstream f1(dir() + "/p1.json"), f2(dir() + "/p2.json");
  std::string l1, l2;
  int n = 0;
  while (std::getline(f1, l1) && std::getline(f2, l2)) {
    nlohmann::json j1 = nlohmann::json::parse(l1), j2 = nlohmann::json::parse(l2);
    EXPECT_EQ(j1["label"], j2["label"]);
    EXPECT_NEAR(j1["probabilities"][0].get<double>(), j2["probabilities"][0].get<double>(), 1e-4);
    ++n;
  }
  EXPECT_EQ(n, 200);
  // The same fine-tuning on two ranks at ZeRO 3 (the causal LM's trunk loaded into the shards,
  // score.weight fresh) predicts what the one process does.
  const std::string cfg3 = write_config("ft3", {{"model", {{"init_from", dir() + "/lm"}, {"num_labels", 2}}},
                                                {"num_train_epochs", 1}, {"model_checkpoint", {{"save_top_k", 0}}},
                                                {"train_micro_batch_size_per_gpu", 8}, {"zero_optimization", {{"stage", 3}}}});
  ASSERT_EQ(run("launch -n 2 -- train " + cfg3, &out, &err), 0) << err;
  {  // said once, not by each rank that holds the head
    const std::string said = "has no score.weight (a causal LM)";
    size_t n_said = 0;
    for (size_t at = err.find(said); at != std::string::npos; at = err.find(said, at + 1)) ++n_said;
    EXPECT_EQ(n_said, 1u) << err;
  }
  ASSERT_EQ(run("predict " + dir() + "/run-ft3 " + dir() + "/dev.jsonl -o " + dir() + "/p5.json", &out, &err), 0) << err;
  {
    std::ifstream g1(dir() + "/p1.json"), g3(dir() + "/p5.json");
    int m = 0;
    while (std::getline(g1, l1) && std::getline(g3, l2)) {
      const nlohmann::json j1 = nlohmann::json::parse(l1), j3 = nlohmann::json::parse(l2);
      EXPECT_NEAR(j1["probabilities"][0].get<double>(), j3["probabilities"][0].get<double>(), 1e-4) << m;
      ++m;
    }
    EXPECT_EQ(m, 200);
  }
  // A Hugging Face directory does not carry the run's seq_length: --seq-length gives it, and the
  // records cut are said (it cut at n_positions without a word).
  ASSERT_EQ(run("predict " + dir() + "/ft-hf " + dir() + "/dev.jsonl -o " + dir() + "/p3.json --tokenizer " + dir() +
                    "/tok.json --texta-name sentence1 --textb-name sentence2 --seq-length 8",
                &out, &err),
            0)
      << err;
  EXPECT_NE(err.find("records are longer than 8 tokens (--seq-length) and are truncated"), std::string::npos) << err;
  EXPECT_EQ(run("predict " + dir() + "/ft-hf " + dir() + "/dev.jsonl -o " + dir() + "/p4.json --seq-length 4096", &out, &err), 2);
  EXPECT_NE(err.find("more than the model's 48 positions"), std::string::npos) << err;
  // The causal LM's export names its document separator as Hugging Face's bos/eos ids (it named
  // none: Hugging Face takes 50256), and generate stops at a config's eos_token_id (read past).
  ASSERT_EQ(run("export " + dir() + "/lm --hf " + dir() + "/lm-hf", &out, &err), 0) << err;
  nlohmann::json lm_hf = nlohmann::json::parse(mt::cli::testing::slurp(dir() + "/lm-hf/config.json"));
  const int eot = mt::data::Tokenizer::load(dir() + "/tok.json").eot_id();
  EXPECT_EQ(lm_hf["eos_token_id"], eot);
  EXPECT_EQ(lm_hf["bos_token_id"], eot);
  const std::string gen = "generate " + dir() + "/lm-hf --prompt cat --max-new-tokens 5 --temperature 0 --tokenizer " +
                          dir() + "/tok.json";
  ASSERT_EQ(run(gen, &out, &err), 0) << err;
  EXPECT_NE(err.find("+ 5 new tokens"), std::string::npos) << err;
  {  // A prompt one short of the 48 positions: one token comes, and is counted (it said "+ 0"); the
    // context holds the prompt and the answer, as serve counts it (a prompt of 48 drew one more,
    // stop 73: it is refused).
    const mt::data::Tokenizer tok = mt::data::Tokenizer::load(dir() + "/tok.json");
    auto of_length = [&](size_t n) {
      for (std::string p = "cat"; p.size() < 400; p += " cat")
        for (const std::string& q : {p, p + "s", p + " a"})
          if (tok.encode(q).size() == n) return q;
      return std::string();
    };
    const std::string short_one = of_length(47), full = of_length(48);
    ASSERT_FALSE(short_one.empty());
    ASSERT_FALSE(full.empty());
    ASSERT_EQ(run("generate " + dir() + "/lm-hf --prompt '" + short_one + "' --max-new-tokens 5 --temperature 0 --tokenizer " +
                      dir() + "/tok.json",
                  &out, &err),
              0)
        << err;
    EXPECT_NE(err.find("47 prompt + 1 new tokens"), std::string::npos) << err;
    EXPECT_NE(err.find("the context is full at 48 positions"), std::string::npos) << err;
    EXPECT_EQ(run("generate " + dir() + "/lm-hf --prompt '" + full + "' --max-new-tokens 5 --temperature 0 --tokenizer " +
                      dir() + "/tok.json",
                  &out, &err),
              2);
    EXPECT_NE(err.find("the prompt is 48 tokens; the context of 48 leaves no room for an answer"), std::string::npos) << err;
    // serve --context 0 was the default without a word (-5 was refused).
    EXPECT_EQ(run("serve " + dir() + "/lm-hf --port 0 --context 0 --tokenizer " + dir() + "/tok.json", &out, &err), 2);
    EXPECT_NE(err.find("--context"), std::string::npos) << err;
  }
  nlohmann::json all = nlohmann::json::array();
  for (int id = 0; id < 300; ++id) all.push_back(id);
  lm_hf["eos_token_id"] = all;  // every id ends the text at once
  std::ofstream(dir() + "/lm-hf/config.json") << lm_hf.dump();
  ASSERT_EQ(run(gen, &out, &err), 0) << err;
  EXPECT_NE(err.find("+ 0 new tokens"), std::string::npos) << err;
  // generate and serve refuse a classifier (they generated text from the score head, exit 0).
  for (const std::string& model : {dir() + "/run-ft", dir() + "/ft-hf"}) {
    EXPECT_EQ(run("generate " + model + " --prompt cat --max-new-tokens 2 --tokenizer " + dir() + "/tok.json", &out, &err), 2);
    EXPECT_NE(err.find(": a sequence classifier (2 labels), not a language model; generate needs a causal LM"),
              std::string::npos) << err;
    EXPECT_EQ(run("serve " + model + " --port 1 --tokenizer " + dir() + "/tok.json", &out, &err), 2);
    EXPECT_NE(err.find("serve needs a causal LM"), std::string::npos) << err;
  }
}

// Each problem_type: single label (at ZeRO 2 and 3), regression (ZeRO 3) and multi-label (ZeRO 2;
// their label values reach the head through the step's table: the second micro-batch's rows after
// the first's). ZeRO 3 was refused for classification: the head's hooks gather score.weight for
// validation's logits as for training.
TEST(Classify, TwoDataParallelRanksEqualOneProcess) {
  for (const auto& [problem, stage] : std::vector<std::pair<std::string, int>>{{"single_label_classification", 2},
                                                                              {"single_label_classification", 3},
                                                                              {"regression", 3},
                                                                              {"multi_label_classification", 2}}) {
    SCOPED_TRACE(problem + " ZeRO " + std::to_string(stage));
    nlohmann::json short_run = {{"num_train_epochs", 0}, {"train_iters", 12}, {"eval_interval", 6},
                                {"train_micro_batch_size_per_gpu", 4}, {"gradient_accumulation_steps", 2},
                                {"model_checkpoint", {{"save_top_k", 0}}}};
    std::vector<std::string> keys = {"loss", "val_loss", "val_acc"};
    if (problem != "single_label_classification") {
      short_run.update(value_task(problem));
      keys = {"loss", "val_loss", problem == "regression" ? "val_spearmanr" : "val_f1"};
    }
    const std::string tag = problem + "-" + std::to_string(stage);
    const std::string one = write_config("one-" + tag, short_run);
    nlohmann::json two_cfg = short_run;
    two_cfg["train_micro_batch_size_per_gpu"] = 2;
    two_cfg["zero_optimization"] = {{"stage", stage}};
    const std::string two = write_config("two-" + tag, two_cfg);
    std::string err;
    ASSERT_EQ(run("train " + one + " --metrics " + dir() + "/one-" + tag + ".jsonl", nullptr, &err), 0) << err;
    ASSERT_EQ(run("launch -n 2 -- train " + two + " --metrics " + dir() + "/two-" + tag + ".jsonl", nullptr, &err), 0) << err;
    for (const std::string& key : keys) {
      const auto a = mt::cli::testing::metric_values(dir() + "/one-" + tag + ".jsonl", key);
      const auto b = mt::cli::testing::metric_values(dir() + "/two-" + tag + ".jsonl", key);
      ASSERT_EQ(a.size(), key == "loss" ? 12u : 2u) << key;
      ASSERT_EQ(a.size(), b.size()) << key;
      for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * std::max(1.0, std::fabs(a[i]))) << key << " " << i;
    }
  }
}

// Tensor, sequence, pipeline and Ulysses parallelism (were refused): the score head is replicated over the
// tp group (its gradient whole on every rank, its input gradient not summed; sequence parallel
// keeps each rank's rows of it), and validation's logits come from a pipeline's last stage. Every
// layout equals one process, step by step in loss and gradient norm (a head input gradient summed
// over the tp group scales the trunk's gradient, which AdamW's update hides but the norm shows;
// the replicated score.weight counts once in it); predict reads the 4-rank run's checkpoint and
// measures the accuracy that run's last validation did. The "time" partition times the classifier
// itself (it trained the timing model on vocabulary targets, outside the labels).
TEST(Classify, TensorSequenceAndPipelineLayoutsEqualOneProcess) {
  struct Layout {
    std::string name, problem;
    int ranks;
    nlohmann::json parallel, extra;
  };
  const std::vector<Layout> layouts = {
      {"tp2", "single_label_classification", 2, {{"tp", 2}}, {}},
      {"tp2-sp", "single_label_classification", 2, {{"tp", 2}, {"sequence_parallel", true}}, {}},
      {"pp2-time", "regression", 2, {{"pp", 2}, {"partition", "time"}}, {}},
      {"tp2-sp-multi", "multi_label_classification", 2, {{"tp", 2}, {"sequence_parallel", true}}, {}},
      {"pp2-gpipe-multi", "multi_label_classification", 2, {{"pp", 2}, {"pipeline_schedule", "gpipe"}}, {}},
      {"tp2-pp2", "single_label_classification", 4, {{"tp", 2}, {"pp", 2}}, {}},
      // Two data-parallel ranks of 2 records a micro-batch: the one process's global batch of 8.
      {"dp2-tp2", "regression", 4, {{"tp", 2}}, {{"zero_optimization", {{"stage", 1}}}, {"train_micro_batch_size_per_gpu", 2}}},
      // Ulysses (stop 80): the pooled token on one rank of the pair, validation's logits assembled
      // over it, each record's counts and prediction added once.
      {"usp2", "single_label_classification", 2, {{"sp", 2}}, {}},
      {"usp2-multi", "multi_label_classification", 2, {{"sp", 2}}, {}},
      {"usp2-tp2", "regression", 4, {{"sp", 2}, {"tp", 2}}, {}}};
  auto base = [](const std::string& problem) {
    nlohmann::json j = {{"num_train_epochs", 0}, {"train_iters", 12}, {"eval_interval", 6}, {"train_micro_batch_size_per_gpu", 4},
                        {"gradient_accumulation_steps", 2}, {"model_checkpoint", {{"save_top_k", 0}}}};
    if (problem != "single_label_classification") j.update(value_task(problem));
    return j;
  };
  auto keys = [](const std::string& problem) {
    return std::vector<std::string>{"loss", "grad_norm", "val_loss",
                                    problem == "single_label_classification" ? "val_acc"
                                    : problem == "regression"                ? "val_spearmanr"
                                                                             : "val_f1"};
  };
  std::string err;
  for (const std::string problem : {"single_label_classification", "regression", "multi_label_classification"}) {
    const std::string one = write_config("layout-one-" + problem, base(problem));
    ASSERT_EQ(run("train " + one + " --metrics " + dir() + "/layout-one-" + problem + ".jsonl", nullptr, &err), 0) << err;
  }
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name + " " + l.problem);
    nlohmann::json j = base(l.problem);
    j["parallel"] = l.parallel;
    if (!l.extra.is_null()) j.update(l.extra);
    const std::string cfg = write_config("layout-" + l.name, j);
    ASSERT_EQ(run("launch -n " + std::to_string(l.ranks) + " -- train " + cfg + " --metrics " + dir() + "/layout-" + l.name + ".jsonl",
                  nullptr, &err),
              0)
        << err;
    if (l.name.rfind("usp", 0) == 0) {  // the pair shares each record (one data-parallel rank), not dp 2
      EXPECT_NE(err.find(" x 1 data-parallel rank(s)"), std::string::npos) << err;
    }
    for (const std::string& key : keys(l.problem)) {
      const auto a = mt::cli::testing::metric_values(dir() + "/layout-one-" + l.problem + ".jsonl", key);
      const auto b = mt::cli::testing::metric_values(dir() + "/layout-" + l.name + ".jsonl", key);
      ASSERT_EQ(a.size(), key == "loss" || key == "grad_norm" ? 12u : 2u) << key;
      ASSERT_EQ(a.size(), b.size()) << key;
      for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * std::max(1.0, std::fabs(a[i]))) << key << " " << i;
    }
  }
  // The 4-rank run's checkpoint (tp and pp shards) predicts on one process what it measured.
  const auto acc = mt::cli::testing::metric_values(dir() + "/layout-tp2-pp2.jsonl", "val_acc");
  ASSERT_FALSE(acc.empty());
  std::string out;
  ASSERT_EQ(run("predict " + dir() + "/run-layout-tp2-pp2 " + dir() + "/dev.jsonl -o " + dir() + "/layout-pred.json", &out, &err), 0)
      << err;
  char want[64];
  std::snprintf(want, sizeof want, "accuracy %.4f on the 200", acc.back());
  EXPECT_NE(err.find(want), std::string::npos) << err;
}

// Each step's rows are cut to its global batch's longest record (rounded up to 8), each validation
// batch's to its own, and predict's batches too: the values of full rows, with dropout on (its
// masks are drawn by sample and position, not by the row's length), one process and the layouts
// above alike (they cut too). data.pad_to_max_length keeps every row seq_length long.
TEST(Classify, RowsCutToTheLongestRecordTrainAsFullRows) {
  nlohmann::json j = {{"num_train_epochs", 0}, {"train_iters", 12}, {"eval_interval", 6}, {"train_micro_batch_size_per_gpu", 4},
                      {"gradient_accumulation_steps", 2}, {"model_checkpoint", {{"save_top_k", 0}}}, {"seq_length", 64},
                      {"model", {{"model_type", "gpt2"}, {"vocab_size", 300}, {"n_positions", 64}, {"n_embd", 64}, {"n_layer", 2},
                                 {"n_head", 4}, {"resid_pdrop", 0.1}, {"attn_pdrop", 0.1}, {"embd_pdrop", 0.1}}}};
  const std::string cut = write_config("rows-cut", j);
  nlohmann::json full_cfg = j;
  full_cfg["data"] = nlohmann::json::parse(mt::cli::testing::slurp(cut))["data"];
  full_cfg["data"]["pad_to_max_length"] = true;
  const std::string full = write_config("rows-full", full_cfg);
  std::string out, err;
  for (const std::string name : {"rows-cut", "rows-full"})
    ASSERT_EQ(run("train " + dir() + "/" + name + ".json --metrics " + dir() + "/" + name + ".jsonl", &out, &err), 0) << err;
  for (const std::string key : {"loss", "grad_norm", "val_loss", "val_acc"}) {
    const auto a = mt::cli::testing::metric_values(dir() + "/rows-full.jsonl", key);
    const auto b = mt::cli::testing::metric_values(dir() + "/rows-cut.jsonl", key);
    ASSERT_EQ(a.size(), key == "loss" || key == "grad_norm" ? 12u : 2u) << key;
    ASSERT_EQ(a.size(), b.size()) << key;
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * std::max(1.0, std::fabs(a[i]))) << key << " " << i;
  }
  const auto full_T = mt::cli::testing::metric_values(dir() + "/rows-full.jsonl", "seq_length");
  const auto cut_T = mt::cli::testing::metric_values(dir() + "/rows-cut.jsonl", "seq_length");
  ASSERT_EQ(cut_T.size(), 12u);
  for (double t : full_T) EXPECT_EQ(t, 64);
  for (double t : cut_T) {
    EXPECT_EQ(std::fmod(t, 8.0), 0.0) << t;
    EXPECT_LT(t, 64) << "the records are shorter than 64 tokens";
  }
  // predict cuts its batches too: the accuracy the run's last validation measured.
  ASSERT_EQ(run("predict " + dir() + "/run-rows-cut " + dir() + "/dev.jsonl -o " + dir() + "/rows-pred.json --batch 5", &out, &err), 0)
      << err;
  char want[64];
  std::snprintf(want, sizeof want, "accuracy %.4f on the 200", mt::cli::testing::metric_values(dir() + "/rows-cut.jsonl", "val_acc").back());
  EXPECT_NE(err.find(want), std::string::npos) << err;
}

// Pearson's correlation, and Spearman's as Pearson's of the ranks with ties at their mean: the
// textbook formulas, written here apart from data::regression_metrics.
double textbook_pearson(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sx += x[i];
    sy += y[i];
    sxx += x[i] * x[i];
    syy += y[i] * y[i];
    sxy += x[i] * y[i];
  }
  return (n * sxy - sx * sy) / std::sqrt((n * sxx - sx * sx) * (n * syy - sy * sy));
}
std::vector<double> textbook_ranks(const std::vector<double>& v) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    double below = 0, same = 0;
    for (double w : v) {
      below += w < v[i];
      same += w == v[i];
    }
    r[i] = below + (same + 1) / 2;  // the mean of ranks below + 1 ... below + same
  }
  return r;
}

// STS-B's recipe (run_glue's regression): one value a record, MSELoss, Pearson's and Spearman's
// correlations every eval_interval; the top k by val_spearmanr; predict writes each record's value
// and scores them as the run's last validation did (the textbook formulas over predict's file).
TEST(Classify, RegressionTrainsAsStsbAndPredictsItsCorrelations) {
  std::string out, err;
  ASSERT_TRUE(train_value_task("reg", "regression", "val_spearmanr", 2, 3, &out, &err));
  EXPECT_NE(err.find("regression of 1 value"), std::string::npos) << err;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(step 150 val_loss [0-9.]+ val_pearson [0-9.]+ val_spearmanr [0-9.]+ \(200 records\))")))
      << out;
  const std::vector<double> pearson = mt::cli::testing::metric_values(dir() + "/reg.jsonl", "val_pearson"),
                            spearman = mt::cli::testing::metric_values(dir() + "/reg.jsonl", "val_spearmanr"),
                            mse = mt::cli::testing::metric_values(dir() + "/reg.jsonl", "val_loss");
  ASSERT_EQ(pearson.size(), 5u);  // steps 50, 100, 150, 200, 225
  EXPECT_GT(pearson.back(), 0.8) << "the count is learnable";
  nlohmann::json top = nlohmann::json::parse(mt::cli::testing::slurp(dir() + "/run-reg/top_k/top_k.json"));
  ASSERT_EQ(top["best"].size(), 2u);
  EXPECT_EQ(top["best"][0]["val_spearmanr"].get<double>(), *std::max_element(spearman.begin(), spearman.end()));
  ASSERT_EQ(run("predict " + dir() + "/run-reg " + dir() + "/dev-values.jsonl -o " + dir() + "/pred-reg.json", &out, &err), 0)
      << err;
  std::ifstream p(dir() + "/pred-reg.json"), truth(dir() + "/dev-values.jsonl");
  std::string line, record;
  std::vector<double> predicted, actual;
  double squared = 0;
  while (std::getline(p, line)) {
    ASSERT_TRUE(std::getline(truth, record));
    const nlohmann::json j = nlohmann::json::parse(line), r = nlohmann::json::parse(record);
    EXPECT_EQ(j["id"], r["id"].dump());
    predicted.push_back(j["label"].get<double>());
    actual.push_back(r["label"].is_string() ? std::stod(r["label"].get<std::string>()) : r["label"].get<double>());
    squared += (predicted.back() - actual.back()) * (predicted.back() - actual.back());
  }
  ASSERT_EQ(predicted.size(), 200u);
  EXPECT_NEAR(textbook_pearson(predicted, actual), pearson.back(), 1e-5);
  EXPECT_NEAR(textbook_pearson(textbook_ranks(predicted), textbook_ranks(actual)), spearman.back(), 1e-5);
  EXPECT_NEAR(squared / 200, mse.back(), 1e-4 * mse.back());
  char want[96];
  std::snprintf(want, sizeof want, "Pearson %.4f, Spearman %.4f on the 200", pearson.back(), spearman.back());
  EXPECT_NE(err.find(want), std::string::npos) << err;
  // Out as Hugging Face's regression (config.json's problem_type, one label), and back in: the
  // directory predicts the same values.
  ASSERT_EQ(run("export " + dir() + "/run-reg --hf " + dir() + "/reg-hf", &out, &err), 0) << err;
  const nlohmann::json hf = nlohmann::json::parse(mt::cli::testing::slurp(dir() + "/reg-hf/config.json"));
  EXPECT_EQ(hf["problem_type"], "regression");
  EXPECT_EQ(hf["id2label"].size(), 1u);
  ASSERT_EQ(run("predict " + dir() + "/reg-hf " + dir() + "/dev-values.jsonl --seq-length 48 --texta-name sentence1 --textb-name sentence2 -o " + dir() + "/pred-reg-hf.json",
                &out, &err),
            0)
      << err;
  EXPECT_NE(err.find(want), std::string::npos) << err;
}

// Multi-label (run_classification.py's lists of labels, BCEWithLogitsLoss): the labels by name or
// index; val_f1 is the micro F1 of the labels whose logit is > 0, and predict writes those labels'
// names and scores them as the run's last validation did.
TEST(Classify, MultiLabelTrainsAndPredictsItsMicroF1) {
  std::string out, err;
  ASSERT_TRUE(train_value_task("ml", "multi_label_classification", "val_f1", 1, 2, &out, &err));
  EXPECT_NE(err.find("multi-label classifier of 3 labels"), std::string::npos) << err;
  const std::vector<double> f1 = mt::cli::testing::metric_values(dir() + "/ml.jsonl", "val_f1");
  ASSERT_EQ(f1.size(), 3u);
  EXPECT_GT(f1.back(), 0.9) << "which words a pair holds is learnable";
  ASSERT_EQ(run("predict " + dir() + "/run-ml " + dir() + "/dev-sets.jsonl -o " + dir() + "/pred-ml.json", &out, &err), 0) << err;
  std::ifstream p(dir() + "/pred-ml.json"), truth(dir() + "/dev-sets.jsonl");
  std::string line, record;
  const std::vector<std::string> names = {"cat", "dog", "bird"};
  double tp = 0, fp = 0, fn = 0;
  while (std::getline(p, line)) {
    ASSERT_TRUE(std::getline(truth, record));
    const nlohmann::json j = nlohmann::json::parse(line), r = nlohmann::json::parse(record);
    ASSERT_EQ(j["probabilities"].size(), 3u);
    for (int c = 0; c < 3; ++c) {
      bool said = false, is = false;
      for (const auto& x : j["label"]) said |= x == names[c];
      for (const auto& x : r["label"]) is |= x == names[c] || x == c;
      EXPECT_EQ(said, j["probabilities"][c].get<double>() > 0.5);
      tp += said && is;
      fp += said && !is;
      fn += !said && is;
    }
  }
  EXPECT_NEAR(2 * tp / (2 * tp + fp + fn), f1.back(), 1e-12);
  char want[64];
  std::snprintf(want, sizeof want, "micro F1 %.4f on the 200", f1.back());
  EXPECT_NE(err.find(want), std::string::npos) << err;
}

// A resumed run ranks the kept checkpoints by its own mode: model_checkpoint {monitor val_loss}
// without a mode meant "max" before and "min" now, and the list a "max" run wrote (worst first to
// a "min" run) was kept in its order: a value between its two was turned away (it was compared
// with the list's last, the best), and the end named the worst as the best. The first run's list
// is given values 100 and 0 in its order, so any real loss lies between them.
TEST(Classify, AResumeRanksTheKeptCheckpointsByItsOwnMode) {
  nlohmann::json first = {{"num_train_epochs", 0}, {"train_iters", 4}, {"eval_interval", 2},
                          {"model_checkpoint", {{"monitor", "val_loss"}, {"mode", "max"}, {"save_top_k", 2}}}};
  nlohmann::json second = first;
  second["train_iters"] = 6;
  second["model_checkpoint"] = {{"monitor", "val_loss"}, {"save_top_k", 2}};  // mode "min", the default
  std::string out, err;
  ASSERT_EQ(run("train " + write_config("modes", first), &out, &err), 0) << err;
  const std::string list = dir() + "/run-modes/top_k/top_k.json";
  nlohmann::json top = nlohmann::json::parse(mt::cli::testing::slurp(list));
  ASSERT_EQ(top["best"].size(), 2u);
  top["best"][0]["val_loss"] = 100.0;
  top["best"][1]["val_loss"] = 0.0;
  const nlohmann::json kept = top["best"][1];
  std::ofstream(list) << top.dump();
  ASSERT_EQ(run("train " + write_config("modes", second) + " --resume " + dir() + "/run-modes --metrics " + dir() + "/modes.jsonl",
                &out, &err),
            0)
      << err;
  const std::vector<double> loss = mt::cli::testing::metric_values(dir() + "/modes.jsonl", "val_loss");
  ASSERT_EQ(loss.size(), 1u);  // step 6
  top = nlohmann::json::parse(mt::cli::testing::slurp(list));
  ASSERT_EQ(top["best"].size(), 2u);
  EXPECT_EQ(top["mode"], "min");
  EXPECT_EQ(top["best"][0], kept);
  EXPECT_EQ(top["best"][1]["step"], 6);
  EXPECT_EQ(top["best"][1]["val_loss"].get<double>(), loss[0]);
  EXPECT_NE(out.find("best val_loss 0.0000 at step"), std::string::npos) << out;
}

// The kept checkpoints across runs: a run resumed before a kept step that re-saves it listed it
// twice, and dropping the older entry removed the directory the newer one named; a damaged
// top_k.json was passed over without a word; --overwrite removed the earlier run's best at its
// start, so a run that failed before its first save left none.
TEST(Classify, TheKeptCheckpointsSurviveResumesAndOverwrites) {
  const nlohmann::json first = {{"num_train_epochs", 0}, {"train_iters", 6}, {"eval_interval", 2}, {"save_interval", 2},
                                {"model_checkpoint", {{"monitor", "val_loss"}, {"mode", "min"}, {"save_top_k", 3}}}};
  std::string out, err;
  ASSERT_EQ(run("train " + write_config("kept", first), &out, &err), 0) << err;
  const std::string list = dir() + "/run-kept/top_k/top_k.json";
  nlohmann::json top = nlohmann::json::parse(mt::cli::testing::slurp(list));
  ASSERT_EQ(top["best"].size(), 3u);  // steps 2, 4 and 6
  // Made so: 4 the best, 6 the second, 2 the worst (the resumed run keeps 2 of them: 4 and 6).
  for (auto& e : top["best"]) e["val_loss"] = e["step"] == 4 ? 0.0 : e["step"] == 6 ? 100.0 : 200.0;
  std::ofstream(list) << top.dump();
  nlohmann::json second = first;  // steps 5 and 6 again
  second["model_checkpoint"]["save_top_k"] = 2;
  ASSERT_EQ(run("train " + write_config("kept", second) + " --resume " + dir() + "/run-kept/step-4", &out, &err), 0) << err;
  top = nlohmann::json::parse(mt::cli::testing::slurp(list));
  std::set<std::string> paths;
  for (const auto& e : top["best"]) {
    EXPECT_TRUE(fs::exists(e["path"].get<std::string>() + "/state.json")) << e.dump();
    EXPECT_TRUE(paths.insert(e["path"].get<std::string>()).second) << e.dump();
  }
  // A damaged list is said.
  std::ofstream(list) << "{";
  second["train_iters"] = 10;
  ASSERT_EQ(run("train " + write_config("kept", second) + " --resume " + dir() + "/run-kept", &out, &err), 0) << err;
  EXPECT_NE(err.find("top_k.json: not the list a run writes"), std::string::npos) << err;
  // --overwrite by a run that fails at its first step (a non-finite gradient, base/fault.h's seam):
  // the earlier run's best are still there.
  setenv("MT_FAULT", "engine.nonfinite_grad", 1);
  const int failed = run("train " + write_config("kept", first) + " --overwrite", &out, &err);
  unsetenv("MT_FAULT");
  EXPECT_NE(failed, 0) << err;
  EXPECT_TRUE(fs::exists(list)) << err;
  // --overwrite with --resume: the earlier run's best (made unbeatable here) are not counted by the
  // new run, whose first save removes them (counted, they kept the new run's own out, and the list
  // named directories that were gone).
  top = nlohmann::json::parse(mt::cli::testing::slurp(list));
  for (auto& e : top["best"]) e["val_loss"] = 0.0;
  std::ofstream(list) << top.dump();
  nlohmann::json again = first;
  again["model_checkpoint"]["save_top_k"] = 1;
  again["train_iters"] = 12;  // from the latest, step 10
  ASSERT_EQ(run("train " + write_config("kept", again) + " --overwrite --resume " + dir() + "/run-kept", &out, &err), 0) << err;
  top = nlohmann::json::parse(mt::cli::testing::slurp(list));
  ASSERT_EQ(top["best"].size(), 1u) << top.dump();
  EXPECT_EQ(top["best"][0]["step"], 12) << top.dump();
  EXPECT_TRUE(fs::exists(top["best"][0]["path"].get<std::string>() + "/state.json")) << top.dump();
}

// num_train_epochs counted in steps of the resumed run's batch: a checkpoint of 100 steps at
// batch 16 (4/3 of an epoch of 1200 records) resumed at batch 32 for 2 epochs got train_iters
// 2 x 38 = 76, "is at step 100 ... nothing to train" (at batch 8, 300: 4 epochs in all). Now the
// 2/3 of an epoch left are 26 steps of 32, and the bar ends at the second epoch's last step.
TEST(Classify, AResumeWithAnotherBatchTrainsTheEpochsLeft) {
  const nlohmann::json quiet = {{"eval_interval", 0}, {"model_checkpoint", {{"save_top_k", 0}}}, {"steps_per_print", 1}};
  nlohmann::json first = quiet, second = quiet;
  first["num_train_epochs"] = 4.0 / 3.0;
  second["num_train_epochs"] = 2;
  second["train_micro_batch_size_per_gpu"] = 32;
  second["save_dir"] = dir() + "/run-epochs";
  std::string out, err;
  ASSERT_EQ(run("train " + write_config("epochs", first), &out, &err), 0) << err;
  EXPECT_NE(err.find("100 steps = 1.33 epochs of 75 steps"), std::string::npos) << err;
  ASSERT_EQ(run("train " + write_config("epochs2", second) + " --resume " + dir() + "/run-epochs", &out, &err), 0) << err;
  EXPECT_NE(err.find("the 0.667 left of num_train_epochs 2 are 26 steps of this batch (32): train_iters 126"),
            std::string::npos) << err;
  nlohmann::json state = nlohmann::json::parse(mt::cli::testing::slurp(dir() + "/run-epochs/step-126/state.json"));
  EXPECT_EQ(state["data"]["next_sample"].get<int64_t>(), 100 * 16 + 26 * 32);  // 2432: the 2400 of 2 epochs, rounded up a step
  EXPECT_NE(out.find("Epoch 1: 100% 38/38"), std::string::npos) << out;
  EXPECT_EQ(out.find("Epoch 2:"), std::string::npos) << out;
}

// A signal while the records are tokenized stops the run there, as `train` does for a corpus
// (it trained a step, saved it and said "stopped after step 1").
TEST(Classify, ASignalDuringTheSetupStopsBeforeTheFirstStep) {
  const std::string cfg = write_config("signal", {{"model_checkpoint", {{"save_top_k", 0}}}});
  const std::string e = dir() + "/signal.err";
  const int rc = std::system(("MT_FAULT=train.sigterm_in_setup " + std::string(MT_MESHTRAIN_BIN) + " train " + cfg +
                              " > /dev/null 2> " + e).c_str());
  const std::string err = mt::cli::testing::slurp(e);
  ASSERT_TRUE(WIFEXITED(rc)) << err;
  EXPECT_EQ(WEXITSTATUS(rc), 143) << err;
  EXPECT_NE(err.find("meshtrain: SIGTERM: stopped before the first step; nothing saved"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir() + "/run-signal/latest"));
}

// A classification run's steps come from its epochs, after the configuration is read: a range test
// whose falling lr crosses 0 within them (1e-3 (1 - 0.05 (i + 1)): below 0 from step 22, -0.0027
// at the epoch's step 75) is refused by key once they are counted, before a step is trained (it
// trained by gradient ascent past step 21).
TEST(Classify, AScheduleThatTakesTheLrBelowZeroIsRefusedBeforeTraining) {
  const std::string cfg =
      write_config("lr-below-zero", {{"num_train_epochs", 1},
                                     {"model_checkpoint", {{"save_top_k", 0}}},
                                     {"scheduler", {{"type", "LRRangeTest"},
                                                    {"params", {{"lr_range_test_min_lr", 1e-3}, {"lr_range_test_step_size", 1},
                                                                {"lr_range_test_step_rate", -0.05}}}}}});
  std::string err;
  EXPECT_NE(run("train " + cfg, nullptr, &err), 0);
  EXPECT_NE(err.find("scheduler.params.lr_range_test_step_rate takes the learning rate to -0.0027 by step 75 (train_iters)"),
            std::string::npos)
      << err;
  EXPECT_FALSE(fs::exists(dir() + "/run-lr-below-zero/latest")) << err;
}

// A classification run saves to its save_dir alone too: while another process holds the save_dir
// (here this test, as a live run would), the run is refused at start with one line naming it, and
// nothing is trained or written there; once let go, the same run trains and saves.
TEST(Classify, ASecondRunOnASaveDirIsRefusedWhileTheFirstHoldsIt) {
  const std::string cfg = write_config("held", {{"num_train_epochs", 1}, {"eval_interval", 0}, {"save_interval", 0}});
  const std::string save = dir() + "/run-held";
  std::string err;
  {
    const std::unique_ptr<mt::HeldLock> other = mt::engine::checkpoint_dir_hold(save);
    EXPECT_EQ(run("train " + cfg, nullptr, &err), 2) << err;
    EXPECT_NE(err.find("save_dir " + save + " is in use by another run (pid " + std::to_string(getpid())), std::string::npos)
        << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_FALSE(fs::exists(save + "/latest"));
  }
  EXPECT_EQ(run("train " + cfg, nullptr, &err), 0) << err;
  EXPECT_TRUE(fs::exists(save + "/latest")) << err;
}

TEST(Classify, BadInputIsOneLineAndExitTwo) {
  std::string err;
  std::ofstream(dir() + "/bad.jsonl") << R"({"sentence1": "a", "sentence2": "b", "label": "7"})" << "\n";
  EXPECT_EQ(run("train " + write_config("b1", {{"data", {{"train", dir() + "/bad.jsonl"}, {"tokenizer", dir() + "/tok.json"},
                                                          {"texta_name", "sentence1"}, {"textb_name", "sentence2"}}},
                                                 {"model_checkpoint", {{"save_top_k", 0}}}}),
                nullptr, &err),
            2);
  EXPECT_NE(err.find("bad.jsonl:1: label 7 is outside [0, 2)"), std::string::npos) << err;
  // A label past int's range is checked before it is narrowed (2^32 + 1 trained as label 1), and an
  // id nested past the JSON depth bound is refused (dumping it overflowed the stack: a segfault).
  std::ofstream(dir() + "/wide.jsonl") << R"({"sentence1": "a", "sentence2": "b", "label": 4294967297})" << "\n";
  std::ofstream(dir() + "/deep.jsonl") << R"({"sentence1": "a", "sentence2": "b", "label": 0, "id": )" << std::string(300000, '[')
                                       << std::string(300000, ']') << "}\n";
  for (const char* f : {"wide", "deep"}) {
    EXPECT_EQ(run("train " + write_config(std::string("b-") + f,
                                          {{"data", {{"train", dir() + "/" + f + ".jsonl"}, {"tokenizer", dir() + "/tok.json"},
                                                     {"texta_name", "sentence1"}, {"textb_name", "sentence2"}}},
                                           {"model_checkpoint", {{"save_top_k", 0}}}}),
                  nullptr, &err),
              2)
        << f;
    EXPECT_NE(err.find(f == std::string("wide") ? "wide.jsonl:1: label 4294967297 is outside [0, 2)"
                                                : "deep.jsonl:1: JSON nested deeper than 1000 levels"),
              std::string::npos)
        << err;
  }
  EXPECT_EQ(run("train " + write_config("b2", {{"task", "regression"}}), nullptr, &err), 2);
  EXPECT_NE(err.find("task: \"regression\" is not a task"), std::string::npos) << err;
  EXPECT_EQ(run("train " + write_config("b3", {{"data", {{"train", dir() + "/train.jsonl"}, {"tokenizer", dir() + "/tok.json"}}}}),
                nullptr, &err),
            2);
  EXPECT_NE(err.find("train.jsonl:1: \"text\" must be a string"), std::string::npos) << err;
  // A regression's label that is no number, a multi-label one that is no list, names for values.
  std::ofstream(dir() + "/bad-value.jsonl") << R"({"sentence1": "a", "sentence2": "b", "label": "high"})" << "\n";
  nlohmann::json bad_value = value_task("regression");
  bad_value["data"]["train"] = dir() + "/bad-value.jsonl";
  bad_value["model_checkpoint"] = {{"save_top_k", 0}};
  EXPECT_EQ(run("train " + write_config("b5", bad_value), nullptr, &err), 2);
  EXPECT_NE(err.find("bad-value.jsonl:1: label \"high\" is not a number (a regression's value)"), std::string::npos) << err;
  std::ofstream(dir() + "/bad-set.jsonl") << R"({"sentence1": "a", "sentence2": "b", "label": "cat"})" << "\n";
  nlohmann::json bad_set = value_task("multi_label_classification");
  bad_set["data"]["train"] = dir() + "/bad-set.jsonl";
  bad_set["model_checkpoint"] = {{"save_top_k", 0}};
  EXPECT_EQ(run("train " + write_config("b6", bad_set), nullptr, &err), 2);
  EXPECT_NE(err.find("bad-set.jsonl:1: label \"cat\" is not a list of labels (problem_type \"multi_label_classification\")"),
            std::string::npos)
      << err;
  bad_value["data"]["labels"] = {"low", "high"};
  EXPECT_EQ(run("train " + write_config("b7", bad_value), nullptr, &err), 2);
  EXPECT_NE(err.find("data.labels names labels; a regression (model.problem_type \"regression\", or num_labels 1) has values"),
            std::string::npos)
      << err;
  EXPECT_EQ(run("predict " + dir() + "/nothing " + dir() + "/dev.jsonl -o " + dir() + "/p.json", nullptr, &err), 2);
  for (const std::string& e : {err}) EXPECT_EQ(std::count(e.begin(), e.end(), '\n'), 1) << e;
}

}  // namespace
