// Pipeline schedules without communication: for pp in {2,4,8}, v in {1,2,4}, m in {pp,2pp,4pp}
// every list passes the structural checks (each forward and backward once, backward after forward,
// every send received on its peer with its tag), the event simulation finishes without deadlock,
// warm-up counts and activation slots follow the formulas, and the simulated idle share of every
// rank equals (p-1)/(m+p-1) (GPipe, 1F1B) or (p-1)/(v·m+p-1) (interleaved). The partition puts
// every layer on exactly one stage, balances the embedding and head when asked, and refuses what
// cannot be split.
#include <gtest/gtest.h>

#include <iostream>
#include <numeric>
#include <set>

#include "base/error.h"
#include "parallel/pp/partition.h"
#include "parallel/pp/schedule.h"

namespace mt::parallel::pp {
namespace {

std::vector<std::vector<Instr>> lists(const ScheduleSpec& s) {
  std::vector<std::vector<Instr>> r;
  for (int q = 0; q < s.pp; ++q) r.push_back(build_schedule(s, q));
  return r;
}

int count_forwards_before_first_backward(const std::vector<Instr>& l) {
  int n = 0;
  for (const Instr& i : l) {
    if (i.kind == OpKind::kBackward) break;
    n += i.kind == OpKind::kForward;
  }
  return n;
}

TEST(PipelineSchedule, EverySpecIsValidDeadlockFreeAndMeetsTheBubbleFormula) {
  int checked = 0;
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved})
    for (int p : {2, 4, 8})
      for (int v : {1, 2, 4})
        for (int mul : {1, 2, 4}) {
          if (v > 1 && kind != ScheduleKind::kInterleaved) continue;
          ScheduleSpec s{kind, p, v, p * mul};
          SCOPED_TRACE(std::string(schedule_name(kind)) + " pp=" + std::to_string(p) + " v=" + std::to_string(v) +
                       " m=" + std::to_string(s.micro_batches));
          auto l = lists(s);
          EXPECT_EQ(validate(s, l), "");
          for (double tb : {1.0, 2.0}) {
            SimResult r = simulate(s, l, 1.0, tb);
            ASSERT_FALSE(r.deadlock) << r.where;
            // Ideal: m·v chunk forwards and backwards each of (1 + tb) / v, plus the fill and drain.
            const double ideal = s.micro_batches * (1.0 + tb);
            for (int q = 0; q < p; ++q) {
              EXPECT_NEAR(r.busy[q], ideal, 1e-9);
              EXPECT_NEAR(r.idle_share(q), bubble_formula(s), 1e-9) << "rank " << q << " tb " << tb;
            }
          }
          for (int q = 0; q < p; ++q) {
            const int warm = warmup_forwards(s, q);
            // The warm-up forwards, then the steady state's forward before the first backward.
            const int expect_first = kind == ScheduleKind::kGPipe ? s.micro_batches * v : std::min(warm + 1, s.micro_batches * v);
            EXPECT_EQ(count_forwards_before_first_backward(l[q]), expect_first) << "rank " << q;
            if (kind == ScheduleKind::k1F1B || (kind == ScheduleKind::kInterleaved && v == 1)) {
              EXPECT_EQ(warm, std::min(p - q - 1, s.micro_batches));
              EXPECT_EQ(max_in_flight(l[q]), p - q) << "1F1B keeps at most p - rank in flight";
            }
            if (kind == ScheduleKind::kGPipe) {
              EXPECT_EQ(max_in_flight(l[q]), s.micro_batches);
            }
            if (kind == ScheduleKind::kInterleaved && v > 1 && s.micro_batches > p) {
              EXPECT_EQ(warm, std::min((p - q - 1) * 2 + (v - 1) * p, s.micro_batches * v));
            }
          }
          ++checked;
        }
  EXPECT_EQ(checked, 3 * 3 + 3 * 3 + 3 * 3 * 3);
}

