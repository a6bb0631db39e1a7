#include "engine/checkpoint_io.h"

#include <algorithm>
#include <cstdio>
#include <fcntl.h>
#include <cstring>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <fstream>
#include <thread>
#include <vector>

#include "base/checksum.h"
#include "data/tokenizer.h"
#include "base/error.h"
#include "base/fault.h"
#include "base/log.h"
#include "base/file_io.h"
#include "checkpoint/safetensors.h"
#include "engine/hf_config.h"
#include "engine/hf_weights.h"
#include "engine/json_file.h"
#include "nn/tp_split.h"
#include "parallel/context.h"
#include "data/megatron_order.h"

namespace mt::engine {
namespace fs = std::filesystem;
namespace {

// train_iters x train_batch_size, the samples a run draws (-1 where the product overflows).
int64_t run_samples(const RunConfig& c) {
  int64_t n = 0;
  return __builtin_mul_overflow(c.train_iters, c.batch.train_batch_size, &n) ? -1 : n;
}

}  // namespace

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
// (Checkpoints before sharding: rank 0 gathered the whole model into these three.)
const char* const kCheckpointFiles[] = {"model.safetensors", "model.safetensors.index.json", "optimizer.safetensors"};
// The sharded format's table of every piece: which parameter, which file and tensor, its
// tensor-parallel place and its element range in that place's shard.
const char* const kShardIndex = "meshtrain.index.json";

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

// The bytes a directory's files take on disk (each rounded up to 4 KiB), and a path's free bytes
// (-1 where statvfs cannot tell).
uint64_t tree_bytes(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code fe;
    if (it->is_regular_file(fe)) total += (static_cast<uint64_t>(it->file_size(fe)) + 4095) / 4096 * 4096;
  }
  return total;
}
int64_t free_bytes(const fs::path& dir) {
  struct statvfs st{};
  if (::statvfs(dir.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(static_cast<uint64_t>(st.f_bavail) * st.f_frsize);
}

// What the next checkpoint takes: the newest earlier one's bytes (the same model and layout), else
// the f32 state every parameter has (master and optimizer states) and 64 KiB of index and state.
uint64_t checkpoint_need_bytes(Engine& engine, const std::vector<std::pair<int64_t, fs::path>>& earlier) {
  for (const auto& [s, p] : earlier)
    if (s < engine.global_step()) return tree_bytes(p);
  return static_cast<uint64_t>(engine.model().store().global_numel()) * sizeof(float) *
             std::max<size_t>(1, engine.state_names().size()) +
         65536;
}

std::string human_bytes(uint64_t b) {
  char buf[32];
  if (b >= (uint64_t{1} << 30)) std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(b) / (1 << 30));
  else std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  return buf;
}

// Which loss scaler a run has: fp16's "dynamic" one (its state goes on across a resume), a
// "static" fp16 scale (the configuration's), or "none" (f32, bf16: the scale is 1).
std::string scaler_kind(const Engine& engine) {
  if (engine.config().compute_dtype != DType::kF16) return "none";
  return engine.config().loss_scaler.dynamic ? "dynamic" : "static";
}

// Empty when file `name` of checkpoint dir has the size and XXH3-64 state.json records for it.
std::string file_damage(const fs::path& dir, const nlohmann::json& state, const std::string& name) {
  fs::path sp = dir / "state.json", fp = dir / name;
  // (state is const: operator[] on a key it lacks is undefined, and aborted export on a state.json
  // without "files".)
  if (!state.contains("files") || !state["files"].is_object()) return sp.string() + " lists no files";
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
  return "";
}

// Empty when dir is an intact checkpoint, else what is wrong with it (one phrase naming the file).
// Empty when dir's state.json is intact (read into *out), else what is wrong with it. A state.json
// written before checksums passes (and has no "files").
std::string state_damage(const fs::path& dir, nlohmann::json* out) {
  fs::path sp = dir / "state.json";
  if (!fs::exists(sp)) return sp.string() + " is missing";
  nlohmann::json& state = *out;
  try {
    state = json_load_file(sp.string(), ErrorKind::kCorruption);
  } catch (const Error& e) {
    return std::string(e.what());
  }
  if (!state.is_object()) return sp.string() + " is not a JSON object";
  // A sharded checkpoint is read through the files it lists (a checkpoint of that format always
  // had checksums).
  if (state.contains("format") && !state.contains("state_xxh3")) return sp.string() + " has no checksum";
  if (!state.contains("state_xxh3")) return "";  // written before checksums: not verifiable
  if (!state["state_xxh3"].is_string() || state["state_xxh3"].get<std::string>() != state_checksum(state))
    return sp.string() + " is corrupt (its checksum does not match its contents)";
  if (!state.contains("files") || !state["files"].is_object()) return sp.string() + " lists no files";
  return "";
}

std::string checkpoint_damage(const fs::path& dir) {
  nlohmann::json state;
  std::string damage = state_damage(dir, &state);
  if (!damage.empty() || !state.contains("state_xxh3")) return damage;
  std::vector<std::string> names;
  if (state.contains("format")) {  // sharded: every file it lists, the shard index among them
    for (auto it = state["files"].begin(); it != state["files"].end(); ++it) names.push_back(it.key());
    if (!state["files"].contains(kShardIndex)) return (dir / "state.json").string() + " does not list " + kShardIndex;
  } else {
    names.assign(std::begin(kCheckpointFiles), std::end(kCheckpointFiles));
  }
  for (const std::string& name : names) {
    damage = file_damage(dir, state, name);
    if (!damage.empty()) return damage;
  }
  return "";
}

}  // namespace

namespace {
// The newest intact step-N of save_dir other than `skip`, as advice to resume from it.
std::string newest_intact_advice(const fs::path& save_dir, const fs::path& skip) {
  const fs::path self = skip.empty() ? fs::path() : fs::weakly_canonical(skip);
  for (const auto& [step, p] : step_dirs(save_dir)) {
    if ((!self.empty() && fs::weakly_canonical(p) == self) || !checkpoint_damage(p).empty()) continue;
    return "the newest intact checkpoint is " + p.string() + " (--resume " + p.string() + ")";
  }
  return "no intact checkpoint is left beside it";
}

// Throws kCorruption with the damage and the newest intact checkpoint beside dir.
[[noreturn]] void throw_damaged(const std::string& dir, const std::string& damage) {
  throw Error(ErrorKind::kCorruption,
              "checkpoint " + dir + ": " + damage + "; " + newest_intact_advice(fs::weakly_canonical(dir).parent_path(), dir));
}
}  // namespace

void checkpoint_verify(const std::string& dir) {
  std::string damage = checkpoint_damage(dir);
  if (!damage.empty()) throw_damaged(dir, damage);
}

