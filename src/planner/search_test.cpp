// The layout search on a hand-written calibration: what must hold whatever the machine (the memory
// budget is a hard limit, recompute only costs time, a per-call latency makes fewer micro-batches
// faster, a priced collective moves the choice off the naive layout) and the rejections' reasons.
#include "planner/search.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <map>

#include "models/tiny_model_test_util.h"

namespace mt::planner {
namespace {

// GEMMs and attention at 1e-9 s a FLOP plus 1e-5 s a call, free memory traffic, AdamW 1e-7 s an
// element; collectives (two ranks) at 1e-9 s a byte.
Calibration hand_calibration(int world) {
  Calibration c;
  c.world = world;
  c.fits["gemm f32"] = {1e-5, 1e-9};
  c.fits["gemm bf16"] = {1e-5, 1e-9};
  c.fits["memory"] = {0.0, 0.0};
  c.fits["adamw"] = {0.0, 1e-7};
  if (world > 1)
    for (const char* f : {"all_reduce", "all_gather", "reduce_scatter", "send_recv"}) c.fits[f] = {0.0, 1e-9};
  return c;
}

PlanJob tiny_job(int procs, int64_t global_batch) {
  PlanJob job;
  job.memory.model = models::tiny(models::Arch::kGpt2);  // models' shared tiny GPT-2
  job.memory.seq_length = 16;
  job.memory.compute_dtype = DType::kF32;
  job.memory.optimizer_states = 2;
  job.procs = procs;
  job.global_batch = global_batch;
  job.base = Layout{.dp = procs, .stage = 0, .micro_batch = static_cast<int>(global_batch / procs)};
  return job;
}

// Collectives and messages with a latency and a rate, and memory-bound passes priced.
Calibration priced_calibration() {
  Calibration cal = hand_calibration(8);
  cal.fits["all_reduce"] = {2e-5, 1e-9};
  cal.fits["all_gather"] = {1e-5, 2e-9};
  cal.fits["reduce_scatter"] = {1e-5, 3e-9};
  cal.fits["send_recv"] = {5e-6, 1e-9};
  cal.fits["memory"] = {0.0, 1e-11};
  return cal;
}

// 8 processes of a 4-layer model of `arch` (LLaMA with sequence parallelism), a pipeline's schedule
// `kind` (interleaved over 2 chunks a rank).
PlanJob eight_process_job(models::Arch arch, parallel::pp::ScheduleKind kind, int64_t global_batch) {
  PlanJob job = tiny_job(8, global_batch);
  job.memory.model = models::tiny(arch);
  job.memory.model.n_layer = 4;
  job.memory.model.n_kv_head = 2;
  job.memory.model.vocab_size = 128;
  job.schedule_kind = kind;
  job.virtual_stages = kind == parallel::pp::ScheduleKind::kInterleaved ? 2 : 1;
  job.memory.sequence_parallel = arch == models::Arch::kLlama;
  return job;
}

SearchSpace everything() {
  SearchSpace s;
  s.parallel = s.stage = s.batch = s.recompute = s.schedule = true;
  return s;
}

TEST(Search, RanksEveryLayoutByItsSimulatedStepAndFewerMicroBatchesWinWithACallLatency) {
  const PlanJob job = tiny_job(1, 8);
  const Calibration cal = hand_calibration(1);
  const SearchResult r = search_layouts(job, everything(), size_t{1} << 40, cal);
  // 4 stages x B in {1, 2, 4, 8} x recompute or not, all within a terabyte.
  EXPECT_EQ(r.considered, 4 * 4 * 2);
  ASSERT_EQ(r.ranked.size(), 32u);
  EXPECT_TRUE(r.rejected.empty());
  for (size_t i = 0; i < r.ranked.size(); ++i) {
    const RankedLayout& x = r.ranked[i];
    EXPECT_DOUBLE_EQ(x.prediction.step, predict_layout(job, x.layout, cal).step) << x.layout.describe();
    EXPECT_EQ(x.prediction.memory, predict_layout(job, x.layout, cal).memory);
    if (i) {  // fastest first, up to a band of ties (rank_layouts)
      EXPECT_LE(r.ranked[i - 1].prediction.step, x.prediction.step * (1 + kTieBand));
    }
    EXPECT_NEAR(x.prediction.tokens_per_s, 8.0 * 16 / x.prediction.step, 1e-6 * x.prediction.tokens_per_s);
  }
  // The FLOPs are the same for every split; each micro-batch pays every GEMM's call latency again.
  EXPECT_EQ(r.ranked.front().layout.micro_batch, 8);
  EXPECT_EQ(r.ranked.front().layout.accumulation, 1);
  EXPECT_FALSE(r.ranked.front().layout.recompute);
  // Recompute runs each block's forward again: never faster than the same layout without it.
  for (const RankedLayout& a : r.ranked) {
    if (!a.layout.recompute) continue;
    {
      Layout b = a.layout;
      b.recompute = false;
      EXPECT_GT(a.prediction.step, predict_layout(job, b, cal).step) << a.layout.describe();
      EXPECT_LT(a.prediction.memory_train, predict_layout(job, b, cal).memory_train) << a.layout.describe();
      EXPECT_LE(a.prediction.memory, predict_layout(job, b, cal).memory) << a.layout.describe();
    }
  }
}

// Steps within 1 % of the band's fastest are ties, less memory first; past the band, the next
// fastest opens the next one.
TEST(Search, LayoutsWithinTheTieBandRankByMemory) {
  auto at = [](double step, size_t memory) {
    RankedLayout x;
    x.prediction.step = step;
    x.prediction.memory = memory;
    return x;
  };
  std::vector<RankedLayout> v = {at(1.5, 3), at(1.025, 2), at(1.009, 7), at(1.0, 10), at(1.02, 1),
                                 at(1.005, 5), at(2.0, 5), at(2.0, 3), at(1.0101, 0)};
  rank_layouts(v);
  std::vector<std::pair<double, size_t>> got;
  for (const RankedLayout& x : v) got.emplace_back(x.prediction.step, x.prediction.memory);
  // 1.0 opens a band to 1.01: 1.005, 1.009 and 1.0 by memory. 1.0101 is past it and opens the next,
  // to 1.020201: 1.0101 and 1.02. 1.025 alone, 1.5 alone, the two at 2.0 by memory.
  const std::vector<std::pair<double, size_t>> want = {{1.005, 5}, {1.009, 7}, {1.0, 10}, {1.0101, 0}, {1.02, 1},
                                                       {1.025, 2}, {1.5, 3},   {2.0, 3},  {2.0, 5}};
  EXPECT_EQ(got, want);
}

TEST(Search, TheBudgetIsAHardLimitAndWhatItRejectsIsNamed) {
  const PlanJob job = tiny_job(1, 8);
  const Calibration cal = hand_calibration(1);
  const SearchResult all = search_layouts(job, everything(), size_t{1} << 40, cal);
  // A budget one byte under the fastest layout's peak: it goes, and the new first fits.
  const size_t budget = all.ranked.front().prediction.memory - 1;
  const SearchResult r = search_layouts(job, everything(), budget, cal);
  ASSERT_FALSE(r.ranked.empty());
  for (const RankedLayout& x : r.ranked) EXPECT_LE(x.prediction.memory, budget) << x.layout.describe();
  const Layout& first = r.ranked.front().layout;
  EXPECT_FALSE(first.micro_batch == all.ranked.front().layout.micro_batch && first.stage == all.ranked.front().layout.stage &&
               first.recompute == all.ranked.front().layout.recompute);
  // The ranked and the over-budget layouts are all the layouts.
  size_t under = 0;
  for (const RankedLayout& x : all.ranked) under += x.prediction.memory <= budget;
  EXPECT_EQ(r.ranked.size(), under);
  ASSERT_FALSE(r.rejected.empty());
  EXPECT_NE(r.rejected.front().find("over the budget"), std::string::npos) << r.rejected.front();
  // Nothing fits: every family says so.
  const SearchResult none = search_layouts(job, everything(), 1000, cal);
  EXPECT_TRUE(none.ranked.empty());
  EXPECT_EQ(none.rejected.size(), 8u);  // 4 stages x recompute or not
  for (const std::string& why : none.rejected) EXPECT_NE(why.find("every micro-batch over the budget"), std::string::npos) << why;
}

TEST(Search, TheCollectivesPricesDecideBetweenPlainDataParallelismAndZeROAndUnmodelledFamiliesAreRejected) {
  const PlanJob job = tiny_job(2, 8);
  Calibration cal = hand_calibration(2);
  // All-reduce free and a second per reduce-scatter and all-gather: stage 0 (no gathers, no
  // refresh) is first, though every rank updates every parameter.
  cal.fits["all_reduce"] = {0.0, 0.0};
  cal.fits["reduce_scatter"] = cal.fits["all_gather"] = {1.0, 0.0};
  SearchResult r = search_layouts(job, everything(), size_t{1} << 40, cal);
  ASSERT_FALSE(r.ranked.empty());
  EXPECT_EQ(r.ranked.front().layout.stage, 0);
  EXPECT_EQ(r.ranked.front().layout.dp, 2);
  // The other way round: a ZeRO stage's reduce-scatter and gathers are cheaper.
  cal.fits["all_reduce"] = {1.0, 0.0};
  cal.fits["reduce_scatter"] = cal.fits["all_gather"] = {0.0, 1e-9};
  r = search_layouts(job, everything(), size_t{1} << 40, cal);
  ASSERT_FALSE(r.ranked.empty());
  EXPECT_GE(r.ranked.front().layout.stage, 1);
  // tp 2 over two processes: timed at every stage, its units one tp rank's shard. pp 2: timed
  // at ZeRO 0 and 1 (the runtime's pipeline takes no other), each stage one layer; its memory the
  // larger stage's.
  int tp = 0, pipelines = 0;
  for (const RankedLayout& x : r.ranked) {
    if (x.layout.tp == 1) continue;
    ++tp;
    EXPECT_EQ(x.layout.dp, 1);
    EXPECT_DOUBLE_EQ(x.prediction.step, predict_layout(job, x.layout, cal).step);
  }
  EXPECT_EQ(tp, 4 * 4 * 2 * 2);  // stages 0-3 x B in {1, 2, 4, 8} x recompute or not x sequence parallel or not
  // tp 3 does not divide the heads: named.
  PlanJob three = tiny_job(3, 6);
  SearchResult r3 = search_layouts(three, everything(), size_t{1} << 40, cal);
  EXPECT_TRUE(std::any_of(r3.rejected.begin(), r3.rejected.end(), [](const std::string& w) {
    return w.rfind("dp 1, tp 3:", 0) == 0 && w.find("does not divide") != std::string::npos;
  }));
  for (const RankedLayout& x : r.ranked) {
    if (x.layout.pp == 1) continue;
    ++pipelines;
    EXPECT_EQ(x.layout.dp, 1);
    EXPECT_LE(x.layout.stage, 1);
    EXPECT_DOUBLE_EQ(x.prediction.step, predict_layout(job, x.layout, cal).step);
  }
  EXPECT_EQ(pipelines, 2 * 4 * 2);  // stages 0-1 x B in {1, 2, 4, 8} x recompute or not
  // A one-rank calibration cannot time two ranks' collectives.
  r = search_layouts(job, everything(), size_t{1} << 40, hand_calibration(1));
  EXPECT_TRUE(r.ranked.empty());
  EXPECT_TRUE(std::any_of(r.rejected.begin(), r.rejected.end(),
                          [](const std::string& w) { return w.find("no collectives") != std::string::npos; }));
  // overlap_comm left to its default: on at stage 3 (DeepSpeed's), off below, in the memory
  // replay as in the program.
  PlanJob defaults = tiny_job(2, 8);
  defaults.overlap_comm_given = false;
  MemoryInput in = defaults.memory;
  in.world = 2;
  in.micro_batch = 4;
  for (int stage : {2, 3}) {
    in.zero.overlap_comm = stage == 3;
    const Layout l{.dp = 2, .stage = stage, .micro_batch = 4};
    EXPECT_EQ(predict_layout(defaults, l, cal).memory_train, estimate_stage(in, stage).ours.total()) << stage;
  }
  in.zero.overlap_comm = false;
  EXPECT_NE(predict_layout(defaults, Layout{.dp = 2, .stage = 3, .micro_batch = 4}, cal).memory_train,
            estimate_stage(in, 3).ours.total());
  // A batch two data-parallel ranks cannot share: only one replica (tp 2 or pp 2) takes it.
  PlanJob odd = tiny_job(2, 8);
  odd.global_batch = 7;
  r = search_layouts(odd, everything(), size_t{1} << 40, cal);
  ASSERT_FALSE(r.ranked.empty());
  for (const RankedLayout& x : r.ranked) EXPECT_EQ(x.layout.dp, 1) << x.layout.describe();
  EXPECT_TRUE(std::any_of(r.rejected.begin(), r.rejected.end(),
                          [](const std::string& w) { return w.find("do not divide train_batch_size 7") != std::string::npos; }));
}

// parallel.partition "time": the engine measures a block's and the rest's time at start-up and cuts
// to balance them; the plan cuts the same way with the cost model's times. Four blocks over two
// stages with the rest (final norm, head, loss) between one and three blocks' time: three blocks
// on the first stage, one with the rest on the second; "uniform" splits two and two.
TEST(Search, APipelineCutByTimeBalancesTheCostModelsTimes) {
  PlanJob job = tiny_job(2, 8);
  job.memory.model.n_layer = 4;
  job.memory.model.vocab_size = 1024;
  job.base = Layout{.dp = 1, .pp = 2, .stage = 0, .micro_batch = 1, .accumulation = 8};
  const Calibration cal = hand_calibration(2);
  StepShape shape{.model = job.memory.model, .micro_batch = 1, .seq_length = job.memory.seq_length};
  const ZeroStepCosts c = zero_step_costs(shape, cal);
  const double block = c.forward[1] + c.backward[1], rest = c.forward[5] + c.backward[5] + c.head_backward;
  ASSERT_GT(rest, 1.2 * block);
  ASSERT_LT(rest, 2.8 * block);
  job.partition = "time";
  EXPECT_EQ(predict_layout(job, job.base, cal).bounds, (std::vector<int>{0, 3, 4}));
  job.partition = "uniform";
  EXPECT_EQ(predict_layout(job, job.base, cal).bounds, (std::vector<int>{0, 2, 4}));
  job.base.pp = 1;
  job.base.dp = 2;
  job.base.accumulation = 4;
  EXPECT_TRUE(predict_layout(job, job.base, cal).bounds.empty());
}

// The executor sends a chunk's f32 residual stream to the next stage: under sequence parallelism a
// tp rank holds, and sends, its N/tp rows of it (TransformerLM::boundary_numel). With the messages
// the only priced thing, the step is the critical path's messages, so halving each halves the step.
TEST(Search, APipelinesMessageUnderSequenceParallelismIsTheRanksRows) {
  PlanJob job = tiny_job(4, 4);
  job.memory.model = models::tiny(models::Arch::kLlama);  // untied: no embedding exchange between the ends
  job.memory.model.vocab_size = 128;
  job.base = Layout{.dp = 1, .tp = 2, .pp = 2, .stage = 0, .micro_batch = 1, .accumulation = 4};
  Calibration cal;
  cal.world = 4;
  for (const char* f : {"gemm f32", "gemm bf16", "memory", "adamw", "all_reduce", "all_gather", "reduce_scatter"})
    cal.fits[f] = {0.0, 0.0};
  const double per_byte = 1e-3;  // a message of 4 B T C = 2048 bytes: 2.048 s
  cal.fits["send_recv"] = {0.0, per_byte};
  const double message = 4.0 * job.memory.seq_length * job.memory.model.hidden * per_byte;
  const double whole = predict_layout(job, job.base, cal).step;
  job.base.sequence_parallel = true;
  const double rows = predict_layout(job, job.base, cal).step;
  // 1F1B over 2 stages, 4 micro-batches, free compute: the first stage sends activation i + 1
  // while the last returns gradient i, so the step is the first activation and then four pairs
  // side by side, (m + 1) messages.
  EXPECT_NEAR(whole, 5 * message, 1e-9);
  EXPECT_NEAR(rows, 5 * message / 2, 1e-9);
}

// Where no cores are shared, or all the processes share one host's (DESIGN-NOTES 132), every
// data-parallel replica (and every tp rank of a ZeRO step) runs the same list at the same times, so
// the search simulates one (ZeroStepSpec::one_rank, PipelineStepSpec::one_replica), standing for
// all on the host. Every layout of 8 processes, GPT-2 (tied: the pipelines' table exchange) and
// LLaMA, 1F1B and interleaved, ZeRO 0-3, recompute, every split, cores of their own or 2 for the 8:
// the same steps, with and without progress, as the whole program's.
TEST(Search, OneReplicaStandsForAllWhereNothingSetsThemApart) {
  const Calibration cal = priced_calibration();
  size_t compared = 0;
  for (models::Arch arch : {models::Arch::kGpt2, models::Arch::kLlama})
    for (auto kind : {parallel::pp::ScheduleKind::k1F1B, parallel::pp::ScheduleKind::kInterleaved})
    for (double cores : {0.0, 2.0}) {  // cores of their own, or the 8 processes on one host of 2
      PlanJob job = eight_process_job(arch, kind, 16);
      job.host_cores = cores;
      job.threads = cores > 0 ? 2 : 1;  // 8 processes of 2 threads on 2 cores
      const SearchResult one = search_layouts(job, everything(), size_t{1} << 40, cal);
      job.whole_program = true;
      const SearchResult whole = search_layouts(job, everything(), size_t{1} << 40, cal);
      ASSERT_EQ(one.ranked.size(), whole.ranked.size());
      for (size_t i = 0; i < one.ranked.size(); ++i) {
        const Layout& l = one.ranked[i].layout;
        ASSERT_EQ(l.describe(), whole.ranked[i].layout.describe());
        EXPECT_NEAR(one.ranked[i].prediction.step, whole.ranked[i].prediction.step, 1e-12 * whole.ranked[i].prediction.step)
            << l.describe();
        EXPECT_NEAR(one.ranked[i].prediction.step_progress, whole.ranked[i].prediction.step_progress,
                    1e-12 * whole.ranked[i].prediction.step_progress)
            << l.describe();
        compared += (l.dp > 1 || l.tp > 1) ? 1 : 0;
      }
    }
  EXPECT_GT(compared, 100u);  // layouts where the whole program has more than one replica
}

// 8 processes at B 2 of 1,024 samples a step (64 to 512 micro-batches a rank) on `cores` shared
// cores (0: cores of their own), `threads` threads each; searched with the batch and the schedule kept.
PlanJob many_micro_batches_job(models::Arch arch, parallel::pp::ScheduleKind kind, double cores, int threads) {
  PlanJob job = eight_process_job(arch, kind, 1024);
  job.host_cores = cores;
  job.threads = threads;
  job.base.micro_batch = 2;
  return job;
}

SearchSpace batch_kept() {
  SearchSpace space = everything();
  space.batch = false;
  space.schedule = false;
  return space;
}

// The same over many micro-batches on shared cores, where the replicas of a stage of the whole
// program had parted: the first to end at an event advanced the host's clock, and the second,
// tested against the advanced clock, could end a rounding later, so their timelines differed (here
// by up to 5e-13 of the step; by 4e-5 over 2,048 micro-batches of 64 processes, DESIGN-NOTES 134).
// With every host's clock brought to the event first, the replicas end together, and one replica's
// step is the whole program's to the last bit.
TEST(Search, OneReplicaStandsForAllOverManyMicroBatches) {
  const Calibration cal = priced_calibration();
  size_t compared = 0;
  for (models::Arch arch : {models::Arch::kGpt2, models::Arch::kLlama})
    for (auto kind : {parallel::pp::ScheduleKind::k1F1B, parallel::pp::ScheduleKind::kGPipe,
                      parallel::pp::ScheduleKind::kInterleaved}) {
      PlanJob job = many_micro_batches_job(arch, kind, 3.0, 2);  // 8 processes of 2 threads on 3 cores
      const SearchSpace space = batch_kept();
      const SearchResult one = search_layouts(job, space, size_t{1} << 40, cal);
      job.whole_program = true;
      const SearchResult whole = search_layouts(job, space, size_t{1} << 40, cal);
      ASSERT_EQ(one.ranked.size(), whole.ranked.size());
      std::map<std::string, Prediction> by_name;
      for (const RankedLayout& x : whole.ranked) by_name[x.layout.describe()] = x.prediction;
      for (const RankedLayout& x : one.ranked) {
        const Layout& l = x.layout;
        if (l.pp == 1 || l.dp == 1) continue;  // a pipeline of several replicas
        ASSERT_TRUE(by_name.count(l.describe())) << l.describe();
        EXPECT_EQ(x.prediction.step, by_name[l.describe()].step) << l.describe();
        EXPECT_EQ(x.prediction.step_progress, by_name[l.describe()].step_progress) << l.describe();
        ++compared;
      }
    }
  EXPECT_GT(compared, 60u);
}

// A data-parallel step of many micro-batches is read off the line through steps of fewer
// (time_one, DESIGN-NOTES 129): every layout of 8 processes with 64-512 micro-batches a rank, GPT-2
// and LLaMA, ZeRO 0-3, recompute, tp with and without sp, cores of their own or 2 shared: the same
// step, with and without progress, and the same compute, communication and waits, as simulating
// every one. Pipelines (1F1B, GPipe, interleaved) are simulated whole, and their figures are the
// same too.
TEST(Search, ManyMicroBatchesAreTheSteadyStatesLine) {
  const Calibration cal = priced_calibration();
  size_t read_off = 0, cases = 0;
  for (models::Arch arch : {models::Arch::kGpt2, models::Arch::kLlama})
    for (auto kind : {parallel::pp::ScheduleKind::k1F1B, parallel::pp::ScheduleKind::kGPipe,
                      parallel::pp::ScheduleKind::kInterleaved})
      for (double cores : {0.0, 2.0}) {
        PlanJob job = many_micro_batches_job(arch, kind, cores, 1);
        const SearchSpace space = batch_kept();
        const SearchResult line = search_layouts(job, space, size_t{1} << 40, cal);
        job.every_micro_batch = true;
        const SearchResult every = search_layouts(job, space, size_t{1} << 40, cal);
        ASSERT_EQ(line.ranked.size(), every.ranked.size());
        ++cases;
        std::map<std::string, Prediction> whole;
        for (const RankedLayout& x : every.ranked) {
          EXPECT_EQ(x.prediction.steady_from, 0);
          whole[x.layout.describe()] = x.prediction;
        }
        for (const RankedLayout& x : line.ranked) {
          const std::string name = x.layout.describe();
          const std::string where = name + ", cores " + std::to_string(cores) + ", arch " + std::to_string(static_cast<int>(arch));
          ASSERT_TRUE(whole.count(name)) << where;
          const Prediction& a = x.prediction;
          const Prediction& b = whole[name];
          const double tol = 1e-9 * b.step;
          EXPECT_NEAR(a.step, b.step, tol) << where;
          EXPECT_NEAR(a.step_progress, b.step_progress, tol) << where;
          EXPECT_NEAR(a.compute, b.compute, tol) << where;
          EXPECT_NEAR(a.comm, b.comm, tol) << where;
          EXPECT_NEAR(a.blocked, b.blocked, tol) << where;
          EXPECT_NEAR(a.streams, b.streams, tol) << where;
          EXPECT_NEAR(a.tokens_per_s, b.tokens_per_s, 1e-9 * b.tokens_per_s) << where;
          EXPECT_EQ(a.memory, b.memory) << where;
          // From 80 micro-batches a data-parallel step is read off the line; a pipeline's queues
          // settle late, so every one of its micro-batches is simulated.
          EXPECT_EQ(a.steady_from > 0, x.layout.pp == 1 && x.layout.accumulation >= 80) << where;
          if (a.steady_from > 0) ++read_off;
        }
      }
  EXPECT_EQ(cases, 12u);
  EXPECT_GT(read_off, 100u) << read_off;  // the line, not the fallback, gave the data-parallel ones
}

// A pipeline's schedule is searched: with free messages the bubble is the only thing between the
// schedules, (p - 1)/(v·m + p - 1) of the passes (Simulator.PipelineBubbleIsTheFormula), so
// interleaving over more chunks is faster, and the search ranks 8 layers over 2 stages by it: 4
// chunks a rank first, 1F1B last. Each step is the
// one the configuration with that schedule predicts. Not searched, every pipeline takes the
// configuration's schedule.
TEST(Search, APipelinesScheduleIsSearchedAndInterleavingShrinksTheBubble) {
  PlanJob job = tiny_job(2, 8);
  job.memory.model = models::tiny(models::Arch::kLlama);
  job.memory.model.n_layer = 8;
  job.base = Layout{.dp = 1, .pp = 2, .stage = 0, .micro_batch = 1, .accumulation = 8};
  Calibration cal = hand_calibration(2);
  cal.fits["send_recv"] = {0.0, 0.0};
  SearchSpace space;
  space.schedule = true;
  const SearchResult r = search_layouts(job, space, size_t{1} << 40, cal);
  ASSERT_EQ(r.ranked.size(), 4u);  // 1F1B and 2, 3, 4 chunks a rank
  std::vector<int> order;
  for (const RankedLayout& x : r.ranked) order.push_back(x.layout.virtual_stages);
  EXPECT_EQ(order.front(), 4);
  EXPECT_EQ(order.back(), 1);
  EXPECT_EQ(r.ranked.back().layout.schedule, parallel::pp::ScheduleKind::k1F1B);
  EXPECT_EQ(r.ranked.front().layout.describe(), "dp 1, pp 2 interleaved x 4, ZeRO 0, B 1 x 8 micro-batches");
  double by_v[5] = {};
  for (const RankedLayout& x : r.ranked) {
    by_v[x.layout.virtual_stages] = x.prediction.step;
    PlanJob configured = job;
    configured.schedule_kind = x.layout.schedule;
    configured.virtual_stages = x.layout.virtual_stages;
    configured.base.schedule = x.layout.schedule;
    configured.base.virtual_stages = x.layout.virtual_stages;
    EXPECT_DOUBLE_EQ(predict_layout(configured, configured.base, cal).step, x.prediction.step) << x.layout.describe();
  }
  EXPECT_GT(by_v[1], by_v[2]);
  EXPECT_GT(by_v[2], by_v[4]);
  // Not searched: the configuration's schedule only.
  const SearchResult fixed = search_layouts(job, SearchSpace{}, size_t{1} << 40, cal);
  ASSERT_EQ(fixed.ranked.size(), 1u);
  EXPECT_EQ(fixed.ranked[0].layout.virtual_stages, 1);
  job.schedule_kind = parallel::pp::ScheduleKind::kInterleaved;
  job.virtual_stages = 2;
  const SearchResult two = search_layouts(job, SearchSpace{}, size_t{1} << 40, cal);
  ASSERT_EQ(two.ranked.size(), 1u);
  EXPECT_EQ(two.ranked[0].layout.virtual_stages, 2);
  EXPECT_DOUBLE_EQ(two.ranked[0].prediction.step, by_v[2]);
}

// Sequence parallelism is searched with the layout (tp > 1): on, a tp rank keeps its N/tp rows of
// the norms and residual stream, so its activations are smaller, and each layout's figures are the
// ones a configuration with that setting predicts. partition_activations turns it on whatever
// parallel says (DeepSpeed's key), so the search then keeps it on.
TEST(Search, SequenceParallelismIsSearchedWithTensorParallelism) {
  PlanJob job = tiny_job(2, 8);
  job.memory.model = models::tiny(models::Arch::kLlama);
  job.base = Layout{.dp = 1, .tp = 2, .stage = 1, .micro_batch = 8};
  const Calibration cal = hand_calibration(2);
  SearchSpace space;
  space.parallel = true;
  const SearchResult r = search_layouts(job, space, size_t{1} << 40, cal);
  const RankedLayout* on = nullptr;
  const RankedLayout* off = nullptr;
  for (const RankedLayout& x : r.ranked) {
    if (x.layout.tp != 2) continue;
    (x.layout.sequence_parallel ? on : off) = &x;
    EXPECT_DOUBLE_EQ(x.prediction.step, predict_layout(job, x.layout, cal).step) << x.layout.describe();
    EXPECT_EQ(x.prediction.memory, predict_layout(job, x.layout, cal).memory) << x.layout.describe();
  }
  ASSERT_NE(on, nullptr);
  ASSERT_NE(off, nullptr);
  EXPECT_EQ(on->layout.describe(), "dp 1, tp 2 sp, ZeRO 1, B 8");
  EXPECT_LT(on->prediction.memory, off->prediction.memory);
  job.sequence_parallel_forced = true;
  for (const RankedLayout& x : search_layouts(job, space, size_t{1} << 40, cal).ranked)
    EXPECT_TRUE(x.layout.tp == 1 || x.layout.sequence_parallel) << x.layout.describe();
}

// Ulysses (parallel.sp) is searched beside dp, tp and pp where the runtime runs it (with tp and pp since stop 80):
// a family of its own, its predictions predict_layout's, its ZeRO group dp x sp (the optimizer's
// shard of a dp 1, Ulysses 2 layout is a dp 2 one's); what the configuration keeps it from is
// named among the rejected, and so are sp sizes that do not divide the heads.
TEST(Search, UlyssesIsSearchedWhereTheRuntimeRunsIt) {
  PlanJob job = tiny_job(2, 8);
  job.memory.model = models::tiny(models::Arch::kLlama);
  job.memory.model.n_kv_head = 2;
  Calibration cal = hand_calibration(2);
  cal.fits["all_to_all"] = {0.0, 1e-9};
  SearchSpace space;
  space.parallel = space.stage = true;
  const SearchResult r = search_layouts(job, space, size_t{1} << 40, cal);
  const RankedLayout* ulysses = nullptr;
  const RankedLayout* dp = nullptr;
  for (const RankedLayout& x : r.ranked) {
    if (x.layout.stage != 1) continue;
    if (x.layout.usp == 2) ulysses = &x;
    if (x.layout.dp == 2) dp = &x;
  }
  ASSERT_NE(ulysses, nullptr);
  ASSERT_NE(dp, nullptr);
  EXPECT_EQ(ulysses->layout.describe(), "dp 1, Ulysses 2, ZeRO 1, B 4 x 2 micro-batches");
  EXPECT_DOUBLE_EQ(ulysses->prediction.step, predict_layout(job, ulysses->layout, cal).step);
  EXPECT_EQ(ulysses->prediction.memory, predict_layout(job, ulysses->layout, cal).memory);
  MemoryInput in = job.memory;
  in.world = 2;
  in.usp = 2;
  in.micro_batch = 4;
  MemoryInput plain = job.memory;
  plain.world = 2;
  plain.micro_batch = 4;
  EXPECT_EQ(estimate_stage(in, 1).ours[MemCategory::kOptimizer], estimate_stage(plain, 1).ours[MemCategory::kOptimizer]);
  EXPECT_THROW(check_layout(job, Layout{.dp = 1, .tp = 2, .stage = 1, .micro_batch = 4, .accumulation = 2, .usp = 2}), Error);
  {  // With tp and pp (stop 80): 4 ranks of the 4-head GPT-2 search tp 2 x Ulysses 2 and pp 2 x Ulysses 2.
    PlanJob four = tiny_job(4, 8);
    Calibration cal4 = hand_calibration(4);
    cal4.fits["all_to_all"] = {0.0, 1e-9};
    const SearchResult r4 = search_layouts(four, space, size_t{1} << 40, cal4);
    const RankedLayout* both = nullptr;
    for (const RankedLayout& x : r4.ranked)
      if (x.layout.tp == 2 && x.layout.usp == 2 && x.layout.stage == 1 && !x.layout.sequence_parallel) both = &x;
    ASSERT_NE(both, nullptr);
    EXPECT_EQ(both->layout.describe(), "dp 1, Ulysses 2, tp 2, ZeRO 1, B 2 x 4 micro-batches");
    const Prediction p = predict_layout(four, both->layout, cal4);
    EXPECT_DOUBLE_EQ(both->prediction.step, p.step);
    // The program's sp groups are the tp-strided ranks {0, 2} and {1, 3}; its all-to-alls cost time.
    Layout no_a2a = both->layout;
    cal4.fits["all_to_all"] = {0.0, 0.0};
    EXPECT_GT(p.step, predict_layout(four, no_a2a, cal4).step);
    cal4.fits["all_to_all"] = {0.0, 1e-9};
    // And with pp: 2 stages of sp 2, predicted as every pipeline is.
    const RankedLayout* piped = nullptr;
    for (const RankedLayout& x : r4.ranked)
      if (x.layout.pp == 2 && x.layout.usp == 2 && x.layout.stage == 1) piped = &x;
    ASSERT_NE(piped, nullptr);
    EXPECT_EQ(piped->layout.describe(), "dp 1, Ulysses 2, pp 2, ZeRO 1, B 2 x 4 micro-batches");
    EXPECT_DOUBLE_EQ(piped->prediction.step, predict_layout(four, piped->layout, cal4).step);
    four.memory.model.n_head = 2;  // 2 heads over tp 2 x sp 2
    four.memory.model.n_kv_head = 2;
    EXPECT_THROW(check_layout(four, both->layout), Error);
  }
  job.ulysses_refused = "task \"classification\"";
  const SearchResult refused = search_layouts(job, space, size_t{1} << 40, cal);
  for (const RankedLayout& x : refused.ranked) EXPECT_EQ(x.layout.usp, 1) << x.layout.describe();
  EXPECT_NE(std::find(refused.rejected.begin(), refused.rejected.end(),
                      "dp 1, Ulysses 2: Ulysses with task \"classification\" is not implemented"),
            refused.rejected.end());
  job.ulysses_refused.clear();
  job.memory.model.n_kv_head = 1;
  const SearchResult odd = search_layouts(job, space, size_t{1} << 40, cal);
  EXPECT_NE(std::find(odd.rejected.begin(), odd.rejected.end(),
                      "dp 1, Ulysses 2: Ulysses does not divide seq_length, or tp x sp the heads and the kv heads"),
            odd.rejected.end());
}

// A 1-bit optimizer runs at ZeRO stage 0 without tp or pp (the runtime refuses the rest): the
// search ranks only those layouts, names the families it rejects and why, and counts the
// exchange's error buffers in each layout's memory.
TEST(Search, OneBitOptimizersAreSearchedAtStageZeroWithoutTpOrPp) {
  PlanJob job = tiny_job(2, 8);
  job.memory.onebit = MemoryInput::OneBit::kPerTensor;
  const Calibration cal = hand_calibration(2);
  const SearchResult r = search_layouts(job, everything(), size_t{1} << 40, cal);
  ASSERT_FALSE(r.ranked.empty());
  for (const RankedLayout& x : r.ranked) {
    EXPECT_EQ(x.layout.stage, 0) << x.layout.describe();
    EXPECT_EQ(x.layout.tp * x.layout.pp, 1) << x.layout.describe();
  }
  int named = 0;
  for (const std::string& why : r.rejected) named += why.find("1-bit optimizers take no tp or pp") != std::string::npos;
  EXPECT_GE(named, 2) << "tp 2 and pp 2";  // dp 1 x tp 2, dp 1 x pp 2
  PlanJob plain = job;
  plain.memory.onebit = MemoryInput::OneBit::kNone;
  EXPECT_GT(r.ranked.front().prediction.memory, predict_layout(plain, r.ranked.front().layout, cal).memory);
}

// 0/1 Adam's steps differ by kind (PlanJob::update_mix): the prediction is their mean, each kind's
// step simulated as its own (here on two ranks: a quarter variance steps, AdamW's with the
// all-reduce, and three quarters local steps, which all-reduce the overflow flag alone); memory is
// the job's.
TEST(Search, StepsThatDifferByKindArePredictedAsTheirMean) {
  PlanJob job = tiny_job(2, 8);
  job.memory.onebit = MemoryInput::OneBit::kPerTensor;
  job.memory.optimizer_states = 3;
  Calibration cal = hand_calibration(2);
  cal.fits["zerooneadam local"] = {0.0, 5e-7};
  const Layout l = job.base;
  const Prediction variance = predict_layout(job, l, cal);
  PlanJob local_job = job;
  local_job.update = UpdateKind::kZeroOneLocal;
  const Prediction local = predict_layout(local_job, l, cal);
  EXPECT_NE(local.step, variance.step);
  EXPECT_DOUBLE_EQ(local.comm, 4e-9);  // the overflow flag's all-reduce alone (4 bytes at 1e-9 s a byte)
  EXPECT_GT(variance.comm, 0.0);
  job.update_mix = {{UpdateKind::kAdamW, 0.25}, {UpdateKind::kZeroOneLocal, 0.75}};
  const Prediction mean = predict_layout(job, l, cal);
  EXPECT_DOUBLE_EQ(mean.step, 0.25 * variance.step + 0.75 * local.step);
  EXPECT_DOUBLE_EQ(mean.comm, 0.25 * variance.comm + 0.75 * local.comm);
  EXPECT_DOUBLE_EQ(mean.tokens_per_s, 8.0 * 16 / mean.step);
  EXPECT_EQ(mean.memory, variance.memory);
  job.update_mix = {{UpdateKind::kAdamW, 0.25}, {UpdateKind::kZeroOneLocal, 0.5}};  // shares short of 1
  EXPECT_THROW(predict_layout(job, l, cal), Error);
}

// Lamb's per-tensor trust ratio takes whole tensors: the runtime refuses it at ZeRO 1-3
// (ds_config's parse_zero), so the search keeps it at stage 0. It ranked ZeRO 1-2 layouts for a
// Lamb configuration, and plan --validate's first of them failed to start.
TEST(Search, LambIsSearchedAtStageZeroOnly) {
  PlanJob job = tiny_job(2, 8);
  const Calibration cal = hand_calibration(2);
  const SearchResult adamw = search_layouts(job, everything(), size_t{1} << 40, cal);
  EXPECT_TRUE(std::any_of(adamw.ranked.begin(), adamw.ranked.end(), [](const RankedLayout& x) { return x.layout.stage > 0; }));
  job.update = UpdateKind::kLamb;
  const SearchResult r = search_layouts(job, everything(), size_t{1} << 40, cal);
  ASSERT_FALSE(r.ranked.empty());
  for (const RankedLayout& x : r.ranked) EXPECT_EQ(x.layout.stage, 0) << x.layout.describe();
}

// A rejected family is named as its layouts are: "sp" beside tp, the schedule beside pp (the
// device lease of 2026-11-27 printed "tp 2, pp 2 sp interleaved x 2").
// What the runtime refuses of a configuration is not ranked, and each family or stage it takes out
// is named: tp, pp or ZeRO 1-3 over several GPUs, ZeRO 0 with 16-bit master weights. The search
// ranked them, and a run of one failed. A pipeline with curriculum learning runs since stop 75
// and is ranked.
TEST(Search, WhatTheRuntimeRefusesIsRejectedAndNamed) {
  const Calibration cal = hand_calibration(2);
  SearchSpace space;
  space.parallel = space.stage = true;
  auto rejected = [](const SearchResult& r, const std::string& what) {
    return std::any_of(r.rejected.begin(), r.rejected.end(), [&](const std::string& w) { return w.find(what) != std::string::npos; });
  };
  PlanJob job = tiny_job(2, 8);
  job.curriculum = true;
  SearchResult r = search_layouts(job, space, size_t{1} << 40, cal);
  ASSERT_FALSE(r.ranked.empty());
  EXPECT_TRUE(std::any_of(r.ranked.begin(), r.ranked.end(), [](const RankedLayout& x) { return x.layout.pp == 2; }));
  EXPECT_FALSE(rejected(r, "curriculum_learning"));
  // Ulysses with it (stop 80): ranked where sp divides every length, else named.
  EXPECT_TRUE(std::any_of(r.ranked.begin(), r.ranked.end(), [](const RankedLayout& x) { return x.layout.usp == 2; }));
  job.curriculum_gcd = 3;  // lengths 9, 12, 15, ...
  r = search_layouts(job, space, size_t{1} << 40, cal);
  for (const RankedLayout& x : r.ranked) EXPECT_EQ(x.layout.usp, 1) << x.layout.describe();
  EXPECT_TRUE(rejected(r, "dp 1, Ulysses 2: Ulysses does not divide every length of the curriculum"));
  job = tiny_job(2, 8);
  job.cuda_replicas = true;
  r = search_layouts(job, space, size_t{1} << 40, cal);
  ASSERT_FALSE(r.ranked.empty());
  for (const RankedLayout& x : r.ranked) {
    EXPECT_EQ(x.layout.dp, 2) << x.layout.describe();
    EXPECT_EQ(x.layout.stage, 0) << x.layout.describe();
  }
  EXPECT_TRUE(rejected(r, "dp 1, tp 2: tp and pp are not implemented on device \"cuda\""));
  job = tiny_job(2, 8);
  job.sixteen_bit_master = true;
  r = search_layouts(job, space, size_t{1} << 40, cal);
  ASSERT_FALSE(r.ranked.empty());
  for (const RankedLayout& x : r.ranked) EXPECT_GE(x.layout.stage, 1) << x.layout.describe();
}

TEST(Search, ARejectedFamilyIsNamedAsItsLayoutsAre) {
  PlanJob job = tiny_job(4, 8);
  job.memory.model = models::tiny(models::Arch::kLlama);
  job.memory.model.n_layer = 4;  // pp 2 with 2 chunks a rank
  job.base = Layout{.dp = 1, .tp = 2, .pp = 2, .stage = 0, .micro_batch = 1, .accumulation = 8};
  const Calibration cal = hand_calibration(4);
  const SearchResult r = search_layouts(job, everything(), 1, cal);  // a byte: every family over the budget
  EXPECT_TRUE(r.ranked.empty());
  bool named = false;
  for (const std::string& why : r.rejected) {
    EXPECT_EQ(why.find("pp 2 sp"), std::string::npos) << why;
    if (why.rfind("dp 1, tp 2 sp, pp 2 interleaved x 2, ZeRO 0:", 0) == 0) named = true;
  }
  EXPECT_TRUE(named);
}

// The search estimates every layout's memory on the process's threads, then ranks, rejects and
// names them in order: on one thread or four, the same layouts, figures and rejections in the same
// order, and each layout's memory the one predict_layout gives it alone. Among the rejections, what
// the runtime refuses: pp 8 over 4 layers at every micro-batch size (the family's), and the
// interleaved schedule at one micro-batch a step, B 16 alone of dp 4's sizes (named with it: the
// family's other sizes are ranked).
TEST(Search, TheThreadsChangeNothing) {
  const PlanJob job = eight_process_job(models::Arch::kLlama, parallel::pp::ScheduleKind::k1F1B, 64);
  const Calibration cal = priced_calibration();
  struct Threads {  // the process's thread count again at the end, whatever fails
    int was = omp_get_max_threads();
    ~Threads() { omp_set_num_threads(was); }
  } restore;
  // Four threads first, while the schedule caches are cold for this job.
  omp_set_num_threads(4);
  const SearchResult all = search_layouts(job, everything(), size_t{1} << 40, cal);
  ASSERT_GT(all.ranked.size(), 20u);
  std::vector<size_t> memory;
  for (const RankedLayout& x : all.ranked) memory.push_back(x.prediction.memory);
  std::nth_element(memory.begin(), memory.begin() + memory.size() / 2, memory.end());
  const size_t budget = memory[memory.size() / 2];  // about half over it
  const SearchResult four = search_layouts(job, everything(), budget, cal);
  omp_set_num_threads(1);
  const SearchResult one = search_layouts(job, everything(), budget, cal);
  EXPECT_EQ(one.considered, four.considered);
  EXPECT_EQ(one.rejected, four.rejected);
  EXPECT_TRUE(std::any_of(one.rejected.begin(), one.rejected.end(),
                          [](const std::string& why) { return why.rfind("dp 1, pp 8: the model has 4 layer(s)", 0) == 0; }));
  EXPECT_TRUE(std::any_of(one.rejected.begin(), one.rejected.end(), [](const std::string& why) {
    return why.rfind("dp 4, pp 2 interleaved x 2, B 16: the interleaved schedule", 0) == 0 &&
           why.find("gradient_accumulation_steps (1) must be a multiple of parallel.pp (2)") != std::string::npos;
  }));
  EXPECT_TRUE(std::any_of(one.ranked.begin(), one.ranked.end(), [](const RankedLayout& x) {
    return x.layout.dp == 4 && x.layout.pp == 2 && x.layout.schedule == parallel::pp::ScheduleKind::kInterleaved;
  }));
  EXPECT_TRUE(std::any_of(one.rejected.begin(), one.rejected.end(),
                          [](const std::string& why) { return why.find("over the budget") != std::string::npos; }));
  ASSERT_EQ(one.ranked.size(), four.ranked.size());
  ASSERT_LT(one.ranked.size(), all.ranked.size());
  for (size_t i = 0; i < one.ranked.size(); ++i) {
    const RankedLayout &a = one.ranked[i], &b = four.ranked[i];
    EXPECT_EQ(a.layout.describe(), b.layout.describe()) << i;
    EXPECT_EQ(a.prediction.step, b.prediction.step) << a.layout.describe();
    EXPECT_EQ(a.prediction.memory, b.prediction.memory) << a.layout.describe();
    EXPECT_EQ(a.prediction.memory_by_stage, b.prediction.memory_by_stage) << a.layout.describe();
    EXPECT_EQ(b.prediction.memory, predict_layout(job, b.layout, cal).memory) << b.layout.describe();
  }
}

}  // namespace
}  // namespace mt::planner
