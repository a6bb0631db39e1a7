// The cost model (issue 14): a ZeRO step's instruction times from the machine's calibration and
// the model's own shapes. Per unit, one micro-batch of N = B·T rows (BlockDims' letters):
//   GEMMs        every projection at the calibrated GEMM line of the compute dtype, by its shape
//                (QKV N×C×QKV, output N×A×C; GPT-2's MLP N×C×G and N×G×C, LLaMA's gate and up
//                N×C×2G and down N×G×C; the head N×C×V); the backward's two GEMMs of each shape
//                (input and weight gradients) at the "gemm backward" line (absent: 2× forward)
//   attention    the core's FLOPs (models::attention_core_flops) at the "attention forward" and
//                "attention backward" lines (absent: the f32 GEMM rate, the backward twice); with
//                documents the share of the causal tiles they leave, with sparse_attention its
//                layout's pairs at the sparse kernel's lines (StepShape::attention_share, sparse)
//   elementwise  the blocks' own kernels at their calibrated lines by elements (the two norms,
//                the two residual adds, GELU or SwiGLU, forward and backward), and the bytes of
//                RoPE, the compute-dtype copies (and in low precision the saved q, k, v and
//                pre-activation rounded, then copied back to f32 in the backward, and the
//                attention output's copy made again there) and the loss at the memory rate (a calibration
//                without those families: every byte at the memory rate, the backward twice)
//   dropout      (a model with embd_pdrop, resid_pdrop or attn_pdrop) the masks at the calibrated
//                "dropout" line by elements: each residual branch's rows forward and again on their
//                gradient (and its copy) backward, the causal half of each head's T x T probabilities
//                once forward and twice backward, the embeddings' sum both ways
//   in situ      a block's forward and backward scaled by the calibration's in-situ factors
//                (a real block of the architecture and dtype timed against this sum; 1 if absent)
//   optimizer    the calibrated update of the run's optimizer by elements of this rank's shard
//                (StepShape::update: AdamW's kernel, LAMB's two passes, SGD with or without its
//                momentum; the variant writing the bf16 copy in low precision at stage 0; a
//                calibration without the optimizer's line: AdamW's), with the gradient norm's read
//                and zero_grad's write of the shard at the memory rate
//   collectives  the calibrated all_gather / reduce_scatter lines by bytes a rank (one rank: a
//                local copy at the memory rate)
// The head's backward (its own hooks) is the head GEMM's two backward GEMMs and the loss's bytes.
// Recompute (models' activation checkpointing, per block) adds a block's forward to its backward,
// and under tensor parallelism the forward's tp collectives before the backward's own.
// Offload of the optimizer to NVMe: the update of a shard of n elements goes through k = n /
// sub_group_size sub-groups of g elements, each read (its two moments, 8 g bytes), updated and
// written back, the next one's read beside this one's update and the previous one's write: the
// first read, update and write, then k - 1 steps of the slower of the update and the disk's 16 g
// bytes at its mixed read-and-write rate (the calibration's disk, `calibrate --io DIR`).
// Tensor parallelism (tp > 1): each unit's pass also makes the tp group's blocking collectives
// (ZeroStepCosts::tp_forward/tp_backward), as models/block.cpp and transformer.cpp make them, of
// N·C floats each: a block's forward two all-reduces (after the attention and MLP outputs), its
// backward two (the column-parallel inputs' gradients); the embedding's forward one, the head's
// backward one, and the vocabulary-parallel loss two of N floats. Under sequence parallelism each
// all-reduce becomes an all-gather of the rows before the column-parallel layer and a
// reduce-scatter after the row-parallel one (forward), and the reverse in the backward. Collective
// times are the calibration's lines for the group's size (Calibration::collective_seconds).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/cpu/sparse_attention.h"
#include "models/config.h"
#include "optim/optimizer.h"
#include "planner/calibrate.h"
#include "planner/program.h"
#include "tensor/dtype.h"

