// Checksums of files (checkpoint integrity): XXH3-64 (libxxhash) as 16 lowercase hex digits.
#pragma once

#include <cstddef>
#include <string>

namespace mt {

std::string xxh3_hex(const void* data, size_t bytes);
// Streams the file; throws kIOError naming it when it cannot be read.
std::string file_xxh3_hex(const std::string& path, size_t* bytes = nullptr);

}  // namespace mt
