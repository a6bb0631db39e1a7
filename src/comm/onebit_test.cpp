// One-bit compression (pack/unpack, the norm-based scale, error feedback) and the compressed
// all-reduce on the local backend (threads as ranks) against a reference computed here from the
// formula in onebit.h; the comms logger's byte counts against the table in comm_log.h.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "comm/comm_log.h"
#include "comm/local_backend.h"
#include "comm/onebit.h"

namespace mt::comm {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

TEST(OneBit, PackIsMsbFirstAndUnpackRestoresSigns) {
  const std::vector<float> x = {1.0f, -2.0f, 0.0f, -0.0f, -1e-9f, 3.0f, -4.0f, 5.0f, -6.0f, 7.0f};
  uint8_t bits[2] = {0xff, 0xff};
  onebit_pack(bits, x.data(), x.size());
  // + - + + - + - + | - +  ->  1011 0101, 01 000000
  EXPECT_EQ(bits[0], 0xb5);
  EXPECT_EQ(bits[1], 0x40);
  std::vector<float> y(x.size());
  onebit_unpack(y.data(), bits, y.size(), 0.5f);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], x[i] < 0.0f ? -0.5f : 0.5f) << i;
}

TEST(OneBit, ScaleIsNormOverSqrtLen) {
  const std::vector<float> x = {3.0f, -4.0f, 0.0f, 0.0f};
  EXPECT_FLOAT_EQ(onebit_scale(x.data(), x.size()), 5.0f / 2.0f);
  EXPECT_EQ(onebit_scale(x.data(), 0), 0.0f);
}

TEST(OneBit, CompressKeepsTheErrorExactly) {
  auto x = randn(100, 1);
  std::vector<float> e(100, 0.25f), c(100);
  std::vector<float> before = e;
  std::vector<uint8_t> bits(13);
  const float s = onebit_compress(bits.data(), x.data(), e.data(), x.size());
  onebit_unpack(c.data(), bits.data(), c.size(), s);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(c[i] + e[i], x[i] + before[i], 1e-6f) << i;
}

// Error feedback: sum_t Q(x_t + e_{t-1}) = sum_t x_t - e_T, so the gap between the running sums
// is the last error, which stays bounded: it does not grow with the number of steps.
TEST(OneBit, ErrorFeedbackTracksTheRunningSum) {
  const size_t n = 256;
  std::vector<float> e(n, 0.0f), c(n);
  std::vector<double> sum_in(n, 0.0), sum_out(n, 0.0);
  std::vector<uint8_t> bits(n / 8);
  double gap_at_100 = 0.0, worst_late = 0.0;
  for (int t = 1; t <= 2000; ++t) {
    auto x = randn(n, static_cast<uint32_t>(t), 1.0f);
    for (size_t i = 0; i < n; ++i) x[i] += 0.1f * static_cast<float>(i % 7);  // a drift to track
    const float s = onebit_compress(bits.data(), x.data(), e.data(), n);
    onebit_unpack(c.data(), bits.data(), n, s);
    double gap = 0.0;
    for (size_t i = 0; i < n; ++i) {
      sum_in[i] += x[i];
      sum_out[i] += c[i];
      gap = std::max(gap, std::fabs(sum_in[i] - sum_out[i]));
    }
    if (t == 100) gap_at_100 = gap;
    if (t > 100) worst_late = std::max(worst_late, gap);
  }
  EXPECT_GT(gap_at_100, 0.0);
  // Bounded: 20x the steps, the gap stays within a small multiple of the early one (and of sigma).
  EXPECT_LT(worst_late, 3.0 * gap_at_100 + 1.0);
  EXPECT_LT(worst_late, 25.0);
}

TEST(OneBit, LayoutChunksAreWholeWordsAndCoverTheBuffer) {
  OneBitLayout L(1000, 3);
  EXPECT_EQ(L.chunk, 352u);  // ceil(1000/3) = 334 -> 352
  EXPECT_EQ(L.begin(0), 0u);
  EXPECT_EQ(L.end(2), 1000u);
  EXPECT_EQ(L.begin(2), 704u);
  EXPECT_EQ(L.words(), 12u);
  OneBitLayout tiny(5, 4);  // ranks 1..3 hold nothing
  EXPECT_EQ(tiny.end(0), 5u);
  EXPECT_EQ(tiny.begin(1), 5u);
  EXPECT_EQ(tiny.end(3), 5u);
}

// The reference: every rank's inputs are known here (seeded by rank), so the result follows by the
// formula of onebit.h in plain loops, step after step (errors carried).
void reference_step(std::vector<std::vector<float>>& in, std::vector<std::vector<float>>& we,
                    std::vector<std::vector<float>>& se, size_t len, int n, std::vector<float>& out) {
  OneBitLayout L(len, n);
  std::vector<std::vector<float>> q(n, std::vector<float>(len));
  for (int w = 0; w < n; ++w)
    for (int r = 0; r < n; ++r) {
      const size_t b = L.begin(r), m = L.end(r) - b;
      std::vector<float> c(m);
      for (size_t i = 0; i < m; ++i) c[i] = in[w][b + i] + we[w][b + i];
      double sq = 0;
      for (float v : c) sq += static_cast<double>(v) * v;
      const float s = m ? static_cast<float>(std::sqrt(sq / static_cast<double>(m))) : 0.0f;
      for (size_t i = 0; i < m; ++i) {
        q[w][b + i] = c[i] < 0 ? -s : s;
        we[w][b + i] = c[i] - q[w][b + i];
      }
    }
  out.assign(len, 0.0f);
  for (int r = 0; r < n; ++r) {
    const size_t b = L.begin(r), m = L.end(r) - b;
    std::vector<float> a(m, 0.0f);
    for (int w = 0; w < n; ++w)
      for (size_t i = 0; i < m; ++i) a[i] += q[w][b + i];
    for (size_t i = 0; i < m; ++i) a[i] = a[i] * (1.0f / static_cast<float>(n)) + se[r][i];
    double sq = 0;
    for (float v : a) sq += static_cast<double>(v) * v;
    const float s = m ? static_cast<float>(std::sqrt(sq / static_cast<double>(m))) : 0.0f;
    for (size_t i = 0; i < m; ++i) {
      out[b + i] = a[i] < 0 ? -s : s;
      se[r][i] = a[i] - out[b + i];
    }
  }
}

