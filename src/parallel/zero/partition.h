// ZeRO partition math (pure; shared by the runtime in zero/ and the memory estimator in planner/).
//
// The flat parameter buffer (nn/param_store.h) is cut into units, ranges that are gathered, freed
// and reduced as one: the embeddings, each transformer block, and the tail (final norm and an
// untied LM head). Every unit of n elements is padded to a multiple of the world size N and split
// evenly: rank r owns elements [r·s, (r+1)·s) of the unit, s = ceil(n / N) (the padding, when there
// is any, belongs to the last ranks and is always zero). A rank's shard is its pieces of every unit
// laid end to end, unit by unit: S = sum of s over the units elements.
//
// Gathering unit u is an all_gather of s elements per rank into N·s elements whose first n are the
// unit; reducing its gradient is a reduce_scatter of those N·s elements back to the pieces. So
// every collective is one call per unit with equal counts (DeepSpeed partitions each parameter the
// same way; per unit gives fewer, larger messages).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace mt::parallel {

struct Unit {
  std::string name;     // "embeddings", "h.3", "tail"
  size_t offset = 0;    // first element in the flat buffer
  size_t numel = 0;     // n
  size_t matrix_numel = 0;  // of which GEMM weights (stored in the compute dtype)
};

// A low-precision gather (bf16/f16 compute) of a unit of n elements, m of them GEMM weights, cut in
// N pieces of s. The layers read the GEMM weights in the compute dtype and the rest (norms, biases,
// position tables) in f32. When true, the unit is gathered as two all-gathers in place: every
// rank's piece in the compute dtype, straight into the view (a 2·N·s-byte image of the padded unit,
// each GEMM weight at its offset in the unit), and each piece's other elements in f32, padded to
// the unit's count of them, n - m, into a staging buffer they are copied out of. That moves
// 2 s + 4 (n - m) bytes a rank against the f32 piece's 4 s: taken where that is less
// (2 (n - m) < s) on 2 or more ranks. Otherwise the unit is gathered in f32 into staging and
// converted whole at its use. DeepSpeed gathers its parameters in the compute dtype too (it keeps
// all of them in it).
bool gathers_in_compute_dtype(const Unit& unit, size_t s, int world);

class ZeroPartition {
 public:
  // units: consecutive, covering [0, total) in order. world >= 1, 0 <= rank < world.
  ZeroPartition(std::vector<Unit> units, int world, int rank);

  int world() const { return world_; }
  int rank() const { return rank_; }
  const std::vector<Unit>& units() const { return units_; }
  size_t total() const { return total_; }  // elements of the flat buffer

  size_t piece(size_t u) const { return piece_[u]; }          // s of unit u
  size_t padded(size_t u) const { return piece_[u] * world_; }  // N·s of unit u
  size_t shard_offset(size_t u) const { return shard_off_[u]; }  // where unit u's piece starts in the shard
  size_t shard_numel() const { return shard_numel_; }            // S

  // The elements of this rank's piece of unit u that hold parameters (not padding): the piece is
  // flat [begin, end) (end == begin when it is all padding).
  size_t piece_begin(size_t u) const;
  size_t piece_end(size_t u) const;

  // The optimizer's segments over this rank's shard: each parameter segment of the flat buffer
  // clipped to this rank's pieces, renumbered to shard offsets (weight decay and name kept).
  std::vector<optim::ParamSegment> shard_segments(const std::vector<optim::ParamSegment>& flat) const;

  // Copies this rank's pieces of a flat buffer (total elements) into a shard (S elements, padding
  // zeroed), and back (only the non-padding elements are written).
  void flat_to_shard(float* shard, const float* flat) const;
  void shard_to_flat(float* flat, const float* shard) const;

 private:
  std::vector<Unit> units_;
  int world_, rank_;
  size_t total_ = 0, shard_numel_ = 0;
  std::vector<size_t> piece_, shard_off_;
};

}  // namespace mt::parallel
