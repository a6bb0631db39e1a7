#include "engine/engine.h"

#ifdef MT_NCCL
#include "comm/nccl/nccl_backend.h"
#endif

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "base/error.h"
#include "base/fault.h"
#include "base/log.h"
#include "base/timer.h"
#include "comm/local_backend.h"
#include "engine/checkpoint_io.h"
#include "engine/corpus.h"
#include "engine/hf_weights.h"
#include "optim/lamb.h"
#include "optim/swapped_adamw.h"
#include "parallel/pp/partition.h"
#include "planner/memory.h"

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

// Options of a pipeline message (comm::SendOptions or RecvOptions).
template <typename Options>
Options p2p_options(const std::string& tag, int msg_tag, std::chrono::milliseconds timeout) {
  Options o;
  o.tag = tag;
  o.msg_tag = msg_tag;
  o.timeout = timeout;
  return o;
}

}  // namespace

std::shared_ptr<parallel::ParallelContext> engine_parallel_context(const RunConfig& config,
                                                                   std::shared_ptr<comm::Backend> world) {
  return parallel::make_parallel_context(std::move(world), config.tp, config.pp, config.sequence_parallel,
                                         std::chrono::milliseconds(static_cast<int64_t>(config.comm_timeout_s * 1000.0)), config.sp);
}

parallel::pp::ScheduleSpec engine_schedule_spec(const RunConfig& config) {
  return {parallel::pp::parse_schedule(config.pipeline_schedule), config.pp, config.virtual_stages,
          static_cast<int>(config.batch.gradient_accumulation_steps)};
}

LayerTimes engine_measure_layer_times(const RunConfig& config) {
  const int B = static_cast<int>(config.batch.micro_batch_per_gpu), T = static_cast<int>(config.seq_length);
  // A sequence classifier trains on a label at each row's last token: label 0, or row b of a zero
  // table of values (regression, multi-label).
  const int labels = config.model.num_labels;
  const bool valued = labels > 0 && config.model.problem_type != models::ProblemType::kSingleLabel;
  std::vector<float> values(valued ? static_cast<size_t>(B) * labels : 0, 0.0f);
  auto build = [&](int layers) {
    models::ModelConfig m = config.model;
    m.n_layer = layers;
    models::ModelOptions o;
    o.compute_dtype = config.compute_dtype;
    o.recompute = config.activation_checkpointing;
    o.seed = config.seed;
    o.sparse_attention = config.sparse_attention;  // the run's own attention (its synthetic tokens hold no documents)
    auto model = std::make_unique<models::TransformerLM>(m, o);
    model->prepare(B, T);
    if (valued) model->set_label_values(values.data(), B);
    return model;
  };
  auto one = build(1), two = build(2);
  std::vector<int32_t> tok(static_cast<size_t>(B) * T), tgt(tok.size());
  for (size_t i = 0; i < tok.size(); ++i) {
    tok[i] = static_cast<int32_t>((i * 7919) % static_cast<size_t>(config.model.vocab_size));
    tgt[i] = static_cast<int32_t>((i * 104729 + 1) % static_cast<size_t>(config.model.vocab_size));
    if (labels > 0) tgt[i] = i % static_cast<size_t>(T) + 1 == static_cast<size_t>(T) ? (valued ? static_cast<int32_t>(i / T) : 0) : -100;
  }
  auto seconds = [&](models::TransformerLM& model) {
    Timer t;
    model.forward(tok.data(), tgt.data(), 1.0f);
    model.backward();
    return t.seconds();
  };
  // Alternating, so that a disturbance hits both; the first pair warms up; the fastest of the rest.
  double t1 = 1e30, t2 = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    double a = seconds(*one), b = seconds(*two);
    if (rep == 0) continue;
    t1 = std::min(t1, a);
    t2 = std::min(t2, b);
  }
  LayerTimes lt;
  lt.block = std::max(t2 - t1, 1e-9);
  lt.rest = std::max(t1 - lt.block, 0.0);
  return lt;
}

std::vector<int> engine_pipeline_bounds(const RunConfig& config, std::string* report, const LayerTimes* times) {
  // Parameters of each part of the model (planner/memory.h, which the planner's search cuts by too).
  parallel::pp::PartitionInput in = planner::pipeline_partition_input(config.model, config.pp * config.virtual_stages);
  const models::ModelConfig& m = config.model;
  if (config.partition == "time") {
    MT_CHECK(times != nullptr, ErrorKind::kInternal, "parallel.partition \"time\" needs measured layer times");
    in.layer_cost.assign(m.n_layer, times->block);
    in.first_cost = 0.0;
    in.last_cost = times->rest;
  }
  auto b = parallel::pp::partition_layers(parallel::pp::parse_partition(config.partition, "parallel.partition"), in);
  if (report) *report = parallel::pp::describe_partition(b, in);
  return b;
}

