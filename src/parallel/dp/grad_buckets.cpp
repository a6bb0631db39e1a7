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
                         std::chrono::milliseconds timeout)
    : grad_(grad), group_(group), overlap_(overlap), timeout_(timeout), ranges_(grad_bucket_ranges(numel, bucket_elems)) {}

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
    inflight_.push_back(group_.all_reduce(grad_ + lo, hi - lo, DType::kF32, o));
    if (!overlap_) inflight_.back()->wait();
    ++next_;
  }
}

void GradBuckets::finish() {
  if (!armed_) return;
  ready_from(0);
  for (auto& w : inflight_) w->wait();
  inflight_.clear();
  armed_ = false;
}

}  // namespace mt::parallel
