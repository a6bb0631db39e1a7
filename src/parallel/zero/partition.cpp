#include "parallel/zero/partition.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"

namespace mt::parallel {

bool gathers_in_compute_dtype(const Unit& unit, size_t s, int world) {
  return world >= 2 && 2 * (unit.numel - unit.matrix_numel) < s;
}

ZeroPartition::ZeroPartition(std::vector<Unit> units, int world, int rank)
    : units_(std::move(units)), world_(world), rank_(rank) {
  MT_CHECK(world >= 1 && rank >= 0 && rank < world, ErrorKind::kInvalidArgument,
           "ZeRO partition: rank " + std::to_string(rank) + " of " + std::to_string(world));
  const size_t N = static_cast<size_t>(world);
  for (const Unit& u : units_) {
    MT_CHECK(u.offset == total_, ErrorKind::kInvalidArgument,
             "ZeRO partition: unit " + u.name + " does not start where the previous one ends");
    size_t s = (u.numel + N - 1) / N;
    piece_.push_back(s);
    shard_off_.push_back(shard_numel_);
    shard_numel_ += s;
    total_ += u.numel;
  }
}

size_t ZeroPartition::piece_begin(size_t u) const {
  return units_[u].offset + std::min(units_[u].numel, piece_[u] * static_cast<size_t>(rank_));
}

size_t ZeroPartition::piece_end(size_t u) const {
  return units_[u].offset + std::min(units_[u].numel, piece_[u] * static_cast<size_t>(rank_ + 1));
}

std::vector<optim::ParamSegment> ZeroPartition::shard_segments(const std::vector<optim::ParamSegment>& flat) const {
  std::vector<optim::ParamSegment> out;
  for (size_t u = 0; u < units_.size(); ++u) {
    size_t lo = piece_begin(u), hi = piece_end(u);
    for (const optim::ParamSegment& s : flat) {
      size_t a = std::max(lo, s.offset), b = std::min(hi, s.offset + s.numel);
      if (a >= b) continue;
      out.push_back({shard_off_[u] + (a - lo), b - a, s.weight_decay, s.name});
    }
  }
  return out;
}

void ZeroPartition::flat_to_shard(float* shard, const float* flat) const {
  std::memset(shard, 0, shard_numel_ * sizeof(float));
  for (size_t u = 0; u < units_.size(); ++u)
    std::memcpy(shard + shard_off_[u], flat + piece_begin(u), (piece_end(u) - piece_begin(u)) * sizeof(float));
}

void ZeroPartition::shard_to_flat(float* flat, const float* shard) const {
  for (size_t u = 0; u < units_.size(); ++u)
    std::memcpy(flat + piece_begin(u), shard + shard_off_[u], (piece_end(u) - piece_begin(u)) * sizeof(float));
}

}  // namespace mt::parallel
