// Backend defaults (every collective throws kNotSupported naming the backend), new_group on top of
// split, timeout messages and the f32 reduction shared by the backends.
#include "comm/backend.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <thread>

namespace mt::comm {

namespace {
std::atomic<uint64_t> g_continues{0};  // lock-free: safe in a handler
static_assert(std::atomic<uint64_t>::is_always_lock_free);
void on_continue(int) { g_continues.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

void count_continues() {
  static const bool installed = [] {
    struct sigaction now {};
    if (::sigaction(SIGCONT, nullptr, &now) != 0 || now.sa_handler != SIG_DFL) return false;
    struct sigaction sa {};
    sa.sa_handler = on_continue;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    return ::sigaction(SIGCONT, &sa, nullptr) == 0;
  }();
  (void)installed;
}

uint64_t continues() { return g_continues.load(std::memory_order_relaxed); }

WaitDeadline::WaitDeadline(std::chrono::milliseconds timeout)
    : timeout_(timeout), deadline_(std::chrono::steady_clock::now() + timeout), continues_(continues()) {}

bool WaitDeadline::passed() {
  using Clock = std::chrono::steady_clock;
  constexpr auto kStall = std::chrono::milliseconds(250);
  auto now = Clock::now();
  if (last_ != Clock::time_point{} && now - last_ > kStall) {  // stopped (or not scheduled) meanwhile
    const Clock::duration shift = std::min<Clock::duration>(now - last_, timeout_ - shifted_);
    if (shift > Clock::duration::zero()) {
      deadline_ += shift;
      shifted_ += shift;
    }
  }
  last_ = now;
  if (now < deadline_) return false;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a continue's count may be on its way
  last_ = now = Clock::now();
  if (const uint64_t c = continues(); c != continues_) {  // stopped and continued meanwhile: wait afresh
    continues_ = c;
    deadline_ = now + timeout_;
    shifted_ = Clock::duration::zero();
    return false;
  }
  return true;
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

CommTimeout::CommTimeout(const std::string& message, std::string collective, uint64_t seq,
                         std::vector<int> missing_ranks)
    : Error(ErrorKind::kTimeout, message),
      collective_(std::move(collective)),
      seq_(seq),
      missing_ranks_(std::move(missing_ranks)) {}

bool drive(Work& w, std::chrono::microseconds budget) {
  const auto until = std::chrono::steady_clock::now() + budget;
  for (;;) {
    if (w.is_completed()) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
  }
}

std::chrono::microseconds send_drive_budget(size_t bytes) {
  return std::chrono::microseconds(100 + static_cast<int64_t>(bytes / 1000));
}

std::string timeout_message(const std::string& backend, const std::string& collective, uint64_t seq,
                            const std::string& tag, int rank, int size,
                            std::chrono::milliseconds timeout, const std::vector<int>& missing, bool silent) {
  std::string m = collective + " #" + std::to_string(seq);
  if (!tag.empty()) m += " [" + tag + "]";
  m += " on rank " + std::to_string(rank) + " of " + std::to_string(size) + " (" + backend +
       ") timed out after " + std::to_string(timeout.count()) + " ms: ";
  if (missing.empty()) return m + "could not learn which ranks have not arrived";
  m += missing.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < missing.size(); ++i) {
    if (i) m.push_back(',');
    m.append(std::to_string(missing[i]));
  }
  if (silent) return m + (missing.size() == 1 ? " arrived but no longer answers" : " arrived but no longer answer");
  return m + (missing.size() == 1 ? " has not arrived" : " have not arrived");
}

void sum_16bit_into(void* acc, const void* src, size_t n, DType dtype) {
  if (dtype == DType::kBF16) {
    auto* a = static_cast<bf16_t*>(acc);
    const auto* b = static_cast<const bf16_t*>(src);
    for (size_t i = 0; i < n; ++i) a[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
  } else {
    MT_CHECK(dtype == DType::kF16, ErrorKind::kInternal, "sum_16bit_into: not a 16-bit type");
    auto* a = static_cast<f16_t*>(acc);
    const auto* b = static_cast<const f16_t*>(src);
    for (size_t i = 0; i < n; ++i) a[i] = f32_to_f16(f16_to_f32(a[i]) + f16_to_f32(b[i]));
  }
}

void check_in_dtype(const char* what, DType dtype, ReduceOp op) {
  MT_CHECK(op == ReduceOp::kSum || op == ReduceOp::kAvg, ErrorKind::kNotSupported,
           std::string(what) + ": a reduction in the element type is a sum or an average, not " + reduce_op_name(op));
  (void)dtype;
}

void reduce_f32_into(float* acc, const float* src, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (size_t i = 0; i < n; ++i) acc[i] += src[i];
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], src[i]);
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) acc[i] = std::min(acc[i], src[i]);
      break;
  }
}

