// The step simulator on programs whose times can be worked out by hand.
#include "planner/sim.h"

#include <gtest/gtest.h>

#include "base/error.h"

namespace mt::planner {
namespace {

SimOp compute(double s, const char* name = "") { return {SimOpKind::kCompute, s, -1, -1, -1, false, name}; }
SimOp collective(int group, int tag, double s, bool async) {
  return {SimOpKind::kCollective, s, -1, tag, group, async, "all_reduce"};
}
SimOp wait(int tag) { return {SimOpKind::kWait, 0.0, -1, tag, -1, false, "wait"}; }

// A pure pipeline, the executor's own instruction lists: every rank idles the formula's share
// ((p-1)/(m+p-1); interleaved (p-1)/(v·m+p-1)) when messages cost nothing and a backward is twice a
// forward, and the step is (m+p-1)·(t_f+t_b) for GPipe and 1F1B.
TEST(Simulator, PipelineBubbleIsTheFormula) {
  using parallel::pp::ScheduleKind;
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved}) {
    for (int p : {2, 4}) {
      parallel::pp::ScheduleSpec spec;
      spec.kind = kind;
      spec.pp = p;
      spec.micro_batches = 8;
      spec.virtual_stages = kind == ScheduleKind::kInterleaved ? 2 : 1;
      const SimReport r = simulate(pipeline_program(spec, 1.0, 2.0));
      ASSERT_FALSE(r.deadlock) << r.where;
      const double want = parallel::pp::bubble_formula(spec);
      for (int q = 0; q < p; ++q) {
        EXPECT_NEAR(r.idle_share(q), want, 1e-12) << parallel::pp::schedule_name(kind) << " p " << p << " rank " << q;
      }
      if (kind != ScheduleKind::kInterleaved) {
        EXPECT_DOUBLE_EQ(r.makespan, (8 + p - 1) * 3.0);
      }
    }
  }
}

// Messages on the critical path add their time: a GPipe of p stages with a message time c sends
// 2(p-1) of them along the first micro-batch's way up and the last one's way down.
TEST(Simulator, PipelineMessagesOnTheCriticalPathAddUp) {
  parallel::pp::ScheduleSpec spec;
  spec.kind = parallel::pp::ScheduleKind::kGPipe;
  spec.pp = 3;
  spec.micro_batches = 4;
  const SimReport r = simulate(pipeline_program(spec, 1.0, 2.0, 0.25));
  ASSERT_FALSE(r.deadlock) << r.where;
  EXPECT_DOUBLE_EQ(r.makespan, (4 + 3 - 1) * 3.0 + 2 * (3 - 1) * 0.25);
}

// Data parallelism's gradient all-reduce: launched after the last layer's backward and waited for
// at the end, it hides behind the remaining backward when that takes longer (costs nothing), and
// shows only its excess otherwise; a blocking one — or an asynchronous one without progress —
// adds its whole time.
TEST(Simulator, OverlappedAllReduceCostsNothingASerialisedOneAddsItsTime) {
  auto program = [](double comm, bool async) {
    SimProgram p;
    p.groups = {{0, 1}};
    for (int q = 0; q < 2; ++q)
      p.ranks.push_back({compute(1.0, "backward layer 2"), collective(0, 7, comm, async), compute(1.0, "backward layer 1"),
                         wait(7)});
    if (!async) {
      for (auto& list : p.ranks) list.pop_back();  // a blocking collective has no wait
    }
    return p;
  };
  EXPECT_DOUBLE_EQ(simulate(program(0.5, true)).makespan, 2.0);   // hidden
  EXPECT_DOUBLE_EQ(simulate(program(1.5, true)).makespan, 2.5);   // 0.5 s shows
  EXPECT_DOUBLE_EQ(simulate(program(0.5, false)).makespan, 2.5);  // serialised
  SimOptions no_progress;
  no_progress.progress = false;
  const SimReport r = simulate(program(0.5, true), no_progress);
  EXPECT_DOUBLE_EQ(r.makespan, 2.5);
  EXPECT_DOUBLE_EQ(r.blocked[0], 0.5);
  EXPECT_DOUBLE_EQ(r.comm[1], 0.5);
  // The report says whether progress could move anything (the search simulates once when not).
  EXPECT_TRUE(r.async_collective);
  EXPECT_FALSE(simulate(program(0.5, false)).async_collective);
}

