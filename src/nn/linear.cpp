#include "nn/linear.h"

#include "base/error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops.h"

namespace mt::nn {
namespace {

// dy (M, out) f32 -> compute dtype, in the workspace unless the compute dtype is f32.
const void* gemm_operand(const float* dy, size_t n, DType dt, Workspace& ws) {
  if (dt == DType::kF32) return dy;
  void* p = ws.get(WorkSlot::kGemmOperand, n * dtype_size(dt));
  convert(p, dt, dy, DType::kF32, n);
  return p;
}

}  // namespace

Linear::Linear(std::string name, int in, int out, bool bias, WeightLayout layout, float init_std, TpKind tp,
               TpPlace place, int parts)
    : Module(std::move(name)), in_(in), out_(out), layout_(layout), tp_(tp), place_(place) {
  Shape shape = layout == WeightLayout::kOutIn ? Shape{out, in} : Shape{in, out};
  const int out_dim = layout == WeightLayout::kOutIn ? 0 : 1;
  TpSplit wsplit, bsplit;
  if (tp == TpKind::kColumn) {
    wsplit = {out_dim, parts, 0};
    bsplit = {0, parts, 0};
  } else if (tp == TpKind::kRow) {
    wsplit = {1 - out_dim, 1, 0};
  }
  weight_ = add_parameter("weight", shape, /*is_matrix=*/true, Init::kNormal, init_std, wsplit, place);
  if (bias) bias_ = add_parameter("bias", {out}, false, Init::kZeros, 0.0f, bsplit, place);
  if (tp == TpKind::kColumn) out_ /= place.size;
  if (tp == TpKind::kRow) in_ /= place.size;
}

void Linear::add_bias(float* y, int M) const {
  if (!bias_) return;
  const float* b = bias_->master;
#pragma omp parallel for schedule(static)
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < out_; ++j) y[static_cast<size_t>(m) * out_ + j] += b[j];
}

void Linear::forward(float* y, const void* x, int M) {
  DType dt = weight_->compute_dtype;
  const float* b = bias_ && !bias_deferred() ? bias_->master : nullptr;
  if (layout_ == WeightLayout::kOutIn) {
    kernels::gemm(M, out_, in_, x, in_, false, weight_->compute, in_, true, y, out_, dt, false, b);
  } else {
    kernels::gemm(M, out_, in_, x, in_, false, weight_->compute, out_, false, y, out_, dt, false, b);
  }
}

void Linear::backward(float* dx, bool accumulate_dx, const float* dy, const void* x, int M,
                      Workspace& ws) {
  DType dt = weight_->compute_dtype;
  const void* dyc = gemm_operand(dy, static_cast<size_t>(M) * out_, dt, ws);
  if (layout_ == WeightLayout::kOutIn) {
    if (dx) kernels::gemm(M, in_, out_, dyc, out_, false, weight_->compute, in_, false, dx, in_, dt, accumulate_dx);
    kernels::gemm(out_, in_, M, dyc, out_, true, x, in_, false, weight_->grad, in_, dt, true);
  } else {
    if (dx) kernels::gemm(M, in_, out_, dyc, out_, false, weight_->compute, out_, true, dx, in_, dt, accumulate_dx);
    kernels::gemm(in_, out_, M, x, in_, true, dyc, out_, false, weight_->grad, out_, dt, true);
  }
  if (bias_) kernels::bias_backward(bias_->grad, dy, M, out_);
}

LinearGroup::LinearGroup(std::vector<Linear*> parts, std::vector<Parameter*> biases)
    : parts_(std::move(parts)), biases_(std::move(biases)) {
  MT_INTERNAL_CHECK(!parts_.empty());
  MT_INTERNAL_CHECK(biases_.empty() || biases_.size() == parts_.size());
  in_ = parts_[0]->in();
  for (size_t i = 0; i < parts_.size(); ++i) {
    const Linear* p = parts_[i];
    MT_INTERNAL_CHECK(p->in() == in_ && p->layout() == WeightLayout::kOutIn && p->bias() == nullptr);
    MT_INTERNAL_CHECK(biases_.empty() || biases_[i]->numel() == p->out());
    out_ += p->out();
  }
}

void LinearGroup::check_contiguous() const {
  for (size_t i = 1; i < parts_.size(); ++i) {
    MT_INTERNAL_CHECK(parts_[i]->weight()->offset ==
                      parts_[i - 1]->weight()->offset + static_cast<size_t>(parts_[i - 1]->weight()->numel()));
    if (!biases_.empty())
      MT_INTERNAL_CHECK(biases_[i]->offset == biases_[i - 1]->offset + static_cast<size_t>(biases_[i - 1]->numel()));
  }
}

void LinearGroup::forward(float* y, const void* x, int M) {
  check_contiguous();
  Parameter* w = parts_[0]->weight();
  const float* b = biases_.empty() ? nullptr : biases_[0]->master;
  kernels::gemm(M, out_, in_, x, in_, false, w->compute, in_, true, y, out_, w->compute_dtype, false, b);
}

void LinearGroup::backward(float* dx, bool accumulate_dx, const float* dy, const void* x, int M,
                           Workspace& ws) {
  Parameter* w = parts_[0]->weight();
  DType dt = w->compute_dtype;
  const void* dyc = gemm_operand(dy, static_cast<size_t>(M) * out_, dt, ws);
  if (dx) kernels::gemm(M, in_, out_, dyc, out_, false, w->compute, in_, false, dx, in_, dt, accumulate_dx);
  kernels::gemm(out_, in_, M, dyc, out_, true, x, in_, false, w->grad, in_, dt, true);
  if (!biases_.empty()) kernels::bias_backward(biases_[0]->grad, dy, M, out_);
}

}  // namespace mt::nn
