// Optimizer: the interface every optimizer over the flat parameter buffer implements (DESIGN
// decision 1), and make_optimizer, which builds one from the `optimizer` block of a ds_config.
//
// An optimizer owns its state (flat f32 buffers, category optimizer) and updates the f32 master
// weights in place; it sees the parameters only as segments of the flat buffer, one per parameter
// tensor in order, each with its own weight decay (DeepSpeed's param groups) and, for Lamb, its own
// trust ratio. Checkpoints save and restore any optimizer through state() and step_count().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace mt::optim {

// The 1-bit optimizers' elementwise loops run over the OpenMP threads past this many elements
// (each element's arithmetic is the same on any thread count; mt_optim is built with
// -fno-math-errno so their square roots vectorise).
inline constexpr size_t kParallelElements = size_t{1} << 15;

// One parameter tensor's range [offset, offset + numel) of the flat buffers.
struct ParamSegment {
  size_t offset = 0;
  size_t numel = 0;
  float weight_decay = 0.0f;
  std::string name;
};

// One named flat f32 state buffer of an optimizer (e.g. "exp_avg"), numel elements.
struct StateBuffer {
  std::string name;
  float* data = nullptr;
  size_t numel = 0;
};

// How an optimizer that communicates its own state averages a buffer over the data-parallel ranks:
// 1-bit Adam's momentum (optim/onebit_adam.h), 0/1 Adam's gradients and accumulated updates
// (optim/zero_one_adam.h), 1-bit LAMB's scaled momentum (optim/onebit_lamb.h). A GradSync provides it (parallel/grad_sync.h, the
// compressed sync holds the error-feedback buffers); the optimizer only calls it.
class StateExchange {
 public:
  virtual ~StateExchange() = default;
  // buf (n) in, its average over the data-parallel ranks out (compressed: approximate, the same on
  // every rank). Collective over the dp group.
  virtual void average(float* buf, size_t n) = 0;
  // Zeroes this rank's error feedback (0/1 Adam: the errors of compressed gradients are not those
  // of the accumulated momentum it sends after the variance freezes). Local.
  virtual void reset_errors() {}
};

// A few values of an optimizer's state that do not cover the span: one per parameter segment
// (1-bit LAMB's frozen lamb coefficients) or one in all (0/1 Adam's sum of learning rates since
// the last synchronisation), the same on every rank. Doubles, as DeepSpeed keeps them (Python
// floats); checkpoints keep them in state.json.
struct ScalarState {
  std::string name;
  std::vector<double>* values = nullptr;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // "AdamW", "SGD", "Lamb".
  virtual const char* type_name() const = 0;

  // One step over the whole flat span. master (numel) f32 is updated in place from grad (numel)
  // f32; grad_scale multiplies the gradients first (1/loss_scale times the clipping coefficient).
  // lowp (numel, nullable) receives the updated weights converted to lowp_dtype (RNE).
  virtual void step(float* master, const float* grad, void* lowp, DType lowp_dtype, float lr,
                    float grad_scale = 1.0f) = 0;

  // Number of steps taken (Adam's t). Restoring a checkpoint sets it after copying state().
  virtual int64_t step_count() const { return step_; }
  virtual void set_step_count(int64_t step) { step_ = step; }

  // For LR schedules that cycle momentum (DeepSpeed's OneCycle, lr_schedule.h): sets beta1 of
  // Adam/AdamW/Lamb, or the momentum of SGD. Takes effect from the next step().
  // NOTE: DeepSpeed's OneCycle cycles momentum only for optimizers whose defaults have `betas`
  // (so not for torch.optim.SGD, where it warns and leaves momentum alone), and it sets the pair
  // (momentum, 0.99), i.e. it also pins beta2 to 0.99. To reproduce DeepSpeed exactly, call
  // set_betas(momentum, kOneCycleBeta2) when has_betas(); set_momentum is the generic knob.
  virtual void set_momentum(double momentum) = 0;
  // True for Adam-like optimizers (AdamW, Lamb): the ones with (beta1, beta2).
  virtual bool has_betas() const { return false; }
  // Sets (beta1, beta2). Throws kNotSupported unless has_betas().
  virtual void set_betas(double beta1, double beta2);

