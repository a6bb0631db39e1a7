// Loading Hugging Face-layout safetensors weights into a model's flat buffers, by parameter name
// and shape (GPT-2's Conv1D weights are (in, out) in both, so no transposes are needed).
#pragma once

#include <string>

#include "checkpoint/safetensors.h"
#include "nn/param_store.h"

namespace mt::engine {

// Copies "<prefix><name>" for every parameter from the file into master weights (and refreshes the
// compute copy). Missing tensors or wrong shapes throw naming the tensor. An untied GPT-2 file's
// "lm_head.weight" is ignored (tied to wte).
void hf_weights_load(nn::ParamStore& store, const checkpoint::SafetensorsFile& file,
                     const std::string& prefix = "");

}  // namespace mt::engine
