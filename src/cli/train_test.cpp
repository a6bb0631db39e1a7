// meshtrain train end to end: a tiny GPT-2 on a generated indexed dataset; stopping and resuming
// from a checkpoint continues the loss curve bit for bit; bad input exits 2 with one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <chrono>
#include <thread>
#include <tuple>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_test_util.h"
#include "data/indexed_dataset.h"
#include "data/token_stream.h"
#include "data/tokenizer.h"
#include "engine/checkpoint_io.h"
#include "models/transformer.h"

namespace fs = std::filesystem;

namespace {

std::string dir() {
  static std::string d = mt::cli::testing::make_test_dir("mt_train_test");
  return d;
}

void write_dataset(const std::string& prefix, int docs) { mt::cli::testing::write_chain_dataset(prefix, docs); }

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
  return mt::cli::testing::run_meshtrain(dir(), args, nullptr, err);
}

// The values of one metric over the lines of a metrics file that have it.
std::vector<double> values(const std::string& metrics, const std::string& key) {
  std::vector<double> out;
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains(key)) out.push_back(j[key].get<double>());
  }
  return out;
}

std::vector<double> losses(const std::string& metrics) { return values(metrics, "loss"); }

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
  // ckpt-b now holds a run of its own: a resume from ckpt-a into it would re-save and rotate its
  // checkpoints (it did, exit 0); refused, unless --overwrite.
  std::string err;
  EXPECT_EQ(run("train " + cfg + " --resume " + dir() + "/ckpt-a/step-3 --set save_dir=" + dir() + "/ckpt-b", &err), 2);
  EXPECT_NE(err.find("holds checkpoints of another run than --resume"), std::string::npos) << err;
  EXPECT_EQ(run("train " + cfg + " --resume " + dir() + "/ckpt-a/step-3 --set save_dir=" + dir() + "/ckpt-b --overwrite", &err), 0)
      << err;
}

// A resume with another tokenizer: text data is tokenized again by it, and the checkpoint's
// embeddings trained on ids that are now other tokens, without a word. Refused by its key.
TEST(Train, AResumeWithAnotherTokenizerIsRefused) {
  const std::string txt = dir() + "/tokswap.txt";
  std::ofstream(txt) << "The cat sat on the mat.\nIt was happy.\n\nThe dog sat on the log.\n\nCats and dogs.\n";
  ASSERT_EQ(run("tokenize " + txt + " -o " + dir() + "/tokA --train-bpe 270"), 0);
  ASSERT_EQ(run("tokenize " + txt + " -o " + dir() + "/tokB --train-bpe 262"), 0);
  const nlohmann::json model = {{"model_type", "gpt2"}, {"vocab_size", 300}, {"n_positions", 32},
                                {"n_embd", 32},        {"n_layer", 1},       {"n_head", 2}};
  const std::string cfg = write_config("tokswap", {{"data", {{"train", txt}, {"tokenizer", dir() + "/tokA.tokenizer.json"}}},
                                                   {"model", model}, {"seq_length", 8}, {"eval_interval", 0}});
  std::string err;
  ASSERT_EQ(run("train " + cfg + " --set train_iters=3", &err), 0) << err;
  EXPECT_EQ(run("train " + cfg + " --resume " + dir() + "/ckpt-tokswap --set data.tokenizer=" + dir() + "/tokB.tokenizer.json",
                &err),
            2);
  EXPECT_NE(err.find("tokenizer.json is another one (its ids are other tokens)"), std::string::npos) << err;
  // The same tokenizer by another path is the same one: a copy's directory (tokenizer.json inside).
  fs::create_directories(dir() + "/tokA-dir");
  fs::copy_file(dir() + "/tokA.tokenizer.json", dir() + "/tokA-dir/tokenizer.json", fs::copy_options::overwrite_existing);
  EXPECT_EQ(run("train " + cfg + " --resume " + dir() + "/ckpt-tokswap --set data.tokenizer=" + dir() + "/tokA-dir", &err), 0) << err;
}

// A tokenizer larger than the model's vocabulary: text data is refused at start, naming the first
// id the model cannot embed (it was found when a sample reached it, hours in for a long run).
TEST(Train, TextDataBeyondTheModelsVocabularyIsRefusedAtStart) {
  const std::string txt = dir() + "/bigtok.txt";
  std::ofstream(txt) << "The cat sat on the mat.\nIt was happy.\n\nThe dog sat on the log.\n\nCats and dogs.\n";
  ASSERT_EQ(run("tokenize " + txt + " -o " + dir() + "/bigtok --train-bpe 270"), 0);
  const nlohmann::json model = {{"model_type", "gpt2"}, {"vocab_size", 258}, {"n_positions", 32},
                                {"n_embd", 32},        {"n_layer", 1},       {"n_head", 2}};
  const std::string cfg = write_config("bigtok", {{"data", {{"train", txt}, {"tokenizer", dir() + "/bigtok.tokenizer.json"}}},
                                                  {"model", model}, {"seq_length", 8}, {"eval_interval", 0}, {"train_iters", 3}});
  std::string err;
  EXPECT_EQ(run("train " + cfg, &err), 2);
  EXPECT_NE(err.find("data.train: " + txt + " tokenized with " + dir() + "/bigtok.tokenizer.json (270 tokens) gives id "),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("outside the model's vocabulary [0, 258)"), std::string::npos) << err;
  EXPECT_EQ(err.find("step 1"), std::string::npos) << "refused before training: " << err;
}

// Standard output closed under the run (`| head`): SIGPIPE ended it at its next progress line, with
// no line on stderr and nothing saved. It stops as SIGTERM does: the step ends, the run saves, 141.
TEST(Train, AClosedStandardOutputStopsTheRunWithASave) {
  write_dataset(dir() + "/train", 30);
  const std::string cfg = write_config("pipe", {{"train_iters", 5000}, {"save_interval", 100000}, {"eval_interval", 0}});
  const std::string err = dir() + "/pipe.err", rc = dir() + "/pipe.rc";
  const std::string cmd = "bash -c '" + std::string(MT_MESHTRAIN_BIN) + " train " + cfg + " 2> " + err +
                          " | head -n 1 > /dev/null; echo ${PIPESTATUS[0]} > " + rc + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  EXPECT_EQ(mt::cli::testing::slurp(rc), "141\n");
  const std::string said = mt::cli::testing::slurp(err);
  EXPECT_NE(said.find("meshtrain: SIGPIPE (standard output closed): stopped after step"), std::string::npos) << said;
  EXPECT_TRUE(fs::exists(dir() + "/ckpt-pipe/latest")) << said;
}

// A metrics file on a full disk (/dev/full: every write ENOSPC) failed without a word: the run
// trained, then ended with "no steps to plot", exit 2. Now the first failed write is one line
// naming the file, the step and the reason, and the run goes on and saves.
// And eval_iters 0 (no validation, as Megatron) printed "validation loss -nan" and ended with a
// JSON type error reading its metrics back.
TEST(Train, AMetricsFileThatCannotBeWrittenIsSaidOnceAndTheRunGoesOn) {
  write_dataset(dir() + "/train", 30);
  std::string err;
  ASSERT_EQ(run("train " + write_config("full", nlohmann::json::object()) + " --metrics /dev/full", &err), 0) << err;
  const std::string line = "warning: /dev/full: cannot write step 1's metrics (No space left on device); the run goes on without them\n";
  EXPECT_NE(err.find(line), std::string::npos) << err;
  EXPECT_EQ(err.find("cannot write step 2"), std::string::npos) << err;
  EXPECT_TRUE(fs::exists(dir() + "/ckpt-full/step-6/state.json"));
  // Unusable output paths are bad input said before any work (exit 1, after the model, the resume
  // and the tokenizing; export's was a raw filesystem error after the weights were read).
  EXPECT_EQ(run("train " + write_config("nodir", nlohmann::json::object()) + " --metrics " + dir() + "/no/such/m.jsonl", &err), 2);
  EXPECT_NE(err.find("/no/such is not a directory"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir() + "/ckpt-nodir/latest"));
  std::ofstream(dir() + "/a-file") << "x";
  EXPECT_EQ(run("export " + dir() + "/ckpt-full --hf " + dir() + "/a-file/out", &err), 2);
  EXPECT_NE(err.find("a-file is a file, not a directory"), std::string::npos) << err;
  // Into another checkpoint of the run (its rotation removed the export with it, stop 73).
  EXPECT_EQ(run("export " + dir() + "/ckpt-full --hf " + dir() + "/ckpt-full/step-3/x", &err), 2);
  EXPECT_NE(err.find("/ckpt-full/step-3, which its run's keep_last rotation removes"),
            std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir() + "/ckpt-full/step-3/x"));
  const std::string metrics = dir() + "/no-eval.jsonl";
  ASSERT_EQ(run("train " + write_config("no-eval", {{"eval_iters", 0}}) + " --metrics " + metrics, &err), 0) << err;
  EXPECT_EQ(values(metrics, "loss").size(), 6u);
  EXPECT_TRUE(values(metrics, "val_loss").empty());
}

// Options that measured or wrote something else than asked, and a FIFO that hung `inspect`: each
// is one line and exit 2 now.
TEST(Cli, OptionsThatWouldDoSomethingElseAreRefused) {
  std::string err;
  const std::string model = std::string(MT_SOURCE_DIR) + "/configs/models/tiny-gpt2.json";
  EXPECT_EQ(run("bench " + model + " --decode -1", &err), 2);  // ran the training benchmark
  EXPECT_NE(err.find("--decode must be a number of decode steps"), std::string::npos) << err;
  EXPECT_EQ(run("bench " + model + " --decode 4 --dtype fp16", &err), 2);  // timed f32
  EXPECT_NE(err.find("--decode times generation with f32 or bf16 weights"), std::string::npos) << err;
  {  // bf16 weights for generation (serve --dtype bf16's path)
    std::string out;
    EXPECT_EQ(mt::cli::testing::run_meshtrain(dir(), "bench " + model + " --decode 4 --seq 4 --dtype bf16", &out, &err), 0) << err;
    // (a CPU without AVX512-BF16 keeps f32 weights, and says so)
    EXPECT_TRUE(out.find("bf16 weights") != std::string::npos ||
                (out.find("f32 weights") != std::string::npos && err.find("bf16 weights need AVX512-BF16") != std::string::npos))
        << out << err;
  }
  EXPECT_EQ(run("bench " + model + " --threads -5", &err), 2);
  EXPECT_NE(err.find("--threads must be >= 0"), std::string::npos) << err;
  std::ofstream(dir() + "/t.txt") << "hello world\n";
  EXPECT_EQ(run("tokenize " + dir() + "/t.txt -o '' --train-bpe 260", &err), 2);  // wrote hidden .bin/.idx
  EXPECT_NE(err.find("give an output prefix"), std::string::npos) << err;
  EXPECT_EQ(run("tokenize " + dir() + "/t.txt -o " + dir() + "/t --train-bpe -5", &err), 2);
  EXPECT_NE(err.find("--train-bpe -5: the vocabulary size must be positive"), std::string::npos) << err;
  EXPECT_EQ(run("tokenize " + dir() + "/t.txt -o " + dir() + "/t --train-bpe 0", &err), 2);  // said "give exactly one of"
  EXPECT_NE(err.find("--train-bpe 0: the vocabulary size must be positive"), std::string::npos) << err;
  const std::string fifo = dir() + "/fifo.safetensors";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_EQ(run("inspect " + fifo, &err), 2);  // hung, waiting for a writer
  EXPECT_NE(err.find("not a regular file"), std::string::npos) << err;
}

