// MpiBackend: see mpi_backend.h. One MPI communicator per group for the data, a duplicate of it
// ("ctl") for arrival announcements and timeout reports so they never match user messages, and
// another ("ring") for reduce_scatter's point-to-point steps.
#include "comm/mpi_backend.h"

#include <mpi.h>
#include <sched.h>

#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/fault.h"
#include "base/threads.h"
#include "tensor/allocator.h"

namespace mt::comm {
namespace {

constexpr int kTagArrive = 1;  // payload: {seq, collective id}
constexpr int kTagReport = 2;  // payload: {seq, missing ranks...}
// After a timeout where every rank announced its arrival, rank 0 asks who still answers: a rank
// stopped (SIGSTOP) or stuck inside the collective does not, and is the one named.
constexpr int kTagPing = 3;  // payload: {seq}
constexpr int kTagPong = 4;  // payload: {seq}

const char* const kCollectives[] = {"broadcast", "all_reduce", "reduce", "all_gather", "gather",
                                    "scatter", "reduce_scatter", "all_to_all", "barrier", "split"};
int collective_id(const std::string& name) {
  for (int i = 0; i < 10; ++i)
    if (name == kCollectives[i]) return i;
  return -1;
}

int g_thread_level = -1;
std::shared_ptr<Backend> g_world;
// MpiWork::wait's sleep between polls once its spins are spent (mpi_idle_sleep_us; set by mpi_init).
std::atomic<int> g_idle_sleep_us{50};
int g_host_cores = 0;  // the union of this host's ranks' affinity masks (mpi_init)

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(ErrorKind::kIOError, std::string("MPI ") + what + " failed: " + std::string(msg, len));
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  return MPI_SUM;
}

// in_dtype sums of bf16 / f16 (backend.h): user MPI ops over MPI_UINT16_T that add the 2-byte
// values and round each partial sum, created once after MPI_Init (commutative).
void sum_bf16_op(void* in, void* inout, int* len, MPI_Datatype*) {
  sum_16bit_into(inout, in, static_cast<size_t>(*len), DType::kBF16);
}
void sum_f16_op(void* in, void* inout, int* len, MPI_Datatype*) {
  sum_16bit_into(inout, in, static_cast<size_t>(*len), DType::kF16);
}
MPI_Op sum_16bit_op(DType dtype) {
  static MPI_Op bf16 = MPI_OP_NULL, f16 = MPI_OP_NULL;
  MPI_Op& op = dtype == DType::kBF16 ? bf16 : f16;
  if (op == MPI_OP_NULL) {
    int rc = MPI_Op_create(dtype == DType::kBF16 ? sum_bf16_op : sum_f16_op, 1, &op);
    if (rc != MPI_SUCCESS) throw Error(ErrorKind::kIOError, "MPI Op_create failed for a 16-bit sum");
  }
  return op;
}

int checked_int(size_t n, const char* what) {
  MT_CHECK(n <= static_cast<size_t>(INT_MAX), ErrorKind::kNotSupported,
           std::string(what) + ": " + std::to_string(n) + " elements exceed MPI's int count");
  return static_cast<int>(n);
}

// A reduce-scatter over a ring of point-to-point messages (reduce_scatter below says why). Ranks
// r-1 -> r -> r+1; in step s (0 .. p-2) rank r sends its partial sum of block (r-s-1) mod p to the
// right and receives the left's partial of block (r-s-2) mod p, to which it adds its own block:
// after p-1 steps it holds block r reduced over every rank. Each step is one Isend and one Irecv of
// a block; advance() adds and posts the next step once both completed, so the ring moves whenever
// any MpiWork of the process is polled (progress_rings), as libnbc's schedules move in MPI_Test.
class Ring {
 public:
  using Add = std::function<void(void* acc, const void* src, size_t n)>;
  Ring(MPI_Comm comm, int rank, int size, int tag, const void* send, void* out, size_t count,
       size_t esize, MPI_Datatype type, Add add)
      : comm_(comm), rank_(rank), size_(size), tag_(tag), send_(static_cast<const char*>(send)),
        out_(static_cast<char*>(out)), count_(count), esize_(esize), type_(type), add_(std::move(add)) {
    const size_t block = count_ * esize_;
    const char* o = out_;
    // out inside send (an in-place call): the last step lands in a buffer of ours, copied at the end
    alias_ = o + block > send_ && o < send_ + block * static_cast<size_t>(size_);
    if (size_ == 1 || count_ == 0) {
      if (size_ == 1 && count_ > 0 && out_ != send_) std::memmove(out_, send_, block);
      done_ = true;
      return;
    }
    // Uninitialised: the steps write them. Accounted as comm (ring_reduce_scatter_scratch_bytes).
    const int blocks = static_cast<int>(ring_reduce_scatter_scratch_bytes(size_, 1, alias_));
    for (int i = 0; i < blocks; ++i) buf_[i] = Buffer::uninitialized(block, MemCategory::kComm);
    post();
  }
  ~Ring() {
    // Not done (a timeout, on the way to abort): MPI may still write into the scratch; leave it.
    if (!done_)
      for (auto& b : buf_)
        if (b.bytes()) (void)new Buffer(std::move(b));
  }
  bool done() const { return done_; }

