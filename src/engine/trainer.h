// Trainer: one optimizer step of a TransformerLM — forward, backward, the gradient overflow check
// (f16), clipping by global norm and a fused AdamW that also refreshes the low-precision weights.
// The engine issue grows this into initialize()/train_batch() with schedules and loss scaling.
#pragma once

#include <cstdint>

#include "models/transformer.h"
#include "optim/adamw.h"

namespace mt::engine {

struct TrainerOptions {
  optim::AdamWConfig adamw;
  float clip_norm = 1.0f;     // 0: no clipping
  float loss_scale = 1.0f;    // static loss scale (f16 compute wants e.g. 1024)
};

struct StepStats {
  float loss = 0.0f;
  double grad_norm = 0.0;     // of the unscaled gradients, before clipping
  bool skipped = false;       // overflow: inf/NaN gradients, no update
  double forward_seconds = 0.0, backward_seconds = 0.0, optimizer_seconds = 0.0;
};

class Trainer {
 public:
  Trainer(models::TransformerLM& model, const TrainerOptions& options);
  // tokens, targets: (B, T) of the model's prepared shape.
  StepStats step(const int32_t* tokens, const int32_t* targets);
  optim::AdamW& optimizer() { return adamw_; }

 private:
  models::TransformerLM& model_;
  TrainerOptions options_;
  optim::AdamW adamw_;
};

}  // namespace mt::engine
