// host_cores: the affinity mask's count (taskset, a cpuset), where hardware_concurrency counted
// every online CPU; threads_per_rank shares those out.
#include "base/threads.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <stdlib.h>

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
  const char* user = std::getenv("OMP_NUM_THREADS");
  ::unsetenv("OMP_NUM_THREADS");
  const int per_rank = threads_per_rank(1);
  if (user) ::setenv("OMP_NUM_THREADS", user, 1);
  ASSERT_EQ(::sched_setaffinity(0, sizeof saved, &saved), 0);
  EXPECT_EQ(restricted, 1);
  EXPECT_EQ(per_rank, 1);
  EXPECT_GE(static_cast<int>(std::thread::hardware_concurrency()), host_cores());
}

}  // namespace
}  // namespace mt