  // Completes every step whose messages have arrived; true once block r is in out.
  bool advance() {
    while (!done_) {
      int flag = 0;
      check_mpi(MPI_Testall(2, reqs_, &flag, MPI_STATUSES_IGNORE), "Testall");
      if (!flag) return false;
      add_(dst(step_), send_ + block_index(step_, 2) * count_ * esize_, count_);
      if (++step_ == size_ - 1) {
        if (alias_) std::memcpy(out_, dst(step_ - 1), count_ * esize_);
        done_ = true;
        for (auto& b : buf_) b = Buffer();
      } else {
        post();
      }
    }
    return true;
  }

 private:
  size_t block_index(int step, int back) const {
    return static_cast<size_t>(((rank_ - step - back) % size_ + size_) % size_);
  }
  // Where step s receives. Step s receives while step s-1's sum goes out, so two places alternate,
  // the last step's being out: out and one buffer, or, when out lies inside send (whose block r is
  // read by the last step), two buffers and a copy to out at the end.
  char* dst(int step) {
    if (alias_) return buf_[step % 2].as<char>();
    return (size_ - 2 - step) % 2 == 0 ? out_ : buf_[0].as<char>();
  }
  void post() {
    const int n = static_cast<int>(count_);
    const int left = (rank_ + size_ - 1) % size_, right = (rank_ + 1) % size_;
    const void* src = step_ == 0 ? send_ + block_index(0, 1) * count_ * esize_ : dst(step_ - 1);
    check_mpi(MPI_Irecv(dst(step_), n, type_, left, tag_, comm_, &reqs_[0]), "Irecv");
    check_mpi(MPI_Isend(src, n, type_, right, tag_, comm_, &reqs_[1]), "Isend");
  }

  MPI_Comm comm_;
  int rank_, size_, tag_;
  const char* send_;
  char* out_;
  size_t count_, esize_;
  MPI_Datatype type_;
  Add add_;
  bool alias_ = false, done_ = false;
  int step_ = 0;
  Buffer buf_[2];  // scratch blocks
  MPI_Request reqs_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

// MT_REDUCE_SCATTER=mpi: reduce_scatter calls MPI_Ireduce_scatter_block instead of the ring (to
// compare them, or for an MPI whose own is faster). Read at every call; every rank must agree.
bool mpi_reduce_scatter() {
  const char* v = std::getenv("MT_REDUCE_SCATTER");
  if (v == nullptr || !*v || std::strcmp(v, "ring") == 0) return false;
  MT_CHECK(std::strcmp(v, "mpi") == 0, ErrorKind::kInvalidArgument,
           std::string("MT_REDUCE_SCATTER=") + v + ": expected 'ring' (the default) or 'mpi'");
  return true;
}

// Every ring not yet done, in the order posted. One process-wide list: a poll of any Work moves all.
std::mutex g_rings_mu;
std::vector<Ring*> g_rings;
void progress_rings() {
  std::lock_guard<std::mutex> lock(g_rings_mu);
  for (Ring* r : g_rings) r->advance();
  g_rings.erase(std::remove_if(g_rings.begin(), g_rings.end(), [](Ring* r) { return r->done(); }), g_rings.end());
}
void forget_ring(Ring* ring) {
  std::lock_guard<std::mutex> lock(g_rings_mu);
  g_rings.erase(std::remove(g_rings.begin(), g_rings.end(), ring), g_rings.end());
}

class MpiBackend;

class MpiWork : public Work {
 public:
  MpiWork(MpiBackend* backend, std::string what, uint64_t seq, int peer, const CommOptions& opts)
      : backend_(backend), what_(std::move(what)), seq_(seq), peer_(peer), tag_(opts.tag),
        timeout_(opts.timeout), deadline_(opts.timeout) {}
  ~MpiWork() override;

  bool is_completed() override;
  void wait() override;
  uint64_t seq() const { return seq_; }

  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<float> f32_a, f32_b;  // widened copies of bf16/f16 buffers
  std::function<void()> finish;     // runs once on completion (narrowing, avg scaling)
  std::unique_ptr<Ring> ring;       // reduce_scatter: its steps, in place of req
  void start_ring(std::unique_ptr<Ring> r) {
    ring = std::move(r);
    if (ring->done()) return;
    std::lock_guard<std::mutex> lock(g_rings_mu);
    g_rings.push_back(ring.get());
  }

