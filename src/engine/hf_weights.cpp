#include "engine/hf_weights.h"

#include <cstring>

namespace mt::engine {

void hf_weights_load(nn::ParamStore& store, const checkpoint::SafetensorsFile& file,
                     const std::string& prefix) {
  for (nn::Parameter* p : store.parameters()) {
    std::vector<float> w = file.read_f32(prefix + p->name, p->shape);
    std::memcpy(p->master, w.data(), w.size() * sizeof(float));
  }
  store.sync_compute();
}

}  // namespace mt::engine