namespace {

// One value reduced over the world (a flag, a length, a rank).
float reduce_one(comm::Backend& world, float v, comm::ReduceOp op, const std::string& tag, std::chrono::milliseconds timeout) {
  comm::AllReduceOptions o;
  o.op = op;
  o.tag = tag;
  o.timeout = timeout;
  world.all_reduce(&v, 1, DType::kF32, o)->wait();
  return v;
}

// Every rank learns whether any rank failed a phase of a collective save or load, so all of them
// stop together (none left waiting in the next collective until the timeout). The failing rank
// rethrows its own error; the others throw one naming the phase.
// The failure's class travels with it: a bad input (a missing or damaged file: exit 2) is one on
// every rank, where the others' I/O error (exit 1) raced the failing rank's abort (exit 2 or 1 by
// which came first).
void agree(const parallel::ParallelContext& ctx, std::exception_ptr failed, std::chrono::milliseconds timeout,
           const std::string& what) {
  float flag = 0.0f;
  if (failed) {
    flag = 1.0f;
    try {
      std::rethrow_exception(failed);
    } catch (const Error& e) {
      const ErrorKind k = e.kind();
      if (k == ErrorKind::kInvalidArgument || k == ErrorKind::kNotFound || k == ErrorKind::kCorruption ||
          k == ErrorKind::kNotSupported)
        flag = 2.0f;
    } catch (...) {
    }
  }
  if (ctx.world->size() > 1) flag = reduce_one(*ctx.world, flag, comm::ReduceOp::kMax, "checkpoint: " + what, timeout);
  if (failed) std::rethrow_exception(failed);
  if (flag > 0.0f)
    throw Error(flag > 1.5f ? ErrorKind::kCorruption : ErrorKind::kIOError,
                what + " failed on another rank (its own message names the file and why)");
}

// The lowest rank's non-empty string, on every rank, and that rank (-1 and "" when no rank has
// one): a failure every rank reports alike, whichever rank's line the job's abort shows.
std::pair<int, std::string> first_string(const parallel::ParallelContext& ctx, const std::string& mine,
                                         std::chrono::milliseconds timeout) {
  comm::Backend& world = *ctx.world;
  if (world.size() == 1) return {mine.empty() ? -1 : 0, mine};
  const std::string tag = "checkpoint: the first rank's message";
  const int root = static_cast<int>(
      reduce_one(world, static_cast<float>(mine.empty() ? world.size() : world.rank()), comm::ReduceOp::kMin, tag, timeout));
  if (root >= world.size()) return {-1, ""};
  comm::BroadcastOptions bo;
  bo.root = root;
  bo.tag = tag;
  bo.timeout = timeout;
  float words = static_cast<float>((std::min<size_t>(mine.size(), 4096) + 3) / 4);
  world.broadcast(&words, 1, DType::kF32, bo)->wait();
  std::vector<float> text(static_cast<size_t>(words), 0.0f);  // the bytes as f32 words (moved, not converted)
  if (world.rank() == root) std::memcpy(text.data(), mine.data(), std::min(mine.size(), text.size() * 4));
  world.broadcast(text.data(), text.size(), DType::kF32, bo)->wait();
  const char* c = reinterpret_cast<const char*>(text.data());
  return {root, std::string(c, strnlen(c, text.size() * 4))};
}

// Rank 0 receives every rank's string (world order); the others get {}. Strings travel as the
// bytes of f32 words (gather moves bits, it does not convert).
std::vector<std::string> gather_strings(const parallel::ParallelContext& ctx, const std::string& mine,
                                        std::chrono::milliseconds timeout) {
  comm::Backend& world = *ctx.world;
  if (world.size() == 1) return {mine};
  MT_CHECK(mine.size() < (size_t{1} << 26), ErrorKind::kInternal, "checkpoint: a rank's shard table is too large to gather");
  const size_t words = static_cast<size_t>(reduce_one(world, static_cast<float>((mine.size() + 3) / 4), comm::ReduceOp::kMax,
                                                      "checkpoint shard tables (length)", timeout));
  std::vector<float> send(words, 0.0f), recv(world.rank() == 0 ? words * static_cast<size_t>(world.size()) : 0);
  std::memcpy(send.data(), mine.data(), mine.size());
  comm::GatherOptions go;
  go.tag = "checkpoint shard tables";
  go.timeout = timeout;
  world.gather(recv.empty() ? nullptr : recv.data(), send.data(), words, DType::kF32, go)->wait();
  std::vector<std::string> out;
  if (world.rank() != 0) return out;
  for (int r = 0; r < world.size(); ++r) {
    const char* c = reinterpret_cast<const char*>(recv.data() + static_cast<size_t>(r) * words);
    out.emplace_back(c, strnlen(c, words * 4));
  }
  return out;
}

nlohmann::json split_json(const nn::TpSplit& s) { return {{"dim", s.dim}, {"parts", s.parts}, {"valid", s.valid}}; }

// One rank's own state (engine.rank_state()): rank_state-R-of-N.safetensors, R the world rank.
std::string rank_state_file(int rank, int world) {
  return "rank_state-" + std::to_string(rank) + "-of-" + std::to_string(world) + ".safetensors";
}

std::string shard_file_name(const char* stem, int64_t index, int64_t total) {
  if (total == 1) return std::string(stem) + ".safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%05lld-of-%05lld.safetensors", stem, static_cast<long long>(index + 1),
                static_cast<long long>(total));
  return buf;
}

}  // namespace

// What a run's tokenizer is, by content (data::Tokenizer::fingerprint: the same tokenizer from
// tokenizer.json or a GPT-2 pair, at any path, is the same); "" without one, or where it cannot be
// read (the run itself says why). Kept per path while its files' sizes and times stay: a save
// reads it once.
std::string tokenizer_fingerprint(const std::string& path) {
  if (path.empty()) return "";
  std::error_code ec;
  std::string signature = fs::absolute(path, ec).string();
  auto stamp = [&signature, &ec](const fs::path& f) {
    if (!fs::is_regular_file(f, ec)) return;
    signature += "|" + f.filename().string() + ":" + std::to_string(fs::file_size(f, ec)) + ":" +
                 std::to_string(fs::last_write_time(f, ec).time_since_epoch().count());
  };
  if (fs::is_directory(path, ec)) {
    for (const char* name : {"tokenizer.json", "encoder.json", "vocab.bpe", "vocab.json", "merges.txt", "gpt2-vocab.json",
                             "gpt2-merges.txt"})
      stamp(fs::path(path) / name);
  } else {
    stamp(path);
  }
  static std::mutex mu;
  static std::map<std::string, std::string> known;  // signature -> fingerprint
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = known.find(signature); it != known.end()) return it->second;
  }
  std::string fp;
  try {
    fp = data::Tokenizer::load(path).fingerprint();
  } catch (const Error&) {
  }
  std::lock_guard<std::mutex> lock(mu);
  known[signature] = fp;
  return fp;
}

