#include "base/log.h"

#include <atomic>
#include <cstdio>

namespace mt {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<int> g_rank{-1};
}  // namespace

void log_set_level(LogLevel level) { g_level = static_cast<int>(level); }
void log_set_rank(int rank) { g_rank = rank; }

void log_message(LogLevel level, const std::string& message) {
  if (static_cast<int>(level) < g_level) return;
  static const char* kNames[] = {"debug", "info", "warning", "error"};
  int rank = g_rank;
  if (rank >= 0) {
    std::fprintf(stderr, "[rank %d] %s: %s\n", rank, kNames[static_cast<int>(level)],
                 message.c_str());
  } else {
    std::fprintf(stderr, "%s: %s\n", kNames[static_cast<int>(level)], message.c_str());
  }
}

}  // namespace mt
