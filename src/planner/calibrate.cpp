#include "planner/calibrate.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>
#include <tuple>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/file_io.h"
#include "base/threads.h"
#include "base/timer.h"
#include "comm/mpi_backend.h"
#include "comm/onebit.h"
#include "io/aio.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/sparse_attention.h"
#include "models/module_profile.h"
#include "models/transformer.h"
#include "optim/optimizer.h"
#include "tensor/dtype.h"
#include "planner/cost.h"

namespace mt::planner {

LinearFit fit_line(const std::vector<std::pair<double, double>>& points, bool relative) {
  MT_CHECK(!points.empty(), ErrorKind::kInvalidArgument, "fit_line: no points");
  // Relative least squares (each point weighted by 1/seconds²): the points span orders of
  // magnitude, and a plain fit would let the largest decide the latency alone.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, y] : points) {
    const double w = relative && y > 0 ? 1.0 / (y * y) : 1.0;
    sw += w;
    sx += w * x;
    sy += w * y;
    sxx += w * x * x;
    sxy += w * x * y;
  }
  LinearFit f;
  const double det = sw * sxx - sx * sx;
  const bool line = points.size() > 1 && det > 0;
  if (line) {
    f.per_unit = (sw * sxy - sx * sy) / det;
    f.latency = (sy - f.per_unit * sx) / sw;
  }
  if (!line || f.latency < 0 || f.per_unit < 0) {  // a rate through the origin
    f.latency = 0.0;
    f.per_unit = sxx > 0 ? sxy / sxx : 0.0;
  }
  return f;
}

double Calibration::seconds(const std::string& family, double units) const {
  auto it = fits.find(family);
  if (it == fits.end())
    throw Error(ErrorKind::kNotFound, (source.empty() ? "calibration" : source) + ": '" + family + "' was not measured" +
                                          (family.rfind("all_", 0) == 0 || family == "reduce_scatter" || family == "send_recv" ||
                                                family.rfind("onebit_all_reduce", 0) == 0
                                               ? " (collectives need a calibration run under mpirun with 2 or more ranks)"
                                               : ""));
  auto c = curves.find(family);
  if (c == curves.end() || c->second.size() < 2) return it->second.seconds(units);
  const auto& pts = c->second;
  // Below the smallest size: the line, no more than that size's time (set_curve's rule).
  if (units < pts.front().first) return std::min(it->second.seconds(units), pts.front().second);
  for (size_t i = 1; i < pts.size(); ++i)
    if (units <= pts[i].first) {
      const auto [x0, y0] = pts[i - 1];
      const auto [x1, y1] = pts[i];
      return y0 + (y1 - y0) * (units - x0) / (x1 - x0);
    }
  return pts.back().second * units / pts.back().first;  // past the largest: at its rate
}

void Calibration::set_curve(const std::string& family, std::vector<std::pair<double, double>> xy) {
  std::sort(xy.begin(), xy.end());
  for (size_t i = xy.size(); i-- > 1;) xy[i - 1].second = std::min(xy[i - 1].second, xy[i].second);
  curves[family] = std::move(xy);
}

double gemm_bytes(double m, double n, double k, double es) { return es * (m * k + n * k) + 4 * m * n; }

double gemm_backward_bytes(double m, double n, double k, double es) {
  return (es * (m * n + n * k) + 4 * m * k) + (es * (m * n + m * k) + 8 * n * k);
}

namespace {

// A GEMM's flops and bytes, forward (2mnk) or backward (4mnk).
std::pair<double, double> gemm_flops_bytes(bool backward, double m, double n, double k, DType dtype) {
  const double es = static_cast<double>(dtype_size(dtype));
  return {(backward ? 4.0 : 2.0) * m * n * k, backward ? gemm_backward_bytes(m, n, k, es) : gemm_bytes(m, n, k, es)};
}

const char* gemm_compute_family(bool backward) { return backward ? "gemm backward compute " : "gemm compute "; }

// The compute line plus the bytes at the memory rate, where the calibration has both; else < 0.
double gemm_compute_seconds(const Calibration& cal, bool backward, long m, long n, long k, DType dtype) {
  auto compute = cal.fits.find(gemm_compute_family(backward) + std::string(dtype_name(dtype)));
  auto mem = cal.fits.find("memory");
  if (compute == cal.fits.end() || mem == cal.fits.end()) return -1.0;
  const auto [flops, bytes] = gemm_flops_bytes(backward, static_cast<double>(m), static_cast<double>(n), static_cast<double>(k), dtype);
  return compute->second.seconds(flops) + mem->second.per_unit * bytes;
}

}  // namespace

double Calibration::gemm_seconds(long m, long n, long k, DType dtype) const {
  const double t = gemm_compute_seconds(*this, false, m, n, k, dtype);
  return t >= 0 ? t : seconds(std::string("gemm ") + dtype_name(dtype), 2.0 * static_cast<double>(m) * n * k);
}

double Calibration::gemm_backward_seconds(long m, long n, long k, DType dtype) const {
  const double t = gemm_compute_seconds(*this, true, m, n, k, dtype);
  if (t >= 0) return t;
  const std::string family = std::string("gemm backward ") + dtype_name(dtype);
  if (fits.count(family)) return seconds(family, 4.0 * static_cast<double>(m) * n * k);
  return 2.0 * gemm_seconds(m, n, k, dtype);
}

void add_gemm_compute_fits(Calibration& cal, const std::vector<GemmTiming>& timings) {
  MT_CHECK(cal.fits.count("memory"), ErrorKind::kInternal, "calibrate: the GEMMs' compute lines need the memory rate first");
  const double mem = cal.fits.at("memory").per_unit;
  std::map<std::string, std::vector<std::pair<double, double>>> xy;
  for (const GemmTiming& t : timings) {
    const auto [flops, bytes] = gemm_flops_bytes(t.backward, t.m, t.n, t.k, t.dtype);
    // What the memory traffic leaves of the time; never below a tenth of it (a point whose bytes
    // at the streaming rate outlast it was cache-resident, and still did its flops).
    const double rest = std::max(t.seconds - mem * bytes, 0.1 * t.seconds);
    xy[gemm_compute_family(t.backward) + std::string(dtype_name(t.dtype))].emplace_back(flops, rest);
  }
  for (const auto& [family, pts] : xy) cal.fits[family] = fit_line(pts, true);
}

double Calibration::collective_seconds(const std::string& family, double bytes, int ranks, int stride) const {
  if (!has_network) {
    // Measured over several hosts: the line of the group's shape where it was timed.
    if (ranks_per_host > 0) {
      const std::string shaped = family + (static_cast<long>(ranks) * stride <= ranks_per_host ? " intra" : " inter");
      if (fits.count(shaped)) return seconds(shaped, bytes);
    }
    // A group size timed as such ("... g4"), else the world's line scaled by the ring's volume a rank moves
    // (all_reduce 2(n-1)/n of the buffer, all_gather and reduce_scatter n-1 times a rank's
    // bytes): a tp group of 4 in an 8-rank world moves 6/7 of what the world's all_reduce does.
    // all_to_all where the calibration has no line of its own (before stop 79): an all_gather of a
    // rank's n-th, which moves what it moves, (n-1)/n of the buffer each way.
    if (family == "all_to_all" && !fits.count("all_to_all")) return ranks <= 1 ? 0.0 : collective_seconds("all_gather", bytes / ranks, ranks, stride);
    if (family != "send_recv" && world >= 2 && ranks != world) {
      if (ranks <= 1) return 0.0;
      const std::string sized = family + " g" + std::to_string(ranks);
      if (fits.count(sized)) return seconds(sized, bytes);  // timed at this group size
      auto volume = [&family](double n) {
        return family == "all_reduce" || family == "onebit_all_reduce" ? 2 * (n - 1) / n : family == "all_to_all" ? (n - 1) / n : n - 1;
      };
      return seconds(family, bytes) * volume(ranks) / volume(world);
    }
    return seconds(family, bytes);
  }
  MT_CHECK(ranks >= 1 && stride >= 1, ErrorKind::kInvalidArgument, "collective_seconds: ranks and stride must be positive");
  const bool intra = static_cast<long>(ranks) * stride <= network.devices_per_host;
  const double a = intra ? network.intra_latency : network.inter_latency;
  const double bw = intra ? network.intra_bytes_per_s : network.inter_bytes_per_s;
  const double n = ranks;
  if (family == "send_recv") return a + bytes / bw;
  if (ranks == 1) return 0.0;
  if (family == "all_reduce") return 2 * (n - 1) * a + 2 * (n - 1) / n * bytes / bw;
  if (family == "all_gather" || family == "reduce_scatter") return (n - 1) * (a + bytes / bw);
  if (family == "all_to_all") return (n - 1) * a + (n - 1) / n * bytes / bw;  // pairwise: a rank's buffer, bytes / n to each peer
  // The 1-bit exchange on a described cluster: an all-to-all and an all-gather of a 32nd of the
  // bytes, and the compression's passes over the buffer (about five reads and writes of it: the
  // worker's error-fed copy, its scale, the bits and the error; the servers' sums; the unpacking)
  // at the description's memory rate.
  if (family == "onebit_all_reduce")
    return 2 * (n - 1) * a + 2 * (n - 1) / n * bytes / 32 / bw + (fits.count("memory") ? seconds("memory", 5 * bytes) : 0.0);
  throw Error(ErrorKind::kInvalidArgument, "collective_seconds: no collective '" + family + "'");
}

