#include "kernels/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/ops.h"

#define MT_LT_CHECK(expr)                                                                          \
  do {                                                                                             \
    cublasStatus_t mt_s_ = (expr);                                                                 \
    if (mt_s_ != CUBLAS_STATUS_SUCCESS)                                                            \
      throw ::mt::Error(::mt::ErrorKind::kInternal, std::string(#expr) + " failed: status " +      \
                                                        std::to_string(static_cast<int>(mt_s_)));  \
  } while (0)

namespace mt::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

constexpr size_t kWorkspaceBytes = size_t{64} << 20;  // cuBLASLt's recommendation for Hopper: 32+ MiB

struct Lt {
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace;
  std::mutex mu;
  // (shape, layout, types, epilogue, beta) -> the heuristic's first algorithm, or none.
  using Key = std::tuple<int, int, int, int, int, int, bool, bool, int, int, int, bool, int>;
  std::map<Key, std::pair<bool, cublasLtMatmulAlgo_t>> algos;
  Lt() {
    MT_LT_CHECK(cublasLtCreate(&handle));
    workspace = DeviceBuffer(kWorkspaceBytes, MemCategory::kWorkspace);
  }
};

Lt& lt() {
  static Lt instance;
  return instance;
}

// One matmul: the descriptors are cheap to build; the heuristic is cached per key.
// Returns false when cuBLASLt has no algorithm for this combination (the caller falls back).
bool g_fused_epilogues = true;

bool lt_matmul(const GemmOp& op, bool with_bias) {
  Lt& L = lt();
  // Column-major view: D^T (N, M) = op(B)^T · op(A)^T.
  const int m = op.N, n = op.M, k = op.K;
  cublasOperation_t opa = op.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // first operand: B
  cublasOperation_t opb = op.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // second operand: A
  cudaDataType_t ab = cuda_type(op.ab_type), dt = cuda_type(op.d_type);
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  const bool beta_one = op.accumulate || op.cin != nullptr;
  const float alpha = 1.0f, beta = beta_one ? 1.0f : 0.0f;

  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr, ld = nullptr;
  MT_LT_CHECK(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
  MT_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  MT_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  // with_bias: the fused epilogue (bias, GELU with its aux, dGELU with its bias gradient).
  const bool gelu = with_bias && op.epilogue == Epilogue::kGelu, dgelu = with_bias && op.epilogue == Epilogue::kDGelu;
  if (with_bias) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    if (gelu) epi = op.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    if (dgelu) epi = op.bgrad ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    MT_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    const void* bias = dgelu ? static_cast<const void*>(op.bgrad) : static_cast<const void*>(op.bias);
    if (bias != nullptr) {
      MT_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
      cudaDataType_t bt = dgelu ? CUDA_R_32F : cuda_type(op.bias_type);
      MT_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    if (gelu || dgelu) {
      MT_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &op.aux, sizeof op.aux));
      int64_t ldaux = op.ldaux;
      MT_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldaux, sizeof ldaux));
      cudaDataType_t at = dt;
      MT_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &at, sizeof at));
    }
  }
  // Stored shapes (column-major): first operand B^T-view is (m, k) for N, (k, m) for T.
  MT_LT_CHECK(cublasLtMatrixLayoutCreate(&la, ab, opa == CUBLAS_OP_N ? m : k, opa == CUBLAS_OP_N ? k : m, op.ldb));
  MT_LT_CHECK(cublasLtMatrixLayoutCreate(&lb, ab, opb == CUBLAS_OP_N ? k : n, opb == CUBLAS_OP_N ? n : k, op.lda));
  MT_LT_CHECK(cublasLtMatrixLayoutCreate(&lc, dt, m, n, op.ldd));
  MT_LT_CHECK(cublasLtMatrixLayoutCreate(&ld, dt, m, n, op.ldd));

  auto align = [](const void* p) { return static_cast<int>(reinterpret_cast<uintptr_t>(p) % 256); };
  Lt::Key key{m, n, k, op.lda, op.ldb, op.ldd, op.trans_a, op.trans_b, static_cast<int>(ab) * 100 + static_cast<int>(dt),
              with_bias ? 1 + static_cast<int>(op.bias_type) + 10 * static_cast<int>(op.epilogue) + 100 * (op.bias != nullptr) +
                              1000 * (op.bgrad != nullptr)
                        : 0,
              (align(op.a) % 16) * 1000 + (align(op.b) % 16) * 10 + align(op.d) % 16, beta_one,
              with_bias && op.aux ? op.ldaux * 16 + align(op.aux) % 16 : 0};
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
  {
    std::lock_guard<std::mutex> lock(L.mu);
    auto it = L.algos.find(key);
    if (it != L.algos.end()) {
      found = it->second.first;
      algo = it->second.second;
    } else {
      cublasLtMatmulPreference_t pref = nullptr;
      MT_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      size_t ws = kWorkspaceBytes;
      MT_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
      cublasLtMatmulHeuristicResult_t res{};
      int count = 0;
      cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(L.handle, desc, la, lb, lc, ld, pref, 1, &res, &count);
      cublasLtMatmulPreferenceDestroy(pref);
      found = st == CUBLAS_STATUS_SUCCESS && count > 0;
      if (found) algo = res.algo;
      L.algos[key] = {found, algo};
    }
  }
  if (found) {
    const void* c = op.cin ? op.cin : op.d;
    MT_LT_CHECK(cublasLtMatmul(L.handle, desc, &alpha, op.b, la, op.a, lb, &beta, c, lc, op.d, ld, &algo,
                               L.workspace.data(), kWorkspaceBytes, static_cast<cudaStream_t>(stream())));
  }
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  return found;
}

}  // namespace

