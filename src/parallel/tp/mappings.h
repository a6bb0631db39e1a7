// Megatron's tensor-parallel mappings (megatron/core/tensor_parallel/mappings.py), as forward and
// backward functions over the tp group, for layers whose forward and backward are written side by
// side. Each region is a pair (forward, backward):
//   copy to region          identity            | all-reduce
//   reduce from region      all-reduce          | identity
//   scatter to region       keep my column slice| all-gather columns
//   gather from region      all-gather columns  | keep my column slice
//   (sequence parallel, rows = tokens)
//   scatter to sequence     keep my row block   | all-gather rows
//   gather from sequence    all-gather rows     | reduce-scatter rows
//   reduce-scatter to seq.  reduce-scatter rows | all-gather rows
// so the primitives are: all_reduce, keep/all-gather columns, keep/all-gather/reduce-scatter rows.
// With a group of one every primitive is a copy or nothing (no collective is issued).
// Buffers are f32 (a gather also takes the compute dtype); bytes() counts what this rank handed to the collectives (for PERF.md's
// bytes-per-step against the formula).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "base/timer.h"
#include "comm/backend.h"

namespace mt::parallel {

class TpComm {
 public:
  TpComm() = default;
  TpComm(std::shared_ptr<comm::Backend> group, std::chrono::milliseconds timeout);
  // A place in a group without the group: for building shapes only (the memory estimator); any
  // collective on it is an internal error.
  TpComm(int rank, int size) : rank_(rank), size_(size) {}

  int size() const { return group_ ? group_->size() : size_; }
  int rank() const { return group_ ? group_->rank() : rank_; }

  // buf (n) summed over the group in place (reduce-from forward, copy-to backward).
  void all_reduce(float* buf, size_t n, const char* tag);
  // in (rows, cols) -> out (rows, cols / size): this rank's column slice (scatter forward,
  // gather backward). out may not alias in.
  void keep_columns(float* out, const float* in, size_t rows, size_t cols) const;
  // in (rows, lc) -> out (rows, lc * size): columns of rank r at [r lc, (r+1) lc).
  void gather_columns(float* out, const float* in, size_t rows, size_t lc, const char* tag);
  // in (rows, cols) -> out (rows / size, cols): this rank's block of rows.
  void keep_rows(float* out, const float* in, size_t rows, size_t cols) const;
  // in (lr, cols) -> out (lr * size, cols): rank r's rows at block r.
  void gather_rows(float* out, const float* in, size_t lr, size_t cols, const char* tag);
  // The same for elements of dtype dt: a GEMM's input already in the compute dtype is gathered as
  // it is (Megatron gathers the bf16 norm output), half the bytes of its f32 values.
  void gather_rows(void* out, const void* in, size_t lr, size_t cols, DType dt, const char* tag);
  // in (lr * size, cols) -> out (lr, cols): block `rank` of the sum over the group.
  void reduce_scatter_rows(float* out, const float* in, size_t lr, size_t cols, const char* tag);

  // Max over the group in place (vocab-parallel cross-entropy's row max).
  void all_reduce_max(float* buf, size_t n, const char* tag);
  size_t bytes() const { return bytes_; }
  double seconds() const { return seconds_; }  // wall time inside the collectives (waiting included)
  void reset_bytes() { bytes_ = 0; seconds_ = 0.0; }

 private:
  void reduce(float* buf, size_t n, comm::ReduceOp op, const char* tag);
  template <typename Options>
  Options options(const char* tag) const;
  void finish(std::unique_ptr<comm::Work> work, size_t handed_bytes, const Timer& started);
  bool alone(float* out, const float* in, size_t n) const;
  std::shared_ptr<comm::Backend> group_;
  std::chrono::milliseconds timeout_ = comm::kDefaultTimeout;
  std::vector<float> staging_;
  size_t bytes_ = 0;
  double seconds_ = 0.0;
  int rank_ = 0, size_ = 1;
};

}  // namespace mt::parallel
