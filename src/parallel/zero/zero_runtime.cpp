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
  Buffer grad;  // N·s f32, bound to the parameters' grad pointers while allocated
};


ZeroRuntime::ZeroRuntime(nn::ParamStore& store, std::vector<Unit> units,
                         const std::vector<std::vector<nn::Module*>>& modules, comm::Backend& group,
                         const ZeroOptions& options)
    : store_(store), part_(std::move(units), group.size(), group.rank()), group_(group), opts_(options),
      cd_(store.compute_dtype()), schedule_(part_.units(), options, *this) {
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
    p->grad = nullptr;  // bound to a gradient slab while one exists
  }
  bool lowp_master = cd_ != DType::kF32;
  master_ = Buffer(part_.shard_numel() * 4, lowp_master ? MemCategory::kOptimizer : MemCategory::kParams);
  grad_ = Buffer(part_.shard_numel() * 4, MemCategory::kGrads);
  part_.flat_to_shard(master(), store.master());

  // Views that persist are built from the store's values (identical on every rank, so no gather):
  // their gather targets are filled here and the schedule completes them.
  views_.resize(U);
  for (size_t i = 0; i < U; ++i) {
    views_[i] = std::make_unique<View>();
    if (!schedule_.persistent(i)) continue;
    View& v = *views_[i];
    Buffer& dst = cd_ == DType::kF32 ? v.f32 : v.staging;
    dst = Buffer(part_.padded(i) * 4, cd_ == DType::kF32 ? MemCategory::kParams : MemCategory::kComm);
    std::memcpy(dst.data(), store.master() + part_.units()[i].offset, part_.units()[i].numel * 4);
  }
  schedule_.construct();
  store.release_buffers();
  for (size_t i = 0; i < U; ++i)
    for (nn::Module* m : modules[i])
      for (nn::HookPoint pt : {nn::HookPoint::kPreForward, nn::HookPoint::kPostForward, nn::HookPoint::kPreBackward,
                               nn::HookPoint::kPostBackward})
        m->add_hook(pt, [this, i](nn::Module&, nn::HookPoint point) {
          schedule_.on_hook(i, point == nn::HookPoint::kPreForward || point == nn::HookPoint::kPreBackward,
                            point == nn::HookPoint::kPreForward || point == nn::HookPoint::kPostForward);
        });
}

ZeroRuntime::~ZeroRuntime() {
  // Let nothing in flight write into freed memory; a failed collective is already being reported.
  try {
    for (auto& v : views_)
      if (v && v->gather) v->gather->wait();
    for (auto& r : pending_) r.work->wait();
  } catch (...) {
  }
}

void ZeroRuntime::start_gather(size_t u) {
  View& v = *views_[u];
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
}

// Completes a gather (or, at construction, a target filled by hand) and binds the view.
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
  bind_params(u);
}

void ZeroRuntime::cancel_gather(size_t u) {
  View& v = *views_[u];
  if (v.gather) {
    v.gather->wait();
    v.gather.reset();
  }
  v.staging = Buffer();
}

void ZeroRuntime::free_view(size_t u) {
  View& v = *views_[u];
  unbind_params(u);
  v.f32 = Buffer();
  v.lowp = Buffer();
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

void ZeroRuntime::begin_grad_slab(size_t u) {
  View& v = *views_[u];
  if (!v.grad.bytes()) {
    v.grad = Buffer(part_.padded(u) * 4, MemCategory::kGrads);  // zero-filled
  } else {
    std::memset(v.grad.data(), 0, v.grad.bytes());
  }
  for (nn::Parameter* p : params_[u]) p->grad = v.grad.as<float>() + (p->offset - part_.units()[u].offset);
}

void ZeroRuntime::launch_reduce(size_t u) {
  PendingReduce r;
  const DType w = opts_.comm_dtype;
  r.recv = Buffer(part_.piece(u) * dtype_size(w), MemCategory::kComm);
  comm::ReduceScatterOptions o;
  o.timeout = opts_.timeout;
  o.op = comm::ReduceOp::kSum;
  o.tag = "zero grads " + part_.units()[u].name;
  const void* send = views_[u]->grad.data();
  if (w != DType::kF32) {  // communication_data_type: the slab rounded to 2 bytes, summed in that type
    r.send = Buffer(part_.padded(u) * dtype_size(w), MemCategory::kComm);
    convert(r.send.data(), w, views_[u]->grad.data(), DType::kF32, part_.padded(u));
    send = r.send.data();
    o.in_dtype = true;
  }
  r.work = group_.reduce_scatter(r.recv.data(), send, part_.piece(u), w, o);
  pending_.push_back(std::move(r));
}

void ZeroRuntime::complete_reduce(size_t u, bool free_slab) {
  PendingReduce& r = pending_.front();
  r.work->wait();
  float* dst = grad() + part_.shard_offset(u);
  const size_t n = part_.piece(u);
  if (opts_.comm_dtype != DType::kF32) {
    std::vector<float> wide(n);
    convert(wide.data(), DType::kF32, r.recv.data(), opts_.comm_dtype, n);
    for (size_t i = 0; i < n; ++i) dst[i] += wide[i];
  } else {
    const float* src = r.recv.as<float>();
    for (size_t i = 0; i < n; ++i) dst[i] += src[i];
  }
  pending_.pop_front();
  if (free_slab) {
    for (nn::Parameter* p : params_[u]) p->grad = nullptr;
    views_[u]->grad = Buffer();
  }
}

bool ZeroRuntime::oldest_reduce_done() { return !pending_.empty() && pending_.front().work->is_completed(); }

void ZeroRuntime::progress() {
  for (auto& v : views_)
    if (v->gather) v->gather->is_completed();  // MPI progresses nonblocking collectives in MPI_Test
}

void ZeroRuntime::finish_backward() { schedule_.finish_backward(); }

void ZeroRuntime::zero_grad() {
  std::memset(grad_.data(), 0, grad_.bytes());
  if (opts_.stage == 1)
    for (auto& v : views_) std::memset(v->grad.data(), 0, v->grad.bytes());
}

void ZeroRuntime::refresh_params() { schedule_.refresh(); }

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