std::vector<size_t> collective_sizes(bool quick, size_t max_bytes) {
  const std::vector<size_t> all = quick ? std::vector<size_t>{4096, 1 << 16, 1 << 20}
                                        : std::vector<size_t>{4096,    1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22,
                                                              3 << 21, 1 << 23, 3 << 22, 1 << 24, 1 << 26, 1 << 27};
  std::vector<size_t> out;
  for (size_t b : all)
    if (b <= max_bytes || out.size() < 3) out.push_back(b);  // the three smallest (at most 1 MiB) always
  return out;
}

size_t collective_max_bytes(double host_bytes, int host_ranks, int ranks) {
  // A rank holds its send and receive buffers (ranks x bytes each, all_gather's and
  // reduce_scatter's whole vector) and MPI's temporary one of the same size: 3 x ranks x bytes.
  const double per_rank = host_bytes / 3.0 / std::max(1, host_ranks);
  return static_cast<size_t>(per_rank / (3.0 * std::max(1, ranks)));
}

namespace {

// Seconds per call of f, timed for at least `budget` seconds and `min_calls` calls after one
// untimed call (none without warm_up). With a group, every rank runs the same calls and takes the
// slowest rank's time.
// The last-level cache's size (the largest level in sysfs; 0 where not told).
size_t last_level_cache_bytes() {
  size_t best = 0;
  int best_level = 0;
  for (int i = 0; i < 8; ++i) {
    const std::string base = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream lv(base + "level"), sz(base + "size");
    int level = 0;
    std::string size;
    if (!(lv >> level) || !(sz >> size) || size.empty()) continue;
    size_t v = 0;
    try {
      v = std::stoull(size);
    } catch (...) {
      continue;
    }
    const char unit = size.back();
    if (unit == 'K') v <<= 10;
    if (unit == 'M') v <<= 20;
    if (level > best_level) best_level = level, best = v;
  }
  return best;
}

// Set while the kernels are timed: time_calls then takes the pace after each point.
struct PaceRecord {
  std::function<double()> pace;  // PaceProbe::once
  std::vector<double> paces;
};
PaceRecord* g_kernel_pace = nullptr;

template <typename F>
double time_calls(F&& f, double budget, int min_calls, comm::Backend* group, bool warm_up = true) {
  if (warm_up) f();
  if (group) group->barrier(comm::BarrierOptions{})->wait();
  Timer t;
  int calls = 0;
  // Every rank must run the same number of calls: rank 0 decides after its budget, and the
  // group follows (a one-element max-reduce per round keeps them in step).
  for (;;) {
    f();
    ++calls;
    float more = calls < min_calls || t.seconds() < budget ? 1.0f : 0.0f;
    if (group) {
      comm::AllReduceOptions o;
      o.op = comm::ReduceOp::kMax;
      o.tag = "calibrate";
      group->all_reduce(&more, 1, DType::kF32, o)->wait();
    }
    if (more == 0.0f) break;
  }
  float s = static_cast<float>(t.seconds() / calls);
  if (group) {
    comm::AllReduceOptions o;
    o.op = comm::ReduceOp::kMax;
    o.tag = "calibrate time";
    group->all_reduce(&s, 1, DType::kF32, o)->wait();
  }
  if (g_kernel_pace != nullptr) g_kernel_pace->paces.push_back(g_kernel_pace->pace());
  return s;
}

void add_family(Calibration& cal, const std::string& family, const std::vector<CalPoint>& pts, bool relative = true,
                bool curve = false) {
  std::vector<std::pair<double, double>> xy;
  for (const CalPoint& p : pts) {
    cal.points.push_back(p);
    xy.emplace_back(p.units, p.seconds);
  }
  cal.fits[family] = fit_line(xy, relative);
  if (curve) cal.set_curve(family, xy);
}

// Copies of a call's operands that together exceed the caches (96 MiB), at most 16.
int rotation(size_t bytes) {
  const size_t want = size_t{96} << 20;
  return static_cast<int>(std::clamp<size_t>((want + bytes - 1) / std::max<size_t>(bytes, 1), 1, 16));
}

// Small values in dt (f32 or a 16-bit type) in a byte buffer.
void fill_lowp(std::vector<char>& buf, DType dt) {
  const size_t n = buf.size() / dtype_size(dt);
  std::vector<float> tmp(n);
  for (size_t i = 0; i < n; ++i) tmp[i] = static_cast<float>(i % 1000) / 1000.0f - 0.5f;
  convert(buf.data(), dt, tmp.data(), DType::kF32, n);
}

// The machine's pace at one moment: a short fixed sample of a step's work (three bf16 GEMMs of
// 512 x 1024 x 512 with operands rotating past the caches, one GELU pass over 16 MiB), prepared
// once, timed once per call on this process's threads. The calibration takes it after every kernel
// point and around every in-situ block, so that a block timed in another speed state of the
// machine than the kernels can be scaled back to theirs (DESIGN-NOTES 84).
class PaceProbe {
 public:
  PaceProbe() {
    const size_t a_bytes = size_t{kM} * kK * 2, b_bytes = size_t{kN} * kK * 2;
    copies_ = rotation(a_bytes + b_bytes + size_t{kM} * kN * 4);
    a_.assign(copies_, std::vector<char>(a_bytes));
    b_.assign(copies_, std::vector<char>(b_bytes));
    c_.assign(copies_, std::vector<float>(size_t{kM} * kN));
    for (int i = 0; i < copies_; ++i) fill_lowp(a_[i], DType::kBF16), fill_lowp(b_[i], DType::kBF16);
    x_.assign(size_t{4} << 20, 0.5f);
    y_.resize(x_.size());
    once();  // warm
  }
  // The fastest of three tries: right after a model's backward, the first try here often took 4-8
  // times the others (a one-off, which the blocks themselves do not show).
  double once() {
    double best = 0.0;
    for (int r = 0; r < 3; ++r) {
      Timer t;
      for (int i = 0; i < 3; ++i) {
        kernels::gemm(kM, kN, kK, a_[next_].data(), kK, false, b_[next_].data(), kK, true, c_[next_].data(), kN,
                      DType::kBF16, false);
        next_ = (next_ + 1) % copies_;
      }
      kernels::gelu_forward(y_.data(), x_.data(), x_.size());
      const double s = t.seconds();
      best = r == 0 ? s : std::min(best, s);
    }
    return best;
  }

 private:
  static constexpr int kM = 512, kN = 1024, kK = 512;
  int copies_ = 1, next_ = 0;
  std::vector<std::vector<char>> a_, b_;
  std::vector<std::vector<float>> c_;
  std::vector<float> x_, y_;
};


}  // namespace

