// LocalBackend: N ranks as threads of one process sharing memory, for unit tests of everything
// built on comm/. Same contract and semantics as the MPI backend, timeouts included: a collective
// whose group has not fully arrived by the deadline throws CommTimeout naming the missing ranks,
// the collective and its sequence number. Ranks calling different collectives (or counts, dtypes,
// roots, ops) at the same sequence number get kInvalidArgument naming both calls.
//
// How it works: the last rank to arrive at a collective moves the data for every rank (it holds all
// the buffer pointers) and marks it complete; the earlier ranks' calls return at once with a
// pending Work. Reductions run in f32 in rank order (deterministic).
// NOTE: a rank that arrives after the others timed out still completes the collective and writes
// into their buffers, as a late MPI rank would; a timeout is meant to end the job.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "comm/backend.h"

namespace mt::comm {

// One Backend per rank of a new local world of `size` ranks; hand backend r to thread r.
std::vector<std::shared_ptr<Backend>> make_local_world(int size);

// Runs fn(backend of rank r) on `size` threads and joins them. Returns each rank's exception (null
// where fn returned normally).
std::vector<std::exception_ptr> run_local_ranks(int size, const std::function<void(Backend&)>& fn);

}  // namespace mt::comm
