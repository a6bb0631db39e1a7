// LocalBackend: every collective against a result computed by hand from each rank's inputs
// (rank r holds x_r[i] = 10 r + i), bf16 sums accumulated in f32 against a double reference,
// timeouts naming the missing rank, mismatched collectives, groups and point to point.
#include "comm/local_backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace mt::comm {
namespace {

constexpr int kN = 4;

void run(int n, const std::function<void(Backend&)>& fn) {
  auto errors = run_local_ranks(n, fn);
  for (int r = 0; r < n; ++r)
    if (errors[r]) {
      try {
        std::rethrow_exception(errors[r]);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    }
}

float x(int r, size_t i) { return static_cast<float>(10 * r + static_cast<int>(i)); }

std::vector<float> inputs(int r, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = x(r, i);
  return v;
}

TEST(LocalBackend, AllReduceEveryOp) {
  run(kN, [](Backend& b) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      auto v = inputs(b.rank(), 5);
      AllReduceOptions o;
      o.op = op;
      b.all_reduce(v.data(), v.size(), DType::kF32, o)->wait();
      for (size_t i = 0; i < v.size(); ++i) {
        float sum = 0;
        for (int r = 0; r < kN; ++r) sum += x(r, i);
        float expect = op == ReduceOp::kSum ? sum : op == ReduceOp::kAvg ? sum / kN
                       : op == ReduceOp::kMax ? x(kN - 1, i) : x(0, i);
        EXPECT_FLOAT_EQ(v[i], expect) << reduce_op_name(op) << " i=" << i;
      }
    }
  });
}

TEST(LocalBackend, BroadcastReduceGatherScatter) {
  run(kN, [](Backend& b) {
    const int me = b.rank();
    auto v = inputs(me, 3);
    BroadcastOptions bo;
    bo.root = 2;
    b.broadcast(v.data(), 3, DType::kF32, bo)->wait();
    EXPECT_EQ(v, inputs(2, 3));

    auto red = inputs(me, 3);
    ReduceOptions ro;
    ro.root = 1;
    ro.op = ReduceOp::kMax;
    b.reduce(red.data(), 3, DType::kF32, ro)->wait();
    if (me == 1) {
      EXPECT_EQ(red, inputs(kN - 1, 3));
    }

    auto mine = inputs(me, 2);
    std::vector<float> all(2 * kN, -1);
    b.all_gather(all.data(), mine.data(), 2, DType::kF32, {})->wait();
    for (int r = 0; r < kN; ++r)
      for (size_t i = 0; i < 2; ++i) EXPECT_EQ(all[r * 2 + i], x(r, i));

    std::vector<float> g(2 * kN, -1);
    GatherOptions go;
    go.root = 3;
    b.gather(g.data(), mine.data(), 2, DType::kF32, go)->wait();
    if (me == 3) {
      EXPECT_EQ(g, all);
    } else {
      EXPECT_EQ(g, std::vector<float>(2 * kN, -1));
    }

    std::vector<float> piece(2);
    auto src = inputs(100, 2 * kN);  // root's send: 1000 + j
    ScatterOptions so;
    so.root = 0;
    b.scatter(piece.data(), me == 0 ? src.data() : nullptr, 2, DType::kF32, so)->wait();
    EXPECT_EQ(piece[0], 1000.0f + 2 * me);
    EXPECT_EQ(piece[1], 1001.0f + 2 * me);
  });
}

TEST(LocalBackend, ReduceScatterAllToAllBarrier) {
  run(kN, [](Backend& b) {
    const int me = b.rank();
    auto send = inputs(me, 2 * kN);
    std::vector<float> out(2);
    b.reduce_scatter(out.data(), send.data(), 2, DType::kF32, {})->wait();
    for (size_t i = 0; i < 2; ++i) {
      float sum = 0;
      for (int r = 0; r < kN; ++r) sum += x(r, me * 2 + i);
      EXPECT_EQ(out[i], sum);
    }
    std::vector<float> a2a(2 * kN);
    b.all_to_all(a2a.data(), send.data(), 2, DType::kF32, {})->wait();
    for (int s = 0; s < kN; ++s)
      for (size_t i = 0; i < 2; ++i) EXPECT_EQ(a2a[s * 2 + i], x(s, me * 2 + i));
    b.barrier({})->wait();
  });
}

