// meshtrain export CKPT --hf OUT [--dtype f32|bf16|f16]: a training checkpoint (a step-N directory,
// or a save_dir whose `latest` names one) as a Hugging Face model directory: model.safetensors
// (the *ForCausalLM state-dict names and layouts) and config.json (with torch_dtype), plus the
// run's tokenizer (as tokenizer.json, or a GPT-2 vocabulary directory's files) when it had one.
#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/file_io.h"
#include "cli/commands.h"
#include "data/classification.h"
#include "engine/checkpoint_io.h"
#include "engine/hf_config.h"
#include "engine/hf_weights.h"
#include "data/tokenizer.h"
#include "models/transformer.h"

namespace mt::cli {
namespace fs = std::filesystem;
namespace {

struct ExportArgs {
  std::string checkpoint, out, dtype = "f32";
};

void run_export(const ExportArgs& a) {
  MT_CHECK(!a.out.empty(), ErrorKind::kInvalidArgument, "export: --hf OUT is required (the output directory)");
  MT_CHECK(a.dtype == "f32" || a.dtype == "bf16" || a.dtype == "f16", ErrorKind::kInvalidArgument,
           "--dtype " + a.dtype + ": expected f32, bf16 or f16");
  DType dtype = a.dtype == "bf16" ? DType::kBF16 : a.dtype == "f16" ? DType::kF16 : DType::kF32;
  engine::CheckpointInfo info = engine::checkpoint_info(a.checkpoint);
  // The output is a Hugging Face directory of its own: never a checkpoint, a save_dir, or a folder
  // inside the checkpoint read (its model.safetensors would be written over the checkpoint's).
  {
    auto norm = [](const std::string& p) {
      fs::path c = fs::weakly_canonical(p);
      return c.has_filename() ? c : c.parent_path();  // no trailing separator
    };
    const fs::path out = norm(a.out), ckpt = norm(info.dir);
    const bool inside = std::mismatch(ckpt.begin(), ckpt.end(), out.begin(), out.end()).first == ckpt.end();
    MT_CHECK(!inside, ErrorKind::kInvalidArgument,
             "--hf " + a.out + ": inside the checkpoint " + info.dir + "; export to a directory of its own");
    MT_CHECK(!fs::exists(out / "state.json") && !engine::checkpoint_dir_has_checkpoints(out.string()), ErrorKind::kInvalidArgument,
             "--hf " + a.out + ": a meshtrain checkpoint or save_dir, whose files export would overwrite; export to another directory");
    // (a file there, or one on the way, was a raw filesystem_error, exit 1, after the weights were read)
    for (fs::path p = out; !p.empty() && p != p.root_path(); p = p.parent_path()) {
      std::error_code ec;
      MT_CHECK(!fs::exists(p, ec) || fs::is_directory(p, ec), ErrorKind::kInvalidArgument,
               "--hf " + a.out + ": " + p.string() + " is a file, not a directory; export to a directory");
      // Inside another checkpoint too: its run's rotation removes the export with it, without a
      // word (stop 73).
      MT_CHECK(p == out || !fs::exists(p / "state.json", ec), ErrorKind::kInvalidArgument,
               "--hf " + a.out + ": inside the checkpoint " + p.string() +
                   ", which its run's keep_last rotation removes with the export; export to a directory of its own");
    }
  }
  // The document separator as Hugging Face's bos/eos ids (GPT-2's convention: both are
  // <|endoftext|>): without them Hugging Face takes 50256 (GPT-2) or 2 (LLaMA), wrong ids for a
  // vocabulary of the run's own. Read before anything is written; a tokenizer that cannot be read
  // is said, and the ids are left out.
  int eot = -1, pad = -1;
  if (!info.tokenizer.empty() && !fs::exists(info.tokenizer))  // (left out without a word)
    std::fprintf(stderr, "warning: the run's tokenizer %s no longer exists: the export has none, and config.json names no eos_token_id\n",
                 info.tokenizer.c_str());
  if (!info.tokenizer.empty() && fs::exists(info.tokenizer)) {
    try {
      const data::Tokenizer tok = data::Tokenizer::load(info.tokenizer);
      pad = data::classification_pad(tok);
      eot = tok.eot_id();
    } catch (const Error& e) {
      std::fprintf(stderr, "warning: %s; config.json names no eos_token_id\n", e.what());
    }
  }
  if (info.model.padding_idx >= 0) pad = info.model.padding_idx;  // LLaMA's: training padded with it (classify)
  // Building the model checks every tensor's name and shape against the architecture.
  models::ModelOptions opts;
  models::TransformerLM model(info.model, opts);
  engine::checkpoint_load_weights(info, model.store());  // any layout it was saved from

  fs::create_directories(a.out);
  engine::hf_weights_save(model.store(), (fs::path(a.out) / "model.safetensors").string(), dtype);
  nlohmann::json cfg = engine::hf_config_to_json(info.model);
  cfg["torch_dtype"] = dtype == DType::kF32 ? "float32" : dtype == DType::kBF16 ? "bfloat16" : "float16";
  // The model's own ids where its config.json gave them (Llama 3's bos 128000 and eos 128001, an
  // Instruct model's list of three): they were overwritten by the end of text, or dropped. An id
  // past the vocabulary (a hub GPT-2 config's 50256 over a vocabulary trained here) is no token:
  // replaced by the end of text, or left out, with a line.
  // In a list, only the ids past the vocabulary are replaced (the others are the model's).
  for (const char* key : {"bos_token_id", "eos_token_id"}) {
    if (!cfg.contains(key)) continue;
    const bool list = cfg[key].is_array();
    const nlohmann::json ids = list ? cfg[key] : nlohmann::json::array({cfg[key]});
    nlohmann::json kept = nlohmann::json::array();
    for (const auto& id : ids) {
      if (id.get<int64_t>() < info.model.vocab_size) {
        if (std::find(kept.begin(), kept.end(), id) == kept.end()) kept.push_back(id);
        continue;
      }
      std::fprintf(stderr, "warning: the model's %s %s is not an id of its vocabulary (%d): %s\n", key, id.dump().c_str(),
                   info.model.vocab_size, eot >= 0 ? "the tokenizer's end of text is written for it" : "left out");
      if (eot >= 0 && std::find(kept.begin(), kept.end(), nlohmann::json(eot)) == kept.end()) kept.push_back(eot);
    }
    if (kept.empty()) cfg.erase(key);
    else cfg[key] = list ? kept : kept[0];
  }
  if (eot >= 0) {
    if (!cfg.contains("bos_token_id")) cfg["bos_token_id"] = eot;
    if (!cfg.contains("eos_token_id")) cfg["eos_token_id"] = eot;
  }
  if (info.model.num_labels > 0) {
    // The id training padded rows with: Hugging Face's classifiers pool at the last token that is
    // not it, and without one refuse a batch of more than one ("Cannot handle batch sizes > 1").
    if (pad >= 0) cfg["pad_token_id"] = pad;
    // The run's label names (data.labels), as run_glue writes them; LABEL_i without them.
    std::ifstream in(fs::path(info.dir) / "state.json");
    const nlohmann::json state = nlohmann::json::parse(in, nullptr, false);
    if (state.is_object() && state.contains("classification") && state["classification"].contains("labels") &&
        state["classification"]["labels"].is_array() &&
        static_cast<int>(state["classification"]["labels"].size()) == info.model.num_labels) {
      nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
      for (int i = 0; i < info.model.num_labels; ++i) {
        const nlohmann::json& name = state["classification"]["labels"][i];
        if (!name.is_string()) break;
        id2label[std::to_string(i)] = name;
        label2id[name.get<std::string>()] = i;
      }
      if (static_cast<int>(id2label.size()) == info.model.num_labels && static_cast<int>(label2id.size()) == info.model.num_labels) {
        cfg["id2label"] = id2label;
        cfg["label2id"] = label2id;
      }
    }
  }
  std::string text = cfg.dump(2) + "\n";
  file_write_atomic((fs::path(a.out) / "config.json").string(), text.data(), text.size());
  // The run's tokenizer travels with the model: a tokenizer.json file as tokenizer.json, a GPT-2
  // vocabulary directory's files as they are.
  const auto overwrite = fs::copy_options::overwrite_existing;
  if (!info.tokenizer.empty() && fs::is_regular_file(info.tokenizer)) {
    fs::copy_file(info.tokenizer, fs::path(a.out) / "tokenizer.json", overwrite);
  } else if (!info.tokenizer.empty() && fs::is_directory(info.tokenizer)) {
    for (const char* f : {"tokenizer.json", "encoder.json", "vocab.bpe", "vocab.json", "merges.txt"})
      if (fs::exists(fs::path(info.tokenizer) / f)) fs::copy_file(fs::path(info.tokenizer) / f, fs::path(a.out) / f, overwrite);
  }
  // With its chat template (the files data::Tokenizer::load reads it from, beside the vocabulary):
  // an Instruct model fine-tuned here was exported without it, and Hugging Face's
  // apply_chat_template then had none to apply.
  if (!info.tokenizer.empty() && fs::exists(info.tokenizer)) {
    const fs::path dir = fs::is_directory(info.tokenizer) ? fs::path(info.tokenizer) : fs::path(info.tokenizer).parent_path();
    for (const char* f : {"tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"})
      if (fs::is_regular_file(dir / f)) fs::copy_file(dir / f, fs::path(a.out) / f, overwrite);
  }
  std::printf("exported %s (step %lld, %zu tensors, %s) to %s\n", info.dir.c_str(), static_cast<long long>(info.global_step),
              model.store().parameters().size(), a.dtype.c_str(), a.out.c_str());
}

}  // namespace

void register_export(CLI::App& app) {
  auto args = std::make_shared<ExportArgs>();
  auto* cmd = app.add_subcommand("export", "Write a checkpoint as a Hugging Face model directory");
  cmd->add_option("CKPT", args->checkpoint, "checkpoint directory (step-N, or a save_dir with `latest`)")->required();
  cmd->add_option("--hf", args->out, "output directory: model.safetensors + config.json")->required();
  cmd->add_option("--dtype", args->dtype, "weights dtype: f32 (default), bf16 or f16");
  cmd->callback([args] { run_export(*args); });
}

}  // namespace mt::cli
