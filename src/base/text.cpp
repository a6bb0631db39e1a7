#include "base/text.h"

#include <algorithm>
#include <vector>

namespace mt {

int edit_distance(const std::string& a, const std::string& b) {
  std::vector<int> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string kib_or_mib(uint64_t bytes) {
  return bytes < (uint64_t{1} << 20) ? std::to_string((bytes + 1023) >> 10) + " KiB" : std::to_string(bytes >> 20) + " MiB";
}

}  // namespace mt
