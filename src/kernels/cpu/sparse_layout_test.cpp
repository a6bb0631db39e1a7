// Tests of DeepSpeed's block layouts (sparse_layout.h). The expected matrices are worked out by
// hand from the definitions in DeepSpeed's deepspeed/ops/sparse_attention/sparsity_config.py
// (row r, column c = query block r attends to key block c); random blocks are checked by count and
// range only (our generator is not Python's). Every error DeepSpeed raises must name its key.
#include "kernels/cpu/sparse_layout.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "base/error.h"

namespace mt::kernels {
namespace {

using Rows = std::vector<std::string>;

Rows plane(const SparseLayout& layout, int h) {
  Rows rows(layout.num_blocks);
  for (int r = 0; r < layout.num_blocks; ++r)
    for (int c = 0; c < layout.num_blocks; ++c) rows[r] += layout.at(h, r, c) ? '1' : '0';
  return rows;
}

SparseLayout make(SparsityPattern pattern, int nb, int num_heads = 1, bool per_head = false,
                  int block = 16) {
  SparsityConfig config;
  config.num_heads = num_heads;
  config.block = block;
  config.different_layout_per_head = per_head;
  config.pattern = std::move(pattern);
  return sparse_layout_make(config, nb * block);
}

int row_count(const SparseLayout& layout, int h, int r) {
  int n = 0;
  for (int c = 0; c < layout.num_blocks; ++c) n += layout.at(h, r, c);
  return n;
}

constexpr auto kUni = SparseDirection::kUnidirectional;

TEST(SparseLayoutTest, DefaultsAreDeepSpeeds) {
  const SparsityConfig config;
  EXPECT_EQ(config.block, 16);
  EXPECT_FALSE(config.different_layout_per_head);
  const FixedSparsity f;
  EXPECT_EQ(f.num_local_blocks, 4);
  EXPECT_EQ(f.num_global_blocks, 1);
  EXPECT_EQ(f.attention, SparseDirection::kBidirectional);
  EXPECT_FALSE(f.horizontal_global_attention);
  EXPECT_EQ(f.num_different_global_patterns, 1);
  const VariableSparsity v;
  EXPECT_EQ(v.num_random_blocks, 0);
  EXPECT_EQ(v.local_window_blocks, std::vector<int>{4});
  EXPECT_EQ(v.global_block_indices, std::vector<int>{0});
  EXPECT_FALSE(v.global_block_end_indices.has_value());
  const BigBirdSparsity b;
  EXPECT_EQ(b.num_random_blocks, 1);
  EXPECT_EQ(b.num_sliding_window_blocks, 3);
  EXPECT_EQ(b.num_global_blocks, 1);
  const BSLongformerSparsity l;
  EXPECT_EQ(l.num_sliding_window_blocks, 3);
  EXPECT_EQ(l.global_block_indices, std::vector<int>{0});
  EXPECT_EQ(sparsity_mode_name(SparsityPattern{BSLongformerSparsity{}}),
            std::string("bslongformer"));
  EXPECT_EQ(sparse_direction_from_name("unidirectional"), kUni);
  EXPECT_EQ(sparse_direction_name(kUni), std::string("unidirectional"));
}

TEST(SparseLayoutTest, Dense) {
  const SparseLayout layout = make(DenseSparsity{}, 3, 2);
  EXPECT_EQ(layout.num_heads, 2);
  EXPECT_EQ(layout.num_blocks, 3);
  EXPECT_EQ(layout.nonzero_blocks(), 18u);
}

TEST(SparseLayoutTest, FixedBidirectional) {
  // Windows {0..3}, {4..7}; the last block of each window (3, 7) is a global column.
  const SparseLayout layout = make(FixedSparsity{}, 8, 3);
  const Rows expected = {"11110001", "11110001", "11110001", "11110001",
                         "00011111", "00011111", "00011111", "00011111"};
  for (int h = 0; h < 3; ++h) EXPECT_EQ(plane(layout, h), expected) << "head " << h;
}

TEST(SparseLayoutTest, FixedUnidirectional) {
  FixedSparsity f;
  f.attention = kUni;
  EXPECT_EQ(plane(make(f, 8), 0), (Rows{"10000000", "11000000", "11100000", "11110000",
                                        "00011000", "00011100", "00011110", "00011111"}));
}

TEST(SparseLayoutTest, FixedShortLastWindowAndHorizontal) {
  // nb = 6: windows {0..3}, {4, 5}; the short window's global block is min(4 + 3, 6 - 1) = 5.
  EXPECT_EQ(plane(make(FixedSparsity{}, 6), 0),
            (Rows{"111101", "111101", "111101", "111101", "000111", "000111"}));
  FixedSparsity f;
  f.horizontal_global_attention = true;  // global rows 3 and 7 see everything
  EXPECT_EQ(plane(make(f, 8), 0), (Rows{"11110001", "11110001", "11110001", "11111111",
                                        "00011111", "00011111", "00011111", "11111111"}));
}

// The layout a model of length T runs is DeepSpeed's SparseSelfAttention's: made for 2048 and
// cropped. Fixed's default at nb = 6 made for 6 has the short last window's global block 5; cropped
// from 128 blocks the windows are {0..3}, {4..7} and the global blocks 3, 7: column 5 is local to
// rows 4-5 only. T alone was taken (rows 0-3 attended to block 5).
TEST(SparseLayoutTest, ALengthRunsDeepSpeedsMasterLayoutCropped) {
  SparsityConfig config;
  config.block = 16;
  config.pattern = FixedSparsity{};
  const SparseLayout l = sparse_layout_for_length(config, 6 * 16);
  ASSERT_EQ(l.num_blocks, 6);
  EXPECT_EQ(plane(l, 0), (Rows{"111100", "111100", "111100", "111100", "000111", "000111"}));
  // Past 2048, or a block that does not divide 2048: the length's own layout.
  config.block = 24;
  EXPECT_EQ(plane(sparse_layout_for_length(config, 6 * 24), 0), plane(sparse_layout_make(config, 6 * 24), 0));
  config.block = 16;
  EXPECT_EQ(plane(sparse_layout_for_length(config, 2064), 0), plane(sparse_layout_make(config, 2064), 0));
}

TEST(SparseLayoutTest, FixedGlobalPatternsPerHead) {
  // Two patterns: heads 0, 2 use the last block of each window (3, 7), head 1 the one before
  // (2, 6).
  FixedSparsity f;
  f.attention = kUni;
  f.num_different_global_patterns = 2;
  const SparseLayout layout = make(f, 8, 3, true);
  const Rows head1 = {"10000000", "11000000", "11100000", "11110000",
                      "00101000", "00101100", "00101110", "00101111"};
  EXPECT_EQ(plane(layout, 1), head1);
  EXPECT_EQ(plane(layout, 0), plane(layout, 2));
  EXPECT_EQ(plane(layout, 0), plane(make(FixedSparsity{.attention = kUni}, 8), 0));
}

TEST(SparseLayoutTest, VariableWindowsAndGlobalIndex) {
  // Windows of 1 and 2 blocks, then of 2 to the end: {0}, {1,2}, {3,4}, {5,6}, {7}; column 0 is
  // global.
  VariableSparsity v;
  v.local_window_blocks = {1, 2};
  EXPECT_EQ(plane(make(v, 8), 0), (Rows{"10000000", "11100000", "11100000", "10011000",
                                        "10011000", "10000110", "10000110", "10000001"}));
}

TEST(SparseLayoutTest, VariableUnidirectionalGlobalRange) {
  VariableSparsity v;
  v.local_window_blocks = {1, 2};
  v.global_block_indices = {2};
  v.global_block_end_indices = std::vector<int>{4};  // global blocks 2 and 3, rows from 2 on
  v.attention = kUni;
  // NOTE: DeepSpeed starts the rows of a global range at its first block, so (2, 3) is set above
  // the diagonal; variable is the one mode not made lower-triangular (the kernel's causal flag
  // drops such blocks).
  EXPECT_EQ(plane(make(v, 8), 0), (Rows{"10000000", "01000000", "01110000", "00110000",
                                        "00111000", "00110100", "00110110", "00110001"}));
}

TEST(SparseLayoutTest, VariableHorizontalAndOutOfRangeIndex) {
  VariableSparsity v;
  v.global_block_indices = {1, 9};  // 9 >= nb: ignored, as DeepSpeed does
  v.horizontal_global_attention = true;
  EXPECT_EQ(plane(make(v, 8), 0), (Rows{"11110000", "11111111", "11110000", "11110000",
                                        "01001111", "01001111", "01001111", "01001111"}));
}

TEST(SparseLayoutTest, VariableRandomBlocksAddCountPerRow) {
  VariableSparsity v;
  v.local_window_blocks = {1};  // the diagonal only
  v.global_block_indices = {};
  v.num_random_blocks = 3;
  const SparseLayout layout = make(v, 32, 2, true);
  int rows_with_four = 0;
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < 32; ++r) {
      const int n = row_count(layout, h, r);
      EXPECT_TRUE(n == 4 || (n == 3 && layout.at(h, r, r))) << h << " " << r;  // distinct draws
      rows_with_four += n == 4;
    }
  EXPECT_GT(rows_with_four, 32);
  EXPECT_NE(plane(layout, 0), plane(layout, 1));  // one stream: heads draw differently
}

TEST(SparseLayoutTest, RandomBlocksFollowTheSeed) {
  SparsityConfig config;
  config.pattern = BigBirdSparsity{};
  const SparseLayout a = sparse_layout_make(config, 1024), b = sparse_layout_make(config, 1024);
  config.seed = 7;
  const SparseLayout c = sparse_layout_make(config, 64 * 16);
  EXPECT_EQ(a.blocks, b.blocks);
  EXPECT_NE(a.blocks, c.blocks);
}

TEST(SparseLayoutTest, BigBird) {
  // Sliding window of 3 (|r - c| <= 1), block 0 global (row and column), no random blocks.
  BigBirdSparsity b;
  b.num_random_blocks = 0;
  EXPECT_EQ(plane(make(b, 6), 0),
            (Rows{"111111", "111000", "111100", "101110", "100111", "100011"}));
  b.attention = kUni;
  EXPECT_EQ(plane(make(b, 6), 0),
            (Rows{"100000", "110000", "111000", "101100", "100110", "100011"}));
}

TEST(SparseLayoutTest, BigBirdRandomBlocks) {
  BigBirdSparsity b;
  b.num_random_blocks = 2;
  b.num_sliding_window_blocks = 1;  // the diagonal
  b.num_global_blocks = 0;
  const SparseLayout bi = make(b, 40);
  for (int r = 0; r < 40; ++r) {
    const int n = row_count(bi, 0, r);
    EXPECT_TRUE(n == 3 || (n == 2 && bi.at(0, r, r))) << r;
  }
  b.num_random_blocks = 1;  // unidirectional draws from blocks 0..r
  b.attention = kUni;
  const SparseLayout uni = make(b, 40);
  int off_diagonal = 0;
  for (int r = 0; r < 40; ++r) {
    for (int c = r + 1; c < 40; ++c) EXPECT_EQ(uni.at(0, r, c), 0) << r << " " << c;
    const int n = row_count(uni, 0, r);
    EXPECT_TRUE(n == 1 || n == 2) << r;
    off_diagonal += n - 1;
  }
  EXPECT_GT(off_diagonal, 20);
}

TEST(SparseLayoutTest, BSLongformer) {
  BSLongformerSparsity l;
  l.global_block_indices = {2};
  l.global_block_end_indices = std::vector<int>{4};  // blocks 2, 3: global rows and columns
  EXPECT_EQ(plane(make(l, 6), 0),
            (Rows{"111100", "111100", "111111", "111111", "001111", "001111"}));
  l.attention = kUni;
  EXPECT_EQ(plane(make(l, 6), 0),
            (Rows{"100000", "110000", "111000", "111100", "001110", "001111"}));
  EXPECT_EQ(plane(make(BSLongformerSparsity{}, 4), 0), (Rows{"1111", "1110", "1111", "1011"}));
}

// --- every error names its key ---

void expect_refused(const std::function<void()>& f, const std::string& key) {
  try {
    f();
    ADD_FAILURE() << "no error for " << key;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("sparse_attention." + key + ":"), std::string::npos)
        << e.what();
  }
}

