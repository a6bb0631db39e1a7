// LocalBackend: see local_backend.h. One LocalGroup per group holds the pending collectives (by
// sequence number) and the point-to-point channels, under one mutex.
#include "comm/local_backend.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

namespace mt::comm {
namespace {

struct Arrival {
  bool arrived = false;
  const void* send = nullptr;
  void* recv = nullptr;
  int color = 0, key = 0;
};

struct OpDesc {
  std::string name;
  size_t count = 0;
  DType dtype = DType::kF32;
  int root = 0;
  ReduceOp op = ReduceOp::kSum;
  bool in_dtype = false;  // a 16-bit reduction on the 2-byte values (backend.h)
  std::string describe() const {
    return name + "(count " + std::to_string(count) + ", " + dtype_name(dtype) + ", root " +
           std::to_string(root) + ", " + reduce_op_name(op) + (in_dtype ? ", in dtype" : "") + ")";
  }
  bool operator==(const OpDesc&) const = default;
};

struct Op {
  OpDesc desc;
  std::vector<Arrival> arrivals;
  int n_arrived = 0;
  bool done = false;
  std::exception_ptr error;
  std::vector<std::shared_ptr<Backend>> split_out;
};

struct P2pMsg {
  const void* send = nullptr;  // set by the sender
  void* recv = nullptr;        // set by the receiver
  size_t bytes = 0;
  bool done = false;
  std::exception_ptr error;
};

using Channel = std::tuple<int, int, int>;  // (src, dst, msg_tag)

struct LocalGroup {
  explicit LocalGroup(int n) : size(n) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, std::shared_ptr<Op>> ops;
  // (src, dst, msg_tag) -> unmatched sends or unmatched recvs (only one of the two is non-empty).
  std::map<Channel, std::deque<std::shared_ptr<P2pMsg>>> sends, recvs;
};

std::vector<float> widen(const void* src, DType dtype, size_t n) {
  std::vector<float> out(n);
  convert(out.data(), DType::kF32, src, dtype, n);
  return out;
}

// The reduction over ranks of every rank's `pick(arrival)` buffer, in f32, rank order.
// in_dtype 16-bit reductions add the 2-byte values in rank order, rounding every partial sum.
std::vector<float> reduce_all(const Op& op, size_t n, const void* (*pick)(const Arrival&)) {
  if (op.desc.in_dtype && op.desc.dtype != DType::kF32) {
    std::vector<uint16_t> acc16(n);
    if (n) std::memcpy(acc16.data(), pick(op.arrivals[0]), 2 * n);
    for (size_t r = 1; r < op.arrivals.size(); ++r) sum_16bit_into(acc16.data(), pick(op.arrivals[r]), n, op.desc.dtype);
    std::vector<float> acc = widen(acc16.data(), op.desc.dtype, n);
    if (op.desc.op == ReduceOp::kAvg) {
      const float inv = 1.0f / static_cast<float>(op.arrivals.size());
      for (float& v : acc) v *= inv;
    }
    return acc;
  }
  std::vector<float> acc = widen(pick(op.arrivals[0]), op.desc.dtype, n);
  std::vector<float> x;
  for (size_t r = 1; r < op.arrivals.size(); ++r) {
    const float* src = static_cast<const float*>(pick(op.arrivals[r]));
    if (op.desc.dtype != DType::kF32) {  // f32 arrivals are summed where they lie
      if (x.size() != n) x.resize(n);
      convert(x.data(), DType::kF32, src, op.desc.dtype, n);
      src = x.data();
    }
    reduce_f32_into(acc.data(), src, n, op.desc.op);
  }
  if (op.desc.op == ReduceOp::kAvg) {
    const float inv = 1.0f / static_cast<float>(op.arrivals.size());
    for (float& v : acc) v *= inv;
  }
  return acc;
}

const void* pick_send(const Arrival& a) { return a.send; }
const void* pick_recv(const Arrival& a) { return a.recv; }

class LocalBackend;

// Runs a fully arrived collective. REQUIRES: group.mu is held.
void execute(LocalGroup& group, Op& op);

// The Work of a collective (State = Op) or a point-to-point message (State = P2pMsg): waits for
// state->done under the group's lock until the deadline; on timeout, missing() (called under the
// lock) names the ranks that have not arrived.
template <typename State>
class LocalWork : public Work {
 public:
  LocalWork(std::shared_ptr<LocalGroup> group, std::shared_ptr<State> state, std::string what, uint64_t seq,
            int rank, const CommOptions& opts, std::function<std::vector<int>(const State&)> missing)
      : group_(std::move(group)), state_(std::move(state)), what_(std::move(what)), seq_(seq), rank_(rank),
        tag_(opts.tag), timeout_(opts.timeout), deadline_(std::chrono::steady_clock::now() + opts.timeout),
        missing_(std::move(missing)) {}

