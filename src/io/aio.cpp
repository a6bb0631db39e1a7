#include "io/aio.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "base/fault.h"
#include "base/log.h"
#include "base/text.h"

namespace mt::io {

namespace {

[[noreturn]] void os_error(const std::string& path, const char* op, uint64_t off, size_t n, int err) {
  throw Error(ErrorKind::kIOError, path + ": " + op + " of " + std::to_string(n) + " bytes at offset " +
                                       std::to_string(off) + ": " + std::strerror(err));
}

[[noreturn]] void short_error(const std::string& path, const char* op, uint64_t off, size_t n, size_t got) {
  throw Error(ErrorKind::kIOError, path + ": short " + op + " at offset " + std::to_string(off) + ": " +
                                       std::to_string(got) + " of " + std::to_string(n) + " bytes");
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

void File::read_blocks(void* buf, size_t n, uint64_t off, const AioOptions& o) {
  char* p = static_cast<char*>(buf);
  for (size_t i = 0; i < n; i += o.block_size) read(p + i, std::min(o.block_size, n - i), off + i);
}

void File::write_blocks(const void* buf, size_t n, uint64_t off, const AioOptions& o) {
  const char* p = static_cast<const char*>(buf);
  for (size_t i = 0; i < n; i += o.block_size) write(p + i, std::min(o.block_size, n - i), off + i);
}

// ---------------------------------------------------------------------------------------------
// The real filesystem.

namespace {

// One io_uring per I/O thread, made on first use; null where the kernel refuses io_uring.
struct Ring {
  io_uring ring{};
  unsigned depth = 0;
  bool ok = false;
  ~Ring() {
    if (ok) io_uring_queue_exit(&ring);
  }
};

Ring& this_thread_ring() {
  thread_local Ring r;
  return r;
}

// Test seam (MT_FAULT=aio.second_submit_fails): the process's second io_uring_submit is refused
// (-EAGAIN) without reaching the kernel, as one the kernel refuses while earlier ones are in flight.
bool fault_submit() {
  static std::atomic<int> submits{0};
  return fault_active("aio.second_submit_fails") && submits.fetch_add(1) + 1 == 2;
}

// Test seam (MT_FAULT=aio.submit_takes_one): every submission hands the kernel all the prepared
// entries and lets it take one, as a kernel short of memory takes fewer than it is offered (the
// rest stay in the submission ring for the next io_uring_enter, as liburing's submit leaves them).
int submit(io_uring* ring) {
  if (!fault_active("aio.submit_takes_one")) return io_uring_submit(ring);
  io_uring_sq* sq = &ring->sq;
  if (sq->sqe_head != sq->sqe_tail) {  // liburing's flush of the prepared entries to the kernel's tail
    sq->sqe_head = sq->sqe_tail;
    io_uring_smp_store_release(sq->ktail, sq->sqe_tail);
  }
  return io_uring_enter(static_cast<unsigned>(ring->ring_fd), 1, 0, 0, nullptr);
}

// Test seam (MT_FAULT=aio.first_wait_fails): the process's first io_uring_wait_cqe fails (-EIO)
// without reaching the kernel, as one that fails while the transfer's requests are in flight.
bool fault_wait() {
  static std::atomic<int> waits{0};
  if (fault_active("aio.every_wait_fails")) return true;
  return fault_active("aio.first_wait_fails") && waits.fetch_add(1) == 0;
}

// Directories whose filesystem took O_DIRECT at open and refused the first aligned write
// (check_swap_dir's probe): files opened there are buffered. The probe's finding was unused, and
// the swap failed at its first write with EINVAL.
std::mutex nodirect_mu;
std::set<std::string> nodirect_dirs;
std::string dir_key(const std::string& dir) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(dir, ec);
  return ec ? dir : p.string();
}
bool direct_refused(const std::string& file) {
  const std::string key = dir_key(std::filesystem::path(file).parent_path().string());
  std::lock_guard<std::mutex> l(nodirect_mu);
  return nodirect_dirs.count(key) != 0;
}

// Test seam (MT_FAULT=aio.direct_write_refused): check_swap_dir's aligned O_DIRECT write is
// refused, as on a filesystem that takes the flag and fails the write.
bool fault_direct_write() { return fault_active("aio.direct_write_refused"); }

io_uring* thread_ring(unsigned depth) {
  Ring& r = this_thread_ring();
  if (r.ok && r.depth >= depth) return &r.ring;
  if (r.ok) io_uring_queue_exit(&r.ring), r.ok = false;
  if (io_uring_queue_init(depth, &r.ring, 0) != 0) return nullptr;
  r.ok = true;
  r.depth = depth;
  return &r.ring;
}

class PosixFile : public File {
 public:
  PosixFile(std::string path, int fd, bool direct) : path_(std::move(path)), fd_(fd), direct_(direct) {}
  ~PosixFile() override { ::close(fd_); }
  const std::string& path() const override { return path_; }
  bool direct() const override { return direct_; }

  void read(void* buf, size_t n, uint64_t off) override {
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::pread(fd_, static_cast<char*>(buf) + done, n - done, static_cast<off_t>(off + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) os_error(path_, "read", off + done, n - done, errno);
      if (r == 0) short_error(path_, "read", off, n, done);
      done += static_cast<size_t>(r);
    }
  }
  void write(const void* buf, size_t n, uint64_t off) override {
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::pwrite(fd_, static_cast<const char*>(buf) + done, n - done, static_cast<off_t>(off + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) os_error(path_, "write", off + done, n - done, errno);
      if (r == 0) short_error(path_, "write", off, n, done);
      done += static_cast<size_t>(r);
    }
  }
  void read_blocks(void* buf, size_t n, uint64_t off, const AioOptions& o) override {
    transfer(false, static_cast<char*>(buf), n, off, o);
  }
  void write_blocks(const void* buf, size_t n, uint64_t off, const AioOptions& o) override {
    transfer(true, const_cast<char*>(static_cast<const char*>(buf)), n, off, o);
  }

 private:
  // Up to queue_depth requests of block_size in flight on this thread's ring. A request the kernel
  // completes short is finished by read/write (which name a true short transfer). On an error the
  // requests in flight are reaped before throwing: the kernel must not write a freed buffer.
  void transfer(bool writing, char* buf, size_t n, uint64_t off, const AioOptions& o) {
    const unsigned depth = static_cast<unsigned>(std::max(1, o.queue_depth));
    io_uring* ring = thread_ring(depth);
    if (ring == nullptr) {
      if (writing) File::write_blocks(buf, n, off, o);
      else File::read_blocks(buf, n, off, o);
      return;
    }
    struct Req {
      size_t at = 0, len = 0;
    };
    std::vector<Req> reqs((n + o.block_size - 1) / o.block_size);
    for (size_t i = 0; i < reqs.size(); ++i) reqs[i] = {i * o.block_size, std::min(o.block_size, n - i * o.block_size)};
    size_t next = 0;
    unsigned inflight = 0;     // taken by the kernel: each completes
    unsigned unsubmitted = 0;  // prepared in the ring, not yet taken
    bool drop_ring = false;    // the ring holds entries that must never be submitted
    int first_err = 0;
    size_t err_at = 0;
    int wait_failures = 0;  // io_uring_wait_cqe failures in a row
    std::vector<Req> partial;
    // Until every request is taken and done: prepared entries the kernel has not taken yet keep the
    // loop going too (it ended with one left when the last taken one completed, and returned with
    // that block never transferred; the thread's next transfer submitted it, into freed requests).
    while (((next < reqs.size() || unsubmitted > 0) && first_err == 0) || inflight > 0) {
      while (first_err == 0 && next < reqs.size() && inflight + unsubmitted < depth && !(o.single_submit && unsubmitted > 0)) {
        io_uring_sqe* sqe = io_uring_get_sqe(ring);
        if (sqe == nullptr) break;
        Req& r = reqs[next++];
        if (writing) io_uring_prep_write(sqe, fd_, buf + r.at, static_cast<unsigned>(r.len), off + r.at);
        else io_uring_prep_read(sqe, fd_, buf + r.at, static_cast<unsigned>(r.len), off + r.at);
        io_uring_sqe_set_data(sqe, &r);
        ++unsubmitted;
      }
      if (first_err == 0 && next < reqs.size() && inflight + unsubmitted == 0) {  // no entry to be had
        first_err = EBUSY, err_at = 0;
        drop_ring = true;
      }
      if (unsubmitted > 0) {
        // The kernel may take fewer than offered (short of memory): the rest stay in the ring and
        // are offered again after a completion. An error takes none, and those entries stay in the
        // ring: with requests still in flight it was kept, and the thread's next transfer submitted
        // them, pointing into this call's freed requests and its caller's buffer. Now the ring is
        // made anew once this call's requests are reaped.
        const int s = fault_submit() ? -EAGAIN : submit(ring);
        const unsigned took = s < 0 ? 0 : std::min(static_cast<unsigned>(s), unsubmitted);
        inflight += took;
        unsubmitted -= took;
        if (s < 0 || (took == 0 && inflight == 0)) {  // refused, or nothing to wait for and none taken
          if (first_err == 0) first_err = s < 0 ? -s : EAGAIN, err_at = 0;
          unsubmitted = 0;
          drop_ring = true;
        }
      }
      if (inflight == 0) continue;
      io_uring_cqe* cqe = nullptr;
      int w = fault_wait() ? -EIO : io_uring_wait_cqe(ring, &cqe);
      if (w == -EINTR) continue;
      if (w < 0) {
        // A failed wait still has the transfer's requests in flight. It threw at once: their
        // completions stayed in the thread's ring and the next transfer took them for its own (a
        // pointer into this call's freed requests; it returned before its writes were done). The
        // error is kept, the requests are reaped, and the ring is made anew. A wait that keeps
        // failing cannot reap them, and the kernel may still complete them into the caller's
        // buffers: returning or throwing would let the caller free or reuse those, so the process
        // ends here, saying why (the checkpoints on disk are not this transfer's).
        if (first_err == 0) first_err = -w, err_at = 0;
        drop_ring = true;
        if (++wait_failures < 8) continue;
        std::fprintf(stderr,
                     "error: %s: %s of %zu bytes at offset %llu: waiting for %u io_uring request(s) in flight failed 8 "
                     "times (%s); ending the process, as the kernel may still write this transfer's buffers\n",
                     path_.c_str(), writing ? "write" : "read", n, static_cast<unsigned long long>(off), inflight,
                     std::strerror(-w));
        std::fflush(stderr);
        std::_Exit(1);
      }
      wait_failures = 0;
      Req* r = static_cast<Req*>(io_uring_cqe_get_data(cqe));
      const int res = cqe->res;
      io_uring_cqe_seen(ring, cqe);
      --inflight;
      if (res < 0) {
        if (first_err == 0) first_err = -res, err_at = r->at;
      } else if (static_cast<size_t>(res) < r->len) {
        partial.push_back({r->at + static_cast<size_t>(res), r->len - static_cast<size_t>(res)});
      }
    }
    if (unsubmitted > 0) drop_ring = true;  // an error left entries in the ring: never to be submitted
    if (drop_ring) {
      Ring& r = this_thread_ring();
      io_uring_queue_exit(&r.ring);
      r.ok = false;
    }
    if (first_err != 0) os_error(path_, writing ? "write" : "read", off + err_at, n - err_at, first_err);
    for (const Req& r : partial) {  // the rest of a short completion, or the real short transfer
      if (writing) write(buf + r.at, r.len, off + r.at);
      else read(buf + r.at, r.len, off + r.at);
    }
  }

  std::string path_;
  int fd_;
  bool direct_;
};

class PosixEnv : public Env {
 public:
  const char* name() const override { return "posix"; }
  std::unique_ptr<File> open(const std::string& path) override {
    bool direct = !direct_refused(path);
    int fd = direct ? ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600) : -1;
    if (!direct || (fd < 0 && errno == EINVAL)) {  // no O_DIRECT there (tmpfs): the page cache it is
      direct = false;
      std::call_once(warned_, [&] {
        log_warning(path + ": the filesystem does not support O_DIRECT; swapping through the page cache");
      });
      fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    }
    if (fd < 0) throw Error(ErrorKind::kIOError, path + ": cannot open for swapping: " + std::strerror(errno));
    return std::make_unique<PosixFile>(path, fd, direct);
  }

 private:
  std::once_flag warned_;
};

// ---------------------------------------------------------------------------------------------
// In memory.

class MemFile : public File {
 public:
  MemFile(std::string path, std::shared_ptr<std::vector<char>> bytes, std::shared_ptr<std::mutex> mu)
      : path_(std::move(path)), bytes_(std::move(bytes)), mu_(std::move(mu)) {}
  const std::string& path() const override { return path_; }
  void read(void* buf, size_t n, uint64_t off) override {
    std::lock_guard<std::mutex> l(*mu_);
    size_t have = off >= bytes_->size() ? 0 : std::min(n, bytes_->size() - off);
    if (have > 0) std::memcpy(buf, bytes_->data() + off, have);
    if (have < n) short_error(path_, "read", off, n, have);
  }
  void write(const void* buf, size_t n, uint64_t off) override {
    std::lock_guard<std::mutex> l(*mu_);
    if (bytes_->size() < off + n) bytes_->resize(off + n);
    std::memcpy(bytes_->data() + off, buf, n);
  }