std::unique_ptr<models::TransformerLM> engine_build_model(const RunConfig& config,
                                                          std::shared_ptr<parallel::ParallelContext> ctx) {
  models::ModelOptions opts;
  opts.compute_dtype = config.compute_dtype;
  opts.recompute = config.activation_checkpointing;
  opts.seed = config.seed;
  opts.parallel = std::move(ctx);
  opts.vocab_divisible = config.vocab_divisible;
  opts.sparse_attention = config.sparse_attention;
  if (config.reset_position_ids || config.reset_attention_mask) {
    std::string from;
    opts.documents = {corpus_eod_id(config, &from), config.reset_position_ids, config.reset_attention_mask};
  }
  // Under ZeRO the runtime makes each rank's shard (and the views it keeps) from the initial
  // values, unit by unit, as DeepSpeed's zero.Init does: the whole model's f32 weights, gradients
  // and compute copy are never allocated beside the shards (a rank's setup held them all, above its
  // training peak: DESIGN-NOTES 57). ZeRO-Infinity writes them straight into the swap. Weights to
  // start from (model.init_from: Hugging Face files or a meshtrain checkpoint) are such initial
  // values too, read a parameter at a time (DESIGN-NOTES 67).
  opts.deferred_init = config.zero.stage >= 1 && config.device == "cpu";
  int slots = 1;
  if (config.pp > 1) {
    MT_CHECK(opts.parallel && opts.parallel->pp() == config.pp, ErrorKind::kInternal,
             "the layout has no pipeline of parallel.pp = " + std::to_string(config.pp) + " stages");
    std::string report;
    LayerTimes times;
    if (config.partition == "time") {
      // Measured on every rank at once (each on its share of the machine, as in training) and
      // averaged over the world: every rank must cut the same stages.
      times = engine_measure_layer_times(config);
      float t[2] = {static_cast<float>(times.block), static_cast<float>(times.rest)};
      comm::AllReduceOptions o;
      o.op = comm::ReduceOp::kAvg;
      o.tag = "pipeline partition times";
      o.timeout = opts.parallel->timeout;
      opts.parallel->world->all_reduce(t, 2, DType::kF32, o)->wait();
      times.block = t[0];
      times.rest = t[1];
    }
    opts.pipeline_bounds = engine_pipeline_bounds(config, &report, &times);
    if (opts.parallel->rank() == 0)
      log_info("pipeline: " + std::string(parallel::pp::schedule_name(engine_schedule_spec(config).kind)) + ", " +
               std::to_string(config.pp) + " ranks x " + std::to_string(config.virtual_stages) + " chunk(s), " +
               std::to_string(config.batch.gradient_accumulation_steps) + " micro-batches, partition " + config.partition +
               (config.partition == "time" ? " (seconds of forward + backward per micro-batch): " : " (parameters): ") + report);
    slots = parallel::pp::max_in_flight(parallel::pp::build_schedule(engine_schedule_spec(config), opts.parallel->pp_rank()));
  }
  auto model = std::make_unique<models::TransformerLM>(config.model, opts);
  if (!config.init_from.empty()) {
    // Opened now (a checkpoint verified, every tensor found, its shape and dtype checked); read as the
    // runtime makes the shards, or into the whole store.
    // Said once: by the first tp rank of the first dp replica (on the stage that holds the head).
    const bool speak = !opts.parallel || (opts.parallel->tp_rank() == 0 && opts.parallel->dp_rank() == 0);
    std::shared_ptr<WeightSource> source = init_from_weights(config.init_from, model->store(), speak);
    // A Hugging Face file's tensors that the whole model does not read: said once, by stage 0.
    if (speak && (!opts.parallel || opts.parallel->pp_rank() == 0) && !is_checkpoint_path(config.init_from))
      hf_warn_unused_tensors(config.init_from, hf_model_tensor_names(config.model),
                             config.model.tie_embeddings && config.model.num_labels == 0);
    if (opts.deferred_init) {
      const models::TransformerLM* m = model.get();
      model->set_initial_values(weight_initial_values(std::move(source), model->store(),
                                                      [m](size_t a, size_t b, float* dst) { m->seed_values(a, b, dst); }));
    } else {
      weights_load(*source, model->store());
    }
  }
  model->prepare(static_cast<int>(config.batch.micro_batch_per_gpu), static_cast<int>(config.seq_length), slots);
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
  // Unwinding out of here (the optimizer's swap directory held or full after the parameters' files
  // were reserved): those files go, before the members that know them are destroyed.
  struct DiscardOnThrow {
    Engine* engine;
    int before = std::uncaught_exceptions();
    ~DiscardOnThrow() {
      if (std::uncaught_exceptions() > before) engine->discard_swap_files();
    }
  } discard_on_throw{this};
  nn::ParamStore& store = model.store();
  MT_CHECK(model.tp().size() == ctx_->tp(), ErrorKind::kInternal,
           "the model was built for " + std::to_string(model.tp().size()) + " tensor-parallel rank(s), the layout has " +
               std::to_string(ctx_->tp()));
  MT_CHECK(ctx_->pp() == config.pp && model.chunks() == config.virtual_stages, ErrorKind::kInternal,
           "the model and layout were not built for parallel.pp = " + std::to_string(config.pp) + " x virtual_stages = " +
               std::to_string(config.virtual_stages));
  MT_CHECK(ctx_->sp() == config.sp && model.sp() == config.sp, ErrorKind::kInternal,
           "the model and layout were not built for parallel.sp = " + std::to_string(config.sp));
  MT_CHECK(data_ranks() == config.world_size, ErrorKind::kInvalidArgument,
           "the configuration was resolved for " + std::to_string(config.world_size) + " process(es), the job has " +
               std::to_string(data_ranks()));
  const ZeroConfig& z = config.zero;
  std::vector<optim::ParamSegment> segments = engine_param_segments(config, store);
  if (config.device == "cuda") {
    // One GPU per process (local rank modulo the visible GPUs). Over one rank a ZeRO partition is
    // the whole model, so every stage is stage 0's arithmetic on the device; over several (stage 0:
    // ds_config refuses the rest) each GPU keeps a replica and the gradients are all-reduced: on the
    // GPUs by NCCL (comm_backend "nccl"), or staged through the host and reduced by MPI
    // (comm_backend "mpi": no NCCL, or several ranks sharing a GPU, which NCCL refuses).
    if (z.stage >= 1 && world() == 1)
      log_info("zero_optimization.stage " + std::to_string(z.stage) +
               " on one GPU: the partition over one rank is the whole model (stage 0's arithmetic)");
    // The CUDA model has no dropout (ds_config_check_trainable refuses it by key for the CLI).
    MT_CHECK(!model.has_dropout(), ErrorKind::kNotSupported,
             "device \"cuda\": the model's dropout (embd_pdrop, resid_pdrop, attn_pdrop / attention_dropout) is not "
             "supported on the CUDA backend; set them to 0 or train on the CPU");
    MT_CHECK(model.config().padding_idx < 0, ErrorKind::kNotSupported,
             "device \"cuda\": LLaMA's padding row (pad_token_id) is not supported on the CUDA backend; train on the CPU");
    const int gpu = models::cuda_select_device();
    device_ = models::make_cuda_lm(model);
    log_info("device: " + device_->device_name() + (world() > 1 ? " (GPU " + std::to_string(gpu) + ")" : ""));
    if (world() > 1 && config.comm_backend == "mpi" && rank() == 0)
      log_info("comm: MPI over " + std::to_string(world()) + " GPU processes, gradients staged through host memory");
    if (config.comm_backend == "nccl") {
#ifdef MT_NCCL
      // The collectives run on their own stream, each gradient range's all-reduce queued as the
      // backward finishes it (Engine::backward), overlapping the rest of the backward.
      nccl_ = comm::make_nccl_backend(*dp_, gpu, models::cuda_comm_stream());
      if (rank() == 0) log_info("comm: NCCL " + comm::nccl_version() + " over " + std::to_string(world()) + " GPU(s)");
#else
      throw Error(ErrorKind::kNotSupported, "comm_backend: \"nccl\": this meshtrain was built without NCCL");
#endif
    }
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
  go.comm_dtype = grad_comm_dtype(config, config.sp);  // Ulysses: seq_parallel_communication_data_type
  go.zero.comm_dtype = go.comm_dtype;
  go.onebit = optim::optimizer_is_onebit(config.optimizer);
  // DeepSpeed's 1-bit and 0/1 Adam compress tensor by tensor in fp32; its fp16 optimizer gives them
  // one flat buffer, and 1-bit LAMB compresses its flat momentum in both.
  go.onebit_per_tensor = go.onebit && !optim::optimizer_is_onebit_lamb(config.optimizer) && config.compute_dtype != DType::kF16;
  const std::string rank_dir = "rank" + std::to_string(rank());
  if (z.offload_param == "nvme") {  // ZeRO-Infinity: master and gradient shards on disk
    go.zero.swap_dir = (std::filesystem::path(z.param_nvme_path) / "zero_stage_3" / "param" / rank_dir).string();
    go.zero.aio.block_size = static_cast<size_t>(config.aio.block_size);
    go.zero.aio.queue_depth = config.aio.queue_depth;
    go.zero.aio.thread_count = config.aio.thread_count;
    go.zero.aio.single_submit = config.aio.single_submit;
    go.zero.aio.overlap_events = config.aio.overlap_events;
  }
  if (store.released())
    go.zero.initial_values = [&model](size_t a, size_t b, float* dst) { model.init_values(a, b, dst); };
  sync_ = parallel::make_grad_sync(store, model.zero_units(), model.zero_unit_modules(), *dp_, go);
  model.set_initial_values(nullptr);  // the values are in the shards: weights read from a file are let go
  segments = sync_->span_segments(segments);
  if (z.stage >= 1 && rank() == 0) {
    if (z.offload_optimizer == "cpu")
      log_info("zero_optimization.offload_optimizer: cpu — the optimizer state already lives in host memory on CPU ranks");
    if (z.offload_param == "cpu")
      log_info("zero_optimization.offload_param: cpu — the parameters already live in host memory on CPU ranks");
  }
  // The gradient norm counts a parameter replicated over the tp group on tp rank 0 only, and the
  // tied GPT-2 table of a pipeline on its first stage only.
  const nn::Parameter* tied_copy = model.tied_head_copy();
  for (const optim::ParamSegment& sg : segments) {
    const nn::Parameter* p = store.find(sg.name);
    if (ctx_->tp() > 1 && ctx_->tp_rank() != 0 && p != nullptr && p->tp_replicated()) continue;
    if (p != nullptr && p == tied_copy) continue;
    if (!norm_ranges_.empty() && norm_ranges_.back().first + norm_ranges_.back().second == sg.offset)
      norm_ranges_.back().second += sg.numel;
    else
      norm_ranges_.emplace_back(sg.offset, sg.numel);
  }
  // At stages 1-3 the norm's ranges end at every unit piece: the sum of squares is then the same
  // whether a piece's gradient sits in memory or was summed on its way to disk (offload_param).
  if (parallel::ZeroRuntime* rt = sync_->zero(); rt != nullptr) {
    const parallel::ZeroPartition& part = rt->partition();
    std::vector<std::pair<size_t, size_t>> split;
    for (auto [off, n] : norm_ranges_) {
      const size_t end = off + n;
      for (size_t u = 0; u < part.units().size() && off < end; ++u) {
        const size_t lo = part.shard_offset(u), hi = lo + part.piece(u);
        if (hi <= off || lo >= end) continue;
        const size_t a = std::max(off, lo), b = std::min(end, hi);
        split.emplace_back(a, b - a);
      }
    }
    norm_ranges_ = std::move(split);
    if (rt->swapped()) rt->set_norm_ranges(norm_ranges_);
  }
  if (z.offload_optimizer == "nvme") {
    // ZeRO-Infinity: the moments swapped under nvme_path, as DeepSpeed lays its swap folders out.
    optim::SwapOptions so;
    so.dir = (std::filesystem::path(z.optimizer_nvme_path) / ("zero_stage_" + std::to_string(z.stage)) / "optimizer" /
              rank_dir)
                 .string();
    if (parallel::ZeroRuntime* rt = sync_->zero(); rt != nullptr && rt->swapped()) {
      so.records = rt->swap_records(static_cast<size_t>(z.sub_group_size));  // the runtime's layout, in sub-group-sized records
      so.master_file = rt->master_file();
      so.grad_file = rt->grad_file();
      // The step runs beside the next forward: each gather waits for its unit's sub-groups only,
      // and the persistent units (gathered as the step ends) go first.
      so.asynchronous = true;
      so.first_records = rt->persistent_records(static_cast<size_t>(z.sub_group_size));
    }
    so.sub_group_size = static_cast<size_t>(z.sub_group_size);
    so.buffer_count = z.optimizer_buffer_count;
    so.pipeline_read = z.pipeline_read;
    so.pipeline_write = z.pipeline_write;
    so.aio.block_size = static_cast<size_t>(config.aio.block_size);
    so.aio.queue_depth = config.aio.queue_depth;
    so.aio.thread_count = config.aio.thread_count;
    so.aio.single_submit = config.aio.single_submit;
    so.aio.overlap_events = config.aio.overlap_events;
    optimizer_ = optim::make_swapped_optimizer(config.optimizer, state_numel(), segments, so);
    if (so.asynchronous) {
      auto* sw = static_cast<optim::SwappedAdamW*>(optimizer_.get());
      sync_->zero()->set_master_wait([sw](size_t begin, size_t end) { sw->wait_range(begin, end); });
    }
    if (rank() == 0) {
      auto* sw = static_cast<const optim::SwappedAdamW*>(optimizer_.get());
      log_info("zero_optimization.offload_optimizer: nvme — AdamW moments" +
               std::string(so.master_file ? ", master weights and gradients (offload_param nvme)" : "") +
               " swapped under " + so.dir + (so.master_file ? " and " + go.zero.swap_dir : "") + " (" +
               format_bytes(sw->disk_bytes() * (so.master_file ? 2 : 1)) + " on disk per rank, " +
               std::to_string(sw->sub_groups()) + " sub-group(s), " + format_bytes(sw->resident_bytes()) + " resident)");
    }
  } else {
    optimizer_ = optim::make_optimizer(config.optimizer, state_numel(), segments);
  }
  sync_->bind(*optimizer_);
  // Lamb's trust ratio is a tensor's: under tp a split tensor's sums of p^2 and u^2 are its pieces'
  // over the tp group (each piece's own ratio trained another model than one process, without a
  // word: stop 73). The sums travel as their bits (all_gather) and are added in rank order here.
  if (auto* lamb = dynamic_cast<optim::Lamb*>(optimizer_.get()); lamb != nullptr && ctx_->tp() > 1) {
    std::vector<size_t> split;
    for (size_t k = 0; k < segments.size(); ++k)
      if (const nn::Parameter* p = store.find(segments[k].name); p == nullptr || !p->tp_replicated()) split.push_back(k);
    comm::Backend* tp = ctx_->groups.tp.get();
    lamb->set_segment_sums([tp, split](std::vector<double>& w, std::vector<double>& u) {
      const size_t n = split.size(), ranks = static_cast<size_t>(tp->size());
      std::vector<double> mine(2 * n), all(2 * n * ranks);
      for (size_t i = 0; i < n; ++i) mine[2 * i] = w[split[i]], mine[2 * i + 1] = u[split[i]];
      static_assert(sizeof(double) == 2 * sizeof(float));
      tp->all_gather(all.data(), mine.data(), 4 * n, DType::kF32, comm::AllGatherOptions{})->wait();
      for (size_t i = 0; i < n; ++i) {
        double ws = 0.0, us = 0.0;
        for (size_t r = 0; r < ranks; ++r) ws += all[r * 2 * n + 2 * i], us += all[r * 2 * n + 2 * i + 1];
        w[split[i]] = ws, u[split[i]] = us;
      }
    });
  }
  store.zero_grad();
  // DeepSpeed's fp16 wrappers outside ZeRO (FP16_Optimizer, FP16_UnfusedOptimizer: fp16 at stage 0,
  // pipelines included) take one step of the optimizer with zero gradients as they are built
  // (initialize_optimizer_states), at the optimizer's own lr, before the scheduler sets one. The
  // step counts (the first real update's bias correction is step 2's: about 0.74 of Adam's first
  // update), and the weight decay applies once: AdamW's decoupled p(1 - lr wd), and Adam's L2 or
  // SGD's wd p an update of its own. ZeRO's stages and the bf16 wrapper take none; the 1-bit
  // optimizers keep their own account of DeepSpeed's first call (optim/onebit_adam.h).
  // Only the fp32 masters move: the wrappers step their fp32 groups and copy them to the fp16
  // weights at the first real step, so step 1's forward runs on the weights as built. (The
  // compute copy was written here too: invisible under AdamW's (1 - lr wd), a move of about lr
  // per weight under Adam's L2 decay, whose gradient is wd p; stop 77's review.)
  if (config.compute_dtype == DType::kF16 && z.stage == 0 && !optim::optimizer_is_onebit(config.optimizer) &&
      !optimizer_->state_swapped()) {
    optimizer_->step(sync_->master(), sync_->grad(), nullptr, sync_->compute_dtype(), static_cast<float>(config.optimizer.lr),
                     1.0f);
    sync_->after_update();
    store.zero_grad();
  }
  if (ctx_->pp() > 1) {
    pp_spec_ = engine_schedule_spec(config);
    parallel::pp::check_schedule_spec(pp_spec_, ctx_->groups.pp->max_msg_tag());
    schedule_ = parallel::pp::build_schedule(pp_spec_, ctx_->pp_rank());
    std::vector<std::vector<parallel::pp::Instr>> lists;
    for (int q = 0; q < ctx_->pp(); ++q)
      lists.push_back(q == ctx_->pp_rank() ? schedule_ : parallel::pp::build_schedule(pp_spec_, q));
    grad_plan_ = parallel::pp::executor_grad_plan(pp_spec_, lists, ctx_->pp_rank());
    MT_CHECK(model.slots() >= parallel::pp::max_in_flight(schedule_), ErrorKind::kInternal,
             "the model keeps fewer activation slots than the pipeline schedule needs");
  }
}

double Engine::grad_sum_squares() {
  double sq = 0.0;
  const float* g = grad();
  const parallel::ZeroRuntime* rt = sync_ ? sync_->zero() : nullptr;
  if (rt != nullptr && rt->swapped()) {  // the norms taken as the gradients went to disk
    for (double norm : rt->range_norms()) sq += norm * norm;
  } else {
    for (const auto& [off, n] : norm_ranges_) {
      double norm = optim::grad_norm(g + off, n);
      sq += norm * norm;
    }
  }
  float v = static_cast<float>(sq);
  comm::AllReduceOptions o;
  o.tag = "grad norm";
  o.timeout = timeout();
  if (sync_->sharded() && world() > 1) dp_->all_reduce(&v, 1, DType::kF32, o)->wait();  // each rank: its shard
  if (ctx_->tp() > 1) ctx_->groups.tp->all_reduce(&v, 1, DType::kF32, o)->wait();  // each rank: its tp shard
  if (ctx_->pp() > 1) ctx_->groups.pp->all_reduce(&v, 1, DType::kF32, o)->wait();  // each rank: its stage
  return static_cast<double>(v);
}

Engine::~Engine() = default;

void Engine::discard_swap_files() noexcept {
  if (optimizer_ && optimizer_->state_swapped()) static_cast<optim::SwappedAdamW*>(optimizer_.get())->discard_swap_files();
  if (sync_ && sync_->zero() != nullptr) sync_->zero()->discard_swap_files();
}

void Engine::settle() {
  if (optimizer_ && optimizer_->state_swapped()) static_cast<optim::SwappedAdamW*>(optimizer_.get())->wait();
}

// "name, element i" of the first value of this rank's span (the whole buffer, or its ZeRO shard,
// whose segments carry the names) of the gradients or the master weights that is not finite.
std::string Engine::first_nonfinite(bool weights) {
  std::vector<float> host;
  const float* v = weights ? master() : grad();
  size_t n = state_numel();
  if (device_) {
    host.resize(model_.store().numel());
    if (weights) device_->store_master(host.data());
    else device_->store_grads(host.data());
    v = host.data();
    n = host.size();
  }
  const auto all = engine_param_segments(config_, model_.store());
  if (v == nullptr && weights && state_swapped("master")) {
    // ZeRO-3 with the parameters on NVMe keeps no master in memory: read the shard back a chunk
    // at a time (the check said "" here, and NaN weights were saved as `latest`).
    std::vector<float> chunk(size_t{1} << 20);
    for (const optim::ParamSegment& s : sync_->span_segments(all))
      for (size_t at = s.offset; at < s.offset + s.numel; at += chunk.size()) {
        const size_t k = std::min(chunk.size(), s.offset + s.numel - at);
        read_span_state("master", at, k, chunk.data());
        for (size_t i = 0; i < k; ++i)
          if (!std::isfinite(chunk[i])) return s.name + ", element " + std::to_string(at + i - s.offset);
      }
    return "";
  }
  if (v == nullptr) return "";
  for (const optim::ParamSegment& s : sync_ ? sync_->span_segments(all) : all) {
    for (size_t i = s.offset; i < s.offset + s.numel && i < n; ++i)
      if (!std::isfinite(v[i])) return s.name + ", element " + std::to_string(i - s.offset);
  }
  return "";
}

std::string Engine::first_nonfinite_grad() { return first_nonfinite(false); }
std::string Engine::first_nonfinite_weight() { return first_nonfinite(true); }

float* Engine::master() const { return sync_ ? sync_->master() : model_.store().master(); }
float* Engine::grad() const { return sync_ ? sync_->grad() : model_.store().grad(); }
std::vector<optim::StateBuffer> Engine::rank_state() const {
  if (!sync_) return {};
  std::vector<optim::StateBuffer> s = sync_->rank_state();
  const std::vector<optim::StateBuffer> own = optimizer_->rank_local_state();
  if (s.empty() || own.empty()) return s;
  s.push_back({"local/master", master(), state_numel()});
  for (const optim::StateBuffer& b : own) s.push_back({"local/" + b.name, b.data, b.numel});
  return s;
}

void Engine::rank_state_loaded() {
  model_.store().sync_compute();
  sync_->after_update();
}

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
  MT_CHECK(ctx_->pp() == 1, ErrorKind::kInvalidArgument,
           "with parallel.pp > 1 the engine runs whole steps through its pipeline schedule: use train_batch");
  MT_CHECK(!pending_backward_, ErrorKind::kInvalidArgument, "forward() twice without backward()");
  Timer t;
  // DeepSpeed scales each micro-batch's loss by 1/gradient_accumulation_steps (and the loss scale)
  // and averages the gradients over the ranks; scaling by 1/(steps · ranks) and summing is the
  // same (and is exactly what one process does with the whole global batch).
  float scale = static_cast<float>(scaler_.scale() / static_cast<double>(config_.batch.gradient_accumulation_steps) *
                                   grad_average_factors().first);
  // Dropout's masks follow the sample's place in the global batch (rank R's micro-batch m holds
  // samples (R·gas + m)·B onwards, as train and classify read them).
  if (!device_)
    model_.set_dropout_origin(static_cast<uint64_t>(global_step_ + 1),
                              static_cast<uint64_t>((static_cast<int64_t>(ctx_->data_rank()) * config_.batch.gradient_accumulation_steps +
                                                     micro_in_step_) * model_.batch()));
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
    if (nccl_ && last) {  // the data-parallel sum, a range at a time as the backward finishes them
      device_->set_grad_ready([this](size_t offset, size_t count) {
        comm::AllReduceOptions o;
        o.tag = "grads";
        o.timeout = timeout();
        models::cuda_comm_waits_for_compute();
        grad_reductions_.push_back(nccl_->all_reduce(device_->grads_device() + offset, count, DType::kF32, o));
      });
    } else {
      device_->set_grad_ready({});
    }
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

namespace {

// x := x rounded to dtype (a 16-bit float) and back, in pieces.
void round_through(float* x, size_t n, DType dtype) {
  std::vector<uint16_t> tmp(std::min<size_t>(n, size_t{1} << 16));
  for (size_t i = 0; i < n; i += tmp.size()) {
    const size_t k = std::min(tmp.size(), n - i);
    convert(tmp.data(), dtype, x + i, DType::kF32, k);
    convert(x + i, DType::kF32, tmp.data(), dtype, k);
  }
}

}  // namespace

StepResult Engine::step() {
  MT_CHECK(micro_in_step_ > 0 && !pending_backward_, ErrorKind::kInvalidArgument,
           "step() needs forward() and backward() of at least one micro-batch first");
  Timer t;
  StepResult r;
  r.forward_seconds = forward_seconds_;
  r.backward_seconds = backward_seconds_;
  if (parallel::ZeroRuntime* rt = sync_ ? sync_->zero() : nullptr; rt != nullptr) r.param_swap = rt->take_swap_io_stats();
  r.pp_wait_seconds = pp_wait_seconds_;
  r.pp_stage_wait_seconds = std::move(pp_stage_wait_);
  r.pp_stage_compute_seconds = std::move(pp_stage_compute_);
  r.pp_schedule_seconds = pp_schedule_seconds_;
  r.pp_stage_peak_mib = std::move(pp_stage_peak_mib_);
  pp_stage_peak_mib_.clear();
  r.pp_stage_comm_peak_mib = std::move(pp_stage_comm_peak_mib_);
  pp_stage_comm_peak_mib_.clear();
  pp_stage_wait_.clear();
  pp_stage_compute_.clear();
  pp_wait_seconds_ = 0.0;
  r.tp_comm_bytes = model_.tp().bytes();
  r.tp_comm_seconds = model_.tp().seconds();
  model_.tp().reset_bytes();
  if (model_.options().documents.on() && model_.options().documents.attention) {
    // The step's attention pairs, summed over the data-parallel ranks in the loss's all-reduce (the
    // model counts them in training forwards; stage 0 of a pipeline holds them).
    float v[2] = {static_cast<float>(loss_sum_ / micro_in_step_), static_cast<float>(model_.take_attention_pairs())};
    if (world() > 1) {
      comm::AllReduceOptions o;
      o.op = comm::ReduceOp::kAvg;
      o.tag = "mean over ranks";
      o.timeout = timeout();
      dp_->all_reduce(v, 2, DType::kF32, o)->wait();
    }
    r.loss = v[0];
    r.attention_pairs = static_cast<double>(v[1]) * world();
  } else {
    r.loss = static_cast<float>(mean_over_ranks(loss_sum_ / micro_in_step_));
  }
  r.loss_scale = scaler_.scale();
  r.lr = current_lr();
  // A schedule whose lr leaves [0, FLT_MAX] would train by gradient ascent or with an infinite
  // rate (ds_config_check_schedule refuses such a run before it starts; this is the backstop).
  if (!(std::isfinite(r.lr) && r.lr >= 0.0 && r.lr <= std::numeric_limits<float>::max())) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", r.lr);
    throw Error(ErrorKind::kInvalidArgument, "step " + std::to_string(global_step_ + 1) + ": the scheduler's learning rate is " + buf +
                                                 ": it must be a non-negative number a float holds");
  }
  if (const double post = grad_average_factors().second; post != 1.0 && !device_) {
    float* g = grad();
    const float f = static_cast<float>(post);
    for (size_t i = 0, n = state_numel(); i < n; ++i) g[i] *= f;
  }
  if ((fault_active("engine.nonfinite_grad") || (fault_active("engine.nonfinite_grad_once") && global_step_ == 0)) && !device_ &&
      grad() != nullptr)
    grad()[state_numel() / 2] = INFINITY;
  double norm;
  if (device_ && nccl_) {  // the data-parallel sum (each micro-batch's loss was scaled by 1 / ranks)
    for (auto& w : grad_reductions_) w->wait();
    grad_reductions_.clear();
    models::cuda_compute_waits_for_comm();
  } else if (device_ && world() > 1) {  // comm_backend "mpi": through the host
    comm::AllReduceOptions o;
    o.tag = "grads";
    o.timeout = timeout();
    staged_grads_.resize(state_numel());
    device_->store_grads(staged_grads_.data());
    dp_->all_reduce(staged_grads_.data(), state_numel(), DType::kF32, o)->wait();
    device_->load_grads(staged_grads_.data());
  }
  if (device_) {
    norm = std::sqrt(device_->grad_sum_squares()) / r.loss_scale;
  } else if (sync_->sharded() || ctx_->tp() > 1 || ctx_->pp() > 1) {  // shards of the gradient: sum the squares over them
    norm = std::sqrt(grad_sum_squares()) / r.loss_scale;
  } else {
    norm = optim::grad_norm(grad(), state_numel()) / r.loss_scale;
  }
  r.grad_norm = norm;
  bool overflow = !std::isfinite(norm);
  // Each rank's own gradients (a 1-bit optimizer after its warm-up): the ranks agree on an overflow
  // (DeepSpeed's overflow check reduces over the ranks; the clipping norm stays local, as there).
  if (!device_ && sync_->grads_local() && world() > 1) {
    float f = overflow ? 1.0f : 0.0f;
    comm::AllReduceOptions o;
    o.op = comm::ReduceOp::kMax;
    o.tag = "overflow";
    o.timeout = timeout();
    dp_->all_reduce(&f, 1, DType::kF32, o)->wait();
    overflow = f != 0.0f;
  }
  // Without a loss scaler (fp32, bf16) a non-finite gradient is the run diverging: stop, naming the
  // step and the first parameter whose gradient is not finite.
  // bf16.check_grad_overflow: DeepSpeed's ZeRO optimizer skips such a step; so does this one.
  // A static fp16 scale: DeepSpeed's fp16 wrappers check for overflow whatever the scale and skip
  // the step ("Grad overflow on iteration N", "Using static loss scale of S"), and the next batch
  // trains; so does this one, with one line a skip. It stopped the run, and a resume read the same
  // batch and stopped again (stop 74, a probe). A run none of whose steps applies ends with exit 1.
  if (overflow && !scaler_.dynamic() && !config_.bf16_check_grad_overflow) {
    std::string where = first_nonfinite_grad();
    char scale[32];
    std::snprintf(scale, sizeof scale, "%g", static_cast<double>(r.loss_scale));
    if (config_.compute_dtype == DType::kF16) {
      // The scaled gradient passing fp16's 65504 is the likely cause, which neither the learning
      // rate nor clipping (applied after) changes.
      if (rank() == 0)
        log_warning("step " + std::to_string(global_step_ + 1) + ": the gradient overflows at the static fp16.loss_scale " +
                    scale + (where.empty() ? std::string() : " (first in " + where + ")") +
                    ": step skipped, as DeepSpeed skips it (a lower fp16.loss_scale, or 0 for dynamic scaling, avoids it)");
    } else {
      throw Error(ErrorKind::kNumerical, "step " + std::to_string(global_step_ + 1) + ": the gradient is not finite" +
                                             (where.empty() ? std::string() : " (first in " + where + ")") +
                                             "; without a dynamic fp16 loss scaler the step cannot be skipped and retried — "
                                             "lower the learning rate, enable gradient_clipping, or check the data");
    }
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
      // The CPU optimizer's parameters, bias_correction among them (built by hand, it was left
      // at true: a GPU run of bias_correction false trained another update without a word).
      const kernels::AdamWParams p =
          optim::adamw_step_params(adam->config(), static_cast<float>(r.lr), optimizer_->step_count(), static_cast<float>(coef));
      device_->adamw_step(segments_, p);
    } else {
      // 16-bit masters (fp16/bf16_master_weights_and_grads): the optimizer reads 16-bit gradients
      // (still scaled, as DeepSpeed's 16-bit gradient partition holds them) and 16-bit weights,
      // and its update is stored back at 16 bits. The buffers stay f32 holding those values.
      const DType md = config_.master_dtype;
      if (md != DType::kF32) {
        round_through(sync_->grad(), state_numel(), md);
        round_through(sync_->master(), state_numel(), md);
      }
      auto* sw = optimizer_->state_swapped() ? static_cast<optim::SwappedAdamW*>(optimizer_.get()) : nullptr;
      if (sw != nullptr) sw->wait();  // an asynchronous step before this one: done by now, its error here
      const optim::SwapStepStats before = sw != nullptr ? sw->last_step() : optim::SwapStepStats{};
      optimizer_->step(sync_->master(), sync_->grad(), sync_->compute(), sync_->compute_dtype(), static_cast<float>(r.lr),
                       static_cast<float>(coef));
      if (md != DType::kF32) round_through(sync_->master(), state_numel(), md);
      // An asynchronous swap reports the step before (this one runs beside the next forward).
      if (sw != nullptr) r.swap = sw->asynchronous() ? before : sw->last_step();
      sync_->after_update();
    }
    ++applied_steps_;
  }
  try {
    scaler_.update(overflow);  // throws at the minimum scale, as DeepSpeed does
  } catch (const Error& e) {  // which step, and where the gradient first overflows (as fp32 says it)
    const std::string where = first_nonfinite_grad();
    throw Error(e.kind(), "step " + std::to_string(global_step_ + 1) + ": " + e.what() +
                              (where.empty() ? std::string() : " (first in " + where + ")"));
  }
  ++global_step_;
  consumed_samples_ += config_.batch.train_batch_size;  // a skipped step consumed its batch too
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

