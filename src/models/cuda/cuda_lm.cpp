// The CUDA DeviceLM: TransformerLM's forward/backward (models/block.cpp, models/transformer.cpp)
// step for step on the GPU, with cuBLASLt GEMMs and the fused kernels of kernels/cuda/.
//
// Precision (compute dtype cd = f32 or bf16): the residual stream, norm statistics, every parameter
// gradient and the master weights are f32, as on the CPU; the saved GEMM inputs (norm outputs, qkv,
// attention output, MLP activations) are kept in cd, where the CPU keeps f32 copies beside cd
// copies. The LM head's logits are in cd (bf16 as under PyTorch's autocast; the CPU keeps them in
// f32) with the cross-entropy's arithmetic in f32. The residual adds ride in the GEMMs
// (D = x + A·B + bias).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>

#include "base/error.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"
#include "models/device_lm.h"

// The benchmark's per-op breakdown (kernels/cuda/device.h ProfScope): one scope per call.
#define MT_PROF(name, ...)                \
  do {                                    \
    ::mt::cuda::ProfScope mt_prof_(name); \
    __VA_ARGS__;                          \
  } while (0)

namespace mt::models {
namespace {

namespace cu = mt::cuda;

struct LayerW {  // element offsets into the flat buffers
  size_t n1w = 0, n1b = 0, qkvw = 0, qkvb = 0, projw = 0, projb = 0, n2w = 0, n2b = 0, fcw = 0, fcb = 0, outw = 0,
         outb = 0;
  bool bias = false;
};

struct Acts {
  float *mean1, *rstd1, *lse, *x2, *mean2, *rstd2;
  void *n1, *qkv, *att, *n2, *h, *act;
};

class CudaLM final : public DeviceLM {
 public:
  explicit CudaLM(TransformerLM& model);
  std::string device_name() const override { return name_; }
  float forward(const int32_t* tokens, const int32_t* targets, float loss_scale) override;
  void backward() override;
  void set_grad_ready(std::function<void(size_t, size_t)> ready) override { grad_ready_ = std::move(ready); }
  void zero_grad() override { cu::fill_zero(grad_.data(), P_ * 4); }
  double grad_sum_squares() override {
    cu::ProfScope prof("opt sum_squares");
    return cu::sum_squares(grad_.as<float>(), P_);
  }
  void adamw_step(const std::vector<optim::ParamSegment>& segments, kernels::AdamWParams params) override;
  void load_master(const float* host) override;
  void store_master(float* host) override { cu::copy_to_host(host, master_.data(), P_ * 4); }
  void store_grads(float* host) override { cu::copy_to_host(host, grad_.data(), P_ * 4); }
  void load_grads(const float* host) override { cu::copy_to_device(grad_.data(), host, P_ * 4); }
  float* grads_device() override { return grad_.as<float>(); }
  void load_state(const std::string& name, const float* host) override { cu::copy_to_device(state(name), host, P_ * 4); }
  void store_state(const std::string& name, float* host) override { cu::copy_to_host(host, state(name), P_ * 4); }
  MemStats memory() const override { return cu::DeviceAllocator::global().stats(); }
  void reset_peaks() override { cu::DeviceAllocator::global().reset_peaks(); }
  void synchronize() override { cu::synchronize(); }

 private:
  float* state(const std::string& name) {
    if (name == "exp_avg") return m_.as<float>();
    if (name == "exp_avg_sq") return v_.as<float>();
    throw Error(ErrorKind::kInvalidArgument, "the cuda AdamW has no state '" + name + "'");
  }
  const float* mf(size_t off) const { return master_.as<float>() + off; }  // f32 master (norms, biases)
  float* gf(size_t off) const { return grad_.as<float>() + off; }
  const void* wc(size_t off) const {  // compute copy of a matrix
    return static_cast<const char*>(compute()) + off * es_;
  }
  // A bias for a GEMM whose output is in cd: the compute copy's (bf16) with a bf16 output.
  const float* bias_cd(size_t off) const {
    return cd_ == DType::kF32 ? mf(off) : static_cast<const float*>(wc(off));
  }
  const void* compute() const { return cd_ == DType::kF32 ? master_.data() : compute_.data(); }
  void* at(void* base, size_t elems) const { return static_cast<char*>(base) + elems * es_; }
  void trunk_forward();
  void block_forward(int l, float* y, const float* x, Acts& a);
  void block_backward(int l, const float* x, const Acts& a);
  Acts& acts_for(int l) { return acts_[recompute_ ? 0 : l]; }
  const void* as_cd(const float* x, size_t n);  // x in cd (a conversion into scratch unless f32)
  // GPT-2's LayerNorm backwards write dres's cd copy into dy_c_ (none needed in f32).
  void* dres_copy() const { return cd_ == DType::kF32 ? nullptr : dy_c_; }
  const void* dres_cd() const { return cd_ == DType::kF32 ? static_cast<const void*>(dres_) : dy_c_; }
  // Each parameter's group by name (-1: the embeddings, l: layer l, L: the final norm and head);
  // the layers' starts if the groups are in that order in the flat buffer, else none.
  std::vector<size_t> layer_starts() const {
    const int L = cfg_.n_layer;
    const std::string layer_prefix = gpt2_ ? "transformer.h." : "model.layers.";
    std::vector<std::pair<size_t, int>> at;  // (offset, group)
    for (const nn::Parameter* p : store_.parameters()) {
      int group = L;
      if (p->name.rfind(layer_prefix, 0) == 0) group = std::atoi(p->name.c_str() + layer_prefix.size());
      else if (p->offset == wte_ || (gpt2_ && p->offset == wpe_)) group = -1;
      at.emplace_back(p->offset, group);
    }
    std::sort(at.begin(), at.end());
    std::vector<size_t> starts(static_cast<size_t>(L), P_);
    for (size_t i = 0; i < at.size(); ++i) {
      if (i > 0 && at[i].second < at[i - 1].second) return {};
      if (at[i].second >= 0 && at[i].second < L)
        starts[static_cast<size_t>(at[i].second)] = std::min(starts[static_cast<size_t>(at[i].second)], at[i].first);
    }
    return starts;
  }
  size_t offset(const std::string& name) const {
    nn::Parameter* p = store_.find(name);
    MT_CHECK(p != nullptr, ErrorKind::kInternal, "cuda model: no parameter " + name);
    return p->offset;
  }

