#include "nn/workspace.h"

namespace mt::nn {

void* Workspace::get(WorkSlot slot, size_t bytes) {
  Buffer& b = slots_[static_cast<size_t>(slot)];
  if (b.bytes() < bytes) b = Buffer(bytes, MemCategory::kWorkspace);
  return b.data();
}

}  // namespace mt::nn
