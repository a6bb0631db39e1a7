// meshtrain's public C++ API: a run configuration (DeepSpeed keys + model/data blocks), a model
// built from it, and the training engine.
//
//   mt::engine::RunConfig cfg = mt::engine::ds_config_load("run.json", {});
//   auto model = mt::engine::engine_build_model(cfg);
//   mt::engine::Engine engine(cfg, *model);
//   for (...) engine.train_batch([&](int32_t* tokens, int32_t* targets) { /* fill (B, T) */ });
#pragma once

#include "engine/ds_config.h"
#include "engine/engine.h"
