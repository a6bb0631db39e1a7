// Linear layers. Two weight layouts, both Hugging Face's:
//   kOutIn (nn.Linear):  W (out, in),  Y = X W^T + b
//   kInOut (GPT-2 Conv1D): W (in, out), Y = X W + b
// X (M, in) is in the compute dtype (saved by the caller for backward); Y (M, out) is f32.
// Backward:  dX = dY W (resp. dY W^T),  dW += dY^T X (resp. X^T dY),  db += colsum(dY).
//
// LinearGroup runs several kOutIn Linears that share an input as one GEMM (LLaMA's q/k/v and
// gate/up projections): their weights are registered consecutively, so in the flat buffers they
// form one (sum of outs, in) matrix. Y's columns are the parts' outputs side by side. Biases
// (Qwen2's q/k/v), when given, are registered consecutively too: one (sum of outs) vector.
#pragma once

#include <vector>

#include "nn/module.h"
#include "nn/workspace.h"

namespace mt::nn {

enum class WeightLayout { kOutIn, kInOut };

// Megatron's tensor-parallel linears. kColumn: the output features are split (the weight's out
// dimension, and the bias), `parts` fused sub-blocks each split (c_attn's q|k|v); the input is
// the whole activation. kRow: the input features are split, each rank's output is a partial sum
// that the caller all-reduces, and the (replicated) bias is added once after that reduction
// (add_bias), not by every rank inside the GEMM.
enum class TpKind { kNone, kColumn, kRow };

class Linear : public Module {
 public:
  // in, out: the whole layer's features; in()/out() are this rank's.
  Linear(std::string name, int in, int out, bool bias, WeightLayout layout, float init_std,
         TpKind tp = TpKind::kNone, TpPlace place = {}, int parts = 1);

  int in() const { return in_; }
  int out() const { return out_; }
  WeightLayout layout() const { return layout_; }
  Parameter* weight() const { return weight_; }
  Parameter* bias() const { return bias_; }

  void forward(float* y, const void* x, int M);  // + bias unless bias_deferred()
  // A row-parallel layer split over more than one rank leaves its bias to add_bias, after the
  // all-reduce of the partial outputs.
  bool bias_deferred() const { return bias_ && tp_ == TpKind::kRow && place_.size > 1; }
  void add_bias(float* y, int M) const;
  // dx (M, in): overwritten (accumulate_dx == false) or added to. dx may be nullptr (not needed).
  void backward(float* dx, bool accumulate_dx, const float* dy, const void* x, int M, Workspace& ws);

 private:
  int in_, out_;
  WeightLayout layout_;
  TpKind tp_;
  TpPlace place_;
  Parameter* weight_;
  Parameter* bias_ = nullptr;
};

class LinearGroup {
 public:
  LinearGroup() = default;
  // REQUIRES: same in, kOutIn, no bias of their own; biases: none, or one a part (its out
  // features), registered consecutively.
  explicit LinearGroup(std::vector<Linear*> parts, std::vector<Parameter*> biases = {});

  int out() const { return out_; }
  void forward(float* y, const void* x, int M);
  void backward(float* dx, bool accumulate_dx, const float* dy, const void* x, int M, Workspace& ws);

 private:
  void check_contiguous() const;
  std::vector<Linear*> parts_;
  std::vector<Parameter*> biases_;
  int in_ = 0, out_ = 0;
};

}  // namespace mt::nn
