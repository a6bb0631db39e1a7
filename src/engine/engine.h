// Engine: DeepSpeed's training contract over one model — initialize(config, model), then per
// micro-batch forward_backward(), and step() once per gradient_accumulation_steps micro-batches
// (train_batch() does both). Mixed precision: bf16/f16 compute with f32 master weights and f32
// gradient accumulation; f16 uses DeepSpeed's dynamic loss scaler (skip the step on overflow).
// Clipping by global norm; LR schedules as DeepSpeed defines them, stepped only on applied steps.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "comm/backend.h"
#include "io/aio.h"
#include "engine/ds_config.h"
#include "parallel/grad_sync.h"
#include "models/device_lm.h"
#include "models/transformer.h"
#include "optim/adamw.h"  // grad_norm
#include "optim/optimizer.h"
#include "optim/swapped_adamw.h"
#include "optim/loss_scaler.h"
#include "parallel/context.h"
#include "parallel/pp/schedule.h"

namespace mt::engine {

struct StepResult {
  float loss = 0.0f;          // mean over the micro-batches of this step
  double grad_norm = 0.0;     // unscaled, before clipping (NaN/inf on overflow)
  double lr = 0.0;            // the learning rate this step used
  double loss_scale = 1.0;    // the scale this step's gradients carried
  bool skipped = false;       // f16 overflow: no update
  // data.reset_attention_mask: the (query, key) pairs the step's attention computed, summed over its
  // micro-batches and the data-parallel ranks (causal: T(T+1)/2 a sample); -1 without documents.
  double attention_pairs = -1.0;
  // Wall-clock seconds of this step's parts (DeepSpeed's wall_clock_breakdown): forward and
  // backward summed over its micro-batches, and the optimizer step (norm, clip, update).
  double forward_seconds = 0.0, backward_seconds = 0.0, step_seconds = 0.0;
  // Tensor parallelism: bytes this rank handed to the tp collectives this step, and the wall time
  // spent in them (waiting for the peers included).
  size_t tp_comm_bytes = 0;
  double tp_comm_seconds = 0.0;
  // Pipeline parallelism: the time this rank waited on its stage neighbours this step (blocked in
  // a receive or on a send's completion): its share of the step is the measured bubble.
  double pp_wait_seconds = 0.0;
  // Every pipeline stage's wait and compute (forward + backward) seconds this step, by pp rank:
  // a slower stage makes the others wait beyond the schedule's bubble.
  std::vector<double> pp_stage_wait_seconds, pp_stage_compute_seconds;
  // The schedule's wall time (the longest stage's: the first, which runs the last backward):
  // 1 - compute / this is a stage's idle share, the measured bubble.
  double pp_schedule_seconds = 0.0;
  // Tokens per sample this step trained on: seq_length, or the curriculum's difficulty.
  int64_t seq_length = 0;
  // Every stage's accounted peak (all categories, since the last reset_memory_peaks), MiB, at the
  // end of its schedule: stages hold different layers, slots and buffers.
  std::vector<double> pp_stage_peak_mib;
  std::vector<double> pp_stage_comm_peak_mib;  // the same for the comm category alone
  // offload_optimizer "nvme": this step's swap (optim/swapped_adamw.h). The optimizer's seconds
  // split into the update's compute and its waits on the disk; the I/O threads' read and write
  // seconds and bytes (their overlap with compute is read + write − wait).
  optim::SwapStepStats swap;
  // offload_param "nvme": the forward and backward passes' parameter and gradient traffic (piece
  // reads for the gathers, gradient records) and the seconds they blocked on it.
  io::AsyncIo::Stats param_swap;
};

class Engine {
 public:
  // ctx: the layout (the model must have been built with the same one). Its data-parallel size must
  // be config.world_size. With zero_optimization.stage >= 1 the engine partitions the model's
  // (tensor-parallel shard's) state across the dp group and the ParamStore buffers are released.
  Engine(const RunConfig& config, models::TransformerLM& model, std::shared_ptr<parallel::ParallelContext> ctx);
  // Data parallelism only: dp is the data-parallel group (null: one process).
  Engine(const RunConfig& config, models::TransformerLM& model, std::shared_ptr<comm::Backend> dp = nullptr);
  ~Engine();

