// Training checkpoints: a directory per save, step-<N>/, written as a whole into a temporary
// directory, fsynced and renamed, so a kill during a save leaves the previous checkpoint loadable.
// Sharded (no rank gathers the model): every rank writes what only it holds, in safetensors files
//   model[-K-of-N].safetensors      master weights (f32): whole tensors in Hugging Face names and
//                                   shapes; parts of tensors (a tensor-parallel shard, a ZeRO
//                                   piece) as 1-D "NAME@tpQofT[begin:end]"
//   optimizer[-K-of-N].safetensors  the optimizer's state() buffers, the same pieces as
//                                   "exp_avg/…", "exp_avg_sq/…" (SGD: "momentum_buffer/…")
//   meshtrain.index.json            every piece: parameter, file, tensor, tensor-parallel place
//                                   (rank, size), shard shape, whole (padded) shape, split rule and
//                                   element range in the shard
//   model.safetensors.index.json    Hugging Face's weight_map, where every tensor is whole
//   state.json                      counters (optimizer step count: bias correction, schedule
//                                   position), loss scaler, model config, tokenizer, data
//                                   position, seed and order, the layout it was saved from, and
//                                   the size and XXH3-64 of every file
// Loading reads, on each rank, only the pieces of the parameters its new layout holds (any dp, tp,
// pp, ZeRO stage and world size), verifying each file it opens. One process writes one
// model.safetensors: a Hugging Face file. Training has no other randomness (no dropout), so this
// is the whole state of a run. `latest` in the save directory names the newest complete
// checkpoint. The last keep_last are kept.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/file_io.h"

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/hf_weights.h"

namespace mt::engine {

// Writes save_dir/step-<global_step>/ atomically (a re-saved step is swapped in whole) with the
// size and XXH3-64 of every file in state.json, points `latest` at it, and rotates: it and later
// steps stay, of the earlier ones the newest keep_last - 1 (all of them kept when keep_last <= 0).
// drop_others removes every other checkpoint instead (train --overwrite's first save).
// Collective over the whole job: every rank writes its shard, rank 0 the index and state.json; a
// failure on any rank fails the save on every rank (the previous checkpoint stays the newest).
// Where save_dir's disk has less room than the checkpoint takes (the newest one's bytes, or the
// model's and optimizer's f32 state before the first) and rotation would remove earlier ones after
// this save anyway, rank 0 removes those first, oldest first, when that makes the room (never the
// newest keep_last - 1, so keep_last 1 never goes below one checkpoint); with a line.
std::string checkpoint_save(Engine& engine, const std::string& save_dir, int64_t keep_last, bool drop_others = false);
// A line for the start of a run whose save_dir's disk cannot hold one checkpoint (empty where it
// can, or where its free space is unknown): such a run was told at its first save, maybe hours in.
std::string checkpoint_space_warning(Engine& engine, const std::string& save_dir);
// Throws kCorruption naming the damaged file (missing, truncated, checksum mismatch) and the newest
// intact checkpoint beside it. A checkpoint written before checksums passes.
void checkpoint_verify(const std::string& dir);
// Whether save_dir holds any checkpoint (a `latest` or a step-N directory).
bool checkpoint_dir_has_checkpoints(const std::string& save_dir);
// A run's right to save into save_dir (train's and classify's, before any work): a save_dir holding
// checkpoints takes a run that resumes one of them (resume: save_dir itself or a checkpoint inside
// it, top_k/ included) or --overwrite. Throws kInvalidArgument otherwise, saying which to give: a
// run resumed from elsewhere re-saved and rotated another run's checkpoints without a word.
void checkpoint_dir_check_run(const std::string& save_dir, const std::string& resume, bool overwrite);
// The run's hold on its save_dir (its .lock, base/file_io.h HeldLock), taken by rank 0 before any
// work and kept to the run's end: one run saves there at a time. A second one's saves swept the
// first's half-written step-N.tmp, rotated its checkpoints away, and the two wrote `latest` in
// turn. Throws kInvalidArgument naming the other run where one holds it.
std::unique_ptr<HeldLock> checkpoint_dir_hold(const std::string& save_dir);
// The checkpoint directory a path names: itself, or the one `latest` names in a save_dir (a
// save_dir without `latest`, its first save killed before writing it: the newest step-N). Throws kNotFound when it holds no state.json.
std::string checkpoint_resolve(const std::string& path);

// What export and generate need from a checkpoint without building an engine.
struct CheckpointInfo {
  std::string dir, weights;   // the step-N directory and its model.safetensors (one file: unsharded)
  bool sharded = false;       // the sharded format (else an older meshtrain's gathered one)
  nlohmann::json model_json;  // the Hugging Face config of the model
  models::ModelConfig model;
  std::string tokenizer;      // data.tokenizer of the run ("" when it had none)
  int64_t global_step = 0;
};
CheckpointInfo checkpoint_info(const std::string& path);
// Where a checkpoint's run stopped, from its state.json alone (nothing verified: checkpoint_load
// does that): its step and the samples those steps consumed (-1: an older checkpoint without).
struct CheckpointProgress {
  int64_t global_step = 0;
  int64_t consumed_samples = -1;
  int64_t consumed_valid_samples = -1;  // Megatron's validation counter (-1: the checkpoint has none)
  int64_t seq_length = -1;              // the length consumed_samples counts in (-1: not written)
};
CheckpointProgress checkpoint_progress(const std::string& path);
// Fills a model built from info.model (one process, or any layout) with the checkpoint's weights.
void checkpoint_load_weights(const CheckpointInfo& info, nn::ParamStore& store);
// The checkpoint's weights for the store's parameters (any layout it was saved in), read one
// parameter at a time (hf_weights.h). speak: this rank says that a causal LM's weights lack a
// classifier's score.weight (one rank of those holding it says so: the engine picks it).
std::unique_ptr<WeightSource> checkpoint_weights(const CheckpointInfo& info, const nn::ParamStore& store,
                                                 bool speak = true);
// True when path is a meshtrain checkpoint as init_from_weights tells one (a step-N directory or
// a file in one: state.json beside it; a save_dir: `latest` in it), else Hugging Face weights.
bool is_checkpoint_path(const std::string& path);
// model.init_from: a meshtrain checkpoint (a step-N directory, a file in one, or a save_dir with
// `latest`, verified first) or Hugging Face weights (a file, a directory, a sharded index).
std::unique_ptr<WeightSource> init_from_weights(const std::string& path, const nn::ParamStore& store,
                                                bool speak = true);

// Restores weights, optimizer, scaler and counters from a checkpoint directory (or a save_dir
// holding `latest`), saved in any layout. Collective; throws naming the file on any mismatch, on
// every rank when one fails.
// Returns the safetensors files this rank read.
std::vector<std::string> checkpoint_load(Engine& engine, const std::string& path);

}  // namespace mt::engine