void expect_refused(SparsityPattern pattern, int nb, const std::string& key,
                    bool per_head = false) {
  expect_refused([&] { make(pattern, nb, 2, per_head); }, key);
}

TEST(SparseLayoutErrorTest, Common) {
  SparsityConfig config;
  expect_refused([&] { sparse_layout_make(config, 100); }, "block");  // 100 % 16
  config.block = 0;
  expect_refused([&] { sparse_layout_make(config, 64); }, "block");
  config.block = 16;
  config.num_heads = 0;
  expect_refused([&] { sparse_layout_make(config, 64); }, "num_heads");
  expect_refused([] { sparse_direction_from_name("causal"); }, "attention");
}

TEST(SparseLayoutErrorTest, Fixed) {
  expect_refused(FixedSparsity{.num_local_blocks = 6, .num_global_blocks = 4}, 8,
                 "num_local_blocks");
  expect_refused(FixedSparsity{.num_local_blocks = 0}, 8, "num_local_blocks");
  expect_refused(FixedSparsity{.num_global_blocks = 0}, 8, "num_global_blocks");
  expect_refused(FixedSparsity{.attention = kUni, .horizontal_global_attention = true}, 8,
                 "horizontal_global_attention");
  expect_refused(FixedSparsity{.num_different_global_patterns = 2}, 8,
                 "num_different_global_patterns");
  expect_refused(FixedSparsity{.num_local_blocks = 4, .num_global_blocks = 2,
                               .num_different_global_patterns = 3},
                 8, "num_different_global_patterns", true);
  expect_refused(FixedSparsity{.num_different_global_patterns = 0}, 8,
                 "num_different_global_patterns");
}

