// One-bit compression with error feedback, and the compressed all-reduce of 1-bit Adam (Tang et al.
// 2021, "1-bit Adam: Communication Efficient Large-Scale Training with Adam's Convergence Speed";
// DeepSpeed's runtime/comm compressed_allreduce), used by 0/1 Adam and 1-bit LAMB as well.
//
// Compression of x (len): bits b[i] = (x[i] >= 0) (NaN counts as >= 0), packed 8 per byte, first
// element in the most significant bit (numpy's packbits), and one scale s = ||x||_2 / sqrt(len)
// (DeepSpeed's norm-based scale). Decompression: y[i] = s · (b[i] ? +1 : -1).
// Error feedback: compress x + e, then e = (x + e) - decompressed, so the sum of the decompressed
// outputs over steps equals the sum of the inputs minus the last error (bounded).
//
// compressed_all_reduce(buf) over n ranks, as DeepSpeed's compressed_allreduce (runtime/comm/
// nccl.py and mpi.py) does it for one tensor, each rank the server of one chunk:
//   0. the buffer is padded with zeros to `padded` = len rounded up to a multiple of
//      n · lcm(n, 8) (DeepSpeed's corrected_tensor_size); chunk = padded / n. The padding is part
//      of the compression: its elements have worker errors and count in the scale's sqrt;
//   1. worker: c = buf + worker_error (padded); one scale s_w = ||c|| / sqrt(padded); bits of c;
//      worker_error = c - Q(c);
//   2. all_to_all: chunk r of every worker's bits (and its scale) goes to rank r;
//   3. server (chunk r): a = sum_w (s_w / n) · (±1) + server_error; server_error = a - Q(a), with
//      Q's scale ||a|| / sqrt(chunk);
//   4. all_gather of Q(a) (scale and bits); every rank decompresses every chunk and keeps the
//      first len elements.
// buf becomes the same on every rank: approximately the average of the inputs.
// A plan compresses several tensors of one flat buffer, each on its own as above (DeepSpeed calls
// compressed_allreduce once per parameter tensor: 1-bit and 0/1 Adam in fp32), with one all_to_all
// and one all_gather for all of them; under fp16 DeepSpeed's fp16 optimizer hands them one flat
// buffer (a plan of one tensor), and 1-bit LAMB always compresses its flat momentum.
// Bytes this rank sends per call (the comms logger's all_to_all + all_gather): 2 · (n - 1) · 4 ·
// sum over tensors of (1 + ceil(chunk / 32)) words: a scale and the chunk's bits.

#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "comm/backend.h"

namespace mt::comm {

// bits (ceil(len/8) bytes) <- x (len): MSB first; the unused low bits of the last byte are 0.
void onebit_pack(uint8_t* bits, const float* x, size_t len);
// y (len) <- scale · (±1 from bits).
void onebit_unpack(float* y, const uint8_t* bits, size_t len, float scale);
// ||x||_2 / sqrt(len) in double, rounded to f32 (0 for len 0).
float onebit_scale(const float* x, size_t len);
// x (len) is compressed with error feedback: c = x + e; bits, scale from c; e = c - Q(c).
// Returns the scale. e (len) is updated in place; x is left as it was.
float onebit_compress(uint8_t* bits, const float* x, float* e, size_t len);

// DeepSpeed's layout of one tensor of len elements over `ranks` (step 0 above).
struct OneBitLayout {
  size_t len = 0;     // elements of the tensor
  int ranks = 1;
  size_t padded = 0;  // len rounded up to a multiple of ranks · lcm(ranks, 8)
  size_t chunk = 0;   // padded / ranks: elements per server chunk (a multiple of 8)
  OneBitLayout(size_t len, int ranks);
  size_t begin(int r) const { return static_cast<size_t>(r) * chunk; }  // in the padded tensor
  size_t words() const { return 1 + (chunk / 8 + 3) / 4; }  // f32 words per chunk on the wire
  size_t sent_bytes() const { return 2 * static_cast<size_t>(ranks - 1) * words() * 4; }
};

// Tensors of one flat buffer, each compressed on its own, and where each one's errors sit.
struct OneBitPlan {
  struct Tensor {
    size_t offset;  // in the flat buffer
    OneBitLayout layout;
    size_t worker_at, server_at;  // its worker errors (layout.padded) and server errors (layout.chunk)
  };
  std::vector<Tensor> tensors;
  size_t worker_error_len = 0, server_error_len = 0, words = 0;
  int ranks = 1;
  // spans: (offset, len) of each tensor in the flat buffer.
  OneBitPlan(const std::vector<std::pair<size_t, size_t>>& spans, int ranks);
  size_t sent_bytes() const { return 2 * static_cast<size_t>(ranks - 1) * words * 4; }
};

// buf's tensors in, each one's compressed average over the ranks of `group` out (the same on
// every rank). worker_error (plan.worker_error_len) and server_error (plan.server_error_len) are
// this rank's error feedback, updated. Collective over group (one all_to_all and one all_gather);
// a group of one returns buf unchanged.
void compressed_all_reduce(Backend& group, float* buf, const OneBitPlan& plan, float* worker_error, float* server_error,
                           const CommOptions& opts = {});
// One tensor of len elements: worker_error has OneBitLayout(len, n).padded elements, server_error
// its chunk.
void compressed_all_reduce(Backend& group, float* buf, size_t len, float* worker_error, float* server_error,
                           const CommOptions& opts = {});

// The scratch compressed_all_reduce keeps on the calling thread from call to call, in bytes, for
// plan (the largest of the plans it has run): the messages sent, received and gathered (ranks ·
// words f32 each), this rank's server message (words) and the largest tensor's server chunk. Pages
// outside the allocator that the process holds from its first exchange on (planner::StageEstimate::
// exchange). 0 for one rank.
size_t compressed_all_reduce_scratch_bytes(const OneBitPlan& plan);
// The calling thread's kept scratch now, in bytes.
size_t compressed_all_reduce_scratch_held();

}  // namespace mt::comm
