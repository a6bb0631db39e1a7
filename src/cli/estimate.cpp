// meshtrain estimate CONFIG [--procs N] [--set k=v]... [--memory GiB] [--json]: memory per rank for
// ZeRO stages 0-3 by category (planner/memory.h), DeepSpeed's published figures beside ours, and the
// largest micro-batch that fits a memory budget per rank (default: physical RAM / N).
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/threads.h"
#include "cli/commands.h"
#include "engine/ds_config.h"
#include "engine/engine.h"
#include "engine/json_file.h"
#include "optim/optimizer.h"
#include "planner/cost.h"
#include "planner/memory.h"

namespace mt::cli {
namespace {

struct EstimateOptions {
  std::string path;
  int procs = 1;
  std::vector<std::string> sets;
  double memory_gib = 0.0;
  double disk_gib = 0.0;  // 0: the free space where the swap goes
  bool json = false;
};

constexpr MemCategory kColumns[] = {MemCategory::kParams, MemCategory::kGrads, MemCategory::kOptimizer,
                                    MemCategory::kActivations, MemCategory::kComm, MemCategory::kWorkspace};


// Loads the run configuration as train does; the estimate covers every stage whatever its
// zero_optimization.stage says, with its stage-3 knobs.
// One input per pipeline rank (one without a pipeline).
// *overlap_given: whether the configuration sets overlap_comm (else each stage's row takes that
// stage's default, as a run at that stage would).
std::vector<planner::MemoryInput> load_inputs(const EstimateOptions& o, std::string* swap_dir = nullptr,
                                              bool* overlap_given = nullptr) {
  engine::RunConfig c = load_layout_config("estimate", o.path, o.sets, o.procs);
  if (swap_dir) *swap_dir = c.zero.optimizer_nvme_path;
  if (overlap_given) *overlap_given = c.zero.overlap_comm_given;
  std::vector<planner::MemoryInput> out;
  for (int r = 0; r < c.pp; ++r) out.push_back(estimate_input(c, o.procs, r));
  return out;
}

// " of pipeline rank 1 (layers 6-11 + head, 2 micro-batches in flight)"
std::string pipeline_rank(const planner::MemoryInput& in) {
  if (!in.pipeline()) return "";
  std::string layers;
  for (auto [lo, hi] : in.chunks) layers += (layers.empty() ? "" : ", ") + std::to_string(lo) + "-" + std::to_string(hi - 1);
  return " of pipeline rank " + std::to_string(in.pp_rank) + " (" + (in.first_stage ? "embedding + " : "") + "layers " + layers +
         (in.last_stage ? " + head" : "") + ", " + std::to_string(in.slots) + " micro-batch(es) in flight)";
}

void print_table(const planner::MemoryInput& in, const std::vector<planner::StageEstimate>& est,
                 const std::vector<int>& fits, size_t budget) {
  const std::string ulysses = in.usp > 1 ? " x sp " + std::to_string(in.usp) + " (Ulysses)" : "";
  std::printf("%s; B=%d T=%d %s, %d optimizer state(s) per parameter%s; %d process(es) = tp %d%s%s x dp %d%s; per rank%s:\n",
              in.model.describe().c_str(), in.micro_batch, in.seq_length, dtype_name(in.compute_dtype),
              in.optimizer_states, in.recompute ? ", recompute" : "", in.world * in.tp * in.pp, in.tp,
              in.sequence_parallel ? " (sequence parallel)" : "", ulysses.c_str(), in.world / in.usp,
              in.pipeline() ? (" x pp " + std::to_string(in.pp)).c_str() : "", pipeline_rank(in).c_str());
  std::printf("%-6s", "stage");
  for (MemCategory c : kColumns) std::printf(" %11s", mem_category_name(c));
  std::printf(" %11s | %11s %11s\n", "total", "DS paper", "DS estimate");
  for (const planner::StageEstimate& e : est) {
    std::printf("%-6d", e.stage);
    for (MemCategory c : kColumns) std::printf(" %11s", format_bytes(e.ours[c]).c_str());
    std::printf(" %11s | %11s %11s\n", format_bytes(e.ours.total()).c_str(), format_bytes(e.ds_paper_bytes).c_str(),
                e.ds_estimator_bytes ? format_bytes(e.ds_estimator_bytes).c_str() : "-");
  }
  std::printf("setup peak (model states while the engine is built):");
  for (const planner::StageEstimate& e : est)
    std::printf("%s stage%d %s", e.stage ? "," : "", e.stage,
                format_bytes(e.setup[MemCategory::kParams] + e.setup[MemCategory::kGrads] +
                             e.setup[MemCategory::kOptimizer] + e.setup[MemCategory::kComm]).c_str());
  std::printf("\n");
  std::printf("allocator footprint (every block through its rules: kept blocks, whole 2 MiB pages; the process adds its "
              "constant, `calibrate`'s process_bytes):");
  for (const planner::StageEstimate& e : est)
    std::printf("%s stage%d %s%s%s%s%s", e.stage ? "," : "", e.stage, format_bytes(e.mapped).c_str(),
                e.mpi ? (" + MPI's temporaries " + format_bytes(e.mpi)).c_str() : "",
                e.exchange ? ((e.exchange_beside_mpi || !e.mpi ? " + " : " or ") + std::string("the 1-bit exchange's scratch ") +
                              format_bytes(e.exchange)).c_str()
                           : "",
                e.gemm_scratch ? (" + oneDNN's scratchpad " + format_bytes(e.gemm_scratch)).c_str() : "",
                e.gemm_widen ? (" + f16 operands widened to f32 " + format_bytes(e.gemm_widen)).c_str() : "");
  std::printf("\n");
  std::printf(
      "DS paper: model states (params + grads + optimizer) of the ZeRO paper (Rajbhandari et al. 2020), "
      "weights and grads in the compute dtype, K = 4 per state (+4 master in mixed precision).\n"
      "DS estimate: DeepSpeed's estimate_zero2/zero3_model_states_mem_needs (mixed-precision Adam, no offload).\n"
      "Ours differs: f32 gradients (as DeepSpeed's bf16 optimizer accumulates), f32 non-matrix weights in the "
      "model view, gathered/reduced unit buffers (comm), and activations and workspace, which DeepSpeed leaves out.\n");
  if (in.zero.optimizer_nvme) {
    std::printf("%s: on disk per rank (stage 0 cannot offload; its row is in memory%s):",
                in.zero.param_nvme ? "offload_optimizer + offload_param nvme (stage 3: master, gradients, moments)"
                                   : "offload_optimizer nvme: the optimizer state",
                in.zero.param_nvme ? "; stages 1-2 swap the optimizer state only" : "");
    for (const planner::StageEstimate& e : est)
      if (e.stage >= 1) std::printf("%s stage%d %s", e.stage > 1 ? "," : "", e.stage, format_bytes(e.disk_bytes).c_str());
    std::printf("; %d sub-group(s) of the span resident\n", in.zero.swap_buffers);
  }
  std::printf("largest micro-batch that fits %s:", format_bytes(budget).c_str());
  for (size_t s = 0; s < fits.size(); ++s) std::printf("%s stage%zu B=%d", s ? "," : "", s, fits[s]);
  std::printf("\n");
}

nlohmann::json to_json(const planner::MemoryInput& in, const std::vector<planner::StageEstimate>& est,
                       const std::vector<int>& fits, size_t budget) {
  nlohmann::json j;
  j["model"] = in.model.describe();
  j["params"] = in.model.num_params();
  j["procs"] = in.world * in.tp * in.pp;
  j["dp"] = in.world / in.usp;  // (the ZeRO group is dp x sp)
  j["sp"] = in.usp;
  j["tp"] = in.tp;
  j["pp"] = in.pp;
  if (in.pipeline()) {
    j["pp_rank"] = in.pp_rank;
    j["chunks"] = in.chunks;
    j["first_stage"] = in.first_stage;
    j["last_stage"] = in.last_stage;
    j["activation_slots"] = in.slots;
  }
  j["sequence_parallel"] = in.sequence_parallel;
  j["micro_batch"] = in.micro_batch;
  j["seq_length"] = in.seq_length;
  j["dtype"] = dtype_name(in.compute_dtype);
  j["optimizer_states"] = in.optimizer_states;
  j["recompute"] = in.recompute;
  j["memory_bytes"] = budget;
  j["stages"] = nlohmann::json::array();
  for (const planner::StageEstimate& e : est) {
    nlohmann::json s;
    s["stage"] = e.stage;
    for (MemCategory c : kColumns) s[mem_category_name(c)] = e.ours[c];
    s["total"] = e.ours.total();
    nlohmann::json setup;  // model states while the engine is built (before training's peaks)
    for (MemCategory c : {MemCategory::kParams, MemCategory::kGrads, MemCategory::kOptimizer, MemCategory::kComm})
      setup[mem_category_name(c)] = e.setup[c];
    s["setup"] = setup;
    s["ds_paper"] = e.ds_paper_bytes;
    s["ds_estimator"] = e.ds_estimator_bytes ? nlohmann::json(e.ds_estimator_bytes) : nlohmann::json(nullptr);
    s["disk"] = e.disk_bytes;  // offload to nvme: the swap files
    s["comm_low"] = e.comm_low;  // overlap_comm: comm when every reduction finishes early
    s["grads_low"] = e.grads_low;  // and the gradients
    s["held"] = e.held;            // the allocator's peak with its kept blocks
    s["mapped"] = e.mapped;        // the same in whole pages (FootprintReplay)
    s["mpi"] = e.mpi;              // libnbc's all-reduce temporaries, outside the allocator
    s["exchange"] = e.exchange;    // the 1-bit exchange's kept scratch, outside it too
    s["exchange_beside_mpi"] = e.exchange_beside_mpi;  // held while the all-reduce's temporaries are (else the larger)
    s["gemm_scratch"] = e.gemm_scratch;  // oneDNN's scratchpad region, outside the allocator
    s["gemm_widen"] = e.gemm_widen;      // f16 operands widened to f32 (no f16 matmul), outside it too
    j["stages"].push_back(s);
  }
  for (size_t s = 0; s < fits.size(); ++s) j["largest_micro_batch"]["stage" + std::to_string(s)] = fits[s];
  return j;
}

// Free bytes of the filesystem holding path (its nearest existing ancestor).
uint64_t free_disk_bytes(std::string path) {
  namespace fs = std::filesystem;
  fs::path p = fs::absolute(path.empty() ? "." : path);
  while (!fs::exists(p) && p.has_parent_path() && p != p.parent_path()) p = p.parent_path();
  std::error_code ec;
  const fs::space_info si = fs::space(p, ec);
  return ec ? 0 : si.available;
}

// The most layers of in's shape whose stage-3 estimate fits the RAM budget and the disk (the swap
// grows with the layers, the resident part with the largest unit): binary search, both monotone.
int largest_layers(planner::MemoryInput in, size_t budget, uint64_t disk) {
  auto fits = [&](int L) {
    in.model.n_layer = L;
    planner::StageEstimate e = planner::estimate_stage(in, 3);
    return e.ours.total() <= budget && e.disk_bytes <= disk;
  };
  if (!fits(1)) return 0;
  int lo = 1, hi = 2;
  while (hi < (1 << 16) && fits(hi)) lo = hi, hi *= 2;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

void run_estimate(const EstimateOptions& o) {
  MT_CHECK(o.procs >= 1, ErrorKind::kInvalidArgument, "--procs must be at least 1, got " + std::to_string(o.procs));
  const size_t given = gib_bytes(o.memory_gib, "--memory");
  const uint64_t disk_given = gib_bytes(o.disk_gib, "--disk");
  size_t budget = given > 0 ? given : physical_memory_bytes() / static_cast<size_t>(o.procs);
  // Under pipeline parallelism one table per pipeline rank (stages differ), ZeRO stages 0-1; in
  // JSON an array of the ranks' objects.
  nlohmann::json ranks = nlohmann::json::array();
  std::string swap_dir;
  bool overlap_given = true;
  const std::vector<planner::MemoryInput> inputs = load_inputs(o, &swap_dir, &overlap_given);
  for (const planner::MemoryInput& in : inputs) {
    std::vector<planner::StageEstimate> est;
    std::vector<int> fits;
    for (int stage = 0; stage <= (in.pipeline() ? 1 : 3); ++stage) {
      planner::MemoryInput row = in;  // overlap_comm unset: the stage's own default (on at 3, as DeepSpeed)
      if (!overlap_given) row.zero.overlap_comm = stage == 3;
      est.push_back(planner::estimate_stage(row, stage));
      fits.push_back(planner::largest_micro_batch(row, stage, budget));
    }
    if (o.json) ranks.push_back(to_json(in, est, fits, budget));
    else print_table(in, est, fits, budget);
    if (in.zero.param_nvme && !in.pipeline()) {  // ZeRO-Infinity: how far RAM + disk reach
      const uint64_t disk = disk_given > 0 ? disk_given : free_disk_bytes(swap_dir);
      const int L = largest_layers(in, budget, disk);
      planner::MemoryInput big = in;
      big.model.n_layer = std::max(L, 1);
      if (o.json) {
        ranks.back()["disk_bytes_available"] = disk;
        ranks.back()["largest_layers_stage3_swapped"] = L;
        ranks.back()["largest_params_stage3_swapped"] = L > 0 ? big.model.num_params() : 0;
      } else {
        std::printf("largest model of this shape in %s of RAM and %s of disk (stage 3, parameters and optimizer on "
                    "nvme): %d layers, %.2fB parameters\n",
                    format_bytes(budget).c_str(), format_bytes(disk).c_str(), L, L > 0 ? big.model.num_params() / 1e9 : 0.0);
      }
    }
  }
  if (o.json) std::printf("%s\n", (ranks.size() == 1 ? ranks[0] : ranks).dump(2).c_str());
}

}  // namespace

size_t gib_bytes(double gib, const std::string& what) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", gib);
  MT_CHECK(std::isfinite(gib) && gib >= 0.0 && gib <= 8589934592.0, ErrorKind::kInvalidArgument,
           what + ": " + buf + " is not a size in GiB from 0 to 2^33 (8 EiB)");
  return static_cast<size_t>(gib * 1073741824.0);
}

size_t physical_memory_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
}

