// Backend: the one communicator interface (after PyTorch c10d's Backend/Work). Every collective the
// training stack uses is a virtual whose default throws kNotSupported naming the backend; each takes
// its own options struct (with a timeout) and returns an async Work whose wait() rethrows.
//
// Contract (as c10d's): all collectives of one Backend are called in the same order, with matching
// arguments, by every rank of its group. Each call gets the next sequence number of that Backend
// (0, 1, 2, ...); a timeout or mismatch message names the collective and its number. Buffers belong
// to the caller and must stay valid and untouched until wait() returns (or is_completed() is true).
// Counts are in elements of `dtype`; "per rank" counts are the size of one rank's block.
//
// Reductions of bf16/f16 are accumulated in fp32: inputs are widened to f32, reduced in f32 and
// rounded once to the element type at the end. kAvg is the sum divided by the group size (in f32).
// With in_dtype (all_reduce and reduce_scatter, kSum/kAvg) they are instead reduced on the 2-byte
// values themselves, as NCCL reduces bf16/f16: every partial sum is rounded to the element type,
// and half the bytes of the f32 path travel (DeepSpeed's communication_data_type).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "tensor/dtype.h"

namespace mt::comm {

enum class ReduceOp : uint8_t { kSum = 0, kAvg = 1, kMax = 2, kMin = 3 };
const char* reduce_op_name(ReduceOp op);

// 5 minutes, NCCL/c10d's order of magnitude: long enough for a slow first step, short enough that
// a hung job is noticed.
inline constexpr std::chrono::milliseconds kDefaultTimeout{300'000};

struct CommOptions {
  std::chrono::milliseconds timeout = kDefaultTimeout;  // measured from the call, per rank
  std::string tag;                                      // free text quoted in error messages
};
struct BroadcastOptions : CommOptions { int root = 0; };
struct AllReduceOptions : CommOptions {
  ReduceOp op = ReduceOp::kSum;
  bool in_dtype = false;  // bf16/f16: reduce the 2-byte values, rounding each partial sum
};
struct ReduceOptions : CommOptions { int root = 0; ReduceOp op = ReduceOp::kSum; };
struct AllGatherOptions : CommOptions {};
struct GatherOptions : CommOptions { int root = 0; };
struct ScatterOptions : CommOptions { int root = 0; };
struct ReduceScatterOptions : CommOptions {
  ReduceOp op = ReduceOp::kSum;
  bool in_dtype = false;  // as AllReduceOptions::in_dtype
};
struct AllToAllOptions : CommOptions {};
// Point to point messages carry an integer tag (MPI's): a recv matches the next send from its
// peer with the same tag, so a pipeline stage can receive the activation of micro-batch 3 before a
// gradient sent earlier. 0 <= msg_tag <= Backend::max_msg_tag(): at least kMaxMsgTag (the MPI
// standard's guaranteed minimum), MPI_TAG_UB under MPI (OpenMPI's is 2^31 - 1).
inline constexpr int kMaxMsgTag = 32767;
struct SendOptions : CommOptions { int msg_tag = 0; };
struct RecvOptions : CommOptions { int msg_tag = 0; };
struct BarrierOptions : CommOptions {};

// How many times this process has been stopped and continued (SIGCONT: Ctrl-Z and `fg`, a
// scheduler's suspend and resume) since count_continues(), which installs the counting handler
// unless the program has its own. A wait whose deadline passed while the process was stopped
// starts its timeout again instead of reporting the ranks that were stopped with it.
void count_continues();
uint64_t continues();

// A collective wait's deadline that does not count this process's own stops. The SIGCONT counter
// sees a stop between posting a collective and waiting on it; but its handler runs on meshtrain's
// signal thread (base/signals.h), which wakes with the waiting one, possibly after the waiting
// thread has found its deadline passed. So a gap between
// two polling turns (which take microseconds) of more than 250 ms moves the deadline by as much
// (the process was stopped or not scheduled; the peers are not to blame), at most one timeout in
// all, and a deadline found passed waits 50 ms for a late count before it is reported.
class WaitDeadline {
 public:
  explicit WaitDeadline(std::chrono::milliseconds timeout);
  // Called at each polling turn of a wait: true once the deadline has passed, counting neither.
  bool passed();

 private:
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point deadline_, last_{};
  std::chrono::steady_clock::duration shifted_{};
  uint64_t continues_;  // the process's stops and continues when the deadline was set
};

// CommTimeout: a collective that did not complete within its timeout. kind() is kTimeout;
// missing_ranks() are the group ranks that had not
// arrived at the collective, as far as this rank could learn (empty when unknown).
class CommTimeout : public Error {
 public:
  CommTimeout(const std::string& message, std::string collective, uint64_t seq,
              std::vector<int> missing_ranks);
  const std::string& collective() const { return collective_; }
  uint64_t seq() const { return seq_; }
  const std::vector<int>& missing_ranks() const { return missing_ranks_; }

 private:
  std::string collective_;
  uint64_t seq_;
  std::vector<int> missing_ranks_;
};

// "all_reduce #3 [tag grads] on rank 0 of 4 (mpi) timed out after 500 ms: rank 2 has not arrived"
std::string timeout_message(const std::string& backend, const std::string& collective, uint64_t seq,
                            const std::string& tag, int rank, int size,
                            std::chrono::milliseconds timeout, const std::vector<int>& missing, bool silent = false);

class Work {
 public:
  virtual ~Work() = default;
  // Returns true once the operation has completed (successfully or not); never blocks.
  virtual bool is_completed() = 0;
  // Blocks until completion; throws the operation's Error, or CommTimeout past its deadline.
  virtual void wait() = 0;
};

// Polls `w` until it completes or `budget` has passed, and returns whether it completed. A message
// past MPI's eager limit moves only while its sender is inside MPI where the transport has no
// single-copy path (OpenMPI's shared memory without CMA, TCP between hosts): a sender that posts
// one and goes on computing holds back a receiver that already waits for it until its next MPI
// call. Driving the send for about its transfer time (send_drive_budget) delivers it to such a
// receiver now, and costs a busy receiver's sender no more than that (DESIGN-NOTES 45).
bool drive(Work& w, std::chrono::microseconds budget);
// About the time `bytes` take to move between two processes: 100 us plus 1 GB/s.
std::chrono::microseconds send_drive_budget(size_t bytes);

// A Work that is already complete (group of one, empty buffers).
class CompletedWork : public Work {
 public:
  bool is_completed() override { return true; }
  void wait() override {}
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "local", "mpi"
  virtual int max_msg_tag() const { return kMaxMsgTag; }  // the largest msg_tag send/recv take

  // buf (count): root's values to every rank.
  virtual std::unique_ptr<Work> broadcast(void* buf, size_t count, DType dtype,
                                          const BroadcastOptions& opts);
  // buf (count): in place, the reduction over ranks on every rank.
  virtual std::unique_ptr<Work> all_reduce(void* buf, size_t count, DType dtype,
                                           const AllReduceOptions& opts);
  // buf (count): in place, the reduction lands on root; other ranks' buf is left unspecified.
  virtual std::unique_ptr<Work> reduce(void* buf, size_t count, DType dtype,
                                       const ReduceOptions& opts);
  // send (count), recv (size*count): recv[r*count ...] = rank r's send.
  virtual std::unique_ptr<Work> all_gather(void* recv, const void* send, size_t count, DType dtype,
                                           const AllGatherOptions& opts);
  // As all_gather, recv only on root (ignored elsewhere, may be null).
  virtual std::unique_ptr<Work> gather(void* recv, const void* send, size_t count, DType dtype,
                                       const GatherOptions& opts);
  // send (size*count) on root only, recv (count): rank r gets send[r*count ...].
  virtual std::unique_ptr<Work> scatter(void* recv, const void* send, size_t count, DType dtype,
                                        const ScatterOptions& opts);
  // send (size*count), recv (count): rank r gets block r of the reduction over ranks.
  virtual std::unique_ptr<Work> reduce_scatter(void* recv, const void* send, size_t count,
                                               DType dtype, const ReduceScatterOptions& opts);
  // send (size*count), recv (size*count): recv block s on rank r = send block r of rank s.
  virtual std::unique_ptr<Work> all_to_all(void* recv, const void* send, size_t count, DType dtype,
                                           const AllToAllOptions& opts);
  // Point to point; not part of the collective sequence. Messages between one pair with one
  // msg_tag arrive in order; different tags are independent queues.
  virtual std::unique_ptr<Work> send(const void* buf, size_t count, DType dtype, int dst,
                                     const SendOptions& opts);
  virtual std::unique_ptr<Work> recv(void* buf, size_t count, DType dtype, int src,
                                     const RecvOptions& opts);
  virtual std::unique_ptr<Work> barrier(const BarrierOptions& opts);

  // Collective over this group (blocking): ranks with equal color form a new group, ordered by
  // (key, rank). color < 0: this rank joins no group and gets nullptr.
  virtual std::shared_ptr<Backend> split(int color, int key);
  // Collective over this group: the group of `ranks` (in that order); nullptr on ranks outside it.
  std::shared_ptr<Backend> new_group(const std::vector<int>& ranks);

  // Ends every rank of the job (MPI_Abort) so that none hangs; for the CLI's last resort. The
  // local backend throws kInternal with the message instead (it cannot kill its own process).
  [[noreturn]] virtual void abort(int code, const std::string& message);

 protected:
  [[noreturn]] void throw_not_supported(const char* what) const;
  void check_root(int root, const char* what) const;
};

// acc[i] = op(acc[i], src[i]) over n floats; kAvg accumulates as kSum (divide at the end).
void reduce_f32_into(float* acc, const float* src, size_t n, ReduceOp op);
// in_dtype reductions: acc[i] = round_to_dtype(acc[i] + src[i]) over 2-byte bf16/f16 values.
void sum_16bit_into(void* acc, const void* src, size_t n, DType dtype);
// Refuses in_dtype for what it does not cover (f32 is fine: it is exact already), naming `what`.
void check_in_dtype(const char* what, DType dtype, ReduceOp op);

}  // namespace mt::comm
