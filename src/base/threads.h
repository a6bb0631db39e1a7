// Thread control: the library computes with OpenMP (the runtime oneDNN shares), so one call sets
// the number of threads for our kernels and oneDNN's alike.
#pragma once

namespace mt {

void threads_set(int n);  // n <= 0: all cores
int threads_get();

}  // namespace mt
