// GEMM microbenchmarks on GPT-2 small's training shapes (B*T = 1024 rows): every form a Linear's
// forward and backward uses, f32, bf16 and f16, reported in FLOP/s. These are the ceilings the
// model's achieved TFLOP/s is compared with. f16 runs as f32 with its operands widened where oneDNN
// has no f16 matmul (no AVX512-FP16): the f32 rate less the conversion.
#include <benchmark/benchmark.h>

#include <vector>

#include "kernels/cpu/gemm.h"

namespace {

using mt::DType;

// args: M, N, K, trans_a, trans_b, dtype (0 f32, 1 bf16, 2 f16)
void BM_Gemm(benchmark::State& state) {
  int M = static_cast<int>(state.range(0)), N = static_cast<int>(state.range(1)),
      K = static_cast<int>(state.range(2));
  bool ta = state.range(3) != 0, tb = state.range(4) != 0;
  const DType dt = state.range(5) == 2 ? DType::kF16 : state.range(5) == 1 ? DType::kBF16 : DType::kF32;
  size_t es = mt::dtype_size(dt);
  std::vector<char> a(static_cast<size_t>(M) * K * es), b(static_cast<size_t>(K) * N * es);
  std::vector<float> c(static_cast<size_t>(M) * N);
  for (auto _ : state)
    mt::kernels::gemm(M, N, K, a.data(), ta ? M : K, ta, b.data(), tb ? K : N, tb, c.data(), N, dt, false);
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * M * N * K * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

// Forward (X W^T), dX (dY W), dW (dY^T X) of the MLP up-projection, and the LM head's logits tile.
BENCHMARK(BM_Gemm)
    ->ArgNames({"M", "N", "K", "ta", "tb", "dtype"})
    ->Args({1024, 3072, 768, 0, 1, 0})
    ->Args({1024, 768, 3072, 0, 0, 0})
    ->Args({3072, 768, 1024, 1, 0, 0})
    ->Args({256, 50257, 768, 0, 1, 0})
    ->Args({1024, 3072, 768, 0, 1, 1})
    ->Args({1024, 768, 3072, 0, 0, 1})
    ->Args({3072, 768, 1024, 1, 0, 1})
    ->Args({256, 50257, 768, 0, 1, 1})
    ->Args({1024, 3072, 768, 0, 1, 2})
    ->Args({1024, 768, 3072, 0, 0, 2})
    ->Args({3072, 768, 1024, 1, 0, 2})
    ->Args({256, 50257, 768, 0, 1, 2})
    ->Unit(benchmark::kMillisecond);

}  // namespace

namespace {

// The memory-bandwidth ceiling for the memory-bound kernels: STREAM triad a = b + s*c over 3 x
// 128 MiB (far beyond the caches), counting 3 x 4 bytes per element (2 reads + 1 write).
void BM_StreamTriad(benchmark::State& state) {
  const size_t n = size_t{32} << 20;
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  for (auto _ : state) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
    benchmark::DoNotOptimize(a.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n) * 12);
}
BENCHMARK(BM_StreamTriad)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
