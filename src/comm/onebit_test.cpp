// One-bit compression (pack/unpack, the norm-based scale, error feedback) and the compressed
// all-reduce on the local backend (threads as ranks) against a reference computed here from the
// formula in onebit.h; the comms logger's byte counts against the table in comm_log.h.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>

#include "base/cpu_features.h"
#include "comm/comm_log.h"
#include "comm/local_backend.h"
#include "comm/onebit.h"
#include "comm/onebit_reference_test_util.h"

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

// DeepSpeed's corrected_tensor_size: a multiple of ranks · lcm(ranks, 8).
TEST(OneBit, LayoutIsDeepSpeedsCorrectedSize) {
  OneBitLayout L(1000, 3);
  EXPECT_EQ(L.padded, 1008u);  // 3 · 24 = 72 divides 1008
  EXPECT_EQ(L.chunk, 336u);
  EXPECT_EQ(L.begin(2), 672u);
  EXPECT_EQ(L.words(), 1u + 11u);  // a scale and 42 bytes of bits
  OneBitLayout tiny(5, 4);
  EXPECT_EQ(tiny.padded, 32u);
  EXPECT_EQ(tiny.chunk, 8u);
  EXPECT_EQ(OneBitLayout(4096, 2).padded, 4096u);
  for (int n : {1, 2, 3, 4, 5, 8})
    for (size_t len : {1u, 7u, 100u, 1003u}) EXPECT_EQ(OneBitLayout(len, n).padded, testing::ds_corrected_size(len, n));
}

// Against DeepSpeed's compressed_allreduce written again (onebit_reference_test_util.h): every
// rank's inputs are known here (seeded by rank), step after step with the errors carried. Bit for
// bit. A plan of several tensors is each of them on its own. The flat buffer was one tensor with a
// scale per server chunk and padding that carried no error: another compression than DeepSpeed's.
void check_compressed_all_reduce(int n, const std::vector<size_t>& lens) {
  const int steps = 3;
  size_t total = 0;
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t len : lens) spans.emplace_back(total, len), total += len;
  std::vector<std::vector<float>> results(n);
  auto errs = run_local_ranks(n, [&](Backend& b) {
    const OneBitPlan plan(spans, n);
    std::vector<float> we(plan.worker_error_len, 0.0f), se(plan.server_error_len, 0.0f), buf;
    for (int t = 0; t < steps; ++t) {
      buf = randn(total, static_cast<uint32_t>(100 * t + b.rank()));
      if (lens.size() == 1) compressed_all_reduce(b, buf.data(), total, we.data(), se.data());
      else compressed_all_reduce(b, buf.data(), plan, we.data(), se.data());
    }
    results[b.rank()] = buf;
    // The scratch the rank's thread (a fresh one) keeps: what the planner counts (the messages
    // sent, received and gathered, this rank's server message, the largest server chunk).
    EXPECT_EQ(compressed_all_reduce_scratch_held(), compressed_all_reduce_scratch_bytes(plan));
  });
  for (auto& e : errs) ASSERT_EQ(e, nullptr);
  std::vector<std::vector<std::vector<float>>> we(lens.size()), se(lens.size());
  std::vector<float> expect(total);
  for (int t = 0; t < steps; ++t) {
    for (size_t k = 0; k < lens.size(); ++k) {
      std::vector<std::vector<float>> x(n);
      for (int r = 0; r < n; ++r) {
        const std::vector<float> in = randn(total, static_cast<uint32_t>(100 * t + r));
        x[r].assign(in.begin() + static_cast<std::ptrdiff_t>(spans[k].first),
                    in.begin() + static_cast<std::ptrdiff_t>(spans[k].first + spans[k].second));
      }
      testing::ds_compressed_allreduce(x, we[k], se[k]);
      std::copy(x[0].begin(), x[0].end(), expect.begin() + static_cast<std::ptrdiff_t>(spans[k].first));
    }
  }
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < total; ++i) ASSERT_EQ(results[r][i], expect[i]) << "rank " << r << " i " << i;
}

