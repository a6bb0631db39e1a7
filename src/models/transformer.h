// TransformerLM: a GPT-2- or LLaMA-family causal language model with Hugging Face parameter names,
// every parameter a view into the ParamStore's flat buffers, explicit saved activations
// (accounted as "activations") and optional full recompute per block.
//
// Usage:
//   TransformerLM model(cfg, opts);          // parameters initialised from opts.seed
//   model.prepare(B, T);                      // allocates activations for this micro-batch shape
//   float loss = model.forward(tokens, targets, loss_scale);   // loss_scale 0: no backward
//   model.backward();                         // parameter grads += d(loss * loss_scale)
#pragma once

#include <functional>

#include <memory>
#include <vector>

#include "models/block.h"
#include "models/config.h"
#include "models/module_profile.h"
#include "nn/embedding.h"
#include "nn/param_store.h"
#include "nn/workspace.h"
#include "parallel/zero/partition.h"
#include "tensor/allocator.h"

namespace mt::models {

// The whole model's parameters in the one-process layout (checkpoints, HF files): name, whole
// (unpadded) shape and element offset, in registration order.
struct ParamLayout {
  std::string name;
  Shape shape;
  size_t offset = 0;
};
std::vector<ParamLayout> one_process_layout(const ModelConfig& cfg);

class TransformerLM : public nn::Module {
 public:
  TransformerLM(const ModelConfig& cfg, const ModelOptions& opts);

  const ModelConfig& config() const { return cfg_; }
  const ModelOptions& options() const { return opts_; }
  nn::ParamStore& store() { return *store_; }
  // The initial values of flat elements [begin, end) (ModelOptions::deferred_init: the store holds
  // none; the ZeRO runtime asks unit by unit).
  // They are the seed's (ParamStore::init), or what set_initial_values gave (weights read from a
  // file: model.init_from under ZeRO).
  void init_values(size_t begin, size_t end, float* dst) const {
    if (initial_values_) initial_values_(begin, end, dst);
    else store_->init_values(opts_.seed, begin, end, dst);
  }
  void set_initial_values(std::function<void(size_t, size_t, float*)> f) { initial_values_ = std::move(f); }
  // The seed's initial values, whatever set_initial_values gave.
  void seed_values(size_t begin, size_t end, float* dst) const { store_->init_values(opts_.seed, begin, end, dst); }
  parallel::TpComm& tp() { return tp_; }
  // DeepSpeed-Ulysses (parallel.sp): the sp group this rank shares its micro-batches with (of one
  // without). Under it forward() still takes whole samples (B, T), keeps this rank's T / sp tokens
  // of each, and returns the micro-batch's loss as one process computes it (the sum and count of
  // the token losses reduced over the group); the gradient it leaves is this rank's tokens' share
  // of that loss's, to be summed over the group (the engine's reduction over dp x sp).
  int sp() const { return sp_.size(); }
  parallel::UlyssesComm& ulysses() { return sp_; }
  // Rows of the (padded) vocabulary on this rank: cfg.vocab_size without tensor parallelism.
  int padded_vocab() const;

  // slots: micro-batches whose activations are kept at once (a pipeline schedule's in-flight
  // count; 1 for forward()/backward()).
  void prepare(int B, int T, int slots = 1);
  int batch() const { return dims_.B; }
  int seq() const { return seq_; }  // T as prepared (whole samples under Ulysses)
  int slots() const { return static_cast<int>(slots_.size()); }

  // tokens, targets: (B, T) for the prepared shape; targets may hold -100 (ignored) and may be
  // nullptr (then the loss is 0 and no backward is possible). Returns the mean loss over the
  // non-ignored targets. loss_scale != 0 prepares backward of (mean loss * loss_scale).
  // Throws kInvalidArgument naming the first token or target out of range. The whole model only
  // (no pipeline stages).
  float forward(const int32_t* tokens, const int32_t* targets, float loss_scale);
  void backward();
  // Dropout (ModelConfig's embd_pdrop, resid_pdrop, attn_pdrop; kernels/cpu/dropout.h) in the next
  // forward()/forward_chunk() only, and in that micro-batch's backward: the micro-batch's first
  // sample is sample0 of the global batch of optimizer step `step` (one-based), so every layout
  // draws the one-process run's masks. A forward without it (evaluation, inference) drops nothing.
  // No-op when the config has no dropout.
  void set_dropout_origin(uint64_t step, uint64_t sample0);
  // What a micro-batch's summed token losses are divided by (and its gradient with them): 0, its
  // own count of targets (the default); else this (the engine's share of a global batch's count,
  // loss_normalization "tokens"). The returned loss is divided the same way.
  void set_loss_denominator(double d) { loss_denominator_ = d; }
  // A regression or multi-label classifier (ModelConfig::problem_type): a target t other than -100
  // names row t of values (rows x num_labels: the values, or the 0/1 labels), which the caller
  // keeps until the micro-batches that name it have run forward. Single-label targets are labels.
  void set_label_values(const float* values, int64_t rows) {
    label_values_ = values;
    label_value_rows_ = rows;
  }
  bool has_dropout() const { return cfg_.embd_pdrop > 0 || cfg_.resid_pdrop > 0 || cfg_.attn_pdrop > 0; }

