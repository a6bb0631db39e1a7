// GradBuckets with a 16-bit communication_data_type against the textbook result: on two ranks each
// gradient element becomes round(round(g0) + round(g1)) in the wire type, widened back to f32.
#include "parallel/dp/grad_buckets.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "comm/local_backend.h"

namespace mt::parallel {
namespace {

std::vector<float> rank_grads(int r, size_t n) {
  std::mt19937 rng(11 + r);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> g(n);
  for (auto& x : g) x = u(rng);
  return g;
}

float round_to(DType dt, float x) {
  return dt == DType::kBF16 ? bf16_to_f32(f32_to_bf16(x)) : f16_to_f32(f32_to_f16(x));
}

TEST(GradBuckets, SixteenBitWireSumsRoundedGradients) {
  const size_t n = 1000;  // 7 buckets of 150 (the first one short)
  for (DType dt : {DType::kBF16, DType::kF16}) {
    std::vector<std::vector<float>> out(2);
    auto errors = comm::run_local_ranks(2, [&](comm::Backend& b) {
      std::vector<float> g = rank_grads(b.rank(), n);
      GradBuckets buckets(g.data(), n, 150, b, true, comm::kDefaultTimeout, dt);
      EXPECT_EQ(buckets.count(), 7u);
      buckets.begin();
      buckets.ready_from(500);  // the buckets wholly inside [500, n) go now, the rest in finish()
      EXPECT_EQ(buckets.launched(), 3u);
      buckets.finish();
      out[b.rank()] = g;
    });
    for (auto& e : errors) ASSERT_FALSE(e);
    std::vector<float> g0 = rank_grads(0, n), g1 = rank_grads(1, n);
    int differs_from_f32 = 0;
    for (size_t i = 0; i < n; ++i) {
      const float want = round_to(dt, round_to(dt, g0[i]) + round_to(dt, g1[i]));
      ASSERT_EQ(out[0][i], want) << dtype_name(dt) << " element " << i;
      ASSERT_EQ(out[1][i], want) << dtype_name(dt) << " element " << i;
      differs_from_f32 += want != g0[i] + g1[i];
    }
    EXPECT_GT(differs_from_f32, static_cast<int>(n / 2)) << "the data should tell the wire types apart";
  }
}

}  // namespace
}  // namespace mt::parallel
