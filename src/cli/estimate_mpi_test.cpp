// meshtrain estimate against real multi-rank training: `meshtrain launch -n 2 -- train CFG --metrics M`
// (mpirun underneath) and `meshtrain estimate CFG --procs 2 --json`, ZeRO stages 0-3, fp32 and bf16,
// tiny GPT-2 (tied head) and tiny LLaMA (untied head). Rank 0's last metrics line holds the peak
// bytes per allocator category since the engine was built (cli/train.cpp resets the peaks there, so
// they describe training, not setup).
//
// (1) Every category agrees within 5% of the measured value, or within kCommSlack bytes for comm:
//     comm holds a few KiB here (reduce-scatter receive buffers of s_u floats, low-precision staging
//     of one unit). With overlap_comm a reduction that MPI happens to finish early frees its buffer
//     (and, with parameters on disk, makes its gradient record) sooner: comm then lies at most the
//     estimate's comm, and at least its comm_low (every reduction finishing at its first chance)
//     less kOverlapSlack — a run mixes early and late reductions (see the test).
// (2) Stage 3 model states (params + grads + optimizer, measured) are within 10% of
//        16 Ψ/N + 4 W_p + 4 W_g    (fp32, Adam)
//        16 Ψ/N + V_max + 4 W_g    (bf16: V_max = the largest unit's view, 2 m_u + 4 (n_u - m_u))
//     Ψ parameters, N ranks; 16 = 4 master + 4 gradient shard + 8 Adam (all f32, in bf16 too: the
//     master is f32 and gradients are accumulated in f32); W_p = the live window of gathered
//     parameter elements (two adjacent units, padded to N s_u: the one in use and the one
//     prefetched), W_g = the live gradient-slab elements (the largest unit's N s_u; two adjacent
//     units with overlap_comm). In bf16 a prefetched unit waits as its gathered records (comm) and
//     its view is built at use, so one view is live. No persistent bf16 parameter shard exists
//     (each gather converts the rank's piece of the f32 master), so bf16 is not DeepSpeed's 18 Ψ/N:
//     see the test.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_test_util.h"
#include "data/indexed_dataset.h"
#include "engine/ds_config.h"
#include "kernels/cpu/gemm.h"
#include "planner/memory.h"
#include "tensor/allocator.h"

namespace fs = std::filesystem;

