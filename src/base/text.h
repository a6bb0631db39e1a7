// Small text helpers shared by the configuration parser and the command line.
#pragma once

#include <string>

namespace mt {

// Levenshtein distance (insert, delete, substitute: 1 each): did-you-mean suggestions.
int edit_distance(const std::string& a, const std::string& b);

}  // namespace mt