  bool is_completed() override {
    std::lock_guard<std::mutex> lock(group_->mu);
    return state_->done;
  }

  void wait() override {
    std::unique_lock<std::mutex> lock(group_->mu);
    if (!group_->cv.wait_until(lock, deadline_, [&] { return state_->done; })) {
      std::vector<int> missing = missing_(*state_);
      throw CommTimeout(timeout_message("local", what_, seq_, tag_, rank_, group_->size, timeout_, missing), what_,
                        seq_, missing);
    }
    if (state_->error) std::rethrow_exception(state_->error);
  }

 private:
  std::shared_ptr<LocalGroup> group_;
  std::shared_ptr<State> state_;
  std::string what_;
  uint64_t seq_;
  int rank_;
  std::string tag_;
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point deadline_;
  std::function<std::vector<int>(const State&)> missing_;
};

class LocalBackend : public Backend {
 public:
  LocalBackend(std::shared_ptr<LocalGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size; }
  std::string name() const override { return "local"; }
  int max_msg_tag() const override { return std::numeric_limits<int>::max(); }

  std::unique_ptr<Work> broadcast(void* buf, size_t count, DType dtype,
                                  const BroadcastOptions& o) override {
    check_root(o.root, "broadcast");
    return post({"broadcast", count, dtype, o.root, ReduceOp::kSum}, nullptr, buf, o);
  }
  std::unique_ptr<Work> all_reduce(void* buf, size_t count, DType dtype,
                                   const AllReduceOptions& o) override {
    if (o.in_dtype) check_in_dtype("all_reduce", dtype, o.op);
    return post({"all_reduce", count, dtype, 0, o.op, o.in_dtype}, nullptr, buf, o);
  }
  std::unique_ptr<Work> reduce(void* buf, size_t count, DType dtype,
                               const ReduceOptions& o) override {
    check_root(o.root, "reduce");
    return post({"reduce", count, dtype, o.root, o.op}, nullptr, buf, o);
  }
  std::unique_ptr<Work> all_gather(void* recv, const void* send, size_t count, DType dtype,
                                   const AllGatherOptions& o) override {
    return post({"all_gather", count, dtype, 0, ReduceOp::kSum}, send, recv, o);
  }
  std::unique_ptr<Work> gather(void* recv, const void* send, size_t count, DType dtype,
                               const GatherOptions& o) override {
    check_root(o.root, "gather");
    return post({"gather", count, dtype, o.root, ReduceOp::kSum}, send, recv, o);
  }
  std::unique_ptr<Work> scatter(void* recv, const void* send, size_t count, DType dtype,
                                const ScatterOptions& o) override {
    check_root(o.root, "scatter");
    return post({"scatter", count, dtype, o.root, ReduceOp::kSum}, send, recv, o);
  }
  std::unique_ptr<Work> reduce_scatter(void* recv, const void* send, size_t count, DType dtype,
                                       const ReduceScatterOptions& o) override {
    if (o.in_dtype) check_in_dtype("reduce_scatter", dtype, o.op);
    return post({"reduce_scatter", count, dtype, 0, o.op, o.in_dtype}, send, recv, o);
  }
  std::unique_ptr<Work> all_to_all(void* recv, const void* send, size_t count, DType dtype,
                                   const AllToAllOptions& o) override {
    return post({"all_to_all", count, dtype, 0, ReduceOp::kSum}, send, recv, o);
  }
  std::unique_ptr<Work> barrier(const BarrierOptions& o) override {
    return post({"barrier", 0, DType::kF32, 0, ReduceOp::kSum}, nullptr, nullptr, o);
  }

  std::unique_ptr<Work> send(const void* buf, size_t count, DType dtype, int dst,
                             const SendOptions& o) override {
    return p2p(true, const_cast<void*>(buf), count * dtype_size(dtype), dst, o.msg_tag, o);
  }
  std::unique_ptr<Work> recv(void* buf, size_t count, DType dtype, int src,
                             const RecvOptions& o) override {
    return p2p(false, buf, count * dtype_size(dtype), src, o.msg_tag, o);
  }