std::string checkpoint_save(Engine& engine, const std::string& save_dir, int64_t keep_last, bool drop_others) {
  models::TransformerLM& model = engine.model();
  nn::ParamStore& store = model.store();
  const parallel::ParallelContext& ctx = engine.parallel();
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(engine.config().comm_timeout_s * 1000.0));
  const bool lead = engine.rank() == 0;
  std::string name = "step-" + std::to_string(engine.global_step());
  fs::path final_dir = fs::path(save_dir) / name;
  fs::path tmp_dir = fs::path(save_dir) / (name + ".tmp");
  // Test seam: a save that takes seconds (a large model's), which a launcher's stop must wait for.
  if (fault_active("checkpoint.slow_save")) std::this_thread::sleep_for(std::chrono::seconds(3));

  // 0. Weights that are no longer finite (an update that overflowed: a learning rate or betas
  // past what Adam takes) are never saved: such a checkpoint would become `latest` and rotation
  // would delete the last good one. Every rank checks its own span and all stop together, the
  // checkpoints untouched.
  // Every rank learns the first rank's finding and throws the same error (under ZeRO only the rank
  // whose shard holds the value knew it, and rank 0's line said "failed on another rank").
  {
    const auto [rank, where] = first_string(ctx, engine.first_nonfinite_weight(), timeout);
    if (rank >= 0) {
      std::string newest;
      try {
        if (checkpoint_dir_has_checkpoints(save_dir)) newest = checkpoint_resolve(save_dir);
      } catch (const Error&) {  // no intact checkpoint to name
      }
      throw Error(ErrorKind::kNumerical,
                  "step " + std::to_string(engine.global_step()) + ": the weights are not finite (first in " + where +
                      (ctx.world->size() > 1 ? " on rank " + std::to_string(rank) : std::string()) + "), so " +
                      (fs::path(save_dir) / name).string() + " is not written" +
                      (newest.empty() ? std::string() : "; the newest checkpoint stays " + newest));
    }
  }

  // 1. Rank 0 prepares the temporary directory. Leftovers of saves killed half-way are never
  // loaded; remove them. A step-N.old is the previous copy of a re-saved step (the fallback path
  // below): it goes once step-N exists, else it is step-N again.
  std::exception_ptr failed;
  if (lead) {
    try {
      fs::create_directories(save_dir);
      // Only the saves' own names: step-N.tmp, step-N.old and latest.tmp.XXXXXX. Any *.tmp or *.old
      // directory and *.tmp.XXXXXX file was taken for one, so a user's mydata.tmp/ was removed and
      // backup.old/ renamed to backup/, exit 0 (stop 73).
      auto step_stem = [](const fs::path& p) {
        const std::string stem = p.stem().string();
        return stem.size() > 5 && stem.rfind("step-", 0) == 0 &&
               std::all_of(stem.begin() + 5, stem.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
      };
      for (const auto& e : fs::directory_iterator(save_dir)) {
        fs::path p = e.path();
        if (!e.is_directory()) {
          // An atomic write's temporary (base/file_io.h: NAME.tmp.XXXXXX) whose process was killed
          // before its rename: `latest`, of an earlier save.
          const std::string name = p.filename().string();
          if (e.is_regular_file() && name.size() == 17 && name.rfind("latest.tmp.", 0) == 0) fs::remove(p);
          continue;
        }
        if (!step_stem(p)) continue;
        if (p.extension() == ".tmp") {
          fs::remove_all(p);
        } else if (p.extension() == ".old") {
          fs::path orig = p;
          orig.replace_extension();
          if (fs::exists(orig)) fs::remove_all(p);
          else fs::rename(p, orig);
        }
      }
      // A disk that holds keep_last checkpoints and no more: the save of one more failed (ENOSPC)
      // before rotation could make room, though rotation would remove the oldest right after it
      // (stop 77). Those rotation removes go first where that makes the room.
      if (keep_last >= 2 && !drop_others) {
        const auto dirs = step_dirs(save_dir);
        const uint64_t need = checkpoint_need_bytes(engine, dirs);
        int64_t free = free_bytes(save_dir);
        std::vector<fs::path> victims;  // earlier steps past the newest keep_last - 1, oldest first
        int64_t earlier = 0;
        for (const auto& [s, p] : dirs)
          if (s < engine.global_step() && ++earlier >= keep_last) victims.insert(victims.begin(), p);
        uint64_t freed = 0;
        for (const fs::path& v : victims) freed += tree_bytes(v);
        if (free >= 0 && static_cast<uint64_t>(free) < need && static_cast<uint64_t>(free) + freed >= need) {
          for (const fs::path& v : victims) {
            if (static_cast<uint64_t>(free_bytes(save_dir)) >= need) break;
            log_warning(save_dir + ": " + human_bytes(static_cast<uint64_t>(free_bytes(save_dir))) + " free, " + name + " takes about " +
                        human_bytes(need) + ": removing " + v.filename().string() +
                        " before the save (keep_last " + std::to_string(keep_last) + " rotates it out after it)");
            fs::remove_all(v);
          }
        }
      }
      fs::create_directories(tmp_dir);
    } catch (...) {
      failed = std::current_exception();
    }
  }
  agree(ctx, failed, timeout, "preparing " + tmp_dir.string());

  // The phases where one rank writes while the others wait for it (its files and their read-back,
  // then rank 0's renames and rotation) take what the disk takes: without ZeRO dp rank 0 writes
  // the whole model and optimizer, 9 GB at 50 MB/s is three minutes and its read-back three more,
  // and under comm_timeout (300 s) every save of such a run failed on the waiting ranks. These
  // waits allow a minute and 8 MiB/s for three passes over the checkpoint's bytes besides; a
  // writer stuck past that is still named by the others' timeout, and a dead one ends the job.
  const double checkpoint_bytes =
      static_cast<double>(store.global_numel()) * sizeof(float) * static_cast<double>(std::max<size_t>(1, engine.state_names().size()));
  const auto io_timeout =
      timeout + std::chrono::milliseconds(static_cast<int64_t>(
                    std::min(60'000.0 + 3.0 * checkpoint_bytes / (8.0 * 1024 * 1024) * 1000.0, 1e12)));

  // 2. Every rank that holds a part nobody else writes writes it, without gathering: its ZeRO
  // pieces (every dp rank) or, without ZeRO, the whole local buffer (dp rank 0). A parameter
  // replicated over the tp group is written by tp rank 0; the last stage's copy of a tied
  // embedding is not written (the first stage's is).
  const bool replicated = engine.span_replicated();
  const bool writer = !replicated || ctx.dp_rank() == 0;
  const int64_t dp_writers = replicated ? 1 : ctx.dp();
  const int64_t total_files = static_cast<int64_t>(ctx.pp()) * ctx.tp() * dp_writers;
  const int64_t file_index = (static_cast<int64_t>(ctx.pp_rank()) * ctx.tp() + ctx.tp_rank()) * dp_writers +
                             (replicated ? 0 : ctx.dp_rank());
  nlohmann::json report = {{"pieces", nlohmann::json::array()}, {"files", nlohmann::json::object()}};
  try {
    if (writer) {
      const std::string model_file = shard_file_name("model", file_index, total_files);
      const std::string opt_file = shard_file_name("optimizer", file_index, total_files);
      std::vector<Engine::SpanRun> runs = engine.span_runs();
      struct Piece {
        const nn::Parameter* p;
        size_t begin, end, span_at;
        std::string tensor;
        bool whole;
      };
      std::vector<Piece> pieces;
      const nn::Parameter* tied_copy = model.tied_head_copy();
      for (const nn::Parameter* p : store.parameters()) {
        if (p == tied_copy || (p->split.dim < 0 && ctx.tp_rank() != 0)) continue;
        const size_t lo = p->offset, hi = p->offset + static_cast<size_t>(p->numel());
        for (const Engine::SpanRun& r : runs) {
          size_t a = std::max(lo, r.flat_begin), b = std::min(hi, r.flat_end);
          if (a >= b) continue;
          Piece pc{p, a - lo, b - lo, r.span_begin + (a - r.flat_begin), "", false};
          pc.whole = p->tp_replicated() && pc.begin == 0 && pc.end == hi - lo && p->shape == p->unpadded_shape();
          const nn::TpPlace place = p->split.dim < 0 ? nn::TpPlace{0, 1} : p->place;
          // Whole tensors keep their Hugging Face name and shape (a one-process checkpoint's
          // model.safetensors is a Hugging Face file); parts are named by place and range.
          pc.tensor = pc.whole ? p->name
                               : p->name + "@tp" + std::to_string(place.rank) + "of" + std::to_string(place.size) + "[" +
                                     std::to_string(pc.begin) + ":" + std::to_string(pc.end) + "]";
          pieces.push_back(pc);
          report["pieces"].push_back({{"param", p->name},
                                      {"tensor", pc.tensor},
                                      {"file", model_file},
                                      {"optimizer_file", opt_file},
                                      {"tp", {place.rank, place.size}},
                                      {"shape", p->shape},
                                      {"global_shape", p->split.dim < 0 ? p->unpadded_shape() : p->global_shape},
                                      {"split", split_json(p->split)},
                                      {"begin", pc.begin},
                                      {"end", pc.end}});
        }
      }
      // A device copies each state into its own scratch, so the spans stay valid until written.
      std::vector<std::string> names = engine.state_names();
      std::vector<std::vector<float>> scratch(names.size());
      // Each piece's XXH3-64 per state goes in the index: a rank that reads a few tensors of a file
      // verifies just those.
      // A swapped state (ZeRO-Infinity) is streamed from its swap files piece by piece, hashed as
      // it is written: never staged whole.
      struct StreamedHash {
        size_t piece;
        std::string state;
        std::unique_ptr<Xxh3Stream> h;
      };
      std::vector<StreamedHash> streamed;
      auto record_hashes = [&] {
        for (StreamedHash& sh : streamed) report["pieces"][sh.piece]["xxh3"][sh.state] = sh.h->hex();
        streamed.clear();
      };
      auto add_state = [&](size_t i, const std::string& prefix, std::vector<checkpoint::StTensorOut>& out) {
        if (engine.state_swapped(names[i])) {
          for (size_t j = 0; j < pieces.size(); ++j) {
            const Piece& pc = pieces[j];
            std::vector<int64_t> shape = pc.whole ? std::vector<int64_t>(pc.p->shape.begin(), pc.p->shape.end())
                                                  : std::vector<int64_t>{static_cast<int64_t>(pc.end - pc.begin)};
            streamed.push_back({j, names[i], std::make_unique<Xxh3Stream>()});
            Xxh3Stream* h = streamed.back().h.get();
            const std::string state = names[i];
            const size_t at = pc.span_at;
            out.push_back({prefix + pc.tensor, DType::kF32, shape, nullptr,
                           [&engine, state, at, h](size_t b, size_t n, void* dst) {
                             engine.read_span_state(state, at + b, n, static_cast<float*>(dst));
                             h->update(dst, n * sizeof(float));
                           }});
          }
          return;
        }
        const float* span = engine.span_state(names[i], scratch[i]);
        for (size_t j = 0; j < pieces.size(); ++j) {
          const Piece& pc = pieces[j];
          std::vector<int64_t> shape = pc.whole ? std::vector<int64_t>(pc.p->shape.begin(), pc.p->shape.end())
                                                : std::vector<int64_t>{static_cast<int64_t>(pc.end - pc.begin)};
          out.push_back({prefix + pc.tensor, DType::kF32, shape, span + pc.span_at});
          report["pieces"][j]["xxh3"][names[i]] = xxh3_hex(span + pc.span_at, (pc.end - pc.begin) * sizeof(float));
        }
      };
      std::vector<checkpoint::StTensorOut> weights, opt_state;
      for (size_t i = 0; i < names.size(); ++i)
        if (names[i] == "master") add_state(i, "", weights);
      checkpoint::safetensors_write((tmp_dir / model_file).string(), weights, {{"format", "pt"}});
      record_hashes();
      for (auto& sc : scratch) std::vector<float>().swap(sc);  // the master's copy, if any, is written
      fault_point("checkpoint.after_weights");
      for (size_t i = 0; i < names.size(); ++i)
        if (names[i] != "master") add_state(i, names[i] + "/", opt_state);
      checkpoint::safetensors_write((tmp_dir / opt_file).string(), opt_state, {{"optimizer", engine.optimizer().type_name()}});
      record_hashes();
      for (const std::string& f : {model_file, opt_file}) {
        size_t bytes = 0;
        std::string h = file_xxh3_hex((tmp_dir / f).string(), &bytes);
        report["files"][f] = {{"bytes", bytes}, {"xxh3", h}};
      }
    }
    // State only this rank holds (a 1-bit optimizer's worker and server errors): every rank its file.
    const std::vector<optim::StateBuffer> own = engine.rank_state();
    if (!own.empty()) {
      const std::string f = rank_state_file(ctx.world->rank(), ctx.world->size());
      std::vector<checkpoint::StTensorOut> out;
      for (const optim::StateBuffer& b : own) out.push_back({b.name, DType::kF32, {static_cast<int64_t>(b.numel)}, b.data});
      checkpoint::safetensors_write((tmp_dir / f).string(), out, {{"optimizer", engine.optimizer().type_name()}});
      size_t bytes = 0;
      std::string h = file_xxh3_hex((tmp_dir / f).string(), &bytes);
      report["files"][f] = {{"bytes", bytes}, {"xxh3", h}};
    }
    // Test seam: a writer whose disk is slow (the others wait for its files).
    if (writer && fault_active("checkpoint.slow_shard")) std::this_thread::sleep_for(std::chrono::seconds(3));
  } catch (const std::exception& e) {
    report["error"] = e.what();
  }
  std::vector<std::string> reports = gather_strings(ctx, report.dump(), io_timeout);

  // 3. Rank 0 writes the index of every shard and state.json, then renames the directory in.
  if (lead) {
    try {
      nlohmann::json index = {{"format", "meshtrain-sharded-1"}, {"pieces", nlohmann::json::array()}};
      nlohmann::json files = nlohmann::json::object();
      for (size_t r = 0; r < reports.size(); ++r) {
        nlohmann::json rep = nlohmann::json::parse(reports[r]);
        if (rep.contains("error"))
          throw Error(ErrorKind::kIOError, "rank " + std::to_string(r) + " could not write its shard: " + rep["error"].get<std::string>());
        for (auto& pc : rep["pieces"]) index["pieces"].push_back(pc);
        for (auto it = rep["files"].begin(); it != rep["files"].end(); ++it) files[it.key()] = it.value();
      }
      // (dp: the data-parallel size; the ZeRO group that shards the states is dp x sp.)
      index["layout"] = {{"world", ctx.world->size()}, {"dp", ctx.data_dp()}, {"tp", ctx.tp()}, {"pp", ctx.pp()},
                         {"sp", ctx.sp()}, {"zero_stage", engine.config().zero.stage}};
      std::string index_text = index.dump(1);
      file_write_atomic((tmp_dir / kShardIndex).string(), index_text.data(), index_text.size());
      // Hugging Face's index where every tensor is whole (one process, or pipeline stages without
      // ZeRO or tp): the directory then loads as a Hugging Face sharded checkpoint.
      bool all_whole = true;
      nlohmann::json hf = {{"metadata", {{"total_size", store.global_numel() * sizeof(float)}}}, {"weight_map", nlohmann::json::object()}};
      for (const auto& pc : index["pieces"]) {
        if (pc["tensor"] != pc["param"]) all_whole = false;
        hf["weight_map"][pc["param"].get<std::string>()] = pc["file"];
      }
      std::vector<std::string> listed{kShardIndex};
      if (all_whole) {
        std::string hf_text = hf.dump(2);
        file_write_atomic((tmp_dir / "model.safetensors.index.json").string(), hf_text.data(), hf_text.size());
        listed.push_back("model.safetensors.index.json");
      }
      for (const std::string& f : listed) {
        size_t bytes = 0;
        std::string h = file_xxh3_hex((tmp_dir / f).string(), &bytes);
        files[f] = {{"bytes", bytes}, {"xxh3", h}};
      }
      const optim::LossScalerState& ls = engine.loss_scaler().state();
      nlohmann::json state = {{"format", "meshtrain-sharded-1"},
                              {"global_step", engine.global_step()},
                              {"applied_steps", engine.applied_steps()},
                              {"optimizer", engine.optimizer().type_name()},
                              {"optimizer_step", engine.optimizer().step_count()},
                              {"optimizer_states", engine.state_names()},
                              {"rank_state_world", engine.rank_state().empty() ? 0 : ctx.world->size()},
                              {"num_params", static_cast<int64_t>(store.global_numel())},
                              {"loss_scale", ls.scale},
                              {"loss_scaler", scaler_kind(engine)},
                              {"scaler_iter", ls.iter},
                              {"scaler_last_overflow_iter", ls.last_overflow_iter},
                              {"scaler_hysteresis_left", ls.hysteresis_left},
                              {"model", ds_config_resolved(engine.config())["model"]},
                              {"data", {{"next_sample", engine.consumed_samples()},
                                        {"consumed_valid_samples", engine.consumed_valid_samples()},
                                        {"seq_length", engine.config().seq_length},
                                        {"seed", engine.config().data_seed},
                                        {"shuffle", engine.config().shuffle},
                                        {"sample_order", engine.config().sample_order},
                                        {"split", engine.config().split},
                                        {"order_samples", run_samples(engine.config())},
                                        {"train", engine.config().data_train}}},
                              {"tokenizer", engine.config().tokenizer.empty() ? std::string()
                                                                              : fs::absolute(engine.config().tokenizer).string()},
                              {"tokenizer_xxh3", tokenizer_fingerprint(engine.config().tokenizer)},
                              {"files", files}};
      if (engine.config().task == "classification") {  // what `meshtrain predict` reads the records with
        const data::ClassificationFields& f = engine.config().cls_fields;
        state["classification"] = {{"texta_name", f.text_a}, {"textb_name", f.text_b}, {"label_name", f.label},
                                   {"id_name", f.id}, {"labels", f.labels},
                                   {"seq_length", engine.config().seq_length}};
      }
      // An optimizer's few values not over the span (the same on every rank): doubles, which JSON
      // writes in the shortest form that reads back to the same bits.
      nlohmann::json scalars = nlohmann::json::object();
      for (const optim::ScalarState& sc : engine.optimizer().scalar_state()) scalars[sc.name] = *sc.values;
      if (!scalars.empty()) state["optimizer_scalars"] = scalars;
      // Integrity: the size and XXH3-64 of every file as it is on disk, and of state.json itself.
      state["state_xxh3"] = state_checksum(state);
      std::string text = state.dump(2);
      file_write_atomic((tmp_dir / "state.json").string(), text.data(), text.size());
      fsync_dir(tmp_dir);
      fault_point("checkpoint.before_rename");
      if (fs::exists(final_dir)) {
        // Re-saving a step: swap the new directory in atomically (renameat2 RENAME_EXCHANGE), so
        // step-N is always a whole checkpoint, then delete the old one. Where the filesystem cannot
        // exchange, step-N moves to step-N.old first; a kill in between is repaired by the next save
        // and by checkpoint_resolve.
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

      // Rotation: the checkpoint just written (which `latest` names) is never removed, and neither
      // are checkpoints of later steps (left by a run that went further before this one resumed
      // from an earlier step: the user's to delete). Of the earlier steps, the newest keep_last - 1
      // stay. drop_others (train --overwrite, first save): every other checkpoint goes.
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
    } catch (...) {
      failed = std::current_exception();
      std::error_code ec;
      fs::remove_all(tmp_dir, ec);  // never loaded; the previous checkpoint stays the newest
    }
  }
  agree(ctx, failed, io_timeout, "saving " + final_dir.string());
  return final_dir.string();
}

std::string checkpoint_space_warning(Engine& engine, const std::string& save_dir) {
  if (save_dir.empty()) return "";
  const auto dirs = step_dirs(save_dir);
  const uint64_t need = checkpoint_need_bytes(engine, dirs);
  const int64_t free = free_bytes(save_dir);
  if (free < 0 || static_cast<uint64_t>(free) >= need) return "";
  return save_dir + ": its disk has " + human_bytes(static_cast<uint64_t>(free)) + " free and a checkpoint of this run takes about " +
         human_bytes(need) + ": the first save will fail unless room is made";
}

std::string checkpoint_resolve(const std::string& path) {
  fs::path dir = path;
  MT_CHECK(fs::exists(dir), ErrorKind::kNotFound, path + ": no such checkpoint directory");
  if (fs::exists(dir / "latest")) {
    std::vector<char> l = file_read_all((dir / "latest").string());
    std::string name(l.begin(), l.end());
    // Its surrounding white space dropped, as DeepSpeed reads it (read().strip()): a `latest`
    // written on Windows (step-9\r\n) named "step-9\r", "which does not exist" (stop 73).
    auto space = [](char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f'; };
    while (!name.empty() && space(name.back())) name.pop_back();
    name.erase(name.begin(), std::find_if_not(name.begin(), name.end(), space));
    const std::string latest = (dir / "latest").string();
    // An empty or damaged `latest`, or one naming a directory that is gone or holds no state.json,
    // names the newest intact checkpoint to resume from (it said "save_dir/: not a checkpoint").
    // Two lines, or a control character, are damage too (two lines were joined into one name).
    const bool odd = std::any_of(name.begin(), name.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x20; });
    std::string shown;
    for (char ch : name) {
      if (static_cast<unsigned char>(ch) >= 0x20) {
        shown += ch;
      } else {
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned char>(ch));
        shown += hex;
      }
    }
    if (name.empty() || odd || name.find('/') != std::string::npos || name == "." || name == "..")
      throw Error(ErrorKind::kCorruption, latest + (name.empty() ? " is empty" : " names '" + shown + "', not a step directory") +
                                              "; " + newest_intact_advice(dir, {}));
    fs::path named = dir / name;
    fs::path old = named;
    old += ".old";
    // A re-save killed between its two renames (filesystems without RENAME_EXCHANGE).
    if (!fs::exists(named) && fs::exists(old)) named = old;
    if (!fs::exists(named))
      throw Error(ErrorKind::kCorruption, latest + " names " + name + ", which does not exist; " + newest_intact_advice(dir, {}));
    if (!fs::exists(named / "state.json"))
      throw Error(ErrorKind::kCorruption,
                  latest + " names " + name + ", which has no state.json; " + newest_intact_advice(dir, named));
    dir = named;
  } else if (!fs::exists(dir / "state.json")) {
    // A save_dir whose first save was killed after step-N was renamed into place and before
    // `latest` was written: step-N is complete (it is renamed only when whole); take the newest.
    for (const auto& [step, p] : step_dirs(dir)) {
      if (fs::exists(p / "state.json")) {
        dir = p;
        break;
      }
    }
  }
  MT_CHECK(fs::exists(dir / "state.json"), ErrorKind::kNotFound, dir.string() + ": not a checkpoint (no state.json)");
  return dir.string();
}

namespace {

// One entry of the shard index: a range of one tensor-parallel place's shard of a parameter.
struct ShardPiece {
  std::string param, tensor, file, optimizer_file;
  nn::TpPlace place;
  Shape shape, global_shape;  // the place's shard, and the whole (padded for place.size) parameter
  nn::TpSplit split;
  size_t begin = 0, end = 0;
  int64_t numel = 0;  // of the shard
  nlohmann::json xxh3;  // per state
};

// Reads parameters of a sharded checkpoint in any layout: the pieces one needs, from the files
// that hold them, each file verified against state.json when first opened.
class ShardReader {
 public:
  ShardReader(fs::path dir, const nlohmann::json& state) : dir_(std::move(dir)), state_(state) {
    const std::string index_path = (dir_ / kShardIndex).string();
    std::string damage = file_damage(dir_, state_, kShardIndex);
    if (!damage.empty()) throw_damaged(dir_.string(), damage);
    nlohmann::json index = json_load_file(index_path, ErrorKind::kCorruption);
    try {
      for (const nlohmann::json& j : index.at("pieces")) {
        ShardPiece pc;
        pc.param = j.at("param").get<std::string>();
        pc.tensor = j.at("tensor").get<std::string>();
        pc.file = j.at("file").get<std::string>();
        pc.optimizer_file = j.at("optimizer_file").get<std::string>();
        pc.place = {j.at("tp").at(0).get<int>(), j.at("tp").at(1).get<int>()};
        pc.shape = j.at("shape").get<Shape>();
        pc.global_shape = j.at("global_shape").get<Shape>();
        pc.split = {j.at("split").at("dim").get<int>(), j.at("split").at("parts").get<int>(),
                    j.at("split").at("valid").get<int64_t>()};
        pc.begin = j.at("begin").get<size_t>();
        pc.end = j.at("end").get<size_t>();
        pc.numel = shape_numel(pc.shape);
        pc.xxh3 = j.value("xxh3", nlohmann::json::object());
        if (pc.place.size < 1 || pc.place.rank < 0 || pc.place.rank >= pc.place.size || pc.begin >= pc.end ||
            pc.end > static_cast<size_t>(pc.numel) || pc.global_shape.size() > 2)
          throw Error(ErrorKind::kCorruption, index_path + ": piece " + pc.tensor + " has an impossible place or range");
        by_param_[pc.param].push_back(std::move(pc));
      }
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorKind::kCorruption, index_path + ": malformed: " + e.what());
    }
  }

  bool has(const std::string& name) const { return by_param_.count(name) > 0; }
  // Throws, naming the index, unless the checkpoint holds `name` whole as `whole` (one-process
  // shape), in every piece: what read() checks, before anything is read.
  void check(const std::string& name, const Shape& whole) const {
    const std::string index_path = (dir_ / kShardIndex).string();
    auto it = by_param_.find(name);
    MT_CHECK(it != by_param_.end(), ErrorKind::kInvalidArgument, index_path + ": the checkpoint has no parameter " + name);
    for (const ShardPiece& pc : it->second)
      MT_CHECK(nn::tp_unpadded_shape(pc.global_shape, pc.split) == whole, ErrorKind::kInvalidArgument,
               index_path + ": " + name + " has shape " + shape_str(nn::tp_unpadded_shape(pc.global_shape, pc.split)) +
                   " in the checkpoint, " + shape_str(whole) + " in this model");
  }

  // out = the shard at `place` (numel elements) of parameter `name` whose whole shape, padded for
  // place.size, is global_shape, of state `state` ("master" or an optimizer buffer).
  // need: the element ranges of the shard wanted (null: all of it); pieces outside them are not read.
  void read(const std::string& state, const std::string& name, const Shape& global_shape, const nn::TpSplit& split,
            nn::TpPlace place, int64_t numel, float* out, const std::vector<std::pair<size_t, size_t>>* need = nullptr) {
    const std::string index_path = (dir_ / kShardIndex).string();
    auto it = by_param_.find(name);
    MT_CHECK(it != by_param_.end(), ErrorKind::kInvalidArgument, index_path + ": the checkpoint has no parameter " + name);
    const Shape whole = nn::tp_unpadded_shape(global_shape, split);
    const nn::TpPlace want = split.dim < 0 ? nn::TpPlace{0, 1} : place;
    // Saved at the same place: copy the pieces straight in.
    std::vector<const ShardPiece*> same;
    for (const ShardPiece& pc : it->second) {
      MT_CHECK(nn::tp_unpadded_shape(pc.global_shape, pc.split) == whole, ErrorKind::kInvalidArgument,
               index_path + ": " + name + " has shape " + shape_str(nn::tp_unpadded_shape(pc.global_shape, pc.split)) +
                   " in the checkpoint, " + shape_str(whole) + " in this model");
      if (pc.place.rank == want.rank && pc.place.size == want.size && pc.numel == numel) same.push_back(&pc);
    }
    if (!same.empty() && covers(same, numel)) {
      for (const ShardPiece* pc : same) {
        bool wanted = !need;
        for (size_t k = 0; need && k < need->size(); ++k)
          wanted = wanted || ((*need)[k].first < pc->end && pc->begin < (*need)[k].second);
        if (wanted) copy_piece(*pc, state, out + pc->begin);
      }
      return;
    }
    // Another tensor-parallel split: put the whole parameter together from every place's pieces,
    // then cut this place's shard out of it.
    std::map<int, std::vector<const ShardPiece*>> by_rank;
    int saved_tp = 0;
    for (const ShardPiece& pc : it->second) {
      MT_CHECK(saved_tp == 0 || saved_tp == pc.place.size, ErrorKind::kCorruption,
               index_path + ": " + name + " is saved at two tensor-parallel sizes");
      saved_tp = pc.place.size;
      by_rank[pc.place.rank].push_back(&pc);
    }
    MT_CHECK(static_cast<int>(by_rank.size()) == saved_tp, ErrorKind::kCorruption,
             index_path + ": " + name + ": pieces of " + std::to_string(by_rank.size()) + " of its " +
                 std::to_string(saved_tp) + " tensor-parallel shards");
    std::vector<float> full(static_cast<size_t>(shape_numel(whole)));
    for (auto& [rank, pieces] : by_rank) {
      const ShardPiece& first = *pieces.front();
      MT_CHECK(covers(pieces, first.numel), ErrorKind::kCorruption,
               index_path + ": the pieces of " + name + " do not cover tensor-parallel shard " + std::to_string(rank));
      std::vector<float> shard(static_cast<size_t>(first.numel));
      for (const ShardPiece* pc : pieces) copy_piece(*pc, state, shard.data() + pc->begin);
      nn::tp_insert(full.data(), shard.data(), first.global_shape, first.split, first.place);
    }
    nn::tp_extract(out, full.data(), global_shape, split, place);
  }
  // Closes the files opened so far (the weights' once the master is read).
  void close_files() { files_.clear(); }
  // Every file opened so far, in order.
  const std::vector<std::string>& opened() const { return opened_; }

 private:
  static bool covers(std::vector<const ShardPiece*>& pieces, int64_t numel) {
    std::sort(pieces.begin(), pieces.end(), [](const ShardPiece* a, const ShardPiece* b) { return a->begin < b->begin; });
    size_t at = 0;
    for (const ShardPiece* pc : pieces) {
      if (pc->begin != at || pc->numel != pieces.front()->numel) return false;
      at = pc->end;
    }
    return at == static_cast<size_t>(numel);
  }
  void copy_piece(const ShardPiece& pc, const std::string& state, float* out) {
    const bool master = state == "master";
    const checkpoint::SafetensorsFile& f = file(master ? pc.file : pc.optimizer_file);
    const std::string tensor = master ? pc.tensor : state + "/" + pc.tensor;
    std::vector<float> v;
    try {
      v = f.read_f32(tensor);
    } catch (const Error& e) {  // a damaged header: a tensor gone, renamed or of another dtype
      if (e.kind() == ErrorKind::kIOError) throw;
      throw_damaged(dir_.string(), e.what());
    }
    MT_CHECK(v.size() == pc.end - pc.begin, ErrorKind::kCorruption,
             f.path() + ": tensor " + tensor + " has " + std::to_string(v.size()) + " elements, the index says " +
                 std::to_string(pc.end - pc.begin));
    const std::string want = pc.xxh3.value(state, std::string()), got = xxh3_hex(v.data(), v.size() * sizeof(float));
    if (want != got)
      throw_damaged(dir_.string(), f.path() + " is corrupt (tensor " + tensor + ": XXH3 " + got + ", the index recorded " +
                                       (want.empty() ? std::string("none") : want) + ")");
    std::copy(v.begin(), v.end(), out);
  }
  const checkpoint::SafetensorsFile& file(const std::string& name) {
    auto it = files_.find(name);
    if (it != files_.end()) return *it->second;
    MT_CHECK(name.find('/') == std::string::npos && name.find("..") == std::string::npos, ErrorKind::kCorruption,
             (dir_ / kShardIndex).string() + ": names a file outside the checkpoint: " + name);
    // Its size as recorded; its header read and checked; each tensor read is checked against the
    // index's XXH3 (the whole file's is in state.json, for checkpoint_verify).
    const fs::path fp = dir_ / name;
    MT_CHECK(state_["files"].contains(name), ErrorKind::kCorruption, (dir_ / "state.json").string() + " does not list " + name);
    std::error_code ec;
    const int64_t bytes = fs::exists(fp, ec) ? static_cast<int64_t>(fs::file_size(fp, ec)) : -1;
    if (bytes < 0) throw_damaged(dir_.string(), fp.string() + " is missing");
    if (bytes != state_["files"][name].value("bytes", int64_t{-1}))
      throw_damaged(dir_.string(), fp.string() + " is truncated or extended (" + std::to_string(bytes) +
                                       " bytes, the checkpoint recorded " +
                                       std::to_string(state_["files"][name].value("bytes", int64_t{-1})) + ")");
    opened_.push_back(name);
    try {
      return *(files_[name] = std::make_unique<checkpoint::SafetensorsFile>(fp.string(), true));
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::kIOError) throw;
      throw_damaged(dir_.string(), e.what());
    }
  }

  fs::path dir_;
  nlohmann::json state_;
  std::map<std::string, std::vector<ShardPiece>> by_param_;
  std::map<std::string, std::unique_ptr<checkpoint::SafetensorsFile>> files_;
  std::vector<std::string> opened_;
};

// The checkpoint's model against the run's, key by key (those both name): a key that changes the
// function but not the parameters' shapes (n_head with the same width, the activation, a norm's
// eps, RoPE's theta) would load the weights into another model without a word. It is refused,
// naming the keys. What acts at initialization only may differ: the initializer's range, and
// init_from (the weights a new run started from, a path as typed: a moved base model, or
// `./hf/gpt2` for an absolute path, refused the resume).
void check_same_model(const fs::path& dir, const nlohmann::json& saved, const nlohmann::json& mine) {
  if (!saved.is_object() || !mine.is_object()) return;
  std::string refused;
  for (const auto& [key, value] : saved.items()) {
    // The special ids name tokens, not the architecture (a run may give the tokenizer's own).
    if (!mine.contains(key) || mine[key] == value || key == "initializer_range" || key == "init_from" ||
        key == "bos_token_id" || key == "eos_token_id")
      continue;
    refused += (refused.empty() ? "" : ", ") + key + " " + value.dump() + " -> " + mine[key].dump();
  }
  // LLaMA's pad_token_id is a padding row since DESIGN-NOTES 117: a checkpoint from before names
  // none, and trained the row.
  if (mine.contains("pad_token_id") && !mine["pad_token_id"].is_null() && !saved.contains("pad_token_id"))
    refused += (refused.empty() ? "" : ", ") + std::string("pad_token_id (none: the row trained) -> ") + mine["pad_token_id"].dump();
  MT_CHECK(refused.empty(), ErrorKind::kInvalidArgument,
           (dir / "state.json").string() + ": the checkpoint's model differs from this run's: " + refused +
               " (resume with the checkpoint's model, or start a new run from its weights with model.init_from)");
}

// The special ids the checkpoint's model names and this run's does not, or names otherwise: a run
// may give its tokenizer's own, so they are not refused, but a resume whose config gives none
// saved the next checkpoint (and its export) without the ids the model was trained to stop at,
// without a word (stop 75's note; stop 77). One line, empty when nothing changes.
std::string special_id_changes(const fs::path& dir, const nlohmann::json& saved, const nlohmann::json& mine) {
  if (!saved.is_object() || !mine.is_object()) return "";
  std::string changed;
  for (const char* key : {"bos_token_id", "eos_token_id"}) {
    if (!saved.contains(key) || saved[key].is_null() || (mine.contains(key) && mine[key] == saved[key])) continue;
    changed += (changed.empty() ? "" : ", ") + std::string(key) + " " + saved[key].dump() + " -> " +
               (mine.contains(key) && !mine[key].is_null() ? mine[key].dump() : std::string("none"));
  }
  if (changed.empty()) return "";
  return (dir / "state.json").string() + ": the checkpoint's model names " + changed +
         "; this run's config is what its next checkpoint and export carry (give the model's ids in its model block to keep them)";
}

// Optimizer step count, loss scaler, counters; warns when the data order will not continue.
void restore_counters(Engine& engine, const fs::path& dir, const nlohmann::json& state) {
  // Said once, by rank 0 (every rank said each line, stop 73).
  const bool lead = engine.parallel().world->rank() == 0;
  auto warn = [lead](const std::string& m) {
    if (lead) log_warning(m);
  };
  auto info = [lead](const std::string& m) {
    if (lead) log_info(m);
  };
  try {
    engine.optimizer().set_step_count(state.at("optimizer_step").get<int64_t>());
    for (const optim::ScalarState& sc : engine.optimizer().scalar_state()) {
      std::vector<double> v = state.at("optimizer_scalars").at(sc.name).get<std::vector<double>>();
      MT_CHECK(v.size() == sc.values->size(), ErrorKind::kInvalidArgument,
               (dir / "state.json").string() + ": optimizer_scalars." + sc.name + " has " + std::to_string(v.size()) +
                   " values, the optimizer " + std::to_string(sc.values->size()) + " (another model?)");
      *sc.values = std::move(v);
    }
    // The scaler's state goes on only from a checkpoint of fp16's dynamic scaler into another: an
    // f32 checkpoint resumed in fp16 trained at its scale of 1 (the minimum: the first overflow
    // ended the run), a static fp16 scale was replaced by the checkpoint's, and a bf16 run resumed
    // from fp16 trained with fp16's scale. Checkpoints before the key restore as they did.
    const std::string kind = scaler_kind(engine), saved = state.value("loss_scaler", std::string("dynamic"));
    if (kind == "dynamic" && saved == "dynamic") {
      optim::LossScalerState ls;
      ls.scale = state.at("loss_scale").get<double>();
      ls.iter = state.at("scaler_iter").get<int64_t>();
      ls.last_overflow_iter = state.at("scaler_last_overflow_iter").get<int64_t>();
      ls.hysteresis_left = state.at("scaler_hysteresis_left").get<int>();
      engine.loss_scaler().set_state(ls);
    } else if (kind != saved) {
      warn((dir / "state.json").string() + ": saved with loss scaler \"" + saved + "\", this run has \"" + kind +
                  "\": the scale starts from this run's configuration");
    }
    engine.set_counters(state.at("global_step").get<int64_t>(), state.at("applied_steps").get<int64_t>());
    // The data position follows from the step; the order from the seed and shuffle, which the
    // resumed run must share to continue the same curve.
    if (state.contains("data")) {
      const nlohmann::json& d = state["data"];
      const RunConfig& c = engine.config();
      // The data goes on from the samples the checkpoint's steps consumed (with another batch size
      // than the checkpoint's, not from step × this run's batch: no sample skipped or repeated).
      int64_t next = d.at("next_sample").get<int64_t>();
      // Samples of another seq_length: the data goes on at the token the checkpoint reached (a
      // sample of this run's length rounded up), not at that many samples of this length (which
      // trained tokens 128-255 again after 8 samples of 32 resumed at 16).
      const int64_t their_len = d.value("seq_length", c.seq_length);
      if (their_len != c.seq_length && their_len > 0 && c.task != "classification") {  // (records there)
        const int64_t tokens = next * their_len;
        next = (tokens + c.seq_length - 1) / c.seq_length;
        warn((dir / "state.json").string() + ": written with seq_length " + std::to_string(their_len) + "; this run's is " +
                    std::to_string(c.seq_length) + ", so the data continues at token " + std::to_string(tokens) + " (sample " +
                    std::to_string(next) + " of this length)" +
                    (c.shuffle ? "; the shuffled order at this length is another one, so some samples repeat or are skipped" : ""));
      }
      engine.set_consumed_samples(next);
      // Megatron's consumed_valid_samples: the validation data goes on from it (a checkpoint
      // without it, or -1: from the evaluations the steps imply).
      const int64_t valid_next = d.value("consumed_valid_samples", int64_t{-1});
      MT_CHECK(valid_next >= -1, ErrorKind::kCorruption,
               (dir / "state.json").string() + ": data.consumed_valid_samples " + std::to_string(valid_next) + " is negative");
      engine.set_consumed_valid_samples(valid_next);
      if (next != engine.global_step() * c.batch.train_batch_size)
        info((dir / "state.json").string() + ": the data continues at sample " + std::to_string(next) +
                 ", where the checkpoint's " + std::to_string(engine.global_step()) + " steps stopped (this run's batch is " +
                 std::to_string(c.batch.train_batch_size) + ")");
      if (d.contains("train") && d["train"].is_string() && d["train"].get<std::string>() != c.data_train)
        warn((dir / "state.json").string() + ": written with data.train " + d["train"].get<std::string>() +
                    "; this run trains on " + c.data_train + " from sample " + std::to_string(next));
      if (d.at("seed").get<uint64_t>() != c.data_seed || d.at("shuffle").get<bool>() != c.shuffle)
        warn((dir / "state.json").string() + ": written with data seed " + std::to_string(d.at("seed").get<uint64_t>()) +
                    " shuffle " + (d.at("shuffle").get<bool>() ? "true" : "false") +
                    "; this run's differ, so the data order will not continue the checkpoint's");
      const std::string their_order = d.value("sample_order", std::string("meshtrain"));
      if (their_order != c.sample_order)
        warn((dir / "state.json").string() + ": written with data.sample_order \"" + their_order + "\"; this run's is \"" +
                    c.sample_order + "\", so the data order will not continue the checkpoint's");
      const std::string their_split = d.value("split", std::string());
      bool same_split = their_split == c.split;
      if (!same_split && !their_split.empty() && !c.split.empty()) {  // "969,30,1" is "969, 30, 1"
        try {
          same_split = data::megatron_split_parse(their_split) == c.split_weights;
        } catch (const Error&) {
        }
      }
      if (!same_split)
        warn((dir / "state.json").string() + ": written with data.split \"" + d.value("split", std::string()) +
                    "\"; this run's is \"" + c.split + "\", so it trains on other sequences than the checkpoint's");
      const int64_t samples = run_samples(c);
      if (their_order == "megatron" && c.sample_order == "megatron" && d.contains("order_samples") &&
          d["order_samples"].get<int64_t>() != samples)
        warn((dir / "state.json").string() + ": Megatron's order was built for " +
                    std::to_string(d["order_samples"].get<int64_t>()) + " samples there and is built for " +
                    std::to_string(samples) + " (train_iters x train_batch_size) here, as Megatron rebuilds its index; "
                    "where the two need different epochs of the data, the order will not continue the checkpoint's");
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kCorruption, (dir / "state.json").string() + ": missing or malformed field: " + e.what());
  }
}

// A checkpoint of an older meshtrain: rank 0 wrote the whole model to model.safetensors and the
// optimizer's flat buffers to optimizer.safetensors; every rank reads them whole.
void legacy_load(Engine& engine, const fs::path& dir) {
  checkpoint_verify(dir.string());
  nn::ParamStore& store = engine.model().store();
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
}

}  // namespace

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
  info.sharded = state.contains("format");
  info.weights = (fs::path(info.dir) / "model.safetensors").string();
  return info;
}