 private:
  std::string path_;
  std::shared_ptr<std::vector<char>> bytes_;
  std::shared_ptr<std::mutex> mu_;
};

class MemEnv : public Env {
 public:
  const char* name() const override { return "memory"; }
  std::unique_ptr<File> open(const std::string& path) override {
    std::lock_guard<std::mutex> l(mu_);
    auto& f = files_[path];
    if (!f) f = std::make_shared<std::vector<char>>();
    return std::make_unique<MemFile>(path, f, file_mu_);
  }

 private:
  std::mutex mu_;
  std::shared_ptr<std::mutex> file_mu_ = std::make_shared<std::mutex>();
  std::map<std::string, std::shared_ptr<std::vector<char>>> files_;
};

// ---------------------------------------------------------------------------------------------
// Faults.

struct FaultState {
  Faults f;
  std::mutex mu;
  int64_t reads = 0, writes = 0, written = 0;
};

class FaultFile : public File {
 public:
  FaultFile(std::unique_ptr<File> inner, std::shared_ptr<FaultState> s) : inner_(std::move(inner)), s_(std::move(s)) {}
  const std::string& path() const override { return inner_->path(); }
  bool direct() const override { return inner_->direct(); }
  void read(void* buf, size_t n, uint64_t off) override {
    int64_t k;
    {
      std::lock_guard<std::mutex> l(s_->mu);
      k = ++s_->reads;
    }
    if (k == s_->f.eio_read_at) os_error(path(), "read", off, n, EIO);
    if (k == s_->f.short_read_at) {
      inner_->read(buf, n / 2, off);
      short_error(path(), "read", off, n, n / 2);
    }
    inner_->read(buf, n, off);
  }
  void write(const void* buf, size_t n, uint64_t off) override {
    int64_t k;
    bool full;
    {
      std::lock_guard<std::mutex> l(s_->mu);
      k = ++s_->writes;
      full = s_->f.enospc_after_bytes >= 0 && s_->written + static_cast<int64_t>(n) > s_->f.enospc_after_bytes;
      if (!full) s_->written += static_cast<int64_t>(n);
    }
    if (k == s_->f.eio_write_at) os_error(path(), "write", off, n, EIO);
    if (full) os_error(path(), "write", off, n, ENOSPC);
    if (k == s_->f.short_write_at) {
      inner_->write(buf, n / 2, off);
      short_error(path(), "write", off, n, n / 2);
    }
    inner_->write(buf, n, off);
  }

