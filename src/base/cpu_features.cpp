#include "base/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace mt {
namespace {

Isa detect() {
  __builtin_cpu_init();
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                __builtin_cpu_supports("avx512bf16");
  return avx512 ? Isa::kAvx512 : Isa::kPortable;
}

std::atomic<int>& active_slot() {
  static std::atomic<int> slot = [] {
    Isa isa = detect();
    const char* env = std::getenv("MT_ISA");
    if (env != nullptr && std::strcmp(env, "portable") == 0) isa = Isa::kPortable;
    return static_cast<int>(isa);
  }();
  return slot;
}

}  // namespace

Isa isa_detected() {
  static const Isa isa = detect();
  return isa;
}

Isa isa_active() { return static_cast<Isa>(active_slot().load(std::memory_order_relaxed)); }

void isa_force(Isa isa) {
  int v = static_cast<int>(isa);
  int d = static_cast<int>(isa_detected());
  active_slot() = v < d ? v : d;
}

const char* isa_name(Isa isa) { return isa == Isa::kAvx512 ? "avx512" : "portable"; }

}  // namespace mt
