// meshtrain plan CONFIG [--procs N] [--calibration cal.json] [--set k=v]: the predicted step of
// the configuration's layout (issue 14). The step program comes from the runtime's own ZeRO
// schedule (planner/program.h), its times from the machine's calibration (`meshtrain calibrate`)
// and the model's shapes (planner/cost.h); the simulator gives the step. So far: data parallelism
// with ZeRO stages 0-3 in memory; other layouts are refused by name.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/commands.h"
#include "engine/ds_config.h"
#include "engine/json_file.h"
#include "planner/cost.h"
#include "planner/memory.h"
#include "planner/program.h"
#include "planner/sim.h"

namespace mt::cli {
namespace {

struct PlanOptions {
  std::string path, calibration = "calibration.json";
  int procs = 1;
  std::vector<std::string> sets;
};

planner::Calibration load_calibration(const std::string& path) {
  const nlohmann::json j = engine::json_load_file(path);
  MT_CHECK(j.contains("fits") && j["fits"].is_object(), ErrorKind::kInvalidArgument,
           path + ": no 'fits' (write it with meshtrain calibrate)");
  planner::Calibration cal;
  cal.world = j.value("world", 1);
  cal.threads = j.value("threads", 1);
  for (const auto& [family, f] : j["fits"].items()) {
    cal.fits[family] = planner::LinearFit{f.at("latency_s").get<double>(), f.at("per_unit_s").get<double>()};
    if (f.contains("curve")) cal.curves[family] = f["curve"].get<std::vector<std::pair<double, double>>>();
  }
  return cal;
}

void run_plan(const PlanOptions& o) {
  const engine::RunConfig c = load_layout_config(o.path, o.sets, o.procs);
  MT_CHECK(c.tp == 1 && c.pp == 1, ErrorKind::kNotSupported,
           "plan: tensor and pipeline parallelism are not in the cost model yet (data parallelism with ZeRO 0-3 is)");
  MT_CHECK(c.zero.offload_optimizer == "none" && c.zero.offload_param == "none", ErrorKind::kNotSupported,
           "plan: offload's disk traffic is not in the cost model yet");
  const planner::Calibration cal = load_calibration(o.calibration);
  MT_CHECK(c.world_size == 1 || cal.world >= 2, ErrorKind::kInvalidArgument,
           o.calibration + ": its collectives were not measured (calibrate under meshtrain launch -n 2 or more)");

  // The step's shape as the estimator reads the configuration.
  const planner::MemoryInput in = estimate_input(c, o.procs);
  const planner::StepShape shape{.model = in.model, .micro_batch = in.micro_batch, .seq_length = in.seq_length,
                                 .compute = in.compute_dtype, .world = in.world, .vocab_divisible = in.vocab_divisible};
  const planner::ZeroStepCosts costs = planner::zero_step_costs(shape, cal);

  planner::ZeroStepSpec spec;
  spec.units = planner::model_units(c.model, 1, c.vocab_divisible);
  spec.world = c.world_size;
  spec.schedule.stage = c.zero.stage;
  spec.schedule.overlap_comm = c.zero.overlap_comm;
  spec.schedule.prefetch_elems = static_cast<size_t>(c.zero.stage3_prefetch_bucket_size);
  spec.schedule.persistence_threshold = static_cast<size_t>(c.zero.stage3_param_persistence_threshold);
  spec.schedule.max_live_elems = static_cast<size_t>(c.zero.stage3_max_live_parameters);
  spec.schedule.comm_dtype = c.comm_dtype;
  spec.bucket_elems = static_cast<size_t>(c.zero.reduce_bucket_size);
  spec.micro_batches = static_cast<int>(c.batch.gradient_accumulation_steps);
  spec.tied_head = c.model.tie_embeddings;
  spec.low_precision = c.compute_dtype != DType::kF32;
  const planner::SimProgram program = planner::zero_step_program(spec, costs);
  const planner::SimReport fast = planner::simulate(program);
  planner::SimOptions no_progress;
  no_progress.progress = false;
  const planner::SimReport slow = planner::simulate(program, no_progress);

  double fwd = 0, bwd = costs.head_backward;
  for (size_t u = 0; u < costs.forward.size(); ++u) fwd += costs.forward[u], bwd += costs.backward[u];
  std::printf("layout       dp %d, ZeRO stage %d, %d micro-batch(es) of B=%d T=%d, %s\n", c.world_size, c.zero.stage,
              spec.micro_batches, shape.micro_batch, shape.seq_length, dtype_name(c.compute_dtype));
  std::printf("calibration  %s (%d rank(s) x %d thread(s))\n", o.calibration.c_str(), cal.world, cal.threads);
  std::printf("passes       forward %.4f s, backward %.4f s per micro-batch (GEMMs, attention, elementwise)\n", fwd, bwd);
  std::printf("step         %.6f s predicted (%.6f s if MPI moves a nonblocking collective only inside its wait); "
              "rank 0 computes %.4f s, its communication stream is busy %.4f s\n",
              fast.makespan, slow.makespan, fast.compute[0], fast.comm[0]);
}

}  // namespace

void register_plan(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "Predict the step time of a configuration's layout from the calibration");
  auto o = std::make_shared<PlanOptions>();
  add_layout_options(cmd, o->path, o->procs, o->sets);
  cmd->add_option("--calibration", o->calibration, "meshtrain calibrate's JSON (default calibration.json)");
  cmd->callback([o] { run_plan(*o); });
}

}  // namespace mt::cli
