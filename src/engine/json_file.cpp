#include "engine/json_file.h"

#include <set>
#include <string>
#include <vector>

#include "base/file_io.h"

namespace mt::engine {

nlohmann::json json_load_file(const std::string& path, ErrorKind malformed) {
  std::vector<char> bytes = file_read_all(path);
  // NOTE: nlohmann parses iteratively but copies, compares and dumps recursively: a 400 KB file of
  // nested brackets overflowed the stack when the config was copied. Real configs nest < 10 deep.
  constexpr int kMaxDepth = 1000;
  // A key twice in one object: nlohmann keeps the last without a word ("train_iters": 6, then 3,
  // trained 3). DeepSpeed refuses a duplicate key in its config; so does every file read here.
  using Event = nlohmann::json::parse_event_t;
  std::vector<std::set<std::string>> keys;  // the keys of each object being parsed
  auto check = [&](int depth, Event event, nlohmann::json& parsed) {
    MT_CHECK(depth <= kMaxDepth, malformed,
             path + ": JSON nested deeper than " + std::to_string(kMaxDepth) + " levels");
    if (event == Event::object_start) keys.emplace_back();
    else if (event == Event::object_end && !keys.empty()) keys.pop_back();
    else if (event == Event::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second)
      throw Error(malformed, path + ": key \"" + parsed.get<std::string>() +
                                 "\" appears twice in one object (which one counts would be a guess; DeepSpeed refuses it too)");
    return true;
  };
  try {
    return nlohmann::json::parse(bytes.begin(), bytes.end(), check);
  } catch (const nlohmann::json::exception& e) {
    throw Error(malformed, path + ": not valid JSON: " + e.what());
  }
}

}  // namespace mt::engine
