// meshtrain bench MODEL_CONFIG: times full training steps (forward + backward + AdamW) after
// warm-up on random tokens and reports tokens/s, achieved TFLOP/s against a GEMM ceiling measured
// in the same process, peak memory by category and activation bytes per token. With --decode N it
// times KV-cache generation instead.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/cpu_features.h"
#include "base/error.h"
#include "base/file_io.h"
#include "base/threads.h"
#include "base/timer.h"
#include "cli/commands.h"
#include "engine/hf_config.h"
#include "engine/ds_config.h"
#include "engine/engine.h"
#include "io/aio.h"
#include "kernels/cpu/gemm.h"
#include "models/device_lm.h"
#include "serve/generator.h"

namespace mt::cli {
namespace {

struct BenchArgs {
  std::string config;
  int batch = 4, seq = 256, threads = 0, steps = 5, warmup = 2;
  int decode_batch = 1;  // --decode: sequences decoded together (serve's continuous batching)
  std::string dtype = "fp32";
  std::string device = "cpu";
  bool recompute = false, json = false, profile = false;
  int decode = 0;  // > 0: time KV-cache generation instead (prefill --seq tokens, then decode)
  std::string io_dir;  // --io: the disk's bandwidth instead
  int64_t io_mib = 2048, io_block = 1 << 20;
  int io_depth = 8, io_threads = 1;
};

// Generation: prefill of a --seq token prompt, then --decode greedy steps with the KV cache (f32
// weights, or bf16 copies with --dtype bf16). Decode reads every weight once per token, so weights/time is its bandwidth.
void run_decode_bench(const BenchArgs& args) {
  threads_set(args.threads);
  models::ModelConfig cfg = engine::hf_config_load(args.config);
  MT_CHECK(args.seq >= 1 && args.seq + args.decode <= cfg.max_positions, ErrorKind::kInvalidArgument,
           "--seq + --decode must fit the model's " + std::to_string(cfg.max_positions) + " positions");
  MT_CHECK(args.decode_batch >= 1, ErrorKind::kInvalidArgument, "--decode-batch must be at least 1");
  models::TransformerLM model(cfg, models::ModelOptions{});
  const int B = args.decode_batch;
  const bool bf16 = args.dtype == "bf16";  // the matrices copied to bf16 (serve --dtype bf16)
  serve::Generator gen(model, {.capacity = args.seq + args.decode, .slots = B, .weights = bf16 ? DType::kBF16 : DType::kF32});
  std::mt19937 rng(42);
  std::vector<std::vector<int32_t>> prompts(B, std::vector<int32_t>(static_cast<size_t>(args.seq)));
  for (auto& p : prompts)
    for (auto& t : p) t = static_cast<int32_t>(rng() % static_cast<unsigned>(cfg.vocab_size));
  gen.prefill(0, prompts[0]);  // warm-up (oneDNN primitives)
  Timer t;
  std::vector<int32_t> next(B);
  std::vector<int> slots(B);
  for (int b = 0; b < B; ++b) {
    next[b] = serve::argmax(gen.prefill(b, prompts[b]));
    slots[b] = b;
  }
  double prefill_s = t.seconds() / B;
  t.reset();
  const size_t V = static_cast<size_t>(cfg.vocab_size);
  for (int i = 0; i < args.decode; ++i) {
    std::span<const float> rows = gen.decode_batch(slots, next);
    for (int b = 0; b < B; ++b) next[b] = serve::argmax(rows.subspan(b * V, V));
  }
  double decode_s = t.seconds() / B;  // per token of one sequence, for the rates below
  // The bytes a step reads: every weight once (bf16: the matrices at 2 bytes, about all of them).
  double weight_bytes = static_cast<double>(model.store().numel()) * (gen.weights() == DType::kBF16 ? 2.0 : 4.0);
  nlohmann::json j = {{"model", cfg.describe()}, {"weights", dtype_name(gen.weights())}, {"threads", threads_get()},
                      {"decode_batch", B}, {"prompt_tokens", args.seq},
                      {"decode_tokens", args.decode}, {"prefill_tokens_per_s", args.seq / prefill_s},
                      {"decode_tokens_per_s", args.decode / decode_s},
                      {"decode_weight_gb_per_s", weight_bytes * args.decode / (decode_s * B) / 1e9},
                      {"kv_cache_bytes", gen.cache_bytes()}};
  if (args.json) {
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("model        %s, %s weights, threads=%d\n", cfg.describe().c_str(), dtype_name(gen.weights()), threads_get());
  std::printf("prefill      %d tokens: %.1f tokens/s\n", args.seq, args.seq / prefill_s);
  std::printf("decode       %d tokens after them, %d sequences a step: %.1f tokens/s (%.1f ms a step, weights read "
              "once a step at %.1f GB/s)\n",
              args.decode, B, args.decode / decode_s, decode_s * B / args.decode * 1e3,
              weight_bytes * args.decode / (decode_s * B) / 1e9);
  std::printf("kv cache     %s\n", format_bytes(gen.cache_bytes()).c_str());
}

// Training steps on the GPU (models/device_lm.h): forward + backward + global norm + AdamW, timed
// after a device synchronisation; the ceiling is a large bf16 GEMM measured in the same process.
void run_device_bench(const BenchArgs& args) {
  models::ModelConfig cfg = engine::hf_config_load(args.config);
  models::ModelOptions opts;
  opts.compute_dtype = dtype_from_name(args.dtype);
  opts.recompute = args.recompute;
  models::TransformerLM model(cfg, opts);
  // The CPU bench trains the config's dropout; the CUDA model has none, so timing it would time
  // another model.
  MT_CHECK(!model.has_dropout(), ErrorKind::kNotSupported,
           args.config + ": dropout (embd_pdrop, resid_pdrop, attn_pdrop / attention_dropout) is not supported on the "
                         "CUDA backend; set them to 0 in the config to time it there");
  model.prepare(args.batch, args.seq);
  auto dev = models::make_cuda_lm(model);
  int N = args.batch * args.seq;
  std::vector<int32_t> tokens(N), targets(N);
  std::mt19937 rng(42);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % static_cast<unsigned>(cfg.vocab_size));
  for (int i = 0; i < N; ++i) targets[i] = (i + 1) % args.seq == 0 ? tokens[i] : tokens[i + 1];
  std::vector<optim::ParamSegment> segs{{0, model.store().numel(), 0.1f, "all"}};
  kernels::AdamWParams p;
  p.lr = 1e-4f;
  float loss = 0.0f;
  auto step = [&](int64_t t) {
    dev->zero_grad();
    loss = dev->forward(tokens.data(), targets.data(), 1.0f);
    dev->backward();
    double norm = std::sqrt(dev->grad_sum_squares());
    p.grad_scale = norm > 1.0 ? static_cast<float>(1.0 / (norm + 1e-6)) : 1.0f;
    p.step = t;
    dev->adamw_step(segs, p);
    dev->synchronize();
  };
  for (int i = 0; i < args.warmup; ++i) step(i + 1);
  dev->reset_peaks();
  std::vector<double> times;
  for (int i = 0; i < args.steps; ++i) {
    Timer t;
    step(args.warmup + i + 1);
    times.push_back(t.seconds());
  }
  std::sort(times.begin(), times.end());
  double step_s = times[times.size() / 2];
  double flops = model.train_flops_per_step();
  double tflops = flops / step_s / 1e12;
  MemStats mem = dev->memory();
  // Where the time goes: a few more steps with every op timed by events (not in the figures above).
  nlohmann::json prof = nlohmann::json::array();
  if (args.profile) {
    const int psteps = 3;
    models::cuda_set_profiling(true);
    for (int i = 0; i < psteps; ++i) step(args.warmup + args.steps + i + 1);
    models::cuda_set_profiling(false);
    for (const models::DeviceOpTime& e : models::cuda_profile_report())
      prof.push_back({{"op", e.op}, {"ms_per_step", e.ms / psteps}, {"calls_per_step", e.calls / psteps}});
    // The MLP's up-projection shape under a few epilogues and layouts (TFLOP/s).
    for (auto& [name, tf] : models::cuda_gemm_probe(N, cfg.intermediate, cfg.hidden))
      prof.push_back({{"op", "probe " + std::to_string(N) + "x" + std::to_string(cfg.intermediate) + "x" +
                                 std::to_string(cfg.hidden) + " " + name},
                      {"ms_per_step", 0.0}, {"calls_per_step", 0}, {"tflops", tf}});
  }
  models::DeviceCeilings ceil = models::cuda_ceilings();
  nlohmann::json j;
  j["model"] = cfg.describe();
  j["device"] = dev->device_name();
  j["dtype"] = dtype_name(opts.compute_dtype);
  j["batch"] = args.batch;
  j["seq"] = args.seq;
  j["recompute"] = args.recompute;
  j["steps"] = args.steps;
  j["step_seconds"] = step_s;
  j["tokens_per_s"] = N / step_s;
  j["tflops"] = tflops;
  j["flops_per_step"] = flops;
  j["gemm_ceiling_tflops"] = ceil.bf16_gemm_tflops;
  j["copy_gbps"] = ceil.copy_gbps;
  j["mfu_vs_ceiling"] = tflops / ceil.bf16_gemm_tflops;
  j["loss"] = loss;
  nlohmann::json peak;
  for (int c = 0; c < kMemCategoryCount; ++c) peak[mem_category_name(static_cast<MemCategory>(c))] = mem.peak[c];
  j["peak_bytes"] = peak;
  j["peak_total_bytes"] = mem.total_peak;
  if (args.profile) j["profile"] = prof;
  if (args.json) {
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("model        %s\n", cfg.describe().c_str());
  std::printf("device       %s\n", dev->device_name().c_str());
  std::printf("setup        B=%d T=%d dtype=%s recompute=%s\n", args.batch, args.seq, dtype_name(opts.compute_dtype),
              args.recompute ? "on" : "off");
  std::printf("step         %.2f ms median of %d (forward + backward + norm + AdamW)\n", step_s * 1e3, args.steps);
  std::printf("throughput   %.0f tokens/s, loss %.4f\n", N / step_s, loss);
  std::printf("flops        %.1f TFLOP/s = %.1f%% of the measured bf16 GEMM ceiling %.1f TFLOP/s (copy %.0f GB/s)\n",
              tflops, 100.0 * tflops / ceil.bf16_gemm_tflops, ceil.bf16_gemm_tflops, ceil.copy_gbps);
  std::printf("peak memory  %s total\n", format_bytes(mem.total_peak).c_str());
  if (args.profile) {
    double total = 0.0;
    for (const auto& e : prof) total += e["ms_per_step"].get<double>();
    std::printf("per op (event-timed steps, %.2f ms of ops a step)\n", total);
    for (const auto& e : prof) {
      if (e.contains("tflops"))
        std::printf("  %-50s %8.1f TFLOP/s\n", e["op"].get<std::string>().c_str(), e["tflops"].get<double>());
      else
        std::printf("  %-34s %8.3f ms %5.1f%%  x%d\n", e["op"].get<std::string>().c_str(), e["ms_per_step"].get<double>(),
                    100.0 * e["ms_per_step"].get<double>() / total, e["calls_per_step"].get<int>());
    }
  }
}

void run_bench(const BenchArgs& args) {
  // A negative --decode ran the training benchmark, and the decode bench ignored the training
  // bench's --dtype, --batch and --recompute: refused rather than measured as something else.
  MT_CHECK(args.decode >= 0, ErrorKind::kInvalidArgument, "--decode must be a number of decode steps (>= 1)");
  MT_CHECK(args.threads >= 0, ErrorKind::kInvalidArgument, "--threads must be >= 0 (0: all cores)");
  MT_CHECK(args.decode == 0 || ((args.dtype == "fp32" || args.dtype == "bf16") && args.batch == 4 && !args.recompute),
           ErrorKind::kInvalidArgument,
           "--decode times generation with f32 or bf16 weights (--dtype fp32|bf16): --batch and --recompute belong to "
           "the training benchmark (--decode-batch sets the sequences decoded together)");
  MT_CHECK(args.decode == 0 || args.device == "cpu", ErrorKind::kInvalidArgument,
           "--decode times generation on the CPU; --device " + args.device + " is the training benchmark's");
  if (args.decode > 0) return run_decode_bench(args);
  if (args.device == "cuda") return run_device_bench(args);
  MT_CHECK(args.device == "cpu", ErrorKind::kInvalidArgument, "--device: cpu or cuda, not " + args.device);
  MT_CHECK(args.steps > 0 && args.warmup >= 0, ErrorKind::kInvalidArgument, "--steps must be > 0, --warmup >= 0");
  threads_set(args.threads);
  models::ModelConfig cfg = engine::hf_config_load(args.config);
  models::ModelOptions opts;
  opts.compute_dtype = dtype_from_name(args.dtype);
  // The production step: the engine over one process (AdamW, clipping 1.0, a static f16 scale).
  nlohmann::json rc = {{"model", args.config}, {"seq_length", args.seq}, {"train_micro_batch_size_per_gpu", args.batch},
                       {"gradient_accumulation_steps", 1}, {"gradient_clipping", 1.0},
                       {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}}};
  if (opts.compute_dtype == DType::kBF16) rc["bf16"] = {{"enabled", true}};
  if (opts.compute_dtype == DType::kF16) rc["fp16"] = {{"enabled", true}, {"loss_scale", 1024}};
  if (args.recompute) rc["activation_checkpointing"] = {{"enabled", true}};
  engine::RunConfig run_cfg = engine::ds_config_parse(rc, args.config);
  auto model = engine::engine_build_model(run_cfg);
  engine::Engine trainer(run_cfg, *model);

  int N = args.batch * args.seq;
  std::vector<int32_t> tokens(N), targets(N);
  std::mt19937 rng(42);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % static_cast<unsigned>(cfg.vocab_size));
  for (int i = 0; i < N; ++i) targets[i] = (i + 1) % args.seq == 0 ? tokens[i] : tokens[i + 1];

