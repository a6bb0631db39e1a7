// The run configuration: one JSON file holding a `model` block (Hugging Face config.json fields, or
// a path to one), a `data` block, a `parallel` block, and DeepSpeed's training keys read as
// DeepSpeed reads them (https://www.deepspeed.ai/docs/config-json/). Every key is classified:
//   - implemented: parsed into RunConfig;
//   - refused (changes what is trained and we don't implement it): kNotSupported naming its path;
//   - ignored with one warning (logging/monitoring/tuning, or unknown to DeepSpeed too), with a
//     did-you-mean for near misses of known keys.
// "auto" values are resolved from the rest of the configuration (rules in docs/CONFIG.md) or refused
// naming the key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/classification.h"
#include "engine/curriculum.h"
#include "models/config.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "optim/lr_schedule.h"

namespace mt::engine {

struct BatchConfig {
  int64_t train_batch_size = 0;
  int64_t micro_batch_per_gpu = 0;
  int64_t gradient_accumulation_steps = 0;
};

// zero_optimization, DeepSpeed's keys and defaults (sizes in elements, as DeepSpeed counts them).
struct ZeroConfig {
  int stage = 0;
  bool overlap_comm = false;                  // DeepSpeed: false, but true at stage 3
  bool overlap_comm_given = false;            // set by the configuration (else the stage's default)
  int64_t reduce_bucket_size = 500'000'000;   // 5e8
  int64_t allgather_bucket_size = 500'000'000;
  int64_t stage3_prefetch_bucket_size = 50'000'000;  // 5e7
  int64_t stage3_param_persistence_threshold = 100'000;  // 1e5
  int64_t stage3_max_live_parameters = 1'000'000'000;    // 1e9
  std::string offload_optimizer = "none", offload_param = "none";  // "none", "cpu" or "nvme" (optimizer)
  // offload_optimizer device "nvme" (ZeRO-Infinity): the AdamW moments swapped in sub-groups of
  // sub_group_size elements under nvme_path, buffer_count of them resident; pipeline_read /
  // pipeline_write overlap the reads and writes with the update (DeepSpeed's defaults: off).
  std::string optimizer_nvme_path;
  int optimizer_buffer_count = 4;
  bool pipeline_read = false, pipeline_write = false;
  int64_t sub_group_size = 1'000'000'000;  // 1e9
  // offload_param device "nvme" (stage 3, with offload_optimizer "nvme"): the f32 master and
  // gradient shards on disk under param_nvme_path (parallel/zero/zero_runtime.h).
  std::string param_nvme_path;
};

// DeepSpeed's `aio` block: the swap I/O engine's request size, depth and threads (io/aio.h).
struct AioConfig {
  int64_t block_size = 1'048'576;
  int queue_depth = 8, thread_count = 1;
  bool single_submit = false, overlap_events = true;
};

// DeepSpeed's comms_logger: the communicator's per-op counters (comm/comm_log.h) printed as a
// summary at the end of training (enabled), and per step (verbose). prof_all false: only prof_ops.
// debug: ops are told apart by the caller's tag. Counting itself is always on (metrics' comm_bytes).
struct CommsLoggerConfig {
  bool enabled = false, verbose = false, prof_all = true, debug = false;
  std::vector<std::string> prof_ops;
};

// DeepSpeed's flops_profiler (its keys and defaults): at training step profile_step (1-based),
// rank 0 times every module's forward and backward and prints the profile (engine/flops_profiler.h)
// to stdout, or to output_file (empty: stdout). module_depth -1: every depth of the aggregated
// profile; top_modules: module kinds listed per depth; detailed: the whole module tree too.
// recompute_fwd_factor: the extra forward share a backward recomputes (activation checkpointing).
struct FlopsProfilerConfig {
  bool enabled = false;
  double recompute_fwd_factor = 0.0;
  int64_t profile_step = 1;
  int module_depth = -1;
  int top_modules = 1;
  bool detailed = true;
  std::string output_file;
};

// data.train or data.valid: one dataset (a prefix or a text file), or a Megatron blend list
// (["0.3", "a", "0.7", "b"] weighted, or ["a", "b"] weighted by their sizes). data_train /
// data_valid hold the one path, or for a blend Megatron's command-line form ("0.3 a 0.7 b").
struct DataSpec {
  std::vector<std::string> paths;
  std::vector<double> weights;  // with paths, when weighted
  bool blend = false;           // a list of several, or a weighted list of one
  bool weighted = false;
};

struct RunConfig {
  nlohmann::json model_json;  // the HF config as given (or loaded from the path)
  models::ModelConfig model;
  std::string init_from;      // model.init_from: HF safetensors to start from
  std::string data_train, data_valid, tokenizer;
  DataSpec train_spec, valid_spec;
  bool shuffle = true;
  // data.sample_order: "meshtrain" (token_stream.h's windows) or "megatron" (Megatron-LM's
  // GPTDataset order for train_iters x train_batch_size samples: data/megatron_order.h).
  std::string sample_order = "meshtrain";
  // data.split: Megatron's --split of data.train into training and validation sequences ("969,30,1"),
  // parsed (three weights; empty when not given).
  std::string split;
  std::vector<double> split_weights;
  // data.eod_mask_loss (Megatron's --eod-mask-loss): a target whose input is the end-of-document
  // token is not trained; data.eod_id names that token (-1: corpus_eod_id's rule).
  bool eod_mask_loss = false;
  int64_t eod_id = -1;
  // data.reset_position_ids / data.reset_attention_mask (Megatron's --reset-position-ids,
  // --reset-attention-mask): documents packed into a sample, split at the same end-of-document
  // token, each with its own positions / attending only within itself (models::ModelOptions::documents).
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  // loss_normalization: "micro_batch" (each micro-batch's mean over its targets, averaged: DeepSpeed's
  // and Megatron's default) or "tokens" (the global batch's sum over its count of targets:
  // Megatron's --calculate-per-token-loss, Hugging Face Trainer's num_items_in_batch).
  std::string loss_normalization = "micro_batch";
  uint64_t seed = 1234;       // the initialization (and what else draws from it)
  uint64_t data_seed = 1234;  // data.seed: the sample order only (default: seed)
  int64_t seq_length = 0;
  int64_t train_iters = 0;
  std::string save_dir;
  int64_t save_interval = 0, eval_interval = 0, eval_iters = 10, keep_last = 3;
  BatchConfig batch;
  double gradient_clipping = 0.0;
  DType compute_dtype = DType::kF32;
  // fp16.fp16_master_weights_and_grads / bf16.bf16_master_weights_and_grads (DeepSpeed, ZeRO 1-3):
  // the optimizer's master weights and the gradients it reads hold 16-bit values (kF32: off).
  DType master_dtype = DType::kF32;
  // bf16.check_grad_overflow (DeepSpeed, passed to its ZeRO optimizer): a bf16 step whose gradient
  // is not finite is skipped, as an fp16 overflow is (without it the run stops, naming the step).
  bool bf16_check_grad_overflow = false;
  // communication_data_type: the dtype data-parallel gradients are reduced in (fp32 by default;
  // bf16/f16: rounded to it and summed in it on the wire).
  DType comm_dtype = DType::kF32;
  // seq_parallel_communication_data_type: with Ulysses (sp > 1) DeepSpeed reduces the gradients in
  // it instead of communication_data_type (fp32 by default). grad_comm_dtype() picks.
  DType seq_comm_dtype = DType::kF32;
  optim::LossScalerConfig loss_scaler;  // meaningful for fp16
  bool fp16_dynamic_args_given = false;  // the fp16 block gives a dynamic key (DeepSpeed's dynamic_loss_scale_args)
  optim::OptimizerSpec optimizer;
  // Parameters without weight decay: substrings of HF parameter names, or "hf" for Hugging Face
  // Trainer's rule (biases and LayerNorm/RMSNorm weights). Empty: every parameter decays, as in
  // DeepSpeed when the client passes model.parameters().
  std::vector<std::string> no_weight_decay;
  optim::LrScheduleConfig scheduler;
  int zero_stage = 0;  // == zero.stage
  ZeroConfig zero;
  AioConfig aio;
  int world_size = 1;  // data-parallel processes the configuration was resolved for (processes / (tp pp sp))
  int processes = 1;   // every process of the job
  // parallel.tp: Megatron's tensor parallelism over tp consecutive ranks (dp = processes / tp).
  int tp = 1;
  // parallel.sequence_parallel (Megatron's --sequence-parallel): norms, residual adds and the
  // residual stream on each tp rank's share of the tokens. A no-op with tp = 1.
  // activation_checkpointing.partition_activations maps onto it (DeepSpeed's name).
  bool sequence_parallel = false;
  bool partition_activations = false;  // activation_checkpointing.partition_activations: sequence parallelism whatever parallel says
  // parallel.sp (DeepSpeed's top-level sequence_parallel_size): DeepSpeed-Ulysses sequence
  // parallelism (parallel/sp/ulysses.h). sp ranks share each micro-batch, each holding seq_length / sp
  // consecutive tokens of every sample; attention trades that split for a split of the heads by an
  // all-to-all. Gradients and ZeRO partitions go over dp x sp; the samples over dp =
  // processes / (tp pp sp); with tp and pp too (stop 80), the rest refused by name (check_ulysses).
  int sp = 1;
  // parallel.make_vocab_size_divisible_by (Megatron's --make-vocab-size-divisible-by): under
  // tp > 1 the vocabulary is padded to a multiple of this times tp.
  int vocab_divisible = 128;
  // parallel.pp (DeepSpeed: pipeline.stages): pipeline stages; dp = processes / (tp pp).
  // parallel.pipeline_schedule: "1f1b" (default, DeepSpeed's and Megatron's), "gpipe" or
  // "interleaved" with parallel.virtual_stages model chunks per rank (Megatron's
  // --num-layers-per-virtual-pipeline-stage, as a count). parallel.partition (DeepSpeed:
  // pipeline.partition / partition_method): "parameters" (default, counting the embedding and
  // head) or "uniform". Micro-batches per step = gradient_accumulation_steps, as in DeepSpeed.
  int pp = 1;
  std::string pipeline_schedule = "1f1b";
  int virtual_stages = 1;
  std::string partition = "parameters";
  // comm_timeout (seconds, our key; torch.distributed's init_process_group timeout): a collective
  // not complete by then names the ranks missing and the job aborts.
  double comm_timeout_s = 300.0;
  // device (our key): "cpu" (default) or "cuda" (one GPU per process: the model's step runs on
  // the GPU, models/device_lm.h). Refused with what the GPU path lacks: fp16, optimizers other
  // than Adam/AdamW, more than one process (the NCCL backend).
  std::string device = "cpu";
  // comm_backend (our key): "mpi" (default) or "nccl": with device "cuda", the data-parallel
  // gradient all-reduce runs on the GPUs through NCCL (comm/nccl/); needed for several GPU ranks.
  std::string comm_backend = "mpi";
  bool activation_checkpointing = false;
  // sparse_attention (DeepSpeed's block, every mode and key): block-sparse attention in every
  // layer, causal inside the blocks. Random blocks are seeded by `seed`.
  std::optional<kernels::SparsityConfig> sparse_attention;
  // curriculum_learning (DeepSpeed's legacy block, curriculum_type "seqlen"): engine/curriculum.h.
  CurriculumConfig curriculum;
  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  // prescale_gradients / gradient_predivide_factor (DeepSpeed): where the data-parallel average's
  // division happens (before the all-reduce, or 1/factor before and factor/dp after).
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  // A bare DeepSpeed config (no model block; `config check` only): model-dependent checks skipped.
  bool bare = false;
  CommsLoggerConfig comms_logger;
  // csv_monitor (DeepSpeed's, top-level or inside monitor_config): one CSV per event under
  // output_path/job_name, written by rank 0 (cli/train.cpp).
  struct CsvMonitor {
    bool enabled = false;
    std::string output_path, job_name = "DeepSpeedJobName";
  } csv_monitor;
  FlopsProfilerConfig flops_profiler;
  // planner (our key): the search behind "auto" layouts (`parallel: "auto"`,
  // zero_optimization.stage "auto", activation_checkpointing.enabled "auto"; cli/plan.cpp) reads
  // this calibration (`meshtrain calibrate -o FILE`) and keeps every rank within memory_gib
  // (0: physical memory / processes).
  struct Planner {
    std::string calibration = "calibration.json";
    double memory_gib = 0.0;
  } planner;
  // task (our key, as Hugging Face's AutoModelFor*): "causal_lm" (default) or "classification":
  // sequence classification (model.num_labels, default 2; data.texta_name / textb_name /
  // label_name / id_name / labels over .jsonl records; validation accuracy; cli/classify.cpp).
  std::string task = "causal_lm";
  data::ClassificationFields cls_fields;
  // data.pad_to_max_length (run_glue's name), classification: every row seq_length long; false (the
  // default) cuts each step's rows to its global batch's longest record (rounded up to 8), and each
  // validation batch's to its own, as DataCollatorWithPadding pads to the longest: the same values.
  bool pad_to_max_length = false;
  // num_train_epochs (Hugging Face's name), classification: train_iters = ceil(epochs x records /
  // train_batch_size) when train_iters is not given.
  double num_train_epochs = 0.0;
  // model_checkpoint (Lightning's ModelCheckpoint): besides the step rotation (save_interval,
  // keep_last), keep the save_top_k checkpoints with the best `monitor` ("val_acc" or "val_loss")
  // in `mode` ("max" or "min") under save_dir/top_k/. save_top_k 0: off.
  struct ModelCheckpoint {
    std::string monitor = "val_acc", mode = "max";
    int64_t save_top_k = 0;
  } model_checkpoint;
  std::vector<std::string> warnings;  // one line each, already worded
  std::vector<std::string> notes;     // each "auto" resolved, one line each
};

// Where a run's configuration comes from (train and config check): a run file (model/data/
// parallel and any DeepSpeed keys), the user's DeepSpeed file (--deepspeed, untouched), the
// --model/--data/--tokenizer flags and --set overrides. Precedence in docs/CONFIG.md.
struct ConfigSources {
  std::string config, deepspeed, model, data, tokenizer;
  std::string deepspeed_config;  // DeepSpeed's --deepspeed_config: the same file as --deepspeed's
  int local_rank = -1;           // DeepSpeed's launcher's --local_rank: read and unused
  std::vector<std::string> sets;
  std::string name() const;  // how messages name the source
  std::string deepspeed_file() const;  // --deepspeed's file, or --deepspeed_config's
};

// Parses and validates. world_size: the job's processes (dp = world_size / parallel.tp).
// `where` names the source in messages (a path). Throws Error naming the key's full path.
// What of c Ulysses (parallel.sp > 1) does not run with ("sparse_attention", ...);
// empty: nothing. The planner leaves Ulysses layouts out for it.
std::string ulysses_unsupported(const RunConfig& c);
// A seqlen curriculum's lengths' greatest common divisor over the steps ds_config checks (0: no
// curriculum): what an sp size must divide (the planner's search).
int64_t curriculum_lengths_gcd(const RunConfig& c);
// The dtype the gradients are reduced in at Ulysses degree `sp`: seq_comm_dtype where sp > 1
// (DeepSpeed's engine replaces communication_data_type with seq_parallel_communication_data_type
// then), comm_dtype otherwise.
inline DType grad_comm_dtype(const RunConfig& c, int sp) { return sp > 1 ? c.seq_comm_dtype : c.comm_dtype; }
RunConfig ds_config_parse(nlohmann::json j, const std::string& where, int world_size = 1, bool allow_bare = false);
RunConfig ds_config_load(const std::string& path, const std::vector<std::string>& overrides,
                         int world_size = 1);
// The JSON the sources compose to: the run file; the DeepSpeed file's keys merged in (a key in
// both files must agree, except that an "auto" takes the other file's value); the flags; --set.
nlohmann::json ds_config_compose(const ConfigSources& s);
RunConfig ds_config_load(const ConfigSources& s, int world_size = 1, bool allow_bare = false);
// What exists outside the file, checked before any work: data.train/data.valid (a dataset prefix
// with .bin/.idx files, or a .txt/.jsonl file), data.tokenizer, and a save_dir that can be created
// and written (created by train; `config check`, create_save_dir false, writes nothing). Throws
// naming the key. `config check` and the start of `train` call it.
void ds_config_check_paths(const RunConfig& c, bool create_save_dir = true);
// What training needs of the model that inference does not: no dropout (the runtime has none, so
// a non-zero embd_pdrop, resid_pdrop, attn_pdrop or attention_dropout is refused by key; estimate,
// plan, generate and serve take them, as Hugging Face's eval mode ignores them).
void ds_config_check_trainable(const RunConfig& c);
// What the schedule does over train_iters steps, once they are known (at parsing, and again where a
// classification run counts them from its epochs): an LRRangeTest whose lr leaves [0, FLT_MAX], a
// WarmupCosineLR with no step after its warmup. Throws naming the scheduler key; no-op without steps.
void ds_config_check_schedule(const RunConfig& c);
// Applies one `a.b.c=value` override (value parsed as JSON, else taken as a string).
void ds_config_set(nlohmann::json& j, const std::string& assignment);
// The validation metrics a classification run logs (and model_checkpoint.monitor may name), in the
// order it prints them: single label val_loss, val_acc, val_f1 (two labels), val_mcc; regression
// val_loss, and of one value val_pearson, val_spearmanr (STS-B's); multi-label val_loss, val_f1.
std::vector<std::string> classification_metric_names(const models::ModelConfig& m);
// The resolved configuration as JSON (what `meshtrain config check` prints).
nlohmann::json ds_config_resolved(const RunConfig& c);

}  // namespace mt::engine