// A collective starts when its last member arrives and ends on all of them at once; one rank's
// communication stream runs its operations one at a time.
TEST(Simulator, CollectivesWaitForTheSlowestMemberAndShareOneStream) {
  SimProgram p;
  p.groups = {{0, 1}, {0, 1}};
  p.ranks = {{compute(1.0), collective(0, 1, 0.5, false), compute(0.25)},
             {compute(3.0), collective(0, 1, 0.5, false)}};
  SimReport r = simulate(p);
  EXPECT_DOUBLE_EQ(r.end[0], 3.75);
  EXPECT_DOUBLE_EQ(r.end[1], 3.5);
  EXPECT_DOUBLE_EQ(r.blocked[0], 2.5);
  EXPECT_DOUBLE_EQ(r.idle_share(1), (3.75 - 3.0) / 3.75);
  // Two asynchronous all-reduces of 1 s issued at 0 beside 1.5 s of compute: the second runs
  // after the first, so the step is 2 s.
  p.ranks = {{collective(0, 1, 1.0, true), collective(1, 2, 1.0, true), compute(1.5), wait(1), wait(2)},
             {collective(0, 1, 1.0, true), collective(1, 2, 1.0, true), compute(1.5), wait(1), wait(2)}};
  r = simulate(p);
  EXPECT_DOUBLE_EQ(r.makespan, 2.0);
  EXPECT_DOUBLE_EQ(r.blocked[0], 0.5);
}

// Work on a rank's own streams (a disk queue, a helper thread): in issue order on each stream,
// beside compute; a wait blocks until the named work ends, and may be repeated.
TEST(Simulator, StreamsRunInIssueOrderBesideComputeAndAreWaitedFor) {
  auto work = [](int stream, int tag, double s, bool async) {
    SimOp op{SimOpKind::kStream, s, -1, tag, -1, async, "io"};
    op.stream = stream;
    return op;
  };
  SimProgram p;
  // A helper thread's 3 x 1 s (tags 1-3), a disk read of 0.5 s (tag 7) and compute of 1.2 s: the
  // wait for tag 2 ends at 2 s, for the read at 0.5 s (done already), for tag 3 at 3 s; then a
  // blocking 0.25 s disk write after the read.
  p.ranks = {{work(2, 1, 1.0, true), work(2, 2, 1.0, true), work(2, 3, 1.0, true), work(1, 7, 0.5, true), compute(1.2),
              wait(2), wait(7), wait(2), compute(0.5), wait(3), work(1, 8, 0.25, false)}};
  SimReport r = simulate(p);
  ASSERT_FALSE(r.deadlock) << r.where;
  EXPECT_DOUBLE_EQ(r.makespan, 3.25);
  EXPECT_DOUBLE_EQ(r.blocked[0], (2.0 - 1.2) + (3.0 - 2.5) + 0.25);
  EXPECT_DOUBLE_EQ(r.streams[0], 3.75);
  // One stream is one queue: a second read issued at 0 starts after the first.
  p.ranks = {{work(1, 1, 1.0, true), work(1, 2, 1.0, true), wait(2)}};
  EXPECT_DOUBLE_EQ(simulate(p).makespan, 2.0);
  p.ranks = {{work(0, 1, 1.0, true), wait(1)}};
  EXPECT_THROW(simulate(p), Error);  // stream 0 is the communicator's
  // A disk transfer slows compute beside it: 1e9 bytes over 2 s (5e8 a second) with k = 5e-10 s a
  // byte runs compute at 1 / (1 + 0.25) = 0.8 of its speed: 1 s of it ends at 1.25 s. Compute
  // after the transfer runs at full speed: 2 s of it from 1.25 ends at 0.75 + 1.25 / 0.8... no:
  // 0.75 s more at 0.8 covers 0.6 s of work, the other 1.4 s ends at 3.4.
  SimOp disk = work(1, 1, 2.0, true);
  disk.bytes = 1e9;
  p.disk_interference = 5e-10;
  p.ranks = {{disk, compute(1.0)}};
  EXPECT_DOUBLE_EQ(simulate(p).makespan, 2.0);
  EXPECT_DOUBLE_EQ(simulate(p).compute[0], 1.25);
  p.ranks = {{disk, compute(1.0), compute(2.0)}};
  EXPECT_DOUBLE_EQ(simulate(p).makespan, 3.4);
  p.disk_interference = 0.0;
  EXPECT_DOUBLE_EQ(simulate(p).makespan, 3.0);
}

