#include "parallel/dp/grad_buckets.h"

#include <algorithm>
#include <string>

#include "base/error.h"

namespace mt::parallel {

std::vector<std::pair<size_t, size_t>> grad_bucket_ranges(size_t numel, size_t bucket_elems) {
  MT_CHECK(bucket_elems > 0, ErrorKind::kInvalidArgument, "reduce_bucket_size must be positive");
  std::vector<std::pair<size_t, size_t>> r;
  for (size_t hi = numel; hi > 0;) {
    size_t lo = hi > bucket_elems ? hi - bucket_elems : 0;
    r.emplace_back(lo, hi);
    hi = lo;
  }
  return r;
}

GradBuckets::GradBuckets(float* grad, size_t numel, size_t bucket_elems, comm::Backend& group, bool overlap,
                         std::chrono::milliseconds timeout, DType wire)
    : grad_(grad), group_(group), overlap_(overlap), timeout_(timeout), ranges_(grad_bucket_ranges(numel, bucket_elems)),
      wire_(wire) {}

void GradBuckets::begin() {
  MT_CHECK(inflight_.empty(), ErrorKind::kInternal, "GradBuckets::begin with reductions in flight");
  next_ = 0;
  armed_ = true;
}

void GradBuckets::poll() {
  for (auto& w : inflight_)
    if (w) w->is_completed();  // MPI progresses nonblocking collectives inside MPI_Test
}

void GradBuckets::ready_from(size_t offset) {
  if (!armed_) return;
  poll();
  while (next_ < ranges_.size() && ranges_[next_].first >= offset) {
    auto [lo, hi] = ranges_[next_];
    comm::AllReduceOptions o;
    o.op = comm::ReduceOp::kSum;
    o.timeout = timeout_;
    o.tag = "grad bucket " + std::to_string(next_);
    if (wire_ == DType::kF32) {
      inflight_.push_back(group_.all_reduce(grad_ + lo, hi - lo, DType::kF32, o));
    } else {
      Buffer& b = staging_.emplace_back((hi - lo) * dtype_size(wire_), MemCategory::kComm);
      convert(b.data(), wire_, grad_ + lo, DType::kF32, hi - lo);
      o.in_dtype = true;
      inflight_.push_back(group_.all_reduce(b.data(), hi - lo, wire_, o));
    }
    if (!overlap_) inflight_.back()->wait();
    ++next_;
  }
}

void GradBuckets::finish() {
  if (!armed_) return;
  ready_from(0);
  for (auto& w : inflight_) w->wait();
  for (size_t i = 0; i < staging_.size(); ++i) {
    auto [lo, hi] = ranges_[i];
    convert(grad_ + lo, DType::kF32, staging_[i].data(), wire_, hi - lo);
  }
  staging_.clear();
  inflight_.clear();
  armed_ = false;
}

}  // namespace mt::parallel
