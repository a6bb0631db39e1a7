#include "cli/load_model.h"

#include <algorithm>
#include <filesystem>

#include "base/error.h"
#include "base/log.h"
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
    // A causal LM's directory is that causal LM (generate and serve), whatever num_labels its
    // config.json carries, as AutoModelForCausalLM loads it.
    nlohmann::json cj = engine::json_load_file(config);
    engine::hf_directory_drop_num_labels(cj);
    out.model = std::make_unique<models::TransformerLM>(engine::hf_config_parse(cj, config), opts);
    // The ids that end an answer: config.json's eos_token_id, and generation_config.json's, which
    // Hugging Face's generate() stops on (Llama 3 Instruct's end-of-turn is only there; it was not
    // read). One that is not an id of the model is refused naming the file (it was dropped).
    auto eos_from = [&](const std::string& file) {
      const nlohmann::json j = engine::json_load_file(file);
      if (!j.is_object() || !j.contains("eos_token_id") || j["eos_token_id"].is_null()) return;
      const nlohmann::json& e = j["eos_token_id"];
      for (const nlohmann::json& id : e.is_array() ? e : nlohmann::json::array({e})) {
        MT_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < out.model->config().vocab_size,
                 ErrorKind::kInvalidArgument,
                 file + ": eos_token_id " + id.dump() + " is not an id of the model's vocabulary (" +
                     std::to_string(out.model->config().vocab_size) + ")");
        const int32_t v = static_cast<int32_t>(id.get<int64_t>());
        if (std::find(out.eos_ids.begin(), out.eos_ids.end(), v) == out.eos_ids.end()) out.eos_ids.push_back(v);
      }
    };
    eos_from(config);
    {
      const nlohmann::json j = engine::json_load_file(config);
      if (j.is_object() && j.contains("pad_token_id") && j["pad_token_id"].is_number_integer()) {
        // A negative one (old LLaMA configs write -1) is no token: Hugging Face's classifier compares
        // the ids with it and pools at the last position, so none here.
        const int64_t v = j["pad_token_id"].get<int64_t>();
        MT_CHECK(v < 0 || v < out.model->config().vocab_size, ErrorKind::kInvalidArgument,
                 config + ": pad_token_id " + std::to_string(v) + " is not an id of the model's vocabulary (" +
                     std::to_string(out.model->config().vocab_size) + ")");
        if (v >= 0) out.pad_id = static_cast<int32_t>(v);
      }
      const int L = out.model->config().num_labels;
      if (L > 0 && j.is_object() && j.contains("id2label") && j["id2label"].is_object()) {
        std::vector<std::string> names(static_cast<size_t>(L));
        bool all = true, named = false;
        for (int i = 0; i < L; ++i) {
          const std::string k = std::to_string(i);
          all = all && j["id2label"].contains(k) && j["id2label"][k].is_string();
          if (!all) break;
          names[i] = j["id2label"][k].get<std::string>();
          named = named || names[i] != "LABEL_" + k;
        }
        if (all && named) out.label_names = std::move(names);
      }
    }
    const fs::path gen_cfg = fs::path(config).parent_path() / "generation_config.json";
    if (fs::exists(gen_cfg)) eos_from(gen_cfg.string());
    engine::hf_weights_load_path(out.model->store(), path);
    if (fs::exists(fs::path(path) / "tokenizer.json") || fs::exists(fs::path(path) / "encoder.json") ||
        fs::exists(fs::path(path) / "vocab.json"))
      out.tokenizer = path;  // Tokenizer::load finds the files in the directory
    return out;
  }
  // Weights without a config.json beside them: said so (it read "not a checkpoint (no state.json)").
  std::error_code ec;
  MT_CHECK(!(fs::is_directory(path, ec) && !fs::exists(fs::path(path) / "state.json") && !fs::exists(fs::path(path) / "latest") &&
             (fs::exists(fs::path(path) / "model.safetensors") || fs::exists(fs::path(path) / "model.safetensors.index.json"))),
           ErrorKind::kNotFound,
           path + ": Hugging Face weights without a config.json beside them (and not a meshtrain checkpoint)");
  engine::CheckpointInfo info = engine::checkpoint_info(path);
  out.model = std::make_unique<models::TransformerLM>(info.model, opts);
  engine::checkpoint_load_weights(info, out.model->store());
  out.tokenizer = info.tokenizer;
  // The model's own eos ids end an answer here as in its export (they were read from an export's
  // config.json only, stop 75); one past the vocabulary (a hub GPT-2 config's 50256 over a
  // vocabulary trained here) is no token, said once.
  for (const int64_t id : info.model.eos_token_ids) {
    if (id >= info.model.vocab_size) {
      log_warning(path + ": the model's eos_token_id " + std::to_string(id) + " is not an id of its vocabulary (" +
                  std::to_string(info.model.vocab_size) + "): it ends nothing");
      continue;
    }
    const int32_t v = static_cast<int32_t>(id);
    if (std::find(out.eos_ids.begin(), out.eos_ids.end(), v) == out.eos_ids.end()) out.eos_ids.push_back(v);
  }
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

DType weights_dtype(const std::string& name) {
  if (name == "f32" || name == "fp32" || name == "float32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  throw Error(ErrorKind::kInvalidArgument, "--dtype must be f32 or bf16, got " + name);
}

}  // namespace mt::cli
