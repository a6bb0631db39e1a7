// CommLog and the logged Backend (a decorator: every call forwards to the wrapped Backend; its
// Work is wrapped to time the call until completion).
#include "comm/comm_log.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace mt::comm {
namespace {

const char* const kOpNames[] = {"broadcast", "all_reduce", "reduce", "all_gather", "gather", "scatter",
                                "reduce_scatter", "all_to_all", "send", "recv", "barrier"};

using Clock = std::chrono::steady_clock;

class LoggedWork : public Work {
 public:
  LoggedWork(std::unique_ptr<Work> inner, std::shared_ptr<CommLog> log, CommOp op, size_t msg_bytes, int n,
             std::string tag)
      : inner_(std::move(inner)), log_(std::move(log)), op_(op), msg_bytes_(msg_bytes), n_(n), tag_(std::move(tag)),
        start_(Clock::now()) {}
  bool is_completed() override {
    bool done = inner_->is_completed();
    if (done) record();
    return done;
  }
  void wait() override {
    inner_->wait();
    record();
  }

 private:
  void record() {
    if (recorded_) return;
    recorded_ = true;
    log_->completed(op_, msg_bytes_, n_, std::chrono::duration<double>(Clock::now() - start_).count(), tag_);
  }
  std::unique_ptr<Work> inner_;
  std::shared_ptr<CommLog> log_;
  CommOp op_;
  size_t msg_bytes_;
  int n_;
  std::string tag_;
  Clock::time_point start_;
  bool recorded_ = false;
};

class LoggedBackend : public Backend {
 public:
  LoggedBackend(std::shared_ptr<Backend> inner, std::shared_ptr<CommLog> log)
      : inner_(std::move(inner)), log_(std::move(log)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }
  int max_msg_tag() const override { return inner_->max_msg_tag(); }

  std::unique_ptr<Work> broadcast(void* buf, size_t count, DType dt, const BroadcastOptions& o) override {
    return logged(CommOp::kBroadcast, count, dt, rank() == o.root, o.tag, inner_->broadcast(buf, count, dt, o));
  }
  std::unique_ptr<Work> all_reduce(void* buf, size_t count, DType dt, const AllReduceOptions& o) override {
    return logged(CommOp::kAllReduce, count, dt, false, o.tag, inner_->all_reduce(buf, count, dt, o));
  }
  std::unique_ptr<Work> reduce(void* buf, size_t count, DType dt, const ReduceOptions& o) override {
    return logged(CommOp::kReduce, count, dt, rank() == o.root, o.tag, inner_->reduce(buf, count, dt, o));
  }
  std::unique_ptr<Work> all_gather(void* recv, const void* send, size_t count, DType dt,
                                   const AllGatherOptions& o) override {
    return logged(CommOp::kAllGather, count, dt, false, o.tag, inner_->all_gather(recv, send, count, dt, o));
  }
  std::unique_ptr<Work> gather(void* recv, const void* send, size_t count, DType dt, const GatherOptions& o) override {
    return logged(CommOp::kGather, count, dt, rank() == o.root, o.tag, inner_->gather(recv, send, count, dt, o));
  }
  std::unique_ptr<Work> scatter(void* recv, const void* send, size_t count, DType dt, const ScatterOptions& o) override {
    return logged(CommOp::kScatter, count, dt, rank() == o.root, o.tag, inner_->scatter(recv, send, count, dt, o));
  }
  std::unique_ptr<Work> reduce_scatter(void* recv, const void* send, size_t count, DType dt,
                                       const ReduceScatterOptions& o) override {
    return logged(CommOp::kReduceScatter, count, dt, false, o.tag, inner_->reduce_scatter(recv, send, count, dt, o));
  }
  std::unique_ptr<Work> all_to_all(void* recv, const void* send, size_t count, DType dt,
                                   const AllToAllOptions& o) override {
    return logged(CommOp::kAllToAll, count, dt, false, o.tag, inner_->all_to_all(recv, send, count, dt, o));
  }
  std::unique_ptr<Work> send(const void* buf, size_t count, DType dt, int dst, const SendOptions& o) override {
    return logged(CommOp::kSend, count, dt, false, o.tag, inner_->send(buf, count, dt, dst, o));
  }
  std::unique_ptr<Work> recv(void* buf, size_t count, DType dt, int src, const RecvOptions& o) override {
    return logged(CommOp::kRecv, count, dt, false, o.tag, inner_->recv(buf, count, dt, src, o));
  }
  std::unique_ptr<Work> barrier(const BarrierOptions& o) override {
    return logged(CommOp::kBarrier, 0, DType::kF32, false, o.tag, inner_->barrier(o));
  }
  std::shared_ptr<Backend> split(int color, int key) override {
    return log_backend(inner_->split(color, key), log_);
  }
  [[noreturn]] void abort(int code, const std::string& message) override {
    inner_->abort(code, message);
    std::abort();  // not reached: Backend::abort does not return
  }