 private:
  std::unique_ptr<File> inner_;
  std::shared_ptr<FaultState> s_;
};

class FaultEnv : public Env {
 public:
  FaultEnv(Env& inner, const Faults& f) : inner_(inner), s_(std::make_shared<FaultState>()) { s_->f = f; }
  const char* name() const override { return "fault"; }
  std::unique_ptr<File> open(const std::string& path) override {
    return std::make_unique<FaultFile>(inner_.open(path), s_);
  }

 private:
  Env& inner_;
  std::shared_ptr<FaultState> s_;
};

}  // namespace

Env& posix_env() {
  static PosixEnv env;
  return env;
}

bool io_uring_available() {
  static const bool ok = [] {
    io_uring r;
    if (io_uring_queue_init(2, &r, 0) != 0) return false;
    io_uring_queue_exit(&r);
    return true;
  }();
  return ok;
}

unsigned thread_ring_unreaped() {
  Ring& r = this_thread_ring();
  return r.ok ? io_uring_cq_ready(&r.ring) : 0;
}

std::unique_ptr<Env> memory_env() { return std::make_unique<MemEnv>(); }

std::unique_ptr<Env> fault_env(Env& inner, const Faults& faults) { return std::make_unique<FaultEnv>(inner, faults); }

namespace {

// The swap directories this process holds (by dir_key), for its later checks of one to share.
std::mutex leases_mu;
std::map<std::string, std::weak_ptr<const int>> leases;

// An exclusive flock of dir for as long as the result lives; this process's earlier one where it
// still lives. A directory that cannot be opened or locked (a filesystem without flock) is not.
std::shared_ptr<const int> lease_swap_dir(const std::string& dir) {
  std::lock_guard<std::mutex> l(leases_mu);
  const std::string key = dir_key(dir);
  if (auto held = leases[key].lock()) return held;
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    ::close(fd);
    if (e != EWOULDBLOCK) return nullptr;
    throw Error(ErrorKind::kIOError,
                dir + ": another process is swapping in this directory (a run given the same nvme_path on this host, "
                      "whose swap files this one would open as its own); give each run its own nvme_path");
  }
  std::shared_ptr<const int> lease(new int(fd), [](const int* p) {
    ::close(*p);  // releases the flock
    delete p;
  });
  leases[key] = lease;
  return lease;
}

}  // namespace

