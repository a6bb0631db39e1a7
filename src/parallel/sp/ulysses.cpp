// UlyssesComm: the all-to-all of DeepSpeed-Ulysses around attention (layout in ulysses.h).
#include "parallel/sp/ulysses.h"

#include <cstring>
#include <string>

#include "base/error.h"

namespace mt::parallel {

namespace {

size_t row_width(const std::vector<size_t>& segments, int sp) {
  size_t W = 0;
  for (size_t s : segments) {
    MT_CHECK(s % static_cast<size_t>(sp) == 0, ErrorKind::kInternal,
             "ulysses: a row segment of " + std::to_string(s) + " elements does not split over " + std::to_string(sp) + " ranks");
    W += s;
  }
  return W;
}

}  // namespace

void ulysses_pack_heads(float* send, const float* in, size_t B, size_t Tl, const std::vector<size_t>& segments, int sp) {
  const size_t S = static_cast<size_t>(sp), W = row_width(segments, sp), w = W / S, rows = B * Tl;
  for (size_t j = 0; j < S; ++j)
    for (size_t r = 0; r < rows; ++r) {
      float* dst = send + (j * rows + r) * w;
      const float* src = in + r * W;
      for (size_t seg : segments) {
        const size_t part = seg / S;
        std::memcpy(dst, src + j * part, part * sizeof(float));
        dst += part;
        src += seg;
      }
    }
}

void ulysses_unpack_heads(float* out, const float* recv, size_t B, size_t Tl, size_t w, int sp) {
  const size_t S = static_cast<size_t>(sp), T = Tl * S;
  for (size_t i = 0; i < S; ++i)
    for (size_t b = 0; b < B; ++b)
      std::memcpy(out + (b * T + i * Tl) * w, recv + (i * B + b) * Tl * w, Tl * w * sizeof(float));
}

void ulysses_pack_tokens(float* send, const float* in, size_t B, size_t Tl, size_t w, int sp) {
  const size_t S = static_cast<size_t>(sp), T = Tl * S;
  for (size_t j = 0; j < S; ++j)
    for (size_t b = 0; b < B; ++b)
      std::memcpy(send + (j * B + b) * Tl * w, in + (b * T + j * Tl) * w, Tl * w * sizeof(float));
}

void ulysses_unpack_tokens(float* out, const float* recv, size_t B, size_t Tl, const std::vector<size_t>& segments, int sp) {
  const size_t S = static_cast<size_t>(sp), W = row_width(segments, sp), w = W / S, rows = B * Tl;
  for (size_t i = 0; i < S; ++i)
    for (size_t r = 0; r < rows; ++r) {
      const float* src = recv + (i * rows + r) * w;
      float* dst = out + r * W;
      for (size_t seg : segments) {
        const size_t part = seg / S;
        std::memcpy(dst + i * part, src, part * sizeof(float));
        src += part;
        dst += seg;
      }
    }
}

UlyssesComm::UlyssesComm(std::shared_ptr<comm::Backend> group, std::chrono::milliseconds timeout)
    : group_(std::move(group)), timeout_(timeout) {}

void UlyssesComm::exchange(size_t block, const char* tag) {
  comm::AllToAllOptions o;
  o.tag = tag;
  o.timeout = timeout_;
  Timer t;
  group_->all_to_all(recv_.as<float>(), send_.as<float>(), block, DType::kF32, o)->wait();
  seconds_ += t.seconds();
  bytes_ += block * static_cast<size_t>(size()) * sizeof(float);
}

bool UlyssesComm::begin(float* out, const float* in, size_t n) {
  if (size() == 1) {
    std::memcpy(out, in, n * sizeof(float));
    return false;
  }
  if (send_.bytes() < n * sizeof(float)) {
    send_ = Buffer();
    recv_ = Buffer();
    send_ = Buffer::uninitialized(n * sizeof(float), MemCategory::kComm);
    recv_ = Buffer::uninitialized(n * sizeof(float), MemCategory::kComm);
  }
  return true;
}

void UlyssesComm::to_heads(float* out, const float* in, size_t B, size_t Tl, const std::vector<size_t>& segments,
                           const char* tag) {
  const int sp = size();
  const size_t W = row_width(segments, sp), n = B * Tl * W;
  if (!begin(out, in, n)) return;
  ulysses_pack_heads(send_.as<float>(), in, B, Tl, segments, sp);
  exchange(n / static_cast<size_t>(sp), tag);
  ulysses_unpack_heads(out, recv_.as<float>(), B, Tl, W / static_cast<size_t>(sp), sp);
}

void UlyssesComm::to_tokens(float* out, const float* in, size_t B, size_t Tl, const std::vector<size_t>& segments,
                            const char* tag) {
  const int sp = size();
  const size_t W = row_width(segments, sp), n = B * Tl * W;
  if (!begin(out, in, n)) return;
  ulysses_pack_tokens(send_.as<float>(), in, B, Tl, W / static_cast<size_t>(sp), sp);
  exchange(n / static_cast<size_t>(sp), tag);
  ulysses_unpack_tokens(out, recv_.as<float>(), B, Tl, segments, sp);
}

void UlyssesComm::all_reduce(float* buf, size_t n, const char* tag) {
  if (size() == 1 || n == 0) return;
  comm::AllReduceOptions o;
  o.tag = tag;
  o.timeout = timeout_;
  Timer t;
  group_->all_reduce(buf, n, DType::kF32, o)->wait();
  seconds_ += t.seconds();
}

}  // namespace mt::parallel
