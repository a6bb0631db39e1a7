// meshtrain plan CONFIG [--procs N] [--calibration cal.json | --cluster cluster.json] [--search | --search-batch]
// [--top K] [--memory GiB]
// [--set k=v]: the predicted step of the configuration's layout, or (--search, or a configuration
// that leaves its layout "auto") the layouts of N processes ranked by predicted step time within
// the memory budget (steps within planner::kTieBand of each other by memory), with the families rejected and why (issue 14). The step program comes from
// the runtime's own ZeRO schedule (planner/program.h), its times from the machine's calibration
// (`meshtrain calibrate`) and the model's shapes (planner/cost.h); the simulator gives the step.
// So far: data parallelism with ZeRO stages 0-3 in memory, micro-batch, accumulation and
// recompute, tensor parallelism, pipelines, and both (dp x tp x pp); offload is refused by name.
//
// load_planned_config: the same search resolves "auto" layouts at train's start-up.
#include <algorithm>
#include <functional>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <chrono>
#include <map>
#include <cmath>
#include <limits>
#include <unistd.h>
#include <random>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/signals.h"
#include "base/threads.h"
#include "cli/commands.h"
#include "cli/hostfile.h"
#include "engine/ds_config.h"
#include "engine/json_file.h"
#include "parallel/pp/schedule.h"
#include "planner/calibrate.h"
#include "planner/cluster.h"
#include "planner/search.h"
#include "models/module_profile.h"
#include "kernels/cpu/sparse_attention.h"