namespace mt {
namespace {

constexpr double kRel = 0.05;
constexpr double kCommSlack = 4096;  // bytes, comm only (see above)
constexpr double kOverlapSlack = 0.12;  // overlap_comm's comm below comm_low (see the test)

std::string dir() {
  static std::string d = cli::testing::make_test_dir("mt_estimate_mpi_test");
  return d;
}

void write_dataset(const std::string& prefix, int docs) {
  if (!fs::exists(prefix + ".idx")) cli::testing::write_chain_dataset(prefix, docs, 101);
}

int run(const std::string& args, std::string* out, std::string* err) {
  return cli::testing::run_meshtrain(dir(), args, out, err);
}

struct Case {
  std::string arch;
  bool bf16;
  int stage;
  bool overlap;
  int tp = 1, procs = 2;
  bool sp = false;
  int pp = 1;
  const char* schedule = "1f1b";
  const char* comm = nullptr;  // communication_data_type
  bool nvme = false;           // offload_optimizer device nvme
  bool param_nvme = false;     // and offload_param (stage 3)
  const char* optimizer = nullptr;  // a 1-bit optimizer (stage 0), compressing from its second update
  bool fp16 = false;
  int usp = 1;  // parallel.sp (Ulysses): procs / usp data-parallel ranks
  const char* seq_comm = nullptr;  // seq_parallel_communication_data_type (Ulysses' gradients' dtype)
};

// k with Ulysses over usp of its ranks.
Case ulysses(Case k, int usp) {
  k.usp = usp;
  return k;
}

std::string case_name(const Case& k) {
  return k.arch + (k.bf16 ? "_bf16" : k.fp16 ? "" : "_fp32") + "_stage" + std::to_string(k.stage) + (k.overlap ? "_overlap" : "") +
         (k.tp > 1 ? "_tp" + std::to_string(k.tp) + "_n" + std::to_string(k.procs) : "") + (k.sp ? "_sp" : "") +
         (k.tp == 1 && k.pp == 1 && k.procs > 2 ? "_dp" + std::to_string(k.procs) : "") +
         (k.procs == 1 ? "_one_process" : "") +
         (k.pp > 1 ? "_pp" + std::to_string(k.pp) + "_" + k.schedule + "_n" + std::to_string(k.procs) : "") +
         (k.comm ? std::string("_comm_") + k.comm : "") + (k.nvme ? "_nvme" : "") + (k.param_nvme ? "_params" : "") +
         (k.optimizer ? std::string("_") + k.optimizer : "") + (k.fp16 ? "_fp16" : "") +
         (k.usp > 1 ? "_usp" + std::to_string(k.usp) : "") + (k.seq_comm ? std::string("_seq_comm_") + k.seq_comm : "");
}

nlohmann::json config_json(const Case& k) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "seq_length": 16, "train_iters": 3, "train_batch_size": 4, "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": "auto", "comm_timeout": 60, "steps_per_print": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.1}}
  })");
  if (k.arch == "gpt2") {  // configs/models/tiny-gpt2.json
    j["model"] = nlohmann::json::parse(
        R"({"model_type": "gpt2", "vocab_size": 97, "n_positions": 32, "n_embd": 48, "n_layer": 2, "n_head": 4})");
  } else {  // configs/models/tiny-llama.json, untied head
    j["model"] = nlohmann::json::parse(R"({"model_type": "llama", "vocab_size": 101, "hidden_size": 64,
      "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "max_position_embeddings": 64, "tie_word_embeddings": false})");
  }
  if (k.bf16) j["bf16"] = {{"enabled", true}};
  if (k.fp16) j["fp16"] = {{"enabled", true}};
  if (k.optimizer)
    j["optimizer"] = {{"type", k.optimizer},
                      {"params", {{"lr", 0.001}, {std::string(k.optimizer) == "ZeroOneAdam" ? "var_freeze_step" : "freeze_step", 2}}}};
  // Threshold 0: every unit is gathered and freed at stage 3 (the tiny units all fall under
  // DeepSpeed's default 1e5 and would persist).
  j["zero_optimization"] = {{"stage", k.stage}, {"overlap_comm", k.overlap},
                            {"stage3_param_persistence_threshold", 0}};
  j["data"] = {{"train", dir() + "/train"}};
  if (k.comm) j["communication_data_type"] = k.comm;
  if (k.seq_comm) j["seq_parallel_communication_data_type"] = k.seq_comm;
  if (k.nvme) {  // several sub-groups, three resident
    j["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", dir() + "/swap-" + case_name(k)},
                                                   {"buffer_count", 3}, {"pipeline_read", true}};
    j["zero_optimization"]["sub_group_size"] = 3000;
    if (k.param_nvme)
      j["zero_optimization"]["offload_param"] = {{"device", "nvme"}, {"nvme_path", dir() + "/swap-" + case_name(k)}};
  }
  if (k.tp > 1 || k.pp > 1) j["parallel"] = {{"tp", k.tp}, {"sequence_parallel", k.sp}, {"pp", k.pp}};
  if (k.usp > 1) j["parallel"]["sp"] = k.usp;
  if (k.pp > 1) {  // rank 0 = the first stage: the embedding, one layer of two, 1F1B's pp slots
    j["parallel"]["pipeline_schedule"] = k.schedule;
    j["train_batch_size"] = 8;  // 8 micro-batches per pipeline (GPipe keeps them all)
  }
  return j;
}

std::string write_config(const Case& k) {
  std::string path = dir() + "/" + case_name(k) + ".json";
  std::ofstream(path) << config_json(k).dump();
  return path;
}

nlohmann::json last_line(const std::string& path) {
  std::ifstream f(path);
  std::string line, last;
  while (std::getline(f, line))
    if (!line.empty()) last = line;
  return nlohmann::json::parse(last);
}

struct Measured {
  nlohmann::json metrics;   // rank 0's last metrics line
  nlohmann::json estimate;  // this stage's row of estimate --json
  std::vector<nlohmann::json> pipeline_ranks;  // a pipeline: every pipeline rank's row
};

Measured measure(const Case& k) {
  write_dataset(dir() + "/train", 30);
  std::string cfg = write_config(k), metrics = dir() + "/" + case_name(k) + ".jsonl", out, err;
  fs::remove(metrics);
  Measured m;
  const std::string n = std::to_string(k.procs);
  // One process trains without MPI (its reductions are local copies, done when launched).
  EXPECT_EQ(run((k.procs == 1 ? std::string("train ") : "launch -n " + n + " -- train ") + cfg + " --metrics " + metrics, &out, &err), 0)
      << err;
  m.metrics = last_line(metrics);
  EXPECT_EQ(run("estimate " + cfg + " --procs " + n + " --json", &out, &err), 0) << err;
  nlohmann::json e = nlohmann::json::parse(out);
  m.estimate = (e.is_array() ? e[0] : e)["stages"][k.stage];  // a pipeline: rank 0 is pipeline rank 0
  if (e.is_array())
    for (const auto& q : e) m.pipeline_ranks.push_back(q["stages"][k.stage]);
  return m;
}

