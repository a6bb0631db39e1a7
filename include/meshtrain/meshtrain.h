// meshtrain's public C++ API: a run configuration (DeepSpeed keys + model/data blocks), a model
// built from it, and the training engine.
//
//   mt::engine::RunConfig cfg = mt::engine::ds_config_load("run.json", {});
//   auto model = mt::engine::engine_build_model(cfg);
//   auto engine = mt::engine::initialize(cfg, *model);         // deepspeed.initialize
//   for (...) engine->train_batch([&](int32_t* tokens, int32_t* targets) { /* fill (B, T) */ });
//   // or, per micro-batch: engine->forward(tokens, targets); engine->backward(); ... engine->step();
//   mt::engine::checkpoint_save(*engine, "runs/x", /*keep_last=*/3);
#pragma once

#include "engine/ds_config.h"
#include "engine/checkpoint_io.h"
#include "engine/engine.h"
