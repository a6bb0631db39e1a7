// Linear layers. Two weight layouts, both Hugging Face's:
//   kOutIn (nn.Linear):  W (out, in),  Y = X W^T + b
//   kInOut (GPT-2 Conv1D): W (in, out), Y = X W + b
// X (M, in) is in the compute dtype (saved by the caller for backward); Y (M, out) is f32.
// Backward:  dX = dY W (resp. dY W^T),  dW += dY^T X (resp. X^T dY),  db += colsum(dY).
//
// LinearGroup runs several kOutIn Linears that share an input as one GEMM (LLaMA's q/k/v and
// gate/up projections): their weights are registered consecutively, so in the flat buffers they
// form one (sum of outs, in) matrix. Y's columns are the parts' outputs side by side.
#pragma once

#include <vector>

#include "nn/module.h"
#include "nn/workspace.h"

namespace mt::nn {

enum class WeightLayout { kOutIn, kInOut };

class Linear : public Module {
 public:
  Linear(std::string name, int in, int out, bool bias, WeightLayout layout, float init_std);

  int in() const { return in_; }
  int out() const { return out_; }
  WeightLayout layout() const { return layout_; }
  Parameter* weight() const { return weight_; }
  Parameter* bias() const { return bias_; }

  void forward(float* y, const void* x, int M);
  // dx (M, in): overwritten (accumulate_dx == false) or added to. dx may be nullptr (not needed).
  void backward(float* dx, bool accumulate_dx, const float* dy, const void* x, int M, Workspace& ws);

 private:
  int in_, out_;
  WeightLayout layout_;
  Parameter* weight_;
  Parameter* bias_ = nullptr;
};

class LinearGroup {
 public:
  LinearGroup() = default;
  explicit LinearGroup(std::vector<Linear*> parts);  // REQUIRES: same in, kOutIn, no bias

  int out() const { return out_; }
  void forward(float* y, const void* x, int M);
  void backward(float* dx, bool accumulate_dx, const float* dy, const void* x, int M, Workspace& ws);

 private:
  void check_contiguous() const;
  std::vector<Linear*> parts_;
  int in_ = 0, out_ = 0;
};

}  // namespace mt::nn
