// Module and Parameter: the tree that names every weight with Hugging Face's dotted names
// ("transformer.h.0.attn.c_attn.weight") and the hooks around forward and backward where ZeRO-3
// gathers/frees parameters, recompute re-runs a block and pipeline stages cut.
//
// Parameters do not own memory: ParamStore (param_store.h) lays every parameter out in one flat
// buffer per role (master f32, grad f32, compute copy) and binds each Parameter's pointers to its
// range.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/tp_split.h"
#include "tensor/tensor.h"

namespace mt::nn {

enum class Init { kZeros, kOnes, kNormal };

struct Parameter {
  std::string name;  // full dotted name, set when the tree is finished (Module::finalize_names)
  Shape shape;         // this rank's (local) shape
  Shape global_shape;  // the whole parameter's shape (padded along dim 0 when split.valid > 0)
  TpSplit split;       // how it is divided over the tensor-parallel group
  TpPlace place;       // this rank's place in that group
  bool is_matrix = false;  // a GEMM operand: its compute copy is in the compute dtype
  Init init = Init::kZeros;
  float init_std = 0.0f;
  int64_t zero_row = -1;  // a row (dim 0, one-process numbering) that init leaves 0: a padding_idx
  // Bound by ParamStore:
  size_t offset = 0;  // element offset in the flat buffers
  size_t global_offset = 0;  // element offset in the one-process (unpadded, unsplit) layout
  float* master = nullptr;   // f32 value (optimizer's view)
  float* grad = nullptr;     // f32 gradient, accumulated (+=)
  void* compute = nullptr;   // value in compute_dtype (== master for f32 and for non-matrices)
  DType compute_dtype = DType::kF32;

  int64_t numel() const { return shape_numel(shape); }
  Shape unpadded_shape() const { return tp_unpadded_shape(global_shape, split); }
  int64_t global_numel() const { return shape_numel(unpadded_shape()); }
  // Every rank of the tensor-parallel group holds the same values (and, outside sequence
  // parallelism, gets the same gradient): counted once in a norm over the group.
  bool tp_replicated() const { return split.dim < 0 || place.size == 1; }
  const float* f32() const { return master; }  // REQUIRES: !is_matrix or f32 compute
};

enum class HookPoint { kPreForward = 0, kPostForward, kPreBackward, kPostBackward };

class Module {
 public:
  using Hook = std::function<void(Module&, HookPoint)>;

  explicit Module(std::string name) : name_(std::move(name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& name() const { return name_; }        // local name ("c_attn", "h.0")
  const std::string& full_name() const { return full_name_; }  // dotted path from the root

  // Sets full names of this subtree (root: prefix ""). Call once after construction.
  void finalize_names(const std::string& prefix = "");
  // Every parameter of the subtree in registration order (the flat-buffer order).
  void collect_parameters(std::vector<Parameter*>& out);
  std::vector<Module*> children() const;

  void add_hook(HookPoint point, Hook hook);
  void run_hooks(HookPoint point);

 protected:
  // shape: the whole parameter's (global) shape; the local shape follows from split and place.
  Parameter* add_parameter(const std::string& local, Shape shape, bool is_matrix, Init init,
                           float init_std = 0.0f, TpSplit split = {}, TpPlace place = {});
  template <typename M>
  M* add_module(std::unique_ptr<M> m) {
    M* raw = m.get();
    children_.push_back(std::move(m));
    return raw;
  }

 private:
  std::string name_;
  std::string full_name_;
  std::vector<std::unique_ptr<Parameter>> params_;
  std::vector<std::unique_ptr<Module>> children_;
  std::vector<std::pair<HookPoint, Hook>> hooks_;
};

// A module that only groups children under a name ("transformer", "attn", "mlp").
class Container : public Module {
 public:
  using Module::Module;
  using Module::add_module;
  using Module::add_parameter;  // Qwen2's q|k|v biases, registered on self_attn (models/block.cpp)
};

}  // namespace mt::nn