TEST(Train, BadInputIsOneLineAndExitTwo) {
  std::string err;
  EXPECT_EQ(run("train " + dir() + "/missing.json", &err), 2);
  EXPECT_NE(err.find("missing.json"), std::string::npos);
  std::string cfg = write_config("c", {{"zero_optimization", {{"stage", 3}, {"offload_param", {{"device", "nvme"}}}}}});
  EXPECT_EQ(run("train " + cfg, &err), 2);
  EXPECT_NE(err.find("zero_optimization.offload_param.nvme_path: device 'nvme' needs the swap directory"), std::string::npos)
      << err;
  cfg = write_config("d", {{"data", {{"train", dir() + "/nothing"}, {"valid", dir() + "/train"}}}});
  EXPECT_EQ(run("train " + cfg, &err), 2);
  EXPECT_NE(err.find("nothing"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

// DeepSpeed's flops_profiler block: step 2 of the run profiled into output_file (its directory
// created), with the aggregated profile to module_depth and the detailed tree.
TEST(Train, FlopsProfilerWritesItsReportToTheOutputFile) {
  write_dataset(dir() + "/train", 30);
  const std::string out_file = dir() + "/profile/flops.txt";
  std::string cfg = write_config("fp", {{"flops_profiler", {{"enabled", true}, {"profile_step", 1}, {"module_depth", 2},
                                                          {"top_modules", 2}, {"output_file", out_file}}},
                                        {"save_interval", 0}, {"eval_interval", 0}});
  std::string out, err;
  ASSERT_EQ(mt::cli::testing::run_meshtrain(dir(), "train " + cfg + " --overwrite", &out, &err), 0) << err;
  EXPECT_NE(err.find("flops profile of step 2: " + out_file), std::string::npos) << err;
  EXPECT_EQ(out.find("flops profiler"), std::string::npos) << out;  // the report went to the file
  ASSERT_TRUE(fs::exists(out_file));
  const std::string rep = mt::cli::testing::slurp(out_file);
  for (const char* want : {"Profile of step 2", "world size:", "batch size per GPU:", "params per GPU:", "fwd MACs per GPU:",
                           "fwd latency:", "bwd latency:", "step latency:", "iter latency:", "samples/second:",
                           "Aggregated profile per GPU", "Detailed profile per GPU", "  h.1 (Block): ", "      c_fc (Linear): ",
                           "  lm_head+loss (LMHead): "})
    EXPECT_NE(rep.find(want), std::string::npos) << want << "\n" << rep;
  // module_depth 2: depths 0 and 1 of the aggregated profile (DeepSpeed's range(depth)); top_modules
  // 2 at depth 1.
  EXPECT_NE(rep.find("depth 1:"), std::string::npos);
  EXPECT_EQ(rep.find("depth 2:"), std::string::npos);
  EXPECT_NE(rep.find("params      - Block "), std::string::npos) << rep;
  // MFU against the GEMM ceiling train measured at the model's MLP shape in its dtype; this tiny
  // model's step can beat a GEMM timed at its tiny shape (128 % in a CI run), and then the line
  // says so instead of an MFU above 100 % (stop 74). Never "no peak" here: one was measured.
  EXPECT_NE(rep.find("peak FLOPS per GPU (measured f32 GEMM ceiling, "), std::string::npos) << rep;
  EXPECT_TRUE(rep.find("MFU = FLOPS per GPU / peak FLOPS per GPU: ") != std::string::npos ||
              rep.find("not reported: the step ran at ") != std::string::npos)
      << rep;
  EXPECT_EQ(rep.find("not reported: no peak was measured"), std::string::npos) << rep;
}

}  // namespace

namespace {

// A dataset tokenized with another (larger) tokenizer: the token past the model's vocabulary was
// met in the embedding, and the line named neither the dataset nor the sample.
TEST(Train, ATokenOutsideTheVocabularyNamesTheDatasetAndPosition) {
  const std::string prefix = dir() + "/bigvocab";
  {
    mt::data::IndexedDatasetWriter w(prefix, 70000);
    std::vector<int32_t> seq(60, 5);
    seq[40] = 69999;
    w.add_sequence(seq);
    w.end_document();
    w.finalize();
  }
  const std::string cfg = write_config("bigvocab", {{"data", {{"train", prefix}, {"shuffle", false}}}, {"eval_interval", 0}});
  std::string err;
  EXPECT_EQ(run("train " + cfg, &err), 2);
  EXPECT_NE(err.find("data.train: " + prefix + ": token 69999 at stream position 40 (sample "), std::string::npos) << err;
  EXPECT_NE(err.find("outside the model's vocabulary [0, 97)"), std::string::npos) << err;
}

// Megatron's consumed_valid_samples: a run resumed with another eval_interval reads the validation
// samples on from the checkpoint's count (Megatron restores it), where the formula from the step
// (done / eval_interval - 1) read an earlier block again. Four steps evaluated at 2 and 4 (blocks 0
// and 1), resumed to 6 with eval_interval 3: step 6 reads block 2, the value an uninterrupted run
// evaluating every 2 steps has there, not block 1, which one evaluating every 3 has.
TEST(Train, MegatronValidationReadsOnFromTheCheckpointsConsumedValidSamples) {
  write_dataset(dir() + "/train", 30);
  const nlohmann::json data = {{"train", dir() + "/train"}, {"valid", dir() + "/train"}, {"sample_order", "megatron"}};
  std::string err;
  for (int every : {2, 3}) {
    const std::string name = "cv-all-" + std::to_string(every);
    ASSERT_EQ(run("train " + write_config(name, {{"data", data}, {"eval_interval", every}}) + " --metrics " + dir() + "/" + name + ".jsonl",
                  &err),
              0)
        << err;
  }
  const std::vector<double> by2 = values(dir() + "/cv-all-2.jsonl", "val_loss"), by3 = values(dir() + "/cv-all-3.jsonl", "val_loss");
  ASSERT_EQ(by2.size(), 3u);
  ASSERT_EQ(by3.size(), 2u);
  ASSERT_NE(by2[2], by3[1]) << "blocks 1 and 2 must differ at step 6 for the test to tell them apart";
  ASSERT_EQ(run("train " + write_config("cv", {{"data", data}, {"eval_interval", 2}, {"train_iters", 4}, {"save_interval", 4}}), &err), 0)
      << err;
  const nlohmann::json state = nlohmann::json::parse(mt::cli::testing::slurp(dir() + "/ckpt-cv/step-4/state.json"));
  EXPECT_EQ(state["data"]["consumed_valid_samples"], 2 * 2 * 4);  // two evaluations of eval_iters 2 x batch 4
  ASSERT_EQ(run("train " + write_config("cv-resumed", {{"data", data}, {"eval_interval", 3}, {"save_dir", dir() + "/ckpt-cv"}}) +
                    " --resume " + dir() + "/ckpt-cv --metrics " + dir() + "/cv-resumed.jsonl",
                &err),
            0)
      << err;
  const std::vector<double> resumed = values(dir() + "/cv-resumed.jsonl", "val_loss");
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_NEAR(resumed[0], by2[2], 1e-6 * std::fabs(by2[2]));
}

// data.sample_order "megatron": the run reads Megatron-LM's GPTDataset samples for train_iters x
// train_batch_size samples (tools/check_megatron_idx.py --gpt-dataset, numpy's shuffles). A token
// outside the vocabulary is planted where the oracle puts global sample 13, and the run names its
// stream position and the first sample of the run that reads it; meshtrain's own order reaches it
// at another sample. The same data without it trains and validates; what Megatron's order cannot
// be is refused by key.
TEST(Train, MegatronSampleOrderReadsGptDatasetsSamples) {
  if (std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) GTEST_SKIP() << "no numpy for /usr/bin/python3";
  std::vector<int> lengths;
  for (int d = 0; d < 30; ++d) lengths.push_back(10 + (d * 7) % 31);
  auto write = [&](const std::string& prefix, int64_t bad_at) {
    mt::data::IndexedDatasetWriter w(prefix, 200);
    int64_t at = 0;
    for (int n : lengths) {
      std::vector<int32_t> seq;
      for (int k = 0; k < n; ++k, ++at) seq.push_back(at == bad_at ? 150 : static_cast<int32_t>((at * 31) % 97));
      w.add_sequence(seq);
      w.end_document();
    }
    w.finalize();
  };
  const std::string clean = dir() + "/mo-clean", planted = dir() + "/mo-planted";
  write(clean, -1);
  const int T = 16;
  const uint64_t N = 6 * 4;  // train_iters x (2 x 2)
  const std::string out = dir() + "/mo-oracle.json";
  const std::string cmd = std::string("/usr/bin/python3 ") + MT_SOURCE_DIR + "/tools/check_megatron_idx.py --gpt-dataset " + clean +
                          " 16 " + std::to_string(N) + " 1234 > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  nlohmann::json want = nlohmann::json::parse(std::ifstream(out));
  const uint64_t p = want["positions"][13][7].get<uint64_t>();
  uint64_t k_megatron = N, k_meshtrain = N;
  for (uint64_t k = 0; k < N && k_megatron == N; ++k)
    for (const auto& q : want["positions"][k])
      if (q.get<uint64_t>() == p) k_megatron = k;
  mt::data::IndexedDataset ds(clean);
  mt::data::TokenStream theirs(ds, T, true, 1234);
  for (uint64_t k = 0; k < N && k_meshtrain == N; ++k)
    if (theirs.window_start(k) <= p && p <= theirs.window_start(k) + T) k_meshtrain = k;
  ASSERT_LE(k_megatron, 13u);
  ASSERT_NE(k_megatron, k_meshtrain) << "the planted token does not tell the orders apart";
  write(planted, static_cast<int64_t>(p));
  std::string err;
  const nlohmann::json order = {{"train", planted}, {"sample_order", "megatron"}};
  std::string cfg = write_config("mo-planted", {{"data", order}, {"eval_interval", 0}});
  EXPECT_EQ(run("train " + cfg, &err), 2);
  EXPECT_NE(err.find("token 150 at stream position " + std::to_string(p) + " (sample " + std::to_string(k_megatron) + ")"),
            std::string::npos)
      << err << "(meshtrain's order reads it at sample " << k_meshtrain << ")";

  cfg = write_config("mo-clean", {{"data", {{"train", clean}, {"valid", clean}, {"sample_order", "megatron"}}}});
  ASSERT_EQ(run("train " + cfg + " --metrics " + dir() + "/mo.jsonl", &err), 0) << err;
  EXPECT_EQ(losses(dir() + "/mo.jsonl").size(), 6u);
  EXPECT_EQ(values(dir() + "/mo.jsonl", "val_loss").size(), 2u);
  // Resumed for more steps, the order is rebuilt for more samples, as Megatron's index is: said.
  ASSERT_EQ(run("train " + cfg + " --resume " + dir() + "/ckpt-mo-clean --set train_iters=8 --set save_dir=" + dir() +
                    "/ckpt-mo-more",
                &err),
            0)
      << err;
  EXPECT_NE(err.find("Megatron's order was built for 24 samples there and is built for 32"), std::string::npos) << err;

  // A token planted at `at` of a dataset cut by `split`, trained in both orders: the run stops
  // naming data.split and the position; check(order, metrics) looks at what was logged before.
  auto planted_split = [&](const std::string& name, const char* split, const std::string& key, int64_t at,
                           const std::function<void(const std::string&, const std::string&)>& check) {
    const std::string prefix = dir() + "/" + name;
    write(prefix, at);
    for (const std::string order : {"meshtrain", "megatron"}) {
      cfg = write_config(name + "-" + order, {{"data", {{"train", prefix}, {"split", split}, {"sample_order", order}}}});
      const std::string metrics = dir() + "/" + name + "-" + order + ".jsonl";
      EXPECT_EQ(run("train " + cfg + " --metrics " + metrics, &err), 2) << order;
      EXPECT_NE(err.find(key + ": " + prefix + ": token 150 at stream position " + std::to_string(at)), std::string::npos)
          << order << ": " << err;
      check(order, metrics);
    }
  };
  // data.split "8,2": sequences 0-23 train, 24-29 validate. A token planted in sequence 26 is never
  // a training sample's; a validation meets it, naming data.split.
  int64_t in_26 = 0;
  for (int d = 0; d < 26; ++d) in_26 += lengths[static_cast<size_t>(d)];
  planted_split("mo-split", "8,2", "data.split", in_26 + 4, [&](const std::string& order, const std::string& metrics) {
    // step 3's line waits for its validation; Megatron's second one (8 samples each, reading on)
    // meets it, at step 6
    EXPECT_EQ(losses(metrics).size(), order == "megatron" ? 5u : 2u) << order;
  });

  // data.split's third share is Megatron's test set, evaluated once when training ends, after the
  // final save: "8,1,1" gives it sequences 27-29. A token planted there passes training and both
  // validations and stops the test evaluation, naming the test set, with step 6 saved and its line
  // written; clean, the last step's line holds test_loss, also without validation (eval_interval 0,
  // as Megatron's do_test); "8,2" has no test set; a share too small for a sample ("969,30,1"
  // leaves 30 sequences' test share none) is said and skipped.
  planted_split("mo-test", "8,1,1", "data.split (test)", in_26 + lengths[26] + 4,
                [&](const std::string& order, const std::string& metrics) {
                  EXPECT_EQ(values(metrics, "val_loss").size(), 2u) << order;
                  EXPECT_TRUE(values(metrics, "test_loss").empty()) << order;
                  EXPECT_TRUE(fs::exists(dir() + "/ckpt-mo-test-" + order + "/step-6")) << order;
                });
  cfg = write_config("mo-test-clean", {{"data", {{"train", clean}, {"split", "8,1,1"}, {"sample_order", "megatron"}}}});
  ASSERT_EQ(run("train " + cfg + " --metrics " + dir() + "/mo-test.jsonl", &err), 0) << err;
  const std::vector<double> tested = values(dir() + "/mo-test.jsonl", "test_loss");
  ASSERT_EQ(tested.size(), 1u);
  EXPECT_TRUE(std::isfinite(tested[0]) && tested[0] > 0);
  cfg = write_config("mo-test-noval", {{"data", {{"train", clean}, {"split", "8,1,1"}}}, {"eval_interval", 0}});
  ASSERT_EQ(run("train " + cfg + " --metrics " + dir() + "/mo-test-noval.jsonl", &err), 0) << err;
  EXPECT_EQ(values(dir() + "/mo-test-noval.jsonl", "test_loss").size(), 1u);
  EXPECT_TRUE(values(dir() + "/mo-test-noval.jsonl", "val_loss").empty());
  cfg = write_config("mo-no-test", {{"data", {{"train", clean}, {"split", "8,2"}}}});
  ASSERT_EQ(run("train " + cfg + " --metrics " + dir() + "/mo-no-test.jsonl", &err), 0) << err;
  EXPECT_TRUE(values(dir() + "/mo-no-test.jsonl", "test_loss").empty());
  EXPECT_EQ(values(dir() + "/mo-no-test.jsonl", "val_loss").size(), 2u);
  EXPECT_EQ(err.find("test set"), std::string::npos) << err;
  cfg = write_config("mo-test-small", {{"data", {{"train", clean}, {"split", "969,30,1"}}}});
  ASSERT_EQ(run("train " + cfg + " --metrics " + dir() + "/mo-test-small.jsonl", &err), 0) << err;
  EXPECT_NE(err.find("data.split leaves test no sequences of the 30"), std::string::npos) << err;
  EXPECT_NE(err.find("the run evaluates no test set"), std::string::npos) << err;
  EXPECT_EQ(values(dir() + "/mo-test-small.jsonl", "val_loss").size(), 2u);
  // A validation share too small to read refused the run with eval_iters 0, where nothing validates,
  // and said "data.split: data.split leaves" (stop 73).
  cfg = write_config("mo-val-small", {{"data", {{"train", clean}, {"split", "99,1"}}}, {"eval_iters", 0}});
  ASSERT_EQ(run("train " + cfg + " --metrics " + dir() + "/mo-val-small.jsonl", &err), 0) << err;
  EXPECT_TRUE(values(dir() + "/mo-val-small.jsonl", "val_loss").empty());
  EXPECT_EQ(run("train " + cfg + " --set eval_iters=2 --set save_dir=" + dir() + "/ckpt-mo-val-small2", &err), 2);
  EXPECT_NE(err.find("data.split: it leaves validation no sequences of the 30"), std::string::npos) << err;

  // A Megatron blend, weights 0.3 and 0.7 (data.train as --data-path's list): the token planted in
  // the second dataset is met at the global sample the oracle's blend puts it, named with that
  // dataset's own sample.
  const std::string other = dir() + "/mo-other";
  write(other, -1);
  const std::string blend_out = dir() + "/mo-blend.json";
  const std::string blend_cmd = std::string("/usr/bin/python3 ") + MT_SOURCE_DIR + "/tools/check_megatron_idx.py --blend 16 " +
                                std::to_string(N) + " 1234 0.3 " + other + " 0.7 " + planted + " > " + blend_out;
  ASSERT_EQ(std::system(blend_cmd.c_str()), 0) << blend_cmd;
  nlohmann::json blended = nlohmann::json::parse(std::ifstream(blend_out));
  uint64_t k_blend = N;
  for (uint64_t k = 0; k < N && k_blend == N; ++k)
    if (blended["dataset"][k] == 1)
      for (const auto& q : blended["positions"][k])
        if (q.get<uint64_t>() == p) k_blend = k;
  ASSERT_LT(k_blend, N) << "the blend's samples of the planted dataset miss the token";
  cfg = write_config("mo-blend", {{"data", {{"train", {"0.3", other, 0.7, planted}}, {"sample_order", "megatron"}}},
                                  {"eval_interval", 0}});
  EXPECT_EQ(run("train " + cfg, &err), 2);
  EXPECT_NE(err.find("data.train: " + planted + ": token 150 at stream position " + std::to_string(p) + " (sample " +
                     std::to_string(k_blend) + ", the dataset's sample " +
                     std::to_string(blended["dataset_sample"][k_blend].get<uint64_t>()) + ")"),
            std::string::npos)
      << err;
  // In meshtrain's order a blend trains and validates too (a blend for validation as well).
  cfg = write_config("mo-blend-clean", {{"data", {{"train", {"1", other, "3", clean}}, {"valid", {clean, other}}}}});
  ASSERT_EQ(run("train " + cfg + " --metrics " + dir() + "/mo-blend.jsonl", &err), 0) << err;
  EXPECT_EQ(values(dir() + "/mo-blend.jsonl", "val_loss").size(), 2u);

  const std::vector<std::pair<nlohmann::json, std::string>> refused = {
      {{{"data", {{"train", clean}, {"sample_order", "megatron"}, {"shuffle", false}}}}, "data.shuffle: false with sample_order"},
      {{{"data", {{"train", clean}, {"sample_order", "megatron"}, {"seed", 4294967296}}}}, "numpy's RandomState takes a seed"},
      {{{"data", {{"train", clean}, {"sample_order", "random"}}}}, "data.sample_order: \"random\" is not an order"},
      // train_iters x train_batch_size past 64 bits wrapped to 0: one epoch built, a death mid-run
      {{{"data", {{"train", clean}, {"sample_order", "megatron"}}}, {"train_iters", 4611686018427387904LL}},
       "x train_batch_size 4 overflows 64 bits"},
  };
  for (const auto& [extra, message] : refused) {
    cfg = write_config("mo-refused", extra);
    EXPECT_EQ(run("train " + cfg, &err), 2) << extra.dump();
    EXPECT_NE(err.find(message), std::string::npos) << err;
  }
}

// data.eod_mask_loss (Megatron's --eod-mask-loss): a target whose input is the end-of-document id
// is not trained. The same data with a loss-mask dataset (the SFT path) zero at every token that
// follows an EOD trains the same losses, bit for bit; without either, other losses.
TEST(Train, EodMaskLossMasksTheTargetAfterEachEod) {
  const std::string plain = dir() + "/eod", masked = dir() + "/eod-masked";
  std::vector<int32_t> stream;
  for (int d = 0; d < 40; ++d) {
    for (int k = 0; k < 6 + d % 9; ++k) stream.push_back(static_cast<int32_t>(10 + (d * 13 + k * 7) % 80));
    stream.push_back(5);  // the end of the document
  }
  for (const std::string& prefix : {plain, masked}) {
    mt::data::IndexedDatasetWriter w(prefix, 97);
    w.add_sequence(stream);
    w.end_document();
    w.finalize();
  }
  {
    mt::data::IndexedDatasetWriter w(masked + ".mask", 2);
    std::vector<int32_t> m(stream.size(), 1);
    for (size_t q = 1; q < stream.size(); ++q)
      if (stream[q - 1] == 5) m[q] = 0;
    w.add_sequence(m);
    w.end_document();
    w.finalize();
  }
  auto train = [&](const std::string& name, const nlohmann::json& data) {
    std::string err;
    const std::string cfg = write_config(name, {{"data", data}, {"eval_interval", 0}});
    EXPECT_EQ(run("train " + cfg + " --metrics " + dir() + "/" + name + ".jsonl", &err), 0) << err;
    return std::make_pair(losses(dir() + "/" + name + ".jsonl"), err);
  };
  const auto [by_key, said] = train("eod-key", {{"train", plain}, {"eod_mask_loss", true}, {"eod_id", 5}});
  const auto by_mask = train("eod-mask", {{"train", masked}}).first;
  const auto neither = train("eod-none", {{"train", plain}}).first;
  ASSERT_EQ(by_key.size(), 6u);
  EXPECT_EQ(by_key, by_mask);
  EXPECT_NE(by_key, neither);
  EXPECT_NE(said.find("data.eod_mask_loss: the target after token 5 (data.eod_id) is not trained"), std::string::npos) << said;
  // Without data.eod_id the model's eos_token_id is Megatron's eod for a Hugging Face tokenizer.
  std::string err;
  std::string cfg = write_config("eod-eos", {{"data", {{"train", plain}, {"eod_mask_loss", true}}}, {"eval_interval", 0}});
  nlohmann::json j = nlohmann::json::parse(std::ifstream(cfg));
  j["model"]["eos_token_id"] = 5;
  std::ofstream(cfg) << j.dump();
  EXPECT_EQ(run("train " + cfg + " --metrics " + dir() + "/eod-eos.jsonl", &err), 0) << err;
  EXPECT_EQ(losses(dir() + "/eod-eos.jsonl"), by_key);
  EXPECT_NE(err.find("(the model's eos_token_id)"), std::string::npos) << err;
  cfg = write_config("eod-none-known", {{"data", {{"train", plain}, {"eod_mask_loss", true}}}, {"eval_interval", 0}});
  EXPECT_EQ(run("train " + cfg, &err), 2);
  EXPECT_NE(err.find("data.eod_mask_loss: no end-of-document id"), std::string::npos) << err;
  cfg = write_config("eod-outside", {{"data", {{"train", plain}, {"eod_mask_loss", true}, {"eod_id", 97}}}, {"eval_interval", 0}});
  EXPECT_EQ(run("train " + cfg, &err), 2);
  // (now at the configuration, before the data is opened: stop 73)
  EXPECT_NE(err.find("data.eod_id: 97 is outside the model's vocabulary [0, 97)"), std::string::npos) << err;
}

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
  // Ids the vocabulary does not have, however written, are refused naming the line (4294968710
  // decoded as id 1414, 1414.9 as 1414 and true as 1; a string exited 1 with a JSON type error).
  for (const char* bad : {"[4294968710]", "[1.5]", "[true]", "[\"a\"]", "[-1]", "[100000]"}) {
    std::ofstream(dir() + "/bad.jsonl") << "[1]\n" << bad << "\n";
    EXPECT_EQ(run("tokenizer decode " + dir() + "/corpus.tokenizer.json < " + dir() + "/bad.jsonl", &err), 2) << bad;
    EXPECT_NE(err.find("stdin:2: "), std::string::npos) << bad << ": " << err;
  }
  EXPECT_NE(err.find("id 100000 out of range (the vocabulary has "), std::string::npos) << err;
  std::ofstream(dir() + "/empty-texts.jsonl") << "{\"text\": \"\"}\n{\"text\": \"\"}\n";
  EXPECT_EQ(run("tokenize " + dir() + "/empty-texts.jsonl -o " + dir() + "/et --tokenizer " + dir() + "/corpus.tokenizer.json", &err), 2);
  EXPECT_NE(err.find("every document's text is empty: nothing to tokenize"), std::string::npos) << err;
  EXPECT_EQ(run("tokenize " + dir() + "/absent.txt -o " + dir() + "/x --train-bpe 300", &err), 2);
  EXPECT_NE(err.find("absent.txt"), std::string::npos);
  // A record without text is a document of no sequences, as Megatron's preprocess_data.py writes it
  // (it was a lone <|endoftext|>).
  std::ofstream(dir() + "/docs.jsonl") << "{\"text\": \"The cat sat.\"}\n{\"text\": \"\"}\n{\"text\": \"The dog sat.\"}\n";
  ASSERT_EQ(run("tokenize " + dir() + "/docs.jsonl -o " + dir() + "/docs --tokenizer " + dir() + "/corpus.tokenizer.json"), 0);
  mt::data::IndexedDataset docs(dir() + "/docs");
  const mt::data::Tokenizer tok = mt::data::Tokenizer::load(dir() + "/corpus.tokenizer.json");
  ASSERT_EQ(docs.num_documents(), 3u);
  EXPECT_EQ(docs.num_sequences(), 2u);
  EXPECT_EQ(docs.document_first_sequence(1), 1u);
  EXPECT_EQ(docs.document_first_sequence(2), 1u);  // the empty record holds none
  EXPECT_EQ(docs.total_tokens(), tok.encode("The cat sat.").size() + tok.encode("The dog sat.").size() + 2);
}

}  // namespace

// Acceptance: Hugging Face-layout GPT-2 weights (the gpt2 hub file's bare-trunk names and mask
// buffers) and a Megatron dataset, both written by tools/make_golden.py; 5 fp32 AdamW steps through
// `meshtrain train` give PyTorch's losses. Then `export --hf` of that checkpoint loads strictly into
// the HF-faithful PyTorch model, whose loss on the next global batch equals the one meshtrain
// computes when it resumes for that step.
namespace {

std::string golden_engine_dir() { return std::string(MT_GOLDEN_DIR) + "/engine-gpt2"; }

std::string hf_run_config(const nlohmann::json& expected, int64_t iters, const std::string& save_dir,
                          const nlohmann::json& extra = nlohmann::json::object()) {
  nlohmann::json j;
  j["model"] = {{"init_from", golden_engine_dir()}};
  j["data"] = {{"train", golden_engine_dir() + "/train"}, {"shuffle", false}};
  j["seq_length"] = expected["seq_length"];
  j["train_iters"] = iters;
  j["train_micro_batch_size_per_gpu"] = expected["micro_batch"];
  j["gradient_accumulation_steps"] = expected["gradient_accumulation_steps"];
  j["gradient_clipping"] = expected["gradient_clipping"];
  j["optimizer"] = {{"type", "AdamW"},
                    {"params", {{"lr", expected["lr"]}, {"betas", expected["betas"]}, {"eps", expected["eps"]},
                                {"weight_decay", expected["weight_decay"]}}}};
  j["save_dir"] = save_dir;
  j["steps_per_print"] = 1;
  j.update(extra);
  std::string path = dir() + "/hf_run.json";
  std::ofstream(path) << j.dump();
  return path;
}

double python_loss_of_export(const std::string& export_dir, const std::vector<int32_t>& rows, int B, int T) {
  std::string toks = dir() + "/rows.json";
  std::ofstream(toks) << nlohmann::json(rows).dump();
  std::string out = dir() + "/py.json";
  std::string cmd = "/usr/bin/python3 " + std::string(MT_SOURCE_DIR) + "/tools/check_hf_export.py " + export_dir + " " +
                    toks + " " + std::to_string(B) + " " + std::to_string(T) + " > " + out;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(out);
  return nlohmann::json::parse(f)["loss"].get<double>();
}

TEST(Train, HfGpt2WeightsFiveStepsMatchPyTorchAndExportLoadsInPyTorch) {
  std::ifstream ef(golden_engine_dir() + "/expected.json");
  ASSERT_TRUE(ef.good()) << "golden data missing: " << golden_engine_dir();
  nlohmann::json expected = nlohmann::json::parse(ef);
  std::vector<double> want = expected["losses"].get<std::vector<double>>();
  std::string save = dir() + "/ckpt-hf";
  std::string cfg = hf_run_config(expected, static_cast<int64_t>(want.size()), save);
  ASSERT_EQ(run("train " + cfg + " --metrics " + dir() + "/hf.jsonl"), 0);
  std::vector<double> got = losses(dir() + "/hf.jsonl");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4 * std::fabs(want[i])) << "step " << i + 1;

  // Export (f32 and bf16) and check in PyTorch on the next global batch.
  ASSERT_EQ(run("export " + save + " --hf " + dir() + "/hf-out"), 0);
  ASSERT_EQ(run("export " + save + " --hf " + dir() + "/hf-out-bf16 --dtype bf16"), 0);
  const int T = expected["seq_length"].get<int>();
  const int B = expected["micro_batch"].get<int>() * expected["gradient_accumulation_steps"].get<int>();
  mt::data::IndexedDataset ds(golden_engine_dir() + "/train");
  mt::data::TokenStream stream(ds, T, false, 0);
  std::vector<int32_t> rows, in(static_cast<size_t>(T)), tg(static_cast<size_t>(T));
  for (int b = 0; b < B; ++b) {
    stream.sample(want.size() * B + b, in.data(), tg.data());
    rows.insert(rows.end(), in.begin(), in.end());
    rows.push_back(tg.back());
  }
  double py = python_loss_of_export(dir() + "/hf-out", rows, B, T);
  double py_bf16 = python_loss_of_export(dir() + "/hf-out-bf16", rows, B, T);
  ASSERT_EQ(run("train " + cfg + " --resume " + save + " --set train_iters=" + std::to_string(want.size() + 1) +
                " --set save_dir=" + dir() + "/ckpt-hf2 --metrics " + dir() + "/hf2.jsonl"), 0);
  std::vector<double> next = losses(dir() + "/hf2.jsonl");
  ASSERT_EQ(next.size(), 1u);
  EXPECT_NEAR(py, next[0], 1e-4 * next[0]);
  EXPECT_NEAR(py_bf16, next[0], 2e-2 * next[0]);
  std::string err;
  EXPECT_EQ(run("export " + dir() + "/nowhere --hf " + dir() + "/x", &err), 2);
  EXPECT_NE(err.find("nowhere"), std::string::npos) << err;
}

// model.init_from Hugging Face weights under ZeRO: each rank's shards are made from the file a
// tensor at a time, the whole model's buffers never allocated (DESIGN-NOTES 67), at stage 3 on one
// process, at stages 1 and 3 on two (the same global batch), and with the master weights and
// gradients on disk (offload_param nvme, which refused init_from before): PyTorch's losses each time.
TEST(Train, HfWeightsUnderZeroAndOnDiskMatchPyTorch) {
  std::ifstream ef(golden_engine_dir() + "/expected.json");
  ASSERT_TRUE(ef.good()) << "golden data missing: " << golden_engine_dir();
  nlohmann::json expected = nlohmann::json::parse(ef);
  std::vector<double> want = expected["losses"].get<std::vector<double>>();
  const int gas = expected["gradient_accumulation_steps"].get<int>();
  ASSERT_EQ(gas % 2, 0);
  const std::string nvme = dir() + "/hf-nvme";
  fs::create_directories(nvme);
  struct Case {
    std::string name;
    int procs;
    nlohmann::json extra;
  };
  const std::vector<Case> cases = {
      {"zero3", 1, {{"zero_optimization", {{"stage", 3}}}}},
      {"zero1-2ranks", 2, {{"zero_optimization", {{"stage", 1}}}, {"gradient_accumulation_steps", gas / 2}}},
      {"zero3-2ranks", 2, {{"zero_optimization", {{"stage", 3}}}, {"gradient_accumulation_steps", gas / 2}}},
      {"zero3-nvme", 1,
       {{"zero_optimization",
         {{"stage", 3},
          {"offload_param", {{"device", "nvme"}, {"nvme_path", nvme}}},
          {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", nvme}}}}}}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    std::string cfg = hf_run_config(expected, static_cast<int64_t>(want.size()), dir() + "/ckpt-" + k.name, k.extra);
    const std::string metrics = dir() + "/hf-" + k.name + ".jsonl";
    std::string err;
    ASSERT_EQ(run((k.procs > 1 ? "launch -n 2 -- train " : "train ") + cfg + " --metrics " + metrics, &err), 0) << err;
    std::vector<double> got = losses(metrics);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4 * std::fabs(want[i])) << "step " << i + 1;
  }
}

// The same data through other optimizers, schedules and weight-decay groups: AdamW under DeepSpeed's
// OneCycle (lr and beta1 cycled, beta2 pinned to 0.99) with HF Trainer's no-decay group, SGD and
// AdamW under DeepSpeed's LRRangeTest (continuous, staircase), and SGD with Nesterov momentum and
// weight decay, each against PyTorch (torch.optim + a transcription of DeepSpeed's OneCycle and
// LRRangeTest, tools/ds_schedules.py).
TEST(Train, OptimizerVariantsMatchPyTorch) {
  std::ifstream ef(golden_engine_dir() + "/expected.json");
  ASSERT_TRUE(ef.good()) << "golden data missing: " << golden_engine_dir();
  nlohmann::json expected = nlohmann::json::parse(ef);
  ASSERT_GE(expected["variants"].size(), 2u);
  for (const auto& [name, v] : expected["variants"].items()) {
    SCOPED_TRACE(name);
    std::vector<double> want = v["losses"].get<std::vector<double>>();
    std::string cfg = hf_run_config(expected, static_cast<int64_t>(want.size()), dir() + "/ckpt-" + name, v["config"]);
    fs::remove(dir() + "/variant.jsonl");
    std::string err;
    ASSERT_EQ(run("train " + cfg + " --metrics " + dir() + "/variant.jsonl", &err), 0) << err;
    std::vector<double> got = losses(dir() + "/variant.jsonl");
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4 * std::fabs(want[i])) << "step " << i + 1;
  }
}

}  // namespace

// A kill (SIGKILL, via the MT_FAULT seam of base/fault.h) at each stage of a checkpoint write
// leaves the previous checkpoint loadable and named by `latest`; resuming from the save_dir then
// reproduces the uninterrupted run's losses.
namespace {

// A save_dir on a small disk (a tmpfs mounted for the test; root only). keep_last 2 on a disk that
// holds two checkpoints and not three: the third save failed (ENOSPC) before rotation could remove
// the oldest, which it removes right after; now the oldest goes first, with a line, and the run
// keeps its two newest. A disk smaller than one checkpoint is said at the start (it was found at the
// first save). Stop 77.
TEST(Train, KeepLastOnADiskOfThatManyCheckpointsRotatesBeforeTheSave) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  write_dataset(dir() + "/train", 30);
  std::string err;
  const std::string probe = write_config("space-probe", {{"train_iters", 1}, {"save_interval", 1}, {"eval_interval", 0}});
  ASSERT_EQ(run("train " + probe, &err), 0) << err;
  uint64_t one = 0;  // a checkpoint's bytes on disk, each file in whole pages
  for (const auto& e : fs::recursive_directory_iterator(dir() + "/ckpt-space-probe/step-1"))
    if (e.is_regular_file()) one += (static_cast<uint64_t>(e.file_size()) + 4095) / 4096 * 4096;
  ASSERT_GT(one, 100000u);
  const std::string mnt = dir() + "/small-disk";
  struct Mount {
    std::string at;
    bool ok = false;
    void mount(uint64_t bytes) {
      unmount();
      fs::create_directories(at);
      ok = std::system(("mount -t tmpfs -o size=" + std::to_string(bytes) + " tmpfs " + at + " 2>/dev/null").c_str()) == 0;
    }
    void unmount() {
      if (ok) ok = std::system(("umount " + at).c_str()) != 0;
    }
    ~Mount() { unmount(); }
  } disk{mnt};
  disk.mount(one * 5 / 2 + 65536);  // two checkpoints, `latest`, the lock; not a third
  if (!disk.ok) GTEST_SKIP() << "cannot mount a tmpfs here";
  const std::string cfg = write_config("space", {{"train_iters", 4}, {"save_interval", 1}, {"keep_last", 2}, {"eval_interval", 0},
                                                 {"save_dir", mnt + "/run"}});
  ASSERT_EQ(run("train " + cfg, &err), 0) << err;
  EXPECT_NE(err.find(": removing step-1 before the save (keep_last 2 rotates it out after it)"), std::string::npos) << err;
  EXPECT_NE(err.find(": removing step-2 before the save"), std::string::npos) << err;
  EXPECT_EQ(err.find("will fail unless room is made"), std::string::npos) << err;
  for (int s = 1; s <= 4; ++s) EXPECT_EQ(fs::exists(mnt + "/run/step-" + std::to_string(s)), s >= 3) << s;
  mt::engine::checkpoint_verify(mnt + "/run/step-4");
  mt::engine::checkpoint_verify(mnt + "/run/step-3");
  // keep_last 1 never removes the only checkpoint before its successor is written: the save fails
  // and step-4 stays the newest.
  ASSERT_EQ(run("train " + cfg + " --resume " + mnt + "/run --set train_iters=5 --set keep_last=1", &err), 1) << err;
  EXPECT_NE(err.find("No space left on device"), std::string::npos) << err;
  EXPECT_TRUE(fs::exists(mnt + "/run/step-4"));
  // Smaller than one checkpoint: one line at the start, then the first save's failure.
  disk.mount(one / 2);
  ASSERT_TRUE(disk.ok);
  const std::string tiny = write_config("space-tiny", {{"train_iters", 1}, {"save_interval", 1}, {"eval_interval", 0},
                                                      {"save_dir", mnt + "/run"}});
  EXPECT_NE(run("train " + tiny, &err), 0);
  EXPECT_NE(err.find("a checkpoint of this run takes about"), std::string::npos) << err;
  EXPECT_NE(err.find(": the first save will fail unless room is made"), std::string::npos) << err;
}

TEST(Train, KillDuringCheckpointWriteLeavesThePreviousOneLoadable) {
  write_dataset(dir() + "/train", 30);
  std::string cfg = write_config("k", nlohmann::json::object());  // 6 iterations, save_interval 3
  ASSERT_EQ(run("train " + cfg + " --set save_dir=" + dir() + "/ckpt-k-full --metrics " + dir() + "/k-full.jsonl"), 0);
  std::vector<double> full = losses(dir() + "/k-full.jsonl");
  ASSERT_EQ(full.size(), 6u);
  for (const char* point : {"checkpoint.after_weights", "checkpoint.before_rename", "checkpoint.before_latest"}) {
    SCOPED_TRACE(point);
    std::string save = dir() + "/ckpt-k-" + point;
    ASSERT_EQ(run("train " + cfg + " --set train_iters=3 --set save_dir=" + save), 0);
    std::string cmd = "MT_FAULT=" + std::string(point) + " " + MT_MESHTRAIN_BIN + " train " + cfg + " --resume " + save +
                      " --set save_dir=" + save + " > /dev/null 2>&1";
    int rc = std::system(cmd.c_str());
    ASSERT_TRUE(WIFSIGNALED(rc) || (WIFEXITED(rc) && WEXITSTATUS(rc) == 128 + SIGKILL)) << rc;
    std::ifstream latest(save + "/latest");
    std::string name;
    latest >> name;
    EXPECT_EQ(name, "step-3");
    fs::remove(dir() + "/k-resumed.jsonl");
    // An atomic write's temporary left by a kill between its open and its rename goes at the next save.
    { std::ofstream(save + "/latest.tmp.Ab3xZ9") << "step-"; }
    // The user's own entries there stay as they are: every *.tmp and *.old directory and *.tmp.XXXXXX
    // file was taken for a save's leftover (mydata.tmp/ removed, backup.old/ renamed, stop 73).
    fs::create_directories(save + "/mydata.tmp");
    fs::create_directories(save + "/backup.old");
    std::ofstream(save + "/mydata.tmp/f") << "x";
    std::ofstream(save + "/notes.tmp.backup") << "z";
    ASSERT_EQ(run("train " + cfg + " --resume " + save + " --set save_dir=" + save + " --metrics " + dir() +
                  "/k-resumed.jsonl"), 0);
    std::vector<double> resumed = losses(dir() + "/k-resumed.jsonl");
    ASSERT_EQ(resumed.size(), 3u);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(resumed[i], full[3 + i]) << "step " << 4 + i;
    EXPECT_TRUE(fs::exists(save + "/mydata.tmp/f"));
    EXPECT_TRUE(fs::is_directory(save + "/backup.old"));
    EXPECT_FALSE(fs::exists(save + "/backup"));
    EXPECT_TRUE(fs::exists(save + "/notes.tmp.backup"));
    for (const std::string user : {"mydata.tmp", "backup.old", "notes.tmp.backup"}) fs::remove_all(save + "/" + user);
    for (const auto& e : fs::directory_iterator(save))
      EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
}

// A resume whose optimizer keeps a state the checkpoint's did not (SGD with a momentum from a
// momentum-0 run) said the checkpoint was damaged: "no tensor named 'momentum_buffer/...'; no
// intact checkpoint is left beside it" (stop 73).
TEST(Train, AResumeWhoseOptimizerKeepsAnotherStateSaysWhich) {
  write_dataset(dir() + "/train", 30);
  const std::string cfg = write_config("sgd0", {{"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}}});
  std::string err;
  ASSERT_EQ(run("train " + cfg + " --set train_iters=3", &err), 0) << err;
  EXPECT_EQ(run("train " + cfg + " --resume " + dir() + "/ckpt-sgd0 --set optimizer.params.momentum=0.9 --set save_dir=" + dir() +
                    "/ckpt-sgd0-m",
                &err),
            2);
  EXPECT_NE(err.find("the checkpoint's SGD kept no 'momentum_buffer' (another setting: momentum 0 there); this run's keeps one"),
            std::string::npos) << err;
  EXPECT_EQ(err.find("no intact checkpoint"), std::string::npos) << err;
  ASSERT_EQ(run("train " + cfg + " --resume " + dir() + "/ckpt-sgd0 --set save_dir=" + dir() + "/ckpt-sgd0-same", &err), 0) << err;
}

}  // namespace

// SFT records: `tokenize` writes a loss mask that trains exactly the response (+ <|endoftext|>),
// checked by decoding the masked-in tokens back to the records' text; `train` takes the .jsonl
// directly (tokenized into save_dir/data-cache on first use) and uses the mask.
namespace {

// TRL's conversational records with an Instruct tokenizer's chat template (stop 76): `tokenize`
// trains each assistant turn as the template renders it; `train` takes the .jsonl; `generate
// --chat` lays a message out by the template (the checkpoint names its tokenizer's directory), and
// `export --hf` carries the template's files with the tokenizer.
TEST(Tokenize, ConversationsTrainTheAssistantTurnsOfTheChatTemplate) {
  const std::string jsonl = dir() + "/conv.jsonl";
  {
    std::ofstream f(jsonl);
    f << R"({"messages": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Name a colour."}, )"
         R"({"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another?"}, )"
         R"({"role": "assistant", "content": "Green, like grass."}]})" "\n";
    f << R"({"prompt": [{"role": "user", "content": "What is the capital of France?"}], )"
         R"("completion": [{"role": "assistant", "content": "Paris is the capital of France."}]})" "\n";
  }
  // A vocabulary of the records' words, then a directory with it and a ChatML template.
  ASSERT_EQ(run("tokenize " + jsonl + " -o " + dir() + "/conv-bpe --train-bpe 300"), 0);
  const std::string tokdir = dir() + "/conv-tok";
  fs::create_directories(tokdir);
  fs::copy_file(dir() + "/conv-bpe.tokenizer.json", tokdir + "/tokenizer.json", fs::copy_options::overwrite_existing);
  std::ofstream(tokdir + "/tokenizer_config.json") << nlohmann::json{
      {"eos_token", "<|endoftext|>"},
      {"chat_template",
       "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|endoftext|>' + '\n' }}"
       "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"}}.dump();
  ASSERT_EQ(run("tokenize " + jsonl + " -o " + dir() + "/conv --tokenizer " + tokdir), 0);
  mt::data::Tokenizer tok = mt::data::Tokenizer::load(tokdir);
  mt::data::IndexedDataset ds(dir() + "/conv"), mask(dir() + "/conv.mask");
  ASSERT_EQ(ds.num_documents(), 2u);
  const std::vector<std::string> want_trained = {"Blue.<|endoftext|>\nGreen, like grass.<|endoftext|>\n",
                                                 "Paris is the capital of France.<|endoftext|>\n"};
  for (uint64_t d = 0; d < 2; ++d) {
    const int64_t n = ds.sequence_length(d);
    std::vector<int32_t> ids(static_cast<size_t>(n)), m(static_cast<size_t>(n)), trained;
    ds.read(d, 0, n, ids.data());
    mask.read(d, 0, n, m.data());
    for (int64_t i = 0; i < n; ++i)
      if (m[static_cast<size_t>(i)]) trained.push_back(ids[static_cast<size_t>(i)]);
    EXPECT_EQ(tok.decode(trained), want_trained[d]) << "document " << d;
    EXPECT_EQ(ids.back(), tok.eot_id());
    EXPECT_EQ(m.back(), 0) << "the end of document after the conversation is not trained";
  }
  // `tokenizer chat`: apply_chat_template's text and ids, a line each.
  std::ofstream(dir() + "/conv-chat.in")
      << R"({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": true})" "\n";
  std::string chat_out, chat_err;
  ASSERT_EQ(mt::cli::testing::run_meshtrain(dir(), "tokenizer chat " + tokdir + " < " + dir() + "/conv-chat.in", &chat_out), 0);
  const std::string chat_text = "<|im_start|>user\nHi<|endoftext|>\n<|im_start|>assistant\n";
  EXPECT_EQ(nlohmann::json::parse(chat_out), (nlohmann::json{{"text", chat_text}, {"ids", tok.encode(chat_text)}}));
  // A line the template fails on is named (str + None in its second line's message).
  std::ofstream(dir() + "/conv-chat.in", std::ios::app) << R"({"messages": [{"role": "assistant", "content": null}]})" "\n";
  EXPECT_EQ(mt::cli::testing::run_meshtrain(dir(), "tokenizer chat " + tokdir + " < " + dir() + "/conv-chat.in", &chat_out,
                                            &chat_err),
            2);
  EXPECT_NE(chat_err.find("stdin:2: "), std::string::npos) << chat_err;
  std::string cfg = write_config("conv", {{"data", {{"train", jsonl}, {"tokenizer", tokdir}, {"shuffle", false}}},
                                          {"model", {{"model_type", "gpt2"}, {"vocab_size", 300}, {"n_positions", 128},
                                                     {"n_embd", 32}, {"n_layer", 1}, {"n_head", 2}}},
                                          {"train_iters", 2}, {"save_interval", 2}});
  std::string out, err;
  ASSERT_EQ(run("train " + cfg, &err), 0) << err;
  const std::string ckpt = dir() + "/ckpt-conv";
  auto gen = [&](const std::string& model, const std::string& flags) {
    return mt::cli::testing::run_meshtrain(dir(), "generate " + model + " --prompt 'Name a colour.' --temperature 0 "
                                                  "--max-new-tokens 4 " + flags, &out, &err);
  };
  ASSERT_EQ(gen(ckpt, "--chat --system 'Be kind.'"), 0) << err;
  // The prompt counted on stderr is the template's text with its generation prompt.
  const size_t prompt_tokens =
      tok.encode("<|im_start|>system\nBe kind.<|endoftext|>\n<|im_start|>user\nName a colour.<|endoftext|>\n<|im_start|>assistant\n")
          .size();
  EXPECT_NE(err.find(std::to_string(prompt_tokens) + " prompt + "), std::string::npos) << err;
  EXPECT_EQ(out.find("Name a colour."), std::string::npos) << "the answer alone: " << out;
  EXPECT_EQ(gen(ckpt, "--system x"), 2);
  EXPECT_NE(err.find("--system needs --chat"), std::string::npos) << err;
  ASSERT_EQ(run("export " + ckpt + " --hf " + dir() + "/conv-hf", &err), 0) << err;
  EXPECT_TRUE(fs::exists(dir() + "/conv-hf/tokenizer_config.json"));
  ASSERT_EQ(gen(dir() + "/conv-hf", "--chat --system 'Be kind.'"), 0) << err;
  EXPECT_NE(err.find(std::to_string(prompt_tokens) + " prompt + "), std::string::npos) << err;
}

TEST(Tokenize, SftRecordsTrainOnlyTheResponse) {
  std::string jsonl = dir() + "/sft.jsonl";
  std::vector<std::pair<std::string, std::string>> records = {
      {"What is the capital of France?", "Paris is the capital of France."},
      {"Name a colour.", "Blue."},
      {"And another one?", "Green, like grass."}};
  {
    std::ofstream f(jsonl);
    f << nlohmann::json({{"prompt", records[0].first}, {"response", records[0].second}}).dump() << "\n";
    f << nlohmann::json({{"prompt", records[1].first}, {"response", records[1].second}}).dump() << "\n\n";
    f << nlohmann::json({{"prompt", records[2].first}, {"response", records[2].second},
                         {"history", nlohmann::json::array({nlohmann::json::array({records[1].first, records[1].second})})}}).dump() << "\n";
  }
  ASSERT_EQ(run("tokenize " + jsonl + " -o " + dir() + "/sft --train-bpe 300"), 0);
  mt::data::Tokenizer tok = mt::data::Tokenizer::load(dir() + "/sft.tokenizer.json");
  mt::data::IndexedDataset ds(dir() + "/sft"), mask(dir() + "/sft.mask");
  ASSERT_EQ(ds.num_documents(), 3u);
  ASSERT_EQ(mask.total_tokens(), ds.total_tokens());
  for (uint64_t d = 0; d < 3; ++d) {
    int64_t n = ds.sequence_length(d);
    std::vector<int32_t> ids(static_cast<size_t>(n)), m(static_cast<size_t>(n)), trained, all;
    ds.read(d, 0, n, ids.data());
    mask.read(d, 0, n, m.data());
    for (int64_t i = 0; i < n; ++i)
      if (m[static_cast<size_t>(i)]) trained.push_back(ids[static_cast<size_t>(i)]);
    EXPECT_EQ(tok.decode(trained), records[d].second + "<|endoftext|>") << "document " << d;
    std::string whole = tok.decode(ids);
    std::string want = (d == 2 ? records[1].first + "\n" + records[1].second + "\n" : std::string()) + records[d].first +
                       "\n" + records[d].second + "<|endoftext|>";
    EXPECT_EQ(whole, want);
  }
  // train straight from the .jsonl with the mask.
  std::string cfg = write_config("sft", {{"data", {{"train", jsonl}, {"tokenizer", dir() + "/sft.tokenizer.json"},
                                                   {"shuffle", false}}},
                                         {"model", {{"model_type", "gpt2"}, {"vocab_size", 300}, {"n_positions", 32},
                                                    {"n_embd", 32}, {"n_layer", 1}, {"n_head", 2}}},
                                         {"train_iters", 2}});
  std::string err;
  // Killed between writing the two datasets of the cache (the tokens' was written first, and every
  // later run reused it without its mask): the next run tokenizes again and trains with the mask.
  setenv("MT_FAULT", "corpus.between_finalizes", 1);
  EXPECT_NE(run("train " + cfg, &err), 0);
  unsetenv("MT_FAULT");
  ASSERT_EQ(run("train " + cfg + " --overwrite --metrics " + dir() + "/sft.jsonl.metrics", &err), 0) << err;
  EXPECT_NE(err.find("loss mask"), std::string::npos) << err;
  {
    size_t masks = 0;  // STEM-HASH.mask.idx
    for (const auto& e : fs::directory_iterator(dir() + "/ckpt-sft/data-cache"))
      masks += e.path().filename().string().rfind("sft-", 0) == 0 && e.path().string().find(".mask.idx") != std::string::npos;
    EXPECT_EQ(masks, 1u);
  }
  std::vector<double> l = losses(dir() + "/sft.jsonl.metrics");
  ASSERT_EQ(l.size(), 2u);
  EXPECT_TRUE(std::isfinite(l[0]) && l[0] > 0);
  // Packed records attend only within themselves with data.reset_attention_mask: each ends with the
  // tokenizer's <|endoftext|> (TRL's padding-free packing), and the samples here span records.
  std::string packed = write_config("sft-docs", {{"data", {{"train", jsonl}, {"tokenizer", dir() + "/sft.tokenizer.json"},
                                                           {"shuffle", false}, {"reset_attention_mask", true}}},
                                                 {"model", {{"model_type", "gpt2"}, {"vocab_size", 300}, {"n_positions", 32},
                                                            {"n_embd", 32}, {"n_layer", 1}, {"n_head", 2}}},
                                                 {"train_iters", 2}, {"save_dir", dir() + "/ckpt-sft"}});
  ASSERT_EQ(run("train " + packed + " --overwrite --metrics " + dir() + "/sft-docs.metrics", &err), 0) << err;
  EXPECT_NE(err.find("data.reset_attention_mask: a document ends at token " + std::to_string(tok.eot_id()) + " (<|endoftext|> of "),
            std::string::npos) << err;
  std::vector<double> ld = losses(dir() + "/sft-docs.metrics");
  ASSERT_EQ(ld.size(), 2u);
  // (a one-layer model at its initialisation: the attention moves the loss by 5e-5; the runs are
  // deterministic, so the same attention would give the same bits)
  EXPECT_GT(std::max(std::fabs(ld[0] - l[0]) / l[0], std::fabs(ld[1] - l[1]) / l[1]), 1e-5)
      << "the records' attention did not change";
  // A record that is neither text nor SFT: one line naming file:line.
  std::ofstream(dir() + "/bad.jsonl") << "{\"prompt\": \"x\"}\n";
  EXPECT_EQ(run("tokenize " + dir() + "/bad.jsonl -o " + dir() + "/bad --train-bpe 260", &err), 2);
  EXPECT_NE(err.find("bad.jsonl:1"), std::string::npos) << err;
}

}  // namespace

namespace {

// The loss curve: `train --metrics F` leaves F's .png beside it (gnuplot is in install-deps), and
// `plot` draws PNG or SVG; bad metrics are one line naming file:line.
TEST(Plot, TrainLeavesALossCurveAndPlotDrawsPngOrSvg) {
  write_dataset(dir() + "/train", 30);
  std::string cfg = write_config("plot", nlohmann::json::object());
  ASSERT_EQ(run("train " + cfg + " --metrics " + dir() + "/plot.jsonl"), 0);
  auto png_magic = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    char m[8] = {};
    f.read(m, 8);
    return std::string(m, 8) == "\x89PNG\r\n\x1a\n";
  };
  EXPECT_TRUE(png_magic(dir() + "/plot.png"));
  ASSERT_EQ(run("plot " + dir() + "/plot.jsonl -o " + dir() + "/curve.svg"), 0);
  std::ifstream svg(dir() + "/curve.svg");
  std::stringstream ss;
  ss << svg.rdbuf();
  EXPECT_NE(ss.str().find("<svg"), std::string::npos);
  EXPECT_NE(ss.str().find("validation loss"), std::string::npos);  // eval_interval 3 -> val_loss points
  std::ofstream(dir() + "/bad-metrics.jsonl") << "{\"step\": 1, \"loss\": 2}\n{oops\n";
  std::string err;
  EXPECT_EQ(run("plot " + dir() + "/bad-metrics.jsonl", &err), 2);
  EXPECT_NE(err.find("bad-metrics.jsonl:2"), std::string::npos) << err;
  // A null val_loss or lr is a step without them (nlohmann's type_error, without a line, before).
  std::ofstream(dir() + "/null-metrics.jsonl") << "{\"step\": 1, \"loss\": 2, \"val_loss\": null, \"lr\": null}\n"
                                                << "{\"step\": 2, \"loss\": 1.5, \"lr\": \"x\"}\n";
  EXPECT_EQ(run("plot " + dir() + "/null-metrics.jsonl -o " + dir() + "/null.svg", &err), 2);
  EXPECT_NE(err.find("null-metrics.jsonl:2: \"val_loss\" and \"lr\" must be numbers"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir() + "/null.svg.dat"));  // a refused input left its work file behind
  // An output in a directory that is not there: one line, bad input (gnuplot's own line and its raw
  // wait status, exit 1).
  EXPECT_EQ(run("plot " + dir() + "/bad-metrics.jsonl -o " + dir() + "/nodir/x.png", &err), 2);
  EXPECT_NE(err.find("/nodir is not a directory"), std::string::npos) << err;
}

// From a probe of plot (stop 72): the last line of a run still writing its metrics is cut short
// (it refused the whole plot), a non-finite loss written null stopped it, an output path with an
// apostrophe broke gnuplot's command line (three lines, exit 1), and a one-step curve printed
// gnuplot's "empty range" warnings.
TEST(Plot, ALineCutShortANullLossAndAnApostropheInThePath) {
  fs::create_directories(dir() + "/o'brien");
  std::ofstream(dir() + "/live.jsonl") << "{\"step\": 1, \"loss\": 2.5, \"lr\": 0.1}\n{\"step\": 2, \"loss\": null, \"lr\": 0.1}\n"
                                       << "{\"step\": 3, \"loss\": 2.0, \"lr\": 0.1}\n{\"step\": 4, \"lo";
  std::string err;
  const std::string out = dir() + "/o'brien/curve.svg";
  ASSERT_EQ(run("plot " + dir() + "/live.jsonl -o \"" + out + "\"", &err), 0) << err;
  EXPECT_EQ(err, "warning: " + dir() + "/live.jsonl:4: a line cut short (a run still writing it?), not plotted\n");
  EXPECT_TRUE(fs::exists(out));
  for (const char* left : {".dat", ".gp", ".log"}) EXPECT_FALSE(fs::exists(out + left)) << left;
  std::ofstream(dir() + "/one.jsonl") << "{\"step\": 1, \"loss\": 1}\n";
  ASSERT_EQ(run("plot " + dir() + "/one.jsonl -o " + dir() + "/one.svg", &err), 0) << err;
  EXPECT_EQ(mt::cli::testing::slurp(dir() + "/stdout.txt") + err, "loss curve: " + dir() + "/one.svg\n");
}

// From a probe of tokenize (stop 72): an output prefix whose file is the input replaced the text
// by its token ids (exit 0); a .json input (Megatron's loose JSON, a record a line) was tokenized
// as text, braces and keys; a gzip or binary "text" was tokenized byte by byte; a missing output
// directory failed after the work, exit 1, naming PREFIX.bin.tmp.
TEST(Tokenize, TheInputIsNeverTheOutputAndTextIsUtf8) {
  std::string err;
  const std::string tok = dir() + "/tk";
  std::ofstream(dir() + "/tk.txt") << "The cat sat on the mat.\n\nThe dog sat on the log.\n";
  ASSERT_EQ(run("tokenize " + dir() + "/tk.txt -o " + tok + " --train-bpe 270", &err), 0) << err;
  std::ofstream(dir() + "/in.bin") << "The cat sat.\n";
  EXPECT_EQ(run("tokenize " + dir() + "/in.bin -o " + dir() + "/in --tokenizer " + tok + ".tokenizer.json", &err), 2);
  EXPECT_NE(err.find("would write " + dir() + "/in.bin, which is the input"), std::string::npos) << err;
  EXPECT_EQ(mt::cli::testing::slurp(dir() + "/in.bin"), "The cat sat.\n");
  // The tokenizer's own file as the input, with the prefix that names it.
  EXPECT_EQ(run("tokenize " + tok + ".tokenizer.json -o " + tok + " --tokenizer " + tok + ".tokenizer.json", &err), 2);
  EXPECT_NE(err.find("which is the input"), std::string::npos) << err;
  std::ofstream(dir() + "/loose.json") << "{\"text\": \"The cat sat.\"}\n{\"text\": \"The dog.\"}\n";
  ASSERT_EQ(run("tokenize " + dir() + "/loose.json -o " + dir() + "/loose --tokenizer " + tok + ".tokenizer.json", &err), 0) << err;
  EXPECT_EQ(mt::data::IndexedDataset(dir() + "/loose").num_documents(), 2u);
  std::ofstream(dir() + "/array.json") << "[{\"text\": \"The cat sat.\"}]\n";
  EXPECT_EQ(run("tokenize " + dir() + "/array.json -o " + dir() + "/array --tokenizer " + tok + ".tokenizer.json", &err), 2);
  EXPECT_NE(err.find("array.json:1: expected a JSON object"), std::string::npos) << err;
  std::ofstream(dir() + "/latin1.txt") << "The cat sat.\n\ncaf\xe9\n";
  EXPECT_EQ(run("tokenize " + dir() + "/latin1.txt -o " + dir() + "/latin1 --tokenizer " + tok + ".tokenizer.json", &err), 2);
  EXPECT_NE(err.find("latin1.txt:3: not valid UTF-8 text"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir() + "/latin1.bin"));
  EXPECT_EQ(run("tokenize " + dir() + "/tk.txt -o " + dir() + "/nodir/x --tokenizer " + tok + ".tokenizer.json", &err), 2);
  EXPECT_NE(err.find("tokenize: -o " + dir() + "/nodir/x: " + dir() + "/nodir is not a directory"), std::string::npos) << err;
  fs::create_directories(dir() + "/dd.bin");
  EXPECT_EQ(run("tokenize " + dir() + "/tk.txt -o " + dir() + "/dd --tokenizer " + tok + ".tokenizer.json", &err), 2);
  EXPECT_NE(err.find(dir() + "/dd.bin is a directory"), std::string::npos) << err;
}

// Values that crashed a command, or had it exit 0 having done nothing or lost its output (a
// review, stop 56), and a dataset prefix tokenized again over an SFT one.
// `config check` writes nothing: it created the save_dir's directories (a `--set save_dir=a=b`
// typo left ./a=b behind); it still says a save_dir that cannot be made.
TEST(Cli, ConfigCheckWritesNothing) {
  std::string err;
  std::ofstream(dir() + "/cc.txt") << "The cat sat on the mat.\n";
  std::ofstream(dir() + "/cc.tokenizer.json") << "{}";
  std::ofstream(dir() + "/cc.json") << R"({"model": {"model_type": "gpt2", "vocab_size": 97, "n_positions": 32, "n_embd": 32,)"
                                       R"( "n_layer": 1, "n_head": 2}, "train_micro_batch_size_per_gpu": 1, "seq_length": 16,)"
                                       R"( "train_iters": 2, "data": {"train": ")" + dir() + R"(/cc.txt", "tokenizer": ")" + dir() +
                                           R"(/cc.tokenizer.json"}})";
  const std::string save = dir() + "/cc-check/sub";
  EXPECT_EQ(run("config check " + dir() + "/cc.json --set save_dir=" + save, &err), 0) << err;
  EXPECT_FALSE(fs::exists(dir() + "/cc-check"));
  std::ofstream(dir() + "/cc-file") << "x";  // a file where a directory would go
  EXPECT_EQ(run("config check " + dir() + "/cc.json --set save_dir=" + dir() + "/cc-file/sub", &err), 2);
  EXPECT_NE(err.find("cc-file is not a directory"), std::string::npos) << err;
  // An nvme_path where a file is: config check passed it, and train failed at the swap's start
  // naming the derived rank directory (stop 73). Both name the key now; a path still to be made passes.
  const std::string nvme = " --set zero_optimization.stage=3 --set zero_optimization.offload_optimizer.device=nvme"
                           " --set zero_optimization.offload_optimizer.nvme_path=";
  for (const char* cmd : {"config check ", "train "}) {
    EXPECT_EQ(run(cmd + dir() + "/cc.json" + nvme + dir() + "/cc-file", &err), 2) << cmd;
    EXPECT_NE(err.find("zero_optimization.offload_optimizer.nvme_path: " + dir() + "/cc-file is not a directory and cannot be one"),
              std::string::npos) << err;
  }
  EXPECT_EQ(run("config check " + dir() + "/cc.json" + nvme + dir() + "/cc-swap/new", &err), 0) << err;
  EXPECT_FALSE(fs::exists(dir() + "/cc-swap"));
  // A pipeline was refused at the one process the check assumed, with no way to say more (stop 73).
  EXPECT_EQ(run("config check " + dir() + "/cc.json --set parallel.pp=2 --set model.n_layer=2", &err), 2);
  EXPECT_NE(err.find("(config check counted 1: give --procs N)"), std::string::npos) << err;
  EXPECT_EQ(run("config check " + dir() + "/cc.json --set parallel.pp=2 --set model.n_layer=2 --procs 2", &err), 0) << err;
  // A prefix given with its .bin said "dset.bin.bin does not exist" (stop 73).
  std::ofstream(dir() + "/dset.bin") << "";
  EXPECT_EQ(run("config check " + dir() + "/cc.json --set data.train=" + dir() + "/dset.bin", &err), 2);
  EXPECT_NE(err.find("dset.bin.bin does not exist (an indexed-dataset prefix, or a .txt/.jsonl file); give the prefix, without .bin"),
            std::string::npos) << err;
}