// Collectives over `group`, by bytes per rank (f32), and a p2p round trip between its ranks 0 and 1
// (half of it is one message), as the families "all_reduce" .. "send_recv" + suffix. Dense between
// 4 and 16 MiB, where OpenMPI's algorithms change here, and up to 128 MiB (a stage-0 bucket of a
// small model). Every rank of the group calls it. The sizes are swept three times in order (quick:
// once), each sweep with a third of the budget, and each point is its sweeps' median
// (swept_medians): this VM's 1 MiB all_reduce took 0.15 or 0.84 ms, by runs of consecutive sizes
// (DESIGN-NOTES 51).
// With `probes`, the exchange probe in each sweep, right after its 1 MiB point (the world's): the
// state of the machine each sweep met where the probe's size lies on the curve.
void time_collectives(Calibration& cal, comm::Backend* group, const std::string& suffix, bool quick, double budget,
                      size_t max_bytes, std::vector<double>* probes = nullptr) {
  const std::vector<size_t> bytes = collective_sizes(quick, max_bytes);
  const int P = group->size(), me = group->rank();
  const int sweeps = quick ? 1 : 3;
  // One pair of buffers for every size (its prefix), touched once: only the first sweep warms up.
  const size_t most = *std::max_element(bytes.begin(), bytes.end()) / 4;
  std::vector<float> x(most * P, 1.0f), y(most * P);
  size_t timed = 0;
  const std::vector<std::vector<double>> t = swept_medians(bytes.size(), sweeps, [&](size_t i) {
    const size_t n = bytes[i] / 4;
    const bool warm_up = timed++ < bytes.size();
    const double part = budget / sweeps;
    std::vector<double> s;
    s.push_back(time_calls([&] {
      comm::AllReduceOptions o;
      o.tag = "calibrate all_reduce";
      group->all_reduce(x.data(), n, DType::kF32, o)->wait();
    }, part, 1, group, warm_up));
    s.push_back(time_calls([&] {
      comm::AllGatherOptions o;
      o.tag = "calibrate all_gather";
      group->all_gather(y.data(), x.data(), n, DType::kF32, o)->wait();
    }, part, 1, group, warm_up));
    s.push_back(time_calls([&] {
      comm::ReduceScatterOptions o;
      o.tag = "calibrate reduce_scatter";
      group->reduce_scatter(y.data(), x.data(), n, DType::kF32, o)->wait();
    }, part, 1, group, warm_up));
    s.push_back(time_calls([&] {
      if (me == 0) {
        comm::SendOptions so;
        group->send(x.data(), n, DType::kF32, 1, so)->wait();
        comm::RecvOptions ro;
        group->recv(y.data(), n, DType::kF32, 1, ro)->wait();
      } else if (me == 1) {
        comm::RecvOptions ro;
        group->recv(y.data(), n, DType::kF32, 0, ro)->wait();
        comm::SendOptions so;
        group->send(y.data(), n, DType::kF32, 0, so)->wait();
      }
    }, part, 1, group, warm_up) / 2);
    // The 1-bit optimizers' compressed exchange of n f32 elements as one tensor (its worker and
    // server errors carried from call to call, as a run carries them), by the f32 bytes it stands in for.
    {
      const comm::OneBitPlan plan({{0, n}}, P);
      std::vector<float> we(plan.worker_error_len, 0.0f), se(plan.server_error_len, 0.0f);
      s.push_back(time_calls([&] {
        comm::CommOptions o;
        o.tag = "calibrate onebit";
        comm::compressed_all_reduce(*group, x.data(), plan, we.data(), se.data(), o);
      }, part, 1, group, warm_up));
    }
    // Ulysses' exchange (parallel::UlyssesComm): a rank's n elements, n / P to each rank, by the
    // bytes a rank sends (its whole buffer). (n rounded down to a multiple of P.)
    s.push_back(time_calls([&] {
      comm::AllToAllOptions o;
      o.tag = "calibrate all_to_all";
      group->all_to_all(y.data(), x.data(), n / static_cast<size_t>(P), DType::kF32, o)->wait();
    }, part, 1, group, warm_up));
    if (probes != nullptr && bytes[i] == kExchangeProbeBytes) probes->push_back(exchange_probe(*group));
    return s;
  });
  const char* families[] = {"all_reduce", "all_gather", "reduce_scatter", "send_recv", "onebit_all_reduce", "all_to_all"};
  for (size_t f = 0; f < 6; ++f) {
    std::vector<CalPoint> pts;
    for (size_t i = 0; i < bytes.size(); ++i)
      pts.push_back({std::string(families[f]) + " f32" + suffix, static_cast<double>(bytes[i]), t[i][f]});
    add_family(cal, families[f] + suffix, pts, true, true);
  }
}

// Which host each rank of `group` runs on (its hostname), as host indices in rank order.
std::vector<int> host_of_ranks(comm::Backend& group) {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  const uint32_t h = static_cast<uint32_t>(std::hash<std::string>{}(name));
  std::vector<float> mine(2), all(2 * static_cast<size_t>(group.size()));
  mine[0] = static_cast<float>(h & 0xffff);  // exact in f32
  mine[1] = static_cast<float>(h >> 16);
  comm::AllGatherOptions o;
  o.tag = "calibrate hosts";
  group.all_gather(all.data(), mine.data(), 2, DType::kF32, o)->wait();
  std::vector<uint32_t> seen;
  std::vector<int> host(static_cast<size_t>(group.size()));
  for (int r = 0; r < group.size(); ++r) {
  const uint32_t x = static_cast<uint32_t>(all[2 * r]) | (static_cast<uint32_t>(all[2 * r + 1]) << 16);
  auto it = std::find(seen.begin(), seen.end(), x);
  if (it == seen.end()) seen.push_back(x), it = seen.end() - 1;
  host[static_cast<size_t>(r)] = static_cast<int>(it - seen.begin());
  }
  return host;
}

// The compute a disk transfer costs: a bf16 GEMM loop timed alone, beside a thread streaming reads
// and writes through a file under `dir` (the swap's own traffic), and alone again. Compute beside
// r bytes a second takes 1 + k·r times as long (planner/sim.h); k from the two rates, 0 when the
// difference is noise. On this project's VMs k is large: the host emulates the disk on the cores.
static double disk_interference(const std::string& dir, unsigned long long io_bytes) {
  constexpr size_t kChunk = 8u << 20;
  const uint64_t chunks = std::max<uint64_t>(2, std::min<uint64_t>(io_bytes, 512ull << 20) / kChunk);
  io::check_swap_dir(dir, chunks * kChunk);
  const std::string path = dir + "/.meshtrain-io-interference";
  double k = 0.0;
  {
    auto f = io::posix_env().open(path);
    io::AioOptions o;
    o.thread_count = 2;
    io::AsyncIo aio(o);
    io::AlignedBuffer rbuf(kChunk, MemCategory::kWorkspace), wbuf(kChunk, MemCategory::kWorkspace);
    for (size_t i = 0; i < kChunk; i += 8) *reinterpret_cast<uint64_t*>(wbuf.as<char>() + i) = i * 0x9E3779B97F4A7C15ull;
    for (uint64_t c = 0; c < chunks; ++c) aio.wait(aio.write(*f, wbuf.data(), kChunk, c * kChunk));
    const int m = 1024, n = 1024, kk = 1024;
    std::vector<char> a(static_cast<size_t>(m) * kk * 2), b(static_cast<size_t>(n) * kk * 2);
    fill_lowp(a, DType::kBF16);
    fill_lowp(b, DType::kBF16);
    std::vector<float> c(static_cast<size_t>(m) * n);
    auto gemm = [&] { kernels::gemm(m, n, kk, a.data(), kk, false, b.data(), kk, true, c.data(), n, DType::kBF16, false); };
    gemm();
    Timer one;
    gemm();
    const int calls = std::max(4, static_cast<int>(1.0 / std::max(one.seconds(), 1e-6)));
    auto loop = [&] {
      Timer t;
      for (int i = 0; i < calls; ++i) gemm();
      return t.seconds();
    };
    const double alone0 = loop();
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> moved{0};
    std::thread streamer([&] {
      for (uint64_t i = 0; !stop.load(); i = (i + 1) % chunks) {
        const auto r = aio.read(*f, rbuf.data(), kChunk, i * kChunk);
        const auto w = aio.write(*f, wbuf.data(), kChunk, ((i + chunks / 2) % chunks) * kChunk);
        aio.wait(r);
        aio.wait(w);
        moved += 2 * kChunk;
      }
    });
    const uint64_t before = moved.load();
    const double beside = loop();
    const uint64_t during = moved.load() - before;
    stop = true;
    streamer.join();
    const double alone = 0.5 * (alone0 + loop());
    const double rate = static_cast<double>(during) / beside;  // bytes a second
    if (rate > 0 && beside > 1.03 * alone) k = (beside / alone - 1.0) / rate;
  }
  std::error_code ec;
  std::filesystem::remove(path, ec);
  return k;
}

