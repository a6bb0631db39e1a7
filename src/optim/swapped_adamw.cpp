#include "optim/swapped_adamw.h"

#include <algorithm>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <utility>

#include "base/error.h"
#include "base/fault.h"
#include "base/timer.h"
#include "kernels/cpu/ops.h"

namespace mt::optim {

namespace {
const char* const kStateNames[2] = {"exp_avg", "exp_avg_sq"};
enum : int { kM = 0, kV = 1, kMaster = 2, kGrad = 3 };
}  // namespace

// One resident sub-group: the moments (and, swapped, the master and gradients), and the
// transfers in flight on them.
struct SwappedAdamW::Slot {
  io::AlignedBuffer buf[4];
  std::vector<io::AsyncIo::Ticket> reads, writes;
};

SwappedAdamW::SwappedAdamW(size_t numel, std::vector<ParamSegment> segments, const AdamWConfig& config,
                           const SwapOptions& swap)
    : Optimizer(numel, std::move(segments)), config_(config), swap_(swap), runs_(decay_runs(segments_)) {
  MT_CHECK(swap_.buffer_count >= 2, ErrorKind::kInvalidArgument,
           "zero_optimization.offload_optimizer.buffer_count must be at least 2 (got " +
               std::to_string(swap_.buffer_count) + ")");
  MT_CHECK(swap_.sub_group_size > 0, ErrorKind::kInvalidArgument, "zero_optimization.sub_group_size must be positive");
  MT_CHECK((swap_.master_file == nullptr) == (swap_.grad_file == nullptr), ErrorKind::kInternal,
           "SwappedAdamW: master and gradients are swapped together");
  records_ = swap_.records;
  if (records_.empty()) {
    // The span in records of sub_group_size rounded to 4 KiB of f32 (1024 elements): one record
    // per sub-group, every transfer O_DIRECT-aligned.
    const size_t unit = io::kAlign / 4;
    const size_t group = std::max<size_t>(unit, (std::min(swap_.sub_group_size, std::max<size_t>(numel_, 1)) + unit - 1) / unit * unit);
    for (size_t b = 0; b < numel_; b += group)
      records_.push_back({b, std::min(group, numel_ - b), static_cast<uint64_t>(b / group) * io::align_up(group * 4)});
  }
  size_t at = 0;
  for (const SwapRecord& r : records_) {
    MT_CHECK(r.begin == at && r.file_off % io::kAlign == 0, ErrorKind::kInternal,
             "SwappedAdamW: records must cover the span in order at aligned offsets");
    at += r.numel;
  }
  MT_CHECK(at == numel_, ErrorKind::kInternal, "SwappedAdamW: records do not cover the span");
  // Sub-groups: whole records, up to sub_group_size elements (at least one record each).
  for (size_t i = 0; i < records_.size();) {
    Group g;
    g.first = i;
    size_t n = 0;
    while (i < records_.size() && (i == g.first || n + records_[i].numel <= swap_.sub_group_size)) n += records_[i++].numel;
    g.last = i;
    g.file_off = records_[g.first].file_off;
    g.bytes = io::align_up(static_cast<size_t>(records_[g.last - 1].file_off - g.file_off) + records_[g.last - 1].numel * 4);
    slot_bytes_ = std::max(slot_bytes_, g.bytes);
    groups_info_.push_back(g);
  }
  groups_ = groups_info_.size();
  std::vector<char> taken(groups_, 0);
  for (size_t r : swap_.first_records) {
    MT_CHECK(r < records_.size(), ErrorKind::kInternal, "SwappedAdamW: first_records past the layout");
    size_t g = 0;
    while (groups_info_[g].last <= r) ++g;
    if (!taken[g]) order_.push_back(g), taken[g] = 1;
  }
  for (size_t g = 0; g < groups_; ++g)
    if (!taken[g]) order_.push_back(g);
  done_.assign(groups_, 1);
  io::Env& env = swap_.env ? *swap_.env : io::posix_env();
  if (swap_.env == nullptr)
    dir_check_ = io::check_swap_dir(swap_.dir, disk_bytes(),
                                    {{std::string(kStateNames[0]) + ".swp", disk_bytes() / 2},
                                     {std::string(kStateNames[1]) + ".swp", disk_bytes() / 2}},
                                    /*hold=*/true);
  for (int s = 0; s < 2; ++s) files_[s] = env.open(swap_.dir + "/" + kStateNames[s] + ".swp");
  io_ = std::make_unique<io::AsyncIo>(swap_.aio);
  on_disk_.assign(groups_, false);
  const int nbuf = swap_.master_file ? 4 : 2;
  const size_t nslots = std::min<size_t>(static_cast<size_t>(swap_.buffer_count), std::max<size_t>(groups_, 1));
  for (size_t i = 0; i < nslots; ++i) {
    auto slot = std::make_unique<Slot>();
    for (int k = 0; k < nbuf; ++k) slot->buf[k] = io::AlignedBuffer(slot_bytes_, MemCategory::kOptimizer);
    slots_.push_back(std::move(slot));
  }
}

SwappedAdamW::~SwappedAdamW() {
  if (worker_.joinable()) worker_.join();  // an error it met was the engine's to collect (wait())
  try {
    if (io_) io_->wait_all();
  } catch (...) {  // a failed write was reported by the step that issued it
  }
}

void SwappedAdamW::discard_swap_files() noexcept {
  if (swap_.env != nullptr) return;  // a test's Env holds no files
  try {
    if (io_) io_->wait_all();
  } catch (...) {
  }
  for (int s = 0; s < 2; ++s) ::unlink((swap_.dir + "/" + kStateNames[s] + ".swp").c_str());
}

io::File& SwappedAdamW::file(int k) const {
  return k == kMaster ? *swap_.master_file : k == kGrad ? *swap_.grad_file : *files_[k];
}

size_t SwappedAdamW::resident_bytes() const {
  return slots_.size() * (swap_.master_file ? 4 : 2) * slot_bytes_;  // whole pages: no pad
}

uint64_t SwappedAdamW::disk_bytes() const {  // the moments' files: up to the last record's end
  if (records_.empty()) return 0;
  return 2 * (records_.back().file_off + io::align_up(records_.back().numel * 4));
}

void SwappedAdamW::set_betas(double beta1, double beta2) {
  wait();
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
  wait();
  const bool swapped = swap_.master_file != nullptr;
  MT_CHECK(swapped == (master == nullptr), ErrorKind::kInternal, "SwappedAdamW: master in memory or on disk, not both");
  ++step_;
  cache_ = io::AlignedBuffer();
  cached_group_ = cached_state_ = SIZE_MAX;
  const kernels::AdamWParams p = adamw_step_params(config_, lr, step_, grad_scale);
  if (!swap_.asynchronous) {
    run_step(master, grad, lowp, lowp_dtype, p);
    return;
  }
  MT_CHECK(swapped && lowp == nullptr, ErrorKind::kInternal, "SwappedAdamW: an asynchronous step needs the master on disk");
  {
    std::lock_guard<std::mutex> l(mu_);
    std::fill(done_.begin(), done_.end(), 0);
    running_ = true;
  }
  worker_ = std::thread([this, p] {
    std::exception_ptr error;
    try {
      run_step(nullptr, nullptr, nullptr, DType::kF32, p);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> l(mu_);
    error_ = error;
    running_ = false;
    cv_.notify_all();
  });
}

void SwappedAdamW::wait() {
  if (worker_.joinable()) worker_.join();
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> l(mu_);
    std::swap(error, error_);
  }
  if (error) std::rethrow_exception(error);
}

void SwappedAdamW::wait_range(size_t begin, size_t end) {
  if (end == SIZE_MAX) return wait();
  {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] {
      if (!running_) return true;
      for (size_t g = 0; g < groups_; ++g) {
        const Group& gr = groups_info_[g];
        const size_t lo = records_[gr.first].begin, hi = records_[gr.last - 1].begin + records_[gr.last - 1].numel;
        if (lo < end && hi > begin && !done_[g]) return false;
      }
      return true;
    });
    if (running_) return;
  }
  wait();  // finished (or failed): collect it
}

