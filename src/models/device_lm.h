// DeviceLM: a TransformerLM's training step on an accelerator. The host model stays the source of
// truth for names, shapes, offsets, initial weights, checkpoints and export; the device keeps its
// own flat buffers in the same layout (f32 master, compute copy, f32 gradients, AdamW moments) and
// runs forward, backward and the optimizer there. Weights and optimizer state cross to the host
// only to load and save (checkpoints "read back through the host unchanged").
//
// make_cuda_lm(model) builds the CUDA implementation (models/cuda/) for the model's prepared
// micro-batch shape; in a build without MT_CUDA it throws kNotSupported saying how to build one.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/ops.h"  // AdamWParams
#include "models/transformer.h"
#include "optim/optimizer.h"  // ParamSegment
#include "tensor/allocator.h"

namespace mt::models {

class DeviceLM {
 public:
  virtual ~DeviceLM() = default;
  virtual std::string device_name() const = 0;

  // Same contract as TransformerLM::forward/backward (mean loss; gradients += d(loss * scale)).
  virtual float forward(const int32_t* tokens, const int32_t* targets, float loss_scale) = 0;
  virtual void backward() = 0;
  // Called during the following backward() calls each time a range [offset, offset + count) of the
  // flat gradient buffer is final in the compute stream's order: ranges in descending order
  // covering [0, numel) once per backward (a layer at a time where the layout allows, else the
  // whole buffer at the end). The gradient all-reduce starts on them while the backward goes on.
  // An empty function: no calls.
  virtual void set_grad_ready(std::function<void(size_t offset, size_t count)> ready) = 0;
  virtual void zero_grad() = 0;
  // Sum of squares of the gradient buffer (f32, accumulated in double).
  virtual double grad_sum_squares() = 0;
  // AdamW (kernels/cpu/ops.h's formula) over the whole flat buffer, segment by segment with each
  // segment's weight decay; refreshes the compute copy.
  virtual void adamw_step(const std::vector<optim::ParamSegment>& segments, kernels::AdamWParams params) = 0;

  // Host <-> device copies of the flat buffers (numel f32 each).
  virtual void load_master(const float* host) = 0;
  virtual void store_master(float* host) = 0;
  virtual void store_grads(float* host) = 0;
  virtual void load_grads(const float* host) = 0;
  // The flat f32 gradient buffer on the device (numel elements): a GPU communicator (NCCL)
  // reduces it in place.
  virtual float* grads_device() = 0;
  // AdamW moments by the CPU optimizer's names, "exp_avg" and "exp_avg_sq".
  virtual void load_state(const std::string& name, const float* host) = 0;
  virtual void store_state(const std::string& name, float* host) = 0;

  // Device memory by category (the accounted allocator's figures) and its peaks.
  virtual MemStats memory() const = 0;
  virtual void reset_peaks() = 0;
  // Waits for every queued kernel (timings).
  virtual void synchronize() = 0;
};

bool cuda_built();  // this binary was built with MT_CUDA
// The GPU's ceilings measured in this process: a large bf16 GEMM through cuBLASLt (TFLOP/s) and a
// device-to-device copy (GB/s, read + written).
struct DeviceCeilings {
  double bf16_gemm_tflops = 0.0, copy_gbps = 0.0;
};
DeviceCeilings cuda_ceilings();
std::unique_ptr<DeviceLM> make_cuda_lm(TransformerLM& model);
// Makes this rank's GPU current (local rank modulo the visible devices) and returns its index.
int cuda_select_device();
// The compute stream (a cudaStream_t) the device model runs on.
void* cuda_stream();
// The stream a GPU communicator's collectives run on, and its ordering against the compute stream
// (kernels/cuda/device.h comm_waits_for_compute / compute_waits_for_comm).
void* cuda_comm_stream();
void cuda_comm_waits_for_compute();
void cuda_compute_waits_for_comm();
// The benchmark's per-op breakdown: while on, each device op is timed by CUDA events; the report
// waits for them and gives (op, milliseconds, calls) summed since the last report, largest first.
struct DeviceOpTime {
  std::string op;
  double ms = 0.0;
  int calls = 0;
};
void cuda_set_profiling(bool on);
std::vector<DeviceOpTime> cuda_profile_report();
// TFLOP/s of one GEMM shape (M, N, K) under a few epilogues, output types and transposes.
std::vector<std::pair<std::string, double>> cuda_gemm_probe(int M, int N, int K);

}  // namespace mt::models
