// ZeroOneAdam: 0/1 Adam (Lu et al. 2022, arXiv:2202.06009; DeepSpeed's ZeroOneAdam, read from
// deepspeed/runtime/fp16/onebit/zoadam.py) over one flat span. Step numbers: DeepSpeed's first
// step() only allocates (no update), so its state step s of our update t is s = t + 1; every
// policy below is written in s, so a config gives DeepSpeed's schedule. With g the gradient
// (times grad_scale), wd each segment's weight decay, no bias correction (DeepSpeed has none):
//
// Phase 1, updates t <= max(var_freeze_step, 1) (DeepSpeed freezes once s > var_freeze_step):
//   variance step, s % var_interval == 0: g is the all-reduced gradient;
//       m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2      (AdamW's kernel, bias_correction off)
//   other steps: g is the rank's own; m = b1 m + (1 - b1) avg(g), avg the compressed all-reduce
//   then p = p (1 - lr wd) - lr m / (sqrt(v) + eps)   (DeepSpeed: p -= lr (m / (sqrt(v) + eps) + wd p))
//   after a variance step var_counter += 1; at var_update_scaler it restarts and var_interval
//   doubles (var_update_scaler is the paper's kappa). At the end of phase 1 the error buffers
//   are zeroed (they held gradient errors; phase 2 sends accumulated updates).
// Phase 2, later updates: v frozen, no gradient communication, u the momentum accumulator:
//   m = b1 m + (1 - b1) g;  lrs += lr;  d = lr (m / (sqrt(v) + eps) + wd p);  p -= d;  u -= d
//   sync step, s % local_interval == 0:
//     p += -u (undo the local steps);  u *= sqrt(v) + eps;  u = avg(u);  m = -u / lrs;
//     p += u / (sqrt(v) + eps);  u = 0;  lrs = 0
//   then local_counter += 1; at local_step_scaler it restarts and local_interval doubles, at
//   most local_step_clipper (the paper's H).
// NOTE: DeepSpeed on one rank leaves m alone in a phase-1 step that is not a variance step (it
// skips the all-reduce and its momentum update together); here one rank's exchange is the
// identity, so m takes the gradient as on more ranks.
#pragma once

#include <cstdint>
#include <vector>

#include "optim/adamw.h"
#include "optim/optimizer.h"
#include "tensor/allocator.h"

namespace mt::optim {

struct ZeroOneAdamConfig {
  AdamWConfig adam;  // lr, betas, eps; bias_correction is not applied (DeepSpeed's arithmetic)
  int64_t var_freeze_step = 100000;
  int64_t var_update_scaler = 16;
  int64_t local_step_scaler = 32678;
  int64_t local_step_clipper = 16;
};

// The configuration as the optimizer takes it: refused (kInvalidArgument, naming the key) where a
// key is out of range; bias correction off.
ZeroOneAdamConfig zero_one_checked(ZeroOneAdamConfig c);

// The step policy alone (pure): which kind update t is, and its counters after it.
class ZeroOnePolicy {
 public:
  enum class Kind { kVariance, kCompressedGradient, kLocal, kSync };

  explicit ZeroOnePolicy(const ZeroOneAdamConfig& config) : config_(config) {}
  // The kind of update t, given that updates 1..t-1 were advanced.
  Kind kind(int64_t t) const;
  // Update t in phase 2 (the variance frozen).
  bool frozen_at(int64_t t) const;
  // After update t.
  void advance(int64_t t);
  // The counters after updates 1..t (replayed).
  void restore(int64_t t);

  int64_t var_interval() const { return var_interval_; }
  int64_t local_interval() const { return local_interval_; }

 private:
  ZeroOneAdamConfig config_;
  int64_t var_interval_ = 1, var_counter_ = 0, local_interval_ = 1, local_counter_ = 0;
};

class ZeroOneAdam : public Optimizer {
 public:
  ZeroOneAdam(size_t numel, std::vector<ParamSegment> segments, const ZeroOneAdamConfig& config);

  const char* type_name() const override { return "ZeroOneAdam"; }
  void step(float* master, const float* grad, void* lowp, DType lowp_dtype, float lr,
            float grad_scale = 1.0f) override;
  void set_step_count(int64_t step) override;
  void set_momentum(double momentum) override { adam_.set_momentum(momentum); }
  bool has_betas() const override { return true; }
  void set_betas(double beta1, double beta2) override { adam_.set_betas(beta1, beta2); }
  std::vector<StateBuffer> state() const override;  // "exp_avg", "exp_avg_sq", "momentum_accumulator"
  std::vector<ScalarState> scalar_state() override;  // "lrs"
  // Between syncs each rank's momentum, accumulator (and parameters) are its own.
  std::vector<StateBuffer> rank_local_state() const override;
  // The next update wants this rank's own gradients (all but the variance steps).
  bool wants_local_gradients() const override;
  void set_exchange(StateExchange* exchange) override { exchange_ = exchange; }
  const ZeroOnePolicy& policy() const { return policy_; }

 private:
  void phase1_step(float* master, const float* grad, float lr, float grad_scale);
  void phase2_step(float* master, const float* grad, float lr, float grad_scale, bool sync);

  ZeroOneAdamConfig config_;
  AdamW adam_;  // m, v and the variance steps (bias correction off)
  std::vector<DecayRun> runs_;
  Buffer u_;    // the momentum accumulator (zero in phase 1 between steps)
  std::vector<double> lrs_{0.0};
  ZeroOnePolicy policy_;
  StateExchange* exchange_ = nullptr;
};

}  // namespace mt::optim
