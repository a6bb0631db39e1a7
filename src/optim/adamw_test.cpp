// AdamW against torch.optim.AdamW's update written out in double (textbook formula).
#include "optim/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace mt::optim {
namespace {

TEST(AdamW, ThreeStepsMatchTheFormula) {
  const size_t n = 37;
  AdamWConfig c{0.05f, 0.9f, 0.95f, 1e-8f, 0.1f};
  AdamW opt(n, c);
  std::vector<float> p(n), g(n);
  std::vector<double> rp(n), rm(n, 0), rv(n, 0);
  for (size_t i = 0; i < n; ++i) rp[i] = p[i] = std::cos(static_cast<float>(i));
  for (int t = 1; t <= 3; ++t) {
    for (size_t i = 0; i < n; ++i) g[i] = std::sin(static_cast<float>(i * t)) * 2.0f;
    opt.step(p.data(), g.data(), nullptr, DType::kF32, c.lr, 0.5f);
    for (size_t i = 0; i < n; ++i) {
      double gi = g[i] * 0.5;
      rp[i] *= 1.0 - c.lr * c.weight_decay;
      rm[i] = 0.9 * rm[i] + 0.1 * gi;
      rv[i] = 0.95 * rv[i] + 0.05 * gi * gi;
      double mh = rm[i] / (1 - std::pow(0.9, t)), vh = rv[i] / (1 - std::pow(0.95, t));
      rp[i] -= c.lr * mh / (std::sqrt(vh) + 1e-8);
      ASSERT_NEAR(p[i], rp[i], 1e-5) << "step " << t << " element " << i;
    }
  }
  EXPECT_EQ(opt.step_count(), 3);
}

TEST(GradNorm, IsTheL2NormAndFlagsOverflow) {
  std::vector<float> g = {3.0f, 4.0f};
  EXPECT_DOUBLE_EQ(grad_norm(g.data(), 2), 5.0);
  g[1] = INFINITY;
  EXPECT_FALSE(std::isfinite(grad_norm(g.data(), 2)));
}

}  // namespace
}  // namespace mt::optim
