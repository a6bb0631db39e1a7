// Reads a Hugging Face config.json (GPT-2 or LLaMA family) into a ModelConfig, with HF's field
// names and defaults; a field that would change the architecture and that we don't implement
// (rope_scaling, attention_bias, another activation) is refused by name.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "models/config.h"

namespace mt::engine {

// where: the name used in error messages ("configs/models/gpt2.json" or "model").
models::ModelConfig hf_config_parse(const nlohmann::json& j, const std::string& where);
models::ModelConfig hf_config_load(const std::string& path);
nlohmann::json hf_config_to_json(const models::ModelConfig& cfg);

}  // namespace mt::engine
