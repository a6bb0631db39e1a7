// Microbenchmarks of the fused CPU kernels (kernels/cpu/ops.h) on GPT-2 small shapes. Each reports
// the bytes it must move (reads + writes of its main buffers) so the GB/s column shows how close a
// kernel is to memory bandwidth. The ISA is whatever isa_active() picks (MT_ISA=portable to
// compare).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"
#include "optim/optimizer.h"

namespace {

using mt::kernels::AdamWParams;

std::vector<float> random_vec(size_t n, float lo, float hi) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

constexpr int kN = 1024, kC = 768;  // LayerNorm: (B*T, C)

void BM_layernorm_forward(benchmark::State& state) {
  const auto x = random_vec(size_t(kN) * kC, -2, 2), w = random_vec(kC, 0.5f, 1.5f),
             b = random_vec(kC, -1, 1);
  std::vector<float> y(x.size()), mean(kN), rstd(kN);
  for (auto _ : state) {
    mt::kernels::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                                   kN, kC, 1e-5f);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * 2 * kN * kC * 4);  // read x, write y
}
BENCHMARK(BM_layernorm_forward)->UseRealTime();

void BM_layernorm_backward(benchmark::State& state) {
  const auto x = random_vec(size_t(kN) * kC, -2, 2), w = random_vec(kC, 0.5f, 1.5f),
             dy = random_vec(x.size(), -1, 1);
  std::vector<float> y(x.size()), mean(kN), rstd(kN), dx(x.size()), dw(kC), db(kC);
  mt::kernels::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), nullptr,
                                 kN, kC, 1e-5f);
  for (auto _ : state) {
    mt::kernels::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                                    mean.data(), rstd.data(), kN, kC);
    benchmark::DoNotOptimize(dx.data());
  }
  // read x, dy, dx; write dx
  state.SetBytesProcessed(int64_t(state.iterations()) * 4 * kN * kC * 4);
}
BENCHMARK(BM_layernorm_backward)->UseRealTime();

constexpr size_t kGeluN = size_t(1024) * 3072;

void BM_gelu_forward(benchmark::State& state) {
  const auto x = random_vec(kGeluN, -6, 6);
  std::vector<float> y(kGeluN);
  for (auto _ : state) {
    mt::kernels::gelu_forward(y.data(), x.data(), kGeluN);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * 2 * kGeluN * 4);
}
BENCHMARK(BM_gelu_forward)->UseRealTime();

void BM_gelu_backward(benchmark::State& state) {
  const auto x = random_vec(kGeluN, -6, 6), dy = random_vec(kGeluN, -1, 1);
  std::vector<float> dx(kGeluN);
  for (auto _ : state) {
    mt::kernels::gelu_backward(dx.data(), x.data(), dy.data(), kGeluN);
    benchmark::DoNotOptimize(dx.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * 3 * kGeluN * 4);
}
BENCHMARK(BM_gelu_backward)->UseRealTime();

void BM_cross_entropy_tile(benchmark::State& state) {
  constexpr int R = 64, V = 50257;
  const auto logits0 = random_vec(size_t(R) * V, -10, 10);
  std::vector<int32_t> tg(R);
  for (int r = 0; r < R; ++r) tg[r] = (r * 7919) % V;
  std::vector<float> logits = logits0, loss(R), lse(R);
  for (auto _ : state) {
    // NOTE: logits is overwritten with dlogits each call; the values stay finite and in range,
    // so the later calls do the same work on different data.
    mt::kernels::cross_entropy_tile(loss.data(), lse.data(), logits.data(), tg.data(), R, V,
                                    1.0f / R);
    benchmark::DoNotOptimize(logits.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * 2 * R * V * 4);  // read + write logits
}
BENCHMARK(BM_cross_entropy_tile)->UseRealTime();

void BM_adamw_update(benchmark::State& state) {
  const size_t n = size_t(16) << 20;
  auto p = random_vec(n, -1, 1), g = random_vec(n, -1, 1);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  std::vector<uint16_t> lowp(n);
  AdamWParams params;
  params.weight_decay = 0.1f;
  for (auto _ : state) {
    mt::kernels::adamw_update(p.data(), g.data(), m.data(), v.data(), lowp.data(), mt::DType::kBF16,
                              n, params);
    benchmark::DoNotOptimize(p.data());
  }
  // read p, g, m, v; write p, m, v (f32) and lowp (bf16)
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n) * (7 * 4 + 2));
}
BENCHMARK(BM_adamw_update)->UseRealTime();

// The optimizers' steps as the engine builds them (optim::make_optimizer, one segment), writing the
// bf16 copy: AdamW against LAMB's two passes (moments and the trust ratio's sums, then the update)
// and SGD with momentum. Bytes: AdamW reads p, g, m, v and writes p, m, v; LAMB's first pass reads
// g, p, m, v and writes m, v, its second reads p, m, v and writes p; SGD reads p, g, buf and
// writes p, buf; each writes the bf16 copy.
void BM_optimizer_step(benchmark::State& state) {
  const char* types[] = {"AdamW", "Lamb", "SGD", "OneBitAdam", "ZeroOneAdam", "OneBitLamb"};
  const int64_t bytes[] = {7 * 4 + 2, 10 * 4 + 2, 5 * 4 + 2, 7 * 4 + 2, 7 * 4 + 2, 10 * 4 + 2};
  const size_t n = size_t(16) << 20;
  mt::optim::OptimizerSpec spec;
  spec.type = types[state.range(0)];
  spec.momentum = 0.9;
  spec.freeze_step = 1;  // the 1-bit optimizers past their warm-up (one rank: no exchange)
  spec.var_freeze_step = 1;
  auto opt = mt::optim::make_optimizer(spec, n, {mt::optim::ParamSegment{0, n, 0.01f, "all"}});
  auto p = random_vec(n, -1, 1), g = random_vec(n, -1, 1);
  std::vector<uint16_t> lowp(n);
  for (auto _ : state) {
    opt->step(p.data(), g.data(), lowp.data(), mt::DType::kBF16, 1e-4f, 1.0f);
    benchmark::DoNotOptimize(p.data());
  }
  state.SetLabel(spec.type);
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n) * bytes[state.range(0)]);
}
BENCHMARK(BM_optimizer_step)->DenseRange(0, 5)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_sum_squares(benchmark::State& state) {
  const size_t n = size_t(16) << 20;
  const auto x = random_vec(n, -1, 1);
  for (auto _ : state) benchmark::DoNotOptimize(mt::kernels::sum_squares(x.data(), n));
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n) * 4);
}
BENCHMARK(BM_sum_squares)->UseRealTime();

}  // namespace