  std::shared_ptr<Backend> split(int color, int key) override {
    CommOptions o;
    std::shared_ptr<Op> op;
    auto work = post({"split", 0, DType::kF32, 0, ReduceOp::kSum}, nullptr, nullptr, o, color, key,
                     &op);
    work->wait();
    return op->split_out[rank_];
  }

 private:
  std::unique_ptr<Work> post(const OpDesc& desc, const void* send, void* recv, const CommOptions& o,
                             int color = 0, int key = 0, std::shared_ptr<Op>* op_out = nullptr) {
    const uint64_t seq = next_seq_++;
    std::lock_guard<std::mutex> lock(group_->mu);
    std::shared_ptr<Op>& op = group_->ops[seq];
    if (!op) {
      op = std::make_shared<Op>();
      op->desc = desc;
      op->arrivals.resize(group_->size);
    } else if (!(op->desc == desc) && !op->error) {
      op->error = std::make_exception_ptr(Error(
          ErrorKind::kInvalidArgument,
          "collective #" + std::to_string(seq) + " mismatch (local): rank " + std::to_string(rank_) +
              " called " + desc.describe() + ", another rank " + op->desc.describe()));
    }
    op->arrivals[rank_] = Arrival{true, send, recv, color, key};
    std::shared_ptr<Op> keep = op;
    if (op_out) *op_out = keep;
    if (++keep->n_arrived == group_->size) {
      if (!keep->error) {
        try {
          execute(*group_, *keep);
        } catch (...) {
          keep->error = std::current_exception();
        }
      }
      keep->done = true;
      group_->ops.erase(seq);
      group_->cv.notify_all();
    }
    return std::make_unique<LocalWork<Op>>(group_, keep, desc.name, seq, rank_, o, [](const Op& op) {
      std::vector<int> missing;
      for (size_t r = 0; r < op.arrivals.size(); ++r)
        if (!op.arrivals[r].arrived) missing.push_back(static_cast<int>(r));
      return missing;
    });
  }

  std::unique_ptr<Work> p2p(bool is_send, void* buf, size_t bytes, int peer, int tag, const CommOptions& o) {
    const char* what = is_send ? "send" : "recv";
    MT_CHECK(peer >= 0 && peer < size() && peer != rank_, ErrorKind::kInvalidArgument,
             std::string(what) + ": peer " + std::to_string(peer) + " is not another rank of a group of " +
                 std::to_string(size()));
    MT_CHECK(tag >= 0, ErrorKind::kInvalidArgument, std::string(what) + ": msg_tag " + std::to_string(tag) + " is negative");
    const Channel channel = is_send ? Channel{rank_, peer, tag} : Channel{peer, rank_, tag};
    const uint64_t seq = (is_send ? send_seq_ : recv_seq_)[peer]++;
    std::lock_guard<std::mutex> lock(group_->mu);
    auto& mine = (is_send ? group_->sends : group_->recvs)[channel];
    auto& theirs = (is_send ? group_->recvs : group_->sends)[channel];
    std::shared_ptr<P2pMsg> msg;
    if (!theirs.empty()) {
      msg = theirs.front();
      theirs.pop_front();
      if (is_send) msg->send = buf; else msg->recv = buf;
      if (msg->bytes != bytes) {
        msg->error = std::make_exception_ptr(Error(
            ErrorKind::kInvalidArgument, "send/recv between ranks " + std::to_string(std::get<0>(channel)) +
                                             " -> " + std::to_string(std::get<1>(channel)) + " (tag " +
                                             std::to_string(tag) + "): " +
                                             std::to_string(msg->bytes) + " vs " +
                                             std::to_string(bytes) + " bytes"));
      } else if (bytes) {
        std::memcpy(msg->recv, msg->send, bytes);
      }
      msg->done = true;
      group_->cv.notify_all();
    } else {
      msg = std::make_shared<P2pMsg>();
      msg->bytes = bytes;
      if (is_send) msg->send = buf; else msg->recv = buf;
      mine.push_back(msg);
    }
    return std::make_unique<LocalWork<P2pMsg>>(group_, msg, what, seq, rank_, o,
                                                [peer](const P2pMsg&) { return std::vector<int>{peer}; });
  }

