#include "engine/json_file.h"

#include <string>
#include <vector>

#include "base/file_io.h"

namespace mt::engine {

nlohmann::json json_load_file(const std::string& path, ErrorKind malformed) {
  std::vector<char> bytes = file_read_all(path);
  // NOTE: nlohmann parses iteratively but copies, compares and dumps recursively: a 400 KB file of
  // nested brackets overflowed the stack when the config was copied. Real configs nest < 10 deep.
  constexpr int kMaxDepth = 1000;
  auto limit_depth = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    MT_CHECK(depth <= kMaxDepth, malformed,
             path + ": JSON nested deeper than " + std::to_string(kMaxDepth) + " levels");
    return true;
  };
  try {
    return nlohmann::json::parse(bytes.begin(), bytes.end(), limit_depth);
  } catch (const nlohmann::json::exception& e) {
    throw Error(malformed, path + ": not valid JSON: " + e.what());
  }
}

}  // namespace mt::engine