CheckpointProgress checkpoint_progress(const std::string& path) {
  const fs::path dir = checkpoint_resolve(path);
  const std::string state_path = (dir / "state.json").string();
  // Verified as checkpoint_load verifies it: a damaged count sized the run's datasets before the
  // load said what was wrong (and one near 2^63 overflowed the sizing).
  nlohmann::json state;
  if (const std::string damage = state_damage(dir, &state); !damage.empty()) throw Error(ErrorKind::kCorruption, damage);
  CheckpointProgress p;
  try {
    p.global_step = state.at("global_step").get<int64_t>();
    if (state.contains("data")) {
      p.consumed_samples = state["data"].at("next_sample").get<int64_t>();
      p.consumed_valid_samples = state["data"].value("consumed_valid_samples", int64_t{-1});
      p.seq_length = state["data"].value("seq_length", int64_t{-1});
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kCorruption, state_path + ": missing or malformed field: " + e.what());
  }
  constexpr int64_t kMost = int64_t{1} << 52;  // past any run's samples, and far from overflow
  for (const int64_t v : {p.global_step, p.consumed_samples, p.consumed_valid_samples, p.seq_length})
    MT_CHECK(v >= -1 && v <= kMost, ErrorKind::kCorruption,
             state_path + ": a step or sample count of " + std::to_string(v) + " is out of range");
  return p;
}

