// NCCL backend: the Backend interface (comm/backend.h) over CUDA device buffers, for ranks that
// train on GPUs ("device": "cuda" with "comm_backend": "nccl"). One NCCL communicator per group,
// bootstrapped over a host group (MPI or local): rank 0's ncclUniqueId is broadcast on it, then
// every rank calls ncclCommInitRank on its current CUDA device.
//
// Buffers are device pointers. Collectives run on the stream given at creation (the training's
// compute stream: models/device_lm.h cuda_stream()), so they are ordered after the kernels that
// produced their inputs; a Work records an event after the call: is_completed() queries it, wait()
// polls it against the timeout (then aborts the communicator and throws CommTimeout) and reports
// NCCL's asynchronous errors.
//
// Reductions: kSum, kAvg (ncclAvg), kMax, kMin. bf16/f16 are reduced by NCCL in their own type,
// every partial sum rounded (in_dtype semantics, DeepSpeed's bf16 communication); a bf16/f16
// reduction asked for without in_dtype is refused (the f32-widened path is the MPI backend's).
// gather, scatter and all_to_all are not implemented (nothing on the GPU path uses them).
//
// One GPU per rank: NCCL refuses two ranks on one device, so a one-GPU machine tests one rank.
#pragma once

#include <memory>

#include "comm/backend.h"

namespace mt::comm {

// Collective over `bootstrap`: a communicator of bootstrap.size() ranks, this rank on CUDA device
// `device` (made current here); collectives on `stream` (a cudaStream_t; nullptr: the default).
std::shared_ptr<Backend> make_nccl_backend(Backend& bootstrap, int device, void* stream);
// "2.27.7": the NCCL library this process loaded.
std::string nccl_version();

}  // namespace mt::comm
