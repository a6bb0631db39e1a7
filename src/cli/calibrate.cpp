// meshtrain calibrate [-o cal.json] [--quick] [--io DIR] [--force]: times this machine's GEMMs,
// a memory-bound kernel, the AdamW update, and (under mpirun, 2 or more ranks) every collective
// and p2p over message sizes, and the disk where asked (planner/calibrate.h), and writes the
// fitted lines as JSON for the planner. The file is reused while the binary and the hardware are
// the same (its fingerprint); --force measures again.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/file_io.h"
#include "base/threads.h"
#include "cli/commands.h"
#include "comm/mpi_backend.h"
#include "engine/json_file.h"
#include "planner/calibrate.h"

namespace mt::cli {
namespace fs = std::filesystem;

namespace {

struct CalibrateArgs {
  std::string out = "calibration.json";
  bool quick = false, force = false, exchange_probe = false, speed_probe = false, pace = false;
  std::string io_dir;
  unsigned long long io_mib = 1024;
  int threads = 0;
};

// What a calibration is valid for: the binary (size and modification time), the CPU, its cores,
// the threads and ranks it ran with, and on several ranks the collectives' algorithms that the
// environment chooses (libnbc's all-reduce, MT_REDUCE_SCATTER): each changes what they cost.
nlohmann::json fingerprint(int world) {
  std::string cpu;
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);)
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  const auto size = ec ? 0 : fs::file_size(exe, ec);
  const auto mtime = ec ? 0 : fs::last_write_time(exe, ec).time_since_epoch().count();
  nlohmann::json fp = {{"cpu", cpu},           {"cores", comm::mpi_host_cores()},
                       {"threads", threads_get()}, {"world", world},
                       {"binary", exe.string()}, {"binary_bytes", size},
                       {"binary_mtime", mtime}};
  if (world > 1)
    fp["collectives"] = {{"iallreduce_algorithm", comm::mpi_iallreduce_algorithm()},
                         {"reduce_scatter", comm::mpi_reduce_scatter_path()},
                         {"wait_nap_us", comm::mpi_wait_sleep_us()}};
  return fp;
}

