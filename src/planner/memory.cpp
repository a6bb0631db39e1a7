#include "planner/memory.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <memory>
#include <string>

#include "base/error.h"
#include "models/block.h"
#include "nn/embedding.h"
#include "nn/norm.h"

namespace mt::planner {
namespace {

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// The parameters a module holds itself (not through its children).
size_t own_params(nn::Module& m) {
  std::vector<nn::Parameter*> all;
  m.collect_parameters(all);
  size_t n = 0;
  for (nn::Parameter* p : all) n += static_cast<size_t>(p->numel());
  for (nn::Module* c : m.children()) {
    std::vector<nn::Parameter*> sub;
    c->collect_parameters(sub);
    for (nn::Parameter* p : sub) n -= static_cast<size_t>(p->numel());
  }
  return n;
}

size_t largest_own_params(nn::Module& m) {
  size_t best = own_params(m);
  for (nn::Module* c : m.children()) best = std::max(best, largest_own_params(*c));
  return best;
}

// Metadata-only copies of the model's modules, in the order TransformerLM registers them. All
// blocks have the same parameters, so one stands for every block.
struct ModelSkeleton {
  std::vector<std::unique_ptr<nn::Module>> embeddings;  // wte (+ wpe)
  std::unique_ptr<nn::Module> block;
  std::vector<std::unique_ptr<nn::Module>> tail;  // final norm (+ untied head)

  explicit ModelSkeleton(const models::ModelConfig& cfg) {
    cfg.validate();
    bool gpt2 = cfg.arch == models::Arch::kGpt2;
    int C = cfg.hidden;
    embeddings.push_back(std::make_unique<nn::Embedding>("wte", cfg.vocab_size, C, true, cfg.init_std));
    if (gpt2) embeddings.push_back(std::make_unique<nn::Embedding>("wpe", cfg.max_positions, C, false, cfg.init_std));
    block = std::make_unique<models::Block>(cfg, 0);
    if (gpt2) {
      tail.push_back(std::make_unique<nn::LayerNorm>("ln_f", C, cfg.norm_eps));
    } else {
      tail.push_back(std::make_unique<nn::RMSNorm>("norm", C, cfg.norm_eps));
    }
    if (!cfg.tie_embeddings) tail.push_back(std::make_unique<nn::Embedding>("lm_head", cfg.vocab_size, C, true, cfg.init_std));
  }
};

parallel::Unit unit_of(std::string name, const std::vector<nn::Module*>& modules, size_t offset) {
  parallel::Unit u;
  u.name = std::move(name);
  u.offset = offset;
  for (nn::Module* m : modules) {
    std::vector<nn::Parameter*> ps;
    m->collect_parameters(ps);
    for (nn::Parameter* p : ps) {
      u.numel += static_cast<size_t>(p->numel());
      if (p->is_matrix) u.matrix_numel += static_cast<size_t>(p->numel());
    }
  }
  return u;
}

std::vector<nn::Module*> raw(const std::vector<std::unique_ptr<nn::Module>>& ms) {
  std::vector<nn::Module*> out;
  for (const auto& m : ms) out.push_back(m.get());
  return out;
}

// The same dimensions TransformerLM::prepare computes.
models::BlockDims block_dims(const models::ModelConfig& cfg, int B, int T) {
  models::BlockDims d;
  d.B = B; d.T = T; d.N = B * T; d.C = cfg.hidden; d.NH = cfg.n_head; d.NKV = cfg.n_kv_head;
  d.HS = cfg.head_dim();
  d.QKV = (d.NH + 2 * d.NKV) * d.HS; d.A = d.NH * d.HS;
  d.H = cfg.arch == models::Arch::kGpt2 ? cfg.intermediate : 2 * cfg.intermediate;
  d.G = cfg.intermediate;
  return d;
}

void check_input(const MemoryInput& in, int stage) {
  MT_CHECK(in.world >= 1, ErrorKind::kInvalidArgument, "memory estimate: processes must be at least 1, got " + std::to_string(in.world));
  MT_CHECK(stage >= 0 && stage <= 3, ErrorKind::kInvalidArgument, "memory estimate: ZeRO stage must be 0..3, got " + std::to_string(stage));
  MT_CHECK(in.micro_batch >= 1 && in.seq_length >= 1, ErrorKind::kInvalidArgument,
           "memory estimate: micro-batch and sequence length must be positive");
  MT_CHECK(in.optimizer_states >= 0, ErrorKind::kInvalidArgument, "memory estimate: negative optimizer state count");
}

size_t ds_paper(size_t P, int stage, int world, size_t e, int k) {
  double p = static_cast<double>(P), N = world;
  double w = static_cast<double>(e), g = w, K = 4.0 * k + (e == 4 ? 0.0 : 4.0);
  double bytes = stage == 0 ? (w + g + K) * p
               : stage == 1 ? (w + g) * p + K * p / N
               : stage == 2 ? w * p + (g + K) * p / N
                            : (w + g + K) * p / N;
  return static_cast<size_t>(bytes);
}

}  // namespace

size_t MemoryBreakdown::total() const {
  size_t t = 0;
  for (size_t b : bytes) t += b;
  return t;
}

int optimizer_state_count(const optim::OptimizerSpec& spec) {
  std::string t = spec.type;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (t == "sgd") return spec.momentum != 0.0 ? 1 : 0;
  return 2;  // Adam, AdamW, Lamb: exp_avg, exp_avg_sq
}

std::vector<parallel::Unit> model_units(const models::ModelConfig& cfg) {
  ModelSkeleton sk(cfg);
  std::vector<parallel::Unit> units;
  units.push_back(unit_of("embeddings", raw(sk.embeddings), 0));
  size_t offset = units.back().numel;
  for (int l = 0; l < cfg.n_layer; ++l) {
    units.push_back(unit_of("h." + std::to_string(l), {sk.block.get()}, offset));
    offset += units.back().numel;
  }
  units.push_back(unit_of("tail", raw(sk.tail), offset));
  return units;
}

size_t largest_module_params(const models::ModelConfig& cfg) {
  ModelSkeleton sk(cfg);
  size_t best = largest_own_params(*sk.block);
  for (const auto& m : sk.embeddings) best = std::max(best, largest_own_params(*m));
  for (const auto& m : sk.tail) best = std::max(best, largest_own_params(*m));
  return best;
}

namespace {

// Replays what parallel::ZeroRuntime allocates, hook by hook, over the units (first the
// embeddings, then the blocks, last the tail): construction from the ParamStore, then training
// micro-batches and optimizer steps. Every Buffer of the runtime is one alloc()/release() here with
// the same bytes and category. Nonblocking work is assumed to finish only when the runtime waits
// for it (poll() completes nothing): the worst case, since completing frees and never allocates.
class ZeroReplay {
 public:
  ZeroReplay(const std::vector<parallel::Unit>& units, int stage, int world, size_t e, int k, bool tied_head,
             const ZeroKnobs& z)
      : units_(units), stage_(stage), N_(static_cast<size_t>(world)), e_(e), k_(static_cast<size_t>(k)),
        tied_(tied_head), z_(z), views_(units.size()) {
    for (const parallel::Unit& u : units_) {
      P_ += u.numel;
      S_ += piece(u);
    }
  }

