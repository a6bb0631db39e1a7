// Fuzzes the run configuration (engine/ds_config.h) the way `meshtrain config check FILE --set ...`
// reads it: ds_config_load on a file, so malformed JSON must come back as an mt::Error too, then
// the resolved form that command prints. Input: the file's text, then optionally a NUL byte and
// NUL-separated `a.b.c=value` overrides. A "model" given as a path is read relative to the working
// directory (scripts/fuzz.sh runs from the repository root, where the seeds' paths lead).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/ds_config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = mt::fuzz::temp_path("config.json");
  const char* text = reinterpret_cast<const char*>(data);
  const void* nul = std::memchr(text, 0, size);
  size_t file_size = nul ? static_cast<size_t>(static_cast<const char*>(nul) - text) : size;
  std::vector<std::string> overrides;
  for (size_t begin = file_size + 1; begin <= size;) {
    const void* next = std::memchr(text + begin, 0, size - begin);
    size_t end = next ? static_cast<size_t>(static_cast<const char*>(next) - text) : size;
    overrides.emplace_back(text + begin, end - begin);
    begin = end + 1;
  }
  mt::fuzz::write_file(path, text, file_size);
  mt::fuzz::expect_ok_or_error([&] {
    mt::engine::RunConfig c = mt::engine::ds_config_load(path, overrides);
    mt::engine::ds_config_resolved(c).dump(2);
  });
  return 0;
}