planner::MemoryInput estimate_input(const engine::RunConfig& c, int procs, int pp_rank) {
  planner::MemoryInput in;
  in.model = c.model;
  in.micro_batch = static_cast<int>(c.batch.micro_batch_per_gpu);
  in.seq_length = static_cast<int>(c.seq_length);
  in.compute_dtype = c.compute_dtype;
  in.recompute = c.activation_checkpointing;
  in.documents = c.reset_position_ids || c.reset_attention_mask;
  in.optimizer_states = planner::optimizer_state_count(c.optimizer);
  // A 1-bit optimizer's exchange (engine.cpp's GradSyncOptions: per tensor but for 1-bit LAMB and fp16).
  if (optim::optimizer_is_onebit(c.optimizer))
    in.onebit = !optim::optimizer_is_onebit_lamb(c.optimizer) && c.compute_dtype != DType::kF16 ? planner::MemoryInput::OneBit::kPerTensor
                                                                                                : planner::MemoryInput::OneBit::kFlat;
  in.optimizer_momentum_copy = optim::optimizer_is_onebit_lamb(c.optimizer);
  // 0/1 Adam's variance steps all-reduce the gradients beside the exchange's kept scratch once one
  // follows an exchange (a run without train_iters counted as long).
  std::string type = c.optimizer.type;
  std::transform(type.begin(), type.end(), type.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (type == "zerooneadam")
    in.exchange_beside_all_reduce = planner::zero_one_variance_after_exchange(
        c.optimizer, c.train_iters > 0 ? c.train_iters : std::numeric_limits<int64_t>::max());
  MT_CHECK(c.processes == procs, ErrorKind::kInternal, "estimate: the configuration was resolved for another process count");
  // The ranks the model states are sharded and reduced over: procs / (tp pp), Ulysses' sp ranks
  // among them (dp x sp).
  in.world = c.world_size * c.sp;
  in.usp = c.sp;
  in.threads = threads_per_rank(procs);  // as meshtrain launch runs them, on this host
  in.tp = c.tp;
  in.sequence_parallel = c.sequence_parallel;
  in.vocab_divisible = c.vocab_divisible;
  in.zero.param_persistence_threshold = c.zero.stage3_param_persistence_threshold;
  in.zero.max_live_parameters = c.zero.stage3_max_live_parameters;
  in.zero.prefetch_bucket_size = c.zero.stage3_prefetch_bucket_size;
  in.zero.overlap_comm = c.zero.overlap_comm;  // the configuration's value for every stage's row
  in.zero.comm_dtype = engine::grad_comm_dtype(c, c.sp);
  in.zero.optimizer_nvme = c.zero.offload_optimizer == "nvme";
  in.zero.sub_group_size = c.zero.sub_group_size;
  in.zero.swap_buffers = c.zero.optimizer_buffer_count;
  in.zero.param_nvme = c.zero.offload_param == "nvme";
  in.zero.accumulation = c.batch.gradient_accumulation_steps > 1;
  in.zero.reduce_bucket_size = c.zero.reduce_bucket_size;
  in.pp = c.pp;
  in.pp_rank = pp_rank;
  if (c.pp > 1) {  // this rank's stage as engine_build_model makes it
    // "time": measured here, as the run's rank 0 would (timings vary: the run may cut otherwise).
    engine::LayerTimes times;
    if (c.partition == "time") times = engine::engine_measure_layer_times(c);
    const std::vector<int> b = engine::engine_pipeline_bounds(c, nullptr, &times);
    in = planner::pipeline_rank_input(in, engine::engine_schedule_spec(c), b, pp_rank);
  }
  return in;
}

void add_layout_options(CLI::App* cmd, std::string& path, int& procs, std::vector<std::string>& sets) {
  cmd->add_option("CONFIG", path, "run configuration JSON")->required();
  cmd->add_option("--procs", procs, "processes (default 1); data parallelism takes procs / parallel.tp");
  cmd->add_option("--set", sets, "override a key: a.b.c=value (JSON value or plain string)");
}

engine::RunConfig load_layout_config(const std::string& command, const std::string& path,
                                     const std::vector<std::string>& sets, int procs, const PlannerInputs& inputs) {
  // `meshtrain launch -n 4 -- estimate CFG` would run four one-process estimates, each refusing a
  // layout of four; the count is --procs.
  const char* world = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (world == nullptr) world = std::getenv("PMI_SIZE");
  if (world != nullptr && std::atoi(world) > 1)
    throw Error(ErrorKind::kInvalidArgument,
                command + " runs in one process and takes the process count from --procs; it was started as one of " +
                    std::string(world) + " MPI processes: run `meshtrain " + command + " CONFIG --procs " +
                    std::string(world) + "` without launch or mpirun");
  engine::ConfigSources src;
  src.config = path;
  src.sets = sets;
  engine::RunConfig c;
  try {
    c = load_planned_config(src, procs, inputs);
  } catch (const Error& e) {
    // The layout was resolved for --procs processes, not for an MPI world.
    const std::string what = e.what();
    if (e.kind() == ErrorKind::kInvalidArgument && what.find(" process(es)") != std::string::npos)
      throw Error(e.kind(), what + " (--procs " + std::to_string(procs) + ")");
    throw;
  }
  for (const auto& w : c.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  for (const auto& n : c.notes) std::fprintf(stderr, "auto: %s\n", n.c_str());
  return c;
}

void register_estimate(CLI::App& app) {
  auto* cmd = app.add_subcommand("estimate", "Memory per rank for ZeRO stages 0-3 and the largest micro-batch that fits");
  auto o = std::make_shared<EstimateOptions>();
  add_layout_options(cmd, o->path, o->procs, o->sets);
  cmd->add_option("--memory", o->memory_gib, "memory per rank in GiB (default, or 0: physical RAM / procs)");
  cmd->add_option("--disk", o->disk_gib,
                  "disk for the swap in GiB (offload to nvme; default, or 0: the free space under nvme_path)");
  cmd->add_flag("--json", o->json, "print JSON");
  cmd->callback([o] { run_estimate(*o); });
}

}  // namespace mt::cli