void Engine::sum_counts_over_ranks(std::vector<double>* counts) {
  if (world() == 1 || counts->empty()) return;
  // Each digit sums exactly in f32 over up to 4096 ranks (4096 · 4095 < 2^24).
  std::vector<float> digits(counts->size() * 3);
  for (size_t i = 0; i < counts->size(); ++i) {
    const double v = (*counts)[i];
    MT_CHECK(v >= 0 && v < 68719476736.0 && v == std::floor(v), ErrorKind::kInternal, "a count to sum is not an integer below 2^36");
    const int64_t n = static_cast<int64_t>(v);
    digits[3 * i] = static_cast<float>(n >> 24);
    digits[3 * i + 1] = static_cast<float>((n >> 12) & 4095);
    digits[3 * i + 2] = static_cast<float>(n & 4095);
  }
  comm::AllReduceOptions o;
  o.tag = "sum of counts";
  o.timeout = timeout();
  dp_->all_reduce(digits.data(), digits.size(), DType::kF32, o)->wait();
  for (size_t i = 0; i < counts->size(); ++i)
    (*counts)[i] = std::ldexp(static_cast<double>(digits[3 * i]), 24) + std::ldexp(static_cast<double>(digits[3 * i + 1]), 12) +
                   static_cast<double>(digits[3 * i + 2]);
}