class EstimateMpi : public ::testing::TestWithParam<Case> {};

TEST_P(EstimateMpi, PeaksPerCategoryAgree) {
  const Case& k = GetParam();
  Measured m = measure(k);
  ASSERT_FALSE(HasFailure());
  for (int c = 0; c < kMemCategoryCount; ++c) {
    std::string name = mem_category_name(static_cast<MemCategory>(c));
    double measured = m.metrics["peak_" + name + "_bytes"].get<double>();
    double estimated = m.estimate[name].get<double>();
    double tol = std::max(kRel * measured, name == "comm" ? kCommSlack : 0.0);
    if (k.optimizer && name == "optimizer") tol = 0.0;  // states and the exchange's errors: whole buffers, exact
    if (k.overlap && (name == "comm" || name == "grads")) {
      // A reduction left in flight finishes when MPI finishes it. The estimate replays two
      // policies: every reduction finishing at its first chance (comm_low) and only when waited
      // for; its comm is the larger. A run mixes the two reduction by reduction, and with
      // parameters on disk a completion also makes a gradient record, so a mix can sit below
      // both replays: the lower side gets kOverlapSlack of the estimate.
      // The gradients likewise: a unit's slab is freed when its reduction finishes (grads_low).
      const double low = m.estimate[name + "_low"].get<double>();
      EXPECT_LE(measured, estimated + tol) << name;
      EXPECT_GE(measured, low - std::max(tol, kOverlapSlack * estimated)) << name << ": measured " << measured << " " << name
                                                                          << "_low " << low;
    } else {
      EXPECT_LE(std::fabs(measured - estimated), tol) << name << ": measured " << measured << " estimated " << estimated;
    }
    std::printf("  %-12s measured %9.0f estimated %9.0f  (%+.2f%%)", name.c_str(), measured, estimated,
                measured > 0 ? 100.0 * (estimated - measured) / measured : 0.0);
    if (k.overlap && m.estimate.contains(name + "_low")) std::printf("  low %9.0f", m.estimate[name + "_low"].get<double>());
    std::printf("\n");
  }
  // The 1-bit exchange's scratch, kept by rank 0's thread outside the allocator: the bytes the
  // estimate counts (0 without a 1-bit optimizer).
  EXPECT_EQ(m.metrics["exchange_scratch_bytes"].get<double>(), m.estimate["exchange"].get<double>());
  if (k.optimizer) {
    EXPECT_GT(m.estimate["exchange"].get<double>(), 0.0);
  }
  // Setup (the model built, the ZeRO shards made, checkpoint loads) holds no more than training
  // does: under ZeRO the shards come from the initial values, with no whole-model buffers beside
  // them (DESIGN-NOTES 57). Before, setup was the rank's peak at every stage >= 1.
  EXPECT_LE(m.metrics["setup_peak_bytes"].get<double>(), m.metrics["total_peak_bytes"].get<double>());
  if (k.pp > 1) {
    // Every pipeline rank's comm peak (metrics: pp_stage_comm_peak_mib) against its row: the
    // received gradient and the gradients in flight back, or the tied table's exchange.
    const auto& comm = m.metrics["pp_stage_comm_peak_mib"];
    ASSERT_EQ(comm.size(), static_cast<size_t>(k.pp));
    ASSERT_EQ(m.pipeline_ranks.size(), static_cast<size_t>(k.pp));
    for (int q = 0; q < k.pp; ++q) {
      const double measured = comm[q].get<double>() * 1048576.0, estimated = m.pipeline_ranks[q]["comm"].get<double>();
      EXPECT_LE(std::fabs(measured - estimated), kCommSlack) << "pipeline rank " << q << ": measured " << measured << " estimated " << estimated;
      std::printf("  pipeline rank %d comm measured %9.0f estimated %9.0f\n", q, measured, estimated);
    }
    if (k.tp == 1 && k.arch == "gpt2" && k.stage == 0) {
      // The last stage waits for each gradient it sent before it sends the next (Megatron's way),
      // so it holds one, not one per micro-batch: 8 here, 1 + 8 boundary activations, 27648 bytes,
      // above the tied table's 18624. GPipe held them all before the stage waited; 1F1B held 2.
      const double E = 16.0 * 48 * 4, m_micro = 8;
      EXPECT_LT(comm[k.pp - 1].get<double>() * 1048576.0, (1 + m_micro) * E);
    }
  }
  if (k.nvme) {  // the swap files of rank 0 hold what the estimate says, byte for byte
    const std::string root = dir() + "/swap-" + case_name(k) + "/zero_stage_" + std::to_string(k.stage);
    const std::string d = root + "/optimizer/rank0/";
    uintmax_t on_disk = fs::file_size(d + "exp_avg.swp") + fs::file_size(d + "exp_avg_sq.swp");
    if (k.param_nvme) on_disk += fs::file_size(root + "/param/rank0/params.swp") + fs::file_size(root + "/param/rank0/grads.swp");
    EXPECT_EQ(on_disk, m.estimate["disk"].get<uintmax_t>());
    EXPECT_GT(on_disk, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Stages, EstimateMpi,
    ::testing::Values(Case{"gpt2", false, 0, false}, Case{"gpt2", false, 1, false}, Case{"gpt2", false, 2, false},
                      Case{"gpt2", false, 3, false}, Case{"gpt2", true, 0, false}, Case{"gpt2", true, 1, false},
                      Case{"gpt2", true, 2, false}, Case{"gpt2", true, 3, false}, Case{"gpt2", false, 2, true},
                      Case{"gpt2", true, 3, true}, Case{"llama", false, 3, false}, Case{"llama", true, 2, false},
                      // Tensor (and sequence) parallelism: each rank's shard, tp 2 alone and x dp 2.
                      Case{"gpt2", false, 0, false, 2, 2}, Case{"llama", true, 0, false, 2, 2, true},
                      Case{"gpt2", true, 3, false, 2, 4}, Case{"gpt2", false, 2, false, 2, 4, true},
                      // Pipeline parallelism: the first stage's memory (its layers, activation slots).
                      Case{"gpt2", false, 0, false, 1, 2, false, 2, "1f1b"}, Case{"gpt2", false, 0, false, 1, 2, false, 2, "gpipe"},
                      Case{"gpt2", true, 1, false, 1, 4, false, 2, "gpipe"},
                      Case{"llama", false, 1, false, 2, 4, true, 2, "1f1b"},
                      // communication_data_type: 2-byte bucket staging (stage 0), slab + receive (stage 2).
                      Case{"gpt2", false, 0, false, 1, 2, false, 1, "1f1b", "bf16"},
                      Case{"gpt2", false, 2, true, 1, 2, false, 1, "1f1b", "fp16"},
                      // offload_optimizer nvme: only the swap's slots are resident; its files on disk.
                      Case{"gpt2", true, 2, false, 1, 2, false, 1, "1f1b", nullptr, true},
                      Case{"llama", false, 3, true, 1, 2, false, 1, "1f1b", nullptr, true},
                      // offload_param nvme too: master and gradient shards on disk, read and
                      // summed through comm buffers, the optimizer's slots of four states.
                      Case{"gpt2", true, 3, false, 1, 2, false, 1, "1f1b", nullptr, true, true},
                      Case{"llama", false, 3, true, 1, 2, false, 1, "1f1b", nullptr, true, true},
                      // dp 4: each reduce-scatter's ring holds a scratch block (f32; a 2-byte
                      // communication_data_type at stage 3).
                      Case{"gpt2", false, 2, false, 1, 4},
                      Case{"llama", true, 3, false, 1, 4, false, 1, "1f1b", "bf16"},
                      // One process: each reduction completes at its launch (overlap_comm or not).
                      Case{"gpt2", true, 3, true, 1, 1}, Case{"llama", false, 2, true, 1, 1},
                      // 1-bit optimizers: their states, and the compressed exchange's error
                      // buffers (each tensor padded on its own in fp32, one flat buffer in fp16 and
                      // for 1-bit LAMB).
                      Case{"gpt2", false, 0, false, 1, 2, false, 1, "1f1b", nullptr, false, false, "OneBitAdam"},
                      Case{"llama", false, 0, false, 1, 2, false, 1, "1f1b", nullptr, false, false, "ZeroOneAdam"},
                      Case{"gpt2", false, 0, false, 1, 2, false, 1, "1f1b", nullptr, false, false, "OneBitLamb"},
                      Case{"gpt2", false, 0, false, 1, 2, false, 1, "1f1b", nullptr, false, false, "OneBitAdam", true},
                      // Four ranks pad each tensor to a multiple of 32 (the LayerNorms' 48 to 64).
                      Case{"gpt2", false, 0, false, 1, 4, false, 1, "1f1b", nullptr, false, false, "OneBitAdam"},
                      // Ulysses: this rank's tokens and targets, the rope table of whole samples,
                      // the all-to-all's two buffers (comm); ZeRO over dp x sp.
                      ulysses(Case{"gpt2", false, 0, false}, 2), ulysses(Case{"llama", true, 3, false}, 2),
                      ulysses(Case{"llama", false, 2, true, 1, 4}, 2),
                      // Ulysses with tp (stop 80): tp 2 x sp 2, each rank one of GPT-2's four heads.
                      ulysses(Case{"gpt2", true, 2, false, 2, 4}, 2),
                      // and with pp: two stages of sp 2 (the pipeline's rows of T/sp tokens).
                      ulysses(Case{"gpt2", false, 1, false, 1, 4, false, 2}, 2),
                      // and with ZeRO-Infinity: the moments, then parameters and gradients, on disk.
                      ulysses(Case{"gpt2", false, 2, false, 1, 2, false, 1, "1f1b", nullptr, true}, 2),
                      ulysses(Case{"llama", false, 3, false, 1, 2, false, 1, "1f1b", nullptr, true, true}, 2),
                      // The gradients' dtype under Ulysses is seq_parallel_communication_data_type's
                      // (its 2-byte copies counted), communication_data_type's unused.
                      Case{"gpt2", true, 2, false, 1, 2, false, 1, "1f1b", nullptr, false, false, nullptr, false, 2, "bf16"},
                      Case{"gpt2", true, 1, false, 1, 2, false, 1, "1f1b", "bf16", false, false, nullptr, false, 2}),
    [](const auto& info) { return case_name(info.param); });

// (2): stage-3 model states against the closed form (header comment), computed from the units
// alone (not from the estimator's replay).
TEST(EstimateMpiStage3, ModelStatesAre16PsiOverNPlusTheLiveWindow) {
  for (bool bf16 : {false, true}) {
    for (bool overlap : {false, true}) {
      Case k{"gpt2", bf16, 3, overlap};
      Measured m = measure(k);
      ASSERT_FALSE(HasFailure());
      double measured = m.metrics["peak_params_bytes"].get<double>() + m.metrics["peak_grads_bytes"].get<double>() +
                        m.metrics["peak_optimizer_bytes"].get<double>();
      engine::RunConfig c = engine::ds_config_parse(config_json(k), "x");
      std::vector<parallel::Unit> units = planner::model_units(c.model);
      const double N = 2, psi = static_cast<double>(c.model.num_params());
      // bf16 units that are mostly GEMM weights (2 (n - m) < s) are gathered in bf16 into an image
      // of the padded unit, 2 N s, beside their other elements in f32; the rest are gathered in f32
      // into staging (comm) and converted to 2 m + 4 (n - m) when used.
      auto image = [&](const parallel::Unit& u) { return bf16 && 2.0 * (u.numel - u.matrix_numel) < std::ceil(u.numel / N); };
      auto view_bytes = [&](const parallel::Unit& u) {  // a gathered unit as the layers read it
        if (!bf16) return 4.0 * N * std::ceil(u.numel / N);
        return (image(u) ? 2.0 * N * std::ceil(u.numel / N) : 2.0 * u.matrix_numel) + 4.0 * (u.numel - u.matrix_numel);
      };
      // The unit in use and the next one in the pass's direction prefetched into its view, unless
      // (bf16, not an image) it is prefetched into staging and its view built only at its use.
      auto prefetched = [&](const parallel::Unit& u) { return !bf16 || image(u) ? view_bytes(u) : 0.0; };
      double window_p = 0, slab = 0, window_g = 0;
      for (size_t u = 0; u < units.size(); ++u) {
        const double up = u + 1 < units.size() ? prefetched(units[u + 1]) : 0.0, down = u > 0 ? prefetched(units[u - 1]) : 0.0;
        window_p = std::max(window_p, view_bytes(units[u]) + std::max(up, down));
      }
      for (size_t u = 0; u + 1 < units.size(); ++u)
        window_g = std::max(window_g, 4.0 * N * (std::ceil(units[u].numel / N) + std::ceil(units[u + 1].numel / N)));
      for (const parallel::Unit& u : units) slab = std::max(slab, 4.0 * N * std::ceil(u.numel / N));
      double formula = 16.0 * psi / N + window_p + (overlap ? window_g : slab);
      EXPECT_LE(std::fabs(measured - formula), 0.10 * formula)
          << case_name(k) << ": measured " << measured << " formula " << formula;
      // DeepSpeed's 18 Ψ/N for mixed precision (2 bf16 params + 4 f32 grads + 12 master and Adam)
      // counts a persistent bf16 parameter partition, which this runtime does not keep: bf16 views
      // are converted from the f32 master (each rank's piece, at each gather) only inside the window. So 16 Ψ/N holds for bf16 too, and
      // the 2 Ψ/N of DeepSpeed's figure is not measured here.
      if (bf16) {
        double ds18 = 18.0 * psi / N + window_p + (overlap ? window_g : slab);
        EXPECT_LT(std::fabs(measured - formula), std::fabs(measured - ds18)) << case_name(k);
      }
      std::printf("  %s: measured %.0f, 16 psi/N + window %.0f (%+.2f%%), 18 psi/N + window %.0f\n", case_name(k).c_str(),
                  measured, formula, 100.0 * (formula - measured) / measured, formula + 2.0 * psi / N);
    }
  }
}

// Writes config j as NAME.json, trains it on `procs` processes (train, or launch -n procs) with its
// metrics in NAME.jsonl, and estimates it for as many: *metrics the run's last metrics line,
// *estimate the estimate's JSON. Fatal failures end the caller's case (check HasFatalFailure).
void train_and_estimate(const nlohmann::json& j, const std::string& name, int procs, nlohmann::json* metrics,
                        nlohmann::json* estimate) {
  const std::string cfg = dir() + "/" + name + ".json", path = dir() + "/" + name + ".jsonl";
  std::ofstream(cfg) << j.dump();
  fs::remove(path);
  std::string out, err;
  const std::string n = std::to_string(procs);
  ASSERT_EQ(run((procs == 1 ? std::string("train ") : "launch -n " + n + " -- train ") + cfg + " --metrics " + path, &out, &err), 0)
      << err;
  *metrics = last_line(path);
  ASSERT_EQ(run("estimate " + cfg + " --procs " + n + " --json", &out, &err), 0) << err;
  *estimate = nlohmann::json::parse(out);
}

// (3) The allocator's footprint: every block of a run (model states through setup and the steps,
// activations, workspace) replayed through the allocator's rules (FootprintReplay) gives the
// measured held and mapped peaks — kept blocks and whole 2 MiB pages included — on a model whose
// units straddle the 1 MiB keep and 2 MiB page thresholds. Blocks under a page (the data's, the
// tokens') are not replayed: a few KiB. Before DESIGN-NOTES 58 the estimate left both out.
TEST(EstimateFootprint, HeldAndMappedPeaksAreTheAllocators) {
  write_dataset(dir() + "/train", 30);
  struct Run {
    int procs, stage;
  };
  for (Run k : {Run{1, 0}, Run{1, 2}, Run{1, 3}, Run{2, 1}, Run{2, 3}}) {
    nlohmann::json j = nlohmann::json::parse(R"({
      "model": {"model_type": "gpt2", "vocab_size": 1024, "n_positions": 64, "n_embd": 256, "n_layer": 2, "n_head": 4},
      "seq_length": 32, "train_iters": 3, "train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": "auto", "comm_timeout": 60, "steps_per_print": 1, "bf16": {"enabled": true},
      "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.1}}})");
    j["zero_optimization"] = {{"stage", k.stage}, {"stage3_param_persistence_threshold", 0}};
    j["data"] = {{"train", dir() + "/train"}};
    const std::string name = "footprint_n" + std::to_string(k.procs) + "_stage" + std::to_string(k.stage);
    nlohmann::json met, est;
    train_and_estimate(j, name, k.procs, &met, &est);
    if (HasFatalFailure()) return;
    const nlohmann::json e = est["stages"][k.stage];
    const double held = met["held_peak_bytes"].get<double>(), mapped = met["mapped_peak_bytes"].get<double>(),
                 total = met["total_peak_bytes"].get<double>();
    std::printf("  %s: held measured %.0f estimated %.0f; mapped measured %.0f estimated %.0f; accounted total %.0f\n",
                name.c_str(), held, e["held"].get<double>(), mapped, e["mapped"].get<double>(), total);
    EXPECT_GT(mapped, total) << name;  // whole pages (and kept blocks) beyond the accounted bytes
    EXPECT_NEAR(e["held"].get<double>(), held, 16384) << name;
    EXPECT_NEAR(e["mapped"].get<double>(), mapped, 16384) << name;
  }
}

// (4) MPI's own temporaries, outside the allocator: stage 0's all-reduce goes through libnbc's
// in-place ring, which mallocs the bucket and receives a 1/p segment into it every round. On two
// ranks the process then holds that segment (whole 2 MiB pages) beyond what stage 1 holds over its
// allocator's footprint; the estimate's `mpi` predicts it (0 at stage 1: ZeRO's reduce-scatter is
// its own ring, with its scratch in the allocator).
TEST(EstimateFootprint, StageZeroHoldsLibnbcsRingSegment) {
  write_dataset(dir() + "/train", 30);
  double beyond[2] = {0, 0}, mpi[2] = {0, 0};
  for (int stage : {0, 1}) {
    nlohmann::json j = nlohmann::json::parse(R"({
      "model": {"model_type": "gpt2", "vocab_size": 4096, "n_positions": 64, "n_embd": 512, "n_layer": 2, "n_head": 8},
      "seq_length": 32, "train_iters": 3, "train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": "auto", "comm_timeout": 60, "steps_per_print": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.1}}})");
    j["zero_optimization"] = {{"stage", stage}};
    j["data"] = {{"train", dir() + "/train"}};
    const std::string name = "libnbc_stage" + std::to_string(stage);
    nlohmann::json met, est;
    train_and_estimate(j, name, 2, &met, &est);
    if (HasFatalFailure()) return;
    const nlohmann::json e = est["stages"][stage];
    EXPECT_NEAR(e["mapped"].get<double>(), met["mapped_peak_bytes"].get<double>(), 16384) << name;
    beyond[stage] = met["rss_peak_bytes"].get<double>() - met["mapped_peak_bytes"].get<double>();
    mpi[stage] = e["mpi"].get<double>();
    std::printf("  %s: VmHWM less the mapped peak %.1f MiB, MPI's temporaries estimated %.1f MiB\n", name.c_str(),
                beyond[stage] / 1048576.0, mpi[stage] / 1048576.0);
  }
  EXPECT_EQ(mpi[1], 0.0);
  EXPECT_GE(mpi[0], 16.0 * 1048576);  // 8.5M parameters in f32: a 17 MB segment
  // The rest beyond the mapped peak varies between runs by a few MiB (stage 1: 37.2-41.8 MiB over
  // five runs, one under a full parallel ctest; glibc's heap retention), and the difference of two
  // runs by up to twice that, so the segment is told apart from nothing within half its size,
  // 8 MiB (4 failed once under that load; 6 left a 4.6 MiB spread on each side 1.4 MiB).
  EXPECT_NEAR(beyond[0] - beyond[1], mpi[0], 8.0 * 1048576);
}

