#include "parallel/tp/mappings.h"

#include <cstring>

#include "base/error.h"
#include "base/timer.h"

namespace mt::parallel {

TpComm::TpComm(std::shared_ptr<comm::Backend> group, std::chrono::milliseconds timeout)
    : group_(std::move(group)), timeout_(timeout) {}

void TpComm::reduce(float* buf, size_t n, comm::ReduceOp op, const char* tag) {
  if (size() == 1 || n == 0) return;
  MT_INTERNAL_CHECK(group_ != nullptr);
  comm::AllReduceOptions o;
  o.op = op;
  o.tag = tag;
  o.timeout = timeout_;
  Timer t;
  group_->all_reduce(buf, n, DType::kF32, o)->wait();
  seconds_ += t.seconds();
  bytes_ += n * sizeof(float);
}

void TpComm::all_reduce(float* buf, size_t n, const char* tag) { reduce(buf, n, comm::ReduceOp::kSum, tag); }
void TpComm::all_reduce_max(float* buf, size_t n, const char* tag) { reduce(buf, n, comm::ReduceOp::kMax, tag); }

void TpComm::keep_columns(float* out, const float* in, size_t rows, size_t cols) const {
  const size_t lc = cols / static_cast<size_t>(size()), c0 = lc * static_cast<size_t>(rank());
  for (size_t r = 0; r < rows; ++r) std::memcpy(out + r * lc, in + r * cols + c0, lc * sizeof(float));
}

void TpComm::gather_columns(float* out, const float* in, size_t rows, size_t lc, const char* tag) {
  const size_t S = static_cast<size_t>(size());
  if (S == 1) {
    std::memcpy(out, in, rows * lc * sizeof(float));
    return;
  }
  MT_INTERNAL_CHECK(group_ != nullptr);
  // all-gather gives rank-major blocks (S, rows, lc); interleave them into (rows, S lc).
  staging_.resize(S * rows * lc);
  comm::AllGatherOptions o;
  o.tag = tag;
  o.timeout = timeout_;
  Timer t;
  group_->all_gather(staging_.data(), in, rows * lc, DType::kF32, o)->wait();
  seconds_ += t.seconds();
  bytes_ += rows * lc * sizeof(float);
  for (size_t s = 0; s < S; ++s)
    for (size_t r = 0; r < rows; ++r)
      std::memcpy(out + r * S * lc + s * lc, staging_.data() + (s * rows + r) * lc, lc * sizeof(float));
}

void TpComm::keep_rows(float* out, const float* in, size_t rows, size_t cols) const {
  const size_t lr = rows / static_cast<size_t>(size());
  std::memcpy(out, in + lr * static_cast<size_t>(rank()) * cols, lr * cols * sizeof(float));
}

void TpComm::gather_rows(float* out, const float* in, size_t lr, size_t cols, const char* tag) {
  if (size() == 1) {
    if (out != in) std::memcpy(out, in, lr * cols * sizeof(float));
    return;
  }
  MT_INTERNAL_CHECK(group_ != nullptr);
  comm::AllGatherOptions o;
  o.tag = tag;
  o.timeout = timeout_;
  Timer t;
  group_->all_gather(out, in, lr * cols, DType::kF32, o)->wait();
  seconds_ += t.seconds();
  bytes_ += lr * cols * sizeof(float);
}

void TpComm::reduce_scatter_rows(float* out, const float* in, size_t lr, size_t cols, const char* tag) {
  if (size() == 1) {
    if (out != in) std::memcpy(out, in, lr * cols * sizeof(float));
    return;
  }
  MT_INTERNAL_CHECK(group_ != nullptr);
  comm::ReduceScatterOptions o;
  o.tag = tag;
  o.timeout = timeout_;
  Timer t;
  group_->reduce_scatter(out, in, lr * cols, DType::kF32, o)->wait();
  seconds_ += t.seconds();
  bytes_ += lr * cols * static_cast<size_t>(size()) * sizeof(float);
}

}  // namespace mt::parallel
