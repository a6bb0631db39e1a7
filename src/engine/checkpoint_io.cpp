#include "engine/checkpoint_io.h"

#include <algorithm>
#include <cstdio>
#include <fcntl.h>
#include <cstring>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "base/checksum.h"
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

// The files a checkpoint's state.json lists with their size and XXH3-64.
const char* const kCheckpointFiles[] = {"model.safetensors", "model.safetensors.index.json", "optimizer.safetensors"};

// state.json's own checksum covers its text with "state_xxh3" removed (nlohmann dumps objects with
// sorted keys and round-trip numbers, so the text is canonical).
std::string state_checksum(nlohmann::json state) {
  state.erase("state_xxh3");
  std::string text = state.dump(2);
  return xxh3_hex(text.data(), text.size());
}

// step-N directories of a save_dir, newest step first.
std::vector<std::pair<int64_t, fs::path>> step_dirs(const fs::path& save_dir) {
  std::vector<std::pair<int64_t, fs::path>> all;
  std::error_code ec;
  if (!fs::is_directory(save_dir, ec)) return all;
  for (const auto& e : fs::directory_iterator(save_dir, ec)) {
    std::string f = e.path().filename().string();
    if (!e.is_directory() || f.rfind("step-", 0) != 0) continue;
    std::string num = f.substr(5);
    if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos || num.size() > 18) continue;
    all.emplace_back(std::stoll(num), e.path());
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return all;
}

// Empty when dir is an intact checkpoint, else what is wrong with it (one phrase naming the file).
std::string checkpoint_damage(const fs::path& dir) {
  fs::path sp = dir / "state.json";
  if (!fs::exists(sp)) return sp.string() + " is missing";
  nlohmann::json state;
  try {
    state = json_load_file(sp.string(), ErrorKind::kCorruption);
  } catch (const Error& e) {
    return std::string(e.what());
  }
  if (!state.is_object()) return sp.string() + " is not a JSON object";
  if (!state.contains("state_xxh3")) return "";  // written before checksums: not verifiable
  if (!state["state_xxh3"].is_string() || state["state_xxh3"].get<std::string>() != state_checksum(state))
    return sp.string() + " is corrupt (its checksum does not match its contents)";
  if (!state.contains("files") || !state["files"].is_object()) return sp.string() + " lists no files";
  for (const char* name : kCheckpointFiles) {
    fs::path fp = dir / name;
    if (!state["files"].contains(name)) return sp.string() + " does not list " + name;
    const nlohmann::json& want = state["files"][name];
    if (!fs::exists(fp)) return fp.string() + " is missing";
    size_t bytes = 0;
    std::string got;
    try {
      got = file_xxh3_hex(fp.string(), &bytes);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    if (!want.is_object() || want.value("bytes", int64_t{-1}) != static_cast<int64_t>(bytes))
      return fp.string() + " is truncated or extended (" + std::to_string(bytes) + " bytes, the checkpoint recorded " +
             (want.is_object() ? std::to_string(want.value("bytes", int64_t{-1})) : std::string("?")) + ")";
    if (want.value("xxh3", std::string()) != got)
      return fp.string() + " is corrupt (XXH3 " + got + ", the checkpoint recorded " + want.value("xxh3", std::string()) + ")";
  }
  return "";
}

}  // namespace

void checkpoint_verify(const std::string& dir) {
  std::string damage = checkpoint_damage(dir);
  if (damage.empty()) return;
  // Name the newest intact checkpoint beside it, to resume from.
  fs::path self = fs::weakly_canonical(dir);
  std::string advice = "no intact checkpoint is left beside it";
  for (const auto& [step, p] : step_dirs(self.parent_path())) {
    if (fs::weakly_canonical(p) == self || !checkpoint_damage(p).empty()) continue;
    advice = "the newest intact checkpoint is " + p.string() + " (--resume " + p.string() + ")";
    break;
  }
  throw Error(ErrorKind::kCorruption, "checkpoint " + dir + ": " + damage + "; " + advice);
}

