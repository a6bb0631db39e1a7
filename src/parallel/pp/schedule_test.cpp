// Pipeline schedules without communication: for pp in {2,4,8}, v in {1,2,4}, m in {pp,2pp,4pp}
// every list passes the structural checks (each forward and backward once, backward after forward,
// every send received on its peer with its tag), the event simulation finishes without deadlock,
// warm-up counts and activation slots follow the formulas, and the simulated idle share of every
// rank equals (p-1)/(m+p-1) (GPipe, 1F1B) or (p-1)/(v·m+p-1) (interleaved). The partition puts
// every layer on exactly one stage, balances the embedding and head when asked, and refuses what
// cannot be split.
#include <gtest/gtest.h>

#include <numeric>

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
  EXPECT_NE(msg({ScheduleKind::k1F1B, 8, 1, 4096}).find("message tags"), std::string::npos);
  EXPECT_THROW(parse_schedule("zero-bubble"), Error);
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

}  // namespace
}  // namespace mt::parallel::pp
