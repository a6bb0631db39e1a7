// Error checks for CUDA runtime and cuBLAS calls inside kernels/cuda/ (.cu files only).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "base/error.h"

#define MT_CUDA_CHECK(expr)                                                                        \
  do {                                                                                             \
    cudaError_t mt_e_ = (expr);                                                                    \
    if (mt_e_ != cudaSuccess)                                                                      \
      throw ::mt::Error(::mt::ErrorKind::kInternal,                                                \
                        std::string(#expr) + " failed: " + cudaGetErrorString(mt_e_) + " (" +     \
                            __FILE__ + ":" + std::to_string(__LINE__) + ")");                     \
  } while (0)

#define MT_LAUNCH_CHECK(name) ::mt::cuda::check_launch(name)