TEST(SparseLayoutErrorTest, Variable) {
  expect_refused(VariableSparsity{.num_random_blocks = 9}, 8, "num_random_blocks");
  expect_refused(VariableSparsity{.num_random_blocks = -1}, 8, "num_random_blocks");
  expect_refused(VariableSparsity{.local_window_blocks = {}}, 8, "local_window_blocks");
  expect_refused(VariableSparsity{.local_window_blocks = {2, 0}}, 8, "local_window_blocks");
  expect_refused(VariableSparsity{.global_block_indices = {-1}}, 8, "global_block_indices");
  expect_refused(VariableSparsity{.global_block_indices = {0, 4},
                                  .global_block_end_indices = std::vector<int>{2}},
                 8, "global_block_end_indices");
  expect_refused(VariableSparsity{.global_block_indices = {3},
                                  .global_block_end_indices = std::vector<int>{3}},
                 8, "global_block_end_indices");
  expect_refused(VariableSparsity{.attention = kUni, .horizontal_global_attention = true}, 8,
                 "horizontal_global_attention");
}

TEST(SparseLayoutErrorTest, BigBird) {
  expect_refused(BigBirdSparsity{.num_random_blocks = 5}, 4, "num_random_blocks");
  expect_refused(BigBirdSparsity{.num_random_blocks = 2, .attention = kUni}, 8,
                 "num_random_blocks");  // row 0 has one block to draw from
  expect_refused(BigBirdSparsity{.num_sliding_window_blocks = 5}, 4, "num_sliding_window_blocks");
  expect_refused(BigBirdSparsity{.num_global_blocks = 5}, 4, "num_global_blocks");
  expect_refused(BigBirdSparsity{.num_global_blocks = -1}, 4, "num_global_blocks");
}

TEST(SparseLayoutErrorTest, BSLongformer) {
  expect_refused(BSLongformerSparsity{.num_sliding_window_blocks = 5}, 4,
                 "num_sliding_window_blocks");
  expect_refused(BSLongformerSparsity{.global_block_indices = {0, 1},
                                      .global_block_end_indices = std::vector<int>{1}},
                 4, "global_block_end_indices");
  expect_refused(BSLongformerSparsity{.global_block_indices = {2},
                                      .global_block_end_indices = std::vector<int>{1}},
                 4, "global_block_end_indices");
  expect_refused(BSLongformerSparsity{.global_block_indices = {-2}}, 4, "global_block_indices");
}

}  // namespace
}  // namespace mt::kernels