namespace {

// Every kernel family (GEMM, attention, the memory-bound and elementwise kernels, AdamW, the in-situ
// blocks) on this process's threads.
void time_kernels(Calibration& cal, const CalibrateOptions& options, double budget) {
  // GEMMs: the shapes a transformer step runs (tokens × out × in), from a small MLP to a wide one.
  // gemm_ceiling_tflops times C = A·Bᵀ on this process's threads (one GEMM per rank at a time).
  struct Shape {
    int m, n, k;
  };
  const std::vector<Shape> shapes = options.quick ? std::vector<Shape>{{64, 256, 256}, {256, 512, 512}, {256, 1024, 512}}
                                                  : std::vector<Shape>{{64, 256, 256},    {256, 1024, 256},
                                                                       {512, 1024, 1024}, {1024, 2048, 1024},
                                                                       {2048, 4096, 1024}, {2048, 2048, 4096}};
  // Each call reads its operands from memory, as a step's GEMMs do (every layer's weights and
  // activations are others): the operands rotate through copies that together exceed the caches
  // (a hot loop on one set ran 10-15 % faster than the same shapes inside the model).
  std::vector<GemmTiming> gemm_timings;  // both directions, for the compute lines (after "memory")
  for (DType dt : {DType::kF32, DType::kBF16}) {
    std::vector<CalPoint> pts;
    for (const Shape& s : shapes) {
      const size_t es = dtype_size(dt);
      const size_t a_bytes = static_cast<size_t>(s.m) * s.k * es, b_bytes = static_cast<size_t>(s.n) * s.k * es;
      const int copies = rotation(a_bytes + b_bytes + static_cast<size_t>(s.m) * s.n * 4);
      std::vector<std::vector<char>> a(copies, std::vector<char>(a_bytes)), b(copies, std::vector<char>(b_bytes));
      std::vector<std::vector<float>> c(copies, std::vector<float>(static_cast<size_t>(s.m) * s.n));
      for (int i = 0; i < copies; ++i) fill_lowp(a[i], dt), fill_lowp(b[i], dt);
      int next = 0;
      const double sec = time_calls(
          [&] {
            kernels::gemm(s.m, s.n, s.k, a[next].data(), s.k, false, b[next].data(), s.k, true, c[next].data(), s.n, dt,
                          false);
            next = (next + 1) % copies;
          },
          budget, 3, nullptr);
      pts.push_back({std::string("gemm ") + dtype_name(dt) + " " + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                         std::to_string(s.k),
                     2.0 * s.m * s.n * s.k, sec});
      gemm_timings.push_back({dt, false, static_cast<double>(s.m), static_cast<double>(s.n), static_cast<double>(s.k), sec});
    }
    add_family(cal, std::string("gemm ") + dtype_name(dt), pts);
  }
  // The backward's two GEMMs of each shape: the input gradient dX (M, K) = dY (M, N) · W (N, K)
  // and the weight gradient dW (N, K) += dY^T · X, accumulated (what Linear's backward runs).
  for (DType dt : {DType::kF32, DType::kBF16}) {
    std::vector<CalPoint> pts;
    for (const Shape& s : shapes) {
      const size_t es = dtype_size(dt);
      const size_t dy_n = static_cast<size_t>(s.m) * s.n, w_n = static_cast<size_t>(s.n) * s.k, x_n = static_cast<size_t>(s.m) * s.k;
      const int copies = rotation((dy_n + w_n + x_n) * es + (x_n + w_n) * 4);
      std::vector<std::vector<char>> dy(copies, std::vector<char>(dy_n * es)), w(copies, std::vector<char>(w_n * es)),
          x(copies, std::vector<char>(x_n * es));
      std::vector<std::vector<float>> dx(copies, std::vector<float>(x_n)), dw(copies, std::vector<float>(w_n));
      for (int i = 0; i < copies; ++i) fill_lowp(dy[i], dt), fill_lowp(w[i], dt), fill_lowp(x[i], dt);
      int next = 0;
      const double sec = time_calls(
          [&] {
            const int i = next;
            kernels::gemm(s.m, s.k, s.n, dy[i].data(), s.n, false, w[i].data(), s.k, false, dx[i].data(), s.k, dt, false);
            kernels::gemm(s.n, s.k, s.m, dy[i].data(), s.n, true, x[i].data(), s.k, false, dw[i].data(), s.k, dt, true);
            next = (next + 1) % copies;
          },
          budget, 3, nullptr);
      pts.push_back({std::string("gemm backward ") + dtype_name(dt) + " " + std::to_string(s.m) + "x" +
                         std::to_string(s.n) + "x" + std::to_string(s.k),
                     4.0 * s.m * s.n * s.k, sec});
      gemm_timings.push_back({dt, true, static_cast<double>(s.m), static_cast<double>(s.n), static_cast<double>(s.k), sec});
    }
    add_family(cal, std::string("gemm backward ") + dtype_name(dt), pts);
  }
  // Causal attention's core (the tiled kernel, f32), forward and backward, by the FLOPs of QK^T
  // and PV over the causal pairs (models::attention_core_flops): 64-wide heads, T 64 to 512.
  {
    std::vector<CalPoint> fwd, bwd;
    const std::vector<int> Ts = options.quick ? std::vector<int>{64, 128} : std::vector<int>{64, 128, 256, 512};
    for (int T : Ts) {
      const int B = 2, NH = 8, HS = 64;
      const size_t rows = static_cast<size_t>(B) * T;
      std::vector<float> qkv(rows * 3 * NH * HS, 0.01f), out(rows * NH * HS), lse(rows * NH), dqkv(qkv.size()),
          dout(out.size(), 1e-3f);
      for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(i % 97) / 97.0f - 0.5f;
      const double flops = 2.0 * 2.0 * B * HS * NH * (static_cast<double>(T) * (T + 1) / 2);
      fwd.push_back({"attention forward T=" + std::to_string(T), flops,
                     time_calls([&] { kernels::attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, NH, HS); },
                                budget, 3, nullptr)});
      bwd.push_back({"attention backward T=" + std::to_string(T), flops,
                     time_calls(
                         [&] {
                           kernels::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B,
                                                       T, NH, NH, HS);
                         },
                         budget, 3, nullptr)});
    }
    // The kernel at T 512, causal and over documents of 64 tokens, one to a tile (no tile mixes
    // two, so none is masked): the same query tiles, 2/9 of the pairs. Each direction's time is then
    // split into a query tile's fixed work (its rows packed, the online softmax's start and end,
    // the rows written; the backward's key tiles alike) and a pair's, "attention forward|backward
    // query tile" and "... pair" (DESIGN-NOTES 105): documents skip pairs, not query tiles.
    {
      const int T = 512, B = 2, NH = 8, HS = 64;
      const size_t rows = static_cast<size_t>(B) * T;
      std::vector<float> qkv(rows * 3 * NH * HS), out(rows * NH * HS), lse(rows * NH), dqkv(qkv.size()), dout(out.size(), 1e-3f);
      for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(i % 97) / 97.0f - 0.5f;
      std::vector<int32_t> ks(rows);
      for (size_t r = 0; r < rows; ++r) ks[r] = static_cast<int32_t>(r % static_cast<size_t>(T)) / 64 * 64;
      const double heads = static_cast<double>(B) * NH, causal = heads * kernels::attention_tile_pairs(T),
                   docs = heads * kernels::attention_tile_pairs(T, ks.data()), tiles = heads * ((T + 63) / 64);
      auto timed = [&](const int32_t* k) {
        return std::pair{
            time_calls([&] { kernels::attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, NH, HS, nullptr, k); }, budget, 3,
                       nullptr),
            time_calls(
                [&] {
                  kernels::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, NH, NH, HS,
                                              nullptr, k);
                },
                budget, 3, nullptr)};
      };
      // Causal and documents alternate, and each keeps its fastest round: a pause in one round
      // (another process on the cores, a quick budget of 20 ms) only slows, and taken as it came it
      // could make the causal pass no slower than the documents' and the pair's time zero. Rounds
      // go on (up to 8) while either direction still says so.
      double c_fwd = 1e30, c_bwd = 1e30, t_fwd = 1e30, t_bwd = 1e30;
      for (int round = 0; round < 8 && (round < 3 || !(c_fwd > t_fwd && c_bwd > t_bwd)); ++round) {
        const auto [cf, cb] = timed(nullptr);
        const auto [tf, tb] = timed(ks.data());
        c_fwd = std::min(c_fwd, cf), c_bwd = std::min(c_bwd, cb), t_fwd = std::min(t_fwd, tf), t_bwd = std::min(t_bwd, tb);
      }
      for (const auto& [what, units, sec] : {std::tuple{"forward causal", causal, c_fwd}, std::tuple{"backward causal", causal, c_bwd},
                                             std::tuple{"forward documents of 64", docs, t_fwd},
                                             std::tuple{"backward documents of 64", docs, t_bwd}})
        cal.points.push_back({std::string("attention ") + what + " T=512, by its tiles' pairs", units, sec});
      for (const auto& [dir, t_causal, t_docs] : {std::tuple{"forward", c_fwd, t_fwd}, std::tuple{"backward", c_bwd, t_bwd}}) {
        const double pair = std::max(t_causal - t_docs, 0.0) / (causal - docs);
        cal.fits[std::string("attention ") + dir + " query tile"] = {0.0, std::max(t_docs - pair * docs, 0.0) / tiles};
        cal.fits[std::string("attention ") + dir + " pair"] = {0.0, pair};
      }
    }
    add_family(cal, "attention forward", fwd);
    add_family(cal, "attention backward", bwd);  // by the forward's FLOPs
  }
  // Block-sparse attention (sparse_attention's kernel, f32), forward and backward, by the FLOPs of
  // the layout's pairs (models::attention_core_flops with its plan), a line per kernel block: its
  // tiles are a block wide on one side, so its rate falls with the block (at 16: half the dense
  // kernel's at T 4096 in PERF.md (i), two-thirds at T 256-1024 here). DeepSpeed's fixed layout (4
  // local blocks, 1 global, unidirectional).
  for (int block : {16, 32, 64}) {
    std::vector<CalPoint> fwd, bwd;
    const std::vector<int> Ts = options.quick ? std::vector<int>{256} : std::vector<int>{256, 512, 1024};
    for (int T : Ts) {
      const int B = 1, NH = 8, HS = 64;
      kernels::SparsityConfig sc;
      sc.num_heads = NH;
      sc.block = block;
      sc.pattern = kernels::FixedSparsity{.attention = kernels::SparseDirection::kUnidirectional};
      const kernels::SparseAttentionPlan plan = kernels::sparse_attention_plan(kernels::sparse_layout_make(sc, T), true);
      const size_t rows = static_cast<size_t>(B) * T;
      std::vector<float> qkv(rows * 3 * NH * HS), out(rows * NH * HS), lse(rows * NH), dqkv(qkv.size()),
          dout(out.size(), 1e-3f);
      for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(i % 97) / 97.0f - 0.5f;
      const double flops = models::attention_core_flops(B, T, NH, HS, &plan);
      const std::string at = " b" + std::to_string(block) + " T=" + std::to_string(T);
      fwd.push_back({"sparse attention forward" + at, flops,
                     time_calls([&] { kernels::sparse_attention_forward(out.data(), lse.data(), qkv.data(), plan, B, T, NH, NH, HS); },
                                budget, 3, nullptr)});
      bwd.push_back({"sparse attention backward" + at, flops,
                     time_calls(
                         [&] {
                           kernels::sparse_attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                                                              plan, B, T, NH, NH, HS);
                         },
                         budget, 3, nullptr)});
    }
    add_family(cal, "sparse attention forward b" + std::to_string(block), fwd);
    add_family(cal, "sparse attention backward b" + std::to_string(block), bwd);
  }

  // A memory-bound kernel (GELU: 4 bytes read and 4 written per element), and the AdamW update
  // (the optimizer's cost per element: master, gradient and both moments).
  const std::vector<size_t> sizes = options.quick ? std::vector<size_t>{1 << 14, 1 << 17, 1 << 19}
                                                  : std::vector<size_t>{1 << 14, 1 << 17, 1 << 20, 1 << 22, 1 << 24};
  {
    std::vector<CalPoint> mem, adam, copy, zero, conv;
    for (size_t n : sizes) {
      std::vector<float> a(n, 0.5f), b(n), g(n, 1e-3f), m(n), v(n);
      std::vector<uint16_t> lowp(n);
      const double s = time_calls([&] { kernels::gelu_forward(b.data(), a.data(), n); }, budget, 3, nullptr);
      mem.push_back({"gelu_forward f32 " + std::to_string(n), 8.0 * static_cast<double>(n), s});
      // The ZeRO step's own passes (ZeroRuntime: a one-rank gather or reduction is a copy, the
      // gradient slab is zeroed, the gathered unit converted to the compute dtype), by bytes read
      // and written: a streaming copy or fill runs at several times GELU's rate here.
      const double e = static_cast<double>(n);
      copy.push_back({"copy_bytes " + std::to_string(n), 8.0 * e,
                      time_calls([&] { copy_bytes(b.data(), a.data(), 4 * n); }, budget, 3, nullptr)});
      zero.push_back({"zero_bytes " + std::to_string(n), 4.0 * e,
                      time_calls([&] { zero_bytes(b.data(), 4 * n); }, budget, 3, nullptr)});
      conv.push_back({"convert f32 bf16 " + std::to_string(n), 6.0 * e,
                      time_calls([&] { convert(lowp.data(), DType::kBF16, a.data(), DType::kF32, n); }, budget, 3, nullptr)});
      kernels::AdamWParams p;
      const double sa = time_calls(
          [&] { kernels::adamw_update(a.data(), g.data(), m.data(), v.data(), nullptr, DType::kF32, n, p); }, budget, 3,
          nullptr);
      adam.push_back({"adamw_update " + std::to_string(n), static_cast<double>(n), sa});
    }
    // Plain least squares: the largest points, past the caches, set the rate. A training step's
    // elementwise passes and its optimizer stream buffers far larger than the caches, and the
    // small points' rate (AdamW 5.3 G elements/s at 1M here, 1.8 at 16M) would be 2-3x too fast.
    add_family(cal, "memory", mem, false);
    add_family(cal, "adamw", adam, false);
    add_family(cal, "copy", copy, false);
    add_family(cal, "zero", zero, false);
    add_family(cal, "convert", conv, false);
  }
  // The other updates the runtime makes, built by optim::make_optimizer as the engine builds them
  // (one segment): LAMB's two passes (the moments and the trust ratio's sums, then the update), SGD
  // without and with its momentum buffer, 1-bit Adam's and 1-bit LAMB's updates past their warm-up
  // (the momentum, the frozen-variance step, LAMB's refresh; one rank, so the exchange, timed with
  // the collectives, apart); by elements, in f32 and writing the bf16 copy (stage 0 in low
  // precision). The largest points set the rate.
  {
    const std::vector<size_t> opt_sizes = options.quick ? std::vector<size_t>{1 << 17, 1 << 19}
                                                        : std::vector<size_t>{1 << 20, 1 << 22, 1 << 24};
    // 0/1 Adam's three steps besides its variance steps (AdamW's), each from a step count its
    // policy (optim::ZeroOnePolicy) makes every timed call that kind: a compressed-gradient step
    // (the variance interval doubled at every variance step, past 2^20 steps), a local step (the
    // sync interval doubled at every step, at most 2^30) and a sync (the interval held at 1).
    struct Update {
      const char* type;
      double momentum;
      UpdateKind kind;
      int64_t var_freeze_step = 100000, var_update_scaler = 16, local_step_scaler = 32678, local_step_clipper = 16;
      int64_t start = 0;  // the optimizer's step count before the timed calls
    };
    constexpr int64_t kNever = int64_t{1} << 40;
    for (const Update& u : {Update{"Lamb", 0.0, UpdateKind::kLamb}, Update{"SGD", 0.0, UpdateKind::kSgd},
                            Update{"SGD", 0.9, UpdateKind::kSgdMomentum},
                            Update{"OneBitAdam", 0.0, UpdateKind::kOneBitAdamCompressed},
                            Update{"OneBitLamb", 0.0, UpdateKind::kOneBitLambCompressed},
                            Update{"ZeroOneAdam", 0.0, UpdateKind::kZeroOneCompressed, kNever, 1, 1, 1, int64_t{1} << 20},
                            Update{"ZeroOneAdam", 0.0, UpdateKind::kZeroOneLocal, 1, 16, 1, int64_t{1} << 30, 64},
                            Update{"ZeroOneAdam", 0.0, UpdateKind::kZeroOneSync, 1, 16, 1, 1, 1}}) {
      std::vector<CalPoint> f32, low;
      for (size_t n : opt_sizes) {
        optim::OptimizerSpec spec;
        spec.type = u.type;
        spec.momentum = u.momentum;
        spec.freeze_step = 1;  // the 1-bit ones past their warm-up (one rank: the exchange apart)
        spec.var_freeze_step = u.var_freeze_step;
        spec.var_update_scaler = u.var_update_scaler;
        spec.local_step_scaler = u.local_step_scaler;
        spec.local_step_clipper = u.local_step_clipper;
        const std::unique_ptr<optim::Optimizer> opt =
            optim::make_optimizer(spec, n, {optim::ParamSegment{0, n, 0.01f, "all"}});
        if (u.start > 0) opt->set_step_count(u.start);
        std::vector<float> w(n, 0.5f), g(n, 1e-3f);
        std::vector<uint16_t> lowp(n);
        const double e = static_cast<double>(n);
        f32.push_back({std::string(update_line(u.kind, false)) + " " + std::to_string(n), e,
                       time_calls([&] { opt->step(w.data(), g.data(), nullptr, DType::kF32, 1e-4f, 1.0f); }, budget, 3, nullptr)});
        low.push_back({std::string(update_line(u.kind, true)) + " " + std::to_string(n), e,
                       time_calls([&] { opt->step(w.data(), g.data(), lowp.data(), DType::kBF16, 1e-4f, 1.0f); }, budget, 3,
                                  nullptr)});
      }
      add_family(cal, update_line(u.kind, false), f32, false);
      add_family(cal, update_line(u.kind, true), low, false);
    }
  }
  // The same passes hot: a buffer that fits in the last-level cache, passed over again and again
  // (a ZeRO step on one rank zeroes a unit's gradient slab, accumulates the weight gradients into
  // it and copies and sums it, and a slab within the cache stays there: PLANNER's eighth
  // validation measured ZeRO 2's extra passes free against ZeRO 0). At an eighth and a quarter of
  // the cache.
  cal.f16_native = kernels::gemm_widen_bytes(16, 16, 16, DType::kF16).first == 0;
  cal.bf16_native = kernels::gemm_native(DType::kBF16);
  cal.cache_bytes = last_level_cache_bytes();
  if (cal.cache_bytes > 0) {
    std::vector<CalPoint> copy, zero, add;
    for (size_t bytes : {cal.cache_bytes / 8, cal.cache_bytes / 4}) {
      const size_t n = bytes / 4;
      std::vector<float> a(n, 0.5f), b(n, 0.25f);
      const double e = static_cast<double>(n);
      copy.push_back({"copy_bytes hot " + std::to_string(n), 8.0 * e,
                      time_calls([&] { copy_bytes(b.data(), a.data(), 4 * n); }, budget, 3, nullptr)});
      zero.push_back({"zero_bytes hot " + std::to_string(n), 4.0 * e,
                      time_calls([&] { zero_bytes(b.data(), 4 * n); }, budget, 3, nullptr)});
      add.push_back({"add hot " + std::to_string(n), e, time_calls([&] { kernels::add_inplace(b.data(), a.data(), n); }, budget, 3, nullptr)});
    }
    add_family(cal, "copy hot", copy, false);
    add_family(cal, "zero hot", zero, false);
    add_family(cal, "add hot", add, false);
  }
  add_gemm_compute_fits(cal, gemm_timings);
  // The blocks' own elementwise kernels, by elements of their input (rows x width): the norms
  // forward and backward (their backward reads the input, the gradient and the statistics, and
  // accumulates the weights' gradients), the activations (GELU's input, SwiGLU's N x I output),
  // the residual add; and AdamW writing the bf16 copy the step's GEMMs read (low-precision runs).
  {
    const int C = 768;
    const std::vector<int> rows = options.quick ? std::vector<int>{16, 256} : std::vector<int>{64, 1024, 4096, 16384};
    std::vector<CalPoint> lnf, lnb, rmf, rmb, gb, swf, swb, add, adam16, drop;
    for (int N : rows) {
      const size_t n = static_cast<size_t>(N) * C;
      std::vector<float> x(2 * n, 0.25f), y(2 * n), dy(2 * n, 1e-3f), dx(2 * n), w(C, 1.0f), b(C), dw(C), db(C), mean(N),
          rstd(N), m(n), v(n);
      std::vector<uint16_t> lowp(n);
      for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 89) / 89.0f - 0.5f;
      kernels::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
      const double e = static_cast<double>(n);
      const std::string at = " " + std::to_string(N) + "x" + std::to_string(C);
      lnf.push_back({"layernorm forward" + at, e, time_calls([&] {
                       kernels::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
                     }, budget, 3, nullptr)});
      lnb.push_back({"layernorm backward" + at, e, time_calls([&] {
                       kernels::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                                                   rstd.data(), N, C);
                     }, budget, 3, nullptr)});
      rmf.push_back({"rmsnorm forward" + at, e, time_calls([&] {
                       kernels::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
                     }, budget, 3, nullptr)});
      rmb.push_back({"rmsnorm backward" + at, e, time_calls([&] {
                       kernels::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
                     }, budget, 3, nullptr)});
      gb.push_back({"gelu backward" + at, e, time_calls([&] { kernels::gelu_backward(dx.data(), x.data(), dy.data(), n); },
                                                         budget, 3, nullptr)});
      // SwiGLU over N x C outputs from N x 2C inputs.
      swf.push_back({"swiglu forward" + at, e, time_calls([&] { kernels::swiglu_forward(y.data(), x.data(), N, C); },
                                                           budget, 3, nullptr)});
      swb.push_back({"swiglu backward" + at, e, time_calls([&] { kernels::swiglu_backward(dx.data(), dy.data(), x.data(), N, C); },
                                                            budget, 3, nullptr)});
      add.push_back({"add" + at, e, time_calls([&] { kernels::add_inplace(y.data(), x.data(), n); }, budget, 3, nullptr)});
      // Dropout's mask made and applied in place (kernels/cpu/dropout.h), by elements.
      const kernels::DropRate rate(0.1f);
      drop.push_back({"dropout" + at, e, time_calls([&] { kernels::dropout_rows(y.data(), static_cast<size_t>(N), C, 7, rate, 0, 0, 1024); },
                                                    budget, 3, nullptr)});
      kernels::AdamWParams p;
      adam16.push_back({"adamw_update bf16 copy" + at, e, time_calls([&] {
                          kernels::adamw_update(y.data(), dy.data(), m.data(), v.data(), lowp.data(), DType::kBF16, n, p);
                        }, budget, 3, nullptr)});
    }
    add_family(cal, "layernorm forward", lnf, false);
    add_family(cal, "layernorm backward", lnb, false);
    add_family(cal, "rmsnorm forward", rmf, false);
    add_family(cal, "rmsnorm backward", rmb, false);
    add_family(cal, "gelu backward", gb, false);
    add_family(cal, "swiglu forward", swf, false);
    add_family(cal, "swiglu backward", swb, false);
    add_family(cal, "add", add, false);
    add_family(cal, "adamw bf16", adam16, false);
    add_family(cal, "dropout", drop, false);
  }
}

