// Pipeline schedules as data (DESIGN decision 8): pure functions that return, for one pipeline rank,
// the ordered instructions of one training step — forward or backward of micro-batch m on the
// rank's model chunk c, and the receives and sends of activations and gradients around them, each
// with the peer and the message tag. The executor (engine/) runs the list; the simulator here and
// the unit tests read the same list.
//
// Virtual stages: with v model chunks per rank (interleaved schedule), virtual stage s = c·pp + r
// (Megatron's assignment: chunk c of rank r); S = pp·v stages in all, the embedding on stage 0 and
// the LM head on stage S-1. Without interleaving v = 1 and the stage is the rank.
//
// Communication semantics the schedules are built for (and the simulator checks): sends are
// posted without blocking (the buffer stays untouched until the step ends), a receive blocks until
// the matching message arrives. Messages are matched by (peer, tag); a tag is unique in a step.
#pragma once

#include <string>
#include <vector>

namespace mt::parallel::pp {

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved };
const char* schedule_name(ScheduleKind k);  // "gpipe", "1f1b", "interleaved"
// Throws kInvalidArgument naming parallel.pipeline_schedule for an unknown name.
ScheduleKind parse_schedule(const std::string& name);

enum class OpKind { kRecvActivation, kForward, kSendActivation, kRecvGrad, kBackward, kSendGrad };
const char* op_name(OpKind k);

struct Instr {
  OpKind kind;
  int chunk = 0;   // the rank's model chunk (0 .. v-1)
  int micro = 0;   // micro-batch (0 .. m-1)
  int peer = -1;   // pipeline rank of the other side (send/recv)
  int tag = -1;    // message tag (send/recv)
  bool operator==(const Instr&) const = default;
};

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int pp = 1;              // pipeline ranks
  int virtual_stages = 1;  // model chunks per rank (v)
  int micro_batches = 1;   // m = gradient_accumulation_steps
  int stages() const { return pp * virtual_stages; }
};

// Throws kInvalidArgument naming the key when the schedule cannot run the spec (v > 1 outside
// the interleaved schedule; interleaved needs m to be a multiple of pp, as Megatron's; more tags
// than max_tag allows: the engine passes its backend's bound, MPI_TAG_UB under MPI).
void check_schedule_spec(const ScheduleSpec& s, long long max_tag = 2147483647LL);
// Tags a step uses: 0 .. step_tags(s) - 1 (the next one is free for the tied-embedding exchange).
long long step_tags(const ScheduleSpec& s);
// Instructions of pipeline rank `rank` for one step.
std::vector<Instr> build_schedule(const ScheduleSpec& s, int rank);
// Forwards a rank runs before its first backward (1F1B: min(pp - rank - 1, m); interleaved:
// Megatron's (pp - rank - 1)·2 + (v - 1)·pp, or all m·v when m == pp; GPipe: all).
int warmup_forwards(const ScheduleSpec& s, int rank);
// Idle share of a rank in the ideal pipeline (no communication time, backward any multiple of
// forward): (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v·m+p-1) interleaved.
double bubble_formula(const ScheduleSpec& s);
// Tag of the message crossing the boundary between virtual stages `stage` and `stage`+1 for
// micro-batch `micro`: the activation going up, or the gradient coming back.
int message_tag(const ScheduleSpec& s, int stage, int micro, bool grad);

// (chunk, micro) pairs whose forward has run and whose backward has not, at most, along the list:
// the activation slots the executor needs.
int max_in_flight(const std::vector<Instr>& list);

// When a rank may reuse the buffer of a gradient it sent (the executor's and the memory model's
// rule, one function): the send at list index i is known received once this rank has received a
// message that its peer sent after its receive of i. Element j lists the kSendGrad indices whose
// buffers are free after instruction j (a receive) completes; a send no later message vouches for
// is waited when the list ends. Needs every pipeline rank's list (ranks[q] for rank q). Waiting
// only on sends already received cannot deadlock, and the count below does not depend on timing.
std::vector<std::vector<int>> grad_send_releases(const std::vector<std::vector<Instr>>& ranks, int rank);

