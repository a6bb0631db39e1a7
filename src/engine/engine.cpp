#include "engine/engine.h"

#include <cmath>
#include <filesystem>
#include <string>

#include "base/error.h"
#include "base/fault.h"
#include "base/log.h"
#include "base/timer.h"
#include "comm/local_backend.h"
#include "engine/checkpoint_io.h"
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
  if (!config.init_from.empty()) {
    // A meshtrain checkpoint (a step-N directory, or a file in one) is verified first.
    std::filesystem::path p = config.init_from;
    std::filesystem::path d = std::filesystem::is_directory(p) ? p : p.parent_path();
    if (std::filesystem::exists(d / "state.json")) checkpoint_verify(d.string());
    hf_weights_load_path(model->store(), config.init_from);
  }
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

Engine::Engine(const RunConfig& config, models::TransformerLM& model, std::shared_ptr<comm::Backend> dp)
    : config_(config), model_(model), dp_(std::move(dp)), scaler_(scaler_config(config)) {
  nn::ParamStore& store = model.store();
  MT_CHECK(world() == config.world_size, ErrorKind::kInvalidArgument,
           "the configuration was resolved for " + std::to_string(config.world_size) + " process(es), the job has " +
               std::to_string(world()));
  const ZeroConfig& z = config.zero;
  std::vector<optim::ParamSegment> segments = engine_param_segments(config, store);
  if (config.device == "cuda") {
    // One process, one GPU (ds_config refuses more until the NCCL backend): a ZeRO partition over
    // one rank is the whole model, so every stage is stage 0's arithmetic on the device.
    MT_CHECK(world() == 1, ErrorKind::kNotSupported, "device \"cuda\" runs one process (no NCCL backend yet)");
    if (z.stage >= 1)
      log_info("zero_optimization.stage " + std::to_string(z.stage) +
               " on one GPU: the partition over one rank is the whole model (stage 0's arithmetic)");
    device_ = models::make_cuda_lm(model);
    log_info("device: " + device_->device_name());
    segments_ = segments;
    // The host optimizer keeps the step count and configuration, and its state buffers are the
    // staging area for checkpoints; the update itself runs on the device.
    optimizer_ = optim::make_optimizer(config.optimizer, store.numel(), segments);
    MT_CHECK(dynamic_cast<optim::AdamW*>(optimizer_.get()) != nullptr, ErrorKind::kNotSupported,
             "optimizer.type: " + config.optimizer.type + " is not implemented on device \"cuda\"");
    device_->zero_grad();
    return;
  }
  if (z.stage >= 1) {
    if (!dp_) dp_ = comm::make_local_world(1)[0];  // a group of one
    parallel::ZeroOptions zo;
    zo.stage = z.stage;
    zo.overlap_comm = z.overlap_comm;
    zo.prefetch_elems = static_cast<size_t>(z.stage3_prefetch_bucket_size);
    zo.persistence_threshold = static_cast<size_t>(z.stage3_param_persistence_threshold);
    zo.max_live_elems = static_cast<size_t>(z.stage3_max_live_parameters);
    zo.timeout = timeout();
    zero_ = std::make_unique<parallel::ZeroRuntime>(store, model.zero_units(), model.zero_unit_modules(), *dp_, zo);
    segments = zero_->partition().shard_segments(segments);
    if (rank() == 0) {
      if (z.offload_optimizer == "cpu")
        log_info("zero_optimization.offload_optimizer: cpu — the optimizer state already lives in host memory on CPU ranks");
      if (z.offload_param == "cpu")
        log_info("zero_optimization.offload_param: cpu — the parameters already live in host memory on CPU ranks");
    }
  } else if (world() > 1) {
    buckets_ = std::make_unique<parallel::GradBuckets>(store.grad(), store.numel(),
                                                       static_cast<size_t>(z.reduce_bucket_size), *dp_, z.overlap_comm,
                                                       timeout());
    // A bucket is launched once backward has passed below it: after each block and the tail.
    std::vector<parallel::Unit> units = model.zero_units();
    auto modules = model.zero_unit_modules();
    for (size_t u = 1; u < units.size(); ++u) {
      size_t from = units[u].offset;
      for (nn::Module* m : modules[u])
        m->add_hook(nn::HookPoint::kPostBackward, [this, from](nn::Module&, nn::HookPoint) {
          if (buckets_->armed()) buckets_->ready_from(from);
        });
    }
  }
  optimizer_ = optim::make_optimizer(config.optimizer, state_numel(), segments);
  store.zero_grad();
}

Engine::~Engine() = default;

