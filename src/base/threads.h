// Thread control: the library computes with OpenMP (the runtime oneDNN shares), so one call sets
// the number of threads for our kernels and oneDNN's alike.
#pragma once

#include <string>

namespace mt {

void threads_set(int n);  // n <= 0: all cores (host_cores)
int threads_get();
// At start-up: without OMP_NUM_THREADS, OpenMP runs a thread per CPU of the affinity mask; a cgroup's
// CPU quota below that (a container's --cpus) bounds the threads to host_cores() too.
void threads_default();
// The cores this process may run on: its CPU affinity mask's count (taskset, a container's cpuset,
// a batch scheduler's binding), which std::thread::hardware_concurrency (every online CPU) is not;
// that count where the mask cannot be read; no more than its cgroup's CPU quota; at least 1.
int host_cores();
// The CPU quota of this process's cgroup in whole cores, rounded up (docker --cpus 1.5: 2; systemd's
// CPUQuota): cgroup v2's cpu.max or v1's cpu.cfs_quota_us over cpu.cfs_period_us, the lowest of its
// cgroup's and its ancestors'; 0 for none (no limit, or none that can be read).
int cgroup_cpu_quota_cores();
// The parts, for tests: a cpu.max line ("max 100000", "150000 100000") in cores (0: no limit);
// v1's quota and period files' contents likewise; the quota of the cgroup `path` (as
// /proc/self/cgroup gives it) under the cgroup filesystems that `mountinfo` (/proc/self/mountinfo's
// text) mounts, with `proc_cgroup` its /proc/self/cgroup text.
double cpu_max_cores(const char* cpu_max);
double cfs_quota_cores(const char* quota_us, const char* period_us);
// *limiting: the directory of the cgroup whose quota it is (empty for none).
double cgroup_quota_cores(const char* proc_cgroup, const char* mountinfo, std::string* limiting = nullptr);
// This process's quota in cores, unrounded (0: none), and the cgroup directory that sets it: ranks
// of one host in one container share it, ranks in cgroups of their own each have theirs.
double cgroup_cpu_quota(std::string* limiting);
// The OpenMP threads `meshtrain launch` gives each of ranks_on_host ranks of this host: the user's
// OMP_NUM_THREADS where set (as under torchrun), else the cores shared out, at least one.
int threads_per_rank(int ranks_on_host);

}  // namespace mt