std::string checkpoint_save(Engine& engine, const std::string& save_dir, int64_t keep_last, bool drop_others) {
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
  // Leftovers of saves killed half-way are never loaded; remove them. A step-N.old is the previous
  // copy of a re-saved step (the fallback path below): it goes once step-N exists, else it is
  // step-N again.
  for (const auto& e : fs::directory_iterator(save_dir)) {
    if (!e.is_directory()) continue;
    fs::path p = e.path();
    if (p.extension() == ".tmp") {
      fs::remove_all(p);
    } else if (p.extension() == ".old") {
      fs::path orig = p;
      orig.replace_extension();
      if (fs::exists(orig)) fs::remove_all(p);
      else fs::rename(p, orig);
    }
  }
  fs::create_directories(tmp_dir);

  std::vector<checkpoint::StTensorOut> weights;
  const std::vector<models::ParamLayout> layout = models::one_process_layout(model.config());
  for (const models::ParamLayout& p : layout)  // whole tensors, at their one-process offsets
    weights.push_back({p.name, DType::kF32, p.shape, master.data() + p.offset});
  checkpoint::safetensors_write((tmp_dir / "model.safetensors").string(), weights, {{"format", "pt"}});
  // Hugging Face's index of a (here one-shard) safetensors checkpoint.
  nlohmann::json index = {{"metadata", {{"total_size", store.global_numel() * sizeof(float)}}}, {"weight_map", nlohmann::json::object()}};
  for (const models::ParamLayout& p : layout) index["weight_map"][p.name] = "model.safetensors";
  std::string index_text = index.dump(2);
  file_write_atomic((tmp_dir / "model.safetensors.index.json").string(), index_text.data(), index_text.size());
  fault_point("checkpoint.after_weights");
  int64_t n = static_cast<int64_t>(store.global_numel());
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
  // Integrity: the size and XXH3-64 of every file as it is on disk, and of state.json itself.
  for (const char* f : kCheckpointFiles) {
    size_t bytes = 0;
    std::string h = file_xxh3_hex((tmp_dir / f).string(), &bytes);
    state["files"][f] = {{"bytes", bytes}, {"xxh3", h}};
  }
  state["state_xxh3"] = state_checksum(state);
  std::string text = state.dump(2);
  file_write_atomic((tmp_dir / "state.json").string(), text.data(), text.size());
  fsync_dir(tmp_dir);
  fault_point("checkpoint.before_rename");
  if (fs::exists(final_dir)) {
    // Re-saving a step: swap the new directory in atomically (renameat2 RENAME_EXCHANGE), so step-N
    // is always a whole checkpoint, then delete the old one. Where the filesystem cannot exchange,
    // step-N moves to step-N.old first; a kill in between is repaired by the next save and by
    // checkpoint_resolve.
    if (renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
      fault_point("checkpoint.after_exchange");
      fs::remove_all(tmp_dir);
    } else {
      fs::path old = final_dir;
      old += ".old";
      fs::remove_all(old);
      fs::rename(final_dir, old);
      fault_point("checkpoint.after_move_old");
      fs::rename(tmp_dir, final_dir);
      fs::remove_all(old);
    }
  } else {
    fs::rename(tmp_dir, final_dir);
  }
  fault_point("checkpoint.before_latest");
  std::string latest = name + "\n";
  file_write_atomic((fs::path(save_dir) / "latest").string(), latest.data(), latest.size());
  fsync_dir(save_dir);

  // Rotation: the checkpoint just written (which `latest` names) is never removed, and neither are
  // checkpoints of later steps (left by a run that went further before this one resumed from an
  // earlier step: the user's to delete). Of the earlier steps, the newest keep_last - 1 stay.
  // drop_others (train --overwrite, first save): every other checkpoint goes.
  const int64_t step = engine.global_step();
  int64_t kept = 1;
  for (const auto& [s, p] : step_dirs(save_dir)) {
    if (s == step) continue;
    if (drop_others) {
      fs::remove_all(p);
    } else if (s < step) {
      if (keep_last > 0 && kept >= keep_last) fs::remove_all(p);
      else ++kept;
    }
  }
  return final_dir.string();
}

std::string checkpoint_resolve(const std::string& path) {
  fs::path dir = path;
  MT_CHECK(fs::exists(dir), ErrorKind::kNotFound, path + ": no such checkpoint directory");
  if (fs::exists(dir / "latest")) {
    std::vector<char> l = file_read_all((dir / "latest").string());
    std::string name(l.begin(), l.end());
    name.erase(std::remove(name.begin(), name.end(), '\n'), name.end());
    fs::path named = dir / name;
    fs::path old = named;
    old += ".old";
    // A re-save killed between its two renames (filesystems without RENAME_EXCHANGE).
    if (!fs::exists(named) && fs::exists(old)) named = old;
    MT_CHECK(fs::exists(named), ErrorKind::kCorruption,
             (dir / "latest").string() + " names " + name + ", which does not exist");
    dir = named;
  }
  MT_CHECK(fs::exists(dir / "state.json"), ErrorKind::kNotFound, dir.string() + ": not a checkpoint (no state.json)");
  return dir.string();
}

CheckpointInfo checkpoint_info(const std::string& path) {
  CheckpointInfo info;
  info.dir = checkpoint_resolve(path);
  checkpoint_verify(info.dir);
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
  checkpoint_verify(dir.string());
  nlohmann::json state = json_load_file((dir / "state.json").string(), ErrorKind::kCorruption);
  if (!state.contains("state_xxh3"))
    log_warning((dir / "state.json").string() + ": written without checksums (an older meshtrain): not verified");
  nn::ParamStore& store = engine.model().store();
  MT_CHECK(state.value("num_params", int64_t{-1}) == static_cast<int64_t>(store.global_numel()), ErrorKind::kInvalidArgument,
           (dir / "state.json").string() + ": the checkpoint's model has a different parameter count");
  checkpoint::SafetensorsFile weights((dir / "model.safetensors").string());
  std::vector<float> flat(store.global_numel());
  hf_weights_load(store, weights, "", flat.data());
  engine.load_master(flat.data());
  checkpoint::SafetensorsFile opt((dir / "optimizer.safetensors").string());
  auto saved_type = opt.metadata().find("optimizer");
  std::string want = engine.optimizer().type_name();
  MT_CHECK(saved_type == opt.metadata().end() ? want == "AdamW" : saved_type->second == want, ErrorKind::kInvalidArgument,
           opt.path() + ": the checkpoint's optimizer is " +
               (saved_type == opt.metadata().end() ? std::string("AdamW") : saved_type->second) + ", the config's " + want);
  for (const optim::StateBuffer& b : engine.optimizer().state()) {
    flat = opt.read_f32(b.name, {static_cast<int64_t>(store.global_numel())});
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

namespace mt::engine {

bool checkpoint_dir_has_checkpoints(const std::string& save_dir) {
  std::error_code ec;
  return fs::exists(fs::path(save_dir) / "latest", ec) || !step_dirs(save_dir).empty();
}

}  // namespace mt::engine