namespace {

// A sharded checkpoint's master weights, a parameter at a time, in the store's layout.
class CheckpointWeights : public WeightSource {
 public:
  CheckpointWeights(const CheckpointInfo& info, const nn::ParamStore& store, bool speak)
      : dir_(info.dir),
        state_(json_load_file((fs::path(info.dir) / "state.json").string(), ErrorKind::kCorruption)),
        reader_(info.dir, state_) {
    for (const nn::Parameter* p : store.parameters()) {
      // A classifier started from a causal LM's checkpoint: score.weight keeps its initial values.
      if (p->name == "score.weight" && !reader_.has(p->name)) {
        if (speak)
          log_warning(info.dir + " has no score.weight (a causal LM): the classification head starts from its initial "
                    "values");
        missing_.push_back(p);
        continue;
      }
      reader_.check(p->name, p->unpadded_shape());  // every parameter there, its shape the model's: before any read
    }
  }
  bool read(const nn::Parameter& p, float* dst) override {
    if (std::find(missing_.begin(), missing_.end(), &p) != missing_.end()) return false;
    reader_.read("master", p.name, p.global_shape, p.split, p.place, p.numel(), dst);
    return true;
  }

 private:
  std::string dir_;
  nlohmann::json state_;
  ShardReader reader_;
  std::vector<const nn::Parameter*> missing_;
};

}  // namespace

