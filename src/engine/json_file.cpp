#include "engine/json_file.h"

#include <vector>

#include "base/file_io.h"

namespace mt::engine {

nlohmann::json json_load_file(const std::string& path, ErrorKind malformed) {
  std::vector<char> bytes = file_read_all(path);
  try {
    return nlohmann::json::parse(bytes.begin(), bytes.end());
  } catch (const nlohmann::json::exception& e) {
    throw Error(malformed, path + ": not valid JSON: " + e.what());
  }
}

}  // namespace mt::engine
