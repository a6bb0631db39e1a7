#include "models/transformer.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/ops.h"
#include "nn/lm_head.h"
#include "nn/norm.h"

namespace mt::models {

int TransformerLM::padded_vocab() const { return models::padded_vocab(cfg_, tp_.size(), opts_.vocab_divisible); }

namespace {

struct Parts {
  nn::Embedding* wte = nullptr;
  nn::Embedding* wpe = nullptr;
  std::vector<Block*> blocks;
  nn::Module* norm_f = nullptr;
  nn::Embedding* lm_head = nullptr;
};

// The modules of a stage under root, in the flat-buffer order: the token table (with the
// embedding, or as the tied head of a last stage), positions, the chunks' blocks in layer order,
// the final norm and the untied head (with the head).
using AddRoot = std::function<nn::Module*(std::unique_ptr<nn::Module>)>;

Parts add_modules(const AddRoot& root, const ModelConfig& cfg, parallel::TpComm& tp, int padded,
                  const std::vector<std::pair<int, int>>& chunks, bool embed, bool head) {
  Parts m;
  const bool gpt2 = cfg.arch == Arch::kGpt2;
  const int C = cfg.hidden;
  const nn::TpPlace place{tp.rank(), tp.size()};
  auto* trunk = static_cast<nn::Container*>(root(std::make_unique<nn::Container>(gpt2 ? "transformer" : "model")));
  const bool cls = cfg.num_labels > 0;  // a score head (num_labels, C) in place of the LM head
  if (embed || (head && head_is_token_table(cfg)))
    m.wte = trunk->add_module(std::make_unique<nn::Embedding>(gpt2 ? "wte" : "embed_tokens", cfg.vocab_size, C, true, cfg.init_std, place, padded));
  if (m.wte != nullptr) m.wte->set_padding_row(cfg.padding_idx);
  if (gpt2 && embed) m.wpe = trunk->add_module(std::make_unique<nn::Embedding>("wpe", cfg.max_positions, C, false, cfg.init_std));
  // Blocks sit under "transformer" / "model" with local names "h.i" / "layers.i" (i global).
  for (auto [lo, hi] : chunks)
    for (int l = lo; l < hi; ++l) m.blocks.push_back(trunk->add_module(std::make_unique<Block>(cfg, l, tp)));
  if (head) {
    if (gpt2) m.norm_f = trunk->add_module(std::make_unique<nn::LayerNorm>("ln_f", C, cfg.norm_eps));
    else m.norm_f = trunk->add_module(std::make_unique<nn::RMSNorm>("norm", C, cfg.norm_eps));
    // The score head is replicated over the tensor-parallel group (it is num_labels rows: a
    // vocabulary-parallel split would leave ranks without a label, and padded rows would enter the
    // softmax). Every rank computes the whole head on the same rows (gathered under sequence
    // parallelism), so its gradient is the same everywhere and its input gradient needs no sum.
    if (cls)
      m.lm_head = static_cast<nn::Embedding*>(root(std::make_unique<nn::Embedding>("score", cfg.num_labels, C, true, cfg.init_std)));
    else if (!cfg.tie_embeddings)
      m.lm_head = static_cast<nn::Embedding*>(root(std::make_unique<nn::Embedding>("lm_head", cfg.vocab_size, C, true, cfg.init_std, place, padded)));
  }
  return m;
}

}  // namespace

std::vector<ParamLayout> one_process_layout(const ModelConfig& cfg) {
  // The module tree of the whole model on one process, built without buffers.
  nn::Container whole("");
  parallel::TpComm one;
  add_modules([&whole](std::unique_ptr<nn::Module> mod) { return whole.add_module(std::move(mod)); }, cfg, one,
              cfg.vocab_size, {{0, cfg.n_layer}}, true, true);
  whole.finalize_names();
  std::vector<nn::Parameter*> all;
  whole.collect_parameters(all);
  std::vector<ParamLayout> out;
  size_t total = 0;
  for (nn::Parameter* p : all) {
    out.push_back({p->name, p->unpadded_shape(), total});
    total += static_cast<size_t>(p->global_numel());
  }
  return out;
}

TransformerLM::TransformerLM(const ModelConfig& cfg, const ModelOptions& opts)
    : Module(""), cfg_(cfg), opts_(opts) {
  cfg_.validate();
  if (opts.parallel) tp_ = parallel::TpComm(opts.parallel->groups.tp, opts.parallel->timeout);
  if (opts.parallel && opts.parallel->sp_group) sp_ = parallel::UlyssesComm(opts.parallel->sp_group, opts.parallel->timeout);
  const int tp = tp_.size();
  bool gpt2 = cfg.arch == Arch::kGpt2;
  if (sp_.size() > 1) {  // what Ulysses runs with so far (ds_config refuses the rest by key)
    const int sp = sp_.size();
    MT_CHECK(cfg.n_head % (sp * tp) == 0 && cfg.n_kv_head % (sp * tp) == 0, ErrorKind::kInvalidArgument,
             "parallel.sp (" + std::to_string(sp) + ") splits the attention heads" + (tp > 1 ? " of each tp rank" : "") + ": model." +
                 (gpt2 ? "n_head" : "num_attention_heads") + " (" + std::to_string(cfg.n_head) + ") and " +
                 (gpt2 ? "n_head" : "num_key_value_heads") + " (" + std::to_string(cfg.n_kv_head) + ") must be divisible by " +
                 (tp > 1 ? "parallel.tp x parallel.sp (" + std::to_string(sp * tp) + ")" : "it"));
  }
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
  // This rank's chunks of the pipeline.
  const auto& b = opts.pipeline_bounds;
  const int pp = opts.parallel ? opts.parallel->pp() : 1;
  if (b.empty()) {
    MT_CHECK(pp == 1, ErrorKind::kInternal, "a pipeline-parallel layout needs ModelOptions::pipeline_bounds");
    chunks_.push_back({0, cfg.n_layer});
  } else {
    const int S = static_cast<int>(b.size()) - 1, rank = opts.parallel ? opts.parallel->pp_rank() : 0;
    MT_CHECK(S >= pp && S % pp == 0 && b.front() == 0 && b.back() == cfg.n_layer, ErrorKind::kInternal,
             "pipeline_bounds do not cover the model's layers on a multiple of parallel.pp stages");
    for (int st = rank; st < S; st += pp) chunks_.push_back({b[st], b[st + 1]});
    embed_ = rank == 0;
    head_ = rank == pp - 1;
  }
  tied_copy_ = head_ && !embed_ && head_is_token_table(cfg);
  for (int c = 0, first = 0; c < chunks(); first += chunk_size(c++)) chunk_first_.push_back(first);
  Parts m = add_modules([this](std::unique_ptr<nn::Module> mod) { return add_module(std::move(mod)); }, cfg, tp_, padded_vocab(), chunks_, embed_, head_);
  wte_ = m.wte;
  wpe_ = m.wpe;
  blocks_ = m.blocks;
  norm_f_ = m.norm_f;
  lm_head_ = m.lm_head;
  finalize_names();
  store_ = std::make_unique<nn::ParamStore>(*this, opts.compute_dtype, !opts.deferred_init);
  if (!whole_model()) {
    // Offsets in the whole model's one-process layout (checkpoints, HF files): from the module
    // tree of the whole model, built without buffers.
    nn::Container whole("");
    parallel::TpComm one;
    add_modules([&whole](std::unique_ptr<nn::Module> mod) { return whole.add_module(std::move(mod)); }, cfg, one, cfg.vocab_size, {{0, cfg.n_layer}}, true, true);
    whole.finalize_names();
    std::vector<nn::Parameter*> all;
    whole.collect_parameters(all);
    std::map<std::string, size_t> offsets;
    size_t total = 0;
    for (nn::Parameter* p : all) {
      offsets[p->name] = total;
      total += static_cast<size_t>(p->global_numel());
    }
    store_->set_global_layout([&](const std::string& name) { return offsets.at(name); }, total);
  }
  if (!opts.deferred_init) store_->init(opts.seed);
}

void TransformerLM::prepare(int B, int T, int slots) {
  MT_CHECK(B > 0 && T > 0, ErrorKind::kInvalidArgument, "batch and sequence length must be positive");
  MT_CHECK(slots >= 1, ErrorKind::kInvalidArgument, "activation slots must be >= 1");
  MT_CHECK(cfg_.arch != Arch::kGpt2 || T <= cfg_.max_positions, ErrorKind::kInvalidArgument,
           "sequence length " + std::to_string(T) + " exceeds n_positions " + std::to_string(cfg_.max_positions));
  if (B == dims_.B && T == seq_ && slots == this->slots()) return;
  int HS = cfg_.head_dim();
  bool gpt2 = cfg_.arch == Arch::kGpt2;
  BlockDims d;
  const int tp = tp_.size(), usp = sp_.size();
  MT_CHECK(T % usp == 0, ErrorKind::kInvalidArgument,
           "parallel.sp (" + std::to_string(usp) + ") splits each sample's " + std::to_string(T) +
               " tokens (seq_length): they must divide evenly");
  const int Tg = T;
  T /= usp;  // this rank's tokens of each sample (all of them without Ulysses)
  d.B = B; d.T = T; d.N = B * T;
  d.usp = usp;
  d.ulysses = usp > 1 ? &sp_ : nullptr; d.C = cfg_.hidden; d.NH = cfg_.n_head / tp; d.NKV = cfg_.n_kv_head / tp; d.HS = HS;
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
  if (opts_.sparse_attention) {  // the layout of the whole model's heads; this rank plans its own
    // (Ulysses: of the whole samples, for the heads its attention computes: its sp-th of its tp
    // rank's.)
    kernels::SparsityConfig sc = *opts_.sparse_attention;
    sc.num_heads = cfg_.n_head;
    kernels::SparseLayout L = kernels::sparse_layout_for_length(sc, Tg);
    const size_t per_head = static_cast<size_t>(L.num_blocks) * static_cast<size_t>(L.num_blocks);
    const int heads = d.NH / usp, head0 = tp_.rank() * d.NH + sp_.rank() * heads;
    sparse_plan_ = std::make_shared<kernels::SparseAttentionPlan>(kernels::sparse_attention_plan(
        L.blocks.data() + static_cast<size_t>(head0) * per_head, heads, L.num_blocks, L.block, /*causal=*/true));
    d.sparse = sparse_plan_.get();
  }
  dims_ = d;
  seq_ = Tg;
  sp_pos_.clear();
  if (usp > 1)  // rank r holds tokens [r T, (r+1) T) of each sample
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) sp_pos_.push_back(sp_.rank() * T + t);
  DType cd = opts_.compute_dtype;
  size_t N = d.N, C = d.C, R = d.rows(), es = dtype_size(cd);

