// mt_allreduce_bench: bucketed gradient reduction (parallel::GradBuckets, DeepSpeed's
// reduce_bucket_size) against one raw MPI_Allreduce of the whole buffer, under mpirun:
//
//   mpirun --allow-run-as-root -np 2 --bind-to none -x OMP_NUM_THREADS=1 \
//       build/bench/mt_allreduce_bench [--reps N] [--sizes ELEMS,ELEMS,...]
//
// Its own executable with its own main (not Google Benchmark's: every rank must run the same
// collectives in the same order). For each buffer size (f32 elements; default 16 MiB, 128 MiB and
// GPT-2 124M's gradient buffer, 124,439,808 elements) it times, median of --reps after one
// warm-up, the slowest rank's time of:
//   raw MPI_Allreduce       MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM) of the whole buffer
//   raw MPI_Iallreduce      the same through MPI_Iallreduce + MPI_Wait (what comm::MpiBackend issues)
//   compressed_all_reduce   1-bit Adam's exchange of the buffer as one tensor (comm/onebit.h), timed
//                           in alternation with the raw all-reduce
//   buckets B (seq)         GradBuckets(overlap=false): each bucket waited for when launched
//   buckets B (overlap)     GradBuckets(overlap=true): every bucket launched, then all waited
// with B in 1M, 4M, 16M, 64M elements and 5e8 (DeepSpeed's default), and the reduce-scatter of the
// buffer (ZeRO 2 and 3's gradient reduction, sequence parallelism's):
//   raw MPI_Ireduce_scatter_block   + MPI_Wait (libnbc's binomial reduce to rank 0, then a scatter)
//   reduce_scatter (ring)           comm::MpiBackend::reduce_scatter (its point-to-point ring)
// timed in alternation (timed_pair).
// Bus bandwidth is nccl-tests' 2(n-1)/n · bytes / time for all-reduce, (n-1)/n · bytes / time for
// reduce-scatter. Rank 0 also measures memcpy on one core (the scale of a shared-memory
// ring's per-hop copy) and prints the table.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi_backend.h"
#include "comm/onebit.h"
#include "parallel/dp/grad_buckets.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// The slowest rank's seconds for fn(), each repetition started together after a barrier.
template <typename F>
double timed(int reps, F&& fn) {
  std::vector<double> t;
  for (int i = -1; i < reps; ++i) {  // i = -1: warm-up
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = Clock::now();
    fn();
    double s = std::chrono::duration<double>(Clock::now() - t0).count(), slowest = 0.0;
    MPI_Allreduce(&s, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (i >= 0) t.push_back(slowest);
  }
  return median(t);
}

// Two ways of doing one thing, timed in alternation (A, B, A, B, ...: the VM's slow spells fall on
// both alike); the medians of each, after one warm-up of each.
template <typename A, typename B>
std::pair<double, double> timed_pair(int reps, A&& a, B&& b) {
  std::vector<double> ta, tb;
  for (int i = -1; i < reps; ++i) {
    double x = timed(1, a), y = timed(1, b);
    if (i >= 0) {
      ta.push_back(x);
      tb.push_back(y);
    }
  }
  return {median(ta), median(tb)};
}

std::vector<size_t> parse_sizes(const char* s) {
  std::vector<size_t> out;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    out.push_back(static_cast<size_t>(std::strtod(p, &end)));
    p = *end == ',' ? end + 1 : end;
    if (end == p && *end != '\0') break;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  mt::comm::mpi_prepare_process(argv);
  std::shared_ptr<mt::comm::Backend> world = mt::comm::mpi_init(&argc, &argv);
  const int rank = world->rank(), W = world->size();
  int reps = 5;
  std::vector<size_t> sizes = {size_t{4} << 20, size_t{32} << 20, 124'439'808};  // 16 MiB, 128 MiB, GPT-2 124M
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--sizes") && i + 1 < argc) sizes = parse_sizes(argv[++i]);
  }
  const std::vector<size_t> bucket_sizes = {size_t{1} << 20, size_t{4} << 20, size_t{16} << 20, size_t{64} << 20,
                                            500'000'000};
  const double ring = 2.0 * (W - 1) / W;
  auto name_elems = [](size_t e) {
    char b[32];
    if (e >= 100'000'000 && e % 100'000'000 == 0) std::snprintf(b, sizeof b, "%ge8", e / 1e8);
    else if (e % (1u << 20) == 0) std::snprintf(b, sizeof b, "%zuM", e >> 20);
    else std::snprintf(b, sizeof b, "%zu", e);
    return std::string(b);
  };
  if (rank == 0) {
    std::printf("mt_allreduce_bench: %d ranks, MPI thread level %s, median of %d after 1 warm-up, slowest rank\n", W,
                mt::comm::mpi_thread_level(), reps);
    std::printf("%-12s %-10s %-30s %7s %10s %12s\n", "buffer", "MB", "method", "buckets", "time ms", "busbw GB/s");
  }
  for (size_t n : sizes) {
    std::vector<float> buf(n, 1.0f / static_cast<float>(W));  // touched: no first-touch faults timed
    const double bytes = static_cast<double>(n) * sizeof(float);
    auto row = [&](const std::string& method, size_t nb, double s, double factor = 0.0) {
      if (rank != 0) return;
      std::printf("%-12s %-10.1f %-30s %7zu %10.2f %12.2f\n", name_elems(n).c_str(), bytes / 1e6, method.c_str(), nb,
                  s * 1e3, (factor > 0.0 ? factor : ring) * bytes / s / 1e9);
      std::fflush(stdout);
    };
    row("raw MPI_Allreduce", 1, timed(reps, [&] {
          MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }));
    row("raw MPI_Iallreduce+Wait", 1, timed(reps, [&] {
          MPI_Request r;
          MPI_Iallreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
          MPI_Wait(&r, MPI_STATUS_IGNORE);
        }));
    {  // 1-bit Adam's compressed all-reduce of the buffer as one tensor (comm/onebit.h; 1-bit LAMB's
       // and fp16's flat exchange), in alternation with the raw all-reduce; busbw as if f32 moved
      const mt::comm::OneBitPlan plan({{0, n}}, W);
      std::vector<float> we(plan.worker_error_len, 0.0f), se(plan.server_error_len, 0.0f);
      auto [raw, onebit] = timed_pair(
          reps, [&] { MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
          [&] { mt::comm::compressed_all_reduce(*world, buf.data(), plan, we.data(), se.data(), {}); });
      row("raw MPI_Allreduce (paired)", 1, raw);
      row("compressed_all_reduce (1-bit)", 1, onebit);
    }
    {
      const size_t block = n / static_cast<size_t>(W);
      std::vector<float> out(block, 0.0f);
      const double rs = static_cast<double>(W - 1) / W;
      auto [libnbc, ring_rs] = timed_pair(
          reps,
          [&] {
            MPI_Request r;
            MPI_Ireduce_scatter_block(buf.data(), out.data(), static_cast<int>(block), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
            MPI_Wait(&r, MPI_STATUS_IGNORE);
          },
          [&] { world->reduce_scatter(out.data(), buf.data(), block, mt::DType::kF32, {})->wait(); });
      row("raw MPI_Ireduce_scatter_block", 1, libnbc, rs);
      row("reduce_scatter (ring)", 1, ring_rs, rs);
    }
    for (bool overlap : {false, true}) {
      for (size_t b : bucket_sizes) {
        if (b >= n && b != bucket_sizes.back()) continue;  // one bucket: the 5e8 row says it
        mt::parallel::GradBuckets gb(buf.data(), n, b, *world, overlap);
        double s = timed(reps, [&] {
          gb.begin();
          gb.finish();
        });
        row("buckets " + name_elems(b) + (overlap ? " (overlap)" : " (seq)"), gb.count(), s);
      }
    }
  }
  if (rank == 0) {  // one core's memcpy, on the largest buffer
    size_t n = *std::max_element(sizes.begin(), sizes.end());
    std::vector<float> a(n, 1.0f), b(n, 2.0f);
    std::vector<double> t;
    for (int i = -1; i < reps; ++i) {
      auto t0 = Clock::now();
      std::memcpy(b.data(), a.data(), n * sizeof(float));
      if (i >= 0) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    double s = median(t), bytes = static_cast<double>(n) * sizeof(float);
    std::printf("memcpy, one core, %.1f MB: %.2f ms = %.2f GB/s copied (%.2f GB/s read + written), check %g\n",
                bytes / 1e6, s * 1e3, bytes / s / 1e9, 2 * bytes / s / 1e9, static_cast<double>(b[n / 2]));
  }
  world.reset();
  mt::comm::mpi_finalize();
  return 0;
}
