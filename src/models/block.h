// One transformer block, GPT-2 or LLaMA flavoured, with forward and backward side by side.
//   GPT-2: x2 = x + c_proj(attn(c_attn(LN1(x))));        y = x2 + mlp.c_proj(gelu(c_fc(LN2(x2))))
//   LLaMA: x2 = x + o_proj(attn(rope(qkv(RMS1(x)))));    y = x2 + down(silu(gate(h)) * up(h)), h = RMS2(x2)
// Saved activations live in a BlockActs (one per block, or one shared by all blocks when the model
// recomputes); scratch lives in BlockScratch, shared by all blocks.
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/sparse_attention.h"
#include "models/config.h"
#include "models/module_profile.h"
#include "nn/linear.h"
#include "nn/norm.h"
#include "nn/workspace.h"
#include "parallel/sp/ulysses.h"
#include "parallel/tp/mappings.h"

namespace mt::models {

// Dropout in a training forward (ModelConfig's embd_pdrop, resid_pdrop, attn_pdrop; the masks of
// kernels/cpu/dropout.h): where this rank's rows and heads sit in the one-process run.
struct BlockDropout {
  uint64_t step_key = 0;  // kernels::drop_step_key(seed, optimizer step)
  uint64_t sample0 = 0;   // the micro-batch's first sample in the step's global batch
  kernels::DropRate embd, resid, attn;
  size_t row0 = 0;        // this rank's first row of the micro-batch (sequence parallelism: tp_rank·Nl)
  size_t t0 = 0;          // this rank's first position of each sample (Ulysses: sp_rank·T/sp)
  int head0 = 0;          // this rank's first attention head (tp_rank·NH/tp; Ulysses: sp_rank·NH/sp)
};

// Widths: C hidden, QKV = (NH + 2 NKV) HS, A = NH HS, H = MLP pre-activation (4C | 2I),
// G = MLP activation output (4C | I). N = B T rows. "cd" = compute dtype.
// Under tensor parallelism (tp ranks) every width but C is this rank's: NH/tp heads, NKV/tp kv
// heads, I/tp MLP features (Megatron's split: column-parallel q/k/v and MLP-in, row-parallel
// attention-out and MLP-out).
struct BlockDims {
  int B, T, N, C, QKV, A, H, G, NH, NKV, HS;
  // Sequence parallelism (Megatron's, within the tp group): the residual stream, the norms and the
  // residual adds hold this rank's Nl = N / tp rows (rows tp_rank·Nl ...); the GEMMs and attention
  // see all N rows, gathered before the column-parallel layers and reduce-scattered after the
  // row-parallel ones.
  bool sp = false;
  int Nl = 0;
  // DeepSpeed's sparse attention: the block-sparse plan of this rank's heads (null: dense causal).
  const kernels::SparseAttentionPlan* sparse = nullptr;
  // Dropout of this micro-batch's training forward (and its backward); null: none.
  const BlockDropout* drop = nullptr;
  // Documents packed into a sample (Megatron's reset_position_ids / reset_attention_mask), each
  // (N) over the micro-batch's whole rows; null: none. pos: each token's position (RoPE);
  // kstart: the first key position each query sees (attention).
  const int32_t* pos = nullptr;
  const int32_t* kstart = nullptr;
  // DeepSpeed-Ulysses (parallel.sp = usp > 1, parallel/sp/ulysses.h): T is this rank's share of
  // each sequence (usp T tokens in all), pos their global positions; attention runs on all usp T
  // tokens for NH/usp heads (NKV/usp kv heads), between an all-to-all and its inverse. Null: none.
  int usp = 1;
  parallel::UlyssesComm* ulysses = nullptr;
  int rows() const { return sp ? Nl : N; }  // rows of the residual stream on this rank
};

struct BlockActs {            // saved for backward
  float* mean1;               // (rows)    LayerNorm only
  float* rstd1;               // (rows)
  // The norms' outputs, the column-parallel GEMMs' inputs: (rows, C), this rank's rows under
  // sequence parallelism, gathered again for the weight gradients' GEMMs in backward (Megatron
  // keeps them sharded: its activation memory's 34/t); (N, C) without it.
  void* n1c;                  // (rows, C) cd: norm1 output, input of the qkv GEMM
  // In low precision the GEMMs' f32 outputs that the block saves (q, k, v and the MLP's
  // pre-activation) are rounded to the compute dtype first and the forward goes on with the
  // rounded values, so the backward sees what the forward used; that is what PyTorch's autocast
  // and Megatron keep (a bf16 GEMM's output). DESIGN-NOTES 69.
  void* qkv;                  // (N, QKV)  cd, after RoPE
  // Attention's output stays f32: its backward's row sums D = rowsum(dO * O) must be the forward's
  // own (a rounded O leaves each score row's gradient a residue that does not sum to zero, and
  // GPT-2's key bias, whose gradient is exactly zero, a gradient). The output projection's input
  // (its compute-dtype copy) is made from it in the forward and again in the backward.
  float* att;                 // (N, A)    f32
  float* lse;                 // (B, NH, T)
  float* x2;                  // (rows, C) residual after attention
  float* mean2;               // (rows)
  float* rstd2;               // (rows)
  void* n2c;                  // (rows, C) cd: norm2 output
  void* h;                    // (N, H)    cd: MLP pre-activation
  void* actc;                 // (N, G)    cd: MLP activation output
  // Lays the buffers out from base (nullptr: only counts). Returns the bytes needed.
  static size_t layout(BlockActs* acts, char* base, const BlockDims& d, DType cd, bool layernorm);
};

struct BlockScratch {         // shared by every block, forward and backward
  float* f;                   // (N, max(C, A, G)) f32 forward scratch; under sequence parallelism
                              // also a gathered norm output in the compute dtype (a GEMM's input).
                              // In low precision (N, max(C, A, G, QKV)): the backward's f32
                              // copy of the saved q, k, v
  float* dact;                // (N, G)
  float* dh;                  // (N, H); the forward's f32 pre-activation in low precision
  float* dqkv;                // (N, QKV); in low precision the forward's f32 q, k, v, then (both
                              // passes) the attention output's compute-dtype copy
  float* datt;                // (N, A)
  float* dn;                  // (N, C)
  float* full;                // (N, C)    sequence parallel: rows gathered from the group
  float* part;                // (Nl, C)   sequence parallel: this rank's rows of a reduce-scatter
  float* a2a;                 // (N, max(QKV, A)) Ulysses: q, k, v or the attention output (or
                              // their gradients) in the other layout of the all-to-all
  static size_t layout(BlockScratch* s, char* base, const BlockDims& d, DType cd);
};

class Block : public nn::Module {
 public:
  // tp: the tensor-parallel group's mappings (a group of one: the whole layer on this rank).
  Block(const ModelConfig& cfg, int index, parallel::TpComm& tp);

