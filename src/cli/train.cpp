// meshtrain train CONFIG [--set k=v] [--resume DIR] [--metrics FILE]: trains on one process, or on
// every rank of an MPI job (`meshtrain launch -n N -- train ...`, or mpirun directly): data
// parallel with ZeRO as zero_optimization says. Rank 0 alone prints, writes metrics and saves;
// each rank reads only its own samples of every global batch. A rank that fails prints one line
// naming itself and aborts the job (MPI_Abort), so none is left waiting.
// Data: data.train / data.valid are Megatron indexed-dataset prefixes (PREFIX.bin + PREFIX.idx, with
// PREFIX.mask.bin/.idx as its loss mask when present) or .txt/.jsonl files tokenized on first use.
// A progress bar on a terminal, plain lines (every steps_per_print) otherwise; --metrics appends
// one JSON object per step.
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <ctime>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "base/file_io.h"
#include "base/error.h"
#include "base/fault.h"
#include "base/log.h"
#include "base/timer.h"
#include "comm/comm_log.h"
#include "comm/mpi_backend.h"
#include "comm/onebit.h"
#include "cli/commands.h"
#include "data/megatron_order.h"
#include "data/token_source.h"
#include "engine/checkpoint_io.h"
#include "engine/corpus.h"
#include "engine/engine.h"
#include "engine/flops_profiler.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gemm.h"
#include "models/config.h"

namespace mt::cli {
namespace fs = std::filesystem;

std::shared_ptr<comm::Backend> mpi_world() {
  if (!std::getenv("OMPI_COMM_WORLD_SIZE")) return nullptr;
  return comm::mpi_init(nullptr, nullptr);
}

namespace {

struct TrainArgs {
  engine::ConfigSources src;
  std::string resume, metrics;
  bool overwrite = false;
};

// SIGTERM / SIGINT: the first asks the run to stop after the current step (and save); a second
// one a second or more later (from the same sender: 10 s from the other, below) ends the process
// at once with the default action. One within the second is the same request arriving twice: a scheduler (Slurm's scancel or time limit, a
// systemd stop) signals every process of the job, so a rank under `launch` gets the SIGTERM itself
// and mpirun's forwarded SIGUSR1 together, and taking the second as "end now" lost the save. The
// forwarded copy can come later than that (launch, mpirun and, across hosts, orted relay it, each
// waiting for a core on a loaded host): one from the other sender (forwarded after direct, or
// direct after forwarded) is the same request for 10 s.
std::atomic<int> g_stop_signal{0};  // written by the handler on the signal thread, read by the loop
static_assert(std::atomic<int>::is_always_lock_free);
volatile std::sig_atomic_t g_stop_forwarded = 0;  // the first came from launch (SIGUSR1/2)
timespec g_stop_at{};

// SIGUSR1 and SIGUSR2 are `launch`'s SIGTERM and SIGINT: mpirun passes them to every rank and
// lets the job run on, where its own SIGTERM/SIGINT kill the ranks about a second later, in the
// middle of the stop's save (DESIGN-NOTES 77). SIGHUP (a closed terminal) stops as SIGTERM does.
void on_stop_signal(int sig) {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  const bool forwarded = sig == SIGUSR1 || sig == SIGUSR2;
  if (g_stop_signal.load() != 0) {
    const double since = static_cast<double>(now.tv_sec - g_stop_at.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec - g_stop_at.tv_nsec);
    if (since < ((forwarded ? 1 : 0) != g_stop_forwarded ? 10.0 : 1.0)) return;  // the same request, from another sender
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_stop_at = now;
  g_stop_forwarded = forwarded ? 1 : 0;
  g_stop_signal.store(sig == SIGUSR1 ? SIGTERM : sig == SIGUSR2 ? SIGINT : sig);
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2}) sigaddset(&sa.sa_mask, sig);  // one at a time
  sa.sa_flags = 0;
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2}) {
    struct sigaction now {};
    sigaction(sig, nullptr, &now);
    if (now.sa_handler != SIG_IGN && now.sa_handler != on_stop_signal) sigaction(sig, &sa, nullptr);  // nohup's SIGHUP stays ignored
  }
}

// One process only: under MPI a SIGPIPE is also a dead peer's socket, which the backend ignores
// (mpi_backend.cpp), and the ranks' output goes to mpirun.
void install_pipe_stop_handler() {
  // Standard output closed under the run (`| head`, a log collector gone): SIGPIPE ended the process
  // at its next progress line, with no line and nothing saved. It is a stop request now, as SIGTERM
  // (the step finishes, the run saves, exit 141); the writes that follow fail quietly (EPIPE), and a
  // second SIGPIPE is no second request.
  struct sigaction pipe {};
  pipe.sa_handler = [](int) {
    int none = 0;
    g_stop_signal.compare_exchange_strong(none, SIGPIPE);
  };
  sigemptyset(&pipe.sa_mask);
  struct sigaction now {};
  sigaction(SIGPIPE, nullptr, &now);
  if (now.sa_handler == SIG_DFL) sigaction(SIGPIPE, &pipe, nullptr);
}

}  // namespace

int train_stop_signal() { return g_stop_signal.load(); }

void sigterm_self_for_test() {
  ::kill(::getpid(), SIGTERM);
  for (int i = 0; i < 10000 && g_stop_signal.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void check_metrics_path(const std::string& path) {
  if (path.empty()) return;
  // Before any work: a --metrics in a directory that is not there, or naming one, failed after the
  // model, the resume and the tokenizing, exit 1.
  std::error_code ec;
  const fs::path p(path), parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
  MT_CHECK(fs::is_directory(parent, ec), ErrorKind::kInvalidArgument,
           "--metrics " + path + ": " + parent.string() + " is not a directory");
  MT_CHECK(!fs::is_directory(p, ec), ErrorKind::kInvalidArgument, "--metrics " + path + ": is a directory; give a file");
}

void MetricsFile::open(const std::string& path) {
  path_ = path;
  // A line an earlier run left cut short (its disk was full) would have this run's first line
  // glued onto it, and the end's plot refuse the file (exit 2 after a run that trained and saved):
  // the partial line is cut off first.
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (!ec && size > 0) {
    std::ifstream in(path, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!text.empty() && text.back() != '\n') {
      const size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      fs::resize_file(path, keep, ec);
      MT_CHECK(!ec, ErrorKind::kIOError, path + ": cannot cut off its partial last line: " + ec.message());
      std::fprintf(stderr, "warning: %s: its last line was cut short (%zu bytes, a write that failed): removed\n", path.c_str(),
                   text.size() - keep);
    }
  }
  out_.open(path, std::ios::app);
  MT_CHECK(out_.good(), ErrorKind::kIOError, path + ": cannot open for appending");
}

void MetricsFile::write(const nlohmann::json& line, int64_t step) {
  if (failed_) return;
  errno = 0;
  out_ << line.dump() << "\n";
  out_.flush();
  if (out_.good()) return;
  failed_ = true;
  const int err = errno;
  std::fprintf(stderr, "warning: %s: cannot write step %lld's metrics (%s); the run goes on without them\n",
               path_.c_str(), static_cast<long long>(step), err != 0 ? std::strerror(err) : "write failed");
}

bool MetricsFile::close() {
  if (!out_.is_open()) return false;
  out_.close();
  return !failed_ && !out_.fail();
}

const char* stop_signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : sig == SIGPIPE ? "SIGPIPE (standard output closed)" : "SIGTERM";
}

int agreed_stop_signal(comm::Backend* world, double timeout_s) {
  int stop = g_stop_signal.load();
  if (world) {
    float s = static_cast<float>(stop);
    comm::AllReduceOptions o;
    o.op = comm::ReduceOp::kMax;
    o.tag = "stop signal";
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0));
    world->all_reduce(&s, 1, DType::kF32, o)->wait();
    stop = static_cast<int>(s);
  }
  return stop;
}

