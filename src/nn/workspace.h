// Workspace: named-slot scratch memory (category workspace) that grows to the largest request and is
// then reused every step, so the hot path allocates nothing.
#pragma once

#include <array>
#include <cstddef>

#include "tensor/allocator.h"

namespace mt::nn {

enum class WorkSlot {
  kGemmOperand = 0,
  kLmHeadLogits,
  kLmHeadOperand,
  kLmHeadLse,
  kLmHeadWeight,  // f16 without an f16 matmul: the head's weight widened to f32 (lm_head.cpp)
  kBlockScratch,
  kCount
};

class Workspace {
 public:
  // Returns at least `bytes` of 64-byte-aligned memory for `slot`; contents are unspecified.
  // The pointer stays valid until the next larger request for the same slot.
  void* get(WorkSlot slot, size_t bytes);

 private:
  std::array<Buffer, static_cast<size_t>(WorkSlot::kCount)> slots_;
};

}  // namespace mt::nn
