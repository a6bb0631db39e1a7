#include "optim/swapped_adamw.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <vector>

#include "base/error.h"
#include "optim/adamw.h"

namespace mt::optim {
namespace {

std::vector<ParamSegment> segments(size_t n) {  // three decay groups, boundaries off the sub-groups
  return {{0, 1000, 0.1f, "a"}, {1000, 2500, 0.0f, "b"}, {3500, n - 3500, 0.05f, "c"}};
}

std::vector<float> randoms(size_t n, unsigned seed, float scale) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

struct Trial {
  std::vector<float> master;
  std::vector<uint16_t> lowp;
};

// Five steps of an optimizer over fixed gradients; the bf16 copy too.
void steps(Optimizer& o, Trial& r, int from, int to) {
  for (int s = from; s < to; ++s) {
    std::vector<float> g = randoms(r.master.size(), 100 + s, 1e-2f);
    o.step(r.master.data(), g.data(), r.lowp.data(), DType::kBF16, 1e-3f * (s + 1), 0.5f);
  }
}

// The oracle: in-memory AdamW `ref` from the shared start (randoms(n, 7, 0.1)) over the first
// `count` fixed-gradient steps; a swapped run from the same start must end on these numbers.
Trial reference(AdamW& ref, size_t n, int count) {
  Trial want{randoms(n, 7, 0.1f), std::vector<uint16_t>(n)};
  steps(ref, want, 0, count);
  return want;
}

// A span written into / read from a swap file in a record layout.
void put_records(io::File& f, const std::vector<SwapRecord>& recs, const std::vector<float>& span) {
  for (const SwapRecord& r : recs) {
    io::AlignedBuffer b(io::align_up(r.numel * 4), MemCategory::kWorkspace);
    std::memcpy(b.data(), span.data() + r.begin, r.numel * 4);
    f.write(b.data(), b.size(), r.file_off);
  }
}
std::vector<float> get_records(io::File& f, const std::vector<SwapRecord>& recs, size_t n) {
  std::vector<float> span(n);
  for (const SwapRecord& r : recs) {
    io::AlignedBuffer b(io::align_up(r.numel * 4), MemCategory::kWorkspace);
    f.read(b.data(), b.size(), r.file_off);
    std::memcpy(span.data() + r.begin, b.data(), r.numel * 4);
  }
  return span;
}

std::string dir(const std::string& name) {
  std::string d = std::string(MT_GOLDEN_DIR) + "/../swap_test/" + name + "-" + std::to_string(::getpid());
  std::filesystem::remove_all(d);
  return d;
}

// The swapped optimizer is AdamW bit for bit: any sub-group size (one, several, a ragged last
// one), buffer counts 2 and 4, pipelined or not, on disk and in memory; its moments read back
// equal AdamW's, and a state written into a fresh one continues the same run.
TEST(SwappedAdamW, EqualsAdamWBitForBitOnDiskAndInMemory) {
  const size_t n = 10000;
  AdamWConfig cfg;
  cfg.beta2 = 0.99f;
  AdamW ref(n, segments(n), cfg);
  const Trial want = reference(ref, n, 5);
  std::vector<float> m(n), v(n);
  auto mem = io::memory_env();
  struct Case {
    size_t sub;
    int buffers;
    bool pipe;
    bool disk;
  };
  for (Case c : {Case{3000, 4, true, true}, Case{3000, 2, true, false}, Case{1024, 3, false, false},
                 Case{100000, 4, true, true}, Case{4096, 2, true, true}}) {
    SCOPED_TRACE("sub " + std::to_string(c.sub) + " buffers " + std::to_string(c.buffers) + (c.disk ? " disk" : " memory"));
    SwapOptions so;
    so.dir = c.disk ? dir("eq") : "mem";
    so.sub_group_size = c.sub;
    so.buffer_count = c.buffers;
    so.pipeline_read = so.pipeline_write = c.pipe;
    so.aio.block_size = 4096;
    so.env = c.disk ? nullptr : mem.get();
    SwappedAdamW o(n, segments(n), cfg, so);
    Trial got{randoms(n, 7, 0.1f), std::vector<uint16_t>(n)};
    steps(o, got, 0, 5);
    EXPECT_EQ(std::memcmp(got.master.data(), want.master.data(), n * 4), 0);
    EXPECT_EQ(got.lowp, want.lowp);
    o.read_state("exp_avg", m.data());
    o.read_state("exp_avg_sq", v.data());
    EXPECT_EQ(std::memcmp(m.data(), ref.exp_avg(), n * 4), 0);
    EXPECT_EQ(std::memcmp(v.data(), ref.exp_avg_sq(), n * 4), 0);
    // buffer_count slots of both moments, a sub-group of whole 4 KiB pages each (+4 KiB of alignment).
    const size_t group = (std::min(c.sub, n) + 1023) / 1024 * 1024;
    const size_t slots = std::min<size_t>(c.buffers, (n + group - 1) / group);
    EXPECT_EQ(o.resident_bytes(), slots * 2 * io::align_up(group * 4));
    EXPECT_GT(o.last_step().bytes_written, 0u);
  }
  // Resume: AdamW's state after 3 steps written into a fresh swapped one continues bit for bit.
  AdamW a3(n, segments(n), cfg);
  Trial r3{randoms(n, 7, 0.1f), std::vector<uint16_t>(n)};
  steps(a3, r3, 0, 3);
  SwapOptions so;
  so.dir = dir("resume");
  so.sub_group_size = 3000;
  SwappedAdamW o(n, segments(n), cfg, so);
  o.write_state("exp_avg", a3.exp_avg());
  o.write_state("exp_avg_sq", a3.exp_avg_sq());
  o.set_step_count(3);
  steps(o, r3, 3, 5);
  EXPECT_EQ(std::memcmp(r3.master.data(), want.master.data(), n * 4), 0);
  std::filesystem::remove_all(dir("eq"));
  std::filesystem::remove_all(dir("resume"));
}

// ZeRO-3 with parameters on disk: records of uneven sizes at aligned offsets (gaps between them),
// the master weights and gradients read from files of that layout and the master written back —
// still AdamW bit for bit, with sub-groups of one and of several records.
TEST(SwappedAdamW, MasterAndGradientsOnDiskInARecordLayout) {
  const size_t n = 10000;
  AdamWConfig cfg;
  AdamW ref(n, segments(n), cfg);
  const Trial want = reference(ref, n, 4);
  const size_t sizes[] = {1500, 2600, 5900};
  std::vector<SwapRecord> recs;
  uint64_t off = 0;
  size_t at = 0;
  for (size_t k : sizes) {
    recs.push_back({at, k, off});
    at += k;
    off += io::align_up(k * 4) + 4096;  // a page of gap too
  }
  for (size_t sub : {size_t{1000}, size_t{5000}, size_t{100000}}) {
    auto mem = io::memory_env();
    auto wf = mem->open("w.swp"), gf = mem->open("g.swp");
    std::vector<float> w0 = randoms(n, 7, 0.1f);
    put_records(*wf, recs, w0);
    SwapOptions so;
    so.dir = "rec";
    so.env = mem.get();
    so.sub_group_size = sub;
    so.records = recs;
    so.master_file = wf.get();
    so.grad_file = gf.get();
    so.buffer_count = 2;
    SwappedAdamW o(n, segments(n), cfg, so);
    for (int s = 0; s < 4; ++s) {
      put_records(*gf, recs, randoms(n, 100 + s, 1e-2f));
      o.step(nullptr, nullptr, nullptr, DType::kBF16, 1e-3f * (s + 1), 0.5f);
    }
    const std::vector<float> got = get_records(*wf, recs, n);
    EXPECT_EQ(std::memcmp(got.data(), want.master.data(), n * 4), 0) << "sub " << sub;
    std::vector<float> m(n);
    o.read_state("exp_avg", m.data());
    EXPECT_EQ(std::memcmp(m.data(), ref.exp_avg(), n * 4), 0) << "sub " << sub;
    EXPECT_EQ(o.sub_groups(), sub == 1000 ? 3u : sub == 5000 ? 2u : 1u);
  }
}

// A disk error mid-step is an Error naming the swap file; nothing is left in flight.
TEST(SwappedAdamW, DiskFaultsMidStepAreNamedErrors) {
  const size_t n = 10000;
  AdamWConfig cfg;
  auto mem = io::memory_env();
  for (int which = 0; which < 3; ++which) {
    io::Faults f;
    if (which == 0) f.eio_read_at = 2;            // step 2's reads
    if (which == 1) f.enospc_after_bytes = 60000;  // step 1's writes run out of space
    if (which == 2) f.short_read_at = 1;
    auto env = io::fault_env(*mem, f);
    SwapOptions so;
    so.dir = std::string("f") + char('0' + which);
    so.sub_group_size = 3000;
    so.env = env.get();
    SwappedAdamW o(n, segments(n), cfg, so);
    Trial r{randoms(n, 7, 0.1f), std::vector<uint16_t>(n)};
    std::string err;
    try {
      steps(o, r, 0, 3);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kIOError);
      err = e.what();
    }
    const char* want[3] = {".swp: read of", "No space left on device", "short read at offset 0"};
    EXPECT_NE(err.find(want[which]), std::string::npos) << which << ": " << err;
    EXPECT_NE(err.find(so.dir + "/exp_avg"), std::string::npos) << err;
  }
}

// A file whose writes at one offset block until released (and say when one has begun).
class GatedFile : public io::File {
 public:
  GatedFile(io::File& inner, uint64_t gate_off) : inner_(inner), gate_off_(gate_off) {}
  const std::string& path() const override { return inner_.path(); }
  void read(void* buf, size_t n, uint64_t off) override { inner_.read(buf, n, off); }
  void write(const void* buf, size_t n, uint64_t off) override {
    if (off == gate_off_) {
      std::unique_lock<std::mutex> l(mu_);
      entered_ = true;
      cv_.notify_all();
      cv_.wait(l, [&] { return open_; });
    }
    inner_.write(buf, n, off);
  }
  void close_gate() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = false;
    entered_ = false;
  }
  void wait_entered() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return entered_; });
  }
  void open_gate() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  io::File& inner_;
  uint64_t gate_off_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true, entered_ = false;
};

