// Rank-aware logging: one line per call, prefixed with the rank once ranks exist. Level set once
// at start-up; messages below it cost one comparison.
#pragma once

#include <string>

namespace mt {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void log_set_level(LogLevel level);
void log_set_rank(int rank);  // -1: single process, no prefix
void log_message(LogLevel level, const std::string& message);

inline void log_info(const std::string& m) { log_message(LogLevel::kInfo, m); }
inline void log_warning(const std::string& m) { log_message(LogLevel::kWarning, m); }
inline void log_debug(const std::string& m) { log_message(LogLevel::kDebug, m); }

}  // namespace mt