  TransformerLM& model_;
  const ModelConfig cfg_;
  nn::ParamStore& store_;
  std::string name_;
  DType cd_;
  size_t es_, P_;
  bool gpt2_, recompute_;
  int B_, T_, N_, C_, NH_, NKV_, HS_, QKV_, A_, H_, G_, V_, Vp_, R_;
  size_t wte_ = 0, wpe_ = 0, nfw_ = 0, nfb_ = 0, head_ = 0;
  std::vector<LayerW> layers_;
  // The backward's ready ranges (set_grad_ready). layer_start_[l]: where layer l's parameters begin
  // in the flat buffer, when the layout is embeddings, layer 0 .. L-1, then the final norm (and an
  // untied head) with each layer's parameters inside its own span; empty otherwise (one range at
  // the end).
  std::function<void(size_t, size_t)> grad_ready_;
  std::vector<size_t> layer_start_;
  size_t ready_end_ = 0;  // the ranges reported in this backward begin here
  void report_ready(size_t from) {
    if (grad_ready_ && from < ready_end_) grad_ready_(from, ready_end_ - from);
    ready_end_ = std::min(ready_end_, from);
  }
  cu::DeviceBuffer master_, compute_, grad_, m_, v_;
  cu::DeviceBuffer acts_buf_, resid_buf_, scratch_buf_, head_buf_, io_buf_;
  // The LM head's weight in cd, padded with zero rows to Vp_: the logits and dL/dx GEMMs then run on
  // a vocabulary that is a multiple of 64 (cuBLASLt's fast kernels; 50257 columns ran 5x slower).
  cu::DeviceBuffer head_pad_, head_grad_pad_;
  void refresh_head() {
    cu::copy_on_device(head_pad_.data(), wc(head_), static_cast<size_t>(V_) * C_ * es_);
  }
  std::vector<Acts> acts_;
  float* resid_ = nullptr;
  float *nmean_ = nullptr, *nrstd_ = nullptr, *dnf_ = nullptr, *dres_ = nullptr, *losses_ = nullptr;
  void* nf_ = nullptr;
  float *rope_cos_ = nullptr, *rope_sin_ = nullptr;
  int32_t *tokens_ = nullptr, *targets_ = nullptr, *buckets_ = nullptr;
  int unique_tokens_ = 0;
  std::vector<int32_t> host_buckets_;
  void *dy_c_ = nullptr, *dact_ = nullptr, *dh_ = nullptr, *datt_ = nullptr, *dqkv_ = nullptr;
  float* dn_ = nullptr;
  float* fc_bgrad_ = nullptr;  // the dGELU epilogue's bias gradient, added to the gradient buffer
  // bf16 GPT-2: GELU and its gradient in cuBLASLt's epilogues (MT_CUDA_GELU_EPILOGUE=1; tanh GELU,
  // tested), or the kernels of ops.h (the default: 0.4 ms a GPT-2 124M step faster on an H200,
  // docs/PERF.md (k)).
  bool gelu_epilogue_ = false;
  void* logits_ = nullptr;  // (R_, Vp_) in cd; the gradient in place
  std::vector<float> host_losses_;
  bool backward_ready_ = false;
};

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

class Carve {
 public:
  explicit Carve(void* base) : base_(static_cast<char*>(base)) {}
  void* take(size_t bytes) {
    void* p = base_ ? base_ + used_ : nullptr;
    used_ += align256(bytes);
    return p;
  }
  float* f32(size_t n) { return static_cast<float*>(take(n * 4)); }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

CudaLM::CudaLM(TransformerLM& model)
    : model_(model), cfg_(model.config()), store_(model.store()), cd_(model.options().compute_dtype) {
  MT_CHECK(cu::available(), ErrorKind::kNotSupported, "device \"cuda\": no CUDA device is visible to this process");
  MT_CHECK(cd_ != DType::kF16, ErrorKind::kNotSupported,
           "device \"cuda\": fp16 is not implemented on the GPU; use bf16 (bf16.enabled) or fp32");
  MT_CHECK(!store_.released(), ErrorKind::kInternal, "cuda model: the host buffers were released");
  MT_CHECK(!cfg_.qkv_bias && !cfg_.o_bias, ErrorKind::kNotSupported,
           "device \"cuda\": attention biases (Qwen2, attention_bias) are not supported on the CUDA backend");
  name_ = cu::device_name();
  es_ = dtype_size(cd_);
  P_ = store_.numel();
  gpt2_ = cfg_.arch == Arch::kGpt2;
  recompute_ = model.options().recompute;
  {
    const char* e = std::getenv("MT_CUDA_GELU_EPILOGUE");
    gelu_epilogue_ = cd_ == DType::kBF16 && e != nullptr && std::string(e) == "1";
  }
  B_ = model.batch();
  T_ = model.seq();
  MT_CHECK(B_ > 0 && T_ > 0, ErrorKind::kInternal, "cuda model: prepare(B, T) the host model first");
  N_ = B_ * T_;
  C_ = cfg_.hidden;
  NH_ = cfg_.n_head;
  NKV_ = cfg_.n_kv_head;
  HS_ = cfg_.head_dim();
  QKV_ = (NH_ + 2 * NKV_) * HS_;
  A_ = NH_ * HS_;
  H_ = gpt2_ ? cfg_.intermediate : 2 * cfg_.intermediate;
  G_ = cfg_.intermediate;
  V_ = cfg_.vocab_size;
  Vp_ = (V_ + 63) / 64 * 64;

  // Parameters by their Hugging Face names (the host model's layout).
  std::string trunk = gpt2_ ? "transformer." : "model.";
  wte_ = offset(trunk + (gpt2_ ? "wte.weight" : "embed_tokens.weight"));
  if (gpt2_) wpe_ = offset("transformer.wpe.weight");
  for (int l = 0; l < cfg_.n_layer; ++l) {
    LayerW w;
    std::string p = trunk + (gpt2_ ? "h." : "layers.") + std::to_string(l) + ".";
    if (gpt2_) {
      w.bias = true;
      w.n1w = offset(p + "ln_1.weight"); w.n1b = offset(p + "ln_1.bias");
      w.qkvw = offset(p + "attn.c_attn.weight"); w.qkvb = offset(p + "attn.c_attn.bias");
      w.projw = offset(p + "attn.c_proj.weight"); w.projb = offset(p + "attn.c_proj.bias");
      w.n2w = offset(p + "ln_2.weight"); w.n2b = offset(p + "ln_2.bias");
      w.fcw = offset(p + "mlp.c_fc.weight"); w.fcb = offset(p + "mlp.c_fc.bias");
      w.outw = offset(p + "mlp.c_proj.weight"); w.outb = offset(p + "mlp.c_proj.bias");
    } else {
      w.n1w = offset(p + "input_layernorm.weight");
      w.qkvw = offset(p + "self_attn.q_proj.weight");  // q, k, v are consecutive: one (QKV, C) matrix
      w.projw = offset(p + "self_attn.o_proj.weight");
      w.n2w = offset(p + "post_attention_layernorm.weight");
      w.fcw = offset(p + "mlp.gate_proj.weight");  // gate, up consecutive: one (2I, C) matrix
      w.outw = offset(p + "mlp.down_proj.weight");
    }
    layers_.push_back(w);
  }
  if (gpt2_) {
    nfw_ = offset("transformer.ln_f.weight");
    nfb_ = offset("transformer.ln_f.bias");
  } else {
    nfw_ = offset("model.norm.weight");
  }
  head_ = cfg_.tie_embeddings ? wte_ : offset("lm_head.weight");
  layer_start_ = layer_starts();

  // Flat buffers, categories as the host ParamStore's.
  master_ = cu::DeviceBuffer(P_ * 4, cd_ == DType::kF32 ? MemCategory::kParams : MemCategory::kOptimizer);
  if (cd_ != DType::kF32) compute_ = cu::DeviceBuffer(P_ * es_, MemCategory::kParams);
  grad_ = cu::DeviceBuffer(P_ * 4, MemCategory::kGrads);
  m_ = cu::DeviceBuffer(P_ * 4, MemCategory::kOptimizer);
  v_ = cu::DeviceBuffer(P_ * 4, MemCategory::kOptimizer);
  head_pad_ = cu::DeviceBuffer(static_cast<size_t>(Vp_) * C_ * es_, MemCategory::kParams);  // zero-filled
  head_grad_pad_ = cu::DeviceBuffer(static_cast<size_t>(Vp_) * C_ * 4, MemCategory::kWorkspace);
  load_master(store_.master());

  // Saved activations: one set per block (one in all with recompute).
  const size_t N = N_;
  auto layout = [&](Acts* a, void* base) {
    Carve c(base);
    a->mean1 = gpt2_ ? c.f32(N) : nullptr;
    a->rstd1 = c.f32(N);
    a->n1 = c.take(N * C_ * es_);
    a->qkv = c.take(N * QKV_ * es_);
    a->att = c.take(N * A_ * es_);
    a->lse = c.f32(static_cast<size_t>(B_) * NH_ * T_);
    a->x2 = c.f32(N * C_);
    a->mean2 = gpt2_ ? c.f32(N) : nullptr;
    a->rstd2 = c.f32(N);
    a->n2 = c.take(N * C_ * es_);
    a->h = c.take(N * H_ * es_);
    a->act = c.take(N * G_ * es_);
    return c.used();
  };
  int sets = recompute_ ? 1 : cfg_.n_layer;
  acts_.assign(sets, Acts{});
  size_t per = layout(&acts_[0], nullptr);
  acts_buf_ = cu::DeviceBuffer(per * sets, MemCategory::kActivations);
  for (int i = 0; i < sets; ++i) layout(&acts_[i], acts_buf_.as<char>() + per * i);

  {
    Carve c(nullptr);
    for (int pass = 0; pass < 2; ++pass) {
      c = Carve(pass ? resid_buf_.data() : nullptr);
      resid_ = c.f32(static_cast<size_t>(cfg_.n_layer + 1) * N * C_);
      nmean_ = c.f32(N);
      nrstd_ = c.f32(N);
      nf_ = c.take(N * C_ * es_);
      dnf_ = c.f32(N * C_);
      dres_ = c.f32(N * C_);
      losses_ = c.f32(N);
      if (pass == 0) resid_buf_ = cu::DeviceBuffer(c.used(), MemCategory::kActivations);
    }
    for (int pass = 0; pass < 2; ++pass) {
      c = Carve(pass ? scratch_buf_.data() : nullptr);
      dy_c_ = c.take(N * C_ * es_);
      dact_ = c.take(N * G_ * es_);
      dh_ = c.take(N * H_ * es_);
      datt_ = c.take(N * A_ * es_);
      dqkv_ = c.take(N * QKV_ * es_);
      dn_ = c.f32(N * C_);
      fc_bgrad_ = c.f32(static_cast<size_t>(G_));
      rope_cos_ = c.f32(static_cast<size_t>(T_) * (HS_ / 2));
      rope_sin_ = c.f32(static_cast<size_t>(T_) * (HS_ / 2));
      if (pass == 0) scratch_buf_ = cu::DeviceBuffer(c.used(), MemCategory::kWorkspace);
    }
    // LM head tiles: logits of at most 1 GiB, equal tiles. The logits are in cd, as PyTorch's
    // autocast makes them (a bf16 GEMM output; the cross-entropy's arithmetic is f32), and the
    // cross-entropy writes the gradient over them.
    size_t budget = std::max<size_t>(1, (size_t{1} << 30) / (es_ * static_cast<size_t>(Vp_)));
    size_t tiles = (N + budget - 1) / budget;
    R_ = static_cast<int>((N + tiles - 1) / tiles);
    for (int pass = 0; pass < 2; ++pass) {
      c = Carve(pass ? head_buf_.data() : nullptr);
      logits_ = c.take(static_cast<size_t>(R_) * Vp_ * es_);
      if (pass == 0) head_buf_ = cu::DeviceBuffer(c.used(), MemCategory::kWorkspace);
    }
    for (int pass = 0; pass < 2; ++pass) {
      c = Carve(pass ? io_buf_.data() : nullptr);
      tokens_ = static_cast<int32_t*>(c.take(N * 4));
      targets_ = static_cast<int32_t*>(c.take(N * 4));
      buckets_ = static_cast<int32_t*>(c.take((3 * N + 1) * 4));  // embedding_buckets: at most 3N + 1
      if (pass == 0) io_buf_ = cu::DeviceBuffer(c.used(), MemCategory::kActivations);
    }
  }
  if (!gpt2_) {
    std::vector<float> cs(static_cast<size_t>(T_) * (HS_ / 2)), sn(cs.size());
    rope_tables(cfg_, cs.data(), sn.data(), T_);
    cu::copy_to_device(rope_cos_, cs.data(), cs.size() * 4);
    cu::copy_to_device(rope_sin_, sn.data(), sn.size() * 4);
  }
  host_losses_.resize(N);
  cu::synchronize();
}

void CudaLM::load_master(const float* host) {
  cu::copy_to_device(master_.data(), host, P_ * 4);
  if (cd_ != DType::kF32) cu::convert(compute_.data(), cd_, master_.data(), DType::kF32, P_);
  refresh_head();
}

const void* CudaLM::as_cd(const float* x, size_t n) {
  if (cd_ == DType::kF32) return x;
  MT_PROF("bwd convert", cu::convert(dy_c_, cd_, x, DType::kF32, n));
  return dy_c_;
}

void CudaLM::block_forward(int l, float* y, const float* x, Acts& a) {
  const LayerW& w = layers_[l];
  const int N = N_, C = C_;
  const DType cd = cd_;
  const float eps = cfg_.norm_eps;
  if (gpt2_) {
    MT_PROF("fwd layernorm_forward", cu::layernorm_forward(a.n1, cd, a.mean1, a.rstd1, x, mf(w.n1w), mf(w.n1b), N, C, eps));
    MT_PROF("fwd gemm NxQKVxC", cu::gemm(N, QKV_, C, a.n1, C, false, wc(w.qkvw), QKV_, false, a.qkv, QKV_, cd, cd, false, bias_cd(w.qkvb),
                                          nullptr, cd));
  } else {
    MT_PROF("fwd rmsnorm_forward", cu::rmsnorm_forward(a.n1, cd, a.rstd1, x, mf(w.n1w), N, C, eps));
    MT_PROF("fwd gemm NxQKVxC", cu::gemm(N, QKV_, C, a.n1, C, false, wc(w.qkvw), C, true, a.qkv, QKV_, cd, cd, false));
    MT_PROF("fwd rope_forward", cu::rope_forward(a.qkv, cd, rope_cos_, rope_sin_, B_, T_, NH_, NKV_, HS_));
  }
  MT_PROF("fwd attention_forward", cu::attention_forward(a.att, a.lse, a.qkv, cd, B_, T_, NH_, NKV_, HS_));
  // x2 = x + att W_o (+ b): the residual add fused into the GEMM.
  if (gpt2_) {
    MT_PROF("fwd gemm NxCxA", cu::gemm(N, C, A_, a.att, A_, false, wc(w.projw), C, false, a.x2, C, cd, DType::kF32, false, mf(w.projb), x));
    MT_PROF("fwd layernorm_forward", cu::layernorm_forward(a.n2, cd, a.mean2, a.rstd2, a.x2, mf(w.n2w), mf(w.n2b), N, C, eps));
    if (gelu_epilogue_) {  // GELU in the GEMM's epilogue: h is its pre-activation, act its output
      cu::GemmOp op;
      op.M = N; op.N = H_; op.K = C;
      op.a = a.n2; op.lda = C; op.b = wc(w.fcw); op.ldb = H_;
      op.d = a.act; op.ldd = H_; op.ab_type = cd; op.d_type = cd;
      op.bias = bias_cd(w.fcb); op.bias_type = cd;
      op.epilogue = cu::Epilogue::kGelu; op.aux = a.h; op.ldaux = H_;
      MT_PROF("fwd gemm+gelu NxHxC", cu::gemm(op));
    } else {
      MT_PROF("fwd gemm NxHxC", cu::gemm(N, H_, C, a.n2, C, false, wc(w.fcw), H_, false, a.h, H_, cd, cd, false,
                                          bias_cd(w.fcb), nullptr, cd));
      MT_PROF("fwd gelu_forward", cu::gelu_forward(a.act, a.h, cd, static_cast<size_t>(N) * G_));
    }
    MT_PROF("fwd gemm NxCxG", cu::gemm(N, C, G_, a.act, G_, false, wc(w.outw), C, false, y, C, cd, DType::kF32, false, mf(w.outb), a.x2));
  } else {
    MT_PROF("fwd gemm NxCxA", cu::gemm(N, C, A_, a.att, A_, false, wc(w.projw), A_, true, a.x2, C, cd, DType::kF32, false, nullptr, x));
    MT_PROF("fwd rmsnorm_forward", cu::rmsnorm_forward(a.n2, cd, a.rstd2, a.x2, mf(w.n2w), N, C, eps));
    MT_PROF("fwd gemm NxHxC", cu::gemm(N, H_, C, a.n2, C, false, wc(w.fcw), C, true, a.h, H_, cd, cd, false));
    MT_PROF("fwd swiglu_forward", cu::swiglu_forward(a.act, a.h, cd, N, G_));
    MT_PROF("fwd gemm NxCxG", cu::gemm(N, C, G_, a.act, G_, false, wc(w.outw), G_, true, y, C, cd, DType::kF32, false, nullptr, a.x2));
  }
}

void CudaLM::block_backward(int l, const float* x, const Acts& a) {
  const LayerW& w = layers_[l];
  const int N = N_, C = C_;
  const DType cd = cd_, f32 = DType::kF32;
  // MLP. dres = dL/dy. GPT-2: the LayerNorm backward above left dres's copy in cd (dy_c_) and
  // added dres's column sums into this block's output bias gradient.
  const void* dy = gpt2_ ? dres_cd() : as_cd(dres_, static_cast<size_t>(N) * C);
  if (gpt2_) {
    if (gelu_epilogue_) {  // dGELU and the fc bias gradient in the GEMM's epilogue
      cu::GemmOp op;
      op.M = N; op.N = G_; op.K = C;
      op.a = dy; op.lda = C; op.b = wc(w.outw); op.ldb = C; op.trans_b = true;
      op.d = dh_; op.ldd = G_; op.ab_type = cd; op.d_type = cd;
      op.epilogue = cu::Epilogue::kDGelu; op.aux = a.h; op.ldaux = G_; op.bgrad = fc_bgrad_;
      MT_PROF("bwd gemm+dgelu NxGxC", cu::gemm(op));
      MT_PROF("bwd add fc bias grad", cu::add_inplace(gf(w.fcb), fc_bgrad_, static_cast<size_t>(G_)));
    } else {
      MT_PROF("bwd gemm NxGxC", cu::gemm(N, G_, C, dy, C, false, wc(w.outw), C, true, dact_, G_, cd, cd, false));
      MT_PROF("bwd gelu_backward", cu::gelu_backward_bias(dh_, gf(w.fcb), a.h, dact_, cd, N, G_));
    }
    MT_PROF("bwd gemm GxCxN", cu::gemm(G_, C, N, a.act, G_, true, dy, C, false, gf(w.outw), C, cd, f32, true));
    MT_PROF("bwd gemm NxCxH", cu::gemm(N, C, H_, dh_, H_, false, wc(w.fcw), H_, true, dn_, C, cd, f32, false));
    MT_PROF("bwd gemm CxHxN", cu::gemm(C, H_, N, a.n2, C, true, dh_, H_, false, gf(w.fcw), H_, cd, f32, true));
    MT_PROF("bwd layernorm_backward", cu::layernorm_backward(dres_, gf(w.n2w), gf(w.n2b), dn_, a.x2, mf(w.n2w), a.mean2, a.rstd2, N, C,
                                                             dres_copy(), cd, gf(w.projb)));
  } else {
    MT_PROF("bwd gemm NxGxC", cu::gemm(N, G_, C, dy, C, false, wc(w.outw), G_, false, dact_, G_, cd, cd, false));
    MT_PROF("bwd gemm CxGxN", cu::gemm(C, G_, N, dy, C, true, a.act, G_, false, gf(w.outw), G_, cd, f32, true));
    MT_PROF("bwd swiglu_backward", cu::swiglu_backward(dh_, dact_, a.h, cd, N, G_));
    MT_PROF("bwd gemm NxCxH", cu::gemm(N, C, H_, dh_, H_, false, wc(w.fcw), C, false, dn_, C, cd, f32, false));
    MT_PROF("bwd gemm HxCxN", cu::gemm(H_, C, N, dh_, H_, true, a.n2, C, false, gf(w.fcw), C, cd, f32, true));
    MT_PROF("bwd rmsnorm_backward", cu::rmsnorm_backward(dres_, gf(w.n2w), dn_, a.x2, mf(w.n2w), a.rstd2, N, C));
  }
  // Attention. dres = dL/dx2 (GPT-2: copy and projection bias gradient from the LayerNorm backward).
  dy = gpt2_ ? dres_cd() : as_cd(dres_, static_cast<size_t>(N) * C);
  if (gpt2_) {
    MT_PROF("bwd gemm NxAxC", cu::gemm(N, A_, C, dy, C, false, wc(w.projw), C, true, datt_, A_, cd, cd, false));
    MT_PROF("bwd gemm AxCxN", cu::gemm(A_, C, N, a.att, A_, true, dy, C, false, gf(w.projw), C, cd, f32, true));
  } else {
    MT_PROF("bwd gemm NxAxC", cu::gemm(N, A_, C, dy, C, false, wc(w.projw), A_, false, datt_, A_, cd, cd, false));
    MT_PROF("bwd gemm CxAxN", cu::gemm(C, A_, N, dy, C, true, a.att, A_, false, gf(w.projw), A_, cd, f32, true));
  }
  MT_PROF("bwd attention_backward", cu::attention_backward(dqkv_, datt_, a.qkv, a.att, a.lse, cd, B_, T_, NH_, NKV_, HS_));
  if (gpt2_) {
    MT_PROF("bwd gemm NxCxQKV", cu::gemm(N, C, QKV_, dqkv_, QKV_, false, wc(w.qkvw), QKV_, true, dn_, C, cd, f32, false));
    MT_PROF("bwd gemm CxQKVxN", cu::gemm(C, QKV_, N, a.n1, C, true, dqkv_, QKV_, false, gf(w.qkvw), QKV_, cd, f32, true));
    MT_PROF("bwd bias_backward", cu::bias_backward(gf(w.qkvb), dqkv_, cd, N, QKV_));
    MT_PROF("bwd layernorm_backward", cu::layernorm_backward(dres_, gf(w.n1w), gf(w.n1b), dn_, x, mf(w.n1w), a.mean1, a.rstd1, N, C,
                                                             dres_copy(), cd, l > 0 ? gf(layers_[l - 1].outb) : nullptr));
  } else {
    MT_PROF("bwd rope_backward", cu::rope_backward(dqkv_, cd, rope_cos_, rope_sin_, B_, T_, NH_, NKV_, HS_));
    MT_PROF("bwd gemm NxCxQKV", cu::gemm(N, C, QKV_, dqkv_, QKV_, false, wc(w.qkvw), C, false, dn_, C, cd, f32, false));
    MT_PROF("bwd gemm QKVxCxN", cu::gemm(QKV_, C, N, dqkv_, QKV_, true, a.n1, C, false, gf(w.qkvw), C, cd, f32, true));
    MT_PROF("bwd rmsnorm_backward", cu::rmsnorm_backward(dres_, gf(w.n1w), dn_, x, mf(w.n1w), a.rstd1, N, C));
  }
}

void CudaLM::trunk_forward() {
  const size_t NC = static_cast<size_t>(N_) * C_;
  MT_PROF("fwd embedding_forward", cu::embedding_forward(resid_, tokens_, wc(wte_), cd_, gpt2_ ? mf(wpe_) : nullptr, N_, T_, C_));
  for (int l = 0; l < cfg_.n_layer; ++l) block_forward(l, resid_ + (l + 1) * NC, resid_ + l * NC, acts_for(l));
  const float* last = resid_ + cfg_.n_layer * NC;
  if (gpt2_) {
    MT_PROF("fwd layernorm_forward", cu::layernorm_forward(nf_, cd_, nmean_, nrstd_, last, mf(nfw_), mf(nfb_), N_, C_, cfg_.norm_eps));
  } else {
    MT_PROF("fwd rmsnorm_forward", cu::rmsnorm_forward(nf_, cd_, nrstd_, last, mf(nfw_), N_, C_, cfg_.norm_eps));
  }
}

float CudaLM::forward(const int32_t* tokens, const int32_t* targets, float loss_scale) {
  for (int i = 0; i < N_; ++i)
    MT_CHECK(tokens[i] >= 0 && tokens[i] < V_, ErrorKind::kInvalidArgument,
             "token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                 " is outside the vocabulary [0, " + std::to_string(V_) + ")");
  backward_ready_ = false;
  cu::copy_to_device(tokens_, tokens, static_cast<size_t>(N_) * 4);
  unique_tokens_ = cu::embedding_buckets(tokens, N_, V_, host_buckets_);
  cu::copy_to_device(buckets_, host_buckets_.data(), host_buckets_.size() * 4);
  trunk_forward();
  if (targets == nullptr) return 0.0f;
  int count = 0;
  for (int i = 0; i < N_; ++i) {
    MT_CHECK(targets[i] == -100 || (targets[i] >= 0 && targets[i] < V_), ErrorKind::kInvalidArgument,
             "target " + std::to_string(targets[i]) + " at position " + std::to_string(i) +
                 " is outside the vocabulary (and not -100)");
    count += targets[i] != -100;
  }
  cu::copy_to_device(targets_, targets, static_cast<size_t>(N_) * 4);
  const float grad_scale = count > 0 ? loss_scale / static_cast<float>(count) : 0.0f;
  const bool train = loss_scale != 0.0f;
  // The LM head fused with the cross-entropy, tile by tile; with a loss scale it also produces
  // dL/d(final norm output) and accumulates the head's weight gradient.
  for (int r0 = 0; r0 < N_; r0 += R_) {
    int r = std::min(R_, N_ - r0);
    const void* x = at(nf_, static_cast<size_t>(r0) * C_);
    MT_PROF("head gemm logits", cu::gemm(r, Vp_, C_, x, C_, false, head_pad_.data(), C_, true, logits_, Vp_, cd_, cd_, false));
    MT_PROF("head cross_entropy_tile", cu::cross_entropy_tile(losses_ + r0, nullptr, logits_, cd_, Vp_, targets_ + r0, r, V_,
                                                              train ? grad_scale : 0.0f, logits_, cd_, Vp_));
    if (!train) continue;
    MT_PROF("head gemm dx", cu::gemm(r, C_, Vp_, logits_, Vp_, false, head_pad_.data(), C_, false, dnf_ + static_cast<size_t>(r0) * C_, C_, cd_,
             DType::kF32, false));
    // The head's weight gradient over the padded vocabulary (as fast as the logits GEMM; 50257 rows
    // ran at 460 TFLOP/s), summed over the tiles, then added to the gradient buffer once.
    MT_PROF("head gemm dW", cu::gemm(Vp_, C_, r, logits_, Vp_, true, x, C_, false, head_grad_pad_.data(), C_, cd_,
                                     DType::kF32, r0 > 0));
  }
  if (train)
    MT_PROF("head add dW", cu::add_inplace(gf(head_), head_grad_pad_.as<float>(), static_cast<size_t>(V_) * C_));
  cu::copy_to_host(host_losses_.data(), losses_, static_cast<size_t>(N_) * 4);
  double total = 0.0;
  for (float v : host_losses_) total += v;
  backward_ready_ = train;
  if (count == 0) {
    if (train) cu::fill_zero(dnf_, static_cast<size_t>(N_) * C_ * 4);
    return 0.0f;
  }
  return static_cast<float>(total / count);
}

void CudaLM::backward() {
  MT_CHECK(backward_ready_, ErrorKind::kInvalidArgument,
           "backward() needs a preceding forward() with targets and a non-zero loss scale");
  backward_ready_ = false;
  const size_t NC = static_cast<size_t>(N_) * C_;
  cu::fill_zero(dres_, NC * 4);
  const float* last = resid_ + cfg_.n_layer * NC;
  ready_end_ = P_;
  if (gpt2_) {
    MT_PROF("bwd layernorm_backward", cu::layernorm_backward(dres_, gf(nfw_), gf(nfb_), dnf_, last, mf(nfw_), nmean_, nrstd_, N_, C_,
                                                             dres_copy(), cd_, gf(layers_.back().outb)));
  } else {
    MT_PROF("bwd rmsnorm_backward", cu::rmsnorm_backward(dres_, gf(nfw_), dnf_, last, mf(nfw_), nrstd_, N_, C_));
  }
  // Layer l's gradients are final after its backward (GPT-2's last bias gradient of layer l comes
  // from the norm backward above it); the final norm's and an untied head's (added in forward())
  // are final now.
  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    if (recompute_) block_forward(l, dn_ /* unused output */, resid_ + l * NC, acts_for(l));
    block_backward(l, resid_ + l * NC, acts_for(l));
    if (!layer_start_.empty()) report_ready(layer_start_[static_cast<size_t>(l)]);
  }
  MT_PROF("bwd embedding_backward", cu::embedding_backward(gf(wte_), gpt2_ ? gf(wpe_) : nullptr, dres_, buckets_, unique_tokens_, N_, T_,
                                                           C_));
  report_ready(0);
}

void CudaLM::adamw_step(const std::vector<optim::ParamSegment>& segments, kernels::AdamWParams params) {
  // One launch per maximal run of equal weight decay (as the CPU AdamW).
  size_t i = 0;
  while (i < segments.size()) {
    size_t j = i + 1;
    size_t end = segments[i].offset + segments[i].numel;
    while (j < segments.size() && segments[j].weight_decay == segments[i].weight_decay &&
           segments[j].offset == end) {
      end += segments[j].numel;
      ++j;
    }
    size_t off = segments[i].offset, n = end - off;
    params.weight_decay = segments[i].weight_decay;
    void* lowp = cd_ == DType::kF32 ? nullptr : at(compute_.data(), off);
    MT_PROF("opt adamw_update", cu::adamw_update(master_.as<float>() + off, grad_.as<float>() + off, m_.as<float>() + off, v_.as<float>() + off,
                     lowp, cd_, n, params));
    i = j;
  }
  refresh_head();
}

}  // namespace

bool cuda_built() { return true; }

std::unique_ptr<DeviceLM> make_cuda_lm(TransformerLM& model) { return std::make_unique<CudaLM>(model); }

int cuda_select_device() { return cu::select_device(cu::local_rank()); }

void* cuda_stream() { return cu::stream(); }
void* cuda_comm_stream() { return cu::comm_stream(); }
void cuda_comm_waits_for_compute() { cu::comm_waits_for_compute(); }
void cuda_compute_waits_for_comm() { cu::compute_waits_for_comm(); }

void cuda_set_profiling(bool on) { cu::set_profiling(on); }

std::vector<DeviceOpTime> cuda_profile_report() {
  std::vector<DeviceOpTime> out;
  for (const cu::ProfEntry& e : cu::profile_report()) out.push_back({e.name, e.ms, e.calls});
  return out;
}

std::vector<std::pair<std::string, double>> cuda_gemm_probe(int M, int N, int K) { return cu::gemm_probe(M, N, K); }

DeviceCeilings cuda_ceilings() {
  cu::Ceilings c = cu::measure_ceilings();
  return {c.bf16_gemm_tflops, c.copy_gbps};
}

}  // namespace mt::models