  // Setup peak (store + runtime construction + optimizer) and the steady-state peak of training.
  void run(MemoryBreakdown& setup, MemoryBreakdown& steady) {
    const bool lowp = e_ != 4;
    // nn::ParamStore (TransformerLM's constructor): master, gradients, compute copy.
    size_t store_master = 4 * P_, store_grad = 4 * P_, store_compute = lowp ? e_ * P_ : 0;
    alloc(lowp ? MemCategory::kOptimizer : MemCategory::kParams, store_master);
    alloc(MemCategory::kGrads, store_grad);
    if (lowp) alloc(MemCategory::kParams, store_compute);
    // ZeroRuntime(): master and gradient shards, persistent views, stage 1's gradient slabs.
    alloc(lowp ? MemCategory::kOptimizer : MemCategory::kParams, 4 * S_);
    alloc(MemCategory::kGrads, 4 * S_);
    for (size_t u = 0; u < units_.size(); ++u) {
      View& v = views_[u];
      if (persistent(u)) {
        if (lowp) {
          v.staging = 4 * padded(u);
          alloc(MemCategory::kComm, v.staging);
        } else {
          v.f32 = 4 * padded(u);
          alloc(MemCategory::kParams, v.f32);
        }
        finish_gather(u);
      }
      if (stage_ == 1) {
        v.grad = 4 * padded(u);
        alloc(MemCategory::kGrads, v.grad);
      }
    }
    release(lowp ? MemCategory::kOptimizer : MemCategory::kParams, store_master);  // store.release_buffers()
    release(MemCategory::kGrads, store_grad);
    if (lowp) release(MemCategory::kParams, store_compute);
    alloc(MemCategory::kOptimizer, 4 * k_ * S_);  // the optimizer's state over the shard
    setup = peak_;
    peak_ = cur_;  // Allocator::reset_peaks() after the engine is built (cli/train.cpp)
    for (int step = 0; step < 2; ++step) {
      micro_batch();
      if (stage_ == 1) {  // finish_backward() of the last micro-batch
        reduce_grads(units_.size() - 1);
        reduce_grads(0);
      }
      wait_reductions(0);
      refresh_params();
    }
    steady = peak_;
  }

