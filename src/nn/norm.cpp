#include "nn/norm.h"

#include "kernels/cpu/ops.h"

namespace mt::nn {

LayerNorm::LayerNorm(std::string name, int C, float eps) : Module(std::move(name)), C_(C), eps_(eps) {
  weight_ = add_parameter("weight", {C}, false, Init::kOnes);
  bias_ = add_parameter("bias", {C}, false, Init::kZeros);
}

void LayerNorm::forward(float* out, float* mean, float* rstd, const float* inp, int N) {
  kernels::layernorm_forward(out, mean, rstd, inp, weight_->master, bias_->master, N, C_, eps_);
}

void LayerNorm::backward(float* dinp, const float* dout, const float* inp, const float* mean,
                         const float* rstd, int N) {
  kernels::layernorm_backward(dinp, weight_->grad, bias_->grad, dout, inp, weight_->master, mean,
                              rstd, N, C_);
}

RMSNorm::RMSNorm(std::string name, int C, float eps) : Module(std::move(name)), C_(C), eps_(eps) {
  weight_ = add_parameter("weight", {C}, false, Init::kOnes);
}

void RMSNorm::forward(float* out, float* rstd, const float* inp, int N) {
  kernels::rmsnorm_forward(out, rstd, inp, weight_->master, N, C_, eps_);
}

void RMSNorm::backward(float* dinp, const float* dout, const float* inp, const float* rstd, int N) {
  kernels::rmsnorm_backward(dinp, weight_->grad, dout, inp, weight_->master, rstd, N, C_);
}

}  // namespace mt::nn