DirCheck check_swap_dir(const std::string& dir, uint64_t need_bytes, const std::vector<SwapFile>& files, bool hold) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  MT_CHECK(!ec && fs::is_directory(dir), ErrorKind::kIOError, dir + ": cannot create the swap directory: " + ec.message());
  std::shared_ptr<const int> lease = hold ? lease_swap_dir(dir) : nullptr;  // before its files are touched
  // Unlinked, not truncated: a process still holding one keeps its own copy.
  for (const SwapFile& f : files)
    MT_CHECK(::unlink((fs::path(dir) / f.name).c_str()) == 0 || errno == ENOENT, ErrorKind::kIOError,
             (fs::path(dir) / f.name).string() + ": cannot remove the previous run's swap file: " + std::strerror(errno));
  DirCheck c;
  c.lease = std::move(lease);
  const std::string probe = (fs::path(dir) / ".meshtrain-probe").string();
  int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  c.direct = fd >= 0;
  if (fd < 0) fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw Error(ErrorKind::kIOError, dir + ": the swap directory is not writable: " + std::strerror(errno));
  if (c.direct) {  // some filesystems accept the flag and refuse the first aligned write
    AlignedBuffer b(kAlign, MemCategory::kWorkspace);
    c.direct = !fault_direct_write() && ::pwrite(fd, b.data(), kAlign, 0) == static_cast<ssize_t>(kAlign);
    if (!c.direct) {
      std::lock_guard<std::mutex> l(nodirect_mu);
      nodirect_dirs.insert(dir_key(dir));
    }
  }
  ::close(fd);
  ::unlink(probe.c_str());
  struct statvfs st{};
  if (::statvfs(dir.c_str(), &st) == 0) c.free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  // (in KiB under a MiB: "needs 0 MiB, has 0 MiB free" was said of 584 KiB and 440 KiB, stop 73)
  MT_CHECK(c.free_bytes >= need_bytes, ErrorKind::kIOError,
           dir + ": the swap needs " + kib_or_mib(need_bytes) + ", the filesystem has " + kib_or_mib(c.free_bytes) +
               " free (after this run's other swap files, and any an earlier run left in other directories there)");
  std::vector<std::string> reserved;  // removed again where a later one cannot be
  auto unreserve = [&reserved] {
    for (const std::string& p : reserved) ::unlink(p.c_str());
  };
  for (const SwapFile& f : files) {
    if (f.bytes == 0) continue;
    const std::string path = (fs::path(dir) / f.name).string();
    const int wfd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (wfd < 0) {
      const int e = errno;
      unreserve();
      throw Error(ErrorKind::kIOError, path + ": cannot create the swap file: " + std::strerror(e));
    }
    reserved.push_back(path);
    int rc;
    // Test seams: the file system full at the first file's reservation, or at the second's.
    const bool full = fault_active("aio.reserve_full") || (fault_active("aio.reserve_full_second") && reserved.size() == 2);
    while ((rc = full ? (errno = ENOSPC, -1) : ::fallocate(wfd, 0, 0, static_cast<off_t>(f.bytes))) != 0 && errno == EINTR) {
    }
    const int e = rc == 0 ? 0 : errno;
    ::close(wfd);
    if (e == 0 || e == EOPNOTSUPP || e == ENOSYS) continue;  // reserved, or not a filesystem that reserves
    uint64_t left = 0;  // before this check's own reservations are given back
    if (::statvfs(dir.c_str(), &st) == 0) left = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
    unreserve();
    throw Error(ErrorKind::kIOError, path + ": cannot reserve the swap's " + std::to_string(f.bytes >> 20) + " MiB (" +
                                         std::strerror(e) + "; " + std::to_string(left >> 20) +
                                         " MiB free now: other processes on this host, such as a run's other ranks, "
                                         "reserved theirs there)");
  }
  return c;
}

