#include "base/threads.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

namespace mt {

void threads_set(int n) {
  if (n <= 0) n = omp_get_num_procs();
  omp_set_num_threads(n);
}

int threads_get() { return omp_get_max_threads(); }

int host_cores() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (::sched_getaffinity(0, sizeof mask, &mask) == 0 && CPU_COUNT(&mask) > 0) return CPU_COUNT(&mask);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int threads_per_rank(int ranks_on_host) {
  if (const char* user = std::getenv("OMP_NUM_THREADS"); user && *user) {
    const int n = std::atoi(user);
    if (n > 0) return n;
  }
  return std::max(1, host_cores() / std::max(1, ranks_on_host));
}

}  // namespace mt
