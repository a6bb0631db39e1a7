#include "tensor/allocator.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

#include <sys/mman.h>

#include "base/error.h"
#include "tensor/dtype.h"

namespace mt {

const char* mem_category_name(MemCategory category) {
  static const char* kNames[] = {"params", "grads", "optimizer", "activations", "comm", "workspace"};
  int i = static_cast<int>(category);
  return i >= 0 && i < kMemCategoryCount ? kNames[i] : "?";
}

Allocator& Allocator::global() {
  static Allocator allocator;
  return allocator;
}

namespace {
void raise_peak(std::atomic<size_t>& peak, size_t value) {
  size_t p = peak.load(std::memory_order_relaxed);
  while (value > p && !peak.compare_exchange_weak(p, value, std::memory_order_relaxed)) {
  }
}
}  // namespace

namespace alloc_rules {
namespace {
// Kept blocks may take the process this far above its highest in-use total (an eighth of it at
// most): within the high water alone, ZeRO-3 with parameters on disk sits 50-200 MB below it through
// the backward while each unit churns ~200 MB of pieces, records and copies, and every one of
// those missed the cache (a 306M model's backward 5.5 s against 1.6 s with this margin).
constexpr size_t kCacheMargin = size_t{128} << 20;
constexpr size_t kPage = 4096;
// Blocks of 2 MiB or more are their own mappings, on a 2 MiB boundary and marked for transparent
// huge pages: a fresh block then faults in 2 MiB at a time, where a 4 KiB-page one took a fault
// (and a zeroed page) per 4 KiB — ZeRO-3 with a 1.3B model's parameters on disk maps ~14 GB of
// fresh pieces, records and slabs a step, and its passes spent more time in those faults than in
// compute. A fresh mapping is already zero.
constexpr size_t kHuge = size_t{2} << 20;
}  // namespace

size_t rounded(size_t bytes) { return bytes == 0 ? 64 : (bytes + 63) / 64 * 64; }
size_t footprint(size_t r) {
  return r >= kHuge ? (r + kHuge - 1) / kHuge * kHuge : r >= kPage ? (r + kPage - 1) / kPage * kPage : r;
}
bool keep_fits(size_t in_use, size_t kept, size_t r, size_t high_water) {
  return in_use + kept + r <= high_water + std::min(kCacheMargin, high_water / 8);
}
}  // namespace alloc_rules

namespace {
using alloc_rules::footprint;
using alloc_rules::kHuge;
using alloc_rules::kPage;
constexpr size_t kCacheMin = alloc_rules::kKeepMin;
size_t round64(size_t bytes) { return alloc_rules::rounded(bytes); }
size_t mapped_size(size_t rounded) { return (rounded + kHuge - 1) / kHuge * kHuge; }

void* map_block(size_t rounded) {
  const size_t size = mapped_size(rounded);
  void* raw = ::mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (base + kHuge - 1) / kHuge * kHuge;
  if (aligned > base) ::munmap(raw, aligned - base);
  const size_t tail = base + size + kHuge - (aligned + size);
  if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + size), tail);
  void* p = reinterpret_cast<void*>(aligned);
  ::madvise(p, size, MADV_HUGEPAGE);  // advice only: without THP the block works in small pages
  return p;
}

// A block of `rounded` bytes back to where it came from.
void release_block(void* p, size_t rounded) {
  if (rounded >= kHuge) {
    ::munmap(p, mapped_size(rounded));
  } else {
    std::free(p);
  }
}
}  // namespace

struct Allocator::Cache {
  std::mutex mu;
  std::multimap<size_t, void*> blocks;  // rounded size -> block
  size_t bytes = 0;
};

size_t Allocator::cached_bytes() const {
  if (!cache_) return 0;
  std::lock_guard<std::mutex> l(cache_->mu);
  return cache_->bytes;
}

void* Allocator::allocate(size_t bytes, MemCategory category, bool zero_fill) {
  const size_t rounded = round64(bytes);
  void* p = nullptr;
  if (rounded >= kCacheMin) {
    std::call_once(cache_once_, [this] { cache_ = new Cache; });
    std::lock_guard<std::mutex> l(cache_->mu);
    auto it = cache_->blocks.find(rounded);
    if (it != cache_->blocks.end()) {
      p = it->second;
      cache_->blocks.erase(it);
      cache_->bytes -= rounded;
      kept_ = cache_->bytes;
    } else {  // no block of this size: drop kept ones (largest first) rather than grow past the high water
      while (!cache_->blocks.empty() && !alloc_rules::keep_fits(total_current_.load(), cache_->bytes, rounded, high_water_.load())) {
        auto last = std::prev(cache_->blocks.end());
        release_block(last->second, last->first);
        mapped_ -= footprint(last->first);
        cache_->bytes -= last->first;
        cache_->blocks.erase(last);
        kept_ = cache_->bytes;
      }
    }
  }
  // Blocks of a page or more start on a page (an io::AlignedBuffer of whole pages then needs no
  // pad, and shares its size, so its kept blocks, with the unit's other buffers); smaller ones on
  // 64 bytes.
  bool zero = false;
  const bool fresh = p == nullptr;
  if (p == nullptr) {
    if (rounded >= kHuge) {
      p = map_block(rounded);
      zero = true;
    } else {
      p = rounded >= kPage ? std::aligned_alloc(kPage, (rounded + kPage - 1) / kPage * kPage) : std::aligned_alloc(64, rounded);
    }
  }
  if (p == nullptr) {
    throw Error(ErrorKind::kOutOfMemory, std::string(mem_category_name(category)) + " need " +
                                             format_bytes(bytes) + " more; in use: " + describe());
  }
  if (fresh) {
    raise_peak(mapped_peak_, mapped_.fetch_add(footprint(rounded)) + footprint(rounded));
    if (rounded >= kHuge) fresh_mapped_ += footprint(rounded);
  }
  if (!zero && zero_fill) zero_bytes(p, rounded);
  int c = static_cast<int>(category);
  raise_peak(peak_[c], current_[c].fetch_add(bytes) + bytes);
  const size_t total = total_current_.fetch_add(bytes) + bytes;
  raise_peak(total_peak_, total);
  raise_peak(high_water_, total);
  raise_peak(held_peak_, total + kept_.load());
  return p;
}

