#include "planner/search.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <tuple>
#include <utility>

#include "base/error.h"
#include "base/once_cache.h"
#include "parallel/pp/partition.h"
#include "planner/sim.h"

namespace mt::planner {
namespace {

std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

// In increasing order, in O(sqrt n) (counting to n ran for hours at a train_batch_size of 1e12).
std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> low, high;
  for (int64_t i = 1; i <= n / i; ++i)
    if (n % i == 0) {
      low.push_back(i);
      if (i != n / i) high.push_back(n / i);
    }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

}  // namespace

void check_layout(const PlanJob& job, const Layout& l) {
  const models::ModelConfig& m = job.memory.model;
  MT_CHECK(m.n_head % l.tp == 0 && m.n_kv_head % l.tp == 0 && m.intermediate % l.tp == 0, ErrorKind::kInvalidArgument,
           "plan: tp " + std::to_string(l.tp) + " does not divide the model's heads (" + std::to_string(m.n_head) +
               "), kv heads (" + std::to_string(m.n_kv_head) + ") and MLP features (" + std::to_string(m.intermediate) + ")");
  MT_CHECK(!l.sequence_parallel || l.tp == 1 ||
               (static_cast<int64_t>(l.micro_batch) * job.memory.seq_length) % l.tp == 0,
           ErrorKind::kInvalidArgument, "plan: sequence parallelism needs B x T divisible by tp");
  MT_CHECK(l.pp == 1 || l.stage <= 1, ErrorKind::kNotSupported,
           "plan: a pipeline takes ZeRO stage 0 or 1 (as DeepSpeed's pipeline engine)");
  MT_CHECK(!job.memory.zero.param_nvme || l.stage < 3 || (l.tp == 1 && l.pp == 1), ErrorKind::kNotSupported,
           "plan: offload_param nvme with tp or pp > 1 (the runtime's limit)");
  MT_CHECK(!job.offload || l.stage >= 1, ErrorKind::kInvalidArgument,
           "plan: offload and 16-bit master weights need ZeRO stage 1, 2 or 3 (DeepSpeed's rule)");
  MT_CHECK(!job.memory.zero.optimizer_nvme || l.pp == 1, ErrorKind::kNotSupported,
           "plan: a pipeline with offload_optimizer nvme is not in the cost model");
  MT_CHECK(l.dp >= 1 && l.usp >= 1 && l.dp * l.tp * l.pp * l.usp == job.procs, ErrorKind::kInvalidArgument,
           "plan: dp " + std::to_string(l.dp) + " x tp " + std::to_string(l.tp) + " x pp " + std::to_string(l.pp) +
               (l.usp > 1 ? " x Ulysses " + std::to_string(l.usp) : std::string()) + " is not the job's " +
               std::to_string(job.procs) + " process(es)");
  if (l.usp > 1) {
    MT_CHECK(job.ulysses_refused.empty(), ErrorKind::kNotSupported, "plan: Ulysses with " + job.ulysses_refused);
    MT_CHECK(job.curriculum_gcd == 0 || job.curriculum_gcd % l.usp == 0, ErrorKind::kInvalidArgument,
             "plan: Ulysses " + std::to_string(l.usp) + " does not divide every length of the curriculum");
    MT_CHECK(job.memory.seq_length % l.usp == 0 && m.n_head % (l.tp * l.usp) == 0 && m.n_kv_head % (l.tp * l.usp) == 0,
             ErrorKind::kInvalidArgument,
             "plan: Ulysses " + std::to_string(l.usp) + " does not divide seq_length (" + std::to_string(job.memory.seq_length) +
                 "), or tp x sp the heads (" + std::to_string(m.n_head) + ") and kv heads (" + std::to_string(m.n_kv_head) + ")");
  }
  MT_CHECK(l.stage >= 0 && l.stage <= 3, ErrorKind::kInvalidArgument, "plan: ZeRO stage must be 0-3");
  // The simulator runs each micro-batch of the step: a million of them took 16 s and 1.6 GB, and a
  // count past int wrapped.
  MT_CHECK(l.accumulation <= kMaxAccumulation, ErrorKind::kInvalidArgument,
           "plan: " + std::to_string(l.accumulation) + " micro-batches a step; the simulator takes at most " +
               std::to_string(kMaxAccumulation));
  MT_CHECK(l.micro_batch >= 1 && l.accumulation >= 1 &&
               static_cast<int64_t>(l.dp) * l.micro_batch * l.accumulation == job.global_batch,
           ErrorKind::kInvalidArgument,
           "plan: dp " + std::to_string(l.dp) + " x B " + std::to_string(l.micro_batch) + " x accumulation " +
               std::to_string(l.accumulation) + " is not train_batch_size " + std::to_string(job.global_batch));
}

namespace {

MemoryInput layout_memory_input(const PlanJob& job, const Layout& l) {
  MemoryInput in = job.memory;
  in.world = l.dp * l.usp;  // the ZeRO group: dp x Ulysses' sp
  in.usp = l.usp;
  in.zero.comm_dtype = l.usp > 1 ? job.usp_comm_dtype : job.schedule.comm_dtype;
  in.tp = l.tp;
  in.sequence_parallel = l.sequence_parallel && l.tp > 1;
  in.pp = 1;
  in.pp_rank = 0;
  in.chunks.clear();
  in.first_stage = in.last_stage = true;
  in.slots = 1;
  in.grads_in_flight = 0;
  in.micro_batch = l.micro_batch;
  in.recompute = l.recompute;
  in.zero.accumulation = l.accumulation > 1;
  if (!job.overlap_comm_given) in.zero.overlap_comm = l.stage == 3;
  return in;
}

parallel::pp::ScheduleSpec pipeline_spec(const PlanJob& job, const Layout& l) {
  parallel::pp::ScheduleSpec spec{l.schedule, l.pp, l.virtual_stages, l.accumulation};
  parallel::pp::check_schedule_spec(spec);
  return spec;
}

StepShape step_shape(const PlanJob& job, const Layout& l) {
  const MemoryInput& m = job.memory;
  return StepShape{.model = m.model, .micro_batch = l.micro_batch, .seq_length = m.seq_length,
                   .compute = m.compute_dtype, .world = l.dp * l.usp, .vocab_divisible = m.vocab_divisible,
                   .recompute = l.recompute, .tp = l.tp, .sequence_parallel = l.sequence_parallel && l.tp > 1, .usp = l.usp,
                   .optimizer_nvme = m.zero.optimizer_nvme, .sub_group_size = m.zero.sub_group_size,
                   .param_nvme = m.zero.param_nvme && l.stage == 3, .zero_stage = l.stage,
                   .attention_share = job.attention_share, .sparse = job.sparse, .update = job.update};
}

// The layer bounds of a layout's pipeline stages. "time" cuts as the engine does at start-up
// (engine_pipeline_bounds: every block at one micro-batch's forward + backward on one process, the
// embedding free, the rest on the last stage) with the cost model's times in place of the measured
// ones (the tp group's collectives left out, as the one-process measurement leaves them).
std::vector<int> pipeline_bounds(const PlanJob& job, const Layout& l, const parallel::pp::ScheduleSpec& spec,
                                 const Calibration& cal) {
  parallel::pp::PartitionInput in = pipeline_partition_input(job.memory.model, spec.stages());
  if (job.partition == "time") {
    // As the engine measures them: its synthetic tokens hold no documents (a sparse layout is its own).
    StepShape shape = step_shape(job, l);
    shape.attention_share = 1.0;
    const ZeroStepCosts c = zero_step_costs(shape, cal);
    const size_t L = c.forward.size() - 2;
    in.layer_cost.assign(L, c.forward[1] + c.backward[1]);
    in.first_cost = 0.0;
    in.last_cost = c.forward[L + 1] + c.backward[L + 1] + c.head_backward;
  }
  // Remembered by their input: the min-max split is L² a stage (Llama 3 405B's 126 layers over
  // 126 stages: 2 M steps), and every layout of a grid and schedule asks it again, several times.
  const parallel::pp::PartitionMethod method = parallel::pp::parse_partition(job.partition, "parallel.partition");
  static OnceCache<std::tuple<int, int, double, double, std::vector<double>>, std::vector<int>> known(4096);
  // A NaN compares equal to every cost in a key: such an input is split without the cache.
  bool nan = std::isnan(in.first_cost) || std::isnan(in.last_cost);
  for (double c : in.layer_cost) nan = nan || std::isnan(c);
  if (nan) return parallel::pp::partition_layers(method, in);
  return known.get({static_cast<int>(method), in.stages, in.first_cost, in.last_cost, in.layer_cost},
                   [&] { return parallel::pp::partition_layers(method, in); });
}

// Every pipeline rank's memory input (one, the whole model, without a pipeline).
std::vector<MemoryInput> rank_inputs(const PlanJob& job, const Layout& l, const Calibration& cal) {
  MemoryInput in = layout_memory_input(job, l);
  in.f16_native = cal.has_network || cal.f16_native ? 1 : 0;  // the cost model's answer (cost.cpp)
  in.bf16_native = cal.has_network || cal.bf16_native ? 1 : 0;
  if (l.pp == 1) return {in};
  const parallel::pp::ScheduleSpec spec = pipeline_spec(job, l);
  const std::vector<int> bounds = pipeline_bounds(job, l, spec, cal);
  std::vector<MemoryInput> out;
  for (int q = 0; q < l.pp; ++q) out.push_back(pipeline_rank_input(in, spec, bounds, q));
  return out;
}

// The accounted peak (the larger of training's and setup's) of the layout's largest rank; *train,
// *by_stage the training peaks; with a process constant in cal, p's process peaks too.
size_t layout_memory(const PlanJob& job, const Layout& l, const Calibration& cal, size_t* train, std::vector<size_t>* by_stage,
                     Prediction* p) {
  size_t peak = 0, steady = 0;
  if (by_stage) by_stage->clear();
  if (p) p->process_by_stage.clear(), p->process = 0;
  for (const MemoryInput& in : rank_inputs(job, l, cal)) {
    const StageEstimate e = estimate_stage(in, l.stage);
    if (by_stage) by_stage->push_back(e.ours.total());
    steady = std::max(steady, e.ours.total());
    peak = std::max(peak, std::max(e.ours.total(), e.setup.total()));
    if (p && cal.process_bytes > 0) {
      p->process_by_stage.push_back(cal.process_bytes + e.mapped + e.outside_allocator());
      p->process = std::max(p->process, p->process_by_stage.back());
    }
  }
  if (train) *train = steady;
  return peak;
}

SimProgram zero_program(const PlanJob& job, const Layout& l, const ZeroStepCosts& costs);

// Whether one rank's timeline (a pipeline: one replica's) is every one's, so the program is that
// rank's alone (DESIGN-NOTES 62, 132): every rank runs one list, and nothing sets them apart where
// no cores are shared, or where all the processes share one host's cores and only compute shares
// them (no disk slowing it: SimProgram::disk_interference). The simulated rank then stands for all
// (share_cores: their demand on the host).
bool ranks_alike(const PlanJob& job, const ZeroStepCosts& costs) {
  if (job.whole_program) return false;
  if (job.host_cores <= 0) return true;
  const int per_host = job.ranks_per_host > 0 ? job.ranks_per_host : job.procs;
  return per_host >= job.procs && costs.disk_interference <= 0;
}
// `scratch`: a program a pipeline's step is built into, refilled in place (pipeline_step_program's
// reason); a search gives each thread one for the search's life. Null: one of the call's own.
Prediction time_layout(const PlanJob& job, const Layout& l, const Calibration& cal, SimProgram* scratch = nullptr);
Prediction finish_prediction(const PlanJob& job, const Layout& l, const ZeroStepCosts& costs, SimProgram& program);

Prediction time_program(const PlanJob& job, const Layout& l, const Calibration& cal, SimProgram* scratch) {
  const MemoryInput& m = job.memory;
  const ZeroStepCosts costs = zero_step_costs(step_shape(job, l), cal);
  if (l.pp > 1) {
    PipelineStepSpec spec;
    spec.schedule = pipeline_spec(job, l);
    spec.bounds = pipeline_bounds(job, l, spec.schedule, cal);
    for (const MemoryInput& in : rank_inputs(job, l, cal)) {
      size_t n = 0;
      for (const parallel::Unit& u : stage_units(in)) n += u.numel;
      spec.stage_params.push_back(n);
    }
    spec.dp = l.dp * l.usp;  // the gradients' group (Ulysses: dp x sp)
    spec.zero_stage = l.stage;
    spec.low_precision = m.compute_dtype != DType::kF32;
    spec.bucket_elems = job.bucket_elems;
    // What the executor sends: the chunk's f32 residual stream (TransformerLM::boundary_numel), this
    // rank's N/tp rows of it under sequence parallelism.
    const StepShape shape = step_shape(job, l);
    spec.boundary_bytes = 4.0 * static_cast<double>(block_dims(m.model, l.micro_batch, m.seq_length, l.tp, shape.sequence_parallel, l.usp).rows()) *
                          m.model.hidden;
    spec.tied_elems = models::head_is_token_table(m.model)
                          ? static_cast<size_t>(models::padded_vocab(m.model, 1, m.vocab_divisible)) * m.model.hidden
                          : 0;
    spec.one_replica = ranks_alike(job, costs);
    spec.shared_cores = job.host_cores > 0;
    SimProgram own;
    SimProgram& program = scratch ? *scratch : own;
    pipeline_step_program(spec, costs, program);
    Prediction p = finish_prediction(job, l, costs, program);
    p.bounds = spec.bounds;
    return p;
  }
  SimProgram program = zero_program(job, l, costs);
  return finish_prediction(job, l, costs, program);
}

// A data-parallel step of many micro-batches (DESIGN-NOTES 129). Its program is a prologue, the
// same passes once a micro-batch on every rank and an epilogue, so once the first micro-batches
// have passed, each more one adds the same time to every figure the simulator reports: the step and
// rank 0's compute, communication, waits and streams. From 80 micro-batches, those are simulated at
// four counts, 8, 9, 10 and 12; where each figure lies on one line through the four (to 1e-9 of the
// step), the layout's count is read off that line, else every micro-batch is simulated. A pipeline's step is always
// simulated whole: work queues between its stages, and where their times nearly agree the
// schedule takes hundreds of micro-batches to settle (Llama 3 405B over pp 16 at 256 micro-batches:
// 6e-5 of the step off a line through 64-128 that held to 1e-9; GPipe with shared cores 2e-6).
// Thousands of micro-batches a rank had taken the search of 64 processes 15 s; every figure agrees
// with the whole simulation to 1e-9 (Search.ManyMicroBatchesAreTheSteadyStatesLine).
Prediction time_one(const PlanJob& job, const Layout& l, const Calibration& cal, SimProgram* scratch) {
  const int counts[4] = {8, 9, 10, 12};
  // The four cost 39 micro-batches (twice with an asynchronous collective): fewer are simulated whole.
  if (job.every_micro_batch || l.pp > 1 || l.accumulation < 80) return time_program(job, l, cal, scratch);
  Prediction at[4];
  for (int i = 0; i < 4; ++i) {
    Layout few = l;
    few.accumulation = counts[i];
    at[i] = time_program(job, few, cal, scratch);
  }
  double Prediction::*figures[] = {&Prediction::step, &Prediction::step_progress, &Prediction::compute,
                                   &Prediction::comm, &Prediction::blocked, &Prediction::streams};
  const double tolerance = 1e-9 * std::max(at[3].step, at[3].step_progress);
  Prediction p = at[3];
  for (double Prediction::*f : figures) {
    const double per = (at[3].*f - at[1].*f) / (counts[3] - counts[1]);
    for (int i = 0; i < 3; ++i)
      if (std::abs(at[3].*f - per * (counts[3] - counts[i]) - at[i].*f) > tolerance) return time_program(job, l, cal, scratch);
    p.*f = at[3].*f + per * (l.accumulation - counts[3]);
  }
  p.tokens_per_s = p.step > 0 ? static_cast<double>(job.global_batch) * job.memory.seq_length / p.step : 0.0;
  p.steady_from = counts[3];
  return p;
}

// A job whose steps differ (PlanJob::update_mix): each kind's step simulated on its own, the mean
// step their shares' sum (the step, its parts and tokens/s alike).
Prediction time_layout(const PlanJob& job, const Layout& l, const Calibration& cal, SimProgram* scratch) {
  if (job.update_mix.empty()) return time_one(job, l, cal, scratch);
  Prediction mean;
  double share = 0.0;
  for (const auto& [kind, w] : job.update_mix) {
    PlanJob one = job;
    one.update = kind;
    one.update_mix.clear();
    const Prediction p = time_one(one, l, cal, scratch);
    if (share == 0.0) mean = p, mean.step = mean.step_progress = mean.compute = mean.comm = mean.blocked = mean.streams = 0.0;
    mean.step += w * p.step;
    mean.step_progress += w * p.step_progress;
    mean.compute += w * p.compute;
    mean.comm += w * p.comm;
    mean.blocked += w * p.blocked;
    mean.streams += w * p.streams;
    share += w;
  }
  MT_CHECK(std::abs(share - 1.0) < 1e-9, ErrorKind::kInternal, "plan: the step kinds' shares sum to " + std::to_string(share));
  mean.tokens_per_s = mean.step > 0 ? static_cast<double>(job.global_batch) * job.memory.seq_length / mean.step : 0.0;
  return mean;
}

SimProgram zero_program(const PlanJob& job, const Layout& l, const ZeroStepCosts& costs) {
  const MemoryInput& m = job.memory;
  ZeroStepSpec spec;
  spec.units = model_units(m.model, l.tp, m.vocab_divisible);
  spec.world = l.dp * l.usp;  // Ulysses' all-to-alls are the passes' blocking collectives (cost.cpp)
  spec.usp = l.usp;
  spec.tp = l.tp;
  spec.schedule = job.schedule;
  if (l.usp > 1) spec.schedule.comm_dtype = job.usp_comm_dtype;
  spec.schedule.stage = l.stage;
  if (!job.overlap_comm_given) spec.schedule.overlap_comm = l.stage == 3;
  spec.bucket_elems = job.bucket_elems;
  spec.micro_batches = l.accumulation;
  spec.tied_head = models::head_is_token_table(m.model);
  spec.low_precision = m.compute_dtype != DType::kF32;
  spec.param_nvme = m.zero.param_nvme && l.stage == 3;  // DeepSpeed reads offload_param at stage 3 only
  spec.sub_group_size = static_cast<size_t>(std::max<int64_t>(1, m.zero.sub_group_size));
  spec.one_rank = ranks_alike(job, costs);
  return zero_step_program(spec, costs);
}

// The hosts' shared cores on the program: a zero program's rank d·tp + t is that process; a pipeline
// program's rank q·dp + d stands for its stage's tp group (processes (q·dp + d)·tp + t); a program
// of one rank (ranks_alike) for every process, of one replica for each stage's dp·tp processes.
void share_cores(const PlanJob& job, SimProgram& program) {
  if (job.host_cores <= 0) return;
  program.host_cores = job.host_cores;
  const int per_host = job.ranks_per_host > 0 ? job.ranks_per_host : job.procs;
  const int n = static_cast<int>(program.ranks.size());
  MT_CHECK(n > 0 && job.procs % n == 0, ErrorKind::kInternal,
           "plan: a program of " + std::to_string(n) + " ranks for " + std::to_string(job.procs) + " processes");
  const int stands_for = job.procs / n;
  for (int q = 0; q < n; ++q) {
    program.host.push_back(q * stands_for / per_host);
    program.demand.push_back(static_cast<double>(stands_for * job.threads));
  }
}

Prediction finish_prediction(const PlanJob& job, const Layout& l, const ZeroStepCosts& costs, SimProgram& program) {
  const MemoryInput& m = job.memory;
  share_cores(job, program);
  SimOptions no_progress;
  no_progress.progress = false;
  const SimReport slow = simulate(program, no_progress);
  // Progress moves only asynchronous collectives (sim.h): without one the two steps are one.
  const SimReport fast = slow.async_collective ? simulate(program) : slow;
  Prediction p;
  p.step = slow.makespan;
  p.step_progress = fast.makespan;
  MT_CHECK(!slow.deadlock && !fast.deadlock, ErrorKind::kInternal, "plan: the step program of " + l.describe() +
                                                                     " deadlocks: " + slow.where + fast.where);
  p.compute = slow.compute[0];
  p.comm = slow.comm[0];
  p.blocked = slow.blocked[0];
  p.streams = slow.streams[0];
  p.backward = costs.head_backward;
  for (size_t u = 0; u < costs.forward.size(); ++u) p.forward += costs.forward[u], p.backward += costs.backward[u];
  p.tokens_per_s = p.step > 0 ? static_cast<double>(job.global_batch) * m.seq_length / p.step : 0.0;
  return p;
}

}  // namespace

void rank_layouts(std::vector<RankedLayout>& ranked) {
  auto faster = [](const RankedLayout& a, const RankedLayout& b) {
    if (a.prediction.step != b.prediction.step) return a.prediction.step < b.prediction.step;
    return a.prediction.memory < b.prediction.memory;
  };
  std::stable_sort(ranked.begin(), ranked.end(), faster);
  // A band: the fastest layout not yet placed and every one predicted within kTieBand of it, the
  // ones with less memory first (DESIGN-NOTES 47).
  for (size_t i = 0; i < ranked.size();) {
    size_t j = i + 1;
    while (j < ranked.size() && ranked[j].prediction.step <= ranked[i].prediction.step * (1.0 + kTieBand)) ++j;
    std::stable_sort(ranked.begin() + static_cast<std::ptrdiff_t>(i), ranked.begin() + static_cast<std::ptrdiff_t>(j),
                     [](const RankedLayout& a, const RankedLayout& b) { return a.prediction.memory < b.prediction.memory; });
    i = j;
  }
}

std::string Layout::describe() const {
  std::string s = "dp " + std::to_string(dp);
  if (usp > 1) s += ", Ulysses " + std::to_string(usp);
  if (tp > 1) s += ", tp " + std::to_string(tp) + (sequence_parallel ? " sp" : "");
  if (pp > 1) s += ", pp " + std::to_string(pp);
  if (pp > 1 && schedule == parallel::pp::ScheduleKind::kGPipe) s += " GPipe";
  if (pp > 1 && schedule == parallel::pp::ScheduleKind::kInterleaved) s += " interleaved x " + std::to_string(virtual_stages);
  s += ", ZeRO " + std::to_string(stage) + ", B " + std::to_string(micro_batch);
  if (accumulation > 1) s += " x " + std::to_string(accumulation) + " micro-batches";
  if (recompute) s += ", recompute";
  return s;
}

Prediction predict_layout(const PlanJob& job, const Layout& layout, const Calibration& cal) {
  check_layout(job, layout);
  Prediction p = time_layout(job, layout, cal);
  p.memory = layout_memory(job, layout, cal, &p.memory_train, &p.memory_by_stage, &p);
  return p;
}

SearchResult search_layouts(const PlanJob& job, const SearchSpace& space, size_t budget, const Calibration& cal) {
  MT_CHECK(job.procs >= 1 && job.global_batch >= 1, ErrorKind::kInvalidArgument,
           "plan: the job needs at least one process and one sample a step");
  SearchResult r;
  std::vector<std::tuple<int, int, int>> grids;  // (tp, pp, Ulysses' sp)
  if (space.parallel) {
    for (int64_t tp : divisors(job.procs))
      for (int64_t pp : divisors(job.procs / tp)) grids.emplace_back(static_cast<int>(tp), static_cast<int>(pp), 1);
    for (int64_t tp : divisors(job.procs))  // Ulysses' grids after the others (with tp and pp since stop 80)
      for (int64_t pp : divisors(job.procs / tp))
        for (int64_t usp : divisors(job.procs / (tp * pp)))
          if (usp > 1) grids.emplace_back(static_cast<int>(tp), static_cast<int>(pp), static_cast<int>(usp));
  } else {
    grids.emplace_back(job.base.tp, job.base.pp, job.base.usp);
  }
  // The layouts are enumerated twice: once to list those whose memory is wanted, which are then
  // estimated on the process's threads at once (22,648 layouts of Llama 3 405B over 512 GPUs took
  // 9 s on one), and once to rank, reject and name them in order with those estimates. The first
  // failure in order is thrown where it was.
  struct LayoutMemory {
    size_t bytes = 0, train = 0;
    std::vector<size_t> by_stage;
    Prediction mem;
    std::exception_ptr failed;
  };
  auto enumerate = [&](SearchResult& out, auto&& memory_of) {
    for (auto [tp, pp, usp] : grids) {
      const int dp = job.procs / (tp * pp * usp);
      const std::string ulysses = usp > 1 ? ", Ulysses " + std::to_string(usp) : "";
      const std::string family = "dp " + std::to_string(dp) + ulysses + (tp > 1 ? ", tp " + std::to_string(tp) : "") +
                                 (pp > 1 ? ", pp " + std::to_string(pp) : "");
      const models::ModelConfig& model = job.memory.model;
      if (usp > 1 && !job.ulysses_refused.empty()) {
        out.rejected.push_back(family + ": Ulysses with " + job.ulysses_refused + " is not implemented");
        continue;
      }
      if (usp > 1 && (job.memory.seq_length % usp != 0 || model.n_head % (tp * usp) != 0 || model.n_kv_head % (tp * usp) != 0)) {
        out.rejected.push_back(family + ": Ulysses does not divide seq_length, or tp x sp the heads and the kv heads");
        continue;
      }
      if (usp > 1 && job.curriculum_gcd > 0 && job.curriculum_gcd % usp != 0) {
        out.rejected.push_back(family + ": Ulysses does not divide every length of the curriculum");
        continue;
      }
      if (model.n_head % tp != 0 || model.n_kv_head % tp != 0 || model.intermediate % tp != 0) {
        out.rejected.push_back(family + ": tp does not divide the model's heads, kv heads and MLP features");
        continue;
      }
      if (job.global_batch % dp != 0) {
        out.rejected.push_back(family + ": " + std::to_string(dp) + " ranks do not divide train_batch_size " +
                             std::to_string(job.global_batch));
        continue;
      }
      if ((dp > 1 || pp > 1 || tp > 1 || usp > 1) && !cal.has_network && cal.world < 2) {  // (a cluster's links are described)
        out.rejected.push_back(family + ": the calibration has no collectives (calibrate under meshtrain launch -n " +
                             std::to_string(std::max(dp, 2)) + ")");
        continue;
      }
      const int64_t share = job.global_batch / dp;
      std::vector<int64_t> batches;
      if (space.batch) {
        batches = divisors(share);
      } else if (space.fixed_accumulation > 0) {
        if (share % space.fixed_accumulation != 0) {
          out.rejected.push_back(family + ": gradient_accumulation_steps " + std::to_string(space.fixed_accumulation) +
                               " does not divide the rank's " + std::to_string(share) + " samples");
          continue;
        }
        batches = {share / space.fixed_accumulation};
      } else if (share % job.base.micro_batch == 0) {
        batches = {job.base.micro_batch};
      } else {
        out.rejected.push_back(family + ": B " + std::to_string(job.base.micro_batch) + " does not divide the rank's " +
                             std::to_string(share) + " samples");
        continue;
      }
      std::vector<int> stages = space.stage ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{job.base.stage};
      if (job.offload) std::erase_if(stages, [](int st) { return st < 1; });  // DeepSpeed's rule
      // The stages a rule of the runtime keeps; none left: the family is rejected, saying why.
      auto keep_stages = [&](bool (*keep)(int), const char* why) {
        std::erase_if(stages, [keep](int st) { return !keep(st); });
        if (stages.empty()) out.rejected.push_back(family + ": " + why);
        return !stages.empty();
      };
      auto stage_zero = [](int st) { return st == 0; };
      auto stage_above_zero = [](int st) { return st >= 1; };
      if (job.cuda_replicas) {
        if (usp > 1) {
          out.rejected.push_back(family + ": Ulysses is not implemented on device \"cuda\"");
          continue;
        }
        if (tp > 1 || pp > 1) {
          out.rejected.push_back(family + ": tp and pp are not implemented on device \"cuda\" (data parallelism is)");
          continue;
        }
        if (!keep_stages(stage_zero, "ZeRO stages 1-3 over several GPUs are not implemented (stage 0 is)")) continue;
      }
      if (job.sixteen_bit_master &&
          !keep_stages(stage_above_zero, "16-bit master weights need ZeRO stage 1, 2 or 3 (as DeepSpeed asserts)"))
        continue;
      if (pp > 1 && job.memory.zero.optimizer_nvme) {
        out.rejected.push_back(family + ": a pipeline with offload_optimizer nvme is not in the cost model");
        continue;
      }
      if (job.memory.zero.param_nvme && (tp > 1 || pp > 1) &&  // offload_param nvme: tp = pp = 1 (the runtime's limit)
          !keep_stages([](int st) { return st != 3; }, "offload_param nvme with tp or pp > 1 is not supported by the runtime"))
        continue;
      if (job.memory.onebit != MemoryInput::OneBit::kNone) {  // 1-bit optimizers: ZeRO 0, no tp or pp (ds_config's check_onebit)
        if (tp > 1 || pp > 1) {
          out.rejected.push_back(family + ": 1-bit optimizers take no tp or pp (DeepSpeed's MPI backend; tp not built)");
          continue;
        }
        if (!keep_stages(stage_zero, "1-bit optimizers need ZeRO stage 0 (as in DeepSpeed)")) continue;
      }
      if (job.update == UpdateKind::kLamb && job.memory.onebit == MemoryInput::OneBit::kNone &&  // ds_config's parse_zero
          !keep_stages(stage_zero, "Lamb needs ZeRO stage 0 (its per-tensor trust ratio takes whole tensors)"))
        continue;
      if (pp > 1 &&  // the runtime's pipeline takes ZeRO 0 or 1
          !keep_stages([](int st) { return st <= 1; }, "a pipeline takes ZeRO stage 0 or 1 (as DeepSpeed's pipeline engine)"))
        continue;
      std::vector<bool> recomputes = space.recompute ? std::vector<bool>{false, true} : std::vector<bool>{job.base.recompute};
      // (schedule, virtual stages): the configuration's; searched, its non-interleaved schedule and
      // the interleaved one at every chunk count that leaves each chunk a layer.
      using parallel::pp::ScheduleKind;
      std::vector<std::pair<ScheduleKind, int>> schedules = {{job.schedule_kind, job.virtual_stages}};
      if (pp == 1) {
        schedules = {{ScheduleKind::k1F1B, 1}};
      } else if (space.schedule) {
        schedules = {{job.schedule_kind == ScheduleKind::kInterleaved ? ScheduleKind::k1F1B : job.schedule_kind, 1}};
        for (int v = 2; static_cast<int64_t>(pp) * v <= model.n_layer; ++v) schedules.emplace_back(ScheduleKind::kInterleaved, v);
      }
      // Sequence parallelism (tp > 1): the configuration's, or searched with the layout.
      std::vector<bool> sps = {tp > 1 && job.memory.sequence_parallel};
      if (tp > 1 && space.parallel) sps = job.sequence_parallel_forced ? std::vector<bool>{true} : std::vector<bool>{false, true};
      for (bool sp : sps)
      for (auto [kind, v] : schedules) {
        // Named as Layout::describe names it: "sp" beside tp, the schedule beside pp.
        const std::string fam = "dp " + std::to_string(dp) + ulysses + (tp > 1 ? ", tp " + std::to_string(tp) + (sp ? " sp" : "") : "") +
                                (pp > 1 ? ", pp " + std::to_string(pp) : "") +
                                (pp > 1 && kind == ScheduleKind::kGPipe ? " GPipe" : "") +
                                (pp > 1 && kind == ScheduleKind::kInterleaved ? " interleaved x " + std::to_string(v) : "");
        // What the runtime refuses, by the micro-batch sizes it refuses (in the order first met); the
        // sizes this family tries at all.
        std::vector<std::pair<std::string, std::vector<int64_t>>> refused;
        std::vector<int64_t> sizes;
        for (int stage : stages)
        for (bool rec : recomputes) {
          int over_from = 0, over_count = 0, tried = 0, too_many = 0;
          size_t over_bytes = 0;
          for (int64_t B : batches) {
            if (sp && (B * (job.memory.seq_length / usp)) % tp != 0) continue;  // the rows split over the tp ranks
            if (share / B > kMaxAccumulation || B > std::numeric_limits<int>::max()) {
              ++too_many;
              continue;
            }
            ++tried;
            if (std::find(sizes.begin(), sizes.end(), B) == sizes.end()) sizes.push_back(B);
            Layout l{.dp = dp, .tp = tp, .pp = pp, .stage = stage, .micro_batch = static_cast<int>(B),
                     .accumulation = static_cast<int>(share / B), .recompute = rec, .schedule = kind, .virtual_stages = v,
                     .sequence_parallel = sp, .usp = usp};
            ++out.considered;
            check_layout(job, l);
            size_t train = 0, bytes = 0;
            std::vector<size_t> by_stage;
            Prediction mem;
            try {
              const LayoutMemory& got = memory_of(l);
              bytes = got.bytes;
              train = got.train;
              by_stage = got.by_stage;
              mem = got.mem;
            } catch (const Error& e) {  // a schedule or partition the runtime cannot run at this B
              auto it = std::find_if(refused.begin(), refused.end(), [&](const auto& x) { return x.first == e.what(); });
              if (it == refused.end()) it = refused.insert(refused.end(), {e.what(), {}});
              if (std::find(it->second.begin(), it->second.end(), B) == it->second.end()) it->second.push_back(B);
              continue;
            }
            // With the calibration's process constant the budget holds for the process as the kernel
            // counts it, else (a described cluster) for the accounted bytes.
            const size_t need = mem.process > 0 ? std::max(mem.process, bytes) : bytes;
            if (need > budget) {
              if (over_count++ == 0) over_from = static_cast<int>(B), over_bytes = need;
              continue;
            }
            Prediction p;  // timed below, with the others
            p.process = mem.process;
            p.process_by_stage = std::move(mem.process_by_stage);
            p.memory = bytes;
            p.memory_train = train;
            p.memory_by_stage = std::move(by_stage);
            out.ranked.push_back({l, p});
          }
          if (too_many > 0 && tried == 0 && stage == stages.front() && rec == recomputes.front())
            out.rejected.push_back(fam + ": every micro-batch size leaves more than " + std::to_string(kMaxAccumulation) +
                                 " micro-batches a step (the simulator runs each), or is past int");
          if (over_count) {
            const std::string what = fam + ", ZeRO " + std::to_string(stage) + (rec ? ", recompute" : "");
            out.rejected.push_back(what + ": " +
                                 (over_count == tried ? std::string("every micro-batch")
                                                      : std::to_string(over_count) + " of " + std::to_string(tried) + " micro-batch sizes") +
                                 " over the budget of " + gib(budget) + " (B " + std::to_string(over_from) + " needs " +
                                 gib(over_bytes) + (cal.process_bytes > 0 ? " as the process" : "") + ")");
          }
        }
        // A refusal of every size is the family's; of some, named with the sizes it holds for (the
        // others ranked or over the budget above).
        for (auto& [what, at] : refused) {
          std::string which;
          if (at.size() < sizes.size()) {
            std::sort(at.begin(), at.end());
            for (int64_t B : at) which += (which.empty() ? ", B " : ", ") + std::to_string(B);
          }
          out.rejected.push_back(fam + which + ": " + what);
        }
      }
    }
  };
  const int threads = std::max(1, std::min(16, omp_get_max_threads()));
  std::vector<Layout> wanted;
  {
    SearchResult listed;
    const LayoutMemory none;
    enumerate(listed, [&](const Layout& l) -> const LayoutMemory& {
      wanted.push_back(l);
      return none;
    });
  }
  std::vector<LayoutMemory> memory(wanted.size());
#pragma omp parallel for schedule(dynamic, 8) num_threads(threads)
  for (int64_t k = 0; k < static_cast<int64_t>(wanted.size()); ++k) {
    LayoutMemory& m = memory[static_cast<size_t>(k)];
    try {
      m.bytes = layout_memory(job, wanted[static_cast<size_t>(k)], cal, &m.train, &m.by_stage, &m.mem);
    } catch (...) {
      m.failed = std::current_exception();
    }
  }
  // Asked inside the enumeration's catch of a refusal: a disorder is said after it, not rejected.
  size_t next = 0;
  std::string disorder;
  enumerate(r, [&](const Layout& l) -> const LayoutMemory& {
    if (next >= wanted.size() || wanted[next].describe() != l.describe()) {
      if (disorder.empty()) disorder = l.describe();
      static const LayoutMemory none;
      return none;
    }
    const LayoutMemory& m = memory[next++];
    if (m.failed) std::rethrow_exception(m.failed);
    return m;
  });
  MT_CHECK(disorder.empty() && next == wanted.size(), ErrorKind::kInternal,
           "plan: the search's second enumeration met " + (disorder.empty() ? std::string("fewer layouts") : disorder) +
               " out of order");
  // Every layout that fits is simulated, on the process's threads at once (each simulation is pure
  // and on its own; the caches they share are locked). A failure is the first layout's in order.
  // In the order of their pipeline schedules, so that the layouts of one schedule (each ZeRO stage,
  // recompute and sp setting) meet its lists in program.cpp's cache of the last few; the most
  // micro-batches first, so that no long one is left to the end. At most 16 threads: each holds
  // its program (tens of MB at thousands of micro-batches).
  const int64_t n = static_cast<int64_t>(r.ranked.size());
  std::vector<size_t> order(r.ranked.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto schedule_of = [&r](size_t i) {
    const Layout& l = r.ranked[i].layout;
    return std::tuple{-l.accumulation, l.pp, static_cast<int>(l.schedule), l.virtual_stages};
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return schedule_of(a) < schedule_of(b); });
  std::vector<std::exception_ptr> failed(r.ranked.size());
  std::vector<SimProgram> scratch(static_cast<size_t>(threads));  // each thread's, for the search's life
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t k = 0; k < n; ++k) {
    const size_t i = order[static_cast<size_t>(k)];
    RankedLayout& x = r.ranked[i];
    try {
      Prediction p = time_layout(job, x.layout, cal, &scratch[static_cast<size_t>(omp_get_thread_num())]);
      p.process = x.prediction.process;
      p.process_by_stage = std::move(x.prediction.process_by_stage);
      p.memory = x.prediction.memory;
      p.memory_train = x.prediction.memory_train;
      p.memory_by_stage = std::move(x.prediction.memory_by_stage);
      x.prediction = std::move(p);
    } catch (...) {
      failed[i] = std::current_exception();
    }
  }
  for (const std::exception_ptr& e : failed)
    if (e) std::rethrow_exception(e);
  rank_layouts(r.ranked);
  return r;
}

}  // namespace mt::planner
