// Small text helpers shared by the configuration parser and the command line.
#pragma once

#include <cstdint>
#include <string>

namespace mt {

// Levenshtein distance (insert, delete, substitute: 1 each): did-you-mean suggestions.
int edit_distance(const std::string& a, const std::string& b);

// A size for a message: whole KiB (rounded up) under a MiB, whole MiB (down) from there.
std::string kib_or_mib(uint64_t bytes);

}  // namespace mt
