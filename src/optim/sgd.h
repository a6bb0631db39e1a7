// SGD exactly as torch.optim.SGD (torch/optim/sgd.py, _single_tensor_sgd; maximize=False), element
// by element in f32, with g = grad * grad_scale and wd the segment's weight decay:
//   d = g + wd * p                                    (L2 penalty, only when wd != 0)
//   if momentum != 0:
//     buf = d                                         first step with momentum (torch clones d)
//     buf = momentum * buf + (1 - dampening) * d      later steps
//     d = nesterov ? d + momentum * buf : buf
//   p = p - lr * d
// The momentum buffer is one flat f32 buffer (category optimizer), allocated only when momentum
// is non-zero (at construction or by set_momentum).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "optim/optimizer.h"
#include "tensor/allocator.h"
#include "tensor/dtype.h"

namespace mt::optim {

struct SgdConfig {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  // reported only; each segment carries its own
  bool nesterov = false;
};

class Sgd : public Optimizer {
 public:
  // Throws kInvalidArgument where torch.optim.SGD raises ValueError: lr < 0, momentum < 0, a
  // segment's weight_decay < 0, nesterov without momentum > 0 and dampening == 0.
  Sgd(size_t numel, std::vector<ParamSegment> segments, const SgdConfig& config);

  const char* type_name() const override { return "SGD"; }
  void step(float* master, const float* grad, void* lowp, DType lowp_dtype, float lr,
            float grad_scale = 1.0f) override;
  // Restoring k > 0 steps marks the momentum buffer as holding state (torch's momentum_buffer is
  // not None after a step with momentum).
  void set_step_count(int64_t step) override;
  void set_momentum(double momentum) override;
  std::vector<StateBuffer> state() const override;  // "momentum_buffer" when momentum is used
  const SgdConfig& config() const { return config_; }

 private:
  // A piece of one decay run: one task of the parallel loop.
  struct Chunk {
    size_t offset, numel;
    float weight_decay;
  };

  SgdConfig config_;
  std::vector<Chunk> chunks_;
  Buffer buf_;
  bool buf_valid_ = false;  // torch: momentum_buffer is not None
};

}  // namespace mt::optim
