// One-bit compression and the compressed all-reduce: see onebit.h.
#include "comm/onebit.h"

#include <cmath>
#include <cstring>

namespace mt::comm {

void onebit_pack(uint8_t* bits, const float* x, size_t len) {
  std::memset(bits, 0, (len + 7) / 8);
  for (size_t i = 0; i < len; ++i)
    if (!(x[i] < 0.0f)) bits[i >> 3] |= static_cast<uint8_t>(0x80u >> (i & 7));
}

void onebit_unpack(float* y, const uint8_t* bits, size_t len, float scale) {
  for (size_t i = 0; i < len; ++i) y[i] = (bits[i >> 3] & (0x80u >> (i & 7))) ? scale : -scale;
}

float onebit_scale(const float* x, size_t len) {
  if (len == 0) return 0.0f;
  double sq = 0.0;
  for (size_t i = 0; i < len; ++i) sq += static_cast<double>(x[i]) * x[i];
  return static_cast<float>(std::sqrt(sq / static_cast<double>(len)));
}

float onebit_compress(uint8_t* bits, const float* x, float* e, size_t len) {
  for (size_t i = 0; i < len; ++i) e[i] += x[i];  // e holds c = x + e
  const float s = onebit_scale(e, len);
  onebit_pack(bits, e, len);
  for (size_t i = 0; i < len; ++i) e[i] -= (e[i] < 0.0f) ? -s : s;
  return s;
}

OneBitLayout::OneBitLayout(size_t n, int r) : len(n), ranks(r) {
  MT_CHECK(r >= 1, ErrorKind::kInvalidArgument, "compressed all-reduce: a group needs a rank");
  const size_t per = (n + static_cast<size_t>(r) - 1) / static_cast<size_t>(r);
  chunk = (per + 31) / 32 * 32;
  if (chunk == 0) chunk = 32;
}

size_t OneBitLayout::begin(int r) const {
  const size_t b = static_cast<size_t>(r) * chunk;
  return b < len ? b : len;
}

size_t OneBitLayout::end(int r) const {
  const size_t e = (static_cast<size_t>(r) + 1) * chunk;
  return e < len ? e : len;
}

namespace {

// One chunk on the wire: word 0 the scale, then chunk/8 bytes of bits.
float* wire_scale(std::vector<float>& w, size_t block, size_t words) { return w.data() + block * words; }
uint8_t* wire_bits(std::vector<float>& w, size_t block, size_t words) {
  return reinterpret_cast<uint8_t*>(w.data() + block * words + 1);
}

}  // namespace

void compressed_all_reduce(Backend& group, float* buf, size_t len, float* worker_error, float* server_error,
                           const CommOptions& opts) {
  const int n = group.size(), me = group.rank();
  if (n == 1) return;
  const OneBitLayout L(len, n);
  const size_t W = L.words();
  // 1. Worker: every chunk compressed with its own scale, error kept.
  std::vector<float> send(W * static_cast<size_t>(n), 0.0f), recv(send.size(), 0.0f);
  for (int r = 0; r < n; ++r) {
    const size_t b = L.begin(r), m = L.end(r) - b;
    *wire_scale(send, r, W) = onebit_compress(wire_bits(send, r, W), buf + b, worker_error + b, m);
  }
  // 2. Chunk r of every worker to rank r.
  AllToAllOptions ao;
  static_cast<CommOptions&>(ao) = opts;
  if (ao.tag.empty()) ao.tag = "onebit worker chunks";
  group.all_to_all(recv.data(), send.data(), W, DType::kF32, ao)->wait();
  // 3. Server: average the decompressed chunks, add its error, compress again.
  const size_t b = L.begin(me), m = L.end(me) - b;
  std::vector<float> avg(m, 0.0f), part(m);
  for (int w = 0; w < n; ++w) {
    onebit_unpack(part.data(), wire_bits(recv, w, W), m, *wire_scale(recv, w, W));
    for (size_t i = 0; i < m; ++i) avg[i] += part[i];
  }
  const float inv = 1.0f / static_cast<float>(n);
  for (size_t i = 0; i < m; ++i) avg[i] *= inv;
  std::vector<float> mine(W, 0.0f), all(W * static_cast<size_t>(n), 0.0f);
  std::vector<float> zero(m, 0.0f);
  // Q(avg + server_error) with server_error updated: compress "zero + (avg + e)".
  for (size_t i = 0; i < m; ++i) server_error[i] += avg[i];
  mine[0] = onebit_compress(reinterpret_cast<uint8_t*>(mine.data() + 1), zero.data(), server_error, m);
  // 4. Every server's chunk to every rank.
  AllGatherOptions go;
  static_cast<CommOptions&>(go) = opts;
  if (go.tag.empty()) go.tag = "onebit server chunks";
  group.all_gather(all.data(), mine.data(), W, DType::kF32, go)->wait();
  for (int r = 0; r < n; ++r)
    onebit_unpack(buf + L.begin(r), wire_bits(all, r, W), L.end(r) - L.begin(r), *wire_scale(all, r, W));
}

}  // namespace mt::comm
