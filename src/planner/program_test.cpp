// ZeRO step programs (planner/program.h) on hand-computable costs: the schedule's own decisions,
// timed by the simulator, give the step the timeline written out in each test.
#include "planner/program.h"

#include <gtest/gtest.h>

#include <string>

#include "base/error.h"

namespace mt::planner {
namespace {

// Three units of 1000 elements, an untied head (its backward hooks are the last unit's).
ZeroStepSpec three_units(int stage, bool overlap) {
  ZeroStepSpec s;
  for (int i = 0; i < 3; ++i) {
    parallel::Unit u;
    u.name = std::string(1, static_cast<char>('a' + i));
    u.offset = 1000 * i;
    u.numel = 1000;
    s.units.push_back(u);
  }
  s.world = 2;
  s.tied_head = false;
  s.schedule.stage = stage;
  s.schedule.overlap_comm = overlap;
  s.schedule.persistence_threshold = 0;
  s.schedule.prefetch_elems = 0;
  return s;
}

ZeroStepCosts costs(double f, double b, double gather, double reduce) {
  ZeroStepCosts c;
  c.forward.assign(3, f);
  c.backward.assign(3, b);
  c.all_gather = [gather](double bytes) {
    EXPECT_EQ(bytes, 2000.0);  // 500 elements a rank, 4 bytes each
    return gather;
  };
  c.reduce_scatter = [reduce](double) { return reduce; };
  return c;
}

// Stage 2, overlap_comm: the head's and the last unit's backward share one slab, reduced once when
// the backward moves on (it was reduced after each use, the first one waited for at once: stop 74);
// every reduction but the last hides behind the next unit's backward, the last one is waited for
// by finish_backward, and the refresh gathers the three views one after another.
TEST(ZeroProgram, Stage2OverlapHidesEachReductionBehindTheNextBackward) {
  const double f = 1, b = 2, R = 0.5, G = 0.25;
  SimProgram p = zero_step_program(three_units(2, true), costs(f, b, G, R));
  ASSERT_EQ(p.ranks.size(), 2u);
  SimReport r = simulate(p);
  ASSERT_FALSE(r.deadlock) << r.where;
  EXPECT_DOUBLE_EQ(r.makespan, 3 * f + 3 * b + R + 3 * G);
  EXPECT_DOUBLE_EQ(r.compute[0], 3 * f + 3 * b);

  // Without progress (MPI moves a nonblocking collective only inside its wait), every reduction
  // costs its whole time.
  SimOptions o;
  o.progress = false;
  SimReport s = simulate(p, o);
  EXPECT_DOUBLE_EQ(s.makespan, 3 * f + 3 * b + 3 * R + 3 * G);
}

// Stage 3 without prefetch or overlap: every gather and reduction is waited for where it is made.
// The forward gathers 3 units, the head's backward the last one again, the backward all 3 (each
// freed after its use): 7 gathers and 3 reductions (the head's and its unit's backward share one),
// nothing persistent to refresh.
TEST(ZeroProgram, Stage3WithoutPrefetchWaitsForEveryGatherTheScheduleMakes) {
  const double f = 1, b = 2, R = 0.5, G = 0.25;
  SimReport r = simulate(zero_step_program(three_units(3, false), costs(f, b, G, R)));
  ASSERT_FALSE(r.deadlock) << r.where;
  EXPECT_DOUBLE_EQ(r.makespan, 3 * f + 3 * b + 7 * G + 3 * R);

  // With the prefetch, the next unit's gather runs under this unit's compute: of the forward's
  // gathers only the first is waited for.
  ZeroStepSpec pre = three_units(3, false);
  pre.schedule.prefetch_elems = 1000;
  SimReport q = simulate(zero_step_program(pre, costs(f, b, G, R)));
  EXPECT_LT(q.makespan, r.makespan - 2 * G + 1e-12);
  // Free collectives: the step is its compute.
  SimReport z = simulate(zero_step_program(pre, costs(f, b, 0, 0)));
  EXPECT_DOUBLE_EQ(z.makespan, 3 * f + 3 * b);
}

// ZeRO-3 with offload_param nvme on one rank, no prefetch, one sub-group a unit: the step before's
// optimizer thread writes sub-group i by O·(i+1) (16 bytes an element read, 12 written: 2.8 s
// each), a unit's piece is ready once the next sub-group is written (unit 0 at 5.6, units 1-2 at
// 8.4), read off the disk (0.4) before its pass; every reduction's record is written behind (0.4),
// at most two in flight, all before the step ends. By hand:
//   forward    unit 0: wait 5.6, read to 6.0, f to 7.0; unit 1: wait 8.4, read 8.8, f 9.8;
//              unit 2: read 9.8-10.2, f 11.2
//   head       unit 2 read again 11.2-11.6; its gradient stays in the slab (one reduction for the
//              unit's two uses, stop 74: its record was written here and read back below)
//   backward   unit 2: read 11.6-12.0, b 14.0; its record written -14.4 as unit 1 begins; unit 1:
//              read -14.8, b 16.8, write -17.2; unit 0: read -17.6, b 19.6, write -20.0; the step
//              waits for it.
TEST(ZeroProgram, OffloadedParametersWaitForTheOptimizersWritesAndReadTheirPieces) {
  ZeroStepSpec s = three_units(3, false);
  s.world = 1;
  s.param_nvme = true;
  s.sub_group_size = 1000;
  ZeroStepCosts c;
  c.forward.assign(3, 1.0);
  c.backward.assign(3, 2.0);
  c.all_gather = c.reduce_scatter = [](double) { return 0.0; };
  c.disk_read_per_byte = c.disk_write_per_byte = 1e-4;
  SimProgram p = zero_step_program(s, c);
  int optimizer_ops = 0;
  for (const SimOp& op : p.ranks[0]) optimizer_ops += op.kind == SimOpKind::kStream && op.stream == 2;
  EXPECT_EQ(optimizer_ops, 3);
  SimReport r = simulate(p);
  ASSERT_FALSE(r.deadlock) << r.where;
  EXPECT_NEAR(r.makespan, 20.0, 1e-9);
  EXPECT_NEAR(r.compute[0], 3 * 1.0 + 3 * 2.0, 1e-9);
  // Two micro-batches: the optimizer is done; the second reads every record back before adding
  // to it. Forward from 20.0: 3 x (0.4 + 1) to 24.2; head read -24.6; each unit's backward then
  // read 0.4, b 2, read back 0.4 (its write is done), write 0.4: 34.2.
  s.micro_batches = 2;
  SimReport two = simulate(zero_step_program(s, c));
  ASSERT_FALSE(two.deadlock) << two.where;
  EXPECT_NEAR(two.makespan, 34.2, 1e-9);
  // A disk that slows compute (k = 1e-5 s a byte): unit 0's first forward runs beside the optimizer's
  // third sub-group (28000 bytes in 2.8 s), at 1 / (1 + 0.1) speed: 1.1 s. The wait for unit 1's
  // piece absorbs it; the step's other passes run beside no transfer (each read is waited for
  // before its pass, and the writes queue ahead of the next read).
  c.disk_interference = 1e-5;
  s.micro_batches = 1;
  SimReport slowed = simulate(zero_step_program(s, c));
  EXPECT_NEAR(slowed.compute[0], 3 * 1.0 + 3 * 2.0 + 0.1, 1e-9);
  EXPECT_NEAR(slowed.makespan, 20.0, 1e-9);
}

// Stage 0 on two ranks, buckets of 1500 elements cut from the end: [1500, 3000) is launched at
// unit 1's post-backward hook (its offset 1000 is below the bucket), hides behind unit 0's
// backward, and [0, 1500) is launched and waited for at the backward's end.
TEST(ZeroProgram, Stage0BucketsLaunchWhereTheBackwardHasPassedThem) {
  ZeroStepSpec s = three_units(0, true);
  s.bucket_elems = 1500;
  ZeroStepCosts c = costs(1, 2, 0, 0);
  c.all_reduce = [](double bytes) {
    EXPECT_EQ(bytes, 6000.0);
    return 0.5;
  };
  SimReport r = simulate(zero_step_program(s, c));
  ASSERT_FALSE(r.deadlock) << r.where;
  EXPECT_DOUBLE_EQ(r.makespan, 3 * 1 + 3 * 2 + 0.5);
  s.schedule.overlap_comm = false;  // each bucket waited for where it is launched
  EXPECT_DOUBLE_EQ(simulate(zero_step_program(s, c)).makespan, 3 * 1 + 3 * 2 + 2 * 0.5);
  s.world = 1;  // one rank: nothing to reduce
  EXPECT_DOUBLE_EQ(simulate(zero_step_program(s, c)).makespan, 3 * 1 + 3 * 2);
}

// A 1-bit optimizer past its warm-up (costs.local_gradients, costs.onebit_exchange): no gradient
// all-reduce in the backward, the ranks' overflow flag all-reduced (4 bytes), the update over the
// whole buffer, then its momentum's compressed exchange of the buffer's 12000 f32 bytes, blocking.
// One rank: neither. (0/1 Adam's compressed-gradient steps
// and syncs are this program; its local steps exchange nothing.)
TEST(ZeroProgram, OneBitCompressedPhaseExchangesTheMomentumInsteadOfTheGradients) {
  ZeroStepSpec s = three_units(0, true);
  s.bucket_elems = 1500;
  ZeroStepCosts c = costs(1, 2, 0, 0);
  c.all_reduce = [](double bytes) { return bytes == 4.0 ? 0.01 : 0.5; };  // 4 bytes: the overflow flag
  c.optimizer_per_element = 0.0001;  // 3000 elements: 0.3
  c.local_gradients = true;
  c.onebit_exchange = [](double bytes) {
    EXPECT_EQ(bytes, 12000.0);
    return 0.25;
  };
  const SimProgram p = zero_step_program(s, c);
  for (const SimOp& op : p.ranks[0])
    if (op.kind == SimOpKind::kCollective) {
      EXPECT_TRUE(op.name == "overflow all_reduce" || op.name == "onebit exchange") << op.name;
    }
  SimReport r = simulate(p);
  ASSERT_FALSE(r.deadlock) << r.where;
  EXPECT_DOUBLE_EQ(r.makespan, 3 * 1 + 3 * 2 + 0.01 + 0.3 + 0.25);
  s.world = 1;
  EXPECT_DOUBLE_EQ(simulate(zero_step_program(s, c)).makespan, 3 * 1 + 3 * 2 + 0.3);
  // 0/1 Adam's local step (costs.local_gradients without an exchange): the passes, the overflow
  // flag's all-reduce and the update alone.
  s.world = 2;
  c.onebit_exchange = nullptr;
  const SimProgram local = zero_step_program(s, c);
  int collectives = 0;
  for (const SimOp& op : local.ranks[0]) collectives += op.kind == SimOpKind::kCollective;
  EXPECT_EQ(collectives, 1);
  EXPECT_DOUBLE_EQ(simulate(local).makespan, 3 * 1 + 3 * 2 + 0.01 + 0.3);
}

// Micro-batches: stage 2 reduces after every micro-batch's backward, the optimizer runs once.
TEST(ZeroProgram, AccumulationRepeatsThePassesAndStepsOnce) {
  ZeroStepSpec s = three_units(2, false);
  s.micro_batches = 2;
  ZeroStepCosts c = costs(1, 2, 0, 0);
  c.optimizer_per_element = 0.001;  // 1500 elements a rank
  SimReport r = simulate(zero_step_program(s, c));
  EXPECT_DOUBLE_EQ(r.makespan, 2 * (3 * 1 + 3 * 2) + 1.5);
  c.forward.pop_back();
  EXPECT_THROW(zero_step_program(s, c), Error);
}

// The ZeRO passes between the collectives, each at its own kernel's rate. Stage 3 without prefetch,
// bf16 compute, free compute and collectives: each of the 7 gathers converts its unit (4000 bytes
// of f32: 1.5 x 4000 bytes moved), each of the 3 slabs is zeroed (4000 bytes) and each of the 3
// reductions summed into the shard (500 elements; the head's unit gathers both its uses in one slab
// and one reduction since stop 74). Without those rates (older calibrations) each
// pass is its bytes at the memory rate: 1.5 x 4000, 4000 and 3 x 2000.
TEST(ZeroProgram, ConversionsZeroingAndSumsRunAtTheirOwnRates) {
  ZeroStepSpec s = three_units(3, false);
  s.low_precision = true;
  ZeroStepCosts c = costs(0, 0, 0, 0);
  c.memory_per_byte = 1e-6;
  const double mem = simulate(zero_step_program(s, c)).makespan;
  EXPECT_DOUBLE_EQ(mem, 1e-6 * (7 * 1.5 * 4000 + 3 * 4000 + 3 * 3 * 2000));
  c.convert_per_byte = 1e-3;
  c.zero_per_byte = 1e-5;
  c.sum_per_element = 1e-1;
  const double own = simulate(zero_step_program(s, c)).makespan;
  EXPECT_DOUBLE_EQ(own, 7 * 1e-3 * 1.5 * 4000 + 3 * 1e-5 * 4000 + 3 * 1e-1 * 500);
  // f32 compute binds the gathered unit itself: no conversion.
  s.low_precision = false;
  EXPECT_DOUBLE_EQ(simulate(zero_step_program(s, c)).makespan, 3 * 1e-5 * 4000 + 3 * 1e-1 * 500);
}

// One rank, stage 2: each unit's slab (4000 bytes) is zeroed, copied by its local reduction (4000
// bytes read and written) and summed into the shard (1000 elements), 3 times (the head's unit once
// for its two uses, stop 74). Within the cache the three passes run at the hot lines; a cache smaller than the slab
// leaves them at the cold ones.
TEST(ZeroProgram, OneRanksSlabPassesRunHotWhenTheSlabFitsTheCache) {
  ZeroStepSpec s = three_units(2, false);
  s.world = 1;
  ZeroStepCosts c = costs(0, 0, 0, 0);
  c.all_gather = [](double) { return 0.0; };                          // the refresh's, free here
  c.reduce_scatter = [](double bytes) { return 1e-6 * 2 * bytes; };  // one rank: a copy at the cold rate
  c.zero_per_byte = 1e-5;
  c.sum_per_element = 1e-4;
  const double cold = 3 * (1e-5 * 4000 + 1e-6 * 2 * 4000 + 1e-4 * 1000);
  EXPECT_DOUBLE_EQ(simulate(zero_step_program(s, c)).makespan, cold);
  c.hot_zero_per_byte = 1e-7;
  c.hot_copy_per_byte = 1e-8;
  c.hot_sum_per_element = 1e-6;
  c.cache_bytes = 4000;
  EXPECT_DOUBLE_EQ(simulate(zero_step_program(s, c)).makespan, 3 * (1e-7 * 4000 + 1e-8 * 2 * 4000 + 1e-6 * 1000));
  c.cache_bytes = 3999;
  EXPECT_DOUBLE_EQ(simulate(zero_step_program(s, c)).makespan, cold);
  // The weight gradients accumulated in a slab zeroed at the unit's hook within the cache: each
  // backward (1 s) saves what the costs say (0.25 s); a slab too large for the cache saves nothing.
  c.backward.assign(3, 1.0);
  c.hot_backward_saving.assign(3, 0.25);
  EXPECT_DOUBLE_EQ(simulate(zero_step_program(s, c)).makespan, cold + 3 * 1.0);
  c.cache_bytes = 4000;
  EXPECT_DOUBLE_EQ(simulate(zero_step_program(s, c)).makespan,
                   3 * 0.75 + 3 * (1e-7 * 4000 + 1e-8 * 2 * 4000 + 1e-6 * 1000));
  // Stage 1 keeps every slab from construction (not zeroed at the hooks): no saving.
  s.schedule.stage = 1;
  EXPECT_GT(simulate(zero_step_program(s, c)).makespan, 3 * 1.0);
}

// Units that are mostly GEMM weights (900 of 1000, 500 a rank) gather in the compute dtype
// (parallel::gathers_in_compute_dtype): each of the 7 gathers converts the rank's piece (2000 bytes
// of f32) into its place in the view, gathers it in bf16 (1000 bytes a rank), gathers the 100
// other elements in f32 (400 bytes a rank) and copies them out (400 bytes read and written). Stage
// 3 without prefetch waits for each at once.
TEST(ZeroProgram, MostlyGemmUnitsGatherInTheComputeDtype) {
  ZeroStepSpec s = three_units(3, false);
  for (parallel::Unit& u : s.units) u.matrix_numel = 900;
  s.low_precision = true;
  ZeroStepCosts c = costs(0, 0, 0, 0);
  c.all_gather = [](double bytes) {
    EXPECT_TRUE(bytes == 1000.0 || bytes == 400.0) << bytes;
    return 1e-6 * bytes;
  };
  c.convert_per_byte = 1e-3;
  c.copy_per_byte = 1e-4;
  EXPECT_TRUE(parallel::gathers_in_compute_dtype(s.units[0], 500, 2));
  EXPECT_DOUBLE_EQ(simulate(zero_step_program(s, c)).makespan,
                   7 * (1e-3 * 1.5 * 2000 + 1e-6 * 1000 + 1e-6 * 400 + 1e-4 * 2 * 400));
  // Where the other elements are half a piece or more, or on one rank, the unit is gathered in f32
  // and converted whole.
  EXPECT_FALSE(parallel::gathers_in_compute_dtype(s.units[0], 200, 5));
  EXPECT_FALSE(parallel::gathers_in_compute_dtype(s.units[0], 1000, 1));
  for (parallel::Unit& u : s.units) u.matrix_numel = 750;  // 2 x 250 = 500: not less than s
  c.all_gather = [](double bytes) {
    EXPECT_EQ(bytes, 2000.0);
    return 0.0;
  };
  EXPECT_DOUBLE_EQ(simulate(zero_step_program(s, c)).makespan, 7 * 1e-3 * 1.5 * 4000);
}

// Tensor parallelism: each pass makes its blocking tp collectives between pieces of its compute.
// One replica of two tp ranks at stage 0 (no dp reduction): every unit's forward 1 s with one
// 0.5 s collective, its backward 2 s with one of 0.25, the head's backward one of 0.1; the update
// (1e-3 s an element over 3000). Two replicas x two tp ranks: the dp groups join equal tp ranks,
// the tp groups each replica's ranks.
TEST(ZeroProgram, TensorParallelCollectivesBlockInsideEachPass) {
  ZeroStepSpec s = three_units(0, false);
  s.world = 1;
  s.tp = 2;
  ZeroStepCosts c = costs(1, 2, 0, 0);
  c.tp_forward.assign(3, {0.5});
  c.tp_backward.assign(3, {0.25});
  c.tp_head_backward = {0.1};
  c.optimizer_per_element = 1e-3;
  SimProgram p = zero_step_program(s, c);
  ASSERT_EQ(p.ranks.size(), 2u);
  EXPECT_EQ(p.groups, (std::vector<std::vector<int>>{{0}, {1}, {0, 1}}));
  SimReport r = simulate(p);
  EXPECT_NEAR(r.makespan, 3 * (1 + 0.5) + 0.1 + 3 * (2 + 0.25) + 3.0, 1e-12);
  EXPECT_NEAR(r.compute[1], 3 * 1 + 3 * 2 + 3.0, 1e-12);
  s.world = 2;
  c.all_reduce = [](double) { return 0.0; };
  p = zero_step_program(s, c);
  ASSERT_EQ(p.ranks.size(), 4u);
  EXPECT_EQ(p.groups, (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {0, 1}, {2, 3}}));
  EXPECT_FALSE(simulate(p).deadlock);
}

// A 1F1B pipeline of two stages (one layer each, forward 1, backward 2, free messages) over four
// micro-batches: the schedule ends at (m + p - 1)(f + b) = 15 on rank 0 and 13 on rank 1 (its last
// backward precedes rank 0's). Then the tied table's gradient crosses each way in 1 s: rank 1's
// arrived before rank 0 asks, but each waits for its own send (rank 0's ends at 16) and rank 1 for
// rank 0's message (16); then each stage updates its own parameters (100 and 300 at 1 ms each).
TEST(PipelineProgram, OneFOneBThenTheTiedExchangeTheReductionAndEachStagesUpdate) {
  ZeroStepCosts c;
  c.forward = {0.0, 1.0, 1.0, 0.0};  // embeddings, two blocks, tail
  c.backward = {0.0, 2.0, 2.0, 0.0};
  c.optimizer_per_element = 1e-3;
  c.send_recv = [](double bytes) { return bytes == 1000.0 ? 1.0 : 0.0; };
  PipelineStepSpec s;
  s.schedule = {parallel::pp::ScheduleKind::k1F1B, 2, 1, 4};
  s.bounds = {0, 1, 2};
  s.stage_params = {100, 300};
  s.boundary_bytes = 64;
  SimProgram p = pipeline_step_program(s, c);
  ASSERT_EQ(p.ranks.size(), 2u);
  SimReport r = simulate(p);
  EXPECT_NEAR(r.end[0], 15.1, 1e-12);
  EXPECT_NEAR(r.end[1], 13.3, 1e-12);
  s.tied_elems = 250;  // 1000 bytes
  r = simulate(pipeline_step_program(s, c));
  EXPECT_NEAR(r.end[0], 16.1, 1e-12);
  EXPECT_NEAR(r.end[1], 16.3, 1e-12);
  EXPECT_NEAR(r.makespan, 16.3, 1e-12);

  // Two data-parallel replicas of each stage (ranks q·2 + d). ZeRO 0: one all-reduce (0.5 s) of the
  // stage's gradients, then the whole update; ZeRO 1: a reduce-scatter (0.5), the update over half
  // (150 and 50 elements) and the refresh's all-gather (0.25).
  s.dp = 2;
  c.all_reduce = c.reduce_scatter = [](double) { return 0.5; };
  c.all_gather = [](double) { return 0.25; };
  p = pipeline_step_program(s, c);
  ASSERT_EQ(p.ranks.size(), 4u);
  ASSERT_EQ(p.groups.size(), 2u);
  EXPECT_EQ(p.groups[1], (std::vector<int>{2, 3}));
  r = simulate(p);
  EXPECT_NEAR(r.end[0], 16.6, 1e-12);
  EXPECT_NEAR(r.end[3], 16.8, 1e-12);
  s.zero_stage = 1;
  r = simulate(pipeline_step_program(s, c));
  EXPECT_NEAR(r.end[1], 16.8, 1e-12);
  EXPECT_NEAR(r.makespan, 16.9, 1e-12);
  // In low precision ZeRO 1's refresh each rank converts its half of the stage's parameters into
  // its views (1.5 x 4 bytes an element moved at 1e-4 s a byte): 0.03 s for the first stage's 50,
  // 0.09 s for the last's 150; the gathers are free.
  s.low_precision = true;
  c.convert_per_byte = 1e-4;
  r = simulate(pipeline_step_program(s, c));
  EXPECT_NEAR(r.end[1], 16.8 + 0.03, 1e-12);
  EXPECT_NEAR(r.makespan, 16.9 + 0.09, 1e-12);
  // One replica converts the whole stage: 0.06 and 0.18 s.
  s.dp = 1;
  r = simulate(pipeline_step_program(s, c));
  EXPECT_NEAR(r.makespan - simulate(pipeline_step_program([&] { auto t = s; t.low_precision = false; return t; }(), c)).makespan,
              0.18, 1e-12);
  s.dp = 2;
  s.low_precision = false;
  // The runtime's pipeline takes ZeRO 0 or 1; the bounds must cover the costs' layers.
  s.zero_stage = 2;
  EXPECT_THROW(pipeline_step_program(s, c), Error);
  s.zero_stage = 0;
  s.bounds = {0, 1, 3};
  EXPECT_THROW(pipeline_step_program(s, c), Error);
}

// Tensor parallelism inside a pipeline (3D): a stage's tp ranks block on their collectives together,
// so each unit's pass lasts its compute plus its collectives. GPipe over two stages and four
// micro-batches with forward 1 + 0.5 and backward 2 + 0.25 (the tail's forward also carries the
// head's backward 0.3 + 0.1) ends at the formula's (m + p - 1)(f + b) with those passes.
TEST(PipelineProgram, TensorParallelCollectivesLengthenEachStagesPasses) {
  ZeroStepCosts c;
  c.forward = {0.0, 1.0, 1.0, 0.0};
  c.backward = {0.0, 2.0, 2.0, 0.0};
  c.head_backward = 0.3;
  c.tp_forward = {{}, {0.25, 0.25}, {0.25, 0.25}, {}};
  c.tp_backward = {{}, {0.25}, {0.25}, {}};
  c.tp_head_backward = {0.1};
  c.send_recv = [](double) { return 0.0; };
  PipelineStepSpec s;
  s.schedule = {parallel::pp::ScheduleKind::kGPipe, 2, 1, 4};
  s.bounds = {0, 1, 2};
  s.stage_params = {0, 0};
  const SimReport r = simulate(pipeline_step_program(s, c));
  // Stage 0: f 1.5, b 2.25; stage 1: f 1.5 + 0.4, b 2.25. GPipe: the forwards flow (stage 1 ends
  // its four at 1.5 + 4 x 1.9 = 9.1), then the backwards (stage 1's four to 9.1 + 9 = 18.1, stage
  // 0's last after it at 18.1 + 2.25).
  EXPECT_NEAR(r.makespan, 9.1 + 4 * 2.25 + 2.25, 1e-12);
  // Sharing cores, each pass is its compute split evenly around the waits (fixed) of its
  // collectives, adjacent compute merged. Stage 1's first forward: block 2's thirds around its
  // two collectives, the head's forward (0 s) and its backward GEMMs' halves around theirs.
  s.shared_cores = true;
  SimProgram shared = pipeline_step_program(s, c);
  std::vector<std::pair<double, bool>> first;
  for (const SimOp& op : shared.ranks[1])
    if (op.kind == SimOpKind::kCompute && first.size() < 7) first.emplace_back(op.seconds, op.fixed);
  const std::vector<std::pair<double, bool>> want = {{1.0 / 3, false}, {0.25, true},          {1.0 / 3, false}, {0.25, true},
                                                     {1.0 / 3 + 0.15, false}, {0.1, true}, {0.15, false}};
  ASSERT_EQ(first.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(first[i].first, want[i].first, 1e-12) << i;
    EXPECT_EQ(first[i].second, want[i].second) << i;
  }
  // With cores for all, the same step.
  EXPECT_NEAR(simulate(shared).makespan, 9.1 + 4 * 2.25 + 2.25, 1e-12);
  // On one core, as compute the waits keep it busy: the step is every pass's time, 4 (1.5 + 2.25)
  // + 4 (1.9 + 2.25). Fixed, a wait beside the other stage's compute takes its own time while the
  // compute runs at half speed, so it uses half its time of the core, never less: the step is
  // shorter, by at most half the waits (4 (0.5 + 0.25) on stage 0, 4 (0.5 + 0.1 + 0.25) on stage 1).
  shared.host_cores = 1.0;
  SimProgram as_compute = shared;
  for (auto& list : as_compute.ranks)
    for (SimOp& op : list) op.fixed = false;
  const double work = 4 * (1.5 + 2.25) + 4 * (1.9 + 2.25), waits = 4 * (0.5 + 0.25) + 4 * (0.5 + 0.1 + 0.25);
  EXPECT_NEAR(simulate(as_compute).makespan, work, 1e-9);
  const double step = simulate(shared).makespan;
  EXPECT_LT(step, work - 0.5);
  EXPECT_GE(step, work - waits / 2 - 1e-9);
  c.tp_forward.clear();
  c.tp_backward.clear();
  c.tp_head_backward.clear();
  EXPECT_NEAR(simulate(pipeline_step_program(s, c)).makespan, 1 + 4 * 1.3 + 4 * 2 + 2, 1e-12);
}

// A search refills one program a thread in place (pipeline_step_program's reason): what it leaves
// must be the program built afresh, whatever the program held before (more ranks or fewer, longer
// lists, the hosts' shared cores of the layout before).
TEST(PipelineProgram, ARefilledProgramIsTheOneBuiltAfresh) {
  ZeroStepCosts c;
  c.forward = {0.1, 1.0, 1.0, 0.2};
  c.backward = {0.1, 2.0, 2.0, 0.2};
  c.tp_forward = {{}, {0.25}, {0.25}, {}};
  c.optimizer_per_element = 1e-3;
  c.all_reduce = c.reduce_scatter = [](double) { return 0.5; };
  c.all_gather = [](double) { return 0.25; };
  c.send_recv = [](double) { return 0.125; };
  PipelineStepSpec big, small;
  big.schedule = {parallel::pp::ScheduleKind::kGPipe, 2, 1, 8};
  big.bounds = {0, 1, 2};
  big.stage_params = {100, 300};
  big.dp = 2;
  big.zero_stage = 1;
  big.tied_elems = 10;
  big.shared_cores = true;
  small = big;
  small.schedule = {parallel::pp::ScheduleKind::k1F1B, 2, 1, 2};
  small.dp = 1;
  small.zero_stage = 0;
  small.shared_cores = false;
  auto same = [](const SimProgram& a, const SimProgram& b) {
    ASSERT_EQ(a.ranks.size(), b.ranks.size());
    for (size_t q = 0; q < a.ranks.size(); ++q) {
      ASSERT_EQ(a.ranks[q].size(), b.ranks[q].size()) << q;
      for (size_t i = 0; i < a.ranks[q].size(); ++i) {
        const SimOp &x = a.ranks[q][i], &y = b.ranks[q][i];
        EXPECT_TRUE(x.kind == y.kind && x.seconds == y.seconds && x.peer == y.peer && x.tag == y.tag && x.group == y.group &&
                    x.async == y.async && x.fixed == y.fixed && x.describe() == y.describe())
            << q << " " << i << ": " << x.describe() << " / " << y.describe();
      }
    }
    EXPECT_EQ(a.groups, b.groups);
    EXPECT_EQ(a.host, b.host);
    EXPECT_EQ(a.demand, b.demand);
    EXPECT_EQ(a.host_cores, b.host_cores);
    EXPECT_EQ(a.disk_interference, b.disk_interference);
    EXPECT_EQ(simulate(a).makespan, simulate(b).makespan);
  };
  SimProgram reused;
  pipeline_step_program(big, c, reused);
  same(reused, pipeline_step_program(big, c));
  reused.host_cores = 1.0;  // what the search's share_cores adds
  reused.host.assign(reused.ranks.size(), 0);
  reused.demand.assign(reused.ranks.size(), 2.0);
  reused.disk_interference = 1e-9;
  pipeline_step_program(small, c, reused);
  same(reused, pipeline_step_program(small, c));
  pipeline_step_program(big, c, reused);
  same(reused, pipeline_step_program(big, c));
}

}  // namespace
}  // namespace mt::planner
