// Error: the one exception type of the library. A kind (like leveldb's Status codes) and a message
// that names the place. Library code throws; only cli/ catches, prints one line and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>

namespace mt {

enum class ErrorKind {
  kInvalidArgument,  // a caller or a config asked for something malformed
  kNotFound,         // a file, tensor or key that should exist does not
  kCorruption,       // a file exists but its contents are inconsistent
  kIOError,          // the OS refused a read or write
  kNotSupported,     // a valid request this build does not implement (yet)
  kOutOfMemory,      // an allocation failed; the message quotes the accounted categories
  kNumerical,        // NaN/inf where a finite value is required
  kInternal,         // a broken invariant: a bug in meshtrain
  kTimeout,          // a collective or a peer did not answer in time (a hang turned into an error)
};

const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message);
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

}  // namespace mt

// MT_CHECK(cond, kind, msg): throws Error(kind, msg) when cond is false. msg is any expression that
// converts to std::string and is only evaluated on failure.
#define MT_CHECK(cond, kind, msg)                      \
  do {                                                 \
    if (!(cond)) throw ::mt::Error((kind), (msg));     \
  } while (0)

#define MT_INTERNAL_CHECK(cond)                                                                 \
  do {                                                                                          \
    if (!(cond))                                                                                \
      throw ::mt::Error(::mt::ErrorKind::kInternal,                                             \
                        std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #cond); \
  } while (0)