// (5) oneDNN's scratchpad: the GEMMs run on one region grown to the largest need (the
// weight-gradient GEMMs, A transposed, need 0.5-2.7 MiB on two threads at these widths). The
// estimate's gemm_scratch lists the step's GEMMs as the layers call them and asks oneDNN for each
// one's need; the largest is the region a run holds, byte for byte: GPT-2 (Conv1D weights with
// biases) and LLaMA (grouped q/k/v and gate/up), one rank and tp 2 (the row-parallel biases
// deferred, this rank's widths), bf16 and f32, and a vocabulary whose head runs in two tiles, also
// an odd one, whose head's tiles have rows on whole lines (nn::lm_head_operand_ld, lm_head_logits_ld),
// which the estimate asks oneDNN about with those strides (at GPT-2 124M's head, bf16, the input
// gradient's GEMM needs 260 KiB from dense rows and none from padded ones; the blocks' larger
// needs set the region here either way).
TEST(EstimateFootprint, GemmScratchIsTheLargestNeedOfTheStepsGemms) {
  write_dataset(dir() + "/train", 30);
  struct Run {
    const char* arch;
    int tp;
    bool bf16;
    int vocab;
  };
  int nonzero = 0;
  for (Run k : {Run{"gpt2", 1, true, 4096}, Run{"llama", 1, true, 4096}, Run{"gpt2", 2, true, 4096},
                Run{"llama", 2, false, 4096}, Run{"gpt2", 1, true, 40000}, Run{"gpt2", 1, true, 40001},
                Run{"gpt2", 1, false, 40001}}) {
    nlohmann::json j = nlohmann::json::parse(R"({
      "model": {"vocab_size": 4096, "n_positions": 256, "n_embd": 384, "n_layer": 1, "n_head": 6},
      "seq_length": 256, "train_iters": 2, "train_batch_size": 2, "train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": "auto", "comm_timeout": 60, "steps_per_print": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.1}}})");
    if (std::string(k.arch) == "llama")
      j["model"] = {{"hidden_size", 384}, {"num_hidden_layers", 1}, {"num_attention_heads", 6},
                    {"intermediate_size", 1024}, {"max_position_embeddings", 256}};
    j["model"]["model_type"] = k.arch;
    j["model"]["vocab_size"] = k.vocab;
    j["bf16"] = {{"enabled", k.bf16}};
    j["data"] = {{"train", dir() + "/train"}};
    if (k.tp > 1) j["parallel"] = {{"tp", k.tp}};
    const std::string name = std::string("scratch_") + k.arch + "_tp" + std::to_string(k.tp) + (k.bf16 ? "_bf16" : "_f32") +
                             "_v" + std::to_string(k.vocab);
    nlohmann::json met, est;
    train_and_estimate(j, name, k.tp, &met, &est);
    if (HasFatalFailure()) return;
    const double predicted = est["stages"][0]["gemm_scratch"].get<double>(),
                 held = met["gemm_scratch_bytes"].get<double>();
    std::printf("  %s: oneDNN's scratchpad region %.0f bytes, estimated %.0f\n", name.c_str(), held, predicted);
    EXPECT_EQ(predicted, held) << name;
    nonzero += held > 0;
  }
  // bf16's weight-gradient GEMMs need one (brgemm's packing of A^T) where oneDNN multiplies bf16
  // (AVX512-BF16, AMX); on a CPU without, gemm widens bf16 to f32 and f32's GEMMs here need none.
  if (kernels::gemm_native(DType::kBF16)) {
    EXPECT_GE(nonzero, 3);
  }
}