  // A buffer big enough for the new shape is kept (a classifier's steps cut to their longest record
  // go down and back up within the first shape's buffers: no block is mapped afresh and faulted in
  // each step); a smaller one is freed before its successor is made.
  auto fit = [](Buffer& b, size_t bytes, MemCategory category) {
    if (bytes > 0 && b.bytes() >= bytes) return;
    b = Buffer();
    b = Buffer(bytes, category);
  };
  int most_layers = 0;
  for (int c = 0; c < chunks(); ++c) most_layers = std::max(most_layers, chunk_size(c));
  size_t per = BlockActs::layout(&shared_acts_, nullptr, d, cd, gpt2);
  fit(shared_acts_buffer_, opts_.recompute ? per : 0, MemCategory::kActivations);
  if (opts_.recompute) BlockActs::layout(&shared_acts_, shared_acts_buffer_.as<char>(), d, cd, gpt2);

  // Per slot: the blocks' saved activations (without recompute), the residual stream (layers + 1
  // copies), and with the head the final norm, the LM-head gradient and the losses; with the
  // embedding the tokens. Under sequence parallelism the residual stream, the final norm and dres
  // hold this rank's R rows, and sp_full (N, C) receives rows gathered from the group.
  const bool vocab_parallel = tp > 1;
  slots_.resize(slots);
  for (Slot& s : slots_) {
    Buffer kept = std::move(s.buffer);  // every field afresh but the buffer
    s = Slot();
    s.buffer = std::move(kept);
    const size_t acts = opts_.recompute ? 0 : per * most_layers;
    const size_t resid = (most_layers + 1) * R * C * 4;
    const size_t head = head_ ? 2 * R * 4 + N * C * es + N * C * 4 + N * 4 + 4 * 64 : 0;
    const size_t full = d.sp ? N * C * 4 + 64 : 0;
    const size_t toks = embed_ ? (vocab_parallel ? 2 : 1) * N * 4 + 64 : 0;
    // Documents: each token's position and first key (Ulysses: every token's first key, as
    // attention sees all of them, and every token's position until this rank's are kept).
    const size_t docs = opts_.documents.on() ? (usp > 1 ? 2 * N * usp + N : 2 * N) * 4 + 64 : 0;
    const size_t sp_in = usp > 1 ? 2 * N * 4 + 64 : 0;
    fit(s.buffer, acts + resid + head + full + toks + docs + sp_in + 64, MemCategory::kActivations);
    char* p = s.buffer.as<char>();
    auto take = [&p](size_t bytes) { char* q = p; p += (bytes + 63) / 64 * 64; return q; };
    if (!opts_.recompute) {
      s.acts.assign(most_layers, BlockActs{});
      char* a = take(acts);
      for (int j = 0; j < most_layers; ++j) BlockActs::layout(&s.acts[j], a + per * j, d, cd, gpt2);
    }
    s.resid = reinterpret_cast<float*>(take(resid));
    if (head_) {
      s.norm_mean = reinterpret_cast<float*>(take(R * 4));
      s.norm_rstd = reinterpret_cast<float*>(take(R * 4));
      s.nfc = take(N * C * es);
      s.dnf = reinterpret_cast<float*>(take(N * C * 4));
      s.losses = reinterpret_cast<float*>(take(N * 4));
    }
    if (d.sp) s.sp_full = reinterpret_cast<float*>(take(N * C * 4));
    if (embed_) {
      s.tokens = reinterpret_cast<int32_t*>(take((vocab_parallel ? 2 : 1) * N * 4));
      s.local_tokens = vocab_parallel ? s.tokens + N : nullptr;
    }
    if (docs) {
      s.doc_pos = reinterpret_cast<int32_t*>(take((usp > 1 ? 2 * N * usp + N : 2 * N) * 4));
      s.doc_kstart = s.doc_pos + N;  // Ulysses: (B, usp T), then (B, usp T) positions
    }
    if (sp_in) s.sp_in = reinterpret_cast<int32_t*>(take(2 * N * 4));
  }
  fit(dres_buffer_, R * C * 4, MemCategory::kActivations);
  dres_ = dres_buffer_.as<float>();

