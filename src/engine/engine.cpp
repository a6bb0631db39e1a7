#include "engine/engine.h"

#include <cmath>
#include <string>

#include "base/error.h"
#include "base/timer.h"
#include "engine/hf_weights.h"

namespace mt::engine {
namespace {

optim::LossScalerConfig scaler_config(const RunConfig& c) {
  optim::LossScalerConfig s = c.loss_scaler;
  if (c.compute_dtype != DType::kF16) {  // DeepSpeed: no scaling outside fp16
    s.dynamic = false;
    s.static_scale = 1.0;
  }
  return s;
}

}  // namespace

std::unique_ptr<models::TransformerLM> engine_build_model(const RunConfig& config) {
  models::ModelOptions opts;
  opts.compute_dtype = config.compute_dtype;
  opts.recompute = config.activation_checkpointing;
  opts.seed = config.seed;
  auto model = std::make_unique<models::TransformerLM>(config.model, opts);
  if (!config.init_from.empty()) hf_weights_load_path(model->store(), config.init_from);
  model->prepare(static_cast<int>(config.batch.micro_batch_per_gpu), static_cast<int>(config.seq_length));
  return model;
}

std::vector<optim::ParamSegment> engine_param_segments(const RunConfig& config, const nn::ParamStore& store) {
  std::vector<optim::ParamSegment> segs;
  for (const nn::Parameter* p : store.parameters()) {
    bool decay = true;
    for (const std::string& pat : config.no_weight_decay) {
      if (pat == "hf") {  // Hugging Face Trainer: no decay for biases and LayerNorm/RMSNorm weights
        decay &= !(p->name.ends_with(".bias") || p->name.find("ln_") != std::string::npos ||
                   p->name.find("norm") != std::string::npos);
      } else {
        decay &= p->name.find(pat) == std::string::npos;
      }
    }
    segs.push_back({p->offset, static_cast<size_t>(p->numel()), decay ? static_cast<float>(config.optimizer.weight_decay) : 0.0f, p->name});
  }
  return segs;
}

Engine::Engine(const RunConfig& config, models::TransformerLM& model)
    : config_(config), model_(model), scaler_(scaler_config(config)) {
  nn::ParamStore& store = model.store();
  optimizer_ = optim::make_optimizer(config.optimizer, store.numel(), engine_param_segments(config, store));
  store.zero_grad();
}

double Engine::current_lr() const { return optim::lr_for_step(config_.scheduler, applied_steps_ + 1); }

float Engine::forward(const int32_t* tokens, const int32_t* targets) {
  MT_CHECK(!pending_backward_, ErrorKind::kInvalidArgument, "forward() twice without backward()");
  Timer t;
  // DeepSpeed scales each micro-batch's loss by 1/gradient_accumulation_steps (and the loss scale).
  float scale = static_cast<float>(scaler_.scale() / static_cast<double>(config_.batch.gradient_accumulation_steps));
  float loss = model_.forward(tokens, targets, scale);
  forward_seconds_ += t.seconds();
  MT_CHECK(std::isfinite(loss), ErrorKind::kNumerical,
           "loss is " + std::to_string(loss) + " at step " + std::to_string(global_step_ + 1) +
               " (micro-batch " + std::to_string(micro_in_step_ + 1) + ")");
  loss_sum_ += loss;
  pending_backward_ = true;
  return loss;
}

void Engine::backward() {
  MT_CHECK(pending_backward_, ErrorKind::kInvalidArgument, "backward() without a forward()");
  Timer t;
  model_.backward();
  backward_seconds_ += t.seconds();
  pending_backward_ = false;
  ++micro_in_step_;
}

float Engine::forward_backward(const int32_t* tokens, const int32_t* targets) {
  float loss = forward(tokens, targets);
  backward();
  return loss;
}

std::unique_ptr<Engine> initialize(const RunConfig& config, models::TransformerLM& model) {
  return std::make_unique<Engine>(config, model);
}

StepResult Engine::step() {
  MT_CHECK(micro_in_step_ > 0 && !pending_backward_, ErrorKind::kInvalidArgument,
           "step() needs forward() and backward() of at least one micro-batch first");
  Timer t;
  nn::ParamStore& store = model_.store();
  StepResult r;
  r.forward_seconds = forward_seconds_;
  r.backward_seconds = backward_seconds_;
  r.loss = static_cast<float>(loss_sum_ / micro_in_step_);
  r.loss_scale = scaler_.scale();
  r.lr = current_lr();
  double norm = optim::grad_norm(store.grad(), store.numel()) / r.loss_scale;
  r.grad_norm = norm;
  bool overflow = !std::isfinite(norm);
  if (overflow) {
    r.skipped = true;
  } else {
    double coef = 1.0 / r.loss_scale;
    if (config_.gradient_clipping > 0.0 && norm > config_.gradient_clipping)
      coef *= config_.gradient_clipping / (norm + 1e-6);
    bool lowp = store.compute_dtype() != DType::kF32;
    // OneCycle cycles beta1 (and pins beta2 to 0.99) of Adam-like optimizers, as DeepSpeed does.
    if (auto mom = optim::momentum_for_step(config_.scheduler, applied_steps_ + 1); mom && optimizer_->has_betas())
      optimizer_->set_betas(*mom, optim::kOneCycleBeta2);
    optimizer_->step(store.master(), store.grad(), lowp ? store.compute() : nullptr, store.compute_dtype(),
                 static_cast<float>(r.lr), static_cast<float>(coef));
    ++applied_steps_;
  }
  scaler_.update(overflow);  // throws at the minimum scale, as DeepSpeed does
  ++global_step_;
  store.zero_grad();
  micro_in_step_ = 0;
  loss_sum_ = 0.0;
  forward_seconds_ = backward_seconds_ = 0.0;
  r.step_seconds = t.seconds();
  return r;
}

StepResult Engine::train_batch(const MicroBatchFn& next) {
  size_t n = static_cast<size_t>(model_.batch()) * static_cast<size_t>(model_.seq());
  std::vector<int32_t> tokens(n), targets(n);
  for (int64_t m = 0; m < config_.batch.gradient_accumulation_steps; ++m) {
    next(tokens.data(), targets.data());
    forward_backward(tokens.data(), targets.data());
  }
  return step();
}

float Engine::evaluate(const int32_t* tokens, const int32_t* targets) {
  return model_.forward(tokens, targets, 0.0f);
}

}  // namespace mt::engine