// 1000 elements on 2 ranks: padded to 1008 (a multiple of 2 · lcm(2, 8)), chunks of 504, a
// message of 1 + 63/4 rounded up = 17 words; sent, received and gathered 2 · 17 words each, the
// server message 17 and the chunk 504: 4 · (119 + 504) bytes. Two tensors of 1000 and 100 on 3
// ranks: chunks of 336 (1008 / 3: lcm 24, unit 72, 1008) and 48 (144 / 3), messages of 1 + 11 and
// 1 + 2 words, 15 in all: 4 · (10 · 15 + 336). One rank keeps none.
TEST(OneBit, CompressedAllReduceScratchIsItsMessagesAndLargestChunk) {
  EXPECT_EQ(compressed_all_reduce_scratch_bytes(OneBitPlan({{0, 1000}}, 2)), 4u * (7 * 17 + 504));
  EXPECT_EQ(compressed_all_reduce_scratch_bytes(OneBitPlan({{0, 1000}, {1000, 100}}, 3)), 4u * (10 * 15 + 336));
  EXPECT_EQ(compressed_all_reduce_scratch_bytes(OneBitPlan({{0, 1000}}, 1)), 0u);
}

TEST(OneBit, CompressedAllReduceIsDeepSpeeds2Ranks) { check_compressed_all_reduce(2, {1000}); }
TEST(OneBit, CompressedAllReduceIsDeepSpeeds4Ranks) { check_compressed_all_reduce(4, {1003}); }
TEST(OneBit, CompressedAllReduceTinyBuffer) { check_compressed_all_reduce(4, {5}); }
TEST(OneBit, CompressedAllReduceOfTensorsIsEachOnItsOwn) { check_compressed_all_reduce(3, {40, 8, 1000, 1, 24}); }

// The comms logger's counts: an all-reduce of N floats on n ranks sends 2(n-1)·4N/n bytes; the
// compressed all-reduce sends 2(n-1)·4·(1 + ceil(chunk/32)) (its all_to_all and all_gather).
// Past one block of 16,384 elements (the passes' blocks over the threads, the scale's sums added in
// block order) and on either ISA (a CPU without AVX-512 runs the portable one twice): DeepSpeed's
// values bit for bit, as above.
TEST(OneBit, CompressedAllReduceOfALargeBufferOnEitherIsa) {
  const Isa was = isa_active();
  for (Isa isa : {Isa::kPortable, Isa::kAvx512}) {
    isa_force(isa);
    check_compressed_all_reduce(2, {100003});
    check_compressed_all_reduce(3, {40000, 70001});
  }
  isa_force(was);
}

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
      std::vector<float> we(L.padded, 0.0f), se(L.chunk, 0.0f);
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
      EXPECT_EQ(ob[r], 2 * (nn - 1) * 4 * OneBitLayout(N, n).words());
      EXPECT_EQ(a2a[r], 1u);
      EXPECT_EQ(ag[r], 1u);
      EXPECT_GE(static_cast<double>(ar[r]) / static_cast<double>(ob[r]), 16.0);
    }
  }
}

// A summary line's columns.
struct SummaryRow {
  std::string op;
  double size = 0, count = 0, sent = 0, total_ms = 0, avg_ms = 0, tput = 0, busbw = 0;
};
SummaryRow summary_row(const std::string& line) {
  SummaryRow r;
  std::istringstream row(line);
  row >> r.op >> r.size >> r.count >> r.sent >> r.total_ms >> r.avg_ms >> r.tput >> r.busbw;
  return r;
}