// A wait that leaves the core to others: the ranks that do not time kernels share cores with
// those that do (an oversubscribed host).
void wait_quietly(comm::Work& w) {
  while (!w.is_completed()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// The group's largest *v, on every rank (a rank that times nothing waits quietly); v unchanged
// without a group of two or more.
void max_over_group(comm::Backend* group, bool runs, float* v, const char* tag) {
  if (group == nullptr || group->size() < 2) return;
  comm::AllReduceOptions o;
  o.op = comm::ReduceOp::kMax;
  o.tag = tag;
  std::unique_ptr<comm::Work> w = group->all_reduce(v, 1, DType::kF32, o);
  if (runs) w->wait();
  else wait_quietly(*w);
}

// The process's memory outside the allocator's blocks, as a training process of this binary has
// it at its peak: VmHWM less the allocator's mapped peak, after a model of the validation cases'
// shape (GPT-2, bf16, 2 layers of 512, B 4 x 256) ran a step's forward and backward twice with its
// threads and, with a group, after a small all-reduce set MPI's buffers up (a 4 MiB one read 6-7
// MiB more: its ring segment, which StageEstimate::mpi counts where a run has one).
// Run first, so the process's peak is still this (the kernels' timings after it leave 60-90 MiB
// of their own behind). The largest over the ranks. Less oneDNN's scratchpad region, which
// StageEstimate::gemm_scratch predicts by the model's shapes: when each primitive held its own,
// a 128-wide model read 18 MiB and a 512-wide one 30 (DESIGN-NOTES 58, 59).
size_t process_constant(comm::Backend* group) {
  {
    models::ModelConfig m;
    m.arch = models::Arch::kGpt2;
    m.vocab_size = 4096;
    m.hidden = 512;
    m.n_head = m.n_kv_head = 8;
    m.intermediate = 2048;
    m.max_positions = 256;
    m.n_layer = 2;
    m.tie_embeddings = true;
    models::ModelOptions o;
    o.compute_dtype = DType::kBF16;
    models::TransformerLM model(m, o);
    const int B = 4, T = 256;
    model.prepare(B, T);
    std::vector<int32_t> tok(static_cast<size_t>(B) * T), tgt(tok.size());
    for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>((i * 7919) % 1024), tgt[i] = static_cast<int32_t>((i * 31) % 1024);
    for (int r = 0; r < 2; ++r) {
      model.forward(tok.data(), tgt.data(), 1.0f);
      model.backward();
    }
    if (group) {
      std::vector<float> x(size_t{1} << 14, 1.0f);  // 64 KiB: MPI set up, no ring segment of note
      for (int r = 0; r < 2; ++r) group->all_reduce(x.data(), x.size(), DType::kF32, comm::AllReduceOptions{})->wait();
    }
  }
  const size_t hwm = process_peak_rss_bytes(),
               mapped = Allocator::global().stats().mapped_peak + kernels::gemm_scratch_held();
  float mib = static_cast<float>(hwm > mapped ? hwm - mapped : 0) / 1048576.0f;
  if (group) {
    comm::AllReduceOptions o;
    o.op = comm::ReduceOp::kMax;
    group->all_reduce(&mib, 1, DType::kF32, o)->wait();
  }
  return static_cast<size_t>(static_cast<double>(mib) * 1048576.0);
}

// In situ: a real block of each architecture and dtype (models::TransformerLM, six layers minus
// two over four, forward and backward apart: a model whose weights and activations outgrow the
// caches, as a step's do) against the cost model's sum of its kernels at the same shape. Inside a
// step each kernel finds its operands out of cache, and the bias adds and casts between them are
// not among the families; the ratio, "in situ forward|backward ARCH DTYPE", scales the cost
// model's blocks (a factor: per_unit, no latency). With a group, every rank that times kernels
// (`runs`) runs each forward and backward at once and each is the slowest rank's time
// (lockstep_seconds): a step's ranks wait for their slowest at every collective (DESIGN-NOTES 50).
// Every rank of the group calls it; the others wait without spinning.
// `kernel_pace`: the median pace over the kernel points (0: none, no scaling). Each block is scaled
// by kernel_pace over the pace around it (the mean of this rank's pace just before and just
// after), so that its time is the one it would have taken at the kernels' state; the unscaled
// factor is kept as a point ("in situ factor ... raw").
void time_in_situ(Calibration& cal, const CalibrateOptions& options, comm::Backend* group, bool runs,
                  PaceProbe* pace, double kernel_pace) {
  for (models::Arch arch : {models::Arch::kGpt2, models::Arch::kLlama})
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const bool gpt2 = arch == models::Arch::kGpt2;
      const int B = options.quick ? 2 : 4, T = options.quick ? 64 : 256;
      models::ModelConfig m;
      m.arch = arch;
      m.vocab_size = 1024;
      m.hidden = options.quick ? 128 : 512;
      m.n_head = m.n_kv_head = options.quick ? 2 : 8;
      m.intermediate = gpt2 ? 4 * m.hidden : m.hidden * 11 / 4;
      m.max_positions = T;
      m.tie_embeddings = gpt2;
      std::vector<int32_t> tok(static_cast<size_t>(B) * T), tgt(tok.size());
      for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>((i * 7919) % 1024), tgt[i] = static_cast<int32_t>((i * 104729 + 1) % 1024);
      auto build = [&](int layers) {
        models::ModelConfig c = m;
        c.n_layer = layers;
        models::ModelOptions o;
        o.compute_dtype = dt;
        auto model = std::make_unique<models::TransformerLM>(c, o);
        model->prepare(B, T);
        return model;
      };
      const int lo = 2, hi = options.quick ? 3 : 6;
      std::unique_ptr<models::TransformerLM> one, two;
      if (runs) one = build(lo), two = build(hi);
      // Alternating, so a disturbance hits both; the first round warms up; the median of the rest
      // (the kernels' lines are means over calls: a fastest-of would bias the ratio low).
      std::vector<double> f[2], b[2], f_own[2], b_own[2];  // the slowest rank's; this rank's own
      std::vector<double> fp[2], bp[2];                        // the slowest rank's, at the kernels' pace
      const int rounds = options.quick ? 3 : 8;
      const bool paced = runs && pace != nullptr && kernel_pace > 0;
      auto pace_now = [&] { return paced ? pace->once() : 0.0; };
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      // A pause in the shorter model's rounds (a quick calibration's median of 2 is the slower)
      // can leave it no faster than the longer one's and a block's time clamped to nothing; rounds
      // go on, up to 5 more, until both directions order them, as timed and at the kernels' pace
      // (the factors' own). The paced times are each rank's, so with a group the ranks max-reduce
      // whether any is still out of order: one collective per check on every rank.
      auto ordered = [&] {
        float out_of_order = 0.0f;
        if (runs && !(median(f[1]) > median(f[0]) && median(b[1]) > median(b[0]) && median(fp[1]) > median(fp[0]) &&
                      median(bp[1]) > median(bp[0])))
          out_of_order = 1.0f;
        max_over_group(group, runs, &out_of_order, "calibrate in situ order");
        return out_of_order == 0.0f;
      };
      double p = pace_now();
      for (int r = 0; r < rounds + 5 && (r < rounds || !ordered()); ++r)
        for (int k = 0; k < 2; ++k) {
          models::TransformerLM* model = runs ? (k ? two.get() : one.get()) : nullptr;
          double of = 0.0, ob = 0.0;
          const double tf = lockstep_seconds(group, runs, [&] { model->forward(tok.data(), tgt.data(), 1.0f); }, &of);
          const double p_mid = pace_now();
          const double tb = lockstep_seconds(group, runs, [&] { model->backward(); }, &ob);
          const double p_end = pace_now();
          const double sf = paced ? 2 * kernel_pace / (p + p_mid) : 1.0, sb = paced ? 2 * kernel_pace / (p_mid + p_end) : 1.0;
          p = p_end;
          if (r == 0) continue;
          f[k].push_back(tf);
          b[k].push_back(tb);
          fp[k].push_back(tf * sf);
          bp[k].push_back(tb * sb);
          f_own[k].push_back(of);
          b_own[k].push_back(ob);
        }
      if (!runs) continue;  // this rank's calibration has no kernel lines to compare with
      m.n_layer = 1;
      const StepShape shape{.model = m, .micro_batch = B, .seq_length = T, .compute = dt};
      const ZeroStepCosts modelled = zero_step_costs(shape, cal);
      const std::string what = std::string(gpt2 ? "gpt2 " : "llama ") + dtype_name(dt);
      const double rf = std::max(median(f[1]) - median(f[0]), 1e-9) / (hi - lo),
                   rb = std::max(median(b[1]) - median(b[0]), 1e-9) / (hi - lo);
      const double mf = std::max(median(fp[1]) - median(fp[0]), 1e-9) / (hi - lo),
                   mb = std::max(median(bp[1]) - median(bp[0]), 1e-9) / (hi - lo);
      if (paced) {
        cal.points.push_back({"in situ factor forward " + what + " raw", 1.0, rf / modelled.forward[1]});
        cal.points.push_back({"in situ factor backward " + what + " raw", 1.0, rb / modelled.backward[1]});
      }
      cal.points.push_back({"in situ block forward " + what, 1.0, mf});
      cal.points.push_back({"in situ block backward " + what, 1.0, mb});
      if (group != nullptr && group->size() > 1) {  // this rank's own, for comparison (not a factor)
        cal.points.push_back({"in situ block forward " + what + " own", 1.0,
                              std::max(median(f_own[1]) - median(f_own[0]), 1e-9) / (hi - lo)});
        cal.points.push_back({"in situ block backward " + what + " own", 1.0,
                              std::max(median(b_own[1]) - median(b_own[0]), 1e-9) / (hi - lo)});
      }
      cal.fits["in situ forward " + what] = {0.0, mf / modelled.forward[1]};
      cal.fits["in situ backward " + what] = {0.0, mb / modelled.backward[1]};
    }
}

}  // namespace