void Engine::gather_slots_over_ranks(std::vector<float>* slots) {
  if (world() == 1 || slots->empty()) return;
  comm::AllReduceOptions o;
  o.tag = "gather of slots";
  o.timeout = timeout();
  dp_->all_reduce(slots->data(), slots->size(), DType::kF32, o)->wait();
}

void Engine::set_step_tokens(const int32_t* targets, size_t micro_numel, int micro_batches) {
  model_.set_loss_denominator(0.0);
  if (config_.loss_normalization != "tokens") return;
  int64_t local = 0;
  for (size_t i = 0; i < micro_numel * static_cast<size_t>(micro_batches); ++i) local += targets[i] != -100;
  std::vector<double> counts{static_cast<double>(local)};
  sum_counts_over_ranks(&counts);
  // Ulysses: the ranks of an sp group read the same samples, each counting all their targets.
  const int64_t count = static_cast<int64_t>(counts[0]) / ctx_->sp();
  // Each micro-batch's scale carries 1/micro_batches and the ranks' average 1/W: dividing its
  // token losses by count / (micro_batches · W) makes the step's gradient their sum over count.
  const auto [pre, post] = grad_average_factors();
  if (count > 0) model_.set_loss_denominator(static_cast<double>(count) * pre * post / static_cast<double>(micro_batches));
}

