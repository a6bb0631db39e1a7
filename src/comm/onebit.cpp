// One-bit compression and the compressed all-reduce: see onebit.h.
#include "comm/onebit.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "base/cpu_features.h"
#include "comm/onebit_avx512.h"

namespace mt::comm {

namespace {

// Passes run over the OpenMP threads in blocks of kBlock elements (a multiple of 8: whole bytes of
// bits); a sum of squares adds its blocks' sums in order, the same on any thread count.
constexpr size_t kBlock = size_t{1} << 14;

int64_t blocks_of(size_t len) { return static_cast<int64_t>((len + kBlock - 1) / kBlock); }

bool avx512() { return isa_active() == Isa::kAvx512; }

// f(first element, elements) for each block of len, over the threads.
template <typename F>
void for_blocks(size_t len, F&& f) {
  const int64_t nb = blocks_of(len);
#pragma omp parallel for schedule(static) if (nb > 1)
  for (int64_t b = 0; b < nb; ++b) {
    const size_t i0 = static_cast<size_t>(b) * kBlock;
    f(i0, std::min(kBlock, len - i0));
  }
}

// compressed_all_reduce's vectors, kept by the thread.
struct Scratch {
  std::vector<float> send, recv, all, mine, chunk;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// y (len) = scale · (±1 from bits), or y += that (add).
void unpack_into(float* y, const uint8_t* bits, size_t len, float scale, bool add) {
  const bool vec = avx512();
  for_blocks(len, [&](size_t i0, size_t n) {
    const uint8_t* in = bits + i0 / 8;
    if (vec) return detail::onebit_unpack_avx512(y + i0, in, n, scale, add);
    for (size_t i = 0; i < n; ++i) {
      const float v = (in[i >> 3] & (0x80u >> (i & 7))) ? scale : -scale;
      y[i0 + i] = add ? y[i0 + i] + v : v;
    }
  });
}

// One block's sum of squares in double (onebit_scale's, the same order).
double block_squares(const float* x, size_t n, bool vec) {
  if (vec) return detail::onebit_sum_squares_avx512(x, n);
  double sq = 0.0;
  for (size_t i = 0; i < n; ++i) sq += static_cast<double>(x[i]) * x[i];
  return sq;
}

// One block's bits (onebit_pack's).
void block_pack(uint8_t* out, const float* x, size_t n, bool vec) {
  if (vec) return detail::onebit_pack_avx512(out, x, n);
  std::memset(out, 0, (n + 7) / 8);
  for (size_t i = 0; i < n; ++i)
    if (!(x[i] < 0.0f)) out[i >> 3] |= static_cast<uint8_t>(0x80u >> (i & 7));
}

// e (n) += x (its first len elements; the rest as zeros), then onebit_scale(e, n): each block's
// squares summed while the block is in the cache (the same blocks and order, so the same value).
float add_and_scale(float* e, const float* x, size_t len, size_t n) {
  if (n == 0) return 0.0f;
  const bool vec = avx512();
  std::vector<double> part(static_cast<size_t>(blocks_of(n)));
  for_blocks(n, [&](size_t i0, size_t m) {
    float* eb = e + i0;
    const size_t real = i0 < len ? std::min(m, len - i0) : 0;
    const float* xb = x + i0;
    if (vec) {
      part[i0 / kBlock] = detail::onebit_add_squares_avx512(eb, xb, real, m);
      return;
    }
    for (size_t i = 0; i < real; ++i) eb[i] = xb[i] + eb[i];
    for (size_t i = real; i < m; ++i) eb[i] = 0.0f + eb[i];  // DeepSpeed's zero padding
    part[i0 / kBlock] = block_squares(eb, m, vec);
  });
  double sq = 0.0;
  for (double q : part) sq += q;
  return static_cast<float>(std::sqrt(sq / static_cast<double>(n)));
}

// bits = onebit_pack(e, n), then the error feedback e -= sign(e) s, a block at a time while it is
// in the cache (each element's bit is taken before its own update).
void pack_and_feedback(uint8_t* bits, float* e, size_t n, float s) {
  const bool vec = avx512();
  for_blocks(n, [&](size_t i0, size_t m) {
    float* eb = e + i0;
    if (vec) return detail::onebit_pack_feedback_avx512(bits + i0 / 8, eb, m, s);
    block_pack(bits + i0 / 8, eb, m, vec);
    for (size_t i = 0; i < m; ++i) eb[i] -= (eb[i] < 0.0f) ? -s : s;
  });
}

}  // namespace

void onebit_pack(uint8_t* bits, const float* x, size_t len) {
  const bool vec = avx512();
  for_blocks(len, [&](size_t i0, size_t n) { block_pack(bits + i0 / 8, x + i0, n, vec); });
}

void onebit_unpack(float* y, const uint8_t* bits, size_t len, float scale) { unpack_into(y, bits, len, scale, false); }

float onebit_scale(const float* x, size_t len) {
  if (len == 0) return 0.0f;
  const bool vec = avx512();
  std::vector<double> part(static_cast<size_t>(blocks_of(len)));
  for_blocks(len, [&](size_t i0, size_t n) { part[i0 / kBlock] = block_squares(x + i0, n, vec); });
  double sq = 0.0;
  for (double p : part) sq += p;
  return static_cast<float>(std::sqrt(sq / static_cast<double>(len)));
}

float onebit_compress(uint8_t* bits, const float* x, float* e, size_t len) {
  const float s = add_and_scale(e, x, len, len);  // e holds c = x + e
  pack_and_feedback(bits, e, len, s);
  return s;
}

OneBitLayout::OneBitLayout(size_t n, int r) : len(n), ranks(r) {
  MT_CHECK(r >= 1, ErrorKind::kInvalidArgument, "compressed all-reduce: a group needs a rank");
  const size_t R = static_cast<size_t>(r);
  const size_t lcm = R * 8 / std::gcd(R, size_t{8});  // DeepSpeed's divider
  const size_t unit = R * lcm;
  padded = (n + unit - 1) / unit * unit;
  if (padded == 0) padded = unit;
  chunk = padded / R;
}

OneBitPlan::OneBitPlan(const std::vector<std::pair<size_t, size_t>>& spans, int r) : ranks(r) {
  for (const auto& [offset, len] : spans) {
    Tensor t{offset, OneBitLayout(len, r), worker_error_len, server_error_len};
    worker_error_len += t.layout.padded;
    server_error_len += t.layout.chunk;
    words += t.layout.words();
    tensors.push_back(t);
  }
}

void compressed_all_reduce(Backend& group, float* buf, const OneBitPlan& plan, float* worker_error, float* server_error,
                           const CommOptions& opts) {
  const int n = group.size(), me = group.rank();
  if (n == 1) return;
  MT_CHECK(plan.ranks == n, ErrorKind::kInternal, "compressed all-reduce: a plan made for another group size");
  const size_t M = plan.words;  // words of one message (every tensor's chunk for one rank)
  // 1. Worker: each tensor padded, plus its error, compressed with one scale; chunk r of its bits
  //    (with the scale) into the message for rank r.
  // Scratch kept by the thread from call to call (a step's exchange is as large as the model: fresh
  // vectors would fault their pages in every step, and freed to glibc they stayed in its heap by
  // chance: compressed_all_reduce_scratch_bytes counts them).
  Scratch& k = scratch();
  std::vector<float>&send = k.send, &recv = k.recv, &a = k.chunk, &mine = k.mine, &all = k.all;
  send.assign(M * static_cast<size_t>(n), 0.0f);
  recv.assign(send.size(), 0.0f);
  size_t at = 0;  // this tensor's first word in a message
  for (const OneBitPlan::Tensor& t : plan.tensors) {
    const OneBitLayout& L = t.layout;
    float* e = worker_error + t.worker_at;  // holds c = buf + e (zero-padded) until its error is taken
    const float* in = buf + t.offset;
    const size_t len = L.len, padded = L.padded;
    // c and its scale in one pass over the blocks; then each chunk's bits and its errors in another.
    const float s = add_and_scale(e, in, len, padded);
    for (int r = 0; r < n; ++r) {
      float* msg = send.data() + static_cast<size_t>(r) * M + at;
      msg[0] = s;
      pack_and_feedback(reinterpret_cast<uint8_t*>(msg + 1), e + L.begin(r), L.chunk, s);
    }
    at += L.words();
  }
  // 2. Chunk r of every worker to rank r.
  AllToAllOptions ao;
  static_cast<CommOptions&>(ao) = opts;
  if (ao.tag.empty()) ao.tag = "onebit worker chunks";
  group.all_to_all(recv.data(), send.data(), M, DType::kF32, ao)->wait();
  // 3. Server: sum_w (s_w / n) · (±1), plus its error, compressed again.
  mine.assign(M, 0.0f);
  all.assign(M * static_cast<size_t>(n), 0.0f);
  size_t largest = 0;  // the chunk's vector sized once (growing tensor by tensor left the smaller ones to the heap)
  for (const OneBitPlan::Tensor& t : plan.tensors) largest = std::max(largest, t.layout.chunk);
  if (a.capacity() < largest) {
    std::vector<float>().swap(a);
    a.reserve(largest);
  }
  const float inv = 1.0f / static_cast<float>(n);
  at = 0;
  for (const OneBitPlan::Tensor& t : plan.tensors) {
    const OneBitLayout& L = t.layout;
    const size_t chunk = L.chunk;
    a.assign(chunk, 0.0f);
    for (int w = 0; w < n; ++w) {
      const float* msg = recv.data() + static_cast<size_t>(w) * M + at;
      unpack_into(a.data(), reinterpret_cast<const uint8_t*>(msg + 1), chunk, msg[0] * inv, /*add=*/true);
    }
    float* se = server_error + t.server_at;
    const float s = add_and_scale(se, a.data(), chunk, chunk);  // se holds a + server_error
    mine[at] = s;
    pack_and_feedback(reinterpret_cast<uint8_t*>(mine.data() + at + 1), se, chunk, s);
    at += L.words();
  }
  (void)me;
  // 4. Every server's chunks to every rank; each tensor's first len elements kept.
  AllGatherOptions go;
  static_cast<CommOptions&>(go) = opts;
  if (go.tag.empty()) go.tag = "onebit server chunks";
  group.all_gather(all.data(), mine.data(), M, DType::kF32, go)->wait();
  at = 0;
  for (const OneBitPlan::Tensor& t : plan.tensors) {
    const OneBitLayout& L = t.layout;
    for (int r = 0; r < n && L.begin(r) < L.len; ++r) {
      const float* msg = all.data() + static_cast<size_t>(r) * M + at;
      const size_t m = std::min(L.chunk, L.len - L.begin(r));
      onebit_unpack(buf + t.offset + L.begin(r), reinterpret_cast<const uint8_t*>(msg + 1), m, msg[0]);
    }
    at += L.words();
  }
}

size_t compressed_all_reduce_scratch_bytes(const OneBitPlan& plan) {
  if (plan.ranks <= 1) return 0;
  size_t chunk = 0;
  for (const OneBitPlan::Tensor& t : plan.tensors) chunk = std::max(chunk, t.layout.chunk);
  return 4 * ((3 * static_cast<size_t>(plan.ranks) + 1) * plan.words + chunk);
}

size_t compressed_all_reduce_scratch_held() {
  const Scratch& s = scratch();
  return 4 * (s.send.capacity() + s.recv.capacity() + s.all.capacity() + s.mine.capacity() + s.chunk.capacity());
}

void compressed_all_reduce(Backend& group, float* buf, size_t len, float* worker_error, float* server_error,
                           const CommOptions& opts) {
  if (group.size() == 1) return;
  compressed_all_reduce(group, buf, OneBitPlan({{0, len}}, group.size()), worker_error, server_error, opts);
}

}  // namespace mt::comm
