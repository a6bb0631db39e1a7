#include "kernels/cpu/dropout.h"

#include <cmath>

#include "base/error.h"

namespace mt::kernels {

DropRate::DropRate(float prob) : p(prob) {
  MT_CHECK(prob >= 0.0f && prob < 1.0f, ErrorKind::kInvalidArgument, "dropout: a probability must be in [0, 1)");
  threshold = static_cast<uint32_t>(std::floor(static_cast<double>(prob) * 4294967296.0));
  scale = 1.0f / (1.0f - prob);
}

void dropout_rows(float* x, size_t rows, int C, uint64_t key, const DropRate& rate, uint64_t sample0, size_t row0, int T) {
  if (!rate.active()) return;
  const uint32_t thr = rate.threshold;
  const float scale = rate.scale;
#pragma omp parallel for schedule(static)
  for (size_t r = 0; r < rows; ++r) {
    const size_t g = row0 + r;
    const uint64_t rk = drop_row_key(key, sample0 + g / static_cast<size_t>(T), g % static_cast<size_t>(T));
    float* row = x + r * static_cast<size_t>(C);
    for (int c = 0; c < C; ++c) row[c] = drop_keep(rk, static_cast<uint64_t>(c), thr) ? row[c] * scale : 0.0f;
  }
}

void dropout_tile(float* x, int ld, bool keys_major, int queries, int keys, uint64_t head_key, const DropRate& rate,
                  uint64_t sample, int q0, int j0) {
  if (!rate.active()) return;
  const uint32_t thr = rate.threshold;
  const float scale = rate.scale;
  for (int i = 0; i < queries; ++i) {
    const uint64_t rk = drop_row_key(head_key, sample, static_cast<uint64_t>(q0 + i));
    for (int j = 0; j < keys; ++j) {
      float& v = keys_major ? x[static_cast<long>(j) * ld + i] : x[static_cast<long>(i) * ld + j];
      v = drop_keep(rk, static_cast<uint64_t>(j0 + j), thr) ? v * scale : 0.0f;
    }
  }
}

}  // namespace mt::kernels