TEST(Cli, ValuesThatCrashedOrLostTheOutputAreRefused) {
  std::string err;
  std::ofstream(dir() + "/auto-plan.json") << R"({"model": {"model_type": "gpt2", "vocab_size": 97, "n_positions": 32,)"
                                              R"( "n_embd": 32, "n_layer": 1, "n_head": 2}, "parallel": "auto", "train_batch_size": 4})";
  EXPECT_EQ(run("plan " + dir() + "/auto-plan.json --procs 0", &err), 2);  // SIGFPE
  EXPECT_NE(err.find("--procs must be at least 1, got 0"), std::string::npos) << err;
  EXPECT_EQ(run("bench --io " + dir() + " --io-size 1 --io-block -1", &err), 2);  // SIGFPE
  EXPECT_NE(err.find("--io-block must be a multiple of 4096 bytes"), std::string::npos) << err;
  // A directory not there was made, and the disk under it measured, exit 0 (stop 73).
  EXPECT_EQ(run("bench --io " + dir() + "/no-such-dir --io-size 1", &err), 2);
  EXPECT_NE(err.find("--io " + dir() + "/no-such-dir: no such directory"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir() + "/no-such-dir"));
  const std::string model = std::string(MT_SOURCE_DIR) + "/configs/models/tiny-gpt2.json";
  EXPECT_EQ(run("bench " + model + " --decode 4 --device cuda", &err), 2);  // timed the CPU
  EXPECT_NE(err.find("--decode times generation on the CPU"), std::string::npos) << err;
  EXPECT_EQ(run("bench " + model + " --decode 0", &err), 2);  // ran the training benchmark, exit 0
  EXPECT_NE(err.find("--decode must be a number of decode steps (>= 1)"), std::string::npos) << err;
  for (const char* bad : {"--duration inf", "--duration 1e10", "--clients ''"}) {  // 0 requests, exit 0
    EXPECT_EQ(run(std::string("loadtest --url http://127.0.0.1:1 ") + bad, &err), 2) << bad;
    EXPECT_TRUE(err.find("--duration must be positive and at most 1e6") != std::string::npos ||
                err.find("--clients: no count given") != std::string::npos)
        << bad << ": " << err;
  }
  // A URL that is no server's, and a count list ending in a comma (exit 1 "no server answers", and
  // the empty count dropped).
  for (const char* bad : {"--url ftp://127.0.0.1:1", "--url notaurl", "--url http://", "--url http://127.0.0.1:1 --clients 1,"}) {
    EXPECT_EQ(run(std::string("loadtest ") + bad, &err), 2) << bad;
    EXPECT_TRUE(err.find("give http://HOST[:PORT][/PATH]") != std::string::npos ||
                err.find("--clients: '' is not a count") != std::string::npos)
        << bad << ": " << err;
  }
  // Hugging Face weights without their config.json: said so (it read "not a checkpoint (no state.json)").
  fs::create_directories(dir() + "/no-config");
  std::ofstream(dir() + "/no-config/model.safetensors") << "x";
  EXPECT_EQ(run("generate " + dir() + "/no-config --prompt x", &err), 2);
  EXPECT_NE(err.find("Hugging Face weights without a config.json beside them"), std::string::npos) << err;
  // Standard output on a full disk: the ids were lost and the command exited 0.
  std::ofstream(dir() + "/enc.txt") << "The cat sat on the mat.\n\nThe dog sat on the log.\n\nCats and dogs sat.\n";
  ASSERT_EQ(run("tokenize " + dir() + "/enc.txt -o " + dir() + "/enc --train-bpe 270"), 0);
  std::ofstream(dir() + "/enc.jsonl") << "\"The cat\"\n";
  const std::string e = dir() + "/full.err";
  const int rc = std::system((std::string(MT_MESHTRAIN_BIN) + " tokenizer encode " + dir() + "/enc.tokenizer.json < " + dir() +
                              "/enc.jsonl > /dev/full 2> " + e).c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 1);
  EXPECT_NE(mt::cli::testing::slurp(e).find("meshtrain: error: writing standard output: No space left on device"),
            std::string::npos)
      << mt::cli::testing::slurp(e);
  // An SFT corpus tokenized to a prefix, then a plain one to the same prefix: the first's loss mask
  // stayed beside the second's tokens, and training on it failed ("loss mask has 812 values ...").
  std::ofstream(dir() + "/enc-sft.jsonl") << R"({"prompt": "The cat", "response": "sat on the mat."})" << "\n";
  ASSERT_EQ(run("tokenize " + dir() + "/enc-sft.jsonl -o " + dir() + "/reused --tokenizer " + dir() + "/enc.tokenizer.json"), 0);
  ASSERT_TRUE(fs::exists(dir() + "/reused.mask.idx"));
  ASSERT_EQ(run("tokenize " + dir() + "/enc.txt -o " + dir() + "/reused --tokenizer " + dir() + "/enc.tokenizer.json"), 0);
  EXPECT_FALSE(fs::exists(dir() + "/reused.mask.idx"));
  // A dataset shorter than one sample: every sample was its few tokens cycled, trained, exit 0.
  std::ofstream(dir() + "/hi.txt") << "hi\n";
  ASSERT_EQ(run("tokenize " + dir() + "/hi.txt -o " + dir() + "/hi --tokenizer " + dir() + "/enc.tokenizer.json"), 0);
  EXPECT_EQ(run("train " + write_config("hi", {{"data", {{"train", dir() + "/hi"}}},
                                               {"model", {{"model_type", "gpt2"}, {"vocab_size", 300}, {"n_positions", 32},
                                                          {"n_embd", 32}, {"n_layer", 1}, {"n_head", 2}}}}),
                &err),
            2);
  EXPECT_NE(err.find("data.train: " + dir() + "/hi has "), std::string::npos) << err;
  EXPECT_NE(err.find("tokens, fewer than seq_length + 1 (17)"), std::string::npos) << err;
}

}  // namespace