 private:
  struct View {
    size_t f32 = 0, lowp = 0, staging = 0, grad = 0;
    bool gather = false, live = false, counted = false;
    int refs = 0;
  };
  struct Pending {
    size_t unit, recv;
  };

  size_t piece(const parallel::Unit& u) const { return (u.numel + N_ - 1) / N_; }
  size_t padded(size_t u) const { return piece(units_[u]) * N_; }
  bool persistent(size_t u) const {
    return stage_ < 3 || static_cast<int64_t>(units_[u].numel) <= z_.param_persistence_threshold;
  }
  void alloc(MemCategory c, size_t b) {
    cur_[c] += b;
    peak_[c] = std::max(peak_[c], cur_[c]);
  }
  void release(MemCategory c, size_t b) { cur_[c] -= b; }

  void count_live(size_t u) {
    if (views_[u].counted) return;
    views_[u].counted = true;
    live_ += units_[u].numel;
  }
  void start_gather(size_t u) {
    View& v = views_[u];
    if (v.gather) return;
    if (e_ == 4) {
      if (!v.f32) alloc(MemCategory::kParams, v.f32 = 4 * padded(u));
    } else {
      alloc(MemCategory::kComm, v.staging = 4 * padded(u));
    }
    v.gather = true;
    count_live(u);
  }
  void finish_gather(size_t u) {
    View& v = views_[u];
    v.gather = false;
    if (e_ != 4) {
      const parallel::Unit& unit = units_[u];
      if (!v.lowp) {
        alloc(MemCategory::kParams, v.lowp = std::max<size_t>(unit.matrix_numel, 1) * e_);
        alloc(MemCategory::kParams, v.f32 = std::max<size_t>(unit.numel - unit.matrix_numel, 1) * 4);
      }
      release(MemCategory::kComm, v.staging);
      v.staging = 0;
    }
    count_live(u);
    v.live = true;
  }
  void acquire(size_t u) {
    View& v = views_[u];
    ++v.refs;
    if (!v.live) {
      start_gather(u);
      finish_gather(u);
    } else if (v.gather) {
      finish_gather(u);
    }
    maybe_prefetch(u);
  }
  void drop(size_t u) {  // ZeroRuntime::release
    View& v = views_[u];
    if (v.refs > 0) --v.refs;
    if (v.refs > 0 || persistent(u)) return;
    release(MemCategory::kParams, v.f32 + v.lowp);
    v.f32 = v.lowp = 0;
    v.live = false;
    if (v.counted) live_ -= units_[u].numel;
    v.counted = false;
  }
  void maybe_prefetch(size_t u) {
    if (stage_ < 3) return;
    size_t next;
    if (backward_) {
      if (u == 0) return;
      next = u - 1;
    } else {
      next = u + 1;
      if (next >= units_.size()) return;
    }
    View& v = views_[next];
    if (persistent(next) || v.live || v.gather) return;
    int64_t n = static_cast<int64_t>(units_[next].numel);
    if (n > z_.prefetch_bucket_size || static_cast<int64_t>(live_) + n > z_.max_live_parameters) return;
    start_gather(next);
  }
  void begin_grads(size_t u) {
    for (size_t i = pending_.size(); i-- > 0;)
      if (pending_[i].unit == u) {
        wait_reductions(pending_.size() - i - 1);
        break;
      }
    View& v = views_[u];
    if (!v.grad) alloc(MemCategory::kGrads, v.grad = 4 * padded(u));
  }
  void reduce_grads(size_t u) {
    size_t recv = 4 * piece(units_[u]);
    alloc(MemCategory::kComm, recv);
    pending_.push_back({u, recv});
    wait_reductions(z_.overlap_comm ? 1 : 0);
  }
  void wait_reductions(size_t keep) {
    while (pending_.size() > keep) {
      const Pending& r = pending_.front();
      release(MemCategory::kComm, r.recv);
      if (stage_ >= 2) {
        release(MemCategory::kGrads, views_[r.unit].grad);
        views_[r.unit].grad = 0;
      }
      pending_.erase(pending_.begin());
    }
  }
  void hook(size_t u, bool pre, bool fwd) {
    const size_t last = units_.size() - 1;
    if (fwd && pre) {
      if (u == 0) backward_ = false;
      if (stage_ == 3) acquire(u);
    } else if (fwd) {
      if (stage_ == 3) {
        if (backward_) {
          if (views_[u].refs > 0) --views_[u].refs;
        } else {
          drop(u);
        }
      }
    } else if (pre) {
      backward_ = true;
      if (stage_ == 3) acquire(u);
      if (stage_ >= 2) begin_grads(u);
    } else {
      if (stage_ >= 2 || (u != 0 && u != last)) reduce_grads(u);  // stage 1: the last micro-batch
      if (stage_ == 3) drop(u);
    }
  }
  // TransformerLM::forward (trunk, fused head) and backward, as their modules run the hooks.
  // Recompute adds a block forward inside backward: it only takes and returns a reference.
  void micro_batch() {
    const size_t last = units_.size() - 1;
    for (size_t u = 0; u <= last; ++u) {
      hook(u, true, true);
      hook(u, false, true);
    }
    size_t head = tied_ ? 0 : last;
    hook(head, true, false);
    hook(head, false, false);
    for (size_t u = last + 1; u-- > 0;) {
      hook(u, true, false);
      hook(u, false, false);
    }
  }
  void refresh_params() {
    for (size_t u = 0; u < units_.size(); ++u) {
      View& v = views_[u];
      if (persistent(u)) continue;
      if (v.gather) {
        v.gather = false;
        release(MemCategory::kComm, v.staging);
        v.staging = 0;
      }
      if (v.live || v.counted) {
        v.refs = 0;
        drop(u);
      }
    }
    // Two gathers in flight at a time: the next one overlaps the unpacking of this one, and
    // the f32 staging never holds more than two units.
    std::vector<size_t> order;
    for (size_t u = 0; u < units_.size(); ++u)
      if (persistent(u)) order.push_back(u);
    for (size_t i = 0; i < order.size(); ++i) {
      start_gather(order[i]);
      if (i > 0) finish_gather(order[i - 1]);
    }
    if (!order.empty()) finish_gather(order.back());
  }