  // y (N, C) = block(x). Fills acts. rope_cos/sin: (T, HS/2) (LLaMA only).
  void forward(float* y, const float* x, BlockActs& acts, BlockScratch& s, const BlockDims& d,
               const float* rope_cos, const float* rope_sin, nn::Workspace& ws);
  // x, y: (rows, C). dres (rows, C): in: dL/dy; out: dL/dx (updated in place). Parameter grads +=.
  void backward(float* dres, const float* x, const BlockActs& acts, BlockScratch& s,
                const BlockDims& d, const float* rope_cos, const float* rope_sin, nn::Workspace& ws);

  // The flops profiler: adds this block's modules under node `parent` of p (this rank's parameters
  // and forward FLOPs for shape d) and times them into p from now on. p null: off.
  void profile_attach(ModuleProfile* p, int parent, const BlockDims& d);

 private:
  struct ProfileIds {  // node ids of this block's parts in prof_
    int block, norm1, attn, qkv, core, proj, norm2, mlp, up, act, down;
  };
  // After a row-parallel layer: y (N, C) partial -> the sum over the tp group plus the bias, in
  // out (rows, C) (== y without sequence parallelism: all-reduce in place; with it: reduce-scatter).
  float* reduce_from(const nn::Linear& layer, float* y, BlockScratch& s, const BlockDims& d);
  // Before a column-parallel layer's backward: the gradient of the whole N rows (dres itself, or
  // gathered from the group).
  const float* full_grad(const float* dres, BlockScratch& s, const BlockDims& d);
  // After a column-parallel layer's backward: dn (N, C) partial -> this rank's rows of the sum.
  const float* reduce_to_rows(float* dn, BlockScratch& s, const BlockDims& d);
  // Residual dropout (resid_pdrop) of site kernels::kDropAttnOut or kDropMlpOut on x (rows, C).
  void drop_residual(float* x, uint32_t site, const BlockDims& d) const;
  // The attention core's dropout (attn_pdrop) for this layer; its rate inactive without.
  kernels::AttnDropout attention_dropout(const BlockDims& d) const;
  Arch arch_;
  int layer_;
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
  nn::Module* attn_ = nullptr;  // the attention and MLP containers
  nn::Module* mlp_ = nullptr;
  ModuleProfile* prof_ = nullptr;
  ProfileIds pid_{};
};

// Runs a norm's backward; with sequence parallelism its weight gradients cover this rank's rows
// only: they are accumulated apart, summed over the tp group and added (Megatron all-reduces the
// gradients of sequence-parallel parameters). `norm`'s parameters' grad pointers are swapped for
// the duration.
void norm_backward_sp(nn::Module& norm, parallel::TpComm& tp, bool sp, const std::function<void()>& run);

}  // namespace mt::models
