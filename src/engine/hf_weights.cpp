#include "engine/hf_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "base/error.h"
#include "base/log.h"
#include "engine/json_file.h"
#include "models/transformer.h"
#include "nn/tp_split.h"

namespace mt::engine {
namespace fs = std::filesystem;
namespace {

// A parameter's name without its first component ("transformer.h.0..." -> "h.0...").
std::string strip_first(const std::string& name) {
  size_t dot = name.find('.');
  return dot == std::string::npos ? std::string() : name.substr(dot + 1);
}

// path's safetensors file, or its sharded index (model.safetensors.index.json), as HfWeights reads it.
fs::path hf_weights_file(const std::string& path) {
  fs::path p = path;
  MT_CHECK(fs::exists(p), ErrorKind::kNotFound, path + ": no such file or directory (model.init_from)");
  if (fs::is_directory(p)) {
    if (fs::exists(p / "model.safetensors")) return p / "model.safetensors";
    if (fs::exists(p / "model.safetensors.index.json")) return p / "model.safetensors.index.json";
    throw Error(ErrorKind::kNotFound, path + ": holds neither model.safetensors nor model.safetensors.index.json");
  }
  return p;
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

HfWeights::HfWeights(const std::string& path, const nn::ParamStore& store, bool speak) : path_(path) {
  const fs::path p = hf_weights_file(path);
  auto open = [&](const std::string& file) -> const checkpoint::SafetensorsFile* {
    auto& f = files_[file];
    if (!f) f = std::make_unique<checkpoint::SafetensorsFile>(file, /*header_only=*/true);
    return f.get();
  };
  nlohmann::json index;
  if (p.extension() == ".json") {  // sharded: {"weight_map": {"tensor name": "shard file name", ...}}
    index = json_load_file(p.string());
    MT_CHECK(index.contains("weight_map") && index["weight_map"].is_object(), ErrorKind::kInvalidArgument,
             p.string() + ": no \"weight_map\" object");
  }
  for (const nn::Parameter* prm : store.parameters()) {
    Source src;
    // The name as we register it, else without its first component (a bare trunk's file).
    const std::string alt = strip_first(prm->name);
    if (index.is_null()) {
      src.file = open(p.string());
      src.name = prm->name;
      if (!src.file->find(src.name) && !alt.empty() && src.file->find(alt)) src.name = alt;
      if (!src.file->find(src.name)) {
        if (prm->name == "score.weight") {
          if (speak)
            log_warning(src.file->path() + " has no score.weight (a causal LM): the classification head starts from its "
                      "initial values");
          src.file = nullptr;
          sources_[prm] = src;
          continue;
        }
        src.file->get(src.name);  // throws naming the file and the tensor
      }
    } else {
      const nlohmann::json& wm = index["weight_map"];
      src.name = prm->name;
      if (!wm.contains(src.name) && !alt.empty() && wm.contains(alt)) src.name = alt;
      if (!wm.contains(src.name) && prm->name == "score.weight") {
        if (speak)
          log_warning(p.string() + " has no score.weight (a causal LM): the classification head starts from its "
                    "initial values");
        sources_[prm] = src;
        continue;
      }
      MT_CHECK(wm.contains(src.name), ErrorKind::kNotFound, p.string() + ": tensor " + prm->name + " is not in the weight_map");
      MT_CHECK(wm[src.name].is_string(), ErrorKind::kCorruption,
               p.string() + ": weight_map[\"" + src.name + "\"] is " + wm[src.name].dump() + ", not a shard's file name");
      src.file = open((p.parent_path() / wm[src.name].get<std::string>()).string());
      src.file->get(src.name);  // the shard the index names holds it
    }
    // The shape, checked now: a wrong file fails before the runtime writes anything.
    const checkpoint::StTensorInfo& t = src.file->get(src.name);
    const Shape want = prm->unpadded_shape();
    if (t.shape != want) src.file->read_f32(src.name, want);  // throws naming the tensor and both shapes
    MT_CHECK(t.dtype == checkpoint::StDType::kF32 || t.dtype == checkpoint::StDType::kBF16 ||
                 t.dtype == checkpoint::StDType::kF16,
             ErrorKind::kInvalidArgument,
             src.file->path() + ": tensor '" + src.name + "' has dtype " + checkpoint::st_dtype_name(t.dtype) +
                 ", expected a float type (F32, BF16 or F16)");
    sources_[prm] = src;
  }
}

bool HfWeights::read(const nn::Parameter& p, float* dst) {
  auto it = sources_.find(&p);
  MT_CHECK(it != sources_.end(), ErrorKind::kInternal, path_ + ": parameter " + p.name + " was not resolved");
  if (it->second.file == nullptr) return false;
  // HF tensors are whole: this rank's tensor-parallel shard of it, read run by run.
  return read_range(p, 0, static_cast<size_t>(p.numel()), dst);
}

bool HfWeights::read_range(const nn::Parameter& p, size_t lo, size_t hi, float* dst) {
  auto it = sources_.find(&p);
  MT_CHECK(it != sources_.end(), ErrorKind::kInternal, path_ + ": parameter " + p.name + " was not resolved");
  if (it->second.file == nullptr) return false;
  MT_CHECK(lo <= hi && hi <= static_cast<size_t>(p.numel()), ErrorKind::kInternal, p.name + ": range out of the parameter");
  std::fill(dst, dst + (hi - lo), 0.0f);  // padding rows
  const auto lo64 = static_cast<int64_t>(lo), hi64 = static_cast<int64_t>(hi);
  // The slice's runs inside the range, read together where they lie close in the file (a column
  // split is a short run a row: SafetensorsFile::read_f32_runs).
  std::vector<checkpoint::SafetensorsFile::Run> runs;
  nn::tp_for_each_run(p.global_shape, p.split, p.place, [&](int64_t local, int64_t global, int64_t len) {
    const int64_t a = std::max(local, lo64), b = std::min(local + len, hi64);
    if (a < b) runs.push_back({static_cast<size_t>(global + (a - local)), static_cast<size_t>(b - a), dst + (a - lo64)});
  });
  it->second.file->read_f32_runs(it->second.name, runs);
  // Weights that are not finite would train a NaN from the first step, blamed on a gradient (or
  // sample NaN logits): said here, naming the file, the tensor and its element.
  for (const auto& r : runs)
    for (size_t i = 0; i < r.count; ++i)
      if (!std::isfinite(r.dst[i]))
        throw Error(ErrorKind::kCorruption, it->second.file->path() + ": tensor '" + it->second.name + "' element " +
                                                std::to_string(r.first + i) + " is " + std::to_string(r.dst[i]) +
                                                ": the weights must be finite");
  return true;
}

size_t HfWeights::bytes_read() const {
  size_t n = 0;
  for (const auto& [path, file] : files_) n += file->bytes_read();
  return n;
}

size_t HfWeights::reads() const {
  size_t n = 0;
  for (const auto& [path, file] : files_) n += file->reads();
  return n;
}

void weights_load(WeightSource& source, nn::ParamStore& store) {
  for (nn::Parameter* p : store.parameters()) source.read(*p, p->master);
  store.sync_compute();
}

void hf_weights_load_path(nn::ParamStore& store, const std::string& path) {
  HfWeights w(path, store);
  std::vector<std::string> names;
  for (const nn::Parameter* p : store.parameters()) names.push_back(p->name);
  hf_warn_unused_tensors(path, names, store.find("lm_head.weight") == nullptr && store.find("score.weight") == nullptr);
  weights_load(w, store);
}

std::vector<std::string> hf_model_tensor_names(const models::ModelConfig& cfg) {
  models::ModelConfig one = cfg;  // the same kinds of tensor, tiny
  one.n_layer = 1;
  one.hidden = 8;
  one.n_head = 2;
  one.n_kv_head = cfg.n_kv_head == cfg.n_head ? 2 : 1;
  one.intermediate = 8;
  one.vocab_size = 8;
  one.max_positions = 8;
  one.padding_idx = -1;
  models::TransformerLM m(one, models::ModelOptions{});
  const std::string layer0 = cfg.arch == models::Arch::kGpt2 ? ".h.0." : ".layers.0.";
  // In the store's order: the names before the layer, each layer's, the names after it.
  std::vector<std::string> before, after;
  std::vector<std::pair<std::string, std::string>> layer;  // (up to the index, after it)
  for (const nn::Parameter* p : m.store().parameters()) {
    const size_t at = p->name.find(layer0);
    if (at == std::string::npos) {
      (layer.empty() ? before : after).push_back(p->name);
      continue;
    }
    layer.emplace_back(p->name.substr(0, at + layer0.size() - 2), p->name.substr(at + layer0.size() - 1));
  }
  std::vector<std::string> names = before;
  for (int i = 0; i < cfg.n_layer; ++i)
    for (const auto& [head, tail] : layer) names.push_back(head + std::to_string(i) + tail);
  names.insert(names.end(), after.begin(), after.end());
  return names;
}

std::vector<std::string> hf_unused_tensors(const std::string& path, const std::vector<std::string>& names, bool tied) {
  const fs::path p = hf_weights_file(path);
  std::vector<std::string> in_file;
  if (p.extension() == ".json") {
    const nlohmann::json index = json_load_file(p.string());
    if (index.contains("weight_map") && index["weight_map"].is_object())
      for (const auto& [name, shard] : index["weight_map"].items()) in_file.push_back(name);
  } else {
    const checkpoint::SafetensorsFile f(p.string(), /*header_only=*/true);
    for (const checkpoint::StTensorInfo& t : f.tensors()) in_file.push_back(t.name);
  }
  std::set<std::string> read;
  for (const std::string& n : names) {
    read.insert(n);
    if (const std::string alt = strip_first(n); !alt.empty()) read.insert(alt);
  }
  auto buffer = [tied](const std::string& n) {
    return n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias") || n.ends_with("rotary_emb.inv_freq") ||
           (tied && n == "lm_head.weight");
  };
  std::vector<std::string> unused;
  for (const std::string& n : in_file)
    if (!read.count(n) && !buffer(n)) unused.push_back(n);
  return unused;
}

void hf_warn_unused_tensors(const std::string& path, const std::vector<std::string>& names, bool tied) {
  const std::vector<std::string> unused = hf_unused_tensors(path, names, tied);
  if (unused.empty()) return;
  std::string list;
  for (size_t i = 0; i < unused.size() && i < 5; ++i) list += (i ? ", " : "") + unused[i];
  if (unused.size() > 5) list += ", ... (" + std::to_string(unused.size() - 5) + " more)";
  log_warning(path + ": " + std::to_string(unused.size()) + " tensor(s) the model does not read were not loaded: " + list +
              " (its config.json may describe another model)");
}

std::function<void(size_t, size_t, float*)> weight_initial_values(std::shared_ptr<WeightSource> source,
                                                                  const nn::ParamStore& store,
                                                                  std::function<void(size_t, size_t, float*)> initial) {
  // The runtime asks piece by piece, and a large parameter spans several pieces: the last one read
  // is kept for the next call.
  struct Last {
    const nn::Parameter* p = nullptr;
    std::vector<float> values;
  };
  auto last = std::make_shared<Last>();
  const nn::ParamStore* s = &store;
  return [source = std::move(source), initial = std::move(initial), last, s](size_t begin, size_t end, float* dst) {
    for (const nn::Parameter* p : s->parameters()) {
      const size_t n = static_cast<size_t>(p->numel());
      const size_t a = std::max(begin, p->offset), b = std::min(end, p->offset + n);
      if (a >= b) continue;
      if (source->reads_ranges()) {  // only the piece's bytes
        if (!source->read_range(*p, a - p->offset, b - p->offset, dst + (a - begin))) initial(a, b, dst + (a - begin));
        continue;
      }
      if (last->p != p) {
        last->p = nullptr;
        last->values.assign(n, 0.0f);
        if (!source->read(*p, last->values.data())) initial(p->offset, p->offset + n, last->values.data());
        last->p = p;
      }
      std::memcpy(dst + (a - begin), last->values.data() + (a - p->offset), (b - a) * sizeof(float));
    }
  };
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
    if (dtype == DType::kF16)  // past f16's range the value became inf, and the export could not be loaded
      for (size_t i = 0; i < n; ++i)
        MT_CHECK(std::fabs(p->master[i]) <= 65504.0f, ErrorKind::kInvalidArgument,
                 p->name + " element " + std::to_string(i) + " is " + std::to_string(p->master[i]) +
                     ", past fp16's range (65504): export it as bf16 or f32");
    converted.emplace_back(n);
    convert(converted.back().data(), dtype, p->master, DType::kF32, n);
    out.push_back({p->name, dtype, p->shape, converted.back().data()});
  }
  checkpoint::safetensors_write(path, out, {{"format", "pt"}});
}

}  // namespace mt::engine
