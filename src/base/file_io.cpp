#include "base/file_io.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <vector>

#include "base/error.h"
#include "base/log.h"

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

DirectoryLock::DirectoryLock(const std::string& path, bool exclusive) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  fd_ = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) return;
  while (::flock(fd_, exclusive ? LOCK_EX : LOCK_SH) != 0 && errno == EINTR) {
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

HeldLock::HeldLock(const std::string& path, const std::string& what, const std::string& advice) {
  // Where it cannot be held, the run goes on as it did before the lock, said once: a file system
  // without locks (NFSv3 without its lock daemon, Lustre mounted noflock), or another user's lock
  // file this user cannot open for writing (NFS's flock needs it).
  auto unlocked = [&](int e) {
    log_warning(path + ": cannot hold the lock (" + std::strerror(e) + "), so another run on " + what + " would not be refused");
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  };
  const bool created = ::access(path.c_str(), F_OK) != 0;
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    const int e = errno;
    if (e == EACCES && !created) {
      unlocked(e);
      return;
    }
    throw Error(ErrorKind::kIOError, path + ": cannot create the lock: " + std::strerror(e));
  }
  if (created) (void)::fchmod(fd_, 0666);  // the next run may be another user's: it rewrites the holder
  int rc;
  while ((rc = ::flock(fd_, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
  }
  const int e = rc == 0 ? 0 : errno;
  if (e == ENOLCK || e == ENOSYS || e == EOPNOTSUPP || e == EINVAL || e == EBADF) {
    unlocked(e);
    return;
  }
  if (e != 0) {
    std::string holder(256, '\0');
    const ssize_t n = ::pread(fd_, holder.data(), holder.size(), 0);
    holder.resize(n > 0 ? static_cast<size_t>(n) : 0);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    if (e != EWOULDBLOCK) throw Error(ErrorKind::kIOError, path + ": cannot lock: " + std::strerror(e));
    throw Error(ErrorKind::kInvalidArgument, what + " is in use by another run (" + (holder.empty() ? "" : holder + ", ") +
                                                 "lock " + path + "): " + advice);
  }
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  const std::string me = "pid " + std::to_string(::getpid()) + " on host " + host + "\n";
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, me.data(), me.size(), 0);  // informational only
}

HeldLock::~HeldLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

void file_write_atomic(const std::string& path, const void* data, size_t bytes) {
  AtomicFile f(path);
  f.append(data, bytes);
  f.commit();
}

namespace {

// The live AtomicFiles' temporaries (remove_live_temporaries).
std::mutex g_live_mu;
std::vector<std::string>* g_live = new std::vector<std::string>;  // never freed: a handler may read it at exit

void live_remove(const std::string& tmp) noexcept {
  std::lock_guard<std::mutex> l(g_live_mu);
  auto it = std::find(g_live->begin(), g_live->end(), tmp);
  if (it != g_live->end()) g_live->erase(it);
}

}  // namespace

void remove_live_temporaries() noexcept {
  for (int attempt = 0; attempt < 50; ++attempt) {
    if (g_live_mu.try_lock()) {
      for (const std::string& t : *g_live) ::unlink(t.c_str());
      g_live->clear();
      g_live_mu.unlock();
      return;
    }
    struct timespec ts{0, 2'000'000};  // 2 ms
    ::nanosleep(&ts, nullptr);
  }
}

// NOTE: the temporary's name is the writer's own (mkostemp: PATH.tmp.XXXXXX, created exclusively).
// A fixed PATH.tmp let two writers of one path (two runs saving the same file, two ranks of a job
// writing one cache) truncate and interleave into one file; the first rename published the mix and
// the second failed. Now each renames a whole file of its own over PATH: the last one wins, whole.
AtomicFile::AtomicFile(const std::string& path) : path_(path) {
  std::string name = path + ".tmp.XXXXXX";
  {
    // Created and registered under the registry's lock: a stop signal between the two found the
    // file on disk but not in the registry, and left it (a CI run under load: export stopped by
    // SIGTERM kept its model.safetensors.tmp.XXXXXX). The handler waits for the lock.
    std::lock_guard<std::mutex> l(g_live_mu);
    fd_ = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd_ >= 0) g_live->push_back(name);
  }
  MT_CHECK(fd_ >= 0, ErrorKind::kIOError, path + ".tmp: " + std::strerror(errno));
  tmp_ = name;
  (void)::flock(fd_, LOCK_EX | LOCK_NB);  // a live writer's (remove_dead_temporaries); released at close
  if (::fchmod(fd_, 0644) != 0) {  // mkostemp's 0600, widened to what an open() with 0644 gave
    const int e = errno;
    ::close(fd_);
    ::unlink(tmp_.c_str());
    live_remove(tmp_);
    fd_ = -1;
    throw Error(ErrorKind::kIOError, tmp_ + ": " + std::strerror(e));
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
  if (!tmp_.empty()) live_remove(tmp_);
}

void AtomicFile::append(const void* data, size_t bytes) {
  MT_CHECK(fd_ >= 0, ErrorKind::kInvalidArgument, path_ + ": committed already, or its write failed");
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {  // the temporary goes at once: a part of the file is never committed
      const int e = n < 0 ? errno : ENOSPC;
      ::close(fd_);
      ::unlink(tmp_.c_str());
      fd_ = -1;
      throw Error(ErrorKind::kIOError, path_ + ": cannot write: " + std::strerror(e));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFile::sync() {
  MT_CHECK(fd_ >= 0, ErrorKind::kInvalidArgument, path_ + ": committed already, or its write failed");
  if (synced_) return;
  if (::fsync(fd_) != 0) {  // a full disk often shows only here
    const int e = errno;
    ::close(fd_);
    ::unlink(tmp_.c_str());
    fd_ = -1;
    throw Error(ErrorKind::kIOError, path_ + ": cannot write: " + std::strerror(e));
  }
  synced_ = true;
}

void AtomicFile::commit() {
  MT_CHECK(fd_ >= 0, ErrorKind::kInvalidArgument, path_ + ": committed already, or its write failed");
  int e = synced_ || ::fsync(fd_) == 0 ? 0 : errno;
  if (::close(fd_) != 0 && e == 0) e = errno;
  fd_ = -1;
  if (e != 0) {  // a full disk often shows only here
    ::unlink(tmp_.c_str());
    throw Error(ErrorKind::kIOError, path_ + ": cannot write: " + std::strerror(e));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp_.c_str());
    throw Error(ErrorKind::kIOError, path_ + ": rename failed: " + std::strerror(e));
  }
  live_remove(tmp_);  // published: nothing of this writer's to remove at a stop
  // The rename itself made durable: the directory's entry, fsynced (a crash after commit() keeps the
  // new file, not the old one or none). A directory that cannot be opened for it (no read right) is
  // left to the file system's own order.
  const size_t slash = path_.rfind('/');
  const std::string parent = slash == std::string::npos ? "." : (slash == 0 ? "/" : path_.substr(0, slash));
  const int dfd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

int remove_dead_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string prefix = target.filename().string() + ".tmp.";
  int removed = 0;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() != prefix.size() + 6 || name.compare(0, prefix.size(), prefix) != 0) continue;
    struct stat st;
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_mtime > std::time(nullptr) - 60) continue;
    const int fd = ::open(it->path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::unlink(it->path().c_str()) == 0) ++removed;  // no live writer holds it
    ::close(fd);
  }
  return removed;
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