  // One micro-batch (B = train_micro_batch_size_per_gpu, T = seq_length), DeepSpeed's
  //   loss = engine(batch); engine.backward(loss); ... engine.step();
  // forward returns the mean loss and prepares backward (throws kNumerical on a NaN/inf loss);
  // backward accumulates the gradients. forward_backward does both.
  float forward(const int32_t* tokens, const int32_t* targets);
  void backward();
  float forward_backward(const int32_t* tokens, const int32_t* targets);
  // Waits for what the last step() left running (ZeRO-Infinity's optimizer swap steps beside the
  // next forward) and throws its error: call it when training ends, before reporting success.
  void settle();
  // After gradient_accumulation_steps micro-batches: overflow check, unscale, clip, update.
  StepResult step();
  // A whole global batch: next(tokens, targets) fills each micro-batch. With pipeline parallelism
  // (parallel.pp > 1) this is the only way to train (as DeepSpeed's PipelineEngine): every stage
  // reads the step's micro-batches and runs its schedule's instructions (parallel/pp/schedule.h).
  using MicroBatchFn = std::function<void(int32_t* tokens, int32_t* targets)>;
  StepResult train_batch(const MicroBatchFn& next);
  // The next train_batch trains on the first L positions of every sample: next() still fills
  // seq_length-wide rows, which are cut to L (a classifier's step at its longest record, as
  // Hugging Face pads to the longest in the batch; causal attention makes the positions before L
  // what they are in the whole row). 1 <= L <= seq_length; under sequence parallelism B·L must
  // divide over the tp group. Not with curriculum_learning (which sets the length itself) or on a
  // device.
  void set_step_seq_length(int64_t L);
  // loss_normalization "tokens": counts the step's targets (micro_batches of micro_numel) over the
  // data-parallel group and sets the model's loss denominator for the step; otherwise clears it.
  void set_step_tokens(const int32_t* targets, size_t micro_numel, int micro_batches);
  // counts[i] := their sum over the data-parallel ranks, exactly (non-negative integers below 2^36:
  // three base-2^12 digits each in one f32 all-reduce).
  void sum_counts_over_ranks(std::vector<double>* counts);
  // slots[i] := the one value a data-parallel rank wrote there, on every rank (the others hold 0
  // there: an f32 sum, exact), so each rank ends with what all of them computed.
  void gather_slots_over_ranks(std::vector<float>* slots);
  // Mean loss of a micro-batch without touching gradients (through every stage of a pipeline:
  // collective over the pp group, every stage gets the loss).
  float evaluate(const int32_t* tokens, const int32_t* targets);
  // The next step's sequence length (a curriculum's, or set_step_seq_length's; else seq_length),
  // and the model prepared for it: the flops profiler attaches to that step's shapes (it counted
  // the step before's length under a curriculum, stop 74).
  int64_t next_step_seq_length();
  void prepare_next_step();
  // A sequence classifier's logits (B, T, num_labels) of a micro-batch of the prepared shape, on
  // every rank (through every stage of a pipeline, whose last stage broadcasts them: collective
  // over the pp group).
  // L (0: seq_length): the rows' length, tokens (B, L) and out (B, L, num_labels).
  void classifier_logits(float* out, const int32_t* tokens, int64_t L = 0);
  // The pipeline schedule of this rank (empty without pipeline parallelism).
  const std::vector<parallel::pp::Instr>& schedule() const { return schedule_; }