StepResult Engine::train_batch(const MicroBatchFn& next) {
  // loss_normalization "tokens" sets the model's denominator for the step; evaluation divides by
  // its own count, whether the step returns or throws.
  struct ResetDenominator {
    models::TransformerLM& model;
    ~ResetDenominator() { model.set_loss_denominator(0.0); }
  } reset{model_};
  if (ctx_->pp() > 1) return train_pipeline(next);
  if (config_.loss_normalization == "tokens") {
    // The step's targets are counted over the data-parallel group before its first micro-batch.
    const int B = model_.batch();
    const int64_t T = config_.seq_length, gas = config_.batch.gradient_accumulation_steps;
    const size_t n = static_cast<size_t>(B) * static_cast<size_t>(T);
    std::vector<int32_t> tokens(n * static_cast<size_t>(gas)), targets(tokens.size());
    for (int64_t m = 0; m < gas; ++m) next(tokens.data() + m * n, targets.data() + m * n);
    set_step_tokens(targets.data(), n, static_cast<int>(gas));
    int64_t m = 0;
    const MicroBatchFn stored = [&](int32_t* tok, int32_t* tgt) {
      std::copy_n(tokens.data() + m * n, n, tok);
      std::copy_n(targets.data() + m * n, n, tgt);
      ++m;
    };
    return train_micro_batches(stored);
  }
  return train_micro_batches(next);
}

