#include "base/affinity.h"

#include <omp.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "base/error.h"

namespace mt {

namespace {

constexpr int kMpolBind = 2;  // linux/mempolicy.h's MPOL_BIND

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return {};
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
  return line;
}

// A non-negative decimal number filling `s`, else -1.
long number(const std::string& s) {
  if (s.empty() || s.size() > 9 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stol(s);
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  const long n = number(v);
  return n < 0 ? fallback : static_cast<int>(n);
}

}  // namespace

std::vector<int> parse_core_list(const std::string& list) {
  std::vector<int> out;
  long last = -1;
  std::istringstream in(list);
  std::string item;
  auto bad = [&](const std::string& why) {
    return Error(ErrorKind::kInvalidArgument, "core list '" + list + "': '" + item + "' " + why +
                                                  " (numbers and ranges A-B, comma-separated and ascending: 0,2-4,6)");
  };
  if (list.empty()) throw Error(ErrorKind::kInvalidArgument, "core list is empty (numbers and ranges: 0,2-4,6)");
  while (std::getline(in, item, ',')) {
    item.erase(0, item.find_first_not_of(' '));  // DeepSpeed's int() takes "0, 2"
    item.erase(item.find_last_not_of(' ') + 1);
    const size_t dash = item.find('-');
    const long lo = number(item.substr(0, dash));
    const long hi = dash == std::string::npos ? lo : number(item.substr(dash + 1));
    if (lo < 0 || hi < 0) throw bad("is not a CPU number or a range of them");
    if (hi < lo) throw bad("ends before it starts");
    if (lo <= last) throw bad("overlaps or precedes the item before it");
    if (hi >= CPU_SETSIZE) throw bad("is past the largest CPU number (" + std::to_string(CPU_SETSIZE - 1) + ")");
    for (long c = lo; c <= hi; ++c) out.push_back(static_cast<int>(c));
    last = hi;
  }
  if (!list.empty() && list.back() == ',') {
    item = "";
    throw bad("(an empty item) is not a CPU number");
  }
  return out;
}

std::string format_core_list(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(cpus[j]);
    }
    i = j + 1;
  }
  return out;
}

std::vector<int> allowed_cpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  std::vector<int> out;
  if (::sched_getaffinity(0, sizeof mask, &mask) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mask)) out.push_back(c);
  return out;
}

std::vector<int> one_cpu_per_core(const std::vector<int>& cpus, const std::string& sys) {
  std::set<int> taken;  // CPUs whose core already has its CPU in the result
  std::vector<int> out;
  for (int c : cpus) {
    if (taken.count(c)) continue;
    out.push_back(c);
    const std::string siblings = first_line(sys + "/cpu" + std::to_string(c) + "/topology/thread_siblings_list");
    try {
      for (int s : siblings.empty() ? std::vector<int>{} : parse_core_list(siblings)) taken.insert(s);
    } catch (const Error&) {  // unreadable topology: this CPU is a core of its own
    }
  }
  return out;
}

std::vector<int> rank_cores(const std::vector<int>& cores, int local_rank, int local_ranks) {
  if (local_ranks < 1 || local_rank < 0 || local_rank >= local_ranks)
    throw Error(ErrorKind::kInvalidArgument, "local rank " + std::to_string(local_rank) + " of " +
                                                 std::to_string(local_ranks) + " is not a rank of this host");
  const size_t per_rank = cores.size() / static_cast<size_t>(local_ranks);
  if (per_rank < 1)
    throw Error(ErrorKind::kInvalidArgument,
                "binding cores to ranks: " + std::to_string(local_ranks) + " ranks on this host but " +
                    std::to_string(cores.size()) + " cores to bind them to (" + format_core_list(cores) +
                    "); each rank needs one");
  const auto first = cores.begin() + static_cast<std::ptrdiff_t>(per_rank * static_cast<size_t>(local_rank));
  return {first, first + static_cast<std::ptrdiff_t>(per_rank)};
}

std::vector<int> bind_candidates(const std::string& spec) {
  const std::vector<int> allowed = allowed_cpus();
  if (spec == "all") return one_cpu_per_core(allowed);
  std::vector<int> list = parse_core_list(spec);
  for (int c : list)
    if (!std::binary_search(allowed.begin(), allowed.end(), c))
      throw Error(ErrorKind::kInvalidArgument, "core list '" + spec + "': CPU " + std::to_string(c) +
                                                   " is not one this process may run on (" +
                                                   format_core_list(allowed) + ")");
  return list;
}

