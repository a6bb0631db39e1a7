#include "nn/embedding.h"

namespace mt::nn {

Embedding::Embedding(std::string name, int V, int C, bool is_matrix, float init_std, TpPlace place, int padded_V)
    : Module(std::move(name)), V_(V) {
  if (place.size == 1) {
    weight_ = add_parameter("weight", {V, C}, is_matrix, Init::kNormal, init_std);
  } else {
    weight_ = add_parameter("weight", {padded_V, C}, is_matrix, Init::kNormal, init_std, TpSplit{0, 1, V}, place);
  }
}

}  // namespace mt::nn