void Allocator::deallocate(void* p, size_t bytes, MemCategory category) {
  if (p == nullptr) return;
  current_[static_cast<int>(category)].fetch_sub(bytes);
  const size_t left = total_current_.fetch_sub(bytes) - bytes;
  const size_t rounded = round64(bytes);
  if (rounded >= kCacheMin && cache_ != nullptr) {
    std::lock_guard<std::mutex> l(cache_->mu);
    if (alloc_rules::keep_fits(left, cache_->bytes, rounded, high_water_.load())) {
      cache_->blocks.emplace(rounded, p);
      cache_->bytes += rounded;
      kept_ = cache_->bytes;
      raise_peak(held_peak_, left + cache_->bytes);
      return;
    }
  }
  release_block(p, rounded);
  mapped_ -= footprint(rounded);
}

MemStats Allocator::stats() const {
  MemStats s;
  for (int i = 0; i < kMemCategoryCount; ++i) {
    s.current[i] = current_[i].load();
    s.peak[i] = peak_[i].load();
  }
  s.total_current = total_current_.load();
  s.total_peak = total_peak_.load();
  s.held_peak = held_peak_.load();
  s.mapped_peak = mapped_peak_.load();
  s.fresh_mapped = fresh_mapped_.load();
  s.mapped = mapped_.load();
  return s;
}

void Allocator::reset_peaks() {
  for (int i = 0; i < kMemCategoryCount; ++i) peak_[i] = current_[i].load();
  total_peak_ = total_current_.load();
}

std::string Allocator::describe() const {
  MemStats s = stats();
  std::string out;
  for (int i = 0; i < kMemCategoryCount; ++i) {
    if (!out.empty()) out += ", ";
    out += std::string(mem_category_name(static_cast<MemCategory>(i))) + " " +
           format_bytes(s.current[i]);
  }
  return out;
}

Buffer::Buffer(size_t bytes, MemCategory category, Allocator& allocator)
    : data_(allocator.allocate(bytes, category)),
      bytes_(bytes),
      category_(category),
      allocator_(&allocator) {}

Buffer Buffer::uninitialized(size_t bytes, MemCategory category, Allocator& allocator) {
  Buffer b;
  b.data_ = allocator.allocate(bytes, category, false);
  b.bytes_ = bytes;
  b.category_ = category;
  b.allocator_ = &allocator;
  return b;
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& other) noexcept
    : data_(other.data_), bytes_(other.bytes_), category_(other.category_), allocator_(other.allocator_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    bytes_ = other.bytes_;
    category_ = other.category_;
    allocator_ = other.allocator_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void Buffer::release() {
  if (data_ != nullptr && allocator_ != nullptr) allocator_->deallocate(data_, bytes_, category_);
  data_ = nullptr;
  bytes_ = 0;
}

void FootprintReplay::allocate(size_t bytes) {
  const size_t r = round64(bytes);
  bool reused = false;
  if (r >= kCacheMin) {
    if (auto it = kept_.find(r); it != kept_.end()) {
      kept_.erase(it);
      kept_bytes_ -= r;
      reused = true;
    } else {
      while (!kept_.empty() && !alloc_rules::keep_fits(in_use_, kept_bytes_, r, high_water_)) {
        auto last = std::prev(kept_.end());
        mapped_ -= footprint(*last);
        kept_bytes_ -= *last;
        kept_.erase(last);
      }
    }
  }
  if (!reused) mapped_peak_ = std::max(mapped_peak_, mapped_ += footprint(r));
  in_use_ += bytes;
  total_peak_ = std::max(total_peak_, in_use_);
  high_water_ = std::max(high_water_, in_use_);
  held_peak_ = std::max(held_peak_, in_use_ + kept_bytes_);
}

void FootprintReplay::release(size_t bytes) {
  in_use_ -= bytes;
  const size_t r = round64(bytes);
  if (r >= kCacheMin && alloc_rules::keep_fits(in_use_, kept_bytes_, r, high_water_)) {
    kept_.insert(r);
    kept_bytes_ += r;
    held_peak_ = std::max(held_peak_, in_use_ + kept_bytes_);
    return;
  }
  mapped_ -= footprint(r);
}

std::string format_bytes(size_t bytes) {
  char buf[64];
  double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  } else if (b >= 1024.0 * 1024) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
  } else if (b >= 1024.0) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  }
  return buf;
}

}  // namespace mt
