// DeepSpeed's block-sparse layouts (sparse_layout.h). Each mode fills head h's (nb, nb) plane in
// DeepSpeed's order (random, then local or sliding window, then global); without
// different_layout_per_head only head 0 is built and copied to the others.
#include "kernels/cpu/sparse_layout.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "base/error.h"

namespace mt::kernels {
namespace {

bool is_uni(SparseDirection d) {
  return d == SparseDirection::kUnidirectional;
}

// Throws "sparse_attention.<key>: <what>" unless ok.
void require(bool ok, const char* key, const std::string& what) {
  MT_CHECK(ok, ErrorKind::kInvalidArgument, std::string("sparse_attention.") + key + ": " + what);
}

std::string str(int v) {
  return std::to_string(v);
}

void require_min(int value, int min, const char* key) {
  require(value >= min, key, str(value) + " must be >= " + str(min));
}

void require_indices(const std::vector<int>& starts, const std::optional<std::vector<int>>& ends) {
  for (int s : starts) require_min(s, 0, "global_block_indices");
  if (!ends) return;
  require(ends->size() == starts.size(), "global_block_end_indices",
          "has " + std::to_string(ends->size()) + " entries, global_block_indices has " +
              std::to_string(starts.size()) + "; they must be the same length");
  for (size_t i = 0; i < starts.size(); ++i)
    require(starts[i] < (*ends)[i], "global_block_end_indices",
            "end " + str((*ends)[i]) + " must be larger than its start " + str(starts[i]));
}

void require_bidirectional_for_horizontal(bool horizontal, SparseDirection attention) {
  require(!(horizontal && is_uni(attention)), "horizontal_global_attention",
          "only bidirectional attention supports horizontal global attention");
}

// One head's (nb, nb) plane.
class Plane {
 public:
  Plane(uint8_t* p, int nb) : p_(p), nb_(nb) {}
  int nb() const { return nb_; }
  void set(int r, int c) { p_[static_cast<size_t>(r) * nb_ + c] = 1; }
  // Rows [r0, r1) x columns [c0, c1), clipped to the plane (Python slicing of non-negatives).
  void fill(int r0, int r1, int c0, int c1) {
    r1 = std::min(r1, nb_);
    c1 = std::min(c1, nb_);
    for (int r = r0; r < r1; ++r)
      for (int c = c0; c < c1; ++c) set(r, c);
  }
  // Rows [r0, r1): columns from the window start c0 to the row itself (unidirectional) or to c1.
  void window(int r0, int r1, int c0, int c1, bool uni) {
    r1 = std::min(r1, nb_);
    for (int r = r0; r < r1; ++r)
      for (int c = c0; c < (uni ? r + 1 : std::min(c1, nb_)); ++c) set(r, c);
  }
  void sliding(int num_sliding_window_blocks) {
    const int w = num_sliding_window_blocks / 2;
    for (int r = 0; r < nb_; ++r) fill(r, r + 1, std::max(0, r - w), r + w + 1);
  }
  void lower_triangle() {
    for (int r = 0; r < nb_; ++r)
      std::fill(p_ + static_cast<size_t>(r) * nb_ + r + 1, p_ + static_cast<size_t>(r + 1) * nb_,
                0);
  }