double speed_probe(int threads) {
  const int saved = threads_get();
  threads_set(threads);
  const int m = 1024, n = 2048, k = 1024;
  const size_t a_bytes = size_t{m} * k * 2, b_bytes = size_t{n} * k * 2;
  const int copies = rotation(a_bytes + b_bytes + size_t{m} * n * 4);
  std::vector<std::vector<char>> a(copies, std::vector<char>(a_bytes)), b(copies, std::vector<char>(b_bytes));
  std::vector<std::vector<float>> c(copies, std::vector<float>(size_t{m} * n));
  for (int i = 0; i < copies; ++i) fill_lowp(a[i], DType::kBF16), fill_lowp(b[i], DType::kBF16);
  const size_t e = size_t{16} << 20;  // 64 MiB of f32
  std::vector<float> x(e, 0.5f), y(e);
  int next = 0;
  auto once = [&] {
    for (int i = 0; i < 4; ++i) {
      kernels::gemm(m, n, k, a[next].data(), k, false, b[next].data(), k, true, c[next].data(), n, DType::kBF16, false);
      next = (next + 1) % copies;
    }
    for (int i = 0; i < 4; ++i) kernels::gelu_forward(y.data(), x.data(), e);
  };
  once();
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    Timer timer;
    once();
    t.push_back(timer.seconds());
  }
  threads_set(saved);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double exchange_probe(comm::Backend& group) {
  const size_t n = kExchangeProbeBytes / 4;
  std::vector<float> x(n, 1.0f);
  std::vector<double> t;
  comm::AllReduceOptions o;
  o.tag = "exchange probe";
  for (int i = 0; i < 24; ++i) {
    if (i % 8 == 0) std::fill(x.begin(), x.end(), 1.0f);  // the sums stay small
    group.barrier(comm::BarrierOptions{})->wait();
    Timer timer;
    group.all_reduce(x.data(), n, DType::kF32, o)->wait();
    if (i >= 3) t.push_back(timer.seconds());
  }
  std::sort(t.begin(), t.end());
  float s = static_cast<float>(t[t.size() / 2]);
  comm::AllReduceOptions m;
  m.op = comm::ReduceOp::kMax;
  m.tag = "exchange probe time";
  group.all_reduce(&s, 1, DType::kF32, m)->wait();
  return s;
}