// bf16 inputs whose exact sum needs more than bf16's 8 bits: the result must be the exact (double)
// sum rounded once to bf16, which pairwise bf16 accumulation misses on many elements.
TEST(LocalBackend, Bf16SumAccumulatesInF32) {
  const size_t n = 256;
  std::vector<std::vector<bf16_t>> in(kN, std::vector<bf16_t>(n));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  for (auto& v : in)
    for (auto& e : v) e = f32_to_bf16(u(rng));
  std::vector<std::vector<bf16_t>> out = in;
  run(kN, [&](Backend& b) {
    b.all_reduce(out[b.rank()].data(), n, DType::kBF16, {})->wait();
  });
  int naive_differs = 0;
  for (size_t i = 0; i < n; ++i) {
    double exact = 0;
    bf16_t naive = in[0][i];
    for (int r = 0; r < kN; ++r) exact += bf16_to_f32(in[r][i]);
    for (int r = 1; r < kN; ++r) naive = f32_to_bf16(bf16_to_f32(naive) + bf16_to_f32(in[r][i]));
    const uint16_t want = f32_to_bf16(static_cast<float>(exact)).bits;
    for (int r = 0; r < kN; ++r) ASSERT_EQ(out[r][i].bits, want) << "i=" << i << " rank " << r;
    naive_differs += naive.bits != want;
  }
  EXPECT_GT(naive_differs, 0) << "the test data should tell f32 from bf16 accumulation";
}

// in_dtype: the 2-byte values are summed in rank order, each partial sum rounded (as NCCL does):
// 1 + 2^-8 + 2^-8 + 2^-8 is 1 in bf16 (ties to even at every step), 1 + 2^-6 summed in f32.
TEST(LocalBackend, InDtypeSumsRoundEveryPartialSum) {
  run(4, [](Backend& b) {
    const float mine = b.rank() == 0 ? 1.0f : 1.0f / 256.0f;
    std::vector<bf16_t> v = {f32_to_bf16(mine), f32_to_bf16(2.0f)};
    std::vector<bf16_t> w = v;
    AllReduceOptions o;
    o.in_dtype = true;
    b.all_reduce(v.data(), 2, DType::kBF16, o)->wait();
    EXPECT_EQ(bf16_to_f32(v[0]), 1.0f);
    EXPECT_EQ(bf16_to_f32(v[1]), 8.0f);
    b.all_reduce(w.data(), 2, DType::kBF16, {})->wait();
    EXPECT_EQ(bf16_to_f32(w[0]), 1.015625f);
    std::vector<f16_t> s = {f32_to_f16(1.0f), f32_to_f16(2.0f), f32_to_f16(3.0f), f32_to_f16(4.0f)};
    std::vector<f16_t> r(1);
    ReduceScatterOptions ro;
    ro.in_dtype = true;
    ro.op = ReduceOp::kAvg;
    b.reduce_scatter(r.data(), s.data(), 1, DType::kF16, ro)->wait();
    EXPECT_EQ(f16_to_f32(r[0]), 1.0f + b.rank());
    o.op = ReduceOp::kMax;
    EXPECT_THROW(b.all_reduce(v.data(), 2, DType::kBF16, o), Error);
  });
}

TEST(LocalBackend, F16AvgAndReduceScatter) {
  run(2, [](Backend& b) {
    std::vector<f16_t> v = {f32_to_f16(1.0f + b.rank()), f32_to_f16(-3.0f * b.rank())};
    AllReduceOptions o;
    o.op = ReduceOp::kAvg;
    b.all_reduce(v.data(), 2, DType::kF16, o)->wait();
    EXPECT_EQ(f16_to_f32(v[0]), 1.5f);
    EXPECT_EQ(f16_to_f32(v[1]), -1.5f);
    std::vector<bf16_t> s = {f32_to_bf16(1.0f), f32_to_bf16(2.0f), f32_to_bf16(3.0f),
                             f32_to_bf16(4.0f)};
    std::vector<bf16_t> r(2);
    b.reduce_scatter(r.data(), s.data(), 2, DType::kBF16, {})->wait();
    EXPECT_EQ(bf16_to_f32(r[0]), b.rank() == 0 ? 2.0f : 6.0f);
    EXPECT_EQ(bf16_to_f32(r[1]), b.rank() == 0 ? 4.0f : 8.0f);
  });
}

// One rank (a single-process run's groups): every reduction leaves its values bit for bit, in
// every dtype and op (they are not widened and narrowed), and reduce_scatter copies send to recv.
TEST(LocalBackend, OneRankReductionsAreItsOwnValues) {
  run(1, [](Backend& b) {
    const std::vector<float> f = {1.0f / 3.0f, -0.0f, 1e-40f, 65504.0f, -7.25f, 3e38f};
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax})
        for (bool in_dtype : {false, true}) {
          if (in_dtype && (dt == DType::kF32 || op != ReduceOp::kSum)) continue;
          const size_t esz = dtype_size(dt), n = f.size();
          std::vector<char> want(n * esz), v(n * esz), s(n * esz), r(n * esz, 0x5a);
          convert(want.data(), dt, f.data(), DType::kF32, n);
          v = want;
          s = want;
          AllReduceOptions o;
          o.op = op;
          o.in_dtype = in_dtype;
          b.all_reduce(v.data(), n, dt, o)->wait();
          EXPECT_EQ(v, want) << dtype_name(dt) << " op " << static_cast<int>(op);
          ReduceScatterOptions ro;
          ro.op = op;
          ro.in_dtype = in_dtype;
          b.reduce_scatter(r.data(), s.data(), n, dt, ro)->wait();
          EXPECT_EQ(r, want) << dtype_name(dt) << " op " << static_cast<int>(op);
          EXPECT_EQ(s, want);
        }
  });
}