 private:
  MpiBackend* backend_;
  std::string what_;
  uint64_t seq_;
  int peer_;  // send/recv: the other rank; collectives: -1
  std::string tag_;
  std::chrono::milliseconds timeout_;
  WaitDeadline deadline_;
  bool done_ = false;
};

class MpiBackend : public Backend {
 public:
  MpiBackend(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    check_mpi(MPI_Comm_rank(comm_, &rank_), "Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "Comm_size");
    check_mpi(MPI_Comm_dup(comm_, &ctl_), "Comm_dup");
    MPI_Comm_set_errhandler(ctl_, MPI_ERRORS_RETURN);
    check_mpi(MPI_Comm_dup(comm_, &ring_), "Comm_dup");
    MPI_Comm_set_errhandler(ring_, MPI_ERRORS_RETURN);
    last_seq_.assign(size_, -1);
    last_id_.assign(size_, -1);
    // A group's ranks are its own numbering (a tp or dp group of a larger world): a timeout names
    // the world's ranks, which the launcher's output and a user's `kill` know (it named group
    // rank 1 of the dp group {1, 3}, a healthy process, for a stuck world rank 3).
    MPI_Group mine, everyone;
    MPI_Comm_group(comm_, &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &everyone);
    std::vector<int> own(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) own[static_cast<size_t>(r)] = r;
    world_of_.assign(static_cast<size_t>(size_), MPI_UNDEFINED);
    MPI_Group_translate_ranks(mine, size_, own.data(), everyone, world_of_.data());
    MPI_Group_free(&mine);
    MPI_Group_free(&everyone);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
    bool same = size_ == world_size_;
    for (int r = 0; r < size_; ++r) same = same && world_of_[static_cast<size_t>(r)] == r;
    if (same) world_of_.clear();
  }
  ~MpiBackend() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    reap_sends();
    for (auto& s : sends_) s.second.release();  // NOTE: leaked on purpose: MPI may still read it
    MPI_Comm_free(&ctl_);
    MPI_Comm_free(&ring_);
    if (owned_) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  int max_msg_tag() const override {
    int* ub = nullptr;
    int found = 0;
    check_mpi(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found), "Comm_get_attr(MPI_TAG_UB)");
    return found && ub ? *ub : kMaxMsgTag;
  }

  std::unique_ptr<Work> broadcast(void* buf, size_t count, DType dtype,
                                  const BroadcastOptions& o) override {
    check_root(o.root, "broadcast");
    auto w = begin("broadcast", o);
    check_mpi(MPI_Ibcast(buf, bytes(count, dtype, "broadcast"), MPI_BYTE, o.root, comm_, &w->req),
              "Ibcast");
    return w;
  }

