// Thread control: the library computes with OpenMP (the runtime oneDNN shares), so one call sets
// the number of threads for our kernels and oneDNN's alike.
#pragma once

namespace mt {

void threads_set(int n);  // n <= 0: all cores
int threads_get();
// The cores this process may run on: its CPU affinity mask's count (taskset, a container's cpuset,
// a batch scheduler's binding), which std::thread::hardware_concurrency (every online CPU) is not;
// that count where the mask cannot be read; at least 1.
int host_cores();
// The OpenMP threads `meshtrain launch` gives each of ranks_on_host ranks of this host: the user's
// OMP_NUM_THREADS where set (as under torchrun), else the cores shared out, at least one.
int threads_per_rank(int ranks_on_host);

}  // namespace mt
