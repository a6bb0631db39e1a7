// The NCCL backend on device buffers. A one-GPU machine runs one rank (NCCL refuses two ranks on
// one GPU): these tests check the bootstrap, every implemented collective's plumbing and result at
// one rank (the identity, or the op over one contribution), Work completion, split, and the
// refusals; several ranks need a machine with several GPUs (scripts/gpu-check.sh notes it).
#include "comm/nccl/nccl_backend.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "comm/local_backend.h"

namespace mt::comm {
namespace {

// Plain CUDA runtime calls: comm/ sits beside kernels/ in the layering, not above it.
bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct DeviceVec {
  float* ptr = nullptr;
  size_t n;
  explicit DeviceVec(const std::vector<float>& v) : n(v.size()) {
    EXPECT_EQ(cudaMalloc(&ptr, v.size() * 4), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, v.data(), v.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceVec() { cudaFree(ptr); }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  float* p() const { return ptr; }
  std::vector<float> get() const {
    std::vector<float> v(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), ptr, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    world_ = make_local_world(1);
    nccl_ = make_nccl_backend(*world_[0], 0, stream_);
  }
  void TearDown() override {
    nccl_.reset();
    if (stream_) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
  std::vector<std::shared_ptr<Backend>> world_;
  std::shared_ptr<Backend> nccl_;
};

TEST_F(Nccl, OneRankCollectivesOnDeviceBuffers) {
  EXPECT_EQ(nccl_->name(), "nccl");
  EXPECT_EQ(nccl_->size(), 1);
  EXPECT_EQ(nccl_->rank(), 0);
  EXPECT_FALSE(nccl_version().empty());
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * static_cast<float>(i) - 3.0f;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    DeviceVec d(v);
    AllReduceOptions o;
    o.op = op;
    auto w = nccl_->all_reduce(d.p(), d.n, DType::kF32, o);
    w->wait();
    EXPECT_TRUE(w->is_completed());
    EXPECT_EQ(d.get(), v) << reduce_op_name(op);
  }
  DeviceVec b(v);
  nccl_->broadcast(b.p(), b.n, DType::kF32, {})->wait();
  EXPECT_EQ(b.get(), v);
  DeviceVec g(std::vector<float>(v.size(), -1.0f)), src(v);
  nccl_->all_gather(g.p(), src.p(), v.size(), DType::kF32, {})->wait();
  EXPECT_EQ(g.get(), v);
  DeviceVec rs(std::vector<float>(v.size(), -1.0f));
  nccl_->reduce_scatter(rs.p(), src.p(), v.size(), DType::kF32, {})->wait();
  EXPECT_EQ(rs.get(), v);
  nccl_->barrier({})->wait();
  // bf16 is reduced in bf16 (in_dtype); asked to widen to f32, NCCL cannot: refused by name.
  AllReduceOptions wide;
  try {
    nccl_->all_reduce(b.p(), 8, DType::kBF16, wide);
    ADD_FAILURE() << "bf16 without in_dtype accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in_dtype"), std::string::npos) << e.what();
  }
  AllReduceOptions in16;
  in16.in_dtype = true;
  nccl_->all_reduce(b.p(), 8, DType::kBF16, in16)->wait();
  auto sub = nccl_->split(0, 0);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(nccl_->split(-1, 0), nullptr);
}

}  // namespace
}  // namespace mt::comm