  // Logits (B, T, V) f32 of a forward over tokens (B, T) of the prepared shape (whole model);
  // (B, T, num_labels) for a classifier (ModelConfig::num_labels).
  void logits(float* out, const int32_t* tokens);
  // The logits of the last forward_chunk() of the chunk with the head on slot 0 (a pipeline's last
  // stage; the whole model's logits() is that forward and this). Under Ulysses, of the whole
  // samples (B, seq(), ...), assembled over the sp group: every rank of it calls this.
  void head_logits(float* out);

  // Pipeline stage: this rank's model chunks (one without virtual stages), each a run of layers;
  // chunk c is virtual stage c·pp + pp_rank. The embedding sits on virtual stage 0, the final norm
  // and the LM head (and the loss) on the last.
  int chunks() const { return static_cast<int>(chunks_.size()); }
  std::pair<int, int> chunk_layers(int c) const { return chunks_[c]; }  // [first, last + 1)
  bool chunk_has_embedding(int c) const { return embed_ && c == 0; }
  bool chunk_has_head(int c) const { return head_ && c + 1 == chunks(); }
  bool whole_model() const { return embed_ && head_ && chunks() == 1; }
  // Elements of an activation (or its gradient) passed between stages: this rank's rows x C.
  size_t boundary_numel() const { return static_cast<size_t>(dims_.rows()) * dims_.C; }
  // Where the activation a chunk without the embedding reads is received (slot's residual input).
  float* chunk_input(int slot);
  // Forward of chunk c on micro-batch slot `slot`: tokens feed the embedding (and are kept for its
  // backward), targets the loss (chunk with the head; its return value, else 0). The output of a
  // chunk without the head is chunk_output(slot) until the slot's next forward.
  float forward_chunk(int c, int slot, const int32_t* tokens, const int32_t* targets, float loss_scale);
  const float* chunk_output(int slot) const;
  // Backward of the chunk whose forward filled `slot`: grad_output (boundary_numel) is dL/d(chunk
  // output) for a chunk without the head (null for the one with it). Afterwards input_grad() holds
  // dL/d(chunk input) for a chunk without the embedding (until the next backward).
  void backward_chunk(int c, int slot, const float* grad_output);
  const float* input_grad() const { return dres_; }
  // The tied GPT-2 token table on the last stage (the head) of a pipeline whose first stage holds
  // the embedding: its gradient is summed between the two. Null otherwise.
  nn::Parameter* tied_head_copy() const { return tied_copy_ ? wte_->weight() : nullptr; }

  // ZeRO units in forward order (embeddings, each block, tail: final norm + untied head; the
  // parts this stage holds) and, for each, the modules whose hooks bracket every use of that unit's
  // parameters: kPreForward / kPostForward around a use that only reads them, kPreBackward /
  // kPostBackward around one that also accumulates their gradients (the fused LM head does that
  // during forward()).
  std::vector<parallel::Unit> zero_units() const;
  std::vector<std::vector<nn::Module*>> zero_unit_modules();

  // FLOPs of one training step on B*T tokens (whole model): 6 N_matmul tokens + attention
  // (documented in PERF).
  double train_flops_per_step() const;
  // Its attention term: attention_flops_per_pair() for each (query, key) pair, causal:
  // B·T(T+1)/2 pairs counted as B·T²/2.
  double attention_flops_per_pair() const {
    return 12.0 * cfg_.n_layer * static_cast<double>(cfg_.n_head) * cfg_.head_dim();
  }
  double causal_attention_flops() const {
    return 0.5 * static_cast<double>(dims_.B) * seq_ * seq_ * attention_flops_per_pair();
  }
  // ModelOptions::documents with attention: the (query, key) pairs the training forwards of the
  // embedding's chunk computed since the last call (each query its own document's keys up to it).
  double take_attention_pairs() {
    const double p = attention_pairs_;
    attention_pairs_ = 0.0;
    return p;
  }
  // Bytes of activations saved (every slot) for the prepared shape (formula in docs/PERF.md).
  size_t activation_bytes() const;

  // DeepSpeed's flops profiler: p (empty) gets this rank's module tree with parameters and forward
  // FLOPs for the prepared shape (models/module_profile.h), and until set_profiler(nullptr) forward
  // and backward time every module into it. REQUIRES: prepare() was called.
  void set_profiler(ModuleProfile* p);