  std::unique_ptr<Work> all_reduce(void* buf, size_t count, DType dtype,
                                   const AllReduceOptions& o) override {
    auto w = begin("all_reduce", o);
    if (o.in_dtype && dtype != DType::kF32) {
      check_in_dtype("all_reduce", dtype, o.op);
      check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buf, checked_int(count, "all_reduce"), MPI_UINT16_T,
                               sum_16bit_op(dtype), comm_, &w->req),
                "Iallreduce");
      if (o.op == ReduceOp::kAvg) w->finish = scale_16bit(buf, count, dtype);
      return w;
    }
    float* data = widen(*w, w->f32_a, buf, count, dtype);
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, checked_int(count, "all_reduce"), MPI_FLOAT,
                             mpi_op(o.op), comm_, &w->req),
              "Iallreduce");
    w->finish = narrow_back(*w, buf, data, count, dtype, o.op);
    return w;
  }

  std::unique_ptr<Work> reduce(void* buf, size_t count, DType dtype, const ReduceOptions& o) override {
    check_root(o.root, "reduce");
    auto w = begin("reduce", o);
    float* data = widen(*w, w->f32_a, buf, count, dtype);
    const bool root = rank_ == o.root;
    check_mpi(MPI_Ireduce(root ? MPI_IN_PLACE : data, root ? data : nullptr,
                          checked_int(count, "reduce"), MPI_FLOAT, mpi_op(o.op), o.root, comm_,
                          &w->req),
              "Ireduce");
    if (root) w->finish = narrow_back(*w, buf, data, count, dtype, o.op);
    return w;
  }

  // Not MPI_Ireduce_scatter_block: OpenMPI 4.1's libnbc reduces the whole buffer to rank 0 over a
  // binomial tree and then scatters it, so rank 0 receives and adds log2(p) whole buffers and sends
  // p-1 blocks, 2.0-3.1 times a ring's time on 2 ranks at 16.8-498 MB (docs/PERF.md (q)). The ring
  // (class Ring) moves and adds (p-1)/p of the buffer on every rank, at once.
  std::unique_ptr<Work> reduce_scatter(void* recv, const void* send, size_t count, DType dtype,
                                       const ReduceScatterOptions& o) override {
    auto w = begin("reduce_scatter", o);
    checked_int(count, "reduce_scatter");
    const int tag = static_cast<int>(w->seq() % 32768);  // MPI_TAG_UB is at least 32767
    if (o.in_dtype && dtype != DType::kF32) {
      check_in_dtype("reduce_scatter", dtype, o.op);
      if (mpi_reduce_scatter())
        check_mpi(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count), MPI_UINT16_T, sum_16bit_op(dtype),
                                            comm_, &w->req),
                  "Ireduce_scatter_block");
      else w->start_ring(std::make_unique<Ring>(ring_, rank_, size_, tag, send, recv, count, 2, MPI_UINT16_T,
                                           [dtype](void* acc, const void* src, size_t n) {
                                             sum_16bit_into(acc, src, n, dtype);
                                           }));
      if (o.op == ReduceOp::kAvg) w->finish = scale_16bit(recv, count, dtype);
      return w;
    }
    const float* in = widen(*w, w->f32_a, const_cast<void*>(send), count * size_, dtype);
    float* out = dtype == DType::kF32 ? static_cast<float*>(recv) : nullptr;
    if (!out) {
      w->f32_b.resize(count);
      out = w->f32_b.data();
    }
    if (mpi_reduce_scatter())
      check_mpi(MPI_Ireduce_scatter_block(in, out, static_cast<int>(count), MPI_FLOAT, mpi_op(o.op), comm_, &w->req),
                "Ireduce_scatter_block");
    else w->start_ring(std::make_unique<Ring>(ring_, rank_, size_, tag, in, out, count, sizeof(float), MPI_FLOAT,
                                         [op = o.op](void* acc, const void* src, size_t n) {
                                           reduce_f32_into(static_cast<float*>(acc), static_cast<const float*>(src), n, op);
                                         }));
    w->finish = narrow_back(*w, recv, out, count, dtype, o.op);
    return w;
  }

  std::unique_ptr<Work> all_gather(void* recv, const void* send, size_t count, DType dtype,
                                   const AllGatherOptions& o) override {
    auto w = begin("all_gather", o);
    const int n = bytes(count, dtype, "all_gather");
    const bool in_place = send == static_cast<char*>(recv) + static_cast<size_t>(rank_) * n;
    check_mpi(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_,
                             &w->req),
              "Iallgather");
    return w;
  }

  std::unique_ptr<Work> gather(void* recv, const void* send, size_t count, DType dtype,
                               const GatherOptions& o) override {
    check_root(o.root, "gather");
    auto w = begin("gather", o);
    const int n = bytes(count, dtype, "gather");
    check_mpi(MPI_Igather(send, n, MPI_BYTE, recv, n, MPI_BYTE, o.root, comm_, &w->req), "Igather");
    return w;
  }

  std::unique_ptr<Work> scatter(void* recv, const void* send, size_t count, DType dtype,
                                const ScatterOptions& o) override {
    check_root(o.root, "scatter");
    auto w = begin("scatter", o);
    const int n = bytes(count, dtype, "scatter");
    check_mpi(MPI_Iscatter(send, n, MPI_BYTE, recv, n, MPI_BYTE, o.root, comm_, &w->req),
              "Iscatter");
    return w;
  }

  std::unique_ptr<Work> all_to_all(void* recv, const void* send, size_t count, DType dtype,
                                   const AllToAllOptions& o) override {
    auto w = begin("all_to_all", o);
    const int n = bytes(count, dtype, "all_to_all");
    check_mpi(MPI_Ialltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, &w->req), "Ialltoall");
    return w;
  }

  std::unique_ptr<Work> barrier(const BarrierOptions& o) override {
    auto w = begin("barrier", o);
    check_mpi(MPI_Ibarrier(comm_, &w->req), "Ibarrier");
    return w;
  }

  void check_msg_tag(int tag, const char* what) const {
    const int ub = max_msg_tag();
    MT_CHECK(tag >= 0 && tag <= ub, ErrorKind::kInvalidArgument,
             std::string(what) + ": msg_tag " + std::to_string(tag) + " is outside [0, " + std::to_string(ub) + "] (MPI_TAG_UB)");
  }

  std::unique_ptr<Work> send(const void* buf, size_t count, DType dtype, int dst,
                             const SendOptions& o) override {
    check_peer(dst, "send");
    check_msg_tag(o.msg_tag, "send");
    auto w = std::make_unique<MpiWork>(this, "send", send_seq_++, dst, o);
    check_mpi(MPI_Isend(buf, bytes(count, dtype, "send"), MPI_BYTE, dst, o.msg_tag, comm_, &w->req), "Isend");
    return w;
  }

  std::unique_ptr<Work> recv(void* buf, size_t count, DType dtype, int src,
                             const RecvOptions& o) override {
    check_peer(src, "recv");
    check_msg_tag(o.msg_tag, "recv");
    auto w = std::make_unique<MpiWork>(this, "recv", recv_seq_++, src, o);
    check_mpi(MPI_Irecv(buf, bytes(count, dtype, "recv"), MPI_BYTE, src, o.msg_tag, comm_, &w->req), "Irecv");
    return w;
  }

  std::shared_ptr<Backend> split(int color, int key) override {
    CommOptions o;
    begin("split", o);
    MPI_Comm sub = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "Comm_split");
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_shared<MpiBackend>(sub, true);
  }

  [[noreturn]] void abort(int code, const std::string& message) override {
    std::fprintf(stderr, "meshtrain: rank %d aborting the MPI job (code %d): %s\n", rank_, code,
                 message.c_str());
    std::fflush(stderr);
    MPI_Abort(comm_, code);
    std::_Exit(code);
  }

  // Ranks other than 0: answers rank 0's "are you there?" (called while waiting).
  void answer_pings() {
    if (rank_ == 0) return;
    for (;;) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(0, kTagPing, ctl_, &flag, &st) != MPI_SUCCESS || !flag) return;
      uint64_t seq = 0;
      check_mpi(MPI_Recv(&seq, 1, MPI_UINT64_T, 0, kTagPing, ctl_, MPI_STATUS_IGNORE), "Recv");
      check_mpi(MPI_Send(&seq, 1, MPI_UINT64_T, 0, kTagPong, ctl_), "Send");
    }
  }

  // Rank 0: the ranks (other than 0) that do not answer a ping within `wait`.
  std::vector<int> silent_ranks(uint64_t seq, std::chrono::milliseconds wait) {
    std::vector<bool> answered(size_, false);
    answered[0] = true;
    std::vector<uint64_t> payload(size_, seq);
    for (int r = 1; r < size_; ++r) {
      MPI_Request req;
      check_mpi(MPI_Isend(&payload[r], 1, MPI_UINT64_T, r, kTagPing, ctl_, &req), "Isend");
      MPI_Request_free(&req);  // tiny, sent eagerly; a stopped rank never receives it
    }
    auto until = std::chrono::steady_clock::now() + wait;
    int left = size_ - 1;
    while (left > 0 && std::chrono::steady_clock::now() < until) {
      int flag = 0;
      MPI_Status st;
      check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, kTagPong, ctl_, &flag, &st), "Iprobe");
      if (!flag) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        continue;
      }
      uint64_t got = 0;
      check_mpi(MPI_Recv(&got, 1, MPI_UINT64_T, st.MPI_SOURCE, kTagPong, ctl_, MPI_STATUS_IGNORE), "Recv");
      if (got == seq && !answered[st.MPI_SOURCE]) {
        answered[st.MPI_SOURCE] = true;
        --left;
      }
    }
    std::vector<int> silent;
    for (int r = 1; r < size_; ++r)
      if (!answered[r]) silent.push_back(r);
    return silent;
  }

  // Rank 0: reads every pending arrival announcement. Others: reaps finished announcements.
  void drain() {
    progress_rings();
    reap_sends();
    if (rank_ != 0) return;
    for (;;) {
      int flag = 0;
      MPI_Status st;
      check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, kTagArrive, ctl_, &flag, &st), "Iprobe");
      if (!flag) return;
      uint64_t msg[2];
      check_mpi(MPI_Recv(msg, 2, MPI_UINT64_T, st.MPI_SOURCE, kTagArrive, ctl_, MPI_STATUS_IGNORE),
                "Recv");
      last_seq_[st.MPI_SOURCE] = static_cast<int64_t>(msg[0]);
      last_id_[st.MPI_SOURCE] = static_cast<int>(msg[1]);
    }
  }

  [[noreturn]] void throw_timeout(const std::string& what, uint64_t seq, int peer,
                                  const std::string& tag, std::chrono::milliseconds timeout) {
    std::vector<int> missing;
    std::string note;
    bool silent = false;
    if (peer >= 0) {
      missing = {peer};
    } else if (rank_ == 0) {
      drain();
      const int id = collective_id(what);
      for (int r = 0; r < size_; ++r) {
        if (last_seq_[r] < static_cast<int64_t>(seq)) missing.push_back(r);
        else if (last_seq_[r] == static_cast<int64_t>(seq) && last_id_[r] != id)
          note += "; rank " + std::to_string(r) + " called " + kCollectives[last_id_[r]] +
                  " #" + std::to_string(seq) + " instead";
      }
      if (missing.empty() && note.empty() && size_ > 1) {
        // Everyone arrived, yet it did not complete: name whoever no longer answers.
        missing = silent_ranks(seq, std::min(timeout, std::chrono::milliseconds(2000)));
        silent = !missing.empty();
        if (silent) note = " (stopped, e.g. by SIGSTOP, or stuck inside the collective)";
      }
      std::vector<uint64_t> report{seq};
      for (int r : missing) report.push_back(static_cast<uint64_t>(r));
      for (int r = 1; r < size_; ++r) {
        if (last_seq_[r] < static_cast<int64_t>(seq)) continue;
        MPI_Request req;  // tiny: sent eagerly; waited for below, at most a second
        check_mpi(MPI_Isend(report.data(), static_cast<int>(report.size()), MPI_UINT64_T, r,
                            kTagReport, ctl_, &req),
                  "Isend");
        auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        int flag = 0;
        while (!flag && std::chrono::steady_clock::now() < until) MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
        if (!flag) MPI_Request_free(&req);
      }
    } else {
      missing = wait_report(seq, timeout);
      if (missing.empty()) {
        missing = {0};
        note = " (no report from rank 0, which gathers arrivals: it has not arrived or is stuck)";
      }
    }
    int shown_rank = rank_, shown_size = size_;
    if (!world_of_.empty()) {
      std::string members;
      for (int& r : missing) r = world_of_[static_cast<size_t>(r)];
      for (int w : world_of_) {
        if (!members.empty()) members.push_back(',');
        members.append(std::to_string(w));
      }
      note += " (world ranks; the group is world ranks " + members + ")";
      shown_rank = world_of_[static_cast<size_t>(rank_)];
      shown_size = world_size_;
    }
    throw CommTimeout(timeout_message("mpi", what, seq, tag, shown_rank, shown_size, timeout, missing, silent) + note,
                      what, seq, missing);
  }

 private:
  std::unique_ptr<MpiWork> begin(const std::string& what, const CommOptions& o) {
    const uint64_t seq = next_seq_++;
    if (rank_ == 0) {
      last_seq_[0] = static_cast<int64_t>(seq);
      last_id_[0] = collective_id(what);
    } else {
      auto payload = std::make_unique<uint64_t[]>(2);
      payload[0] = seq;
      payload[1] = static_cast<uint64_t>(collective_id(what));
      MPI_Request req;
      check_mpi(MPI_Isend(payload.get(), 2, MPI_UINT64_T, 0, kTagArrive, ctl_, &req), "Isend");
      sends_.emplace_back(req, std::move(payload));
    }
    // Tests: MT_FAULT=comm.after_arrive@R with MT_FAULT_MODE=hang stops rank R right after it has
    // announced its arrival (what SIGSTOP inside a collective looks like to the others).
    fault_point("comm.after_arrive");
    drain();
    return std::make_unique<MpiWork>(this, what, seq, -1, o);
  }

  std::vector<int> wait_report(uint64_t seq, std::chrono::milliseconds timeout) {
    auto until = std::chrono::steady_clock::now() + std::max(timeout, std::chrono::milliseconds(200));
    while (std::chrono::steady_clock::now() < until) {
      int flag = 0;
      MPI_Status st;
      check_mpi(MPI_Iprobe(0, kTagReport, ctl_, &flag, &st), "Iprobe");
      if (!flag) {
        answer_pings();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        continue;
      }
      int n = 0;
      MPI_Get_count(&st, MPI_UINT64_T, &n);
      std::vector<uint64_t> report(n);
      check_mpi(MPI_Recv(report.data(), n, MPI_UINT64_T, 0, kTagReport, ctl_, MPI_STATUS_IGNORE),
                "Recv");
      if (n >= 1 && report[0] == seq) return std::vector<int>(report.begin() + 1, report.end());
    }
    return {};
  }

  void reap_sends() {
    while (!sends_.empty()) {
      int flag = 0;
      MPI_Test(&sends_.front().first, &flag, MPI_STATUS_IGNORE);
      if (!flag) return;
      sends_.pop_front();
    }
  }

  int bytes(size_t count, DType dtype, const char* what) const {
    return checked_int(count * dtype_size(dtype), what);
  }

  void check_peer(int peer, const char* what) const {
    MT_CHECK(peer >= 0 && peer < size_ && peer != rank_, ErrorKind::kInvalidArgument,
             std::string(what) + ": peer " + std::to_string(peer) +
                 " is not another rank of a group of " + std::to_string(size_));
  }

  // The f32 buffer to reduce: buf itself for f32, else a widened copy kept in `keep`.
  static float* widen(MpiWork&, std::vector<float>& keep, void* buf, size_t n, DType dtype) {
    if (dtype == DType::kF32) return static_cast<float*>(buf);
    keep.resize(n);
    convert(keep.data(), DType::kF32, buf, dtype, n);
    return keep.data();
  }

  // kAvg of an in_dtype reduction: the rounded sum divided by the group size, rounded again.
  std::function<void()> scale_16bit(void* buf, size_t n, DType dtype) const {
    const float inv = 1.0f / static_cast<float>(size_);
    return [=] {
      std::vector<float> f(n);
      convert(f.data(), DType::kF32, buf, dtype, n);
      for (float& v : f) v *= inv;
      convert(buf, dtype, f.data(), DType::kF32, n);
    };
  }

  std::function<void()> narrow_back(MpiWork&, void* dst, float* f32, size_t n, DType dtype,
                                    ReduceOp op) const {
    const float inv = 1.0f / static_cast<float>(size_);
    return [=] {
      if (op == ReduceOp::kAvg)
        for (size_t i = 0; i < n; ++i) f32[i] *= inv;
      if (dtype != DType::kF32) convert(dst, dtype, f32, DType::kF32, n);
    };
  }

  MPI_Comm comm_, ctl_, ring_;  // ring_: reduce_scatter's messages (tag: the call's number)
  bool owned_;
  int rank_ = 0, size_ = 1;
  uint64_t next_seq_ = 0, send_seq_ = 0, recv_seq_ = 0;
  std::vector<int> world_of_;  // a group's: each group rank's world rank (empty: numbered as the world)
  int world_size_ = 0;
  std::vector<int64_t> last_seq_;  // rank 0: the last collective each rank announced
  std::vector<int> last_id_;
  std::deque<std::pair<MPI_Request, std::unique_ptr<uint64_t[]>>> sends_;
};