namespace mt::cli {
namespace {

// The rejected families printed (and put in a refusal) before "and N more".
constexpr size_t kShownRejections = 24;

struct PlanOptions {
  std::string path, calibration, cluster;
  bool search_batch = false;
  int procs = 1;
  std::vector<std::string> sets;
  bool search = false, json = false;
  int top = 5;
  int validate = 0, steps = 6, rounds = 1;
  double memory_gib = 0.0;
  std::string hostfile;  // --validate's runs go over these hosts (launch --hostfile)
  bool procs_given = false;
};

// s as one word of a shell command line: in single quotes, each ' as '\''.
std::string shell_word(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

// " --hostfile 'F'" for a launch over o's hosts, "" for this machine.
std::string hostfile_arg(const PlanOptions& o) { return o.hostfile.empty() ? "" : " --hostfile " + shell_word(o.hostfile); }

}  // namespace

static planner::Calibration calibration_from_json(const nlohmann::json& j, const std::string& path);

planner::Calibration load_calibration(const std::string& path, const std::string& key) {
  MT_CHECK(std::filesystem::exists(path), ErrorKind::kNotFound,
           key + ": " + path + " does not exist (meshtrain calibrate -o " + path +
               " measures this machine; under meshtrain launch -n N -- for N ranks' collectives)");
  const nlohmann::json j = engine::json_load_file(path);
  MT_CHECK(j.contains("fits") && j["fits"].is_object(), ErrorKind::kInvalidArgument,
           path + ": no 'fits' (write it with meshtrain calibrate)");
  try {
    planner::Calibration c = calibration_from_json(j, path);
    c.source = path;
    return c;
  } catch (const nlohmann::json::exception& e) {  // a field of another type, or missing: named with the file
    throw Error(ErrorKind::kInvalidArgument, path + ": " + e.what() + " (meshtrain calibrate --force writes it anew)");
  }
}

// The calibration's fields, each checked for a value a time or a count can have: negative rates
// predicted negative passes and a step of 0 s, curve points at 0 bytes an infinite time that the
// simulator reported as a deadlock, a process_bytes of -1 a budget of nothing (all with exit 0).
static planner::Calibration calibration_from_json(const nlohmann::json& j, const std::string& path) {
  auto bad = [&path](const std::string& what) {
    throw Error(ErrorKind::kInvalidArgument, path + ": " + what + " (meshtrain calibrate --force writes it anew)");
  };
  // (at most 1e6 s: 1.7e308 a unit overflowed to inf in the simulator, which reported a deadlock)
  auto time = [&](double v, const std::string& what) {
    if (!std::isfinite(v) || v < 0 || v > 1e6) bad(what + " must be a time from 0 to 1e6 s");
    return v;
  };
  // A field of another type is named (it was nlohmann's "type must be number, but is string").
  for (const char* k : {"world", "threads", "ranks_per_host", "kernel_ranks"})
    if (j.contains(k) && !j[k].is_number_integer()) bad(std::string(k) + " must be a whole number");
  for (const char* k : {"speed_probe_s", "exchange_probe_s"})
    if (j.contains(k) && !j[k].is_number()) bad(std::string(k) + " must be a number of seconds");
  for (const auto& [family, f] : j["fits"].items()) {
    if (!f.is_object()) bad("fits." + family + " must be an object of latency_s and per_unit_s");
    for (const char* k : {"latency_s", "per_unit_s"})
      if (!f.contains(k) || !f[k].is_number())
        bad("fits." + family + "." + k + (f.contains(k) ? " must be a number of seconds" : " is missing"));
  }
  planner::Calibration cal;
  cal.world = j.value("world", 1);
  cal.threads = j.value("threads", 1);
  cal.ranks_per_host = j.value("ranks_per_host", 0);
  cal.kernel_ranks = j.value("kernel_ranks", cal.ranks_per_host > 0 ? cal.ranks_per_host : cal.world);
  if (cal.world < 1 || cal.threads < 1 || cal.ranks_per_host < 0 || cal.kernel_ranks < 1 || cal.world > 65536)
    bad("world, threads and kernel_ranks must be at least 1 (world at most 65536), ranks_per_host at least 0");
  cal.speed_probe_s = time(j.value("speed_probe_s", 0.0), "speed_probe_s");
  cal.exchange_probe_s = time(j.value("exchange_probe_s", 0.0), "exchange_probe_s");
  for (const char* k : {"process_bytes", "cache_bytes"})
    if (j.contains(k) && !(j[k].is_number() && std::isfinite(j[k].get<double>()) && j[k].get<double>() >= 0 &&
                           j[k].get<double>() < 1e18))
      bad(std::string(k) + " must be a number of bytes, 0 or more");
  cal.process_bytes = j.value("process_bytes", size_t{0});
  cal.cache_bytes = j.value("cache_bytes", size_t{0});
  if (j.contains("f16_native") && !j["f16_native"].is_boolean()) bad("f16_native must be true or false");
  cal.f16_native = j.value("f16_native", false);
  if (j.contains("bf16_native") && !j["bf16_native"].is_boolean()) bad("bf16_native must be true or false");
  cal.bf16_native = j.value("bf16_native", true);
  if (j.contains("exchange_probes_s")) cal.exchange_probes = j["exchange_probes_s"].get<std::vector<double>>();
  if (j.contains("speed_probes_s")) cal.speed_probes = j["speed_probes_s"].get<std::vector<double>>();
  for (const auto& [family, f] : j["fits"].items()) {
    cal.fits[family] = planner::LinearFit{time(f.at("latency_s").get<double>(), "fits." + family + ".latency_s"),
                                          time(f.at("per_unit_s").get<double>(), "fits." + family + ".per_unit_s")};
    if (!f.contains("curve")) continue;
    std::vector<std::pair<double, double>> curve = f["curve"].get<std::vector<std::pair<double, double>>>();
    for (size_t i = 0; i < curve.size(); ++i) {
      if (!std::isfinite(curve[i].first) || curve[i].first <= 0 || (i > 0 && curve[i].first <= curve[i - 1].first))
        bad("fits." + family + ".curve's sizes must be positive and increasing");
      time(curve[i].second, "fits." + family + ".curve's times");
    }
    cal.set_curve(family, std::move(curve));
  }
  // A rate of 0 a unit (an edited or zeroed file) priced a step at 0 s and 0 tokens/s, exit 0: the
  // GEMMs, AdamW and the in-situ factors always take time (free memory traffic is a hand
  // calibration's way to price FLOPs alone).
  for (const auto& [family, f] : cal.fits)
    if (f.per_unit <= 0 && (family == "gemm f32" || family == "gemm bf16" || family == "adamw" ||
                            family.rfind("in situ ", 0) == 0))
      bad("fits." + family + ".per_unit_s is 0, which no machine measures (that work takes no time)");
  if (cal.fits.count("gemm bf16") && !cal.fits.count("gemm compute bf16"))  // from before DESIGN-NOTES 44
    std::fprintf(stderr,
                 "warning: %s has no GEMM compute lines, so a GEMM is priced by its flops alone and a split into smaller "
                 "micro-batches does not pay for reading the weights again; meshtrain calibrate --force measures them\n",
                 path.c_str());
  if (j.contains("disk") && j["disk"].is_object()) {  // calibrate --io DIR
    cal.disk_read_gbs = j["disk"].value("read_gbs", 0.0);
    cal.disk_write_gbs = j["disk"].value("write_gbs", 0.0);
    cal.disk_mixed_gbs = j["disk"].value("mixed_gbs", 0.0);
    cal.disk_interference_s_per_byte = j["disk"].value("interference_s_per_gb", 0.0) / 1e9;
    for (double v : {cal.disk_read_gbs, cal.disk_write_gbs, cal.disk_mixed_gbs, cal.disk_interference_s_per_byte})
      if (!std::isfinite(v) || v < 0) bad("disk's rates must be finite and 0 or more");
  }
  return cal;
}

namespace {

// data.reset_attention_mask's share of the causal tiles for `c`, read once a process (plan resolves
// an "auto" layout, then plans it). In an MPI world rank 0 reads it, tokenizing a text corpus into
// the cache while the others wait (as train's setup does), and sends it to them, so every rank
// plans the same layout. Data it cannot use is said, by rank 0, and priced as causal attention.
DocumentAttention documents_of(const engine::RunConfig& c, comm::Backend* world) {
  static std::map<std::string, DocumentAttention> memo;
  std::string key = std::to_string(c.seq_length) + "|" + c.split + "|" + c.sample_order + "|" + std::to_string(c.shuffle) + "|" +
                    std::to_string(c.data_seed) + "|" + std::to_string(c.train_iters) + "|" +
                    std::to_string(c.batch.train_batch_size) + "|" + std::to_string(c.eod_id) + "|" + c.tokenizer;
  for (const std::string& path : c.train_spec.paths) key += "|" + path;
  if (auto it = memo.find(key); it != memo.end()) return it->second;
  const bool lead = world == nullptr || world->rank() == 0;
  float got[2] = {1.0f, 0.0f};  // share, samples
  if (lead) {
    try {
      const DocumentAttention d = document_attention_share(c);
      got[0] = static_cast<float>(d.share);
      got[1] = static_cast<float>(d.samples);
    } catch (const std::exception& e) {  // a plan made away from the data, or data train would refuse
      if (const auto* err = dynamic_cast<const Error*>(&e); err && err->kind() == ErrorKind::kInternal) throw;
      std::fprintf(stderr, "warning: data.reset_attention_mask: the training data could not be used (%s), so its attention is "
                           "priced as causal, which overstates it\n", e.what());
    }
  }
  if (world != nullptr && world->size() > 1) {
    comm::BroadcastOptions o;
    o.tag = "the plan's documents";
    // Rank 0 may be tokenizing a text corpus (train's "data ready" barrier waits as long).
    o.timeout = std::chrono::milliseconds(int64_t{1'000'000'000'000});
    world->broadcast(got, 2, DType::kF32, o)->wait();
  }
  DocumentAttention r;
  r.share = got[0];
  r.samples = static_cast<int>(got[1]);
  memo[key] = r;
  return r;
}

// The job a configuration describes, its own layout as the base.
planner::PlanJob plan_job(const engine::RunConfig& c, int procs, comm::Backend* world = nullptr) {
  MT_CHECK(c.device == "cpu" || (c.zero.offload_optimizer == "none" && c.zero.offload_param == "none"),
           ErrorKind::kNotSupported, "plan: offload on device \"" + c.device + "\" is not in the cost model");
  // (Cast to int below: 1e12 samples wrapped to a negative accumulation.)
  MT_CHECK(c.batch.gradient_accumulation_steps <= planner::kMaxAccumulation &&
               c.batch.micro_batch_per_gpu <= std::numeric_limits<int>::max(),
           ErrorKind::kInvalidArgument,
           "plan: gradient_accumulation_steps " + std::to_string(c.batch.gradient_accumulation_steps) +
               " (the simulator runs each micro-batch: at most " + std::to_string(planner::kMaxAccumulation) +
               ") or train_micro_batch_size_per_gpu past int");
  planner::PlanJob job;
  // (16-bit master weights need a ZeRO stage of 1 or more as offload does)
  job.offload = c.zero.offload_optimizer != "none" || c.zero.offload_param != "none" || c.master_dtype != DType::kF32;
  job.memory = estimate_input(c, procs);
  job.schedule.overlap_comm = c.zero.overlap_comm;
  job.overlap_comm_given = c.zero.overlap_comm_given;
  job.schedule.prefetch_elems = static_cast<size_t>(c.zero.stage3_prefetch_bucket_size);
  job.schedule.persistence_threshold = static_cast<size_t>(c.zero.stage3_param_persistence_threshold);
  job.schedule.max_live_elems = static_cast<size_t>(c.zero.stage3_max_live_parameters);
  job.schedule.comm_dtype = c.comm_dtype;
  job.usp_comm_dtype = c.seq_comm_dtype;
  job.bucket_elems = static_cast<size_t>(c.zero.reduce_bucket_size);
  job.procs = procs;
  job.global_batch = c.batch.train_batch_size;
  job.schedule_kind = parallel::pp::parse_schedule(c.pipeline_schedule);
  job.virtual_stages = c.virtual_stages;
  job.partition = c.partition;
  job.base = planner::Layout{.dp = c.world_size, .tp = c.tp, .pp = c.pp, .stage = c.zero.stage,
                             .micro_batch = static_cast<int>(c.batch.micro_batch_per_gpu),
                             .accumulation = static_cast<int>(c.batch.gradient_accumulation_steps),
                             .recompute = c.activation_checkpointing, .schedule = job.schedule_kind,
                             .virtual_stages = job.virtual_stages, .sequence_parallel = c.sequence_parallel, .usp = c.sp};
  job.ulysses_refused = engine::ulysses_unsupported(c);
  // (A classifier runs with Ulysses since stop 80; its estimate there is not measured yet.)
  if (job.ulysses_refused.empty() && c.task == "classification") job.ulysses_refused = "task \"classification\" (in the planner)";
  job.sequence_parallel_forced = c.partition_activations;
  job.curriculum = c.curriculum.enabled;
  job.curriculum_gcd = engine::curriculum_lengths_gcd(c);
  job.cuda_replicas = c.device == "cuda" && procs > 1;
  job.sixteen_bit_master = c.master_dtype != DType::kF32;
  job.update = planner::update_kind(c.optimizer);
  // Optimizers whose steps differ: the mean of the run's train_iters steps, each kind priced as its
  // own step (1-bit Adam and 1-bit LAMB: their warm-up, AdamW's or LAMB's step after the gradients'
  // all-reduce, then the compressed phase: the gradients kept local, the momentum exchanged
  // compressed; 0/1 Adam: variance steps, compressed-gradient steps, local steps and syncs,
  // interleaved as its policy makes them).
  std::string type = c.optimizer.type;
  std::transform(type.begin(), type.end(), type.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (c.train_iters >= 1) job.update_mix = planner::update_mix(c.optimizer, 1, c.train_iters);
  job.mix_of = type == "onebitadam" ? "1-bit Adam" : type == "onebitlamb" ? "1-bit LAMB" : type == "zerooneadam" ? "0/1 Adam" : "";
  // The attention the run computes: its documents' share of the causal tiles, read from its own
  // first samples; a sparse layout's plan, as the model builds it over the model's heads.
  if (c.reset_attention_mask) {
    const DocumentAttention docs = documents_of(c, world);
    job.attention_share = docs.share;
    job.attention_samples = docs.samples;
  }
  if (c.sparse_attention) {
    kernels::SparsityConfig sc = *c.sparse_attention;
    sc.num_heads = c.model.n_head;
    job.sparse = std::make_shared<kernels::SparseAttentionPlan>(kernels::sparse_attention_plan(
        kernels::sparse_layout_for_length(sc, static_cast<int>(c.seq_length)), /*causal=*/true));
  }
  return job;
}

// More processes x threads on a host than it has cores (this machine's count; a calibration over
// several hosts gives its ranks per host): the simulator shares the cores among the ranks computing
// at once (the calibration times each kernel on a rank with cores of its own). Whether it does.
bool share_cores(planner::PlanJob& job, const planner::Calibration& cal) {
  const unsigned cores = static_cast<unsigned>(host_cores());
  const int per_host = cal.ranks_per_host > 0 ? std::min(cal.ranks_per_host, job.procs) : job.procs;
  if (cores == 0 || per_host * cal.threads <= static_cast<int>(cores)) return false;
  // Sharing cores, the simulator runs every rank (4096 on this 2-core machine took minutes): a
  // host of more than 64 processes a core is no plan for this calibration's machine.
  MT_CHECK(static_cast<int64_t>(per_host) * cal.threads <= int64_t{64} * cores, ErrorKind::kInvalidArgument,
           "plan: " + std::to_string(per_host) + " process(es) x " + std::to_string(cal.threads) + " thread(s) on one host of " +
               std::to_string(cores) + " cores (the calibration's machine; over 64 a core): give the hosts' calibration "
               "(calibrate under launch --hostfile) or a --cluster");
  if (cal.kernel_ranks * cal.threads > static_cast<int>(cores)) {  // a calibration from before kernel_ranks
    std::fprintf(stderr,
                 "warning: the calibration timed its kernels on %d rank(s) x %d thread(s) at once over %u core(s), so "
                 "its rates are shared ones; meshtrain calibrate --force times them on ranks with cores of their own\n",
                 cal.kernel_ranks, cal.threads, cores);
    return false;
  }
  job.host_cores = cores;
  job.threads = cal.threads;
  job.ranks_per_host = per_host;
  return true;
}

size_t budget_bytes(double gib, int procs) {
  if (gib > 0) return gib_bytes(gib, "the memory budget a rank (--memory, planner.memory_gib or the cluster's memory_gib)");
  return physical_memory_bytes() / static_cast<size_t>(procs);
}

// One number in a printf format.
std::string fmt(const char* format, double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, format, x);
  return buf;
}

std::string gib(size_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

// What the plan prices for attention when it is not the causal kernel ("" then): the documents'
// share of its tiles, or the sparse layout's pairs and the lines that price them. A calibration
// without the sparse kernel's lines prices them at the dense kernel's, said in a warning.
std::string attention_note(const planner::PlanJob& job, const planner::Calibration& cal, const std::string& source,
                           comm::Backend* world = nullptr) {
  if (job.sparse) {
    const int T = job.sparse->seq_len();
    const double share = models::attention_pairs(T, job.sparse->num_heads, job.sparse.get()) /
                         models::attention_pairs(T, job.sparse->num_heads, nullptr);
    const int b = planner::sparse_attention_line(cal, job.sparse->block);
    static bool said = false;  // once a process (plan resolves an "auto" layout, then plans it), by rank 0
    if (b == 0 && !said && (world == nullptr || world->rank() == 0) && (said = true))
      std::fprintf(stderr,
                   "warning: %s has no sparse attention lines, so sparse_attention's pairs are priced at the dense "
                   "kernel's rate (about 1.5 times the sparse kernel's at block 16 here); meshtrain calibrate --force measures them\n",
                   source.c_str());
    return "sparse_attention: " + fmt("%.1f", 100 * share) + "% of the causal pairs" +
           (b > 0 ? ", at the sparse kernel's block-" + std::to_string(b) + " lines" : ", at the dense kernel's rate");
  }
  if (job.attention_samples > 0)
    return "data.reset_attention_mask: the documents leave " + fmt("%.1f", 100 * job.attention_share) + "% of the causal kernel's tiles" +
           " (the run's first " + std::to_string(job.attention_samples) + " samples)" +
           (cal.fits.count("attention forward query tile") && cal.fits.count("attention backward query tile")
                ? ", and every query tile's fixed work"
            : cal.has_network ? ""
                              : "; priced by the pairs alone (calibrate --force splits off a query tile's fixed work, which "
                                "documents keep)");
  return "";
}

// A kind of step's short name (plan's "by kind" line and --json).
const char* step_kind_name(planner::UpdateKind kind, bool zero_one) {
  switch (kind) {
    case planner::UpdateKind::kAdamW: return zero_one ? "variance" : "warm-up";
    case planner::UpdateKind::kLamb: return "warm-up";
    case planner::UpdateKind::kZeroOneCompressed: return "compressed-gradient";
    case planner::UpdateKind::kZeroOneLocal: return "local";
    case planner::UpdateKind::kZeroOneSync: return "sync";
    default: return "compressed";
  }
}

// The optimizer's kinds of step the plan prices, where its steps differ ("" else).
std::string optimizer_note(const planner::PlanJob& job, const planner::Calibration& cal) {
  if (job.update_mix.empty()) return "";
  const bool exchange_line = cal.has_network || cal.fits.count("onebit_all_reduce");
  const bool zero_one = job.mix_of == "0/1 Adam";
  std::string kinds;
  for (const auto& [kind, share] : job.update_mix) {
    using planner::UpdateKind;
    const char* name = kind == UpdateKind::kAdamW ? (zero_one ? "variance steps (AdamW's, the gradients all-reduced)"
                                                              : "warm-up steps (AdamW's, the gradients all-reduced)")
                       : kind == UpdateKind::kLamb              ? "warm-up steps (LAMB's, the gradients all-reduced)"
                       : kind == UpdateKind::kZeroOneCompressed ? "compressed-gradient steps"
                       : kind == UpdateKind::kZeroOneLocal      ? "local steps"
                       : kind == UpdateKind::kZeroOneSync       ? "syncs"
                                                                : "compressed steps (the gradients kept local, the momentum exchanged)";
    kinds += (kinds.empty() ? "" : ", ") + fmt("%.1f%% ", 100 * share) + name;
  }
  const bool exchanges =
      std::any_of(job.update_mix.begin(), job.update_mix.end(), [](const auto& k) { return planner::update_exchanges(k.first); });
  const bool update_lines = std::all_of(job.update_mix.begin(), job.update_mix.end(), [&cal](const auto& k) {
    return cal.fits.count(planner::update_line(k.first, false)) > 0;
  });
  return job.mix_of + ", the mean of its steps: " + kinds +
         (!exchanges       ? std::string()
          : exchange_line ? "; the compressed exchange at its calibrated line"
                          : "; the compressed exchange at the all-reduce's line (a calibration without it: calibrate again)") +
         (update_lines       ? ""
          : cal.has_network ? "; updates without a line of their own at AdamW's or LAMB's"
                            : "; updates without a line of their own at AdamW's or LAMB's (a calibration without the optimizer's "
                              "own lines: calibrate again)");
}

std::string prediction_line(const planner::Layout& l, const planner::Prediction& p) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s: %.4f s a step, %.0f tokens/s, %s a rank%s", l.describe().c_str(), p.step,
                p.tokens_per_s, gib(p.memory).c_str(), p.process > 0 ? (" (" + gib(p.process) + " as the process)").c_str() : "");
  return buf;
}

void print_search(const planner::SearchResult& r, int top, size_t budget, bool json) {
  if (json) {
    nlohmann::json j;
    j["budget_bytes"] = budget;
    j["considered"] = r.considered;
    for (size_t i = 0; i < r.ranked.size() && static_cast<int>(i) < top; ++i) {
      const auto& [l, p] = r.ranked[i];
      j["ranked"].push_back({{"dp", l.dp}, {"tp", l.tp}, {"pp", l.pp}, {"sp", l.usp},
                             {"pipeline_schedule", l.pp > 1 ? parallel::pp::schedule_name(l.schedule) : "1f1b"},
                             {"virtual_stages", l.pp > 1 ? l.virtual_stages : 1},
                             {"sequence_parallel", l.tp > 1 && l.sequence_parallel}, {"stage", l.stage}, {"micro_batch", l.micro_batch},
                             {"accumulation", l.accumulation}, {"recompute", l.recompute}, {"step_s", p.step},
                             {"step_progress_s", p.step_progress}, {"tokens_per_s", p.tokens_per_s},
                             {"memory_bytes", p.memory}, {"process_bytes", p.process}});
    }
    j["rejected"] = r.rejected;
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("%d layout(s) considered, %zu within %s a rank; the fastest %d (steps within %.0f%% of each other: less "
              "memory first):\n",
              r.considered, r.ranked.size(), gib(budget).c_str(), top, 100 * planner::kTieBand);
  // memory: the accounted bytes; process: what the kernel will count (the calibration's process
  // constant and the allocator's pages and kept blocks on top), which the budget applies to.
  const bool process = !r.ranked.empty() && r.ranked.front().prediction.process > 0;
  int width = 52;  // the layout column: as wide as the longest printed layout
  for (size_t i = 0; i < r.ranked.size() && static_cast<int>(i) < top; ++i)
    width = std::max(width, static_cast<int>(r.ranked[i].layout.describe().size()));
  std::printf("%4s  %-*s %10s %12s %11s%s\n", "rank", width, "layout", "step s", "tokens/s", "memory", process ? "     process" : "");
  for (size_t i = 0; i < r.ranked.size() && static_cast<int>(i) < top; ++i) {
    const auto& [l, p] = r.ranked[i];
    std::printf("%4zu  %-*s %10.4f %12.0f %11s%s\n", i + 1, width, l.describe().c_str(), p.step, p.tokens_per_s,
                gib(p.memory).c_str(), process ? (" " + std::string(12 - std::min<size_t>(12, gib(p.process).size()), ' ') + gib(p.process)).c_str() : "");
  }
  if (!r.rejected.empty()) {
    // A search of thousands of processes rejects hundreds of families: the first kShownRejections,
    // and the count of the rest, which --json lists.
    std::printf("rejected:\n");
    for (size_t i = 0; i < r.rejected.size() && i < kShownRejections; ++i) std::printf("  %s\n", r.rejected[i].c_str());
    if (r.rejected.size() > kShownRejections)
      std::printf("  ... and %zu more (--json lists them all)\n", r.rejected.size() - kShownRejections);
  }
}

// The pipeline's schedule and sequence parallelism of `l` as --set overrides. Without a pipeline the configuration's
// pipeline knobs (an interleaved schedule's virtual stages) do not apply.
std::vector<std::string> schedule_sets(const planner::Layout& l) {
  const std::string sp = std::string("parallel.sequence_parallel=") + (l.tp > 1 && l.sequence_parallel ? "true" : "false");
  const std::string usp = "parallel.sp=" + std::to_string(l.usp);  // Ulysses
  if (l.pp == 1) return {"parallel.virtual_stages=1", "parallel.pipeline_schedule=1f1b", sp, usp};
  return {"parallel.pipeline_schedule=" + std::string(parallel::pp::schedule_name(l.schedule)),
          "parallel.virtual_stages=" + std::to_string(l.virtual_stages), sp, usp};
}

// The --set overrides that make a configuration train `l`.
std::vector<std::string> layout_sets(const planner::Layout& l) {
  std::vector<std::string> sets = {"parallel.tp=" + std::to_string(l.tp), "parallel.pp=" + std::to_string(l.pp),
                                   "zero_optimization.stage=" + std::to_string(l.stage),
                                   "train_micro_batch_size_per_gpu=" + std::to_string(l.micro_batch),
                                   "gradient_accumulation_steps=" + std::to_string(l.accumulation),
                                   std::string("activation_checkpointing.enabled=") + (l.recompute ? "true" : "false")};
  for (const std::string& s : schedule_sets(l)) sets.push_back(s);
  return sets;
}

struct Measured {
  double step = 0.0;   // the median step of steps 3.. (seconds: the batch's tokens / tokens_per_s)
  // Steps that differ by kind (0/1 Adam's, priced as a mean): the mean of steps 3.. that updated
  // (an fp16 overflow skips the update, and the optimizer's count with it), and the updates they
  // made, first to last.
  double mean = 0.0;
  int64_t first_update = 0, last_update = 0;
  double memory = 0.0; // rank 0's accounted peaks, each category at its own, summed (bytes)
  double rss = 0.0;    // rank 0's VmHWM: what the kernel counts for the process (bytes)
};

// Trains `l` for o.steps steps (under meshtrain launch when it has several processes) and reads its
// --metrics file: tokens a step / tokens_per_s gives each step's seconds. Throws naming the layout
// and its log when the run fails.
Measured measure_layout(const PlanOptions& o, const planner::Layout& l, double tokens, const std::string& dir, int index) {
  const std::string stem = dir + "/layout" + std::to_string(index), metrics = stem + ".jsonl", log = stem + ".log";
  std::filesystem::remove(metrics);
  std::string cmd = self_exe();
  const int procs = l.dp * l.tp * l.pp * l.usp;
  if (procs > 1) cmd += " launch -n " + std::to_string(procs) + hostfile_arg(o) + " --";
  cmd += " train " + shell_word(o.path);
  std::vector<std::string> sets = o.sets;
  for (const std::string& s : layout_sets(l)) sets.push_back(s);
  for (const std::string& s : {std::string("train_iters=") + std::to_string(o.steps), std::string("save_dir="),
                               std::string("eval_interval=0"), std::string("steps_per_print=1")})
    sets.push_back(s);
  for (const std::string& s : sets) cmd += " --set " + shell_word(s);
  cmd += " --metrics " + shell_word(metrics) + " > " + shell_word(log) + " 2>&1";
  const int rc = system_as_started(cmd);
  MT_CHECK(rc == 0, ErrorKind::kInternal, "plan --validate: " + l.describe() + " did not train (see " + log + ")");
  std::vector<double> steps, updated;
  int64_t updates = 0;
  Measured m;
  std::map<std::string, double> peaks;
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const bool update = j.contains("tokens_per_s") && !j.value("skipped", false);
    updates += update;
    if (j.value("step", 0) >= 3 && j.value("tokens_per_s", 0.0) > 0) {
      steps.push_back(tokens / j["tokens_per_s"].get<double>());
      if (update) {
        updated.push_back(steps.back());
        if (m.first_update == 0) m.first_update = updates;
        m.last_update = updates;
      }
    }
    for (const auto& [k, v] : j.items())
      if (k.rfind("peak_", 0) == 0 && v.is_number()) peaks[k] = std::max(peaks[k], v.get<double>());
    m.rss = std::max(m.rss, j.value("rss_peak_bytes", 0.0));
  }
  MT_CHECK(!steps.empty(), ErrorKind::kInternal,
           "plan --validate: " + metrics + " has no step past the second" +
               (o.hostfile.empty() ? std::string() : " (rank 0 writes it on " + o.hostfile + "'s first host: run plan there)"));
  for (double t : updated) m.mean += t / static_cast<double>(updated.size());
  std::sort(steps.begin(), steps.end());
  m.step = steps.size() % 2 ? steps[steps.size() / 2] : 0.5 * (steps[steps.size() / 2 - 1] + steps[steps.size() / 2]);
  for (const auto& [k, v] : peaks) m.memory += v;
  return m;
}

// The exchange probe now over `procs` ranks (launch -n procs -- calibrate --exchange-probe), in
// seconds; throws naming its log when it fails.
double exchange_probe_now(const PlanOptions& o, int procs, const std::string& dir) {
  const std::string log = dir + "/exchange-probe.log";
  const std::string cmd =
      self_exe() + " launch -n " + std::to_string(procs) + hostfile_arg(o) + " -- calibrate --exchange-probe > " + shell_word(log) + " 2>&1";
  const int rc = system_as_started(cmd);
  std::ifstream f(log);
  std::string line;
  double s = 0;
  while (std::getline(f, line))  // launch tags each line with its rank ("[1,0]<stdout>:")
    if (const size_t at = line.find("exchange probe: "); at != std::string::npos) s = std::atof(line.c_str() + at + 16);
  MT_CHECK(rc == 0 && s > 0, ErrorKind::kInternal, "plan --validate: the exchange probe over " + std::to_string(procs) +
                                                       " ranks failed (see " + log + ")");
  return s;
}

// Kendall's tau-a of two orders.
double kendall_tau(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  const size_t n = a.size();
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) {
      const double x = (a[i] - a[j]) * (b[i] - b[j]);
      s += x > 0 ? 1 : x < 0 ? -1 : 0;
    }
  return n > 1 ? s / (0.5 * static_cast<double>(n) * static_cast<double>(n - 1)) : 1.0;
}

// plan --validate K: the search's first K layouts, K others drawn from the rest of those that fit,
// and the configuration's own (when it fits), trained here; predicted against measured.
using StepMix = std::vector<std::pair<planner::UpdateKind, double>>;

// Whether a mix holds a 1-bit optimizer's compressed steps (plan --validate's runs then set
// freeze_step 1, so that their measured steps are such).
bool has_onebit_compressed(const StepMix& mix) {
  return std::any_of(mix.begin(), mix.end(), [](const auto& k) {
    return k.first == planner::UpdateKind::kOneBitAdamCompressed || k.first == planner::UpdateKind::kOneBitLambCompressed;
  });
}

// mix_of: where the job's steps differ by kind (update_mix), their shares over updates first..last:
// each layout is priced over the updates its measured steps made (3 to o.steps, less any skipped)
// and measured by their mean.
void validate(const PlanOptions& o, const planner::PlanJob& job, const planner::SearchResult& r, const planner::Calibration& cal,
              const std::function<StepMix(int64_t, int64_t)>& mix_of) {
  std::vector<size_t> picks;
  for (size_t i = 0; i < r.ranked.size() && static_cast<int>(i) < o.validate; ++i) picks.push_back(i);
  std::vector<size_t> rest;
  for (size_t i = picks.size(); i < r.ranked.size(); ++i) rest.push_back(i);
  std::mt19937 rng(1);
  std::shuffle(rest.begin(), rest.end(), rng);
  for (size_t i = 0; i < rest.size() && static_cast<int>(i) < o.validate; ++i) picks.push_back(rest[i]);
  for (size_t i = 0; i < r.ranked.size(); ++i) {
    const planner::Layout& l = r.ranked[i].layout;
    const planner::Layout& b = job.base;
    const bool same_schedule = (l.pp == 1 || (l.schedule == b.schedule && l.virtual_stages == b.virtual_stages)) &&
                               (l.tp == 1 || l.sequence_parallel == b.sequence_parallel);
    if (l.dp == b.dp && l.tp == b.tp && l.pp == b.pp && l.usp == b.usp && l.stage == b.stage && l.micro_batch == b.micro_batch &&
        l.recompute == b.recompute && same_schedule && std::find(picks.begin(), picks.end(), i) == picks.end())
      picks.push_back(i);
  }
  std::sort(picks.begin(), picks.end());
  const std::string dir = (std::filesystem::temp_directory_path() / ("meshtrain-validate-" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  const double tokens = static_cast<double>(job.global_batch) * job.memory.seq_length;
  const bool onebit_compressed = has_onebit_compressed(job.update_mix);
  if (onebit_compressed)
    std::printf("each run sets optimizer.params.freeze_step=1: its measured steps (3 on) are in the compressed phase the plan priced\n");
  planner::PlanJob window = job;
  if (mix_of) {
    window.update_mix = mix_of(3, o.steps);
    std::printf("%s: each layout priced as the mean of the steps measured (3 to %d where no overflow skips one: %s), "
                "and measured by their mean\n",
                job.mix_of.c_str(), o.steps, optimizer_note(window, cal).substr((job.mix_of + ", the mean of its steps: ").size()).c_str());
  }
  if (!o.hostfile.empty() && job.procs > 1)
    std::printf("each run: meshtrain launch -n %d --hostfile %s (rank 0, which writes the metrics, on its first host)\n",
                job.procs, o.hostfile.c_str());
  std::map<size_t, std::pair<int64_t, int64_t>> updates_of;  // each pick's measured updates (its last run's)
  std::printf("%4s  %-48s %10s %10s %7s %11s %11s %7s\n", "rank", "layout", "predicted", "measured", "error",
              "rank 0 mem", "measured", "error");
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  std::vector<double> predicted, measured, step_errors, memory_errors, at_speed, speed_errors, slowdowns;
  std::vector<double> beyond;  // each layout's VmHWM over its predicted accounted peak, bytes
  std::vector<double> process_errors;  // each layout's predicted process peak against its VmHWM
  std::vector<std::pair<double, double>> spread;  // --rounds: each pick's fastest and slowest run
  // Before each run the speed probe (planner::speed_probe) gives the machine's slowdown against the
  // calibration's moment; each run's step divided by it is the step at the calibrated speed.
  const bool probe = cal.speed_probe_s > 0;
  // Before each run of the calibration's world, the exchange probe too (DESIGN-NOTES 52): the
  // ranks' data exchange against the calibration's.
  const bool exchange = cal.exchange_probe_s > 0 && cal.world > 1;
  std::map<size_t, std::vector<double>> exchange_of;  // each pick's probes, seconds
  std::vector<double> exchanges;
  auto run = [&](size_t i, std::vector<double>& steps, std::vector<double>& slow) {
    const planner::Layout& l = r.ranked[i].layout;
    if (exchange && l.dp * l.tp * l.pp * l.usp == cal.world) exchange_of[i].push_back(exchange_probe_now(o, cal.world, dir));
    if (probe) slow.push_back(planner::speed_probe(cal.threads) / cal.speed_probe_s);
    // The phase the plan priced: a 1-bit optimizer's compressed one from its second update, so that
    // the measured steps (3 on) are in it.
    PlanOptions run_o = o;
    if (onebit_compressed) run_o.sets.push_back("optimizer.params.freeze_step=1");
    Measured m = measure_layout(run_o, r.ranked[i].layout, tokens, dir, static_cast<int>(i));
    if (mix_of) {
      MT_CHECK(m.first_update > 0, ErrorKind::kInternal,
               "plan --validate: " + r.ranked[i].layout.describe() + " made no update past its second step (every one skipped)");
      m.step = m.mean;
      updates_of[i] = {m.first_update, m.last_update};
    }
    steps.push_back(m.step);
    return m;
  };
  // --rounds R: rounds 1 .. R-1 train every pick in turn first; the last round prints each with the
  // median of its R steps (the drift of a shared machine lands on every layout alike).
  std::map<size_t, std::vector<double>> steps_of, slow_of;
  for (int round = 1; round < o.rounds; ++round)
    for (size_t i : picks) run(i, steps_of[i], slow_of[i]);
  for (size_t i : picks) {
    const planner::Layout& l = r.ranked[i].layout;
    planner::Prediction p = r.ranked[i].prediction;
    std::vector<double>& all = steps_of[i];
    std::vector<double>& slow = slow_of[i];
    Measured m = run(i, all, slow);
    if (mix_of) {  // the measured steps' kinds
      window.update_mix = mix_of(updates_of[i].first, updates_of[i].second);
      const planner::Prediction w = planner::predict_layout(window, l, cal);
      p.step = w.step;
      p.step_progress = w.step_progress;
      p.tokens_per_s = w.tokens_per_s;
    }
    std::string runs;
    if (o.rounds > 1) {
      for (double t : all) runs += fmt(" %.4g", t);
      spread.emplace_back(*std::min_element(all.begin(), all.end()), *std::max_element(all.begin(), all.end()));
      m.step = median(all);
    }
    predicted.push_back(p.step);
    measured.push_back(m.step);
    step_errors.push_back(std::abs(p.step / m.step - 1));
    std::string speeds;
    if (probe) {
      std::vector<double> normal;
      for (size_t k = 0; k < all.size(); ++k) {
        normal.push_back(all[k] / slow[k]);
        speeds += fmt(" %.3f", slow[k]);
        slowdowns.push_back(slow[k]);
      }
      at_speed.push_back(median(normal));
      speed_errors.push_back(std::abs(p.step / at_speed.back() - 1));
    }
    std::string probes;
    for (double x : exchange_of[i]) probes += fmt(" %.2f", x / cal.exchange_probe_s), exchanges.push_back(x);
    // Rank 0's categories (a pipeline's first stage) against its own prediction.
    const double mine = static_cast<double>(p.memory_by_stage.empty() ? p.memory_train : p.memory_by_stage.front());
    memory_errors.push_back(m.memory > 0 ? std::abs(mine / m.memory - 1) : 0.0);
    std::printf("%4zu  %-48s %9.4fs %9.4fs %+6.1f%% %11s %11s %+6.1f%%\n", i + 1, l.describe().c_str(), p.step, m.step,
                100 * (p.step / m.step - 1), gib(static_cast<size_t>(mine)).c_str(), gib(static_cast<size_t>(m.memory)).c_str(),
                m.memory > 0 ? 100 * (mine / m.memory - 1) : 0.0);
    if (!runs.empty()) std::printf("      runs in turn (s):%s\n", runs.c_str());
    if (probe)
      std::printf("      slowdown at each run (speed probe / the calibration's):%s; at the calibrated speed %.4fs %+.1f%%\n",
                  speeds.c_str(), at_speed.back(), 100 * (p.step / at_speed.back() - 1));
    if (!probes.empty())
      std::printf("      exchange at each run (1 MiB all_reduce / the calibration's %.3f ms):%s\n", cal.exchange_probe_s * 1e3,
                  probes.c_str());
    if (m.rss > 0) {  // the outside count: the process as the kernel sees it (DESIGN-NOTES 57, 58)
      beyond.push_back(m.rss - mine);
      std::printf("      process peak (VmHWM) %s: %+.0f MiB over the accounted prediction (%+.1f%%)", gib(static_cast<size_t>(m.rss)).c_str(),
                  (m.rss - mine) / 1048576.0, 100 * (m.rss / mine - 1));
      if (!p.process_by_stage.empty()) {  // rank 0's predicted process peak
        const double want = static_cast<double>(p.process_by_stage.front());
        process_errors.push_back(std::abs(want / m.rss - 1));
        std::printf("; predicted as the process %s, %+.1f%%", gib(static_cast<size_t>(want)).c_str(), 100 * (want / m.rss - 1));
      }
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  const double best = *std::min_element(measured.begin(), measured.end());
  std::printf("step error: median %.1f%%, worst %.1f%%; memory error: median %.1f%%, worst %.1f%%; Kendall's tau %.2f\n",
              100 * median(step_errors), 100 * *std::max_element(step_errors.begin(), step_errors.end()),
              100 * median(memory_errors), 100 * *std::max_element(memory_errors.begin(), memory_errors.end()),
              kendall_tau(predicted, measured));
  if (!beyond.empty()) {
    const auto [lo, hi] = std::minmax_element(beyond.begin(), beyond.end());
    std::printf("process peak (VmHWM) over the predicted accounted peak: median %+.0f MiB (%+.0f to %+.0f): the binary, its "
                "libraries and threads, MPI's buffers, the allocator's kept blocks and whole pages, which the accounted "
                "bytes leave out\n",
                median(beyond) / 1048576.0, *lo / 1048576.0, *hi / 1048576.0);
  }
  if (!process_errors.empty())
    std::printf("process peak error (the prediction with the calibration's process constant, %.1f MiB, against VmHWM): "
                "median %.1f%%, worst %.1f%%\n",
                static_cast<double>(cal.process_bytes) / 1048576.0, 100 * median(process_errors),
                100 * *std::max_element(process_errors.begin(), process_errors.end()));
  if (probe) {  // the model against the machine as it was calibrated: its drift since taken out
    std::printf("at the calibrated speed (each run's step / its slowdown, %.2f-%.2f, median %.2f): step error median %.1f%%, "
                "worst %.1f%%; Kendall's tau %.2f\n",
                *std::min_element(slowdowns.begin(), slowdowns.end()), *std::max_element(slowdowns.begin(), slowdowns.end()),
                median(slowdowns), 100 * median(speed_errors), 100 * *std::max_element(speed_errors.begin(), speed_errors.end()),
                kendall_tau(predicted, at_speed));
    const std::string verdict = planner::speed_verdict(slowdowns);
    if (!verdict.empty()) std::printf("warning: %s\n", verdict.c_str());
  }
  if (!exchanges.empty()) {  // whether the runs met the exchange at the calibration's speed
    const auto [lo, hi] = std::minmax_element(exchanges.begin(), exchanges.end());
    std::printf("exchange probe at the runs: median %.3f ms (%.3f-%.3f), the calibration's %.3f ms\n", median(exchanges) * 1e3,
                *lo * 1e3, *hi * 1e3, cal.exchange_probe_s * 1e3);
    const std::string verdict = planner::exchange_verdict(cal.exchange_probe_s, exchanges);
    if (!verdict.empty()) std::printf("warning: %s\n", verdict.c_str());
  }
  if (!spread.empty()) {  // which swapped pairs the runs themselves cannot order
    int pairs = 0, discordant = 0, overlapping = 0;
    for (size_t i = 0; i < predicted.size(); ++i)
      for (size_t j = i + 1; j < predicted.size(); ++j) {
        ++pairs;
        if ((predicted[i] - predicted[j]) * (measured[i] - measured[j]) >= 0) continue;
        ++discordant;
        overlapping += spread[i].first <= spread[j].second && spread[j].first <= spread[i].second;
      }
    std::printf("order: %d of %d pairs swapped, %d of them with overlapping runs (an order the runs do not settle)\n",
                discordant, pairs, overlapping);
  }
  std::printf("the chosen layout (rank 1) measured %.4f s, %.1f%% over the best measured (%.4f s)\n", measured.front(),
              100 * (measured.front() / best - 1), best);
  std::filesystem::remove_all(dir);
}

void run_plan(PlanOptions o) {
  // --hostfile: the hosts --validate trains on (DeepSpeed's format, as launch reads it); --procs
  // defaults to their slots, and a rank's memory is its host's over the ranks it runs.
  std::vector<HostSlots> hosts;
  if (!o.hostfile.empty()) {
    MT_CHECK(o.cluster.empty(), ErrorKind::kInvalidArgument,
             "plan: --hostfile names the hosts --validate trains on; a described --cluster is priced, not trained on");
    hosts = hostfile_parse(read_launcher_file(o.hostfile), o.hostfile);
    MT_CHECK(!hosts.empty(), ErrorKind::kInvalidArgument, o.hostfile + ": no hosts");
    long slots = 0;
    for (const HostSlots& h : hosts) slots += h.slots;
    // (70000 slots planned 65536 processes and printed that count as the hostfile's.)
    MT_CHECK(o.procs_given || slots <= 65536, ErrorKind::kInvalidArgument,
             o.hostfile + ": " + std::to_string(slots) + " slots in all, more than the 65536 processes a plan takes; give --procs");
    if (!o.procs_given) o.procs = static_cast<int>(slots);
    MT_CHECK(o.procs <= slots, ErrorKind::kInvalidArgument,
             "plan: --procs " + std::to_string(o.procs) + " is more than " + o.hostfile + "'s " + std::to_string(slots) + " slots");
  }
  // (0 divided the batch by it under "parallel": "auto": SIGFPE.)
  MT_CHECK(o.procs >= 1, ErrorKind::kInvalidArgument, "--procs must be at least 1, got " + std::to_string(o.procs));
  gib_bytes(o.memory_gib, "--memory");  // a negative or non-finite one is refused, not passed over
  // Over hosts, mpirun fills the first host's slots first: a rank shares this machine's memory (the
  // first host's, where plan runs) with at most that many.
  const int here = hosts.empty() ? o.procs : std::min(o.procs, hosts.front().slots);
  // An "auto" configuration is searched with plan's own rates and budget (it was searched with its
  // planner block's, then priced with these: a layout chosen for this machine shown for an H100).
  PlannerInputs inputs{o.calibration, o.cluster, o.memory_gib};
  inputs.ranks_a_host = here;
  const engine::RunConfig c = load_layout_config("plan", o.path, o.sets, o.procs, inputs);
  MT_CHECK(o.cluster.empty() || o.calibration.empty(), ErrorKind::kInvalidArgument,
           "plan: --cluster and --calibration are two sources of the same rates; give one");
  MT_CHECK(o.cluster.empty() || o.validate == 0, ErrorKind::kInvalidArgument,
           "plan --validate trains here; a described --cluster cannot be validated on this machine");
  // A described cluster (its devices' memory the budget), or this machine's calibration.
  planner::ClusterSpec spec;
  if (!o.cluster.empty()) spec = planner::parse_cluster(engine::json_load_file(o.cluster), o.cluster);
  const std::string cal_path = !o.cluster.empty() ? o.cluster : o.calibration.empty() ? c.planner.calibration : o.calibration;
  const planner::Calibration cal =
      !o.cluster.empty() ? planner::cluster_calibration(spec)
                         : load_calibration(cal_path, o.calibration.empty() ? "planner.calibration" : "--calibration");
  planner::PlanJob job = plan_job(c, o.procs);
  const double gib_given = o.memory_gib > 0 ? o.memory_gib : !o.cluster.empty() ? spec.memory_gib : c.planner.memory_gib;
  const size_t budget = budget_bytes(gib_given, here);
  if (hosts.size() > 1 && o.procs > hosts.front().slots) {  // the runs span hosts: the plan must know them
    MT_CHECK(cal.ranks_per_host > 0, ErrorKind::kInvalidArgument,
             "plan --hostfile: " + cal_path + " was calibrated on one host, so it prices every group at this host's "
             "lines; calibrate over the hosts (meshtrain launch --hostfile " + o.hostfile + " -- calibrate -o FILE)");
    for (const HostSlots& h : hosts)
      MT_CHECK(h.slots == cal.ranks_per_host, ErrorKind::kInvalidArgument,
               "plan --hostfile: " + o.hostfile + " gives " + h.host + " " + std::to_string(h.slots) + " slot(s), where " +
                   cal_path + " was calibrated with " + std::to_string(cal.ranks_per_host) +
                   " rank(s) a host (the plan puts that many consecutive ranks on each host; calibrate over these hosts: "
                   "meshtrain launch --hostfile " + o.hostfile + " -- calibrate -o FILE)");
  }
  if (o.cluster.empty() && cal.ranks_per_host == 1 && o.procs > 1 && hosts.size() <= 1)
    std::fprintf(stderr,
                 "warning: %s was calibrated with one rank a host, so its collectives are the ones across hosts; these "
                 "%d ranks are priced at them (give --hostfile for runs over those hosts)\n",
                 cal_path.c_str(), o.procs);
  if (o.cluster.empty() && share_cores(job, cal))
    std::fprintf(stderr,
                 "note: %d process(es) x %d thread(s) on %.0f core(s): the simulator shares the cores among the ranks "
                 "computing at once\n",
                 job.ranks_per_host, cal.threads, job.host_cores);
  if (o.search || o.search_batch) {
    planner::SearchSpace all;
    all.batch = true;
    all.parallel = all.stage = all.recompute = all.schedule = o.search;
    const planner::SearchResult r = planner::search_layouts(job, all, budget, cal);
    if (const std::string note = attention_note(job, cal, cal_path); !note.empty() && !o.json)
      std::printf("attention: %s\n", note.c_str());
    if (const std::string note = optimizer_note(job, cal); !note.empty() && !o.json) std::printf("optimizer: %s\n", note.c_str());
    print_search(r, o.top, budget, o.json);
    // (It exited 0 with "0 within ..."; the "auto" path refuses the same.)
    MT_CHECK(!r.ranked.empty(), ErrorKind::kInvalidArgument,
             "plan: no layout of " + std::to_string(o.procs) + " process(es) fits within " + gib(budget) + " a rank (the reasons above)");
    if (o.validate > 0) {
      MT_CHECK(o.steps >= 3, ErrorKind::kInvalidArgument,
               "plan --validate: --steps " + std::to_string(o.steps) + " (each run's steps from the third are measured: at least 3)");
      std::function<StepMix(int64_t, int64_t)> mix_of;
      // (A 1-bit optimizer's runs set freeze_step 1, validate's runs: their measured steps are in
      // the compressed phase.)
      // Whatever the plan's train_iters (0: no mix priced), runs of an optimizer whose steps
      // differ are priced by the kinds they made.
      optim::OptimizerSpec runs = c.optimizer;
      if (has_onebit_compressed(job.update_mix)) runs.freeze_step = 1;
      if (!planner::update_mix(runs, 1, 1).empty())
        mix_of = [runs](int64_t first, int64_t last) { return planner::update_mix(runs, first, last); };
      validate(o, job, r, cal, mix_of);
    }
    return;
  }
  planner::check_layout(job, job.base);
  // (A described cluster of one device a host has its links, not measured collectives.)
  MT_CHECK(o.procs == 1 || cal.world >= 2 || cal.has_network, ErrorKind::kInvalidArgument,
           cal_path + ": its collectives were not measured (calibrate under meshtrain launch -n 2 or more)");
  const planner::Prediction p = planner::predict_layout(job, job.base, cal);
  // Steps that differ by kind: each kind's own step (the prediction is their shares' mean).
  nlohmann::json kinds = nlohmann::json::array();
  std::string by_kind;
  for (const auto& [kind, share] : job.update_mix) {
    planner::PlanJob one = job;
    one.update = kind;
    one.update_mix.clear();
    const double t = planner::predict_layout(one, job.base, cal).step;
    const char* name = step_kind_name(kind, job.mix_of == "0/1 Adam");
    kinds.push_back({{"kind", name}, {"share", share}, {"step_s", t}});
    by_kind += std::string(by_kind.empty() ? "" : ", ") + name + fmt(" %.6f s", t);
  }
  if (o.json) {
    nlohmann::json j{{"step_s", p.step},           {"step_progress_s", p.step_progress}, {"forward_s", p.forward},
                     {"backward_s", p.backward},   {"tokens_per_s", p.tokens_per_s},     {"memory_bytes", p.memory}};
    if (!kinds.empty()) j["steps_by_kind"] = kinds;
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("layout       %s (train_batch_size %lld, T=%d, %s)\n", job.base.describe().c_str(),
              static_cast<long long>(job.global_batch), job.memory.seq_length, dtype_name(c.compute_dtype));
  if (!o.cluster.empty())
    std::printf("cluster      %s: %s (%d devices a host, %.0f GiB each)\n", cal_path.c_str(), spec.name.c_str(),
                spec.devices_per_host, spec.memory_gib);
  else
    std::printf("calibration  %s (%d rank(s) x %d thread(s))\n", cal_path.c_str(), cal.world, cal.threads);
  std::printf("passes       forward %.4f s, backward %.4f s per micro-batch (GEMMs, attention, elementwise)\n", p.forward,
              p.backward);
  if (const std::string note = attention_note(job, cal, cal_path); !note.empty()) std::printf("attention    %s\n", note.c_str());
  if (const std::string note = optimizer_note(job, cal); !note.empty()) std::printf("optimizer    %s\n", note.c_str());
  std::printf("step         %.6f s predicted (%.6f s if MPI moved a nonblocking collective beside compute); "
              "rank 0 computes %.4f s, its communication stream is busy %.4f s\n",
              p.step, p.step_progress, p.compute, p.comm);
  if (!by_kind.empty()) std::printf("by kind      %s (their mean the step above)\n", by_kind.c_str());
  if (p.streams > 0)
    std::printf("offload      rank 0's disk and optimizer thread are busy %.4f s; its compute waits %.4f s in all\n", p.streams,
                p.blocked);
  if (!p.bounds.empty()) {
    std::string cuts;
    for (size_t i = 0; i + 1 < p.bounds.size(); ++i)
      cuts += (i ? ", " : "") + std::to_string(p.bounds[i]) + "-" + std::to_string(p.bounds[i + 1] - 1);
    std::printf("stages       layers %s (parallel.partition \"%s\"%s)\n", cuts.c_str(), job.partition.c_str(),
                job.partition == "time" ? ", by the cost model's times" : "");
  }
  std::printf("memory       %s a rank at its peak (the estimate's replay)%s\n", gib(p.memory).c_str(),
              p.memory > budget ? (", over the budget of " + gib(budget)).c_str() : "");
}

bool is_auto(const nlohmann::json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string() && j[key] == "auto";
}
bool is_number(const nlohmann::json& j, const char* key) { return j.contains(key) && j[key].is_number(); }

}  // namespace

engine::RunConfig load_planned_config(const engine::ConfigSources& src, int procs, const PlannerInputs& inputs) {
  const nlohmann::json j = engine::ds_config_compose(src);
  planner::SearchSpace space;
  engine::ConfigSources base = src;  // the configuration with placeholders for what is searched
  std::vector<std::string> keys;     // what the configuration left to the planner
  // With the layout searched, the global batch stays what the configuration gives (its
  // train_batch_size, else its micro-batch x accumulation x every process, DeepSpeed's product at
  // dp = the world), whatever dp the layout has: what is trained does not change with the layout.
  // Of micro-batch and accumulation, the one the configuration gives stays and the other is the
  // rank's share over it (the micro-batch where it gives both, as Megatron derives accumulation
  // from its global and micro batch); neither given, the search picks the split. The chosen
  // layout's three are written back: a run kept the configuration's accumulation at another dp,
  // and trained a quarter of the batch the plan had priced.
  int64_t global_batch = 0;
  int64_t fixed_micro = 0;
  if (is_auto(j, "parallel")) {
    MT_CHECK(!j.contains("sequence_parallel_size") || j["sequence_parallel_size"] == 1, ErrorKind::kNotSupported,
             "parallel: \"auto\" with sequence_parallel_size " + j["sequence_parallel_size"].dump() +
                 " (Ulysses): \"auto\" searches Ulysses' sp itself; drop the key, or give the parallel block");
    space.parallel = space.schedule = true;
    keys.push_back("parallel");
    base.sets.push_back("parallel={}");
    const bool tbs = is_number(j, "train_batch_size"), mb = is_number(j, "train_micro_batch_size_per_gpu"),
               ga = is_number(j, "gradient_accumulation_steps");
    auto positive = [&](const char* key) {
      const int64_t v = j[key].get<int64_t>();
      MT_CHECK(v >= 1, ErrorKind::kInvalidArgument, std::string(key) + " must be at least 1 (got " + std::to_string(v) + ")");
      return v;
    };
    const int64_t micro = mb ? positive("train_micro_batch_size_per_gpu") : 0, accumulation = ga ? positive("gradient_accumulation_steps") : 0;
    int64_t per_process = 0;  // micro-batch x accumulation
    if (mb)
      MT_CHECK(!__builtin_mul_overflow(micro, std::max<int64_t>(accumulation, 1), &per_process) &&
                   (tbs || !__builtin_mul_overflow(per_process, int64_t{procs}, &global_batch)),
               ErrorKind::kInvalidArgument, "train_micro_batch_size_per_gpu x gradient_accumulation_steps x processes overflows");
    if (tbs) {
      global_batch = positive("train_batch_size");
      // All three given: DeepSpeed's rule at dp = every process, as the configuration reads without
      // "auto" (the placeholders below would drop the accumulation without a word).
      int64_t product = 0;
      MT_CHECK(!(mb && ga) || (!__builtin_mul_overflow(per_process, int64_t{procs}, &product) && product == global_batch),
               ErrorKind::kInvalidArgument,
               "train_batch_size (" + std::to_string(global_batch) + ") must equal train_micro_batch_size_per_gpu (" +
                   std::to_string(micro) + ") * gradient_accumulation_steps (" + std::to_string(accumulation) +
                   ") * every process (" + std::to_string(procs) + "), the data-parallel size of a layout without tp or pp");
    }
    if (global_batch > 0) {
      space.batch = !mb && !ga;
      if (mb) fixed_micro = micro;
      else if (ga) space.fixed_accumulation = static_cast<int>(std::min<int64_t>(accumulation, planner::kMaxAccumulation + 1));
      // Placeholders the configuration loads with at dp = every process: the global batch where the
      // processes divide it (what reads the run's samples, the documents' attention, reads as many),
      // else one sample a process (a train_batch_size they do not divide failed here before any
      // layout was tried, though a smaller dp takes it).
      const bool even = global_batch % procs == 0;
      for (const std::string& k : {"train_batch_size=" + std::to_string(even ? global_batch : procs),
                                   "train_micro_batch_size_per_gpu=" + std::to_string(even ? global_batch / procs : 1),
                                   std::string("gradient_accumulation_steps=1")})
        base.sets.push_back(k);
    }
    if (!j.contains("activation_checkpointing")) space.recompute = true;
  }
  if (j.contains("zero_optimization") && is_auto(j["zero_optimization"], "stage")) {
    space.stage = true;
    keys.push_back("zero_optimization.stage");
    // A placeholder the rest of the configuration takes: offload and 16-bit master weights need a
    // stage of 1 or more (DeepSpeed's rule), offload_param stage 3 (read there only). Stage 0 refused
    // them as if the user had asked for it (stop 73); the search keeps to the stages they take.
    const nlohmann::json& z = j["zero_optimization"];
    auto device = [&z](const char* k) {
      return z.contains(k) && z[k].is_object() && z[k].contains("device") && z[k]["device"].is_string() &&
             z[k]["device"] != "none";
    };
    auto set = [](const nlohmann::json& o, const char* k) { return o.is_object() && o.contains(k) && o[k] == true; };
    const bool param = device("offload_param") || set(z, "cpu_offload_param");
    const bool needs_zero = param || device("offload_optimizer") || set(z, "cpu_offload") ||
                            (j.contains("bf16") && set(j["bf16"], "bf16_master_weights_and_grads")) ||
                            (j.contains("fp16") && set(j["fp16"], "fp16_master_weights_and_grads"));
    base.sets.push_back(std::string("zero_optimization.stage=") + (param ? "3" : needs_zero ? "1" : "0"));
  }
  if (j.contains("activation_checkpointing") && is_auto(j["activation_checkpointing"], "enabled")) {
    space.recompute = true;
    keys.push_back("activation_checkpointing.enabled");
    base.sets.push_back("activation_checkpointing.enabled=false");
  }
  if (keys.empty()) return engine::ds_config_load(src, procs);

  const engine::RunConfig c = engine::ds_config_load(base, procs);
  // No number for the batch (its keys "auto", Hugging Face's, or absent): the global batch and the
  // micro-batch are what the configuration resolves to at dp = every process, and stay so.
  if (space.parallel && global_batch == 0) {
    global_batch = c.batch.train_batch_size;
    fixed_micro = c.batch.micro_batch_per_gpu;
  }
  planner::ClusterSpec spec;
  if (!inputs.cluster.empty()) spec = planner::parse_cluster(engine::json_load_file(inputs.cluster), inputs.cluster);
  const std::string source = !inputs.cluster.empty() ? inputs.cluster : !inputs.calibration.empty() ? inputs.calibration : c.planner.calibration;
  const planner::Calibration cal = !inputs.cluster.empty() ? planner::cluster_calibration(spec)
                                                           : load_calibration(source, inputs.calibration.empty() ? "planner.calibration" : "--calibration");
  // A rank's share of its host: over several hosts, the ranks mpirun puts on rank 0's (the first,
  // which it fills first), the same count on every rank so that every rank plans alike.
  int here = inputs.ranks_a_host > 0 ? inputs.ranks_a_host : procs;
  const bool mpi = inputs.world != nullptr && inputs.world->size() > 1;
  if (inputs.ranks_a_host <= 0 && mpi)
    if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE"); local != nullptr && std::atoi(local) > 0) here = std::atoi(local);
  here = std::clamp(here, 1, procs);
  size_t budget = budget_bytes(inputs.memory_gib > 0 ? inputs.memory_gib : !inputs.cluster.empty() ? spec.memory_gib : c.planner.memory_gib, here);
  if (mpi) {  // rank 0's, exactly (two floats of 24 bits: hosts may differ in memory and ranks)
    float parts[2] = {static_cast<float>(budget >> 24), static_cast<float>(budget & ((size_t{1} << 24) - 1))};
    comm::BroadcastOptions o;
    o.tag = "the plan's memory budget";
    inputs.world->broadcast(parts, 2, DType::kF32, o)->wait();
    budget = (static_cast<size_t>(parts[0]) << 24) + static_cast<size_t>(parts[1]);
  }
  planner::PlanJob job = plan_job(c, procs, inputs.world);
  if (global_batch > 0) {
    job.global_batch = global_batch;
    if (fixed_micro > 0) job.base.micro_batch = static_cast<int>(std::min<int64_t>(fixed_micro, std::numeric_limits<int>::max()));
  }
  if (inputs.cluster.empty()) share_cores(job, cal);
  const planner::SearchResult r = planner::search_layouts(job, space, budget, cal);
  if (r.ranked.empty()) {
    std::string why;
    for (size_t i = 0; i < r.rejected.size() && i < kShownRejections; ++i) why += "; " + r.rejected[i];
    if (r.rejected.size() > kShownRejections) why += "; and " + std::to_string(r.rejected.size() - kShownRejections) + " more";
    throw Error(ErrorKind::kInvalidArgument, "the planner found no layout of " + std::to_string(procs) +
                                                 " process(es) within " + gib(budget) + " a rank" + why);
  }
  // The fastest layout the runtime accepts: a key the search does not vary may refuse one (a
  // pipeline with an optimizer or feature it does not take), and the next is tried.
  engine::RunConfig out;
  const planner::RankedLayout* pick = nullptr;
  std::string refused;
  for (const planner::RankedLayout& x : r.ranked) {
    engine::ConfigSources chosen = base;
    if (space.parallel) {
      for (const std::string& k : {"parallel.tp=" + std::to_string(x.layout.tp), "parallel.pp=" + std::to_string(x.layout.pp)})
        chosen.sets.push_back(k);
      for (const std::string& k : schedule_sets(x.layout)) chosen.sets.push_back(k);
    }
    if (space.stage) chosen.sets.push_back("zero_optimization.stage=" + std::to_string(x.layout.stage));
    if (global_batch > 0) {
      chosen.sets.push_back("train_micro_batch_size_per_gpu=" + std::to_string(x.layout.micro_batch));
      chosen.sets.push_back("gradient_accumulation_steps=" + std::to_string(x.layout.accumulation));
      chosen.sets.push_back("train_batch_size=" + std::to_string(global_batch));
    }
    if (space.recompute)
      chosen.sets.push_back(std::string("activation_checkpointing.enabled=") + (x.layout.recompute ? "true" : "false"));
    try {
      out = engine::ds_config_load(chosen, procs);
    } catch (const Error& e) {
      // A rule of the runtime's the search does not model (curriculum lengths over tp's sequence
      // shards, a pipeline with a feature it lacks): the next layout; all refused, the first reason.
      if (e.kind() != ErrorKind::kNotSupported && e.kind() != ErrorKind::kInvalidArgument) throw;
      if (refused.empty()) refused = std::string("; faster layouts refused: ") + e.what();
      continue;
    }
    pick = &x;
    break;
  }
  MT_CHECK(pick != nullptr, ErrorKind::kNotSupported, "the planner's layouts were all refused by the configuration" + refused);
  const planner::Layout& l = pick->layout;
  const planner::Prediction& p = pick->prediction;
  std::string left;
  for (const std::string& k : keys) left += (left.empty() ? "" : ", ") + k;
  out.notes.push_back(left + " -> " + prediction_line(l, p) + " predicted (the fastest of " + std::to_string(r.ranked.size()) +
                      " layouts within " + gib(budget) + " a rank; " + source + ")" +
                      (refused.empty() ? "" : refused));
  if (const std::string note = attention_note(job, cal, source, inputs.world); !note.empty())
    out.notes.push_back("the plan's attention: " + note);
  if (const std::string note = optimizer_note(job, cal); !note.empty()) out.notes.push_back("the plan's optimizer: " + note);
  return out;
}

void register_plan(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "Predict a layout's step from the calibration, or search the layouts (--search)");
  auto o = std::make_shared<PlanOptions>();
  add_layout_options(cmd, o->path, o->procs, o->sets);
  cmd->add_option("--calibration", o->calibration, "meshtrain calibrate's JSON (default: planner.calibration, calibration.json)");
  cmd->add_flag("--search", o->search, "rank every layout of --procs processes that fits (dp x tp x pp, and those x Ulysses sp, a pipeline's schedule, ZeRO stage, micro-batch, recompute)");
  cmd->add_flag("--search-batch", o->search_batch,
                "rank the micro-batch / accumulation splits only (the configuration's dp x tp x pp, ZeRO stage and recompute)");
  cmd->add_option("--cluster", o->cluster,
                  "plan for a described cluster (configs/clusters/*.json: devices, peaks, links) instead of this "
                  "machine's calibration; its device memory is the budget");
  cmd->add_option("--top", o->top, "layouts to print with --search (default 5)")->check(CLI::Range(1, std::numeric_limits<int>::max()));
  cmd->add_option("--memory", o->memory_gib, "memory per rank in GiB (default: planner.memory_gib, else physical RAM / procs)");
  cmd->add_option("--validate", o->validate,
                  "search (as --search does, or --search-batch where given), train the first K layouts, K others "
                  "that fit and the configured one here, and print predicted against measured")->check(CLI::Range(0, std::numeric_limits<int>::max()));
  cmd->add_option("--steps", o->steps, "steps each --validate run trains (default 6; steps 3.. are measured)")
      ->check(CLI::Range(3, 1000));
  cmd->add_option("--rounds", o->rounds,
                  "--validate: train every layout this many times, one after another in turn, and take each one's median "
                  "(a machine whose speed drifts between runs; default 1)")
      ->check(CLI::Range(1, 20));
  cmd->add_option("--hostfile", o->hostfile,
                  "plan for these hosts and train --validate's runs over them (DeepSpeed's hostfile, as launch takes it): "
                  "--procs defaults to their slots, a rank's memory is this machine's over the ranks on the first host, and "
                  "runs that span hosts need a calibration over them (launch --hostfile F -- calibrate)");
  cmd->add_flag("--json", o->json, "print JSON");
  cmd->callback([o, cmd] {
    o->procs_given = cmd->count("--procs") > 0;
    // Options that did nothing, or another thing, were taken without a word: --search beside
    // --search-batch ran the full search, --validate beside --search-batch dropped the batch-only
    // search for the full one, --top, --steps and --rounds without their mode were ignored.
    MT_CHECK(!(o->search && o->search_batch), ErrorKind::kInvalidArgument,
             "plan: --search and --search-batch are two searches (every layout, or the configuration's with its batch "
             "splits); give one");
    for (const auto& [flag, value] : {std::pair<const char*, const std::string*>{"--cluster", &o->cluster},
                                      {"--calibration", &o->calibration},
                                      {"--hostfile", &o->hostfile}})  // ('' was taken for "not given")
      MT_CHECK(cmd->count(flag) == 0 || !value->empty(), ErrorKind::kInvalidArgument,
               std::string("plan: ") + flag + " '' names no file");
    if (o->validate > 0 && !o->search_batch) o->search = true;
    MT_CHECK(cmd->count("--top") == 0 || o->search || o->search_batch, ErrorKind::kInvalidArgument,
             "plan: --top ranks a search's layouts; give --search or --search-batch");
    for (const char* flag : {"--steps", "--rounds"})
      MT_CHECK(cmd->count(flag) == 0 || o->validate > 0, ErrorKind::kInvalidArgument,
               std::string("plan: ") + flag + " sets --validate's runs; give --validate K");
    run_plan(*o);
  });
}

}  // namespace mt::cli
