#include "models/block.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"

namespace mt::models {
namespace {

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

// Hands out consecutive 64-byte-aligned pieces of one allocation (or only counts them).
class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  void* take(size_t bytes) {
    void* p = base_ ? base_ + used_ : nullptr;
    used_ += align64(bytes);
    return p;
  }
  float* f32(size_t n) { return static_cast<float*>(take(n * 4)); }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

// f32 (n) -> cd buffer; a no-op when the destination already is the f32 source.
void store_cd(void* dst, DType cd, const float* src, size_t n) {
  if (dst != src) convert(dst, cd, src, DType::kF32, n);
}

}  // namespace

size_t BlockActs::layout(BlockActs* a, char* base, const BlockDims& d, DType cd, bool layernorm) {
  Carver c(base);
  size_t N = d.N, es = dtype_size(cd);
  bool f32 = cd == DType::kF32;
  a->mean1 = layernorm ? c.f32(N) : nullptr;
  a->rstd1 = c.f32(N);
  a->n1c = c.take(N * d.C * es);
  a->qkv = c.f32(N * d.QKV);
  a->att = c.f32(N * d.A);
  a->lse = c.f32(static_cast<size_t>(d.B) * d.NH * d.T);
  a->attc = f32 ? a->att : c.take(N * d.A * es);
  a->x2 = c.f32(N * d.C);
  a->mean2 = layernorm ? c.f32(N) : nullptr;
  a->rstd2 = c.f32(N);
  a->n2c = c.take(N * d.C * es);
  a->h = c.f32(N * d.H);
  a->actc = c.take(N * d.G * es);
  return c.used();
}

size_t BlockScratch::layout(BlockScratch* s, char* base, const BlockDims& d) {
  Carver c(base);
  size_t N = d.N;
  s->f = c.f32(N * std::max({d.C, d.A, d.G}));
  s->dact = c.f32(N * d.G);
  s->dh = c.f32(N * d.H);
  s->dqkv = c.f32(N * d.QKV);
  s->datt = c.f32(N * d.A);
  s->dn = c.f32(N * d.C);
  return c.used();
}

Block::Block(const ModelConfig& cfg, int index, parallel::TpComm& tp)
    : Module((cfg.arch == Arch::kGpt2 ? "h." : "layers.") + std::to_string(index)),
      arch_(cfg.arch),
      eps_(cfg.norm_eps),
      tp_(tp) {
  int C = cfg.hidden, HS = cfg.head_dim(), I = cfg.intermediate;
  int A = cfg.n_head * HS, KV = cfg.n_kv_head * HS;
  float std = cfg.init_std;
  const nn::TpPlace place{tp.rank(), tp.size()};
  const auto col = nn::TpKind::kColumn, row = nn::TpKind::kRow;
  if (arch_ == Arch::kGpt2) {
    // GPT-2 scales the residual projections' init by 1/sqrt(2 L) (HF GPT2PreTrainedModel).
    float proj_std = std / std::sqrt(2.0f * static_cast<float>(cfg.n_layer));
    ln_1_ = add_module(std::make_unique<nn::LayerNorm>("ln_1", C, eps_));
    auto* attn = add_module(std::make_unique<nn::Container>("attn"));
    c_attn_ = attn->add_module(std::make_unique<nn::Linear>("c_attn", C, 3 * C, true, nn::WeightLayout::kInOut, std, col, place, 3));
    attn_proj_ = attn->add_module(std::make_unique<nn::Linear>("c_proj", C, C, true, nn::WeightLayout::kInOut, proj_std, row, place));
    ln_2_ = add_module(std::make_unique<nn::LayerNorm>("ln_2", C, eps_));
    auto* mlp = add_module(std::make_unique<nn::Container>("mlp"));
    c_fc_ = mlp->add_module(std::make_unique<nn::Linear>("c_fc", C, I, true, nn::WeightLayout::kInOut, std, col, place));
    mlp_proj_ = mlp->add_module(std::make_unique<nn::Linear>("c_proj", I, C, true, nn::WeightLayout::kInOut, proj_std, row, place));
  } else {
    using nn::Linear;
    using nn::WeightLayout;
    rms_1_ = add_module(std::make_unique<nn::RMSNorm>("input_layernorm", C, eps_));
    auto* attn = add_module(std::make_unique<nn::Container>("self_attn"));
    auto* q = attn->add_module(std::make_unique<Linear>("q_proj", C, A, false, WeightLayout::kOutIn, std, col, place));
    auto* k = attn->add_module(std::make_unique<Linear>("k_proj", C, KV, false, WeightLayout::kOutIn, std, col, place));
    auto* v = attn->add_module(std::make_unique<Linear>("v_proj", C, KV, false, WeightLayout::kOutIn, std, col, place));
    o_proj_ = attn->add_module(std::make_unique<Linear>("o_proj", A, C, false, WeightLayout::kOutIn, std, row, place));
    qkv_ = nn::LinearGroup({q, k, v});
    rms_2_ = add_module(std::make_unique<nn::RMSNorm>("post_attention_layernorm", C, eps_));
    auto* mlp = add_module(std::make_unique<nn::Container>("mlp"));
    auto* gate = mlp->add_module(std::make_unique<Linear>("gate_proj", C, I, false, WeightLayout::kOutIn, std, col, place));
    auto* up = mlp->add_module(std::make_unique<Linear>("up_proj", C, I, false, WeightLayout::kOutIn, std, col, place));
    down_proj_ = mlp->add_module(std::make_unique<Linear>("down_proj", I, C, false, WeightLayout::kOutIn, std, row, place));
    gate_up_ = nn::LinearGroup({gate, up});
  }
}

// Megatron's reduce-from region after a row-parallel layer: sum the partial outputs over the tp
// group, then add the bias once.
void Block::reduce_from(const nn::Linear& layer, float* y, int N, int C) {
  if (tp_.size() == 1) return;
  tp_.all_reduce(y, static_cast<size_t>(N) * C, "tp row-parallel forward");
  if (layer.bias_deferred()) layer.add_bias(y, N);
}

void Block::forward(float* y, const float* x, BlockActs& a, BlockScratch& s, const BlockDims& d,
                    const float* rope_cos, const float* rope_sin, nn::Workspace& ws) {
  run_hooks(nn::HookPoint::kPreForward);
  const size_t N = d.N;
  DType cd = arch_ == Arch::kGpt2 ? c_attn_->weight()->compute_dtype : o_proj_->weight()->compute_dtype;
  bool f32 = cd == DType::kF32;
  float* n1 = f32 ? static_cast<float*>(a.n1c) : s.f;
  if (arch_ == Arch::kGpt2) {
    ln_1_->forward(n1, a.mean1, a.rstd1, x, d.N);
    store_cd(a.n1c, cd, n1, N * d.C);
    c_attn_->forward(a.qkv, a.n1c, d.N);
  } else {
    rms_1_->forward(n1, a.rstd1, x, d.N);
    store_cd(a.n1c, cd, n1, N * d.C);
    qkv_.forward(a.qkv, a.n1c, d.N);
    kernels::rope_forward(a.qkv, rope_cos, rope_sin, d.B, d.T, d.NH, d.NKV, d.HS);
  }
  kernels::attention_forward(a.att, a.lse, a.qkv, d.B, d.T, d.NH, d.NKV, d.HS);
  store_cd(a.attc, cd, a.att, N * d.A);
  nn::Linear* proj = arch_ == Arch::kGpt2 ? attn_proj_ : o_proj_;
  proj->forward(s.f, a.attc, d.N);
  reduce_from(*proj, s.f, d.N, d.C);
  kernels::add_forward(a.x2, x, s.f, N * d.C);

  float* n2 = f32 ? static_cast<float*>(a.n2c) : s.f;
  float* act = f32 ? static_cast<float*>(a.actc) : s.f;
  if (arch_ == Arch::kGpt2) {
    ln_2_->forward(n2, a.mean2, a.rstd2, a.x2, d.N);
    store_cd(a.n2c, cd, n2, N * d.C);
    c_fc_->forward(a.h, a.n2c, d.N);
    kernels::gelu_forward(act, a.h, N * d.G);
  } else {
    rms_2_->forward(n2, a.rstd2, a.x2, d.N);
    store_cd(a.n2c, cd, n2, N * d.C);
    gate_up_.forward(a.h, a.n2c, d.N);
    kernels::swiglu_forward(act, a.h, d.N, d.G);
  }
  store_cd(a.actc, cd, act, N * d.G);
  nn::Linear* down = arch_ == Arch::kGpt2 ? mlp_proj_ : down_proj_;
  down->forward(s.f, a.actc, d.N);
  reduce_from(*down, s.f, d.N, d.C);
  kernels::add_forward(y, a.x2, s.f, N * d.C);
  run_hooks(nn::HookPoint::kPostForward);
}

void Block::backward(float* dres, const float* x, const BlockActs& a, BlockScratch& s,
                     const BlockDims& d, const float* rope_cos, const float* rope_sin,
                     nn::Workspace& ws) {
  run_hooks(nn::HookPoint::kPreBackward);
  const size_t N = d.N;
  // MLP: dres is dL/dy = dL/dx2 (residual path) + the MLP branch's contribution.
  nn::Linear* down = arch_ == Arch::kGpt2 ? mlp_proj_ : down_proj_;
  down->backward(s.dact, false, dres, a.actc, d.N, ws);
  if (arch_ == Arch::kGpt2) {
    kernels::gelu_backward(s.dh, a.h, s.dact, N * d.G);
    c_fc_->backward(s.dn, false, s.dh, a.n2c, d.N, ws);
    tp_.all_reduce(s.dn, N * d.C, "tp mlp-in backward");
    ln_2_->backward(dres, s.dn, a.x2, a.mean2, a.rstd2, d.N);
  } else {
    kernels::swiglu_backward(s.dh, s.dact, a.h, d.N, d.G);
    gate_up_.backward(s.dn, false, s.dh, a.n2c, d.N, ws);
    tp_.all_reduce(s.dn, N * d.C, "tp mlp-in backward");
    rms_2_->backward(dres, s.dn, a.x2, a.rstd2, d.N);
  }
  // Attention: dres now holds dL/dx2 = dL/dx (residual) + the attention branch's contribution.
  nn::Linear* proj = arch_ == Arch::kGpt2 ? attn_proj_ : o_proj_;
  proj->backward(s.datt, false, dres, a.attc, d.N, ws);
  kernels::attention_backward(s.dqkv, s.datt, a.qkv, a.att, a.lse, d.B, d.T, d.NH, d.NKV, d.HS);
  if (arch_ == Arch::kGpt2) {
    c_attn_->backward(s.dn, false, s.dqkv, a.n1c, d.N, ws);
    tp_.all_reduce(s.dn, N * d.C, "tp qkv backward");
    ln_1_->backward(dres, s.dn, x, a.mean1, a.rstd1, d.N);
  } else {
    kernels::rope_backward(s.dqkv, rope_cos, rope_sin, d.B, d.T, d.NH, d.NKV, d.HS);
    qkv_.backward(s.dn, false, s.dqkv, a.n1c, d.N, ws);
    tp_.all_reduce(s.dn, N * d.C, "tp qkv backward");
    rms_1_->backward(dres, s.dn, x, a.rstd1, d.N);
  }
  run_hooks(nn::HookPoint::kPostBackward);
}

}  // namespace mt::models
