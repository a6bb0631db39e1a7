// The step simulator (issue 14): per-rank programs of compute and communication, each rank with a
// compute stream (its thread) and one communication stream (its communicator, one operation at a
// time), simulated in time with their dependencies. What overlaps is what the runtime overlaps:
//   - compute runs on the compute stream, in program order;
//   - a blocking send or collective holds the compute stream until it ends; an asynchronous one
//     is queued on the communication stream and the compute stream goes on until a kWait names it;
//   - with progress = false (MPI without a progress thread, and no polling), an asynchronous
//     collective only moves while its rank is inside MPI: it starts at its kWait at the earliest,
//     so it adds its time as a blocking one would. An asynchronous send still moves (the
//     receiver's blocking receive drives it);
//   - a rank's asynchronous operations have distinct tags within a step;
//   - a collective starts when every member has issued it and its members' communication streams
//     are free; it ends on all of them at once;
//   - a message (send) arrives when its transfer ends; a receive blocks until then;
//   - work on a stream of its own (kStream: stream 1 a disk's queue, 2 a helper thread, ...) runs
//     in issue order on that stream, beside the compute and communication streams; asynchronous,
//     it is waited for by a kWait, otherwise the compute stream waits for its end;
//   - disk transfers slow the rank's compute (a virtual machine's disk runs on the same cores):
//     while its streams move r bytes a second, compute progresses at 1 / (1 + k·r) of its speed,
//     k = SimProgram::disk_interference (calibrate --io measures it);
//   - ranks that share a host's cores (SimProgram::host_cores > 0: more processes x threads than
//     cores, as oversubscribed CPU ranks) share them while they compute: a rank whose compute needs
//     `demand` cores runs at min(1, cores / the demand of every rank computing on its host then) of
//     its speed. A rank waiting (a receive, a collective, a wait) takes no core: OpenMPI yields
//     when oversubscribed. Compute is simulated in global time, re-rated at every start and end.
//     A compute instruction with `fixed` is a wait inside a pass, timed as the host shares its
//     cores (a pipeline rank standing for its tp group spends it in the group's blocking
//     collectives, which the calibration timed with every group exchanging at once): its time is
//     not re-rated, and the rank's demand stays on its host meanwhile (ranks waiting in MPI poll).
// Pure: no kernels, no communicator. The times come from the caller (calibration, or a test's
// hand-computable numbers).
#pragma once

#include <string>
#include <vector>

#include "parallel/pp/schedule.h"

namespace mt::planner {

enum class SimOpKind { kCompute, kSend, kRecv, kCollective, kWait, kStream };

struct SimOp {
  SimOpKind kind = SimOpKind::kCompute;
  double seconds = 0.0;  // compute: its time; send: the transfer; collective: once all members are in
  int peer = -1;         // send/recv: the other rank
  int tag = -1;          // send/recv: the message (matched by (from, to, tag)); collective/wait: the handle
  int group = -1;        // collective: index into SimProgram::groups
  bool async = false;    // send/collective: issued on the communication stream, waited for by a kWait
  std::string name;      // what it is, for reports
  int stream = 0;        // kStream: which of the rank's own streams (>= 1) runs it
  double bytes = 0.0;    // kStream: bytes it moves through the disk (their rate slows compute)
  bool fixed = false;    // kCompute: a wait inside a pass, its time fixed, its rank's demand held (above)
  // Where name is empty, what it is: a static label and the pipeline chunk and micro-batch (-1:
  // none), spelt out only for a report (a pipeline step of thousands of micro-batches built a string
  // an instruction).
  const char* label = nullptr;
  int chunk = -1, micro = -1;
  std::string describe() const;
};

struct SimProgram {
  std::vector<std::vector<SimOp>> ranks;  // one instruction list per rank
  std::vector<std::vector<int>> groups;   // collective groups: their member ranks
  double disk_interference = 0.0;         // k: compute seconds lost per disk byte moved while computing
  // Cores shared by the ranks of a host (0: every rank has the cores its compute needs): host[q]
  // is rank q's host (empty: one host) and demand[q] the cores its compute keeps busy (empty: 1;
  // a rank standing for a tp group of T ranks of t threads: T·t).
  double host_cores = 0.0;
  std::vector<int> host;
  std::vector<double> demand;
};

struct SimOptions {
  bool progress = true;  // asynchronous operations move while compute runs (false: only at their wait)
};

struct SimReport {
  bool deadlock = false;
  std::string where;              // the blocked instruction of every stuck rank, on deadlock
  double makespan = 0.0;          // the step: the last rank's end
  std::vector<double> end;        // per rank: when its compute stream finished its list
  std::vector<double> compute;    // per rank: seconds of compute
  std::vector<double> comm;       // per rank: seconds its communication stream was busy
  std::vector<double> blocked;    // per rank: seconds its compute stream waited (receives, blocking ops, waits)
  std::vector<double> streams;    // per rank: seconds its own streams (kStream) were busy, all together
  bool async_collective = false;  // the program has an asynchronous collective (SimOptions::progress moves only those)
  // A rank's idle share of the step (the pipeline bubble on a pipeline program).
  double idle_share(int rank) const { return makespan > 0 ? (makespan - compute[rank]) / makespan : 0.0; }
};

// Throws kInvalidArgument on a malformed program (a collective's group missing or not holding the
// rank, a wait without its operation, a send to itself).
SimReport simulate(const SimProgram& program, const SimOptions& options = {});

// A pipeline step's instruction lists (parallel/pp, the executor's own) as a program: a forward of
// one chunk takes t_forward / v, a backward t_backward / v, a message t_message.
SimProgram pipeline_program(const parallel::pp::ScheduleSpec& spec, double t_forward, double t_backward,
                            double t_message = 0.0);

}  // namespace mt::planner
