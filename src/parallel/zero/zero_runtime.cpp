#include "parallel/zero/zero_runtime.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "tensor/dtype.h"

namespace mt::parallel {

// A unit's view: what the layers read (values) and accumulate into (gradients).
struct ZeroRuntime::View {
  Buffer f32;      // f32 compute: the unit's padded range (N·s, the all_gather target);
                   // low precision: the unit's non-matrix parameters, packed
  Buffer lowp;     // low precision: the unit's GEMM weights, packed, in the compute dtype
  Buffer staging;  // low precision: N·s f32 all_gather target while a gather is in flight
  std::unique_ptr<comm::Work> gather;  // in flight
  bool live = false;                   // values valid and bound
  bool counted = false;                // its elements are in live_elems_ (allocated or in flight)
  int refs = 0;
  Buffer grad;  // N·s f32, bound to the parameters' grad pointers while allocated
};

struct ZeroRuntime::PendingReduce {
  size_t unit = 0;
  Buffer recv;  // s f32
  std::unique_ptr<comm::Work> work;
  bool free_slab = false;
};

ZeroRuntime::ZeroRuntime(nn::ParamStore& store, std::vector<Unit> units,
                         const std::vector<std::vector<nn::Module*>>& modules, comm::Backend& group,
                         const ZeroOptions& options)
    : store_(store), part_(std::move(units), group.size(), group.rank()), group_(group), opts_(options),
      cd_(store.compute_dtype()) {
  MT_CHECK(opts_.stage >= 1 && opts_.stage <= 3, ErrorKind::kInvalidArgument,
           "ZeRO runtime: stage " + std::to_string(opts_.stage) + " (1, 2 or 3)");
  MT_CHECK(part_.total() == store.numel(), ErrorKind::kInvalidArgument, "ZeRO runtime: units do not cover the parameters");
  MT_CHECK(modules.size() == part_.units().size(), ErrorKind::kInvalidArgument, "ZeRO runtime: one module list per unit");
  const size_t U = part_.units().size();
  params_.resize(U);
  size_t u = 0;
  for (nn::Parameter* p : store.parameters()) {
    while (u + 1 < U && p->offset >= part_.units()[u + 1].offset) ++u;
    params_[u].push_back(p);
  }
  bool lowp_master = cd_ != DType::kF32;
  master_ = Buffer(part_.shard_numel() * 4, lowp_master ? MemCategory::kOptimizer : MemCategory::kParams);
  grad_ = Buffer(part_.shard_numel() * 4, MemCategory::kGrads);
  part_.flat_to_shard(master(), store.master());

  // Views that persist are built from the store's values (identical on every rank); the rest
  // start unbound.
  views_.resize(U);
  for (size_t i = 0; i < U; ++i) {
    views_[i] = std::make_unique<View>();
    if (persistent(i)) {
      View& v = *views_[i];
      Buffer& dst = cd_ == DType::kF32 ? v.f32 : v.staging;
      dst = Buffer(part_.padded(i) * 4, cd_ == DType::kF32 ? MemCategory::kParams : MemCategory::kComm);
      std::memcpy(dst.data(), store.master() + part_.units()[i].offset, part_.units()[i].numel * 4);
      finish_gather(i);
    } else {
      unbind_params(i);
    }
    if (opts_.stage == 1) {
      views_[i]->grad = Buffer(part_.padded(i) * 4, MemCategory::kGrads);
      for (nn::Parameter* p : params_[i])
        p->grad = views_[i]->grad.as<float>() + (p->offset - part_.units()[i].offset);
    } else {
      for (nn::Parameter* p : params_[i]) p->grad = nullptr;
    }
  }
  store.release_buffers();
  for (size_t i = 0; i < U; ++i)
    for (nn::Module* m : modules[i])
      for (nn::HookPoint pt : {nn::HookPoint::kPreForward, nn::HookPoint::kPostForward, nn::HookPoint::kPreBackward,
                               nn::HookPoint::kPostBackward})
        m->add_hook(pt, [this, i](nn::Module&, nn::HookPoint point) { on_hook(i, point); });
}

ZeroRuntime::~ZeroRuntime() {
  // Let nothing in flight write into freed memory; a failed collective is already being reported.
  try {
    for (auto& v : views_)
      if (v && v->gather) v->gather->wait();
    for (auto& r : pending_) r->work->wait();
  } catch (...) {
  }
}

bool ZeroRuntime::persistent(size_t u) const {
  return opts_.stage < 3 || part_.units()[u].numel <= opts_.persistence_threshold;
}

void ZeroRuntime::start_gather(size_t u) {
  View& v = *views_[u];
  if (v.gather) return;
  void* target;
  if (cd_ == DType::kF32) {
    if (!v.f32.bytes()) v.f32 = Buffer(part_.padded(u) * 4, MemCategory::kParams);
    target = v.f32.data();
  } else {
    v.staging = Buffer(part_.padded(u) * 4, MemCategory::kComm);
    target = v.staging.data();
  }
  comm::AllGatherOptions o;
  o.timeout = opts_.timeout;
  o.tag = "zero params " + part_.units()[u].name;
  v.gather = group_.all_gather(target, master() + part_.shard_offset(u), part_.piece(u), DType::kF32, o);
  count_live(u);
}

void ZeroRuntime::count_live(size_t u) {
  View& v = *views_[u];
  if (v.counted) return;
  v.counted = true;
  live_elems_ += view_elems(u);
  peak_live_elems_ = std::max(peak_live_elems_, live_elems_);
}

// Completes a gather (or, at construction, a staging/f32 buffer filled by hand) and binds the view.
void ZeroRuntime::finish_gather(size_t u) {
  View& v = *views_[u];
  if (v.gather) {
    v.gather->wait();
    v.gather.reset();
  }
  if (cd_ != DType::kF32) {
    const Unit& unit = part_.units()[u];
    if (!v.lowp.bytes()) {
      v.lowp = Buffer(std::max<size_t>(unit.matrix_numel, 1) * dtype_size(cd_), MemCategory::kParams);
      v.f32 = Buffer(std::max<size_t>(unit.numel - unit.matrix_numel, 1) * 4, MemCategory::kParams);
    }
    const float* src = v.staging.as<float>();
    size_t mo = 0, fo = 0;
    for (nn::Parameter* p : params_[u]) {
      size_t n = static_cast<size_t>(p->numel()), rel = p->offset - unit.offset;
      if (p->is_matrix) {
        convert(v.lowp.as<char>() + mo * dtype_size(cd_), cd_, src + rel, DType::kF32, n);
        mo += n;
      } else {
        std::memcpy(v.f32.as<float>() + fo, src + rel, n * 4);
        fo += n;
      }
    }
    v.staging = Buffer();
  }
  count_live(u);
  v.live = true;
  bind_params(u);
}

void ZeroRuntime::bind_params(size_t u) {
  View& v = *views_[u];
  const Unit& unit = part_.units()[u];
  size_t mo = 0, fo = 0;
  for (nn::Parameter* p : params_[u]) {
    size_t n = static_cast<size_t>(p->numel());
    if (cd_ == DType::kF32) {
      p->master = v.f32.as<float>() + (p->offset - unit.offset);
      p->compute = p->master;
    } else if (p->is_matrix) {
      p->master = nullptr;  // layers read GEMM weights through compute only
      p->compute = v.lowp.as<char>() + mo * dtype_size(cd_);
      mo += n;
    } else {
      p->master = v.f32.as<float>() + fo;
      p->compute = p->master;
      fo += n;
    }
  }
}

void ZeroRuntime::unbind_params(size_t u) {
  for (nn::Parameter* p : params_[u]) {
    p->master = nullptr;
    p->compute = nullptr;
  }
}

void ZeroRuntime::acquire(size_t u) {
  View& v = *views_[u];
  ++v.refs;
  if (!v.live) {
    start_gather(u);
    finish_gather(u);
  } else if (v.gather) {
    finish_gather(u);
  }
  maybe_prefetch(u);
}

void ZeroRuntime::release(size_t u) {
  View& v = *views_[u];
  if (v.refs > 0) --v.refs;
  if (v.refs > 0 || persistent(u)) return;
  unbind_params(u);
  v.f32 = Buffer();
  v.lowp = Buffer();
  v.live = false;
  if (v.counted) live_elems_ -= view_elems(u);
  v.counted = false;
}

void ZeroRuntime::maybe_prefetch(size_t u) {
  if (opts_.stage < 3) return;
  size_t next;
  if (backward_phase_) {
    if (u == 0) return;
    next = u - 1;
  } else {
    next = u + 1;
    if (next >= views_.size()) return;
  }
  View& v = *views_[next];
  if (persistent(next) || v.live || v.gather) return;
  size_t n = view_elems(next);
  if (n > opts_.prefetch_elems || live_elems_ + n > opts_.max_live_elems) return;
  start_gather(next);  // bound when acquire() completes it
}

void ZeroRuntime::begin_grads(size_t u) {
  // A unit used twice in a pass (a tied or untied head and its norm/embedding): its previous
  // reduction must finish before the slab is reused.
  for (size_t i = pending_.size(); i-- > 0;)
    if (pending_[i]->unit == u) {
      wait_reductions(pending_.size() - i - 1);
      break;
    }
  View& v = *views_[u];
  if (!v.grad.bytes()) {
    v.grad = Buffer(part_.padded(u) * 4, MemCategory::kGrads);  // zero-filled
  } else {
    std::memset(v.grad.data(), 0, v.grad.bytes());
  }
  for (nn::Parameter* p : params_[u]) p->grad = v.grad.as<float>() + (p->offset - part_.units()[u].offset);
}

void ZeroRuntime::reduce_grads(size_t u) {
  auto r = std::make_unique<PendingReduce>();
  r->unit = u;
  r->recv = Buffer(part_.piece(u) * 4, MemCategory::kComm);
  r->free_slab = opts_.stage >= 2;
  comm::ReduceScatterOptions o;
  o.timeout = opts_.timeout;
  o.op = comm::ReduceOp::kSum;
  o.tag = "zero grads " + part_.units()[u].name;
  r->work = group_.reduce_scatter(r->recv.data(), views_[u]->grad.data(), part_.piece(u), DType::kF32, o);
  pending_.push_back(std::move(r));
  wait_reductions(opts_.overlap_comm ? 1 : 0);
}

void ZeroRuntime::complete(PendingReduce& r) {
  r.work->wait();
  float* dst = grad() + part_.shard_offset(r.unit);
  const float* src = r.recv.as<float>();
  for (size_t i = 0, n = part_.piece(r.unit); i < n; ++i) dst[i] += src[i];
  r.recv = Buffer();
  if (r.free_slab) {
    for (nn::Parameter* p : params_[r.unit]) p->grad = nullptr;
    views_[r.unit]->grad = Buffer();
  }
}

void ZeroRuntime::wait_reductions(size_t keep) {
  while (pending_.size() > keep) {
    complete(*pending_.front());
    pending_.erase(pending_.begin());
  }
}

void ZeroRuntime::poll() {
  while (!pending_.empty() && pending_.front()->work->is_completed()) {
    complete(*pending_.front());
    pending_.erase(pending_.begin());
  }
  for (auto& v : views_)
    if (v->gather) v->gather->is_completed();  // progress (MPI progresses inside MPI_Test)
}

void ZeroRuntime::on_hook(size_t u, nn::HookPoint point) {
  poll();
  const size_t last = views_.size() - 1;
  switch (point) {
    case nn::HookPoint::kPreForward:
      if (u == 0) backward_phase_ = false;
      if (opts_.stage == 3) acquire(u);
      break;
    case nn::HookPoint::kPostForward:
      if (opts_.stage == 3) {
        // A forward inside backward (recompute) keeps the view for the backward that follows.
        if (backward_phase_) {
          if (views_[u]->refs > 0) --views_[u]->refs;
        } else {
          release(u);
        }
      }
      break;
    case nn::HookPoint::kPreBackward:
      backward_phase_ = true;
      if (opts_.stage == 3) acquire(u);
      if (opts_.stage >= 2) begin_grads(u);
      break;
    case nn::HookPoint::kPostBackward:
      // Stage 1 reduces a block's gradients during the last micro-batch's backward (used once);
      // the embeddings and tail (used twice when tied) wait for finish_backward().
      if (opts_.stage >= 2 || (last_micro_ && u != 0 && u != last)) reduce_grads(u);
      if (opts_.stage == 3) release(u);
      break;
  }
}

void ZeroRuntime::finish_backward() {
  if (opts_.stage == 1 && last_micro_) {
    reduce_grads(views_.size() - 1);
    reduce_grads(0);
  }
  wait_reductions(0);
}

void ZeroRuntime::zero_grad() {
  std::memset(grad_.data(), 0, grad_.bytes());
  if (opts_.stage == 1)
    for (auto& v : views_) std::memset(v->grad.data(), 0, v->grad.bytes());
}

void ZeroRuntime::refresh_params() {
  wait_reductions(0);
  // Stage 3: views gathered before this step (prefetched, unused) hold old values: drop them.
  for (size_t u = 0; u < views_.size(); ++u) {
    View& v = *views_[u];
    if (persistent(u)) continue;
    if (v.gather) {
      v.gather->wait();
      v.gather.reset();
      v.staging = Buffer();
    }
    if (v.live || v.counted) {
      v.refs = 0;
      release(u);
    }
  }
  // Two gathers in flight at a time: the next one overlaps the unpacking of this one, and
  // the f32 staging never holds more than two units.
  std::vector<size_t> order;
  for (size_t u = 0; u < views_.size(); ++u)
    if (persistent(u)) order.push_back(u);
  for (size_t i = 0; i < order.size(); ++i) {
    start_gather(order[i]);
    if (i > 0) finish_gather(order[i - 1]);
  }
  if (!order.empty()) finish_gather(order.back());
}

void ZeroRuntime::gather_flat(float* flat, const float* shard, int root) {
  const bool is_root = group_.rank() == root;
  size_t most = 0;
  for (size_t u = 0; u < views_.size(); ++u) most = std::max(most, part_.padded(u));
  Buffer tmp(is_root ? most * 4 : 0, MemCategory::kComm);
  for (size_t u = 0; u < views_.size(); ++u) {
    comm::GatherOptions o;
    o.root = root;
    o.timeout = opts_.timeout;
    o.tag = "zero gather " + part_.units()[u].name;
    group_.gather(is_root ? tmp.data() : nullptr, shard + part_.shard_offset(u), part_.piece(u), DType::kF32, o)->wait();
    if (is_root) std::memcpy(flat + part_.units()[u].offset, tmp.data(), part_.units()[u].numel * 4);
  }
}

}  // namespace mt::parallel
