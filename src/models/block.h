// One transformer block, GPT-2 or LLaMA flavoured, with forward and backward side by side.
//   GPT-2: x2 = x + c_proj(attn(c_attn(LN1(x))));        y = x2 + mlp.c_proj(gelu(c_fc(LN2(x2))))
//   LLaMA: x2 = x + o_proj(attn(rope(qkv(RMS1(x)))));    y = x2 + down(silu(gate(h)) * up(h)), h = RMS2(x2)
// Saved activations live in a BlockActs (one per block, or one shared by all blocks when the model
// recomputes); scratch lives in BlockScratch, shared by all blocks.
#pragma once

#include <cstdint>

#include "models/config.h"
#include "nn/linear.h"
#include "nn/norm.h"
#include "nn/workspace.h"
#include "parallel/tp/mappings.h"

namespace mt::models {

// Widths: C hidden, QKV = (NH + 2 NKV) HS, A = NH HS, H = MLP pre-activation (4C | 2I),
// G = MLP activation output (4C | I). N = B T rows. "cd" = compute dtype.
// Under tensor parallelism (tp ranks) every width but C is this rank's: NH/tp heads, NKV/tp kv
// heads, I/tp MLP features (Megatron's split: column-parallel q/k/v and MLP-in, row-parallel
// attention-out and MLP-out).
struct BlockDims {
  int B, T, N, C, QKV, A, H, G, NH, NKV, HS;
};

struct BlockActs {            // saved for backward
  float* mean1;               // (N)       LayerNorm only
  float* rstd1;               // (N)
  void* n1c;                  // (N, C)    cd: norm1 output, input of the qkv GEMM
  float* qkv;                 // (N, QKV)  f32, after RoPE
  float* att;                 // (N, A)    f32 attention output
  float* lse;                 // (B, NH, T)
  void* attc;                 // (N, A)    cd copy of att (== att for f32)
  float* x2;                  // (N, C)    residual after attention
  float* mean2;               // (N)
  float* rstd2;               // (N)
  void* n2c;                  // (N, C)    cd: norm2 output
  float* h;                   // (N, H)    f32 MLP pre-activation
  void* actc;                 // (N, G)    cd: MLP activation output
  // Lays the buffers out from base (nullptr: only counts). Returns the bytes needed.
  static size_t layout(BlockActs* acts, char* base, const BlockDims& d, DType cd, bool layernorm);
};

struct BlockScratch {         // shared by every block, forward and backward
  float* f;                   // (N, max(C, A, G)) f32 forward scratch
  float* dact;                // (N, G)
  float* dh;                  // (N, H)
  float* dqkv;                // (N, QKV)
  float* datt;                // (N, A)
  float* dn;                  // (N, C)
  static size_t layout(BlockScratch* s, char* base, const BlockDims& d);
};

class Block : public nn::Module {
 public:
  // tp: the tensor-parallel group's mappings (a group of one: the whole layer on this rank).
  Block(const ModelConfig& cfg, int index, parallel::TpComm& tp);

  // y (N, C) = block(x). Fills acts. rope_cos/sin: (T, HS/2) (LLaMA only).
  void forward(float* y, const float* x, BlockActs& acts, BlockScratch& s, const BlockDims& d,
               const float* rope_cos, const float* rope_sin, nn::Workspace& ws);
  // dres (N, C): in: dL/dy; out: dL/dx (updated in place). Parameter grads +=.
  void backward(float* dres, const float* x, const BlockActs& acts, BlockScratch& s,
                const BlockDims& d, const float* rope_cos, const float* rope_sin, nn::Workspace& ws);

 private:
  void reduce_from(const nn::Linear& layer, float* y, int N, int C);
  Arch arch_;
  float eps_;
  parallel::TpComm& tp_;
  // GPT-2
  nn::LayerNorm* ln_1_ = nullptr;
  nn::LayerNorm* ln_2_ = nullptr;
  nn::Linear* c_attn_ = nullptr;
  nn::Linear* attn_proj_ = nullptr;
  nn::Linear* c_fc_ = nullptr;
  nn::Linear* mlp_proj_ = nullptr;
  // LLaMA
  nn::RMSNorm* rms_1_ = nullptr;
  nn::RMSNorm* rms_2_ = nullptr;
  nn::LinearGroup qkv_, gate_up_;
  nn::Linear* o_proj_ = nullptr;
  nn::Linear* down_proj_ = nullptr;
};

}  // namespace mt::models