TEST(LocalBackend, TimeoutNamesTheMissingRankCollectiveAndSeq) {
  auto errors = run_local_ranks(3, [](Backend& b) {
    float v = 1;
    b.all_reduce(&v, 1, DType::kF32, {})->wait();  // #0: everyone
    if (b.rank() == 1) return;                     // rank 1 never arrives at #1
    AllReduceOptions o;
    o.timeout = std::chrono::milliseconds(4000);  // rank 2 arrives well within it, even on a loaded machine
    o.tag = "grads";
    b.all_reduce(&v, 1, DType::kF32, o)->wait();
  });
  EXPECT_FALSE(errors[1]);
  for (int r : {0, 2}) {
    ASSERT_TRUE(errors[r]) << "rank " << r;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const CommTimeout& e) {
      EXPECT_EQ(e.collective(), "all_reduce");
      EXPECT_EQ(e.seq(), 1u);
      EXPECT_EQ(e.missing_ranks(), std::vector<int>{1});
      EXPECT_NE(std::string(e.what()).find("all_reduce #1 [grads]"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 1 has not arrived"), std::string::npos) << e.what();
    }
  }
}

TEST(LocalBackend, MismatchedCollectivesAreNamed) {
  auto errors = run_local_ranks(2, [](Backend& b) {
    float v[2] = {1, 2};
    if (b.rank() == 0) b.all_reduce(v, 2, DType::kF32, {})->wait();
    else b.broadcast(v, 2, DType::kF32, {})->wait();
  });
  for (auto& e : errors) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      EXPECT_EQ(err.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(err.what()).find("collective #0 mismatch"), std::string::npos);
    }
  }
}

TEST(LocalBackend, AsyncWorkCompletesWhenTheLastRankArrives) {
  run(2, [](Backend& b) {
    float v = static_cast<float>(b.rank() + 1);
    auto w = b.all_reduce(&v, 1, DType::kF32, {});
    w->wait();
    EXPECT_TRUE(w->is_completed());
    EXPECT_EQ(v, 3.0f);
  });
}

TEST(LocalBackend, SendRecvInOrder) {
  run(3, [](Backend& b) {
    if (b.rank() == 0) {
      float a = 1, c = 2;
      auto w1 = b.send(&a, 1, DType::kF32, 2, {});
      auto w2 = b.send(&c, 1, DType::kF32, 2, {});
      w1->wait();
      w2->wait();
    } else if (b.rank() == 2) {
      float a = 0, c = 0;
      b.recv(&a, 1, DType::kF32, 0, {})->wait();
      b.recv(&c, 1, DType::kF32, 0, {})->wait();
      EXPECT_EQ(a, 1.0f);
      EXPECT_EQ(c, 2.0f);
      RecvOptions o;
      o.timeout = std::chrono::milliseconds(50);
      EXPECT_THROW(b.recv(&a, 1, DType::kF32, 1, o)->wait(), CommTimeout);
    }
  });
}

TEST(LocalBackend, SendRecvMatchByTag) {
  run(2, [](Backend& b) {
    if (b.rank() == 0) {
      float grad = 1, act = 2;
      SendOptions g, a;
      g.msg_tag = 1;  // sent first
      a.msg_tag = 2;
      auto w1 = b.send(&grad, 1, DType::kF32, 1, g);
      auto w2 = b.send(&act, 1, DType::kF32, 1, a);
      w1->wait();
      w2->wait();
    } else {
      float act = 0, grad = 0;
      RecvOptions a, g;
      a.msg_tag = 2;  // received first
      g.msg_tag = 1;
      b.recv(&act, 1, DType::kF32, 0, a)->wait();
      b.recv(&grad, 1, DType::kF32, 0, g)->wait();
      EXPECT_EQ(act, 2.0f);
      EXPECT_EQ(grad, 1.0f);
      RecvOptions bad;
      bad.msg_tag = -1;
      EXPECT_THROW(b.recv(&act, 1, DType::kF32, 0, bad), Error);
      EXPECT_GE(b.max_msg_tag(), kMaxMsgTag);
    }
  });
}

TEST(LocalBackend, NewGroupAndSplit) {
  run(kN, [](Backend& b) {
    auto g = b.new_group({3, 1});
    if (b.rank() == 3 || b.rank() == 1) {
      ASSERT_TRUE(g);
      EXPECT_EQ(g->size(), 2);
      EXPECT_EQ(g->rank(), b.rank() == 3 ? 0 : 1);
      float v = static_cast<float>(b.rank());
      g->all_reduce(&v, 1, DType::kF32, {})->wait();
      EXPECT_EQ(v, 4.0f);
    } else {
      EXPECT_FALSE(g);
    }
    auto odd = b.split(b.rank() % 2, -b.rank());
    EXPECT_EQ(odd->size(), 2);
    EXPECT_EQ(odd->rank(), b.rank() < 2 ? 1 : 0);  // key -rank: higher world rank first
  });
}

}  // namespace
}  // namespace mt::comm
