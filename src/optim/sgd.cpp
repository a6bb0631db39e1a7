#include "optim/sgd.h"

#include <algorithm>
#include <string>
#include <utility>

#include "base/error.h"

namespace mt::optim {
namespace {

constexpr size_t kChunk = size_t{1} << 14;  // elements per task

}  // namespace

Sgd::Sgd(size_t numel, std::vector<ParamSegment> segments, const SgdConfig& config)
    : Optimizer(numel, std::move(segments)), config_(config) {
  MT_CHECK(config.lr >= 0.0, ErrorKind::kInvalidArgument,
           "optimizer.params.lr: invalid learning rate " + std::to_string(config.lr));
  MT_CHECK(config.momentum >= 0.0, ErrorKind::kInvalidArgument,
           "optimizer.params.momentum: invalid momentum value " + std::to_string(config.momentum));
  MT_CHECK(!config.nesterov || (config.momentum > 0.0 && config.dampening == 0.0),
           ErrorKind::kInvalidArgument,
           "optimizer.params.nesterov: Nesterov momentum requires a momentum and zero dampening");
  for (const ParamSegment& s : segments_)
    MT_CHECK(s.weight_decay >= 0.0f, ErrorKind::kInvalidArgument,
             "optimizer.params.weight_decay: invalid value " + std::to_string(s.weight_decay) +
                 " for '" + s.name + "'");
  for (const DecayRun& r : decay_runs(segments_))
    for (size_t i = 0; i < r.numel; i += kChunk)
      chunks_.push_back({r.offset + i, std::min(kChunk, r.numel - i), r.weight_decay});
  if (config.momentum != 0.0) buf_ = Buffer(numel * 4, MemCategory::kOptimizer);
}

void Sgd::step(float* master, const float* grad, void* lowp, DType lowp_dtype, float lr,
               float grad_scale) {
  ++step_;
  const bool use_momentum = config_.momentum != 0.0;
  if (use_momentum && buf_.data() == nullptr) buf_ = Buffer(numel_ * 4, MemCategory::kOptimizer);
  const bool first = use_momentum && !buf_valid_;
  const float momentum = static_cast<float>(config_.momentum);
  const float keep = static_cast<float>(1.0 - config_.dampening);  // torch: alpha = 1 - dampening
  const float neg_lr = -lr;
  const bool nesterov = config_.nesterov;
  float* buf = buf_.as<float>();
  const size_t esz = dtype_size(lowp_dtype);
  const int64_t nchunks = static_cast<int64_t>(chunks_.size());
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (int64_t c = 0; c < nchunks; ++c) {
    const Chunk& ch = chunks_[static_cast<size_t>(c)];
    const float wd = ch.weight_decay;
    for (size_t i = ch.offset; i < ch.offset + ch.numel; ++i) {
      float d = grad[i] * grad_scale;
      if (wd != 0.0f) d = d + wd * master[i];
      if (use_momentum) {
        const float b = first ? d : momentum * buf[i] + keep * d;
        buf[i] = b;
        d = nesterov ? d + momentum * b : b;
      }
      master[i] = master[i] + neg_lr * d;
    }
    if (lowp != nullptr)
      convert(static_cast<char*>(lowp) + ch.offset * esz, lowp_dtype, master + ch.offset, DType::kF32, ch.numel);
  }
  if (use_momentum) buf_valid_ = true;
}

void Sgd::set_step_count(int64_t step) {
  step_ = step;
  buf_valid_ = step > 0 && buf_.data() != nullptr;
}

void Sgd::set_momentum(double momentum) {
  config_.momentum = momentum;
  if (momentum != 0.0 && buf_.data() == nullptr) buf_ = Buffer(numel_ * 4, MemCategory::kOptimizer);
}

std::vector<StateBuffer> Sgd::state() const {
  if (buf_.data() == nullptr) return {};
  return {{"momentum_buffer", buf_.as<float>(), numel_}};
}

}  // namespace mt::optim