std::string Engine::first_nonfinite_grad() {
  // This rank's span: the whole buffer, or its ZeRO shard (whose segments carry the names).
  std::vector<float> host;
  const float* g = grad();
  size_t n = state_numel();
  if (device_) {
    host.resize(model_.store().numel());
    device_->store_grads(host.data());
    g = host.data();
    n = host.size();
  }
  if (g == nullptr) return "";
  for (const optim::ParamSegment& s : zero_ ? zero_->partition().shard_segments(engine_param_segments(config_, model_.store()))
                                            : engine_param_segments(config_, model_.store())) {
    for (size_t i = s.offset; i < s.offset + s.numel && i < n; ++i)
      if (!std::isfinite(g[i])) return s.name + ", element " + std::to_string(i - s.offset);
  }
  return "";
}

float* Engine::master() const { return zero_ ? zero_->master() : model_.store().master(); }
float* Engine::grad() const { return zero_ ? zero_->grad() : model_.store().grad(); }
size_t Engine::state_numel() const { return zero_ ? zero_->partition().shard_numel() : model_.store().numel(); }

std::chrono::milliseconds Engine::timeout() const {
  return std::chrono::milliseconds(static_cast<int64_t>(config_.comm_timeout_s * 1000.0));
}

double Engine::mean_over_ranks(double value) {
  if (world() == 1) return value;
  float v = static_cast<float>(value);
  comm::AllReduceOptions o;
  o.op = comm::ReduceOp::kAvg;
  o.tag = "mean over ranks";
  o.timeout = timeout();
  dp_->all_reduce(&v, 1, DType::kF32, o)->wait();
  return v;
}

double Engine::current_lr() const { return optim::lr_for_step(config_.scheduler, applied_steps_ + 1); }

float Engine::forward(const int32_t* tokens, const int32_t* targets) {
  MT_CHECK(!pending_backward_, ErrorKind::kInvalidArgument, "forward() twice without backward()");
  Timer t;
  // DeepSpeed scales each micro-batch's loss by 1/gradient_accumulation_steps (and the loss scale)
  // and averages the gradients over the ranks; scaling by 1/(steps · ranks) and summing is the
  // same (and is exactly what one process does with the whole global batch).
  float scale = static_cast<float>(scaler_.scale() / static_cast<double>(config_.batch.gradient_accumulation_steps) /
                                   static_cast<double>(world()));
  float loss = device_ ? device_->forward(tokens, targets, scale) : model_.forward(tokens, targets, scale);
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
  const bool last = micro_in_step_ + 1 == config_.batch.gradient_accumulation_steps;
  if (zero_) zero_->set_last_micro_batch(last);
  if (buckets_ && last) buckets_->begin();  // no communication on the other micro-batches
  if (device_) {
    device_->backward();
    if (config_.wall_clock_breakdown) device_->synchronize();  // honest per-phase timings
  } else {
    model_.backward();
  }
  if (zero_) zero_->finish_backward();
  if (buckets_ && last) buckets_->finish();
  backward_seconds_ += t.seconds();
  pending_backward_ = false;
  ++micro_in_step_;
}

float Engine::forward_backward(const int32_t* tokens, const int32_t* targets) {
  float loss = forward(tokens, targets);
  backward();
  return loss;
}

std::unique_ptr<Engine> initialize(const RunConfig& config, models::TransformerLM& model,
                                   std::shared_ptr<comm::Backend> dp) {
  return std::make_unique<Engine>(config, model, std::move(dp));
}