StepResult Engine::train_micro_batches(const MicroBatchFn& next) {
  const int B = model_.batch();
  const int64_t T = config_.seq_length;
  // curriculum_learning (seqlen): this step trains on the first L tokens of every sample (and
  // their targets), as Megatron-DeepSpeed truncates tokens[:, :L].
  const int64_t L = next_step_seq_length();
  step_seq_length_ = 0;
  if (L != model_.seq()) model_.prepare(B, static_cast<int>(L));
  std::vector<int32_t> tokens(static_cast<size_t>(B) * static_cast<size_t>(T)), targets(tokens.size());
  for (int64_t m = 0; m < config_.batch.gradient_accumulation_steps; ++m) {
    next(tokens.data(), targets.data());
    for (int b = 1; b < B && L != T; ++b) {
      std::copy_n(tokens.data() + b * T, L, tokens.data() + b * L);
      std::copy_n(targets.data() + b * T, L, targets.data() + b * L);
    }
    forward_backward(tokens.data(), targets.data());
  }
  StepResult r = step();
  r.seq_length = L;
  return r;
}

int64_t Engine::next_step_seq_length() {
  if (step_seq_length_ > 0) return step_seq_length_;
  if (!config_.curriculum.enabled) return config_.seq_length;
  if (!curriculum_) curriculum_ = std::make_unique<CurriculumSchedule>(config_.curriculum);
  return curriculum_->at(global_step_ + 1);
}

void Engine::prepare_next_step() {
  const int64_t L = next_step_seq_length();
  if (!device_ && L != model_.seq()) model_.prepare(model_.batch(), static_cast<int>(L), model_.slots());
}

float Engine::evaluate(const int32_t* tokens, const int32_t* targets) {
  if (device_) return device_->forward(tokens, targets, 0.0f);
  // Validation reads whole samples (a curriculum shortens training steps only).
  if (model_.seq() != config_.seq_length) model_.prepare(model_.batch(), static_cast<int>(config_.seq_length), model_.slots());
  if (ctx_->pp() == 1) return model_.forward(tokens, targets, 0.0f);
  return pipe_sum(pipeline_forward(tokens, targets), "pipeline eval loss");  // from the last stage
}

void Engine::set_step_seq_length(int64_t L) {
  MT_CHECK(L >= 1 && L <= config_.seq_length && !device_ && !config_.curriculum.enabled, ErrorKind::kInternal,
           "set_step_seq_length: " + std::to_string(L) + " outside [1, seq_length], on a device or with a curriculum");
  MT_CHECK(!ctx_->sequence_parallel || ctx_->tp() == 1 || model_.batch() * L % ctx_->tp() == 0, ErrorKind::kInternal,
           "set_step_seq_length: B x L does not divide over the tp group under sequence parallelism");
  step_seq_length_ = L;
}

void Engine::classifier_logits(float* out, const int32_t* tokens, int64_t L) {
  MT_CHECK(model_.config().num_labels > 0 && !device_, ErrorKind::kInternal, "classifier_logits: a sequence classifier on the CPU");
  if (L == 0) L = config_.seq_length;
  MT_CHECK(L >= 1 && L <= config_.seq_length, ErrorKind::kInternal, "classifier_logits: L outside [1, seq_length]");
  if (model_.seq() != L) model_.prepare(model_.batch(), static_cast<int>(L), model_.slots());
  if (ctx_->pp() == 1) return model_.logits(out, tokens);
  pipeline_forward(tokens, nullptr);
  const int P = ctx_->pp();
  if (ctx_->pp_rank() == P - 1) model_.head_logits(out);
  comm::BroadcastOptions o;
  o.root = P - 1;
  o.tag = "pipeline classifier logits";
  o.timeout = timeout();
  const size_t n = static_cast<size_t>(model_.batch()) * static_cast<size_t>(model_.seq()) * static_cast<size_t>(model_.config().num_labels);
  ctx_->groups.pp->broadcast(out, n, DType::kF32, o)->wait();
}

float Engine::pipeline_forward(const int32_t* tokens, const int32_t* targets) {
  // Through the virtual stages in order: receive, forward, send (slot 0; between steps).
  comm::Backend& pipe = *ctx_->groups.pp;
  const int P = ctx_->pp(), r = ctx_->pp_rank(), S = P * model_.chunks();
  const size_t E = model_.boundary_numel();
  float loss = 0.0f;
  for (int c = 0; c < model_.chunks(); ++c) {
    const int st = c * P + r;
    if (st > 0)
      pipe.recv(model_.chunk_input(0), E, DType::kF32, (st - 1) % P,
                p2p_options<comm::RecvOptions>("pipeline eval activation", parallel::pp::message_tag(pp_spec_, st - 1, 0, false), timeout()))
          ->wait();
    loss += model_.forward_chunk(c, 0, tokens, targets, 0.0f);
    if (st + 1 < S)
      pipe.send(model_.chunk_output(0), E, DType::kF32, (st + 1) % P,
                p2p_options<comm::SendOptions>("pipeline eval activation", parallel::pp::message_tag(pp_spec_, st, 0, false), timeout()))
          ->wait();
  }
  return loss;
}

float Engine::pipe_sum(float v, const char* tag) {
  comm::AllReduceOptions o;
  o.tag = tag;
  o.timeout = timeout();
  ctx_->groups.pp->all_reduce(&v, 1, DType::kF32, o)->wait();
  return v;
}

void Engine::sum_tied_embedding_grads() {
  // GPT-2's token table is the embedding on the first stage and the head on the last: each holds
  // a copy, whose gradients are summed (first + last on both, so the copies stay identical).
  if (!models::head_is_token_table(model_.config())) return;  // untied, or a classifier's score.weight
  const int P = ctx_->pp(), r = ctx_->pp_rank();
  if (r != 0 && r != P - 1) return;
  nn::Parameter* t = r == 0 ? model_.store().parameters().front() : model_.tied_head_copy();  // the token table
  MT_CHECK(t != nullptr && t->grad != nullptr, ErrorKind::kInternal, "the tied token table has no gradient here");
  const size_t n = static_cast<size_t>(t->numel());
  Buffer other_buffer(n * 4, MemCategory::kComm);
  float* other = other_buffer.as<float>();
  const char* tag = "pipeline tied embedding grad";
  comm::Backend& pipe = *ctx_->groups.pp;
  const int msg_tag = static_cast<int>(parallel::pp::step_tags(pp_spec_));  // past every step message's
  auto sent = pipe.send(t->grad, n, DType::kF32, r == 0 ? P - 1 : 0, p2p_options<comm::SendOptions>(tag, msg_tag, timeout()));
  pipe.recv(other, n, DType::kF32, r == 0 ? P - 1 : 0, p2p_options<comm::RecvOptions>(tag, msg_tag, timeout()))->wait();
  sent->wait();
  for (size_t i = 0; i < n; ++i) t->grad[i] = r == 0 ? t->grad[i] + other[i] : other[i] + t->grad[i];
}

