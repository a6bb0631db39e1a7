#include "base/error.h"

namespace mt {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "invalid argument";
    case ErrorKind::kNotFound: return "not found";
    case ErrorKind::kCorruption: return "corruption";
    case ErrorKind::kIOError: return "I/O error";
    case ErrorKind::kNotSupported: return "not supported";
    case ErrorKind::kOutOfMemory: return "out of memory";
    case ErrorKind::kNumerical: return "numerical error";
    case ErrorKind::kInternal: return "internal error";
    case ErrorKind::kTimeout: return "timeout";
  }
  return "error";
}

Error::Error(ErrorKind kind, const std::string& message)
    : std::runtime_error(message), kind_(kind) {}

}  // namespace mt
