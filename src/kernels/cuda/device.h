// The CUDA device: availability, one compute stream, and device memory through one accounted
// caching allocator (the categories and peak figures of tensor/allocator.h, so a GPU step reports
// where memory goes as a CPU step does). Pure C++: no CUDA header leaks out of kernels/cuda/.
//
// Memory: blocks come from cudaMalloc once and are kept in a pool keyed by rounded size after they
// are freed, so a training loop that allocates the same shapes every step reaches a steady state
// with no cudaMalloc/cudaFree at all (tested). On cudaMalloc failure the pool is emptied and the
// allocation retried once; then kOutOfMemory quotes the accounted categories.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensor/allocator.h"

namespace mt::cuda {

bool available();             // a CUDA device is visible to this process
// One GPU per rank: makes device local_rank % (visible devices) current for this process and
// returns its index (mpirun's OMPI_COMM_WORLD_LOCAL_RANK, torchrun's LOCAL_RANK: local_rank()).
int select_device(int local_rank);
int local_rank();             // from the launcher's environment; 0 without one
std::string device_name();    // "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)"
void* stream();               // the compute stream (a cudaStream_t)
void synchronize();           // waits for the compute stream; throws on a pending device error
// A second stream for collectives (the gradient all-reduce overlapping the backward), ordered
// against the compute stream by events: comm_waits_for_compute() makes the comm stream's next work
// start after everything queued on the compute stream so far, compute_waits_for_comm() the reverse.
void* comm_stream();
void comm_waits_for_compute();
void compute_waits_for_comm();
// Throws kInternal naming `what` if the last launch failed (cudaGetLastError).
void check_launch(const char* what);

class DeviceAllocator {
 public:
  static DeviceAllocator& global();

  // At least `bytes` of device memory, 256-byte aligned, zero-filled (on the compute stream).
  void* allocate(size_t bytes, MemCategory category);
  void deallocate(void* p, size_t bytes, MemCategory category);

  MemStats stats() const;       // accounted bytes (what callers asked for) per category
  void reset_peaks();
  std::string describe() const;
  size_t reserved() const;      // bytes held from cudaMalloc (in use + cached)
  int64_t device_mallocs() const { return mallocs_; }  // cudaMalloc calls so far
  void empty_cache();           // cudaFree every cached block

 private:
  mutable std::mutex mu_;
  std::unordered_multimap<size_t, void*> free_;  // rounded size -> cached block
  std::unordered_map<void*, size_t> sizes_;      // live block -> rounded size
  std::array<size_t, kMemCategoryCount> current_{}, peak_{};
  size_t total_current_ = 0, total_peak_ = 0, reserved_ = 0;
  int64_t mallocs_ = 0;
};

// RAII owner of one accounted device allocation. Movable, not copyable.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, MemCategory category);
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemCategory category_ = MemCategory::kWorkspace;
};

// Copies on the compute stream; the host side is synchronous (the call returns when done).
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void copy_on_device(void* dst, const void* src, size_t bytes);  // async on the stream
void fill_zero(void* dst, size_t bytes);                          // async on the stream

// A growing scratch area for the kernels' internal partial sums (category workspace). Valid until
// the next call; callers use it within one operation on the compute stream.
void* scratch(size_t bytes);

// Per-op GPU time for the benchmark's breakdown: while profiling is on, each ProfScope records an
// event pair on the compute stream; profile_report() waits for them and sums by name (then clears).
// Off by default: a scope then costs one branch.
void set_profiling(bool on);
bool profiling();
class ProfScope {
 public:
  explicit ProfScope(const char* name);
  ~ProfScope();
  ProfScope(const ProfScope&) = delete;
  ProfScope& operator=(const ProfScope&) = delete;

 private:
  int index_ = -1;
};
// (name, milliseconds, calls), the largest first.
struct ProfEntry {
  std::string name;
  double ms = 0.0;
  int calls = 0;
};
std::vector<ProfEntry> profile_report();

// Measured on the device: a large bf16 GEMM (TFLOP/s) and a device-to-device copy (GB/s, bytes
// read + written), the ceilings the benchmark reports against.
struct Ceilings {
  double bf16_gemm_tflops = 0.0;
  double copy_gbps = 0.0;
};
Ceilings measure_ceilings();

}  // namespace mt::cuda
