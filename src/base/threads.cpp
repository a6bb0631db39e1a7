#include "base/threads.h"

#include <omp.h>

namespace mt {

void threads_set(int n) {
  if (n <= 0) n = omp_get_num_procs();
  omp_set_num_threads(n);
}

int threads_get() { return omp_get_max_threads(); }

}  // namespace mt
