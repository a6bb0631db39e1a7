// Sharded checkpoints (engine/checkpoint_io.h) on ranks over the local backend: every rank writes
// only its part, the index places every piece, and a load in any layout reads only the files that
// hold the parameters the rank keeps and restores the state exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "engine/checkpoint_io.h"
#include "engine/layout_test_util.h"

namespace mt::engine {
namespace {
namespace fs = std::filesystem;

const char* kGpt2 =
    R"({"model": {"model_type": "gpt2", "vocab_size": 97, "n_positions": 32, "n_embd": 32, "n_layer": 4, "n_head": 4}})";

// This process's folder, removed when the process ends (every run left one in /tmp before).
std::string test_dir() {
  struct Dir {
    std::string path;
    ~Dir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Dir d = [] {
    std::string p = fs::temp_directory_path().string() + "/mt_ckpt_shard_test_" + std::to_string(getpid());
    fs::remove_all(p);
    fs::create_directories(p);
    return Dir{p};
  }();
  return d.path;
}

struct RankState {
  int pp_rank = 0, tp_rank = 0, dp_rank = 0;
  std::vector<std::string> read;       // files this rank's load opened
  std::vector<float> master, exp_avg;  // gathered on rank 0 after the load (or the training)
};

// On `processes` ranks with the layout of cfg: loads `load` (if given), trains `steps` steps, saves
// to `save` (if given). Returns every rank's view.
std::vector<RankState> run(const nlohmann::json& cfg, int processes, int steps, const std::string& load,
                           const std::string& save) {
  std::vector<RankState> out(static_cast<size_t>(processes));
  std::mutex mu;
  auto errors = comm::run_local_ranks(processes, [&](comm::Backend& b) {
    RunConfig c = ds_config_parse(cfg, "checkpoint_shard_test", processes);
    std::shared_ptr<comm::Backend> world(&b, [](comm::Backend*) {});
    auto ctx = engine_parallel_context(c, processes > 1 ? world : nullptr);
    auto model = engine_build_model(c, ctx);
    Engine eng(c, *model, ctx);
    RankState mine{ctx->pp_rank(), ctx->tp_rank(), ctx->dp_rank(), {}, {}, {}};
    if (!load.empty()) mine.read = checkpoint_load(eng, load);
    const int g = c.batch.gradient_accumulation_steps, dp = ctx->dp(), d = ctx->dp_rank();
    for (int step = 0; step < steps; ++step) {
      uint64_t next = static_cast<uint64_t>(eng.global_step()) * static_cast<uint64_t>(g * dp) + static_cast<uint64_t>(d * g);
      eng.train_batch([&](int32_t* t, int32_t* y) { layout_sample(next++, t, y); });
    }
    if (!save.empty()) checkpoint_save(eng, save, 0);
    eng.gather_master(mine.master);
    for (auto& [name, v] : eng.gather_optimizer_state())
      if (name == "exp_avg") mine.exp_avg = std::move(v);
    std::lock_guard<std::mutex> lock(mu);
    out[static_cast<size_t>(b.rank())] = std::move(mine);
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

nlohmann::json layout(int tp, int pp, int dp, int zero) {
  nlohmann::json j = layout_config(kGpt2, "fp32", dp, 2 * pp);
  j["parallel"] = {{"tp", tp}, {"pp", pp}};
  j["zero_optimization"] = {{"stage", zero}};
  return j;
}

std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> s;
  for (const auto& e : fs::directory_iterator(dir)) s.insert(e.path().filename().string());
  return s;
}

std::string shard(const char* stem, int k, int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%05d-of-%05d.safetensors", stem, k, n);
  return buf;
}

// tp2 x pp2: four ranks each write their own two files; nobody gathers.
TEST(ShardedCheckpoint, EveryRankWritesItsPartAndEachLayoutReadsOnlyWhatItHolds) {
  const std::string save = test_dir() + "/tp2pp2";
  std::vector<RankState> saved = run(layout(2, 2, 1, 0), 4, 3, "", save);
  const std::string ck = save + "/step-3";
  std::set<std::string> want{"meshtrain.index.json", "state.json"};
  for (int k = 1; k <= 4; ++k) want.insert({shard("model", k, 4), shard("optimizer", k, 4)});
  EXPECT_EQ(files_in(ck), want);  // no model.safetensors: no rank held the whole model
  nlohmann::json index = nlohmann::json::parse(std::ifstream(ck + "/meshtrain.index.json"));
  EXPECT_EQ(index["layout"]["tp"], 2);
  EXPECT_EQ(index["layout"]["pp"], 2);

  // The same layout: every rank opens its own two files, and besides them only those of the
  // tensors it holds that another rank wrote: the parameters replicated over the tp group (tp rank
  // 0 of the stage writes them) and, on the last stage, its copy of the tied embedding (the first
  // stage's shard at the same tp rank). Files are opened header-only: just those tensors are read.
  std::vector<RankState> same = run(layout(2, 2, 1, 0), 4, 0, ck, "");
  for (const RankState& r : same) {
    std::set<int> ks{r.pp_rank * 2 + r.tp_rank + 1};
    if (r.tp_rank != 0) ks.insert(r.pp_rank * 2 + 1);
    if (r.pp_rank == 1) ks.insert(r.tp_rank + 1);
    std::set<std::string> want_read;
    for (int k : ks) want_read.insert({shard("model", k, 4), shard("optimizer", k, 4)});
    EXPECT_EQ(std::set<std::string>(r.read.begin(), r.read.end()), want_read) << "pp " << r.pp_rank << " tp " << r.tp_rank;
  }
  EXPECT_EQ(same[0].master, saved[0].master);
  EXPECT_EQ(same[0].exp_avg, saved[0].exp_avg);

  // pp2 alone: the first stage reads only the first stage's files (both tp shards of them), never
  // the last stage's; the last stage reads its own and, for its copy of the tied embedding, the
  // first stage's.
  std::vector<RankState> pp2 = run(layout(1, 2, 1, 0), 2, 0, ck, "");
  for (const RankState& r : pp2) {
    std::set<std::string> got(r.read.begin(), r.read.end());
    for (int k = 1; k <= 2; ++k) EXPECT_TRUE(got.count(shard("model", k, 4))) << "stage " << r.pp_rank;
    for (int k = 3; k <= 4; ++k) EXPECT_EQ(got.count(shard("model", k, 4)) == 1, r.pp_rank == 1) << "stage " << r.pp_rank;
  }
  EXPECT_EQ(pp2[0].master, saved[0].master);
  EXPECT_EQ(pp2[0].exp_avg, saved[0].exp_avg);

  // One process (every file), tp4 (each tp2 shard cut in two) and dp2 ZeRO-3 (pieces): the state
  // is the saved one, bit for bit.
  for (auto [name, cfg, n] : {std::tuple{"one process", layout(1, 1, 1, 0), 1}, std::tuple{"tp4", layout(4, 1, 1, 0), 4},
                              std::tuple{"dp2 ZeRO-3", layout(1, 1, 2, 3), 2}}) {
    std::vector<RankState> got = run(cfg, n, 0, ck, "");
    EXPECT_EQ(got[0].master, saved[0].master) << name;
    EXPECT_EQ(got[0].exp_avg, saved[0].exp_avg) << name;
  }
  // model.init_from a sharded checkpoint (fine-tuning from it) in another layout: its weights. Under
  // ZeRO the runtime's shards are made from it a parameter at a time (DESIGN-NOTES 67).
  for (auto [name, cfg, n] : {std::tuple{"tp2", layout(2, 1, 1, 0), 2}, std::tuple{"dp2 ZeRO-3", layout(1, 1, 2, 3), 2},
                              std::tuple{"tp2 x dp2 ZeRO-1", layout(2, 1, 2, 1), 4}}) {
    nlohmann::json init = cfg;
    init["model"]["init_from"] = ck;
    EXPECT_EQ(run(init, n, 0, "", "")[0].master, saved[0].master) << name;
  }
  // A model of another shape: refused when the weights are opened, naming the parameter, before
  // the runtime reads any (the ranks whose pieces touch it would fail alone otherwise).
  {
    nlohmann::json other = layout(1, 1, 1, 0);
    other["model"]["n_embd"] = other["model"]["n_embd"].get<int>() * 2;
    const RunConfig oc = ds_config_parse(other, "test");
    models::TransformerLM m(oc.model, {});
    try {
      init_from_weights(ck, m.store());
      ADD_FAILURE() << "a model of another shape was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("in the checkpoint, "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("in this model"), std::string::npos) << e.what();
    }
  }
}

// ZeRO-1 over dp2: each dp rank writes its own pieces; resuming in the same layout each reads only
// its own files and the run continues as the uninterrupted one.
TEST(ShardedCheckpoint, ZeroPiecesResumeExactly) {
  const std::string save = test_dir() + "/z1";
  std::vector<RankState> whole = run(layout(1, 1, 2, 1), 2, 5, "", "");
  run(layout(1, 1, 2, 1), 2, 3, "", save);
  const std::string ck = save + "/step-3";
  EXPECT_TRUE(fs::exists(ck + "/" + shard("model", 2, 2)));
  std::vector<RankState> resumed = run(layout(1, 1, 2, 1), 2, 2, ck, "");
  for (const RankState& r : resumed) {
    std::vector<std::string> own{shard("model", r.dp_rank + 1, 2), shard("optimizer", r.dp_rank + 1, 2)};
    EXPECT_EQ(r.read, own) << "dp rank " << r.dp_rank;
  }
  EXPECT_EQ(resumed[0].master, whole[0].master);
  EXPECT_EQ(resumed[0].exp_avg, whole[0].exp_avg);
}

// A damaged shard fails the load on every rank: the rank that reads it names the file, the others
// say another rank failed (none waits for a collective the failing rank never joins).
TEST(ShardedCheckpoint, ADamagedShardFailsEveryRankNamingTheFile) {
  const std::string save = test_dir() + "/damaged";
  run(layout(1, 2, 1, 0), 2, 2, "", save);
  const std::string victim = save + "/step-2/" + shard("optimizer", 2, 2);
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(victim) - 10));
    f.put('\x55');
  }
  std::vector<std::string> messages(2);
  std::vector<ErrorKind> kinds(2, ErrorKind::kInternal);
  auto errors = comm::run_local_ranks(2, [&](comm::Backend& b) {
    RunConfig c = ds_config_parse(layout(1, 2, 1, 0), "checkpoint_shard_test", 2);
    std::shared_ptr<comm::Backend> world(&b, [](comm::Backend*) {});
    auto ctx = engine_parallel_context(c, world);
    auto model = engine_build_model(c, ctx);
    Engine eng(c, *model, ctx);
    try {
      checkpoint_load(eng, save);
    } catch (const Error& e) {
      messages[static_cast<size_t>(b.rank())] = e.what();
      kinds[static_cast<size_t>(b.rank())] = e.kind();
    }
  });
  for (auto& e : errors) EXPECT_FALSE(e);
  EXPECT_NE(messages[1].find(shard("optimizer", 2, 2) + " is corrupt"), std::string::npos) << messages[1];
  EXPECT_NE(messages[0].find("failed on another rank"), std::string::npos) << messages[0];
  // Both a bad input (exit 2): the other rank's was an I/O error (exit 1), and the job's exit was
  // 2 or 1 by whose abort came first.
  EXPECT_EQ(kinds[1], ErrorKind::kCorruption);
  EXPECT_EQ(kinds[0], ErrorKind::kCorruption);
}

}  // namespace
}  // namespace mt::engine