StepResult Engine::train_pipeline(const MicroBatchFn& next) {
  MT_CHECK(micro_in_step_ == 0 && !pending_backward_, ErrorKind::kInvalidArgument,
           "train_batch in the middle of a step (forward/backward called before)");
  using parallel::pp::OpKind;
  const int m = pp_spec_.micro_batches, B = model_.batch();
  // Every micro-batch is filled seq_length wide, then cut to the step's length (set_step_seq_length,
  // or a curriculum's: every stage computes it from the step number, as DeepSpeed's PipelineEngine
  // resets its activation shape) in place: each row moves to an earlier place, so a forward copy
  // reads it before it is written.
  const size_t T = static_cast<size_t>(config_.seq_length), full = static_cast<size_t>(B) * T;
  const size_t L = static_cast<size_t>(next_step_seq_length());
  step_seq_length_ = 0;
  std::vector<int32_t> tokens(full * m), targets(full * m);
  for (int i = 0; i < m; ++i) next(tokens.data() + i * full, targets.data() + i * full);
  for (size_t r = 1; L != T && r < static_cast<size_t>(B) * m; ++r) {
    std::copy_n(tokens.data() + r * T, L, tokens.data() + r * L);
    std::copy_n(targets.data() + r * T, L, targets.data() + r * L);
  }
  if (static_cast<size_t>(model_.seq()) != L) model_.prepare(B, static_cast<int>(L), model_.slots());
  const size_t n = static_cast<size_t>(B) * L;
  set_step_tokens(targets.data(), n, m);  // loss_normalization "tokens": over the dp group (every stage counts alike)
  comm::Backend& pipe = *ctx_->groups.pp;
  const size_t E = model_.boundary_numel();
  const float scale = static_cast<float>(scaler_.scale() / static_cast<double>(m) * grad_average_factors().first);
  Timer schedule_time;
  {  // the executor's buffers are freed before the step's reductions
    std::map<std::pair<int, int>, int> slot_of;  // (chunk, micro) -> activation slot
    std::vector<int> free_slots;
    for (int s = model_.slots() - 1; s >= 0; --s) free_slots.push_back(s);
    std::vector<std::unique_ptr<comm::Work>> slot_send(model_.slots());  // a slot's activation, in flight
    // Gradients in flight to the previous stage, by list index, each in its own buffer until the
    // stage waits for it before its next gradient send, or a later message from the previous stage
    // proves it received (grad_plan_); then the buffer is reused.
    std::map<size_t, std::pair<Buffer, std::unique_ptr<comm::Work>>> grad_out;
    std::vector<Buffer> grad_free;
    Buffer grad_in(E * 4, MemCategory::kComm);
    auto slot = [&](const parallel::pp::Instr& i) {
      auto it = slot_of.find({i.chunk, i.micro});
      if (it != slot_of.end()) return it->second;
      MT_CHECK(!free_slots.empty(), ErrorKind::kInternal, "pipeline: no free activation slot");
      int s = free_slots.back();
      free_slots.pop_back();
      slot_of[{i.chunk, i.micro}] = s;
      return s;
    };
    auto tag = [](const parallel::pp::Instr& i, const char* what) {
      return std::string("pipeline ") + what + " micro-batch " + std::to_string(i.micro);
    };
    using comm::RecvOptions;
    using comm::SendOptions;
    auto reuse = [&](int sent) {
      auto it = grad_out.find(static_cast<size_t>(sent));
      MT_CHECK(it != grad_out.end(), ErrorKind::kInternal, "pipeline: a gradient send released twice");
      Timer w;
      it->second.second->wait();
      pp_wait_seconds_ += w.seconds();
      grad_free.push_back(std::move(it->second.first));
      grad_out.erase(it);
    };
    // A send still in flight may move only while this rank is inside MPI (DESIGN-NOTES 45): each
    // compute op starts with a look at every one, which moves them as far as their receivers allow.
    auto poke_sends = [&] {
      for (auto& w : slot_send)
        if (w) w->is_completed();
      for (auto& [sent_at, g] : grad_out) g.second->is_completed();
    };
    for (size_t at = 0; at < schedule_.size(); ++at) {
      const parallel::pp::Instr& i = schedule_[at];
      for (int sent : grad_plan_.wait_before[at]) reuse(sent);  // may block until the previous stage receives it
      if (i.kind == OpKind::kForward || i.kind == OpKind::kBackward) poke_sends();
      switch (i.kind) {
        case OpKind::kRecvActivation: {
          Timer w;
          pipe.recv(model_.chunk_input(slot(i)), E, DType::kF32, i.peer, p2p_options<RecvOptions>(tag(i, "activation"), i.tag, timeout()))
              ->wait();
          pp_wait_seconds_ += w.seconds();
          break;
        }
        case OpKind::kForward: {
          Timer t;
          const int32_t* tok = tokens.data() + static_cast<size_t>(i.micro) * n;
          const int32_t* tgt = targets.data() + static_cast<size_t>(i.micro) * n;
          model_.set_dropout_origin(static_cast<uint64_t>(global_step_ + 1),
                                    static_cast<uint64_t>((static_cast<int64_t>(ctx_->data_rank()) * m + i.micro) * model_.batch()));
          float loss = model_.forward_chunk(i.chunk, slot(i), tok, tgt, scale);
          if (model_.chunk_has_head(i.chunk)) loss_sum_ += loss;
          forward_seconds_ += t.seconds();
          break;
        }
        case OpKind::kSendActivation: {
          const int s = slot(i);
          slot_send[s] = pipe.send(model_.chunk_output(s), E, DType::kF32, i.peer,
                                   p2p_options<SendOptions>(tag(i, "activation"), i.tag, timeout()));
          Timer d;
          comm::drive(*slot_send[s], comm::send_drive_budget(E * 4));  // to a stage that already waits
          pp_wait_seconds_ += d.seconds();
          break;
        }
        case OpKind::kRecvGrad: {
          Timer w;
          pipe.recv(grad_in.data(), E, DType::kF32, i.peer, p2p_options<RecvOptions>(tag(i, "gradient"), i.tag, timeout()))->wait();
          pp_wait_seconds_ += w.seconds();
          break;
        }
        case OpKind::kBackward: {
          Timer t;
          const int s = slot(i);
          if (sync_) sync_->begin_backward(false);  // reduced once, after the schedule
          model_.backward_chunk(i.chunk, s, model_.chunk_has_head(i.chunk) ? nullptr : grad_in.as<float>());
          if (sync_) sync_->end_backward(false);
          backward_seconds_ += t.seconds();
          if (slot_send[s]) {  // the next stage has received it: it sent this backward's gradient
            Timer w;
            slot_send[s]->wait();
            pp_wait_seconds_ += w.seconds();
            slot_send[s].reset();
          }
          slot_of.erase({i.chunk, i.micro});
          free_slots.push_back(s);
          ++micro_in_step_;
          break;
        }
        case OpKind::kSendGrad: {
          Buffer b;
          if (grad_free.empty()) {
            b = Buffer::uninitialized(E * 4, MemCategory::kComm);
          } else {
            b = std::move(grad_free.back());
            grad_free.pop_back();
          }
          std::memcpy(b.data(), model_.input_grad(), E * 4);
          auto w = pipe.send(b.data(), E, DType::kF32, i.peer, p2p_options<SendOptions>(tag(i, "gradient"), i.tag, timeout()));
          Timer d;
          comm::drive(*w, comm::send_drive_budget(E * 4));  // to a stage that already waits
          pp_wait_seconds_ += d.seconds();
          grad_out.emplace(at, std::make_pair(std::move(b), std::move(w)));
          break;
        }
      }
      for (int sent : grad_plan_.release_after[at]) reuse(sent);  // received by now: the wait returns at once
    }
    {
      Timer w;
      for (auto& [at, g] : grad_out) g.second->wait();
      pp_wait_seconds_ += w.seconds();
    }
  }
  micro_in_step_ = m;
  // The loss lives on the last stage: every rank gets it (and a non-finite one stops every rank).
  loss_sum_ = pipe_sum(static_cast<float>(loss_sum_), "pipeline loss");
  MT_CHECK(std::isfinite(loss_sum_), ErrorKind::kNumerical,
           "loss is " + std::to_string(loss_sum_ / m) + " at step " + std::to_string(global_step_ + 1) + " (pipeline)");
  {  // every stage's wait and compute time, schedule time, peak and comm peak, for the step's report
    // MiB (a float holds them exactly to 16 TiB)
    const MemStats ms = memory_stats();
    const double peak_mib = static_cast<double>(ms.total_peak) / 1048576.0;
    const double comm_mib = static_cast<double>(ms.peak[static_cast<size_t>(MemCategory::kComm)]) / 1048576.0;
    constexpr size_t kF = 5;
    float mine[kF] = {static_cast<float>(pp_wait_seconds_), static_cast<float>(forward_seconds_ + backward_seconds_),
                      static_cast<float>(schedule_time.seconds()), static_cast<float>(peak_mib), static_cast<float>(comm_mib)};
    std::vector<float> all(kF * static_cast<size_t>(ctx_->pp()));
    comm::AllGatherOptions o;
    o.tag = "pipeline stage times";
    o.timeout = timeout();
    pipe.all_gather(all.data(), mine, kF, DType::kF32, o)->wait();
    pp_stage_wait_.clear();
    pp_stage_compute_.clear();
    pp_stage_peak_mib_.clear();
    pp_stage_comm_peak_mib_.clear();
    pp_schedule_seconds_ = 0.0;
    for (size_t q = 0; q < static_cast<size_t>(ctx_->pp()); ++q) {
      pp_stage_wait_.push_back(all[kF * q]);
      pp_stage_compute_.push_back(all[kF * q + 1]);
      pp_schedule_seconds_ = std::max(pp_schedule_seconds_, static_cast<double>(all[kF * q + 2]));
      pp_stage_peak_mib_.push_back(all[kF * q + 3]);
      pp_stage_comm_peak_mib_.push_back(all[kF * q + 4]);
    }
  }
  Timer t;
  sum_tied_embedding_grads();
  if (sync_) {  // the data-parallel reduction of the whole step's gradients
    sync_->begin_backward(true);
    sync_->end_backward(true);
  }
  backward_seconds_ += t.seconds();
  StepResult r = step();
  r.seq_length = static_cast<int64_t>(L);
  return r;
}

