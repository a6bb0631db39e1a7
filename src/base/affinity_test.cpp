// Binding ranks to cores (DeepSpeed's --bind_cores_to_rank): the core list's syntax and DeepSpeed's
// equal runs per local rank as pure functions, the physical cores and NUMA nodes from a sysfs tree
// written here, and the binding itself in a child process, read back from the kernel.
#include "base/affinity.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/child_process_test_util.h"
#include "base/scratch_dir.h"

namespace mt {
namespace {

using V = std::vector<int>;

std::string list_error(const std::string& list) {
  try {
    parse_core_list(list);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    return e.what();
  }
  return "";
}

void put(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text << "\n";
}

TEST(Affinity, CoreListsAreDeepSpeedsSyntax) {
  EXPECT_EQ(parse_core_list("0,2-4,6"), (V{0, 2, 3, 4, 6}));
  EXPECT_EQ(parse_core_list("7"), (V{7}));
  EXPECT_EQ(parse_core_list("0-95").size(), 96u);
  EXPECT_EQ(format_core_list({0, 2, 3, 4, 6}), "0,2-4,6");
  EXPECT_EQ(format_core_list({5}), "5");
  EXPECT_EQ(format_core_list({}), "");
  EXPECT_NE(list_error("4-2").find("'4-2' ends before it starts"), std::string::npos) << list_error("4-2");
  EXPECT_NE(list_error("0-3,2").find("'2' overlaps or precedes"), std::string::npos) << list_error("0-3,2");
  EXPECT_NE(list_error("1,0").find("precedes"), std::string::npos);
  EXPECT_NE(list_error("a").find("'a' is not a CPU number"), std::string::npos);
  EXPECT_NE(list_error("1-2-3").find("not a CPU number"), std::string::npos);
  EXPECT_NE(list_error("0,,1").find("not a CPU number"), std::string::npos);
  EXPECT_NE(list_error("0,").find("empty item"), std::string::npos);
  EXPECT_NE(list_error("").find("empty"), std::string::npos);
  EXPECT_NE(list_error("0-5000").find("past the largest CPU"), std::string::npos);
}

// deepspeed/utils/numa.py: cores_per_rank = len(list) // local ranks, rank i the i-th run; the
// remainder idle. DeepSpeed's own example: 0-95 on two ranks of a host.
TEST(Affinity, EachLocalRankTakesItsRunOfTheCores) {
  const V all = parse_core_list("0-95");
  EXPECT_EQ(format_core_list(rank_cores(all, 0, 2)), "0-47");
  EXPECT_EQ(format_core_list(rank_cores(all, 1, 2)), "48-95");
  const V ten = parse_core_list("0-3,8-13");
  EXPECT_EQ(rank_cores(ten, 0, 3), (V{0, 1, 2}));
  EXPECT_EQ(rank_cores(ten, 1, 3), (V{3, 8, 9}));
  EXPECT_EQ(rank_cores(ten, 2, 3), (V{10, 11, 12}));  // 13 stays idle
  EXPECT_EQ(rank_cores(ten, 9, 10), (V{13}));
  try {
    rank_cores({0, 1}, 0, 3);
    ADD_FAILURE() << "three ranks on two cores were bound";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("3 ranks on this host but 2 cores to bind them to (0-1)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(rank_cores(ten, 3, 3), Error);
}

TEST(Affinity, OneCpuOfEachPhysicalCore) {
  const ScratchDir sys("mt_affinity_sys");
  // Two cores of two hardware threads each (0 and 4, 1 and 5) and CPU 2 without a topology.
  for (int c : {0, 4}) put(sys.file("cpu" + std::to_string(c) + "/topology/thread_siblings_list"), "0,4");
  for (int c : {1, 5}) put(sys.file("cpu" + std::to_string(c) + "/topology/thread_siblings_list"), "1,5");
  EXPECT_EQ(one_cpu_per_core({0, 1, 2, 4, 5}, sys.path()), (V{0, 1, 2}));
  EXPECT_EQ(one_cpu_per_core({4, 5}, sys.path()), (V{4, 5}));  // the first of each core's threads that is offered
  EXPECT_EQ(one_cpu_per_core({}, sys.path()), V{});
}

TEST(Affinity, TheNumaNodeHoldingEveryCpu) {
  const ScratchDir two("mt_affinity_node");
  put(two.file("node0/cpulist"), "0-3");
  put(two.file("node1/cpulist"), "4-7");
  put(two.file("possible"), "0-1");  // sysfs's other entries are not nodes
  EXPECT_EQ(numa_node_of({4, 5}, two.path()), 1);
  EXPECT_EQ(numa_node_of({0}, two.path()), 0);
  EXPECT_EQ(numa_node_of({3, 4}, two.path()), -1);
  const ScratchDir one("mt_affinity_node");
  put(one.file("node0/cpulist"), "0-7");
  EXPECT_EQ(numa_node_of({4, 5}, one.path()), -1);  // one node: nothing to bind memory to
}

using mt::testing::in_child;

// The second local rank of two, over the process's first two CPUs: the kernel's mask afterwards is
// the second alone, and the rank runs one OpenMP thread whatever OMP_NUM_THREADS said.
void as_second_rank_of_two(const V& allowed) {
  ::setenv("MT_LAUNCHED", "1", 1);
  ::setenv("MT_BIND_CORES", format_core_list({allowed[0], allowed[1]}).c_str(), 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  ::setenv("OMP_NUM_THREADS", "7", 1);
  ::unsetenv("MT_BIND_REEXEC");
}

int bound_child() {
  const V allowed = allowed_cpus();
  as_second_rank_of_two(allowed);
  const V bound = bind_rank_from_environment(nullptr);  // no exec: the calling thread's count
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (::sched_getaffinity(0, sizeof mask, &mask) != 0) return 10;
  if (CPU_COUNT(&mask) != 1 || !CPU_ISSET(allowed[1], &mask)) return 11;
  if (bound != V{allowed[1]}) return 12;
  if (omp_get_max_threads() != 1 || std::string(std::getenv("OMP_NUM_THREADS")) != "1") return 13;
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");  // a rank that does not know its place on the host
  ::sched_setaffinity(0, sizeof mask, &mask);
  try {
    bind_rank_from_environment(nullptr);
    return 14;
  } catch (const Error& e) {
    if (std::string(e.what()).find("this rank's place on its host is unknown") == std::string::npos) return 15;
  }
  return 0;
}

std::string g_self;  // this test binary, for the exec below

// With argv, a rank whose OMP_NUM_THREADS changes starts again (OpenMP reads it once, and a thread
// other than the one that called omp_set_num_threads kept the old count): the process after the
// exec runs the disabled test below, which checks what it inherited.
int reexec_child(const std::string& out) {
  const V allowed = allowed_cpus();
  as_second_rank_of_two(allowed);
  if (std::freopen(out.c_str(), "w", stdout) == nullptr) return 30;
  std::string filter = "--gtest_filter=Affinity.DISABLED_AfterTheBindingsExec";
  std::string also = "--gtest_also_run_disabled_tests";
  char* argv[] = {g_self.data(), filter.data(), also.data(), nullptr};
  bind_rank_from_environment(argv);
  return 31;  // not exec'd
}

TEST(Affinity, DISABLED_AfterTheBindingsExec) {
  ASSERT_NE(std::getenv("MT_BIND_REEXEC"), nullptr) << "run by Affinity.ARankWhoseThreadCountChangesStartsAgain";
  const V mask = bind_rank_from_environment(nullptr);  // bound before the exec: taken as it is
  EXPECT_EQ(std::getenv("MT_BIND_REEXEC"), nullptr);  // not passed on to the rank's own children
  EXPECT_EQ(mask.size(), 1u);
  EXPECT_EQ(allowed_cpus(), mask);
  int other = 0;
  std::thread([&other] { other = omp_get_max_threads(); }).join();
  EXPECT_EQ(other, 1);
  EXPECT_EQ(omp_get_max_threads(), 1);
  std::printf("after the exec: bound to %s, %d thread(s) on another thread\n", format_core_list(mask).c_str(), other);
}

// Outside a launch's ranks (no MT_LAUNCHED: plan's own process, a shell that exported it) nothing
// is bound; a CPU outside the mask is refused naming it.
int unbound_child() {
  const V before = allowed_cpus();
  ::unsetenv("MT_LAUNCHED");
  ::setenv("MT_BIND_CORES", "all", 1);
  if (!bind_rank_from_environment(nullptr).empty() || allowed_cpus() != before) return 20;
  ::setenv("MT_LAUNCHED", "1", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1", 1);
  ::setenv("MT_BIND_CORES", std::to_string(before.back() + 1).c_str(), 1);
  try {
    bind_rank_from_environment(nullptr);
    return 21;
  } catch (const Error& e) {
    const std::string want = "CPU " + std::to_string(before.back() + 1) + " is not one this process may run on";
    if (e.kind() != ErrorKind::kInvalidArgument || std::string(e.what()).find(want) == std::string::npos) {
      std::fprintf(stderr, "%s\n", e.what());
      return 22;
    }
  }
  return allowed_cpus() == before ? 0 : 23;
}

TEST(Affinity, ARankIsBoundToItsRunAndRunsAThreadPerCore) {
  if (allowed_cpus().size() < 2) GTEST_SKIP() << "needs two CPUs";
  EXPECT_EQ(in_child(bound_child), 0);
}

TEST(Affinity, ARankWhoseThreadCountChangesStartsAgain) {
  if (allowed_cpus().size() < 2) GTEST_SKIP() << "needs two CPUs";
  g_self = std::filesystem::read_symlink("/proc/self/exe").string();
  const ScratchDir dir("mt_affinity_exec");
  const std::string out = dir.file("out.txt");
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(reexec_child(out));
  int status = 0;
  ::waitpid(pid, &status, 0);
  std::ifstream in(out);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << text;
  EXPECT_NE(text.find("after the exec: bound to " + std::to_string(allowed_cpus()[1]) + ", 1 thread(s)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("[  PASSED  ] 1 test"), std::string::npos) << text;
}

TEST(Affinity, NothingIsBoundOutsideALaunchAndForeignCpusAreRefused) {
  if (allowed_cpus().empty() || allowed_cpus().back() + 1 >= CPU_SETSIZE) GTEST_SKIP() << "no CPU number outside the mask";
  EXPECT_EQ(in_child(unbound_child), 0);
}

}  // namespace
}  // namespace mt
