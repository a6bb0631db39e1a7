#include "kernels/cuda/device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "base/error.h"
#include "kernels/cuda/check.cuh"

namespace mt::cuda {

bool available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

int select_device(int local_rank) {
  int n = 0;
  MT_CUDA_CHECK(cudaGetDeviceCount(&n));
  MT_CHECK(n > 0, ErrorKind::kNotSupported, "no CUDA device is visible to this process");
  int d = local_rank % n;
  MT_CUDA_CHECK(cudaSetDevice(d));
  return d;
}

int local_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "LOCAL_RANK"})
    if (const char* e = std::getenv(v); e != nullptr && *e) return std::max(0, std::atoi(e));
  return 0;
}

std::string device_name() {
  int dev = 0;
  MT_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  MT_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %d SMs, %.1f GiB)", p.name, p.major, p.minor,
                p.multiProcessorCount, static_cast<double>(p.totalGlobalMem) / (1 << 30));
  return buf;
}

namespace {
cudaStream_t new_stream() {
  cudaStream_t st = nullptr;
  MT_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  return st;
}
}  // namespace

void* stream() {
  static cudaStream_t s = new_stream();
  return s;
}

void synchronize() { MT_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream()))); }

void* comm_stream() {
  static cudaStream_t s = new_stream();
  return s;
}

namespace {
// `waiter` waits for the work queued on `producer` so far (the wait takes the event's state at the
// call, so one event serves every pair).
void order_after(cudaStream_t waiter, cudaStream_t producer, cudaEvent_t& ev) {
  if (ev == nullptr) MT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  MT_CUDA_CHECK(cudaEventRecord(ev, producer));
  MT_CUDA_CHECK(cudaStreamWaitEvent(waiter, ev, 0));
}
cudaEvent_t g_compute_done = nullptr, g_comm_done = nullptr;
}  // namespace

void comm_waits_for_compute() {
  order_after(static_cast<cudaStream_t>(comm_stream()), static_cast<cudaStream_t>(stream()), g_compute_done);
}
void compute_waits_for_comm() {
  order_after(static_cast<cudaStream_t>(stream()), static_cast<cudaStream_t>(comm_stream()), g_comm_done);
}

void check_launch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw Error(ErrorKind::kInternal, std::string("CUDA launch of ") + what + " failed: " + cudaGetErrorString(e));
}

namespace {
struct ProfRecord {
  const char* name;
  cudaEvent_t begin, end;
};
bool g_profiling = false;
std::vector<ProfRecord> g_records;
std::vector<cudaEvent_t> g_events;  // created on demand, reused after each report
size_t g_events_used = 0;
cudaEvent_t prof_event() {
  if (g_events_used == g_events.size()) {
    cudaEvent_t e = nullptr;
    MT_CUDA_CHECK(cudaEventCreate(&e));
    g_events.push_back(e);
  }
  return g_events[g_events_used++];
}
}  // namespace

void set_profiling(bool on) { g_profiling = on; }
bool profiling() { return g_profiling; }

ProfScope::ProfScope(const char* name) {
  if (!g_profiling) return;
  cudaEvent_t b = prof_event(), e = prof_event();
  MT_CUDA_CHECK(cudaEventRecord(b, static_cast<cudaStream_t>(stream())));
  index_ = static_cast<int>(g_records.size());
  g_records.push_back({name, b, e});
}

ProfScope::~ProfScope() {
  if (index_ >= 0) cudaEventRecord(g_records[static_cast<size_t>(index_)].end, static_cast<cudaStream_t>(stream()));
}

std::vector<ProfEntry> profile_report() {
  synchronize();
  std::map<std::string, ProfEntry> by;
  for (const ProfRecord& r : g_records) {
    float ms = 0.0f;
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms, r.begin, r.end));
    ProfEntry& e = by[r.name];
    e.name = r.name;
    e.ms += ms;
    e.calls += 1;
  }
  g_records.clear();
  g_events_used = 0;
  std::vector<ProfEntry> out;
  for (auto& [name, e] : by) out.push_back(e);
  std::sort(out.begin(), out.end(), [](const ProfEntry& a, const ProfEntry& b) { return a.ms > b.ms; });
  return out;
}