  int64_t global_step() const { return global_step_; }
  int64_t applied_steps() const { return applied_steps_; }
  double current_lr() const;
  const RunConfig& config() const { return config_; }
  int world() const { return dp_->size(); }       // data-parallel ranks (dp x sp: the gradient's group)
  int data_ranks() const { return world() / ctx_->sp(); }  // ... of them reading different samples
  // DeepSpeed's gradient averaging over the dp ranks (prescale_gradients, gradient_predivide_factor):
  // the factor the micro-batch losses carry into backward (before the all-reduce) and the one the
  // reduced gradients get after it. Default and prescale: 1/dp before, 1 after (DeepSpeed's
  // default divides after; for a power-of-two dp size the results are the same bits). A predivide
  // factor f: 1/f before, f/dp after. One rank: 1 and 1.
  std::pair<double, double> grad_average_factors() const;
  int rank() const { return ctx_->rank(); }        // in the whole job (0 writes checkpoints)
  const parallel::ParallelContext& parallel() const { return *ctx_; }
  comm::Backend* dp() const { return dp_.get(); }
  const parallel::ZeroRuntime* zero() const { return sync_ ? sync_->zero() : nullptr; }
  const parallel::GradSync* grad_sync() const { return sync_.get(); }
  // Mean of a value over the data-parallel ranks (collective; the value itself on one process).
  double mean_over_ranks(double value);

  // The whole state as one process holds it (nn::ParamStore::global_numel() elements, each
  // parameter whole at its global_offset), for checkpoints and export: collectives when ZeRO or
  // tensor parallelism divides it; every rank calls them. gather_master fills flat on rank 0 only;
  // gather_optimizer_state returns each state buffer in full on rank 0 (empty elsewhere).
  void gather_master(std::vector<float>& flat);
  std::vector<std::pair<std::string, std::vector<float>>> gather_optimizer_state();
  // Every rank passes the full buffers (one-process layout, read from a checkpoint): each keeps its part.
  void load_master(const float* flat);
  void load_optimizer_state(const std::string& name, const float* flat);