// generate: greedy sampling with the KV cache from a checkpoint equals greedy decoding by full
// re-forward in PyTorch of the exported model; sampling options are validated.
namespace {

TEST(Generate, GreedyFromACheckpointMatchesPyTorch) {
  std::string txt = dir() + "/gen.txt";
  {
    std::ofstream f(txt);
    for (int i = 0; i < 40; ++i)
      f << "The cat sat on the mat. The dog sat on the log. A bird sat on the wire " << i << ".\n\n";
  }
  ASSERT_EQ(run("tokenize " + txt + " -o " + dir() + "/gen --train-bpe 300"), 0);
  std::string tokjson = dir() + "/gen.tokenizer.json";
  std::string cfg = write_config("gen", {{"data", {{"train", dir() + "/gen"}, {"tokenizer", tokjson}}},
                                         {"model", {{"model_type", "gpt2"}, {"vocab_size", 300}, {"n_positions", 64},
                                                    {"n_embd", 32}, {"n_layer", 2}, {"n_head", 2}}},
                                         {"train_iters", 30}, {"save_interval", 30}, {"eval_interval", 0}});
  ASSERT_EQ(run("train " + cfg), 0);
  std::string err;
  const std::string prompt = "The cat sat";
  ASSERT_EQ(run("generate " + dir() + "/ckpt-gen --prompt \"" + prompt + "\" --temperature 0 --max-new-tokens 12 --quiet", &err),
            0) << err;
  std::ifstream out(dir() + "/stdout.txt");
  std::stringstream ss;
  ss << out.rdbuf();
  std::string text = ss.str();
  ASSERT_FALSE(text.empty());
  text.pop_back();  // the final newline

  ASSERT_EQ(run("export " + dir() + "/ckpt-gen --hf " + dir() + "/gen-hf"), 0);
  EXPECT_TRUE(fs::exists(dir() + "/gen-hf/tokenizer.json"));
  // The run's tokenizer gone since: the export (weights alone) says so (it was left out silently).
  fs::rename(tokjson, tokjson + ".away");
  ASSERT_EQ(run("export " + dir() + "/ckpt-gen --hf " + dir() + "/gen-hf-bare", &err), 0) << err;
  fs::rename(tokjson + ".away", tokjson);
  EXPECT_NE(err.find("warning: the run's tokenizer " + tokjson + " no longer exists"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir() + "/gen-hf-bare/tokenizer.json"));
  mt::data::Tokenizer tok = mt::data::Tokenizer::load(tokjson);
  std::vector<int32_t> ids = tok.encode(prompt);
  std::ofstream(dir() + "/prompt.json") << nlohmann::json(ids).dump();
  std::string cmd = "/usr/bin/python3 " + std::string(MT_SOURCE_DIR) + "/tools/check_hf_export.py " + dir() + "/gen-hf " +
                    dir() + "/prompt.json --greedy 12 --stop " + std::to_string(tok.eot_id()) + " > " + dir() + "/greedy.json";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream g(dir() + "/greedy.json");
  std::vector<int32_t> py = nlohmann::json::parse(g)["ids"].get<std::vector<int32_t>>();
  if (!py.empty() && py.back() == tok.eot_id()) py.pop_back();  // generate stops before printing it
  EXPECT_EQ(text, prompt + tok.decode(py));
  // The same from the exported Hugging Face directory (its tokenizer.json found beside it).
  ASSERT_EQ(run("generate " + dir() + "/gen-hf --prompt \"" + prompt + "\" --temperature 0 --max-new-tokens 12 --quiet"), 0);
  std::ifstream out2(dir() + "/stdout.txt");
  std::stringstream ss2;
  ss2 << out2.rdbuf();
  EXPECT_EQ(ss2.str(), text + "\n");
  {  // a prompt of 63 of the 64 positions: one new token fits (prompt and answer hold the context, as serve
     // and vLLM count them; two were drawn, the last from the last position, stop 73), and it says why
     // (it stopped silently)
    std::string text_b, long_prompt;
    for (int i = 0; i < 20; ++i) text_b += "The cat sat on the mat. The dog sat on the log. ";
    for (size_t len = 1; len <= text_b.size() && long_prompt.empty(); ++len)
      if (tok.encode(text_b.substr(0, len)).size() == 63) long_prompt = text_b.substr(0, len);
    ASSERT_FALSE(long_prompt.empty());
    ASSERT_EQ(run("generate " + dir() + "/gen-hf --prompt \"" + long_prompt + "\" --temperature 0 --max-new-tokens 5 --quiet", &err), 0)
        << err;
    EXPECT_NE(err.find("warning: the context is full at 64 positions (the model's n_positions): stopped after 1 of 5 new tokens"),
              std::string::npos) << err;
  }
  // generation_config.json's eos_token_id ends the answer, as Hugging Face's generate() reads it
  // (only config.json's was read): with the first greedy id there, nothing follows the prompt. An
  // id outside the vocabulary is refused naming the file (it was dropped).
  ASSERT_FALSE(py.empty());
  std::ofstream(dir() + "/gen-hf/generation_config.json") << nlohmann::json({{"eos_token_id", {py[0], 7}}}).dump();
  ASSERT_EQ(run("generate " + dir() + "/gen-hf --prompt \"" + prompt + "\" --temperature 0 --max-new-tokens 12 --quiet", &err), 0) << err;
  EXPECT_EQ(mt::cli::testing::slurp(dir() + "/stdout.txt"), prompt + "\n");
  std::ofstream(dir() + "/gen-hf/generation_config.json") << R"({"eos_token_id": 100000})";
  EXPECT_EQ(run("generate " + dir() + "/gen-hf --prompt \"" + prompt + "\" --max-new-tokens 2 --quiet", &err), 2);
  EXPECT_NE(err.find("generation_config.json: eos_token_id 100000 is not an id of the model's vocabulary (300)"), std::string::npos) << err;
  fs::remove(dir() + "/gen-hf/generation_config.json");
  {  // The model's own bos/eos ids (a Llama 3 Instruct's list of eos ids) are exported as given: they
     // were overwritten by the tokenizer's end of text (stop 75). An id past the vocabulary (a hub
     // GPT-2 config's 50256 over this 300) is replaced by the end of text, with a line; in a list,
     // only that id. generate on the checkpoint stops at the model's eos ids as on its export (with
     // every id one, nothing follows the prompt; it drew on).
    nlohmann::json every = nlohmann::json::array();
    for (int id = 0; id < 300; ++id) every.push_back(id);
    for (const auto& [name, ids] : {std::pair<std::string, nlohmann::json>{"own-ids", {{"bos_token_id", 5}, {"eos_token_id", {6, 7}}}},
                                    {"hub-ids", {{"bos_token_id", 50256}, {"eos_token_id", 50256}}},
                                    {"mixed-ids", {{"eos_token_id", {6, 999}}}},
                                    {"every-id", {{"eos_token_id", every}}}}) {
      nlohmann::json model = {{"model_type", "gpt2"}, {"vocab_size", 300}, {"n_positions", 64}, {"n_embd", 32}, {"n_layer", 2}, {"n_head", 2}};
      model.update(ids);
      const std::string c = write_config(name, {{"data", {{"train", dir() + "/gen"}, {"tokenizer", tokjson}}}, {"model", model},
                                                {"train_iters", 1}, {"save_interval", 1}, {"eval_interval", 0}});
      ASSERT_EQ(run("train " + c, &err), 0) << err;
      ASSERT_EQ(run("export " + dir() + "/ckpt-" + name + " --hf " + dir() + "/" + name + "-hf", &err), 0) << err;
      const nlohmann::json written = nlohmann::json::parse(mt::cli::testing::slurp(dir() + "/" + name + "-hf/config.json"));
      if (name == "own-ids") {
        EXPECT_EQ(written["bos_token_id"], 5);
        EXPECT_EQ(written["eos_token_id"], nlohmann::json({6, 7}));
        // A resume whose config names no ids says so: its next checkpoint and export lose them (it
        // was silent, stop 77); with the same ids, nothing is said.
        nlohmann::json bare = model;
        bare.erase("bos_token_id");
        bare.erase("eos_token_id");
        for (const auto& [tag, m] : {std::pair<std::string, nlohmann::json>{"bare", bare}, {"same", model}}) {
          const std::string r = write_config(name + "-" + tag, {{"data", {{"train", dir() + "/gen"}, {"tokenizer", tokjson}}},
                                                               {"model", m}, {"train_iters", 2}, {"save_interval", 1},
                                                               {"eval_interval", 0}});
          ASSERT_EQ(run("train " + r + " --resume " + dir() + "/ckpt-" + name, &err), 0) << err;
          const size_t said = err.find("the checkpoint's model names bos_token_id 5 -> none, eos_token_id [6,7] -> none");
          EXPECT_EQ(said != std::string::npos, tag == "bare") << err;
        }
      } else if (name == "mixed-ids") {
        EXPECT_EQ(written["eos_token_id"], nlohmann::json({6, tok.eot_id()}));
        EXPECT_NE(err.find("warning: the model's eos_token_id 999 is not an id of its vocabulary (300)"), std::string::npos) << err;
      } else if (name == "every-id") {
        ASSERT_EQ(run("generate " + dir() + "/ckpt-" + name + " --prompt \"" + prompt + "\" --max-new-tokens 5", &err), 0) << err;
        EXPECT_NE(err.find("+ 0 new tokens"), std::string::npos) << err;
      } else {
        EXPECT_EQ(written["bos_token_id"], tok.eot_id());
        EXPECT_EQ(written["eos_token_id"], tok.eot_id());
        EXPECT_NE(err.find("warning: the model's eos_token_id 50256 is not an id of its vocabulary (300)"), std::string::npos) << err;
      }
    }
  }
  // generate reads a sharded checkpoint (tp2 x pp2: four ranks' files) as it reads a whole one: the
  // same text as from that checkpoint's Hugging Face export.
  std::string cfg3d = write_config("gen3d", {{"data", {{"train", dir() + "/gen"}, {"tokenizer", tokjson}}},
                                             {"model", {{"model_type", "gpt2"}, {"vocab_size", 300}, {"n_positions", 128},
                                                        {"n_embd", 32}, {"n_layer", 2}, {"n_head", 2}}},
                                             {"train_iters", 6}, {"save_interval", 6}, {"eval_interval", 0}});
  ASSERT_EQ(run("launch -n 4 -- train " + cfg3d + " --set parallel.tp=2 --set parallel.pp=2", &err), 0) << err;
  ASSERT_TRUE(fs::exists(dir() + "/ckpt-gen3d/step-6/model-00004-of-00004.safetensors"));
  ASSERT_EQ(run("generate " + dir() + "/ckpt-gen3d --prompt \"" + prompt + "\" --temperature 0 --max-new-tokens 12 --quiet", &err), 0)
      << err;
  std::string sharded_text = mt::cli::testing::slurp(dir() + "/stdout.txt");
  ASSERT_EQ(run("export " + dir() + "/ckpt-gen3d --hf " + dir() + "/gen3d-hf"), 0);
  ASSERT_EQ(run("generate " + dir() + "/gen3d-hf --prompt \"" + prompt + "\" --temperature 0 --max-new-tokens 12 --quiet"), 0);
  EXPECT_EQ(mt::cli::testing::slurp(dir() + "/stdout.txt"), sharded_text);
  // Sampling with a seed is reproducible; bad options are one line.
  std::string s1, s2;
  ASSERT_EQ(run("generate " + dir() + "/ckpt-gen --prompt The --temperature 0.9 --top-k 20 --top-p 0.9 --seed 7 --quiet"), 0);
  s1 = std::string(std::istreambuf_iterator<char>(*std::make_unique<std::ifstream>(dir() + "/stdout.txt")), {});
  ASSERT_EQ(run("generate " + dir() + "/ckpt-gen --prompt The --temperature 0.9 --top-k 20 --top-p 0.9 --seed 7 --quiet"), 0);
  s2 = std::string(std::istreambuf_iterator<char>(*std::make_unique<std::ifstream>(dir() + "/stdout.txt")), {});
  EXPECT_EQ(s1, s2);
  EXPECT_EQ(run("generate " + dir() + "/ckpt-gen --prompt The --top-p 1.5", &err), 2);
  EXPECT_NE(err.find("top_p"), std::string::npos) << err;
}

}  // namespace

