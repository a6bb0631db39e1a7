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

 private:
  int V_;
  Parameter* weight_;
};

}  // namespace mt::nn
