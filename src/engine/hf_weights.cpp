#include "engine/hf_weights.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include "base/error.h"
#include "base/log.h"
#include "engine/json_file.h"

namespace mt::engine {
namespace fs = std::filesystem;
namespace {

// A parameter's name without its first component ("transformer.h.0..." -> "h.0...").
std::string strip_first(const std::string& name) {
  size_t dot = name.find('.');
  return dot == std::string::npos ? std::string() : name.substr(dot + 1);
}

}  // namespace

void hf_weights_load(nn::ParamStore& store, const checkpoint::SafetensorsFile& file, const std::string& prefix,
                     float* flat) {
  for (nn::Parameter* p : store.parameters()) {
    std::string name = prefix + p->name;
    if (!file.find(name)) {
      std::string alt = prefix + strip_first(p->name);
      if (!strip_first(p->name).empty() && file.find(alt)) name = alt;
    }
    // A classifier started from a causal LM: its score head keeps its initial values, as Hugging
    // Face's from_pretrained does ("newly initialized").
    if (p->name == "score.weight" && !file.find(name) && !flat) {
      log_warning(file.path() + " has no score.weight (a causal LM): the classification head starts from its "
                  "initial values");
      continue;
    }
    // HF tensors are whole: into the one-process layout, or this rank's tensor-parallel shard.
    std::vector<float> w = file.read_f32(name, p->unpadded_shape());  // throws naming file + tensor
    if (flat) std::memcpy(flat + p->global_offset, w.data(), w.size() * sizeof(float));
    else nn::tp_extract(p->master, w.data(), p->global_shape, p->split, p->place);
  }
  if (!flat) store.sync_compute();
}

std::string hf_weights_config_path(const std::string& path) {
  fs::path p = path;
  if (fs::is_directory(p) && fs::exists(p / "config.json")) return (p / "config.json").string();
  return "";
}

void hf_weights_load_path(nn::ParamStore& store, const std::string& path) {
  fs::path p = path;
  MT_CHECK(fs::exists(p), ErrorKind::kNotFound, path + ": no such file or directory (model.init_from)");
  if (fs::is_directory(p)) {
    if (fs::exists(p / "model.safetensors")) {
      p /= "model.safetensors";
    } else if (fs::exists(p / "model.safetensors.index.json")) {
      p /= "model.safetensors.index.json";
    } else {
      throw Error(ErrorKind::kNotFound, path + ": holds neither model.safetensors nor model.safetensors.index.json");
    }
  }
  if (p.extension() != ".json") {
    checkpoint::SafetensorsFile file(p.string());
    hf_weights_load(store, file);
    return;
  }
  // Sharded: {"weight_map": {"tensor name": "shard file name", ...}}.
  nlohmann::json index = json_load_file(p.string());
  MT_CHECK(index.contains("weight_map") && index["weight_map"].is_object(), ErrorKind::kInvalidArgument,
           p.string() + ": no \"weight_map\" object");
  std::map<std::string, std::unique_ptr<checkpoint::SafetensorsFile>> shards;
  for (nn::Parameter* prm : store.parameters()) {
    std::string name = prm->name;
    const nlohmann::json& wm = index["weight_map"];
    if (!wm.contains(name) && wm.contains(strip_first(name))) name = strip_first(name);
    MT_CHECK(wm.contains(name) && wm[name].is_string(), ErrorKind::kNotFound,
             p.string() + ": tensor " + prm->name + " is not in the weight_map");
    std::string shard = (p.parent_path() / wm[name].get<std::string>()).string();
    auto& f = shards[shard];
    if (!f) f = std::make_unique<checkpoint::SafetensorsFile>(shard);
    std::vector<float> w = f->read_f32(name, prm->unpadded_shape());
    nn::tp_extract(prm->master, w.data(), prm->global_shape, prm->split, prm->place);
  }
  store.sync_compute();
}

void hf_weights_save(const nn::ParamStore& store, const std::string& path, DType dtype) {
  std::vector<checkpoint::StTensorOut> out;
  std::vector<std::vector<uint16_t>> converted;
  converted.reserve(store.parameters().size());
  for (nn::Parameter* p : store.parameters()) {
    if (dtype == DType::kF32) {
      out.push_back({p->name, DType::kF32, p->shape, p->master});
      continue;
    }
    size_t n = 1;
    for (int64_t d : p->shape) n *= static_cast<size_t>(d);
    converted.emplace_back(n);
    convert(converted.back().data(), dtype, p->master, DType::kF32, n);
    out.push_back({p->name, dtype, p->shape, converted.back().data()});
  }
  checkpoint::safetensors_write(path, out, {{"format", "pt"}});
}

}  // namespace mt::engine
