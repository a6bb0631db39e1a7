#include "nn/tp_split.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/error.h"

namespace mt::nn {

Shape tp_local_shape(const std::string& name, const Shape& global, const TpSplit& s, TpPlace place) {
  if (s.dim < 0 || place.size == 1) return global;
  MT_CHECK(s.dim < static_cast<int>(global.size()) && s.parts >= 1, ErrorKind::kInternal,
           name + ": split dim " + std::to_string(s.dim) + " of " + shape_str(global));
  int64_t extent = global[static_cast<size_t>(s.dim)];
  MT_CHECK(extent % (static_cast<int64_t>(s.parts) * place.size) == 0, ErrorKind::kInvalidArgument,
           name + ": dimension " + std::to_string(s.dim) + " of " + shape_str(global) + " (" + std::to_string(s.parts) +
               " part(s)) cannot be split evenly over " + std::to_string(place.size) + " tensor-parallel ranks");
  Shape local = global;
  local[static_cast<size_t>(s.dim)] = extent / place.size;
  return local;
}

Shape tp_unpadded_shape(const Shape& global, const TpSplit& s) {
  Shape out = global;
  if (s.valid > 0 && !out.empty()) out[0] = s.valid;
  return out;
}

void tp_for_each_run(const Shape& global, const TpSplit& s, TpPlace place,
                     const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  MT_INTERNAL_CHECK(global.size() <= 2);
  const int64_t rows = global.empty() ? 1 : global[0];
  const int64_t cols = global.size() == 2 ? global[1] : 1;
  const int64_t valid = s.valid > 0 ? s.valid : rows;
  if (s.dim < 0 || place.size == 1) {  // whole tensor (without padding rows)
    fn(0, 0, valid * cols);
    return;
  }
  const int64_t extent = global[static_cast<size_t>(s.dim)];
  const int64_t sub = extent / s.parts;        // one fused sub-block
  const int64_t slice = sub / place.size;      // this rank's part of it
  if (s.dim == 0) {  // rows: each part's slice is slice*cols contiguous elements
    int64_t local = 0;
    for (int p = 0; p < s.parts; ++p) {
      int64_t r0 = p * sub + place.rank * slice;
      int64_t n = std::min(slice, std::max<int64_t>(0, valid - r0));
      if (n > 0) fn(local * cols, r0 * cols, n * cols);
      local += slice;
    }
    return;
  }
  // dim 1: per row, one run per part
  const int64_t lcols = cols / place.size;
  for (int64_t r = 0; r < valid; ++r)
    for (int p = 0; p < s.parts; ++p) fn(r * lcols + p * slice, r * cols + p * sub + place.rank * slice, slice);
}

void tp_extract(float* local, const float* full, const Shape& global, const TpSplit& s, TpPlace place) {
  int64_t n = shape_numel(tp_local_shape("", global, s, place));
  std::memset(local, 0, static_cast<size_t>(n) * sizeof(float));
  tp_for_each_run(global, s, place, [&](int64_t lo, int64_t go, int64_t len) {
    std::memcpy(local + lo, full + go, static_cast<size_t>(len) * sizeof(float));
  });
}

void tp_insert(float* full, const float* local, const Shape& global, const TpSplit& s, TpPlace place) {
  tp_for_each_run(global, s, place, [&](int64_t lo, int64_t go, int64_t len) {
    std::memcpy(full + go, local + lo, static_cast<size_t>(len) * sizeof(float));
  });
}

}  // namespace mt::nn