std::pair<double, double> Engine::grad_average_factors() const {
  // Over the data-parallel replicas: the sp ranks of one hold parts of the same samples' gradient,
  // which the reduction over dp x sp sums (each rank's loss is its tokens' share of the sample's
  // mean, models/transformer.h).
  const double W = static_cast<double>(data_ranks()), f = config_.gradient_predivide_factor;
  if (data_ranks() == 1) return {1.0, 1.0};
  if (config_.prescale_gradients || f == 1.0) return {1.0 / W, 1.0};
  return {1.0 / f, f / W};
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
  if ((tp == 1 && ctx_->pp() == 1) || !lead_dp) return local;  // the local layout is the one-process layout
  // The tp group of dp rank 0 gathers its shards on tp rank 0, which puts each parameter together.
  const bool lead = ctx_->tp_rank() == 0;
  std::vector<float> all;
  if (tp > 1) {
    all.resize(lead ? P * static_cast<size_t>(tp) : 0);
    comm::GatherOptions o;
    o.tag = "checkpoint tp shards";
    o.timeout = timeout();
    ctx_->groups.tp->gather(lead ? all.data() : nullptr, local.data(), P, DType::kF32, o)->wait();
  } else {
    all = std::move(local);
  }
  if (!lead) return {};
  std::vector<float> full(store.global_numel());
  const nn::Parameter* tied_copy = model_.tied_head_copy();
  for (int r = 0; r < tp; ++r)
    for (const nn::Parameter* p : store.parameters())
      if (p != tied_copy)  // the first stage's copy is the one written
        nn::tp_insert(full.data() + p->global_offset, all.data() + static_cast<size_t>(r) * P + p->offset, p->global_shape,
                      p->split, nn::TpPlace{r, tp});
  if (ctx_->pp() > 1) {
    // Each stage's lead (dp 0, tp 0) holds its parameters in place and zeros elsewhere: their sum
    // on the first stage's lead (world rank 0) is the whole model, exactly.
    // NOTE: a temporary of the whole model on each stage lead; sharded checkpoints will not need it.
    comm::ReduceOptions o;
    o.root = 0;
    o.tag = "checkpoint pipeline stages";
    o.timeout = timeout();
    ctx_->groups.pp->reduce(full.data(), full.size(), DType::kF32, o)->wait();
    if (ctx_->pp_rank() != 0) return {};
  }
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
  std::vector<float> scratch;
  flat = to_one_process(span_state("master", scratch));
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
      std::vector<float> scratch;
      v = to_one_process(span_state(b.name, scratch));
      if (rank() != 0) v.clear();
    }
    out.emplace_back(b.name, std::move(v));
  }
  return out;
}

void Engine::load_master(const float* flat) { load_local_state("master", from_one_process(flat).data()); }

void Engine::load_optimizer_state(const std::string& name, const float* flat) {
  load_local_state(name, from_one_process(flat).data());
}

std::vector<Engine::SpanRun> Engine::span_runs() const {
  const parallel::ZeroRuntime* z = zero();
  if (!z) return {SpanRun{0, model_.store().numel(), 0}};
  std::vector<SpanRun> runs;
  const parallel::ZeroPartition& part = z->partition();
  for (size_t u = 0; u < part.units().size(); ++u)
    if (part.piece_end(u) > part.piece_begin(u)) runs.push_back({part.piece_begin(u), part.piece_end(u), part.shard_offset(u)});
  return runs;
}

std::vector<std::string> Engine::state_names() const {
  std::vector<std::string> names{"master"};
  for (const optim::StateBuffer& b : optimizer_->state()) names.push_back(b.name);
  return names;
}

const float* Engine::span_state(const std::string& name, std::vector<float>& scratch) {
  if (name == "master") {
    if (const parallel::ZeroRuntime* rt = sync_ ? sync_->zero() : nullptr; rt != nullptr && rt->swapped()) {
      scratch.assign(state_numel(), 0.0f);
      rt->read_master(scratch.data());
      return scratch.data();
    }
    if (!device_) return master();
    scratch.assign(model_.store().numel(), 0.0f);
    device_->store_master(scratch.data());
    return scratch.data();
  }
  for (const optim::StateBuffer& b : optimizer_->state()) {
    if (b.name != name) continue;
    if (!device_ && optimizer_->state_swapped()) {  // one buffer read back from the swap
      scratch.assign(state_numel(), 0.0f);
      optimizer_->read_state(name, scratch.data());
      return scratch.data();
    }
    if (!device_) return b.data;
    scratch.assign(model_.store().numel(), 0.0f);
    device_->store_state(b.name, scratch.data());
    return scratch.data();
  }
  throw Error(ErrorKind::kInvalidArgument, "optimizer " + std::string(optimizer_->type_name()) + " has no state '" + name + "'");
}

namespace {
Engine::FlatFill local_fill(const float* local) {
  return [local](size_t begin, size_t n, float* dst) { std::memcpy(dst, local + begin, n * sizeof(float)); };
}
}  // namespace

std::function<void(size_t, size_t, float*)> Engine::span_from_flat(FlatFill flat) const {
  // The ZeRO partition's map of this rank's shard onto the local flat buffer: padding is zero.
  const parallel::ZeroPartition& part = sync_->zero()->partition();
  return [&part, flat = std::move(flat)](size_t begin, size_t n, float* dst) {
    std::fill(dst, dst + n, 0.0f);
    const size_t end = begin + n;
    for (size_t u = 0; u < part.units().size(); ++u) {
      const size_t lo = part.shard_offset(u), real = part.piece_end(u) - part.piece_begin(u);
      const size_t a = std::max(begin, lo), b = std::min(end, lo + real);
      if (a < b) flat(part.piece_begin(u) + (a - lo), b - a, dst + (a - begin));
    }
  };
}

void Engine::load_swapped_state(const std::string& name, const FlatFill& flat) {
  MT_CHECK(state_swapped(name) && sync_->zero() != nullptr, ErrorKind::kInternal,
           "load_swapped_state: " + name + " is not swapped");
  if (name == "master") sync_->zero()->write_master_from(span_from_flat(flat));
  else static_cast<optim::SwappedAdamW*>(optimizer_.get())->write_state_from(name, span_from_flat(flat));
}

bool Engine::state_swapped(const std::string& name) const {
  if (device_ || !sync_) return false;
  if (name == "master") {
    const parallel::ZeroRuntime* rt = sync_->zero();
    return rt != nullptr && rt->swapped();
  }
  return optimizer_->state_swapped();
}

void Engine::read_span_state(const std::string& name, size_t begin, size_t n, float* dst) {
  MT_CHECK(state_swapped(name), ErrorKind::kInternal, "read_span_state: " + name + " is not swapped");
  if (name == "master") sync_->zero()->read_master_range(begin, n, dst);
  else static_cast<optim::SwappedAdamW*>(optimizer_.get())->read_state_range(name, begin, n, dst);
}

void Engine::load_local_state(const std::string& name, const float* local) {
  if (name == "master") {
    if (device_) {
      nn::ParamStore& store = model_.store();
      std::copy(local, local + store.numel(), store.master());
      store.sync_compute();
      device_->load_master(local);
      return;
    }
    if (state_swapped(name)) {
      load_swapped_state(name, local_fill(local));  // piece by piece, never the whole span
    } else {
      sync_->scatter(master(), local);
    }
    sync_->after_update();
    return;
  }
  for (const optim::StateBuffer& b : optimizer_->state()) {
    if (b.name != name) continue;
    if (device_) {
      device_->load_state(name, local);
    } else if (optimizer_->state_swapped()) {
      load_swapped_state(name, local_fill(local));
    } else {
      sync_->scatter(b.data, local);
    }
    return;
  }
  throw Error(ErrorKind::kInvalidArgument, "optimizer " + std::string(optimizer_->type_name()) + " has no state '" + name + "'");
}

}  // namespace mt::engine
