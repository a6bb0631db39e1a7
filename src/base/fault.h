// Fault injection for tests of crash safety: fault_point("name") kills the process with SIGKILL
// (no destructors, no flushing: what a power cut or an OOM kill leaves behind) when the environment
// variable MT_FAULT equals "name". Costs one getenv per call; the points sit on rare paths only.
#pragma once

namespace mt {

void fault_point(const char* name);

}  // namespace mt