  size_t scratch = BlockScratch::layout(&scratch_, nullptr, d, cd);
  size_t rope = gpt2 ? 0 : 2 * static_cast<size_t>(Tg) * (HS / 2) * 4 + 128;  // every position (Ulysses: all ranks')
  fit(scratch_buffer_, scratch + rope, MemCategory::kWorkspace);
  BlockScratch::layout(&scratch_, scratch_buffer_.as<char>(), d, cd);
  if (!gpt2) {
    rope_cos_ = reinterpret_cast<float*>(scratch_buffer_.as<char>() + scratch);
    rope_sin_ = rope_cos_ + ((static_cast<size_t>(Tg) * (HS / 2) + 15) / 16 * 16);
    rope_tables(cfg_, rope_cos_, rope_sin_, Tg);
  }
}

size_t TransformerLM::activation_bytes() const {
  size_t n = shared_acts_buffer_.bytes() + dres_buffer_.bytes();
  for (const Slot& s : slots_) n += s.buffer.bytes();
  return n;
}

float* TransformerLM::chunk_input(int slot) {
  MT_CHECK(slot >= 0 && slot < slots(), ErrorKind::kInternal, "activation slot out of range");
  return slots_[slot].resid;
}

const float* TransformerLM::chunk_output(int slot) const {
  const Slot& s = slots_[slot];
  MT_CHECK(s.chunk >= 0, ErrorKind::kInternal, "chunk_output of a slot without a forward");
  return s.resid + static_cast<size_t>(chunk_size(s.chunk)) * boundary_numel();
}