std::unique_ptr<WeightSource> checkpoint_weights(const CheckpointInfo& info, const nn::ParamStore& store, bool speak) {
  if (!info.sharded) return std::make_unique<HfWeights>(info.weights, store, speak);
  return std::make_unique<CheckpointWeights>(info, store, speak);
}

void checkpoint_load_weights(const CheckpointInfo& info, nn::ParamStore& store) {
  weights_load(*checkpoint_weights(info, store), store);
}

bool is_checkpoint_path(const std::string& path) {
  const fs::path p = path;
  const fs::path d = fs::is_directory(p) ? p : p.parent_path();
  return fs::exists(d / "state.json") || fs::exists(p / "latest");
}

std::unique_ptr<WeightSource> init_from_weights(const std::string& path, const nn::ParamStore& store, bool speak) {
  // A meshtrain checkpoint (a step-N directory, or a file in one) is verified first. Sharded or not,
  // and saved in any layout: this rank's parameters from their pieces.
  fs::path p = path;
  fs::path d = fs::is_directory(p) ? p : p.parent_path();
  if (fs::exists(d / "state.json")) return checkpoint_weights(checkpoint_info(d.string()), store, speak);
  if (fs::exists(p / "latest")) return checkpoint_weights(checkpoint_info(p.string()), store, speak);
  return std::make_unique<HfWeights>(path, store, speak);
}

