// The LM head fused with cross-entropy (nn::lm_head_cross_entropy) at GPT-2 124M's shapes: B·T =
// 1024 rows, C 768, its odd vocabulary of 50257 (four tiles of 256 rows) and a padded one of 50304,
// f32, bf16 and f16 (widened to f32 where oneDNN has no f16 matmul, PERF (ff)): the logits, the loss and dlogits, dX and dW for the whole batch, as a training
// step's forward runs them. Reported in FLOP/s of the three GEMMs (6 · N · C · V). PERF (dd): the
// odd vocabulary's dlogits on whole lines run at the padded one's rate.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "nn/lm_head.h"
#include "nn/workspace.h"

namespace {

using mt::DType;

// args: V, dtype (0 f32, 1 bf16, 2 f16)
void BM_lm_head(benchmark::State& state) {
  const int N = 1024, C = 768, V = static_cast<int>(state.range(0));
  const DType dt = state.range(1) == 1 ? DType::kBF16 : state.range(1) == 2 ? DType::kF16 : DType::kF32;
  const size_t es = mt::dtype_size(dt);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-0.05f, 0.05f);
  auto operand = [&](size_t n) {
    std::vector<char> v(n * es);
    for (size_t i = 0; i < n; ++i) {
      const float f = d(rng);
      if (dt == DType::kBF16) {
        const mt::bf16_t b = mt::f32_to_bf16(f);
        std::memcpy(v.data() + 2 * i, &b, 2);
      } else if (dt == DType::kF16) {
        const mt::f16_t h = mt::f32_to_f16(f);
        std::memcpy(v.data() + 2 * i, &h, 2);
      } else {
        std::memcpy(v.data() + 4 * i, &f, 4);
      }
    }
    return v;
  };
  const std::vector<char> x = operand(size_t(N) * C), w = operand(size_t(V) * C);
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[i] = (i * 7919) % V;
  std::vector<float> dx(size_t(N) * C), dw(size_t(V) * C), losses(N);
  mt::nn::LmHeadArgs a;
  a.x = x.data(), a.w = w.data(), a.dtype = dt, a.targets = targets.data();
  a.N = N, a.C = C, a.V = V, a.grad_scale = 1.0f / N;
  a.dx = dx.data(), a.dw = dw.data(), a.losses = losses.data();
  mt::nn::Workspace ws;
  for (auto _ : state) {
    benchmark::DoNotOptimize(mt::nn::lm_head_cross_entropy(a, ws));
    benchmark::DoNotOptimize(dw.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(6.0 * N * C * V * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_lm_head)
    ->ArgNames({"V", "dtype"})
    ->Args({50257, 0})
    ->Args({50304, 0})
    ->Args({50257, 1})
    ->Args({50304, 1})
    ->Args({50257, 2})
    ->Args({32000, 0})
    ->Args({32000, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
