// Run-time ISA dispatch. Kernels with an AVX-512 body call isa_active() once per call and choose
// their path; tests force the portable path with isa_force() to compare the two.
#pragma once

namespace mt {

enum class Isa { kPortable = 0, kAvx512 = 1 };

Isa isa_detected();      // what this CPU supports (AVX-512 F/BW/VL/DQ + BF16)
Isa isa_active();        // detected, unless forced lower (or MT_ISA=portable in the environment)
void isa_force(Isa isa);  // clamps to what is detected
const char* isa_name(Isa isa);

}  // namespace mt
