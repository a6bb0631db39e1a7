// ModuleProfile: DeepSpeed's flops profiler in meshtrain's terms. One training step's module tree
// on this rank (model, embedding, blocks with their norms, attention and MLP parts, final norm,
// LM head + loss), each node with this rank's parameters and forward FLOPs (analytic, from the
// GEMM shapes and the attention layout) and its measured forward and backward wall time.
//
// The model holds a pointer to one while a step is profiled (TransformerLM::set_profiler); null
// means off, and a ProfileScope then costs one branch.
//
// FLOPs counted (forward, one micro-batch of N = B·T rows; widths are this rank's under tensor
// parallelism, BlockDims' letters):
//   GEMM (M, K) x (K, Nout):  2·M·K·Nout            MACs = FLOPs / 2
//   attention core:           QK^T and PV over the (query, key) pairs the kernel visits:
//                             2·2·B·NH·HS·pairs,    pairs = T(T+1)/2 dense causal, or the pairs of
//                             the block-sparse plan (causal inside its diagonal blocks)
// Elementwise work (norms, activations, softmax, RoPE, residual adds) is not counted (as
// TransformerLM::train_flops_per_step). Backward: 2x forward (DeepSpeed's convention).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/sparse_attention.h"

namespace mt::models {

enum class ProfilePhase { kForward, kBackward };

struct ProfileNode {
  std::string name;   // local name ("h.0", "attn", "c_attn")
  std::string kind;   // what the aggregated profile groups by ("Block", "Linear", ...)
  int depth = 0;      // the root is 0
  int parent = -1;
  std::vector<int> children;
  int64_t params = 0;        // this rank's parameters (the subtree's)
  double fwd_flops = 0.0;    // one micro-batch's forward, this rank (the subtree's)
  double fwd_seconds = 0.0;  // measured, summed over the profiled micro-batches
  double bwd_seconds = 0.0;  // with activation recompute: includes the recomputed forward
  int fwd_calls = 0, bwd_calls = 0;
};

class ModuleProfile {
 public:
  // Adds a node under parent (-1: the root, added first) and returns its id. params and flops are
  // the node's own; a parent's totals include its children's (finish() sums them).
  int add(const std::string& name, const std::string& kind, int parent, int64_t params, double fwd_flops);
  // Sums params and flops up the tree. Call once after the last add().
  void finish();
  bool empty() const { return nodes_.empty(); }
  const std::vector<ProfileNode>& nodes() const { return nodes_; }
  const ProfileNode& root() const { return nodes_.front(); }

  // The phase whose latency scopes record into (set by the model's forward and backward).
  void set_phase(ProfilePhase p) { phase_ = p; }
  void record(int node, double seconds);

 private:
  std::vector<ProfileNode> nodes_;
  ProfilePhase phase_ = ProfilePhase::kForward;
};

// Times its lifetime into node `node` of p (the current phase); does nothing when p is null.
class ProfileScope {
 public:
  ProfileScope(ModuleProfile* p, int node) : p_(p), node_(node) {
    if (p_) start_ = std::chrono::steady_clock::now();
  }
  ~ProfileScope() {
    if (p_) p_->record(node_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  ModuleProfile* p_;
  int node_;
  std::chrono::steady_clock::time_point start_;
};

// 2·M·K·N.
inline double gemm_flops(double M, double K, double N) { return 2.0 * M * K * N; }
// (query, key) pairs the NH heads of one sequence visit together: NH·T(T+1)/2 dense causal (plan
// null), else the plan's non-empty blocks (a causal plan's diagonal blocks: block(block+1)/2 pairs,
// blocks above the diagonal none).
double attention_pairs(int T, int NH, const kernels::SparseAttentionPlan* plan);
// The plan's pairs of heads [h0, h1) (a tensor-parallel rank's heads).
double sparse_attention_pairs(const kernels::SparseAttentionPlan& plan, int h0, int h1);
// QK^T and PV of B sequences, NH heads of width HS: 2·2·B·HS·attention_pairs(T, NH, plan).
double attention_core_flops(int B, int T, int NH, int HS, const kernels::SparseAttentionPlan* plan);
// What the flops profiler reports for it, as DeepSpeed's counts it: dense attention over the whole
// T x T score matrix (its sdpa and matmul rules count the masked half too); sparse, the layout's
// pairs (as attention_core_flops).
double attention_profile_flops(int B, int T, int NH, int HS, const kernels::SparseAttentionPlan* plan);

}  // namespace mt::models
