#include "parallel/zero/zero_runtime.h"

#include <algorithm>
#include <cstring>
#include <unistd.h>

#include "base/error.h"
#include "kernels/cpu/ops.h"
#include "optim/adamw.h"
#include "tensor/dtype.h"

namespace mt::parallel {

// A unit's view: what the layers read (values) and accumulate into (gradients).
struct ZeroRuntime::View {
  Buffer f32;      // f32 compute: the unit's padded range (N·s, the all_gather target);
                   // low precision: the unit's non-matrix parameters, packed
  Buffer lowp;     // low precision: the unit's GEMM weights in the compute dtype, packed, or
                   // (image_view) an image of the padded unit, each weight at its unit offset
  Buffer staging;  // low precision: the all_gather target while a gather is in flight: N·s f32,
                   // or (packed) the N runs of the pieces' non-GEMM elements in f32
  bool packed = false;  // gathered as an image and runs (gathers_in_compute_dtype)
  std::unique_ptr<comm::Work> gather, gather_other;  // in flight
  Buffer grad;  // N·s f32, bound to the parameters' grad pointers while allocated
  // offload_param nvme: the unit's master piece read from disk for its gather (then all-gathered
  // at finish_gather).
  io::AlignedBuffer piece;
  io::AsyncIo::Ticket piece_read = 0;
};

struct ZeroRuntime::Swap {
  io::DirCheck dir_check;  // its lease of the swap directory, held while it swaps there
  std::unique_ptr<io::AsyncIo> io;
  std::unique_ptr<io::File> master, grad;
  std::vector<uint64_t> off;         // per unit: its record's byte offset
  std::vector<char> grad_on_disk;    // per unit: its record holds this step's sum so far
  struct Write {
    io::AsyncIo::Ticket t = 0;
    io::AlignedBuffer buf;
  };
  std::vector<Write> grad_write;     // per unit: the write behind in flight
  std::deque<size_t> writing;        // units with a write in flight, oldest first (at most two)
  std::vector<std::pair<size_t, size_t>> norm_ranges;
  size_t cached = SIZE_MAX;  // read_master_range: the unit whose record `cache` holds
  io::AlignedBuffer cache;
  std::vector<std::vector<size_t>> unit_ranges;  // per unit: indices into norm_ranges
  std::vector<double> norms;         // per norm range, at the last micro-batch
  void wait_write(size_t u) {
    if (grad_write[u].t != 0) io->wait(grad_write[u].t);
    grad_write[u].t = 0;
    grad_write[u].buf = io::AlignedBuffer();
  }
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
  MT_CHECK(!store.released() || opts_.initial_values, ErrorKind::kInternal,
           "ZeRO runtime: a store without buffers needs the initial values");
  if (opts_.swap_dir.empty()) {
    master_ = Buffer(part_.shard_numel() * 4, lowp_master ? MemCategory::kOptimizer : MemCategory::kParams);
    grad_ = Buffer(part_.shard_numel() * 4, MemCategory::kGrads);
    // From the initial values each piece is filled below, once the views exist.
    if (!store.released()) part_.flat_to_shard(master(), store.master());
  } else {
    MT_CHECK(opts_.stage == 3, ErrorKind::kInvalidArgument, "ZeRO runtime: parameters on disk need stage 3");
    swap_ = std::make_unique<Swap>();
    io::Env& env = opts_.env ? *opts_.env : io::posix_env();
    uint64_t at = 0;
    for (size_t i = 0; i < U; ++i) {
      swap_->off.push_back(at);
      at += io::align_up(part_.piece(i) * 4);
    }
    if (!opts_.env)
      swap_->dir_check = io::check_swap_dir(opts_.swap_dir, 2 * at, {{"params.swp", at}, {"grads.swp", at}}, /*hold=*/true);
    swap_->master = env.open(opts_.swap_dir + "/params.swp");
    swap_->grad = env.open(opts_.swap_dir + "/grads.swp");
    swap_->io = std::make_unique<io::AsyncIo>(opts_.aio);
    swap_->grad_on_disk.assign(U, 0);
    swap_->grad_write.resize(U);
    swap_->unit_ranges.resize(U);
    // This rank's master pieces to disk, one unit at a time; the gradient records start as zeros
    // (a unit whose gradient is never reduced reads as zero, not as a short file).
    size_t most = 0;
    for (size_t i = 0; i < U; ++i) most = std::max(most, io::align_up(part_.piece(i) * 4));
    io::AlignedBuffer bounce(most, MemCategory::kComm);
    for (size_t i = 0; i < U; ++i) {
      const size_t bytes = io::align_up(part_.piece(i) * 4);
      std::memset(bounce.data(), 0, bytes);
      swap_->io->wait(swap_->io->write(*swap_->grad, bounce.data(), bytes, swap_->off[i]));
      const size_t a = part_.piece_begin(i), n = part_.piece_end(i) - a;
      if (store.released()) opts_.initial_values(a, a + n, bounce.as<float>());
      else std::memcpy(bounce.data(), store.master() + a, n * 4);
      swap_->io->wait(swap_->io->write(*swap_->master, bounce.data(), bytes, swap_->off[i]));
    }
  }

