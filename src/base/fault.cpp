#include "base/fault.h"

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>

namespace mt {

bool fault_active(const char* name) {
  const char* want = std::getenv("MT_FAULT");
  if (!want) return false;
  std::string w = want;
  if (size_t at = w.rfind('@'); at != std::string::npos) {
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (!rank || w.substr(at + 1) != rank) return false;
    w.resize(at);
  }
  return w == name;
}

void fault_point(const char* name) {
  if (!fault_active(name)) return;
  const char* mode = std::getenv("MT_FAULT_MODE");
  if (mode && std::strcmp(mode, "hang") == 0)
    for (;;) pause();
  std::raise(SIGKILL);
}

}  // namespace mt
