// The pure ZeRO and bucket logic, without communication: the partition covers every element once
// and round-trips, the optimizer's shard segments add up, bucket ranges tile the buffer from the
// end, and the stage 1-3 schedule, driven by a recording ZeroEffects through the hook sequence a
// tied GPT-2 makes, balances every gather with a free and every reduction with its completion,
// reduces each unit once per use (stage 2/3) or once per step on the last micro-batch (stage 1).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "parallel/dp/grad_buckets.h"
#include "parallel/zero/partition.h"
#include "parallel/zero/schedule.h"

namespace mt::parallel {
namespace {

std::vector<Unit> units_of(const std::vector<size_t>& sizes) {
  std::vector<Unit> u;
  size_t off = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    u.push_back({i == 0 ? "embeddings" : i + 1 == sizes.size() ? "tail" : "h." + std::to_string(i - 1), off, sizes[i], sizes[i] / 2});
    off += sizes[i];
  }
  return u;
}

TEST(ZeroPartition, EveryElementOnceAndRoundTrip) {
  const std::vector<size_t> sizes = {13, 7, 7, 1, 10};
  const size_t total = 38;
  std::vector<float> flat(total);
  for (size_t i = 0; i < total; ++i) flat[i] = static_cast<float>(i + 1);
  std::vector<optim::ParamSegment> segs = {{0, 5, 0.1f, "a"}, {5, 20, 0.0f, "b"}, {25, 13, 0.1f, "c"}};
  for (int N : {1, 2, 3, 5}) {
    std::vector<int> owner(total, 0);
    std::vector<float> back(total, 0.0f);
    std::map<std::string, size_t> seg_total;
    for (int r = 0; r < N; ++r) {
      ZeroPartition p(units_of(sizes), N, r);
      size_t S = 0;
      for (size_t u = 0; u < sizes.size(); ++u) {
        EXPECT_EQ(p.piece(u), (sizes[u] + N - 1) / N);
        S += p.piece(u);
        for (size_t i = p.piece_begin(u); i < p.piece_end(u); ++i) ++owner[i];
      }
      EXPECT_EQ(p.shard_numel(), S);
      std::vector<float> shard(S, -1.0f);
      p.flat_to_shard(shard.data(), flat.data());
      for (size_t u = 0; u < sizes.size(); ++u)  // padding is zero
        for (size_t k = p.piece_end(u) - p.piece_begin(u); k < p.piece(u); ++k) EXPECT_EQ(shard[p.shard_offset(u) + k], 0.0f);
      p.shard_to_flat(back.data(), shard.data());
      for (const optim::ParamSegment& s : p.shard_segments(segs)) {
        EXPECT_LE(s.offset + s.numel, S);
        seg_total[s.name] += s.numel;
      }
    }
    for (size_t i = 0; i < total; ++i) EXPECT_EQ(owner[i], 1) << "element " << i << " world " << N;
    EXPECT_EQ(back, flat) << "world " << N;
    for (const auto& s : segs) EXPECT_EQ(seg_total[s.name], s.numel) << s.name << " world " << N;
  }
}

TEST(GradBuckets, RangesTileTheBufferFromTheEnd) {
  for (size_t numel : {1, 10, 4096, 4097}) {
    for (size_t b : {1, 3, 4096, 1000000}) {
      auto r = grad_bucket_ranges(numel, b);
      size_t hi = numel;
      for (auto [lo, h] : r) {
        EXPECT_EQ(h, hi);
        EXPECT_LT(lo, h);
        EXPECT_LE(h - lo, b);
        hi = lo;
      }
      EXPECT_EQ(hi, 0u);
    }
  }
}

// Records what the schedule asks for and checks the protocol as it goes.
class Recorder : public ZeroEffects {
 public:
  std::set<size_t> gathering, live, slabs;
  std::vector<size_t> pending;  // launched reductions, oldest first
  std::map<size_t, int> reduced;
  int errors = 0;
  // A persistent view is re-gathered in place after each step (refresh), so a live unit may be
  // gathered again; a unit is never gathered twice at once, and a finish follows its start.
  void start_gather(size_t u) override { errors += !gathering.insert(u).second; }
  void finish_gather(size_t u) override {
    errors += gathering.erase(u) != 1 && !live.count(u);
    live.insert(u);
  }
  void cancel_gather(size_t u) override { errors += gathering.erase(u) != 1; }
  void free_view(size_t u) override { errors += live.erase(u) != 1; }
  void begin_grad_slab(size_t u) override { slabs.insert(u); }
  void launch_reduce(size_t u) override {
    errors += !slabs.count(u);
    pending.push_back(u);
  }
  void complete_reduce(size_t u, bool free_slab) override {
    errors += pending.empty() || pending.front() != u;  // FIFO
    if (!pending.empty()) pending.erase(pending.begin());
    ++reduced[u];
    if (free_slab) slabs.erase(u);
  }
};

// One micro-batch of a tied GPT-2 with `blocks` blocks: units 0 (embeddings, also the head),
// 1..blocks, blocks+1 (tail: final norm).
void micro_batch(ZeroSchedule& s, size_t blocks, bool recompute) {
  const size_t tail = blocks + 1;
  for (size_t u = 0; u <= tail; ++u) {
    s.on_hook(u, true, true);
    s.on_hook(u, false, true);
  }
  s.on_hook(0, true, false);  // the fused head accumulates the tied embedding's gradient in forward
  s.on_hook(0, false, false);
  s.on_hook(tail, true, false);
  s.on_hook(tail, false, false);
  for (size_t u = blocks; u >= 1; --u) {
    if (recompute) {
      s.on_hook(u, true, true);
      s.on_hook(u, false, true);
    }
    s.on_hook(u, true, false);
    s.on_hook(u, false, false);
  }
  s.on_hook(0, true, false);
  s.on_hook(0, false, false);
}

TEST(ZeroSchedule, GathersFreesAndReductionsBalance) {
  const std::vector<size_t> sizes = {500, 300, 300, 300, 20};
  for (int stage : {1, 2, 3}) {
    for (bool overlap : {false, true}) {
      for (bool recompute : {false, true}) {
        ZeroScheduleOptions o;
        o.stage = stage;
        o.overlap_comm = overlap;
        o.persistence_threshold = 50;  // the tail stays gathered at stage 3
        o.prefetch_elems = 400;
        o.max_live_elems = 800;
        auto units = units_of(sizes);
        Recorder fx;
        ZeroSchedule s(units, o, fx);
        for (size_t u = 0; u < units.size(); ++u) fx.live.insert(u);  // before: views into the whole store
        s.construct();
        const int micro = 3;
        for (int step = 0; step < 2; ++step) {
          fx.reduced.clear();
          for (int m = 0; m < micro; ++m) {
            s.set_last_micro_batch(m + 1 == micro);
            micro_batch(s, 3, recompute);
            s.finish_backward();
            EXPECT_TRUE(fx.pending.empty());
          }
          s.refresh();
          for (size_t u = 0; u < units.size(); ++u) {
            // Stage 2/3 reduce every unit once a micro-batch: the tied embeddings' two uses (the head's
            // and the table's) go into one slab and one reduction (it was one per use, stop 74).
            int want = stage == 1 ? 1 : micro;
            EXPECT_EQ(fx.reduced[u], want) << "stage " << stage << " unit " << u;
          }
          // Only the persistent units (every unit below stage 3) stay gathered between steps.
          for (size_t u = 0; u < units.size(); ++u) EXPECT_EQ(fx.live.count(u), s.persistent(u) ? 1u : 0u) << u;
          EXPECT_TRUE(fx.gathering.empty());
          if (stage == 3) {
            EXPECT_GE(s.peak_live_elems(), 500u);
          }
        }
        EXPECT_EQ(fx.errors, 0) << "stage " << stage << " overlap " << overlap << " recompute " << recompute;
      }
    }
  }
}

}  // namespace
}  // namespace mt::parallel