// fp16 where oneDNN has no f16 matmul (no AVX512-FP16): gemm widens each call's operands into two
// f32 regions of the calling thread, each grown to the largest copy; the estimate finds them from
// the step's GEMMs, byte for byte. The LM head widens its own (its weight once a call, in the
// workspace: nn::lm_head_widened), so the regions hold the blocks' copies alone, the same at any
// vocabulary. bf16 widens nothing.
TEST(EstimateFootprint, Fp16OperandsWidenedToF32AreTheLargestCopies) {
  write_dataset(dir() + "/train", 30);
  double fp16_held = -1.0;
  for (const char* dtype : {"fp16", "bf16"})
    for (int vocab : {4096, 40000}) {
      nlohmann::json j = nlohmann::json::parse(R"({
        "model": {"model_type": "gpt2", "n_positions": 256, "n_embd": 384, "n_layer": 1, "n_head": 6},
        "seq_length": 256, "train_iters": 2, "train_batch_size": 2, "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": "auto", "comm_timeout": 60, "steps_per_print": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.1}}})");
      j["model"]["vocab_size"] = vocab;
      j[dtype] = {{"enabled", true}};
      j["data"] = {{"train", dir() + "/train"}};
      const std::string name = std::string("widen_") + dtype + "_v" + std::to_string(vocab);
      nlohmann::json met, est;
      train_and_estimate(j, name, 1, &met, &est);
      if (HasFatalFailure()) return;
      const double predicted = est["stages"][0]["gemm_widen"].get<double>(), held = met["gemm_widen_bytes"].get<double>();
      std::printf("  %s: widened operands %.0f bytes, estimated %.0f\n", name.c_str(), held, predicted);
      EXPECT_EQ(predicted, held) << name;
      if (std::string(dtype) == "bf16") {
        // Nothing widened where oneDNN multiplies bf16; on a CPU without (AVX2 alone) every GEMM,
        // the head's too, is widened, and the estimate prices it (it priced none).
        if (kernels::gemm_native(DType::kBF16)) {
          EXPECT_EQ(held, 0.0) << name;
        } else {
          EXPECT_GT(held, 0.0) << name;
        }
      } else if (kernels::gemm_widen_bytes(16, 16, 16, DType::kF16).first == 0) {
        EXPECT_EQ(held, 0.0) << name;  // a machine with an f16 matmul (AVX512-FP16)
      } else {
        // The MLP's 512 x 1536 rows in f32 in each region (its widest operand on either side), not
        // the head's weight (V x 384).
        EXPECT_EQ(held, 2 * 4.0 * 512 * 1536) << name;
        if (fp16_held >= 0.0) {
          EXPECT_EQ(held, fp16_held) << name;  // the vocabulary changes nothing
        }
        fp16_held = held;
      }
    }
}

}  // namespace
}  // namespace mt