namespace mt::planner {

// The optimizer's update: AdamW's kernel, LAMB's two passes, SGD's one pass without or with its
// momentum, and 1-bit Adam's and 1-bit LAMB's own updates past their warm-up (the compressed phase,
// whose momentum goes through the compressed exchange: ZeroStepCosts::onebit_exchange), and 0/1
// Adam's three steps besides its variance steps (AdamW's): a compressed-gradient step (the rank's
// own gradient through the exchange, then the momentum and the update), a local step (no
// communication) and a sync (a local step, then the accumulated update through the exchange;
// optim/zero_one_adam.h).
enum class UpdateKind {
  kAdamW,
  kLamb,
  kSgd,
  kSgdMomentum,
  kOneBitAdamCompressed,
  kOneBitLambCompressed,
  kZeroOneCompressed,
  kZeroOneLocal,
  kZeroOneSync
};
// Whether an update keeps the gradients local (no all-reduce in the backward, OneBitSync), and
// whether it exchanges a model-sized buffer compressed.
bool update_keeps_gradients_local(UpdateKind u);
bool update_exchanges(UpdateKind u);
// 0/1 Adam's steps over updates first..last (1-based, as the engine counts them), as the
// optimizer's own policy (optim::ZeroOnePolicy) makes them: each kind's share, variance steps as
// kAdamW; kinds with no step left out.
std::vector<std::pair<UpdateKind, double>> zero_one_mix(const optim::OptimizerSpec& spec, int64_t first, int64_t last);
// Whether 0/1 Adam makes a variance step (its gradients all-reduced) after its first exchange, within
// updates 1..last: the exchange's kept scratch then meets the all-reduce's temporaries
// (MemoryInput::exchange_beside_all_reduce). With var_update_scaler k >= 1 the first k updates are
// variance steps at interval 1; the interval then doubles, so the first compressed-gradient step is
// update k + 1 (k odd) or k + 2 (k even) and the next variance step follows it at once.
bool zero_one_variance_after_exchange(const optim::OptimizerSpec& spec, int64_t last);
// The run's steps by kind over updates first..last where an optimizer's steps differ: 1-bit Adam
// and 1-bit LAMB, their warm-up's (max(freeze_step, 2) - 1 updates, as kAdamW / kLamb) and their
// compressed phase's; 0/1 Adam, zero_one_mix. Empty for the others (every step alike).
std::vector<std::pair<UpdateKind, double>> update_mix(const optim::OptimizerSpec& spec, int64_t first, int64_t last);
// The update an optimizer specification runs in its warm-up (optim::make_optimizer's types; the
// 1-bit ones as AdamW and LAMB).
UpdateKind update_kind(const optim::OptimizerSpec& spec);

struct StepShape {
  models::ModelConfig model;
  int micro_batch = 1;  // B
  int seq_length = 1;   // T
  DType compute = DType::kF32;
  int world = 1;        // data-parallel ranks
  int vocab_divisible = 128;
  bool recompute = false;  // activation checkpointing: each block's backward runs its forward again first
  // Megatron's tensor parallelism over tp ranks (this rank's widths: NH/tp heads, I/tp features,
  // V/tp vocabulary rows), with sequence parallelism: the norms and residual adds on N/tp rows.
  int tp = 1;
  bool sequence_parallel = false;
  // DeepSpeed-Ulysses over usp ranks (parallel.sp, tp = 1): each rank's GEMMs and elementwise work on
  // its B·T/usp tokens, attention on all T for NH/usp heads, and around it the sp group's blocking
  // all-to-alls (ZeroStepCosts::tp_forward/tp_backward; Calibration::collective_seconds
  // "all_to_all"), each with its pack and unpack copies: a block's forward q, k, v to heads and the
  // output back; its backward the saved output to tokens again, the output's gradient to heads and
  // q, k, v's gradients back (the forward's two first under recompute); the loss's sum and count
  // all-reduced. `world` counts the ZeRO ranks, dp x usp.
  int usp = 1;
  // offload_optimizer device "nvme" (optim/swapped_adamw.h): the moments stream from and to the
  // disk in sub-groups of sub_group_size elements during the update.
  bool optimizer_nvme = false;
  int64_t sub_group_size = 1'000'000'000;
  // offload_param device "nvme" at stage 3: the disk's rates and the bare update for the step
  // program's swap (planner/program.h); the same calibration's disk as optimizer_nvme.
  bool param_nvme = false;
  // ZeRO's stage. At stage 0 the update writes the compute-dtype copy of the parameters itself
  // (parallel/grad_sync's LocalSync and BucketedSync hand the optimizer the copy); under ZeRO
  // (ZeroSync) the update writes the f32 master alone and the refresh converts the gathered views,
  // which the step programs price.
  int zero_stage = 0;
  // The attention the run computes (causal by default). attention_share: the share of the causal
  // kernel's tile pairs (kernels::attention_tile_pairs) its documents leave, data.reset_attention_mask's
  // over the run's own samples (cli's document_attention_share); it scales attention's core and the
  // dropout of its probabilities. sparse: sparse_attention's plan over the model's heads (tp rank r
  // computes heads [r NH/tp, (r+1) NH/tp): the rank with the most pairs is priced), by those pairs'
  // FLOPs at the sparse kernel's calibrated lines of the nearest block (sparse_attention_line;
  // none: the dense kernel's).
  double attention_share = 1.0;
  std::shared_ptr<const kernels::SparseAttentionPlan> sparse = nullptr;
  // The optimizer's update (optimizer.type, update_kind): Adam, AdamW and the 1-bit Adams run
  // AdamW's kernel (the 1-bit ones in their warm-up, which the plan prices); Lamb and 1-bit LAMB
  // (its warm-up) LAMB's two passes; SGD one pass, with or without its momentum buffer.
  UpdateKind update = UpdateKind::kAdamW;
};

// The calibration's line for an update (calibrate's "adamw", "lamb", "sgd", "sgd momentum",
// "onebitadam compressed", "onebitlamb compressed", "zerooneadam compressed", "zerooneadam local",
// "zerooneadam sync"; with the bf16 copy written: "adamw bf16", "lamb bf16", ...).
const char* update_line(UpdateKind u, bool bf16_copy);

// The calibration's sparse attention lines ("sparse attention forward bN", "... backward bN") for a
// plan of kernel block `block`: the smallest calibrated N >= block, else the largest; 0 if none.
int sparse_attention_line(const Calibration& cal, int block);

// FLOPs of one block's GEMMs in the forward (the textbook 24·N·C² for GPT-2's 4C MLP, without
// attention's core).
double block_gemm_flops(const StepShape& s);

// Seconds per unit of models/planner::model_units(s.model) order: embeddings, blocks, tail.
ZeroStepCosts zero_step_costs(const StepShape& s, const Calibration& cal);

}  // namespace mt::planner
