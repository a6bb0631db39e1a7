// Training checkpoints: a directory per save, step-<N>/, written as a whole into a temporary
// directory, fsynced and renamed, so a kill during a save leaves the previous checkpoint loadable:
//   model.safetensors      weights in Hugging Face names and layouts (f32 masters)
//   optimizer.safetensors  AdamW exp_avg / exp_avg_sq as flat f32 spans
//   state.json             counters, loss scaler, config digest, data position
// `latest` in the save directory names the newest complete checkpoint. The last keep_last are kept.
#pragma once

#include <string>

#include "engine/engine.h"

namespace mt::engine {

// Writes save_dir/step-<global_step>/ atomically and prunes older ones. Returns its path.
std::string checkpoint_save(Engine& engine, const std::string& save_dir, int64_t keep_last);
// Restores weights, optimizer, scaler and counters from a checkpoint directory (or a save_dir
// holding `latest`). Throws naming the file on any mismatch.
void checkpoint_load(Engine& engine, const std::string& path);

}  // namespace mt::engine
