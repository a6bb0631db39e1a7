// Binding each rank of a host to cores of its own: DeepSpeed's launcher options --bind_cores_to_rank
// and --bind_core_list (deepspeed/utils/numa.py). The cores (the list, or one CPU of each physical
// core of the process's affinity mask) are cut into as many equal runs as the host has ranks, the
// i-th run goes to local rank i, the rest stay idle; a rank whose cores lie in one NUMA node of
// several allocates from that node; each rank runs as many OpenMP threads as it has cores
// (OMP_NUM_THREADS is set so, as DeepSpeed sets it). `meshtrain launch` passes the request to its
// ranks as MT_BIND_CORES ("all" or the list), which main() applies before any thread starts.
#pragma once

#include <string>
#include <vector>

namespace mt {

// "0,2-4,6" -> {0, 2, 3, 4, 6}: numbers and inclusive ranges, comma-separated, ascending and not
// overlapping (DeepSpeed's rules). Throws kInvalidArgument naming the bad item.
std::vector<int> parse_core_list(const std::string& list);
// The inverse, with runs as ranges: {0, 2, 3, 4, 6} -> "0,2-4,6".
std::string format_core_list(const std::vector<int>& cpus);
// The CPUs of this process's affinity mask, ascending.
std::vector<int> allowed_cpus();
// One CPU of each physical core among `cpus`: the first of its hardware threads in `cpus`, from
// SYS/cpuN/topology/thread_siblings_list (a CPU whose topology cannot be read counts as a core).
std::vector<int> one_cpu_per_core(const std::vector<int>& cpus, const std::string& sys = "/sys/devices/system/cpu");
// Local rank `local_rank` of `local_ranks`'s run of `cores` (floor(cores / ranks) of them).
// Throws kInvalidArgument when there are fewer cores than ranks.
std::vector<int> rank_cores(const std::vector<int>& cores, int local_rank, int local_ranks);
// The cores MT_BIND_CORES's value (`spec`: "all" or a list) offers this host's ranks: the list's
// CPUs, each in the affinity mask (kInvalidArgument naming one that is not), or for "all" one CPU
// of each core of the mask.
std::vector<int> bind_candidates(const std::string& spec);
// The NUMA node holding every one of `cpus` where the machine has more than one (-1 otherwise),
// from NODE_SYS/nodeN/cpulist.
int numa_node_of(const std::vector<int>& cpus, const std::string& node_sys = "/sys/devices/system/node");
// In a rank of `meshtrain launch` (MT_LAUNCHED) with MT_BIND_CORES set: binds the process to its run
// of cores (its local rank and the host's rank count from OpenMPI's OMPI_COMM_WORLD_LOCAL_RANK and
// _LOCAL_SIZE), its memory to their NUMA node where there are several, says so in one line, and
// gives it a thread per core: OMP_NUM_THREADS, and where that changes it, the process starts again
// (execv of /proc/self/exe with `argv`, marked MT_BIND_REEXEC, which the next call takes as bound;
// argv null: no exec, the calling thread's count only). Returns the CPUs the kernel now runs it on
// (empty where nothing was asked). Call before any thread starts (threads inherit the mask).
// Throws kInvalidArgument for a bad list, too few cores or a rank without its place on the host,
// kIOError where the kernel refuses.
std::vector<int> bind_rank_from_environment(char** argv);

}  // namespace mt