MpiWork::~MpiWork() {
  if (ring) forget_ring(ring.get());
  // NOTE: a Work dropped before completion leaves MPI writing into the caller's buffers; it is
  // only meant to happen on the way to abort().
  if (!done_ && req != MPI_REQUEST_NULL) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && peer_ >= 0) MPI_Request_free(&req);
  }
}

bool MpiWork::is_completed() {
  if (done_) return true;
  backend_->drain();  // moves every ring too
  if (ring) {
    if (!ring->done()) return false;
  } else {
    int flag = 0;
    check_mpi(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "Test");
    if (!flag) return false;
  }
  done_ = true;
  if (finish) finish();
  return true;
}

void MpiWork::wait() {
  const auto nap = std::chrono::microseconds(g_idle_sleep_us.load(std::memory_order_relaxed));
  for (int spins = 0; !is_completed(); ++spins) {
    if (deadline_.passed()) {
      if (!is_completed()) backend_->throw_timeout(what_, seq_, peer_, tag_, timeout_);
      return;
    }
    if (spins > 1000) {
      if (spins % 64 == 0) backend_->answer_pings();
      std::this_thread::sleep_for(nap);
    } else {
      std::this_thread::yield();
    }
  }
}

const char* level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "single";
    case MPI_THREAD_FUNNELED: return "funneled";
    case MPI_THREAD_SERIALIZED: return "serialized";
    case MPI_THREAD_MULTIPLE: return "multiple";
  }
  return "none";
}

}  // namespace

