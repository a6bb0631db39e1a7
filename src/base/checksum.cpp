#include "base/checksum.h"

#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "base/error.h"

namespace mt {
namespace {
std::string hex64(XXH64_hash_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}
}  // namespace

std::string xxh3_hex(const void* data, size_t bytes) { return hex64(XXH3_64bits(data, bytes)); }

Xxh3Stream::Xxh3Stream() : state_(XXH3_createState()) {
  MT_CHECK(state_ != nullptr, ErrorKind::kOutOfMemory, "XXH3 state");
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
Xxh3Stream::~Xxh3Stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Xxh3Stream::update(const void* data, size_t bytes) { XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes); }
std::string Xxh3Stream::hex() const { return hex64(XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_))); }

std::string file_xxh3_hex(const std::string& path, size_t* bytes) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw Error(ErrorKind::kIOError, path + ": cannot open: " + std::strerror(errno));
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<char> buf(size_t{4} << 20);
  size_t total = 0, n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    XXH3_64bits_update(st, buf.data(), n);
    total += n;
  }
  bool bad = std::ferror(f);
  std::fclose(f);
  XXH64_hash_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  if (bad) throw Error(ErrorKind::kIOError, path + ": read error");
  if (bytes) *bytes = total;
  return hex64(h);
}

}  // namespace mt
