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

// Bytes of unit u's model-view slab: f32, or matrices in the compute dtype and the rest in f32.
size_t slab_bytes(const parallel::Unit& u, size_t e) {
  return e == 4 ? 4 * u.numel : e * u.matrix_numel + 4 * (u.numel - u.matrix_numel);
}

// Stage 3: the widest live window of non-persistent slabs walking `order` (unit indices).
size_t stage3_window(const std::vector<parallel::Unit>& units, const std::vector<size_t>& order,
                     size_t e, const ZeroKnobs& z) {
  std::vector<size_t> live;  // non-persistent units in this order
  for (size_t u : order)
    if (static_cast<int64_t>(units[u].numel) > z.param_persistence_threshold) live.push_back(u);
  size_t best = 0;
  for (size_t i = 0; i < live.size(); ++i) {
    size_t bytes = slab_bytes(units[live[i]], e);
    int64_t elems = static_cast<int64_t>(units[live[i]].numel), prefetched = 0;
    for (size_t j = i + 1; j < live.size(); ++j) {
      int64_t n = static_cast<int64_t>(units[live[j]].numel);
      if (elems + n > z.max_live_parameters || prefetched + n > z.prefetch_bucket_size) break;
      elems += n;
      prefetched += n;
      bytes += slab_bytes(units[live[j]], e);
    }
    best = std::max(best, bytes);
  }
  return best;
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

MemoryBreakdown model_state_memory(const std::vector<parallel::Unit>& units, int stage, int world,
                                   size_t e, int k, const ZeroKnobs& zero) {
  MT_CHECK(world >= 1 && stage >= 0 && stage <= 3 && (e == 2 || e == 4), ErrorKind::kInvalidArgument,
           "memory estimate: bad stage/world/dtype");
  const bool lowp = e != 4;
  const size_t N = static_cast<size_t>(world), ku = static_cast<size_t>(k);
  MemoryBreakdown m;
  size_t P = 0;
  for (const parallel::Unit& u : units) P += u.numel;
  if (stage == 0) {  // nn::ParamStore + the optimizer over the whole flat buffer
    m[MemCategory::kParams] = lowp ? e * P : 4 * P;
    m[MemCategory::kOptimizer] = (lowp ? 4 * P : 0) + 4 * ku * P;
    m[MemCategory::kGrads] = 4 * P;
    return m;
  }
  size_t S = 0, slabs = 0, comm = 0;
  std::vector<size_t> grad_slabs;
  for (const parallel::Unit& u : units) {
    size_t s = ceil_div(u.numel, N);
    S += s;
    slabs += slab_bytes(u, e);
    grad_slabs.push_back(4 * N * s);
    comm = std::max(comm, 4 * N * s + 4 * s);
  }
  std::sort(grad_slabs.rbegin(), grad_slabs.rend());
  size_t grad_slab_bytes = 0;
  for (size_t i = 0; i < grad_slabs.size() && (stage == 1 || i < 2); ++i) grad_slab_bytes += grad_slabs[i];

  size_t view = slabs;
  if (stage == 3) {
    size_t persistent = 0;
    std::vector<size_t> fwd;
    for (size_t u = 0; u < units.size(); ++u) {
      fwd.push_back(u);
      if (static_cast<int64_t>(units[u].numel) <= zero.param_persistence_threshold) persistent += slab_bytes(units[u], e);
    }
    std::vector<size_t> bwd(fwd.rbegin(), fwd.rend());
    view = persistent + std::max(stage3_window(units, fwd, e, zero), stage3_window(units, bwd, e, zero));
  }
  m[MemCategory::kParams] = view + (lowp ? 0 : 4 * S);
  m[MemCategory::kOptimizer] = (lowp ? 4 * S : 0) + 4 * ku * S;
  m[MemCategory::kGrads] = 4 * S + grad_slab_bytes;
  m[MemCategory::kComm] = comm;
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
  r.ours = model_state_memory(units, stage, in.world, e, in.optimizer_states, in.zero);
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
                                     in.optimizer_states, in.zero).total();
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
