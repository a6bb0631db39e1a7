// Test oracle: DeepSpeed's compressed_allreduce (deepspeed/runtime/comm/nccl.py, mpi.py) written
// again in plain loops over every rank's buffers, from DeepSpeed's code, not from comm/onebit.h:
//   corrected_tensor_size: numel rounded up to a multiple of size · divider, divider = size · 8 /
//   gcd(size, 8); server_chunk_size = corrected / size;
//   worker: buffer_m (zero-padded) += worker_error; worker_scale = norm(buffer_m) /
//   sqrt(numel(buffer_m)); worker_error = buffer_m - worker_scale · sign01(buffer_m), sign01(x) =
//   +1 where x >= 0 (sign().add_(1).bool(): 0 is +1), else -1;
//   server chunk: sum over workers of sign01 · (worker_scale / size), + server_error;
//   server_scale = norm / sqrt(chunk); server_error = that - server_scale · sign01;
//   every rank: the servers' sign01 · server_scale, the first numel elements.
// T is float (the tests that compare bit for bit) or double.
#pragma once

#include <cmath>
#include <cstddef>
#include <numeric>
#include <vector>

namespace mt::comm::testing {

inline size_t ds_corrected_size(size_t numel, int size) {
  const size_t n = static_cast<size_t>(size), divider = n * 8 / std::gcd(n, size_t{8});
  return numel % (n * divider) == 0 ? numel : numel + (n * divider - numel % (n * divider));
}

// x[r] (numel) in, the compressed average out on every rank; we[r] (corrected) and se[r] (corrected
// / size) are rank r's errors, zero-filled to their sizes on first use.
template <typename T>
void ds_compressed_allreduce(std::vector<std::vector<T>>& x, std::vector<std::vector<T>>& we, std::vector<std::vector<T>>& se) {
  const int n = static_cast<int>(x.size());
  const size_t numel = x[0].size(), corrected = ds_corrected_size(numel, n), chunk = corrected / static_cast<size_t>(n);
  we.resize(n);
  se.resize(n);
  auto sign01 = [](T v) { return v >= T(0) || std::isnan(static_cast<double>(v)) ? T(1) : T(-1); };
  auto scale = [](const std::vector<T>& v) {
    double sq = 0;
    for (T e : v) sq += static_cast<double>(e) * static_cast<double>(e);
    return static_cast<T>(std::sqrt(sq / static_cast<double>(v.size())));
  };
  std::vector<std::vector<T>> m(n);
  std::vector<T> ws(n);
  for (int w = 0; w < n; ++w) {
    if (we[w].size() != corrected) we[w].assign(corrected, T(0));
    m[w].assign(corrected, T(0));
    for (size_t i = 0; i < numel; ++i) m[w][i] = x[w][i];
    for (size_t i = 0; i < corrected; ++i) m[w][i] += we[w][i];
    ws[w] = scale(m[w]);
    for (size_t i = 0; i < corrected; ++i) we[w][i] = m[w][i] - ws[w] * sign01(m[w][i]);
  }
  std::vector<T> out(corrected);
  for (int r = 0; r < n; ++r) {
    if (se[r].size() != chunk) se[r].assign(chunk, T(0));
    std::vector<T> a(chunk, T(0));
    for (int w = 0; w < n; ++w) {
      const T share = ws[w] * (T(1) / static_cast<T>(n));
      for (size_t i = 0; i < chunk; ++i) a[i] += sign01(m[w][r * chunk + i]) * share;
    }
    for (size_t i = 0; i < chunk; ++i) a[i] += se[r][i];
    const T s = scale(a);
    for (size_t i = 0; i < chunk; ++i) {
      out[r * chunk + i] = s * sign01(a[i]);
      se[r][i] = a[i] - out[r * chunk + i];
    }
  }
  for (int w = 0; w < n; ++w) x[w].assign(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(numel));
}

}  // namespace mt::comm::testing
