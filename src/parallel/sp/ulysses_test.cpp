// The Ulysses all-to-all (parallel/sp/ulysses.h) on ranks over the local backend: a hand-made
// exchange, and to_tokens after to_heads is the identity (and the other way round).
#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "comm/local_backend.h"
#include "parallel/sp/ulysses.h"

namespace mt::parallel {
namespace {

// Every rank's output of fn(rank, comm), in rank order.
std::vector<std::vector<float>> on_ranks(int sp, const std::function<std::vector<float>(UlyssesComm&)>& fn) {
  std::vector<std::vector<float>> out(static_cast<size_t>(sp));
  std::mutex mu;
  auto errors = comm::run_local_ranks(sp, [&](comm::Backend& b) {
    std::shared_ptr<comm::Backend> group(&b, [](comm::Backend*) {});
    UlyssesComm u(group, comm::kDefaultTimeout);
    std::vector<float> mine = fn(u);
    std::lock_guard<std::mutex> lock(mu);
    out[static_cast<size_t>(b.rank())] = std::move(mine);
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

// Two ranks, one sequence of T = 4 tokens (2 a rank), a row of two segments of 2 (q heads 0-1,
// kv heads 0-1, head size 1). Rank r's token t, column c holds 100 r + 10 t + c.
TEST(Ulysses, ToHeadsByHand) {
  auto out = on_ranks(2, [](UlyssesComm& u) {
    std::vector<float> in(2 * 4), got(4 * 2);
    for (int t = 0; t < 2; ++t)
      for (int c = 0; c < 4; ++c) in[static_cast<size_t>(t * 4 + c)] = static_cast<float>(100 * u.rank() + 10 * t + c);
    u.to_heads(got.data(), in.data(), 1, 2, {2, 2}, "test");
    return got;
  });
  // Rank j: all 4 tokens (rank 0's two, then rank 1's), q head j then kv head j (columns j, 2 + j).
  const std::vector<float> rank0 = {0, 2, 10, 12, 100, 102, 110, 112};
  const std::vector<float> rank1 = {1, 3, 11, 13, 101, 103, 111, 113};
  EXPECT_EQ(out[0], rank0);
  EXPECT_EQ(out[1], rank1);
}

// The pure layout on one "rank": what pack_heads puts in rank 1's block, then unpack as if every
// rank had sent the same.
TEST(Ulysses, PackHeadsSplitsEverySegment) {
  // B 1, Tl 1, segments {4, 2, 2} over sp 2: row 0..7.
  std::vector<float> in = {0, 1, 2, 3, 4, 5, 6, 7}, send(8);
  ulysses_pack_heads(send.data(), in.data(), 1, 1, {4, 2, 2}, 2);
  EXPECT_EQ(send, (std::vector<float>{0, 1, 4, 6, 2, 3, 5, 7}));
  std::vector<float> back(8);
  ulysses_unpack_tokens(back.data(), send.data(), 1, 1, {4, 2, 2}, 2);
  EXPECT_EQ(back, in);
}

class UlyssesRoundTrip : public ::testing::TestWithParam<int> {};

TEST_P(UlyssesRoundTrip, ToTokensUndoesToHeadsAndBack) {
  const int sp = GetParam();
  const size_t B = 2, Tl = 3;
  const std::vector<size_t> segs = {8, 4, 4};  // q 8 heads, k and v 4 (GQA), head size 1
  const size_t W = 16, w = W / static_cast<size_t>(sp);
  auto out = on_ranks(sp, [&](UlyssesComm& u) {
    std::vector<float> in(B * Tl * W), heads(B * Tl * W), back(B * Tl * W), heads_back(B * Tl * W), tokens(B * Tl * W);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(1000 * u.rank() + static_cast<int>(i));
    u.to_heads(heads.data(), in.data(), B, Tl, segs, "test");
    u.to_tokens(back.data(), heads.data(), B, Tl, segs, "test");
    // The other way: all tokens of this rank's heads -> tokens -> heads.
    u.to_tokens(tokens.data(), heads.data(), B, Tl, segs, "test");
    u.to_heads(heads_back.data(), tokens.data(), B, Tl, segs, "test");
    float bad = 0;
    for (size_t i = 0; i < in.size(); ++i) bad += back[i] != in[i] || heads_back[i] != heads[i];
    // Spot check: sequence 1's token from rank sp-1's last row, this rank's first q column.
    const size_t T = Tl * static_cast<size_t>(sp), row = 1 * T + (static_cast<size_t>(sp) - 1) * Tl + (Tl - 1);
    const float want = static_cast<float>(1000 * (sp - 1) + static_cast<int>((1 * Tl + Tl - 1) * W) +
                                          u.rank() * static_cast<int>(8 / sp));
    return std::vector<float>{bad, heads[row * w], want};
  });
  for (int r = 0; r < sp; ++r) {
    EXPECT_EQ(out[static_cast<size_t>(r)][0], 0.0f) << "rank " << r;
    EXPECT_EQ(out[static_cast<size_t>(r)][1], out[static_cast<size_t>(r)][2]) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Sp, UlyssesRoundTrip, ::testing::Values(1, 2, 4));

}  // namespace
}  // namespace mt::parallel
