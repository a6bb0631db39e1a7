#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <tuple>
#include <vector>

#include <omp.h>
#include <sys/mman.h>

#include "base/error.h"
#include "base/timer.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "tensor/allocator.h"

namespace mt::kernels {
namespace {

using Key = std::tuple<int, int, int, int, int, int, bool, bool, int, bool, bool>;

struct Entry {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c, bias, scratch;
};

// Every primitive runs in user scratchpad mode on one region, grown to the largest primitive's need
// (calls hold `mu`, so one GEMM runs at a time). In oneDNN's library mode each primitive of Debian's
// build holds a scratchpad of its own for its lifetime (the backward's weight-gradient GEMMs, A
// transposed, 0.5-2.7 MiB each on two threads): their sum, outside the allocator (DESIGN-NOTES 59).
struct Scratch {
  void* p = nullptr;
  size_t bytes = 0;  // whole 4 KiB pages
  void grow(size_t need) {
    need = (need + 4095) / 4096 * 4096;
    if (need <= bytes) return;
    if (p) ::munmap(p, bytes);  // the old region first: the process never holds both
    p = ::mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      p = nullptr, bytes = 0;
      MT_CHECK(false, ErrorKind::kOutOfMemory, "gemm: cannot map " + std::to_string(need) + " bytes of oneDNN scratchpad");
    }
    bytes = need;
  }
};

struct Context {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, std::unique_ptr<Entry>> cache;
  std::map<std::pair<Key, int>, size_t> scratch_sizes;  // gemm_scratch_bytes' answers, by the call and threads
  Scratch scratch;
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

// The primitive descriptor of a call (user scratchpad mode); false where oneDNN has no matmul for it.
bool describe(Context& ctx, Entry& e, dnnl::matmul::primitive_desc& pd, int M, int N, int K, int lda, int ldb,
              int ldc, bool ta, bool tb, DType dt, bool acc, bool has_bias) {
  using dims = dnnl::memory::dims;
  e.a = dnnl::memory::desc(dims{M, K}, to_dnnl(dt), ta ? dims{1, lda} : dims{lda, 1});
  e.b = dnnl::memory::desc(dims{K, N}, to_dnnl(dt), tb ? dims{1, ldb} : dims{ldb, 1});
  e.c = dnnl::memory::desc(dims{M, N}, dnnl::memory::data_type::f32, dims{ldc, 1});
  if (has_bias) e.bias = dnnl::memory::desc(dims{1, N}, dnnl::memory::data_type::f32, dims{N, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (acc) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  try {
    auto desc = has_bias ? dnnl::matmul::desc(e.a, e.b, e.bias, e.c) : dnnl::matmul::desc(e.a, e.b, e.c);
    pd = dnnl::matmul::primitive_desc(desc, attr, ctx.engine);
  } catch (const dnnl::error& err) {
    return false;
  }
  e.scratch = pd.scratchpad_desc();
  return true;
}

Entry* lookup(Context& ctx, int M, int N, int K, int lda, int ldb, int ldc, bool ta, bool tb,
              DType dt, bool acc, bool has_bias) {
  Key key{M, N, K, lda, ldb, ldc, ta, tb, static_cast<int>(dt), acc, has_bias};
  auto it = ctx.cache.find(key);
  if (it != ctx.cache.end()) return it->second.get();
  auto e = std::make_unique<Entry>();
  dnnl::matmul::primitive_desc pd;
  // Not implemented for this dtype on this CPU: the caller falls back.
  if (!describe(ctx, *e, pd, M, N, K, lda, ldb, ldc, ta, tb, dt, acc, has_bias)) return nullptr;
  e->prim = dnnl::matmul(pd);
  Entry* raw = e.get();
  ctx.cache.emplace(key, std::move(e));
  return raw;
}

// Operands widened to f32 where oneDNN has no matmul for their dtype (f16 without AVX512-FP16):
// a region per thread and operand, grown as needed and reused. A fresh std::vector a call was
// zero-filled and faulted in anew, and an fp16 LM head widened its whole weight so once a tile:
// fp16's forward took 5.7x bf16's on a 4-layer GPT-2 (PERF.md (z)).
struct WidenBuffers {
  Scratch a, b;
  ~WidenBuffers() {
    for (Scratch* s : {&a, &b})
      if (s->p) ::munmap(s->p, s->bytes);
  }
};

WidenBuffers& widen_buffers() {
  thread_local WidenBuffers wide;
  return wide;
}

// Copies a (rows, cols) strided operand to a dense f32 matrix with the same logical layout in `to`.
const float* widen(Scratch& to, const void* p, int rows, int cols, int ld, DType dt) {
  to.grow(static_cast<size_t>(rows) * static_cast<size_t>(cols) * sizeof(float));
  float* out = static_cast<float*>(to.p);
  if (ld == cols) {  // dense: one conversion, over the threads
    convert(out, DType::kF32, p, dt, static_cast<size_t>(rows) * static_cast<size_t>(cols));
    return out;
  }
#pragma omp parallel for schedule(static) if (rows > 1)
  for (int r = 0; r < rows; ++r)
    convert(out + static_cast<size_t>(r) * cols, DType::kF32,
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
  std::unique_lock<std::mutex> lock(ctx.mu);
  Entry* e = lookup(ctx, M, N, K, lda, ldb, ldc, trans_a, trans_b, ab_dtype, accumulate,
                    bias != nullptr);
  if (e == nullptr) {
    MT_CHECK(ab_dtype != DType::kF32, ErrorKind::kInternal, "oneDNN has no f32 matmul");
    // NOTE: oneDNN has no f16 matmul without AVX512-FP16; widen to f32 (exact: an f16 product
    // fits f32's mantissa; the f32 matmul's rate plus the conversion's bytes).
    // (Unlocked through the widening and the f32 call, which locks again: a throw in either,
    // a region that cannot be mapped, leaves the mutex as it found it.)
    WidenBuffers& wide = widen_buffers();
    lock.unlock();
    const float* a32 = trans_a ? widen(wide.a, A, K, M, lda, ab_dtype) : widen(wide.a, A, M, K, lda, ab_dtype);
    const float* b32 = trans_b ? widen(wide.b, B, N, K, ldb, ab_dtype) : widen(wide.b, B, K, N, ldb, ab_dtype);
    gemm(M, N, K, a32, trans_a ? M : K, trans_a, b32, trans_b ? K : N, trans_b, C,
         ldc, DType::kF32, accumulate, bias);
    return;
  }
  dnnl::memory a(e->a, ctx.engine, const_cast<void*>(A));
  dnnl::memory b(e->b, ctx.engine, const_cast<void*>(B));
  dnnl::memory c(e->c, ctx.engine, C);
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
  if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, dnnl::memory(e->bias, ctx.engine, const_cast<float*>(bias)));
  if (e->scratch.get_size() > 0) {
    ctx.scratch.grow(e->scratch.get_size());
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(e->scratch, ctx.engine, ctx.scratch.p));
  }
  e->prim.execute(ctx.stream, args);
  ctx.stream.wait();
}

int gemm_primitive_count() {
  Context& ctx = context();
  std::lock_guard<std::mutex> lock(ctx.mu);
  return static_cast<int>(ctx.cache.size());
}

size_t gemm_scratch_bytes(int M, int N, int K, bool trans_a, bool trans_b, DType ab_dtype, bool accumulate,
                          bool bias, int threads, int lda, int ldc) {
  if (M == 0 || N == 0) return 0;
  Context& ctx = context();
  std::lock_guard<std::mutex> lock(ctx.mu);
  const int ldb = trans_b ? K : N, own = omp_get_max_threads();
  if (lda <= 0) lda = trans_a ? M : K;
  if (ldc <= 0) ldc = N;
  if (threads <= 0) threads = own;
  const std::pair<Key, int> key{Key{M, N, K, lda, ldb, ldc, trans_a, trans_b, static_cast<int>(ab_dtype), accumulate, bias},
                                threads};
  auto it = ctx.scratch_sizes.find(key);
  if (it != ctx.scratch_sizes.end()) return it->second;
  struct Threads {  // oneDNN reads omp_get_max_threads() when it describes the primitive
    int own;
    ~Threads() { omp_set_num_threads(own); }
  } restore{own};
  omp_set_num_threads(threads);
  Entry e;
  dnnl::matmul::primitive_desc pd;
  size_t bytes = 0;
  // Where oneDNN has no matmul for the dtype, gemm widens the operands into dense f32 copies and
  // runs the f32 one on them (lda dense, ldc as given).
  if (describe(ctx, e, pd, M, N, K, lda, ldb, ldc, trans_a, trans_b, ab_dtype, accumulate, bias) ||
      describe(ctx, e, pd, M, N, K, trans_a ? M : K, ldb, ldc, trans_a, trans_b, DType::kF32, accumulate, bias))
    bytes = (e.scratch.get_size() + 4095) / 4096 * 4096;
  ctx.scratch_sizes.emplace(key, bytes);
  return bytes;
}

bool gemm_native(DType ab_dtype) {
  if (ab_dtype == DType::kF32) return true;
  Context& ctx = context();
  std::lock_guard<std::mutex> lock(ctx.mu);
  static std::map<DType, bool> native;  // whether oneDNN multiplies the dtype here (any shape alike)
  if (!native.count(ab_dtype)) {
    Entry e;
    dnnl::matmul::primitive_desc pd;
    native[ab_dtype] = describe(ctx, e, pd, 16, 16, 16, 16, 16, 16, false, false, ab_dtype, false, false);
  }
  return native[ab_dtype];
}

std::pair<size_t, size_t> gemm_widen_bytes(int M, int N, int K, DType ab_dtype) {
  if (ab_dtype == DType::kF32 || gemm_native(ab_dtype)) return {0, 0};
  return gemm_widen_pages(M, N, K);
}

std::pair<size_t, size_t> gemm_widen_pages(int M, int N, int K) {
  if (M == 0 || N == 0) return {0, 0};
  auto pages = [](size_t elems) { return (elems * sizeof(float) + 4095) / 4096 * 4096; };
  return {pages(static_cast<size_t>(M) * static_cast<size_t>(K)), pages(static_cast<size_t>(K) * static_cast<size_t>(N))};
}

size_t gemm_widen_held() {
  const WidenBuffers& w = widen_buffers();
  return w.a.bytes + w.b.bytes;
}

size_t gemm_scratch_held() {
  Context& ctx = context();
  std::lock_guard<std::mutex> lock(ctx.mu);
  return ctx.scratch.bytes;
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
