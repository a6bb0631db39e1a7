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
  // The slot (device) indices --include/--exclude kept, in order; empty: the first `slots`.
  std::vector<int> ids;
};

// A launcher's input file (the hostfile, .deepspeed_env) as text: a regular file of at most 1 MiB
// (a FIFO hung the launcher waiting for a writer, and /dev/zero read until memory ran out).
// `what` names it in errors.
std::string read_launcher_file(const std::string& path, const std::string& what = "hostfile");

// Parses a hostfile's text; `where` names it in errors ("hosts.txt" -> "hosts.txt:3: ...").
// Rejects lines that do not begin `host slots=N`, N that is not a positive integer, host names
// with ',' or ':' (mpirun's --host separators), and repeated hosts. Words after `slots=N`
// (OpenMPI's `max_slots=M`) are ignored, as DeepSpeed's parser ignores them.
std::vector<HostSlots> hostfile_parse(const std::string& text, const std::string& where);

// Applies DeepSpeed's --include / --exclude (at most one non-empty): `host1@host2` keeps (drops)
// whole hosts, `host1:0,1@host2` keeps (drops) those slot indices of host1; the indices kept are
// in `ids` (a GPU run's devices: launch exports them as CUDA_VISIBLE_DEVICES, as DeepSpeed does).
// Hosts left with no slots are removed.
std::vector<HostSlots> hostfile_filter(const std::vector<HostSlots>& hosts, const std::string& include,
                                       const std::string& exclude);

}  // namespace mt::cli