// DeepSpeed's summary: averages are scipy's trim_mean(values, 0.1), and an all_reduce's tput is
// 2 S / t (calc_bw_log); both were a plain mean of S / t.
TEST(CommLog, AveragesAndTputAreDeepSpeeds) {
  EXPECT_DOUBLE_EQ(comm_trim_mean({5, 1, 100, 2, 3, 4, 6, 7, 8, 9, 10}), 6.0);  // int(1.1) = 1 cut from each end
  EXPECT_DOUBLE_EQ(comm_trim_mean({1, 2, 30}), 11.0);                          // fewer than 10: nothing cut
  CommLog log;
  for (double t : {1e-6, 1e-6, 1e-6, 1e-6, 1e-6, 1e-6, 1e-6, 1e-6, 1e-6, 1.0}) {  // one slow outlier
    log.issued(CommOp::kAllReduce, 1000, 1000, "");
    log.completed(CommOp::kAllReduce, 1000, 2, t, "");
  }
  const std::vector<std::string> lines = log.summary_lines();
  ASSERT_EQ(lines.size(), 2u);
  const SummaryRow r = summary_row(lines[1]);
  EXPECT_NEAR(r.avg_ms, 1e-3, 1e-6);  // the outlier cut
  EXPECT_NEAR(r.tput, 2.0 * 1000 / 1e-6 * 8e-9, 1e-3);   // 16 Gbps
  EXPECT_NEAR(r.busbw, 1000 / 1e-6 * 8e-9, 1e-3);        // S/t · 2(n-1)/n, n = 2
}

// An all_gather's tput is its n inputs over the time (DeepSpeed's calc_bw_log: size *= n), listed
// under its input's size; busbw is that times (n-1)/n.
TEST(CommLog, AllGatherIsListedByItsInputAndPricedByItsOutput) {
  CommLog log;
  const size_t input = comm_msg_bytes(CommOp::kAllGather, 250, DType::kF32, 4);  // 1000 bytes a rank
  log.issued(CommOp::kAllGather, input, comm_sent_bytes(CommOp::kAllGather, 250, DType::kF32, 4, false), "");
  log.completed(CommOp::kAllGather, input, 4, 1e-6, "");
  const std::vector<std::string> lines = log.summary_lines();
  ASSERT_EQ(lines.size(), 2u);
  const SummaryRow r = summary_row(lines[1]);
  EXPECT_EQ(r.op, "all_gather");
  EXPECT_EQ(r.size, 1000) << lines[1];
  EXPECT_EQ(r.sent, 3000) << lines[1];
  EXPECT_NEAR(r.tput, 4 * 1000 / 1e-6 * 8e-9, 1e-3);           // 32 Gbps
  EXPECT_NEAR(r.busbw, 4 * 1000 / 1e-6 * 8e-9 * 0.75, 1e-3);  // 24 Gbps
}

TEST(CommLog, SentBytesTable) {
  EXPECT_EQ(comm_sent_bytes(CommOp::kAllReduce, 10, DType::kF32, 4, false), 60u);
  EXPECT_EQ(comm_sent_bytes(CommOp::kAllGather, 10, DType::kBF16, 4, false), 60u);
  EXPECT_EQ(comm_sent_bytes(CommOp::kReduceScatter, 10, DType::kF32, 2, false), 40u);
  EXPECT_EQ(comm_sent_bytes(CommOp::kBroadcast, 10, DType::kF32, 4, true), 40u);
  EXPECT_EQ(comm_sent_bytes(CommOp::kBroadcast, 10, DType::kF32, 4, false), 0u);
  EXPECT_EQ(comm_sent_bytes(CommOp::kAllReduce, 10, DType::kF32, 1, false), 0u);
  // DeepSpeed's message size is its call's `tensor`: all_gather's and gather's input, scatter's
  // output (it was their n blocks: an all_gather of 40 bytes a rank was listed as 160).
  EXPECT_EQ(comm_msg_bytes(CommOp::kAllGather, 10, DType::kF32, 4), 40u);
  EXPECT_EQ(comm_msg_bytes(CommOp::kGather, 10, DType::kF32, 4), 40u);
  EXPECT_EQ(comm_msg_bytes(CommOp::kScatter, 10, DType::kF32, 4), 40u);
  EXPECT_EQ(comm_msg_bytes(CommOp::kReduceScatter, 10, DType::kF32, 4), 160u);
  EXPECT_EQ(comm_msg_bytes(CommOp::kAllToAll, 10, DType::kF32, 4), 160u);
  EXPECT_DOUBLE_EQ(comm_busbw_factor(CommOp::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(comm_busbw_factor(CommOp::kAllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(comm_busbw_factor(CommOp::kSend, 4), 1.0);
}

}  // namespace
}  // namespace mt::comm
