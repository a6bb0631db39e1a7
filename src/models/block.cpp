#include "models/block.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/error.h"
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

namespace {

// Ulysses: a q, k, v row's segments (q heads, k heads, v heads) and an attention output row's.
std::vector<size_t> qkv_segments(const BlockDims& d) {
  const size_t q = static_cast<size_t>(d.NH) * d.HS, kv = static_cast<size_t>(d.NKV) * d.HS;
  return {q, kv, kv};
}
std::vector<size_t> att_segments(const BlockDims& d) { return {static_cast<size_t>(d.A)}; }

}  // namespace

size_t BlockActs::layout(BlockActs* a, char* base, const BlockDims& d, DType cd, bool layernorm) {
  Carver c(base);
  size_t N = d.N, R = d.rows(), es = dtype_size(cd);
  a->mean1 = layernorm ? c.f32(R) : nullptr;
  a->rstd1 = c.f32(R);
  a->n1c = c.take(R * d.C * es);  // R = N without sequence parallelism
  a->qkv = c.take(N * d.QKV * es);
  a->att = c.f32(N * d.A);
  a->lse = c.f32(static_cast<size_t>(d.B) * d.NH * d.T);
  a->x2 = c.f32(R * d.C);
  a->mean2 = layernorm ? c.f32(R) : nullptr;
  a->rstd2 = c.f32(R);
  a->n2c = c.take(R * d.C * es);
  a->h = c.take(N * d.H * es);
  a->actc = c.take(N * d.G * es);
  return c.used();
}

size_t BlockScratch::layout(BlockScratch* s, char* base, const BlockDims& d, DType cd) {
  Carver c(base);
  size_t N = d.N;
  const bool low = cd != DType::kF32;
  s->f = c.f32(N * (low ? std::max({d.C, d.A, d.G, d.QKV}) : std::max({d.C, d.A, d.G})));
  s->dact = c.f32(N * d.G);
  s->dh = c.f32(N * d.H);
  s->dqkv = c.f32(N * d.QKV);
  s->datt = c.f32(N * d.A);
  s->dn = c.f32(N * d.C);
  s->full = d.sp ? c.f32(N * d.C) : nullptr;
  s->part = d.sp ? c.f32(static_cast<size_t>(d.Nl) * d.C) : nullptr;
  s->a2a = d.usp > 1 ? c.f32(N * std::max(d.QKV, d.A)) : nullptr;
  return c.used();
}

Block::Block(const ModelConfig& cfg, int index, parallel::TpComm& tp)
    : Module((cfg.arch == Arch::kGpt2 ? "h." : "layers.") + std::to_string(index)),
      arch_(cfg.arch),
      layer_(index),
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
    attn_ = attn;
    c_attn_ = attn->add_module(std::make_unique<nn::Linear>("c_attn", C, 3 * C, true, nn::WeightLayout::kInOut, std, col, place, 3));
    attn_proj_ = attn->add_module(std::make_unique<nn::Linear>("c_proj", C, C, true, nn::WeightLayout::kInOut, proj_std, row, place));
    ln_2_ = add_module(std::make_unique<nn::LayerNorm>("ln_2", C, eps_));
    auto* mlp = add_module(std::make_unique<nn::Container>("mlp"));
    mlp_ = mlp;
    c_fc_ = mlp->add_module(std::make_unique<nn::Linear>("c_fc", C, I, true, nn::WeightLayout::kInOut, std, col, place));
    mlp_proj_ = mlp->add_module(std::make_unique<nn::Linear>("c_proj", I, C, true, nn::WeightLayout::kInOut, proj_std, row, place));
  } else {
    using nn::Linear;
    using nn::WeightLayout;
    rms_1_ = add_module(std::make_unique<nn::RMSNorm>("input_layernorm", C, eps_));
    auto* attn = add_module(std::make_unique<nn::Container>("self_attn"));
    attn_ = attn;
    // Qwen2's (and attention_bias's) q/k/v biases belong to self_attn itself, whose parameters
    // come before its children's: one (QKV) vector beside the one (QKV, C) matrix, split by heads
    // as their weights are. Zeros, as transformers' _init_weights.
    std::vector<nn::Parameter*> qkv_bias;
    if (cfg.qkv_bias) {
      const nn::TpSplit bs{0, 1, 0};
      qkv_bias = {attn->add_parameter("q_proj.bias", {A}, false, nn::Init::kZeros, 0.0f, bs, place),
                  attn->add_parameter("k_proj.bias", {KV}, false, nn::Init::kZeros, 0.0f, bs, place),
                  attn->add_parameter("v_proj.bias", {KV}, false, nn::Init::kZeros, 0.0f, bs, place)};
    }
    auto* q = attn->add_module(std::make_unique<Linear>("q_proj", C, A, false, WeightLayout::kOutIn, std, col, place));
    auto* k = attn->add_module(std::make_unique<Linear>("k_proj", C, KV, false, WeightLayout::kOutIn, std, col, place));
    auto* v = attn->add_module(std::make_unique<Linear>("v_proj", C, KV, false, WeightLayout::kOutIn, std, col, place));
    o_proj_ = attn->add_module(std::make_unique<Linear>("o_proj", A, C, cfg.o_bias, WeightLayout::kOutIn, std, row, place));
    qkv_ = nn::LinearGroup({q, k, v}, qkv_bias);
    rms_2_ = add_module(std::make_unique<nn::RMSNorm>("post_attention_layernorm", C, eps_));
    auto* mlp = add_module(std::make_unique<nn::Container>("mlp"));
    mlp_ = mlp;
    auto* gate = mlp->add_module(std::make_unique<Linear>("gate_proj", C, I, false, WeightLayout::kOutIn, std, col, place));
    auto* up = mlp->add_module(std::make_unique<Linear>("up_proj", C, I, false, WeightLayout::kOutIn, std, col, place));
    down_proj_ = mlp->add_module(std::make_unique<Linear>("down_proj", I, C, false, WeightLayout::kOutIn, std, row, place));
    gate_up_ = nn::LinearGroup({gate, up});
  }
}

