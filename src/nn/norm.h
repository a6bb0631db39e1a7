// LayerNorm (GPT-2) and RMSNorm (LLaMA) modules over the last dimension C; the math is in
// kernels/cpu/ops.h. Inputs/outputs f32; mean/rstd (N) are the saved activations.
#pragma once

#include "nn/module.h"

namespace mt::nn {

class LayerNorm : public Module {
 public:
  LayerNorm(std::string name, int C, float eps);
  void forward(float* out, float* mean, float* rstd, const float* inp, int N);
  void backward(float* dinp, const float* dout, const float* inp, const float* mean,
                const float* rstd, int N);  // dinp +=

 private:
  int C_;
  float eps_;
  Parameter* weight_;
  Parameter* bias_;
};

class RMSNorm : public Module {
 public:
  RMSNorm(std::string name, int C, float eps);
  void forward(float* out, float* rstd, const float* inp, int N);
  void backward(float* dinp, const float* dout, const float* inp, const float* rstd, int N);  // +=

 private:
  int C_;
  float eps_;
  Parameter* weight_;
};

}  // namespace mt::nn