// ---- Many processes: `meshtrain launch -n N -- train` (mpirun underneath) ----

// The weights of a checkpoint (saved in any layout), flat, in the one-process layout: read through
// the loader export and generate use.
std::vector<float> checkpoint_weights(const std::string& step_dir) {
  mt::engine::CheckpointInfo info = mt::engine::checkpoint_info(step_dir);
  mt::models::TransformerLM model(info.model, mt::models::ModelOptions{});
  mt::engine::checkpoint_load_weights(info, model.store());
  return std::vector<float>(model.store().master(), model.store().master() + model.store().numel());
}

// A global batch of 4 sequences: one process runs 4 micro-batches of 1, N ranks 4/N each.
std::string dp_config(const std::string& name, int stage, const nlohmann::json& more = nlohmann::json::object()) {
  nlohmann::json extra = {{"train_batch_size", 4}, {"train_micro_batch_size_per_gpu", 1},
                          {"gradient_accumulation_steps", "auto"}, {"comm_timeout", 20},
                          {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 5000},
                                                 {"stage3_param_persistence_threshold", 0}}}};
  extra.update(more);
  return write_config(name, extra);
}

std::string launch(int n) { return "launch -n " + std::to_string(n) + " -- train "; }

void expect_close(const std::vector<double>& a, const std::vector<double>& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], tol * std::fabs(a[i])) << what << " step " << i + 1;
}

// Weights of a checkpoint against a reference: ||w - ref|| / ||ref||.
double relative_error(const std::vector<float>& w, const std::vector<float>& ref) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < w.size(); ++i) {
    diff += (static_cast<double>(w[i]) - ref[i]) * (static_cast<double>(w[i]) - ref[i]);
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(diff / norm);
}

