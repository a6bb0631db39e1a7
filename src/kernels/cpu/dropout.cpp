#include "kernels/cpu/dropout.h"

#include <cmath>

#include "base/cpu_features.h"
#include "base/error.h"

namespace mt::kernels {
namespace detail {
void dropout_row_avx512(float* x, int n, uint64_t rk, uint64_t col0, uint32_t threshold, float scale);
void dropout_column_avx512(float* x, int n, const uint64_t* rks, uint64_t col, uint32_t threshold, float scale);
}  // namespace detail
namespace {

// x[c] for c < n: columns col0 + c of the row whose key is rk.
void drop_row(float* x, int n, uint64_t rk, uint64_t col0, uint32_t thr, float scale, bool avx512) {
  if (avx512) return detail::dropout_row_avx512(x, n, rk, col0, thr, scale);
  for (int c = 0; c < n; ++c) x[c] = drop_keep(rk, col0 + static_cast<uint64_t>(c), thr) ? x[c] * scale : 0.0f;
}

}  // namespace

DropRate::DropRate(float prob) : p(prob) {
  MT_CHECK(prob >= 0.0f && prob < 1.0f, ErrorKind::kInvalidArgument, "dropout: a probability must be in [0, 1)");
  threshold = static_cast<uint32_t>(std::floor(static_cast<double>(prob) * 4294967296.0));
  scale = 1.0f / (1.0f - prob);
}

void dropout_rows(float* x, size_t rows, int C, uint64_t key, const DropRate& rate, uint64_t sample0, size_t row0, int T,
                  size_t t0) {
  if (!rate.active()) return;
  const bool avx512 = isa_active() == Isa::kAvx512;
#pragma omp parallel for schedule(static)
  for (size_t r = 0; r < rows; ++r) {
    const size_t g = row0 + r;
    const uint64_t rk = drop_row_key(key, sample0 + g / static_cast<size_t>(T), t0 + g % static_cast<size_t>(T));
    drop_row(x + r * static_cast<size_t>(C), C, rk, 0, rate.threshold, rate.scale, avx512);
  }
}

void dropout_tile(float* x, int ld, bool keys_major, int queries, int keys, uint64_t head_key, const DropRate& rate,
                  uint64_t sample, int q0, int j0) {
  if (!rate.active()) return;
  const uint32_t thr = rate.threshold;
  const float scale = rate.scale;
  const bool avx512 = isa_active() == Isa::kAvx512;
  if (!keys_major) {  // a row a query: its keys contiguous
    for (int i = 0; i < queries; ++i)
      drop_row(x + static_cast<long>(i) * ld, keys, drop_row_key(head_key, sample, static_cast<uint64_t>(q0 + i)),
               static_cast<uint64_t>(j0), thr, scale, avx512);
    return;
  }
  // A row a key, its queries contiguous: the queries' row keys first.
  uint64_t rks[256];
  MT_CHECK(queries <= 256, ErrorKind::kInternal, "dropout_tile: more than 256 queries in a tile");
  for (int i = 0; i < queries; ++i) rks[i] = drop_row_key(head_key, sample, static_cast<uint64_t>(q0 + i));
  for (int j = 0; j < keys; ++j) {
    float* v = x + static_cast<long>(j) * ld;
    const uint64_t col = static_cast<uint64_t>(j0 + j);
    if (avx512) {
      detail::dropout_column_avx512(v, queries, rks, col, thr, scale);
      continue;
    }
    for (int i = 0; i < queries; ++i) v[i] = drop_keep(rks[i], col, thr) ? v[i] * scale : 0.0f;
  }
}

}  // namespace mt::kernels
