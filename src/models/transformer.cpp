#include "models/transformer.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/ops.h"
#include "nn/lm_head.h"
#include "nn/norm.h"

namespace mt::models {

int TransformerLM::padded_vocab() const { return models::padded_vocab(cfg_, tp_.size(), opts_.vocab_divisible); }

TransformerLM::TransformerLM(const ModelConfig& cfg, const ModelOptions& opts)
    : Module(""), cfg_(cfg), opts_(opts) {
  cfg_.validate();
  if (opts.parallel) tp_ = parallel::TpComm(opts.parallel->groups.tp, opts.parallel->timeout);
  const int tp = tp_.size();
  bool gpt2 = cfg.arch == Arch::kGpt2;
  if (tp > 1) {
    auto need = [&](int v, const char* gpt2_key, const char* llama_key) {
      MT_CHECK(v % tp == 0, ErrorKind::kInvalidArgument,
               std::string("model.") + (gpt2 ? gpt2_key : llama_key) + " (" + std::to_string(v) +
                   ") is not divisible by parallel.tp (" + std::to_string(tp) + "): Megatron's split gives each rank whole heads and equal MLP slices");
    };
    need(cfg.n_head, "n_head", "num_attention_heads");
    need(cfg.n_kv_head, "n_head", "num_key_value_heads");
    need(cfg.intermediate, "n_inner", "intermediate_size");
    MT_CHECK(opts.vocab_divisible >= 1, ErrorKind::kInvalidArgument, "parallel.make_vocab_size_divisible_by must be >= 1");
  }
  int C = cfg.hidden;
  const nn::TpPlace place{tp_.rank(), tp};
  auto* trunk = add_module(std::make_unique<nn::Container>(gpt2 ? "transformer" : "model"));
  wte_ = trunk->add_module(std::make_unique<nn::Embedding>(gpt2 ? "wte" : "embed_tokens", cfg.vocab_size, C, true, cfg.init_std, place, padded_vocab()));
  if (gpt2) wpe_ = trunk->add_module(std::make_unique<nn::Embedding>("wpe", cfg.max_positions, C, false, cfg.init_std));
  // Blocks sit under "transformer" / "model" with local names "h.i" / "layers.i".
  for (int l = 0; l < cfg.n_layer; ++l) blocks_.push_back(trunk->add_module(std::make_unique<Block>(cfg, l, tp_)));
  if (gpt2) {
    norm_f_ = trunk->add_module(std::make_unique<nn::LayerNorm>("ln_f", C, cfg.norm_eps));
  } else {
    norm_f_ = trunk->add_module(std::make_unique<nn::RMSNorm>("norm", C, cfg.norm_eps));
  }
  if (!cfg.tie_embeddings) lm_head_ = add_module(std::make_unique<nn::Embedding>("lm_head", cfg.vocab_size, C, true, cfg.init_std, place, padded_vocab()));
  finalize_names();
  store_ = std::make_unique<nn::ParamStore>(*this, opts.compute_dtype);
  store_->init(opts.seed);
}

void TransformerLM::prepare(int B, int T) {
  MT_CHECK(B > 0 && T > 0, ErrorKind::kInvalidArgument, "batch and sequence length must be positive");
  MT_CHECK(cfg_.arch != Arch::kGpt2 || T <= cfg_.max_positions, ErrorKind::kInvalidArgument,
           "sequence length " + std::to_string(T) + " exceeds n_positions " + std::to_string(cfg_.max_positions));
  if (B == dims_.B && T == dims_.T) return;
  int HS = cfg_.head_dim();
  bool gpt2 = cfg_.arch == Arch::kGpt2;
  BlockDims d;
  const int tp = tp_.size();
  d.B = B; d.T = T; d.N = B * T; d.C = cfg_.hidden; d.NH = cfg_.n_head / tp; d.NKV = cfg_.n_kv_head / tp; d.HS = HS;
  d.QKV = (d.NH + 2 * d.NKV) * HS; d.A = d.NH * HS;
  d.G = cfg_.intermediate / tp;
  d.H = gpt2 ? d.G : 2 * d.G;
  d.sp = tp > 1 && opts_.parallel && opts_.parallel->sequence_parallel;
  if (d.sp)
    MT_CHECK(d.N % tp == 0, ErrorKind::kInvalidArgument,
             "sequence parallelism splits the micro-batch's " + std::to_string(d.N) +
                 " tokens (train_micro_batch_size_per_gpu x seq_length) over parallel.tp = " + std::to_string(tp) +
                 ": they must divide evenly");
  d.Nl = d.sp ? d.N / tp : d.N;
  dims_ = d;
  DType cd = opts_.compute_dtype;
  size_t N = d.N, C = d.C, R = d.rows(), es = dtype_size(cd);

  int sets = opts_.recompute ? 1 : cfg_.n_layer;
  acts_.assign(sets, BlockActs{});
  size_t per = BlockActs::layout(&acts_[0], nullptr, d, cd, gpt2);
  acts_buffer_ = Buffer(per * sets, MemCategory::kActivations);
  for (int i = 0; i < sets; ++i) BlockActs::layout(&acts_[i], acts_buffer_.as<char>() + per * i, d, cd, gpt2);

  // Residual stream (L+1 copies), final norm, LM-head gradient, losses: saved activations too.
  // Under sequence parallelism the residual stream, the final norm and dres hold this rank's R
  // rows, and sp_full_ (N, C) receives rows gathered from the group.
  size_t resid_bytes = (cfg_.n_layer + 1) * R * C * 4;
  size_t tail = 2 * R * 4 + N * C * es + N * C * 4 + R * C * 4 + N * 4 + (d.sp ? N * C * 4 : 0);
  resid_buffer_ = Buffer(resid_bytes + tail + 64 * (d.sp ? 7 : 6), MemCategory::kActivations);
  char* p = resid_buffer_.as<char>();
  auto take = [&p](size_t bytes) { char* q = p; p += (bytes + 63) / 64 * 64; return q; };
  resid_ = reinterpret_cast<float*>(take(resid_bytes));
  norm_mean_ = reinterpret_cast<float*>(take(R * 4));
  norm_rstd_ = reinterpret_cast<float*>(take(R * 4));
  nfc_ = take(N * C * es);
  dnf_ = reinterpret_cast<float*>(take(N * C * 4));
  dres_ = reinterpret_cast<float*>(take(R * C * 4));
  sp_full_ = d.sp ? reinterpret_cast<float*>(take(N * C * 4)) : nullptr;
  losses_ = reinterpret_cast<float*>(take(N * 4));

  size_t scratch = BlockScratch::layout(&scratch_, nullptr, d);
  size_t rope = gpt2 ? 0 : 2 * static_cast<size_t>(T) * (HS / 2) * 4 + 128;
  scratch_buffer_ = Buffer(scratch + rope, MemCategory::kWorkspace);
  BlockScratch::layout(&scratch_, scratch_buffer_.as<char>(), d);
  if (!gpt2) {
    rope_cos_ = reinterpret_cast<float*>(scratch_buffer_.as<char>() + scratch);
    rope_sin_ = rope_cos_ + ((static_cast<size_t>(T) * (HS / 2) + 15) / 16 * 16);
    kernels::rope_table(rope_cos_, rope_sin_, T, HS, cfg_.rope_theta);
  }
  const bool vocab_parallel = tp_.size() > 1;  // + this shard's rows of the tokens
  tokens_buffer_ = Buffer((vocab_parallel ? 2 : 1) * N * 4, MemCategory::kActivations);
  tokens_ = tokens_buffer_.as<int32_t>();
  local_tokens_ = vocab_parallel ? tokens_ + N : nullptr;
  backward_ready_ = false;
}

void TransformerLM::forward_trunk(const int32_t* tokens) {
  const BlockDims& d = dims_;
  MT_CHECK(d.N > 0, ErrorKind::kInvalidArgument, "forward before prepare(B, T)");
  for (int i = 0; i < d.N; ++i)
    MT_CHECK(tokens[i] >= 0 && tokens[i] < cfg_.vocab_size, ErrorKind::kInvalidArgument,
             "token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                 " is outside the vocabulary [0, " + std::to_string(cfg_.vocab_size) + ")");
  std::memcpy(tokens_, tokens, static_cast<size_t>(d.N) * 4);
  size_t NC = static_cast<size_t>(d.N) * d.C, RC = static_cast<size_t>(d.rows()) * d.C;
  nn::Parameter* wte = wte_->weight();
  wte_->run_hooks(nn::HookPoint::kPreForward);
  if (tp_.size() == 1) {
    kernels::embedding_forward(resid_, tokens_, wte->compute, wte->compute_dtype,
                               wpe_ ? wpe_->weight()->master : nullptr, d.N, d.T, d.C);
  } else {
    // Vocabulary-parallel (Megatron's VocabParallelEmbedding): rows this shard does not hold are
    // zero; the all-reduce assembles the lookup; positions are added once, after it.
    const int v0 = wte_->first_row(), vl = wte_->local_rows();
    for (int i = 0; i < d.N; ++i) local_tokens_[i] = tokens_[i] >= v0 && tokens_[i] < v0 + vl ? tokens_[i] - v0 : -1;
    // Sequence parallel: reduce-scatter instead, each rank keeping its rows of the residual stream.
    if (d.sp) {
      kernels::embedding_forward(sp_full_, local_tokens_, wte->compute, wte->compute_dtype, nullptr, d.N, d.T, d.C);
      tp_.reduce_scatter_rows(resid_, sp_full_, static_cast<size_t>(d.Nl), static_cast<size_t>(d.C), "sp vocab embedding");
    } else {
      kernels::embedding_forward(resid_, local_tokens_, wte->compute, wte->compute_dtype, nullptr, d.N, d.T, d.C);
      tp_.all_reduce(resid_, NC, "tp vocab embedding");
    }
    if (wpe_) {
      const float* wpe = wpe_->weight()->master;
      const int r0 = d.sp ? tp_.rank() * d.Nl : 0;
#pragma omp parallel for schedule(static)
      for (int i = 0; i < d.rows(); ++i)
        for (int c = 0; c < d.C; ++c)
          resid_[static_cast<size_t>(i) * d.C + c] += wpe[static_cast<size_t>((r0 + i) % d.T) * d.C + c];
    }
  }
  wte_->run_hooks(nn::HookPoint::kPostForward);
  for (int l = 0; l < cfg_.n_layer; ++l)
    blocks_[l]->forward(resid_ + (l + 1) * RC, resid_ + l * RC, acts_for(l), scratch_, d, rope_cos_,
                        rope_sin_, ws_);
  DType cd = opts_.compute_dtype;
  const bool f32 = cd == DType::kF32;
  // The final norm's rows (this rank's under sequence parallelism, gathered for the LM head).
  float* nf = d.sp ? dnf_ : f32 ? static_cast<float*>(nfc_) : scratch_.f;
  const float* last = resid_ + cfg_.n_layer * RC;
  norm_f_->run_hooks(nn::HookPoint::kPreForward);
  if (cfg_.arch == Arch::kGpt2) {
    static_cast<nn::LayerNorm*>(norm_f_)->forward(nf, norm_mean_, norm_rstd_, last, d.rows());
  } else {
    static_cast<nn::RMSNorm*>(norm_f_)->forward(nf, norm_rstd_, last, d.rows());
  }
  norm_f_->run_hooks(nn::HookPoint::kPostForward);
  if (d.sp) {
    float* full = f32 ? static_cast<float*>(nfc_) : sp_full_;
    tp_.gather_rows(full, nf, static_cast<size_t>(d.Nl), static_cast<size_t>(d.C), "sp lm-head forward");
    nf = full;
  }
  if (nf != nfc_) convert(nfc_, cd, nf, DType::kF32, NC);
}

float TransformerLM::forward(const int32_t* tokens, const int32_t* targets, float loss_scale) {
  forward_trunk(tokens);
  backward_ready_ = false;
  if (targets == nullptr) return 0.0f;
  const BlockDims& d = dims_;
  int count = 0;
  for (int i = 0; i < d.N; ++i) {
    MT_CHECK(targets[i] == -100 || (targets[i] >= 0 && targets[i] < cfg_.vocab_size),
             ErrorKind::kInvalidArgument,
             "target " + std::to_string(targets[i]) + " at position " + std::to_string(i) +
                 " is outside the vocabulary (and not -100)");
    count += targets[i] != -100;
  }
  nn::Module* head_module = lm_head_ ? lm_head_ : wte_;
  // The fused head accumulates the head's gradient during forward when training.
  head_module->run_hooks(loss_scale != 0.0f ? nn::HookPoint::kPreBackward : nn::HookPoint::kPreForward);
  nn::Parameter* head = this->head();
  nn::LmHeadArgs a;
  a.x = nfc_;
  a.w = head->compute;
  a.dtype = head->compute_dtype;
  a.targets = targets;
  a.N = d.N; a.C = d.C; a.V = static_cast<int>(head->shape[0]);
  if (tp_.size() > 1) {  // vocabulary-parallel cross-entropy
    a.v0 = static_cast<int>(head->shape[0]) * tp_.rank();
    a.valid = std::max(0, std::min(a.V, cfg_.vocab_size - a.v0));
    a.reduce_max = [this](float* v, size_t n) { tp_.all_reduce_max(v, n, "tp cross-entropy max"); };
    a.reduce_sum = [this](float* v, size_t n) { tp_.all_reduce(v, n, "tp cross-entropy sum"); };
  }
  a.grad_scale = count > 0 ? loss_scale / static_cast<float>(count) : 0.0f;
  a.dx = dnf_;
  a.dw = head->grad;
  a.losses = losses_;
  double total = nn::lm_head_cross_entropy(a, ws_);
  // The head's input gradient is this vocabulary shard's part (copy-to region's backward): summed
  // over the group (sequence parallel: reduce-scattered, each rank keeping its rows in sp_full_).
  if (loss_scale != 0.0f) {
    if (d.sp) tp_.reduce_scatter_rows(sp_full_, dnf_, static_cast<size_t>(d.Nl), static_cast<size_t>(d.C), "sp lm-head backward");
    else tp_.all_reduce(dnf_, static_cast<size_t>(d.N) * d.C, "tp lm-head backward");
  }
  head_module->run_hooks(loss_scale != 0.0f ? nn::HookPoint::kPostBackward : nn::HookPoint::kPostForward);
  backward_ready_ = loss_scale != 0.0f;
  if (count == 0) {
    if (backward_ready_) std::memset(d.sp ? sp_full_ : dnf_, 0, static_cast<size_t>(d.rows()) * d.C * 4);
    return 0.0f;
  }
  return static_cast<float>(total / count);
}

void TransformerLM::backward() {
  MT_CHECK(backward_ready_, ErrorKind::kInvalidArgument,
           "backward() needs a preceding forward() with targets and a non-zero loss scale");
  backward_ready_ = false;
  const BlockDims& d = dims_;
  size_t RC = static_cast<size_t>(d.rows()) * d.C;
  std::memset(dres_, 0, RC * 4);
  const float* last = resid_ + cfg_.n_layer * RC;
  const float* dnf = d.sp ? sp_full_ : dnf_;
  norm_f_->run_hooks(nn::HookPoint::kPreBackward);
  norm_backward_sp(*norm_f_, tp_, d.sp, [&] {
    if (cfg_.arch == Arch::kGpt2) {
      static_cast<nn::LayerNorm*>(norm_f_)->backward(dres_, dnf, last, norm_mean_, norm_rstd_, d.rows());
    } else {
      static_cast<nn::RMSNorm*>(norm_f_)->backward(dres_, dnf, last, norm_rstd_, d.rows());
    }
  });
  norm_f_->run_hooks(nn::HookPoint::kPostBackward);
  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    if (opts_.recompute)
      blocks_[l]->forward(scratch_.dact /* unused output */, resid_ + l * RC, acts_for(l), scratch_,
                          d, rope_cos_, rope_sin_, ws_);
    blocks_[l]->backward(dres_, resid_ + l * RC, acts_for(l), scratch_, d, rope_cos_, rope_sin_, ws_);
  }
  wte_->run_hooks(nn::HookPoint::kPreBackward);
  const float* demb = dres_;
  if (d.sp) {  // the lookup's gradient needs every row: gathered from the group
    tp_.gather_rows(sp_full_, dres_, static_cast<size_t>(d.Nl), static_cast<size_t>(d.C), "sp embedding backward");
    demb = sp_full_;
  }
  kernels::embedding_backward(wte_->weight()->grad, wpe_ ? wpe_->weight()->grad : nullptr, demb,
                              tp_.size() == 1 ? tokens_ : local_tokens_, d.N, d.T, d.C);
  wte_->run_hooks(nn::HookPoint::kPostBackward);
}

std::vector<parallel::Unit> TransformerLM::zero_units() const {
  std::vector<parallel::Unit> units;
  auto add = [&units](std::string name, const std::vector<const nn::Parameter*>& ps) {
    parallel::Unit u;
    u.name = std::move(name);
    u.offset = ps.front()->offset;
    for (const nn::Parameter* p : ps) {
      u.numel += static_cast<size_t>(p->numel());
      if (p->is_matrix) u.matrix_numel += static_cast<size_t>(p->numel());
    }
    units.push_back(std::move(u));
  };
  const auto& all = store_->parameters();
  // Registration order: embeddings, blocks, final norm, untied head (see the constructor).
  size_t i = 0;
  std::vector<const nn::Parameter*> group;
  auto take_until = [&](size_t end_offset) {
    group.clear();
    while (i < all.size() && all[i]->offset < end_offset) group.push_back(all[i++]);
  };
  size_t P = store_->numel();
  std::vector<size_t> starts;  // first offset of each block
  for (Block* b : blocks_) {
    std::vector<nn::Parameter*> bp;
    b->collect_parameters(bp);
    starts.push_back(bp.front()->offset);
  }
  size_t tail = P;
  {
    std::vector<nn::Parameter*> np;
    norm_f_->collect_parameters(np);
    tail = np.front()->offset;
  }
  take_until(starts.empty() ? tail : starts[0]);
  add("embeddings", group);
  for (size_t l = 0; l < starts.size(); ++l) {
    take_until(l + 1 < starts.size() ? starts[l + 1] : tail);
    add("h." + std::to_string(l), group);
  }
  take_until(P);
  add("tail", group);
  return units;
}

std::vector<std::vector<nn::Module*>> TransformerLM::zero_unit_modules() {
  std::vector<std::vector<nn::Module*>> m;
  m.push_back({wte_});
  for (Block* b : blocks_) m.push_back({b});
  m.push_back({norm_f_});
  if (lm_head_) m.back().push_back(lm_head_);
  return m;
}

void TransformerLM::logits(float* out, const int32_t* tokens) {
  forward_trunk(tokens);
  backward_ready_ = false;
  nn::Module* head_module = lm_head_ ? lm_head_ : wte_;
  head_module->run_hooks(nn::HookPoint::kPreForward);
  nn::Parameter* head = this->head();
  if (tp_.size() == 1) {
    nn::lm_head_logits(out, nfc_, head->compute, head->compute_dtype, dims_.N, dims_.C, cfg_.vocab_size);
  } else {  // this shard's logits, gathered over the group; padding columns dropped
    const size_t N = static_cast<size_t>(dims_.N), vl = static_cast<size_t>(head->shape[0]), V = cfg_.vocab_size;
    std::vector<float> local(N * vl), all(N * vl * static_cast<size_t>(tp_.size()));
    nn::lm_head_logits(local.data(), nfc_, head->compute, head->compute_dtype, dims_.N, dims_.C, static_cast<int>(vl));
    tp_.gather_columns(all.data(), local.data(), N, vl, "tp logits");
    for (size_t i = 0; i < N; ++i) std::memcpy(out + i * V, all.data() + i * vl * tp_.size(), V * sizeof(float));
  }
  head_module->run_hooks(nn::HookPoint::kPostForward);
}

double TransformerLM::train_flops_per_step() const {
  // 6 FLOPs per parameter per token for the matmul weights (embedding lookups excluded, the tied
  // head included once as a matmul), plus attention: QK^T and PV, causal (half), forward 2*2*T*A
  // per token per layer halved, x3 for forward+backward.
  double tokens = static_cast<double>(dims_.N);
  double matmul_params = static_cast<double>(cfg_.num_params());
  if (cfg_.arch == Arch::kGpt2) matmul_params -= static_cast<double>(cfg_.max_positions) * cfg_.hidden;
  if (!cfg_.tie_embeddings) matmul_params -= static_cast<double>(cfg_.vocab_size) * cfg_.hidden;
  double attn = 6.0 * cfg_.n_layer * dims_.T * static_cast<double>(cfg_.n_head * cfg_.head_dim());
  return 6.0 * matmul_params * tokens + attn * tokens;
}

}  // namespace mt::models