// The ranks' resolved configurations, compared before any work: each rank reads its own file (a
// host's copy may differ, or a --set given to one rank under a bare mpirun), and a seed, lr or
// seq_length of its own trained another replica, exit 0; a width of its own was an MPI error. Rank
// 0's text goes to every rank; the lowest rank that differs says where (a JSON pointer, both
// values), and every rank throws that line.
void check_same_config(comm::Backend& world, const engine::RunConfig& cfg) {
  if (world.size() == 1) return;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.comm_timeout_s * 1000.0));
  const nlohmann::json mine = engine::ds_config_resolved(cfg);
  // A string from root to every rank, as the bytes of f32 words (a broadcast moves bits).
  auto share = [&](std::string text, int root, const char* tag) {
    comm::BroadcastOptions bo;
    bo.root = root;
    bo.tag = tag;
    bo.timeout = timeout;
    // The length by an all-reduce (the others' 0): every rank waits in it for every other, as a
    // collective that ranks meet at (a broadcast's root goes on at once).
    comm::AllReduceOptions ao;
    ao.op = comm::ReduceOp::kMax;
    ao.tag = tag;
    ao.timeout = timeout;
    float words = world.rank() == root ? static_cast<float>((text.size() + 3) / 4) : 0.0f;
    world.all_reduce(&words, 1, DType::kF32, ao)->wait();
    std::vector<float> buf(static_cast<size_t>(words), 0.0f);
    if (world.rank() == root) std::memcpy(buf.data(), text.data(), text.size());
    world.broadcast(buf.data(), buf.size(), DType::kF32, bo)->wait();
    const char* c = reinterpret_cast<const char*>(buf.data());
    return std::string(c, strnlen(c, buf.size() * 4));
  };
  MT_CHECK(mine.dump().size() < (size_t{1} << 24), ErrorKind::kInternal, "the resolved configuration is too large to compare");
  const nlohmann::json first = nlohmann::json::parse(share(mine.dump(), 0, "configuration (rank 0's)"));
  std::string differs;
  if (first != mine) {
    const nlohmann::json patch = nlohmann::json::diff(first, mine);
    const nlohmann::json& op = patch.at(0);
    const std::string where = op.at("path").get<std::string>();
    const nlohmann::json::json_pointer ptr(where);
    const std::string theirs = first.contains(ptr) ? first.at(ptr).dump() : "absent";
    const std::string ours = mine.contains(ptr) ? mine.at(ptr).dump() : "absent";
    differs = "rank " + std::to_string(world.rank()) + "'s configuration differs from rank 0's at " + where + " (" +
              ours.substr(0, 200) + " there, " + theirs.substr(0, 200) +
              " on rank 0): every rank must read the same file (each host its own copy) with the same --set";
  }
  comm::AllReduceOptions o;
  o.op = comm::ReduceOp::kMin;
  o.tag = "configuration (the first rank that differs)";
  o.timeout = timeout;
  float root = static_cast<float>(differs.empty() ? world.size() : world.rank());
  world.all_reduce(&root, 1, DType::kF32, o)->wait();
  if (static_cast<int>(root) >= world.size()) return;
  throw Error(ErrorKind::kInvalidArgument, share(differs, static_cast<int>(root), "configuration (where it differs)"));
}

void stop_before_first_step(comm::Backend* world, double timeout_s, bool lead) {
  if (const int stop = agreed_stop_signal(world, timeout_s); stop != 0) {  // nothing trained, nothing to save
    if (lead)
      std::fprintf(stderr, "meshtrain: %s: stopped before the first step; nothing saved\n", stop_signal_name(stop));
    throw StopRequested{stop};
  }
}

bool train_resume(engine::Engine& eng, const std::string& path, bool lead) {
  if (path.empty()) return false;
  engine::checkpoint_load(eng, path);
  const int64_t step = eng.global_step(), iters = eng.config().train_iters;
  // A checkpoint past train_iters trains nothing: an error, not exit 0 without progress. One at
  // train_iters is a finished run (a job requeued after its last save): one line, and done.
  MT_CHECK(step <= iters, ErrorKind::kInvalidArgument,
           path + " is at step " + std::to_string(step) + " and train_iters is " + std::to_string(iters) +
               ": nothing to train (--set train_iters=N with N > " + std::to_string(step) + " to go on)");
  if (lead && step == iters)
    std::fprintf(stderr, "%s is at step %lld = train_iters: the run is complete, nothing to train\n", path.c_str(),
                 static_cast<long long>(step));
  else if (lead)
    std::fprintf(stderr, "resumed from %s at step %lld\n", path.c_str(), static_cast<long long>(step));
  return step == iters;
}

namespace {

std::string fmt_time(double s) {
  char buf[32];
  int t = static_cast<int>(s);
  std::snprintf(buf, sizeof buf, "%02d:%02d", t / 60, t % 60);
  return buf;
}

// A loss scale as the progress lines print it: whole numbers as they are, a fraction (the unfused
// fp16 wrapper's minimum, 0.25) as it is ("scale 0" before).
std::string scale_text(double s) {
  char b[32];
  std::snprintf(b, sizeof b, s >= 1.0 ? "%.0f" : "%g", s);
  return b;
}

// A data source: one dataset or a blend of several (data/token_source.h), with each part's loss mask.
struct DataSource {
  std::unique_ptr<data::TokenSource> source;
  std::string key;  // "data.train", "data.valid" or "data.split"

  // Samples [first, first + B) of the source, each checked against the model's vocabulary: a
  // dataset tokenized with another tokenizer was met in the model's embedding, named by neither
  // file nor sample ("token 69999 at position 2 is outside the vocabulary").
  void batch(uint64_t first, int B, int32_t* inputs, int32_t* targets, int64_t vocab) {
    const int64_t T = source->seq_length();
    for (int b = 0; b < B; ++b) source->sample(first + static_cast<uint64_t>(b), inputs + b * T, targets + b * T);
    auto outside = [&](int32_t t) { return t < 0 || t >= vocab; };
    for (int64_t i = 0; i < static_cast<int64_t>(B) * T; ++i) {
      const bool input = outside(inputs[i]);
      if (!input && (targets[i] == -100 || !outside(targets[i]))) continue;
      const uint64_t k = first + static_cast<uint64_t>(i / T);
      const uint64_t at = source->token_position(k, static_cast<uint64_t>(i % T) + (input ? 0 : 1));
      const auto [part, local] = source->locate(k);
      throw Error(ErrorKind::kCorruption,
                  key + ": " + source->prefix(part) + ": token " + std::to_string(input ? inputs[i] : targets[i]) +
                      " at stream position " + std::to_string(at) + " (sample " + std::to_string(k) +
                      (source->num_parts() > 1 ? ", the dataset's sample " + std::to_string(local) : std::string()) +
                      ") is outside the model's vocabulary [0, " + std::to_string(vocab) +
                      "); was the dataset tokenized with another tokenizer?");
    }
  }
};

// num_samples: the samples the run draws from this source (Megatron's order and blends are built
// for them). split: data.split's share of each dataset's sequences this source reads (-1: all).
DataSource open_data(const engine::RunConfig& cfg, const engine::DataSpec& spec, const char* key, bool shuffle,
                     uint64_t num_samples, int split = -1, int32_t eod_mask = -1, bool quiet = false) {
  MT_CHECK(!spec.paths.empty(), ErrorKind::kInvalidArgument,
           std::string(key) + ": missing (an indexed-dataset prefix, or a .txt/.jsonl file)");
  std::string cache = cfg.save_dir.empty() ? "runs/data-cache" : cfg.save_dir + "/data-cache";
  std::vector<data::TokenSourcePart> parts;
  for (size_t i = 0; i < spec.paths.size(); ++i) {
    data::TokenSourcePart p;
    p.prefix = engine::corpus_prepare(spec.paths[i], cfg.tokenizer, cache);
    engine::corpus_check_vocab(p.prefix, spec.paths[i], cfg.tokenizer, cfg.model.vocab_size, key);
    p.mask_prefix = engine::corpus_mask_prefix(p.prefix);
    if (spec.weighted) p.weight = spec.weights[i];
    if (!p.mask_prefix.empty() && !quiet &&
        (!std::getenv("OMPI_COMM_WORLD_RANK") || std::strcmp(std::getenv("OMPI_COMM_WORLD_RANK"), "0") == 0))
      std::fprintf(stderr, "%s: loss mask %s (SFT: only responses are trained)\n", key, p.mask_prefix.c_str());
    parts.push_back(p);
  }
  data::TokenSourceOptions o;
  o.name = key;
  o.seq_length = static_cast<int>(cfg.seq_length);
  o.shuffle = shuffle;
  o.seed = cfg.data_seed;
  o.megatron_order = cfg.sample_order == "megatron";
  o.num_samples = num_samples;
  o.blend = spec.blend;
  o.weighted = spec.weighted;
  o.split_weights = cfg.split_weights;
  o.split = split;
  o.eod_mask = eod_mask;
  DataSource d;
  d.key = key;
  d.source = std::make_unique<data::TokenSource>(parts, o);
  return d;
}

}  // namespace