  // Views that persist are built from the store's values (identical on every rank, so no gather):
  // their gather targets are filled here and the schedule completes them.
  views_.resize(U);
  for (size_t i = 0; i < U; ++i) {
    views_[i] = std::make_unique<View>();
    if (!schedule_.persistent(i)) continue;
    View& v = *views_[i];
    Buffer& dst = cd_ == DType::kF32 ? v.f32 : v.staging;
    dst = Buffer(part_.padded(i) * 4, cd_ == DType::kF32 ? MemCategory::kParams : MemCategory::kComm);
    const Unit& unit = part_.units()[i];
    if (store.released()) opts_.initial_values(unit.offset, unit.offset + unit.numel, dst.as<float>());
    else std::memcpy(dst.data(), store.master() + unit.offset, unit.numel * 4);
  }
  // Each master piece from the initial values (the padding stays zero): a persistent unit's out of
  // its view's values, which hold the whole unit (every unit at stages 1-2), so no value is made or
  // read twice; the others' by themselves.
  if (opts_.swap_dir.empty() && store.released()) {
    for (size_t i = 0; i < U; ++i) {
      float* piece = master() + part_.shard_offset(i);
      const size_t a = part_.piece_begin(i), b = part_.piece_end(i);
      if (!schedule_.persistent(i)) {
        opts_.initial_values(a, b, piece);
        continue;
      }
      const View& v = *views_[i];
      const float* unit = (cd_ == DType::kF32 ? v.f32 : v.staging).as<float>();
      std::memcpy(piece, unit + (a - part_.units()[i].offset), (b - a) * sizeof(float));
    }
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
    for (auto& v : views_) {
      if (v && v->gather) v->gather->wait();
      if (v && v->gather_other) v->gather_other->wait();
    }
    for (auto& r : pending_) r.work->wait();
  } catch (...) {
  }
  if (swap_) {
    try {
      swap_->io->wait_all();
    } catch (...) {
    }
  }
}

void ZeroRuntime::discard_swap_files() noexcept {
  if (!swap_ || opts_.env != nullptr) return;  // a test's Env holds no files
  try {
    swap_->io->wait_all();
  } catch (...) {
  }
  for (const char* f : {"params.swp", "grads.swp"}) ::unlink((opts_.swap_dir + "/" + f).c_str());
}

void ZeroRuntime::set_last_micro_batch(bool last) {
  last_micro_ = last;
  schedule_.set_last_micro_batch(last);
}

std::vector<optim::SwapRecord> ZeroRuntime::swap_records(size_t max_elems) const {
  const size_t chunk = std::max<size_t>(1024, max_elems / 1024 * 1024);
  std::vector<optim::SwapRecord> r;
  for (size_t u = 0; u < part_.units().size(); ++u)
    for (size_t k = 0; k < part_.piece(u); k += chunk)
      r.push_back({part_.shard_offset(u) + k, std::min(chunk, part_.piece(u) - k), swap_->off[u] + k * 4});
  return r;
}

std::vector<size_t> ZeroRuntime::persistent_records(size_t max_elems) const {
  const size_t chunk = std::max<size_t>(1024, max_elems / 1024 * 1024);
  std::vector<size_t> out;
  size_t i = 0;
  for (size_t u = 0; u < part_.units().size(); ++u)
    for (size_t k = 0; k < part_.piece(u); k += chunk, ++i)
      if (schedule_.persistent(u)) out.push_back(i);
  return out;
}

io::File* ZeroRuntime::master_file() const { return swap_ ? swap_->master.get() : nullptr; }
io::File* ZeroRuntime::grad_file() const { return swap_ ? swap_->grad.get() : nullptr; }

void ZeroRuntime::read_master(float* shard) const {
  wait_master(0, SIZE_MAX);
  for (size_t u = 0; u < part_.units().size(); ++u) {
    io::AlignedBuffer b(io::align_up(part_.piece(u) * 4), MemCategory::kComm);
    swap_->io->wait(swap_->io->read(*swap_->master, b.data(), b.size(), swap_->off[u]));
    std::memcpy(shard + part_.shard_offset(u), b.data(), part_.piece(u) * 4);
  }
}

void ZeroRuntime::read_master_range(size_t begin, size_t n, float* dst) const {
  wait_master(0, SIZE_MAX);
  const size_t end = begin + n;
  for (size_t u = 0; u < part_.units().size(); ++u) {
    const size_t lo = part_.shard_offset(u), hi = lo + part_.piece(u);
    if (hi <= begin || lo >= end) continue;
    if (swap_->cached != u) {
      swap_->cache = io::AlignedBuffer(io::align_up(part_.piece(u) * 4), MemCategory::kComm);
      swap_->io->wait(swap_->io->read(*swap_->master, swap_->cache.data(), swap_->cache.size(), swap_->off[u]));
      swap_->cached = u;
    }
    const size_t a = std::max(begin, lo), b = std::min(end, hi);
    std::memcpy(dst + (a - begin), swap_->cache.as<float>() + (a - lo), (b - a) * 4);
    if (b == hi) {  // the unit read to its end: sequential readers are done with it
      swap_->cached = SIZE_MAX;
      swap_->cache = io::AlignedBuffer();
    }
  }
}

void ZeroRuntime::write_master(const float* shard) {
  wait_master(0, SIZE_MAX);
  write_master_from([shard](size_t b, size_t n, float* dst) { std::memcpy(dst, shard + b, n * sizeof(float)); });
}

void ZeroRuntime::write_master_from(const std::function<void(size_t, size_t, float*)>& fill) {
  wait_master(0, SIZE_MAX);
  swap_->cached = SIZE_MAX;
  swap_->cache = io::AlignedBuffer();
  for (size_t u = 0; u < part_.units().size(); ++u) {
    io::AlignedBuffer b(io::align_up(part_.piece(u) * 4), MemCategory::kComm);
    std::memset(b.data(), 0, b.size());
    fill(part_.shard_offset(u), part_.piece(u), b.as<float>());
    swap_->io->wait(swap_->io->write(*swap_->master, b.data(), b.size(), swap_->off[u]));
  }
}

void ZeroRuntime::set_norm_ranges(std::vector<std::pair<size_t, size_t>> ranges) {
  swap_->norm_ranges = std::move(ranges);
  swap_->norms.assign(swap_->norm_ranges.size(), 0.0);
  for (auto& v : swap_->unit_ranges) v.clear();
  for (size_t i = 0; i < swap_->norm_ranges.size(); ++i) {
    const auto [off, n] = swap_->norm_ranges[i];
    size_t u = 0;
    while (u + 1 < part_.units().size() && part_.shard_offset(u + 1) <= off) ++u;
    MT_CHECK(off >= part_.shard_offset(u) && off + n <= part_.shard_offset(u) + part_.piece(u), ErrorKind::kInternal,
             "ZeRO runtime: a gradient-norm range crosses a unit piece");
    swap_->unit_ranges[u].push_back(i);
  }
}

const std::vector<double>& ZeroRuntime::range_norms() const { return swap_->norms; }

// gathers_in_compute_dtype: the elements of piece k (unit-relative [k s, (k+1) s)) that are not
// GEMM weights, in parameter order, from vals (the piece's s f32 values) into out (n - m floats,
// the rest zeroed); and back, from the N gathered runs into the view's packed f32 parameters.
void ZeroRuntime::pack_other(size_t u, size_t k, const float* vals, float* out) const {
  const Unit& unit = part_.units()[u];
  const size_t s = part_.piece(u), lo = k * s, hi = lo + s, other = unit.numel - unit.matrix_numel;
  size_t c = 0;
  for (const nn::Parameter* p : params_[u]) {
    if (p->is_matrix) continue;
    const size_t a = std::max(p->offset - unit.offset, lo),
                 b = std::min(p->offset - unit.offset + static_cast<size_t>(p->numel()), hi);
    if (a >= b) continue;
    std::memcpy(out + c, vals + (a - lo), 4 * (b - a));
    c += b - a;
  }
  std::fill(out + c, out + other, 0.0f);
}

void ZeroRuntime::unpack_other(size_t u) {
  View& v = *views_[u];
  const Unit& unit = part_.units()[u];
  const size_t s = part_.piece(u), other = unit.numel - unit.matrix_numel;
  const float* runs = v.staging.as<float>();
  std::vector<size_t> cursor(static_cast<size_t>(part_.world()), 0);
  size_t fo = 0;
  for (const nn::Parameter* p : params_[u]) {
    if (p->is_matrix) continue;
    const size_t rel = p->offset - unit.offset, n = static_cast<size_t>(p->numel());
    for (size_t a = rel; a < rel + n;) {
      const size_t k = a / s, b = std::min(rel + n, (k + 1) * s);
      std::memcpy(v.f32.as<float>() + fo + (a - rel), runs + k * other + cursor[k], 4 * (b - a));
      cursor[k] += b - a;
      a = b;
    }
    fo += n;
  }
}

bool ZeroRuntime::image_view(size_t u) const {
  return cd_ != DType::kF32 && !swap_ && gathers_in_compute_dtype(part_.units()[u], part_.piece(u), part_.world());
}

void ZeroRuntime::alloc_lowp_view(size_t u) {
  View& v = *views_[u];
  if (v.lowp.bytes()) return;
  const Unit& unit = part_.units()[u];
  // Written whole before it is read: by the conversion at finish_gather, or, as an image of the
  // unit, by the all_gather (every GEMM weight; the elements between them are never read).
  const size_t lowp = image_view(u) ? part_.padded(u) : std::max<size_t>(unit.matrix_numel, 1);
  v.lowp = Buffer::uninitialized(lowp * dtype_size(cd_), MemCategory::kParams);
  v.f32 = Buffer::uninitialized(std::max<size_t>(unit.numel - unit.matrix_numel, 1) * 4, MemCategory::kParams);
}

void ZeroRuntime::start_gather(size_t u) {
  View& v = *views_[u];
  void* target = nullptr;
  v.packed = false;
  if (image_view(u)) {  // this rank's piece converted into its place in the view, gathered in place
    alloc_lowp_view(u);
    const size_t s = part_.piece(u), N = static_cast<size_t>(part_.world()), me = static_cast<size_t>(group_.rank());
    const size_t other = part_.units()[u].numel - part_.units()[u].matrix_numel;
    const float* vals = master() + part_.shard_offset(u);
    char* mine = v.lowp.as<char>() + me * s * dtype_size(cd_);
    convert(mine, cd_, vals, DType::kF32, s);
    comm::AllGatherOptions o;
    o.timeout = opts_.timeout;
    o.tag = "zero params " + part_.units()[u].name;
    v.gather = group_.all_gather(v.lowp.data(), mine, s, cd_, o);
    v.packed = true;
    if (other > 0) {
      v.staging = Buffer::uninitialized(N * other * 4, MemCategory::kComm);
      float* run = v.staging.as<float>() + me * other;
      pack_other(u, me, vals, run);
      o.tag = "zero params " + part_.units()[u].name + " (f32)";
      v.gather_other = group_.all_gather(v.staging.data(), run, other, DType::kF32, o);
    }
    return;
  }
  if (cd_ == DType::kF32) {
    if (!v.f32.bytes()) v.f32 = Buffer(part_.padded(u) * 4, MemCategory::kParams);
    target = v.f32.data();
  } else if (!piece_is_unit()) {  // the all_gather writes all of it
    v.staging = Buffer::uninitialized(part_.padded(u) * 4, MemCategory::kComm);
    target = v.staging.data();
  }
  if (swap_) {  // the piece comes off the disk first; the all_gather runs when the unit is used
    wait_master(part_.shard_offset(u), part_.shard_offset(u) + part_.piece(u));
    v.piece = io::AlignedBuffer(io::align_up(part_.piece(u) * 4), MemCategory::kComm, false);
    v.piece_read = swap_->io->read(*swap_->master, v.piece.data(), v.piece.size(), swap_->off[u]);
    return;
  }
  comm::AllGatherOptions o;
  o.timeout = opts_.timeout;
  o.tag = "zero params " + part_.units()[u].name;
  v.gather = group_.all_gather(target, master() + part_.shard_offset(u), part_.piece(u), DType::kF32, o);
}

namespace {
void* view_target(Buffer& f32, Buffer& staging, DType cd) { return cd == DType::kF32 ? f32.data() : staging.data(); }
}  // namespace

// Completes a gather (or, at construction, a target filled by hand) and binds the view.
void ZeroRuntime::finish_gather(size_t u) {
  View& v = *views_[u];
  if (v.piece_read != 0) {
    swap_->io->wait(v.piece_read);
    v.piece_read = 0;
    if (!piece_is_unit()) {
      comm::AllGatherOptions o;
      o.timeout = opts_.timeout;
      o.tag = "zero params " + part_.units()[u].name;
      group_.all_gather(view_target(v.f32, v.staging, cd_), v.piece.data(), part_.piece(u), DType::kF32, o)->wait();
      v.piece = io::AlignedBuffer();
    }
  }
  if (v.gather) {
    v.gather->wait();
    v.gather.reset();
  }
  if (v.gather_other) {
    v.gather_other->wait();
    v.gather_other.reset();
  }
  if (cd_ != DType::kF32) {
    const Unit& unit = part_.units()[u];
    alloc_lowp_view(u);
    if (v.packed) {  // the GEMM weights are in place; the rest from the runs
      if (v.staging.bytes()) unpack_other(u);
      v.staging = Buffer();
      v.packed = false;
      bind_params(u);
      return;
    }
    // From an f32 image of the unit (a persistent view at construction, a piece off the disk).
    const float* src = v.piece.size() ? v.piece.as<float>() : v.staging.as<float>();
    const bool image = image_view(u);
    size_t mo = 0, fo = 0;
    for (nn::Parameter* p : params_[u]) {
      size_t n = static_cast<size_t>(p->numel()), rel = p->offset - unit.offset;
      if (p->is_matrix) {
        convert(v.lowp.as<char>() + (image ? rel : mo) * dtype_size(cd_), cd_, src + rel, DType::kF32, n);
        mo += n;
      } else {
        std::memcpy(v.f32.as<float>() + fo, src + rel, n * 4);
        fo += n;
      }
    }
    v.staging = Buffer();
    v.piece = io::AlignedBuffer();
  }
  bind_params(u);
}

void ZeroRuntime::cancel_gather(size_t u) {
  View& v = *views_[u];
  if (v.piece_read != 0) {
    swap_->io->wait(v.piece_read);
    v.piece_read = 0;
    v.piece = io::AlignedBuffer();
  }
  if (v.gather) {
    v.gather->wait();
    v.gather.reset();
  }
  if (v.gather_other) {
    v.gather_other->wait();
    v.gather_other.reset();
  }
  v.staging = Buffer();
  v.packed = false;
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
  const bool image = image_view(u);
  size_t mo = 0, fo = 0;
  for (nn::Parameter* p : params_[u]) {
    size_t n = static_cast<size_t>(p->numel());
    if (cd_ == DType::kF32) {
      p->master = v.f32.as<float>() + (p->offset - unit.offset);
      p->compute = p->master;
    } else if (p->is_matrix) {
      p->master = nullptr;  // layers read GEMM weights through compute only
      p->compute = v.lowp.as<char>() + (image ? p->offset - unit.offset : mo) * dtype_size(cd_);
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
    zero_bytes(v.grad.data(), v.grad.bytes());
  }
  for (nn::Parameter* p : params_[u]) p->grad = v.grad.as<float>() + (p->offset - part_.units()[u].offset);
}

void ZeroRuntime::launch_reduce(size_t u) {
  PendingReduce r;
  const DType w = opts_.comm_dtype;
  void* recv;
  if (swap_ && w == DType::kF32) {  // received straight into the unit's gradient record
    const size_t n = part_.piece(u) * 4;
    r.record = io::AlignedBuffer(io::align_up(n), MemCategory::kComm, false);
    std::memset(r.record.as<char>() + n, 0, r.record.size() - n);
    recv = r.record.data();
  } else {
    r.recv = Buffer::uninitialized(part_.piece(u) * dtype_size(w), MemCategory::kComm);
    recv = r.recv.data();
  }
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
  r.work = group_.reduce_scatter(recv, send, part_.piece(u), w, o);
  pending_.push_back(std::move(r));
}

void ZeroRuntime::complete_reduce(size_t u, bool free_slab) {
  PendingReduce& r = pending_.front();
  r.work->wait();
  const size_t n = part_.piece(u);
  float* dst;
  io::AlignedBuffer record;
  bool summed = false;
  if (swap_) {  // the record is the shard's piece: read it back unless this step has not written it
    swap_->wait_write(u);
    const bool on_disk = swap_->grad_on_disk[u];
    if (r.record.size()) {  // f32: the reduction is in its record already; the earlier sum added to it
      record = std::move(r.record);
      if (on_disk) {
        io::AlignedBuffer old(record.size(), MemCategory::kComm, false);
        swap_->io->wait(swap_->io->read(*swap_->grad, old.data(), old.size(), swap_->off[u]));
        float* acc = record.as<float>();
        const float* prev = old.as<float>();
        kernels::add_inplace(acc, prev, n);  // = prev + received, as below (one rounding either way)
      }
      summed = true;
    } else {
      record = io::AlignedBuffer(io::align_up(n * 4), MemCategory::kComm, on_disk ? false : true);
      if (on_disk) swap_->io->wait(swap_->io->read(*swap_->grad, record.data(), record.size(), swap_->off[u]));
    }
    dst = record.as<float>();
  } else {
    dst = grad() + part_.shard_offset(u);
  }
  if (!summed && opts_.comm_dtype != DType::kF32) {
    std::vector<float> wide(n);
    convert(wide.data(), DType::kF32, r.recv.data(), opts_.comm_dtype, n);
    kernels::add_inplace(dst, wide.data(), n);
  } else if (!summed) {
    const float* src = r.recv.as<float>();
    kernels::add_inplace(dst, src, n);  // every core's memory bandwidth, not one loop's
  }
  if (swap_) {
    if (last_micro_)  // the piece's gradient is final: the norm's ranges in it
      for (size_t i : swap_->unit_ranges[u]) {
        const auto [off, len] = swap_->norm_ranges[i];
        swap_->norms[i] = optim::grad_norm(dst + (off - part_.shard_offset(u)), len);
      }
    swap_->grad_write[u].t = swap_->io->write(*swap_->grad, record.data(), record.size(), swap_->off[u]);
    swap_->grad_write[u].buf = std::move(record);
    swap_->grad_on_disk[u] = 1;
    swap_->writing.push_back(u);
    while (swap_->writing.size() > 2) {  // written behind, but not a second copy of the gradients in memory
      swap_->wait_write(swap_->writing.front());
      swap_->writing.pop_front();
    }
  }
  pending_.pop_front();
  if (free_slab) {
    for (nn::Parameter* p : params_[u]) p->grad = nullptr;
    views_[u]->grad = Buffer();
  }
}

io::AsyncIo::Stats ZeroRuntime::take_swap_io_stats() {
  if (!swap_) return {};
  io::AsyncIo::Stats s = swap_->io->stats();
  swap_->io->reset_stats();
  return s;
}

bool ZeroRuntime::oldest_reduce_done() { return !pending_.empty() && pending_.front().work->is_completed(); }

void ZeroRuntime::progress() {
  for (auto& v : views_) {  // MPI progresses nonblocking collectives in MPI_Test
    if (v->gather) v->gather->is_completed();
    if (v->gather_other) v->gather_other->is_completed();
  }
}

void ZeroRuntime::finish_backward() {
  schedule_.finish_backward();
  if (swap_) {  // every gradient record on disk before the optimizer reads them
    for (size_t u = 0; u < views_.size(); ++u) swap_->wait_write(u);
    swap_->writing.clear();
  }
}

void ZeroRuntime::zero_grad() {
  if (swap_) {  // the records are stale, not rewritten: the next reduction starts from zero
    std::fill(swap_->grad_on_disk.begin(), swap_->grad_on_disk.end(), 0);
    return;
  }
  std::memset(grad_.data(), 0, grad_.bytes());
  if (opts_.stage == 1)
    for (auto& v : views_) std::memset(v->grad.data(), 0, v->grad.bytes());
}

void ZeroRuntime::refresh_params() {
  if (swap_) {  // the optimizer rewrote the master records
    swap_->cached = SIZE_MAX;
    swap_->cache = io::AlignedBuffer();
  }
  schedule_.refresh();
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
