#include "nn/embedding.h"

namespace mt::nn {

Embedding::Embedding(std::string name, int V, int C, bool is_matrix, float init_std)
    : Module(std::move(name)), V_(V) {
  weight_ = add_parameter("weight", {V, C}, is_matrix, Init::kNormal, init_std);
}

}  // namespace mt::nn
