// Tests of the flash attention kernels (attention.h). Oracles: a naive double-precision attention
// (the full (T, T) softmax with the causal mask, grouped heads by h / (NH / NKV)), its analytic
// backward, and central finite differences of loss = sum(dout * out) taken on the double forward.
// Every comparison runs on the portable and on the AVX-512 path (skipped where the CPU lacks it).
#include "kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "base/cpu_features.h"
#include "base/error.h"
#include "kernels/cpu/attention_test_util.h"

namespace mt::kernels {
namespace {

// Analytic backward of the naive attention: dS = P * (dP - rowsum(P * dP)).
std::vector<double> reference_backward(const std::vector<double>& dout,
                                       const std::vector<double>& qkv, const Shape& s) {
  const int C3 = s.c3(), group = s.NH / s.NKV, T = s.T, HS = s.HS;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  std::vector<double> dqkv(s.qkv_size(), 0.0);
  std::vector<double> P(static_cast<size_t>(T) * T), dP(static_cast<size_t>(T) * T);
  auto at = [&](int b, int t, int head) {
    return (static_cast<size_t>(b) * T + t) * C3 + head * HS;
  };
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h) {
      const int kh = s.NH + h / group, vh = s.NH + s.NKV + h / group;
      const size_t dob = static_cast<size_t>(b) * T * s.NH * HS + h * HS;
      for (int i = 0; i < T; ++i) {
        double mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int d = 0; d < HS; ++d) dot += qkv[at(b, i, h) + d] * qkv[at(b, j, kh) + d];
          P[i * T + j] = dot * scale;
          mx = std::max(mx, P[i * T + j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= i; ++j) sum += (P[i * T + j] = std::exp(P[i * T + j] - mx));
        double rowdot = 0.0;
        for (int j = 0; j <= i; ++j) {
          P[i * T + j] /= sum;
          double dot = 0.0;
          for (int d = 0; d < HS; ++d)
            dot += dout[dob + static_cast<size_t>(i) * s.NH * HS + d] * qkv[at(b, j, vh) + d];
          dP[i * T + j] = dot;
          rowdot += P[i * T + j] * dot;
        }
        for (int j = 0; j <= i; ++j) {
          const double p = P[i * T + j], ds = p * (dP[i * T + j] - rowdot) * scale;
          for (int d = 0; d < HS; ++d) {
            dqkv[at(b, j, vh) + d] += p * dout[dob + static_cast<size_t>(i) * s.NH * HS + d];
            dqkv[at(b, i, h) + d] += ds * qkv[at(b, j, kh) + d];
            dqkv[at(b, j, kh) + d] += ds * qkv[at(b, i, h) + d];
          }
        }
      }
    }
  return dqkv;
}

struct Result {
  std::vector<float> out, lse, dqkv;
};

// kstart: documents (attention.h), or null.
Result run_kernels(const std::vector<float>& qkv, const std::vector<float>& dout, const Shape& s,
                   const int32_t* kstart = nullptr) {
  Result r{std::vector<float>(s.out_size()), std::vector<float>(s.lse_size()),
           std::vector<float>(s.qkv_size(), NAN)};
  attention_forward(r.out.data(), r.lse.data(), qkv.data(), s.B, s.T, s.NH, s.NKV, s.HS, nullptr, kstart);
  attention_backward(r.dqkv.data(), dout.data(), qkv.data(), r.out.data(), r.lse.data(), s.B, s.T,
                     s.NH, s.NKV, s.HS, nullptr, kstart);
  return r;
}

const Shape kShapes[] = {
    {1, 1, 4, 4, 16},   {2, 17, 4, 2, 8},   {1, 67, 6, 1, 24}, {2, 67, 4, 2, 64},
    {1, 130, 2, 2, 64}, {1, 100, 6, 3, 16}, {1, 70, 2, 1, 80}, {1, 64, 3, 3, 128},
};

class AttentionTest : public ::testing::TestWithParam<std::tuple<Shape, Isa>> {
 protected:
  void SetUp() override {
    if (std::get<1>(GetParam()) == Isa::kAvx512 && isa_detected() != Isa::kAvx512)
      GTEST_SKIP() << "CPU lacks AVX-512";
  }
};

TEST_P(AttentionTest, ForwardAndBackwardMatchDoubleReference) {
  const auto [s, isa] = GetParam();
  IsaScope scope(isa);
  auto qkv = random_vector(s.qkv_size(), 1);
  auto dout = random_vector(s.out_size(), 2);
  Result r = run_kernels(qkv, dout, s);

  std::vector<double> ref_out, ref_lse;
  reference_forward(ref_out, ref_lse, to_double(qkv), s);
  EXPECT_LE(rel_error(r.out, ref_out), 1e-5);
  EXPECT_LE(rel_error(r.lse, ref_lse), 1e-5);
  EXPECT_LE(rel_error(r.dqkv, reference_backward(to_double(dout), to_double(qkv), s)), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Combine(::testing::ValuesIn(kShapes),
                                            ::testing::Values(Isa::kPortable, Isa::kAvx512)),
                         [](const auto& info) {
                           return shape_name(std::get<0>(info.param)) + "_" +
                                  isa_name(std::get<1>(info.param));
                         });

const Isa kIsas[] = {Isa::kPortable, Isa::kAvx512};

// d/dx sum(dout * out) by central differences on the double forward, vs both backwards.
TEST(AttentionGradTest, MatchesFiniteDifferences) {
  for (const Shape s : {Shape{1, 5, 2, 1, 8}, Shape{2, 4, 4, 2, 4}, Shape{1, 7, 3, 3, 5}}) {
    auto qkv = random_vector(s.qkv_size(), 3);
    auto dout = random_vector(s.out_size(), 4);
    const std::vector<double> dout_d = to_double(dout);
    std::vector<double> x = to_double(qkv), out, lse;
    auto loss = [&]() {
      reference_forward(out, lse, x, s);
      double sum = 0.0;
      for (size_t i = 0; i < out.size(); ++i) sum += dout_d[i] * out[i];
      return sum;
    };
    const std::vector<double> fd = central_differences(x, loss);
    EXPECT_LE(rel_error(reference_backward(dout_d, x, s), fd), 1e-7) << shape_name(s);
    for (Isa isa : kIsas) {
      if (isa == Isa::kAvx512 && isa_detected() != Isa::kAvx512) continue;
      IsaScope scope(isa);
      Result r = run_kernels(qkv, dout, s);
      EXPECT_LE(rel_error(r.dqkv, fd), 1e-5) << shape_name(s) << " " << isa_name(isa);
    }
  }
}

TEST(AttentionIsaTest, Avx512MatchesPortable) {
  if (isa_detected() != Isa::kAvx512) GTEST_SKIP() << "CPU lacks AVX-512";
  const Shape s{2, 150, 4, 2, 64};
  auto qkv = random_vector(s.qkv_size(), 5);
  auto dout = random_vector(s.out_size(), 6);
  Result portable, avx512;
  {
    IsaScope scope(Isa::kPortable);
    portable = run_kernels(qkv, dout, s);
  }
  {
    IsaScope scope(Isa::kAvx512);
    avx512 = run_kernels(qkv, dout, s);
  }
  EXPECT_LE(rel_error(avx512.out, to_double(portable.out)), 1e-5);
  EXPECT_LE(rel_error(avx512.lse, to_double(portable.lse)), 1e-5);
  EXPECT_LE(rel_error(avx512.dqkv, to_double(portable.dqkv)), 1e-5);
}

// Logits of about +-50: a naive exp would overflow; the online softmax must not.
TEST(AttentionTest, LargeScoresStayFinite) {
  const Shape s{1, 90, 2, 1, 64};
  auto qkv = random_vector(s.qkv_size(), 7, 8.0f);
  auto dout = random_vector(s.out_size(), 8);
  const std::vector<double> x = to_double(qkv);
  double max_logit = 0.0;
  for (int i = 0; i < s.T; ++i)
    for (int j = 0; j <= i; ++j) {
      double dot = 0.0;
      for (int d = 0; d < s.HS; ++d) dot += x[i * s.c3() + d] * x[j * s.c3() + s.NH * s.HS + d];
      max_logit = std::max(max_logit, std::abs(dot) / 8.0);
    }
  ASSERT_GT(max_logit, 40.0);
  std::vector<double> ref_out, ref_lse;
  reference_forward(ref_out, ref_lse, x, s);
  const std::vector<double> ref_dqkv = reference_backward(to_double(dout), x, s);
  for (Isa isa : kIsas) {
    if (isa == Isa::kAvx512 && isa_detected() != Isa::kAvx512) continue;
    IsaScope scope(isa);
    Result r = run_kernels(qkv, dout, s);
    EXPECT_TRUE(all_finite(r.out) && all_finite(r.lse) && all_finite(r.dqkv)) << isa_name(isa);
    // fp32 logits of magnitude 50 carry ~5e-6 absolute error, amplified by exp.
    EXPECT_LE(rel_error(r.out, ref_out), 1e-4) << isa_name(isa);
    EXPECT_LE(rel_error(r.lse, ref_lse), 1e-5) << isa_name(isa);
    EXPECT_LE(rel_error(r.dqkv, ref_dqkv), 1e-4) << isa_name(isa);
  }
}

TEST(AttentionTest, RepeatedCallsAreBitwiseEqual) {
  const Shape s{2, 100, 4, 1, 32};
  auto qkv = random_vector(s.qkv_size(), 9);
  auto dout = random_vector(s.out_size(), 10);
  Result a = run_kernels(qkv, dout, s), b = run_kernels(qkv, dout, s);
  EXPECT_EQ(0, std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.dqkv.data(), b.dqkv.data(), a.dqkv.size() * sizeof(float)));
}

// Documents packed into a sample (kstart: Megatron's reset_attention_mask). kstart for ends: a
// document ends at each listed position of each batch row (the token there belongs to it).
std::vector<int32_t> kstart_of(const std::vector<std::vector<int>>& ends, int T) {
  std::vector<int32_t> ks;
  for (const auto& row : ends) {
    int start = 0;
    for (int t = 0; t < T; ++t) {
      ks.push_back(start);
      if (std::find(row.begin(), row.end(), t) != row.end()) start = t + 1;
    }
  }
  return ks;
}

// Against the naive double attention under the documents' mask (key j visible to query i iff
// kstart[i] <= j <= i), with finite differences of it for the backward, on both paths.
TEST(AttentionDocuments, MatchTheMaskedReferenceAndFiniteDifferences) {
  for (const Shape s : {Shape{2, 9, 2, 1, 8}, Shape{1, 7, 3, 3, 5}}) {
    // Row 0: documents [0,3) [3,4) [4,9); row 1: [0,1) [1,T). A document of one token, one at the start.
    const std::vector<int32_t> ks = kstart_of({{2, 3}, {0}}, s.T);
    auto qkv = random_vector(s.qkv_size(), 11);
    auto dout = random_vector(s.out_size(), 12);
    const std::vector<double> dout_d = to_double(dout);
    std::vector<double> x = to_double(qkv), ref_out, ref_lse;
    auto forward = [&](std::vector<double>& out, std::vector<double>& lse) {
      // reference_forward's mask has no batch row: one row at a time.
      out.assign(s.out_size(), 0.0);
      lse.assign(s.lse_size(), 0.0);
      const Shape one{1, s.T, s.NH, s.NKV, s.HS};
      for (int b = 0; b < s.B; ++b) {
        std::vector<double> xb(x.begin() + static_cast<long>(b) * one.qkv_size(), x.begin() + static_cast<long>(b + 1) * one.qkv_size());
        std::vector<double> ob, lb;
        const int32_t* k = ks.data() + static_cast<size_t>(b) * s.T;
        reference_forward(ob, lb, xb, one, [k](int, int i, int j) { return k[i] <= j && j <= i; });
        std::copy(ob.begin(), ob.end(), out.begin() + static_cast<long>(b) * one.out_size());
        std::copy(lb.begin(), lb.end(), lse.begin() + static_cast<long>(b) * one.lse_size());
      }
    };
    forward(ref_out, ref_lse);
    auto loss = [&]() {
      std::vector<double> out, lse;
      forward(out, lse);
      double sum = 0.0;
      for (size_t i = 0; i < out.size(); ++i) sum += dout_d[i] * out[i];
      return sum;
    };
    const std::vector<double> fd = central_differences(x, loss);
    for (Isa isa : kIsas) {
      if (isa == Isa::kAvx512 && isa_detected() != Isa::kAvx512) continue;
      IsaScope scope(isa);
      const Result r = run_kernels(qkv, dout, s, ks.data());
      EXPECT_LE(rel_error(r.out, ref_out), 1e-5) << shape_name(s) << " " << isa_name(isa);
      EXPECT_LE(rel_error(r.lse, ref_lse), 1e-5) << shape_name(s) << " " << isa_name(isa);
      EXPECT_LE(rel_error(r.dqkv, fd), 1e-5) << shape_name(s) << " " << isa_name(isa);
      // The plain causal attention differs: the mask is not a no-op.
      std::vector<float> causal(s.out_size()), causal_lse(s.lse_size());
      attention_forward(causal.data(), causal_lse.data(), qkv.data(), s.B, s.T, s.NH, s.NKV, s.HS);
      EXPECT_GT(rel_error(causal, ref_out), 1e-2) << shape_name(s);
    }
  }
}

// Over several tiles (documents across tile edges, key tiles skipped whole): each document alone
// is a causal attention of its own length, so the kernel over the packed rows must equal the plain
// kernel run on each document's rows by themselves (forward, lse and every gradient).
TEST(AttentionDocuments, EqualEachDocumentOnItsOwnAcrossTiles) {
  // Head sizes whose scale's product with the masked score rounds either way (a fused
  // multiply-add's residue once overflowed the AVX-512 softmax's exponent at 16, 48, 64, 80).
  for (int HS : {16, 32, 48, 64, 80, 128}) {
  SCOPED_TRACE("HS " + std::to_string(HS));
  const Shape s{2, 200, 4, 2, HS};
  const std::vector<std::vector<int>> ends = {{0, 63, 64, 130, 199}, {10, 150}};
  const std::vector<int32_t> ks = kstart_of(ends, s.T);
  auto qkv = random_vector(s.qkv_size(), 13);
  auto dout = random_vector(s.out_size(), 14);
  const int C3 = s.c3(), A = s.NH * s.HS;
  for (Isa isa : kIsas) {
    if (isa == Isa::kAvx512 && isa_detected() != Isa::kAvx512) continue;
    IsaScope scope(isa);
    const Result r = run_kernels(qkv, dout, s, ks.data());
    std::vector<double> ref_out(s.out_size()), ref_lse(s.lse_size()), ref_dqkv(s.qkv_size());
    for (int b = 0; b < s.B; ++b) {
      int start = 0;
      std::vector<int> cuts = ends[b];
      if (cuts.back() != s.T - 1) cuts.push_back(s.T - 1);
      for (int end : cuts) {
        const int n = end + 1 - start;
        const size_t row0 = static_cast<size_t>(b) * s.T + start;
        std::vector<float> q(qkv.begin() + static_cast<long>(row0 * C3), qkv.begin() + static_cast<long>((row0 + n) * C3));
        std::vector<float> d(dout.begin() + static_cast<long>(row0 * A), dout.begin() + static_cast<long>((row0 + n) * A));
        std::vector<float> o(static_cast<size_t>(n) * A), l(static_cast<size_t>(s.NH) * n), g(q.size());
        attention_forward(o.data(), l.data(), q.data(), 1, n, s.NH, s.NKV, s.HS);
        attention_backward(g.data(), d.data(), q.data(), o.data(), l.data(), 1, n, s.NH, s.NKV, s.HS);
        std::copy(o.begin(), o.end(), ref_out.begin() + static_cast<long>(row0 * A));
        std::copy(g.begin(), g.end(), ref_dqkv.begin() + static_cast<long>(row0 * C3));
        for (int h = 0; h < s.NH; ++h)
          for (int t = 0; t < n; ++t)
            ref_lse[(static_cast<size_t>(b) * s.NH + h) * s.T + start + t] = l[static_cast<size_t>(h) * n + t];
        start = end + 1;
      }
    }
    EXPECT_TRUE(all_finite(r.out) && all_finite(r.lse) && all_finite(r.dqkv)) << isa_name(isa);
    EXPECT_LE(rel_error(r.out, ref_out), 1e-5) << isa_name(isa);
    EXPECT_LE(rel_error(r.lse, ref_lse), 1e-5) << isa_name(isa);
    EXPECT_LE(rel_error(r.dqkv, ref_dqkv), 1e-5) << isa_name(isa);
  }
  }
}

// The pairs the kernels compute, counted by their rule, against the tiles that hold a pair some
// query sees (key j visible to query i iff kstart[i] <= j <= i), found by visiting every pair: for
// random documents of 1 to 150 tokens at lengths around the 64-wide tiles, and causal.
TEST(AttentionDocuments, TilePairsAreTheTilesHoldingAVisiblePair) {
  const int tile = 64;
  auto oracle = [tile](int T, const int32_t* ks) {
    double pairs = 0.0;
    for (int q0 = 0; q0 < T; q0 += tile)
      for (int j0 = 0; j0 < T; j0 += tile) {
        const int rows = std::min(tile, T - q0), cols = std::min(tile, T - j0);
        bool seen = false;
        for (int i = q0; i < q0 + rows && !seen; ++i)
          for (int j = j0; j < j0 + cols && !seen; ++j) seen = (ks ? ks[i] : 0) <= j && j <= i;
        if (seen) pairs += static_cast<double>(rows) * cols;
      }
    return pairs;
  };
  std::mt19937 rng(5);
  for (int T : {1, 63, 64, 65, 127, 200, 512}) {
    EXPECT_EQ(attention_tile_pairs(T), oracle(T, nullptr)) << "T " << T;
    for (int draw = 0; draw < 20; ++draw) {
      std::vector<int> ends;
      for (int t = static_cast<int>(rng() % 150); t < T; t += 1 + static_cast<int>(rng() % 150)) ends.push_back(t);
      const std::vector<int32_t> ks = kstart_of({ends}, T);
      EXPECT_EQ(attention_tile_pairs(T, ks.data()), oracle(T, ks.data())) << "T " << T << " draw " << draw;
    }
  }
  // Causal, T = 64 n: n(n+1)/2 whole tiles. Documents of 64 tokens on the tiles: the diagonal alone.
  EXPECT_EQ(attention_tile_pairs(256), 4096.0 * 10);
  const std::vector<int32_t> ks = kstart_of({{63, 127, 191, 255}}, 256);
  EXPECT_EQ(attention_tile_pairs(256, ks.data()), 4096.0 * 4);
}

TEST(AttentionTest, RejectsHeadsNotDivisibleByKvHeads) {
  std::vector<float> buf(1024);
  EXPECT_THROW(attention_forward(buf.data(), buf.data(), buf.data(), 1, 2, 3, 2, 8), Error);
  EXPECT_THROW(
      attention_backward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), 1, 2, 3, 2, 8),
      Error);
}

}  // namespace
}  // namespace mt::kernels
