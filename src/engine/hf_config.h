// Reads a Hugging Face config.json (GPT-2 or LLaMA family) into a ModelConfig, with HF's field
// names and defaults; a field that would change the architecture and that we don't implement
// (longrope or ntk rope_scaling, another activation) is refused by name.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/config.h"

namespace mt::engine {

// where: the name used in error messages ("configs/models/gpt2.json" or "model").
// warnings, when given, gets a line for each key one or two edits from a field that is read and
// absent (a misspelt n_layer left at its default).
models::ModelConfig hf_config_parse(const nlohmann::json& j, const std::string& where,
                                    std::vector<std::string>* warnings = nullptr);
models::ModelConfig hf_config_load(const std::string& path);
nlohmann::json hf_config_to_json(const models::ModelConfig& cfg);

// A Hugging Face directory's config.json names its model class in "architectures". A num_labels
// beside causal-LM classes only (a fine-tuning script's key written out) does not make it a
// classifier: AutoModelForCausalLM loads that causal LM. Erases such a num_labels and says whether
// it did. Only for a directory's file read as a causal LM: a run's model block (configs/models/*.json
// with num_labels) is how a classifier is asked for.
bool hf_directory_drop_num_labels(nlohmann::json& j);

}  // namespace mt::engine