 private:
  std::unique_ptr<Work> logged(CommOp op, size_t count, DType dt, bool root, const std::string& tag,
                               std::unique_ptr<Work> w) {
    const int n = size();
    const size_t msg = comm_msg_bytes(op, count, dt, n);
    log_->issued(op, msg, comm_sent_bytes(op, count, dt, n, root), tag);
    return std::make_unique<LoggedWork>(std::move(w), log_, op, msg, n, tag);
  }
  std::shared_ptr<Backend> inner_;
  std::shared_ptr<CommLog> log_;
};

}  // namespace

const char* comm_op_name(CommOp op) {
  const int i = static_cast<int>(op);
  return i >= 0 && i < static_cast<int>(CommOp::kCount) ? kOpNames[i] : "?";
}

bool comm_op_from_name(const std::string& name, CommOp* op) {
  for (int i = 0; i < static_cast<int>(CommOp::kCount); ++i)
    if (name == kOpNames[i]) {
      *op = static_cast<CommOp>(i);
      return true;
    }
  return false;
}

size_t comm_msg_bytes(CommOp op, size_t count, DType dtype, int n) {
  const size_t b = count * dtype_size(dtype), N = static_cast<size_t>(n);
  switch (op) {
    case CommOp::kReduceScatter:
    case CommOp::kAllToAll: return N * b;
    case CommOp::kBarrier: return 0;
    default: return b;
  }
}

size_t comm_sent_bytes(CommOp op, size_t count, DType dtype, int n, bool is_root) {
  const size_t b = count * dtype_size(dtype), N = static_cast<size_t>(n);
  if (n <= 1 && op != CommOp::kSend) return 0;
  switch (op) {
    case CommOp::kAllReduce: return 2 * (N - 1) * b / N;
    case CommOp::kAllGather:
    case CommOp::kReduceScatter:
    case CommOp::kAllToAll: return (N - 1) * b;
    case CommOp::kBroadcast: return is_root ? b : 0;
    case CommOp::kReduce:
    case CommOp::kGather: return is_root ? 0 : b;
    case CommOp::kScatter: return is_root ? (N - 1) * b : 0;
    case CommOp::kSend: return b;
    default: return 0;
  }
}

double comm_busbw_factor(CommOp op, int n) {
  const double N = static_cast<double>(n);
  switch (op) {
    case CommOp::kAllReduce: return 2.0 * (N - 1.0) / N;
    case CommOp::kAllGather:
    case CommOp::kReduceScatter:
    case CommOp::kAllToAll: return (N - 1.0) / N;
    default: return 1.0;
  }
}

std::string CommLog::key(CommOp op, const std::string& tag) const {
  std::string k = comm_op_name(op);
  if (debug_ && !tag.empty()) k += " | " + tag;
  return k;
}

void CommLog::issued(CommOp op, size_t msg_bytes, size_t sent_bytes, const std::string& tag) {
  std::lock_guard<std::mutex> lock(mu_);
  const int i = static_cast<int>(op);
  sent_[i] += sent_bytes;
  ++count_[i];
  for (auto* m : {&stats_, &step_}) {
    CommOpStats& s = (*m)[{key(op, tag), msg_bytes}];
    ++s.count;
    s.sent_bytes += sent_bytes;
    s.msg_bytes += msg_bytes;
  }
}