namespace {
std::string ratio_text(double r) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", r);
  return b;
}
}  // namespace

std::string exchange_verdict(double calibrated, const std::vector<double>& now) {
  if (calibrated <= 0 || now.empty()) return "";
  std::vector<double> v = now;
  std::sort(v.begin(), v.end());
  const double med = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  const double r = med / calibrated;
  const std::string at = " (the 1 MiB all_reduce: ";
  char times[96];
  std::snprintf(times, sizeof times, "%.3f ms at calibration, a median %.3f ms at the runs)", calibrated * 1e3, med * 1e3);
  if (r < 0.5)
    return "the calibration was taken while the ranks exchanged data " + ratio_text(1 / r) + " times slower than during these runs" +
           at + times + ": its collectives are priced slow; calibrate again";
  if (r > 2)
    return "these runs met the ranks' data exchange " + ratio_text(r) + " times slower than at calibration" + at + times +
           ": their collectives took longer than priced; validate again";
  return "";
}

std::string speed_spread_verdict(const std::vector<double>& probes) {
  if (probes.size() < 2) return "";
  const auto [lo, hi] = std::minmax_element(probes.begin(), probes.end());
  if (*lo <= 0 || *hi / *lo <= 1.25) return "";
  char b[160];
  std::snprintf(b, sizeof b, "%.4f to %.4f s", *lo, *hi);
  return "this machine changed speed while it was calibrated (the speed probe took " + std::string(b) +
         " across its phases): the kernels' rates and the in-situ factors may come from different states; calibrate again";
}

std::string speed_verdict(const std::vector<double>& slowdowns) {
  if (slowdowns.empty()) return "";
  std::vector<double> v = slowdowns;
  std::sort(v.begin(), v.end());
  const double med = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  if (med <= 0 || (med <= 1.25 && med >= 0.8)) return "";
  char b[64];
  std::snprintf(b, sizeof b, "%.2f", med);
  if (med > 1.25)
    return "these runs met this machine " + std::string(b) + " times slower than at calibration (the speed probe's median "
           "slowdown): the calibration was taken in a faster state, and the steps are under-predicted by about as much; "
           "calibrate again";
  return "these runs met this machine faster than at calibration (the speed probe's median slowdown " + std::string(b) +
         "): the calibration was taken in a slower state, and the steps are over-predicted by about as much; calibrate again";
}

