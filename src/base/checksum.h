// Checksums of files (checkpoint integrity): XXH3-64 (libxxhash) as 16 lowercase hex digits.
#pragma once

#include <cstddef>
#include <string>

namespace mt {

std::string xxh3_hex(const void* data, size_t bytes);
// The same digest over data given in parts (their concatenation).
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void update(const void* data, size_t bytes);
  std::string hex() const;

 private:
  void* state_;
};
// Streams the file; throws kIOError naming it when it cannot be read.
std::string file_xxh3_hex(const std::string& path, size_t* bytes = nullptr);

}  // namespace mt