namespace {
// Small blocks round to 512 B, large ones to 2 MiB, so a pool of a few sizes serves a whole run.
size_t round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes < (size_t{1} << 20)) return (bytes + 511) / 512 * 512;
  return (bytes + (size_t{2} << 20) - 1) / (size_t{2} << 20) * (size_t{2} << 20);
}
}  // namespace

DeviceAllocator& DeviceAllocator::global() {
  static DeviceAllocator a;
  return a;
}

void* DeviceAllocator::allocate(size_t bytes, MemCategory category) {
  size_t r = round_size(bytes);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(r);
    if (it != free_.end()) {
      p = it->second;
      free_.erase(it);
    }
  }
  if (p == nullptr) {
    cudaError_t e = cudaMalloc(&p, r);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      empty_cache();
      e = cudaMalloc(&p, r);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw Error(ErrorKind::kOutOfMemory, std::string("GPU ") + mem_category_name(category) + " need " +
                                               format_bytes(bytes) + " more; in use: " + describe());
    }
    std::lock_guard<std::mutex> lock(mu_);
    reserved_ += r;
    ++mallocs_;
  }
  MT_CUDA_CHECK(cudaMemsetAsync(p, 0, r, static_cast<cudaStream_t>(stream())));
  std::lock_guard<std::mutex> lock(mu_);
  sizes_[p] = r;
  int c = static_cast<int>(category);
  current_[c] += bytes;
  peak_[c] = std::max(peak_[c], current_[c]);
  total_current_ += bytes;
  total_peak_ = std::max(total_peak_, total_current_);
  return p;
}

void DeviceAllocator::deallocate(void* p, size_t bytes, MemCategory category) {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sizes_.find(p);
  if (it == sizes_.end()) return;
  free_.emplace(it->second, p);  // reuse is stream-ordered: every kernel runs on the one stream
  sizes_.erase(it);
  current_[static_cast<int>(category)] -= bytes;
  total_current_ -= bytes;
}

MemStats DeviceAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  MemStats s;
  s.current = current_;
  s.peak = peak_;
  s.total_current = total_current_;
  s.total_peak = total_peak_;
  return s;
}

void DeviceAllocator::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = current_;
  total_peak_ = total_current_;
}

std::string DeviceAllocator::describe() const {
  MemStats s = stats();
  std::string out;
  for (int i = 0; i < kMemCategoryCount; ++i) {
    if (!out.empty()) out += ", ";
    out += std::string(mem_category_name(static_cast<MemCategory>(i))) + " " + format_bytes(s.current[i]);
  }
  return out + "; reserved " + format_bytes(reserved());
}

size_t DeviceAllocator::reserved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_;
}

void DeviceAllocator::empty_cache() {
  cudaStreamSynchronize(static_cast<cudaStream_t>(stream()));
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, p] : free_) {
    cudaFree(p);
    reserved_ -= size;
  }
  free_.clear();
}

DeviceBuffer::DeviceBuffer(size_t bytes, MemCategory category)
    : data_(DeviceAllocator::global().allocate(bytes, category)), bytes_(bytes), category_(category) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = o.data_;
    bytes_ = o.bytes_;
    category_ = o.category_;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::release() {
  if (data_) DeviceAllocator::global().deallocate(data_, bytes_, category_);
  data_ = nullptr;
  bytes_ = 0;
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  auto s = static_cast<cudaStream_t>(stream());
  MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  auto s = static_cast<cudaStream_t>(stream());
  MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
}

void copy_on_device(void* dst, const void* src, size_t bytes) {
  MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream())));
}

void fill_zero(void* dst, size_t bytes) {
  MT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(stream())));
}

void* scratch(size_t bytes) {
  static DeviceBuffer buf;
  if (buf.bytes() < bytes) {
    buf = DeviceBuffer();  // stream-ordered reuse: the old block returns to the pool
    buf = DeviceBuffer(std::max(bytes, size_t{1} << 20), MemCategory::kWorkspace);
  }
  return buf.data();
}

}  // namespace mt::cuda
