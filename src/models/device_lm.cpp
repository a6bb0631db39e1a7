#include "models/device_lm.h"

#include "base/error.h"

namespace mt::models {

#ifndef MT_CUDA
bool cuda_built() { return false; }

std::unique_ptr<DeviceLM> make_cuda_lm(TransformerLM&) {
  throw Error(ErrorKind::kNotSupported,
              "device \"cuda\": this meshtrain was built without CUDA (configure with -DMT_CUDA=ON where the "
              "CUDA toolkit is installed; see docs/GPU.md)");
}

DeviceCeilings cuda_ceilings() {
  throw Error(ErrorKind::kNotSupported, "this meshtrain was built without CUDA (-DMT_CUDA=ON)");
}
#endif

}  // namespace mt::models
