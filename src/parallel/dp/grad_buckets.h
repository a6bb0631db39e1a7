// GradBuckets: data-parallel gradient reduction (ZeRO stage 0) over the flat f32 gradient buffer,
// in buckets of at most bucket_elems elements (DeepSpeed's reduce_bucket_size), all-reduced (sum)
// as soon as backward has finished every gradient inside them.
//
// Backward runs from the end of the flat buffer towards its start (tail, last block, ..., first
// block, embeddings), so buckets are cut from the end: [numel - b, numel), [numel - 2b, numel - b),
// ... Calling ready_from(offset) when every gradient in [offset, numel) is final launches each
// bucket lying wholly inside it (nonblocking); finish() launches the rest and waits for all. With
// overlap false each bucket is waited for when launched (so nothing runs behind compute).
// Only the last micro-batch of an accumulation communicates: the engine arms begin() then.
// wire bf16/f16 (DeepSpeed's communication_data_type): each bucket is rounded into a 2-byte staging
// buffer (comm memory, held until finish()), summed in that type on the wire (in_dtype) and
// widened back into the f32 gradients: half the bytes, each partial sum rounded.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "comm/backend.h"
#include "tensor/allocator.h"

namespace mt::parallel {

// Bucket ranges [lo, hi) of a flat buffer of numel elements, cut from the end, in launch order.
std::vector<std::pair<size_t, size_t>> grad_bucket_ranges(size_t numel, size_t bucket_elems);

class GradBuckets {
 public:
  GradBuckets(float* grad, size_t numel, size_t bucket_elems, comm::Backend& group, bool overlap,
              std::chrono::milliseconds timeout = comm::kDefaultTimeout, DType wire = DType::kF32);
  void begin();                    // the last micro-batch's backward starts
  bool armed() const { return armed_; }
  void ready_from(size_t offset);  // gradients of [offset, numel) are final
  void finish();                   // launches what is left and waits for everything
  size_t launched() const { return next_; }
  size_t count() const { return ranges_.size(); }

 private:
  void poll();
  float* grad_;
  comm::Backend& group_;
  bool overlap_;
  std::chrono::milliseconds timeout_;
  std::vector<std::pair<size_t, size_t>> ranges_;
  DType wire_;
  std::vector<std::unique_ptr<comm::Work>> inflight_;
  std::vector<Buffer> staging_;  // wire != f32: one per launched bucket, in launch order
  size_t next_ = 0;
  bool armed_ = false;
};

}  // namespace mt::parallel
