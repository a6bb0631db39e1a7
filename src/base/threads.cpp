#include "base/threads.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace mt {

void threads_set(int n) {
  if (n <= 0) n = host_cores();
  omp_set_num_threads(n);
}

int threads_get() { return omp_get_max_threads(); }

void threads_default() {
  if (const char* user = std::getenv("OMP_NUM_THREADS"); user && *user) return;
  if (const int cores = host_cores(); cores < threads_get()) threads_set(cores);
}

namespace {

std::string read_small(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> split(const std::string& s, char by) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, by)) out.push_back(part);
  return out;
}

// A positive number of a quota file (cpu.max's fields, cfs_quota_us), else 0 ("max", -1, junk).
double positive(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str()) return 0.0;
  while (*end == ' ' || *end == '\n') ++end;
  return *end == '\0' && v > 0 ? v : 0.0;
}

// mountinfo's escapes of a path's space, tab, newline and backslash (\040, \011, \012, \134).
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool octal = s[i] == '\\' && s.size() - i >= 4 && s[i + 1] >= '0' && s[i + 1] <= '3' && s[i + 2] >= '0' &&
                       s[i + 2] <= '7' && s[i + 3] >= '0' && s[i + 3] <= '7';
    if (octal) {
      out.push_back(static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

}  // namespace

double cpu_max_cores(const char* cpu_max) {
  std::istringstream in(cpu_max ? cpu_max : "");
  std::string quota, period;
  if (!(in >> quota)) return 0.0;
  if (!(in >> period)) period = "100000";  // the kernel's default period when only the quota is written
  const double q = positive(quota), p = positive(period);
  return q > 0 && p > 0 ? q / p : 0.0;
}

double cfs_quota_cores(const char* quota_us, const char* period_us) {
  const double q = positive(quota_us ? quota_us : ""), p = positive(period_us ? period_us : "");
  return q > 0 && p > 0 ? q / p : 0.0;
}

double cgroup_quota_cores(const char* proc_cgroup, const char* mountinfo, std::string* limiting) {
  if (limiting) limiting->clear();
  // The cpu controller's cgroup: v1's line naming "cpu" among its controllers, else v2's "0::".
  std::string v1_path, v2_path;
  bool v1 = false, v2 = false;
  for (const std::string& line : split(proc_cgroup ? proc_cgroup : "", '\n')) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) v2 = true, v2_path = path;
    for (const std::string& c : split(controllers, ','))
      if (c == "cpu") v1 = true, v1_path = path;
  }
  // Its mount: mountinfo's fields 4 (the mount's root within the hierarchy) and 5 (where), and past
  // " - " the filesystem type, the source and, for v1, the controllers among the super options.
  for (const std::string& line : split(mountinfo ? mountinfo : "", '\n')) {
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream head(line.substr(0, dash));
    std::string id, parent, dev, root, where;
    if (!(head >> id >> parent >> dev >> root >> where)) continue;
    const std::vector<std::string> tail = split(line.substr(dash + 3), ' ');  // the source may be empty
    if (tail.size() < 3) continue;
    const std::string& type = tail[0];
    bool cpu = false;
    for (const std::string& o : split(tail[2], ',')) cpu = cpu || o == "cpu";
    const bool is_v1 = v1 && type == "cgroup" && cpu, is_v2 = !v1 && v2 && type == "cgroup2";
    if (!is_v1 && !is_v2) continue;
    root = unescape(root);
    where = unescape(where);
    // The cgroup's directory under the mount (a container sees its own cgroup as the mount's root);
    // a mount of another part of the hierarchy is not this process's.
    std::string rel = is_v1 ? v1_path : v2_path;
    if (root != "/") {
      if (rel != root && rel.compare(0, root.size() + 1, root + "/") != 0) continue;
      rel = rel.substr(root.size());
    }
    const std::filesystem::path below = std::filesystem::path(rel).relative_path();
    const std::filesystem::path top(where);
    std::filesystem::path dir = below.empty() ? top : top / below;
    std::error_code ec;
    if (rel.find("/..") != std::string::npos || !std::filesystem::is_directory(dir, ec)) continue;
    // The cgroup and each ancestor up to the mount point: the lowest quota of them.
    double lowest = 0.0;
    for (;;) {
      const double cores = is_v2 ? cpu_max_cores(read_small((dir / "cpu.max").string()).c_str())
                                 : cfs_quota_cores(read_small((dir / "cpu.cfs_quota_us").string()).c_str(),
                                                   read_small((dir / "cpu.cfs_period_us").string()).c_str());
      if (cores > 0 && (lowest == 0.0 || cores < lowest)) {
        lowest = cores;
        if (limiting) *limiting = dir.string();
      }
      if (dir == top || !dir.has_parent_path() || dir.parent_path() == dir) break;
      dir = dir.parent_path();
    }
    return lowest;
  }
  return 0.0;
}

double cgroup_cpu_quota(std::string* limiting) {
  return cgroup_quota_cores(read_small("/proc/self/cgroup").c_str(), read_small("/proc/self/mountinfo").c_str(), limiting);
}

int cgroup_cpu_quota_cores() {
  const double cores = cgroup_cpu_quota(nullptr);
  return cores > 0 ? static_cast<int>(std::ceil(cores - 1e-9)) : 0;
}

int host_cores() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  int cores = ::sched_getaffinity(0, sizeof mask, &mask) == 0 && CPU_COUNT(&mask) > 0
                  ? CPU_COUNT(&mask)
                  : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (const int quota = cgroup_cpu_quota_cores(); quota > 0) cores = std::min(cores, quota);
  return std::max(1, cores);
}

int threads_per_rank(int ranks_on_host) {
  if (const char* user = std::getenv("OMP_NUM_THREADS"); user && *user) {
    const int n = std::atoi(user);
    if (n > 0) return n;
  }
  return std::max(1, host_cores() / std::max(1, ranks_on_host));
}

}  // namespace mt
