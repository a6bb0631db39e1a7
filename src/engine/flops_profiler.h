// The flops profiler's report: DeepSpeed's print_model_profile in meshtrain's words. For one
// profiled training step on this rank ("per GPU" in DeepSpeed is per rank here):
//   - a summary: the layout, batch, parameters, forward MACs/FLOPs, forward, backward, optimizer
//     step and iteration latency, the achieved FLOPS of each and samples per second;
//   - the aggregated profile: at each depth of the module tree (0 .. module_depth, every depth for
//     -1), the top_modules module kinds by parameters, MACs, forward and backward latency;
//   - the detailed profile (detailed): every module with its parameters, MACs, latencies, FLOPS
//     and their shares of the whole model.
// FLOPs of a step = the forward's x (1 + 2 + recompute_fwd_factor) over its micro-batches.
#pragma once

#include <cstdint>
#include <string>

#include "engine/ds_config.h"
#include "models/module_profile.h"

namespace mt::engine {

class Engine;
struct StepResult;

// What the report says about the step besides the module tree.
struct FlopsProfileStep {
  int64_t step = 0;             // 1-based
  int world_size = 1, dp = 1, tp = 1, pp = 1;
  int64_t micro_batch = 1;      // samples per micro-batch on one rank
  int64_t micro_batches = 1;    // per step (gradient accumulation)
  int64_t model_params = 0;     // the whole model's
  double fwd_seconds = 0.0, bwd_seconds = 0.0, step_seconds = 0.0;  // the engine's, for the step
  // The peak MFU is taken against: a GEMM ceiling this rank measured (kernels::gemm_ceiling_tflops)
  // and what it was (shape, dtype). peak_tflops <= 0: none measured, MFU not reported.
  double peak_tflops = 0.0;
  std::string peak_what;
};

// The facts of the step `r` that eng has just run.
FlopsProfileStep flops_profile_step(const Engine& eng, const StepResult& r);

// The report (lines ending in '\n'). profile: the step's, filled by the model.
std::string flops_profiler_report(const models::ModuleProfile& profile, const FlopsProfileStep& step,
                                  const FlopsProfilerConfig& config);

// Writes the report to config.output_file (its directory created; replaced) or to stdout.
// Returns where it went ("stdout" or the path). Throws kIOError naming the file.
std::string flops_profiler_write(const std::string& report, const FlopsProfilerConfig& config);

}  // namespace mt::engine