DocumentAttention document_attention_share(const engine::RunConfig& cfg) {
  const int T = static_cast<int>(cfg.seq_length);
  const uint64_t tbs = static_cast<uint64_t>(std::max<int64_t>(1, cfg.batch.train_batch_size));
  uint64_t train_samples = tbs;  // train's count (a product past 64 bits: train refuses it)
  if (cfg.train_iters > 0 && __builtin_mul_overflow(static_cast<uint64_t>(cfg.train_iters), tbs, &train_samples))
    train_samples = tbs;
  // The training source as train opens it (its order, shuffle, blend and split), built for the
  // samples read here alone: Megatron's order and weighted blends are built for the samples drawn,
  // and the run's whole count could take minutes (meshtrain's order reads the run's own first ones).
  const uint64_t n = std::min<uint64_t>(train_samples, DocumentAttention::kMaxSamples);
  DataSource d = open_data(cfg, cfg.train_spec, "data.train", cfg.shuffle, n, cfg.split_weights.empty() ? -1 : 0, -1,
                           /*quiet=*/true);
  std::string from;
  const int32_t eod = engine::corpus_eod_id(cfg, &from);
  DocumentAttention r;
  r.samples = static_cast<int>(std::min<uint64_t>(n, d.source->size()));
  std::vector<int32_t> inputs(static_cast<size_t>(T)), targets(inputs.size()), pos(inputs.size()), ks(inputs.size());
  const double causal = kernels::attention_tile_pairs(T);
  double sum = 0.0;
  for (int k = 0; k < r.samples; ++k) {
    d.source->sample(static_cast<uint64_t>(k), inputs.data(), targets.data());
    models::document_bounds(inputs.data(), 1, T, eod, pos.data(), ks.data());
    sum += kernels::attention_tile_pairs(T, ks.data()) / causal;
  }
  r.share = r.samples > 0 ? sum / r.samples : 1.0;
  return r;
}

namespace {


// DeepSpeed's csv_monitor: each event (a tensorboard-style name, a value, a step in samples) is
// appended to <output_path>/<job_name>/<name with '/' and ' ' as '_'>.csv, whose first line in
// this process is "step,<last part of the name>". Values are written as Python's repr writes them.
class CsvMonitor {
 public:
  // Python's repr of a float: the shortest digits that round-trip, fixed for exponents -4 to 15
  // (0.0003, 2.0, 123456.0), else scientific with a signed exponent of at least two digits (3e-05,
  // 1.5e+16). std::to_chars' shortest form picked whichever was shorter ("3e-04" for 0.0003).
  static std::string python_repr(double value) {
    if (std::isnan(value)) return "nan";
    if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
    const std::string sci(buf, res.ptr);  // [-]d[.ddd]e[+-]xx
    const size_t e = sci.find('e');
    const bool neg = sci[0] == '-';
    std::string digits;
    for (size_t i = neg ? 1 : 0; i < e; ++i)
      if (sci[i] != '.') digits += sci[i];
    const int exp = std::stoi(sci.substr(e + 1));
    std::string out = neg ? "-" : "";
    if (exp >= -4 && exp < 16) {
      if (exp < 0) {
        out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
      } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
        out += digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
      }
      return out;
    }
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    const int a = exp < 0 ? -exp : exp;
    out += std::string("e") + (exp < 0 ? "-" : "+") + (a < 10 ? "0" : "") + std::to_string(a);
    return out;
  }

  explicit CsvMonitor(const engine::RunConfig::CsvMonitor& c)
      : dir_(c.output_path.empty() ? fs::path(c.job_name) : fs::path(c.output_path) / c.job_name) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    MT_CHECK(!ec, ErrorKind::kInvalidArgument, "csv_monitor: cannot create " + dir_.string() + " (" + ec.message() + ")");
  }
  // A row that cannot be written (a full disk) is said once, and the run goes on without the
  // monitor, as with --metrics: the rows were checked before the stream was flushed, so a full disk
  // lost them without a word, exit 0.
  void write(const std::string& name, double value, int64_t step) {
    if (failed_) return;
    std::string file = name;
    for (char& ch : file)
      if (ch == '/' || ch == ' ') ch = '_';
    const fs::path path = dir_ / (file + ".csv");
    errno = 0;
    std::ofstream f(path, std::ios::app);
    if (f.good()) {
      if (started_.insert(file).second) f << "step," << name.substr(name.rfind('/') + 1) << "\r\n";
      f << step << "," << python_repr(value) << "\r\n";
      f.flush();
    }
    if (!f.good()) {
      const int e = errno;
      failed_ = true;
      std::fprintf(stderr, "warning: csv_monitor: cannot write %s at step %lld (%s); the run goes on without it\n",
                   path.c_str(), static_cast<long long>(step), e != 0 ? std::strerror(e) : "the stream failed");
    }
  }

 private:
  fs::path dir_;
  std::set<std::string> started_;
  bool failed_ = false;
};

// How far a rank got: before `started` every rank fails alike (same config, same files) and rank 0
// alone says why, unless `own` (past the data's barrier: a file missing on this host, or the
// barrier's own deadline), where the rank says it too.
struct SetupState {
  bool started = false, own = false;
};

