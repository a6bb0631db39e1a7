#include "engine/checkpoint_io.h"

#include <algorithm>
#include <cstring>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "base/error.h"
#include "base/fault.h"
#include "base/log.h"
#include "base/file_io.h"
#include "checkpoint/safetensors.h"
#include "engine/hf_config.h"
#include "engine/hf_weights.h"
#include "engine/json_file.h"

namespace mt::engine {
namespace fs = std::filesystem;
namespace {

void fsync_dir(const fs::path& dir) {
  // Persist the directory entry of a rename (POSIX: fsync the directory).
  FILE* f = std::fopen(dir.c_str(), "r");
  if (f) {
    fsync(fileno(f));
    std::fclose(f);
  }
}

}  // namespace

std::string checkpoint_save(Engine& engine, const std::string& save_dir, int64_t keep_last) {
  models::TransformerLM& model = engine.model();
  nn::ParamStore& store = model.store();
  std::string name = "step-" + std::to_string(engine.global_step());
  fs::path final_dir = fs::path(save_dir) / name;
  // ZeRO: the partitions are gathered on rank 0, which alone writes, in the layout one process
  // writes; so a checkpoint loads at any stage and world size.
  std::vector<float> master;
  engine.gather_master(master);
  auto opt_full = engine.gather_optimizer_state();
  if (engine.rank() != 0) return final_dir.string();
  fs::create_directories(save_dir);
  fs::path tmp_dir = fs::path(save_dir) / (name + ".tmp");
  // Leftovers of saves killed half-way are never loaded; remove them.
  for (const auto& e : fs::directory_iterator(save_dir))
    if (e.is_directory() && e.path().extension() == ".tmp") fs::remove_all(e.path());
  fs::create_directories(tmp_dir);

  std::vector<checkpoint::StTensorOut> weights;
  for (nn::Parameter* p : store.parameters())
    weights.push_back({p->name, DType::kF32, p->shape, master.data() + p->offset});
  checkpoint::safetensors_write((tmp_dir / "model.safetensors").string(), weights, {{"format", "pt"}});
  // Hugging Face's index of a (here one-shard) safetensors checkpoint.
  nlohmann::json index = {{"metadata", {{"total_size", store.numel() * sizeof(float)}}}, {"weight_map", nlohmann::json::object()}};
  for (nn::Parameter* p : store.parameters()) index["weight_map"][p->name] = "model.safetensors";
  std::string index_text = index.dump(2);
  file_write_atomic((tmp_dir / "model.safetensors.index.json").string(), index_text.data(), index_text.size());
  fault_point("checkpoint.after_weights");
  int64_t n = static_cast<int64_t>(store.numel());
  std::vector<checkpoint::StTensorOut> opt_state;
  for (const auto& [state_name, values] : opt_full)
    opt_state.push_back({state_name, DType::kF32, {static_cast<int64_t>(values.size())}, values.data()});
  checkpoint::safetensors_write((tmp_dir / "optimizer.safetensors").string(), opt_state,
                                {{"optimizer", engine.optimizer().type_name()}});
  const optim::LossScalerState& ls = engine.loss_scaler().state();
  nlohmann::json state = {{"global_step", engine.global_step()},
                          {"applied_steps", engine.applied_steps()},
                          {"optimizer_step", engine.optimizer().step_count()},
                          {"num_params", n},
                          {"loss_scale", ls.scale},
                          {"scaler_iter", ls.iter},
                          {"scaler_last_overflow_iter", ls.last_overflow_iter},
                          {"scaler_hysteresis_left", ls.hysteresis_left},
                          {"model", ds_config_resolved(engine.config())["model"]},
                          {"data", {{"next_sample", engine.global_step() * engine.config().batch.train_batch_size},
                                    {"seed", engine.config().seed},
                                    {"shuffle", engine.config().shuffle},
                                    {"train", engine.config().data_train}}},
                          {"tokenizer", engine.config().tokenizer.empty() ? std::string()
                                                                  : fs::absolute(engine.config().tokenizer).string()}};
  std::string text = state.dump(2);
  file_write_atomic((tmp_dir / "state.json").string(), text.data(), text.size());
  fsync_dir(tmp_dir);
  fs::remove_all(final_dir);
  fault_point("checkpoint.before_rename");
  fs::rename(tmp_dir, final_dir);
  fault_point("checkpoint.before_latest");
  std::string latest = name + "\n";
  file_write_atomic((fs::path(save_dir) / "latest").string(), latest.data(), latest.size());
  fsync_dir(save_dir);

  // Keep the newest keep_last complete checkpoints.
  std::vector<std::pair<int64_t, fs::path>> all;
  for (const auto& e : fs::directory_iterator(save_dir)) {
    std::string f = e.path().filename().string();
    if (e.is_directory() && f.rfind("step-", 0) == 0 && f.find(".tmp") == std::string::npos)
      all.emplace_back(std::stoll(f.substr(5)), e.path());
  }
  std::sort(all.begin(), all.end());
  for (size_t i = 0; keep_last > 0 && i + static_cast<size_t>(keep_last) < all.size(); ++i) fs::remove_all(all[i].second);
  return final_dir.string();
}

std::string checkpoint_resolve(const std::string& path) {
  fs::path dir = path;
  MT_CHECK(fs::exists(dir), ErrorKind::kNotFound, path + ": no such checkpoint directory");
  if (fs::exists(dir / "latest")) {
    std::vector<char> l = file_read_all((dir / "latest").string());
    std::string name(l.begin(), l.end());
    name.erase(std::remove(name.begin(), name.end(), '\n'), name.end());
    dir /= name;
  }
  MT_CHECK(fs::exists(dir / "state.json"), ErrorKind::kNotFound, dir.string() + ": not a checkpoint (no state.json)");
  return dir.string();
}

CheckpointInfo checkpoint_info(const std::string& path) {
  CheckpointInfo info;
  info.dir = checkpoint_resolve(path);
  std::string state_path = (fs::path(info.dir) / "state.json").string();
  nlohmann::json state = json_load_file(state_path, ErrorKind::kCorruption);
  MT_CHECK(state.contains("model") && state["model"].is_object(), ErrorKind::kCorruption,
           state_path + ": no \"model\" object");
  info.model_json = state["model"];
  info.model = hf_config_parse(info.model_json, state_path + ": model");
  if (state.contains("tokenizer") && state["tokenizer"].is_string()) info.tokenizer = state["tokenizer"].get<std::string>();
  info.global_step = state.value("global_step", int64_t{0});
  info.weights = (fs::path(info.dir) / "model.safetensors").string();
  return info;
}

void checkpoint_load(Engine& engine, const std::string& path) {
  fs::path dir = checkpoint_resolve(path);
  nlohmann::json state = json_load_file((dir / "state.json").string(), ErrorKind::kCorruption);
  nn::ParamStore& store = engine.model().store();
  MT_CHECK(state.value("num_params", int64_t{-1}) == static_cast<int64_t>(store.numel()), ErrorKind::kInvalidArgument,
           (dir / "state.json").string() + ": the checkpoint's model has a different parameter count");
  checkpoint::SafetensorsFile weights((dir / "model.safetensors").string());
  std::vector<float> flat(store.numel());
  hf_weights_load(store, weights, "", flat.data());
  engine.load_master(flat.data());
  checkpoint::SafetensorsFile opt((dir / "optimizer.safetensors").string());
  auto saved_type = opt.metadata().find("optimizer");
  std::string want = engine.optimizer().type_name();
  MT_CHECK(saved_type == opt.metadata().end() ? want == "AdamW" : saved_type->second == want, ErrorKind::kInvalidArgument,
           opt.path() + ": the checkpoint's optimizer is " +
               (saved_type == opt.metadata().end() ? std::string("AdamW") : saved_type->second) + ", the config's " + want);
  for (const optim::StateBuffer& b : engine.optimizer().state()) {
    flat = opt.read_f32(b.name, {static_cast<int64_t>(store.numel())});
    engine.load_optimizer_state(b.name, flat.data());
  }
  try {
    engine.optimizer().set_step_count(state.at("optimizer_step").get<int64_t>());
    optim::LossScalerState ls;
    ls.scale = state.at("loss_scale").get<double>();
    ls.iter = state.at("scaler_iter").get<int64_t>();
    ls.last_overflow_iter = state.at("scaler_last_overflow_iter").get<int64_t>();
    ls.hysteresis_left = state.at("scaler_hysteresis_left").get<int>();
    engine.loss_scaler().set_state(ls);
    engine.set_counters(state.at("global_step").get<int64_t>(), state.at("applied_steps").get<int64_t>());
    // The data position follows from the step; the order from the seed and shuffle, which the
    // resumed run must share to continue the same curve.
    if (state.contains("data")) {
      const nlohmann::json& d = state["data"];
      const RunConfig& c = engine.config();
      if (d.at("seed").get<uint64_t>() != c.seed || d.at("shuffle").get<bool>() != c.shuffle)
        log_warning((dir / "state.json").string() + ": written with data seed " + std::to_string(d.at("seed").get<uint64_t>()) +
                    " shuffle " + (d.at("shuffle").get<bool>() ? "true" : "false") +
                    "; this run's differ, so the data order will not continue the checkpoint's");
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kCorruption, (dir / "state.json").string() + ": missing or malformed field: " + e.what());
  }
}

}  // namespace mt::engine