// Ranks that share a host's cores share them while they compute, and a waiting rank takes none.
TEST(Simulator, RanksSharingCoresShareThemWhileTheyCompute) {
  SimProgram p;
  p.ranks = {{compute(1.0)}, {compute(1.0)}};
  EXPECT_DOUBLE_EQ(simulate(p).makespan, 1.0);  // each its own cores
  p.host_cores = 1.0;
  EXPECT_DOUBLE_EQ(simulate(p).makespan, 2.0);  // one core: each at half speed
  p.host_cores = 2.0;
  EXPECT_DOUBLE_EQ(simulate(p).makespan, 1.0);
  // One core: 2 s and 1 s of work run at half speed together until the shorter has had its 1 s
  // (t = 2); the longer has had 1 s too and runs its last second alone: the step is 3 s, the
  // work's sum, and each rank's compute is its wall time.
  p.host_cores = 1.0;
  p.ranks = {{compute(2.0)}, {compute(1.0)}};
  SimReport r = simulate(p);
  EXPECT_DOUBLE_EQ(r.makespan, 3.0);
  EXPECT_DOUBLE_EQ(r.compute[0], 3.0);
  EXPECT_DOUBLE_EQ(r.compute[1], 2.0);
  // On two hosts of one core each they do not meet.
  p.host = {0, 1};
  EXPECT_DOUBLE_EQ(simulate(p).makespan, 2.0);
  // A rank standing for two threads (demand 2) beside one of one thread, on two cores: 3 cores
  // wanted, each runs at 2/3 of its speed; 1 s of work each ends at 1.5 s.
  p.host.clear();
  p.host_cores = 2.0;
  p.demand = {2.0, 1.0};
  p.ranks = {{compute(1.0)}, {compute(1.0)}};
  EXPECT_DOUBLE_EQ(simulate(p).makespan, 1.5);
  // A rank waiting in a collective takes no core: rank 1 waits for rank 0's 2 s of compute, which
  // runs at full speed on the one core, then both compute 1 s at half speed.
  p.demand.clear();
  p.host_cores = 1.0;
  p.groups = {{0, 1}};
  p.ranks = {{compute(2.0), collective(0, 1, 0.5, false), compute(1.0)}, {collective(0, 1, 0.5, false), compute(1.0)}};
  r = simulate(p);
  EXPECT_DOUBLE_EQ(r.makespan, 2.0 + 0.5 + 2.0);
  EXPECT_DOUBLE_EQ(r.blocked[1], 2.5);
  // A fixed wait inside a pass (the tp collectives of the ranks a pipeline rank stands for, timed
  // as the host shares its cores) keeps its time and its core: on one core, rank 0's 1 s of
  // compute and rank 1's 2 s run at half speed to t = 2; rank 0 then waits 1 s, to t = 3, while
  // rank 1 still runs at half speed (0.5 s done); alone, its last 0.5 s ends at 3.5 s. As compute,
  // the wait would have been slowed too (both end at 4 s); holding no core, rank 1 would have
  // had the core to itself from t = 2 (3 s).
  p.groups.clear();
  SimOp wait_in_pass = compute(1.0);
  wait_in_pass.fixed = true;
  p.ranks = {{compute(1.0), wait_in_pass}, {compute(2.0)}};
  r = simulate(p);
  EXPECT_DOUBLE_EQ(r.makespan, 3.5);
  EXPECT_DOUBLE_EQ(r.end[0], 3.0);
  EXPECT_DOUBLE_EQ(r.end[1], 3.5);
  EXPECT_DOUBLE_EQ(r.compute[0], 3.0);  // the pass's wall time: its compute and its wait
  wait_in_pass.fixed = false;
  p.ranks = {{compute(1.0), wait_in_pass}, {compute(2.0)}};
  EXPECT_DOUBLE_EQ(simulate(p).makespan, 4.0);
  p.host_cores = 0.0;  // cores for all: a fixed wait is compute at full speed
  wait_in_pass.fixed = true;
  p.ranks = {{compute(1.0), wait_in_pass}, {compute(2.0)}};
  EXPECT_DOUBLE_EQ(simulate(p).makespan, 2.0);
  p.host_cores = 1.0;
  // A pipeline on one core never leaves it idle when messages are free: its step is its work,
  // p·m·(t_f + t_b), where p cores give the bubble's formula.
  for (int stages : {2, 4}) {
    parallel::pp::ScheduleSpec spec;
    spec.kind = parallel::pp::ScheduleKind::k1F1B;
    spec.pp = stages;
    spec.micro_batches = 8;
    SimProgram pipe = pipeline_program(spec, 1.0, 2.0);
    pipe.host_cores = 1.0;
    EXPECT_NEAR(simulate(pipe).makespan, stages * 8 * 3.0, 1e-9) << stages;
    pipe.host_cores = stages;
    EXPECT_NEAR(simulate(pipe).makespan, (8 + stages - 1) * 3.0, 1e-9) << stages;
  }
  p.host = {0};
  EXPECT_THROW(simulate(p), Error);  // a host for one rank of two
}