 private:
  void rank_logits(float* out);  // this rank's tokens' logits (head_logits)
  struct Slot {  // one micro-batch's saved state
    Buffer buffer;
    std::vector<BlockActs> acts;  // per layer of the chunk (empty with recompute: shared_acts_)
    float* resid = nullptr;       // (layers + 1, rows, C) block inputs/outputs
    float* norm_mean = nullptr;   // (rows)  final norm (chunk with the head)
    float* norm_rstd = nullptr;
    void* nfc = nullptr;          // (N, C) cd final-norm output
    float* dnf = nullptr;         // (N, C) dL/d(final-norm output), from the fused LM head
    float* sp_full = nullptr;     // (N, C) sequence parallel: rows gathered from the tp group
    float* losses = nullptr;      // (N)
    int32_t* tokens = nullptr;    // (N) the forward's tokens (chunk with the embedding)
    int32_t* local_tokens = nullptr;  // (N) vocab-parallel: row in this rank's shard, or -1
    int32_t* doc_pos = nullptr;       // (N) ModelOptions::documents: positions, from the forward's tokens
    int32_t* doc_kstart = nullptr;    // (N) and each query's first key
    int32_t* sp_in = nullptr;         // (2N) Ulysses: this rank's tokens, then its targets, of the forward's samples
    int chunk = -1;
    bool backward_ready = false;
    BlockDropout drop;       // this micro-batch's dropout (drop_on)
    bool drop_on = false;
  };
  BlockDims dims_of(const Slot& s) const {  // dims_ with the slot's dropout
    BlockDims d = dims_;
    d.drop = s.drop_on ? &s.drop : nullptr;
    d.pos = opts_.documents.on() && opts_.documents.positions ? s.doc_pos : sp_.size() > 1 ? sp_pos_.data() : nullptr;
    d.kstart = opts_.documents.on() && opts_.documents.attention ? s.doc_kstart : nullptr;
    return d;
  }
  void embed(Slot& s, const int32_t* tokens);          // embeddings -> s.resid[0]
  float head_forward(Slot& s, const float* last, const int32_t* targets, float loss_scale);
  BlockActs& acts_for(Slot& s, int j) { return opts_.recompute ? shared_acts_ : s.acts[j]; }
  nn::Parameter* head() const { return lm_head_ ? lm_head_->weight() : wte_->weight(); }
  int chunk_size(int c) const { return chunks_[c].second - chunks_[c].first; }
  Block* block(int c, int j) const { return blocks_[chunk_first_[c] + j]; }

  ModelConfig cfg_;
  ModelOptions opts_;
  parallel::TpComm tp_;  // the tensor-parallel group (of one without tensor parallelism)
  parallel::UlyssesComm sp_;  // the Ulysses group (of one without)
  int seq_ = 0;               // prepare()'s T: dims_.T sp times under Ulysses
  std::vector<int32_t> sp_pos_;  // (N) Ulysses: the global positions of this rank's rows
  std::vector<std::pair<int, int>> chunks_;  // layer ranges of this rank's chunks
  std::vector<int> chunk_first_;             // index in blocks_ of each chunk's first block
  bool embed_ = true, head_ = true, tied_copy_ = false;
  nn::Embedding* wte_ = nullptr;
  nn::Embedding* wpe_ = nullptr;  // GPT-2 only
  std::vector<Block*> blocks_;
  nn::Module* norm_f_ = nullptr;  // LayerNorm (GPT-2) or RMSNorm (LLaMA)
  nn::Embedding* lm_head_ = nullptr;  // untied head (LLaMA), shaped like an embedding (V, C)
  std::unique_ptr<nn::ParamStore> store_;
  std::function<void(size_t, size_t, float*)> initial_values_;  // set_initial_values

  BlockDims dims_{};
  bool drop_next_ = false;      // set_dropout_origin: the next forward drops
  double loss_denominator_ = 0.0;  // set_loss_denominator (0: each micro-batch's own count)
  const float* label_values_ = nullptr;  // set_label_values
  int64_t label_value_rows_ = 0;
  double attention_pairs_ = 0.0;   // take_attention_pairs
  BlockDropout drop_origin_{};
  std::shared_ptr<kernels::SparseAttentionPlan> sparse_plan_;  // dims_.sparse
  std::vector<Slot> slots_;
  Buffer shared_acts_buffer_, scratch_buffer_, dres_buffer_;
  BlockActs shared_acts_{};  // with recompute: one set for every block and slot
  BlockScratch scratch_{};
  float* dres_ = nullptr;       // (rows, C) residual-stream gradient
  float* rope_cos_ = nullptr;   // (T, HS/2)
  float* rope_sin_ = nullptr;
  nn::Workspace ws_;
  ModuleProfile* prof_ = nullptr;  // null: not profiling
  struct {
    int root = -1, embed = -1, norm = -1, head = -1;
  } pid_;
};

}  // namespace mt::models
