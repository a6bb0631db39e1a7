// ParamStore: the flat buffers behind every Parameter (DESIGN decision 1).
//   master (P) f32   — the weights in f32; the optimizer updates these. Category: params when the
//                      compute dtype is f32 (it is then also the compute copy), else optimizer.
//   compute (P)      — a bf16/f16 copy for GEMM weights (only when compute dtype != f32).
//   grad (P) f32     — gradients, accumulated over micro-batches.
// Parameter i occupies [offset_i, offset_i + numel_i) in all of them, in registration order, with
// no padding, so a run of consecutively registered parameters is one contiguous matrix (fused QKV).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nn/module.h"
#include "tensor/allocator.h"

namespace mt::nn {

class ParamStore {
 public:
  // allocate false: no flat buffers (released() from the start, pointers null); the values come
  // from init_values (ZeRO-Infinity's deferred initialisation).
  ParamStore(Module& root, DType compute_dtype, bool allocate = true);

  size_t numel() const { return numel_; }
  // Elements of the one-process layout (every parameter whole, no vocabulary padding): the layout
  // of checkpoints; Parameter::global_offset indexes it.
  size_t global_numel() const { return global_numel_; }
  DType compute_dtype() const { return compute_dtype_; }
  const std::vector<Parameter*>& parameters() const { return params_; }
  Parameter* find(const std::string& name) const;  // nullptr if absent

  float* master() const { return master_.as<float>(); }
  float* grad() const { return grad_.as<float>(); }
  void* compute() const { return compute_.bytes() ? compute_.data() : master_.data(); }

  // Deterministic initialisation from a seed: element i of parameter `name` (i its index in the
  // one-process tensor) is normal(0, std) from a counter-based generator keyed on (seed, name, i),
  // so the same seed gives the same weights whatever the thread count, the tensor-parallel shard or
  // the pipeline stage. Padding rows are zero.
  void init(uint64_t seed);
  // init(seed)'s values of flat elements [begin, end) into dst (end - begin floats), without the
  // store's buffers: the same numbers, for a runtime that never holds the whole model.
  void init_values(uint64_t seed, size_t begin, size_t end, float* dst) const;
  void zero_grad();
  // Refreshes the compute copy from master (after an optimizer step or a weight load).
  void sync_compute();
  // Frees the three flat buffers (ZeRO: a runtime that partitions them owns the values from then
  // on and rebinds each Parameter's pointers). master()/grad() are null afterwards.
  void release_buffers();
  // A store holding part of a larger model (a pipeline stage): sets each parameter's global_offset
  // to offset_of(name) in the whole model's one-process layout of `total` elements.
  void set_global_layout(const std::function<size_t(const std::string&)>& offset_of, size_t total);
  bool released() const { return released_; }

 private:
  std::vector<Parameter*> params_;
  DType compute_dtype_;
  size_t numel_ = 0, global_numel_ = 0;
  Buffer master_, grad_, compute_;
  bool released_ = false;
};

}  // namespace mt::nn
