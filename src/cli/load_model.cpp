#include "cli/load_model.h"

#include <filesystem>

#include "base/error.h"
#include "engine/checkpoint_io.h"
#include "engine/hf_config.h"
#include "engine/hf_weights.h"
#include "engine/json_file.h"

namespace mt::cli {
namespace fs = std::filesystem;

LoadedModel load_model(const std::string& path) {
  LoadedModel out;
  models::ModelOptions opts;
  if (!engine::hf_weights_config_path(path).empty() && !fs::exists(fs::path(path) / "state.json") &&
      !fs::exists(fs::path(path) / "latest")) {  // a Hugging Face directory
    const std::string config = engine::hf_weights_config_path(path);
    out.model = std::make_unique<models::TransformerLM>(engine::hf_config_load(config), opts);
    const nlohmann::json j = engine::json_load_file(config);
    if (j.contains("eos_token_id")) {
      const nlohmann::json& e = j["eos_token_id"];
      for (const nlohmann::json& id : e.is_array() ? e : nlohmann::json::array({e}))
        if (id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < out.model->config().vocab_size)
          out.eos_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    engine::hf_weights_load_path(out.model->store(), path);
    if (fs::exists(fs::path(path) / "tokenizer.json") || fs::exists(fs::path(path) / "encoder.json") ||
        fs::exists(fs::path(path) / "vocab.json"))
      out.tokenizer = path;  // Tokenizer::load finds the files in the directory
    return out;
  }
  engine::CheckpointInfo info = engine::checkpoint_info(path);
  out.model = std::make_unique<models::TransformerLM>(info.model, opts);
  engine::checkpoint_load_weights(info, out.model->store());
  out.tokenizer = info.tokenizer;
  return out;
}

void require_causal_lm(const LoadedModel& lm, const std::string& path, const char* command) {
  const int labels = lm.model->config().num_labels;
  MT_CHECK(labels == 0, ErrorKind::kInvalidArgument,
           path + ": a sequence classifier (" + std::to_string(labels) + " labels), not a language model; " + command +
               " needs a causal LM (meshtrain predict MODEL RECORDS.jsonl classifies)");
}

data::Tokenizer load_model_tokenizer(const LoadedModel& lm, const std::string& path, const std::string& override) {
  const std::string tok_path = override.empty() ? lm.tokenizer : override;
  MT_CHECK(!tok_path.empty(), ErrorKind::kInvalidArgument,
           path + ": names no tokenizer; give --tokenizer (a tokenizer.json or a GPT-2 vocabulary directory)");
  data::Tokenizer tok = data::Tokenizer::load(tok_path);
  MT_CHECK(tok.vocab_size() <= lm.model->config().vocab_size, ErrorKind::kInvalidArgument,
           tok_path + ": " + std::to_string(tok.vocab_size()) + " tokens, more than the model's vocab_size " +
               std::to_string(lm.model->config().vocab_size));
  return tok;
}

}  // namespace mt::cli
