// dtype conversions against IEEE facts, accounted allocation, views.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "base/cpu_features.h"
#include "base/error.h"
#include "tensor/allocator.h"
#include "tensor/tensor.h"

namespace mt {
namespace {

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f).bits, 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd mantissa) and 1.015625: rounds up to even.
  EXPECT_EQ(f32_to_bf16(1.01171875f).bits, 0x3f82);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()).bits, 0x7f80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  EXPECT_EQ(bf16_to_f32(bf16_t{0xc040}), -3.0f);
}

TEST(DType, F16KnownValues) {
  EXPECT_EQ(f32_to_f16(1.0f).bits, 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f).bits, 0x7bff);           // largest finite
  EXPECT_EQ(f32_to_f16(65520.0f).bits, 0x7c00);           // rounds to inf
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)).bits, 0x0000);  // halfway to 0: ties to even
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)).bits, 0x0002);  // 1.5 subnormal units -> 2
  EXPECT_EQ(f32_to_f16(-2.0f).bits, 0xc000);
  EXPECT_EQ(f16_to_f32(f16_t{0x0001}), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(f16_t{0x3555}), 0.333251953125f);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::nanf("")))));
  // Every f16 value round-trips exactly through f32.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaN payloads
    ASSERT_EQ(f32_to_f16(f16_to_f32(f16_t{static_cast<uint16_t>(h)})).bits, h) << std::hex << h;
  }
}

TEST(DType, VectorConvertersMatchScalar) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-70000.0f, 70000.0f);
  for (size_t n : {0, 1, 15, 16, 17, 1000}) {
    std::vector<float> x(n);
    for (auto& v : x) v = u(rng) * (rng() % 2 ? 1e-6f : 1.0f);
    std::vector<bf16_t> b(n);
    std::vector<f16_t> h(n);
    std::vector<float> back(n);
    convert_f32_to_bf16(b.data(), x.data(), n);
    convert_f32_to_f16(h.data(), x.data(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(b[i].bits, f32_to_bf16(x[i]).bits) << "isa " << isa_name(isa_active());
      ASSERT_EQ(h[i].bits, f32_to_f16(x[i]).bits) << x[i];
    }
    convert_bf16_to_f32(back.data(), b.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], bf16_to_f32(b[i]));
    convert_f16_to_f32(back.data(), h.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], f16_to_f32(h[i]));
  }
}

// round_to: the saved activation in the compute dtype and the f32 values the forward goes on with
// are the scalar round-to-nearest-even of each element, across the 2048-element blocks and the
// threads' chunks (2^17 elements and more split over the threads).
TEST(DType, RoundToWritesTheRoundedValuesAndTheirCopy) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-70000.0f, 70000.0f);
  for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{2049}, size_t{300001}}) {
    std::vector<float> x(n);
    for (auto& v : x) v = u(rng) * (rng() % 2 ? 1e-6f : 1.0f);
    std::vector<float> xb = x, xh = x;
    std::vector<bf16_t> b(n);
    std::vector<f16_t> h(n);
    round_to(b.data(), DType::kBF16, xb.data(), n);
    round_to(h.data(), DType::kF16, xh.data(), n);
    std::vector<float> alone_b = x, alone_h = x;  // no copy: the values alone
    round_to(nullptr, DType::kBF16, alone_b.data(), n);
    round_to(nullptr, DType::kF16, alone_h.data(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(alone_b[i], xb[i]) << i;
      ASSERT_EQ(alone_h[i], xh[i]) << i;
      ASSERT_EQ(b[i].bits, f32_to_bf16(x[i]).bits) << i;
      ASSERT_EQ(xb[i], bf16_to_f32(f32_to_bf16(x[i]))) << i;
      ASSERT_EQ(h[i].bits, f32_to_f16(x[i]).bits) << i;
      ASSERT_EQ(xh[i], f16_to_f32(f32_to_f16(x[i]))) << i;
    }
  }
  float one = 1.0f;
  EXPECT_THROW(round_to(&one, DType::kF32, &one, 1), Error);
}

TEST(Allocator, AccountsCurrentAndPeakByCategory) {
  Allocator a;
  {
    Buffer p(1000, MemCategory::kParams, a);
    Buffer g(500, MemCategory::kGrads, a);
    EXPECT_EQ(a.stats().current[static_cast<int>(MemCategory::kParams)], 1000u);
    EXPECT_EQ(a.stats().total_current, 1500u);
    { Buffer t(4000, MemCategory::kActivations, a); }
    EXPECT_EQ(a.stats().current[static_cast<int>(MemCategory::kActivations)], 0u);
    EXPECT_EQ(a.stats().peak[static_cast<int>(MemCategory::kActivations)], 4000u);
    EXPECT_EQ(a.stats().total_peak, 5500u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.data()) % 64, 0u);
  }
  EXPECT_EQ(a.stats().total_current, 0u);
  a.reset_peaks();
  EXPECT_EQ(a.stats().total_peak, 0u);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::kF32, MemCategory::kWorkspace);
  for (int i = 0; i < 24; ++i) t.as<float>()[i] = static_cast<float>(i);
  Tensor s = t.slice(1, 1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 2, 4}));
  EXPECT_FALSE(s.is_contiguous());
  std::vector<float> v = s.to_f32_vector();
  EXPECT_EQ(v[0], 4.0f);
  EXPECT_EQ(v[8], 16.0f);
  Tensor tr = t.reshape({6, 4}).transpose(0, 1);
  EXPECT_EQ(tr.to_f32_vector()[1], 4.0f);
  EXPECT_THROW(t.reshape({5, 5}), Error);
}

}  // namespace
}  // namespace mt

