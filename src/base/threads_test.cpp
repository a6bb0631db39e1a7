// host_cores: the affinity mask's count (taskset, a cpuset), where hardware_concurrency counted
// every online CPU, within the cgroup's CPU quota (docker --cpus); threads_per_rank shares those out.
#include "base/threads.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <stdlib.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

namespace mt {
namespace {

TEST(Threads, HostCoresAreTheAffinityMasksCores) {
  cpu_set_t saved;
  CPU_ZERO(&saved);
  ASSERT_EQ(::sched_getaffinity(0, sizeof saved, &saved), 0);
  EXPECT_EQ(host_cores(), CPU_COUNT(&saved));
  int first = 0;
  while (!CPU_ISSET(first, &saved)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(::sched_setaffinity(0, sizeof one, &one), 0);  // as under `taskset -c <first>`
  const int restricted = host_cores();
  const char* env = std::getenv("OMP_NUM_THREADS");
  const std::optional<std::string> user = env ? std::optional<std::string>(env) : std::nullopt;
  ::unsetenv("OMP_NUM_THREADS");
  const int per_rank = threads_per_rank(1);
  if (user) ::setenv("OMP_NUM_THREADS", user->c_str(), 1);
  ASSERT_EQ(::sched_setaffinity(0, sizeof saved, &saved), 0);
  EXPECT_EQ(restricted, 1);
  EXPECT_EQ(per_rank, 1);
  EXPECT_GE(static_cast<int>(std::thread::hardware_concurrency()), host_cores());
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p);
  out << text;
}

TEST(Threads, CgroupQuotaFilesReadAsCores) {
  EXPECT_EQ(cpu_max_cores("max 100000\n"), 0.0);
  EXPECT_EQ(cpu_max_cores("150000 100000\n"), 1.5);
  EXPECT_EQ(cpu_max_cores("200000 50000"), 4.0);
  EXPECT_EQ(cpu_max_cores("50000"), 0.5);  // the default period
  EXPECT_EQ(cpu_max_cores(""), 0.0);
  EXPECT_EQ(cpu_max_cores("junk 100000"), 0.0);
  EXPECT_EQ(cfs_quota_cores("-1\n", "100000\n"), 0.0);
  EXPECT_EQ(cfs_quota_cores("250000\n", "100000\n"), 2.5);
  EXPECT_EQ(cfs_quota_cores("250000\n", ""), 0.0);
}

// The quota of a cgroup and its ancestors (the lowest), found as /proc/self/cgroup and mountinfo
// name them: v1's cpu controller (beside v2's), v2's unified tree, a container's own cgroup as
// its mount's root.
TEST(Threads, CgroupQuotaIsTheLowestOfTheCgroupAndItsAncestors) {
  const std::filesystem::path top = std::filesystem::temp_directory_path() / ("mt_cgroup_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(top);
  const std::filesystem::path v1 = top / "cpu", v2 = top / "unified";
  std::filesystem::create_directories(v1 / "job" / "step");
  std::filesystem::create_directories(v2 / "a" / "b");
  for (const auto& d : {v1, v1 / "job" / "step"}) write_file(d / "cpu.cfs_quota_us", "-1\n"), write_file(d / "cpu.cfs_period_us", "100000\n");
  write_file(v1 / "job" / "cpu.cfs_quota_us", "150000\n");
  write_file(v1 / "job" / "cpu.cfs_period_us", "100000\n");
  write_file(v2 / "cpu.max", "max 100000\n");
  write_file(v2 / "a" / "cpu.max", "300000 100000\n");
  write_file(v2 / "a" / "b" / "cpu.max", "max 100000\n");
  const std::string v1_mount = "30 25 0:27 / " + v1.string() + " rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n";
  const std::string v2_mount = "35 25 0:30 / " + v2.string() + " rw,nosuid - cgroup2 cgroup2 rw\n";
  const std::string other = "22 1 8:1 / / rw - ext4 /dev/vda rw\n";
  const std::string mounts = other + v1_mount + v2_mount;
  EXPECT_EQ(cgroup_quota_cores("4:cpu,cpuacct:/job/step\n0::/a/b\n", mounts.c_str()), 1.5);  // v1's cpu, from the parent
  EXPECT_EQ(cgroup_quota_cores("4:memory:/x\n0::/a/b\n", mounts.c_str()), 3.0);             // v2's, from the parent
  EXPECT_EQ(cgroup_quota_cores("0::/\n", mounts.c_str()), 0.0);                               // the root: none
  EXPECT_EQ(cgroup_quota_cores("4:cpu,cpuacct:/job/step\n", other.c_str()), 0.0);            // not mounted
  // A container's cgroup is its mount's root: its path under the mount is the mount itself.
  const std::string container = "30 25 0:27 /docker/abc " + (v1 / "job").string() + " rw - cgroup cgroup rw,cpuacct,cpu\n";
  EXPECT_EQ(cgroup_quota_cores("4:cpu,cpuacct:/docker/abc\n", container.c_str()), 1.5);
  // A mount of another part of the hierarchy (a sibling whose name starts alike, a cgroup outside
  // the namespace) is not this process's: no quota, not the mount's.
  EXPECT_EQ(cgroup_quota_cores("4:cpu,cpuacct:/docker/abcd/x\n", container.c_str()), 0.0);
  EXPECT_EQ(cgroup_quota_cores("4:cpu,cpuacct:/../other\n", mounts.c_str()), 0.0);
  // The cgroup that sets the quota is named: the parent's, for the step's.
  std::string limiting;
  EXPECT_EQ(cgroup_quota_cores("4:cpu,cpuacct:/job/step\n", mounts.c_str(), &limiting), 1.5);
  EXPECT_EQ(limiting, (v1 / "job").string());
  // A mount point with a space, as mountinfo escapes it; a mount with an empty source.
  const std::filesystem::path spaced = top / "with space";
  std::filesystem::create_directories(spaced);
  write_file(spaced / "cpu.max", "50000 100000\n");
  const std::string escaped = "36 25 0:31 / " + top.string() + "/with\\040space rw - cgroup2  rw\n";
  EXPECT_EQ(cgroup_quota_cores("0::/\n", escaped.c_str()), 0.5);
  std::filesystem::remove_all(top);
}

// This process moved into a cgroup of one core's quota (where it may make one: root, v1's cpu
// controller, as on this machine): host_cores() counts one core, as threads_per_rank does.
TEST(Threads, HostCoresKeepToTheCgroupsCpuQuota) {
  std::string path;
  {
    std::ifstream in("/proc/self/cgroup");
    std::string line;
    while (std::getline(in, line))
      if (line.find(":cpu,") != std::string::npos || line.find(":cpu:") != std::string::npos ||
          line.find(",cpu:") != std::string::npos || line.find(",cpu,") != std::string::npos)
        path = line.substr(line.find(':', line.find(':') + 1) + 1);
  }
  const std::filesystem::path mount = "/sys/fs/cgroup/cpu";
  std::error_code ec;
  if (path.empty() || !std::filesystem::exists(mount / "cpu.cfs_quota_us", ec))
    GTEST_SKIP() << "no cgroup v1 cpu controller at " << mount;
  const std::filesystem::path mine = mount / std::filesystem::path(path).relative_path();
  const std::filesystem::path child = mine / ("mt_threads_test_" + std::to_string(::getpid()));
  if (!std::filesystem::create_directory(child, ec) || ec) GTEST_SKIP() << "cannot make a cgroup under " << mine;
  auto put = [](const std::filesystem::path& p, const std::string& text) {
    std::ofstream out(p);
    out << text;
    out.flush();
    return static_cast<bool>(out);
  };
  // Back to its own cgroup, and the child removed, however the test ends.
  struct Restore {
    std::filesystem::path mine, child;
    bool moved = false;
    ~Restore() {
      if (moved) {
        std::ofstream out(mine / "cgroup.procs");
        out << ::getpid();
      }
      std::error_code e;
      std::filesystem::remove(child, e);
    }
  } restore{mine, child};
  if (!put(child / "cpu.cfs_period_us", "100000") || !put(child / "cpu.cfs_quota_us", "100000"))
    GTEST_SKIP() << "cannot set a quota on " << child;
  const int before = host_cores(), saved_threads = threads_get();
  restore.moved = true;
  if (!put(child / "cgroup.procs", std::to_string(::getpid()))) GTEST_SKIP() << "cannot move into " << child;
  const int quota = cgroup_cpu_quota_cores(), inside = host_cores();
  const char* env = std::getenv("OMP_NUM_THREADS");
  const std::optional<std::string> user = env ? std::optional<std::string>(env) : std::nullopt;
  ::unsetenv("OMP_NUM_THREADS");
  const int per_rank = threads_per_rank(1);
  threads_set(2);  // OpenMP's own default on two CPUs
  threads_default();
  const int by_default = threads_get();
  threads_set(0);
  const int all_cores = threads_get();
  if (user) ::setenv("OMP_NUM_THREADS", user->c_str(), 1);
  threads_set(saved_threads);
  ASSERT_TRUE(put(mine / "cgroup.procs", std::to_string(::getpid())));
  restore.moved = false;
  EXPECT_EQ(quota, 1);
  EXPECT_EQ(inside, 1);
  EXPECT_EQ(per_rank, 1);
  EXPECT_EQ(by_default, 1);
  EXPECT_EQ(all_cores, 1);
  EXPECT_EQ(host_cores(), before);
}

}  // namespace
}  // namespace mt