  auto step = [&] {
    trainer.forward_backward(tokens.data(), targets.data());
    return trainer.step();
  };
  for (int i = 0; i < args.warmup; ++i) step();
  Allocator::global().reset_peaks();
  std::vector<double> times;
  engine::StepResult last;
  double fwd = 0, bwd = 0, opt = 0;
  for (int i = 0; i < args.steps; ++i) {
    Timer t;
    last = step();
    times.push_back(t.seconds());
    fwd += last.forward_seconds;
    bwd += last.backward_seconds;
    opt += last.step_seconds;
  }
  std::sort(times.begin(), times.end());
  double step_s = times[times.size() / 2];  // median
  double flops = model->train_flops_per_step();
  double tflops = flops / step_s / 1e12;
  double tokens_per_s = N / step_s;
  double ceiling = kernels::gemm_ceiling_tflops(N, cfg.intermediate, cfg.hidden, opts.compute_dtype);
  MemStats mem = Allocator::global().stats();
  double act_per_token = static_cast<double>(model->activation_bytes()) / N;

  if (args.json) {
    nlohmann::json j;
    j["model"] = cfg.describe();
    j["params"] = cfg.num_params();
    j["dtype"] = dtype_name(opts.compute_dtype);
    j["batch"] = args.batch;
    j["seq"] = args.seq;
    j["threads"] = threads_get();
    j["isa"] = isa_name(isa_active());
    j["recompute"] = args.recompute;
    j["steps"] = args.steps;
    j["step_seconds"] = step_s;
    j["forward_seconds"] = fwd / args.steps;
    j["backward_seconds"] = bwd / args.steps;
    j["optimizer_seconds"] = opt / args.steps;
    j["tokens_per_s"] = tokens_per_s;
    j["tflops"] = tflops;
    j["flops_per_step"] = flops;
    j["gemm_ceiling_tflops"] = ceiling;
    j["mfu_vs_ceiling"] = tflops / ceiling;
    j["loss"] = last.loss;
    j["activation_bytes_per_token"] = act_per_token;
    nlohmann::json peak;
    for (int c = 0; c < kMemCategoryCount; ++c) peak[mem_category_name(static_cast<MemCategory>(c))] = mem.peak[c];
    j["peak_bytes"] = peak;
    j["peak_total_bytes"] = mem.total_peak;
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("model        %s\n", cfg.describe().c_str());
  std::printf("setup        B=%d T=%d dtype=%s threads=%d isa=%s recompute=%s\n", args.batch, args.seq,
              dtype_name(opts.compute_dtype), threads_get(), isa_name(isa_active()), args.recompute ? "on" : "off");
  std::printf("step         %.1f ms median of %d (forward %.1f, backward %.1f, optimizer %.1f ms mean)\n",
              step_s * 1e3, args.steps, fwd / args.steps * 1e3, bwd / args.steps * 1e3, opt / args.steps * 1e3);
  std::printf("throughput   %.1f tokens/s, loss %.4f\n", tokens_per_s, last.loss);
  std::printf("flops        %.3f TFLOP/s achieved = (6*N_matmul*tokens + 6*L*T*A*tokens) / step\n", tflops);
  std::printf("             with N_matmul = %.1fM (params less position embeddings), %.1f GFLOP per step\n",
              (flops / N - 6.0 * cfg.n_layer * args.seq * cfg.n_head * cfg.head_dim()) / 6.0 / 1e6, flops / 1e9);
  std::printf("ceiling      %.3f TFLOP/s GEMM (%d x %d x %d, %s) -> %.0f%% of ceiling\n", ceiling, N,
              cfg.intermediate, cfg.hidden, dtype_name(opts.compute_dtype), 100.0 * tflops / ceiling);
  std::printf("activations  %.1f KiB per token (%s for B*T=%d)\n", act_per_token / 1024.0,
              format_bytes(model->activation_bytes()).c_str(), N);
  std::printf("peak memory ");
  for (int c = 0; c < kMemCategoryCount; ++c)
    std::printf(" %s %s%s", mem_category_name(static_cast<MemCategory>(c)), format_bytes(mem.peak[c]).c_str(),
                c + 1 < kMemCategoryCount ? "," : "\n");
}

}  // namespace

void write_disk_ceiling(const std::string& dir, const DiskCeiling& c) {
  const nlohmann::json j = {{"write_gbs", c.write_gbs}, {"read_gbs", c.read_gbs}, {"mixed_gbs", c.mixed_gbs}, {"bytes", c.bytes}};
  const std::string text = j.dump() + "\n";
  file_write_atomic(dir + "/.meshtrain-io-ceiling.json", text.data(), text.size());
}

bool read_disk_ceiling(const std::string& dir, DiskCeiling* c) {
  std::ifstream f(dir + "/.meshtrain-io-ceiling.json");
  if (!f) return false;
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.value("read_gbs", 0.0) || !j.value("write_gbs", 0.0)) return false;
  *c = DiskCeiling{j.value("write_gbs", 0.0), j.value("read_gbs", 0.0), j.value("mixed_gbs", 0.0),
                   j.value("bytes", 0ull)};
  return true;
}