namespace {
constexpr const char* kHugeMalloc = "glibc.malloc.hugetlb=1";
}  // namespace

bool mpi_malloc_huge_pages() {
  const char* t = std::getenv("GLIBC_TUNABLES");
  return t != nullptr && std::strstr(t, kHugeMalloc) != nullptr;
}

void mpi_prepare_process(char** argv) {
  const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_SIZE");
  if (!launched || argv == nullptr || argv[0] == nullptr || mpi_malloc_huge_pages()) return;
  const char* user = std::getenv("GLIBC_TUNABLES");
  if (user != nullptr && std::strstr(user, "glibc.malloc.hugetlb") != nullptr) return;  // the user chose
  if (std::getenv("MT_MALLOC_REEXEC")) return;  // once: a secure-mode exec drops tunables
  const std::string tunables = user && *user ? std::string(user) + ":" + kHugeMalloc : std::string(kHugeMalloc);
  ::setenv("GLIBC_TUNABLES", tunables.c_str(), 1);
  ::setenv("MT_MALLOC_REEXEC", "1", 1);
  ::execv("/proc/self/exe", argv);
  // The exec failed (no /proc): run on as we are, with the user's environment back.
  if (user) ::setenv("GLIBC_TUNABLES", user, 1);
  else ::unsetenv("GLIBC_TUNABLES");
}

