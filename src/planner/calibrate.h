// Calibration (issue 14): the only part of the planner that runs kernels and collectives. It
// times this machine's own GEMMs by shape and dtype, a memory-bound kernel by bytes, the AdamW
// update by elements, every collective and p2p by message size over the given group, and the disk
// where asked. Each family is a least-squares line, time = latency + units × seconds-per-unit: the
// cost model's input (DESIGN decision 6: the planner uses the real system's numbers).
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "comm/backend.h"
#include "tensor/dtype.h"

namespace mt::planner {

// time = latency + per_unit × units, fitted to measured (units, seconds) points by least squares.
// A negative intercept (the points' noise) is refitted through the origin: latency is never < 0.
struct LinearFit {
  double latency = 0.0;   // seconds
  double per_unit = 0.0;  // seconds per unit (flop, byte or element)
  double seconds(double units) const { return latency + per_unit * units; }
};
// relative false: every point weighs the same, so the largest set the rate (bandwidth-bound
// families, whose small points fit in the caches).
LinearFit fit_line(const std::vector<std::pair<double, double>>& points, bool relative = true);

struct CalPoint {
  std::string what;     // "gemm bf16 512x2048x2048", "all_reduce f32", ...
  double units = 0.0;   // flops, bytes or elements
  double seconds = 0.0;
};

// The bytes a GEMM of m rows (tokens), n outputs and k inputs moves through memory, its operands in
// a type of `es` bytes: the forward C (m×n, f32) = A (m×k) · W (n×k)ᵀ reads A and W and writes C;
// the backward's dX (m×k, f32) = dY (m×n) · W reads dY and W and writes dX, and dW (n×k, f32) +=
// dYᵀ · X reads dY and X and reads and writes dW. The weights' share does not shrink with m: a
// micro-batch split in more, smaller ones moves them once more each (12 bytes a bf16 weight).
double gemm_bytes(double m, double n, double k, double es);
double gemm_backward_bytes(double m, double n, double k, double es);

// One GEMM timing of the calibration: forward (2mnk flops) or backward (4mnk).
struct GemmTiming {
  DType dtype = DType::kF32;
  bool backward = false;
  double m = 0, n = 0, k = 0;
  double seconds = 0.0;
};

// A described cluster's links (`plan --cluster`, planner/cluster.h): collectives are rings over the
// intra-host links when the group fits in one host, else over the inter-host ones.
struct Network {
  int devices_per_host = 1;
  double intra_latency = 0.0, intra_bytes_per_s = 0.0;  // one direction, one device
  double inter_latency = 0.0, inter_bytes_per_s = 0.0;
};

struct Calibration {
  std::string source;  // the file it was read from, for messages ("" : "calibration")
  int world = 1;  // ranks of the group the collectives were timed on
  int threads = 1;
  // Ranks of a host that timed the kernels at once: every rank of it, unless that would take more
  // cores than it has (then cores / threads of them, so each kernel's rate is a rank's on cores of
  // its own). Calibrations without the field timed them on every rank.
  int kernel_ranks = 1;
  // The largest message a rank the collectives were timed at (0: none timed); past it the curves
  // go on at their last rate.
  size_t collective_max_bytes = 0;
  std::vector<CalPoint> points;             // everything measured
  std::map<std::string, LinearFit> fits;    // "gemm f32", "gemm bf16" (flops), "memory" (bytes),
                                            // "adamw" (elements), "all_reduce", "all_gather",
                                            // "reduce_scatter", "send_recv" (bytes per rank)
  double disk_read_gbs = 0.0, disk_write_gbs = 0.0, disk_mixed_gbs = 0.0;  // 0: not measured
  // Compute seconds lost per byte the disk moves beside it (calibrate --io: a GEMM loop alone and
  // beside a stream of reads and writes; on a virtual machine the disk's emulation shares the cores).
  double disk_interference_s_per_byte = 0.0;
  // speed_probe(threads) when the calibration was taken (rank 0 alone; 0: not measured): the
  // machine's speed then, for plan --validate to compare the machine's speed at each run with.
  double speed_probe_s = 0.0;
  // The same probe at each phase of the calibration (rank 0): before the kernels, before the in-situ
  // blocks, before the collectives and at the end (speed_probe_s). A VM's speed can change state
  // within the calibration (the device machine's probe took 0.09 or 0.14 s, two states; PLANNER,
  // the fifth lease): then the kernels' rates and the in-situ factors come from different states.
  std::vector<double> speed_probes;
  // exchange_probe over the world when the collectives were timed (0: not measured): the median of
  // `exchange_probes`, one taken in each sweep of the world's collectives right after its 1 MiB
  // point. On a virtual machine the ranks' data exchange changes speed from seconds to minutes
  // (the host placing the vCPUs; DESIGN-NOTES 52): plan --validate times the probe again before
  // each run of the calibration's world and says when the calibration and the runs met the
  // exchange at speeds more than twofold apart.
  double exchange_probe_s = 0.0;
  std::vector<double> exchange_probes;
  // The process's memory outside the allocator's blocks (0: not measured): its resident set less
  // the allocator's footprint after the calibration ran its kernels and collectives, the largest
  // over the ranks — the binary, its libraries, the threads' stacks, oneDNN's and MPI's own
  // buffers. A rank's predicted process peak is this plus StageEstimate::mapped, mpi and
  // gemm_scratch (DESIGN-NOTES 58, 59); oneDNN's scratchpad region is not in it.
  size_t process_bytes = 0;
  // The last-level cache (sysfs; 0: not told), and the "copy hot", "zero hot" and "add hot" lines
  // timed on buffers within it: a one-rank ZeRO step's gradient slab that fits stays there
  // (ZeroStepCosts::cache_bytes).
  size_t cache_bytes = 0;
  // The collectives' measured (bytes, seconds), by size: MPI's algorithms change with the message
  // size (OpenMPI's reduce_scatter here: 3.85 GB/s at 1 MiB, 0.12 at 16 MiB), so no one line holds.
  // seconds() interpolates them piecewise-linearly, past the largest at its rate, below the
  // smallest on the line (no more than the smallest's time).
  std::map<std::string, std::vector<std::pair<double, double>>> curves;
  // Sets a family's curve: sorted by size, and no point above a larger size's (a collective of
  // fewer bytes costs no more than one of more; a sweep's first size on an oversubscribed host
  // read 17.8 ms at 4 KiB beside 0.6 ms at 16 KiB: DESIGN-NOTES 120).
  void set_curve(const std::string& family, std::vector<std::pair<double, double>> xy);
  // A family's time for `units`; throws kNotFound naming the family when it was not measured.
  double seconds(const std::string& family, double units) const;
  // A GEMM's time (forward, or the backward's two): with the "gemm compute DT" lines (the
  // timings less their bytes at the memory rate, add_gemm_compute_fits) their compute plus
  // gemm_bytes at the "memory" rate; else (older calibrations, described clusters) the
  // "gemm DT" / "gemm backward DT" lines by flops, the backward absent twice the forward.
  double gemm_seconds(long m, long n, long k, DType dtype) const;
  double gemm_backward_seconds(long m, long n, long k, DType dtype) const;
  // Calibrated over several hosts of ranks_per_host ranks each (0: one host): every collective is
  // also timed within a host and across hosts (one rank a host), families "<collective> intra" and
  // "<collective> inter" (with one rank a host, the world's lines are those across hosts).
  int ranks_per_host = 0;
  // Whether this machine's oneDNN multiplies f16 itself (AVX512-FP16); where not, kernels::gemm
  // widens f16 operands to f32 and the cost model prices that (planner/cost.cpp). A calibration
  // without the field: false, as on the machines before it was recorded.
  bool f16_native = false;
  // Whether it multiplies bf16 itself (AVX512-BF16 or AMX). Where not (an AVX2 CPU), kernels::gemm
  // widens bf16 operands to f32 as it does f16's, and the cost model and the memory estimate price
  // the widening (it was taken as native on any CPU, stop 76's note). A calibration without the
  // field: true, as the machines it was recorded on multiplied bf16.
  bool bf16_native = true;
  // A described cluster's network (none for a machine's calibration).
  bool has_network = false;
  Network network;
  // A collective ("all_reduce": bytes of the whole buffer; "all_gather", "reduce_scatter": bytes a
  // rank; "send_recv": bytes) over a group of `ranks` ranks placed `stride` ranks apart (a tp group:
  // 1; a dp group: tp; pipeline neighbours: tp x dp). With a network, the ring's textbook time
  // (all_reduce 2(n-1) latencies + 2(n-1)/n bytes / bandwidth, all_gather and reduce_scatter
  // (n-1)(latency + bytes / bandwidth), send_recv latency + bytes / bandwidth) over the intra-host
  // links when ranks x stride <= devices_per_host, else the inter-host ones; without, the measured
  // line of the group's shape ("... intra" when ranks x stride <= ranks_per_host, else "... inter")
  // where calibrated over several hosts; on one host the line of the group's size where it was
  // timed ("... g4": groups of 4 at once, in a world of 8), else the world's, scaled to a group of
  // another size by the ring's volume a rank moves (2(n-1)/n of the buffer for all_reduce, n-1
  // times a rank's bytes for all_gather and reduce_scatter; DESIGN-NOTES 46). "all_to_all" (Ulysses'
  // exchange): bytes a rank sends, its whole buffer; a network's (n-1) latencies + (n-1)/n of them
  // at the bandwidth; a calibration without its line: all_gather's of bytes / ranks.
  double collective_seconds(const std::string& family, double bytes, int ranks, int stride) const;
};

struct CalibrateOptions {
  bool quick = false;            // fewer, smaller points (tests, a first look)
  comm::Backend* group = nullptr;  // collectives over it (null or one rank: none)
  std::string io_dir;            // the disk probe's directory (empty: not measured)
  unsigned long long io_bytes = 1ull << 30;
  // Experimental (calibrate --pace): the in-situ blocks scaled to the kernels' pace (PaceProbe in
  // calibrate.cpp, DESIGN-NOTES 84). Off: as timed, the factor at the state each block met.
  bool pace = false;
};

// Collective when group has more than one rank: every rank calls it.
Calibration calibrate(const CalibrateOptions& options);

// n points timed `sweeps` times over, all n in order each sweep (time(i) gives point i's
// quantities), and each point's median per quantity (the middle one; the upper of two). A
// disturbance lasting fewer than n consecutive timings touches each point at most once, so with
// three sweeps it reaches no median (the collectives' curves, DESIGN-NOTES 51).
std::vector<std::vector<double>> swept_medians(size_t n, int sweeps,
                                               const std::function<std::vector<double>(size_t)>& time);

// The seconds `f` takes on the slowest rank of `group`, its ranks starting it together: a barrier,
// f timed on each rank where `runs` (the others count 0 and wait without spinning), a max-reduce.
// What a step's synchronised ranks see of a block: they wait for the slowest. Without a group (or
// with one rank), f's own time. Every rank of the group calls it. `own`, where given, gets this
// rank's own time (0 where it does not run).
double lockstep_seconds(comm::Backend* group, bool runs, const std::function<void()>& f, double* own = nullptr);

// A fixed sample of a step's work, timed in this process on `threads` threads: four bf16 GEMMs of
// a block's shape (1024 x 2048 x 1024, operands rotating past the caches) and four GELU passes
// over 64 MiB, about three quarters GEMM by time as a step is; the median of five tries (seconds).
// A virtual machine's speed drifts (two calibrations of one 16-core VM eight minutes apart
// differed by 19 %); the ratio of this probe now to the calibration's (Calibration::speed_probe_s)
// is how much slower than calibrated the machine runs at this moment.
double speed_probe(int threads);

// The speed probes of a calibration's phases (Calibration::speed_probes, seconds): an empty string
// when they lie within 25 % of each other; otherwise one line saying the machine changed speed
// while it was calibrated.
std::string speed_spread_verdict(const std::vector<double>& probes);

// The runs' slowdowns (each run's speed probe / the calibration's): an empty string when their
// median lies within 25 % of 1; otherwise one line saying the runs met the machine in another
// speed state than the calibration did, and by how much.
std::string speed_verdict(const std::vector<double>& slowdowns);

// The ranks' data exchange now: an all_reduce of kExchangeProbeBytes (f32) over `group`, each call
// timed after a barrier, the median of 21 calls after 3 untimed ones; the slowest rank's median
// (seconds). Every rank of the group calls it. This VM's 2-rank probe takes 0.14-0.19 ms, and
// 0.6-1.1 ms in a slow spell (DESIGN-NOTES 52).
constexpr size_t kExchangeProbeBytes = size_t{1} << 20;
double exchange_probe(comm::Backend& group);

// How the exchange probes of a calibration (`calibrated`, seconds) and of later runs (`now`)
// compare: an empty string when the runs' median lies within a factor of 2 of it; otherwise one
// sentence saying which was slower, by how much, and what to do.
std::string exchange_verdict(double calibrated, const std::vector<double>& now);
// A calibration's own probes (one a sweep): empty when they agree within a factor of 2, else one
// sentence saying its collective curves' medians may come from either speed.
std::string exchange_spread_verdict(const std::vector<double>& probes);

// The "gemm compute DT" and "gemm backward compute DT" lines: each timing less its bytes at the
// calibration's "memory" rate, fitted by flops as the "gemm DT" lines are. Needs "memory".
void add_gemm_compute_fits(Calibration& cal, const std::vector<GemmTiming>& timings);

// The message sizes (bytes a rank) the collectives are timed at: the full list's (4 KiB to 128
// MiB; quick: to 1 MiB) up to max_bytes, and its three smallest always.
std::vector<size_t> collective_sizes(bool quick, size_t max_bytes);
// The largest message a rank may time when host_ranks ranks of a group of `ranks` share a host of
// host_bytes: together within a third of it, each holding 3 x ranks x the message.
size_t collective_max_bytes(double host_bytes, int host_ranks, int ranks);

}  // namespace mt::planner