// Megatron's reduce-from region after a row-parallel layer: sum the partial outputs over the tp
// group, then add the bias once.
float* Block::reduce_from(const nn::Linear& layer, float* y, BlockScratch& s, const BlockDims& d) {
  if (tp_.size() == 1) return y;
  float* out = y;
  if (d.sp) {
    tp_.reduce_scatter_rows(s.part, y, static_cast<size_t>(d.Nl), static_cast<size_t>(d.C), "sp row-parallel forward");
    out = s.part;
  } else {
    tp_.all_reduce(y, static_cast<size_t>(d.N) * d.C, "tp row-parallel forward");
  }
  if (layer.bias_deferred()) layer.add_bias(out, d.rows());
  return out;
}

const float* Block::full_grad(const float* dres, BlockScratch& s, const BlockDims& d) {
  if (!d.sp) return dres;
  tp_.gather_rows(s.full, dres, static_cast<size_t>(d.Nl), static_cast<size_t>(d.C), "sp row-parallel backward");
  return s.full;
}

const float* Block::reduce_to_rows(float* dn, BlockScratch& s, const BlockDims& d) {
  if (d.sp) {
    tp_.reduce_scatter_rows(s.part, dn, static_cast<size_t>(d.Nl), static_cast<size_t>(d.C), "sp column-parallel backward");
    return s.part;
  }
  tp_.all_reduce(dn, static_cast<size_t>(d.N) * d.C, "tp column-parallel backward");
  return dn;
}

void Block::drop_residual(float* x, uint32_t site, const BlockDims& d) const {
  if (d.drop == nullptr || !d.drop->resid.active()) return;
  kernels::dropout_rows(x, static_cast<size_t>(d.rows()), d.C,
                        kernels::drop_site_key(d.drop->step_key, static_cast<uint32_t>(layer_), site), d.drop->resid,
                        d.drop->sample0, d.drop->row0, d.T, d.drop->t0);
}

kernels::AttnDropout Block::attention_dropout(const BlockDims& d) const {
  kernels::AttnDropout a;
  if (d.drop == nullptr || !d.drop->attn.active()) return a;
  MT_CHECK(d.sparse == nullptr, ErrorKind::kNotSupported, "attention dropout with sparse attention is not supported");
  a.site_key = kernels::drop_site_key(d.drop->step_key, static_cast<uint32_t>(layer_), kernels::kDropAttnProbs);
  a.rate = d.drop->attn;
  a.sample0 = d.drop->sample0;
  a.head0 = d.drop->head0;
  return a;
}