void train_loop(const TrainArgs& args, engine::RunConfig& cfg, const std::shared_ptr<comm::Backend>& world, SetupState& st) {
  bool& started = st.started;
  if (cfg.task == "classification") {
    classify_loop({args.resume, args.metrics, args.overwrite, args.src.name()}, cfg, world, started);
    return;
  }
  const int R = world ? world->rank() : 0;
  const bool lead = R == 0;
  if (lead) {
    for (const auto& w : cfg.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
    for (const auto& n : cfg.notes) std::fprintf(stderr, "auto: %s\n", n.c_str());
  }
  MT_CHECK(cfg.train_iters > 0, ErrorKind::kInvalidArgument,
           args.src.name() + ": train_iters must be positive (a DeepSpeed config has none: --set train_iters=N)");
  engine::ds_config_check_paths(cfg);  // data, tokenizer, save_dir: before any work
  engine::ds_config_check_trainable(cfg);
  if (lead) check_metrics_path(args.metrics);  // rank 0's file (another host may lack its directory)
  // (its directory made here, before any work: one that could not be made failed after the model)
  std::unique_ptr<CsvMonitor> csv;
  if (lead && cfg.csv_monitor.enabled) csv = std::make_unique<CsvMonitor>(cfg.csv_monitor);
  // One run saves to a save_dir at a time (checkpoint_dir_hold): rank 0 holds it to the end, before
  // the check below (a run beside a live one is told so, not told to pass --resume).
  std::unique_ptr<HeldLock> save_hold;
  if (lead && !cfg.save_dir.empty()) save_hold = engine::checkpoint_dir_hold(cfg.save_dir);
  // A new run does not write over an earlier run's checkpoints unless told to (HF Trainer's
  // overwrite_output_dir): rotation and re-saves would otherwise mix the two runs.
  engine::checkpoint_dir_check_run(cfg.save_dir, args.resume, args.overwrite);
  // Text corpora are tokenized into a cache on first use: rank 0 does it while the others wait,
  // then they open the cached datasets (mapped: each touches only the samples it reads).
  // Tokenizing takes what the corpus takes (17 MB/s here), so where a text corpus is named the
  // others wait without comm_timeout's deadline (a 76 MB corpus under comm_timeout 1 ended the run
  // with no line, and each rerun met the same); rank 0's failure or death still ends the job.
  comm::BarrierOptions bo;
  bo.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.comm_timeout_s * 1000.0));
  auto text = [](const std::string& p) { return p.ends_with(".txt") || p.ends_with(".jsonl"); };
  for (const engine::DataSpec* spec : {&cfg.train_spec, &cfg.valid_spec})
    if (std::any_of(spec->paths.begin(), spec->paths.end(), text)) bo.timeout = std::chrono::milliseconds(int64_t{1'000'000'000'000});
  bo.tag = "data ready";
  if (world && !lead) world->barrier(bo)->wait();
  st.own = true;
  if (fault_active("train.sigterm_in_setup")) sigterm_self_for_test();  // test seam: a scheduler's signal during the setup
  if (fault_active("train.slow_data")) std::this_thread::sleep_for(std::chrono::seconds(6));  // test seam: a long tokenizing
  // Megatron's order and blends are built for the samples the run draws (its GPTDataset's and
  // BlendedDataset's num_samples): the training steps' batches, and what validation reads: in
  // meshtrain's order eval_iters micro-batches, the same ones each time; in Megatron's, its
  // validation: eval_iters global batches an evaluation, each reading on from the last, over a set
  // built for (train_iters / eval_interval + 1) evaluations (get_train_valid_test_num_samples).
  // data.split: training reads split 0 of data.train's sequences, validation split 1 (none when
  // the split gives it none, as Megatron builds no validation set then).
  const bool split = !cfg.split_weights.empty();
  // The samples each source draws (a product that wrapped built one epoch and died mid-run).
  int64_t train_samples = 0, valid_samples_signed = 0;
  MT_CHECK(!__builtin_mul_overflow(std::max<int64_t>(0, cfg.train_iters), cfg.batch.train_batch_size, &train_samples),
           ErrorKind::kInvalidArgument,
           "train_iters " + std::to_string(cfg.train_iters) + " x train_batch_size " + std::to_string(cfg.batch.train_batch_size) +
               " overflows 64 bits");
  // A resumed run draws from the checkpoint's position on (engine::checkpoint_load: its next_sample,
  // at this run's seq_length): with a smaller batch or shorter samples than the checkpoint's, that
  // is past train_iters x this batch, and a blend, built for exactly that many, ended the run at
  // the first sample past it ("sample 16 is past the blend's 12").
  std::optional<engine::CheckpointProgress> resumed;
  if (!args.resume.empty()) {
    try {
      resumed = engine::checkpoint_progress(args.resume);
    } catch (const Error&) {  // checkpoint_load says what is wrong with it
    }
  }
  if (resumed && resumed->consumed_samples > 0 && resumed->global_step >= 0 && cfg.task != "classification") {
    int64_t next = resumed->consumed_samples, tokens = 0, left = 0, need = 0;
    if (resumed->seq_length > 0 && resumed->seq_length != cfg.seq_length && cfg.seq_length > 0 &&
        !__builtin_mul_overflow(next, resumed->seq_length, &tokens))
      next = tokens / cfg.seq_length + (tokens % cfg.seq_length != 0);
    if (!__builtin_mul_overflow(std::max<int64_t>(0, cfg.train_iters - resumed->global_step), cfg.batch.train_batch_size, &left) &&
        !__builtin_add_overflow(next, left, &need))
      train_samples = std::max(train_samples, need);
  }
  const bool megatron_valid = cfg.sample_order == "megatron";
  if (megatron_valid) {
    int64_t evaluations = cfg.eval_interval > 0 ? std::max<int64_t>(0, cfg.train_iters) / cfg.eval_interval + 1 : 1;
    // A resumed run reads on from the checkpoint's consumed_valid_samples: the set holds those too
    // (counted as evaluations of this run's size, rounded up).
    if (resumed) {
      const int64_t block = std::max<int64_t>(1, std::max<int64_t>(0, cfg.eval_iters) * cfg.batch.train_batch_size);
      if (resumed->consumed_valid_samples > 0) evaluations += (resumed->consumed_valid_samples + block - 1) / block;
    }
    int64_t per = 0;
    MT_CHECK(!__builtin_mul_overflow(std::max<int64_t>(0, cfg.eval_iters), cfg.batch.train_batch_size, &per) &&
                 !__builtin_mul_overflow(per, evaluations, &valid_samples_signed),
             ErrorKind::kInvalidArgument,
             "eval_iters " + std::to_string(cfg.eval_iters) + " x train_batch_size x " + std::to_string(evaluations) +
                 " evaluations (Megatron's validation set) overflows 64 bits");
  } else {  // eval_iters global batches, the same ones each time
    MT_CHECK(!__builtin_mul_overflow(std::max<int64_t>(0, cfg.eval_iters), cfg.batch.train_batch_size, &valid_samples_signed),
             ErrorKind::kInvalidArgument,
             "eval_iters " + std::to_string(cfg.eval_iters) + " x train_batch_size overflows 64 bits");
  }
  // data.eod_mask_loss: training and validation alike, as Megatron's datasets mask both.
  int32_t eod = -1;
  if (cfg.eod_mask_loss) {
    std::string from;
    eod = engine::corpus_eod_id(cfg, &from);
    if (lead) std::fprintf(stderr, "data.eod_mask_loss: the target after token %d (%s) is not trained\n", eod, from.c_str());
  }
  if (lead && (cfg.reset_position_ids || cfg.reset_attention_mask)) {
    std::string from;
    const int32_t id = engine::corpus_eod_id(cfg, &from);
    std::fprintf(stderr, "%s%s: a document ends at token %d (%s)\n", cfg.reset_position_ids ? "data.reset_position_ids" : "",
                 cfg.reset_attention_mask ? (cfg.reset_position_ids ? ", data.reset_attention_mask" : "data.reset_attention_mask") : "",
                 id, from.c_str());
  }
  DataSource train_data =
      open_data(cfg, cfg.train_spec, "data.train", cfg.shuffle, static_cast<uint64_t>(train_samples), split ? 0 : -1, eod);
  DataSource valid_data;
  bool valid = false;
  const uint64_t valid_samples = static_cast<uint64_t>(valid_samples_signed);
  // (with eval_iters 0 nothing validates: a share too small to read refused the run, stop 73)
  if (split && cfg.eval_iters > 0 && data::megatron_split_sequences(cfg.split_weights, 1, 1)) {
    valid_data = open_data(cfg, cfg.train_spec, "data.split", false, valid_samples, 1, eod);
    valid = true;
  } else if (split && cfg.eval_iters > 0) {
    if (lead && cfg.eval_interval > 0 && cfg.eval_iters > 0)
      log_warning("data.split: \"" + cfg.split + "\" gives validation no sequences, so the run validates nothing");
  } else if (!cfg.valid_spec.paths.empty()) {
    valid_data = open_data(cfg, cfg.valid_spec, "data.valid", false, valid_samples, -1, eod);
    valid = true;
  }
  // data.split's third share: Megatron's test set (its test_iters = eval_iters batches), evaluated
  // once when training ends, as Megatron's do_test; none when the split gives it no weight, or when
  // its share of a dataset is too small to read (said; the run goes on without it).
  DataSource test_data;
  bool test = false;
  std::string test_skipped;  // why this rank has none
  if (split && cfg.eval_iters > 0 && cfg.split_weights.size() > 2 && data::megatron_split_sequences(cfg.split_weights, 1, 2)) {
    const uint64_t test_samples = static_cast<uint64_t>(cfg.eval_iters) * static_cast<uint64_t>(cfg.batch.train_batch_size);
    try {
      // test seam: rank 1's host holds a shorter copy of the data
      MT_CHECK(!(fault_active("train.test_share_unreadable") && world && world->rank() == 1), ErrorKind::kInvalidArgument,
               "data.split (test): this rank's copy of the test share is too short (fault seam)");
      test_data = open_data(cfg, cfg.train_spec, "data.split (test)", false, test_samples, 2, eod);
      test = true;
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kInvalidArgument) throw;
      test_skipped = std::string(e.what()) + "; the run evaluates no test set";
    }
  }
  if (world && lead) world->barrier(bo)->wait();
  started = true;  // from here on the ranks run collectives together
  if (split && cfg.eval_iters > 0 && cfg.split_weights.size() > 2) {
    // Every rank evaluates the test set or none does (its forwards are collective): the ranks agree,
    // each one that could not open it saying why where they differ (a host's shorter copy).
    float has[2] = {test ? 1.0f : 0.0f, test ? 0.0f : 1.0f};  // max: some rank has one / lacks one
    if (world) {
      comm::AllReduceOptions o;
      o.op = comm::ReduceOp::kMax;
      o.tag = "test set";
      o.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.comm_timeout_s * 1000.0));
      world->all_reduce(has, 2, DType::kF32, o)->wait();
    }
    const bool differ = has[0] > 0.5f && has[1] > 0.5f;
    if (!test_skipped.empty() && (lead || differ))
      log_warning((differ ? "rank " + std::to_string(world ? world->rank() : 0) + ": " : std::string()) + test_skipped);
    if (differ && lead && test) log_warning("data.split (test): another rank could not open the test set; the run evaluates none");
    test = test && !differ;
  }
  // Every collective of the run goes through the comms logger (comm/comm_log.h): its counters give
  // each step's comm_bytes; the comms_logger block says what is printed.
  auto comm_log = std::make_shared<comm::CommLog>();
  comm_log->set_debug(cfg.comms_logger.debug);
  comm_log->set_profiled(cfg.comms_logger.prof_all, cfg.comms_logger.prof_ops);
  auto ctx = engine::engine_parallel_context(cfg, comm::log_backend(world, comm_log));
  auto model = engine::engine_build_model(cfg, ctx);
  engine::Engine eng(cfg, *model, ctx);
  // Data is sharded by the data-parallel coordinate: the ranks of one tensor-parallel group (and of
  // one Ulysses group, parallel.sp) read the same samples.
  const int DW = ctx->data_dp(), DR = ctx->data_rank();
  try {
    if (train_resume(eng, args.resume, lead)) return;
  } catch (...) {  // a resume that failed trained nothing: its swap files go (stop 73's note)
    eng.discard_swap_files();
    throw;
  }
  // A save_dir whose disk cannot hold one checkpoint was found at the first save (stop 77).
  if (lead) {
    const std::string room = engine::checkpoint_space_warning(eng, cfg.save_dir);
    if (!room.empty()) log_warning(room);
  }
  // The metrics' peak_<category>_bytes describe training, not setup (the ParamStore's full buffers
  // live beside the ZeRO shards until the runtime releases them): `meshtrain estimate` predicts these.
  const size_t setup_peak = eng.memory_stats().total_peak;
  size_t fresh_before = eng.memory_stats().fresh_mapped;
  eng.reset_memory_peaks();
  if (lead)
    std::fprintf(stderr, "model %s, batch %lld = %lld x %lld accumulation x %d data-parallel rank(s), T=%lld, %s, ZeRO stage %d%s\n",
                 cfg.model.describe().c_str(), static_cast<long long>(cfg.batch.train_batch_size),
                 static_cast<long long>(cfg.batch.micro_batch_per_gpu),
                 static_cast<long long>(cfg.batch.gradient_accumulation_steps), DW, static_cast<long long>(cfg.seq_length),
                 dtype_name(cfg.compute_dtype), cfg.zero.stage,
                 ((ctx->sp() > 1 ? ", Ulysses sequence parallel " + std::to_string(ctx->sp()) : std::string()) +
                  (ctx->tp() > 1 ? ", tensor parallel " + std::to_string(ctx->tp()) +
                                       (ctx->sequence_parallel ? " (sequence parallel)" : "")
                                 : std::string()) +
                  (ctx->pp() > 1 ? ", pipeline " + std::to_string(ctx->pp()) + " stages (" + cfg.pipeline_schedule +
                                       (cfg.virtual_stages > 1 ? ", " + std::to_string(cfg.virtual_stages) + " chunks per rank" : "") + ")"
                                 : std::string()))
                     .c_str());
  MetricsFile metrics;
  if (lead && !args.metrics.empty()) metrics.open(args.metrics);
  const int B = static_cast<int>(cfg.batch.micro_batch_per_gpu);
  const int64_t T = cfg.seq_length, tbs = cfg.batch.train_batch_size, gas = cfg.batch.gradient_accumulation_steps;
  // Under `meshtrain launch`, stdout is mpirun's pseudo-terminal; the launcher says what its is.
  const char* launcher_tty = std::getenv("MT_STDOUT_TTY");
  const bool tty = lead && (launcher_tty ? std::strcmp(launcher_tty, "1") == 0 : isatty(fileno(stdout)));
  const double full_flops = model->train_flops_per_step() * static_cast<double>(gas * DW);
  // The optimizer swap's share of the disk's ceiling (meshtrain bench --io under its nvme_path).
  DiskCeiling ceiling;
  const bool swapping = cfg.zero.offload_optimizer == "nvme";
  const bool have_ceiling = swapping && read_disk_ceiling(cfg.zero.optimizer_nvme_path, &ceiling);
  if (lead && swapping && cfg.wall_clock_breakdown) {
    if (have_ceiling)
      std::printf("disk ceiling of %s (bench --io, %.1f GiB each way): write %.2f GB/s, read %.2f GB/s, mixed %.2f GB/s\n",
                  cfg.zero.optimizer_nvme_path.c_str(), static_cast<double>(ceiling.bytes) / 1073741824.0,
                  ceiling.write_gbs, ceiling.read_gbs, ceiling.mixed_gbs);
    else
      std::printf("no disk ceiling recorded for %s: `meshtrain bench --io %s --io-size MIB` measures it (MIB about the "
                  "swap's size)\n",
                  cfg.zero.optimizer_nvme_path.c_str(), cfg.zero.optimizer_nvme_path.c_str());
  }
  Timer total;
  int64_t start_step = eng.global_step();
  const int64_t applied_at_start = eng.applied_steps();
  bool first_save = true;
  bool stdout_failed = false;  // said once
  // One evaluation of a validation or test set: eval_iters global batches (train_batch_size samples
  // each), every data-parallel rank reading eval_iters x accumulation micro-batches of them, and the
  // loss the mean over their counted targets (Megatron's evaluate sums the losses and the tokens).
  // So every layout reports the one-process run's number: eval_iters counted micro-batches before,
  // and dp 2 at the same global batch validated half the samples (1.85 % off, stop 74); a micro-batch
  // of masked targets counted as a loss of 0.
  bool warned_empty = false;
  auto evaluate_set = [&](DataSource& data, int64_t e, bool validation) {
    std::vector<int32_t> tokens(static_cast<size_t>(B * T)), targets(tokens.size());
    const int64_t per = cfg.eval_iters * gas;
    int64_t first = 0;  // meshtrain's: the set's first samples each time (a curve of comparable points)
    if (megatron_valid) {
      // Megatron's evaluation: evaluation e's samples [e, e + 1) x eval_iters x train_batch_size
      // (e = done / eval_interval - 1 at an interval, done / eval_interval at a last step between
      // two: Megatron's evaluation after its loop), so a resumed run reads on where Megatron's
      // consumed_valid_samples puts it. The validation set reads on from Megatron's
      // consumed_valid_samples where the run (or the checkpoint it resumed) counted them: a resume
      // that changed eval_interval, eval_iters or the batch read other samples with the formula.
      first = validation && eng.consumed_valid_samples() >= 0 ? eng.consumed_valid_samples() : e * cfg.eval_iters * tbs;
      if (validation) eng.set_consumed_valid_samples(first + cfg.eval_iters * tbs);
    }
    // Each rank its contiguous slice of the evaluation's samples (Megatron's slices); every rank runs
    // the same number of forwards (ZeRO-3 gathers parameters collectively).
    uint64_t next = static_cast<uint64_t>(first + DR * per * B);
    double sum = 0.0, counted = 0.0;
    for (int64_t j = 0; j < per; ++j, next += static_cast<uint64_t>(B)) {
      data.batch(next, B, tokens.data(), targets.data(), cfg.model.vocab_size);
      const double n = static_cast<double>(std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t != -100; }));
      const float l = eng.evaluate(tokens.data(), targets.data());
      if (n > 0) sum += static_cast<double>(l) * n;
      counted += n;
    }
    // Over the ranks (each all-reduce averages: the ratio is the sums').
    const double all = eng.mean_over_ranks(counted);
    if (all <= 0.0) {
      if (lead && !warned_empty)
        log_warning(std::string(validation ? "validation" : "test") + ": every target of its " +
                    std::to_string(cfg.eval_iters) + " global batch(es) is masked; its loss is reported as 0");
      warned_empty = true;
      return 0.0;
    }
    return eng.mean_over_ranks(sum) / all;
  };
  nlohmann::json last_line;  // the last step's metrics, held for the test set's loss
  stop_before_first_step(world.get(), cfg.comm_timeout_s, lead);
  while (eng.global_step() < cfg.train_iters) {
    int64_t step = eng.global_step();
    // Rank R's micro-batches are samples [R·gas·B, (R+1)·gas·B) of the global batch: the global
    // batch is the one a single process trains on, and each rank reads only its part of it.
    uint64_t next_sample = static_cast<uint64_t>(eng.consumed_samples() + DR * gas * B);
    // DeepSpeed's flops profiler: rank 0 times every module of the step run when profile_step steps
    // are done (DeepSpeed's global_steps == profile_step; 1: the second step).
    std::unique_ptr<models::ModuleProfile> profile;
    if (lead && cfg.flops_profiler.enabled && step == cfg.flops_profiler.profile_step && !eng.device()) {
      profile = std::make_unique<models::ModuleProfile>();
      eng.prepare_next_step();  // the module FLOPs of this step's length (a curriculum's)
      model->set_profiler(profile.get());
    }
    Timer t;
    const uint64_t sent_before = comm_log->sent_bytes();
    engine::StepResult r = eng.train_batch([&](int32_t* tokens, int32_t* targets) {
      train_data.batch(next_sample, B, tokens, targets, cfg.model.vocab_size);
      next_sample += static_cast<uint64_t>(B);
    });
    double secs = t.seconds();
    if (profile) {
      model->set_profiler(nullptr);
      if (tty) std::printf("\n");
      engine::FlopsProfileStep ps = engine::flops_profile_step(eng, r);
      // MFU's peak: this rank's GEMM ceiling at the model's MLP up-projection shape in the run's
      // compute dtype, measured now (0.3 s) as meshtrain bench does.
      const int gm = static_cast<int>(B * (r.seq_length > 0 ? r.seq_length : T));
      ps.peak_tflops = kernels::gemm_ceiling_tflops(gm, cfg.model.intermediate, cfg.model.hidden, cfg.compute_dtype);
      char what[160];
      std::snprintf(what, sizeof what, "measured %s GEMM ceiling, %d x %d x %d", dtype_name(cfg.compute_dtype), gm,
                    cfg.model.intermediate, cfg.model.hidden);
      ps.peak_what = what;
      std::string report = engine::flops_profiler_report(*profile, ps, cfg.flops_profiler);
      std::string where = engine::flops_profiler_write(report, cfg.flops_profiler);
      if (where != "stdout") std::fprintf(stderr, "flops profile of step %lld: %s\n", static_cast<long long>(step + 1), where.c_str());
    }
    const uint64_t comm_bytes = comm_log->sent_bytes() - sent_before;  // this rank's, in the step's collectives
    // A curriculum step trains on fewer tokens (and FLOPs) than seq_length's.
    const int64_t step_T = r.seq_length > 0 ? r.seq_length : T;
    double flops = step_T == T ? full_flops : model->train_flops_per_step() * static_cast<double>(gas * DW);
    // data.reset_attention_mask: the attention the step computed, not a causal sample's.
    if (r.attention_pairs >= 0)
      flops += model->attention_flops_per_pair() * r.attention_pairs -
               model->causal_attention_flops() * static_cast<double>(gas * DW);
    double tok_s = static_cast<double>(tbs * step_T) / secs;
    int64_t done = eng.global_step();
    fault_point(("train.after_step_" + std::to_string(done)).c_str());
    // eval_iters 0: no validation, as Megatron (it averaged 0 losses: "validation loss -nan", and
    // the metrics file's null ended the run's plot with a JSON type error).
    bool have_val = valid && cfg.eval_interval > 0 && cfg.eval_iters > 0 && (done % cfg.eval_interval == 0 || done == cfg.train_iters);
    const double val_loss = have_val ? evaluate_set(valid_data,
                                                    done % cfg.eval_interval == 0 ? done / cfg.eval_interval - 1 : done / cfg.eval_interval,
                                                    true)
                                     : 0.0;
    // data.split's test share, once at the end, after the final save (Megatron's do_test): its
    // loss goes in the last step's metrics line, held back until then.
    const bool have_test = test && done == cfg.train_iters;
    if (csv) {  // DeepSpeed's events, stepped in samples, at the points its engine writes them
      const int64_t samples = eng.consumed_samples();
      // backward() writes the loss before the step counts its samples; step() writes the lr and the
      // loss scale after the update: the next step's lr (the scheduler has stepped) and the scale
      // the overflow check left. The step's own lr and scale were written, at the samples after it.
      csv->write("Train/Samples/train_loss", r.loss, samples - cfg.batch.train_batch_size);
      csv->write("Train/Samples/lr", eng.current_lr(), samples);
      if (cfg.compute_dtype == DType::kF16) csv->write("Train/Samples/loss_scale", eng.loss_scaler().scale(), samples);
    }
    if (metrics.is_open()) {
      nlohmann::json m = {{"step", done}, {"loss", r.loss}, {"lr", r.lr}, {"grad_norm", r.grad_norm},
                          {"loss_scale", r.loss_scale}, {"skipped", r.skipped}, {"tokens_per_s", tok_s},
                          {"tflops", flops / secs / 1e12}, {"comm_bytes", comm_bytes}};
      if (cfg.tp > 1) {
        m["tp_comm_bytes"] = r.tp_comm_bytes;
        m["tp_comm_seconds"] = r.tp_comm_seconds;
      }
      if (cfg.curriculum.enabled) m["curriculum_seqlen"] = step_T;
      if (cfg.pp > 1) {
        m["pp_wait_seconds"] = r.pp_wait_seconds;  // rank 0's (the first stage's)
        m["pp_stage_wait_seconds"] = r.pp_stage_wait_seconds;  // every stage's, by pp rank
        m["pp_stage_compute_seconds"] = r.pp_stage_compute_seconds;
        m["pp_schedule_seconds"] = r.pp_schedule_seconds;
        m["pp_stage_peak_mib"] = r.pp_stage_peak_mib;  // rank 0's categories above; every stage's total here
        m["pp_stage_comm_peak_mib"] = r.pp_stage_comm_peak_mib;
      }
      if (cfg.zero.offload_optimizer == "nvme") {  // rank 0's swap this step
        const optim::SwapStepStats& w = r.swap;
        for (const auto& [key, value] :
             {std::pair<const char*, double>{"optimizer_seconds", w.step_seconds}, {"compute_seconds", w.compute_seconds},
              {"wait_seconds", w.wait_seconds}, {"read_seconds", w.read_seconds}, {"write_seconds", w.write_seconds},
              {"read_bytes", static_cast<double>(w.bytes_read)}, {"write_bytes", static_cast<double>(w.bytes_written)}})
          m[std::string("swap_") + key] = value;
        // The serial time of its bytes at the recorded ceiling over the time it took.
        if (have_ceiling && w.step_seconds > 0)
          m["swap_ceiling_share"] = ceiling.serial_seconds(static_cast<double>(w.bytes_read), static_cast<double>(w.bytes_written)) /
                                    w.step_seconds;
      }
      if (cfg.zero.offload_param == "nvme" && cfg.zero.stage == 3) {  // forward + backward: pieces and records
        const io::AsyncIo::Stats& p = r.param_swap;
        for (const auto& [key, value] :
             {std::pair<const char*, double>{"wait_seconds", p.wait_seconds}, {"read_seconds", p.read_seconds},
              {"write_seconds", p.write_seconds}, {"read_bytes", static_cast<double>(p.bytes_read)},
              {"write_bytes", static_cast<double>(p.bytes_written)}})
          m[std::string("swap_param_") + key] = value;
      }
      if (cfg.wall_clock_breakdown) {
        m["forward_seconds"] = r.forward_seconds;
        m["backward_seconds"] = r.backward_seconds;
        m["step_seconds"] = r.step_seconds;
      }
      if (have_val) m["val_loss"] = val_loss;
      if (r.attention_pairs >= 0) m["attention_pairs"] = r.attention_pairs;  // the step's, every rank's
      MemStats mem = eng.memory_stats();
      for (int c = 0; c < kMemCategoryCount; ++c)
        m["peak_" + std::string(mem_category_name(static_cast<MemCategory>(c))) + "_bytes"] = mem.peak[c];
      m["total_peak_bytes"] = mem.total_peak;
      m["setup_peak_bytes"] = setup_peak;
      m["held_peak_bytes"] = mem.held_peak;
      m["mapped_peak_bytes"] = mem.mapped_peak;
      m["fresh_mapped_bytes"] = static_cast<double>(mem.fresh_mapped - fresh_before);  // this step's: page faults
      fresh_before = mem.fresh_mapped;
      m["rss_peak_bytes"] = process_peak_rss_bytes();  // VmHWM: everything the process ever held
      m["gemm_scratch_bytes"] = kernels::gemm_scratch_held();  // oneDNN's scratchpad region
      m["gemm_widen_bytes"] = kernels::gemm_widen_held();      // f16 operands widened to f32 (this thread's)
      m["exchange_scratch_bytes"] = comm::compressed_all_reduce_scratch_held();  // the 1-bit exchange's (this thread's)
      if (have_test) last_line = std::move(m);
      else metrics.write(m, done);
    }
    double elapsed = total.seconds();
    double remaining = elapsed / static_cast<double>(done - start_step) * static_cast<double>(cfg.train_iters - done);
    if (tty) {
      int width = 30, filled = static_cast<int>(width * done / cfg.train_iters);
      std::printf("\r[%s%s] %lld/%lld %s<%s %.2fit/s %.0f tok/s loss %.4f lr %.2e scale %s ",
                  std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                  static_cast<long long>(done), static_cast<long long>(cfg.train_iters), fmt_time(elapsed).c_str(),
                  fmt_time(remaining).c_str(), 1.0 / secs, tok_s, r.loss, r.lr, scale_text(r.loss_scale).c_str());
      std::fflush(stdout);
    } else if (lead && (done % cfg.steps_per_print == 0 || done == cfg.train_iters)) {
      std::printf("step %lld/%lld loss %.4f lr %.3e grad_norm %.3f scale %s %.0f tok/s%s\n", static_cast<long long>(done),
                  static_cast<long long>(cfg.train_iters), r.loss, r.lr, r.grad_norm, scale_text(r.loss_scale).c_str(), tok_s,
                  r.skipped ? " (skipped: overflow)" : "");
    }
    if (lead && cfg.wall_clock_breakdown && (done % cfg.steps_per_print == 0 || done == cfg.train_iters))
      std::printf("%stime (ms) | forward: %.2f | backward: %.2f | step: %.2f | data: %.2f%s%s\n", tty ? "\n" : "",
                  r.forward_seconds * 1e3, r.backward_seconds * 1e3, r.step_seconds * 1e3,
                  (secs - r.forward_seconds - r.backward_seconds - r.step_seconds - r.pp_wait_seconds) * 1e3,
                  cfg.pp > 1 ? (" | pipeline wait: " + std::to_string(r.pp_wait_seconds * 1e3).substr(0, 8) + " (" +
                                std::to_string(static_cast<int>(100.0 * r.pp_wait_seconds / secs + 0.5)) + "% of the step)")
                                   .c_str()
                             : "",
                  cfg.tp > 1 ? (" | tp comm: " + std::to_string(r.tp_comm_seconds * 1e3).substr(0, 8) + " (" +
                                std::to_string(r.tp_comm_bytes >> 20) + " MiB)")
                                   .c_str()
                             : "");
    if (lead && swapping && cfg.wall_clock_breakdown && (done % cfg.steps_per_print == 0 || done == cfg.train_iters) &&
        r.swap.step_seconds > 0) {
      const optim::SwapStepStats& w = r.swap;
      const double rb = static_cast<double>(w.bytes_read), wb = static_cast<double>(w.bytes_written);
      char share[160] = "";
      if (have_ceiling)
        std::snprintf(share, sizeof share, ", %.0f%% of the disk's ceiling: %.2f s at the recorded read and write rates",
                      100.0 * ceiling.serial_seconds(rb, wb) / w.step_seconds, ceiling.serial_seconds(rb, wb));
      std::printf("swap | optimizer: read %.2f GB, wrote %.2f GB in %.2f s (%.2f GB/s%s; waited %.2f s)", rb / 1e9, wb / 1e9,
                  w.step_seconds, (rb + wb) / w.step_seconds / 1e9, share, w.wait_seconds);
      if (cfg.zero.offload_param == "nvme" && cfg.zero.stage == 3)
        std::printf(" | passes: read %.2f GB, wrote %.2f GB, waited %.2f s", static_cast<double>(r.param_swap.bytes_read) / 1e9,
                    static_cast<double>(r.param_swap.bytes_written) / 1e9, r.param_swap.wait_seconds);
      std::printf("\n");
    }
    if (cfg.comms_logger.enabled && cfg.comms_logger.verbose) {
      std::vector<std::string> lines = comm_log->step_lines();
      if (lead) {
        std::printf("%scomms step %lld (rank 0):\n", tty ? "\n" : "", static_cast<long long>(done));
        for (const std::string& l : lines) std::printf("  %s\n", l.c_str());
      }
    }
    if (lead && have_val)
      std::printf("%sstep %lld validation loss %.4f\n", tty ? "\n" : "", static_cast<long long>(done), val_loss);
    const int stop = agreed_stop_signal(world.get(), cfg.comm_timeout_s);
    // A run that reached train_iters having applied no step (each fp16 step skipped for overflow,
    // with the scale still above its minimum: about 18 steps from 2^16) saved that as `latest` and
    // exited 0. It fails instead, with nothing saved; interval saves before it still happen (an
    // fp16 run skips its first steps while the scale comes down).
    if (done == cfg.train_iters && stop == 0 && eng.applied_steps() == applied_at_start) {
      char scale[32];
      std::snprintf(scale, sizeof scale, "%g", r.loss_scale);
      const std::string why = cfg.bf16_check_grad_overflow && cfg.compute_dtype == DType::kBF16
                                  ? "(bf16.check_grad_overflow skips them)"
                                  : std::string("(fp16 loss scale ") + scale + " at the last)";
      throw Error(ErrorKind::kNumerical, "steps " + std::to_string(start_step + 1) + "-" + std::to_string(done) +
                                             ": none applied: every step's gradients overflowed " + why + "; nothing saved");
    }
    bool save_now = (cfg.save_interval > 0 && done % cfg.save_interval == 0) || done == cfg.train_iters || stop != 0;
    std::string where;
    if (!cfg.save_dir.empty() && save_now) {
      where = engine::checkpoint_save(eng, cfg.save_dir, cfg.keep_last, args.overwrite && first_save);  // collective
      first_save = false;
      if (lead && !tty && stop == 0) std::printf("saved %s\n", where.c_str());
    }
    if (have_test) {
      if (stop == 0) {
        try {
          const double test_loss = evaluate_set(test_data, 0, false);
          if (lead) std::printf("%sstep %lld test loss %.4f\n", tty ? "\n" : "", static_cast<long long>(done), test_loss);
          if (metrics.is_open()) last_line["test_loss"] = test_loss;
        } catch (...) {
          if (metrics.is_open()) metrics.write(last_line, done);  // the step trained and was saved
          throw;
        }
      }
      if (metrics.is_open()) metrics.write(last_line, done);
    }
    if (lead) {
      // A pipe or a log file sees each line as it happens. A log file on a full disk lost every line
      // after without a word (stop 74, a probe): said once on stderr, and the run goes on.
      errno = 0;
      const bool failed = std::fflush(stdout) != 0 || std::ferror(stdout);
      const int e = errno;
      if (failed && !stdout_failed && e != EPIPE) {  // a closed pipe stops the run (SIGPIPE) instead
        stdout_failed = true;
        log_warning(std::string("standard output: cannot write the progress lines (") +
                    (e != 0 ? std::strerror(e) : "write error") + "); the run goes on, --metrics keeps every step");
      }
    }
    if (stop != 0) {
      if (lead) {
        if (tty) std::printf("\n");
        std::fprintf(stderr, "meshtrain: %s: stopped after step %lld; %s\n", stop_signal_name(stop),
                     static_cast<long long>(done),
                     where.empty() ? "no save_dir, nothing saved" : ("saved " + where).c_str());
        std::fflush(stdout);
        std::fflush(stderr);
      }
      throw StopRequested{stop};
    }
  }
  if (tty) std::printf("\n");
  eng.settle();  // the last optimizer swap may still be running: its error is this run's
  if (lead && cfg.comms_logger.enabled) {  // DeepSpeed's comm log_summary, rank 0's counters
    std::printf("comms summary (rank 0, %s):\n", world ? "every collective of the run" : "one process: no collectives");
    for (const std::string& l : comm_log->summary_lines()) std::printf("  %s\n", l.c_str());
  }
  if (metrics.is_open() && metrics.close()) {
    // Beside the metrics, never over them (--metrics run.png was overwritten by its plot); the
    // plot is the run's extra: a failure is said, and the run that trained and saved exits 0.
    std::string png = fs::path(args.metrics).replace_extension(".png").string();
    if (png == args.metrics) png = args.metrics + ".png";
    try {
      if (plot_metrics(args.metrics, png, false)) std::printf("loss curve: %s\n", png.c_str());
    } catch (const Error& e) {
      std::fprintf(stderr, "warning: no loss-curve plot: %s\n", e.what());
    }
  }
}