Bandwidth bandwidth_probe(const std::string& dir, uint64_t bytes, const AioOptions& options, size_t chunk) {
  chunk = align_up(std::max<size_t>(chunk, options.block_size));
  const uint64_t n = std::max<uint64_t>(1, bytes / chunk);
  DirCheck c = check_swap_dir(dir, n * chunk);
  const std::string path = (std::filesystem::path(dir) / ".meshtrain-io-probe").string();
  Bandwidth bw;
  {
    auto f = posix_env().open(path);
    bw.direct = f->direct();
    AlignedBuffer buf[2] = {AlignedBuffer(chunk, MemCategory::kWorkspace), AlignedBuffer(chunk, MemCategory::kWorkspace)};
    // Data a virtual disk's host can neither compress nor deduplicate: random bytes, and every
    // 4 KiB block stamped with its chunk and block before it is written (a repeated pattern read
    // back faster than the swap's own records did).
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (auto& b : buf)
      for (size_t i = 0; i + 8 <= chunk; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        *reinterpret_cast<uint64_t*>(b.as<char>() + i) = x;
      }
    auto stamp = [chunk](void* p, uint64_t k) {
      for (size_t i = 0; i + 16 <= chunk; i += 4096) {
        auto* w = reinterpret_cast<uint64_t*>(static_cast<char*>(p) + i);
        w[0] = k;
        w[1] = i ^ 0xA5A5A5A5A5A5A5A5ull;
      }
    };
    AsyncIo io(options);
    auto pass = [&](bool writing) {
      AsyncIo::Ticket t[2] = {0, 0};
      const double t0 = now();
      for (uint64_t k = 0; k < n; ++k) {
        const int s = static_cast<int>(k % 2);
        if (t[s] != 0) io.wait(t[s]);
        if (writing) stamp(buf[s].data(), k);
        t[s] = writing ? io.write(*f, buf[s].data(), chunk, k * chunk) : io.read(*f, buf[s].data(), chunk, k * chunk);
      }
      for (auto x : t)
        if (x != 0) io.wait(x);
      if (writing && !bw.direct) {  // buffered: the write ends on the disk
        int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd >= 0) ::fdatasync(fd), ::close(fd);
      }
      return static_cast<double>(n * chunk) / (now() - t0) / 1e9;
    };
    bw.write_gbs = pass(true);
    bw.read_gbs = pass(false);
    if (n >= 2) {  // the first half read while the second is written, on two threads
      AioOptions mo = options;
      mo.thread_count = std::max(2, options.thread_count);
      AsyncIo mio(mo);
      AlignedBuffer rbuf(chunk, MemCategory::kWorkspace);
      const uint64_t half = n / 2;
      AsyncIo::Ticket tr = 0, tw = 0;
      const double t0 = now();
      for (uint64_t k = 0; k < half; ++k) {
        if (tr != 0) mio.wait(tr);
        if (tw != 0) mio.wait(tw);
        tr = mio.read(*f, rbuf.data(), chunk, k * chunk);
        stamp(buf[0].data(), n + k);  // not the bytes the write pass left there
        tw = mio.write(*f, buf[0].data(), chunk, (half + k) * chunk);
      }
      mio.wait(tr);
      mio.wait(tw);
      bw.mixed_gbs = static_cast<double>(2 * half * chunk) / (now() - t0) / 1e9;
    }
  }
  std::filesystem::remove(path);
  (void)c;
  return bw;
}

