// CommLog: DeepSpeed's comms logger for our communicator. A logged Backend (log_backend) wraps any
// Backend and records, per collective kind and message size, the number of calls, the bytes this
// rank sent and the latency (from the call until its Work completes). Groups split from a logged
// Backend are logged into the same CommLog, so wrapping the world covers the dp, tp and pp groups.
//
// Bytes, per call on a group of n ranks, S = the message size: DeepSpeed's key, the size of the
// collective's `tensor` argument (all_gather_into_tensor's and gather's input, scatter's output,
// reduce_scatter_tensor's and all_to_all_single's whole input):
//   op              S (message)            sent by this rank            tput (algbw)   busbw factor
//   all_reduce      count·esize            2(n-1)·S/n (ring)            2 S / t        2(n-1)/n of S/t
//   reduce_scatter  n·count·esize (input)  (n-1)·count·esize            S / t          (n-1)/n
//   all_gather      count·esize (input)    (n-1)·count·esize            n S / t        (n-1)/n
//   all_to_all      n·count·esize          (n-1)·count·esize            S / t          (n-1)/n
//   broadcast       count·esize            S on the root, else 0        S / t          1
//   reduce          count·esize            S off the root, else 0       S / t          1
//   gather          count·esize (input)    count·esize off the root     S / t          1
//   scatter         count·esize (output)   (n-1)·count·esize on root    S / t          1
//   send / recv     count·esize            S / 0                        S / t          1
//   barrier         0                      0                            0              1
// The "sent" column is the volume of the bandwidth-optimal algorithm (what a rank must put on the
// wire), not a measurement of what MPI chose to do. all_reduce's 2(n-1)·S/n is integer-divided.
// tput and busbw (busbw = tput · factor, all_reduce's S/t · 2(n-1)/n) are DeepSpeed's calc_bw_log,
// printed in Gbps as its log_summary does, except reduce_scatter's: DeepSpeed multiplies its whole
// input by n once more (n² blocks a call); here it is nccl-tests' S / t.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/backend.h"

namespace mt::comm {

enum class CommOp : uint8_t {
  kBroadcast = 0, kAllReduce, kReduce, kAllGather, kGather, kScatter, kReduceScatter, kAllToAll,
  kSend, kRecv, kBarrier, kCount
};
const char* comm_op_name(CommOp op);           // "all_reduce", ...
bool comm_op_from_name(const std::string& name, CommOp* op);  // false for an unknown name

// S and this rank's sent bytes for one call (the table above). count: elements per rank's block
// for the gathered/scattered ops, the buffer's elements otherwise.
size_t comm_msg_bytes(CommOp op, size_t count, DType dtype, int n);
size_t comm_sent_bytes(CommOp op, size_t count, DType dtype, int n, bool is_root);
double comm_busbw_factor(CommOp op, int n);
// scipy.stats.trim_mean(values, 0.1): DeepSpeed's comms summary's averages.
double comm_trim_mean(std::vector<double> values);

struct CommOpStats {
  uint64_t count = 0;
  uint64_t sent_bytes = 0;   // this rank's
  uint64_t msg_bytes = 0;    // sum of S
  double seconds = 0.0;      // sum of latencies (completed calls)
  double algbw_sum = 0.0, busbw_sum = 0.0;  // bytes/s summed over completed calls
  uint64_t completed = 0;
  // Each completed call's latency (s), tput and busbw (bytes/s): the summary's averages are
  // DeepSpeed's, scipy's trim_mean(values, 0.1) (a tenth cut from each end of the sorted values).
  std::vector<double> latencies, tputs, busbws;
};

class CommLog {
 public:
  // A call (counted when issued): bytes go to the totals at once.
  void issued(CommOp op, size_t msg_bytes, size_t sent_bytes, const std::string& tag);
  // Its completion: latency and bandwidths of a call of S = msg_bytes on n ranks.
  void completed(CommOp op, size_t msg_bytes, int n, double seconds, const std::string& tag);

  // Bytes this rank sent since construction (every op, whatever is profiled).
  uint64_t sent_bytes() const;
  uint64_t sent_bytes(CommOp op) const;
  uint64_t count(CommOp op) const;
  // Per (op, message size), summed over tags.
  std::map<std::pair<std::string, uint64_t>, CommOpStats> by_op_size() const;

  // debug: keys carry the caller's tag ("all_reduce | grads"), DeepSpeed's caller name.
  void set_debug(bool debug) { debug_ = debug; }
  // Which ops the summary reports (DeepSpeed's prof_all / prof_ops); counters cover every op.
  void set_profiled(bool all, const std::vector<std::string>& ops);
  // DeepSpeed's log_summary: a header and one line per (op, message size) of the profiled ops.
  std::vector<std::string> summary_lines() const;
  // The lines of the calls since the last mark_step() (verbose: once per step), then marks.
  std::vector<std::string> step_lines();
  void reset();

 private:
  std::string key(CommOp op, const std::string& tag) const;
  bool profiled(const std::string& op) const;
  static std::vector<std::string> format(const std::map<std::pair<std::string, uint64_t>, CommOpStats>& m);

  mutable std::mutex mu_;
  std::map<std::pair<std::string, uint64_t>, CommOpStats> stats_, step_;
  uint64_t sent_[static_cast<int>(CommOp::kCount)] = {};
  uint64_t count_[static_cast<int>(CommOp::kCount)] = {};
  bool debug_ = false, prof_all_ = true;
  std::vector<std::string> prof_ops_;
};

// inner, with every call recorded in log (splits too). inner null: null.
std::shared_ptr<Backend> log_backend(std::shared_ptr<Backend> inner, std::shared_ptr<CommLog> log);

}  // namespace mt::comm
