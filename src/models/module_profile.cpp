#include "models/module_profile.h"

#include "base/error.h"

namespace mt::models {

int ModuleProfile::add(const std::string& name, const std::string& kind, int parent, int64_t params, double fwd_flops) {
  MT_CHECK(parent < static_cast<int>(nodes_.size()) && (parent >= 0 || nodes_.empty()), ErrorKind::kInternal,
           "profile node " + name + ": its parent is not in the tree (the root comes first, alone)");
  ProfileNode n;
  n.name = name;
  n.kind = kind;
  n.parent = parent;
  n.depth = parent < 0 ? 0 : nodes_[parent].depth + 1;
  n.params = params;
  n.fwd_flops = fwd_flops;
  const int id = static_cast<int>(nodes_.size());
  nodes_.push_back(std::move(n));
  if (parent >= 0) nodes_[parent].children.push_back(id);
  return id;
}

void ModuleProfile::finish() {
  // Children come after their parents: one backward pass sums every subtree.
  for (int i = static_cast<int>(nodes_.size()) - 1; i > 0; --i) {
    ProfileNode& p = nodes_[nodes_[i].parent];
    p.params += nodes_[i].params;
    p.fwd_flops += nodes_[i].fwd_flops;
  }
}

void ModuleProfile::record(int node, double seconds) {
  ProfileNode& n = nodes_[node];
  if (phase_ == ProfilePhase::kForward) {
    n.fwd_seconds += seconds;
    ++n.fwd_calls;
  } else {
    n.bwd_seconds += seconds;
    ++n.bwd_calls;
  }
}

double attention_pairs(int T, int NH, const kernels::SparseAttentionPlan* plan) {
  if (plan == nullptr) return static_cast<double>(NH) * T * (T + 1.0) / 2.0;
  return sparse_attention_pairs(*plan, 0, plan->num_heads);
}

double sparse_attention_pairs(const kernels::SparseAttentionPlan& p, int h0, int h1) {
  const kernels::SparseAttentionPlan* plan = &p;
  const int nb = plan->num_blocks;
  const double b = plan->block, full = b * b, diagonal = plan->causal ? b * (b + 1.0) / 2.0 : full;
  double pairs = 0.0;
  for (int h = h0; h < h1; ++h)
    for (int q = 0; q < nb; ++q) {
      const int row = h * nb + q;
      for (int e = plan->row_begin[row]; e < plan->row_begin[row + 1]; ++e) {
        const int k = plan->row_columns[e];
        pairs += k == q ? diagonal : (k < q || !plan->causal) ? full : 0.0;
      }
    }
  return pairs;
}

double attention_core_flops(int B, int T, int NH, int HS, const kernels::SparseAttentionPlan* plan) {
  return 2.0 * 2.0 * B * HS * attention_pairs(T, NH, plan);
}

double attention_profile_flops(int B, int T, int NH, int HS, const kernels::SparseAttentionPlan* plan) {
  if (plan != nullptr) return attention_core_flops(B, T, NH, HS, plan);
  return 2.0 * 2.0 * B * HS * static_cast<double>(NH) * T * T;
}

}  // namespace mt::models