void run_calibrate(const CalibrateArgs& args) {
  // (-1 was taken for "not given", as 0 is)
  MT_CHECK(args.threads >= 0, ErrorKind::kInvalidArgument, "--threads must be at least 1, or 0 for OpenMP's count (got " +
                                                                std::to_string(args.threads) + ")");
  // The probe's mixed pass reads one of its 64 MiB chunks while writing another: below two it did
  // not run, and the calibration said a mixed rate of 0, which plan then refused as not measured.
  MT_CHECK(args.io_dir.empty() || args.io_mib >= 128, ErrorKind::kInvalidArgument,
           "--io-size must be at least 128 MiB (two of the disk probe's 64 MiB chunks; got " + std::to_string(args.io_mib) + ")");
  // (-o '' measured for seconds, then failed its rename with exit 1.)
  MT_CHECK(!args.out.empty(), ErrorKind::kInvalidArgument, "-o: give the calibration's path; nothing was measured");
  // The disk probe's directory is the disk the offload will use: one that is not there was created
  // (as root, at /nonexistent) and the root disk's speed recorded for a misspelt NVMe mount.
  if (!args.io_dir.empty()) {
    std::error_code ec;
    MT_CHECK(fs::is_directory(args.io_dir, ec), ErrorKind::kInvalidArgument,
             "--io " + args.io_dir + ": " + (fs::exists(args.io_dir, ec) ? "not a directory" : "no such directory") +
                 " (the disk probe writes its files in the offload's directory; nothing was measured)");
  }
  // Before MPI: mpi_init sets a waiting rank's nap from the threads (comm::mpi_wait_sleep_us).
  if (args.threads > 0) threads_set(args.threads);  // else OpenMP's (meshtrain launch sets one per rank's share)
  std::shared_ptr<comm::Backend> world = mpi_world();
  const int P = world ? world->size() : 1;
  const bool lead = !world || world->rank() == 0;
  if (args.speed_probe) {  // the machine's speed state now (scripts/planner-campaign.sh, before calibrating)
    MT_CHECK(P == 1, ErrorKind::kInvalidArgument,
             "calibrate --speed-probe: one process times it (plan --validate runs it so); run it without meshtrain launch");
    std::printf("speed probe: %.4f s on %d thread(s)\n", planner::speed_probe(threads_get()), threads_get());
    return;
  }
  if (args.exchange_probe) {  // plan --validate, before each run of several ranks
    MT_CHECK(P > 1, ErrorKind::kInvalidArgument,
             "calibrate --exchange-probe: one rank has no exchange to probe (run it under meshtrain launch -n 2 or more)");
    const double s = planner::exchange_probe(*world);
    if (lead) std::printf("exchange probe: %.9f s (1 MiB all_reduce over %d ranks)\n", s, P);
    world.reset();
    comm::mpi_finalize();
    return;
  }
  nlohmann::json fp = fingerprint(P);
  if (args.pace) fp["pace"] = true;  // a paced calibration is not an unpaced one's, nor the reverse
  bool fresh = args.force || !fs::exists(args.out);
  std::error_code fec;
  MT_CHECK(!fs::exists(args.out, fec) || fs::is_regular_file(args.out, fec), ErrorKind::kInvalidArgument,
           args.out + ": not a regular file (-o names the calibration's file); nothing was measured");
  if (!fresh) {
    // A file cut short or emptied (a killed calibrate) is measured over, as one the planner cannot
    // read is (it was refused: "not valid JSON", until --force).
    nlohmann::json old;
    try {
      old = engine::json_load_file(args.out);
    } catch (const Error& e) {
      fresh = true;
      if (lead) std::printf("note: %s; measuring again\n", e.what());
    }
    // The disk probed is part of what is cached: --io another directory measures that one.
    auto same_dir = [](const std::string& a, const std::string& b) {
      std::error_code ec1, ec2;
      return fs::weakly_canonical(a, ec1) == fs::weakly_canonical(b, ec2) && !ec1 && !ec2;
    };
    fresh = fresh || !old.is_object() || !old.contains("fingerprint") || old["fingerprint"] != fp ||
            (!args.io_dir.empty() &&
             !(old.contains("disk") && old["disk"].is_object() && old["disk"].contains("dir") && old["disk"]["dir"].is_string() &&
               same_dir(old["disk"]["dir"].get<std::string>(), args.io_dir)));
    // A file of this machine that the planner cannot read (a field edited or cut, a family lost)
    // was reused as "up to date" and failed every plan after: measured again.
    if (!fresh) {
      try {
        const planner::Calibration cal = load_calibration(args.out, "-o");
        for (const char* family : {"gemm f32", "gemm bf16", "memory", "adamw"})
          MT_CHECK(cal.fits.count(family), ErrorKind::kInvalidArgument, args.out + ": no '" + family + "' fit");
      } catch (const Error& e) {
        fresh = true;
        if (lead) std::printf("note: %s; measuring again\n", e.what());
      }
    }
  }
  if (!fresh) {
    if (lead)
      std::printf("calibration up to date: %s (same binary, hardware, threads and ranks); --force measures again\n",
                  args.out.c_str());
    if (world) {
      world.reset();
      comm::mpi_finalize();
    }
    return;
  }
  // The output is probed before minutes of measuring (-o /nonexistent/c.json measured for 2.5
  // minutes, then failed at the write with the measurements lost). Rank 0 writes it; every rank
  // learns whether it can.
  std::string unwritable;
  if (lead) {
    std::string probe = args.out + ".probe-XXXXXX";  // a name of its own: no file of the user's is touched
    if (const int fd = ::mkstemp(probe.data()); fd >= 0) {
      ::close(fd);
      std::remove(probe.c_str());
    } else {
      unwritable = args.out + ": cannot write the calibration there (" + std::strerror(errno) + "); nothing was measured";
    }
  }
  if (world) {
    float flag = unwritable.empty() ? 0.0f : 1.0f;
    comm::AllReduceOptions ao;
    ao.op = comm::ReduceOp::kMax;
    ao.tag = "calibrate: output writable";
    world->all_reduce(&flag, 1, DType::kF32, ao)->wait();
    if (flag > 0.0f && unwritable.empty()) unwritable = args.out + ": rank 0 cannot write the calibration there";
  }
  MT_CHECK(unwritable.empty(), ErrorKind::kInvalidArgument, unwritable);  // (a path: bad input, exit 2)
  planner::CalibrateOptions o;
  o.quick = args.quick;
  o.pace = args.pace;
  o.group = world.get();
  o.io_dir = args.io_dir;
  o.io_bytes = args.io_mib << 20;
  const planner::Calibration cal = planner::calibrate(o);
  if (lead) {
    nlohmann::json j;
    j["fingerprint"] = fp;
    j["world"] = cal.world;
    j["threads"] = cal.threads;
    j["kernel_ranks"] = cal.kernel_ranks;
    if (cal.collective_max_bytes > 0) j["collective_max_bytes"] = cal.collective_max_bytes;
    if (cal.ranks_per_host > 0) j["ranks_per_host"] = cal.ranks_per_host;
    j["speed_probe_s"] = cal.speed_probe_s;
    if (!cal.speed_probes.empty()) j["speed_probes_s"] = cal.speed_probes;
    if (cal.process_bytes > 0) j["process_bytes"] = cal.process_bytes;
    if (cal.cache_bytes > 0) j["cache_bytes"] = cal.cache_bytes;
    j["f16_native"] = cal.f16_native;
    j["bf16_native"] = cal.bf16_native;
    if (cal.exchange_probe_s > 0) {
      j["exchange_probe_s"] = cal.exchange_probe_s;
      j["exchange_probes_s"] = cal.exchange_probes;
    }
    for (const auto& [family, f] : cal.fits) j["fits"][family] = {{"latency_s", f.latency}, {"per_unit_s", f.per_unit}};
    for (const auto& [family, pts] : cal.curves) j["fits"][family]["curve"] = pts;  // [[units, seconds], ...]
    for (const planner::CalPoint& p : cal.points)
      j["points"].push_back({{"what", p.what}, {"units", p.units}, {"seconds", p.seconds}});
    if (cal.disk_read_gbs > 0)
      j["disk"] = {{"dir", args.io_dir}, {"read_gbs", cal.disk_read_gbs}, {"write_gbs", cal.disk_write_gbs},
                   {"mixed_gbs", cal.disk_mixed_gbs}, {"interference_s_per_gb", cal.disk_interference_s_per_byte * 1e9}};
    const std::string text = j.dump(1) + "\n";
    file_write_atomic(args.out, text.data(), text.size());
    std::printf("calibrated %d rank(s) x %d thread(s)%s -> %s\n", cal.world, cal.threads,
                cal.ranks_per_host > 0 ? (" on " + std::to_string(cal.world / cal.ranks_per_host) + " hosts").c_str() : "",
                args.out.c_str());
    std::printf("speed probe: %.4f s on %d thread(s) (plan --validate runs it again before each run)\n", cal.speed_probe_s,
                cal.threads);
    if (!cal.speed_probes.empty()) {
      std::string each;
      for (double p : cal.speed_probes) {
        char b[32];
        std::snprintf(b, sizeof b, "%s%.4f", each.empty() ? "" : ", ", p);
        each += b;
      }
      std::printf("speed probe at each phase (before the kernels, before the in-situ blocks, %sat the end): %s s\n",
                  cal.speed_probes.size() > 3 ? "before the collectives, " : "", each.c_str());
      const std::string spread = planner::speed_spread_verdict(cal.speed_probes);
      if (!spread.empty()) std::fprintf(stderr, "warning: %s\n", spread.c_str());
    }
    std::printf("process constant: %.1f MiB (resident beyond the allocator's blocks, the largest rank's; plan adds it to "
                "each layout's predicted footprint)\n", static_cast<double>(cal.process_bytes) / 1048576.0);
    if (cal.exchange_probe_s > 0) {
      std::string each;
      for (double p : cal.exchange_probes) {
        char b[32];
        std::snprintf(b, sizeof b, "%s%.3f", each.empty() ? "" : ", ", p * 1e3);
        each += b;
      }
      std::printf("exchange probe: %.3f ms, a 1 MiB all_reduce over %d ranks (one in each sweep of the collectives: "
                  "%s ms; plan --validate runs it again before each run of %d ranks)\n",
                  cal.exchange_probe_s * 1e3, cal.world, each.c_str(), cal.world);
      const std::string spread = planner::exchange_spread_verdict(cal.exchange_probes);
      if (!spread.empty()) std::fprintf(stderr, "warning: %s\n", spread.c_str());
    }
    if (cal.kernel_ranks < cal.world)
      std::printf("kernels timed on %d rank(s) of a host at once: %d x %d thread(s) fill its %u cores\n", cal.kernel_ranks,
                  cal.kernel_ranks, cal.threads, comm::mpi_host_cores());
    if (cal.collective_max_bytes > 0 && cal.collective_max_bytes < (size_t{1} << 27))
      std::printf("collectives timed up to %.0f MiB a rank: %d rank(s) share this host's memory\n",
                  static_cast<double>(cal.collective_max_bytes) / (1 << 20), cal.world);
    std::printf("%-24s %12s %16s\n", "family", "latency", "rate");
    for (const auto& [family, f] : cal.fits) {
      if (family.rfind("in situ", 0) == 0) {  // a factor, not a rate; beside it, the factor as timed
        const std::string raw = "in situ factor " + family.substr(8) + " raw";  // before the pace
        auto it = std::find_if(cal.points.begin(), cal.points.end(), [&](const planner::CalPoint& p) { return p.what == raw; });
        if (it != cal.points.end())
          std::printf("%-24s %12.3f x the kernels' sum (as timed: %.3f)\n", family.c_str(), f.per_unit, it->seconds);
        else
          std::printf("%-24s %12.3f x the kernels' sum\n", family.c_str(), f.per_unit);
        continue;
      }
      if (family.size() > 11 && (family.rfind(" query tile") == family.size() - 11 || family.rfind(" pair") == family.size() - 5)) {
        // attention's split (DESIGN-NOTES 105): a time each, not a rate
        const bool tile = family.rfind(" query tile") == family.size() - 11;
        std::printf("%-24s %12.3f %s\n", family.c_str(), f.per_unit * (tile ? 1e6 : 1e9), tile ? "us a query tile of a head" : "ns a pair");
        continue;
      }
      const bool flops = family.rfind("gemm", 0) == 0 || family.rfind("attention", 0) == 0 || family.rfind("sparse attention", 0) == 0;
      const std::string base = family.substr(0, family.find(' '));  // "all_reduce intra" -> "all_reduce"
      const bool bytes = family == "memory" || family == "copy" || family == "zero" || family == "convert" || base == "all_reduce" || base == "all_gather" || base == "reduce_scatter" ||
                         base == "send_recv" || base == "onebit_all_reduce" || base == "all_to_all";
      const double rate = f.per_unit > 0 ? 1.0 / f.per_unit : 0.0;
      std::printf("%-24s %9.1f us %12.2f %s\n", family.c_str(), f.latency * 1e6, flops ? rate / 1e12 : rate / 1e9,
                  flops ? "TFLOP/s" : bytes ? "GB/s" : "G elements/s");
    }
    if (cal.disk_read_gbs > 0)
      std::printf("disk %s: read %.2f GB/s, write %.2f GB/s, mixed %.2f GB/s; compute beside it loses %.3f s per GB moved\n",
                  args.io_dir.c_str(), cal.disk_read_gbs, cal.disk_write_gbs, cal.disk_mixed_gbs,
                  cal.disk_interference_s_per_byte * 1e9);
  }
  if (world) {
    world.reset();
    comm::mpi_finalize();
  }
}

}  // namespace

