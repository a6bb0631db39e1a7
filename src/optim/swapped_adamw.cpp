#include "optim/swapped_adamw.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <utility>

#include "base/error.h"
#include "base/fault.h"
#include "base/timer.h"
#include "kernels/cpu/ops.h"

namespace mt::optim {

namespace {
const char* const kStateNames[2] = {"exp_avg", "exp_avg_sq"};
}

// One resident sub-group: both moments, and the transfers in flight on them.
struct SwappedAdamW::Slot {
  io::AlignedBuffer buf[2];
  size_t group = SIZE_MAX;  // the sub-group held (or being read / written)
  std::vector<io::AsyncIo::Ticket> reads, writes;
};

SwappedAdamW::SwappedAdamW(size_t numel, std::vector<ParamSegment> segments, const AdamWConfig& config,
                           const SwapOptions& swap)
    : Optimizer(numel, std::move(segments)), config_(config), swap_(swap), runs_(decay_runs(segments_)) {
  MT_CHECK(swap_.buffer_count >= 2, ErrorKind::kInvalidArgument,
           "zero_optimization.offload_optimizer.buffer_count must be at least 2 (got " +
               std::to_string(swap_.buffer_count) + ")");
  MT_CHECK(swap_.sub_group_size > 0, ErrorKind::kInvalidArgument, "zero_optimization.sub_group_size must be positive");
  // Sub-groups start on 4 KiB of f32 (1024 elements), so every transfer is O_DIRECT-aligned.
  const size_t unit = io::kAlign / 4;
  group_ = std::max<size_t>(unit, (std::min(swap_.sub_group_size, std::max<size_t>(numel_, 1)) + unit - 1) / unit * unit);
  groups_ = numel_ == 0 ? 0 : (numel_ + group_ - 1) / group_;
  io::Env& env = swap_.env ? *swap_.env : io::posix_env();
  if (swap_.env == nullptr) io::check_swap_dir(swap_.dir, disk_bytes());
  for (int s = 0; s < 2; ++s) files_[s] = env.open(swap_.dir + "/" + kStateNames[s] + ".swp");
  io_ = std::make_unique<io::AsyncIo>(swap_.aio);
  on_disk_.assign(groups_, false);
  const size_t nslots = std::min<size_t>(static_cast<size_t>(swap_.buffer_count), std::max<size_t>(groups_, 1));
  for (size_t i = 0; i < nslots; ++i) {
    auto slot = std::make_unique<Slot>();
    for (auto& b : slot->buf) b = io::AlignedBuffer(io::align_up(group_ * 4), MemCategory::kOptimizer);
    slots_.push_back(std::move(slot));
  }
}

SwappedAdamW::~SwappedAdamW() {
  try {
    if (io_) io_->wait_all();
  } catch (...) {  // a failed write was reported by the step that issued it
  }
}

size_t SwappedAdamW::resident_bytes() const { return slots_.size() * 2 * io::align_up(group_ * 4); }
uint64_t SwappedAdamW::disk_bytes() const {  // every sub-group at its stride, the last one's own length
  if (groups_ == 0) return 0;
  return 2 * ((groups_ - 1) * static_cast<uint64_t>(io::align_up(group_ * 4)) + io::align_up(group_len(groups_ - 1) * 4));
}

void SwappedAdamW::set_betas(double beta1, double beta2) {
  config_.beta1 = static_cast<float>(beta1);
  config_.beta2 = static_cast<float>(beta2);
}

std::vector<StateBuffer> SwappedAdamW::state() const {
  return {{kStateNames[0], nullptr, numel_}, {kStateNames[1], nullptr, numel_}};
}

size_t SwappedAdamW::state_index(const std::string& name) const {
  for (size_t s = 0; s < 2; ++s)
    if (name == kStateNames[s]) return s;
  throw Error(ErrorKind::kInvalidArgument, "optimizer AdamW has no state '" + name + "'");
}

void SwappedAdamW::step(float* master, const float* grad, void* lowp, DType lowp_dtype, float lr, float grad_scale) {
  ++step_;
  Timer total;
  io_->reset_stats();
  kernels::AdamWParams p;
  p.lr = lr;
  p.beta1 = config_.beta1;
  p.beta2 = config_.beta2;
  p.eps = config_.eps;
  p.step = step_;
  p.grad_scale = grad_scale;
  p.bias_correction = config_.bias_correction;
  const size_t esz = dtype_size(lowp_dtype);
  const size_t nslots = slots_.size();
  double compute = 0;
  // Brings sub-group g into its slot: waits for the slot's previous write-back first.
  auto fetch = [&](size_t g) {
    Slot& s = *slots_[g % nslots];
    for (auto t : s.writes) io_->wait(t);
    s.writes.clear();
    s.group = g;
    const size_t bytes = io::align_up(group_len(g) * 4);
    for (int k = 0; k < 2; ++k) {
      if (on_disk_[g]) s.reads.push_back(io_->read(*files_[k], s.buf[k].data(), bytes, group_off(g)));
      else std::memset(s.buf[k].data(), 0, bytes);
    }
  };
  try {
    if (groups_ > 0) fetch(0);
    for (size_t g = 0; g < groups_; ++g) {
      Slot& s = *slots_[g % nslots];
      for (auto t : s.reads) io_->wait(t);
      s.reads.clear();
      if (swap_.pipeline_read && g + 1 < groups_) fetch(g + 1);  // read while this sub-group is updated
      Timer c;
      const size_t a = group_begin(g), b = a + group_len(g);
      float* m = s.buf[0].as<float>();
      float* v = s.buf[1].as<float>();
      for (const DecayRun& r : runs_) {
        const size_t lo = std::max(a, r.offset), hi = std::min(b, r.offset + r.numel);
        if (lo >= hi) continue;
        p.weight_decay = r.weight_decay;
        void* lp = lowp ? static_cast<char*>(lowp) + lo * esz : nullptr;
        kernels::adamw_update(master + lo, grad + lo, m + (lo - a), v + (lo - a), lp, lowp_dtype, hi - lo, p);
      }
      compute += c.seconds();
      const size_t bytes = io::align_up(group_len(g) * 4);
      for (int k = 0; k < 2; ++k) s.writes.push_back(io_->write(*files_[k], s.buf[k].data(), bytes, group_off(g)));
      on_disk_[g] = true;
      if (g == 0 && groups_ > 1) fault_point(("optim.swap_step_" + std::to_string(step_)).c_str());  // tests: killed mid-swap
      if (!swap_.pipeline_write) {
        for (auto t : s.writes) io_->wait(t);
        s.writes.clear();
      }
      if (!swap_.pipeline_read && g + 1 < groups_) fetch(g + 1);
    }
    for (auto& s : slots_) {
      for (auto t : s->writes) io_->wait(t);
      s->writes.clear();
    }
  } catch (...) {
    // The swap files are this step's scratch: the last checkpoint is elsewhere and intact. Let
    // every transfer finish before the buffers can go.
    try {
      io_->wait_all();
    } catch (...) {
    }
    for (auto& s : slots_) s->reads.clear(), s->writes.clear();
    throw;
  }
  const io::AsyncIo::Stats st = io_->stats();
  last_.step_seconds = total.seconds();
  last_.compute_seconds = compute;
  last_.wait_seconds = st.wait_seconds;
  last_.read_seconds = st.read_seconds;
  last_.write_seconds = st.write_seconds;
  last_.bytes_read = st.bytes_read;
  last_.bytes_written = st.bytes_written;
}

void SwappedAdamW::read_state(const std::string& name, float* dst) {
  const size_t k = state_index(name);
  Slot& s = *slots_[0];
  for (size_t g = 0; g < groups_; ++g) {
    const size_t len = group_len(g);
    if (!on_disk_[g]) {
      std::fill(dst + group_begin(g), dst + group_begin(g) + len, 0.0f);
      continue;
    }
    io_->wait(io_->read(*files_[k], s.buf[k].data(), io::align_up(len * 4), group_off(g)));
    std::memcpy(dst + group_begin(g), s.buf[k].data(), len * 4);
  }
}

void SwappedAdamW::write_state(const std::string& name, const float* src) {
  const size_t k = state_index(name);
  Slot& s = *slots_[0];
  for (size_t g = 0; g < groups_; ++g) {
    const size_t len = group_len(g);
    const size_t bytes = io::align_up(len * 4);
    if (!on_disk_[g]) {  // the other moment of this sub-group must read as zeros: write them too
      std::memset(s.buf[1 - k].data(), 0, bytes);
      io_->wait(io_->write(*files_[1 - k], s.buf[1 - k].data(), bytes, group_off(g)));
    }
    std::memset(s.buf[k].data(), 0, bytes);
    std::memcpy(s.buf[k].data(), src + group_begin(g), len * 4);
    io_->wait(io_->write(*files_[k], s.buf[k].data(), bytes, group_off(g)));
    on_disk_[g] = true;
  }
}

}  // namespace mt::optim