  const std::vector<parallel::Unit>& units_;
  int stage_;
  size_t N_, e_, k_;
  bool tied_;
  ZeroKnobs z_;
  std::vector<View> views_;
  std::vector<Pending> pending_;
  size_t P_ = 0, S_ = 0, live_ = 0;
  bool backward_ = false;
  MemoryBreakdown cur_, peak_;
};

}  // namespace

MemoryBreakdown model_state_memory(const std::vector<parallel::Unit>& units, int stage, int world,
                                   size_t e, int k, const ZeroKnobs& zero, bool tied_head,
                                   MemoryBreakdown* setup) {
  MT_CHECK(world >= 1 && stage >= 0 && stage <= 3 && (e == 2 || e == 4) && units.size() >= 2,
           ErrorKind::kInvalidArgument, "memory estimate: bad stage/world/dtype/units");
  const bool lowp = e != 4;
  const size_t ku = static_cast<size_t>(k);
  MemoryBreakdown m;
  size_t P = 0;
  for (const parallel::Unit& u : units) P += u.numel;
  if (stage == 0) {  // nn::ParamStore + the optimizer over the whole flat buffer
    m[MemCategory::kParams] = lowp ? e * P : 4 * P;
    m[MemCategory::kOptimizer] = (lowp ? 4 * P : 0) + 4 * ku * P;
    m[MemCategory::kGrads] = 4 * P;
    if (setup) *setup = m;
    return m;
  }
  MemoryBreakdown s;
  ZeroReplay(units, stage, world, e, k, tied_head, zero).run(s, m);
  if (setup) *setup = s;
  return m;
}

MemoryBreakdown step_memory(const MemoryInput& in) {
  const models::ModelConfig& cfg = in.model;
  const bool gpt2 = cfg.arch == models::Arch::kGpt2;
  const models::BlockDims d = block_dims(cfg, in.micro_batch, in.seq_length);
  const size_t N = static_cast<size_t>(d.N), C = static_cast<size_t>(d.C), V = static_cast<size_t>(cfg.vocab_size);
  const size_t e = dtype_size(in.compute_dtype);
  const bool lowp = in.compute_dtype != DType::kF32;
  MemoryBreakdown m;

  // TransformerLM::prepare: saved activations of every block (one with recompute), the residual
  // stream (L+1 copies) and the head's rows (norm stats, final-norm output, dL/dnorm, dres,
  // losses; six 64-byte-aligned pieces), and the token copy.
  models::BlockActs acts{};
  size_t per_block = models::BlockActs::layout(&acts, nullptr, d, in.compute_dtype, gpt2);
  size_t sets = in.recompute ? 1 : static_cast<size_t>(cfg.n_layer);
  size_t resid = (static_cast<size_t>(cfg.n_layer) + 1) * N * C * 4;
  size_t head_rows = 2 * N * 4 + N * C * e + N * C * 4 + N * C * 4 + N * 4 + 64 * 6;
  m[MemCategory::kActivations] = per_block * sets + resid + head_rows + N * 4;

  // Workspace: BlockScratch (+ LLaMA's RoPE tables), then nn::Workspace's slots.
  models::BlockScratch scratch{};
  size_t ws = models::BlockScratch::layout(&scratch, nullptr, d);
  if (!gpt2) ws += 2 * static_cast<size_t>(d.T) * (d.HS / 2) * 4 + 128;
  // nn::lm_head_cross_entropy: equal row tiles of at most 64 MiB of f32 logits (lm_head.cpp):
  // logits R V f32, their compute-dtype copy (low precision), the row log-sum-exps.
  size_t budget_rows = std::max<size_t>(1, (size_t{64} << 20) / (4 * V));
  size_t R = std::min(N, ceil_div(N, ceil_div(N, budget_rows)));
  ws += R * V * 4 + (lowp ? R * V * e : 0) + R * 4;
  // nn::Linear::backward converts dL/dy (N, out) to the compute dtype in one slot that grows to the
  // largest request; a growth holds the old and the new buffer for a moment. Backward visits each
  // block's GEMMs as down/c_proj (C), up+gate/c_fc (H), o_proj/c_proj (C), qkv/c_attn (QKV).
  if (lowp) {
    size_t cur = 0, peak = 0;
    for (int out : {d.C, d.H, d.C, d.QKV}) {
      size_t bytes = N * static_cast<size_t>(out) * e;
      if (bytes > cur) {
        peak = std::max(peak, cur + bytes);
        cur = bytes;
      }
    }
    ws += peak;
  }
  m[MemCategory::kWorkspace] = ws;
  return m;
}

StageEstimate estimate_stage(const MemoryInput& in, int stage) {
  check_input(in, stage);
  std::vector<parallel::Unit> units = model_units(in.model);
  size_t e = dtype_size(in.compute_dtype);
  StageEstimate r;
  r.stage = stage;
  r.ours = model_state_memory(units, stage, in.world, e, in.optimizer_states, in.zero, in.model.tie_embeddings,
                              &r.setup);
  MemoryBreakdown step = step_memory(in);
  r.ours[MemCategory::kActivations] = step[MemCategory::kActivations];
  r.ours[MemCategory::kWorkspace] = step[MemCategory::kWorkspace];
  size_t P = 0;
  for (const parallel::Unit& u : units) P += u.numel;
  r.ds_paper_bytes = ds_paper(P, stage, in.world, e, in.optimizer_states);
  if (stage == 1 || stage == 2) r.ds_estimator_bytes = 4 * P + 16 * P / static_cast<size_t>(in.world);
  if (stage == 3) r.ds_estimator_bytes = 4 * largest_module_params(in.model) + 18 * P / static_cast<size_t>(in.world);
  return r;
}

int largest_micro_batch(const MemoryInput& in, int stage, size_t budget_bytes, int max_batch) {
  MemoryInput probe = in;
  probe.micro_batch = 1;
  check_input(probe, stage);
  size_t states = model_state_memory(model_units(in.model), stage, in.world, dtype_size(in.compute_dtype),
                                     in.optimizer_states, in.zero, in.model.tie_embeddings).total();
  if (states > budget_bytes) return 0;
  // A linear walk: the total grows with B except where the LM head's tile shrinks as one more tile
  // is needed, so "every smaller B fits too" needs each B checked; each check is a few formulas.
  int limit = std::min(max_batch, INT_MAX / in.seq_length);
  int best = 0;
  for (int B = 1; B <= limit; ++B) {
    probe.micro_batch = B;
    if (states + step_memory(probe).total() > budget_bytes) break;
    best = B;
  }
  return best;
}

}  // namespace mt::planner
