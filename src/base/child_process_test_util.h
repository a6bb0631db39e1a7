// For tests that must run in a process of their own (signal masks, CPU affinity, exec): runs `body`
// in a forked child, single-threaded as main() is at start-up (the test process may have threads of
// its own). The result is the child's exit code (body's: 0 passed, its reasons on stderr), or 100 +
// the signal that ended it.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

namespace mt::testing {

inline int in_child(int (*body)()) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

}  // namespace mt::testing
