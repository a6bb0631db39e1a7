// Megatron's GPT sample order built as a run starts (data/megatron_order.h): a corpus of 1M
// sequences (uniform 1-1999 tokens, about 1G tokens), T 2048, the samples of one epoch and of 2.5
// epochs. The peer's share that is not its C++ helper is numpy's RandomState.shuffle of the same
// arrays (docs/PERF.md: tools/check_megatron_idx.py --numpy-shuffle N SEED, timed).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "data/megatron_order.h"

namespace {

std::vector<int32_t> corpus_lengths() {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> len(1, 1999);
  std::vector<int32_t> v(1'000'000);
  for (int32_t& x : v) x = len(rng);
  return v;
}

void BM_megatron_order_build(benchmark::State& state) {
  static const std::vector<int32_t> lengths = corpus_lengths();
  uint64_t tokens = 0;
  for (int32_t n : lengths) tokens += static_cast<uint64_t>(n);
  const int T = 2048;
  const uint64_t samples = static_cast<uint64_t>(static_cast<double>(tokens) * static_cast<double>(state.range(0)) / 10.0) / T;
  for (auto _ : state) {
    mt::data::MegatronOrder order(lengths, T, samples, 1234);
    benchmark::DoNotOptimize(order.size());
  }
  state.counters["samples"] = static_cast<double>(samples);
}
BENCHMARK(BM_megatron_order_build)->Arg(10)->Arg(25)->Unit(benchmark::kMillisecond);

void BM_numpy_legacy_shuffle(benchmark::State& state) {
  std::vector<uint32_t> v(static_cast<size_t>(state.range(0)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint32_t>(i);
  for (auto _ : state) {
    mt::data::NumpyLegacyRandom rng(1234);
    rng.shuffle(v);
    benchmark::DoNotOptimize(v.data());
  }
}
BENCHMARK(BM_numpy_legacy_shuffle)->Arg(1'000'000)->Arg(10'000'000)->Unit(benchmark::kMillisecond);

}  // namespace