TEST(TrainMpi, DataParallelAndZeroMatchOneProcess) {
  write_dataset(dir() + "/train", 30);
  for (std::string dtype : {"fp32", "bf16"}) {
    nlohmann::json prec = dtype == "bf16" ? nlohmann::json{{"bf16", {{"enabled", true}}}} : nlohmann::json::object();
    ASSERT_EQ(run("train " + dp_config("one-" + dtype, 0, prec) + " --metrics " + dir() + "/one-" + dtype + ".jsonl"), 0);
    std::vector<double> one = losses(dir() + "/one-" + dtype + ".jsonl");
    std::vector<float> w1 = checkpoint_weights(dir() + "/ckpt-one-" + dtype + "/step-6");
    // fp32: every stage on 2 ranks, stages 0 and 3 on 1 and 4; bf16: stages 0 and 3 on 2 ranks
    // (the in-process suite, engine/zero_test.cpp, runs the whole matrix).
    for (int stage : {0, 1, 2, 3}) {
      for (int n : {1, 2, 4}) {
        if (n != 2 && (stage == 1 || stage == 2)) continue;
        if (dtype == "bf16" && (n != 2 || stage == 1 || stage == 2)) continue;
        std::string name = dtype + "-dp" + std::to_string(n) + "-s" + std::to_string(stage), err;
        ASSERT_EQ(run(launch(n) + dp_config(name, stage, prec) + " --metrics " + dir() + "/" + name + ".jsonl", &err), 0) << err;
        // fp32: summation order only. bf16: compute copies rounded from masters differing in the
        // last f32 bits can flip by one bf16 ulp (2^-8); 2e-3 bounds the effect over 6 steps.
        double tol = dtype == "fp32" ? 1e-5 : 2e-3;
        expect_close(one, losses(dir() + "/" + name + ".jsonl"), tol, name);
        std::vector<float> w = checkpoint_weights(dir() + "/ckpt-" + name + "/step-6");
        ASSERT_EQ(w.size(), w1.size());
        // The weights as a whole (single weights with gradients near zero move by Adam's
        // sign-like steps, lr 0.01 here, and differ more).
        EXPECT_LE(relative_error(w, w1), tol) << name;
        // Rank 0 alone reports: one "step 6/6" line.
        std::ifstream out(dir() + "/stdout.txt");
        std::string text((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
        size_t first = text.find("step 6/6");
        ASSERT_NE(first, std::string::npos) << text;
        EXPECT_EQ(text.find("step 6/6", first + 1), std::string::npos) << text;
      }
    }
  }
}

// Ulysses sequence parallelism (parallel.sp, DeepSpeed's sequence_parallel_size) under mpirun: two
// ranks share each micro-batch, half the tokens each, and train the one-process run (the in-process
// suite, engine/ulysses_test.cpp, runs more layouts); DeepSpeed's key says the same, and ZeRO 3's
// gathers (prefetched on the comm thread) run beside the all-to-alls.
TEST(TrainMpi, UlyssesSequenceParallelMatchesOneProcess) {
  write_dataset(dir() + "/train", 30);
  ASSERT_EQ(run("train " + dp_config("usp-one", 1) + " --metrics " + dir() + "/usp-one.jsonl"), 0);
  const std::vector<double> one = losses(dir() + "/usp-one.jsonl");
  const std::vector<float> w1 = checkpoint_weights(dir() + "/ckpt-usp-one/step-6");
  // (and four ranks of tp 2 x sp 2 and pp 2 x sp 2, stop 80: each tp rank's two heads split over
  // its sp pair; each pipeline stage's ranks an sp pair)
  for (const auto& [name, ranks, more] :
       {std::tuple<std::string, int, nlohmann::json>{"usp-s1", 2, {{"parallel", {{"sp", 2}}}}},
        {"usp-ds-s2", 2, {{"sequence_parallel_size", 2}, {"zero_optimization", {{"stage", 2}}}}},
        {"usp-s3", 2,
         {{"parallel", {{"sp", 2}}},
          {"zero_optimization", {{"stage", 3}, {"overlap_comm", true}, {"stage3_param_persistence_threshold", 0}}}}},
        {"usp-tp2", 4, {{"parallel", {{"sp", 2}, {"tp", 2}}}}},
        {"usp-pp2", 4, {{"parallel", {{"sp", 2}, {"pp", 2}}}}}}) {
    std::string err;
    ASSERT_EQ(run(launch(ranks) + dp_config(name, 1, more) + " --metrics " + dir() + "/" + name + ".jsonl", &err), 0) << err;
    expect_close(one, losses(dir() + "/" + name + ".jsonl"), 1e-5, name);
    const std::vector<float> w = checkpoint_weights(dir() + "/ckpt-" + name + "/step-6");
    ASSERT_EQ(w.size(), w1.size());
    EXPECT_LE(relative_error(w, w1), 1e-5) << name;
  }
}

// loss_normalization "tokens" (Megatron's --calculate-per-token-loss, Hugging Face's
// num_items_in_batch): with a loss mask that leaves the samples different numbers of targets, a
// step's loss and gradient are the global batch's mean over its targets, which one micro-batch
// holding the whole batch computes by itself (the oracle). Four micro-batches on one process, two
// data-parallel ranks at ZeRO 3, a two-stage pipeline and two tensor-parallel ranks each equal it; the default, each micro-batch's own
// mean averaged, does not. Validation divides by its own count after either.
TEST(TrainMpi, TokenLossNormalisationIsTheWholeBatchsTokenMean) {
  const std::string prefix = dir() + "/tokloss";
  {
    std::vector<int32_t> tokens, mask;
    for (int q = 0; q < 1200; ++q) {
      tokens.push_back(static_cast<int32_t>((q * 37 + q / 11) % 97));
      mask.push_back(static_cast<int32_t>((q / 5) % 4 != 0 && q % 41 > 12));
    }
    for (const auto& [path, values, vocab] : {std::tuple<std::string, const std::vector<int32_t>*, int>{prefix, &tokens, 97},
                                              {prefix + ".mask", &mask, 2}, {prefix + "-plain", &tokens, 97}}) {
      mt::data::IndexedDatasetWriter w(path, vocab);
      w.add_sequence(*values);
      w.end_document();
      w.finalize();
    }
  }
  auto config = [&](const std::string& name, int micro, const nlohmann::json& more) {
    // Validation on the same tokens without the mask: eval_iters 1 is one global batch, the same 4
    // samples in every layout (it counted micro-batches, and the layouts had to say 4 / micro).
    nlohmann::json extra = {{"data", {{"train", prefix}, {"valid", prefix + "-plain"}}}, {"train_batch_size", 4},
                            {"train_micro_batch_size_per_gpu", micro}, {"gradient_accumulation_steps", "auto"},
                            {"comm_timeout", 20}, {"eval_iters", 1}};
    extra.update(more);
    return write_config(name, extra) + " --metrics " + dir() + "/" + name + ".jsonl";
  };
  const nlohmann::json tokens = {{"loss_normalization", "tokens"}};
  std::string err;
  ASSERT_EQ(run("train " + config("tl-whole", 4, nlohmann::json::object()), &err), 0) << err;
  ASSERT_EQ(run("train " + config("tl-gas4", 1, tokens), &err), 0) << err;
  nlohmann::json zero = tokens;  // and with the gradients reduce-scattered into ZeRO 3's shards
  zero["zero_optimization"] = {{"stage", 3}, {"reduce_bucket_size", 5000}, {"stage3_param_persistence_threshold", 0}};
  ASSERT_EQ(run(launch(2) + config("tl-dp2", 1, zero), &err), 0) << err;
  nlohmann::json pp = tokens;
  pp["parallel"] = {{"pp", 2}};
  ASSERT_EQ(run(launch(2) + config("tl-pp2", 1, pp), &err), 0) << err;
  nlohmann::json tp = tokens;
  tp["parallel"] = {{"tp", 2}};
  ASSERT_EQ(run(launch(2) + config("tl-tp2", 1, tp), &err), 0) << err;
  nlohmann::json sp = tokens;  // Ulysses: both ranks read the same samples, half the tokens each
  sp["parallel"] = {{"sp", 2}};
  ASSERT_EQ(run(launch(2) + config("tl-sp2", 1, sp), &err), 0) << err;
  ASSERT_EQ(run("train " + config("tl-mean", 1, nlohmann::json::object()), &err), 0) << err;
  const std::vector<double> whole = losses(dir() + "/tl-whole.jsonl");
  ASSERT_EQ(whole.size(), 6u);
  for (const char* name : {"tl-gas4", "tl-dp2", "tl-pp2", "tl-tp2", "tl-sp2"}) {
    expect_close(whole, losses(dir() + "/" + name + ".jsonl"), 1e-5, name);
    expect_close(values(dir() + "/tl-whole.jsonl", "val_loss"), values(dir() + "/" + std::string(name) + ".jsonl", "val_loss"),
                 1e-5, std::string(name) + " validation");
  }
  const std::vector<double> mean = losses(dir() + "/tl-mean.jsonl");
  double apart = 0.0;
  for (size_t i = 0; i < whole.size(); ++i) apart = std::max(apart, std::fabs(mean[i] - whole[i]) / whole[i]);
  EXPECT_GT(apart, 1e-3) << "the micro-batches' counts differ too little to tell the normalisations apart";
}

// data.sample_order "megatron" validates as Megatron does: eval_iters global batches an
// evaluation, reading on from the last one, over a validation set built for
// (train_iters / eval_interval + 1) x eval_iters x train_batch_size samples. Here 6 steps, an
// evaluation every 3, eval_iters 2, batches of 4: 24 samples, the second evaluation reads samples
// 8-15. A token planted where the oracle (tools/check_megatron_idx.py) puts validation sample 11
// passes the first evaluation and stops the second, named at sample 11 (meshtrain's own
// validation reads the same 4 samples each time). Clean, two data-parallel ranks validate as one
// process does, and a run resumed at step 3 reads the second evaluation's samples.
TEST(TrainMpi, MegatronValidationReadsOnAcrossEvaluations) {
  if (std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) GTEST_SKIP() << "no numpy for /usr/bin/python3";
  auto write = [&](const std::string& prefix, int64_t bad_at) {
    mt::data::IndexedDatasetWriter w(prefix, 200);
    int64_t at = 0;
    for (int d = 0; d < 30; ++d) {
      std::vector<int32_t> seq;
      for (int k = 0; k < 10 + (d * 7) % 31; ++k, ++at) seq.push_back(at == bad_at ? 150 : static_cast<int32_t>((at * 29) % 97));
      w.add_sequence(seq);
      w.end_document();
    }
    w.finalize();
  };
  const std::string clean = dir() + "/mv-clean", planted = dir() + "/mv-planted";
  write(clean, -1);
  const uint64_t N = (6 / 3 + 1) * 2 * 4;
  const std::string out = dir() + "/mv-oracle.json";
  const std::string cmd = std::string("/usr/bin/python3 ") + MT_SOURCE_DIR + "/tools/check_megatron_idx.py --gpt-dataset " + clean +
                          " 16 " + std::to_string(N) + " 1234 > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  nlohmann::json want = nlohmann::json::parse(std::ifstream(out));
  ASSERT_EQ(want["positions"].size(), N);
  const uint64_t p = want["positions"][11][5].get<uint64_t>();
  uint64_t first = N;
  for (uint64_t k = 0; k < N && first == N; ++k)
    for (const auto& q : want["positions"][k])
      if (q.get<uint64_t>() == p) first = k;
  ASSERT_EQ(first, 11u) << "the planted token is met before the second evaluation";
  write(planted, static_cast<int64_t>(p));
  std::string err;
  std::string cfg = write_config("mv-planted", {{"data", {{"train", clean}, {"valid", planted}, {"sample_order", "megatron"}}}});
  EXPECT_EQ(run("train " + cfg + " --metrics " + dir() + "/mv-planted.jsonl", &err), 2);
  EXPECT_NE(err.find("data.valid: " + planted + ": token 150 at stream position " + std::to_string(p) + " (sample 11)"),
            std::string::npos)
      << err;
  EXPECT_EQ(values(dir() + "/mv-planted.jsonl", "val_loss").size(), 1u);  // step 3's passed
  // 7 steps build the same 24 samples (7 / 3 + 1 evaluations): steps 3 and 6 read slots 0 and 1,
  // the last step, between two intervals, slot 2 (Megatron's evaluation after its loop).
  const uint64_t p2 = want["positions"][19][5].get<uint64_t>();
  uint64_t first2 = N;
  for (uint64_t k = 0; k < N && first2 == N; ++k)
    for (const auto& q : want["positions"][k])
      if (q.get<uint64_t>() == p2) first2 = k;
  ASSERT_EQ(first2, 19u);
  write(planted, static_cast<int64_t>(p2));
  cfg = write_config("mv-last", {{"data", {{"train", clean}, {"valid", planted}, {"sample_order", "megatron"}}}, {"train_iters", 7}});
  EXPECT_EQ(run("train " + cfg + " --metrics " + dir() + "/mv-last.jsonl", &err), 2);
  EXPECT_NE(err.find("data.valid: " + planted + ": token 150 at stream position " + std::to_string(p2) + " (sample 19)"),
            std::string::npos)
      << err;
  EXPECT_EQ(values(dir() + "/mv-last.jsonl", "val_loss").size(), 2u);

  const nlohmann::json data = {{"train", clean}, {"valid", clean}, {"sample_order", "megatron"}};
  cfg = write_config("mv-one", {{"data", data}});
  ASSERT_EQ(run("train " + cfg + " --metrics " + dir() + "/mv-one.jsonl", &err), 0) << err;
  const std::vector<double> one = values(dir() + "/mv-one.jsonl", "val_loss");
  ASSERT_EQ(one.size(), 2u);
  cfg = write_config("mv-dp2", {{"data", data}, {"train_batch_size", 4}, {"train_micro_batch_size_per_gpu", 2},
                                {"gradient_accumulation_steps", "auto"}, {"comm_timeout", 20}});
  ASSERT_EQ(run(launch(2) + cfg + " --metrics " + dir() + "/mv-dp2.jsonl", &err), 0) << err;
  expect_close(one, values(dir() + "/mv-dp2.jsonl", "val_loss"), 1e-5, "dp 2 validation");
  cfg = write_config("mv-resumed", {{"data", data}});
  ASSERT_EQ(run("train " + cfg + " --resume " + dir() + "/ckpt-mv-one/step-3 --metrics " + dir() + "/mv-resumed.jsonl", &err), 0)
      << err;
  const std::vector<double> resumed = values(dir() + "/mv-resumed.jsonl", "val_loss");
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_NEAR(resumed[0], one[1], 1e-5 * one[1]);
  EXPECT_GT(std::fabs(one[1] - one[0]), 1e-4) << "the two evaluations read the same samples";
  // The test set (data.split's third share) is evaluated alike by one process and two ranks.
  const nlohmann::json split = {{"train", clean}, {"split", "8,1,1"}, {"sample_order", "megatron"}};
  cfg = write_config("mv-test-one", {{"data", split}});
  ASSERT_EQ(run("train " + cfg + " --metrics " + dir() + "/mv-test-one.jsonl", &err), 0) << err;
  cfg = write_config("mv-test-dp2", {{"data", split}, {"train_batch_size", 4}, {"train_micro_batch_size_per_gpu", 2},
                                     {"gradient_accumulation_steps", "auto"}, {"comm_timeout", 20},
                                     {"zero_optimization", {{"stage", 3}, {"stage3_param_persistence_threshold", 0}}}});
  ASSERT_EQ(run(launch(2) + cfg + " --metrics " + dir() + "/mv-test-dp2.jsonl", &err), 0) << err;
  const std::vector<double> t1 = values(dir() + "/mv-test-one.jsonl", "test_loss");
  ASSERT_EQ(t1.size(), 1u);
  expect_close(t1, values(dir() + "/mv-test-dp2.jsonl", "test_loss"), 1e-5, "dp 2 test loss");
  // One rank that cannot open the test set (a host's shorter copy): the ranks agree to evaluate
  // none, and that rank says why, instead of the other running the test's collectives alone.
  setenv("MT_FAULT", "train.test_share_unreadable", 1);
  const int rc = run(launch(2) + cfg + " --overwrite --metrics " + dir() + "/mv-test-one-rank.jsonl", &err);
  unsetenv("MT_FAULT");
  ASSERT_EQ(rc, 0) << err;
  EXPECT_NE(err.find("rank 1: data.split (test): this rank's copy of the test share is too short"), std::string::npos) << err;
  EXPECT_NE(err.find("another rank could not open the test set; the run evaluates none"), std::string::npos) << err;
  EXPECT_TRUE(values(dir() + "/mv-test-one-rank.jsonl", "test_loss").empty());
  EXPECT_EQ(losses(dir() + "/mv-test-one-rank.jsonl").size(), 6u);
}

// data.reset_position_ids and data.reset_attention_mask (Megatron's): documents end at token 5
// (data.eod_id), every few tokens, so every sample packs several. The numerics are PyTorch's
// (engine/golden_test.cpp's GoldenDocuments); here the keys reach the model (the plain run trains
// something else, and each flag alone differs from both), and tensor parallelism with sequence
// parallelism, a two-stage pipeline and two data-parallel ranks at ZeRO 3 train the one process's
// losses and validation, GPT-2 with both flags and LLaMA with positions alone (its RoPE).
TEST(TrainMpi, DocumentsTrainAsOneProcessInEveryLayout) {
  const std::string prefix = dir() + "/docs";
  {
    mt::data::IndexedDatasetWriter w(prefix, 97);
    std::vector<int32_t> tokens;
    for (int q = 0; q < 1200; ++q) tokens.push_back(q % 7 == 3 || q % 11 == 0 ? 5 : static_cast<int32_t>(6 + (q * 37 + q / 13) % 91));
    w.add_sequence(tokens);
    w.end_document();
    w.finalize();
  }
  const nlohmann::json llama = {{"model_type", "llama"}, {"vocab_size", 97}, {"hidden_size", 48}, {"intermediate_size", 96},
                                {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                                {"max_position_embeddings", 32}, {"tie_word_embeddings", false}};
  auto config = [&](const std::string& name, const nlohmann::json& data, const nlohmann::json& more) {
    nlohmann::json d = {{"train", prefix}, {"valid", prefix}, {"eod_id", 5}};
    d.update(data);
    nlohmann::json extra = {{"data", d}, {"train_batch_size", 4}, {"train_micro_batch_size_per_gpu", 2},
                            {"gradient_accumulation_steps", "auto"}, {"comm_timeout", 20}};
    extra.update(more);
    return write_config(name, extra) + " --metrics " + dir() + "/" + name + ".jsonl";
  };
  const nlohmann::json both = {{"reset_position_ids", true}, {"reset_attention_mask", true}};
  const nlohmann::json none = nlohmann::json::object();
  std::string err;
  ASSERT_EQ(run("train " + config("doc-one", both, none), &err), 0) << err;
  EXPECT_NE(err.find("data.reset_position_ids, data.reset_attention_mask: a document ends at token 5 (data.eod_id)"),
            std::string::npos) << err;
  ASSERT_EQ(run("train " + config("doc-plain", none, none), &err), 0) << err;
  ASSERT_EQ(run("train " + config("doc-pos", {{"reset_position_ids", true}}, none), &err), 0) << err;
  ASSERT_EQ(run("train " + config("doc-attn", {{"reset_attention_mask", true}}, none), &err), 0) << err;
  const std::vector<double> one = losses(dir() + "/doc-one.jsonl");
  ASSERT_EQ(one.size(), 6u);
  for (const char* other : {"doc-plain", "doc-pos", "doc-attn"}) {
    const std::vector<double> o = losses(dir() + "/" + other + ".jsonl");
    ASSERT_EQ(o.size(), one.size()) << other;
    double apart = 0.0;
    for (size_t i = 0; i < one.size(); ++i) apart = std::max(apart, std::fabs(o[i] - one[i]) / one[i]);
    EXPECT_GT(apart, 1e-4) << other << " trains what both flags train";
  }
  nlohmann::json tp = {{"parallel", {{"tp", 2}, {"sequence_parallel", true}}}};
  ASSERT_EQ(run(launch(2) + config("doc-tp2", both, tp), &err), 0) << err;
  ASSERT_EQ(run(launch(2) + config("doc-pp2", both, {{"parallel", {{"pp", 2}}}}), &err), 0) << err;
  nlohmann::json zero = {{"zero_optimization", {{"stage", 3}, {"reduce_bucket_size", 5000}, {"stage3_param_persistence_threshold", 0}}}};
  ASSERT_EQ(run(launch(2) + config("doc-dp2", both, zero), &err), 0) << err;
  // The step's attention pairs (its tflops count them): the global batch's, whoever holds it.
  const std::vector<double> pairs = values(dir() + "/doc-one.jsonl", "attention_pairs");
  ASSERT_EQ(pairs.size(), one.size());
  EXPECT_LT(pairs[0], 4 * 16 * 17 / 2) << "no fewer pairs than a causal batch's";
  EXPECT_TRUE(values(dir() + "/doc-pos.jsonl", "attention_pairs").empty());
  for (const char* name : {"doc-tp2", "doc-pp2", "doc-dp2"}) {
    EXPECT_EQ(pairs, values(dir() + "/" + std::string(name) + ".jsonl", "attention_pairs")) << name;
    expect_close(one, losses(dir() + "/" + name + ".jsonl"), 1e-5, name);
    expect_close(values(dir() + "/doc-one.jsonl", "val_loss"), values(dir() + "/" + std::string(name) + ".jsonl", "val_loss"), 1e-5,
                 std::string(name) + " validation");
  }
  const nlohmann::json pos = {{"reset_position_ids", true}};
  ASSERT_EQ(run("train " + config("doc-llama", pos, {{"model", llama}}), &err), 0) << err;
  ASSERT_EQ(run("train " + config("doc-llama-plain", none, {{"model", llama}}), &err), 0) << err;
  nlohmann::json llama_tp = tp;
  llama_tp["model"] = llama;
  ASSERT_EQ(run(launch(2) + config("doc-llama-tp2", pos, llama_tp), &err), 0) << err;
  const std::vector<double> l1 = losses(dir() + "/doc-llama.jsonl"), lp = losses(dir() + "/doc-llama-plain.jsonl");
  ASSERT_EQ(l1.size(), lp.size());
  double apart = 0.0;
  for (size_t i = 0; i < l1.size(); ++i) apart = std::max(apart, std::fabs(lp[i] - l1[i]) / l1[i]);
  EXPECT_GT(apart, 1e-4) << "LLaMA's positions change nothing";
  expect_close(l1, losses(dir() + "/doc-llama-tp2.jsonl"), 1e-5, "doc-llama-tp2");
}

TEST(TrainMpi, CheckpointsLoadAtAnyStageAndWorldSize) {
  write_dataset(dir() + "/train", 30);
  ASSERT_EQ(run("train " + dp_config("ref", 0) + " --metrics " + dir() + "/ref.jsonl"), 0);
  std::vector<double> ref = losses(dir() + "/ref.jsonl");
  // Written by 2 ranks at stage 3, resumed by one process at stage 0 and by 4 ranks at stage 2.
  ASSERT_EQ(run(launch(2) + dp_config("s3", 3) + " --set train_iters=3"), 0);
  std::string ck = dir() + "/ckpt-s3/step-3";
  ASSERT_EQ(run("train " + dp_config("r1", 0) + " --resume " + ck + " --metrics " + dir() + "/r1.jsonl"), 0);
  expect_close(std::vector<double>(ref.begin() + 3, ref.end()), losses(dir() + "/r1.jsonl"), 1e-5, "2xS3 -> 1xS0");
  std::string err;
  ASSERT_EQ(run(launch(4) + dp_config("r4", 2) + " --resume " + ck + " --metrics " + dir() + "/r4.jsonl", &err), 0) << err;
  expect_close(std::vector<double>(ref.begin() + 3, ref.end()), losses(dir() + "/r4.jsonl"), 1e-5, "2xS3 -> 4xS2");
  // A resume's lines are said once, by rank 0 (each rank said each one, stop 73).
  ASSERT_EQ(run(launch(2) + dp_config("rs", 1) + " --resume " + ck + " --set train_iters=4 --set data.seed=7", &err), 0) << err;
  const std::string seed_line = "written with data seed";
  ASSERT_NE(err.find(seed_line), std::string::npos) << err;
  EXPECT_EQ(err.find(seed_line), err.rfind(seed_line)) << err;
  // ... and exports to one Hugging Face file like any checkpoint.
  ASSERT_EQ(run("export " + ck + " --hf " + dir() + "/hf-s3"), 0);
  EXPECT_TRUE(fs::exists(dir() + "/hf-s3/model.safetensors"));
}

// Tensor parallelism through `meshtrain launch ... --set parallel.tp=N` (the in-process suite,
// engine/tp_test.cpp, runs the whole matrix): GPT-2 and LLaMA with grouped kv heads, tp 2 and 4,
// tp 2 x dp 2 with ZeRO 1-3, recompute, bf16, sequence parallelism (by parallel.sequence_parallel or
// activation_checkpointing.partition_activations); losses and checkpointed weights equal one process's,
// and a tp checkpoint resumes in one process and exports to Hugging Face.
TEST(TrainMpi, TensorParallelMatchesOneProcess) {
  write_dataset(dir() + "/train", 30);
  const nlohmann::json llama = {{"model", {{"model_type", "llama"}, {"vocab_size", 97}, {"hidden_size", 48},
                                           {"intermediate_size", 96}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                                           {"num_key_value_heads", 2}, {"max_position_embeddings", 32},
                                           {"tie_word_embeddings", false}}}};
  const nlohmann::json bf16 = {{"bf16", {{"enabled", true}}}};
  // LLaMA with 8 heads over 4 kv heads: grouped-query attention that tp 4 can split.
  const nlohmann::json llama8 = {{"model", {{"model_type", "llama"}, {"vocab_size", 97}, {"hidden_size", 64},
                                            {"intermediate_size", 96}, {"num_hidden_layers", 2}, {"num_attention_heads", 8},
                                            {"num_key_value_heads", 4}, {"max_position_embeddings", 32},
                                            {"tie_word_embeddings", false}}}};
  // 10 steps, the schedule over all of them, every checkpoint kept.
  const nlohmann::json steps = {{"train_iters", 10}, {"keep_last", 0},
                                {"scheduler", {{"type", "WarmupDecayLR"},
                                               {"params", {{"warmup_num_steps", 2}, {"warmup_max_lr", 0.01}, {"total_num_steps", 10}}}}}};
  auto with = [&steps](nlohmann::json j) {
    j.update(steps);
    return j;
  };
  struct Layout {
    const char* name;
    int n, tp, stage;
    bool llama, bf16, recompute;
    bool sp = false;
    bool llama8 = false;
  };
  const std::vector<Layout> layouts = {{"tp2", 2, 2, 0, false, false, false},      {"tp4", 4, 4, 0, false, false, false},
                                       {"tp2dp2s1", 4, 2, 1, false, false, false}, {"tp2dp2s2", 4, 2, 2, false, false, false},
                                       {"tp2dp2s3rc", 4, 2, 3, false, false, true}, {"llama-tp2", 2, 2, 0, true, false, false},
                                       {"llama-tp2dp2s3", 4, 2, 3, true, false, false}, {"bf16-tp2", 2, 2, 0, false, true, false},
                                       {"tp2-sp", 2, 2, 0, false, false, false, true},  {"tp4-sp-rc", 4, 4, 0, false, false, true, true},
                                       {"llama-tp2dp2s2-sp", 4, 2, 2, true, false, false, true},
                                       {"llama8-tp4", 4, 4, 0, false, false, false, false, true},
                                       {"llama8-tp4-sp-rc", 4, 4, 0, false, false, true, true, true}};
  auto model_of = [&](const std::string& ref) {
    return with(ref == "llama" ? llama : ref == "llama8" ? llama8 : ref == "bf16" ? bf16 : nlohmann::json::object());
  };
  for (const char* ref : {"gpt2", "llama", "llama8", "bf16"}) {
    std::string one = std::string("tp-one-") + ref;
    ASSERT_EQ(run("train " + dp_config(one, 0, model_of(ref)) + " --metrics " + dir() + "/" + one + ".jsonl"), 0);
  }
  for (const Layout& l : layouts) {
    std::string ref = l.llama ? "llama" : l.llama8 ? "llama8" : l.bf16 ? "bf16" : "gpt2";
    nlohmann::json more = model_of(ref);
    if (l.recompute) more["activation_checkpointing"] = {{"enabled", true}};
    // Sequence parallelism by Megatron's key, or by DeepSpeed's partition_activations.
    if (l.sp && l.recompute) more["activation_checkpointing"]["partition_activations"] = true;
    else if (l.sp) more["parallel"] = {{"sequence_parallel", true}};
    std::string name = std::string("tp-") + l.name, err;
    ASSERT_EQ(run(launch(l.n) + dp_config(name, l.stage, more) + " --set parallel.tp=" + std::to_string(l.tp) +
                      " --metrics " + dir() + "/" + name + ".jsonl",
                  &err),
              0)
        << err;
    double tol = l.bf16 ? 2e-3 : 1e-5;
    expect_close(losses(dir() + "/tp-one-" + ref + ".jsonl"), losses(dir() + "/" + name + ".jsonl"), tol, name);
    std::vector<float> w1 = checkpoint_weights(dir() + "/ckpt-tp-one-" + ref + "/step-10");
    std::vector<float> w = checkpoint_weights(dir() + "/ckpt-" + name + "/step-10");
    ASSERT_EQ(w.size(), w1.size()) << name << ": the checkpoint holds the one-process layout (no padding)";
    EXPECT_LE(relative_error(w, w1), tol) << name;
  }
  // A tp 2 x dp 2 checkpoint resumes in one process (the curve goes on) and exports to HF.
  std::vector<double> ref = losses(dir() + "/tp-one-gpt2.jsonl");
  std::string ck = dir() + "/ckpt-tp-tp2dp2s1/step-3", err;
  ASSERT_EQ(run("train " + dp_config("tp-r1", 0, with({})) + " --resume " + ck + " --metrics " + dir() + "/tp-r1.jsonl", &err), 0) << err;
  expect_close(std::vector<double>(ref.begin() + 3, ref.end()), losses(dir() + "/tp-r1.jsonl"), 1e-5, "tp2xdp2 -> 1");
  // ... and a one-process checkpoint resumes under tp 4.
  ASSERT_EQ(run(launch(4) + dp_config("tp-r4", 0, with({})) + " --set parallel.tp=4 --resume " + dir() + "/ckpt-tp-one-gpt2/step-3" +
                    " --metrics " + dir() + "/tp-r4.jsonl",
                &err),
            0)
      << err;
  expect_close(std::vector<double>(ref.begin() + 3, ref.end()), losses(dir() + "/tp-r4.jsonl"), 1e-5, "1 -> tp4");
  ASSERT_EQ(run("export " + ck + " --hf " + dir() + "/hf-tp"), 0);
  EXPECT_TRUE(fs::exists(dir() + "/hf-tp/model.safetensors"));
  // A split that does not give whole kv heads is refused naming the key.
  nlohmann::json bad = llama;
  EXPECT_EQ(run(launch(4) + dp_config("tp-bad", 0, bad) + " --set parallel.tp=4", &err), 2);
  EXPECT_NE(err.find("num_key_value_heads (2) is not divisible by parallel.tp (4)"), std::string::npos) << err;
}

// Pipeline parallelism and 3D through `meshtrain launch` (real MPI ranks): 10 steps of GPT-2
// (tied) and LLaMA with 4 layers under 1F1B, GPipe and interleaved schedules, and tp 2 x pp 2 x
// dp 2 with ZeRO-1 and sequence parallelism on 8 ranks, against one process (losses, validation
// losses through the stages, final weights); then the 3D checkpoint resumes at one process, at tp 4
// and at dp 2 with ZeRO-3, and a one-process checkpoint resumes under an interleaved pipeline: the
// curve goes on as if uninterrupted.
TEST(TrainMpi, PipelineAnd3DMatchOneProcessAndCheckpointsReshard) {
  write_dataset(dir() + "/train", 30);
  const nlohmann::json base = {
      {"model", {{"model_type", "gpt2"}, {"vocab_size", 97}, {"n_positions", 32}, {"n_embd", 48}, {"n_layer", 4}, {"n_head", 4}}},
      {"train_iters", 10}, {"keep_last", 0},
      {"scheduler", {{"type", "WarmupDecayLR"}, {"params", {{"warmup_num_steps", 2}, {"warmup_max_lr", 0.01}, {"total_num_steps", 10}}}}}};
  nlohmann::json llama = base;
  llama["model"] = {{"model_type", "llama"}, {"vocab_size", 97}, {"hidden_size", 48}, {"intermediate_size", 96},
                    {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                    {"max_position_embeddings", 32}, {"tie_word_embeddings", false}};
  for (const char* ref : {"gpt2", "llama"}) {
    std::string one = std::string("pp-one-") + ref;
    ASSERT_EQ(run("train " + dp_config(one, 0, std::string(ref) == "llama" ? llama : base) + " --metrics " + dir() + "/" + one + ".jsonl"), 0);
  }
  struct Layout {
    const char* name;
    int n, stage;
    const char* sets;
    bool llama = false;
  };
  const std::vector<Layout> layouts = {
      {"pp2-1f1b", 2, 0, " --set parallel.pp=2"},
      {"pp2-interleaved", 2, 0, " --set parallel.pp=2 --set parallel.pipeline_schedule=interleaved --set parallel.virtual_stages=2"},
      {"pp4-gpipe", 4, 0, " --set parallel.pp=4 --set parallel.pipeline_schedule=gpipe"},
      {"llama-pp2dp2s1", 4, 1, " --set parallel.pp=2", true},
      {"3d", 8, 1, " --set parallel.tp=2 --set parallel.pp=2 --set parallel.sequence_parallel=true"}};
  for (const Layout& l : layouts) {
    std::string name = std::string("pp-") + l.name, err, ref = l.llama ? "llama" : "gpt2";
    ASSERT_EQ(run(launch(l.n) + dp_config(name, l.stage, l.llama ? llama : base) + l.sets + " --metrics " + dir() + "/" + name + ".jsonl", &err), 0)
        << err;
    expect_close(losses(dir() + "/pp-one-" + ref + ".jsonl"), losses(dir() + "/" + name + ".jsonl"), 1e-5, name);
    expect_close(values(dir() + "/pp-one-" + ref + ".jsonl", "val_loss"), values(dir() + "/" + name + ".jsonl", "val_loss"), 1e-5,
                 name + " validation");
    // Every stage's times and accounted peak are in the metrics.
    const std::vector<double> idle = values(dir() + "/" + name + ".jsonl", "pp_schedule_seconds");
    ASSERT_EQ(idle.size(), 10u) << name;
    {
      std::ifstream f(dir() + "/" + name + ".jsonl");
      std::string line;
      std::getline(f, line);
      nlohmann::json m = nlohmann::json::parse(line);
      const size_t stages = std::string(l.sets).find("pp=4") != std::string::npos ? 4 : 2;
      ASSERT_EQ(m["pp_stage_peak_mib"].size(), stages) << name;
      ASSERT_EQ(m["pp_stage_compute_seconds"].size(), stages) << name;
      for (size_t q = 0; q < stages; ++q) {
        EXPECT_GT(m["pp_stage_peak_mib"][q].get<double>(), 0.0) << name;
        EXPECT_LE(m["pp_stage_compute_seconds"][q].get<double>(), m["pp_schedule_seconds"].get<double>() * 1.001) << name;
      }
    }
    std::vector<float> w1 = checkpoint_weights(dir() + "/ckpt-pp-one-" + ref + "/step-10");
    std::vector<float> w = checkpoint_weights(dir() + "/ckpt-" + name + "/step-10");
    ASSERT_EQ(w.size(), w1.size()) << name;
    EXPECT_LE(relative_error(w, w1), 1e-5) << name;
  }
  std::vector<double> ref = losses(dir() + "/pp-one-gpt2.jsonl");
  const std::vector<double> rest(ref.begin() + 3, ref.end());
  const std::string ck = dir() + "/ckpt-pp-3d/step-3";
  // Sharded: each of the 8 ranks (ZeRO-1 pieces of its tp shard of its stage) wrote its own files;
  // no rank gathered the model.
  EXPECT_FALSE(fs::exists(ck + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(ck + "/model-00008-of-00008.safetensors"));
  EXPECT_TRUE(fs::exists(ck + "/optimizer-00008-of-00008.safetensors"));
  EXPECT_TRUE(fs::exists(ck + "/meshtrain.index.json"));
  std::string err;
  ASSERT_EQ(run("train " + dp_config("pp-r1", 0, base) + " --resume " + ck + " --metrics " + dir() + "/pp-r1.jsonl", &err), 0) << err;
  expect_close(rest, losses(dir() + "/pp-r1.jsonl"), 1e-5, "tp2 pp2 dp2 -> 1");
  ASSERT_EQ(run(launch(4) + dp_config("pp-rtp4", 0, base) + " --set parallel.tp=4 --resume " + ck + " --metrics " + dir() + "/pp-rtp4.jsonl", &err), 0)
      << err;
  expect_close(rest, losses(dir() + "/pp-rtp4.jsonl"), 1e-5, "tp2 pp2 dp2 -> tp4");
  ASSERT_EQ(run(launch(2) + dp_config("pp-rz3", 3, base) + " --resume " + ck + " --metrics " + dir() + "/pp-rz3.jsonl", &err), 0) << err;
  expect_close(rest, losses(dir() + "/pp-rz3.jsonl"), 1e-5, "tp2 pp2 dp2 -> dp2 ZeRO-3");
  ASSERT_EQ(run(launch(2) + dp_config("pp-rpp", 0, base) + layouts[1].sets + " --resume " + dir() + "/ckpt-pp-one-gpt2/step-3" +
                    " --metrics " + dir() + "/pp-rpp.jsonl",
                &err),
            0)
      << err;
  expect_close(rest, losses(dir() + "/pp-rpp.jsonl"), 1e-5, "1 -> pp2 interleaved");
  ASSERT_EQ(run("export " + ck + " --hf " + dir() + "/hf-pp"), 0);
  EXPECT_TRUE(fs::exists(dir() + "/hf-pp/model.safetensors"));
  // ZeRO-2 under a pipeline is refused by name.
  EXPECT_EQ(run(launch(4) + dp_config("pp-z2", 2, base) + " --set parallel.pp=2", &err), 2);
  EXPECT_NE(err.find("zero_optimization.stage 2 with parallel.pp > 1"), std::string::npos) << err;
}

TEST(TrainMpi, AKilledRankEndsTheJobNamingItAndResumeContinues) {
  write_dataset(dir() + "/train", 30);
  ASSERT_EQ(run("train " + dp_config("k1", 2) + " --metrics " + dir() + "/k1.jsonl"), 0);
  std::vector<double> ref = losses(dir() + "/k1.jsonl");
  std::string cfg = dp_config("kill", 2, {{"comm_timeout", 10}});
  std::string err;
  setenv("MT_FAULT", "train.after_step_4@1", 1);  // mpirun's local ranks inherit the environment
  int rc = run(launch(2) + cfg, &err);
  unsetenv("MT_FAULT");
  EXPECT_NE(rc, 0);
  std::ifstream out(dir() + "/stdout.txt");
  std::string all((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  all += err;
  EXPECT_NE(all.find("rank 1"), std::string::npos) << all;
  // The checkpoint of step 3 survived; resuming on 2 ranks finishes the curve.
  ASSERT_EQ(run(launch(2) + cfg + " --resume " + dir() + "/ckpt-kill --metrics " + dir() + "/k2.jsonl", &err), 0) << err;
  expect_close(std::vector<double>(ref.begin() + 3, ref.end()), losses(dir() + "/k2.jsonl"), 1e-5, "resumed");
}

// ZeRO-Infinity's optimizer swap on 2 ranks: the curve equals the in-memory run bit for bit; a
// rank killed in the middle of a step's swap (half its sub-groups written back) loses nothing: the
// step-3 checkpoint resumes, swapped or in memory, and continues the same curve exactly.
nlohmann::json nvme_zero(const std::string& swap, bool on, int stage = 2) {
  nlohmann::json z = {{"stage", stage}, {"reduce_bucket_size", 5000}, {"stage3_param_persistence_threshold", 0}};
  if (on) {
    z["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", swap}, {"pipeline_read", true}, {"pipeline_write", true}};
    z["sub_group_size"] = 2000;
    if (stage == 3) z["offload_param"] = {{"device", "nvme"}, {"nvme_path", swap}};
  }
  return {{"train_batch_size", 4}, {"train_micro_batch_size_per_gpu", 1}, {"gradient_accumulation_steps", "auto"},
          {"comm_timeout", 20}, {"zero_optimization", z}, {"aio", {{"block_size", 8192}}}};
}

TEST(TrainMpi, NvmeOffloadEqualsMemoryAndAKillMidSwapLosesNothing) {
  write_dataset(dir() + "/train", 30);
  const std::string swap = dir() + "/swap";
  std::string err;
  ASSERT_EQ(run(launch(2) + write_config("nv-mem", nvme_zero(swap, false)) + " --metrics " + dir() + "/nv-mem.jsonl", &err), 0)
      << err;
  ASSERT_EQ(run(launch(2) + write_config("nv-disk", nvme_zero(swap, true)) + " --metrics " + dir() + "/nv-disk.jsonl", &err), 0)
      << err;
  const std::vector<double> ref = losses(dir() + "/nv-mem.jsonl"), disk = losses(dir() + "/nv-disk.jsonl");
  ASSERT_EQ(ref.size(), 6u);
  EXPECT_EQ(disk, ref);
  const std::vector<double> written = values(dir() + "/nv-disk.jsonl", "swap_write_bytes");
  ASSERT_EQ(written.size(), 6u);
  EXPECT_GT(written[0], 0.0);
  EXPECT_GT(values(dir() + "/nv-disk.jsonl", "swap_read_bytes")[1], 0.0);
  EXPECT_TRUE(fs::exists(swap + "/zero_stage_2/optimizer/rank1/exp_avg_sq.swp"));
  // Rank 1 dies inside step 5's swap.
  const std::string kill = write_config("nv-kill", nvme_zero(swap, true));
  setenv("MT_FAULT", "optim.swap_step_5@1", 1);
  int rc = run(launch(2) + kill, &err);
  unsetenv("MT_FAULT");
  EXPECT_NE(rc, 0);
  for (const char* z : {"true", "false"}) {  // resumed swapped, and in memory
    const std::string name = std::string("nv-resume-") + z;
    ASSERT_EQ(run(launch(2) + write_config(name, nvme_zero(swap, std::string(z) == "true")) + " --resume " + dir() +
                      "/ckpt-nv-kill --metrics " + dir() + "/" + name + ".jsonl",
                  &err),
              0)
        << err;
    EXPECT_EQ(losses(dir() + "/" + name + ".jsonl"), std::vector<double>(ref.begin() + 3, ref.end())) << z;
  }
  // Stage 3 with the parameters on disk too: the same curve as stage 3 in memory; its checkpoint
  // (streamed from the swap files) resumes in memory and swapped, and continues exactly.
  ASSERT_EQ(run(launch(2) + write_config("nv3-mem", nvme_zero(swap, false, 3)) + " --metrics " + dir() + "/nv3-mem.jsonl", &err), 0)
      << err;
  ASSERT_EQ(run(launch(2) + write_config("nv3-disk", nvme_zero(swap, true, 3)) + " --metrics " + dir() + "/nv3-disk.jsonl", &err), 0)
      << err;
  const std::vector<double> ref3 = losses(dir() + "/nv3-mem.jsonl");
  ASSERT_EQ(ref3.size(), 6u);
  EXPECT_EQ(losses(dir() + "/nv3-disk.jsonl"), ref3);
  EXPECT_TRUE(fs::exists(swap + "/zero_stage_3/param/rank1/params.swp"));
  for (const char* z : {"true", "false"}) {
    const std::string name = std::string("nv3-resume-") + z;
    ASSERT_EQ(run(launch(2) + write_config(name, nvme_zero(swap, std::string(z) == "true", 3)) + " --resume " + dir() +
                      "/ckpt-nv3-disk/step-3 --metrics " + dir() + "/" + name + ".jsonl",
                  &err),
              0)
        << err;
    EXPECT_EQ(losses(dir() + "/" + name + ".jsonl"), std::vector<double>(ref3.begin() + 3, ref3.end())) << z;
  }
}

// Resuming a ZeRO-Infinity run writes the checkpoint's state into the swap one parameter at a
// time: the resumed process's peak RSS stays within a few parameters of the run that saved it,
// where staging each state whole (4 P bytes, 252 MB here: more than the training's own peak)
// would add that much.
// `bench --io DIR` records the disk's ceiling under DIR; a run swapping there reports, each
// printed step, its optimizer swap's bytes and its share of that ceiling (the serial time of those
// bytes at the recorded rates over the swap's time), in the output and the metrics.
TEST(TrainNvme, TheSwapReportsItsShareOfTheRecordedCeiling) {
  write_dataset(dir() + "/train", 30);
  const std::string swap = dir() + "/swap-share";
  fs::create_directories(swap);
  nlohmann::json extra = nvme_zero(swap, true, 2);
  extra["train_iters"] = 2;
  extra["wall_clock_breakdown"] = true;
  extra["steps_per_print"] = 1;
  std::string out, err;
  ASSERT_EQ(mt::cli::testing::run_meshtrain(dir(), "train " + write_config("share-a", extra), &out, &err), 0) << err;
  EXPECT_NE(out.find("no disk ceiling recorded for " + swap), std::string::npos) << out;
  EXPECT_NE(out.find("swap | optimizer: read"), std::string::npos) << out;
  EXPECT_EQ(out.find("of the disk's ceiling"), std::string::npos) << out;

  ASSERT_EQ(mt::cli::testing::run_meshtrain(dir(), "bench --io " + swap + " --io-size 8", &out, &err), 0) << err;
  ASSERT_TRUE(fs::exists(swap + "/.meshtrain-io-ceiling.json"));
  ASSERT_EQ(mt::cli::testing::run_meshtrain(dir(), "train " + write_config("share-b", extra) + " --metrics " + dir() +
                                                       "/share-b.jsonl",
                                            &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("disk ceiling of " + swap + " (bench --io, 0.0 GiB each way)"), std::string::npos) << out;
  EXPECT_NE(out.find("of the disk's ceiling:"), std::string::npos) << out;
  const std::vector<double> share = values(dir() + "/share-b.jsonl", "swap_ceiling_share");
  ASSERT_EQ(share.size(), 2u);
  for (double x : share) EXPECT_GT(x, 0.0);
}

TEST(TrainNvme, ResumeStreamsTheCheckpointIntoTheSwap) {
  write_dataset(dir() + "/train", 30);
  const std::string swap = dir() + "/swap-stream";
  fs::create_directories(swap);
  nlohmann::json extra = nvme_zero(swap, true, 3);
  extra["model"] = {{"model_type", "gpt2"}, {"vocab_size", 97}, {"n_positions", 32}, {"n_embd", 512}, {"n_layer", 20}, {"n_head", 8}};
  extra["train_batch_size"] = 1;
  extra["train_micro_batch_size_per_gpu"] = 1;
  extra["zero_optimization"]["sub_group_size"] = 500000;
  extra["aio"]["block_size"] = 1 << 20;  // DeepSpeed's default: 8 KiB requests made this test 4 times longer
  extra["train_iters"] = 2;
  extra["save_interval"] = 2;
  extra["eval_interval"] = 0;
  std::string err;
  ASSERT_EQ(run("train " + write_config("stream-a", extra) + " --metrics " + dir() + "/stream-a.jsonl", &err), 0) << err;
  extra["train_iters"] = 3;
  extra["save_dir"] = dir() + "/ckpt-stream-b";
  ASSERT_EQ(run("train " + write_config("stream-b", extra) + " --resume " + dir() + "/ckpt-stream-a --metrics " + dir() +
                    "/stream-b.jsonl", &err),
            0)
      << err;
  const std::vector<double> a = values(dir() + "/stream-a.jsonl", "rss_peak_bytes"),
                            b = values(dir() + "/stream-b.jsonl", "rss_peak_bytes");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 1u);  // step 3 only: the resume happened
  // The binary's own footprint (its libraries: 14 MB, or 225 MB linked with CUDA), measured the
  // same way by a tiny model's one step, is not the model's.
  nlohmann::json tiny = {{"train_iters", 1}, {"save_interval", 0}, {"eval_interval", 0}};
  ASSERT_EQ(run("train " + write_config("stream-tiny", tiny) + " --metrics " + dir() + "/stream-tiny.jsonl", &err), 0) << err;
  const double base = values(dir() + "/stream-tiny.jsonl", "rss_peak_bytes").at(0);
  const double params = 20 * 12 * 512.0 * 512.0;  // the blocks' weights, the bulk of P
  ASSERT_GT(4 * params, a.back() - base) << "saving run " << a.back() << " B, the binary alone " << base << " B";  // one state staged whole would set the peak
  EXPECT_LT(b[0], a.back() + 24e6) << "resumed " << b[0] << " B, saving run " << a.back() << " B";
  // The passes' own traffic: every piece read in forward and again in backward, each gradient
  // record written once (one micro-batch); the blocks alone hold 4 * params bytes.
  EXPECT_GT(values(dir() + "/stream-b.jsonl", "swap_param_read_bytes").at(0), 2 * 4 * params);
  EXPECT_GT(values(dir() + "/stream-b.jsonl", "swap_param_write_bytes").at(0), 4 * params);
  EXPECT_EQ(values(dir() + "/stream-b.jsonl", "swap_param_wait_seconds").size(), 1u);
}

// Rank 0 tokenizes a text corpus while the others wait at the "data ready" barrier: that wait has
// no comm_timeout deadline (a corpus that took longer to tokenize than comm_timeout ended the run
// with no line, and every rerun met the same). Where nothing is tokenized the deadline stays, and
// the rank that meets it says so in its own line (it exited without one).
TEST(TrainMpi, RankZerosTokenizingOutlastsTheCommTimeout) {
  write_dataset(dir() + "/train", 30);
  std::ofstream(dir() + "/slow.txt") << "The cat sat on the mat.\n\nThe dog sat on the log.\n\nCats and dogs sat.\n";
  ASSERT_EQ(run("tokenize " + dir() + "/slow.txt -o " + dir() + "/slowtok --train-bpe 270"), 0);
  const nlohmann::json common = {{"comm_timeout", 3}, {"train_iters", 2}, {"save_interval", 0}, {"eval_interval", 0},
                                 {"model", {{"model_type", "gpt2"}, {"vocab_size", 300}, {"n_positions", 32}, {"n_embd", 32},
                                            {"n_layer", 1}, {"n_head", 2}}}};
  nlohmann::json text = common, prefix = common;
  text["data"] = {{"train", dir() + "/slow.txt"}, {"tokenizer", dir() + "/slowtok.tokenizer.json"}};
  prefix["data"] = {{"train", dir() + "/slowtok"}};
  setenv("MT_FAULT", "train.slow_data@0", 1);  // rank 0 takes 6 s over its data
  std::string err_text, err_prefix;
  const int rc_text = run(launch(2) + dp_config("slow-text", 0, text), &err_text);
  const int rc_prefix = run(launch(2) + dp_config("slow-prefix", 0, prefix), &err_prefix);
  unsetenv("MT_FAULT");
  EXPECT_EQ(rc_text, 0) << err_text;
  EXPECT_NE(rc_prefix, 0);
  EXPECT_NE(err_prefix.find("meshtrain: error: rank 1: "), std::string::npos) << err_prefix;
  EXPECT_NE(err_prefix.find("data ready"), std::string::npos) << err_prefix;
}

// A rank that fails where rank 0 did not, before the first collective (a config or data file its
// host lacks), ended the job with mpirun's banner alone: it says why. One that has not reached
// the process groups' splits when rank 0 does held every other rank in MPI_Comm_split, which has
// no deadline (a stopped rank hung the job): the world meets at a barrier within comm_timeout first.
TEST(TrainMpi, ARankThatFailsOrStallsAloneInTheSetupIsNamed) {
  write_dataset(dir() + "/train", 30);
  std::string err;
  setenv("MT_FAULT", "train.setup_error@1", 1);
  const int rc_alone = run(launch(2) + dp_config("alone", 0), &err);
  EXPECT_EQ(rc_alone, 2) << err;
  EXPECT_NE(err.find("meshtrain: error: rank 1: test seam: a file this host lacks"), std::string::npos) << err;
  setenv("MT_FAULT", "train.slow_data@1", 1);  // rank 1 takes 6 s past the data's barrier
  const int rc_stall = run(launch(2) + dp_config("stall", 0, {{"comm_timeout", 2}}) + " --set parallel.tp=2", &err);
  unsetenv("MT_FAULT");
  EXPECT_NE(rc_stall, 0) << err;
  EXPECT_NE(err.find("[process groups] on rank 0 of 2 (mpi) timed out after 2000 ms: rank 1 has not arrived"), std::string::npos)
      << err;
}

// A rank whose configuration differs (its host's copy of the file, a --set given to one rank under
// a bare mpirun): a seed of its own trained another replica, exit 0. Compared before any work, and
// named by where it differs.
TEST(TrainMpi, ARankWhoseConfigurationDiffersIsNamed) {
  write_dataset(dir() + "/train", 30);
  std::string err;
  setenv("MT_FAULT", "train.other_seed@1", 1);
  const int rc = run(launch(2) + dp_config("differs", 0), &err);
  unsetenv("MT_FAULT");
  EXPECT_EQ(rc, 2) << err;
  EXPECT_NE(err.find("meshtrain: error: rank 1's configuration differs from rank 0's at /seed ("), std::string::npos) << err;
}

// A rank that joins MPI late (stopped, or stuck, before MPI_Init: a seam sleeps 8 s there) held
// the others in MPI_Init for good; the start-up's watch ends the job with a line at
// MT_START_TIMEOUT.
TEST(TrainMpi, ARankLateToJoinMpiEndsTheJobWithALine) {
  write_dataset(dir() + "/train", 30);
  std::string err;
  setenv("MT_FAULT", "mpi.slow_start@1", 1);
  setenv("MT_START_TIMEOUT", "2", 1);
  const int rc = run(launch(2) + dp_config("late", 0), &err);
  unsetenv("MT_FAULT");
  unsetenv("MT_START_TIMEOUT");
  EXPECT_NE(rc, 0) << err;
  EXPECT_NE(err.find("MPI's start-up (MPI_Init and this host's ranks meeting) has not finished in 2 s"), std::string::npos) << err;
}

TEST(TrainMpi, AStuckRankIsNamedByTheCollectiveTimeout) {
  write_dataset(dir() + "/train", 30);
  std::string cfg = dp_config("hang", 3, {{"comm_timeout", 3}});
  std::string err;
  setenv("MT_FAULT", "train.after_step_2@1", 1);
  setenv("MT_FAULT_MODE", "hang", 1);
  int rc = run(launch(2) + cfg, &err);
  unsetenv("MT_FAULT");
  unsetenv("MT_FAULT_MODE");
  EXPECT_NE(rc, 0);
  EXPECT_NE(err.find("rank 1 has not arrived"), std::string::npos) << err;
  EXPECT_NE(err.find("timed out"), std::string::npos) << err;
}

// ---- Several hosts: network namespaces with an sshd each (scripts/netns-hosts.sh) ----

// Two "hosts" of 2 slots for the length of a test (skipped where namespaces cannot be made); their
// OMPI_MCA_* settings are in this process's environment, which `meshtrain launch` passes to mpirun.
class NetnsHosts {
 public:
  explicit NetnsHosts(const std::string& where) : dir_(where) {
    std::string log = where + ".log";
    int rc = std::system(("bash " + std::string(MT_SOURCE_DIR) + "/scripts/netns-hosts.sh up 2 " + dir_ + " > " + log + " 2>&1").c_str());
    status_ = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    message_ = mt::cli::testing::slurp(log);
    if (status_ != 0) return;
    std::ifstream env(dir_ + "/env");
    for (std::string line; std::getline(env, line);) {
      if (line.rfind("export ", 0) != 0) continue;
      std::string kv = line.substr(7), k = kv.substr(0, kv.find('=')), v = kv.substr(kv.find('=') + 1);
      if (v.size() >= 2 && v.front() == '"') v = v.substr(1, v.size() - 2);
      setenv(k.c_str(), v.c_str(), 1);
      vars_.push_back(k);
    }
  }
  ~NetnsHosts() {
    for (const std::string& k : vars_) unsetenv(k.c_str());
    if (status_ == 0)
      (void)std::system(("bash " + std::string(MT_SOURCE_DIR) + "/scripts/netns-hosts.sh down " + dir_ + " > /dev/null 2>&1").c_str());
  }
  int status() const { return status_; }
  const std::string& message() const { return message_; }
  std::string hostfile() const { return dir_ + "/hostfile"; }

 private:
  std::string dir_, message_;
  int status_ = -1;
  std::vector<std::string> vars_;
};

// `launch -n 4 --hostfile HOSTFILE -- train CFG --metrics DIR/NAME.jsonl` in the background (its
// output in DIR/NAME.out and .err), once it has written a metrics line; -1 when it ended or made no
// step within 2 minutes.
pid_t start_on_hosts(const std::string& hostfile, const std::string& cfg, const std::string& name) {
  const std::string metrics = dir() + "/" + name + ".jsonl";
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    const int out = ::open((dir() + "/" + name + ".out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open((dir() + "/" + name + ".err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || err < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) _exit(127);
    execl(MT_MESHTRAIN_BIN, "meshtrain", "launch", "-n", "4", "--hostfile", hostfile.c_str(), "--", "train", cfg.c_str(),
          "--metrics", metrics.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  for (int i = 0; i < 1200; ++i) {  // up to 2 minutes to start and make a step
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (mt::cli::testing::slurp(metrics).find('\n') != std::string::npos) return pid;  // a whole metrics line
    if (waitpid(pid, &status, WNOHANG) == pid) return -1;
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

// Waits up to a minute for pid; false (and pid killed) when it did not end.
bool ends_within_a_minute(pid_t pid, int* status) {
  for (int i = 0; i < 600; ++i) {
    if (waitpid(pid, status, WNOHANG) == pid) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(pid, SIGKILL);
  waitpid(pid, status, 0);
  return false;
}

// tp inside a host, pp and dp across the two: the one-process numbers. Then one host's ranks are
// killed: the job ends (not hangs) with a message naming a lost rank.
TEST(TrainMultiHost, TpWithinAHostPpAndDpAcrossHostsMatchOneProcessAndALostHostIsNamed) {
  NetnsHosts hosts(dir() + "/hosts");
  if (hosts.status() == 77) GTEST_SKIP() << "no network namespaces here: " << hosts.message();
  ASSERT_EQ(hosts.status(), 0) << hosts.message();
  write_dataset(dir() + "/train", 30);
  const nlohmann::json base = {
      {"model", {{"model_type", "gpt2"}, {"vocab_size", 97}, {"n_positions", 32}, {"n_embd", 48}, {"n_layer", 4}, {"n_head", 4}}},
      {"train_iters", 10}, {"keep_last", 0},
      {"scheduler", {{"type", "WarmupDecayLR"}, {"params", {{"warmup_num_steps", 2}, {"warmup_max_lr", 0.01}, {"total_num_steps", 10}}}}}};
  ASSERT_EQ(run("train " + dp_config("mh-one", 0, base) + " --metrics " + dir() + "/mh-one.jsonl"), 0);
  const std::string hf = " --hostfile " + hosts.hostfile();
  std::string err;
  // Ranks 0, 1 on host 0 and 2, 3 on host 1; tp (the innermost dimension) pairs 0-1 and 2-3.
  for (auto [name, sets, stage] : {std::tuple{"mh-tp2pp2", " --set parallel.tp=2 --set parallel.pp=2", 0},
                                   std::tuple{"mh-tp2dp2", " --set parallel.tp=2", 1}}) {
    ASSERT_EQ(run("launch -n 4" + hf + " -- train " + dp_config(name, stage, base) + sets + " --metrics " + dir() + "/" + name + ".jsonl", &err), 0)
        << err;
    EXPECT_NE(err.find("10.77.0.11"), std::string::npos) << "the mpirun line names the second host: " << err;
    expect_close(losses(dir() + "/mh-one.jsonl"), losses(dir() + "/" + std::string(name) + ".jsonl"), 1e-5, name);
  }
  // The calibration over the two hosts also times each collective within a host and across hosts
  // (one rank a host): the planner's lines per group shape.
  const std::string cal = dir() + "/mh-cal.json";
  std::string out;
  ASSERT_EQ(mt::cli::testing::run_meshtrain(dir(), "launch -n 4" + hf + " -- calibrate --quick --force -o " + cal, &out, &err), 0) << err;
  EXPECT_NE(out.find("calibrated 4 rank(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("on 2 hosts"), std::string::npos) << out;
  const nlohmann::json c = nlohmann::json::parse(mt::cli::testing::slurp(cal));
  EXPECT_EQ(c.value("ranks_per_host", 0), 2);
  for (const char* f : {"all_reduce", "all_gather", "reduce_scatter", "send_recv"})
    for (const std::string shape : {"", " intra", " inter"}) {
      ASSERT_TRUE(c["fits"].contains(f + shape)) << f << shape;
      EXPECT_GT(c["fits"][f + shape]["per_unit_s"].get<double>(), 0.0) << f << shape;
    }

  // One rank a host: the world's lines are the ones across hosts, and the calibration says so
  // (ranks_per_host 1; it wrote none, and plan --hostfile took it for one host's).
  {
    const std::string one_each = dir() + "/hosts-one-each";
    std::ofstream(one_each) << "10.77.0.10 slots=1\n10.77.0.11 slots=1\n";
    const std::string cal1 = dir() + "/mh-cal-1.json";
    ASSERT_EQ(mt::cli::testing::run_meshtrain(dir(), "launch -n 2 --hostfile " + one_each + " -- calibrate --quick --force -o " + cal1,
                                              &out, &err), 0) << err;
    EXPECT_NE(out.find("on 2 hosts"), std::string::npos) << out;
    EXPECT_EQ(nlohmann::json::parse(mt::cli::testing::slurp(cal1)).value("ranks_per_host", 0), 1);
  }

  // plan --validate over the hosts, priced from that calibration: each layout trained under launch
  // --hostfile (the table's rows are those runs' steps and rank 0's peaks).
  {
    std::string pout, perr;
    const std::string pcfg = dp_config("mh-plan", 0, base);
    ASSERT_EQ(mt::cli::testing::run_meshtrain(dir(), "plan " + pcfg + " --calibration " + cal + hf + " --validate 1 --steps 3", &pout,
                                              &perr), 0) << perr << pout;
    EXPECT_NE(pout.find("each run: meshtrain launch -n 4 --hostfile " + hosts.hostfile()), std::string::npos) << pout;
    EXPECT_NE(pout.find("step error: median"), std::string::npos) << pout;
    EXPECT_NE(pout.find("the chosen layout (rank 1) measured"), std::string::npos) << pout;
  }

  // A long run; once it has made a step, host 1's ranks are killed.
  nlohmann::json longer = base;
  longer["train_iters"] = 100000;
  longer["scheduler"]["params"]["total_num_steps"] = 100000;
  longer["comm_timeout"] = 10;
  const std::string cfg = dp_config("mh-kill", 1, longer);
  const std::string metrics = dir() + "/mh-kill.jsonl";
  pid_t pid = start_on_hosts(hosts.hostfile(), cfg, "mh-kill");
  ASSERT_GT(pid, 0) << mt::cli::testing::slurp(dir() + "/mh-kill.err");
  ASSERT_EQ(std::system(("for p in $(bash " + std::string(MT_SOURCE_DIR) + "/scripts/netns-hosts.sh pids 1); do kill -9 $p; done").c_str()), 0);
  // Every surviving rank ends: well within comm_timeout (10 s) plus mpirun's teardown.
  int status = 0;
  ASSERT_TRUE(ends_within_a_minute(pid, &status)) << "the job hung after a host's ranks were killed";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
  // The lost host is named: by its ranks (mpirun's report of their deaths, a survivor's timeout)
  // or, when a survivor's broken connection reaches mpirun first, by OpenMPI's line for it ("Peer
  // host: 10.77.0.11"); not by the launch line, which names every host.
  std::string all = mt::cli::testing::slurp(dir() + "/mh-kill.out") + mt::cli::testing::slurp(dir() + "/mh-kill.err");
  bool named = false;
  std::istringstream lines(all);
  for (std::string line; !named && std::getline(lines, line);)
    named = line.rfind("launch:", 0) != 0 && (line.find("rank 2") != std::string::npos || line.find("rank 3") != std::string::npos ||
                                              line.find("10.77.0.11") != std::string::npos);
  EXPECT_TRUE(named) << all;

  // A scheduler's stop (Slurm's time limit): SIGTERM to every process of the job at once, the
  // launcher, mpirun, both hosts' daemons and the ranks, whose saves take 3 s. The daemons start
  // with SIGTERM held (launch's agent, `meshtrain _orted`), so every rank saves the step and the
  // launcher exits 143. Before, a daemon's own teardown ended its ranks about a second in: the
  // launcher exited 205 and the stop saved nothing.
  setenv("MT_FAULT", "checkpoint.slow_save", 1);
  const std::string stop_cfg = dp_config("mh-stop", 1, longer);
  pid = start_on_hosts(hosts.hostfile(), stop_cfg, "mh-stop");
  unsetenv("MT_FAULT");
  ASSERT_GT(pid, 0) << mt::cli::testing::slurp(dir() + "/mh-stop.err");
  // The daemons are the orted processes inside the two hosts' network namespaces (an orted of
  // another job on this machine is not signalled): /proc/PID/ns/net is the file `ip netns` mounts.
  std::vector<ino_t> host_nets;
  for (int i = 0; i < 2; ++i) {
    struct stat st;
    if (stat(("/run/netns/mt-h" + std::to_string(i)).c_str(), &st) == 0) host_nets.push_back(st.st_ino);
  }
  ASSERT_EQ(host_nets.size(), 2u) << "the hosts' namespaces under /run/netns";
  auto on_a_host = [&](const std::string& proc) {
    struct stat st;
    return stat((proc + "/ns/net").c_str(), &st) == 0 &&
           std::find(host_nets.begin(), host_nets.end(), st.st_ino) != host_nets.end();
  };
  std::vector<int> job;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos || std::stoi(name) == getpid()) continue;
    std::string cmd = mt::cli::testing::slurp(e.path().string() + "/cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(stop_cfg) != std::string::npos ||
        (mt::cli::testing::slurp(e.path().string() + "/comm") == "orted\n" && on_a_host(e.path().string())))
      job.push_back(std::stoi(name));
  }
  EXPECT_GE(job.size(), 8u) << "the launcher, mpirun, 2 daemons and 4 ranks";
  for (int p : job) kill(p, SIGTERM);
  ASSERT_TRUE(ends_within_a_minute(pid, &status)) << "the job hung after the scheduler's stop";
  const std::string stop_err = mt::cli::testing::slurp(dir() + "/mh-stop.err");
  ASSERT_TRUE(WIFEXITED(status)) << stop_err;
  EXPECT_EQ(WEXITSTATUS(status), 143) << stop_err;
  const size_t said = stop_err.find("SIGTERM: stopped after step ");
  ASSERT_NE(said, std::string::npos) << stop_err;
  const std::string step = "step-" + std::to_string(std::atoi(stop_err.c_str() + said + 28));
  std::string latest = mt::cli::testing::slurp(dir() + "/ckpt-mh-stop/latest");
  while (!latest.empty() && latest.back() == '\n') latest.pop_back();
  EXPECT_EQ(latest, step) << stop_err;
}
