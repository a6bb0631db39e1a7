// Tests of the block-sparse attention (sparse_attention.h). Oracles:
// (a) PyTorch: tools/sparse_attention_oracle.py, run here with /usr/bin/python3 (Debian's
//     python3-torch), computes dense float64 attention under the elementwise mask expanded from the
//     layout and its gradients by autograd; a missing torch fails the test;
// (b) central finite differences of loss = sum(dout * out) on a naive double forward;
// (c) with the dense layout and the causal flag it must equal attention.h's causal kernels (a
//     consistency check, not an oracle).
// Every comparison runs on the portable and on the AVX-512 path (where the CPU has it).
#include "kernels/cpu/sparse_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/scratch_dir.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_test_util.h"

#ifndef MT_SOURCE_DIR
#define MT_SOURCE_DIR "."
#endif

namespace mt::kernels {
namespace {

struct Result {
  std::vector<float> out, lse, dqkv;
};

Result run_sparse(const std::vector<float>& qkv, const std::vector<float>& dout,
                  const SparseAttentionPlan& plan, const Shape& s) {
  Result r{std::vector<float>(s.out_size(), NAN), std::vector<float>(s.lse_size(), NAN),
           std::vector<float>(s.qkv_size(), NAN)};
  sparse_attention_forward(r.out.data(), r.lse.data(), qkv.data(), plan, s.B, s.T, s.NH, s.NKV,
                           s.HS);
  sparse_attention_backward(r.dqkv.data(), dout.data(), qkv.data(), r.out.data(), r.lse.data(),
                            plan, s.B, s.T, s.NH, s.NKV, s.HS);
  return r;
}

// lse: -inf exactly where the reference has it, the rest within tol (norm-wise).
void expect_lse_near(const std::vector<float>& lse, const std::vector<double>& ref, double tol,
                     const std::string& what) {
  std::vector<float> got;
  std::vector<double> want;
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(std::isinf(ref[i]), std::isinf(lse[i])) << what << " lse[" << i << "] " << lse[i];
    if (std::isinf(ref[i])) {
      EXPECT_TRUE(lse[i] < 0) << what;
      continue;
    }
    got.push_back(lse[i]);
    want.push_back(ref[i]);
  }
  EXPECT_LE(rel_error(got, want), tol) << what << " lse";
}

// ---- (a) PyTorch ----

struct OracleCase {
  const char* name;
  Shape s;
  int block;
  bool causal;
  SparsityPattern pattern;
  bool per_head = false;
  bool empty_lines = false;  // head 1: block row 1 emptied; heads >= NH/2: block column 0 emptied
};

SparseLayout oracle_layout(const OracleCase& c) {
  SparsityConfig config;
  config.num_heads = c.s.NH;
  config.block = c.block;
  config.different_layout_per_head = c.per_head;
  config.pattern = c.pattern;
  config.seed = 11;
  SparseLayout layout = sparse_layout_make(config, c.s.T);
  const int nb = layout.num_blocks;
  if (c.empty_lines) {
    for (int col = 0; col < nb; ++col) layout.blocks[(1 * nb + 1) * nb + col] = 0;
    for (int h = c.s.NH / 2; h < c.s.NH; ++h)
      for (int row = 0; row < nb; ++row) layout.blocks[(h * nb + row) * nb] = 0;
  }
  return layout;
}

template <typename V>
void write_raw(std::ofstream& f, const V& v) {
  f.write(reinterpret_cast<const char*>(v.data()),
          static_cast<std::streamsize>(v.size() * sizeof(v[0])));
}

struct OracleResult {
  std::vector<double> out, lse, dqkv;
};

// Runs tools/sparse_attention_oracle.py; fails the test where it cannot (python or torch missing).
OracleResult run_oracle(const OracleCase& c, const SparseLayout& layout,
                        const std::vector<float>& qkv, const std::vector<float>& dout) {
  const ScratchDir dir("sparse_oracle");  // removed with the files on every return
  const std::string base = dir.file(c.name);
  const std::string in = base + ".in", out = base + ".out";
  {
    std::ofstream f(in, std::ios::binary);
    const std::vector<int32_t> header = {c.s.B,  c.s.T,   c.s.NH,           c.s.NKV,
                                         c.s.HS, c.block, c.causal ? 1 : 0, 0};
    write_raw(f, header);
    std::vector<uint8_t> blocks = layout.blocks;
    blocks.resize((blocks.size() + 3) / 4 * 4, 0);
    write_raw(f, blocks);
    write_raw(f, qkv);
    write_raw(f, dout);
  }
  const std::string cmd = "/usr/bin/python3 " + std::string(MT_SOURCE_DIR) +
                          "/tools/sparse_attention_oracle.py " + in + " " + out;
  const int rc = std::system(cmd.c_str());
  OracleResult r{std::vector<double>(c.s.out_size()), std::vector<double>(c.s.lse_size()),
                 std::vector<double>(c.s.qkv_size())};
  EXPECT_EQ(rc, 0) << cmd << " failed: PyTorch (Debian's python3-torch) is required";
  if (rc != 0) return {};
  std::ifstream f(out, std::ios::binary);
  for (std::vector<double>* v : {&r.out, &r.lse, &r.dqkv})
    f.read(reinterpret_cast<char*>(v->data()),
           static_cast<std::streamsize>(v->size() * sizeof(double)));
  EXPECT_TRUE(f.good()) << "short oracle output " << out;
  return r;
}

constexpr auto kUni = SparseDirection::kUnidirectional;

const OracleCase kOracleCases[] = {
    {"fixed_uni_b16_gqa", {2, 80, 4, 2, 16}, 16, true, FixedSparsity{.attention = kUni}},
    {"fixed_uni_b16_local2_hs64",
     {1, 176, 4, 2, 64},
     16,
     true,
     FixedSparsity{.num_local_blocks = 2, .attention = kUni}},
    {"bigbird_bi_b32_hs64", {1, 96, 4, 2, 64}, 32, false, BigBirdSparsity{}, true},
    {"bigbird_bi_layout_causal_b16",
     {1, 112, 4, 2, 16},
     16,
     true,
     BigBirdSparsity{.num_random_blocks = 2},
     true},
    {"variable_uni_b64",
     {1, 192, 4, 2, 16},
     64,
     true,
     VariableSparsity{.local_window_blocks = {1, 2}, .attention = kUni}},
    {"variable_bi_random_b16",
     {2, 128, 4, 2, 16},
     16,
     false,
     VariableSparsity{.num_random_blocks = 2,
                      .local_window_blocks = {2},
                      .global_block_indices = {3},
                      .horizontal_global_attention = true},
     true},
    {"bslongformer_bi_b16_hs64", {1, 144, 2, 2, 64}, 16, false, BSLongformerSparsity{}},
    {"fixed_bi_empty_lines_b16",
     {2, 80, 4, 2, 16},
     16,
     false,
     FixedSparsity{.num_local_blocks = 2},
     false,
     true},
    {"fixed_uni_empty_lines_b32_hs64",
     {1, 160, 4, 2, 64},
     32,
     true,
     FixedSparsity{.num_local_blocks = 2, .attention = kUni},
     false,
     true},
    {"variable_bi_b128_split",
     {1, 384, 4, 2, 16},
     128,
     false,
     VariableSparsity{
         .num_random_blocks = 1, .local_window_blocks = {1}, .global_block_indices = {}},
     true},
    {"dense_uni_b8", {1, 40, 2, 1, 16}, 8, true, DenseSparsity{}},
};

class SparseAttentionOracleTest : public ::testing::TestWithParam<OracleCase> {};

TEST_P(SparseAttentionOracleTest, MatchesPyTorch) {
  const OracleCase& c = GetParam();
  const SparseLayout layout = oracle_layout(c);
  const SparseAttentionPlan plan = sparse_attention_plan(layout, c.causal);
  const auto qkv = random_vector(c.s.qkv_size(), 21);
  const auto dout = random_vector(c.s.out_size(), 22);
  const OracleResult ref = run_oracle(c, layout, qkv, dout);
  if (ref.out.empty()) return;
  for (Isa isa : attention_test_isas()) {
    IsaScope scope(isa);
    const Result r = run_sparse(qkv, dout, plan, c.s);
    const std::string what = std::string(c.name) + " " + isa_name(isa);
    EXPECT_TRUE(all_finite(r.out) && all_finite(r.dqkv)) << what;
    EXPECT_LE(rel_error(r.out, ref.out), 1e-5) << what << " out";
    expect_lse_near(r.lse, ref.lse, 1e-5, what);
    EXPECT_LE(rel_error(r.dqkv, ref.dqkv), 1e-5) << what << " dqkv";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, SparseAttentionOracleTest, ::testing::ValuesIn(kOracleCases),
                         [](const auto& info) { return std::string(info.param.name); });

// An empty block row: out = 0, lse = -inf, dq = 0; a key block column nobody attends: dk = dv = 0.
TEST(SparseAttentionTest, EmptyRowsAndColumnsGiveZerosNotNaN) {
  const OracleCase c{"empty", {1, 64, 2, 1, 16}, 16, false, DenseSparsity{}};
  SparseLayout layout = oracle_layout(c);
  const int nb = layout.num_blocks;
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < nb; ++i) {
      layout.blocks[(h * nb + 1) * nb + i] = 0;  // block row 1: queries 16..31
      layout.blocks[(h * nb + i) * nb + 2] = 0;  // block column 2: keys 32..47
    }
  for (bool causal : {false, true})
    for (Isa isa : attention_test_isas()) {
      IsaScope scope(isa);
      const Shape& s = c.s;
      const Result r = run_sparse(random_vector(s.qkv_size(), 1), random_vector(s.out_size(), 2),
                                  sparse_attention_plan(layout, causal), s);
      ASSERT_TRUE(all_finite(r.out) && all_finite(r.dqkv));
      for (int t = 0; t < s.T; ++t)
        for (int h = 0; h < 2; ++h) {
          const bool empty_row = t / 16 == 1, empty_col = t / 16 == 2;
          EXPECT_EQ(std::isinf(r.lse[h * s.T + t]), empty_row) << t;
          const float* row = &r.dqkv[t * s.c3()];
          for (int d = 0; d < s.HS; ++d) {
            if (empty_row) {
              EXPECT_EQ(r.out[t * s.NH * s.HS + h * s.HS + d], 0.0f);
              EXPECT_EQ(row[h * s.HS + d], 0.0f);  // dq
            }
            if (empty_col) {
              EXPECT_EQ(row[s.NH * s.HS + d], 0.0f);        // dk
              EXPECT_EQ(row[(s.NH + 1) * s.HS + d], 0.0f);  // dv
            }
          }
        }
    }
}

// ---- (b) finite differences ----

TEST(SparseAttentionGradTest, MatchesFiniteDifferences) {
  const Shape s{1, 8, 2, 1, 4};
  // block 2, nb 4; head 1's block row 1 is empty; head 0 has blocks above the diagonal.
  const std::vector<uint8_t> blocks = {1, 0, 0, 0, 1, 1, 0, 1, 0, 1, 1, 0, 1, 0, 1, 1,
                                       1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 1};
  for (bool causal : {false, true}) {
    auto visible = [&](int h, int i, int j) {
      return blocks[(h * 4 + i / 2) * 4 + j / 2] != 0 && (!causal || j <= i);
    };
    const auto qkv = random_vector(s.qkv_size(), 3);
    const auto dout = random_vector(s.out_size(), 4);
    const std::vector<double> dout_d = to_double(dout);
    std::vector<double> x = to_double(qkv), out, lse;
    auto loss = [&]() {
      reference_forward(out, lse, x, s, visible);
      double sum = 0.0;
      for (size_t i = 0; i < out.size(); ++i) sum += dout_d[i] * out[i];
      return sum;
    };
    const std::vector<double> fd = central_differences(x, loss);
    reference_forward(out, lse, x, s, visible);
    const SparseAttentionPlan plan = sparse_attention_plan(blocks.data(), 2, 4, 2, causal);
    for (Isa isa : attention_test_isas()) {
      IsaScope scope(isa);
      const Result r = run_sparse(qkv, dout, plan, s);
      const std::string what = std::string(causal ? "causal " : "") + isa_name(isa);
      EXPECT_LE(rel_error(r.out, out), 1e-6) << what;
      expect_lse_near(r.lse, lse, 1e-6, what);
      EXPECT_LE(rel_error(r.dqkv, fd), 1e-5) << what;
    }
  }
}

// ---- (c) the dense causal kernel ----

TEST(SparseAttentionTest, DenseCausalLayoutEqualsCausalAttention) {
  const Shape s{2, 192, 4, 2, 64};
  const auto qkv = random_vector(s.qkv_size(), 5);
  const auto dout = random_vector(s.out_size(), 6);
  for (Isa isa : attention_test_isas()) {
    IsaScope scope(isa);
    Result dense{std::vector<float>(s.out_size()), std::vector<float>(s.lse_size()),
                 std::vector<float>(s.qkv_size())};
    attention_forward(dense.out.data(), dense.lse.data(), qkv.data(), s.B, s.T, s.NH, s.NKV, s.HS);
    attention_backward(dense.dqkv.data(), dout.data(), qkv.data(), dense.out.data(),
                       dense.lse.data(), s.B, s.T, s.NH, s.NKV, s.HS);
    for (int block : {64, 32, 16}) {
      SparsityConfig config{.num_heads = s.NH, .block = block, .pattern = DenseSparsity{}};
      const Result r =
          run_sparse(qkv, dout, sparse_attention_plan(sparse_layout_make(config, s.T), true), s);
      const std::string what = "block " + std::to_string(block) + " " + isa_name(isa);
      if (block == 64) {  // the same tiles in the same order: the same bits
        EXPECT_EQ(r.out, dense.out) << what;
        EXPECT_EQ(r.lse, dense.lse) << what;
        EXPECT_EQ(r.dqkv, dense.dqkv) << what;
      }
      EXPECT_LE(rel_error(r.out, to_double(dense.out)), 2e-6) << what;
      EXPECT_LE(rel_error(r.lse, to_double(dense.lse)), 2e-6) << what;
      EXPECT_LE(rel_error(r.dqkv, to_double(dense.dqkv)), 2e-6) << what;
    }
  }
}

// ---- the plan ----

TEST(SparseAttentionPlanTest, RowsAndColumns) {
  const std::vector<uint8_t> blocks = {1, 1, 0, 0, 1, 1, 1, 0, 1};  // "110", "011", "101"
  const SparseAttentionPlan bi = sparse_attention_plan(blocks.data(), 1, 3, 16, false);
  EXPECT_EQ(bi.row_begin, (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(bi.row_columns, (std::vector<int>{0, 1, 1, 2, 0, 2}));
  EXPECT_EQ(bi.col_begin, (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(bi.col_rows, (std::vector<int>{0, 2, 0, 1, 1, 2}));
  const SparseAttentionPlan uni = sparse_attention_plan(blocks.data(), 1, 3, 16, true);
  EXPECT_EQ(uni.row_columns, (std::vector<int>{0, 1, 0, 2}));  // (0, 1) and (1, 2) dropped
  EXPECT_EQ(uni.col_rows, (std::vector<int>{0, 2, 1, 2}));
  EXPECT_EQ(uni.nonzero_blocks(), 4u);
}

TEST(SparseAttentionPlanTest, LargeBlocksSplitIntoTiles) {
  const std::vector<uint8_t> blocks = {1, 0, 1,
                                       1};  // block 128 -> 64: (0,0) becomes 2x2 sub-blocks
  const SparseAttentionPlan plan = sparse_attention_plan(blocks.data(), 1, 2, 128, true);
  EXPECT_EQ(plan.block, 64);
  EXPECT_EQ(plan.num_blocks, 4);
  EXPECT_EQ(plan.seq_len(), 256);
  EXPECT_EQ(plan.row_begin, (std::vector<int>{0, 1, 3, 6, 10}));
  EXPECT_EQ(plan.row_columns, (std::vector<int>{0, 0, 1, 0, 1, 2, 0, 1, 2, 3}));
  EXPECT_THROW(sparse_attention_plan(blocks.data(), 1, 2, 131, true), Error);
}

TEST(SparseAttentionTest, RejectsMismatchedPlans) {
  const std::vector<uint8_t> blocks(2 * 4 * 4, 1);
  const SparseAttentionPlan plan = sparse_attention_plan(blocks.data(), 2, 4, 16, true);
  std::vector<float> buf(1 << 16);
  float* p = buf.data();
  EXPECT_THROW(sparse_attention_forward(p, p, p, plan, 1, 48, 2, 1, 8), Error);  // T
  EXPECT_THROW(sparse_attention_forward(p, p, p, plan, 1, 64, 4, 1, 8), Error);  // NH
  EXPECT_THROW(sparse_attention_backward(p, p, p, p, p, plan, 1, 64, 3, 2, 8), Error);
  EXPECT_THROW(sparse_attention_plan(blocks.data(), 2, 0, 16, true), Error);
}

TEST(SparseAttentionTest, RepeatedCallsAreBitwiseEqual) {
  const Shape s{2, 256, 4, 2, 32};
  SparsityConfig config{.num_heads = s.NH, .pattern = BigBirdSparsity{.num_random_blocks = 2}};
  const SparseAttentionPlan plan = sparse_attention_plan(sparse_layout_make(config, s.T), false);
  const auto qkv = random_vector(s.qkv_size(), 9);
  const auto dout = random_vector(s.out_size(), 10);
  const Result a = run_sparse(qkv, dout, plan, s), b = run_sparse(qkv, dout, plan, s);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_EQ(a.dqkv, b.dqkv);
}

}  // namespace
}  // namespace mt::kernels