  // Sharded checkpoints (engine/checkpoint_io.h), without gathering: the runs of the local flat
  // layout (nn::Parameter::offset) that this rank's span holds, [flat_begin, flat_end) at
  // span_begin (its ZeRO pieces, or the whole local buffer).
  struct SpanRun {
    size_t flat_begin = 0, flat_end = 0, span_begin = 0;
  };
  std::vector<SpanRun> span_runs() const;
  // Whether the other data-parallel ranks hold the same span (no ZeRO partition).
  bool span_replicated() const { return !(sync_ && sync_->sharded()); }
  // The names of the state a checkpoint holds: "master", then the optimizer's state() buffers.
  std::vector<std::string> state_names() const;
  // State only this rank holds (a 1-bit optimizer's error-feedback buffers; with 0/1 Adam also the
  // parameters, momentum and accumulated updates of its local steps): saved per rank.
  std::vector<optim::StateBuffer> rank_state() const;
  // After rank_state() was written into: the parameters as the next forward reads them.
  void rank_state_loaded();
  // One of them as this rank's span (state_numel() elements); with a device, copied into scratch.
  const float* span_state(const std::string& name, std::vector<float>& scratch);
  // ZeRO-Infinity: whether state `name` lives on disk (then span_state stages it whole; a
  // checkpoint reads it in parts with read_span_state instead).
  bool state_swapped(const std::string& name) const;
  // Elements [begin, begin + n) of state `name` over this rank's span, read from the swap.
  void read_span_state(const std::string& name, size_t begin, size_t n, float* dst);
  // fill(begin, n, dst): elements [begin, begin + n) of the local flat buffer (store.numel()).
  using FlatFill = std::function<void(size_t, size_t, float*)>;
  // Span elements [begin, begin + n) from the local flat buffer given by flat (ZeRO: this rank's
  // pieces of it, in flat order; padding is zero).
  std::function<void(size_t, size_t, float*)> span_from_flat(FlatFill flat) const;
  // local: the whole local flat buffer (store.numel()), correct at least on this rank's span runs:
  // each rank keeps its span. "master" refreshes the parameters (collective under ZeRO).
  void load_local_state(const std::string& name, const float* local);
  // A swapped state (state_swapped(name)) written to the swap piece by piece from flat, asked for
  // this rank's span runs in increasing order, never the whole buffer at once. "master" then needs
  // refresh_params() (collective; called apart so that ranks can agree on a failed read first).
  void load_swapped_state(const std::string& name, const FlatFill& flat);
  void refresh_params() { sync_->after_update(); }
  models::TransformerLM& model() { return model_; }
  // The model's step on an accelerator (config.device "cuda"), else null.
  models::DeviceLM* device() const { return device_.get(); }
  // Accounted memory of where the step runs: the GPU's allocator with a device, else the host's.
  MemStats memory_stats() const;
  void reset_memory_peaks();
  // A start that failed (here, or the resume after): the NVMe swap files already made are removed,
  // as their reserved space counted against the next run on that filesystem (stop 73's note). Never throws.
  void discard_swap_files() noexcept;
  optim::Optimizer& optimizer() { return *optimizer_; }
  optim::LossScaler& loss_scaler() { return scaler_; }
  // Restores the counters of a checkpoint.
  void set_counters(int64_t global_step, int64_t applied_steps) {
    global_step_ = global_step;
    applied_steps_ = applied_steps;
    consumed_samples_ = global_step * config_.batch.train_batch_size;
  }
  // The training samples the steps so far consumed (Megatron's consumed_train_samples): the next
  // step's global batch starts here. A checkpoint keeps it, so a run resumed with another batch
  // size goes on from where the data stopped, not from step × the new batch.
  int64_t consumed_samples() const { return consumed_samples_; }
  void set_consumed_samples(int64_t n) { consumed_samples_ = n; }
  // Megatron's consumed_valid_samples (sample_order "megatron"): the validation samples the run's
  // evaluations have read, saved in checkpoints so a resumed run reads on from them; -1 before the
  // first evaluation of a run not resumed from one that counted.
  int64_t consumed_valid_samples() const { return consumed_valid_samples_; }
  void set_consumed_valid_samples(int64_t n) { consumed_valid_samples_ = n; }

  // "name, element i" of the first weight this rank updates (its master span) that is not finite,
  // or "" ("" too where the weights are on NVMe): checkpoint_save refuses such weights.
  std::string first_nonfinite_weight();

 private:
  float* master() const;
  float* grad() const;
  std::string first_nonfinite_grad();  // "name, element i" of this rank's span, or ""
  std::string first_nonfinite(bool weights);
  std::chrono::milliseconds timeout() const;
  size_t state_numel() const;  // elements of the optimizer's span (shard or whole)
  // This rank's span (the local flat buffer, or its ZeRO shard) in the one-process layout on rank 0.
  std::vector<float> to_one_process(const float* span);
  std::vector<float> from_one_process(const float* full) const;  // -> the local flat layout
  double grad_sum_squares();  // over the whole model: dp, tp and pp shards summed, replicas once
  StepResult train_pipeline(const MicroBatchFn& next);  // parallel.pp > 1
  StepResult train_micro_batches(const MicroBatchFn& next);  // train_batch's micro-batches, one at a time
  void sum_tied_embedding_grads();  // first and last pipeline stage of a tied GPT-2
  float pipe_sum(float v, const char* tag);  // sum over the pp group
  // evaluate()'s pass through this rank's chunks in stage order (slot 0): the loss on the last
  // stage, 0 on the others.
  float pipeline_forward(const int32_t* tokens, const int32_t* targets);