void norm_backward_sp(nn::Module& norm, parallel::TpComm& tp, bool sp, const std::function<void()>& run) {
  if (!sp || tp.size() == 1) {
    run();
    return;
  }
  std::vector<nn::Parameter*> ps;
  norm.collect_parameters(ps);
  size_t n = 0;
  for (nn::Parameter* p : ps) n += static_cast<size_t>(p->numel());
  std::vector<float> tmp(n, 0.0f);
  std::vector<float*> saved;
  size_t off = 0;
  for (nn::Parameter* p : ps) {
    saved.push_back(p->grad);
    p->grad = tmp.data() + off;
    off += static_cast<size_t>(p->numel());
  }
  run();
  tp.all_reduce(tmp.data(), n, "sp norm weight gradients");
  off = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    ps[i]->grad = saved[i];
    for (int64_t k = 0; k < ps[i]->numel(); ++k) ps[i]->grad[k] += tmp[off + static_cast<size_t>(k)];
    off += static_cast<size_t>(ps[i]->numel());
  }
}

void Block::forward(float* y, const float* x, BlockActs& a, BlockScratch& s, const BlockDims& d,
                    const float* rope_cos, const float* rope_sin, nn::Workspace& ws) {
  ProfileScope block_scope(prof_, pid_.block);
  run_hooks(nn::HookPoint::kPreForward);
  const size_t N = d.N, R = d.rows(), C = d.C;
  const bool gpt2 = arch_ == Arch::kGpt2;
  const bool ulysses = d.usp > 1;
  DType cd = gpt2 ? c_attn_->weight()->compute_dtype : o_proj_->weight()->compute_dtype;
  bool f32 = cd == DType::kF32;
  // A norm's output (R, C) f32, saved in the compute dtype (dst_cd), then all N rows of it as the
  // GEMM's input. Under sequence parallelism the saved copy keeps this rank's rows and the GEMM
  // reads them gathered (Megatron's gather-from-sequence region before a column-parallel layer):
  // in s.full (f32), or in s.f gathered from the saved copy in the compute dtype as it is (the
  // values the GEMM would read after a cast, at half the bytes).
  auto norm_out = [&](void* dst_cd) { return f32 ? static_cast<float*>(dst_cd) : d.sp ? s.part : s.f; };
  auto to_gemm_input = [&](void* dst_cd, float* n) -> const void* {
    store_cd(dst_cd, cd, n, R * C);
    if (!d.sp) return dst_cd;
    if (f32) {
      tp_.gather_rows(s.full, n, R, C, "sp column-parallel forward");
      return s.full;
    }
    tp_.gather_rows(s.f, dst_cd, R, C, cd, "sp column-parallel forward");
    return s.f;
  };
  float* n1 = norm_out(a.n1c);
  {
    ProfileScope p(prof_, pid_.norm1);
    if (gpt2) ln_1_->forward(n1, a.mean1, a.rstd1, x, d.rows());
    else rms_1_->forward(n1, a.rstd1, x, d.rows());
  }
  {
    ProfileScope attn_scope(prof_, pid_.attn);
    const void* in1 = to_gemm_input(a.n1c, n1);
    // f32: the saved buffers themselves; low precision: the scratch the backward reuses, rounded
    // into the saved copies (round_to) before the forward reads them.
    // Ulysses: the GEMM's output (this rank's tokens, every head) in s.a2a; RoPE at the tokens'
    // global positions; then all the tokens of this rank's heads in qkv (saved in that layout).
    float* qkv = f32 ? static_cast<float*>(a.qkv) : s.dqkv;
    float* qkv_out = ulysses ? s.a2a : qkv;
    {
      ProfileScope p(prof_, pid_.qkv);
      if (gpt2) c_attn_->forward(qkv_out, in1, d.N);
      else qkv_.forward(qkv_out, in1, d.N);
    }
    {
      ProfileScope p(prof_, pid_.core);
      if (!gpt2) kernels::rope_forward(qkv_out, rope_cos, rope_sin, d.B, d.T, d.NH, d.NKV, d.HS, d.pos);
      if (ulysses) d.ulysses->to_heads(qkv, qkv_out, d.B, d.T, qkv_segments(d), "ulysses q, k, v");
      if (!f32) round_to(a.qkv, cd, qkv, N * d.QKV);
      const kernels::AttnDropout att_drop = attention_dropout(d);
      MT_CHECK(!(d.sparse && d.kstart), ErrorKind::kNotSupported, "reset_attention_mask with sparse attention is not supported");
      if (d.sparse)  // (Ulysses: all T for this rank's heads, as the dense kernel below)
        kernels::sparse_attention_forward(a.att, a.lse, qkv, *d.sparse, d.B, d.T * d.usp, d.NH / d.usp, d.NKV / d.usp, d.HS);
      else kernels::attention_forward(a.att, a.lse, qkv, d.B, d.T * d.usp, d.NH / d.usp, d.NKV / d.usp, d.HS,
                                      att_drop.rate.active() ? &att_drop : nullptr, d.kstart);
    }
    // The output projection's input: the attention output in the compute dtype (q, k, v are used);
    // Ulysses: back to this rank's tokens (every head) first.
    const float* att = a.att;
    if (ulysses) {
      d.ulysses->to_tokens(s.a2a, a.att, d.B, d.T, att_segments(d), "ulysses attention output");
      att = s.a2a;
    }
    void* attc = f32 ? const_cast<float*>(att) : static_cast<void*>(s.dqkv);
    store_cd(attc, cd, att, N * d.A);
    nn::Linear* proj = gpt2 ? attn_proj_ : o_proj_;
    {
      ProfileScope p(prof_, pid_.proj);
      proj->forward(s.f, attc, d.N);
    }
    float* branch = reduce_from(*proj, s.f, s, d);
    drop_residual(branch, kernels::kDropAttnOut, d);
    kernels::add_forward(a.x2, x, branch, R * C);
  }

  float* n2 = norm_out(a.n2c);
  {
    ProfileScope p(prof_, pid_.norm2);
    if (gpt2) ln_2_->forward(n2, a.mean2, a.rstd2, a.x2, d.rows());
    else rms_2_->forward(n2, a.rstd2, a.x2, d.rows());
  }
  {
    ProfileScope mlp_scope(prof_, pid_.mlp);
    const void* in2 = to_gemm_input(a.n2c, n2);
    float* h = f32 ? static_cast<float*>(a.h) : s.dh;
    {
      ProfileScope p(prof_, pid_.up);
      if (gpt2) c_fc_->forward(h, in2, d.N);
      else gate_up_.forward(h, in2, d.N);
    }
    {
      ProfileScope p(prof_, pid_.act);
      // Low precision: the pre-activation rounded into its saved copy and the activation written
      // in the compute dtype, fused (kernels::*_lp).
      if (f32 && gpt2) kernels::gelu_forward(static_cast<float*>(a.actc), h, N * d.G);
      else if (f32) kernels::swiglu_forward(static_cast<float*>(a.actc), h, d.N, d.G);
      else if (gpt2) kernels::gelu_forward_lp(a.h, a.actc, cd, h, N * d.G);
      else kernels::swiglu_forward_lp(a.h, a.actc, cd, h, d.N, d.G);
    }
    nn::Linear* down = gpt2 ? mlp_proj_ : down_proj_;
    {
      ProfileScope p(prof_, pid_.down);
      down->forward(s.f, a.actc, d.N);
    }
    float* branch = reduce_from(*down, s.f, s, d);
    drop_residual(branch, kernels::kDropMlpOut, d);
    kernels::add_forward(y, a.x2, branch, R * C);
  }
  run_hooks(nn::HookPoint::kPostForward);
}

