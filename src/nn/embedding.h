// Token embedding (V, C), a GEMM operand too when tied to the LM head; and learned positions
// (GPT-2's wpe) as a plain f32 table.
#pragma once

#include <cstdint>

#include "nn/module.h"

namespace mt::nn {

class Embedding : public Module {
 public:
  // is_matrix: stored in the compute dtype (true for token tables, which the LM head may use).
  // Vocabulary-parallel (place.size > 1): the rows are padded to padded_V (a multiple of
  // place.size) and split over the group; rank r holds rows [r·Vl, (r+1)·Vl), Vl = padded_V / size.
  Embedding(std::string name, int V, int C, bool is_matrix, float init_std, TpPlace place = {}, int padded_V = 0);
  int V() const { return V_; }                 // the real vocabulary
  int local_rows() const { return static_cast<int>(weight_->shape[0]); }
  int first_row() const { return weight_->place.rank * local_rows(); }
  Parameter* weight() const { return weight_; }
  // nn.Embedding's padding_idx (row in [0, V), or -1: none): the row that init leaves 0 and that
  // the lookup's backward does not touch (the caller passes local_padding_row() to
  // kernels::embedding_backward).
  void set_padding_row(int row) {
    padding_row_ = row;
    weight_->zero_row = row;
  }
  int padding_row() const { return padding_row_; }
  // The padding row in this shard's numbering; -1 when there is none or another shard holds it.
  int local_padding_row() const {
    const int r = padding_row_ - first_row();
    return padding_row_ >= 0 && r >= 0 && r < local_rows() ? r : -1;
  }

 private:
  int V_;
  Parameter* weight_;
  int padding_row_ = -1;
};

}  // namespace mt::nn
