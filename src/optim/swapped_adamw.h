// AdamW whose moments live on disk (ZeRO-Infinity's offload_optimizer device "nvme"; DeepSpeed's
// OptimizerSwapper): the span is cut into sub-groups of sub_group_size elements (DeepSpeed's
// swap unit), and step() streams them through buffer_count slots — reading the next sub-group's
// exp_avg and exp_avg_sq while this one is updated and the previous one is written back — so the
// resident optimizer state is buffer_count sub-groups, not the span. The update is the same fused
// kernel on the same elements as AdamW (it is elementwise): the numbers are bit for bit AdamW's.
//
// Files: DIR/exp_avg.swp and DIR/exp_avg_sq.swp, sub-group g at g * align_up(4 * sub_group) bytes.
// A sub-group never written reads as zeros (AdamW's initial moments) without touching the disk.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "io/aio.h"
#include "kernels/cpu/ops.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"

namespace mt::optim {

// A run of the span stored at a 4 KiB-aligned file offset: the unit of the layout on disk. Records
// are consecutive and in span order; a sub-group is a run of whole records.
struct SwapRecord {
  size_t begin = 0, numel = 0;  // span elements
  uint64_t file_off = 0;        // bytes, in every swap file of the layout
};

struct SwapOptions {
  std::string dir;                        // this rank's swap directory (created)
  // The layout (empty: the span cut into sub_group_size records). ZeRO-3 with offload_param nvme
  // gives one record per ZeRO unit piece, the layout of its master and gradient files.
  std::vector<SwapRecord> records;
  // Master weights and gradients on disk in the same layout (null: in memory, step()'s pointers).
  // Owned by the caller; step() then takes master and grad null, reads both and writes the master.
  io::File* master_file = nullptr;
  io::File* grad_file = nullptr;
  size_t sub_group_size = 1'000'000'000;  // elements per swap unit (DeepSpeed's default 1e9)
  int buffer_count = 4;                   // sub-groups resident at once (>= 2)
  bool pipeline_read = true;              // read the next sub-group during this one's update
  bool pipeline_write = true;             // write this sub-group back during the next one's update
  io::AioOptions aio;
  io::Env* env = nullptr;  // null: the real filesystem (io::posix_env())
  // With the master on disk: step() hands the step to a thread of its own and returns, so the
  // next forward runs beside it; wait_range() blocks until the sub-groups holding given span
  // elements are written back (a ZeRO-3 gather reads its unit's piece after that), wait() until
  // the whole step is. Every other call waits first. The update is the same either way.
  bool asynchronous = false;
  // Records whose sub-groups step before all others, in this order (ZeRO-3's persistent units:
  // they are gathered as the step ends); the rest follow in span order.
  std::vector<size_t> first_records;
};

// Seconds and bytes of the last step(): compute is the kernel's time, wait the time the update
// waited for the disk (what the overlap did not hide).
struct SwapStepStats {
  double step_seconds = 0, compute_seconds = 0, wait_seconds = 0;
  double read_seconds = 0, write_seconds = 0;  // the I/O threads' busy time
  uint64_t bytes_read = 0, bytes_written = 0;
};

class SwappedAdamW : public Optimizer {
 public:
  SwappedAdamW(size_t numel, std::vector<ParamSegment> segments, const AdamWConfig& config, const SwapOptions& swap);
  ~SwappedAdamW() override;

  // Checkpoints name it AdamW: its state is AdamW's, and resumes in memory or swapped alike.
  const char* type_name() const override { return "AdamW"; }
  void step(float* master, const float* grad, void* lowp, DType lowp_dtype, float lr,
            float grad_scale = 1.0f) override;
  void set_momentum(double momentum) override { config_.beta1 = static_cast<float>(momentum); }
  bool has_betas() const override { return true; }
  void set_betas(double beta1, double beta2) override;
  // "exp_avg", "exp_avg_sq" with data null: read and written through read_state/write_state.
  std::vector<StateBuffer> state() const override;
  bool state_swapped() const override { return true; }
  void read_state(const std::string& name, float* dst) override;
  void write_state(const std::string& name, const float* src) override;
  // The same, the span's elements [begin, begin + n) given by fill in order (never the whole span).
  void write_state_from(const std::string& name, const std::function<void(size_t begin, size_t n, float* dst)>& fill);
  // Span elements [begin, begin + n) of state `name` (one sub-group cached between calls, dropped
  // when a read reaches its end: a checkpoint streams the state in order).
  void read_state_range(const std::string& name, size_t begin, size_t n, float* dst);

  // The last finished step's figures (asynchronous: call wait() first).
  const SwapStepStats& last_step() const { return last_; }
  // Asynchronous: blocks until span elements [begin, end) are updated and on disk (end SIZE_MAX:
  // until the whole step is, as wait()); rethrows the step's error. Synchronous: returns at once.
  void wait_range(size_t begin, size_t end);
  void wait();
  // A start that failed: removes the moments' swap files (not the runtime's master file), whose
  // reserved space counted against the next run on the filesystem. Never throws.
  void discard_swap_files() noexcept;
  bool asynchronous() const { return swap_.asynchronous; }
  size_t sub_groups() const { return groups_; }
  size_t resident_bytes() const;  // the slots
  uint64_t disk_bytes() const;    // both files at full size (planner::optimizer_swap's figure)

 private:
  struct Slot;
  struct Group {
    size_t first = 0, last = 0;  // records [first, last)
    uint64_t file_off = 0;
    size_t bytes = 0;  // the records and their padding, 4 KiB-aligned
  };
  size_t state_index(const std::string& name) const;
  // Reads (writing: writes) state k's part of group g between the slot buffer and its file.
  io::File& file(int k) const;
  // The step itself (on the caller's thread, or the worker's when asynchronous).
  void run_step(float* master, const float* grad, void* lowp, DType lowp_dtype, const kernels::AdamWParams& p);

  AdamWConfig config_;
  SwapOptions swap_;
  std::vector<DecayRun> runs_;
  std::vector<SwapRecord> records_;
  std::vector<Group> groups_info_;
  size_t groups_ = 0, slot_bytes_ = 0;
  std::unique_ptr<io::AsyncIo> io_;
  io::DirCheck dir_check_;  // its lease of the swap directory, held while it swaps there
  std::unique_ptr<io::File> files_[2];
  std::vector<bool> on_disk_;  // per sub-group: written at least once (else zeros)
  std::vector<std::unique_ptr<Slot>> slots_;
  io::AlignedBuffer cache_;
  size_t cached_group_ = SIZE_MAX, cached_state_ = SIZE_MAX;
  SwapStepStats last_;
  std::vector<size_t> order_;  // the sub-groups in the order a step takes them
  // Asynchronous step: its thread, which sub-groups it has written back, its error.
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char> done_;
  bool running_ = false;
  std::exception_ptr error_;
};

// Adam/AdamW of spec with its moments swapped (offload_optimizer device "nvme"); others refused.
std::unique_ptr<Optimizer> make_swapped_optimizer(const OptimizerSpec& spec, size_t numel, std::vector<ParamSegment> segments,
                                                  const SwapOptions& swap);

}  // namespace mt::optim