void Block::backward(float* dres, const float* x, const BlockActs& a, BlockScratch& s,
                     const BlockDims& d, const float* rope_cos, const float* rope_sin,
                     nn::Workspace& ws) {
  ProfileScope block_scope(prof_, pid_.block);
  run_hooks(nn::HookPoint::kPreBackward);
  const size_t N = d.N;
  const int R = d.rows();
  const bool gpt2 = arch_ == Arch::kGpt2;
  const bool ulysses = d.usp > 1;
  // MLP: dres is dL/dy = dL/dx2 (residual path) + the MLP branch's contribution. Row-parallel
  // layers' backward takes the whole N rows (the reduce-scatter's backward is an all-gather).
  const float* dn = nullptr;
  const DType cd = gpt2 ? c_attn_->weight()->compute_dtype : o_proj_->weight()->compute_dtype;
  // A saved activation as f32: itself, or (low precision) converted into the scratch `into`.
  auto saved_f32 = [&](const void* saved, float* into, size_t n) -> const float* {
    if (cd == DType::kF32) return static_cast<const float*>(saved);
    convert(into, DType::kF32, saved, cd, n);
    return into;
  };
  // A saved norm output as its GEMM's input: under sequence parallelism this rank's rows gathered
  // from the group again (the backward's all-gather of Megatron's sharded input), into s.full
  // (f32) or, in the compute dtype as saved, into s.f (the forward's scratch is free in backward).
  auto gemm_input = [&](const void* saved) -> const void* {
    if (!d.sp) return saved;
    void* out = cd == DType::kF32 ? static_cast<void*>(s.full) : static_cast<void*>(s.f);
    tp_.gather_rows(out, saved, static_cast<size_t>(R), static_cast<size_t>(d.C), cd, "sp column-parallel backward input");
    return out;
  };
  // A branch's output gradient: dres, or with residual dropout dres through the forward's mask (in
  // s.part under sequence parallelism, else s.dn: both free until the branch's last GEMM).
  auto branch_grad = [&](uint32_t site) -> const float* {
    if (d.drop == nullptr || !d.drop->resid.active()) return full_grad(dres, s, d);
    float* m = d.sp ? s.part : s.dn;
    std::memcpy(m, dres, static_cast<size_t>(R) * d.C * 4);
    drop_residual(m, site, d);
    return full_grad(m, s, d);
  };
  {
    ProfileScope mlp_scope(prof_, pid_.mlp);
    nn::Linear* down = gpt2 ? mlp_proj_ : down_proj_;
    const float* dy = branch_grad(kernels::kDropMlpOut);
    {
      ProfileScope p(prof_, pid_.down);
      down->backward(s.dact, false, dy, a.actc, d.N, ws);
    }
    {
      ProfileScope p(prof_, pid_.act);
      const bool f32 = cd == DType::kF32;
      if (f32 && gpt2) kernels::gelu_backward(s.dh, static_cast<const float*>(a.h), s.dact, N * d.G);
      else if (f32) kernels::swiglu_backward(s.dh, s.dact, static_cast<const float*>(a.h), d.N, d.G);
      else if (gpt2) kernels::gelu_backward_lp(s.dh, a.h, cd, s.dact, N * d.G);
      else kernels::swiglu_backward_lp(s.dh, s.dact, a.h, cd, d.N, d.G);
    }
    {
      ProfileScope p(prof_, pid_.up);
      const void* in2 = gemm_input(a.n2c);
      if (gpt2) c_fc_->backward(s.dn, false, s.dh, in2, d.N, ws);
      else gate_up_.backward(s.dn, false, s.dh, in2, d.N, ws);
    }
    dn = reduce_to_rows(s.dn, s, d);
  }
  {
    ProfileScope p(prof_, pid_.norm2);
    if (gpt2) norm_backward_sp(*ln_2_, tp_, d.sp, [&] { ln_2_->backward(dres, dn, a.x2, a.mean2, a.rstd2, R); });
    else norm_backward_sp(*rms_2_, tp_, d.sp, [&] { rms_2_->backward(dres, dn, a.x2, a.rstd2, R); });
  }
  // Attention: dres now holds dL/dx2 = dL/dx (residual) + the attention branch's contribution.
  {
    ProfileScope attn_scope(prof_, pid_.attn);
    nn::Linear* proj = gpt2 ? attn_proj_ : o_proj_;
    const float* dy = branch_grad(kernels::kDropAttnOut);
    {
      ProfileScope p(prof_, pid_.proj);
      // The forward's compute-dtype copy of the attention output again (s.dqkv is free until the
      // core's backward writes it).
      // Ulysses: the saved output is all tokens of this rank's heads; the projection read this
      // rank's tokens of every head (exchanged again rather than saved twice).
      const float* att = a.att;
      if (ulysses) {
        d.ulysses->to_tokens(s.a2a, a.att, d.B, d.T, att_segments(d), "ulysses attention output (backward)");
        att = s.a2a;
      }
      void* attc = cd == DType::kF32 ? const_cast<float*>(att) : static_cast<void*>(s.dqkv);
      store_cd(attc, cd, att, N * d.A);
      proj->backward(s.datt, false, dy, attc, d.N, ws);
    }
    // The gradient of q, k, v in this rank's tokens' layout (the qkv GEMM's output).
    float* dqkv = s.dqkv;
    {
      ProfileScope p(prof_, pid_.core);
      const float* qkv = saved_f32(a.qkv, s.f, N * d.QKV);
      const kernels::AttnDropout att_drop = attention_dropout(d);
      // Ulysses: the output's gradient to all tokens of this rank's heads (to_tokens' backward).
      const float* datt = s.datt;
      if (ulysses) {
        d.ulysses->to_heads(s.a2a, s.datt, d.B, d.T, att_segments(d), "ulysses attention output gradient");
        datt = s.a2a;
      }
      if (d.sparse)
        kernels::sparse_attention_backward(s.dqkv, datt, qkv, a.att, a.lse, *d.sparse, d.B, d.T * d.usp, d.NH / d.usp,
                                           d.NKV / d.usp, d.HS);
      else
        kernels::attention_backward(s.dqkv, datt, qkv, a.att, a.lse, d.B, d.T * d.usp, d.NH / d.usp, d.NKV / d.usp, d.HS,
                                    att_drop.rate.active() ? &att_drop : nullptr, d.kstart);
      if (ulysses) {  // back to this rank's tokens of every head (to_heads' backward)
        d.ulysses->to_tokens(s.a2a, s.dqkv, d.B, d.T, qkv_segments(d), "ulysses q, k, v gradient");
        dqkv = s.a2a;
      }
      if (!gpt2) kernels::rope_backward(dqkv, rope_cos, rope_sin, d.B, d.T, d.NH, d.NKV, d.HS, d.pos);
    }
    {
      ProfileScope p(prof_, pid_.qkv);
      const void* in1 = gemm_input(a.n1c);
      if (gpt2) c_attn_->backward(s.dn, false, dqkv, in1, d.N, ws);
      else qkv_.backward(s.dn, false, dqkv, in1, d.N, ws);
    }
    dn = reduce_to_rows(s.dn, s, d);
  }
  {
    ProfileScope p(prof_, pid_.norm1);
    if (gpt2) norm_backward_sp(*ln_1_, tp_, d.sp, [&] { ln_1_->backward(dres, dn, x, a.mean1, a.rstd1, R); });
    else norm_backward_sp(*rms_1_, tp_, d.sp, [&] { rms_1_->backward(dres, dn, x, a.rstd1, R); });
  }
  run_hooks(nn::HookPoint::kPostBackward);
}