void Backend::throw_not_supported(const char* what) const {
  throw Error(ErrorKind::kNotSupported, "backend " + name() + " does not support " + what);
}

void Backend::check_root(int root, const char* what) const {
  MT_CHECK(root >= 0 && root < size(), ErrorKind::kInvalidArgument,
           std::string(what) + ": root " + std::to_string(root) + " is not a rank of a group of " +
               std::to_string(size()));
}

std::unique_ptr<Work> Backend::broadcast(void*, size_t, DType, const BroadcastOptions&) {
  throw_not_supported("broadcast");
}
std::unique_ptr<Work> Backend::all_reduce(void*, size_t, DType, const AllReduceOptions&) {
  throw_not_supported("all_reduce");
}
std::unique_ptr<Work> Backend::reduce(void*, size_t, DType, const ReduceOptions&) {
  throw_not_supported("reduce");
}
std::unique_ptr<Work> Backend::all_gather(void*, const void*, size_t, DType,
                                          const AllGatherOptions&) {
  throw_not_supported("all_gather");
}
std::unique_ptr<Work> Backend::gather(void*, const void*, size_t, DType, const GatherOptions&) {
  throw_not_supported("gather");
}
std::unique_ptr<Work> Backend::scatter(void*, const void*, size_t, DType, const ScatterOptions&) {
  throw_not_supported("scatter");
}
std::unique_ptr<Work> Backend::reduce_scatter(void*, const void*, size_t, DType,
                                              const ReduceScatterOptions&) {
  throw_not_supported("reduce_scatter");
}
std::unique_ptr<Work> Backend::all_to_all(void*, const void*, size_t, DType,
                                          const AllToAllOptions&) {
  throw_not_supported("all_to_all");
}
std::unique_ptr<Work> Backend::send(const void*, size_t, DType, int, const SendOptions&) {
  throw_not_supported("send");
}
std::unique_ptr<Work> Backend::recv(void*, size_t, DType, int, const RecvOptions&) {
  throw_not_supported("recv");
}
std::unique_ptr<Work> Backend::barrier(const BarrierOptions&) { throw_not_supported("barrier"); }
std::shared_ptr<Backend> Backend::split(int, int) { throw_not_supported("split"); }

void Backend::abort(int code, const std::string& message) {
  throw Error(ErrorKind::kInternal,
              "abort (code " + std::to_string(code) + ") on " + name() + ": " + message);
}

std::shared_ptr<Backend> Backend::new_group(const std::vector<int>& ranks) {
  for (int r : ranks)
    MT_CHECK(r >= 0 && r < size(), ErrorKind::kInvalidArgument,
             "new_group: rank " + std::to_string(r) + " is not in a group of " +
                 std::to_string(size()));
  auto it = std::find(ranks.begin(), ranks.end(), rank());
  if (it == ranks.end()) return split(-1, 0);
  return split(0, static_cast<int>(it - ranks.begin()));
}

}  // namespace mt::comm