// MPI's start-up has no deadline of its own: a rank stopped or stuck before it joined (SIGSTOP, a
// host that hangs) held every other rank in MPI_Init, or in the host's split below, for good (a
// job hung 717 s, a SIGTERM recorded but never acted on), where comm_timeout covers only the
// collectives after it. The watch ends this rank with its line once the start-up has taken
// MT_START_TIMEOUT seconds (300, comm_timeout's default; the configuration is read after MPI
// starts), and mpirun ends the job at that exit.
class StartWatch {
 public:
  StartWatch() {
    double seconds = 300.0;
    if (const char* v = std::getenv("MT_START_TIMEOUT"); v != nullptr && *v) {
      char* end = nullptr;
      const double s = std::strtod(v, &end);
      MT_CHECK(*end == '\0' && s > 0 && s <= 1e6, ErrorKind::kInvalidArgument,
               std::string("MT_START_TIMEOUT=") + v + ": expected seconds, more than 0 and at most 1e6");
      seconds = s;
    }
    const char* r = std::getenv("OMPI_COMM_WORLD_RANK");  // (read here: MPI_Init sets variables as it goes)
    const std::string rank = r ? r : "?";
    watch_ = std::thread([this, seconds, rank] {
      // Time the job spent stopped does not count (a suspend and resume during the start-up): the
      // deadline starts afresh at each continue, as comm_timeout's.
      std::unique_lock<std::mutex> lock(mu_);
      uint64_t seen = continues();
      auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                             std::chrono::duration<double>(seconds));
      while (!done_) {
        if (cv_.wait_for(lock, std::chrono::seconds(1), [this] { return done_; })) return;
        if (const uint64_t now = continues(); now != seen) {
          seen = now;
          deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                            std::chrono::duration<double>(seconds));
        }
        if (std::chrono::steady_clock::now() < deadline) continue;
        std::fprintf(stderr,
                     "meshtrain: error: rank %s: MPI's start-up (MPI_Init and this host's ranks meeting) has not finished "
                     "in %g s: a rank of the job was stopped or is stuck before it joined (MT_START_TIMEOUT sets the wait)\n",
                     rank.c_str(), seconds);
        std::fflush(stderr);
        ::_exit(1);
      }
    });
  }
  ~StartWatch() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    watch_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread watch_;
};