TEST(PipelineSchedule, OneFOneBNeedsFewerSlotsThanGPipe) {
  ScheduleSpec g{ScheduleKind::kGPipe, 4, 1, 16}, f{ScheduleKind::k1F1B, 4, 1, 16};
  EXPECT_EQ(max_in_flight(build_schedule(g, 0)), 16);
  EXPECT_EQ(max_in_flight(build_schedule(f, 0)), 4);
  EXPECT_EQ(max_in_flight(build_schedule(f, 3)), 1);
}

TEST(PipelineSchedule, FewerMicroBatchesThanStagesStillRuns) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    ScheduleSpec s{kind, 4, 1, 1};
    auto l = lists(s);
    EXPECT_EQ(validate(s, l), "");
    SimResult r = simulate(s, l);
    EXPECT_FALSE(r.deadlock);
    EXPECT_NEAR(r.idle_share(0), bubble_formula(s), 1e-9);
  }
}

TEST(PipelineSchedule, RefusesWhatItCannotRun) {
  auto msg = [](ScheduleSpec s) {
    try {
      build_schedule(s, 0);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg({ScheduleKind::kInterleaved, 4, 2, 6}).find("multiple of parallel.pp (4)"), std::string::npos);
  EXPECT_NE(msg({ScheduleKind::k1F1B, 2, 2, 4}).find("parallel.virtual_stages = 2 needs"), std::string::npos);
  EXPECT_THROW(parse_schedule("zero-bubble"), Error);
  // Tags: the bound is the backend's (MPI_TAG_UB); 8 x 4096 needs 65537, past the standard's 32768.
  try {
    check_schedule_spec({ScheduleKind::k1F1B, 8, 1, 4096}, 32767);
    ADD_FAILURE() << "65537 tags passed a bound of 32768";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("need 65537 message tags"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_schedule_spec({ScheduleKind::k1F1B, 8, 1, 4096}, 2147483647));
  EXPECT_EQ(step_tags({ScheduleKind::kInterleaved, 4, 2, 8}), 2 * 8 * 8);
}

// The executor reuses a sent gradient's buffer once a later message from the peer proves the send
// received. 1F1B, 2 ranks: rank 0 sends activation k+2 after receiving gradient k, so rank 1 holds
// 2 buffers whatever m is (it held one per micro-batch before); GPipe's receives all come first.
TEST(PipelineSchedule, SentGradientBuffersAreReleasedByTheNextMessageFromThePeer) {
  auto no_waits = [](const std::vector<std::vector<Instr>>& l, int q) { return max_grads_in_flight(l, q, grad_send_plan(l, q, false)); };
  for (int m : {2, 8, 64}) {
    auto l = lists({ScheduleKind::k1F1B, 2, 1, m});
    EXPECT_EQ(no_waits(l, 1), std::min(m, 2)) << m;
    EXPECT_EQ(no_waits(l, 0), 0) << m;  // the first stage sends no gradient
    auto g = lists({ScheduleKind::kGPipe, 2, 1, m});
    EXPECT_EQ(no_waits(g, 1), m) << m;
  }
  auto l = lists({ScheduleKind::k1F1B, 2, 1, 8});
  auto rel = grad_send_releases(l, 1);
  // Rank 1: [recv A0, F0, B0, send G0, recv A1, F1, B1, send G1, recv A2, ...]: receiving A2
  // releases G0 (rank 0 received G0 before its forward of micro-batch 2).
  ASSERT_EQ(l[1][3].kind, OpKind::kSendGrad);
  ASSERT_EQ(l[1][8].kind, OpKind::kRecvActivation);
  ASSERT_EQ(l[1][8].micro, 2);
  EXPECT_EQ(rel[8], std::vector<int>{3});
  // Every release is a receive that comes after its send, each send released at most once; with
  // 4 stages (1F1B and interleaved) a stage holds its warm-up count plus two under 1F1B.
  for (ScheduleSpec s : {ScheduleSpec{ScheduleKind::k1F1B, 4, 1, 32}, ScheduleSpec{ScheduleKind::kInterleaved, 4, 2, 32}}) {
    auto ranks = lists(s);
    for (int q = 0; q < 4; ++q) {
      auto r = grad_send_releases(ranks, q);
      std::set<int> seen;
      for (size_t j = 0; j < r.size(); ++j)
        for (int i : r[j]) {
          EXPECT_TRUE(ranks[q][j].kind == OpKind::kRecvActivation || ranks[q][j].kind == OpKind::kRecvGrad);
          EXPECT_EQ(ranks[q][i].kind, OpKind::kSendGrad);
          EXPECT_LT(i, static_cast<int>(j));
          EXPECT_TRUE(seen.insert(i).second);
        }
      const int held = no_waits(ranks, q);
      if (s.kind == ScheduleKind::k1F1B) {
        EXPECT_EQ(held, q == 0 ? 0 : warmup_forwards(s, q) + 2) << q;
      }
      EXPECT_LT(held, s.micro_batches * s.virtual_stages / 2) << schedule_name(s.kind) << " rank " << q;
    }
  }
}

TEST(PipelineSchedule, ABrokenListIsCaught) {
  ScheduleSpec s{ScheduleKind::k1F1B, 2, 1, 2};
  auto l = lists(s);
  // Drop a send: its receive is unmatched and the simulation deadlocks.
  auto broken = l;
  for (size_t n = 0; n < broken[0].size(); ++n)
    if (broken[0][n].kind == OpKind::kSendActivation) {
      broken[0].erase(broken[0].begin() + static_cast<long>(n));
      break;
    }
  EXPECT_NE(validate(s, broken), "");
  EXPECT_TRUE(simulate(s, broken).deadlock);
  // Swap a backward before its forward.
  auto early = l;
  std::swap(early[1][0], early[1][2]);
  EXPECT_NE(validate(s, early), "");
}

TEST(PipelinePartition, UniformAndParameterBalanced) {
  PartitionInput in;
  in.stages = 4;
  in.layer_cost.assign(14, 7.0);
  auto u = partition_layers(PartitionMethod::kUniform, in);
  EXPECT_EQ(u, (std::vector<int>{0, 4, 8, 11, 14}));  // DeepSpeed: the first L mod S stages get one more
  // A 24-layer model whose embedding weighs as much as 6 layers and the head as 4: the balanced
  // split gives the first and last stages fewer layers.
  in.stages = 2;
  in.layer_cost.assign(24, 1.0);
  in.first_cost = 6.0;
  in.last_cost = 4.0;
  auto p = partition_layers(PartitionMethod::kParameters, in);
  EXPECT_EQ(p, (std::vector<int>{0, 11, 24}));  // 6 + 11 = 17 vs 13 + 4 = 17
  EXPECT_EQ(partition_layers(PartitionMethod::kUniform, in), (std::vector<int>{0, 12, 24}));
  EXPECT_NE(describe_partition(p, in).find("stage 0: embedding + layers 0-10 (17)"), std::string::npos);
  // Uneven layer counts are allowed; every layer lands on exactly one stage.
  for (int L = 3; L <= 13; ++L)
    for (int S = 1; S <= std::min(L, 8); ++S) {
      in.stages = S;
      in.layer_cost.assign(L, 1.0);
      for (auto m : {PartitionMethod::kUniform, PartitionMethod::kParameters}) {
        auto b = partition_layers(m, in);
        ASSERT_EQ(b.size(), static_cast<size_t>(S + 1));
        EXPECT_EQ(b.front(), 0);
        EXPECT_EQ(b.back(), L);
        for (int s = 0; s < S; ++s) EXPECT_GE(b[s + 1] - b[s], 1);
      }
    }
  in.stages = 5;
  in.layer_cost.assign(4, 1.0);
  EXPECT_THROW(partition_layers(PartitionMethod::kUniform, in), Error);
  EXPECT_THROW(parse_partition("type:transformer", "pipeline.partition"), Error);
}

// Megatron waits on each gradient it sends; ours does too where a rendezvous simulation of every
// rank's list proves the waits cannot deadlock, so a stage holds one gradient buffer where it held
// its warm-up count + 2 (1F1B) or every micro-batch (GPipe).
TEST(PipelineSchedule, WaitingOnEachGradientSendHoldsOneBufferAndCannotDeadlock) {
  int safe = 0, all = 0;
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved})
    for (int p : {2, 3, 4, 8})
      for (int v : {1, 2, 3})
        for (int m : {1, 2, 5, 8, 16, 32}) {
          if (v > 1 && kind != ScheduleKind::kInterleaved) continue;
          if (kind == ScheduleKind::kInterleaved && m % p != 0) continue;
          ScheduleSpec s{kind, p, v, m};
          SCOPED_TRACE(std::string(schedule_name(kind)) + " pp=" + std::to_string(p) + " v=" + std::to_string(v) +
                       " m=" + std::to_string(m));
          auto l = lists(s);
          std::vector<std::vector<std::vector<int>>> waits;
          for (int q = 0; q < p; ++q) waits.push_back(grad_send_plan(l, q, true).wait_before);
          const std::string stuck = rendezvous_check(l, waits);
          EXPECT_EQ(gradient_waits_safe(s), stuck.empty()) << stuck;
          ++all;
          if (!stuck.empty()) {
            std::cout << "  " << schedule_name(kind) << " pp " << p << " v " << v << " m " << m << ": " << stuck << "\n";
            continue;
          }
          ++safe;
          EXPECT_EQ(rendezvous_check(l, {}), "");  // without waits: the schedule itself
          for (int q = 0; q < p; ++q) {
            EXPECT_EQ(max_grads_in_flight(s, l, q), q == 0 && v == 1 ? 0 : std::min(1, m * v)) << "rank " << q;
            // Every send of a gradient is waited for or released exactly once, after it.
            GradSendPlan plan = executor_grad_plan(s, l, q);
            std::set<int> seen;
            for (size_t j = 0; j < l[q].size(); ++j) {
              for (int i : plan.wait_before[j]) {
                EXPECT_LT(i, static_cast<int>(j));
                EXPECT_TRUE(seen.insert(i).second);
              }
              for (int i : plan.release_after[j]) {
                EXPECT_LT(i, static_cast<int>(j));
                EXPECT_TRUE(seen.insert(i).second);
              }
            }
          }
        }
  std::cout << safe << " of " << all << " specs wait on their gradient sends\n";
  EXPECT_GT(safe, 0);
}

// The check finds a wait that can deadlock: two ranks that each send, then wait for their send
// before receiving the other's, block for ever when sends complete only once received.
TEST(PipelineSchedule, RendezvousCheckFindsAWaitThatDeadlocks) {
  std::vector<std::vector<Instr>> l = {
      {{OpKind::kSendActivation, 0, 0, 1, 7}, {OpKind::kRecvGrad, 0, 0, 1, 8}},
      {{OpKind::kSendGrad, 0, 0, 0, 8}, {OpKind::kRecvActivation, 0, 0, 0, 7}},
  };
  EXPECT_EQ(rendezvous_check(l, {}), "");
  EXPECT_EQ(rendezvous_check(l, {{{}, {0}}}), "");  // one rank waits: the other receives, then so does it
  const std::string stuck = rendezvous_check(l, {{{}, {0}}, {{}, {0}}});
  EXPECT_NE(stuck.find("rank 0 waits at instruction 1"), std::string::npos) << stuck;
  EXPECT_NE(stuck.find("rank 1 waits at instruction 1"), std::string::npos) << stuck;
}

}  // namespace
}  // namespace mt::parallel::pp