void register_calibrate(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "calibrate", "Time this machine's kernels, collectives (under mpirun) and disk for the planner's cost model");
  auto a = std::make_shared<CalibrateArgs>();
  cmd->add_option("-o,--output", a->out, "calibration JSON to write (default calibration.json)");
  cmd->add_flag("--quick", a->quick, "fewer and smaller points");
  cmd->add_flag("--force", a->force, "measure even when the file matches this binary and machine");
  cmd->add_option("--io", a->io_dir, "also probe the disk under this directory");
  cmd->add_option("--io-size", a->io_mib, "MiB each way for the disk probe (default 1024)");
  cmd->add_flag("--exchange-probe", a->exchange_probe,
                "only time the exchange probe (a 1 MiB all_reduce over the ranks) and print its seconds; writes nothing");
  cmd->add_flag("--speed-probe", a->speed_probe,
                "only time the speed probe (a fixed sample of a step's work, as plan --validate runs before each run) and "
                "print its seconds; writes nothing");
  cmd->add_flag("--pace", a->pace,
                "experimental: scale each in-situ block to the kernels' pace, taken after every kernel point and around "
                "every block (DESIGN-NOTES 84); the factors as timed are kept in the file and printed beside");
  cmd->add_option("--threads", a->threads, "threads per rank (default: OMP_NUM_THREADS, which meshtrain launch sets to the cores per rank)");
  cmd->callback([a] { run_calibrate(*a); });
}

}  // namespace mt::cli