void gemm(const GemmOp& op) {
  MT_CHECK(op.M > 0 && op.N > 0 && op.K > 0, ErrorKind::kInvalidArgument, "cuda gemm: empty shape");
  MT_CHECK(!(op.accumulate && op.cin), ErrorKind::kInvalidArgument, "cuda gemm: accumulate and cin together");
  if (op.epilogue != Epilogue::kNone) {
    MT_CHECK(!op.accumulate && !op.cin && op.aux != nullptr, ErrorKind::kInvalidArgument,
             "cuda gemm: a GELU epilogue needs aux, and neither accumulate nor cin");
    MT_CHECK(op.epilogue == Epilogue::kGelu || op.bias == nullptr, ErrorKind::kInvalidArgument,
             "cuda gemm: dGELU takes no bias (its bias gradient goes to bgrad)");
    if (g_fused_epilogues && lt_matmul(op, true)) return;
    // The same results from the product and the kernels (rows of N elements: ld == N).
    MT_CHECK(op.ldd == op.N && op.ldaux == op.N, ErrorKind::kNotSupported,
             "cuda gemm: the unfused GELU epilogue needs dense rows (ld == N)");
    const size_t n = static_cast<size_t>(op.M) * op.N;
    GemmOp p = op;
    p.epilogue = Epilogue::kNone;
    p.bgrad = nullptr;
    p.aux = nullptr;
    if (op.epilogue == Epilogue::kGelu) {
      p.d = op.aux;  // the pre-activation (with the bias)
      gemm(p);
      gelu_forward(op.d, op.aux, op.d_type, n);
    } else {
      gemm(p);  // the product into D, then D *= gelu'(aux) in place
      gelu_backward(op.d, op.aux, op.d, op.d_type, n);
      if (op.bgrad) {
        fill_zero(op.bgrad, static_cast<size_t>(op.N) * sizeof(float));
        bias_backward(op.bgrad, op.d, op.d_type, op.M, op.N);
      }
    }
    return;
  }
  if (op.bias && lt_matmul(op, true)) return;
  // No fused-bias algorithm for this combination: the product, then the bias as its own pass.
  if (!lt_matmul(op, false))
    throw Error(ErrorKind::kNotSupported, "cuBLASLt has no algorithm for a " + std::to_string(op.M) + "x" +
                                              std::to_string(op.N) + "x" + std::to_string(op.K) + " " +
                                              dtype_name(op.ab_type) + " GEMM into " + dtype_name(op.d_type));
  if (op.bias) {
    const float* bias = op.bias;
    if (op.bias_type != DType::kF32) {  // add_bias takes f32
      float* f = static_cast<float*>(scratch(static_cast<size_t>(op.N) * sizeof(float)));
      cuda::convert(f, DType::kF32, op.bias, op.bias_type, static_cast<size_t>(op.N));
      bias = f;
    }
    add_bias(op.d, op.d_type, bias, op.M, op.N, op.ldd);
  }
}

