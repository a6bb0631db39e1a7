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

void* cuda_stream() {
  throw Error(ErrorKind::kNotSupported, "this meshtrain was built without CUDA (-DMT_CUDA=ON)");
}
void* cuda_comm_stream() {
  throw Error(ErrorKind::kNotSupported, "this meshtrain was built without CUDA (-DMT_CUDA=ON)");
}
void cuda_comm_waits_for_compute() {}
void cuda_compute_waits_for_comm() {}

int cuda_select_device() {
  throw Error(ErrorKind::kNotSupported, "this meshtrain was built without CUDA (-DMT_CUDA=ON)");
}

DeviceCeilings cuda_ceilings() {
  throw Error(ErrorKind::kNotSupported, "this meshtrain was built without CUDA (-DMT_CUDA=ON)");
}
void cuda_set_profiling(bool) {
  throw Error(ErrorKind::kNotSupported, "this meshtrain was built without CUDA (-DMT_CUDA=ON)");
}

std::vector<DeviceOpTime> cuda_profile_report() { return {}; }

std::vector<std::pair<std::string, double>> cuda_gemm_probe(int, int, int) { return {}; }
#endif

}  // namespace mt::models
