#include "engine/trainer.h"

#include <cmath>

#include "base/timer.h"

namespace mt::engine {

Trainer::Trainer(models::TransformerLM& model, const TrainerOptions& options)
    : model_(model), options_(options), adamw_(model.store().numel(), options.adamw) {}

StepStats Trainer::step(const int32_t* tokens, const int32_t* targets) {
  StepStats s;
  nn::ParamStore& store = model_.store();
  Timer t;
  store.zero_grad();
  s.loss = model_.forward(tokens, targets, options_.loss_scale);
  s.forward_seconds = t.seconds();
  t.reset();
  model_.backward();
  s.backward_seconds = t.seconds();
  t.reset();
  double norm = optim::grad_norm(store.grad(), store.numel()) / options_.loss_scale;
  s.grad_norm = norm;
  if (!std::isfinite(norm)) {
    s.skipped = true;
    s.optimizer_seconds = t.seconds();
    return s;
  }
  float scale = 1.0f / options_.loss_scale;
  if (options_.clip_norm > 0.0f && norm > options_.clip_norm)
    scale *= static_cast<float>(options_.clip_norm / (norm + 1e-6));
  bool lowp = store.compute_dtype() != DType::kF32;
  adamw_.step(store.master(), store.grad(), lowp ? store.compute() : nullptr, store.compute_dtype(),
              options_.adamw.lr, scale);
  s.optimizer_seconds = t.seconds();
  return s;
}

}  // namespace mt::engine