void set_gemm_fused_epilogues(bool fused) { g_fused_epilogues = fused; }

std::vector<std::pair<std::string, double>> gemm_probe(int M, int N, int K) {
  std::vector<std::pair<std::string, double>> out;
  size_t big = static_cast<size_t>(std::max({M, N, K})) * std::max({M, N, K});
  DeviceBuffer a(big * 2, MemCategory::kWorkspace), b(big * 2, MemCategory::kWorkspace),
      d(static_cast<size_t>(M) * N * 4, MemCategory::kWorkspace), bias(static_cast<size_t>(N) * 4, MemCategory::kWorkspace);
  fill_random_bf16(a.data(), big, 3);
  fill_random_bf16(b.data(), big, 4);
  auto s = static_cast<cudaStream_t>(stream());
  cudaEvent_t e0, e1;
  MT_CUDA_CHECK(cudaEventCreate(&e0));
  MT_CUDA_CHECK(cudaEventCreate(&e1));
  auto run = [&](const std::string& name, GemmOp op) {
    op.M = M; op.N = N; op.K = K; op.a = a.data(); op.b = b.data(); op.d = d.data(); op.ldd = N;
    op.lda = op.trans_a ? M : K;
    op.ldb = op.trans_b ? K : N;
    for (int i = 0; i < 3; ++i) gemm(op);
    MT_CUDA_CHECK(cudaEventRecord(e0, s));
    for (int i = 0; i < 20; ++i) gemm(op);
    MT_CUDA_CHECK(cudaEventRecord(e1, s));
    MT_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    out.emplace_back(name, 2.0 * M * N * static_cast<double>(K) / (ms / 20 * 1e-3) / 1e12);
  };
  struct Variant {
    DType out, bias;  // bias kF16 here: none
  };
  const Variant variants[] = {{DType::kBF16, DType::kF16}, {DType::kBF16, DType::kF32}, {DType::kBF16, DType::kBF16},
                              {DType::kF32, DType::kF16},  {DType::kF32, DType::kF32}};
  for (bool tb : {false, true})
    for (const Variant& v : variants) {
      GemmOp op;
      op.trans_b = tb;
      op.ab_type = DType::kBF16;
      op.d_type = v.out;
      op.bias = v.bias == DType::kF16 ? nullptr : bias.as<float>();
      op.bias_type = v.bias == DType::kF16 ? DType::kF32 : v.bias;
      run(std::string(tb ? "NT " : "NN ") + dtype_name(v.out) + " out" +
              (op.bias ? std::string(" + ") + dtype_name(v.bias) + " bias" : std::string()),
          op);
    }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return out;
}

Ceilings measure_ceilings() {
  Ceilings c;
  const int n = 8192;
  DeviceBuffer a(size_t{n} * n * 2, MemCategory::kWorkspace), b(size_t{n} * n * 2, MemCategory::kWorkspace),
      d(size_t{n} * n * 2, MemCategory::kWorkspace);
  fill_random_bf16(a.data(), size_t{n} * n, 1);
  fill_random_bf16(b.data(), size_t{n} * n, 2);
  auto s = static_cast<cudaStream_t>(stream());
  cudaEvent_t e0, e1;
  MT_CUDA_CHECK(cudaEventCreate(&e0));
  MT_CUDA_CHECK(cudaEventCreate(&e1));
  auto time_ms = [&](auto&& fn, int reps) {
    for (int i = 0; i < 3; ++i) fn();
    MT_CUDA_CHECK(cudaEventRecord(e0, s));
    for (int i = 0; i < reps; ++i) fn();
    MT_CUDA_CHECK(cudaEventRecord(e1, s));
    MT_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return static_cast<double>(ms) / reps;
  };
  double ms = time_ms([&] { gemm(n, n, n, a.data(), n, false, b.data(), n, false, d.data(), n, DType::kBF16, DType::kBF16, false); }, 20);
  c.bf16_gemm_tflops = 2.0 * n * n * static_cast<double>(n) / (ms * 1e-3) / 1e12;
  size_t bytes = size_t{n} * n * 2;
  ms = time_ms([&] { copy_on_device(d.data(), a.data(), bytes); }, 20);
  c.copy_gbps = 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return c;
}

}  // namespace mt::cuda
