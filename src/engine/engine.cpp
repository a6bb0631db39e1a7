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

std::shared_ptr<parallel::ParallelContext> engine_parallel_context(const RunConfig& config,
                                                                   std::shared_ptr<comm::Backend> world) {
  return parallel::make_parallel_context(std::move(world), config.tp, 1, config.sequence_parallel,
                                         std::chrono::milliseconds(static_cast<int64_t>(config.comm_timeout_s * 1000.0)));
}

std::unique_ptr<models::TransformerLM> engine_build_model(const RunConfig& config,
                                                          std::shared_ptr<parallel::ParallelContext> ctx) {
  models::ModelOptions opts;
  opts.compute_dtype = config.compute_dtype;
  opts.recompute = config.activation_checkpointing;
  opts.seed = config.seed;
  opts.parallel = std::move(ctx);
  opts.vocab_divisible = config.vocab_divisible;
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
    : Engine(config, model, parallel::make_parallel_context(std::move(dp), 1, 1, false,
                                                            std::chrono::milliseconds(static_cast<int64_t>(config.comm_timeout_s * 1000.0)))) {}

Engine::Engine(const RunConfig& config, models::TransformerLM& model, std::shared_ptr<parallel::ParallelContext> ctx)
    : config_(config), model_(model), ctx_(std::move(ctx)), dp_(ctx_->groups.dp), scaler_(scaler_config(config)) {
  nn::ParamStore& store = model.store();
  MT_CHECK(model.tp().size() == ctx_->tp(), ErrorKind::kInternal,
           "the model was built for " + std::to_string(model.tp().size()) + " tensor-parallel rank(s), the layout has " +
               std::to_string(ctx_->tp()));
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
  // How gradients are synchronised over the dp group and what part of the state this rank holds.
  parallel::GradSyncOptions go;
  go.stage = z.stage;
  go.bucket_elems = static_cast<size_t>(z.reduce_bucket_size);
  go.overlap_comm = z.overlap_comm;
  go.timeout = timeout();
  go.zero.stage = z.stage;
  go.zero.overlap_comm = z.overlap_comm;
  go.zero.prefetch_elems = static_cast<size_t>(z.stage3_prefetch_bucket_size);
  go.zero.persistence_threshold = static_cast<size_t>(z.stage3_param_persistence_threshold);
  go.zero.max_live_elems = static_cast<size_t>(z.stage3_max_live_parameters);
  go.zero.timeout = timeout();
  sync_ = parallel::make_grad_sync(store, model.zero_units(), model.zero_unit_modules(), *dp_, go);
  segments = sync_->span_segments(segments);
  if (z.stage >= 1 && rank() == 0) {
    if (z.offload_optimizer == "cpu")
      log_info("zero_optimization.offload_optimizer: cpu — the optimizer state already lives in host memory on CPU ranks");
    if (z.offload_param == "cpu")
      log_info("zero_optimization.offload_param: cpu — the parameters already live in host memory on CPU ranks");
  }
  // The gradient norm counts a parameter replicated over the tp group on tp rank 0 only.
  for (const optim::ParamSegment& sg : segments) {
    const nn::Parameter* p = store.find(sg.name);
    if (ctx_->tp() > 1 && ctx_->tp_rank() != 0 && p != nullptr && p->tp_replicated()) continue;
    if (!norm_ranges_.empty() && norm_ranges_.back().first + norm_ranges_.back().second == sg.offset)
      norm_ranges_.back().second += sg.numel;
    else
      norm_ranges_.emplace_back(sg.offset, sg.numel);
  }
  optimizer_ = optim::make_optimizer(config.optimizer, state_numel(), segments);
  store.zero_grad();
}

double Engine::grad_sum_squares() {
  double sq = 0.0;
  const float* g = grad();
  for (const auto& [off, n] : norm_ranges_) {
    double norm = optim::grad_norm(g + off, n);
    sq += norm * norm;
  }
  float v = static_cast<float>(sq);
  comm::AllReduceOptions o;
  o.tag = "grad norm";
  o.timeout = timeout();
  if (sync_->sharded() && world() > 1) dp_->all_reduce(&v, 1, DType::kF32, o)->wait();  // each rank: its shard
  if (ctx_->tp() > 1) ctx_->groups.tp->all_reduce(&v, 1, DType::kF32, o)->wait();  // each rank: its tp shard
  return static_cast<double>(v);
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
  const auto all = engine_param_segments(config_, model_.store());
  for (const optim::ParamSegment& s : sync_ ? sync_->span_segments(all) : all) {
    for (size_t i = s.offset; i < s.offset + s.numel && i < n; ++i)
      if (!std::isfinite(g[i])) return s.name + ", element " + std::to_string(i - s.offset);
  }
  return "";
}

float* Engine::master() const { return sync_ ? sync_->master() : model_.store().master(); }
float* Engine::grad() const { return sync_ ? sync_->grad() : model_.store().grad(); }
size_t Engine::state_numel() const { return sync_ ? sync_->numel() : model_.store().numel(); }

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
  if (sync_) sync_->begin_backward(last);  // bucketed: no communication on the other micro-batches
  if (device_) {
    device_->backward();
    if (config_.wall_clock_breakdown) device_->synchronize();  // honest per-phase timings
  } else {
    model_.backward();
  }
  if (sync_) sync_->end_backward(last);
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
  StepResult r;
  r.forward_seconds = forward_seconds_;
  r.backward_seconds = backward_seconds_;
  r.tp_comm_bytes = model_.tp().bytes();
  r.tp_comm_seconds = model_.tp().seconds();
  model_.tp().reset_bytes();
  r.loss = static_cast<float>(mean_over_ranks(loss_sum_ / micro_in_step_));
  r.loss_scale = scaler_.scale();
  r.lr = current_lr();
  if (fault_active("engine.nonfinite_grad") && !device_ && grad() != nullptr) grad()[state_numel() / 2] = INFINITY;
  double norm;
  if (device_) {
    norm = std::sqrt(device_->grad_sum_squares()) / r.loss_scale;
  } else if (sync_->sharded() || ctx_->tp() > 1) {  // shards of the gradient: sum the squares over them
    norm = std::sqrt(grad_sum_squares()) / r.loss_scale;
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
    } else {
      optimizer_->step(sync_->master(), sync_->grad(), sync_->compute(), sync_->compute_dtype(), static_cast<float>(r.lr),
                       static_cast<float>(coef));
      sync_->after_update();
    }
    ++applied_steps_;
  }
  scaler_.update(overflow);  // throws at the minimum scale, as DeepSpeed does
  ++global_step_;
  if (device_) {
    device_->zero_grad();
    device_->synchronize();  // the step's time includes its kernels
  } else {
    sync_->zero_grad();
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

std::vector<float> Engine::to_one_process(const float* span) {
  nn::ParamStore& store = model_.store();
  const size_t P = store.numel();
  const bool lead_dp = dp_->rank() == 0;
  std::vector<float> local(lead_dp ? P : 0);
  sync_->gather(lead_dp ? local.data() : nullptr, span);
  const int tp = ctx_->tp();
  if (tp == 1 || !lead_dp) return local;  // tp 1: the local layout is the one-process layout
  // The tp group of dp rank 0 gathers its shards on tp rank 0, which puts each parameter together.
  const bool lead = ctx_->tp_rank() == 0;
  std::vector<float> all(lead ? P * static_cast<size_t>(tp) : 0);
  comm::GatherOptions o;
  o.tag = "checkpoint tp shards";
  o.timeout = timeout();
  ctx_->groups.tp->gather(lead ? all.data() : nullptr, local.data(), P, DType::kF32, o)->wait();
  if (!lead) return {};
  std::vector<float> full(store.global_numel());
  for (int r = 0; r < tp; ++r)
    for (const nn::Parameter* p : store.parameters())
      nn::tp_insert(full.data() + p->global_offset, all.data() + static_cast<size_t>(r) * P + p->offset, p->global_shape,
                    p->split, nn::TpPlace{r, tp});
  return full;
}

std::vector<float> Engine::from_one_process(const float* full) const {
  const nn::ParamStore& store = model_.store();
  std::vector<float> local(store.numel());
  for (const nn::Parameter* p : store.parameters())
    nn::tp_extract(local.data() + p->offset, full + p->global_offset, p->global_shape, p->split, p->place);
  return local;
}

void Engine::gather_master(std::vector<float>& flat) {
  if (device_) {
    flat.assign(model_.store().numel(), 0.0f);
    device_->store_master(flat.data());
    return;
  }
  flat = to_one_process(master());
  if (rank() != 0) flat.clear();
}

std::vector<std::pair<std::string, std::vector<float>>> Engine::gather_optimizer_state() {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (const optim::StateBuffer& b : optimizer_->state()) {
    std::vector<float> v;
    if (device_) {
      v.resize(model_.store().numel());
      device_->store_state(b.name, v.data());
    } else {
      v = to_one_process(b.data);
      if (rank() != 0) v.clear();
    }
    out.emplace_back(b.name, std::move(v));
  }
  return out;
}

void Engine::load_master(const float* flat) {
  std::vector<float> local = from_one_process(flat);
  if (device_) {
    nn::ParamStore& store = model_.store();
    std::copy(local.begin(), local.end(), store.master());
    store.sync_compute();
    device_->load_master(local.data());
    return;
  }
  sync_->scatter(master(), local.data());
  sync_->after_update();
}

void Engine::load_optimizer_state(const std::string& name, const float* flat) {
  for (const optim::StateBuffer& b : optimizer_->state()) {
    if (b.name != name) continue;
    std::vector<float> local = from_one_process(flat);
    if (device_) {
      device_->load_state(name, local.data());
    } else {
      sync_->scatter(b.data, local.data());
    }
    return;
  }
  throw Error(ErrorKind::kInvalidArgument, "optimizer " + std::string(optimizer_->type_name()) + " has no state '" + name + "'");
}

}  // namespace mt::engine