void SwappedAdamW::run_step(float* master, const float* grad, void* lowp, DType lowp_dtype, const kernels::AdamWParams& p0) {
  const bool swapped = swap_.master_file != nullptr;
  kernels::AdamWParams p = p0;
  Timer total;
  io_->reset_stats();
  const size_t esz = dtype_size(lowp_dtype);
  const size_t nslots = slots_.size();
  double compute = 0;
  // The i-th sub-group of the order into slot i mod nslots: waits for the slot's previous write-back first.
  auto fetch = [&](size_t i) {
    const size_t g = order_[i];
    Slot& s = *slots_[i % nslots];
    for (auto t : s.writes) io_->wait(t);
    s.writes.clear();
    const Group& gr = groups_info_[g];
    for (int k : {kM, kV}) {
      if (on_disk_[g]) s.reads.push_back(io_->read(file(k), s.buf[k].data(), gr.bytes, gr.file_off));
      else std::memset(s.buf[k].data(), 0, gr.bytes);
    }
    if (swapped)
      for (int k : {kMaster, kGrad}) s.reads.push_back(io_->read(file(k), s.buf[k].data(), gr.bytes, gr.file_off));
  };
  try {
    // Asynchronous: sub-group order_[i] is marked written once its writes are done (at the latest
    // during the next one's update), and the waiters told.
    auto written = [&](size_t i) {
      Slot& s = *slots_[i % nslots];
      for (auto t : s.writes) io_->wait(t);
      s.writes.clear();
      if (!swap_.asynchronous) return;
      std::lock_guard<std::mutex> l(mu_);
      done_[order_[i]] = 1;
      cv_.notify_all();
    };
    if (groups_ > 0) fetch(0);
    for (size_t i = 0; i < groups_; ++i) {
      const size_t g = order_[i];
      Slot& s = *slots_[i % nslots];
      for (auto t : s.reads) io_->wait(t);
      s.reads.clear();
      if (swap_.pipeline_read && i + 1 < groups_) fetch(i + 1);  // read while this sub-group is updated
      Timer c;
      const Group& gr = groups_info_[g];
      for (size_t ri = gr.first; ri < gr.last; ++ri) {
        const SwapRecord& rec = records_[ri];
        const size_t a = rec.begin, b = a + rec.numel, at = static_cast<size_t>(rec.file_off - gr.file_off) / 4;
        float* m = s.buf[kM].as<float>() + at;
        float* v = s.buf[kV].as<float>() + at;
        float* w = swapped ? s.buf[kMaster].as<float>() + at : master + a;
        const float* gd = swapped ? s.buf[kGrad].as<float>() + at : grad + a;
        for (const DecayRun& r : runs_) {
          const size_t lo = std::max(a, r.offset), hi = std::min(b, r.offset + r.numel);
          if (lo >= hi) continue;
          p.weight_decay = r.weight_decay;
          void* lp = lowp ? static_cast<char*>(lowp) + lo * esz : nullptr;
          kernels::adamw_update(w + (lo - a), gd + (lo - a), m + (lo - a), v + (lo - a), lp, lowp_dtype, hi - lo, p);
        }
      }
      compute += c.seconds();
      for (int k : {kM, kV}) s.writes.push_back(io_->write(file(k), s.buf[k].data(), gr.bytes, gr.file_off));
      if (swapped) s.writes.push_back(io_->write(file(kMaster), s.buf[kMaster].data(), gr.bytes, gr.file_off));
      on_disk_[g] = true;
      if (i == 0 && groups_ > 1) fault_point(("optim.swap_step_" + std::to_string(step_)).c_str());  // tests: killed mid-swap
      if (!swap_.pipeline_write) written(i);
      else if (swap_.asynchronous && i > 0) written(i - 1);
      if (!swap_.pipeline_read && i + 1 < groups_) fetch(i + 1);
    }
    for (size_t i = groups_ > nslots ? groups_ - nslots : 0; i < groups_; ++i) written(i);
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
  wait();
  const size_t k = state_index(name);
  Slot& s = *slots_[0];
  for (size_t g = 0; g < groups_; ++g) {
    const Group& gr = groups_info_[g];
    if (on_disk_[g]) io_->wait(io_->read(*files_[k], s.buf[k].data(), gr.bytes, gr.file_off));
    for (size_t ri = gr.first; ri < gr.last; ++ri) {
      const SwapRecord& rec = records_[ri];
      if (on_disk_[g]) std::memcpy(dst + rec.begin, s.buf[k].as<char>() + (rec.file_off - gr.file_off), rec.numel * 4);
      else std::fill(dst + rec.begin, dst + rec.begin + rec.numel, 0.0f);
    }
  }
}

void SwappedAdamW::read_state_range(const std::string& name, size_t begin, size_t n, float* dst) {
  wait();
  const size_t k = state_index(name), end = begin + n;
  for (size_t g = 0; g < groups_; ++g) {
    const Group& gr = groups_info_[g];
    const size_t lo = records_[gr.first].begin, hi = records_[gr.last - 1].begin + records_[gr.last - 1].numel;
    if (hi <= begin || lo >= end) continue;
    if (!on_disk_[g]) {
      std::fill(dst + (std::max(begin, lo) - begin), dst + (std::min(end, hi) - begin), 0.0f);
      continue;
    }
    if (cached_group_ != g || cached_state_ != k) {
      if (cache_.size() < gr.bytes) cache_ = io::AlignedBuffer(slot_bytes_, MemCategory::kOptimizer);
      io_->wait(io_->read(*files_[k], cache_.data(), gr.bytes, gr.file_off));
      cached_group_ = g, cached_state_ = k;
    }
    for (size_t ri = gr.first; ri < gr.last; ++ri) {
      const SwapRecord& rec = records_[ri];
      const size_t a = std::max(begin, rec.begin), b = std::min(end, rec.begin + rec.numel);
      if (a >= b) continue;
      std::memcpy(dst + (a - begin), cache_.as<char>() + (rec.file_off - gr.file_off) + (a - rec.begin) * 4, (b - a) * 4);
    }
    if (std::min(end, hi) == hi) {  // read to the sub-group's end
      cache_ = io::AlignedBuffer();
      cached_group_ = cached_state_ = SIZE_MAX;
    }
  }
}

void SwappedAdamW::write_state(const std::string& name, const float* src) {
  write_state_from(name, [src](size_t b, size_t n, float* dst) { std::memcpy(dst, src + b, n * sizeof(float)); });
}

void SwappedAdamW::write_state_from(const std::string& name, const std::function<void(size_t, size_t, float*)>& fill) {
  wait();
  const size_t k = state_index(name);
  cache_ = io::AlignedBuffer();
  cached_group_ = cached_state_ = SIZE_MAX;
  Slot& s = *slots_[0];
  for (size_t g = 0; g < groups_; ++g) {
    const Group& gr = groups_info_[g];
    if (!on_disk_[g]) {  // the other moment of this sub-group must read as zeros: write them too
      std::memset(s.buf[1 - k].data(), 0, gr.bytes);
      io_->wait(io_->write(*files_[1 - k], s.buf[1 - k].data(), gr.bytes, gr.file_off));
    }
    std::memset(s.buf[k].data(), 0, gr.bytes);
    for (size_t ri = gr.first; ri < gr.last; ++ri) {
      const SwapRecord& rec = records_[ri];
      fill(rec.begin, rec.numel, reinterpret_cast<float*>(s.buf[k].as<char>() + (rec.file_off - gr.file_off)));
    }
    io_->wait(io_->write(*files_[k], s.buf[k].data(), gr.bytes, gr.file_off));
    on_disk_[g] = true;
  }
}

}  // namespace mt::optim