// Whole pages are taken as they are (the Allocator starts blocks of a page or more on a page);
// any other size gets a page of pad to align it.
AlignedBuffer::AlignedBuffer(size_t bytes, MemCategory category, bool zero) : bytes_(bytes) {
  const size_t raw = bytes > 0 && bytes % kAlign == 0 ? bytes : bytes + kAlign;
  raw_ = zero ? Buffer(raw, category) : Buffer::uninitialized(raw, category);
  auto a = reinterpret_cast<uintptr_t>(raw_.data());
  p_ = reinterpret_cast<void*>((a + kAlign - 1) / kAlign * kAlign);
  MT_CHECK(raw_.bytes() != bytes || p_ == raw_.data(), ErrorKind::kInternal, "AlignedBuffer: a block of whole pages off a page");
}

// ---------------------------------------------------------------------------------------------
// The engine.

struct AsyncIo::Impl {
  struct Job {
    Ticket t;
    bool writing;
    File* f;
    char* buf;
    size_t n;
    uint64_t off;
  };
  struct Done {
    bool done = false;
    std::string error;
    ErrorKind kind = ErrorKind::kIOError;
  };
  AioOptions opts;
  std::mutex mu;
  std::condition_variable cv_work, cv_done;
  std::deque<Job> queue;
  std::unordered_map<Ticket, Done> state;  // issued and not yet waited for
  Ticket next = 1;
  bool stop = false;
  Stats stats;
  std::vector<std::thread> threads;