// Whether rank `q` may wait, before instruction j, for its sends waits[q][j] (indices into its own
// list) without any rank blocking for ever. Checked with rendezvous sends, the most a transport
// can delay one: a send completes only once its receiver has reached the matching receive (our
// receives block there, posted when reached), and a rank waiting for a send, or blocked on a
// receive, is inside MPI and moves its own sends on. Returns "" or where every unfinished rank
// is stuck. waits may be shorter than ranks (no waits for the missing ranks).
std::string rendezvous_check(const std::vector<std::vector<Instr>>& ranks,
                             const std::vector<std::vector<std::vector<int>>>& waits);

// What the executor does with the buffer of a gradient it sends (the executor's and the memory
// model's rule, one function). With `wait` (Megatron's way: it waits on every send), the rank
// waits, before it posts a gradient, for the gradients it sent earlier that no message has yet
// proven received, so it holds one such buffer; otherwise (or for those a message proves
// received first) the buffer is reused after the proving receive (grad_send_releases).
struct GradSendPlan {
  std::vector<std::vector<int>> wait_before;    // [j]: sends waited for before instruction j runs
  std::vector<std::vector<int>> release_after;  // [j]: sends known received once receive j completes
};
GradSendPlan grad_send_plan(const std::vector<std::vector<Instr>>& ranks, int rank, bool wait);
// Whether every rank of the step may wait so (rendezvous_check of every rank's plan with waits).
// The schedules are small and the answer depends only on the spec: remembered per spec.
bool gradient_waits_safe(const ScheduleSpec& s);
// The plan the executor runs for `rank` of the spec's step (ranks: build_schedule of each rank):
// with waits where gradient_waits_safe says they cannot deadlock.
GradSendPlan executor_grad_plan(const ScheduleSpec& s, const std::vector<std::vector<Instr>>& ranks, int rank);
// The most gradient buffers `rank` holds at once along its list under the executor's plan (1 once
// it waits on its sends, as Megatron; without waits 1F1B holds its warm-up count + 2, and GPipe
// every micro-batch, its receives all come first).
int max_grads_in_flight(const ScheduleSpec& s, const std::vector<std::vector<Instr>>& ranks, int rank);
int max_grads_in_flight(const std::vector<std::vector<Instr>>& ranks, int rank, const GradSendPlan& plan);
// The buffers `rank` of the spec's step holds at once: activation slots (max_in_flight of its list)
// and gradients (max_grads_in_flight under the executor's plan). They depend only on the spec, and
// the planner asks for them at every layout it prices (a search: the same spec at each ZeRO stage,
// recompute and tp setting): remembered per spec and rank.
struct RankBuffers {
  int slots = 0;
  int grads_in_flight = 0;
};
RankBuffers rank_buffers(const ScheduleSpec& s, int rank);

// Event simulation of a step: each rank runs its list in order, a forward of one chunk takes
// t_forward / v, a backward t_backward / v, messages arrive when sent. Deadlock (every unfinished
// rank waits on a receive that no rank will send) is reported, not thrown.
struct SimResult {
  bool deadlock = false;
  std::string where;             // the blocked instruction of each rank, on deadlock
  double makespan = 0.0;
  std::vector<double> busy;      // compute time per rank
  double idle_share(int rank) const { return makespan > 0 ? (makespan - busy[rank]) / makespan : 0.0; }
};
SimResult simulate(const ScheduleSpec& s, const std::vector<std::vector<Instr>>& ranks, double t_forward = 1.0,
                   double t_backward = 2.0);

// Structural checks of a whole step's lists (every rank's): each (chunk, micro) forward and
// backward exactly once, every backward after its forward, every receive before its compute, each
// send matched by exactly one receive on the peer with the same tag and the same (micro, stage).
// Returns "" or what is wrong.
std::string validate(const ScheduleSpec& s, const std::vector<std::vector<Instr>>& ranks);

}  // namespace mt::parallel::pp