// A 1-bit optimizer's error buffers: restored when the checkpoint was saved by as many ranks (each
// rank reads its own file), else left at zero with a warning (what DeepSpeed does on every load).
void load_rank_state(Engine& engine, const fs::path& dir, const nlohmann::json& state, std::vector<std::string>& read) {
  const std::vector<optim::StateBuffer> own = engine.rank_state();
  if (own.empty()) return;
  const parallel::ParallelContext& ctx = engine.parallel();
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(engine.config().comm_timeout_s * 1000.0));
  std::exception_ptr failed;
  bool restored = false;
  try {
    const int saved = state.value("rank_state_world", 0);
    const std::string f = rank_state_file(ctx.world->rank(), ctx.world->size());
    if (saved == ctx.world->size() && state.contains("files") && state["files"].contains(f)) {
      std::string bad = file_damage(dir, state, f);
      if (!bad.empty()) throw_damaged(dir.string(), bad);
      checkpoint::SafetensorsFile file((dir / f).string());
      // Buffers of another layout (saved under another precision, or before the exchange
      // compressed tensor by tensor) start at zero, as on another world size.
      bool same = true;
      for (const optim::StateBuffer& b : own) {
        const checkpoint::StTensorInfo* t = file.find(b.name);
        same = same && t != nullptr && t->shape == std::vector<int64_t>{static_cast<int64_t>(b.numel)};
      }
      if (same) {
        for (const optim::StateBuffer& b : own) {
          std::vector<float> v = file.read_f32(b.name, {static_cast<int64_t>(b.numel)});
          std::copy(v.begin(), v.end(), b.data);
        }
        read.push_back(f);
        restored = true;
        engine.rank_state_loaded();
      }
    }
  } catch (...) {
    failed = std::current_exception();
  }
  agree(ctx, failed, timeout, "loading checkpoint " + dir.string());
  if (!restored && ctx.world->rank() == 0)
    log_warning(dir.string() + ": no error-feedback buffers of this layout saved by " + std::to_string(ctx.world->size()) +
                " ranks: " + engine.optimizer().type_name() + " starts them at zero");
}

