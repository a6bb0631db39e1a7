// DeepSpeed-Ulysses sequence parallelism (Jacobs et al. 2023, DeepSpeed's deepspeed/sequence/
// layer.py DistributedAttention): the sp ranks of one group share a micro-batch, rank r holding
// tokens [r Tl, (r+1) Tl) of every sequence (T = sp Tl). Everything but attention runs on those
// local tokens; around attention one all-to-all trades the token split for a head split:
//   to_heads   (B, Tl, W) local tokens x all heads  ->  (B, T, W/sp) all tokens x this rank's heads
//   to_tokens  (B, T, W/sp)                         ->  (B, Tl, W)   (the inverse)
// A row of width W is a run of segments (q | k | v heads, or the attention output's heads), each
// split in sp equal parts: rank j's part of a row is part j of every segment, in segment order, so
// rank j holds q heads [j NH/sp, (j+1) NH/sp) with their kv heads [j NKV/sp, ...) (GQA's grouping
// is kept). The backward of to_heads is to_tokens and vice versa. With a group of one both are
// copies (no collective is issued).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "base/timer.h"
#include "comm/backend.h"
#include "tensor/allocator.h"

namespace mt::parallel {

// Pure layout of the exchange (no communication), for the runtime and its tests.
//   pack_heads:   in (B, Tl, W) -> send (sp, B, Tl, W/sp): block j = rank j's part of each row.
//   unpack_heads: recv (sp, B, Tl, W/sp), block i from rank i -> out (B, T, W/sp), rank i's tokens
//                 at rows [i Tl, (i+1) Tl) of each sequence.
//   pack_tokens / unpack_tokens: the inverse pair.
// segments: the widths (in elements) making up a row of W; each divisible by sp.
void ulysses_pack_heads(float* send, const float* in, size_t B, size_t Tl, const std::vector<size_t>& segments, int sp);
void ulysses_unpack_heads(float* out, const float* recv, size_t B, size_t Tl, size_t w, int sp);
void ulysses_pack_tokens(float* send, const float* in, size_t B, size_t Tl, size_t w, int sp);
void ulysses_unpack_tokens(float* out, const float* recv, size_t B, size_t Tl, const std::vector<size_t>& segments, int sp);

class UlyssesComm {
 public:
  UlyssesComm() = default;
  UlyssesComm(std::shared_ptr<comm::Backend> group, std::chrono::milliseconds timeout);

  int size() const { return group_ ? group_->size() : 1; }
  int rank() const { return group_ ? group_->rank() : 0; }

  // in (B, Tl, W) -> out (B, sp Tl, W/sp), W the sum of segments. out may not alias in.
  void to_heads(float* out, const float* in, size_t B, size_t Tl, const std::vector<size_t>& segments, const char* tag);
  // in (B, sp Tl, W/sp) -> out (B, Tl, W). out may not alias in.
  void to_tokens(float* out, const float* in, size_t B, size_t Tl, const std::vector<size_t>& segments, const char* tag);
  // buf (n) summed over the group in place (the loss's sum and count).
  void all_reduce(float* buf, size_t n, const char* tag);

  size_t bytes() const { return bytes_; }
  double seconds() const { return seconds_; }
  void reset_bytes() { bytes_ = 0; seconds_ = 0.0; }

 private:
  void exchange(size_t block, const char* tag);  // send_ -> recv_, block elements per rank
  // The exchange of n elements: false where there is nothing to exchange (one rank: in copied to
  // out); else send_ and recv_ hold n each.
  bool begin(float* out, const float* in, size_t n);
  std::shared_ptr<comm::Backend> group_;
  std::chrono::milliseconds timeout_ = comm::kDefaultTimeout;
  // The exchange's buffers (accounted comm), grown to the widest exchange and kept: the first block's
  // q, k, v in a step (planner/memory.cpp counts them so).
  Buffer send_, recv_;
  size_t bytes_ = 0;
  double seconds_ = 0.0;
};

}  // namespace mt::parallel
