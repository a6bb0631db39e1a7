#include "comm/nccl/nccl_backend.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>


namespace mt::comm {
namespace {

void check_nccl(ncclResult_t r, const std::string& what) {
  if (r != ncclSuccess)
    throw Error(ErrorKind::kIOError, "nccl: " + what + " failed: " + ncclGetErrorString(r) +
                                         (r == ncclInvalidUsage ? " (two ranks on one GPU? NCCL needs one GPU each)" : ""));
}
void check_cuda(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw Error(ErrorKind::kInternal, "nccl: " + what + ": " + cudaGetErrorString(e));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

class NcclWork : public Work {
 public:
  NcclWork(ncclComm_t comm, cudaStream_t stream, std::string what, int rank, int size,
           std::chrono::milliseconds timeout)
      : comm_(comm), what_(std::move(what)), rank_(rank), size_(size), timeout_(timeout),
        deadline_(timeout) {
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(event_, stream), "cudaEventRecord after " + what_);
  }
  ~NcclWork() override {
    if (event_) cudaEventDestroy(event_);
  }
  bool is_completed() override {
    if (done_) return true;
    cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    check_cuda(e, what_);
    done_ = true;
    return true;
  }
  void wait() override {
    while (!is_completed()) {
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
      check_nccl(async, what_);
      if (deadline_.passed()) {
        if (is_completed()) return;
        ncclCommAbort(comm_);  // the communicator cannot be used again: the job is meant to end
        throw CommTimeout(timeout_message("nccl", what_, 0, "", rank_, size_, timeout_, {}), what_, 0, {});
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  ncclComm_t comm_;
  std::string what_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  WaitDeadline deadline_;
  cudaEvent_t event_ = nullptr;
  bool done_ = false;
};

class NcclBackend final : public Backend {
 public:
  NcclBackend(ncclComm_t comm, cudaStream_t stream, int rank, int size)
      : comm_(comm), stream_(stream), rank_(rank), size_(size) {}
  ~NcclBackend() override {
    if (comm_) ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }

  std::unique_ptr<Work> broadcast(void* buf, size_t count, DType dtype, const BroadcastOptions& o) override {
    check_root(o.root, "broadcast");
    check_nccl(ncclBroadcast(buf, buf, count, nccl_type(dtype), o.root, comm_, stream_), "ncclBroadcast");
    return work("broadcast", o);
  }
  std::unique_ptr<Work> all_reduce(void* buf, size_t count, DType dtype, const AllReduceOptions& o) override {
    check_dtype("all_reduce", dtype, o.in_dtype);
    check_nccl(ncclAllReduce(buf, buf, count, nccl_type(dtype), nccl_op(o.op), comm_, stream_),
               "ncclAllReduce");
    return work("all_reduce", o);
  }
  std::unique_ptr<Work> reduce(void* buf, size_t count, DType dtype, const ReduceOptions& o) override {
    check_root(o.root, "reduce");
    check_dtype("reduce", dtype, false);
    check_nccl(ncclReduce(buf, buf, count, nccl_type(dtype), nccl_op(o.op), o.root, comm_, stream_),
               "ncclReduce");
    return work("reduce", o);
  }
  std::unique_ptr<Work> all_gather(void* recv, const void* send, size_t count, DType dtype,
                                   const AllGatherOptions& o) override {
    check_nccl(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, stream_), "ncclAllGather");
    return work("all_gather", o);
  }
  std::unique_ptr<Work> reduce_scatter(void* recv, const void* send, size_t count, DType dtype,
                                       const ReduceScatterOptions& o) override {
    check_dtype("reduce_scatter", dtype, o.in_dtype);
    check_nccl(ncclReduceScatter(send, recv, count, nccl_type(dtype), nccl_op(o.op), comm_, stream_),
               "ncclReduceScatter");
    return work("reduce_scatter", o);
  }
  std::unique_ptr<Work> send(const void* buf, size_t count, DType dtype, int dst, const SendOptions& o) override {
    MT_CHECK(o.msg_tag == 0, ErrorKind::kNotSupported, "nccl send: message tags are not supported (NCCL orders by call)");
    check_nccl(ncclSend(buf, count, nccl_type(dtype), dst, comm_, stream_), "ncclSend");
    return work("send", o);
  }
  std::unique_ptr<Work> recv(void* buf, size_t count, DType dtype, int src, const RecvOptions& o) override {
    MT_CHECK(o.msg_tag == 0, ErrorKind::kNotSupported, "nccl recv: message tags are not supported (NCCL orders by call)");
    check_nccl(ncclRecv(buf, count, nccl_type(dtype), src, comm_, stream_), "ncclRecv");
    return work("recv", o);
  }
  std::unique_ptr<Work> barrier(const BarrierOptions& o) override {
    if (!token_) check_cuda(cudaMalloc(&token_, sizeof(float)), "cudaMalloc (barrier token)");
    check_nccl(ncclAllReduce(token_, token_, 1, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce (barrier)");
    auto w = work("barrier", o);
    w->wait();  // a barrier returns once every rank arrived
    return w;
  }
  std::shared_ptr<Backend> split(int color, int key) override {
    ncclComm_t sub = nullptr;
    check_nccl(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, nullptr), "ncclCommSplit");
    if (sub == nullptr) return nullptr;
    int r = 0, n = 0;
    check_nccl(ncclCommUserRank(sub, &r), "ncclCommUserRank");
    check_nccl(ncclCommCount(sub, &n), "ncclCommCount");
    return std::make_shared<NcclBackend>(sub, stream_, r, n);
  }

 private:
  void check_dtype(const char* what, DType dtype, bool in_dtype) const {
    MT_CHECK(dtype == DType::kF32 || in_dtype, ErrorKind::kNotSupported,
             std::string("nccl ") + what + ": " + dtype_name(dtype) +
                 " is reduced in " + dtype_name(dtype) + " by NCCL (ask for in_dtype), not widened to f32");
  }
  std::unique_ptr<Work> work(const char* what, const CommOptions& o) {
    std::string w = std::string(what) + " #" + std::to_string(seq_++) + (o.tag.empty() ? "" : " [tag " + o.tag + "]");
    return std::make_unique<NcclWork>(comm_, stream_, w, rank_, size_, o.timeout);
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_, size_;
  uint64_t seq_ = 0;
  float* token_ = nullptr;
};

}  // namespace

std::shared_ptr<Backend> make_nccl_backend(Backend& bootstrap, int device, void* stream) {
  count_continues();
  check_cuda(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (bootstrap.rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  static_assert(sizeof(ncclUniqueId) % sizeof(float) == 0);
  BroadcastOptions bo;
  bo.tag = "nccl unique id";
  bootstrap.broadcast(&id, sizeof id / sizeof(float), DType::kF32, bo)->wait();  // bytes, copied as they are
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()),
             "ncclCommInitRank (rank " + std::to_string(bootstrap.rank()) + " of " + std::to_string(bootstrap.size()) +
                 ", CUDA device " + std::to_string(device) + ")");
  return std::make_shared<NcclBackend>(comm, static_cast<cudaStream_t>(stream), bootstrap.rank(), bootstrap.size());
}

std::string nccl_version() {
  int v = 0;
  check_nccl(ncclGetVersion(&v), "ncclGetVersion");
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

}  // namespace mt::comm
