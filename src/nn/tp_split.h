// How a parameter is divided over a tensor-parallel group (DESIGN decision 7), and the mapping
// between a rank's local shard and the parameter as one process holds it.
//
// A split is (dim, parts): the global extent along `dim` is `parts` fused sub-blocks of equal size
// (GPT-2's c_attn output is q|k|v: parts 3), and each sub-block is cut into tp equal slices; rank r
// holds slice r of every sub-block, side by side (so its c_attn shard is q_r|k_r|v_r, its heads'
// q, k and v). dim -1: replicated, every rank holds the whole parameter.
// `valid` (vocabulary padding): the global extent along dim 0 is padded past `valid` rows so that tp
// divides it; rows >= valid exist only in the sharded layout (zero, never trained: their logits are
// masked) and not in checkpoints or HF files.
#pragma once

#include <cstdint>
#include <functional>

#include "tensor/tensor.h"

namespace mt::nn {

struct TpSplit {
  int dim = -1;        // -1: replicated
  int parts = 1;       // fused sub-blocks along dim
  int64_t valid = 0;   // rows of dim 0 that exist in the one-process layout (0: all)
};

struct TpPlace {
  int rank = 0, size = 1;
};

// Local shape of a parameter of `global` shape (padded) on `place`. Throws kInvalidArgument naming
// `name` when the split does not divide evenly.
Shape tp_local_shape(const std::string& name, const Shape& global, const TpSplit& split, TpPlace place);
// The parameter's shape in the one-process layout (padding rows removed).
Shape tp_unpadded_shape(const Shape& global, const TpSplit& split);

// Calls fn(local_offset, global_offset, length) for each contiguous run of the local shard's
// elements, in local order; global offsets index the unpadded one-process tensor (row-major).
// Padding elements are not visited. Parameters of rank <= 2 (every transformer weight).
void tp_for_each_run(const Shape& global, const TpSplit& split, TpPlace place,
                     const std::function<void(int64_t, int64_t, int64_t)>& fn);

// local = this rank's shard of `full` (unpadded one-process tensor); padding elements set to 0.
void tp_extract(float* local, const float* full, const Shape& global, const TpSplit& split, TpPlace place);
// full's elements of this rank's shard = local (the others are left as they are).
void tp_insert(float* full, const float* local, const Shape& global, const TpSplit& split, TpPlace place);

}  // namespace mt::nn