namespace mt {
namespace {

// Freed large blocks are reused (zero-filled again) instead of mapped afresh, and the allocator
// never holds more than its highest in-use total: a block of another size evicts kept ones first.
TEST(AllocatorCache, ReusesLargeBlocksWithinTheHighWater) {
  Allocator a;
  const size_t mib = size_t{1} << 20;
  void* p = a.allocate(4 * mib, MemCategory::kComm);
  static_cast<char*>(p)[123] = 7;
  a.deallocate(p, 4 * mib, MemCategory::kComm);
  EXPECT_EQ(a.cached_bytes(), 4 * mib);
  void* q = a.allocate(4 * mib, MemCategory::kParams);
  EXPECT_EQ(q, p);                                // the same block
  EXPECT_EQ(static_cast<char*>(q)[123], 0);       // zero-filled as promised
  EXPECT_EQ(a.cached_bytes(), 0u);
  EXPECT_EQ(a.stats().current[static_cast<int>(MemCategory::kParams)], 4 * mib);
  a.deallocate(q, 4 * mib, MemCategory::kParams);
  void* r = a.allocate(6 * mib, MemCategory::kComm);  // 6 + 4 kept > the 4 MiB high water: evicted
  EXPECT_EQ(a.cached_bytes(), 0u);
  void* s = a.allocate(2 * mib, MemCategory::kComm);  // high water now 8 MiB
  a.deallocate(s, 2 * mib, MemCategory::kComm);
  EXPECT_EQ(a.cached_bytes(), 2 * mib);  // 6 in use + 2 kept <= 8
  a.deallocate(r, 6 * mib, MemCategory::kComm);
  EXPECT_EQ(a.cached_bytes(), 8 * mib);  // 0 in use + 8 kept <= 8
  void* small = a.allocate(1000, MemCategory::kComm);  // small blocks are not kept
  a.deallocate(small, 1000, MemCategory::kComm);
  EXPECT_EQ(a.cached_bytes(), 8 * mib);
  EXPECT_EQ(a.stats().total_current, 0u);
}

// Kept blocks may hold the process above its high water by a margin of an eighth of it (at most
// 128 MiB), no further: ZeRO-3 with parameters on disk churns more per unit than the high water leaves.
TEST(AllocatorCache, KeptBlocksWithinAMarginAboveTheHighWater) {
  Allocator a;
  const size_t mib = size_t{1} << 20;
  void* p = a.allocate(16 * mib, MemCategory::kComm);  // high water 16 MiB: margin 2 MiB
  a.deallocate(p, 16 * mib, MemCategory::kComm);
  void* q = a.allocate(1 * mib, MemCategory::kComm);  // 1 in use + 16 kept = 17 <= 18: still kept
  EXPECT_EQ(a.cached_bytes(), 16 * mib);
  void* r = a.allocate(2 * mib, MemCategory::kComm);  // 3 + 16 > 18: dropped
  EXPECT_EQ(a.cached_bytes(), 0u);
  a.deallocate(q, 1 * mib, MemCategory::kComm);
  a.deallocate(r, 2 * mib, MemCategory::kComm);
  EXPECT_EQ(a.cached_bytes(), 3 * mib);
}

// What the allocator holds beyond its accounted bytes: kept blocks (held_peak) and, in the OS's
// units, blocks of 2 MiB or more rounded to whole 2 MiB pages (mapped_peak); the accounted
// total_peak counts neither.
TEST(AllocatorCache, HeldAndMappedPeaksCountKeptBlocksAndWholeHugePages) {
  Allocator a;
  const size_t mib = size_t{1} << 20;
  void* p = a.allocate(3 * mib, MemCategory::kComm);  // one 4 MiB mapping
  MemStats s = a.stats();
  EXPECT_EQ(s.total_peak, 3 * mib);
  EXPECT_EQ(s.held_peak, 3 * mib);
  EXPECT_EQ(s.mapped_peak, 4 * mib);
  a.deallocate(p, 3 * mib, MemCategory::kComm);  // kept
  void* q = a.allocate(1000, MemCategory::kComm);  // the heap: 1024 bytes (64-byte granules)
  s = a.stats();
  EXPECT_EQ(s.total_peak, 3 * mib);
  EXPECT_EQ(s.held_peak, 3 * mib + 1000);  // in use + kept
  EXPECT_EQ(s.mapped_peak, 4 * mib + 1024);
  a.deallocate(q, 1000, MemCategory::kComm);
  void* r = a.allocate(5 * mib, MemCategory::kParams);  // 5 + 3 kept > 3 + 3/8: the kept block goes first
  s = a.stats();
  EXPECT_EQ(a.cached_bytes(), 0u);
  EXPECT_EQ(s.total_peak, 5 * mib);
  EXPECT_EQ(s.held_peak, 5 * mib);
  EXPECT_EQ(s.mapped_peak, 6 * mib);  // the 4 MiB mapping was released before the 6 MiB one
  a.deallocate(r, 5 * mib, MemCategory::kParams);
  void* t = a.allocate(5 * mib, MemCategory::kParams);  // the kept block: no fresh mapping
  EXPECT_EQ(a.stats().fresh_mapped, 4 * mib + 6 * mib);  // blocks of 2 MiB or more mapped afresh, ever
  a.deallocate(t, 5 * mib, MemCategory::kParams);
}

// FootprintReplay is the allocator's bookkeeping on sizes: a random run of requests and releases
// (sizes around the keep and huge-page thresholds, with repeats so kept blocks are reused and
// evicted) gives the allocator's total, held and mapped peaks byte for byte.
TEST(AllocatorCache, FootprintReplayMatchesTheAllocator) {
  const size_t mib = size_t{1} << 20;
  const size_t sizes[] = {1000, 5000, mib - 100, mib, 3 * mib / 2, 2 * mib, 3 * mib + 64, 5 * mib, 9 * mib, 24 * mib};
  for (unsigned seed : {1u, 2u, 3u}) {
    Allocator a;
    FootprintReplay f;
    std::mt19937 rng(seed);
    std::vector<std::pair<void*, size_t>> live;
    size_t kept_seen = 0;
    for (int i = 0; i < 400; ++i) {
      if (!live.empty() && rng() % 5 < 2 + (live.size() > 12)) {
        const size_t k = rng() % live.size();
        a.deallocate(live[k].first, live[k].second, MemCategory::kComm);
        f.release(live[k].second);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      } else {
        const size_t b = sizes[rng() % std::size(sizes)];
        live.emplace_back(a.allocate(b, MemCategory::kComm, false), b);
        f.allocate(b);
      }
      ASSERT_EQ(a.cached_bytes(), f.kept()) << "seed " << seed << " step " << i;
      kept_seen = std::max(kept_seen, f.kept());
    }
    const MemStats s = a.stats();
    EXPECT_EQ(s.total_peak, f.total_peak());
    EXPECT_EQ(s.held_peak, f.held_peak());
    EXPECT_EQ(s.mapped_peak, f.mapped_peak());
    EXPECT_GT(kept_seen, 0u);                 // the run did keep blocks
    EXPECT_GT(f.mapped_peak(), f.held_peak());  // and rounded some to whole pages
    for (auto [p, b] : live) a.deallocate(p, b, MemCategory::kComm);
  }
}

// The "THPeligible" field of the mapping that holds p in /proc/self/smaps (-1: not found).
int thp_eligible(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " ", &lo, &hi) == 2) {
      inside = addr >= lo && addr < hi;
    } else if (inside && line.rfind("THPeligible:", 0) == 0) {
      return std::stoi(line.substr(12));
    }
  }
  return -1;
}

