// One subcommand per file; each registers its flags on the app and runs when chosen.
#pragma once

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "comm/backend.h"
#include "engine/ds_config.h"
#include "engine/engine.h"
#include "planner/calibrate.h"
#include "planner/memory.h"

namespace mt::cli {

void register_bench(CLI::App& app);
void register_inspect(CLI::App& app);
void register_config(CLI::App& app);
void register_train(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_export(CLI::App& app);
void register_generate(CLI::App& app);
void register_serve(CLI::App& app);
void register_loadtest(CLI::App& app);
void register_predict(CLI::App& app);
void register_plot(CLI::App& app);
void register_launch(CLI::App& app);
// The command line with "--" put before launch's subcommand when it has none, so that options
// after the subcommand are the subcommand's (DeepSpeed's launcher gives the script everything after
// it; CLI11 took `launch train x --num_gpus 2`'s --num_gpus as launch's). Other commands: as given.
std::vector<std::string> launch_separate_args(const std::vector<std::string>& args);
void register_estimate(CLI::App& app);
void register_calibrate(CLI::App& app);
void register_plan(CLI::App& app);

// Thrown when a stop signal ended a training loop after a save: the process exits 128 + signal.
struct StopRequested {
  int signal;
};
// The first SIGTERM/SIGINT `train` received (0: none); the loop stops after the current step.
int train_stop_signal();
// The test seam MT_FAULT=train.sigterm_in_setup: SIGTERM sent to this process, as a scheduler sends
// it, and taken (the signal thread takes it: std::raise's, to the calling thread, which holds it,
// would wait there for ever).
void sigterm_self_for_test();
// --metrics FILE: one JSON object a step, appended by rank 0. A write that fails (a full disk) is
// said once, naming the file, the step and the reason; the run goes on without metrics, and
// without the plot (it ended with "no steps to plot", exit 2, having said nothing).
class MetricsFile {
 public:
  void open(const std::string& path);  // kIOError when it cannot be opened for appending
  bool is_open() const { return out_.is_open(); }
  void write(const nlohmann::json& line, int64_t step);
  // Closes it; true when every line was written (then it can be plotted).
  bool close();

 private:
  std::string path_;
  std::ofstream out_;
  bool failed_ = false;
};
// "SIGTERM", "SIGINT" or "SIGHUP", for the stop's line.
const char* stop_signal_name(int sig);
// --metrics FILE checked before any work (its directory is there, it is not one); throws kInvalidArgument.
void check_metrics_path(const std::string& path);
// That signal agreed over the ranks (one tiny all-reduce of the largest; world may be null): a
// signal on any rank stops every rank after the same step.
int agreed_stop_signal(comm::Backend* world, double timeout_s);
// Before a loop's first step: a signal during the setup (model, checkpoint, corpus) stops the run
// there with its line on rank 0, "stopped before the first step; nothing saved" (StopRequested).
void stop_before_first_step(comm::Backend* world, double timeout_s, bool lead);
// --resume: restores eng from a checkpoint (nothing when path is empty) and says so on rank 0. True
// when the checkpoint is at train_iters (the run is complete: nothing to train); past it, an error.
bool train_resume(engine::Engine& eng, const std::string& path, bool lead);

// `train` with task "classification" (cli/classify.cpp): sequence classification over .jsonl
// records, validation accuracy, the top-k checkpoints by a metric, an epoch progress bar.
struct ClassifyArgs {
  std::string resume, metrics;
  bool overwrite = false;
  std::string source;  // how messages name the configuration
};
void classify_loop(const ClassifyArgs& args, engine::RunConfig& cfg, const std::shared_ptr<comm::Backend>& world,
                   bool& started);

// Under mpirun (ours or the user's): the MPI world; else null.
std::shared_ptr<comm::Backend> mpi_world();

// --deepspeed, --model, --data, --tokenizer and --set: where a run's configuration comes from.
void add_config_source_options(CLI::App* cmd, engine::ConfigSources& src);

// CONFIG, --procs and --set: a run configuration as a layout on a process count (estimate, plan).
void add_layout_options(CLI::App* cmd, std::string& path, int& procs, std::vector<std::string>& sets);
// That configuration resolved for procs processes, its warnings printed to stderr. `command`
// (estimate, plan) runs in one process and takes the count from --procs: it is refused under an MPI
// launcher of several processes, and a layout that does not divide the count names --procs.
// A calibration file (meshtrain calibrate's), every field checked for a value it can have (a
// negative rate, a curve point at 0 bytes, a field of another type: kInvalidArgument naming the
// file); `key` names where the path came from when the file does not exist.
planner::Calibration load_calibration(const std::string& path, const std::string& key);
// What `plan`'s own options give the search of an "auto" configuration in place of its planner
// block: another calibration, a described cluster (its rates and its devices' memory), a budget.
struct PlannerInputs {
  std::string calibration, cluster;
  double memory_gib = 0.0;
  // train's MPI world (null: one process, or a command that plans in one): what the plan reads from
  // the data (data.reset_attention_mask's documents) is read by rank 0 and sent to the others, so
  // every rank plans alike.
  comm::Backend* world = nullptr;
  // The ranks that share a host's memory, which the budget divides (0: with `world`, rank 0's
  // host's count under mpirun, OMPI_COMM_WORLD_LOCAL_SIZE; else, or without it, every process).
  // With `world`, rank 0's budget is sent to every rank, so that every rank plans alike.
  int ranks_a_host = 0;
};
engine::RunConfig load_layout_config(const std::string& command, const std::string& path,
                                     const std::vector<std::string>& sets, int procs, const PlannerInputs& inputs = {});

// A run configuration loaded as train loads it, with what it leaves to the planner chosen by the
// search (cli/plan.cpp, planner/search.h): `"parallel": "auto"` (the layout of the processes, and
// with train_batch_size given and neither train_micro_batch_size_per_gpu nor
// gradient_accumulation_steps a number, their split; with no activation_checkpointing block,
// recompute), `zero_optimization.stage: "auto"` and `activation_checkpointing.enabled: "auto"`.
// The choice is one line in the result's notes. Every rank computes the same choice from the same
// files.
engine::RunConfig load_planned_config(const engine::ConfigSources& src, int procs, const PlannerInputs& inputs = {});
// This binary's path (/proc/self/exe), for re-executing it (launch, plan --validate).
std::string self_exe();
// Physical memory of this host in bytes (0: unknown).
size_t physical_memory_bytes();
// A size in GiB from an option or a key (`what` names it) in bytes: finite, >= 0 and at most
// 2^33 GiB (8 EiB, what a size_t holds); refused by name otherwise.
size_t gib_bytes(double gib, const std::string& what);

// data.reset_attention_mask: the mean share of the causal attention kernel's tile pairs that the
// documents of the run's first training samples (at most kMaxSamples, in its order) leave
// (planner::StepShape::attention_share).
struct DocumentAttention {
  static constexpr uint64_t kMaxSamples = 256;
  double share = 1.0;
  int samples = 0;  // how many were read
};
DocumentAttention document_attention_share(const engine::RunConfig& cfg);

// The estimator's input for a run configuration on `procs` data-parallel ranks.
planner::MemoryInput estimate_input(const engine::RunConfig& config, int procs, int pp_rank = 0);

// The disk ceiling `meshtrain bench --io DIR` measured, kept in DIR/.meshtrain-io-ceiling.json so
// a run that swaps under DIR reports its share of it.
struct DiskCeiling {
  double write_gbs = 0, read_gbs = 0, mixed_gbs = 0;
  unsigned long long bytes = 0;  // the probe's size each way
  // Seconds the disk needs for these bytes one after the other at the probe's rates.
  double serial_seconds(double read_bytes, double written_bytes) const {
    return read_bytes / (read_gbs * 1e9) + written_bytes / (write_gbs * 1e9);
  }
};
void write_disk_ceiling(const std::string& dir, const DiskCeiling& c);
bool read_disk_ceiling(const std::string& dir, DiskCeiling* c);  // false: none recorded (or unreadable)

// Draws the loss curve of a --metrics file into out (.png/.svg) with gnuplot. Without gnuplot:
// throws kNotFound when required, else prints a note and returns false.
bool plot_metrics(const std::string& metrics, const std::string& out, bool required);

}  // namespace mt::cli
