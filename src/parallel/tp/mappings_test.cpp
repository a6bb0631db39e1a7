// Megatron's mapping primitives on 1, 2 and 4 ranks (threads over the local backend), each against
// what it must compute, forward and backward (each region's backward is another primitive).
#include "parallel/tp/mappings.h"

#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "comm/local_backend.h"

namespace mt::parallel {
namespace {

// A value that tells rank, row and column apart.
float val(int rank, size_t row, size_t col) { return static_cast<float>(rank * 1000 + row * 10 + col); }

// A rank's (rows, cols) block of val.
std::vector<float> block_of(int rank, size_t rows, size_t cols) {
  std::vector<float> b(rows * cols);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) b[r * cols + c] = val(rank, r, c);
  return b;
}

void on_ranks(int n, const std::function<void(TpComm&)>& fn) {
  auto errs = comm::run_local_ranks(n, [&](comm::Backend& b) {
    TpComm tp(std::shared_ptr<comm::Backend>(&b, [](comm::Backend*) {}), std::chrono::milliseconds(10000));
    fn(tp);
  });
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

class Mappings : public ::testing::TestWithParam<int> {};

TEST_P(Mappings, AllReduceSumsAndMaxes) {  // reduce-from forward, copy-to backward
  const int S = GetParam();
  on_ranks(S, [S](TpComm& tp) {
    std::vector<float> x = {1.0f + tp.rank(), -2.0f * tp.rank(), 0.5f};
    tp.all_reduce(x.data(), x.size(), "test");
    EXPECT_EQ(x[0], S + S * (S - 1) / 2.0f);
    EXPECT_EQ(x[1], -1.0f * S * (S - 1));
    EXPECT_EQ(x[2], 0.5f * S);
    std::vector<float> m = {static_cast<float>(tp.rank()), -static_cast<float>(tp.rank())};
    tp.all_reduce_max(m.data(), m.size(), "test");
    EXPECT_EQ(m[0], S - 1.0f);
    EXPECT_EQ(m[1], 0.0f);
    EXPECT_EQ(tp.bytes(), S == 1 ? 0u : 5 * sizeof(float));
  });
}

TEST_P(Mappings, ColumnsScatterAndGatherAreInverse) {  // scatter-to / gather-from regions
  const int S = GetParam();
  on_ranks(S, [S](TpComm& tp) {
    const size_t rows = 3, lc = 2, cols = lc * static_cast<size_t>(S);
    std::vector<float> local = block_of(tp.rank(), rows, lc), full(rows * cols);
    tp.gather_columns(full.data(), local.data(), rows, lc, "test");
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c)
        ASSERT_EQ(full[r * cols + c], val(static_cast<int>(c / lc), r, c % lc)) << r << "," << c;
    std::vector<float> back(rows * lc);
    tp.keep_columns(back.data(), full.data(), rows, cols);
    EXPECT_EQ(back, local);
  });
}

TEST_P(Mappings, RowsGatherAndReduceScatter) {  // sequence-parallel regions
  const int S = GetParam();
  on_ranks(S, [S](TpComm& tp) {
    const size_t lr = 2, cols = 3, rows = lr * static_cast<size_t>(S);
    std::vector<float> mine = block_of(tp.rank(), lr, cols), all(rows * cols);
    tp.gather_rows(all.data(), mine.data(), lr, cols, "test");  // gather-from-sequence forward
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c) ASSERT_EQ(all[r * cols + c], val(static_cast<int>(r / lr), r % lr, c));
    std::vector<float> kept(lr * cols);
    tp.keep_rows(kept.data(), all.data(), rows, cols);  // scatter-to-sequence forward
    EXPECT_EQ(kept, mine);
    // reduce-scatter (its backward): every rank contributes `all` scaled by (rank + 1); block r
    // of the sum is sum_s (s+1) * all's block r.
    std::vector<float> contrib(all), out(lr * cols);
    for (float& x : contrib) x *= static_cast<float>(tp.rank() + 1);
    tp.reduce_scatter_rows(out.data(), contrib.data(), lr, cols, "test");
    const float k = S * (S + 1) / 2.0f;
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], k * all[static_cast<size_t>(tp.rank()) * lr * cols + i]);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Mappings, ::testing::Values(1, 2, 4));

TEST(Mappings, AGroupOfOneIssuesNoCollective) {
  TpComm none;  // no group at all: every primitive is a copy or nothing
  std::vector<float> x = {1, 2, 3, 4}, y(4);
  none.all_reduce(x.data(), 4, "t");
  none.gather_columns(y.data(), x.data(), 2, 2, "t");
  EXPECT_EQ(y, x);
  none.reduce_scatter_rows(y.data(), x.data(), 2, 2, "t");
  EXPECT_EQ(y, x);
  EXPECT_EQ(none.bytes(), 0u);
}

}  // namespace
}  // namespace mt::parallel
