// Flash attention forward and backward (kernels/cpu/attention.h) at GPT-2 124M shapes:
// B=4, T=256 and B=1, T=1024, NH=NKV=12, HS=64. FLOP counts are the causal ones: forward
// 2*B*NH*T^2*HS (two products over half the score matrix), backward 2.5x that (five products).
// Long sequences (B=1, T=4096 and 16384, same heads): forward + backward of the dense causal kernel
// against the block-sparse one (sparse_attention.h) with DeepSpeed's fixed layout (block 16, 4
// local blocks, 1 global, unidirectional); FLOPs count the (query, key) pairs each computes.
// Documents (Megatron's reset_attention_mask, kstart): T = 4096 packing documents of D tokens each,
// forward + backward; FLOPs count the visible pairs, T/D documents of D(D+1)/2.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/sparse_attention.h"

namespace {

struct AttentionBuffers {
  int B, T, NH, HS;
  std::vector<float> qkv, out, lse, dout, dqkv;  // (B,T,3*NH*HS), (B,T,NH*HS), (B,NH,T), ...

  AttentionBuffers(int B_, int T_, int NH_, int HS_) : B(B_), T(T_), NH(NH_), HS(HS_) {
    const size_t rows = static_cast<size_t>(B) * T;
    qkv.resize(rows * 3 * NH * HS);
    out.resize(rows * NH * HS);
    dout.resize(rows * NH * HS);
    dqkv.resize(qkv.size());
    lse.resize(static_cast<size_t>(B) * NH * T);
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (float& x : qkv) x = dist(gen);
    for (float& x : dout) x = dist(gen);
    mt::kernels::attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, NH, HS);
  }
  double forward_flops() const { return 2.0 * B * NH * static_cast<double>(T) * T * HS; }
};

void set_flops(benchmark::State& state, double flops) {
  state.counters["FLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_AttentionForward(benchmark::State& state) {
  AttentionBuffers a(state.range(0), state.range(1), state.range(2), state.range(3));
  for (auto _ : state) {
    mt::kernels::attention_forward(a.out.data(), a.lse.data(), a.qkv.data(), a.B, a.T, a.NH, a.NH,
                                   a.HS);
    benchmark::DoNotOptimize(a.out.data());
  }
  set_flops(state, a.forward_flops());
}

void BM_AttentionBackward(benchmark::State& state) {
  AttentionBuffers a(state.range(0), state.range(1), state.range(2), state.range(3));
  for (auto _ : state) {
    mt::kernels::attention_backward(a.dqkv.data(), a.dout.data(), a.qkv.data(), a.out.data(),
                                    a.lse.data(), a.B, a.T, a.NH, a.NH, a.HS);
    benchmark::DoNotOptimize(a.dqkv.data());
  }
  set_flops(state, 2.5 * a.forward_flops());
}

// Forward + backward: 3.5x the forward's 4 * HS FLOPs per visible (query, key) pair.
double fwd_bwd_flops(const AttentionBuffers& a, double pairs_per_head) {
  return 3.5 * 4.0 * a.HS * pairs_per_head * a.NH * a.B;
}

void BM_AttentionCausalFwdBwd(benchmark::State& state) {
  AttentionBuffers a(1, state.range(0), 12, 64);
  for (auto _ : state) {
    mt::kernels::attention_forward(a.out.data(), a.lse.data(), a.qkv.data(), a.B, a.T, a.NH, a.NH,
                                   a.HS);
    mt::kernels::attention_backward(a.dqkv.data(), a.dout.data(), a.qkv.data(), a.out.data(),
                                    a.lse.data(), a.B, a.T, a.NH, a.NH, a.HS);
    benchmark::DoNotOptimize(a.dqkv.data());
  }
  set_flops(state, fwd_bwd_flops(a, 0.5 * a.T * (a.T + 1.0)));
  state.counters["density"] = 1.0;
}

void BM_SparseAttentionFixedFwdBwd(benchmark::State& state) {
  AttentionBuffers a(1, state.range(0), 12, 64);
  mt::kernels::SparsityConfig config;
  config.num_heads = a.NH;
  config.pattern =
      mt::kernels::FixedSparsity{.attention = mt::kernels::SparseDirection::kUnidirectional};
  const auto plan =
      mt::kernels::sparse_attention_plan(mt::kernels::sparse_layout_make(config, a.T), true);
  for (auto _ : state) {
    mt::kernels::sparse_attention_forward(a.out.data(), a.lse.data(), a.qkv.data(), plan, a.B, a.T,
                                          a.NH, a.NH, a.HS);
    mt::kernels::sparse_attention_backward(a.dqkv.data(), a.dout.data(), a.qkv.data(), a.out.data(),
                                           a.lse.data(), plan, a.B, a.T, a.NH, a.NH, a.HS);
    benchmark::DoNotOptimize(a.dqkv.data());
  }
  // Off-diagonal blocks: block^2 pairs; diagonal ones (every row has its own): block(block+1)/2.
  const double blk = plan.block, nb = plan.num_blocks;
  const double pairs = (plan.nonzero_blocks() / a.NH - nb) * blk * blk + nb * blk * (blk + 1) / 2;
  set_flops(state, fwd_bwd_flops(a, pairs));
  state.counters["density"] = pairs / (0.5 * a.T * (a.T + 1.0));
}

void BM_AttentionDocumentsFwdBwd(benchmark::State& state) {
  AttentionBuffers a(1, state.range(0), 12, 64);
  const int D = static_cast<int>(state.range(1));
  std::vector<int32_t> kstart(static_cast<size_t>(a.T));
  for (int t = 0; t < a.T; ++t) kstart[t] = t / D * D;
  for (auto _ : state) {
    mt::kernels::attention_forward(a.out.data(), a.lse.data(), a.qkv.data(), a.B, a.T, a.NH, a.NH,
                                   a.HS, nullptr, kstart.data());
    mt::kernels::attention_backward(a.dqkv.data(), a.dout.data(), a.qkv.data(), a.out.data(),
                                    a.lse.data(), a.B, a.T, a.NH, a.NH, a.HS, nullptr, kstart.data());
    benchmark::DoNotOptimize(a.dqkv.data());
  }
  for (float x : a.dqkv)
    if (!std::isfinite(x)) return state.SkipWithError("a gradient is not finite");
  const double full = a.T / D * (0.5 * D * (D + 1.0)), tail = a.T % D * 0.5 * (a.T % D + 1.0);
  set_flops(state, fwd_bwd_flops(a, full + tail));
  state.counters["density"] = (full + tail) / (0.5 * a.T * (a.T + 1.0));
}

}  // namespace

BENCHMARK(BM_AttentionDocumentsFwdBwd)
    ->ArgNames({"T", "D"})
    ->Args({4096, 2048})
    ->Args({4096, 512})
    ->Args({4096, 100})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_AttentionCausalFwdBwd)
    ->ArgName("T")
    ->Arg(4096)
    ->Arg(16384)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_SparseAttentionFixedFwdBwd)
    ->ArgName("T")
    ->Arg(4096)
    ->Arg(16384)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_AttentionForward)
    ->ArgNames({"B", "T", "NH", "HS"})
    ->Args({4, 256, 12, 64})
    ->Args({1, 1024, 12, 64})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_AttentionBackward)
    ->ArgNames({"B", "T", "NH", "HS"})
    ->Args({4, 256, 12, 64})
    ->Args({1, 1024, 12, 64})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
