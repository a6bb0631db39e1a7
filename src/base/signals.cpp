#include "base/signals.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "base/error.h"
#include "base/file_io.h"

namespace mt {

namespace {

constexpr int kRouted[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT};

std::mutex g_mu;
bool g_routed = false;
sigset_t g_starting;

void* take_signals(void*) {
  for (;;) ::pause();  // the handlers run here, between pauses
  return nullptr;
}

}  // namespace

sigset_t routed_signals() {
  sigset_t s;
  sigemptyset(&s);
  for (int sig : kRouted) sigaddset(&s, sig);
  return s;
}

void route_signals_to_their_own_thread() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_routed) return;
  const sigset_t routed = routed_signals();
  sigset_t starting;
  ::pthread_sigmask(SIG_SETMASK, nullptr, &starting);
  // Started before the caller holds the set, the thread has the starting mask from its first
  // instruction (a thread inherits its creator's): there is no moment when every thread holds them.
  pthread_attr_t attr;
  ::pthread_attr_init(&attr);
  ::pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  ::pthread_attr_setstacksize(&attr, 256 << 10);
  pthread_t t;
  const int rc = ::pthread_create(&t, &attr, take_signals, nullptr);
  ::pthread_attr_destroy(&attr);
  if (rc != 0) {  // a pids limit: the process goes on as before, a handler running on any thread
    std::fprintf(stderr, "warning: cannot start the signal thread (%s): a signal that lands inside a oneDNN GEMM may corrupt the heap\n",
                 std::strerror(rc));
    return;
  }
  ::pthread_setname_np(t, "mt-signals");
  MT_CHECK(::pthread_sigmask(SIG_BLOCK, &routed, nullptr) == 0, ErrorKind::kInternal, "cannot hold the stop signals");
  g_starting = starting;
  g_routed = true;
}

namespace {

char g_command[64] = "meshtrain";

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    default: return "a signal";
  }
}

void stop_now(int sig) {
  remove_live_temporaries();
  char line[160];
  const int n = std::snprintf(line, sizeof line, "meshtrain %s: stopped by %s; what it was writing is not kept\n", g_command,
                              signal_name(sig));
  if (n > 0 && ::write(2, line, static_cast<size_t>(std::min<int>(n, sizeof line - 1))) < 0) {
  }
  ::_exit(128 + sig);
}

}  // namespace

void stop_on_signals(const char* command) {
  std::snprintf(g_command, sizeof g_command, "%s", command);
  ::signal(SIGXFSZ, SIG_IGN);
  struct sigaction sa {};
  sa.sa_handler = stop_now;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2}) sigaddset(&sa.sa_mask, sig);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2}) {
    struct sigaction now {};
    ::sigaction(sig, nullptr, &now);
    if (now.sa_handler != SIG_IGN) ::sigaction(sig, &sa, nullptr);
  }
}

sigset_t starting_signal_mask() {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_routed) return g_starting;
  }
  sigset_t now;
  ::pthread_sigmask(SIG_SETMASK, nullptr, &now);
  return now;
}

int system_as_started(const std::string& command) {
  const sigset_t starting = starting_signal_mask();
  sigset_t now;
  ::pthread_sigmask(SIG_SETMASK, &starting, &now);
  const int rc = std::system(command.c_str());
  ::pthread_sigmask(SIG_SETMASK, &now, nullptr);
  return rc;
}

}  // namespace mt