void CommLog::completed(CommOp op, size_t msg_bytes, int n, double seconds, const std::string& tag) {
  std::lock_guard<std::mutex> lock(mu_);
  const double t = std::max(seconds, 1e-9);
  // DeepSpeed's calc_bw_log: an all_gather moves n of its S-byte inputs (S · n / t); an
  // all-reduce's tput is 2 S / t (its busbw S / t · 2(n-1)/n).
  const double algbw = static_cast<double>(msg_bytes) / t * (op == CommOp::kAllGather ? n : 1);
  const double tput = op == CommOp::kAllReduce ? 2.0 * algbw : algbw;
  const double busbw = algbw * comm_busbw_factor(op, n);
  for (auto* m : {&stats_, &step_}) {
    CommOpStats& s = (*m)[{key(op, tag), msg_bytes}];
    s.seconds += seconds;
    s.algbw_sum += tput;
    s.busbw_sum += busbw;
    ++s.completed;
    s.latencies.push_back(seconds);
    s.tputs.push_back(tput);
    s.busbws.push_back(busbw);
  }
}

uint64_t CommLog::sent_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t t = 0;
  for (uint64_t b : sent_) t += b;
  return t;
}
uint64_t CommLog::sent_bytes(CommOp op) const {
  std::lock_guard<std::mutex> lock(mu_);
  return sent_[static_cast<int>(op)];
}
uint64_t CommLog::count(CommOp op) const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_[static_cast<int>(op)];
}

std::map<std::pair<std::string, uint64_t>, CommOpStats> CommLog::by_op_size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CommLog::set_profiled(bool all, const std::vector<std::string>& ops) {
  std::lock_guard<std::mutex> lock(mu_);
  prof_all_ = all;
  prof_ops_ = ops;
}

bool CommLog::profiled(const std::string& key) const {
  if (prof_all_) return true;
  const std::string op = key.substr(0, key.find(' '));
  return std::find(prof_ops_.begin(), prof_ops_.end(), op) != prof_ops_.end();
}

// scipy.stats.trim_mean(values, 0.1), as DeepSpeed's comms summary averages: int(0.1 n) values cut
// from each end of the sorted values, the mean of the rest.
double comm_trim_mean(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t cut = static_cast<size_t>(0.1 * static_cast<double>(v.size()));
  double sum = 0.0;
  for (size_t i = cut; i < v.size() - cut; ++i) sum += v[i];
  return sum / static_cast<double>(v.size() - 2 * cut);
}

std::vector<std::string> CommLog::format(const std::map<std::pair<std::string, uint64_t>, CommOpStats>& m) {
  std::vector<std::string> lines;
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%-28s %14s %8s %16s %18s %16s %15s %16s", "Comm. Op", "Message Size", "Count",
                "Sent (this rank)", "Total Latency(ms)", "Avg Latency(ms)", "tput_avg (Gbps)", "busbw_avg (Gbps)");
  lines.emplace_back(buf);
  for (const auto& [k, s] : m) {
    std::snprintf(buf, sizeof(buf), "%-28s %14llu %8llu %16llu %18.3f %16.3f %15.3f %16.3f", k.first.c_str(),
                  static_cast<unsigned long long>(k.second), static_cast<unsigned long long>(s.count),
                  static_cast<unsigned long long>(s.sent_bytes), s.seconds * 1e3, comm_trim_mean(s.latencies) * 1e3,
                  comm_trim_mean(s.tputs) * 8e-9, comm_trim_mean(s.busbws) * 8e-9);
    lines.emplace_back(buf);
  }
  return lines;
}

std::vector<std::string> CommLog::summary_lines() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::pair<std::string, uint64_t>, CommOpStats> m;
  for (const auto& [k, s] : stats_)
    if (profiled(k.first)) m[k] = s;
  return format(m);
}

std::vector<std::string> CommLog::step_lines() {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::pair<std::string, uint64_t>, CommOpStats> m;
  for (const auto& [k, s] : step_)
    if (profiled(k.first)) m[k] = s;
  step_.clear();
  return format(m);
}

void CommLog::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.clear();
  step_.clear();
  std::fill(std::begin(sent_), std::end(sent_), 0);
  std::fill(std::begin(count_), std::end(count_), 0);
}

std::shared_ptr<Backend> log_backend(std::shared_ptr<Backend> inner, std::shared_ptr<CommLog> log) {
  if (!inner) return nullptr;
  return std::make_shared<LoggedBackend>(std::move(inner), std::move(log));
}

}  // namespace mt::comm