 private:
  uint8_t* p_;
  int nb_;
};

// Uniform in [0, n) from 32-bit draws, by rejection (std::uniform_int_distribution is not the same
// across standard libraries; this is).
uint32_t draw_below(std::mt19937& gen, uint32_t n) {
  const uint32_t threshold = (0u - n) % n;  // 2^32 mod n
  for (;;) {
    const uint32_t x = gen();
    if (x >= threshold) return x % n;
  }
}

// Python's random.sample(range(population), count) in spirit: count distinct columns, each row.
void set_random(Plane plane, std::mt19937& gen, int row, int population, int count) {
  std::vector<int> cols(population);
  std::iota(cols.begin(), cols.end(), 0);
  for (int i = 0; i < count; ++i) {
    std::swap(cols[i], cols[i + draw_below(gen, static_cast<uint32_t>(population - i))]);
    plane.set(row, cols[i]);
  }
}

void make_fixed(Plane plane, int h, const FixedSparsity& f) {
  const int nb = plane.nb(), L = f.num_local_blocks, G = f.num_global_blocks;
  const bool uni = is_uni(f.attention);
  for (int i = 0; i < nb; i += L) plane.window(i, i + L, i, i + L, uni);

  // The last G blocks of each full window (other heads: earlier groups of G, round robin).
  const int first = L - (1 + h % f.num_different_global_patterns) * G;
  const int full_end = nb - nb % L;
  auto global = [&](int start, int end) {
    plane.fill(uni ? start : 0, nb, start, end);
    if (f.horizontal_global_attention) plane.fill(start, end, 0, nb);
  };
  for (int i = first; i < full_end; i += L) global(i, i + G);
  if (full_end < nb) {  // a short last window: its global blocks, shifted left to fit
    int start = std::min(full_end + first, nb - G);
    const int end = start + G;
    if (start < 0) start = std::max(0, start + nb);  // DeepSpeed slices from the end here
    global(start, end);
  }
}

void make_variable(Plane plane, int h, const VariableSparsity& v, std::mt19937& gen) {
  const int nb = plane.nb();
  const bool uni = is_uni(v.attention);
  require(v.num_random_blocks <= nb, "num_random_blocks",
          str(v.num_random_blocks) + " is more than the " + str(nb) + " blocks of a row");
  for (int r = 0; r < nb; ++r) set_random(plane, gen, r, nb, v.num_random_blocks);

  // Windows of the listed sizes, then windows of the last size to the end.
  int start = 0, end = 0;
  for (int size : v.local_window_blocks) {
    end = std::min(end + size, nb);
    plane.window(start, end, start, end, uni);
    start += size;
  }
  const int size = v.local_window_blocks.back();
  for (int i = start; i < nb; i += size) plane.window(i, i + size, i, i + size, uni);

  for (size_t k = 0; k < v.global_block_indices.size(); ++k) {
    const int s = v.global_block_indices[k];
    const int e = v.global_block_end_indices ? (*v.global_block_end_indices)[k] : s + 1;
    if (s >= nb) continue;
    if (v.horizontal_global_attention) plane.fill(s, e, 0, nb);
    plane.fill(uni ? s : 0, nb, s, e);
  }
}

void make_bigbird(Plane plane, const BigBirdSparsity& b, std::mt19937& gen) {
  const int nb = plane.nb();
  const bool uni = is_uni(b.attention);
  require(b.num_random_blocks <= nb, "num_random_blocks",
          str(b.num_random_blocks) + " is more than the " + str(nb) + " blocks of a row");
  require(!uni || b.num_random_blocks <= 1, "num_random_blocks",
          str(b.num_random_blocks) +
              " random blocks cannot be drawn for block row 0 with unidirectional attention "
              "(it sees 1 block)");
  for (int r = 0; r < nb; ++r) set_random(plane, gen, r, uni ? r + 1 : nb, b.num_random_blocks);
  require(b.num_sliding_window_blocks <= nb, "num_sliding_window_blocks",
          str(b.num_sliding_window_blocks) + " is more than the " + str(nb) + " blocks of a row");
  plane.sliding(b.num_sliding_window_blocks);
  require(b.num_global_blocks <= nb, "num_global_blocks",
          str(b.num_global_blocks) + " is more than the " + str(nb) + " blocks of a row");
  plane.fill(0, b.num_global_blocks, 0, nb);
  plane.fill(0, nb, 0, b.num_global_blocks);
  if (uni) plane.lower_triangle();
}

void make_bslongformer(Plane plane, const BSLongformerSparsity& l) {
  const int nb = plane.nb();
  require(l.num_sliding_window_blocks <= nb, "num_sliding_window_blocks",
          str(l.num_sliding_window_blocks) + " is more than the " + str(nb) + " blocks of a row");
  plane.sliding(l.num_sliding_window_blocks);
  for (size_t k = 0; k < l.global_block_indices.size(); ++k) {
    const int s = l.global_block_indices[k];
    const int e = l.global_block_end_indices ? (*l.global_block_end_indices)[k] : s + 1;
    if (s >= nb) continue;
    plane.fill(s, e, 0, nb);
    plane.fill(0, nb, s, e);
  }
  if (is_uni(l.attention)) plane.lower_triangle();
}

struct Validate {
  bool different_layout_per_head;
  void operator()(const DenseSparsity&) const {}
  void operator()(const FixedSparsity& f) const {
    require_min(f.num_local_blocks, 1, "num_local_blocks");
    require_min(f.num_global_blocks, 1, "num_global_blocks");
    require(f.num_local_blocks % f.num_global_blocks == 0, "num_local_blocks",
            str(f.num_local_blocks) + " must be divisible by num_global_blocks (" +
                str(f.num_global_blocks) + ")");
    require_bidirectional_for_horizontal(f.horizontal_global_attention, f.attention);
    require_min(f.num_different_global_patterns, 1, "num_different_global_patterns");
    require(f.num_different_global_patterns == 1 || different_layout_per_head,
            "num_different_global_patterns",
            "more than one pattern needs different_layout_per_head = true");
    const int most = f.num_local_blocks / f.num_global_blocks;
    require(f.num_different_global_patterns <= most, "num_different_global_patterns",
            str(f.num_different_global_patterns) +
                " is more than num_local_blocks / num_global_blocks = " + str(most));
  }
  void operator()(const VariableSparsity& v) const {
    require_min(v.num_random_blocks, 0, "num_random_blocks");
    require(!v.local_window_blocks.empty(), "local_window_blocks", "must not be empty");
    for (int w : v.local_window_blocks) require_min(w, 0, "local_window_blocks");
    require_min(v.local_window_blocks.back(), 1, "local_window_blocks");  // its last entry
    require_indices(v.global_block_indices, v.global_block_end_indices);
    require_bidirectional_for_horizontal(v.horizontal_global_attention, v.attention);
  }
  void operator()(const BigBirdSparsity& b) const {
    require_min(b.num_random_blocks, 0, "num_random_blocks");
    require_min(b.num_sliding_window_blocks, 0, "num_sliding_window_blocks");
    require_min(b.num_global_blocks, 0, "num_global_blocks");
  }
  void operator()(const BSLongformerSparsity& l) const {
    require_min(l.num_sliding_window_blocks, 0, "num_sliding_window_blocks");
    require_indices(l.global_block_indices, l.global_block_end_indices);
  }
};

}  // namespace

SparseDirection sparse_direction_from_name(std::string_view name) {
  if (name == "bidirectional") return SparseDirection::kBidirectional;
  if (name == "unidirectional") return SparseDirection::kUnidirectional;
  std::string what(name);  // (built by appends: GCC 12 warns falsely on "'" + std::string)
  what += " is not one of \"bidirectional\", \"unidirectional\"";
  require(false, "attention", what);
  return SparseDirection::kBidirectional;
}

const char* sparse_direction_name(SparseDirection direction) {
  return is_uni(direction) ? "unidirectional" : "bidirectional";
}

const char* sparsity_mode_name(const SparsityPattern& pattern) {
  static const char* const kNames[] = {"dense", "fixed", "variable", "bigbird", "bslongformer"};
  return kNames[pattern.index()];
}

size_t SparseLayout::nonzero_blocks() const {
  return static_cast<size_t>(std::count(blocks.begin(), blocks.end(), uint8_t{1}));
}

void sparsity_config_validate(const SparsityConfig& config) {
  require_min(config.num_heads, 1, "num_heads");
  require_min(config.block, 1, "block");
  std::visit(Validate{config.different_layout_per_head}, config.pattern);
}

SparseLayout sparse_layout_make(const SparsityConfig& config, int T) {
  sparsity_config_validate(config);
  require(T > 0 && T % config.block == 0, "block",
          "the sequence length " + str(T) + " must be a positive multiple of block (" +
              str(config.block) + ")");
  SparseLayout layout;
  layout.num_heads = config.num_heads;
  layout.num_blocks = T / config.block;
  layout.block = config.block;
  const int nb = layout.num_blocks;
  const size_t plane_size = static_cast<size_t>(nb) * nb;
  layout.blocks.assign(plane_size * config.num_heads, 0);
  std::mt19937 gen(static_cast<std::mt19937::result_type>(config.seed));
  const int built = config.different_layout_per_head ? config.num_heads : 1;
  for (int h = 0; h < built; ++h) {
    Plane plane(layout.blocks.data() + h * plane_size, nb);
    const SparsityPattern& p = config.pattern;
    if (std::holds_alternative<DenseSparsity>(p)) plane.fill(0, nb, 0, nb);
    if (auto* f = std::get_if<FixedSparsity>(&p)) make_fixed(plane, h, *f);
    if (auto* v = std::get_if<VariableSparsity>(&p)) make_variable(plane, h, *v, gen);
    if (auto* b = std::get_if<BigBirdSparsity>(&p)) make_bigbird(plane, *b, gen);
    if (auto* l = std::get_if<BSLongformerSparsity>(&p)) make_bslongformer(plane, *l);
  }
  for (int h = built; h < config.num_heads; ++h)
    std::copy_n(layout.blocks.begin(), plane_size, layout.blocks.begin() + h * plane_size);
  return layout;
}

SparseLayout sparse_layout_for_length(const SparsityConfig& config, int T) {
  const int master = T < kDeepSpeedMaxSeqLength && kDeepSpeedMaxSeqLength % config.block == 0 ? kDeepSpeedMaxSeqLength : T;
  SparseLayout full = sparse_layout_make(config, master);
  require(T > 0 && T % config.block == 0, "block",
          "the sequence length " + str(T) + " must be a positive multiple of block (" + str(config.block) + ")");
  if (master == T) return full;
  SparseLayout out;
  out.num_heads = full.num_heads;
  out.block = full.block;
  out.num_blocks = T / config.block;
  const int nb = out.num_blocks;
  out.blocks.resize(static_cast<size_t>(out.num_heads) * nb * nb);
  for (int h = 0; h < out.num_heads; ++h)
    for (int r = 0; r < nb; ++r)
      for (int c = 0; c < nb; ++c) out.blocks[(static_cast<size_t>(h) * nb + r) * nb + c] = full.at(h, r, c);
  return out;
}

}  // namespace mt::kernels