std::shared_ptr<Backend> mpi_init(int* argc, char*** argv) {
  if (g_world) return g_world;
  count_continues();  // (before the watch, which counts continues)
  StartWatch watch;   // to the end of the start-up's collectives
  int user_nap = 0;  // MT_WAIT_NAP_US, refused before MPI starts (every rank exits with its line)
  if (const char* v = std::getenv("MT_WAIT_NAP_US"); v != nullptr && *v) {
    char* end = nullptr;
    const long us = std::strtol(v, &end, 10);
    MT_CHECK(*end == '\0' && us >= 1 && us <= 1000000, ErrorKind::kInvalidArgument,
             std::string("MT_WAIT_NAP_US=") + v + ": expected a whole number of microseconds from 1 to 1000000");
    user_nap = static_cast<int>(us);
  }
  int initialized = 0;
  MPI_Initialized(&initialized);
  // A peer that died leaves its TCP sockets half closed: OpenMPI's next writev to one raises
  // SIGPIPE, which would kill this healthy rank, and mpirun, reporting the first death it hears
  // of, would name it ("rank 1 exited on signal 13") instead of the lost one. Ignored, the write
  // fails with EPIPE, the rank waits on, and the lost rank's own death (or the collective
  // timeout's report naming it) is what ends the job. A handler the program set stays.
  count_continues();
  struct sigaction pipe_action {};
  if (::sigaction(SIGPIPE, nullptr, &pipe_action) == 0 && pipe_action.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
  if (!initialized) {
    if (fault_active("mpi.slow_start")) std::this_thread::sleep_for(std::chrono::seconds(8));  // test seam: a rank late to join
    ::setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);  // the ring, unless the user chose (mpi_backend.h)
    check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &g_thread_level), "Init_thread");
  }
  else MPI_Query_thread(&g_thread_level);
  MT_CHECK(g_thread_level >= MPI_THREAD_SERIALIZED, ErrorKind::kIOError,
           std::string("MPI provides only thread level '") + level_name(g_thread_level) +
               "'; meshtrain needs 'serialized' or 'multiple'");
  // This host's ranks (shared memory) and the cores they may run on together: the union of their
  // affinity masks (mpirun binds each of 2 ranks to a core of its own by default, a cpuset bounds
  // them all; hardware_concurrency counted CPUs that none of them may use), within their cgroup's
  // CPU quota.
  MPI_Comm host = MPI_COMM_NULL;
  int on_host = 1;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const bool masked = ::sched_getaffinity(0, sizeof cpus, &cpus) == 0;
  // Each rank's cgroup CPU quota and the cgroup that sets it: the ranks of one container share
  // one quota, ranks in cgroups of their own each bring theirs; none where any rank has none.
  std::string limiting;
  std::vector<double> quotas = {cgroup_cpu_quota(&limiting), static_cast<double>(std::hash<std::string>{}(limiting) >> 12)};
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host) == MPI_SUCCESS &&
      host != MPI_COMM_NULL) {
    MPI_Comm_size(host, &on_host);
    MPI_Allreduce(MPI_IN_PLACE, &cpus, static_cast<int>(sizeof cpus), MPI_BYTE, MPI_BOR, host);
    std::vector<double> all(2 * static_cast<size_t>(on_host));
    MPI_Allgather(quotas.data(), 2, MPI_DOUBLE, all.data(), 2, MPI_DOUBLE, host);
    quotas = std::move(all);
    MPI_Comm_free(&host);
  }
  g_host_cores = masked && CPU_COUNT(&cpus) > 0 ? CPU_COUNT(&cpus) : host_cores();
  double quota = 0.0;
  std::vector<double> counted;
  for (size_t r = 0; r + 1 < quotas.size(); r += 2) {
    if (quotas[r] <= 0) {
      quota = 0.0;
      break;
    }
    if (std::find(counted.begin(), counted.end(), quotas[r + 1]) == counted.end())
      counted.push_back(quotas[r + 1]), quota += quotas[r];
  }
  if (quota > 0) g_host_cores = std::min(g_host_cores, std::max(1, static_cast<int>(std::ceil(quota - 1e-9))));
  g_idle_sleep_us.store(user_nap > 0 ? user_nap : mpi_idle_sleep_us(on_host, threads_get(), g_host_cores));
  g_world = std::make_shared<MpiBackend>(MPI_COMM_WORLD, false);
  return g_world;
}

int mpi_idle_sleep_us(int ranks_on_host, int threads, int cores) {
  const long wanted = static_cast<long>(std::max(1, ranks_on_host)) * std::max(1, threads);
  return wanted > std::max(1, cores) ? 1000 : 50;
}

int mpi_wait_sleep_us() { return g_idle_sleep_us.load(std::memory_order_relaxed); }

int mpi_host_cores() { return g_host_cores > 0 ? g_host_cores : host_cores(); }

const char* mpi_reduce_scatter_path() { return mpi_reduce_scatter() ? "mpi" : "ring"; }

size_t ring_reduce_scatter_scratch_bytes(int size, size_t block_bytes, bool in_place) {
  if (size < 2 || block_bytes == 0) return 0;
  const int blocks = in_place ? std::min(2, size - 1) : std::min(1, size - 2);
  return static_cast<size_t>(blocks) * block_bytes;
}

size_t reduce_scatter_scratch_bytes(int size, size_t block_bytes, bool in_place) {
  return mpi_reduce_scatter() ? 0 : ring_reduce_scatter_scratch_bytes(size, block_bytes, in_place);
}

int mpi_iallreduce_algorithm() {
  int provided = 0;
  if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) return -1;
  int index = -1, value = -1;
  if (MPI_T_cvar_get_index("coll_libnbc_iallreduce_algorithm", &index) == MPI_SUCCESS) {
    MPI_T_cvar_handle handle;
    int count = 0;
    if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
      if (count != 1 || MPI_T_cvar_read(handle, &value) != MPI_SUCCESS) value = -1;
      MPI_T_cvar_handle_free(&handle);
    }
  }
  MPI_T_finalize();
  return value;
}

void mpi_finalize() {
  g_world.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

const char* mpi_thread_level() { return level_name(g_thread_level); }

}  // namespace mt::comm