// ZeRO-Infinity's overlap: an asynchronous step returns at once and runs on its own thread, its
// sub-groups in the order asked for (first_records first, then span order); wait_range() returns
// as soon as the sub-groups holding a range are on disk, while a later one's write is still held
// back; the result is AdamW's bit for bit. An I/O error of such a step surfaces at the next wait.
TEST(SwappedAdamW, AsynchronousStepRunsBesideTheCallerInItsOrder) {
  const size_t n = 10000;
  AdamWConfig cfg;
  AdamW ref(n, segments(n), cfg);
  const Trial want = reference(ref, n, 3);
  const std::vector<SwapRecord> recs = {{0, 1500, 0}, {1500, 2600, 8192}, {4100, 5900, 20480}};
  auto mem = io::memory_env();
  auto raw_w = mem->open("w.swp"), gf = mem->open("g.swp");
  GatedFile wf(*raw_w, recs[1].file_off);  // the master's write of the middle record waits for the test
  const std::vector<float> w0 = randoms(n, 7, 0.1f);
  put_records(*raw_w, recs, w0);
  SwapOptions so;
  so.dir = "async";
  so.env = mem.get();
  so.sub_group_size = 1000;  // one record per sub-group
  so.records = recs;
  so.master_file = &wf;
  so.grad_file = gf.get();
  so.buffer_count = 2;
  so.asynchronous = true;
  so.first_records = {2};  // order: 2, 0, 1
  SwappedAdamW o(n, segments(n), cfg, so);
  for (int s = 0; s < 3; ++s) {
    o.wait();  // the gradients of the step before were read (the engine's gathers see to it)
    put_records(*gf, recs, randoms(n, 100 + s, 1e-2f));
    if (s == 2) wf.close_gate();
    o.step(nullptr, nullptr, nullptr, DType::kBF16, 1e-3f * (s + 1), 0.5f);  // returns while held
    if (s == 2) {
      wf.wait_entered();  // the last sub-group's master write has begun and is held
      o.wait_range(recs[2].begin, recs[2].begin + recs[2].numel);  // first in the order: on disk
      o.wait_range(0, recs[0].numel);                              // second: on disk too
      io::AlignedBuffer b(io::align_up(recs[2].numel * 4), MemCategory::kWorkspace);
      raw_w->read(b.data(), b.size(), recs[2].file_off);
      EXPECT_EQ(std::memcmp(b.data(), want.master.data() + recs[2].begin, recs[2].numel * 4), 0);
      wf.open_gate();
    }
  }
  o.wait_range(0, SIZE_MAX);
  const std::vector<float> got = get_records(*raw_w, recs, n);
  EXPECT_EQ(std::memcmp(got.data(), want.master.data(), n * 4), 0);
  std::vector<float> m(n);
  o.read_state("exp_avg_sq", m.data());
  EXPECT_EQ(std::memcmp(m.data(), ref.exp_avg_sq(), n * 4), 0);
  EXPECT_EQ(o.last_step().bytes_written, 3u * (8192u + 12288u + 24576u));  // m, v and master of each sub-group

  // An error on the step's thread: the next wait throws it, once.
  io::Faults f;
  f.eio_write_at = 1;  // a moment's write-back
  auto env = io::fault_env(*mem, f);
  SwapOptions fo = so;
  fo.dir = "async-fault";
  fo.env = env.get();
  fo.master_file = raw_w.get();
  SwappedAdamW bad(n, segments(n), cfg, fo);
  bad.step(nullptr, nullptr, nullptr, DType::kBF16, 1e-3f, 1.0f);
  std::string err;
  try {
    bad.wait_range(0, 10);
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("async-fault/exp_avg"), std::string::npos) << err;
  EXPECT_NO_THROW(bad.wait());
}

}  // namespace
}  // namespace mt::optim