namespace {
int64_t params_of(nn::Module& m) {
  std::vector<nn::Parameter*> ps;
  m.collect_parameters(ps);
  int64_t n = 0;
  for (const nn::Parameter* p : ps) n += p->numel();
  return n;
}
}  // namespace

void Block::profile_attach(ModuleProfile* p, int parent, const BlockDims& d) {
  prof_ = p;
  if (p == nullptr) return;
  // Own parameters and FLOPs of each node; the containers' come from their children (finish()).
  const bool gpt2 = arch_ == Arch::kGpt2;
  const double N = d.N, C = d.C;
  nn::Linear* proj = gpt2 ? attn_proj_ : o_proj_;
  nn::Linear* down = gpt2 ? mlp_proj_ : down_proj_;
  nn::Module& norm1 = gpt2 ? static_cast<nn::Module&>(*ln_1_) : *rms_1_;
  nn::Module& norm2 = gpt2 ? static_cast<nn::Module&>(*ln_2_) : *rms_2_;
  const std::string norm_kind = gpt2 ? "LayerNorm" : "RMSNorm";
  pid_.block = p->add(name(), "Block", parent, 0, 0.0);
  pid_.norm1 = p->add(norm1.name(), norm_kind, pid_.block, params_of(norm1), 0.0);
  pid_.attn = p->add(attn_->name(), "Attention", pid_.block, 0, 0.0);
  pid_.qkv = p->add(gpt2 ? "c_attn" : "q_proj+k_proj+v_proj", "Linear", pid_.attn,
                    params_of(*attn_) - params_of(*proj), gemm_flops(N, C, d.QKV));
  pid_.core = p->add(d.sparse ? "sparse_core" : "core", d.sparse ? "SparseAttentionCore" : "AttentionCore", pid_.attn, 0,
                     attention_profile_flops(d.B, d.T * d.usp, d.NH / d.usp, d.HS, d.sparse));
  pid_.proj = p->add(proj->name(), "Linear", pid_.attn, params_of(*proj), gemm_flops(N, d.A, C));
  pid_.norm2 = p->add(norm2.name(), norm_kind, pid_.block, params_of(norm2), 0.0);
  pid_.mlp = p->add(mlp_->name(), "MLP", pid_.block, 0, 0.0);
  pid_.up = p->add(gpt2 ? "c_fc" : "gate_proj+up_proj", "Linear", pid_.mlp, params_of(*mlp_) - params_of(*down),
                   gemm_flops(N, C, d.H));
  pid_.act = p->add(gpt2 ? "gelu" : "swiglu", gpt2 ? "GELU" : "SwiGLU", pid_.mlp, 0, 0.0);
  pid_.down = p->add(down->name(), "Linear", pid_.mlp, params_of(*down), gemm_flops(N, d.G, C));
}

}  // namespace mt::models