  void run() {
    for (;;) {
      Job j;
      {
        std::unique_lock<std::mutex> l(mu);
        cv_work.wait(l, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;
        j = queue.front();
        queue.pop_front();
      }
      std::string err;
      ErrorKind kind = ErrorKind::kIOError;
      const double t0 = now();
      try {
        if (j.writing) j.f->write_blocks(j.buf, j.n, j.off, opts);
        else j.f->read_blocks(j.buf, j.n, j.off, opts);
      } catch (const Error& e) {
        err = e.what(), kind = e.kind();
      } catch (const std::exception& e) {
        err = e.what();
      }
      const double dt = now() - t0;
      std::lock_guard<std::mutex> l(mu);
      if (j.writing) stats.bytes_written += err.empty() ? j.n : 0, stats.write_seconds += dt;
      else stats.bytes_read += err.empty() ? j.n : 0, stats.read_seconds += dt;
      Done& d = state[j.t];
      d.done = true;
      d.error = std::move(err);
      d.kind = kind;
      cv_done.notify_all();
    }
  }

  Ticket submit(bool writing, File& f, const void* buf, size_t n, uint64_t off) {
    if (f.direct())
      MT_CHECK(reinterpret_cast<uintptr_t>(buf) % kAlign == 0 && n % kAlign == 0 && off % kAlign == 0,
               ErrorKind::kInternal, f.path() + ": an O_DIRECT transfer that is not 4 KiB-aligned");
    std::lock_guard<std::mutex> l(mu);
    Ticket t = next++;
    state[t];
    queue.push_back({t, writing, &f, const_cast<char*>(static_cast<const char*>(buf)), n, off});
    cv_work.notify_one();
    return t;
  }

  void wait(Ticket t) {
    const double t0 = now();
    std::unique_lock<std::mutex> l(mu);
    auto it = state.find(t);
    MT_CHECK(it != state.end(), ErrorKind::kInternal, "AsyncIo: a ticket waited for twice or never issued");
    cv_done.wait(l, [&] { return it->second.done; });
    Done d = std::move(it->second);
    state.erase(it);
    stats.wait_seconds += now() - t0;
    if (!d.error.empty()) throw Error(d.kind, d.error);
  }
};

AsyncIo::AsyncIo(const AioOptions& options) : opts_(options), impl_(std::make_unique<Impl>()) {
  MT_CHECK(opts_.block_size >= kAlign && opts_.block_size % kAlign == 0, ErrorKind::kInvalidArgument,
           "aio.block_size must be a positive multiple of 4096 bytes (got " + std::to_string(opts_.block_size) + ")");
  MT_CHECK(opts_.queue_depth >= 1 && opts_.thread_count >= 1, ErrorKind::kInvalidArgument,
           "aio.queue_depth and aio.thread_count must be at least 1");
  impl_->opts = opts_;
  for (int i = 0; i < opts_.thread_count; ++i) impl_->threads.emplace_back([this] { impl_->run(); });
}

AsyncIo::~AsyncIo() {
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->stop = true;  // the threads finish the queue first: no buffer is left to a transfer
  }
  impl_->cv_work.notify_all();
  for (std::thread& t : impl_->threads) t.join();
}

AsyncIo::Ticket AsyncIo::read(File& f, void* buf, size_t n, uint64_t off) { return impl_->submit(false, f, buf, n, off); }
AsyncIo::Ticket AsyncIo::write(File& f, const void* buf, size_t n, uint64_t off) { return impl_->submit(true, f, buf, n, off); }
void AsyncIo::wait(Ticket t) { impl_->wait(t); }

void AsyncIo::wait_all() {
  std::vector<Ticket> ts;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    for (auto& [t, d] : impl_->state) ts.push_back(t);
  }
  std::sort(ts.begin(), ts.end());
  std::string first;
  ErrorKind kind = ErrorKind::kIOError;
  for (Ticket t : ts) {
    try {
      impl_->wait(t);
    } catch (const Error& e) {
      if (first.empty()) first = e.what(), kind = e.kind();
    }
  }
  if (!first.empty()) throw Error(kind, first);
}

AsyncIo::Stats AsyncIo::stats() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->stats;
}

void AsyncIo::reset_stats() {
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->stats = {};
}

}  // namespace mt::io