  std::shared_ptr<LocalGroup> group_;
  int rank_;
  uint64_t next_seq_ = 0;
  std::map<int, uint64_t> send_seq_, recv_seq_;
};

// A copy that may overlap (one rank's all_gather in place); apart, every thread's (copy_bytes).
void move_bytes(void* dst, const void* src, size_t bytes) {
  const auto* d = static_cast<const char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if (d + bytes <= s || s + bytes <= d) copy_bytes(dst, src, bytes);
  else std::memmove(dst, src, bytes);
}

void execute(LocalGroup& group, Op& op) {
  const int n = group.size;
  const size_t count = op.desc.count;
  const size_t bytes = count * dtype_size(op.desc.dtype);
  auto& a = op.arrivals;
  const std::string& name = op.desc.name;
  auto narrow = [&](void* dst, const float* src, size_t k) {
    convert(dst, op.desc.dtype, src, DType::kF32, k);
  };
  if (name == "barrier") return;
  // One rank (a single-process run's groups): a reduction is its own values in every dtype (the
  // f32 round trip of a 2-byte value is exact, an average divides by 1), so nothing is widened.
  if (n == 1 && (name == "all_reduce" || name == "reduce")) return;
  if (n == 1 && name == "reduce_scatter") {
    if (bytes && a[0].recv != a[0].send) move_bytes(a[0].recv, a[0].send, bytes);
    return;
  }
  if (name == "broadcast") {
    for (int r = 0; r < n; ++r)
      if (r != op.desc.root && bytes) std::memcpy(a[r].recv, a[op.desc.root].recv, bytes);
  } else if (name == "all_reduce" || name == "reduce") {
    std::vector<float> acc = reduce_all(op, count, pick_recv);
    for (int r = 0; r < n; ++r)
      if (name == "all_reduce" || r == op.desc.root) narrow(a[r].recv, acc.data(), count);
  } else if (name == "all_gather" || name == "gather") {
    for (int r = 0; r < n; ++r) {
      if (name == "gather" && r != op.desc.root) continue;
      for (int s = 0; s < n; ++s)
        if (bytes) move_bytes(static_cast<char*>(a[r].recv) + s * bytes, a[s].send, bytes);
    }
  } else if (name == "scatter") {
    for (int r = 0; r < n; ++r)
      if (bytes)
        std::memmove(a[r].recv, static_cast<const char*>(a[op.desc.root].send) + r * bytes, bytes);
  } else if (name == "reduce_scatter") {
    std::vector<float> acc = reduce_all(op, count * n, pick_send);
    for (int r = 0; r < n; ++r) narrow(a[r].recv, acc.data() + r * count, count);
  } else if (name == "all_to_all") {
    std::vector<std::vector<char>> out(n, std::vector<char>(bytes * n));
    for (int r = 0; r < n; ++r)
      for (int s = 0; s < n; ++s)
        if (bytes)
          std::memcpy(out[r].data() + s * bytes, static_cast<const char*>(a[s].send) + r * bytes, bytes);
    for (int r = 0; r < n; ++r)
      if (bytes) std::memcpy(a[r].recv, out[r].data(), bytes * n);
  } else if (name == "split") {
    op.split_out.assign(n, nullptr);
    std::map<int, std::vector<std::pair<int, int>>> members;  // color -> (key, rank)
    for (int r = 0; r < n; ++r)
      if (a[r].color >= 0) members[a[r].color].push_back({a[r].key, r});
    for (auto& [color, m] : members) {
      std::sort(m.begin(), m.end());
      auto g = std::make_shared<LocalGroup>(static_cast<int>(m.size()));
      for (size_t i = 0; i < m.size(); ++i)
        op.split_out[m[i].second] = std::make_shared<LocalBackend>(g, static_cast<int>(i));
    }
  } else {
    throw Error(ErrorKind::kInternal, "local backend: unknown collective " + name);
  }
}

}  // namespace

std::vector<std::shared_ptr<Backend>> make_local_world(int size) {
  MT_CHECK(size >= 1, ErrorKind::kInvalidArgument,
           "local world: size " + std::to_string(size) + " < 1");
  auto group = std::make_shared<LocalGroup>(size);
  std::vector<std::shared_ptr<Backend>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_shared<LocalBackend>(group, r));
  return out;
}

std::vector<std::exception_ptr> run_local_ranks(int size, const std::function<void(Backend&)>& fn) {
  auto world = make_local_world(size);
  std::vector<std::exception_ptr> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(*world[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace mt::comm