  RunConfig config_;
  models::TransformerLM& model_;
  std::shared_ptr<parallel::ParallelContext> ctx_;
  std::shared_ptr<comm::Backend> dp_;
  // Ranges of the optimizer's span that this rank counts in the gradient norm (parameters
  // replicated over the tp group are counted by tp rank 0 only).
  std::vector<std::pair<size_t, size_t>> norm_ranges_;
  std::unique_ptr<parallel::GradSync> sync_;  // null with a device (the device steps itself)
  std::unique_ptr<models::DeviceLM> device_;        // config.device "cuda"
  std::shared_ptr<comm::Backend> nccl_;             // comm_backend "nccl": the dp group on the GPUs
  std::vector<float> staged_grads_;                 // device "cuda" over MPI: the gradients on the host
  std::vector<std::unique_ptr<comm::Work>> grad_reductions_;  // NCCL: the step's gradient all-reduces in flight
  std::vector<optim::ParamSegment> segments_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  optim::LossScaler scaler_;
  int64_t global_step_ = 0, applied_steps_ = 0;
  int64_t consumed_samples_ = 0;
  int64_t consumed_valid_samples_ = -1;
  std::unique_ptr<CurriculumSchedule> curriculum_;  // curriculum_learning (null: off)
  int64_t step_seq_length_ = 0;  // set_step_seq_length for the next train_batch (0: seq_length)
  int micro_in_step_ = 0;
  bool pending_backward_ = false;
  double loss_sum_ = 0.0;
  double forward_seconds_ = 0.0, backward_seconds_ = 0.0, pp_wait_seconds_ = 0.0;
  std::vector<double> pp_stage_wait_, pp_stage_compute_;
  double pp_schedule_seconds_ = 0.0;
  std::vector<double> pp_stage_peak_mib_;
  std::vector<double> pp_stage_comm_peak_mib_;
  parallel::pp::ScheduleSpec pp_spec_;
  std::vector<parallel::pp::Instr> schedule_;
  parallel::pp::GradSendPlan grad_plan_;  // parallel::pp::executor_grad_plan of schedule_
};

// The optimizer's segments: one per parameter, weight decay 0 where config.no_weight_decay says.
std::vector<optim::ParamSegment> engine_param_segments(const RunConfig& config, const nn::ParamStore& store);

// DeepSpeed's deepspeed.initialize(config, model): the engine over a model built by
// engine_build_model (or one prepared for the configuration's micro-batch shape).
std::unique_ptr<Engine> initialize(const RunConfig& config, models::TransformerLM& model,
                                   std::shared_ptr<comm::Backend> dp = nullptr);

// The layout of a configuration over `world` (null: one process): parallel.tp, parallel.pp and
// sequence_parallel; collective over world.
std::shared_ptr<parallel::ParallelContext> engine_parallel_context(const RunConfig& config,
                                                                   std::shared_ptr<comm::Backend> world);

// Builds this rank's part of the model of a configuration (compute dtype, recompute, seed, the
// layout's tensor-parallel shard and pipeline stage) and prepares it for the micro-batch shape
// (with as many activation slots as the rank's pipeline schedule keeps in flight).
std::unique_ptr<models::TransformerLM> engine_build_model(const RunConfig& config,
                                                          std::shared_ptr<parallel::ParallelContext> ctx = nullptr);
// Seconds of one training micro-batch (forward + backward) of one transformer block and of the
// rest (embedding, final norm, LM head and loss), measured on this machine on one process with the
// configuration's shape and dtype (parallel.partition "time").
struct LayerTimes {
  double block = 0.0, rest = 0.0;
};
LayerTimes engine_measure_layer_times(const RunConfig& config);
// Layer boundaries of the pp x virtual_stages pipeline stages of a configuration
// (parallel.partition), and the line that reports them. "time" needs the measured times (the
// embedding's lookup is counted as free: the rest goes to the last stage).
std::vector<int> engine_pipeline_bounds(const RunConfig& config, std::string* report = nullptr,
                                        const LayerTimes* times = nullptr);
parallel::pp::ScheduleSpec engine_schedule_spec(const RunConfig& config);

}  // namespace mt::engine
