// GEMM on the GPU through cuBLASLt, in the row-major convention of kernels/cpu/gemm.h:
//   D (M, N) = op(A) (M, K) · op(B) (K, N)  [+ bias (N) broadcast over rows]  [+ Cin or D itself]
// op(X) = X, or X^T when the trans flag is set (X then stored (K, M) / (N, K)). Leading dimensions
// are in elements. A and B share one type (f32 or bf16); D is f32 or bf16; accumulation is f32
// (pure f32 for f32 operands: no TF32, so the f32 path is the exact reference).
// accumulate: D += product (beta 1). cin (same type and ld as D): D = cin + product (the residual
// add fused into the GEMM). bias is f32, or bf16 with a bf16 D (cuBLASLt's bf16-output kernels
// with an f32 bias ran at 40% of the bf16-bias speed on an H200).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tensor/dtype.h"

namespace mt::cuda {

// Epilogues cuBLASLt fuses into the product (tanh GELU, as GPT-2's; the tests check it):
//   kGelu:  aux = A·B (+ bias), D = gelu(aux): the MLP's up-projection saves its pre-activation.
//   kDGelu: D = (A·B) * gelu'(aux); bgrad (f32, N), when set, = the column sums of D (overwritten).
// Where cuBLASLt has no algorithm the same results come from the product and the kernels of ops.h.
enum class Epilogue : uint8_t { kNone, kGelu, kDGelu };

struct GemmOp {
  int M = 0, N = 0, K = 0;
  const void* a = nullptr;
  int lda = 0;
  bool trans_a = false;
  const void* b = nullptr;
  int ldb = 0;
  bool trans_b = false;
  void* d = nullptr;
  int ldd = 0;
  DType ab_type = DType::kBF16;
  DType d_type = DType::kF32;
  bool accumulate = false;
  const float* bias = nullptr;
  const void* cin = nullptr;
  DType bias_type = DType::kF32;  // bf16 allowed with a bf16 D (the bias pointer then holds bf16)
  Epilogue epilogue = Epilogue::kNone;
  void* aux = nullptr;  // kGelu: written, kDGelu: read; D's type and shape
  int ldaux = 0;
  float* bgrad = nullptr;  // kDGelu
};

// Tests: false forces the unfused path (product, then the kernels) for the GELU epilogues.
void set_gemm_fused_epilogues(bool fused);

void gemm(const GemmOp& op);

// Times a few variants of one GEMM shape (epilogues, output types, transposes) for the benchmark's
// breakdown: (variant, TFLOP/s).
std::vector<std::pair<std::string, double>> gemm_probe(int M, int N, int K);

// Shorthand with the CPU gemm's argument order.
inline void gemm(int M, int N, int K, const void* a, int lda, bool ta, const void* b, int ldb, bool tb,
                 void* d, int ldd, DType ab_type, DType d_type, bool accumulate,
                 const float* bias = nullptr, const void* cin = nullptr, DType bias_type = DType::kF32) {
  GemmOp op;
  op.M = M; op.N = N; op.K = K;
  op.a = a; op.lda = lda; op.trans_a = ta;
  op.b = b; op.ldb = ldb; op.trans_b = tb;
  op.d = d; op.ldd = ldd;
  op.ab_type = ab_type; op.d_type = d_type;
  op.accumulate = accumulate; op.bias = bias; op.cin = cin; op.bias_type = bias_type;
  gemm(op);
}

}  // namespace mt::cuda
