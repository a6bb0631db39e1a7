// DeepSpeed's hostfile (`hostname slots=N` lines, `#` comments, blank lines) and its --include /
// --exclude host filters, as pure functions for `meshtrain launch`. Errors throw kInvalidArgument
// with one line naming the place (file:line for the hostfile, the flag for the filters).
#pragma once

#include <string>
#include <vector>

namespace mt::cli {

struct HostSlots {
  std::string host;
  int slots = 0;
};

// Parses a hostfile's text; `where` names it in errors ("hosts.txt" -> "hosts.txt:3: ...").
// Rejects lines that are not `host slots=N`, N that is not a positive integer, and repeated hosts.
std::vector<HostSlots> hostfile_parse(const std::string& text, const std::string& where);

// Applies DeepSpeed's --include / --exclude (at most one non-empty): `host1@host2` keeps (drops)
// whole hosts, `host1:0,1@host2` keeps (drops) those slot indices of host1. For CPU ranks a slot
// is just a count, so only how many slots remain matters. Hosts left with no slots are removed.
std::vector<HostSlots> hostfile_filter(const std::vector<HostSlots>& hosts, const std::string& include,
                                       const std::string& exclude);

}  // namespace mt::cli
