// Reading a JSON file: a missing file is kNotFound, a malformed one kInvalidArgument (or the kind
// the caller asks for, e.g. kCorruption for files we wrote ourselves), each naming the path.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace mt::engine {

nlohmann::json json_load_file(const std::string& path, ErrorKind malformed = ErrorKind::kInvalidArgument);

}  // namespace mt::engine