void run_train(const TrainArgs& args) {
  // Before the setup (MPI, the plan of an "auto" layout, the model, a checkpoint, a corpus: seconds
  // to minutes): a signal then stops the run before its first step, with its line (a launcher's
  // SIGUSR1 killed a rank still in MPI_Init or the plan).
  install_stop_handlers();
  std::shared_ptr<comm::Backend> world = mpi_world();
  if (!world) {
    install_pipe_stop_handler();
    engine::RunConfig cfg = load_planned_config(args.src, 1);
    SetupState st;
    try {
      train_loop(args, cfg, nullptr, st);
    } catch (const StopRequested& s) {
      std::exit(128 + s.signal);
    }
    return;
  }
  SetupState st;
  int stop_code = 0;
  try {
    if (fault_active("train.setup_error"))  // test seam: a file this rank's host lacks
      throw Error(ErrorKind::kNotFound, "test seam: a file this host lacks");
    PlannerInputs planner_inputs;
    planner_inputs.world = world.get();
    engine::RunConfig cfg = load_planned_config(args.src, world->size(), planner_inputs);
    if (fault_active("train.other_seed")) cfg.seed += 1;  // test seam: a host whose copy of the file differs
    check_same_config(*world, cfg);
    train_loop(args, cfg, world, st);
  } catch (const StopRequested& s) {
    stop_code = 128 + s.signal;
  } catch (const Error& e) {
    bool bad_input = e.kind() == ErrorKind::kInvalidArgument || e.kind() == ErrorKind::kNotFound ||
                     e.kind() == ErrorKind::kCorruption || e.kind() == ErrorKind::kNotSupported;
    int code = bad_input ? 2 : 1;
    // Before the first collective every rank fails alike (same config, same files): rank 0 says it.
    if (!st.started) {
      // Past the data's barrier, or at its deadline, the error may be this rank's alone (a data
      // file missing on its host): it says it too, naming itself.
      if (world->rank() != 0 && (st.own || e.kind() == ErrorKind::kTimeout)) {
        std::fprintf(stderr, "meshtrain: error: rank %d: %s\n", world->rank(), e.what());
        std::fflush(stderr);
      }
      // The others leave a moment later: mpirun aborts the job at the first non-zero exit, and a
      // rank that exited first could take rank 0 down before its line was written (seen in CI).
      // One still running then failed where rank 0 did not (a config, tokenizer or data file
      // missing on its host, which ended the job with mpirun's banner alone): it says why.
      if (world->rank() != 0) {
        std::this_thread::sleep_for(std::chrono::seconds(3));
        if (!st.own && e.kind() != ErrorKind::kTimeout) {
          std::fprintf(stderr, "meshtrain: error: rank %d: %s\n", world->rank(), e.what());
          std::fflush(stderr);
        }
        std::_Exit(code);
      }
      std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
      std::fflush(stderr);
      std::_Exit(code);
    }
    world->abort(code, e.what());  // ends every rank: none waits for a peer that will not come
  }
  world.reset();
  comm::mpi_finalize();
  if (stop_code) std::exit(stop_code);
}

}  // namespace

void register_train(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand("train", "Train a model on one process from a run configuration");
  cmd->add_option("CONFIG", args->src.config, "run configuration (JSON, DeepSpeed keys + model/data)");
  add_config_source_options(cmd, args->src);
  cmd->add_option("--resume", args->resume, "continue from a checkpoint directory (or a save_dir)");
  cmd->add_option("--metrics", args->metrics, "append one JSON object per step to this file");
  cmd->add_flag("--overwrite", args->overwrite,
                "start a new run in a save_dir that holds an earlier run's checkpoints (removed at the first save)");
  cmd->callback([args] {
    MT_CHECK(!args->src.config.empty() || !args->src.deepspeed_file().empty(), ErrorKind::kInvalidArgument,
             "train: give a run configuration CONFIG, or --deepspeed ds_config.json with --model and --data");
    run_train(*args);
  });
}

}  // namespace mt::cli
