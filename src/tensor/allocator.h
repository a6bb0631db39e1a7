// Accounted memory: every allocation carries a category, and the allocator keeps the current and
// peak bytes of each, so a step can report (and the planner predict) where memory goes.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <mutex>
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
