// Block layouts of DeepSpeed's sparse attention
// (deepspeed/ops/sparse_attention/sparsity_config.py): which (block x block) tiles of each head's
// (T, T) score matrix are computed. A layout is (num_heads, nb, nb) with nb = T / block; entry (h,
// r, c) = 1 iff query block r of head h attends to key block c. Modes and keys are DeepSpeed's,
// with its defaults:
//   dense         every block
//   fixed         Child et al. 2019 ("Generative Modeling with Sparse Transformers"): local windows
//                 of num_local_blocks, the last num_global_blocks of each window attended by all
//   variable      fixed with a list of window sizes, explicit global blocks and random blocks
//   bigbird       Zaheer et al. 2020: random + sliding window + the first global blocks
//   bslongformer  Beltagy et al. 2020, block-sparse: sliding window + global rows and columns
// "unidirectional" makes the local windows causal and starts global columns at their own block;
// bigbird and bslongformer then keep only blocks at or below the diagonal. variable, as in
// DeepSpeed, may keep random blocks and global ranges above it. Masking inside the diagonal blocks
// and dropping blocks above it is the kernel's causal flag (sparse_attention.h).
//
// Deviations from DeepSpeed, on purpose:
// - Random blocks are drawn with std::mt19937 seeded by SparsityConfig::seed (one stream for the
//   whole layout, heads and rows in DeepSpeed's order), not Python's `random`: the count per row
//   and the range drawn from are DeepSpeed's, the blocks drawn are not. Same seed, same layout.
// - Values DeepSpeed accepts only by accident of Python (negative counts or block indices, which
//   slice from the end) are refused, as are non-positive block sizes and head counts.
// Every refusal throws mt::Error(kInvalidArgument) naming the key as "sparse_attention.<key>".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace mt::kernels {

enum class SparseDirection { kBidirectional, kUnidirectional };

// "bidirectional" / "unidirectional" (DeepSpeed's `attention` key); anything else throws.
SparseDirection sparse_direction_from_name(std::string_view name);
const char* sparse_direction_name(SparseDirection direction);

struct DenseSparsity {};

struct FixedSparsity {
  int num_local_blocks = 4;
  int num_global_blocks = 1;
  SparseDirection attention = SparseDirection::kBidirectional;
  bool horizontal_global_attention = false;
  int num_different_global_patterns = 1;
};

struct VariableSparsity {
  int num_random_blocks = 0;
  std::vector<int> local_window_blocks{4};
  std::vector<int> global_block_indices{0};
  std::optional<std::vector<int>> global_block_end_indices = std::nullopt;  // None: single blocks
  SparseDirection attention = SparseDirection::kBidirectional;
  bool horizontal_global_attention = false;
};

struct BigBirdSparsity {
  int num_random_blocks = 1;
  int num_sliding_window_blocks = 3;
  int num_global_blocks = 1;
  SparseDirection attention = SparseDirection::kBidirectional;
};

struct BSLongformerSparsity {
  int num_sliding_window_blocks = 3;
  std::vector<int> global_block_indices{0};
  std::optional<std::vector<int>> global_block_end_indices = std::nullopt;
  SparseDirection attention = SparseDirection::kBidirectional;
};

using SparsityPattern = std::variant<DenseSparsity, FixedSparsity, VariableSparsity,
                                     BigBirdSparsity, BSLongformerSparsity>;

// DeepSpeed's `mode` names: "dense", "fixed", "variable", "bigbird", "bslongformer".
const char* sparsity_mode_name(const SparsityPattern& pattern);

struct SparsityConfig {
  int num_heads = 1;
  int block = 16;
  bool different_layout_per_head = false;  // false: head 0's layout is copied to every head
  SparsityPattern pattern = FixedSparsity{};
  uint64_t seed = 0;  // random blocks (variable, bigbird) only
};

struct SparseLayout {
  int num_heads = 0;
  int num_blocks = 0;  // nb = T / block
  int block = 0;
  std::vector<uint8_t> blocks;  // (num_heads, nb, nb), 0 or 1

  uint8_t at(int h, int r, int c) const {
    return blocks[(static_cast<size_t>(h) * num_blocks + r) * num_blocks + c];
  }
  size_t nonzero_blocks() const;
};

// Checks the config's keys (the errors DeepSpeed raises when the config is built).
void sparsity_config_validate(const SparsityConfig& config);

// The layout for sequence length T. Throws for an invalid config, T % block != 0, and the
// length-dependent errors of DeepSpeed (window or random counts larger than nb).
SparseLayout sparse_layout_make(const SparsityConfig& config, int T);

// DeepSpeed's SparseSelfAttention builds its layout once for max_seq_length (2048 by default) and
// runs a length L on its first L / block rows and columns (get_layout). The layout a model of
// length T runs, so: sparse_layout_make for max(T, 2048), cropped to T's blocks (for T itself
// where block does not divide 2048: DeepSpeed's default would not build). The layout made for T
// alone differed where the pattern depends on the length: fixed with horizontal global attention
// when T / block is not a multiple of num_local_blocks, and the range random blocks are drawn from.
constexpr int kDeepSpeedMaxSeqLength = 2048;
SparseLayout sparse_layout_for_length(const SparsityConfig& config, int T);

}  // namespace mt::kernels
