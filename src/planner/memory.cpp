#include "planner/memory.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "base/error.h"
#include "comm/mpi_backend.h"
#include "comm/onebit.h"
#include "models/block.h"
#include "kernels/cpu/gemm.h"
#include "nn/embedding.h"
#include "nn/lm_head.h"
#include "nn/norm.h"
#include "parallel/dp/grad_buckets.h"
#include "parallel/zero/schedule.h"

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
  parallel::TpComm tp;  // rank 0's place in the tp group (shapes only, no group)

  explicit ModelSkeleton(const models::ModelConfig& cfg, int tp_size = 1, int vocab_divisible = 128) : tp(0, tp_size) {
    cfg.validate();
    bool gpt2 = cfg.arch == models::Arch::kGpt2;
    int C = cfg.hidden;
    const nn::TpPlace place{0, tp_size};
    const int Vp = models::padded_vocab(cfg, tp_size, vocab_divisible);
    embeddings.push_back(std::make_unique<nn::Embedding>("wte", cfg.vocab_size, C, true, cfg.init_std, place, Vp));
    if (gpt2) embeddings.push_back(std::make_unique<nn::Embedding>("wpe", cfg.max_positions, C, false, cfg.init_std));
    block = std::make_unique<models::Block>(cfg, 0, tp);
    if (gpt2) {
      tail.push_back(std::make_unique<nn::LayerNorm>("ln_f", C, cfg.norm_eps));
    } else {
      tail.push_back(std::make_unique<nn::RMSNorm>("norm", C, cfg.norm_eps));
    }
    if (cfg.num_labels > 0)  // a classifier's score head, replicated over the tp group (TransformerLM)
      tail.push_back(std::make_unique<nn::Embedding>("score", cfg.num_labels, C, true, cfg.init_std));
    else if (!cfg.tie_embeddings)
      tail.push_back(std::make_unique<nn::Embedding>("lm_head", cfg.vocab_size, C, true, cfg.init_std, place, Vp));
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

}  // namespace

models::BlockDims block_dims(const models::ModelConfig& cfg, int B, int T, int tp, bool sp, int usp) {
  models::BlockDims d;
  d.usp = usp;
  d.B = B; d.T = T / usp; d.N = B * d.T; d.C = cfg.hidden; d.NH = cfg.n_head / tp; d.NKV = cfg.n_kv_head / tp;
  d.HS = cfg.head_dim();
  d.QKV = (d.NH + 2 * d.NKV) * d.HS; d.A = d.NH * d.HS;
  d.G = cfg.intermediate / tp;
  d.H = cfg.arch == models::Arch::kGpt2 ? d.G : 2 * d.G;
  d.sp = sp && tp > 1;
  d.Nl = d.sp ? d.N / tp : d.N;
  return d;
}

namespace {

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
  if (t == "zerooneadam") return 3;  // exp_avg, exp_avg_sq, momentum_accumulator
  if (t == "onebitlamb") return 3;   // exp_avg, exp_avg_sq, exp_avg_sq_fresh
  return 2;  // Adam, AdamW, Lamb, 1-bit Adam: exp_avg, exp_avg_sq
}

namespace {

// The exchange's plan (parallel/grad_sync's OneBitSync); in has a 1-bit optimizer over world > 1.
comm::OneBitPlan onebit_plan(const MemoryInput& in, int world) {
  MT_CHECK(in.tp == 1 && !in.pipeline(), ErrorKind::kInvalidArgument, "memory estimate: 1-bit optimizers take no tp or pp");
  // The parameter tensors as the store holds them (every block alike), each padded on its own.
  ModelSkeleton sk(in.model, 1, in.vocab_divisible);
  std::vector<std::pair<size_t, size_t>> spans;
  size_t P = 0;
  auto add = [&](nn::Module& m, int copies) {
    std::vector<nn::Parameter*> ps;
    m.collect_parameters(ps);
    for (int c = 0; c < copies; ++c)
      for (nn::Parameter* p : ps) {
        spans.emplace_back(P, static_cast<size_t>(p->numel()));
        P += static_cast<size_t>(p->numel());
      }
  };
  for (auto& m : sk.embeddings) add(*m, 1);
  add(*sk.block, in.model.n_layer);
  for (auto& m : sk.tail) add(*m, 1);
  if (in.onebit == MemoryInput::OneBit::kFlat) spans = {{0, P}};
  return comm::OneBitPlan(spans, world);
}

}  // namespace

std::pair<size_t, size_t> onebit_error_bytes(const MemoryInput& in, int world) {
  if (in.onebit == MemoryInput::OneBit::kNone || world <= 1) return {0, 0};
  const comm::OneBitPlan plan = onebit_plan(in, world);
  return {4 * plan.worker_error_len, 4 * plan.server_error_len};
}

size_t onebit_scratch_bytes(const MemoryInput& in, int world) {
  if (in.onebit == MemoryInput::OneBit::kNone || world <= 1) return 0;
  return comm::compressed_all_reduce_scratch_bytes(onebit_plan(in, world));
}

