// File I/O seam: whole-file reads and atomic whole-file writes (temp, fsync, rename), each failure an
// Error naming the path.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace mt {

std::vector<char> file_read_all(const std::string& path);
// Writes data to path atomically: a reader sees the old file or the whole new one, never a part.
void file_write_atomic(const std::string& path, const void* data, size_t bytes);
bool file_exists(const std::string& path);

// file_write_atomic in parts: a temporary of the writer's own beside path (path.tmp.XXXXXX) is
// written by append(), then commit() fsyncs it, renames it over path and fsyncs the directory.
// Destroyed without commit (an error on the way), the temporary is removed. Two writers of one path
// at once each publish a whole file; the last rename wins.
// While it is written the temporary holds an exclusive flock, so that remove_dead_temporaries
// can tell a live writer's from one whose process died before its rename.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void append(const void* data, size_t bytes);
  // The temporary's bytes on disk (fsync), without publishing it; commit() then only renames. A
  // pair of files published together syncs both before either is renamed.
  void sync();
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool synced_ = false;
};

// Removes the temporaries of path (path.tmp.XXXXXX) whose writer died before its rename (killed,
// crashed): those older than a minute that no live AtomicFile holds locked. A writer whose temporary
// name is fixed overwrote the last run's; these are the writer's own, and would pile up. Returns
// how many it removed; never throws (a leftover it cannot remove stays).
int remove_dead_temporaries(const std::string& path);

// Removes the temporaries of the AtomicFiles alive now, for a stop signal's handler on the signal
// thread (base/signals.h) just before the process exits: a command stopped mid-write (tokenize,
// export) left its PATH.tmp.XXXXXX behind. Where the registry is busy a few short tries, then
// nothing (remove_dead_temporaries takes the rest later). Never throws.
void remove_live_temporaries() noexcept;

// A flock of the directory holding `path`, for files that belong together (an indexed dataset's
// .bin and .idx): a writer holds it exclusively while it renames its pair into place, a reader
// shared while it opens the pair, so that two writers' renames do not interleave (one's .bin with
// the other's .idx) and a reader never opens one writer's half with another's. Best effort: where
// the directory cannot be opened (no read permission), there is no lock and no error.
class DirectoryLock {
 public:
  DirectoryLock(const std::string& path, bool exclusive);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

// An exclusive flock of the lock file `path` (created), held for the object's life: the kernel
// releases it when the process ends, killed or not. Who holds it ("pid N on host H") is written in
// the file. Where a live process holds it, throws kInvalidArgument: "<what> is in use by another
// run (pid N on host H, lock <path>)" and `advice`. Where the file cannot be created, throws
// kIOError naming it. Where it cannot be held (a file system without locks: ENOLCK, ENOSYS,
// EOPNOTSUPP, EINVAL, EBADF; another user's lock file this user cannot write), one warning line and
// no lock. A lock file it creates is writable by all (the next run may be another user's).
class HeldLock {
 public:
  HeldLock(const std::string& path, const std::string& what, const std::string& advice);
  ~HeldLock();
  HeldLock(const HeldLock&) = delete;
  HeldLock& operator=(const HeldLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace mt

namespace mt {

// The process's peak resident set (VmHWM of /proc/self/status), bytes; 0 where unknown.
size_t process_peak_rss_bytes();
// The process's resident set now (VmRSS), bytes; 0 where unknown.
size_t process_rss_bytes();

// Removes the temporaries of path (path.tmp.XXXXXX) whose writer died before its rename (killed,
// crashed): those older than a minute that no live AtomicFile holds locked. A writer whose temporary
// name is fixed overwrote the last run's; these are the writer's own, and would pile up. Returns
// how many it removed; never throws (a leftover it cannot remove stays).
int remove_dead_temporaries(const std::string& path);

}  // namespace mt
