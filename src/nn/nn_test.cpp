// nn: names, flat buffers, hooks, and Linear/LinearGroup backward against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "nn/linear.h"
#include "nn/param_store.h"

namespace mt::nn {
namespace {

class Toy : public Module {
 public:
  Toy() : Module("") {
    auto* c = add_module(std::make_unique<Container>("mlp"));
    a = c->add_module(std::make_unique<Linear>("a", 5, 3, true, WeightLayout::kInOut, 0.5f));
    b = c->add_module(std::make_unique<Linear>("b", 5, 4, false, WeightLayout::kOutIn, 0.5f));
    d = c->add_module(std::make_unique<Linear>("d", 5, 2, false, WeightLayout::kOutIn, 0.5f));
    finalize_names();
  }
  Linear *a, *b, *d;
};

TEST(Module, DottedNamesAndFlatBuffers) {
  Toy t;
  ParamStore s(t, DType::kF32);
  std::vector<std::string> names;
  for (auto* p : s.parameters()) names.push_back(p->name);
  EXPECT_EQ(names, (std::vector<std::string>{"mlp.a.weight", "mlp.a.bias", "mlp.b.weight", "mlp.d.weight"}));
  EXPECT_EQ(s.numel(), 15u + 3 + 20 + 10);
  EXPECT_EQ(s.find("mlp.b.weight")->master, s.master() + 18);
  EXPECT_EQ(s.find("mlp.b.weight")->grad, s.grad() + 18);
  s.init(7);
  ParamStore s2(t, DType::kBF16);  // rebinding the same tree: bf16 copy for matrices only
  s2.init(7);
  EXPECT_EQ(s2.find("mlp.a.bias")->compute, static_cast<void*>(s2.find("mlp.a.bias")->master));
  EXPECT_EQ(s2.find("mlp.a.weight")->compute_dtype, DType::kBF16);
}

TEST(Module, HooksRunAroundForwardAndBackward) {
  Toy t;
  std::vector<HookPoint> seen;
  t.a->add_hook(HookPoint::kPreForward, [&](Module& m, HookPoint p) { seen.push_back(p); EXPECT_EQ(m.full_name(), "mlp.a"); });
  t.a->add_hook(HookPoint::kPostBackward, [&](Module&, HookPoint p) { seen.push_back(p); });
  t.a->run_hooks(HookPoint::kPreForward);
  t.a->run_hooks(HookPoint::kPostForward);
  t.a->run_hooks(HookPoint::kPostBackward);
  EXPECT_EQ(seen, (std::vector<HookPoint>{HookPoint::kPreForward, HookPoint::kPostBackward}));
}

// loss = sum(w_out * Y) for a fixed random w_out; checks dX, dW, db against central differences.
template <typename Fwd, typename Bwd>
void check_fd(ParamStore& s, std::vector<float>& x, int M, int out, Fwd fwd, Bwd bwd) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> wout(static_cast<size_t>(M) * out), y(wout.size()), dx(x.size());
  for (auto& v : wout) v = nd(rng);
  auto loss = [&] {
    fwd(y.data(), x.data());
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += static_cast<double>(wout[i]) * y[i];
    return l;
  };
  s.zero_grad();
  bwd(dx.data(), wout.data(), x.data());
  const float h = 1e-2f;
  for (size_t i = 0; i < x.size(); ++i) {
    float keep = x[i];
    x[i] = keep + h; double lp = loss();
    x[i] = keep - h; double lm = loss();
    x[i] = keep;
    ASSERT_NEAR(dx[i], (lp - lm) / (2 * h), 2e-3) << "dx " << i;
  }
  for (size_t i = 0; i < s.numel(); ++i) {
    float keep = s.master()[i];
    s.master()[i] = keep + h; double lp = loss();
    s.master()[i] = keep - h; double lm = loss();
    s.master()[i] = keep;
    ASSERT_NEAR(s.grad()[i], (lp - lm) / (2 * h), 2e-3) << "param element " << i;
  }
}

TEST(Linear, BothLayoutsAndGroupsMatchFiniteDifferences) {
  Toy t;
  ParamStore s(t, DType::kF32);
  s.init(11);
  for (size_t i = 0; i < s.numel(); ++i) s.master()[i] += 0.01f * static_cast<float>(i % 7);
  Workspace ws;
  const int M = 3;
  std::vector<float> x(M * 5);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i));
  check_fd(s, x, M, 3, [&](float* y, const float* xx) { t.a->forward(y, xx, M); },
           [&](float* dx, const float* dy, const float* xx) { t.a->backward(dx, false, dy, xx, M, ws); });
  LinearGroup g({t.b, t.d});
  check_fd(s, x, M, 6, [&](float* y, const float* xx) { g.forward(y, xx, M); },
           [&](float* dx, const float* dy, const float* xx) { g.backward(dx, false, dy, xx, M, ws); });
}

}  // namespace
}  // namespace mt::nn