std::vector<parallel::Unit> model_units(const models::ModelConfig& cfg, int tp, int vocab_divisible) {
  ModelSkeleton sk(cfg, tp, vocab_divisible);
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

std::vector<parallel::Unit> stage_units(const MemoryInput& in) {
  if (!in.pipeline()) return model_units(in.model, in.tp, in.vocab_divisible);
  // TransformerLM's registration order on a stage: the token table (with the embedding, or as the
  // tied head), positions (with the embedding), the chunks' blocks, the tail (with the head).
  ModelSkeleton sk(in.model, in.tp, in.vocab_divisible);
  std::vector<parallel::Unit> units;
  size_t offset = 0;
  auto add = [&](std::string name, const std::vector<nn::Module*>& ms) {
    units.push_back(unit_of(std::move(name), ms, offset));
    offset += units.back().numel;
  };
  if (in.first_stage) add("embeddings", raw(sk.embeddings));
  else if (in.last_stage && models::head_is_token_table(in.model)) add("embeddings", {sk.embeddings[0].get()});
  for (auto [lo, hi] : in.chunks)
    for (int l = lo; l < hi; ++l) add("h." + std::to_string(l), {sk.block.get()});
  if (in.last_stage) add("tail", raw(sk.tail));
  return units;
}

parallel::pp::PartitionInput pipeline_partition_input(const models::ModelConfig& m, int stages) {
  const double C = m.hidden, I = m.intermediate, V = m.vocab_size, HS = m.head_dim();
  const bool gpt2 = m.arch == models::Arch::kGpt2;
  const double block = gpt2 ? 4 * C + 3 * C * C + 3 * C + C * C + C + C * I + I + I * C + C
                            : 2 * C + C * HS * (m.n_head + 2.0 * m.n_kv_head) + m.n_head * HS * C + 3 * C * I;
  parallel::pp::PartitionInput in;
  in.stages = stages;
  in.layer_cost.assign(m.n_layer, block);
  in.first_cost = V * C + (gpt2 ? m.max_positions * C : 0.0);
  // The head: a classifier's score.weight (num_labels rows), else the (tied or untied) token table.
  in.last_cost = (gpt2 ? 2 * C : C) + (m.num_labels > 0 ? static_cast<double>(m.num_labels) : V) * C;
  return in;
}

MemoryInput pipeline_rank_input(MemoryInput in, const parallel::pp::ScheduleSpec& spec, const std::vector<int>& bounds, int q) {
  in.pp = spec.pp;
  in.pp_rank = q;
  in.chunks.clear();
  const int S = static_cast<int>(bounds.size()) - 1;
  for (int st = q; st < S; st += spec.pp) in.chunks.push_back({bounds[st], bounds[st + 1]});
  in.first_stage = q == 0;
  in.last_stage = q == spec.pp - 1;
  const parallel::pp::RankBuffers buffers = parallel::pp::rank_buffers(spec, q);
  in.slots = buffers.slots;
  in.grads_in_flight = buffers.grads_in_flight;
  return in;
}

size_t largest_module_params(const models::ModelConfig& cfg) {
  ModelSkeleton sk(cfg);
  size_t best = largest_own_params(*sk.block);
  for (const auto& m : sk.embeddings) best = std::max(best, largest_own_params(*m));
  for (const auto& m : sk.tail) best = std::max(best, largest_own_params(*m));
  return best;
}

OptimizerSwap optimizer_swap(size_t span, int states, int64_t sub_group_size, int buffers) {
  // optim::SwappedAdamW: sub-groups of a multiple of 1024 elements (4 KiB of f32), one slot
  // buffer per state per resident sub-group, each an io::AlignedBuffer of whole pages (no pad).
  constexpr size_t kAlign = 4096, unit = kAlign / 4;
  auto align_up = [](size_t n) { return (n + kAlign - 1) / kAlign * kAlign; };
  OptimizerSwap r;
  const size_t sub = static_cast<size_t>(std::max<int64_t>(sub_group_size, 1));
  const size_t group = std::max(unit, (std::min(sub, std::max<size_t>(span, 1)) + unit - 1) / unit * unit);
  r.sub_groups = span == 0 ? 0 : (span + group - 1) / group;
  const size_t slots = std::min(static_cast<size_t>(std::max(buffers, 1)), std::max<size_t>(r.sub_groups, 1));
  r.slot_bytes = align_up(group * 4);
  r.slot_buffers = slots * static_cast<size_t>(states);
  r.resident = r.slot_buffers * r.slot_bytes;
  if (r.sub_groups > 0)  // every sub-group at its stride; the last one's own length rounded to 4 KiB
    r.disk = static_cast<uint64_t>(states) *
             ((r.sub_groups - 1) * align_up(group * 4) + align_up((span - (r.sub_groups - 1) * group) * 4));
  return r;
}

OptimizerSwap param_swap(const std::vector<size_t>& pieces, int64_t sub_group_size, int buffers) {
  // parallel::ZeroRuntime::swap_records and optim::SwappedAdamW's sub-groups of whole records.
  constexpr size_t kAlign = 4096;
  auto align_up = [](size_t n) { return (n + kAlign - 1) / kAlign * kAlign; };
  const size_t sub = static_cast<size_t>(std::max<int64_t>(sub_group_size, 1));
  const size_t chunk = std::max<size_t>(1024, sub / 1024 * 1024);
  struct Rec {
    size_t numel;
    uint64_t off;
  };
  std::vector<Rec> recs;
  uint64_t at = 0;
  for (size_t p : pieces) {
    for (size_t k = 0; k < p; k += chunk) recs.push_back({std::min(chunk, p - k), at + k * 4});
    at += align_up(p * 4);
  }
  OptimizerSwap r;
  size_t slot = 0;
  for (size_t i = 0; i < recs.size();) {
    const size_t first = i;
    size_t n = 0;
    while (i < recs.size() && (i == first || n + recs[i].numel <= sub)) n += recs[i++].numel;
    slot = std::max(slot, align_up(static_cast<size_t>(recs[i - 1].off - recs[first].off) + recs[i - 1].numel * 4));
    ++r.sub_groups;
  }
  const size_t slots = std::min(static_cast<size_t>(std::max(buffers, 1)), std::max<size_t>(r.sub_groups, 1));
  r.slot_bytes = slot;
  r.slot_buffers = slots * 4;
  r.resident = r.slot_buffers * r.slot_bytes;
  if (!recs.empty()) r.disk = 2 * (recs.back().off + align_up(recs.back().numel * 4)) + 2 * at;
  return r;
}

namespace {

// Replays what parallel::ZeroRuntime allocates: the runtime's own schedule (parallel::ZeroSchedule)
// driven through the hooks the model runs, with effects that count bytes instead of allocating:
// construction from the ParamStore, then training micro-batches and optimizer steps. Every
// Buffer of the runtime is one alloc()/release() here with the same bytes and category.
// Nonblocking work finishes either only when waited for (late) or at the first hook after its
// launch (early: oldest_reduce_done() is true whenever a reduction is pending). Which one holds is
// MPI's timing; completing frees the receive buffer, but with parameters on disk it also allocates
// the piece's gradient record, so neither policy bounds the other: estimate_stage runs both.
class ZeroReplay : private parallel::ZeroEffects {
 public:
  ZeroReplay(const std::vector<parallel::Unit>& units, int stage, int world, size_t e, int k, bool tied_head,
             const ZeroKnobs& z, bool pipeline, bool early)
      : early_(early), units_(units), stage_(stage), N_(static_cast<size_t>(world)), e_(e), k_(static_cast<size_t>(k)),
        tied_(tied_head), pipeline_(pipeline), comm_(z.comm_dtype), zero_(z), record_(units.size()), views_(units.size()),
        schedule_(units, schedule_options(stage, z), *this) {
    for (const parallel::Unit& u : units_) {
      P_ += u.numel;
      S_ += piece(u);
    }
  }

  // Setup peak (store + runtime construction + optimizer) and the steady-state peak of training.
  // `step`: the model's own blocks (step_blocks), made after the engine is built; they count in
  // footprint() only (the categories' peaks take them from step_memory).
  void run(MemoryBreakdown& setup, MemoryBreakdown& steady, const std::vector<BlockEvent>& step = {}) {
    const bool lowp = e_ != 4;
    const bool swap = param_swap_on();
    // nn::ParamStore (TransformerLM's constructor) holds no buffers: the runtime makes its shards
    // from the initial values, the seed's or init_from's weights read a parameter at a time
    // (deferred initialisation, engine_build_model; DESIGN-NOTES 57, 67).
    // ZeroRuntime(): master and gradient shards (or, swapped, one bounce buffer of the largest
    // piece while the records are written), the persistent views' targets filled from the initial
    // values, then the schedule's construction.
    if (swap) {
      size_t most = 0;
      for (const parallel::Unit& u : units_) most = std::max(most, align4k(piece(u) * 4));
      alloc(MemCategory::kComm, most);  // AlignedBuffers of whole pages: no pad
      release(MemCategory::kComm, most);
    } else {
      alloc(lowp ? MemCategory::kOptimizer : MemCategory::kParams, 4 * S_);
      alloc(MemCategory::kGrads, 4 * S_);
    }
    for (size_t u = 0; u < units_.size(); ++u) {
      if (!schedule_.persistent(u)) continue;
      View& v = views_[u];
      if (lowp) {
        alloc(MemCategory::kComm, v.staging = 4 * padded(u));
      } else {
        alloc(MemCategory::kParams, v.f32 = 4 * padded(u));
      }
    }
    schedule_.construct();
    if (swap) {  // the slots of master, gradients and moments
      std::vector<size_t> pieces;
      for (const parallel::Unit& u : units_) pieces.push_back(piece(u));
      alloc_slots(param_swap(pieces, zero_.sub_group_size, zero_.swap_buffers));
    } else if (zero_.optimizer_nvme) {  // only the swap's slots are resident
      alloc_slots(optimizer_swap(S_, static_cast<int>(k_), zero_.sub_group_size, zero_.swap_buffers));
    } else {
      for (size_t j = 0; j < k_; ++j) alloc(MemCategory::kOptimizer, 4 * S_);  // each state over the shard
    }
    setup = peak_;
    peak_ = cur_;  // Allocator::reset_peaks() after the engine is built (cli/train.cpp)
    for (const BlockEvent& b : step) b.release ? fp_.release(b.bytes) : fp_.allocate(b.bytes);
    for (int step = 0; step < 2; ++step) {
      if (pipeline_) {
        // engine::Engine::train_pipeline: backwards that do not reduce (stage 1 allocates nothing
        // in their hooks), then the whole step's reduction without a backward.
        schedule_.set_last_micro_batch(false);
        schedule_.finish_backward();
        schedule_.set_last_micro_batch(true);
      } else {
        schedule_.set_last_micro_batch(true);
        micro_batch();
      }
      schedule_.finish_backward();
      if (swap) {  // ZeroRuntime::finish_backward: every gradient record written
        for (size_t u = 0; u < record_.size(); ++u) free_record(u);
        writing_.clear();
      }
      schedule_.refresh();
    }
    steady = peak_;
  }
  const FootprintReplay& footprint() const { return fp_; }

 private:
  struct View {
    size_t f32 = 0, lowp = 0, staging = 0, grad = 0, piece = 0;
  };

  static parallel::ZeroScheduleOptions schedule_options(int stage, const ZeroKnobs& z) {
    parallel::ZeroScheduleOptions o;
    o.stage = stage;
    o.overlap_comm = z.overlap_comm;
    o.prefetch_elems = static_cast<size_t>(z.prefetch_bucket_size);
    o.persistence_threshold = static_cast<size_t>(z.param_persistence_threshold);
    o.max_live_elems = static_cast<size_t>(z.max_live_parameters);
    o.comm_dtype = z.comm_dtype;
    return o;
  }
  size_t piece(const parallel::Unit& u) const { return (u.numel + N_ - 1) / N_; }
  static size_t align4k(size_t b) { return (b + 4095) / 4096 * 4096; }
  bool param_swap_on() const { return zero_.param_nvme && stage_ == 3; }
  void free_record(size_t u) {
    release(MemCategory::kComm, record_[u]);
    record_[u] = 0;
  }
  size_t padded(size_t u) const { return piece(units_[u]) * N_; }
  // One Buffer of the runtime (none for 0 bytes: what is not made).
  void alloc(MemCategory c, size_t b) {
    cur_[c] += b;
    peak_[c] = std::max(peak_[c], cur_[c]);
    if (b) fp_.allocate(b);
  }
  void release(MemCategory c, size_t b) {
    cur_[c] -= b;
    if (b) fp_.release(b);
  }
  void alloc_slots(const OptimizerSwap& w) {  // optim::SwappedAdamW's slot buffers
    for (size_t j = 0; j < w.slot_buffers; ++j) alloc(MemCategory::kOptimizer, w.slot_bytes);
  }

  // parallel::ZeroEffects, as ZeroRuntime implements them, in bytes.
  // ZeroRuntime::piece_is_unit(): one rank, low precision, on disk — the views are converted from
  // the piece read, with no staging.
  bool piece_is_unit() const { return param_swap_on() && N_ == 1 && e_ != 4; }
  // ZeroRuntime::image_view: the view an image of the unit in the compute dtype, gathered in place,
  // and the other elements' f32 runs in staging.
  bool image(size_t u) const {
    return e_ != 4 && !param_swap_on() && parallel::gathers_in_compute_dtype(units_[u], piece(units_[u]), static_cast<int>(N_));
  }
  void alloc_view(size_t u) {  // ZeroRuntime::alloc_lowp_view
    View& v = views_[u];
    if (v.lowp) return;
    const parallel::Unit& unit = units_[u];
    alloc(MemCategory::kParams, v.lowp = (image(u) ? padded(u) : std::max<size_t>(unit.matrix_numel, 1)) * e_);
    alloc(MemCategory::kParams, v.f32 = std::max<size_t>(unit.numel - unit.matrix_numel, 1) * 4);
  }
  void start_gather(size_t u) override {
    View& v = views_[u];
    if (image(u)) {
      alloc_view(u);
      alloc(MemCategory::kComm, v.staging = 4 * N_ * (units_[u].numel - units_[u].matrix_numel));
      return;
    }
    if (e_ == 4) {
      if (!v.f32) alloc(MemCategory::kParams, v.f32 = 4 * padded(u));
    } else if (!piece_is_unit()) {
      alloc(MemCategory::kComm, v.staging = 4 * padded(u));
    }
    if (param_swap_on()) alloc(MemCategory::kComm, v.piece = align4k(piece(units_[u]) * 4));  // read from disk
  }
  void finish_gather(size_t u) override {
    View& v = views_[u];
    if (!piece_is_unit()) {
      release(MemCategory::kComm, v.piece);  // all-gathered, then freed
      v.piece = 0;
    }
    if (e_ == 4) return;
    alloc_view(u);
    release(MemCategory::kComm, v.staging);
    release(MemCategory::kComm, v.piece);
    v.staging = v.piece = 0;
  }
  void cancel_gather(size_t u) override {
    release(MemCategory::kComm, views_[u].staging);
    release(MemCategory::kComm, views_[u].piece);
    views_[u].staging = views_[u].piece = 0;
  }
  void free_view(size_t u) override {
    View& v = views_[u];
    release(MemCategory::kParams, v.f32);
    release(MemCategory::kParams, v.lowp);
    v.f32 = v.lowp = 0;
  }
  void begin_grad_slab(size_t u) override {
    View& v = views_[u];
    if (!v.grad) alloc(MemCategory::kGrads, v.grad = 4 * padded(u));
  }
  bool oldest_reduce_done() override { return early_ && !recv_.empty(); }
  void launch_reduce(size_t u) override {
    // f32: the receive buffer; a 16-bit communication_data_type: the unit's slab rounded to it and
    // a 2-byte receive buffer (ZeroRuntime::launch_reduce).
    // On disk, f32: the receive buffer is the piece's gradient record (whole pages).
    const size_t w = dtype_size(comm_);
    const size_t bytes = param_swap_on() && comm_ == DType::kF32 ? align4k(4 * piece(units_[u])) : w * piece(units_[u]);
    const size_t send = comm_ != DType::kF32 ? w * padded(u) : 0;
    alloc(MemCategory::kComm, bytes);
    alloc(MemCategory::kComm, send);
    recv_.push_back(bytes);
    send_.push_back(send);
    // The ring's scratch (comm::MpiBackend::reduce_scatter) until the ring is done: at the latest
    // where the reduction is waited for.
    const size_t scratch = comm::reduce_scatter_scratch_bytes(static_cast<int>(N_), w * piece(units_[u]), false);
    alloc(MemCategory::kComm, scratch);
    scratch_.push_back(scratch);
  }
  void complete_reduce(size_t u, bool free_slab) override {
    release(MemCategory::kComm, scratch_.front());
    scratch_.erase(scratch_.begin());
    const bool received_in_record = param_swap_on() && comm_ == DType::kF32;
    if (param_swap_on()) {  // the piece's record: summed, written behind (two writes in flight)
      free_record(u);
      if (received_in_record) {  // the receive buffer becomes the record; the sum so far read beside it
        record_[u] = recv_.front();
        if (zero_.accumulation) {
          alloc(MemCategory::kComm, record_[u]);
          release(MemCategory::kComm, record_[u]);
        }
      }
      else alloc(MemCategory::kComm, record_[u] = align4k(piece(units_[u]) * 4));
      writing_.push_back(u);
      while (writing_.size() > 2) {
        free_record(writing_.front());
        writing_.erase(writing_.begin());
      }
    }
    if (!received_in_record) release(MemCategory::kComm, recv_.front());
    release(MemCategory::kComm, send_.front());
    recv_.erase(recv_.begin());
    send_.erase(send_.begin());
    if (free_slab) {
      release(MemCategory::kGrads, views_[u].grad);
      views_[u].grad = 0;
    }
  }

  // TransformerLM::forward (trunk, fused head) and backward, as their modules run the hooks.
  // Recompute adds a block forward inside backward: it only takes and returns a reference.
  void micro_batch() {
    const size_t last = units_.size() - 1;
    for (size_t u = 0; u <= last; ++u) {
      schedule_.on_hook(u, true, true);
      schedule_.on_hook(u, false, true);
    }
    size_t head = tied_ ? 0 : last;
    schedule_.on_hook(head, true, false);
    schedule_.on_hook(head, false, false);
    for (size_t u = last + 1; u-- > 0;) {
      schedule_.on_hook(u, true, false);
      schedule_.on_hook(u, false, false);
    }
  }

  bool early_;
  const std::vector<parallel::Unit>& units_;
  int stage_;
  size_t N_, e_, k_;
  bool tied_, pipeline_;
  DType comm_;
  ZeroKnobs zero_;
  std::vector<size_t> record_;   // per unit: its gradient record in memory (offload_param nvme)
  std::vector<size_t> writing_;  // units whose record is being written, oldest first
  std::vector<View> views_;
  std::vector<size_t> recv_;  // receive buffers of the reductions in flight, oldest first
  std::vector<size_t> send_;  // their 16-bit send copies (0: none)
  std::vector<size_t> scratch_;  // their rings' scratch, likewise
  size_t P_ = 0, S_ = 0;
  MemoryBreakdown cur_, peak_;
  FootprintReplay fp_;  // every block, through the allocator's rules
  parallel::ZeroSchedule schedule_;
};

}  // namespace

MemoryBreakdown model_state_memory(const std::vector<parallel::Unit>& units, int stage, int world,
                                   size_t e, int k, const ZeroKnobs& zero, bool tied_head,
                                   MemoryBreakdown* setup, bool pipeline, bool early_completion,
                                   const std::vector<BlockEvent>* step_blocks, FootprintReplay* footprint) {
  MT_CHECK(world >= 1 && stage >= 0 && stage <= 3 && (e == 2 || e == 4) && units.size() >= (pipeline ? 1u : 2u) &&
               (!pipeline || stage <= 1),
           ErrorKind::kInvalidArgument, "memory estimate: bad stage/world/dtype/units");
  const bool lowp = e != 4;
  const size_t ku = static_cast<size_t>(k);
  MemoryBreakdown m;
  size_t P = 0;
  for (const parallel::Unit& u : units) P += u.numel;
  if (stage == 0) {  // nn::ParamStore + the optimizer over the whole flat buffer
    m[MemCategory::kParams] = lowp ? e * P : 4 * P;
    m[MemCategory::kOptimizer] = (lowp ? 4 * P : 0) + 4 * ku * P + zero.onebit_worker_errors + zero.onebit_server_errors;
    m[MemCategory::kGrads] = 4 * P;
    m[MemCategory::kWorkspace] = zero.optimizer_workspace;
    if (setup) *setup = m;
    // parallel::GradBuckets with a 16-bit communication_data_type: every bucket's 2-byte staging
    // lives until the step's reduction ends.
    if (world > 1 && zero.comm_dtype != DType::kF32) m[MemCategory::kComm] = dtype_size(zero.comm_dtype) * P;
    if (footprint) {  // the store's buffers (master, gradients, compute copy), the states, the model's
      FootprintReplay f;
      f.allocate(4 * P);
      f.allocate(4 * P);
      if (lowp) f.allocate(e * P);
      // The 1-bit exchange's errors (the gradient sync, built before the optimizer), the states,
      // 1-bit LAMB's momentum copy.
      if (zero.onebit_worker_errors) f.allocate(zero.onebit_worker_errors);
      if (zero.onebit_server_errors) f.allocate(zero.onebit_server_errors);
      for (size_t j = 0; j < ku; ++j) f.allocate(4 * P);
      if (zero.optimizer_workspace) f.allocate(zero.optimizer_workspace);
      if (step_blocks)
        for (const BlockEvent& b : *step_blocks) b.release ? f.release(b.bytes) : f.allocate(b.bytes);
      if (m[MemCategory::kComm]) f.allocate(m[MemCategory::kComm]);
      *footprint = f;
    }
    return m;
  }
  MemoryBreakdown s;
  ZeroReplay replay(units, stage, world, e, k, tied_head, zero, pipeline, early_completion);
  replay.run(s, m, step_blocks ? *step_blocks : std::vector<BlockEvent>{});
  if (setup) *setup = s;
  if (footprint) *footprint = replay.footprint();
  return m;
}

std::vector<BlockEvent> step_blocks(const MemoryInput& in) {
  const models::ModelConfig& cfg = in.model;
  const bool gpt2 = cfg.arch == models::Arch::kGpt2;
  const models::BlockDims d = block_dims(cfg, in.micro_batch, in.seq_length, in.tp, in.sequence_parallel, in.usp);
  // V: this rank's rows of the head (the padded vocabulary's, or a classifier's labels); R: its
  // rows of the residual stream.
  const size_t N = static_cast<size_t>(d.N), C = static_cast<size_t>(d.C), Rr = static_cast<size_t>(d.rows()),
               V = static_cast<size_t>(models::head_rows_per_rank(cfg, in.tp, in.vocab_divisible));
  const size_t e = dtype_size(in.compute_dtype);
  const bool lowp = in.compute_dtype != DType::kF32;
  std::vector<BlockEvent> out;
  auto make = [&out](MemCategory c, size_t bytes) {
    if (bytes) out.push_back({c, bytes, false});
  };
  auto free = [&out](MemCategory c, size_t bytes) {
    if (bytes) out.push_back({c, bytes, true});
  };

  // TransformerLM::prepare: saved activations of every block (one with recompute), the residual
  // stream (L+1 copies of this rank's rows) and the head's rows (norm stats, final-norm output,
  // dL/dnorm, dres, losses, + the gathered rows under sequence parallelism; 64-byte-aligned
  // pieces), and the token copy (+ this shard's token rows under tp).
  // The shared recompute set, then one buffer per activation slot (one per micro-batch in flight;
  // a pipeline stage holds its chunks' layers, the head's rows only with the head, the tokens only
  // with the embedding), then dres.
  models::BlockActs acts{};
  size_t per_block = models::BlockActs::layout(&acts, nullptr, d, in.compute_dtype, gpt2);
  size_t layers = static_cast<size_t>(cfg.n_layer);
  if (in.pipeline()) {
    layers = 0;
    for (auto [lo, hi] : in.chunks) layers = std::max(layers, static_cast<size_t>(hi - lo));
  }
  size_t slot = (in.recompute ? 0 : per_block * layers) + (layers + 1) * Rr * C * 4 + 64;
  if (in.last_stage) slot += 2 * Rr * 4 + N * C * e + N * C * 4 + N * 4 + 4 * 64;
  if (d.sp) slot += N * C * 4 + 64;
  if (in.first_stage) slot += N * 4 * (in.tp > 1 ? 2 : 1) + 64;
  // Documents: each token's position and first key (Ulysses: every token's of the whole samples,
  // and this rank's positions); Ulysses: this rank's tokens and targets.
  if (in.documents) slot += (in.usp > 1 ? 2 * N * static_cast<size_t>(in.usp) + N : 2 * N) * 4 + 64;
  if (in.usp > 1) slot += 2 * N * 4 + 64;
  make(MemCategory::kActivations, in.recompute ? per_block : 0);
  for (int i = 0; i < in.slots; ++i) make(MemCategory::kActivations, slot);
  make(MemCategory::kActivations, Rr * C * 4);

  // Workspace: BlockScratch (+ LLaMA's RoPE tables), then nn::Workspace's slots.
  models::BlockScratch scratch{};
  size_t ws = models::BlockScratch::layout(&scratch, nullptr, d, in.compute_dtype);
  if (!gpt2) ws += 2 * static_cast<size_t>(d.T) * static_cast<size_t>(d.usp) * (d.HS / 2) * 4 + 128;  // every position
  make(MemCategory::kWorkspace, ws);
  // Ulysses: the all-to-all's send and receive buffers, made at the first exchange (the first
  // block's q, k, v, the widest) and kept.
  if (d.usp > 1)
    for (int i = 0; i < 2; ++i) make(MemCategory::kComm, N * static_cast<size_t>(std::max(d.QKV, d.A)) * 4);
  // nn::lm_head_cross_entropy: equal row tiles of at most 64 MiB of f32 logits (lm_head.cpp):
  // logits R V f32 (rows of lm_head_logits_ld), their compute-dtype copy (low precision; rows of
  // lm_head_operand_ld) or, f16 widened, the weight V C and a tile's rows R C in f32; the row
  // log-sum-exps. Each a slot.
  if (in.last_stage) {  // a pipeline stage without the head has no logits
    size_t budget_rows = std::max<size_t>(1, (size_t{64} << 20) / (4 * V));
    size_t R = std::min(N, ceil_div(N, ceil_div(N, budget_rows)));
    make(MemCategory::kWorkspace, R * static_cast<size_t>(nn::lm_head_logits_ld(static_cast<int>(V), in.compute_dtype)) * 4);
    if (f16_widened(in)) {  // the weight and a tile's rows in f32; dlogits in place
      make(MemCategory::kWorkspace, V * C * 4);
      make(MemCategory::kWorkspace, R * C * 4);
    } else if (lowp) {
      make(MemCategory::kWorkspace, R * static_cast<size_t>(nn::lm_head_operand_ld(static_cast<int>(V), in.compute_dtype)) * e);
    }
    make(MemCategory::kWorkspace, R * 4);
  }
  // nn::Linear::backward converts dL/dy (N, out) to the compute dtype in one slot that grows to the
  // largest request; a growth holds the old and the new buffer for a moment. Backward visits each
  // block's GEMMs as down/c_proj (C), up+gate/c_fc (H), o_proj/c_proj (C), qkv/c_attn (QKV).
  if (lowp) {
    size_t cur = 0;
    for (int o : {d.C, d.H, d.C, d.QKV}) {
      const size_t bytes = N * static_cast<size_t>(o) * e;
      if (bytes > cur) {
        make(MemCategory::kWorkspace, bytes);
        free(MemCategory::kWorkspace, cur);
        cur = bytes;
      }
    }
  }
  if (in.pipeline()) {
    // The pipeline executor's buffers (engine::Engine::train_pipeline), freed before the step's
    // reduction: the received gradient and each gradient sent back; then the tied token table's
    // partner gradient.
    const size_t E = Rr * C * 4;
    for (int i = 0; i <= in.grads_in_flight; ++i) make(MemCategory::kComm, E);
    for (int i = 0; i <= in.grads_in_flight; ++i) free(MemCategory::kComm, E);
    if (models::head_is_token_table(cfg) && in.pp > 1 && (in.first_stage || in.last_stage)) {
      make(MemCategory::kComm, V * C * 4);
      free(MemCategory::kComm, V * C * 4);
    }
  }
  // Sequence parallelism reduce-scatters this rank's rows over tp ranks (parallel::TpComm) with the
  // ring, whose scratch is a block of them from 3 ranks on.
  if (d.sp) {
    const size_t b = comm::reduce_scatter_scratch_bytes(in.tp, Rr * C * 4, false);
    make(MemCategory::kComm, b);
    free(MemCategory::kComm, b);
  }
  return out;
}

MemoryBreakdown step_memory(const MemoryInput& in) {
  MemoryBreakdown cur, m;
  for (const BlockEvent& b : step_blocks(in)) {
    if (b.release) {
      cur[b.category] -= b.bytes;
    } else {
      cur[b.category] += b.bytes;
      m[b.category] = std::max(m[b.category], cur[b.category]);
    }
  }
  return m;
}

size_t libnbc_allreduce_touched(size_t count, size_t elem_bytes, int p) {
  if (p <= 1 || count == 0) return 0;
  const size_t seg = (count + static_cast<size_t>(p) - 1) / static_cast<size_t>(p) * elem_bytes;
  return (seg + 4095) / 4096 * 4096;
}

namespace {

// One kernels::gemm call of a step: its shape and form (lda, ldc 0: dense).
struct GemmCall {
  int M, N, K;
  bool ta, tb, acc, bias;
  int lda = 0, ldc = 0;
  bool head = false;  // the LM head's, which widens its own operands (nn::lm_head_widened)
};

// The GEMMs a rank's step makes (each layer's forward, dX and dW; the head's tiles).
std::vector<GemmCall> step_gemms(const MemoryInput& in) {
  const bool gpt2 = in.model.arch == models::Arch::kGpt2;
  const models::BlockDims d = block_dims(in.model, in.micro_batch, in.seq_length, in.tp, in.sequence_parallel, in.usp);
  std::vector<GemmCall> calls;
  // A layer of `in` to `out` features, row-parallel (`row`) or not, over M rows: GPT-2's Conv1D
  // weights are stored (in, out) with a bias (a row-parallel layer's deferred over tp ranks),
  // LLaMA's (out, in) without.
  auto layer = [&](int in_f, int out_f, bool row, int M) {
    if (gpt2) {
      calls.push_back({M, out_f, in_f, false, false, false, !(row && in.tp > 1)});
      calls.push_back({M, in_f, out_f, false, true, false, false});
      calls.push_back({in_f, out_f, M, true, false, true, false});
    } else {
      calls.push_back({M, out_f, in_f, false, true, false, false});
      calls.push_back({M, in_f, out_f, false, false, false, false});
      calls.push_back({out_f, in_f, M, true, false, true, false});
    }
  };
  bool blocks = !in.pipeline();
  for (auto [lo, hi] : in.chunks) blocks = blocks || hi > lo;
  if (blocks) {
    layer(d.C, d.QKV, false, d.N);
    layer(d.A, d.C, true, d.N);
    layer(d.C, d.H, false, d.N);
    layer(d.G, d.C, true, d.N);
  }
  if (in.last_stage) {  // the head's tiles: logits, the input's gradient, the weight's gradient
    const int V = models::head_rows_per_rank(in.model, in.tp, in.vocab_divisible);
    const int R = nn::lm_head_tile_rows(d.N, V);
    const int ldl = nn::lm_head_logits_ld(V, in.compute_dtype), ld = nn::lm_head_operand_ld(V, in.compute_dtype);
    for (int r : {R, d.N - (d.N - 1) / R * R}) {  // their strides: nn::lm_head_cross_entropy's
      calls.push_back({r, V, d.C, false, true, false, false, 0, ldl, true});
      calls.push_back({r, d.C, V, false, false, false, false, ld, 0, true});
      calls.push_back({V, d.C, r, true, false, true, false, ld, 0, true});
    }
  }
  return calls;
}

}  // namespace

size_t gemm_scratch_bytes(const MemoryInput& in) {
  size_t most = 0;
  for (const GemmCall& g : step_gemms(in))
    most = std::max(most, kernels::gemm_scratch_bytes(g.M, g.N, g.K, g.ta, g.tb, in.compute_dtype, g.acc, g.bias, in.threads,
                                                      g.lda, g.ldc));
  return most;
}

bool f16_widened(const MemoryInput& in) {
  if (in.compute_dtype != DType::kF16) return false;
  return in.f16_native < 0 ? nn::lm_head_widened(in.compute_dtype) : in.f16_native == 0;
}

size_t gemm_widen_bytes(const MemoryInput& in) {
  // bf16 where oneDNN has no bf16 matmul here (a CPU without AVX512-BF16 or AMX: AVX2 alone): gemm
  // widens every call's operands, the LM head's too (it keeps f32 copies of its own for f16 only).
  // It was priced as native: an estimate 14.7 MB short at GPT-2's smallest head. A calibrated
  // plan's machine multiplies bf16 as its calibration found (MemoryInput::bf16_native).
  const bool bf16_widened = in.compute_dtype == DType::kBF16 &&
                            (in.bf16_native < 0 ? !kernels::gemm_native(DType::kBF16) : in.bf16_native == 0);
  if (!f16_widened(in) && !bf16_widened) return 0;
  size_t a = 0, b = 0;
  for (const GemmCall& g : step_gemms(in)) {
    if (g.head && !bf16_widened) continue;  // f32 GEMMs on the head's own copies (nn::lm_head_cross_entropy)
    const auto [ga, gb] = kernels::gemm_widen_pages(g.M, g.N, g.K);  // the plan's answer, not this host's
    a = std::max(a, ga);
    b = std::max(b, gb);
  }
  return a + b;
}

// in.zero with what a stage-0 run's optimizer adds (a 1-bit optimizer's exchange errors, 1-bit
// LAMB's momentum copy).
static ZeroKnobs state_knobs(const MemoryInput& in, int stage, const std::vector<parallel::Unit>& units) {
  ZeroKnobs z = in.zero;
  if (stage != 0) return z;
  std::tie(z.onebit_worker_errors, z.onebit_server_errors) = onebit_error_bytes(in, in.world);
  if (in.optimizer_momentum_copy)
    for (const parallel::Unit& u : units) z.optimizer_workspace += 4 * u.numel;
  return z;
}

StageEstimate estimate_stage(const MemoryInput& in, int stage) {
  check_input(in, stage);
  std::vector<parallel::Unit> units = stage_units(in);
  const ZeroKnobs knobs = state_knobs(in, stage, units);
  size_t e = dtype_size(in.compute_dtype);
  StageEstimate r;
  r.stage = stage;
  // On one rank a reduction is a local copy, done when launched: its buffers go at the next hook.
  const bool local = in.world == 1;
  const std::vector<BlockEvent> blocks = step_blocks(in);
  FootprintReplay fp;
  r.ours = model_state_memory(units, stage, in.world, e, in.optimizer_states, knobs, models::head_is_token_table(in.model),
                              &r.setup, in.pipeline(), local, &blocks, &fp);
  r.held = fp.held_peak();
  r.mapped = fp.mapped_peak();
  // MPI's temporaries: stage 0's buckets over the data-parallel ranks (parallel::GradBuckets: each
  // waited for at its launch, or, with overlap_comm, all in flight until finish), and tp's
  // all-reduces of a micro-batch's rows (one at a time), whichever is larger.
  if (stage == 0 && in.world > 1) {
    size_t P = 0;
    for (const parallel::Unit& u : units) P += u.numel;
    const size_t wire = dtype_size(in.zero.comm_dtype);
    for (auto [lo, hi] : parallel::grad_bucket_ranges(P, static_cast<size_t>(std::max<int64_t>(in.zero.reduce_bucket_size, 1)))) {
      const size_t b = libnbc_allreduce_touched(hi - lo, wire, in.world);
      r.mpi = in.zero.overlap_comm ? r.mpi + b : std::max(r.mpi, b);
    }
  }
  if (in.tp > 1 && !in.sequence_parallel) {
    const models::BlockDims d = block_dims(in.model, in.micro_batch, in.seq_length, in.tp, false);
    r.mpi = std::max(r.mpi, libnbc_allreduce_touched(static_cast<size_t>(d.N) * static_cast<size_t>(d.C), 4, in.tp));
  }
  if (stage == 0) {
    r.exchange = onebit_scratch_bytes(in, in.world);
    r.exchange_beside_mpi = in.exchange_beside_all_reduce;
  }
  r.gemm_scratch = gemm_scratch_bytes(in);
  r.gemm_widen = gemm_widen_bytes(in);
  MemoryBreakdown step = step_memory(in);
  r.ours[MemCategory::kActivations] = step[MemCategory::kActivations];
  r.ours[MemCategory::kWorkspace] = step[MemCategory::kWorkspace] + knobs.optimizer_workspace;
  // The pipeline executor's buffers (engine::Engine::train_pipeline), freed before the step's
  // reduction: the received gradient and each gradient sent back; then the tied token table's
  // partner gradient. The comm peak is the largest of these phases.
  // overlap_comm: the comm and gradient peaks depend on when MPI finishes a reduction left in
  // flight; the row holds the larger of the two replays (late, early), comm_low and grads_low the
  // smaller.
  // The gradients too: a unit's gradient slab goes when its reduction finishes.
  size_t comm_low = r.ours[MemCategory::kComm];
  r.grads_low = r.ours[MemCategory::kGrads];
  if (stage >= 1 && in.zero.overlap_comm && !local) {
    const MemoryBreakdown early = model_state_memory(units, stage, in.world, e, in.optimizer_states, in.zero,
                                                     models::head_is_token_table(in.model), nullptr, in.pipeline(), true, &blocks, &fp);
    r.held = std::max(r.held, fp.held_peak());
    r.mapped = std::max(r.mapped, fp.mapped_peak());
    comm_low = std::min(comm_low, early[MemCategory::kComm]);
    r.ours[MemCategory::kComm] = std::max(r.ours[MemCategory::kComm], early[MemCategory::kComm]);
    r.grads_low = std::min(r.grads_low, early[MemCategory::kGrads]);
    r.ours[MemCategory::kGrads] = std::max(r.ours[MemCategory::kGrads], early[MemCategory::kGrads]);
  }
  // Ulysses' exchange buffers (step_blocks) are kept from the first forward on, through every
  // reduction: beside the model states' comm, not a phase of their own.
  const models::BlockDims ud = block_dims(in.model, in.micro_batch, in.seq_length, in.tp, in.sequence_parallel, in.usp);
  const size_t a2a = in.usp > 1 ? 2 * static_cast<size_t>(ud.N) * static_cast<size_t>(std::max(ud.QKV, ud.A)) * 4 : 0;
  r.ours[MemCategory::kComm] = std::max(r.ours[MemCategory::kComm] + a2a, step[MemCategory::kComm]);
  r.comm_low = std::max(comm_low + a2a, step[MemCategory::kComm]);
  size_t P = 0;
  for (const parallel::Unit& u : units) P += u.numel;
  r.ds_paper_bytes = ds_paper(P, stage, in.world, e, in.optimizer_states);
  if (in.zero.optimizer_nvme && stage >= 1) {
    std::vector<size_t> pieces;
    size_t S = 0;
    for (const parallel::Unit& u : units) {
      pieces.push_back((u.numel + static_cast<size_t>(in.world) - 1) / static_cast<size_t>(in.world));
      S += pieces.back();
    }
    r.disk_bytes = in.zero.param_nvme && stage == 3
                       ? param_swap(pieces, in.zero.sub_group_size, in.zero.swap_buffers).disk
                       : optimizer_swap(S, in.optimizer_states, in.zero.sub_group_size, in.zero.swap_buffers).disk;
  }
  if (stage == 1 || stage == 2) r.ds_estimator_bytes = 4 * P + 16 * P / static_cast<size_t>(in.world);
  if (stage == 3) r.ds_estimator_bytes = 4 * largest_module_params(in.model) + 18 * P / static_cast<size_t>(in.world);
  return r;
}

int largest_micro_batch(const MemoryInput& in, int stage, size_t budget_bytes, int max_batch) {
  MemoryInput probe = in;
  probe.micro_batch = 1;
  check_input(probe, stage);
  const std::vector<parallel::Unit> units = stage_units(in);
  size_t states = model_state_memory(units, stage, in.world, dtype_size(in.compute_dtype), in.optimizer_states,
                                     state_knobs(in, stage, units), models::head_is_token_table(in.model), nullptr, in.pipeline())
                      .total();
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
