// Fault injection for tests of crash safety: fault_point("name") kills the process with SIGKILL
// (no destructors, no flushing: what a power cut or an OOM kill leaves behind) when the environment
// variable MT_FAULT equals "name". Costs one getenv per call; the points sit on rare paths only.
//
// Many processes: MT_FAULT="name@R" fires only on the rank R of an MPI job (OMPI_COMM_WORLD_RANK),
// and MT_FAULT_MODE=hang makes the process stop forever instead of dying (a stuck rank, which
// the others must detect by their collective timeouts).
#pragma once

namespace mt {

void fault_point(const char* name);
// Whether MT_FAULT names `name` (for this rank): for seams that inject a condition rather than a
// kill (e.g. "engine.nonfinite_grad" makes one gradient element infinite before a step).
bool fault_active(const char* name);

}  // namespace mt