  // The optimizer's state, one flat f32 buffer per entry, each covering the whole span (numel).
  // Saving them and step_count(), and restoring both, resumes the exact run.
  virtual std::vector<StateBuffer> state() const = 0;
  // State buffers (of state()) that the data-parallel ranks hold apart, the parameters with them
  // (0/1 Adam's local steps: each rank's momentum and accumulated updates): saved per rank.
  virtual std::vector<StateBuffer> rank_local_state() const { return {}; }
  // Whether state()'s buffers live outside memory (ZeRO-Infinity's swap, swapped_adamw.h): their
  // data pointers are null, and the span of each is copied out and in by name.
  virtual bool state_swapped() const { return false; }
  virtual void read_state(const std::string& name, float* dst);
  virtual void write_state(const std::string& name, const float* src);
  // State that is not over the span (see ScalarState); restored with the size it was saved with.
  virtual std::vector<ScalarState> scalar_state() { return {}; }

  // 1-bit optimizers after their warm-up: the next step() wants this rank's own (not averaged)
  // gradients, and averages its momentum itself through the exchange set here (null: one rank).
  virtual bool wants_local_gradients() const { return false; }
  virtual void set_exchange(StateExchange* exchange) { (void)exchange; }

  size_t numel() const { return numel_; }
  const std::vector<ParamSegment>& segments() const { return segments_; }

 protected:
  // Throws kInvalidArgument unless segments cover [0, numel) in order without gaps or overlap.
  Optimizer(size_t numel, std::vector<ParamSegment> segments);

  size_t numel_;
  std::vector<ParamSegment> segments_;
  int64_t step_ = 0;
};

// One segment covering [0, numel) with the given weight decay.
std::vector<ParamSegment> single_segment(size_t numel, float weight_decay);

// A maximal run of consecutive segments with equal weight decay: one fused-kernel call.
struct DecayRun {
  size_t offset = 0;
  size_t numel = 0;
  float weight_decay = 0.0f;
};
std::vector<DecayRun> decay_runs(const std::vector<ParamSegment>& segments);

// The union of the parameters of the optimizers we build, in DeepSpeed's `optimizer.params` keys.
// The weight decay applied is the one in each ParamSegment; weight_decay here is what the caller
// should put in the segments (DeepSpeed decays every parameter with the one value) and is kept for
// reporting.
struct OptimizerSpec {
  std::string type = "AdamW";  // "Adam", "AdamW", "SGD", "Lamb" (case-insensitive)
  double lr = 1e-3;
  double weight_decay = 0.0;
  // Adam, AdamW, Lamb
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  bool adam_w_mode = true;      // Adam: true (DeepSpeed's default) is AdamW; false adds the decay to the gradient (L2)
  bool bias_correction = true;  // Adam, AdamW, Lamb
  bool torch_adam = false;      // Adam, AdamW: torch.optim's, not DeepSpeed's FusedAdam (its fp16 wrapper differs)
  // Lamb (DeepSpeed FusedLamb)
  bool eps_inside_sqrt = false;
  double max_grad_norm = 0.0;
  double max_coeff = 10.0, min_coeff = 0.01;
  // SGD (torch.optim.SGD)
  double momentum = 0.0, dampening = 0.0;
  bool nesterov = false;
  // OneBitAdam (DeepSpeed's OnebitAdam): full-precision Adam for freeze_step steps, then the
  // variance is frozen and the momentum is averaged by a 1-bit compressed all-reduce. Also
  // OneBitLamb's warm-up length.
  int64_t freeze_step = 100000;
  // ZeroOneAdam (DeepSpeed's 0/1 Adam, optim/zero_one_adam.h).
  int64_t var_freeze_step = 100000, var_update_scaler = 16, local_step_scaler = 32678, local_step_clipper = 16;
  // OneBitLamb (DeepSpeed's OnebitLamb, optim/onebit_lamb.h); also freeze_step, max/min_coeff.
  double coeff_beta = 0.9, factor_max = 4.0, factor_min = 0.5, factor_threshold = 0.1;
};

// Whether spec.type names a 1-bit optimizer (its momentum is averaged by a StateExchange).
bool optimizer_is_onebit(const OptimizerSpec& spec);
bool optimizer_is_onebit_lamb(const OptimizerSpec& spec);  // OneBitLamb: compresses its flat momentum

// Builds the optimizer named by spec.type over numel elements split into segments. Throws
// kNotSupported for an unknown type, kInvalidArgument for bad
// values (as torch/DeepSpeed reject them) or segments that do not cover [0, numel).
std::unique_ptr<Optimizer> make_optimizer(const OptimizerSpec& spec, size_t numel,
                                          std::vector<ParamSegment> segments);

}  // namespace mt::optim
