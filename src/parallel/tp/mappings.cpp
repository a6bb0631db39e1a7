#include "parallel/tp/mappings.h"

#include <cstring>

#include "base/error.h"
#include "base/timer.h"

namespace mt::parallel {

TpComm::TpComm(std::shared_ptr<comm::Backend> group, std::chrono::milliseconds timeout)
    : group_(std::move(group)), timeout_(timeout) {}

template <typename Options>
Options TpComm::options(const char* tag) const {
  MT_INTERNAL_CHECK(group_ != nullptr);  // a place without a group builds shapes only
  Options o;
  o.tag = tag;
  o.timeout = timeout_;
  return o;
}

void TpComm::finish(std::unique_ptr<comm::Work> work, size_t handed_bytes, const Timer& started) {
  work->wait();
  seconds_ += started.seconds();
  bytes_ += handed_bytes;
}

void TpComm::reduce(float* buf, size_t n, comm::ReduceOp op, const char* tag) {
  if (size() == 1 || n == 0) return;
  auto o = options<comm::AllReduceOptions>(tag);
  o.op = op;
  Timer t;
  finish(group_->all_reduce(buf, n, DType::kF32, o), n * sizeof(float), t);
}

void TpComm::all_reduce(float* buf, size_t n, const char* tag) { reduce(buf, n, comm::ReduceOp::kSum, tag); }
void TpComm::all_reduce_max(float* buf, size_t n, const char* tag) { reduce(buf, n, comm::ReduceOp::kMax, tag); }

void TpComm::keep_columns(float* out, const float* in, size_t rows, size_t cols) const {
  const size_t lc = cols / static_cast<size_t>(size()), c0 = lc * static_cast<size_t>(rank());
  for (size_t r = 0; r < rows; ++r) std::memcpy(out + r * lc, in + r * cols + c0, lc * sizeof(float));
}

void TpComm::gather_columns(float* out, const float* in, size_t rows, size_t lc, const char* tag) {
  const size_t S = static_cast<size_t>(size());
  if (alone(out, in, rows * lc)) return;
  // all-gather gives rank-major blocks (S, rows, lc); interleave them into (rows, S lc).
  staging_.resize(S * rows * lc);
  Timer t;
  finish(group_->all_gather(staging_.data(), in, rows * lc, DType::kF32, options<comm::AllGatherOptions>(tag)),
         rows * lc * sizeof(float), t);
  for (size_t s = 0; s < S; ++s)
    for (size_t r = 0; r < rows; ++r)
      std::memcpy(out + r * S * lc + s * lc, staging_.data() + (s * rows + r) * lc, lc * sizeof(float));
}

void TpComm::keep_rows(float* out, const float* in, size_t rows, size_t cols) const {
  const size_t lr = rows / static_cast<size_t>(size());
  std::memcpy(out, in + lr * static_cast<size_t>(rank()) * cols, lr * cols * sizeof(float));
}

// A group of one: the primitive is a copy (or nothing in place). Returns true when it was.
bool TpComm::alone(float* out, const float* in, size_t n) const {
  if (size() != 1) return false;
  if (out != in) std::memcpy(out, in, n * sizeof(float));
  return true;
}

void TpComm::gather_rows(float* out, const float* in, size_t lr, size_t cols, const char* tag) {
  gather_rows(static_cast<void*>(out), static_cast<const void*>(in), lr, cols, DType::kF32, tag);
}

void TpComm::gather_rows(void* out, const void* in, size_t lr, size_t cols, DType dt, const char* tag) {
  const size_t bytes = lr * cols * dtype_size(dt);
  if (size() == 1) {
    if (out != in) std::memcpy(out, in, bytes);
    return;
  }
  Timer t;
  finish(group_->all_gather(out, in, lr * cols, dt, options<comm::AllGatherOptions>(tag)), bytes, t);
}

void TpComm::reduce_scatter_rows(float* out, const float* in, size_t lr, size_t cols, const char* tag) {
  if (alone(out, in, lr * cols)) return;
  Timer t;
  finish(group_->reduce_scatter(out, in, lr * cols, DType::kF32, options<comm::ReduceScatterOptions>(tag)),
         lr * cols * static_cast<size_t>(size()) * sizeof(float), t);
}

}  // namespace mt::parallel
