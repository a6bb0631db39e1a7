// Test datasets: documents of given lengths with tokens from a fixed linear-congruential rule.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"

namespace mt::data::testing {

// Writes one document per length to PREFIX.bin/.idx, token k of the run being
// ((x = x · 1103515245 + 12345) >> 8) mod vocab from x = seed; with split_in_two each document is
// two sequences (its first half and the rest), else one (a length of 0 an empty sequence).
// Returns every token end to end.
inline std::vector<int32_t> write_lcg_documents(const std::string& prefix, const std::vector<int>& lengths, int64_t vocab,
                                                uint32_t seed, bool split_in_two) {
  IndexedDatasetWriter w(prefix, vocab);
  std::vector<int32_t> all;
  uint32_t x = seed;
  for (int n : lengths) {
    std::vector<int32_t> doc;
    for (int k = 0; k < n; ++k) {
      x = x * 1103515245u + 12345u;
      doc.push_back(static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(vocab)));
    }
    const size_t half = split_in_two ? doc.size() / 2 : doc.size();
    w.add_sequence(std::span<const int32_t>(doc.data(), half));
    if (split_in_two) w.add_sequence(std::span<const int32_t>(doc.data() + half, doc.size() - half));
    w.end_document();
    all.insert(all.end(), doc.begin(), doc.end());
  }
  w.finalize();
  return all;
}

}  // namespace mt::data::testing
