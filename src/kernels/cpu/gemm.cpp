#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "base/timer.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "tensor/allocator.h"

namespace mt::kernels {
namespace {

using Key = std::tuple<int, int, int, int, int, int, bool, bool, int, bool, bool>;

struct Entry {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c, bias;
};

struct Context {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, std::unique_ptr<Entry>> cache;
  std::mutex mu;
};

Context& context() {
  static Context ctx;
  return ctx;
}

dnnl::memory::data_type to_dnnl(DType d) {
  switch (d) {
    case DType::kF32: return dnnl::memory::data_type::f32;
    case DType::kBF16: return dnnl::memory::data_type::bf16;
    case DType::kF16: return dnnl::memory::data_type::f16;
  }
  return dnnl::memory::data_type::f32;
}

Entry* lookup(Context& ctx, int M, int N, int K, int lda, int ldb, int ldc, bool ta, bool tb,
              DType dt, bool acc, bool has_bias) {
  Key key{M, N, K, lda, ldb, ldc, ta, tb, static_cast<int>(dt), acc, has_bias};
  auto it = ctx.cache.find(key);
  if (it != ctx.cache.end()) return it->second.get();
  using dims = dnnl::memory::dims;
  auto e = std::make_unique<Entry>();
  e->a = dnnl::memory::desc(dims{M, K}, to_dnnl(dt), ta ? dims{1, lda} : dims{lda, 1});
  e->b = dnnl::memory::desc(dims{K, N}, to_dnnl(dt), tb ? dims{1, ldb} : dims{ldb, 1});
  e->c = dnnl::memory::desc(dims{M, N}, dnnl::memory::data_type::f32, dims{ldc, 1});
  if (has_bias) e->bias = dnnl::memory::desc(dims{1, N}, dnnl::memory::data_type::f32, dims{N, 1});
  dnnl::primitive_attr attr;
  if (acc) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  try {
    auto desc = has_bias ? dnnl::matmul::desc(e->a, e->b, e->bias, e->c)
                         : dnnl::matmul::desc(e->a, e->b, e->c);
    e->prim = dnnl::matmul(dnnl::matmul::primitive_desc(desc, attr, ctx.engine));
  } catch (const dnnl::error& err) {
    return nullptr;  // not implemented for this dtype on this CPU: the caller falls back
  }
  Entry* raw = e.get();
  ctx.cache.emplace(key, std::move(e));
  return raw;
}

// Copies a (rows, cols) strided operand to a dense f32 matrix with the same logical layout.
std::vector<float> widen(const void* p, int rows, int cols, int ld, DType dt) {
  std::vector<float> out(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r)
    convert(out.data() + static_cast<size_t>(r) * cols, DType::kF32,
            static_cast<const char*>(p) + static_cast<size_t>(r) * ld * dtype_size(dt), dt,
            static_cast<size_t>(cols));
  return out;
}

}  // namespace

void gemm(int M, int N, int K, const void* A, int lda, bool trans_a, const void* B, int ldb,
          bool trans_b, float* C, int ldc, DType ab_dtype, bool accumulate, const float* bias) {
  MT_INTERNAL_CHECK(!(accumulate && bias != nullptr));
  if (M == 0 || N == 0) return;
  Context& ctx = context();
  std::lock_guard<std::mutex> lock(ctx.mu);
  Entry* e = lookup(ctx, M, N, K, lda, ldb, ldc, trans_a, trans_b, ab_dtype, accumulate,
                    bias != nullptr);
  if (e == nullptr) {
    MT_CHECK(ab_dtype != DType::kF32, ErrorKind::kInternal, "oneDNN has no f32 matmul");
    // NOTE: oneDNN has no f16 matmul without AVX512-FP16; widen to f32 (correct, slower).
    std::vector<float> a32 = trans_a ? widen(A, K, M, lda, ab_dtype) : widen(A, M, K, lda, ab_dtype);
    std::vector<float> b32 = trans_b ? widen(B, N, K, ldb, ab_dtype) : widen(B, K, N, ldb, ab_dtype);
    ctx.mu.unlock();
    gemm(M, N, K, a32.data(), trans_a ? M : K, trans_a, b32.data(), trans_b ? K : N, trans_b, C,
         ldc, DType::kF32, accumulate, bias);
    ctx.mu.lock();
    return;
  }
  dnnl::memory a(e->a, ctx.engine, const_cast<void*>(A));
  dnnl::memory b(e->b, ctx.engine, const_cast<void*>(B));
  dnnl::memory c(e->c, ctx.engine, C);
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
  if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, dnnl::memory(e->bias, ctx.engine, const_cast<float*>(bias)));
  e->prim.execute(ctx.stream, args);
  ctx.stream.wait();
}

int gemm_primitive_count() {
  Context& ctx = context();
  std::lock_guard<std::mutex> lock(ctx.mu);
  return static_cast<int>(ctx.cache.size());
}

double gemm_ceiling_tflops(int M, int N, int K, DType dt, double seconds) {
  size_t es = dtype_size(dt);
  std::vector<char> a(static_cast<size_t>(M) * K * es), b(static_cast<size_t>(K) * N * es);
  std::vector<float> c(static_cast<size_t>(M) * N);
  std::mt19937 rng(1);
  std::vector<float> tmp(std::max(a.size(), b.size()) / es);
  for (auto& x : tmp) x = static_cast<float>(rng() % 1000) / 1000.0f - 0.5f;
  convert(a.data(), dt, tmp.data(), DType::kF32, a.size() / es);
  convert(b.data(), dt, tmp.data(), DType::kF32, b.size() / es);
  gemm(M, N, K, a.data(), K, false, b.data(), K, true, c.data(), N, dt, false);
  Timer t;
  int iters = 0;
  while (t.seconds() < seconds || iters < 3) {
    gemm(M, N, K, a.data(), K, false, b.data(), K, true, c.data(), N, dt, false);
    ++iters;
  }
  return 2.0 * M * N * K * iters / t.seconds() / 1e12;
}

}  // namespace mt::kernels