void check_compressed_all_reduce(int n, size_t len) {
  const int steps = 3;
  std::vector<std::vector<float>> results(n);
  auto errs = run_local_ranks(n, [&](Backend& b) {
    OneBitLayout L(len, n);
    std::vector<float> we(len, 0.0f), se(L.chunk, 0.0f), buf;
    for (int t = 0; t < steps; ++t) {
      buf = randn(len, static_cast<uint32_t>(100 * t + b.rank()));
      compressed_all_reduce(b, buf.data(), len, we.data(), se.data());
    }
    results[b.rank()] = buf;
  });
  for (auto& e : errs) ASSERT_EQ(e, nullptr);
  std::vector<std::vector<float>> in(n), we(n, std::vector<float>(len, 0.0f));
  std::vector<std::vector<float>> se(n, std::vector<float>(OneBitLayout(len, n).chunk, 0.0f));
  std::vector<float> expect;
  for (int t = 0; t < steps; ++t) {
    for (int r = 0; r < n; ++r) in[r] = randn(len, static_cast<uint32_t>(100 * t + r));
    reference_step(in, we, se, len, n, expect);
  }
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < len; ++i) ASSERT_FLOAT_EQ(results[r][i], expect[i]) << "rank " << r << " i " << i;
}

TEST(OneBit, CompressedAllReduceMatchesTheFormula2Ranks) { check_compressed_all_reduce(2, 1000); }
TEST(OneBit, CompressedAllReduceMatchesTheFormula4Ranks) { check_compressed_all_reduce(4, 1003); }
TEST(OneBit, CompressedAllReduceTinyBuffer) { check_compressed_all_reduce(4, 5); }

// The comms logger's counts: an all-reduce of N floats on n ranks sends 2(n-1)·4N/n bytes; the
// compressed all-reduce sends 2(n-1)(4 + chunk/8) (its all_to_all and all_gather).
TEST(CommLog, CountsBytesByTheDocumentedFormulas) {
  for (int n : {2, 4}) {
    const size_t N = 4096;
    std::vector<uint64_t> ar(n), ob(n), a2a(n), ag(n);
    auto errs = run_local_ranks(n, [&](Backend& raw) {
      auto log = std::make_shared<CommLog>();
      std::shared_ptr<Backend> b = log_backend(std::shared_ptr<Backend>(&raw, [](Backend*) {}), log);
      // The wrapper takes the tags its backend takes (a pipeline's schedule is checked against them).
      EXPECT_EQ(b->max_msg_tag(), raw.max_msg_tag());
      EXPECT_EQ(b->split(0, raw.rank())->max_msg_tag(), raw.max_msg_tag());
      std::vector<float> v(N, 1.0f);
      b->all_reduce(v.data(), N, DType::kF32, {})->wait();
      ar[raw.rank()] = log->sent_bytes();
      log->reset();
      OneBitLayout L(N, n);
      std::vector<float> we(N, 0.0f), se(L.chunk, 0.0f);
      compressed_all_reduce(*b, v.data(), N, we.data(), se.data());
      ob[raw.rank()] = log->sent_bytes();
      a2a[raw.rank()] = log->count(CommOp::kAllToAll);
      ag[raw.rank()] = log->count(CommOp::kAllGather);
      EXPECT_GE(log->summary_lines().size(), 3u);
    });
    for (auto& e : errs) ASSERT_EQ(e, nullptr);
    const uint64_t nn = static_cast<uint64_t>(n);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(ar[r], 2 * (nn - 1) * N * 4 / nn);
      EXPECT_EQ(ob[r], 2 * (nn - 1) * (4 + OneBitLayout(N, n).chunk / 8));
      EXPECT_EQ(a2a[r], 1u);
      EXPECT_EQ(ag[r], 1u);
      EXPECT_GE(static_cast<double>(ar[r]) / static_cast<double>(ob[r]), 16.0);
    }
  }
}

TEST(CommLog, SentBytesTable) {
  EXPECT_EQ(comm_sent_bytes(CommOp::kAllReduce, 10, DType::kF32, 4, false), 60u);
  EXPECT_EQ(comm_sent_bytes(CommOp::kAllGather, 10, DType::kBF16, 4, false), 60u);
  EXPECT_EQ(comm_sent_bytes(CommOp::kReduceScatter, 10, DType::kF32, 2, false), 40u);
  EXPECT_EQ(comm_sent_bytes(CommOp::kBroadcast, 10, DType::kF32, 4, true), 40u);
  EXPECT_EQ(comm_sent_bytes(CommOp::kBroadcast, 10, DType::kF32, 4, false), 0u);
  EXPECT_EQ(comm_sent_bytes(CommOp::kAllReduce, 10, DType::kF32, 1, false), 0u);
  EXPECT_EQ(comm_msg_bytes(CommOp::kAllGather, 10, DType::kF32, 4), 160u);
  EXPECT_DOUBLE_EQ(comm_busbw_factor(CommOp::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(comm_busbw_factor(CommOp::kAllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(comm_busbw_factor(CommOp::kSend, 4), 1.0);
}

}  // namespace
}  // namespace mt::comm