std::string exchange_spread_verdict(const std::vector<double>& probes) {
  if (probes.size() < 2) return "";
  const auto [lo, hi] = std::minmax_element(probes.begin(), probes.end());
  if (*lo <= 0 || *hi / *lo <= 2) return "";
  char b[128];
  std::snprintf(b, sizeof b, "%.3f to %.3f ms", *lo * 1e3, *hi * 1e3);
  return "the ranks' data exchange changed speed between the collectives' sweeps (the 1 MiB all_reduce took " +
         std::string(b) + "): each size's median may come from either speed; calibrate again";
}

std::vector<std::vector<double>> swept_medians(size_t n, int sweeps,
                                               const std::function<std::vector<double>(size_t)>& time) {
  std::vector<std::vector<std::vector<double>>> got(n);  // point, sweep, quantity
  for (int s = 0; s < sweeps; ++s)
    for (size_t i = 0; i < n; ++i) got[i].push_back(time(i));
  std::vector<std::vector<double>> med(n);
  for (size_t i = 0; i < n; ++i)
    for (size_t q = 0; q < got[i].front().size(); ++q) {
      std::vector<double> v;
      for (const auto& one : got[i]) v.push_back(one.at(q));
      std::sort(v.begin(), v.end());
      med[i].push_back(v[v.size() / 2]);
    }
  return med;
}

double lockstep_seconds(comm::Backend* group, bool runs, const std::function<void()>& f, double* own) {
  const bool together = group != nullptr && group->size() > 1;
  if (together) {
    std::unique_ptr<comm::Work> w = group->barrier(comm::BarrierOptions{});
    if (runs) w->wait();
    else wait_quietly(*w);
  }
  float s = 0.0f;
  if (runs) {
    Timer t;
    f();
    s = static_cast<float>(t.seconds());
  }
  if (own != nullptr) *own = s;
  max_over_group(group, runs, &s, "calibrate lockstep");
  return s;
}

Calibration calibrate(const CalibrateOptions& options) {
  Calibration cal;
  cal.threads = threads_get();
  comm::Backend* group = options.group != nullptr && options.group->size() > 1 ? options.group : nullptr;
  cal.world = group ? group->size() : 1;
  const double budget = options.quick ? 0.02 : 0.2;

  // A kernel's rate is a rank's on cores of its own. With more ranks x threads on a host than it
  // has cores (oversubscribed), only the host's first cores / threads ranks time the kernels, at
  // once, while the others wait without spinning; the simulator then shares the cores among the
  // ranks that compute together (SimProgram::host_cores). Rank 0 always times them.
  bool times_kernels = true;
  std::vector<int> host;
  if (group) {
    host = host_of_ranks(*group);
    const int me = group->rank();
    int local = 0;
    for (int r = 0; r < me; ++r) local += host[static_cast<size_t>(r)] == host[static_cast<size_t>(me)];
    // The host's cores as its ranks share them (mpirun may bind each rank to a core of its own).
    const int cores = comm::mpi_host_cores();
    times_kernels = local == 0 || (local + 1) * cal.threads <= cores;
  }
  // First, while the process's peak is still its own: the process constant.
  cal.process_bytes = process_constant(group);
  // The speed probe at each phase, rank 0 alone (the others wait without spinning): the machine's
  // state when each part was timed.
  auto probe_now = [&] {
    double s = !group || group->rank() == 0 ? speed_probe(cal.threads) : 0.0;
    if (group) {
      std::unique_ptr<comm::Work> w = group->barrier(comm::BarrierOptions{});
      while (!w->is_completed()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      float f = static_cast<float>(s);
      group->all_reduce(&f, 1, DType::kF32, comm::AllReduceOptions{})->wait();  // rank 0's
      s = f;
    }
    cal.speed_probes.push_back(s);
    return s;
  };
  probe_now();
  // With options.pace, the pace after every kernel point; its median is the kernels' state.
  std::unique_ptr<PaceProbe> pace;
  double kernel_pace = 0.0;
  if (times_kernels && options.pace) {
    pace = std::make_unique<PaceProbe>();
    PaceRecord record{.pace = [&] { return pace->once(); }, .paces = {}};
    g_kernel_pace = &record;
    try {
      time_kernels(cal, options, budget);
    } catch (...) {
      g_kernel_pace = nullptr;
      throw;
    }
    g_kernel_pace = nullptr;
    std::vector<double> q = record.paces;
    std::sort(q.begin(), q.end());
    double mean = 0.0;
    for (double x : q) mean += x / static_cast<double>(q.size());
    if (!q.empty()) {
      kernel_pace = q[q.size() / 2];
      cal.points.push_back({"pace kernels", static_cast<double>(q.size()), kernel_pace});
      cal.points.push_back({"pace kernels mean", static_cast<double>(q.size()), mean});
    }
  } else if (times_kernels) {
    time_kernels(cal, options, budget);
  }
  probe_now();
  time_in_situ(cal, options, group, times_kernels, pace.get(), kernel_pace);
  if (group) probe_now();  // before the collectives
  if (group) {
    std::unique_ptr<comm::Work> w = group->barrier(comm::BarrierOptions{});
    while (!w->is_completed()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    float on_first_host = times_kernels && host[static_cast<size_t>(group->rank())] == host[0] ? 1.0f : 0.0f;
    group->all_reduce(&on_first_host, 1, DType::kF32, comm::AllReduceOptions{})->wait();
    cal.kernel_ranks = static_cast<int>(on_first_host + 0.5f);
  }
  // The collectives' largest messages, within a third of the host's memory for its ranks together (8
  // ranks timing 128 MiB a rank needed 4.5 GB each, and the kernel killed the job; the rest is the
  // ranks' own, 0.9 GB each after the kernels): the smallest
  // cap over the group, so every rank times the same sizes.
  size_t max_bytes = SIZE_MAX;
  if (group) {
    const int me = group->rank();
    const int host_ranks = static_cast<int>(std::count(host.begin(), host.end(), host[static_cast<size_t>(me)]));
    const double mem = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
    float cap = static_cast<float>(collective_max_bytes(mem, host_ranks, group->size()));
    comm::AllReduceOptions o;
    o.op = comm::ReduceOp::kMin;
    group->all_reduce(&cap, 1, DType::kF32, o)->wait();
    max_bytes = static_cast<size_t>(cap);
    cal.collective_max_bytes = collective_sizes(options.quick, max_bytes).back();
  }

  if (group) {
    time_collectives(cal, group, "", options.quick, budget, max_bytes, &cal.exchange_probes);
    std::vector<double> sorted = cal.exchange_probes;  // none when the sizes stop short of 1 MiB
    std::sort(sorted.begin(), sorted.end());
    if (!sorted.empty()) cal.exchange_probe_s = sorted[sorted.size() / 2];  // the sweeps' median, as the curves'
    // Several hosts with several ranks each: the same collectives within a host and across hosts
    // (one rank a host), each group shape's own lines ("... intra", "... inter").
    const int hosts = *std::max_element(host.begin(), host.end()) + 1;
    const int me = group->rank();
    int local = 0;
    for (int r = 0; r < me; ++r) local += host[static_cast<size_t>(r)] == host[static_cast<size_t>(me)];
    bool even = group->size() % hosts == 0;
    for (int k = 0; k < hosts; ++k) even = even && std::count(host.begin(), host.end(), k) == group->size() / hosts;
    if (hosts == 1) {
      // One host: the collectives of every smaller group size that divides the world, all its
      // groups at once (consecutive ranks), as a layout runs its tp and dp groups side by side:
      // "all_reduce g4" ... (DESIGN-NOTES 46).
      for (int g = 2; g < group->size(); ++g) {
        if (group->size() % g != 0) continue;
        std::shared_ptr<comm::Backend> sub = group->split(me / g, me);
        time_collectives(cal, sub.get(), " g" + std::to_string(g), options.quick, budget, max_bytes);
      }
    }
    // (One rank a host: the world's lines are the ones across hosts, and ranks_per_host 1 says so.)
    if (hosts > 1 && even) cal.ranks_per_host = group->size() / hosts;
    if (hosts > 1 && even && group->size() > hosts) {
      std::shared_ptr<comm::Backend> intra = group->split(host[static_cast<size_t>(me)], me);
      std::shared_ptr<comm::Backend> inter = group->split(local, me);
      time_collectives(cal, intra.get(), " intra", options.quick, budget, max_bytes);
      time_collectives(cal, inter.get(), " inter", options.quick, budget, max_bytes);
    }
  }

  // The speed probe: rank 0 alone (the others wait without spinning), as plan --validate runs it.
  cal.speed_probe_s = probe_now();

  if (!options.io_dir.empty()) {
    io::AioOptions o;
    const io::Bandwidth bw = io::bandwidth_probe(options.io_dir, options.io_bytes, o);
    cal.disk_read_gbs = bw.read_gbs;
    cal.disk_write_gbs = bw.write_gbs;
    cal.disk_mixed_gbs = bw.mixed_gbs;
    cal.disk_interference_s_per_byte = disk_interference(options.io_dir, options.io_bytes);
  }
  return cal;
}

}  // namespace mt::planner