void TransformerLM::set_dropout_origin(uint64_t step, uint64_t sample0) {
  if (!has_dropout()) return;
  BlockDropout& o = drop_origin_;
  o.step_key = kernels::drop_step_key(opts_.seed, step);
  o.sample0 = sample0;
  o.embd = kernels::DropRate(cfg_.embd_pdrop);
  o.resid = kernels::DropRate(cfg_.resid_pdrop);
  o.attn = kernels::DropRate(cfg_.attn_pdrop);
  o.row0 = dims_.sp ? static_cast<size_t>(tp_.rank()) * static_cast<size_t>(dims_.Nl) : 0;
  // Ulysses: this rank's T of each sample's tokens outside attention, its NH/sp heads of all of
  // them inside.
  o.t0 = static_cast<size_t>(sp_.rank()) * static_cast<size_t>(dims_.T);
  o.head0 = tp_.rank() * dims_.NH + sp_.rank() * (dims_.NH / sp_.size());
  drop_next_ = true;
}

void TransformerLM::embed(Slot& s, const int32_t* tokens) {
  const BlockDims& d = dims_;
  for (int i = 0; i < d.N; ++i)
    MT_CHECK(tokens[i] >= 0 && tokens[i] < cfg_.vocab_size, ErrorKind::kInvalidArgument,
             "token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                 " is outside the vocabulary [0, " + std::to_string(cfg_.vocab_size) + ")");
  std::memcpy(s.tokens, tokens, static_cast<size_t>(d.N) * 4);
  size_t NC = static_cast<size_t>(d.N) * d.C;
  float* resid = s.resid;
  nn::Parameter* wte = wte_->weight();
  ProfileScope scope(prof_, pid_.embed);
  wte_->run_hooks(nn::HookPoint::kPreForward);
  if (tp_.size() == 1) {
    kernels::embedding_forward(resid, s.tokens, wte->compute, wte->compute_dtype,
                               wpe_ ? wpe_->weight()->master : nullptr, d.N, d.T, d.C, dims_of(s).pos);
  } else {
    // Vocabulary-parallel (Megatron's VocabParallelEmbedding): rows this shard does not hold are
    // zero; the all-reduce assembles the lookup; positions are added once, after it.
    const int v0 = wte_->first_row(), vl = wte_->local_rows();
    for (int i = 0; i < d.N; ++i) s.local_tokens[i] = s.tokens[i] >= v0 && s.tokens[i] < v0 + vl ? s.tokens[i] - v0 : -1;
    // Sequence parallel: reduce-scatter instead, each rank keeping its rows of the residual stream.
    if (d.sp) {
      kernels::embedding_forward(s.sp_full, s.local_tokens, wte->compute, wte->compute_dtype, nullptr, d.N, d.T, d.C);
      tp_.reduce_scatter_rows(resid, s.sp_full, static_cast<size_t>(d.Nl), static_cast<size_t>(d.C), "sp vocab embedding");
    } else {
      kernels::embedding_forward(resid, s.local_tokens, wte->compute, wte->compute_dtype, nullptr, d.N, d.T, d.C);
      tp_.all_reduce(resid, NC, "tp vocab embedding");
    }
    if (wpe_) {
      const float* wpe = wpe_->weight()->master;
      const int r0 = d.sp ? tp_.rank() * d.Nl : 0;
      const int32_t* pos = dims_of(s).pos;
#pragma omp parallel for schedule(static)
      for (int i = 0; i < d.rows(); ++i) {
        const size_t p = static_cast<size_t>(pos ? pos[r0 + i] : (r0 + i) % d.T);
        for (int c = 0; c < d.C; ++c) resid[static_cast<size_t>(i) * d.C + c] += wpe[p * d.C + c];
      }
    }
  }
  // GPT-2's embedding dropout (embd_pdrop) on the sum, as Hugging Face's transformer.drop.
  if (s.drop_on && s.drop.embd.active())
    kernels::dropout_rows(resid, static_cast<size_t>(d.rows()), d.C,
                          kernels::drop_site_key(s.drop.step_key, 0, kernels::kDropEmbedding), s.drop.embd, s.drop.sample0,
                          s.drop.row0, d.T, s.drop.t0);
  wte_->run_hooks(nn::HookPoint::kPostForward);
}

float TransformerLM::forward_chunk(int c, int slot, const int32_t* tokens, const int32_t* targets, float loss_scale) {
  const BlockDims& d = dims_;
  MT_CHECK(d.N > 0, ErrorKind::kInvalidArgument, "forward before prepare(B, T)");
  MT_CHECK(c >= 0 && c < chunks() && slot >= 0 && slot < slots(), ErrorKind::kInternal, "model chunk or activation slot out of range");
  Slot& s = slots_[slot];
  s.chunk = c;
  s.backward_ready = false;
  s.drop_on = drop_next_;  // set_dropout_origin holds for this forward only
  if (drop_next_) s.drop = drop_origin_;
  drop_next_ = false;
  if (prof_) prof_->set_phase(ProfilePhase::kForward);
  ProfileScope scope(prof_, pid_.root);
  if (opts_.documents.on()) {  // every chunk's attention (and RoPE) needs them: each stage has the tokens
    MT_CHECK(tokens != nullptr, ErrorKind::kInternal, "documents: a forward without its tokens");
    // Ulysses: the bounds of whole samples (attention sees all their tokens, for this rank's heads),
    // and this rank's share of the positions (RoPE and GPT-2's table read them outside attention).
    const int usp = sp_.size(), T = d.T, Tg = T * usp, r0 = sp_.rank() * T;
    int32_t* pos = usp > 1 ? s.doc_kstart + static_cast<size_t>(d.N) * usp : s.doc_pos;
    document_bounds(tokens, d.B, Tg, opts_.documents.eod, pos, s.doc_kstart);
    for (int b = 0; usp > 1 && b < d.B; ++b)
      std::memcpy(s.doc_pos + static_cast<size_t>(b) * T, pos + static_cast<size_t>(b) * Tg + r0, static_cast<size_t>(T) * 4);
    // The pairs of this rank's queries (Ulysses: its share of each sample's; the group sums them).
    if (opts_.documents.attention && chunk_has_embedding(c) && loss_scale != 0.0f)
      for (int b = 0; b < d.B; ++b)
        for (int t = r0; t < r0 + T; ++t) attention_pairs_ += static_cast<double>(t - s.doc_kstart[b * Tg + t] + 1);
  }
  if (sp_.size() > 1 && tokens != nullptr) {
    // Ulysses: this rank's tokens of each sample. The whole samples are checked here, alike on every
    // rank of the group (a rank that threw alone would leave the others waiting in the all-to-all).
    const int Tg = seq_, T = d.T, r0 = sp_.rank() * T;
    for (int i = 0; i < d.B * Tg; ++i) {
      MT_CHECK(tokens[i] >= 0 && tokens[i] < cfg_.vocab_size, ErrorKind::kInvalidArgument,
               "token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                   " is outside the vocabulary [0, " + std::to_string(cfg_.vocab_size) + ")");
      MT_CHECK(targets == nullptr || targets[i] == -100 || (targets[i] >= 0 && targets[i] < cfg_.vocab_size),
               ErrorKind::kInvalidArgument,
               "target " + std::to_string(targets ? targets[i] : 0) + " at position " + std::to_string(i) +
                   " is outside the vocabulary (and not -100)");
    }
    for (int b = 0; b < d.B; ++b) {
      std::memcpy(s.sp_in + static_cast<size_t>(b) * T, tokens + static_cast<size_t>(b) * Tg + r0, static_cast<size_t>(T) * 4);
      if (targets)
        std::memcpy(s.sp_in + d.N + static_cast<size_t>(b) * T, targets + static_cast<size_t>(b) * Tg + r0, static_cast<size_t>(T) * 4);
    }
    tokens = s.sp_in;
    if (targets) targets = s.sp_in + d.N;
  }
  if (chunk_has_embedding(c)) embed(s, tokens);
  const size_t RC = boundary_numel();
  const int n = chunk_size(c);
  const BlockDims ds = dims_of(s);
  for (int j = 0; j < n; ++j)
    block(c, j)->forward(s.resid + (j + 1) * RC, s.resid + j * RC, acts_for(s, j), scratch_, ds, rope_cos_, rope_sin_, ws_);
  if (!chunk_has_head(c)) {
    s.backward_ready = loss_scale != 0.0f;
    return 0.0f;
  }
  return head_forward(s, s.resid + n * RC, targets, loss_scale);
}

float TransformerLM::head_forward(Slot& s, const float* last, const int32_t* targets, float loss_scale) {
  const BlockDims& d = dims_;
  const size_t NC = static_cast<size_t>(d.N) * d.C;
  DType cd = opts_.compute_dtype;
  const bool f32 = cd == DType::kF32;
  // The final norm's rows (this rank's under sequence parallelism, gathered for the LM head).
  float* nf = d.sp ? s.dnf : f32 ? static_cast<float*>(s.nfc) : scratch_.f;
  {
    ProfileScope scope(prof_, pid_.norm);
    norm_f_->run_hooks(nn::HookPoint::kPreForward);
    if (cfg_.arch == Arch::kGpt2) {
      static_cast<nn::LayerNorm*>(norm_f_)->forward(nf, s.norm_mean, s.norm_rstd, last, d.rows());
    } else {
      static_cast<nn::RMSNorm*>(norm_f_)->forward(nf, s.norm_rstd, last, d.rows());
    }
    norm_f_->run_hooks(nn::HookPoint::kPostForward);
  }
  // The LM head and the loss (the fused kernel computes the head's gradients here too).
  ProfileScope head_scope(prof_, pid_.head);
  if (d.sp && f32) {
    tp_.gather_rows(static_cast<float*>(s.nfc), nf, static_cast<size_t>(d.Nl), static_cast<size_t>(d.C), "sp lm-head forward");
  } else if (d.sp) {
    // Low precision: this rank's rows cast into their block of the head's input, then gathered in
    // place in the compute dtype (Megatron gathers the bf16 norm output).
    char* mine = static_cast<char*>(s.nfc) + static_cast<size_t>(tp_.rank()) * d.Nl * d.C * dtype_size(cd);
    convert(mine, cd, nf, DType::kF32, static_cast<size_t>(d.Nl) * d.C);
    tp_.gather_rows(s.nfc, mine, static_cast<size_t>(d.Nl), static_cast<size_t>(d.C), cd, "sp lm-head forward");
  } else if (nf != s.nfc) {
    convert(s.nfc, cd, nf, DType::kF32, NC);
  }
  if (targets == nullptr) return 0.0f;
  int count = 0;
  // A regression or multi-label classifier's targets name rows of the label values.
  const bool valued = cfg_.num_labels > 0 && cfg_.problem_type != ProblemType::kSingleLabel;
  const int64_t classes = valued ? label_value_rows_ : cfg_.num_labels > 0 ? cfg_.num_labels : cfg_.vocab_size;
  for (int i = 0; i < d.N; ++i) {
    MT_CHECK(targets[i] == -100 || (targets[i] >= 0 && targets[i] < classes), ErrorKind::kInvalidArgument,
             "target " + std::to_string(targets[i]) + " at position " + std::to_string(i) + " is outside " +
                 (valued ? "the label values' rows [0, " + std::to_string(classes) + ") (set_label_values)"
                  : cfg_.num_labels > 0 ? "the labels [0, " + std::to_string(classes) + ")"
                                        : std::string("the vocabulary")) +
                 " (and not -100)");
    count += targets[i] != -100;
  }
  nn::Module* head_module = lm_head_ ? lm_head_ : wte_;
  // The fused head accumulates the head's gradient during forward when training.
  head_module->run_hooks(loss_scale != 0.0f ? nn::HookPoint::kPreBackward : nn::HookPoint::kPreForward);
  nn::Parameter* head = this->head();
  nn::LmHeadArgs a;
  a.x = s.nfc;
  a.w = head->compute;
  a.dtype = head->compute_dtype;
  a.targets = targets;
  a.N = d.N; a.C = d.C; a.V = static_cast<int>(head->shape[0]);
  if (valued) {
    a.loss = cfg_.problem_type == ProblemType::kRegression ? nn::HeadLoss::kMeanSquared : nn::HeadLoss::kBinaryCrossEntropy;
    a.values = label_values_;
    a.value_rows = label_value_rows_;
  }
  const bool vocab_parallel = tp_.size() > 1 && cfg_.num_labels == 0;  // a classifier's score head is replicated
  if (vocab_parallel) {  // vocabulary-parallel cross-entropy
    a.v0 = static_cast<int>(head->shape[0]) * tp_.rank();
    a.valid = std::max(0, std::min(a.V, cfg_.vocab_size - a.v0));
    a.reduce_max = [this](float* v, size_t n) { tp_.all_reduce_max(v, n, "tp cross-entropy max"); };
    a.reduce_sum = [this](float* v, size_t n) { tp_.all_reduce(v, n, "tp cross-entropy sum"); };
  }
  if (sp_.size() > 1) {  // Ulysses: the sample's targets, counted over the group (exact in f32 below 2^24)
    float n = static_cast<float>(count);
    sp_.all_reduce(&n, 1, "ulysses loss count");
    count = static_cast<int>(n);
  }
  const double denominator = loss_denominator_ > 0.0 ? loss_denominator_ : static_cast<double>(count);
  a.grad_scale = count > 0 ? static_cast<float>(loss_scale / denominator) : 0.0f;
  a.dx = s.dnf;
  a.dw = head->grad;
  a.losses = s.losses;
  double total = nn::lm_head_cross_entropy(a, ws_);
  if (sp_.size() > 1) {  // Ulysses: the sum of the sample's token losses
    float t = static_cast<float>(total);
    sp_.all_reduce(&t, 1, "ulysses loss sum");
    total = t;
  }
  // The head's input gradient is this vocabulary shard's part (copy-to region's backward): summed
  // over the group (sequence parallel: reduce-scattered, each rank keeping its rows in sp_full).
  // A replicated score head's is whole on every rank: sequence parallel keeps this rank's rows.
  if (loss_scale != 0.0f && vocab_parallel) {
    if (d.sp) tp_.reduce_scatter_rows(s.sp_full, s.dnf, static_cast<size_t>(d.Nl), static_cast<size_t>(d.C), "sp lm-head backward");
    else tp_.all_reduce(s.dnf, NC, "tp lm-head backward");
  } else if (loss_scale != 0.0f && d.sp) {
    std::memcpy(s.sp_full, s.dnf + static_cast<size_t>(tp_.rank()) * d.Nl * d.C, static_cast<size_t>(d.Nl) * d.C * 4);
  }
  head_module->run_hooks(loss_scale != 0.0f ? nn::HookPoint::kPostBackward : nn::HookPoint::kPostForward);
  s.backward_ready = loss_scale != 0.0f;
  if (count == 0) {
    if (s.backward_ready) std::memset(d.sp ? s.sp_full : s.dnf, 0, static_cast<size_t>(d.rows()) * d.C * 4);
    return 0.0f;
  }
  return static_cast<float>(total / denominator);
}

float TransformerLM::forward(const int32_t* tokens, const int32_t* targets, float loss_scale) {
  MT_CHECK(whole_model(), ErrorKind::kInternal, "forward() of a pipeline stage: use forward_chunk");
  return forward_chunk(0, 0, tokens, targets, loss_scale);
}

void TransformerLM::backward() {
  MT_CHECK(whole_model(), ErrorKind::kInternal, "backward() of a pipeline stage: use backward_chunk");
  backward_chunk(0, 0, nullptr);
}

void TransformerLM::backward_chunk(int c, int slot, const float* grad_output) {
  MT_CHECK(c >= 0 && c < chunks() && slot >= 0 && slot < slots(), ErrorKind::kInternal, "model chunk or activation slot out of range");
  Slot& s = slots_[slot];
  MT_CHECK(s.backward_ready && s.chunk == c, ErrorKind::kInvalidArgument,
           "backward() needs a preceding forward() with targets and a non-zero loss scale");
  s.backward_ready = false;
  const BlockDims& d = dims_;
  const size_t RC = boundary_numel();
  const int n = chunk_size(c);
  if (prof_) prof_->set_phase(ProfilePhase::kBackward);  // a recomputed forward counts as backward
  ProfileScope scope(prof_, pid_.root);
  if (chunk_has_head(c)) {
    std::memset(dres_, 0, RC * 4);
    const float* last = s.resid + n * RC;
    const float* dnf = d.sp ? s.sp_full : s.dnf;
    ProfileScope norm_scope(prof_, pid_.norm);
    norm_f_->run_hooks(nn::HookPoint::kPreBackward);
    norm_backward_sp(*norm_f_, tp_, d.sp, [&] {
      if (cfg_.arch == Arch::kGpt2) {
        static_cast<nn::LayerNorm*>(norm_f_)->backward(dres_, dnf, last, s.norm_mean, s.norm_rstd, d.rows());
      } else {
        static_cast<nn::RMSNorm*>(norm_f_)->backward(dres_, dnf, last, s.norm_rstd, d.rows());
      }
    });
    norm_f_->run_hooks(nn::HookPoint::kPostBackward);
  } else {
    MT_CHECK(grad_output != nullptr, ErrorKind::kInternal, "backward of a chunk without the head needs its output's gradient");
    std::memcpy(dres_, grad_output, RC * 4);
  }
  const BlockDims ds = dims_of(s);  // a recomputed forward draws the forward's masks again
  for (int j = n - 1; j >= 0; --j) {
    if (opts_.recompute)
      block(c, j)->forward(scratch_.dact /* unused output */, s.resid + j * RC, acts_for(s, j), scratch_, ds, rope_cos_,
                           rope_sin_, ws_);
    block(c, j)->backward(dres_, s.resid + j * RC, acts_for(s, j), scratch_, ds, rope_cos_, rope_sin_, ws_);
  }
  if (!chunk_has_embedding(c)) return;
  ProfileScope embed_scope(prof_, pid_.embed);
  wte_->run_hooks(nn::HookPoint::kPreBackward);
  if (s.drop_on && s.drop.embd.active())  // the embedding dropout's mask on its gradient
    kernels::dropout_rows(dres_, static_cast<size_t>(d.rows()), d.C,
                          kernels::drop_site_key(s.drop.step_key, 0, kernels::kDropEmbedding), s.drop.embd, s.drop.sample0,
                          s.drop.row0, d.T, s.drop.t0);
  const float* demb = dres_;
  if (d.sp) {  // the lookup's gradient needs every row: gathered from the group
    tp_.gather_rows(s.sp_full, dres_, static_cast<size_t>(d.Nl), static_cast<size_t>(d.C), "sp embedding backward");
    demb = s.sp_full;
  }
  kernels::embedding_backward(wte_->weight()->grad, wpe_ ? wpe_->weight()->grad : nullptr, demb,
                              tp_.size() == 1 ? s.tokens : s.local_tokens, d.N, d.T, d.C, dims_of(s).pos,
                              wte_->local_padding_row());
  wte_->run_hooks(nn::HookPoint::kPostBackward);
}

std::vector<parallel::Unit> TransformerLM::zero_units() const {
  std::vector<parallel::Unit> units;
  auto groups = const_cast<TransformerLM*>(this)->zero_unit_modules();
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<nn::Parameter*> ps;
    for (nn::Module* m : groups[g]) m->collect_parameters(ps);
    parallel::Unit u;
    const bool emb = g == 0 && wte_ != nullptr, tail = g + 1 == groups.size() && norm_f_ != nullptr;
    if (emb && wpe_) wpe_->collect_parameters(ps);  // positions belong to the embeddings unit
    std::string block_name;
    if (!emb && !tail) {  // the layer of block i (chunks are runs of layers)
      int i = static_cast<int>(g) - (wte_ ? 1 : 0), c = 0;
      while (i >= chunk_size(c)) i -= chunk_size(c++);
      block_name = "h." + std::to_string(chunks_[c].first + i);
    }
    u.name = emb ? "embeddings" : tail ? "tail" : block_name;
    u.offset = ps.front()->offset;
    for (const nn::Parameter* p : ps) {
      u.offset = std::min(u.offset, p->offset);
      u.numel += static_cast<size_t>(p->numel());
      if (p->is_matrix) u.matrix_numel += static_cast<size_t>(p->numel());
    }
    units.push_back(std::move(u));
  }
  return units;
}

std::vector<std::vector<nn::Module*>> TransformerLM::zero_unit_modules() {
  // Registration order: the token table (and positions), the blocks, the final norm and untied head.
  std::vector<std::vector<nn::Module*>> m;
  if (wte_) {
    m.push_back({wte_});  // its hooks bracket the positions' use too
  }
  for (Block* b : blocks_) m.push_back({b});
  if (norm_f_) {
    m.push_back({norm_f_});
    if (lm_head_) m.back().push_back(lm_head_);
  }
  return m;
}

void TransformerLM::logits(float* out, const int32_t* tokens) {
  MT_CHECK(whole_model(), ErrorKind::kInternal, "logits() of a pipeline stage");
  forward_chunk(0, 0, tokens, nullptr, 0.0f);  // through the final norm: slot 0's nfc
  head_logits(out);
}

void TransformerLM::head_logits(float* out) {
  MT_CHECK(head_ && slots_[0].chunk == chunks() - 1, ErrorKind::kInternal,
           "head_logits() needs a forward of the chunk with the head on slot 0");
  nn::Module* head_module = lm_head_ ? lm_head_ : wte_;
  head_module->run_hooks(nn::HookPoint::kPreForward);
  if (sp_.size() > 1) {
    // Ulysses: this rank's tokens' rows, placed in the whole samples' (B, usp T) and summed over
    // the sp group (every other rank's rows are zeros here).
    const size_t W = tp_.size() == 1 || cfg_.num_labels > 0 ? static_cast<size_t>(head()->shape[0]) : static_cast<size_t>(cfg_.vocab_size);
    const size_t T = static_cast<size_t>(dims_.T), Tg = T * static_cast<size_t>(sp_.size()), r0 = static_cast<size_t>(sp_.rank()) * T;
    std::vector<float> local(static_cast<size_t>(dims_.N) * W);
    rank_logits(local.data());
    std::fill(out, out + static_cast<size_t>(dims_.B) * Tg * W, 0.0f);
    for (size_t b = 0; b < static_cast<size_t>(dims_.B); ++b)
      std::memcpy(out + (b * Tg + r0) * W, local.data() + b * T * W, T * W * sizeof(float));
    sp_.all_reduce(out, static_cast<size_t>(dims_.B) * Tg * W, "ulysses logits");
  } else {
    rank_logits(out);
  }
  head_module->run_hooks(nn::HookPoint::kPostForward);
}

// This rank's tokens' logits from slot 0's final-norm rows: (N, V), or (N, num_labels) for a
// (replicated) classifier; under tp the vocabulary shards gathered, padding columns dropped.
void TransformerLM::rank_logits(float* out) {
  const void* nfc = slots_[0].nfc;
  nn::Parameter* head = this->head();
  if (tp_.size() == 1 || cfg_.num_labels > 0) {
    nn::lm_head_logits(out, nfc, head->compute, head->compute_dtype, dims_.N, dims_.C, static_cast<int>(head->shape[0]));
  } else {  // this shard's logits, gathered over the group
    const size_t N = static_cast<size_t>(dims_.N), vl = static_cast<size_t>(head->shape[0]), V = cfg_.vocab_size;
    std::vector<float> local(N * vl), all(N * vl * static_cast<size_t>(tp_.size()));
    nn::lm_head_logits(local.data(), nfc, head->compute, head->compute_dtype, dims_.N, dims_.C, static_cast<int>(vl));
    tp_.gather_columns(all.data(), local.data(), N, vl, "tp logits");
    for (size_t i = 0; i < N; ++i) std::memcpy(out + i * V, all.data() + i * vl * tp_.size(), V * sizeof(float));
  }
}

void TransformerLM::set_profiler(ModuleProfile* p) {
  MT_CHECK(p == nullptr || dims_.N > 0, ErrorKind::kInternal, "set_profiler before prepare(B, T)");
  MT_CHECK(p == nullptr || p->empty(), ErrorKind::kInternal, "set_profiler: give a fresh (empty) ModuleProfile");
  prof_ = p;
  if (p != nullptr) {
    // This rank's modules in forward order; FLOPs of one micro-batch (models/module_profile.h).
    auto params = [](nn::Module* m) {
      std::vector<nn::Parameter*> ps;
      if (m) m->collect_parameters(ps);
      int64_t n = 0;
      for (const nn::Parameter* q : ps) n += q->numel();
      return n;
    };
    const bool gpt2 = cfg_.arch == Arch::kGpt2;
    pid_.root = p->add("model", "TransformerLM", -1, 0, 0.0);
    pid_.embed = pid_.norm = pid_.head = -1;
    // The token table of a last stage with a tied head is the head's.
    if (embed_) pid_.embed = p->add(gpt2 ? "wte+wpe" : "embed_tokens", "Embedding", pid_.root,
                                    params(wte_) + params(wpe_), 0.0);
    for (Block* b : blocks_) b->profile_attach(p, pid_.root, dims_);
    if (head_) {
      pid_.norm = p->add(norm_f_->name(), gpt2 ? "LayerNorm" : "RMSNorm", pid_.root, params(norm_f_), 0.0);
      nn::Parameter* w = head();
      pid_.head = p->add("lm_head+loss", "LMHead", pid_.root,
                         lm_head_ ? params(lm_head_) : tied_copy_ ? params(wte_) : 0,
                         gemm_flops(dims_.N, dims_.C, static_cast<double>(w->shape[0])));
    }
    p->finish();
    return;
  }
  for (Block* b : blocks_) b->profile_attach(nullptr, -1, dims_);
}

double TransformerLM::train_flops_per_step() const {
  // 6 FLOPs per parameter per token for the matmul weights (embedding lookups excluded, the tied
  // head included once as a matmul), plus attention: QK^T and PV, causal (half), forward 2*2*T*A
  // per token per layer halved, x3 for forward+backward.
  double tokens = static_cast<double>(dims_.B) * seq_;  // whole samples (Ulysses: every rank's tokens)
  double matmul_params = static_cast<double>(cfg_.num_params());
  if (cfg_.arch == Arch::kGpt2) matmul_params -= static_cast<double>(cfg_.max_positions) * cfg_.hidden;
  if (!cfg_.tie_embeddings && cfg_.num_labels == 0) matmul_params -= static_cast<double>(cfg_.vocab_size) * cfg_.hidden;
  if (cfg_.num_labels > 0) matmul_params -= static_cast<double>(cfg_.vocab_size) * cfg_.hidden;  // lookup only
  double attn = 6.0 * cfg_.n_layer * seq_ * static_cast<double>(cfg_.n_head * cfg_.head_dim());
  return 6.0 * matmul_params * tokens + attn * tokens;  // the attention term is causal_attention_flops()
}

}  // namespace mt::models
