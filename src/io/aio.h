// Swap I/O for ZeRO-Infinity (../shared/DESIGN.md decision 10): an Env-style seam over files
// (the real disk with O_DIRECT and io_uring, an in-memory fake, a fault-injecting fake) and an
// asynchronous engine that moves large buffers between memory and those files in blocks, several
// in flight, on its own threads, so the optimizer computes while its state streams.
//
// DeepSpeed's `aio` block maps onto AioOptions: block_size (bytes per request), queue_depth
// (requests in flight per thread), thread_count (I/O threads), single_submit (one request per
// submission), overlap_events (submit the next requests before reaping: always, with
// overlap_events true). Every failure is an Error (kIOError) naming the file, the operation, the
// offset and the OS's reason; a short transfer is an error, never a silent partial buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/allocator.h"

namespace mt::io {

// O_DIRECT needs buffers, offsets and lengths aligned to the device's logical block; 4 KiB covers
// every disk we meet.
constexpr size_t kAlign = 4096;
inline size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct AioOptions {
  size_t block_size = 1 << 20;  // DeepSpeed's default 1 MiB
  int queue_depth = 8;
  int thread_count = 1;
  bool single_submit = false;
  bool overlap_events = true;
};

// An open swap file, read and written at offsets. read/write are blocking and whole: they transfer
// exactly n bytes or throw.
class File {
 public:
  virtual ~File() = default;
  virtual const std::string& path() const = 0;
  // Whether the file bypasses the page cache (O_DIRECT): then buf, off and n are kAlign-aligned.
  virtual bool direct() const { return false; }
  virtual void read(void* buf, size_t n, uint64_t off) = 0;
  virtual void write(const void* buf, size_t n, uint64_t off) = 0;
  // The same, cut into `block` bytes with up to `depth` requests in flight where the file can
  // (io_uring); the default is a loop of read/write.
  virtual void read_blocks(void* buf, size_t n, uint64_t off, const AioOptions& o);
  virtual void write_blocks(const void* buf, size_t n, uint64_t off, const AioOptions& o);
};

// Where files come from.
class Env {
 public:
  virtual ~Env() = default;
  virtual const char* name() const = 0;
  // Opens path read-write, creating it (its size is whatever was written before).
  virtual std::unique_ptr<File> open(const std::string& path) = 0;
};

// The real filesystem: O_DIRECT where the filesystem takes it (a buffered fallback with one log
// line where it does not, e.g. tmpfs), io_uring for block transfers (pread/pwrite when the kernel
// refuses io_uring).
Env& posix_env();
// Whether this kernel lets the process use io_uring (else pread/pwrite on the I/O threads).
bool io_uring_available();
// Completions waiting in the calling thread's io_uring that no transfer has reaped (tests: a
// transfer leaves none of its own behind, even one that failed).
unsigned thread_ring_unreaped();
// Files held in memory (tests: offload logic without a disk).
std::unique_ptr<Env> memory_env();

// Faults injected into another Env's files (tests). Operations are counted over all files, from 1.
struct Faults {
  int64_t eio_read_at = -1;   // the n-th read fails with EIO
  int64_t eio_write_at = -1;  // the n-th write fails with EIO
  int64_t short_read_at = -1;   // the n-th read returns half the bytes (as at EOF)
  int64_t short_write_at = -1;  // the n-th write stores half and reports it (a full disk's first sign)
  int64_t enospc_after_bytes = -1;  // writes beyond this many bytes in all fail with ENOSPC
};
std::unique_ptr<Env> fault_env(Env& inner, const Faults& faults);

// What a swap directory can do: checked before a run writes to it.
struct DirCheck {
  bool direct = false;      // O_DIRECT works there
  uint64_t free_bytes = 0;  // statvfs: available to this user
  // With `hold`: an exclusive flock of dir, held while any copy lives: a swap keeps its DirCheck for
  // as long as it swaps there. This process's checks of one directory share it.
  std::shared_ptr<const int> lease;
};
// A swap's own file in its directory, and the bytes it will hold.
struct SwapFile {
  std::string name;
  uint64_t bytes = 0;
};
// Creates dir if needed; throws naming dir when it cannot be created or written, when another
// process holds it (two runs given one nvme_path on a host opened each other's files and trained on
// them), or when need_bytes exceed its free space. The `files` (this swap's own, which it writes
// anew) are removed first: a previous run's left them, and they counted against the space their
// successor needs (a run that fit its disk could not be resumed). Then each is created with its
// bytes reserved (fallocate): the ranks of a host that swap to one filesystem each found it had room
// for their own swap, and together ran out of it mid-run; now the rank that finds no room left after
// the others' reservations says so at start, and removes the files it reserved. A filesystem
// without fallocate keeps the check alone; a copy-on-write one (btrfs, ZFS) may still run out
// where later writes need new blocks.
// `hold`: a swap's check, which takes the lease (a probe of the directory's speed, which every rank
// of `launch -n N -- calibrate --io DIR` runs on one directory, does not).
DirCheck check_swap_dir(const std::string& dir, uint64_t need_bytes, const std::vector<SwapFile>& files = {},
                        bool hold = false);

// The disk's sequential write and read bandwidth under dir, measured as fio would with direct I/O:
// a file of `bytes` written then read in `chunk`-byte transfers, two in flight, each cut into
// options.block_size requests, options.queue_depth of them in flight per thread. The file is
// removed after. direct: whether O_DIRECT was used (false on filesystems without it). The bytes
// are random, each 4 KiB block unique. A virtual disk's host may cache recent blocks: the read pass
// starts at the file's oldest bytes, so a probe as large as the swap's working set reads what the
// swap would find cold (docs/PERF.md (j)).
struct Bandwidth {
  double write_gbs = 0, read_gbs = 0;  // 1e9 bytes per second
  // Reading one half of the file while writing the other (what a pipelined swap does): bytes
  // read plus written per second.
  double mixed_gbs = 0;
  bool direct = false;
};
Bandwidth bandwidth_probe(const std::string& dir, uint64_t bytes, const AioOptions& options, size_t chunk = 64 << 20);

// A kAlign-aligned, accounted buffer (O_DIRECT's requirement).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(size_t bytes, MemCategory category, bool zero = true);  // zero false: Buffer::uninitialized
  void* data() const { return p_; }
  template <class T>
  T* as() const { return static_cast<T*>(p_); }
  size_t size() const { return bytes_; }

 private:
  Buffer raw_;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Asynchronous transfers on thread_count threads. A ticket is waited for once; wait() rethrows
// the transfer's error. The destructor waits for everything in flight (buffers stay valid).
class AsyncIo {
 public:
  using Ticket = uint64_t;
  explicit AsyncIo(const AioOptions& options = {});
  ~AsyncIo();
  AsyncIo(const AsyncIo&) = delete;
  AsyncIo& operator=(const AsyncIo&) = delete;

  Ticket read(File& f, void* buf, size_t n, uint64_t off);
  Ticket write(File& f, const void* buf, size_t n, uint64_t off);
  void wait(Ticket t);
  // Waits for every ticket issued; throws the first error among those not yet waited for.
  void wait_all();

  struct Stats {
    uint64_t bytes_read = 0, bytes_written = 0;
    double read_seconds = 0, write_seconds = 0;  // time transfers were in progress on the threads
    double wait_seconds = 0;                     // time callers blocked in wait()
  };
  Stats stats() const;
  void reset_stats();
  const AioOptions& options() const { return opts_; }

 private:
  struct Impl;
  AioOptions opts_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt::io