int numa_node_of(const std::vector<int>& cpus, const std::string& node_sys) {
  std::error_code ec;
  int nodes = 0, holder = -1;  // nodes with CPUs (memory-only ones, CXL or HBM, are not a choice here)
  for (const auto& entry : std::filesystem::directory_iterator(node_sys, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("node", 0) != 0) continue;
    const long id = number(name.substr(4));
    if (id < 0) continue;
    std::vector<int> mine;
    try {
      const std::string list = first_line(entry.path().string() + "/cpulist");
      if (!list.empty()) mine = parse_core_list(list);
    } catch (const Error&) {
      continue;
    }
    if (mine.empty()) continue;
    ++nodes;
    const bool holds = !cpus.empty() && std::all_of(cpus.begin(), cpus.end(), [&](int c) {
      return std::binary_search(mine.begin(), mine.end(), c);
    });
    if (holds && (holder < 0 || id < holder)) holder = static_cast<int>(id);  // the lowest of duplicates
  }
  return nodes > 1 ? holder : -1;
}

std::vector<int> bind_rank_from_environment(char** argv) {
  const char* spec = std::getenv("MT_BIND_CORES");
  if (spec == nullptr || *spec == '\0' || std::getenv("MT_LAUNCHED") == nullptr) return {};
  if (std::getenv("MT_BIND_REEXEC") != nullptr) {  // bound before our own exec below: the mask stands
    ::unsetenv("MT_BIND_REEXEC");
    return allowed_cpus();
  }
  const char* local_rank_s = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const char* local_size_s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (local_rank_s == nullptr || local_size_s == nullptr)
    throw Error(ErrorKind::kInvalidArgument, std::string("MT_BIND_CORES=") + spec +
                                                 " (--bind_cores_to_rank): this rank's place on its host is unknown "
                                                 "(no OMPI_COMM_WORLD_LOCAL_RANK and _LOCAL_SIZE: not started by OpenMPI's mpirun)");
  const int local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", -1);
  const int local_ranks = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 0);
  std::vector<int> mine;
  try {
    mine = rank_cores(bind_candidates(spec), local_rank, local_ranks);
  } catch (const Error& e) {
    throw Error(ErrorKind::kInvalidArgument, std::string("MT_BIND_CORES=") + spec + " (--bind_cores_to_rank): " + e.what());
  }
  cpu_set_t mask;
  CPU_ZERO(&mask);
  for (int c : mine) CPU_SET(c, &mask);
  if (::sched_setaffinity(0, sizeof mask, &mask) != 0)
    throw Error(ErrorKind::kIOError, "binding to CPUs " + format_core_list(mine) + ": " + std::strerror(errno));
  const int node = numa_node_of(mine);
  if (node >= 0) {
    // The kernel reads maxnode - 1 bits of the mask.
    unsigned long nodemask[16] = {};
    constexpr unsigned long kBits = sizeof nodemask * 8;
    if (static_cast<unsigned long>(node) >= kBits - 1)
      std::fprintf(stderr, "meshtrain: warning: NUMA node %d is past the %lu this binding handles; memory is not bound\n",
                   node, kBits - 1);
    else {
      nodemask[static_cast<unsigned long>(node) / 64] = 1UL << (static_cast<unsigned long>(node) % 64);
      if (::syscall(SYS_set_mempolicy, kMpolBind, nodemask, kBits) != 0)
        std::fprintf(stderr, "meshtrain: warning: binding memory to NUMA node %d: %s; memory is not bound\n", node,
                     std::strerror(errno));
    }
  }
  const std::vector<int> now = allowed_cpus();
  std::fprintf(stderr, "meshtrain: rank %d (local %d of %d) bound to CPU%s %s%s, %zu OpenMP thread%s\n",
               env_int("OMPI_COMM_WORLD_RANK", local_rank), local_rank, local_ranks, now.size() == 1 ? "" : "s",
               format_core_list(now).c_str(), node >= 0 ? (", memory on NUMA node " + std::to_string(node)).c_str() : "",
               mine.size(), mine.size() == 1 ? "" : "s");
  std::fflush(stderr);
  // As DeepSpeed: a thread per bound core, whatever OMP_NUM_THREADS said. OpenMP read the variable as
  // the process started, and omp_set_num_threads sets the calling thread's count only (the optimizer's
  // and the server's threads would run the old one): where it differs, the process starts again
  // with it, bound (the mask and the memory policy pass through exec).
  const std::string threads = std::to_string(mine.size());
  const char* had = std::getenv("OMP_NUM_THREADS");
  const bool same = had != nullptr && threads == had;
  ::setenv("OMP_NUM_THREADS", threads.c_str(), 1);
  if (!same && argv != nullptr && argv[0] != nullptr) {
    ::setenv("MT_BIND_REEXEC", "1", 1);
    ::execv("/proc/self/exe", argv);
    ::unsetenv("MT_BIND_REEXEC");  // no /proc: on as we are, the main thread's count set below
  }
  omp_set_num_threads(static_cast<int>(mine.size()));
  return now;
}

}  // namespace mt