// Blocks of 2 MiB or more are their own 2 MiB-aligned mappings marked for transparent huge pages:
// a fresh 200 MB ZeRO-3 piece faulted in 4 KiB at a time cost the 1.3B offload run most of its
// passes' time (38 s of system time in two steps; 13 s with huge pages).
TEST(AllocatorHuge, LargeBlocksAreHugePageMappings) {
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode((std::istreambuf_iterator<char>(thp)), std::istreambuf_iterator<char>());
  if (mode.empty() || mode.find("[never]") != std::string::npos) GTEST_SKIP() << "transparent huge pages are off here";
  Allocator a;
  const size_t mib = size_t{1} << 20;
  const size_t bytes = 6 * mib + 4096;  // not a whole number of huge pages
  auto* p = static_cast<unsigned char*>(a.allocate(bytes, MemCategory::kParams));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (2 * mib), 0u);
  EXPECT_EQ(thp_eligible(p), 1);
  EXPECT_EQ(thp_eligible(p + bytes - 1), 1);
  size_t nonzero = 0;
  for (size_t i = 0; i < bytes; i += 997) nonzero += p[i] != 0;
  EXPECT_EQ(nonzero, 0u);  // a fresh mapping is zero without a memset
  std::memset(p, 0xab, bytes);
  a.deallocate(p, bytes, MemCategory::kParams);
  auto* q = static_cast<unsigned char*>(a.allocate(bytes, MemCategory::kParams));  // kept and re-zeroed
  EXPECT_EQ(q, p);
  EXPECT_EQ(q[bytes - 1], 0);
  a.deallocate(q, bytes, MemCategory::kParams);
  auto* small = static_cast<unsigned char*>(a.allocate(mib + 64, MemCategory::kParams));  // under 2 MiB: the heap
  small[mib] = 1;
  a.deallocate(small, mib + 64, MemCategory::kParams);
}

}  // namespace
}  // namespace mt
