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
// compressed_all_reduce(buf) over n ranks, each rank the server of one chunk of buf:
//   1. worker: c = buf + worker_error; per chunk r: scale s_r and bits; worker_error = c - Q(c)
//   2. all_to_all: chunk r of every worker goes to rank r (scale and bits, 1 + chunk/32 floats)
//   3. server (chunk r): a = (1/n) sum_w Q_w(c_w,r) + server_error; server_error = a - Q(a)
//   4. all_gather of Q(a) (scale and bits); every rank decompresses every chunk into buf.
// buf becomes the same on every rank: approximately the average of the inputs.
// NOTE: DeepSpeed's worker keeps one scale per tensor; here a worker has one scale per server
// chunk (n scales of 4 bytes: DeepSpeed's layout otherwise), since buf is the whole flat buffer.
//
// Chunks: chunk = ceil(len / n) rounded up to a multiple of 32 elements (whole bytes of bits and a
// whole number of 4-byte words on the wire); chunk r covers [r·chunk, min((r+1)·chunk, len)) and
// may be short or empty at the end (the padding carries no data and no error).
// Bytes this rank sends per call (counted by the comms logger as all_to_all + all_gather):
//   2 · (n - 1) · (4 + chunk / 8)          against 2 · (n - 1) · len · 4 / n for an f32 all-reduce.
#pragma once

#include <cstddef>
#include <cstdint>
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

struct OneBitLayout {
  size_t len = 0;   // elements of buf
  int ranks = 1;
  size_t chunk = 0; // elements per server chunk (multiple of 32)
  OneBitLayout(size_t len, int ranks);
  size_t begin(int r) const;
  size_t end(int r) const;
  size_t words() const { return 1 + chunk / 32; }  // f32 words per chunk on the wire
  size_t sent_bytes() const { return 2 * static_cast<size_t>(ranks - 1) * words() * 4; }
};

// buf (len) in, the compressed average over the ranks of `group` out (the same on every rank).
// worker_error (len) and server_error (layout.chunk) are this rank's error feedback, updated.
// Collective over group (one all_to_all and one all_gather); a group of one returns buf unchanged.
void compressed_all_reduce(Backend& group, float* buf, size_t len, float* worker_error, float* server_error,
                           const CommOptions& opts = {});

}  // namespace mt::comm
