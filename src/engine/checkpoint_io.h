// Training checkpoints: a directory per save, step-<N>/, written as a whole into a temporary
// directory, fsynced and renamed, so a kill during a save leaves the previous checkpoint loadable:
//   model.safetensors      weights in Hugging Face names and layouts (f32 masters)
//   model.safetensors.index.json  Hugging Face's index (weight_map) of the weights
//   optimizer.safetensors  the optimizer's state() buffers as flat f32 spans (AdamW/Lamb exp_avg,
//                          exp_avg_sq; SGD momentum_buffer), its type in the metadata
//   state.json             counters (optimizer step count: bias correction, schedule position),
//                          loss scaler, model config, tokenizer, data position, seed and order
// Training has no other randomness (no dropout), so this is the whole state of a run.
// `latest` in the save directory names the newest complete checkpoint. The last keep_last are kept.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace mt::engine {

// Writes save_dir/step-<global_step>/ atomically (a re-saved step is swapped in whole) with the
// size and XXH3-64 of every file in state.json, points `latest` at it, and rotates: it and later
// steps stay, of the earlier ones the newest keep_last - 1 (all of them kept when keep_last <= 0).
// drop_others removes every other checkpoint instead (train --overwrite's first save).
std::string checkpoint_save(Engine& engine, const std::string& save_dir, int64_t keep_last, bool drop_others = false);
// Throws kCorruption naming the damaged file (missing, truncated, checksum mismatch) and the newest
// intact checkpoint beside it. A checkpoint written before checksums passes.
void checkpoint_verify(const std::string& dir);
// Whether save_dir holds any checkpoint (a `latest` or a step-N directory).
bool checkpoint_dir_has_checkpoints(const std::string& save_dir);
// The checkpoint directory a path names: itself, or the one `latest` names in a save_dir.
// Throws kNotFound when it holds no state.json.
std::string checkpoint_resolve(const std::string& path);

// What export and generate need from a checkpoint without building an engine.
struct CheckpointInfo {
  std::string dir, weights;   // the step-N directory and its model.safetensors
  nlohmann::json model_json;  // the Hugging Face config of the model
  models::ModelConfig model;
  std::string tokenizer;      // data.tokenizer of the run ("" when it had none)
  int64_t global_step = 0;
};
CheckpointInfo checkpoint_info(const std::string& path);

// Restores weights, optimizer, scaler and counters from a checkpoint directory (or a save_dir
// holding `latest`). Throws naming the file on any mismatch.
void checkpoint_load(Engine& engine, const std::string& path);

}  // namespace mt::engine