// The disk's ceiling for the swap: one sequential pass each way, and the sweep over request size
// and depth that finds the best (what fio's sequential direct-I/O jobs report).
void run_io_bench(const BenchArgs& args) {
  // (--io-block -1 became SIZE_MAX, rounded up to 0, and divided by: SIGFPE.)
  MT_CHECK(args.io_mib >= 1 && args.io_mib <= (int64_t{1} << 30), ErrorKind::kInvalidArgument,
           "--io-size must be at least 1 MiB (got " + std::to_string(args.io_mib) + ")");
  MT_CHECK(args.io_block >= 4096 && args.io_block % 4096 == 0 && args.io_block <= (int64_t{1} << 30), ErrorKind::kInvalidArgument,
           "--io-block must be a multiple of 4096 bytes, at most 1 GiB (got " + std::to_string(args.io_block) + ")");
  MT_CHECK(args.io_depth >= 1 && args.io_threads >= 1, ErrorKind::kInvalidArgument, "--io-depth and --io-threads must be at least 1");
  // A directory that is not there was created, and whatever disk it landed on measured (stop 73;
  // calibrate --io refuses it too).
  std::error_code ec;
  MT_CHECK(std::filesystem::is_directory(args.io_dir, ec), ErrorKind::kInvalidArgument,
           "--io " + args.io_dir + ": " + (std::filesystem::exists(args.io_dir, ec) ? "not a directory" : "no such directory") +
               " (the disk measured is the one that holds it)");
  io::AioOptions o;
  o.block_size = static_cast<size_t>(args.io_block);
  o.queue_depth = args.io_depth;
  o.thread_count = args.io_threads;
  const uint64_t bytes = static_cast<uint64_t>(args.io_mib) << 20;
  io::Bandwidth bw = io::bandwidth_probe(args.io_dir, bytes, o);
  write_disk_ceiling(args.io_dir, DiskCeiling{bw.write_gbs, bw.read_gbs, bw.mixed_gbs, bytes});
  if (args.json) {
    nlohmann::json j = {{"dir", args.io_dir}, {"bytes", bytes}, {"direct", bw.direct}, {"block_size", o.block_size},
                        {"queue_depth", o.queue_depth}, {"thread_count", o.thread_count}, {"io_uring", io::io_uring_available()},
                        {"write_gbs", bw.write_gbs}, {"read_gbs", bw.read_gbs}, {"mixed_gbs", bw.mixed_gbs}};
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("disk         %s (%s, %s)\n", args.io_dir.c_str(), bw.direct ? "O_DIRECT" : "buffered: no O_DIRECT here",
              io::io_uring_available() ? "io_uring" : "pread/pwrite: no io_uring here");
  std::printf("setup        %llu MiB each way, block %zu KiB, depth %d, %d thread(s)\n",
              static_cast<unsigned long long>(args.io_mib), o.block_size >> 10, o.queue_depth, o.thread_count);
  std::printf("write        %.2f GB/s\n", bw.write_gbs);
  std::printf("read         %.2f GB/s\n", bw.read_gbs);
  std::printf("mixed        %.2f GB/s read + written (one half read while the other is written)\n", bw.mixed_gbs);
  std::printf("recorded     %s/.meshtrain-io-ceiling.json (a run swapping under %s reports its share of it)\n",
              args.io_dir.c_str(), args.io_dir.c_str());
}

void register_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  auto* cmd = app.add_subcommand("bench", "Time full training steps of a model (forward + backward + AdamW)");
  cmd->add_option("MODEL_CONFIG", args->config, "Hugging Face config.json of the model (not with --io)");
  cmd->add_option("--io", args->io_dir, "measure the disk under this directory instead: sequential direct-I/O write "
                                        "and read bandwidth (the ceiling for offload to nvme)");
  cmd->add_option("--io-size", args->io_mib, "--io: MiB written and read")->capture_default_str();
  cmd->add_option("--io-block", args->io_block, "--io: bytes per request (aio.block_size)")->capture_default_str();
  cmd->add_option("--io-depth", args->io_depth, "--io: requests in flight per thread (aio.queue_depth)")->capture_default_str();
  cmd->add_option("--io-threads", args->io_threads, "--io: I/O threads (aio.thread_count)")->capture_default_str();
  cmd->add_option("--batch", args->batch, "micro-batch size B")->capture_default_str();
  cmd->add_option("--decode-batch", args->decode_batch, "with --decode: sequences decoded together each step (default 1)");
  cmd->add_option("--seq", args->seq, "sequence length T")->capture_default_str();
  cmd->add_option("--dtype", args->dtype, "compute dtype: fp32, bf16 or fp16")->capture_default_str();
  cmd->add_option("--threads", args->threads, "threads (0: all cores)")->capture_default_str();
  cmd->add_option("--steps", args->steps, "timed steps")->capture_default_str();
  cmd->add_option("--warmup", args->warmup, "untimed warm-up steps")->capture_default_str();
  cmd->add_option("--device", args->device, "cpu or cuda (a build with -DMT_CUDA=ON)")->capture_default_str();
  cmd->add_flag("--recompute", args->recompute, "recompute each block in backward (activation checkpointing)");
  cmd->add_flag("--profile", args->profile,
                "--device cuda: 3 more steps with every op timed by CUDA events, the time per op (not in the step figure)");
  cmd->add_flag("--json", args->json, "print one JSON object");
  CLI::Option* decode = cmd->add_option("--decode", args->decode, "time generation instead: prefill --seq tokens, then this many decode steps");
  cmd->callback([args, decode] {
    // (0 was taken for absent: --decode 0 ran the training benchmark, exit 0)
    MT_CHECK(decode->count() == 0 || args->decode >= 1, ErrorKind::kInvalidArgument,
             "--decode must be a number of decode steps (>= 1)");
    if (!args->io_dir.empty()) return run_io_bench(*args);
    MT_CHECK(!args->config.empty(), ErrorKind::kInvalidArgument, "bench: MODEL_CONFIG is required (or --io DIR)");
    run_bench(*args);
  });
}

}  // namespace mt::cli
