#include "base/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "base/error.h"

namespace mt {

std::vector<char> file_read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  MT_CHECK(in.good(), ErrorKind::kNotFound, path + ": cannot open for reading");
  // NOTE: a directory opens, and on ext4 its size reads as 2^63 - 1: refuse it before allocating.
  struct stat st;
  MT_CHECK(::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode), ErrorKind::kInvalidArgument,
           path + ": is a directory, not a file");
  std::streamsize size = in.tellg();
  MT_CHECK(size >= 0, ErrorKind::kIOError, path + ": cannot determine size");
  std::vector<char> data(static_cast<size_t>(size));
  in.seekg(0);
  MT_CHECK(in.read(data.data(), size).good() || size == 0, ErrorKind::kIOError,
           path + ": short read");
  return data;
}

void file_write_atomic(const std::string& path, const void* data, size_t bytes) {
  AtomicFile f(path);
  f.append(data, bytes);
  f.commit();
}

AtomicFile::AtomicFile(const std::string& path) : path_(path), tmp_(path + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  MT_CHECK(fd_ >= 0, ErrorKind::kIOError, tmp_ + ": " + std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::append(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(ErrorKind::kIOError, tmp_ + ": write failed: " + std::strerror(n < 0 ? errno : ENOSPC));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  bool ok = ::fsync(fd_) == 0;
  ok = (::close(fd_) == 0) && ok;
  const int fd = fd_;
  fd_ = -1;
  if (!ok) {
    ::unlink(tmp_.c_str());
    throw Error(ErrorKind::kIOError, tmp_ + ": fsync/close failed");
  }
  (void)fd;
  MT_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, ErrorKind::kIOError, path_ + ": rename failed: " + std::strerror(errno));
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace mt

namespace mt {

namespace {
size_t status_kb(const char* field) {  // a "Field:   N kB" line of /proc/self/status, in bytes
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return static_cast<size_t>(std::stoull(line.substr(key.size()))) * 1024;
  return 0;
}
}  // namespace

size_t process_peak_rss_bytes() { return status_kb("VmHWM"); }
size_t process_rss_bytes() { return status_kb("VmRSS"); }

}  // namespace mt