// A receive nobody sends, and a collective a member never joins, are deadlocks named by rank;
// malformed programs are refused.
TEST(Simulator, DeadlocksAreReportedAndBadProgramsRefused) {
  SimProgram p;
  p.groups = {{0, 1}};
  p.ranks = {{compute(1.0), {SimOpKind::kRecv, 0.0, 1, 5, -1, false, "recv activation"}},
             {collective(0, 3, 1.0, false)}};
  SimReport r = simulate(p);
  EXPECT_TRUE(r.deadlock);
  EXPECT_NE(r.where.find("rank 0 waits at recv recv activation tag 5"), std::string::npos) << r.where;
  EXPECT_NE(r.where.find("rank 1 waits at collective"), std::string::npos) << r.where;
  p.ranks = {{collective(1, 3, 1.0, false)}, {}};
  EXPECT_THROW(simulate(p), Error);  // no group 1
  p.ranks = {{wait(9)}, {}};
  EXPECT_THROW(simulate(p), Error);  // nothing issued with tag 9
  p.ranks = {{{SimOpKind::kSend, 1.0, 0, 1, -1, false, "to itself"}}, {}};
  EXPECT_THROW(simulate(p), Error);
  // Of two refusals, the first in the rank's order is the one said.
  auto refusal = [&] {
    try {
      simulate(p);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("none");
  };
  p.ranks = {{wait(3), {SimOpKind::kSend, 1.0, 0, 1, -1, false, "to itself"}}, {}};
  EXPECT_NE(refusal().find("waits for tag 3, never issued"), std::string::npos) << refusal();
  p.ranks = {{{SimOpKind::kSend, 1.0, 0, 1, -1, false, "to itself"}, wait(3)}, {}};
  EXPECT_NE(refusal().find("send to itself: bad peer"), std::string::npos) << refusal();
}

}  // namespace
}  // namespace mt::planner
