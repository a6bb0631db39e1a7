// Token embedding (V, C), a GEMM operand too when tied to the LM head; and learned positions
// (GPT-2's wpe) as a plain f32 table.
#pragma once

#include <cstdint>

#include "nn/module.h"

namespace mt::nn {

class Embedding : public Module {
 public:
  // is_matrix: stored in the compute dtype (true for token tables, which the LM head may use).
  Embedding(std::string name, int V, int C, bool is_matrix, float init_std);
  int V() const { return V_; }
  Parameter* weight() const { return weight_; }

 private:
  int V_;
  Parameter* weight_;
};

}  // namespace mt::nn
