// Accounted memory: every allocation carries a category, and the allocator keeps the current and
// peak bytes of each, so a step can report (and the planner predict) where memory goes.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <mutex>
#include <set>
#include <string>

namespace mt {

enum class MemCategory : int {
  kParams = 0,
  kGrads,
  kOptimizer,
  kActivations,
  kComm,
  kWorkspace,
  kCount
};
constexpr int kMemCategoryCount = static_cast<int>(MemCategory::kCount);

const char* mem_category_name(MemCategory category);

struct MemStats {
  std::array<size_t, kMemCategoryCount> current{};
  std::array<size_t, kMemCategoryCount> peak{};
  size_t total_current = 0;
  size_t total_peak = 0;
  size_t held_peak = 0;  // the most the allocator ever held: in use plus kept blocks (see Allocator)
  size_t mapped_peak = 0;  // the same in the OS's units: blocks of 2 MiB or more are whole 2 MiB pages
  size_t fresh_mapped = 0;  // bytes of blocks of 2 MiB or more mapped afresh (no kept block fitted), ever
  size_t mapped = 0;        // the blocks' footprint now (in use + kept, whole pages)
};

// The allocator's rules on sizes, shared by Allocator and FootprintReplay so the two cannot differ.
namespace alloc_rules {
// Blocks of this many bytes (rounded) or more are kept for reuse when freed.
inline constexpr size_t kKeepMin = size_t{1} << 20;
// Bytes a request of `bytes` takes: whole 64-byte granules (64 for an empty request).
size_t rounded(size_t bytes);
// Bytes the OS gives a block of `rounded` bytes: whole 2 MiB pages from 2 MiB on (each its own
// mapping), whole 4 KiB pages from a page on, else the bytes.
size_t footprint(size_t rounded);
// Whether a block of `rounded` bytes may be kept beside `in_use` bytes in use and `kept` bytes kept
// when the highest in-use total so far is `high_water`: the kept blocks may take the process at
// most an eighth of the high water (128 MiB at most) above it.
bool keep_fits(size_t in_use, size_t kept, size_t rounded, size_t high_water);
}  // namespace alloc_rules

// Allocator's bookkeeping on sizes alone: the same requests and releases, in the same order, give
// the same total, held and mapped peaks as the allocator (the planner replays a run's blocks
// through it to predict what the process holds; tensor_test checks the two against each other).
class FootprintReplay {
 public:
  void allocate(size_t bytes);
  void release(size_t bytes);  // a block allocated before with these bytes
  size_t in_use() const { return in_use_; }
  size_t total_peak() const { return total_peak_; }
  size_t held_peak() const { return held_peak_; }
  size_t mapped_peak() const { return mapped_peak_; }
  size_t kept() const { return kept_bytes_; }

 private:
  std::multiset<size_t> kept_;  // rounded sizes
  size_t kept_bytes_ = 0, in_use_ = 0, high_water_ = 0, total_peak_ = 0, held_peak_ = 0, mapped_ = 0, mapped_peak_ = 0;
};

class Allocator {
 public:
  static Allocator& global();

  // Returns 64-byte-aligned, zero-filled memory of at least `bytes`. Throws kOutOfMemory with the
  // accounted figures when the OS refuses. zero false: the caller writes every byte before reading
  // one (a read target, a collective's receive buffer), so a kept block is handed back as it is.
  void* allocate(size_t bytes, MemCategory category, bool zero = true);
  void deallocate(void* p, size_t bytes, MemCategory category);

  MemStats stats() const;
  void reset_peaks();  // peak := current, per category and in total
  std::string describe() const;  // one line: "params 1.2 GiB, grads ..."

  // Bytes of freed large blocks kept for reuse (see allocate()).
  size_t cached_bytes() const;

 private:
  std::array<std::atomic<size_t>, kMemCategoryCount> current_{};
  std::array<std::atomic<size_t>, kMemCategoryCount> peak_{};
  std::atomic<size_t> total_current_{0};
  std::atomic<size_t> total_peak_{0};
  // Large blocks (>= 1 MiB) freed and kept, by size: ZeRO-3 gathers and frees the same unit sizes
  // every pass, and a fresh mapping faults in every page again (most of a stage-3 step's time in
  // the kernel). Kept only while in use + kept <= the highest in-use total so far (never reset)
  // plus a margin of 128 MiB (an eighth of that total at most), and evicted before a new block would
  // exceed it: the process holds at most that margin more than without them.
  struct Cache;
  Cache* cache_ = nullptr;  // made on the first large block; kept to the process's end
  std::once_flag cache_once_;
  std::atomic<size_t> high_water_{0};
  std::atomic<size_t> kept_{0};       // Cache::bytes, readable without its lock
  std::atomic<size_t> held_peak_{0};  // max over time of in use + kept
  std::atomic<size_t> mapped_{0}, mapped_peak_{0};  // the blocks' footprints (in use + kept), and its max
  std::atomic<size_t> fresh_mapped_{0};
};

// Buffer: RAII owner of one accounted allocation. Movable, not copyable.
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, MemCategory category, Allocator& allocator = Allocator::global());
  // Not zero-filled (Allocator::allocate's zero false): for memory written whole before it is read.
  static Buffer uninitialized(size_t bytes, MemCategory category, Allocator& allocator = Allocator::global());
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  MemCategory category() const { return category_; }

 private:
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemCategory category_ = MemCategory::kWorkspace;
  Allocator* allocator_ = nullptr;
};

std::string format_bytes(size_t bytes);  // "1.50 GiB", "12.0 MiB", "512 B"

}  // namespace mt