std::vector<std::string> checkpoint_load(Engine& engine, const std::string& path) {
  const parallel::ParallelContext& ctx = engine.parallel();
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(engine.config().comm_timeout_s * 1000.0));
  fs::path dir;
  nlohmann::json state;
  std::unique_ptr<ShardReader> reader;
  nn::ParamStore& store = engine.model().store();
  std::exception_ptr failed;
  try {
    dir = checkpoint_resolve(path);
    std::string damage = state_damage(dir, &state);
    if (!damage.empty()) throw_damaged(dir.string(), damage);
    if (!state.contains("state_xxh3"))
      log_warning((dir / "state.json").string() + ": written without checksums (an older meshtrain): not verified");
    if (state.contains("model")) {
      const nlohmann::json mine = ds_config_resolved(engine.config())["model"];
      check_same_model(dir, state["model"], mine);
      const std::string ids = special_id_changes(dir, state["model"], mine);
      if (!ids.empty() && ctx.world->rank() == 0) log_warning(ids);
    }
    // Another tokenizer gives the same ids other tokens (text data is tokenized again by it): it
    // was resumed without a word.
    const std::string their_tok = state.value("tokenizer_xxh3", std::string()),
                      my_tok = tokenizer_fingerprint(engine.config().tokenizer);
    MT_CHECK(their_tok.empty() || my_tok.empty() || their_tok == my_tok, ErrorKind::kInvalidArgument,
             (dir / "state.json").string() + ": written with the tokenizer " + state.value("tokenizer", std::string()) +
                 "; this run's " + engine.config().tokenizer +
                 " is another one (its ids are other tokens): give the checkpoint's tokenizer (data.tokenizer)");
    MT_CHECK(state.value("num_params", int64_t{-1}) == static_cast<int64_t>(store.global_numel()), ErrorKind::kInvalidArgument,
             (dir / "state.json").string() + ": the checkpoint's model has a different parameter count");
    if (state.contains("format")) {
      MT_CHECK(state["format"] == "meshtrain-sharded-1", ErrorKind::kNotSupported,
               (dir / "state.json").string() + ": format " + state["format"].dump() + " is newer than this meshtrain reads");
      std::string saved = state.value("optimizer", std::string("?")), want = engine.optimizer().type_name();
      MT_CHECK(saved == want, ErrorKind::kInvalidArgument,
               (dir / "state.json").string() + ": the checkpoint's optimizer is " + saved + ", the config's " + want);
      // The same optimizer keeping another state (SGD's momentum_buffer, kept only with a momentum):
      // the missing buffer was read as a damaged checkpoint, "no tensor named ...; no intact
      // checkpoint is left beside it" (stop 73). Checkpoints before the list are read as before.
      if (state.contains("optimizer_states") && state["optimizer_states"].is_array())
        for (const std::string& name : engine.state_names()) {
          const auto& had = state["optimizer_states"];
          MT_CHECK(std::find(had.begin(), had.end(), name) != had.end(), ErrorKind::kInvalidArgument,
                   (dir / "state.json").string() + ": the checkpoint's " + saved + " kept no '" + name +
                       "' (another setting: " + (name == "momentum_buffer" ? "momentum 0 there" : "see its state.json") +
                       "); this run's keeps one. Resume with the checkpoint's setting, or start from its weights "
                       "(model.init_from) with a new optimizer state");
        }
      // The small files (the indexes) on every rank; each shard file by the ranks that read it
      // (every one is read by some rank, whatever the new layout).
      for (auto it = state["files"].begin(); it != state["files"].end(); ++it) {
        if (fs::path(it.key()).extension() == ".safetensors") continue;
        std::string bad = file_damage(dir, state, it.key());
        if (!bad.empty()) throw_damaged(dir.string(), bad);
      }
      reader = std::make_unique<ShardReader>(dir, state);
    }
  } catch (...) {
    failed = std::current_exception();
  }
  agree(ctx, failed, timeout, "loading checkpoint " + path);
  std::vector<std::string> read{"model.safetensors", "optimizer.safetensors"};
  if (!reader) {
    legacy_load(engine, dir);
  } else {
    // Each rank reads the parameters its span holds (its ZeRO pieces, or its whole stage and
    // tensor-parallel shard), each from the pieces that hold it, in whatever layout they were saved.
    const std::vector<Engine::SpanRun> runs = engine.span_runs();
    // The parameter's elements of this rank's span runs (of its local shard), empty if none.
    auto needed = [&runs](const nn::Parameter* p) {
      const size_t lo = p->offset, hi = p->offset + static_cast<size_t>(p->numel());
      std::vector<std::pair<size_t, size_t>> need;
      for (const Engine::SpanRun& r : runs)
        if (r.flat_begin < hi && lo < r.flat_end) need.emplace_back(std::max(lo, r.flat_begin) - lo, std::min(hi, r.flat_end) - lo);
      return need;
    };
    std::vector<const nn::Parameter*> by_offset(store.parameters().begin(), store.parameters().end());
    std::sort(by_offset.begin(), by_offset.end(), [](const nn::Parameter* a, const nn::Parameter* b) { return a->offset < b->offset; });
    for (const std::string& name : engine.state_names()) {
      const bool swapped = engine.state_swapped(name);
      std::vector<float> local;
      try {
        if (swapped) {
          // ZeRO-Infinity: straight into the swap, one parameter in memory at a time (the flat
          // ranges come in increasing order, so each parameter is read once).
          size_t next = 0;  // by_offset index of the first parameter not wholly behind
          const nn::Parameter* held = nullptr;
          std::vector<float> value;
          engine.load_swapped_state(name, [&](size_t begin, size_t n, float* dst) {
            std::fill(dst, dst + n, 0.0f);
            const size_t end = begin + n;
            while (next < by_offset.size() && by_offset[next]->offset + static_cast<size_t>(by_offset[next]->numel()) <= begin) ++next;
            for (size_t i = next; i < by_offset.size() && by_offset[i]->offset < end; ++i) {
              const nn::Parameter* p = by_offset[i];
              if (p != held) {
                const std::vector<std::pair<size_t, size_t>> need = needed(p);
                value.assign(static_cast<size_t>(p->numel()), 0.0f);
                reader->read(name, p->name, p->global_shape, p->split, p->place, p->numel(), value.data(), &need);
                held = p;
              }
              const size_t a = std::max(begin, p->offset), b = std::min(end, p->offset + value.size());
              std::copy(value.begin() + static_cast<std::ptrdiff_t>(a - p->offset), value.begin() + static_cast<std::ptrdiff_t>(b - p->offset),
                        dst + (a - begin));
            }
          });
        } else {
          local.assign(store.numel(), 0.0f);
          for (const nn::Parameter* p : by_offset) {
            const std::vector<std::pair<size_t, size_t>> need = needed(p);
            if (!need.empty())
              reader->read(name, p->name, p->global_shape, p->split, p->place, p->numel(), local.data() + p->offset, &need);
          }
        }
        if (name == "master") reader->close_files();
      } catch (...) {
        failed = std::current_exception();
      }
      agree(ctx, failed, timeout, "loading checkpoint " + dir.string());
      if (!swapped) engine.load_local_state(name, local.data());
      else if (name == "master") engine.refresh_params();
    }
    read = reader->opened();
  }
  restore_counters(engine, dir, state);
  load_rank_state(engine, dir, state, read);
  return read;
}

}  // namespace mt::engine

namespace mt::engine {

bool checkpoint_dir_has_checkpoints(const std::string& save_dir) {
  std::error_code ec;
  return fs::exists(fs::path(save_dir) / "latest", ec) || !step_dirs(save_dir).empty();
}

void checkpoint_dir_check_run(const std::string& save_dir, const std::string& resume, bool overwrite) {
  if (save_dir.empty() || overwrite || !checkpoint_dir_has_checkpoints(save_dir)) return;
  if (resume.empty())
    throw Error(ErrorKind::kInvalidArgument,
                "save_dir " + save_dir + " already holds checkpoints of an earlier run; pass --resume " + save_dir +
                    " to continue it, or --overwrite to start a new run there (its first save removes them)");
  std::error_code ec;
  const fs::path dir = fs::weakly_canonical(save_dir, ec);
  fs::path r = fs::weakly_canonical(resume, ec);
  for (int up = 0; up < 3 && !r.empty(); ++up, r = r.parent_path())  // save_dir, step-N, top_k/step-N
    if (r == dir) return;
  throw Error(ErrorKind::kInvalidArgument,
              "save_dir " + save_dir + " holds checkpoints of another run than --resume " + resume +
                  " (its saves would replace and rotate them); give a save_dir of its own, --resume " + save_dir +
                  " to continue the run it holds (a job requeued after it saved there), or --overwrite to replace them "
                  "(its first save removes them)");
}

std::unique_ptr<HeldLock> checkpoint_dir_hold(const std::string& save_dir) {
  std::error_code ec;
  fs::create_directories(save_dir, ec);  // ds_config_check_paths said why where it cannot be
  return std::make_unique<HeldLock>((fs::path(save_dir) / ".lock").string(), "save_dir " + save_dir,
                                    "give each run its own save_dir, or stop the other run first");
}

}  // namespace mt::engine