StepResult Engine::step() {
  MT_CHECK(micro_in_step_ > 0 && !pending_backward_, ErrorKind::kInvalidArgument,
           "step() needs forward() and backward() of at least one micro-batch first");
  Timer t;
  nn::ParamStore& store = model_.store();
  StepResult r;
  r.forward_seconds = forward_seconds_;
  r.backward_seconds = backward_seconds_;
  r.loss = static_cast<float>(mean_over_ranks(loss_sum_ / micro_in_step_));
  r.loss_scale = scaler_.scale();
  r.lr = current_lr();
  if (fault_active("engine.nonfinite_grad") && !device_ && grad() != nullptr) grad()[state_numel() / 2] = INFINITY;
  double norm;
  if (device_) {
    norm = std::sqrt(device_->grad_sum_squares()) / r.loss_scale;
  } else if (zero_) {  // each rank holds the reduced gradients of its shard: sum the squares over ranks
    double local = optim::grad_norm(grad(), state_numel());
    float sq = static_cast<float>(local * local);
    if (world() > 1) {
      comm::AllReduceOptions o;
      o.tag = "grad norm";
      o.timeout = timeout();
      dp_->all_reduce(&sq, 1, DType::kF32, o)->wait();
    }
    norm = std::sqrt(static_cast<double>(sq)) / r.loss_scale;
  } else {
    norm = optim::grad_norm(grad(), state_numel()) / r.loss_scale;
  }
  r.grad_norm = norm;
  bool overflow = !std::isfinite(norm);
  // Without a dynamic loss scaler (fp32, bf16, a static fp16 scale) skipping cannot recover: the
  // next step's gradients come from the same weights. Stop, naming the step and the first parameter
  // whose gradient is not finite.
  if (overflow && !scaler_.dynamic()) {
    std::string where = first_nonfinite_grad();
    throw Error(ErrorKind::kNumerical,
                "step " + std::to_string(global_step_ + 1) + ": the gradient is not finite" +
                    (where.empty() ? std::string() : " (first in " + where + ")") +
                    "; without a dynamic fp16 loss scaler the step cannot be skipped and retried — lower the "
                    "learning rate, enable gradient_clipping, or check the data");
  }
  if (overflow) {
    r.skipped = true;
  } else {
    double coef = 1.0 / r.loss_scale;
    if (config_.gradient_clipping > 0.0 && norm > config_.gradient_clipping)
      coef *= config_.gradient_clipping / (norm + 1e-6);
    // OneCycle cycles beta1 (and pins beta2 to 0.99) of Adam-like optimizers, as DeepSpeed does.
    if (auto mom = optim::momentum_for_step(config_.scheduler, applied_steps_ + 1); mom && optimizer_->has_betas())
      optimizer_->set_betas(*mom, optim::kOneCycleBeta2);
    if (device_) {
      auto* adam = static_cast<optim::AdamW*>(optimizer_.get());
      optimizer_->set_step_count(optimizer_->step_count() + 1);
      kernels::AdamWParams p;
      p.lr = static_cast<float>(r.lr);
      p.beta1 = adam->config().beta1;
      p.beta2 = adam->config().beta2;
      p.eps = adam->config().eps;
      p.step = optimizer_->step_count();
      p.grad_scale = static_cast<float>(coef);
      device_->adamw_step(segments_, p);
    } else if (zero_) {
      optimizer_->step(master(), grad(), nullptr, DType::kF32, static_cast<float>(r.lr), static_cast<float>(coef));
      zero_->refresh_params();
    } else {
      bool lowp = store.compute_dtype() != DType::kF32;
      optimizer_->step(store.master(), store.grad(), lowp ? store.compute() : nullptr, store.compute_dtype(),
                       static_cast<float>(r.lr), static_cast<float>(coef));
    }
    ++applied_steps_;
  }
  scaler_.update(overflow);  // throws at the minimum scale, as DeepSpeed does
  ++global_step_;
  if (zero_) zero_->zero_grad();
  if (device_) {
    device_->zero_grad();
    device_->synchronize();  // the step's time includes its kernels
  } else {
    store.zero_grad();
  }
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
  return device_ ? device_->forward(tokens, targets, 0.0f) : model_.forward(tokens, targets, 0.0f);
}

MemStats Engine::memory_stats() const { return device_ ? device_->memory() : Allocator::global().stats(); }

void Engine::reset_memory_peaks() {
  if (device_) device_->reset_peaks();
  else Allocator::global().reset_peaks();
}

}  // namespace mt::engine

namespace mt::engine {

void Engine::gather_master(std::vector<float>& flat) {
  const size_t P = model_.store().numel();
  flat.assign(rank() == 0 ? P : 0, 0.0f);
  if (device_) {
    device_->store_master(flat.data());
    return;
  }
  if (!zero_) {
    if (rank() == 0) std::copy(master(), master() + P, flat.begin());
    return;
  }
  zero_->gather_flat(rank() == 0 ? flat.data() : nullptr, master(), 0);
}

std::vector<std::pair<std::string, std::vector<float>>> Engine::gather_optimizer_state() {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  const size_t P = model_.store().numel();
  for (const optim::StateBuffer& b : optimizer_->state()) {
    std::vector<float> v(rank() == 0 ? P : 0);
    if (device_) {
      device_->store_state(b.name, v.data());
    } else if (zero_) {
      zero_->gather_flat(rank() == 0 ? v.data() : nullptr, b.data, 0);
    } else if (rank() == 0) {
      std::copy(b.data, b.data + b.numel, v.begin());
    }
    out.emplace_back(b.name, std::move(v));
  }
  return out;
}

void Engine::load_master(const float* flat) {
  if (zero_) {
    zero_->scatter_flat(master(), flat);
    zero_->refresh_params();
    return;
  }
  nn::ParamStore& store = model_.store();
  std::copy(flat, flat + store.numel(), store.master());
  store.sync_compute();
  if (device_) device_->load_master(flat);
}

void Engine::load_optimizer_state(const std::string& name, const float* flat) {
  for (const optim::StateBuffer& b : optimizer_->state()) {
    if (b.name != name) continue;
    if (device_) {
      device_->load_state(name, flat);
    } else if (zero_) {
      zero_->scatter_flat(b.data, flat);
    } else {
      std::copy(flat, flat + b.numel, b.data);
    }
    return;
  }
  throw Error(ErrorKind::kInvalidArgument, "optimizer " + std::string(optimizer_->type_name()) + " has no state '" + name + "'");
}

}  // namespace mt::engine
