#include "io/aio.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <unistd.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"

namespace mt::io {
namespace {

namespace fs = std::filesystem;

// A directory on the build tree's disk (not /tmp, which may be tmpfs without O_DIRECT).
std::string test_dir(const std::string& name) {
  std::string d = std::string(MT_GOLDEN_DIR) + "/../io_test/" + name + "-" + std::to_string(::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

AlignedBuffer random_buffer(size_t n, unsigned seed) {
  AlignedBuffer b(n, MemCategory::kWorkspace);
  std::mt19937 g(seed);
  for (size_t i = 0; i < n; ++i) b.as<unsigned char>()[i] = static_cast<unsigned char>(g());
  return b;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIOError) << e.what();
    return e.what();
  }
  return "";
}

// Bytes written in blocks, several in flight, come back the same: over the disk (O_DIRECT and
// io_uring where they work) and in memory, with a length that is not a multiple of the block.
TEST(AsyncIo, RoundTripsInBlocksOnDiskAndInMemory) {
  const std::string dir = test_dir("roundtrip");
  DirCheck c = check_swap_dir(dir, 1 << 20);
  EXPECT_GT(c.free_bytes, 1u << 20);
  auto mem = memory_env();
  for (Env* env : {&posix_env(), mem.get()}) {
    AioOptions o;
    o.block_size = 64 << 10;
    o.queue_depth = 4;
    o.thread_count = 2;
    AsyncIo io(o);
    auto f = env->open(dir + "/a.swp");
    EXPECT_EQ(f->direct(), env == &posix_env() && c.direct) << env->name();
    const size_t n = (3 << 20) + kAlign;  // 48 blocks and one page
    AlignedBuffer a = random_buffer(n, 1), b = random_buffer(n, 2), back(n, MemCategory::kWorkspace);
    auto t1 = io.write(*f, a.data(), n, 0);
    auto t2 = io.write(*f, b.data(), n, n);  // a second region, concurrently
    io.wait(t2);
    io.wait(t1);
    io.wait(io.read(*f, back.data(), n, n));
    EXPECT_EQ(std::memcmp(back.data(), b.data(), n), 0) << env->name();
    io.wait(io.read(*f, back.data(), n, 0));
    EXPECT_EQ(std::memcmp(back.data(), a.data(), n), 0) << env->name();
    AsyncIo::Stats s = io.stats();
    EXPECT_EQ(s.bytes_written, 2 * n);
    EXPECT_EQ(s.bytes_read, 2 * n);
    // Reading past the end is a short read, named, never a partly filled buffer taken as whole.
    std::string err = error_of([&] { io.wait(io.read(*f, back.data(), n, 2 * n)); });
    EXPECT_NE(err.find("a.swp: short read at offset " + std::to_string(2 * n)), std::string::npos) << err;
  }
  fs::remove_all(dir);
}

TEST(AsyncIo, DirectFilesRefuseUnalignedTransfers) {
  const std::string dir = test_dir("align");
  if (!check_swap_dir(dir, 0).direct) GTEST_SKIP() << dir << " has no O_DIRECT";
  AsyncIo io;
  auto f = posix_env().open(dir + "/a.swp");
  AlignedBuffer a(2 * kAlign, MemCategory::kWorkspace);
  EXPECT_THROW(io.write(*f, a.as<char>() + 8, kAlign, 0), Error);
  EXPECT_THROW(io.write(*f, a.data(), kAlign, 512), Error);
  fs::remove_all(dir);
}

// Each injected fault is an Error naming the file, the operation, the offset and the reason.
TEST(AsyncIo, FaultsAreErrorsNamingFileOffsetAndReason) {
  auto mem = memory_env();
  AioOptions o;
  o.block_size = kAlign;
  const size_t n = 4 * kAlign;
  AlignedBuffer a = random_buffer(n, 3), back(n, MemCategory::kWorkspace);
  // The file "s/eio.swp" holds n bytes written before the faults start counting; `act` runs the
  // transfers on a fresh engine over a fault-injecting view of it, and the error is returned.
  mem->open("s/eio.swp")->write(a.data(), n, 0);
  auto fault = [&](Faults fl, const char* file, const std::function<void(AsyncIo&, File&)>& act) {
    auto env = fault_env(*mem, fl);
    auto f = env->open(file);
    AsyncIo io(o);
    return error_of([&] { act(io, *f); });
  };
  auto read_all = [&](AsyncIo& io, File& f) { io.wait(io.read(f, back.data(), n, 0)); };
  auto write_all = [&](AsyncIo& io, File& f) { io.wait(io.write(f, a.data(), n, 0)); };
  Faults fl;
  fl.eio_read_at = 2;  // the second block of the read
  EXPECT_EQ(fault(fl, "s/eio.swp", read_all), "s/eio.swp: read of 4096 bytes at offset 4096: Input/output error");
  fl = Faults{};
  fl.short_read_at = 1;
  EXPECT_EQ(fault(fl, "s/eio.swp", read_all), "s/eio.swp: short read at offset 0: 2048 of 4096 bytes");
  fl = Faults{};
  fl.short_write_at = 3;
  EXPECT_EQ(fault(fl, "s/short.swp", write_all), "s/short.swp: short write at offset 8192: 2048 of 4096 bytes");
  fl = Faults{};
  fl.eio_write_at = 1;
  EXPECT_EQ(fault(fl, "s/w.swp", write_all), "s/w.swp: write of 4096 bytes at offset 0: Input/output error");
  fl = Faults{};
  fl.enospc_after_bytes = static_cast<int64_t>(n + kAlign);  // the second transfer's second block
  EXPECT_EQ(fault(fl, "s/full.swp",
                  [&](AsyncIo& io, File& f) {
                    io.write(f, a.data(), n, 0);
                    io.write(f, a.data(), n, n);
                    io.wait_all();
                  }),
            "s/full.swp: write of 4096 bytes at offset " + std::to_string(n + kAlign) + ": No space left on device");
}

TEST(AsyncIo, SwapDirectoryChecksNameTheDirectory) {
  const std::string dir = test_dir("check");
  std::string err = error_of([&] { check_swap_dir(dir, uint64_t{1} << 62); });
  EXPECT_NE(err.find(dir + ": the swap needs"), std::string::npos) << err;
  std::ofstream(dir + "/file") << "x";
  err = error_of([&] { check_swap_dir(dir + "/file/sub", 0); });
  EXPECT_NE(err.find(dir + "/file/sub: cannot create the swap directory"), std::string::npos) << err;
  AioOptions o;
  o.block_size = 1000;
  EXPECT_THROW(AsyncIo{o}, Error);
  fs::remove_all(dir);
}

// Block transfers of one page each, two in flight: a four-block transfer has requests in flight
// when the second submission or the first wait is reached.
AioOptions two_in_flight() {
  AioOptions o;
  o.block_size = kAlign;
  o.queue_depth = 2;
  return o;
}

// Four blocks of `data` written at offset 0 with MT_FAULT=fault; the error the write throws.
std::string faulted_write(File& f, const char* fault, const AlignedBuffer& data) {
  setenv("MT_FAULT", fault, 1);
  const std::string err = error_of([&] { f.write_blocks(data.data(), 4 * kAlign, 0, two_in_flight()); });
  unsetenv("MT_FAULT");
  return err;
}

// An io_uring submission refused while earlier requests of the transfer are in flight: the
// transfer fails naming the file, and the entries it left in the ring are never submitted. The
// thread's next transfer submitted them: block 2 of the failed write landed over what was written
// there since (and its completion pointed into the failed call's freed requests).
TEST(AsyncIo, ARefusedSubmissionIsNeverSubmittedLater) {
  if (!io_uring_available()) GTEST_SKIP() << "no io_uring here";
  const std::string dir = test_dir("submit");
  auto f = posix_env().open(dir + "/s.swp");
  const AioOptions o = two_in_flight();
  AlignedBuffer first = random_buffer(4 * kAlign, 5), fixed = random_buffer(kAlign, 6), second = random_buffer(4 * kAlign, 7);
  const std::string err = faulted_write(*f, "aio.second_submit_fails", first);
  EXPECT_NE(err.find("s.swp: write of " + std::to_string(4 * kAlign) + " bytes at offset 0: Resource temporarily unavailable"),
            std::string::npos)
      << err;
  f->write(fixed.data(), kAlign, 2 * kAlign);                 // block 2 now
  f->write_blocks(second.data(), 4 * kAlign, 4 * kAlign, o);  // the thread's next transfer, elsewhere
  AlignedBuffer back = random_buffer(8 * kAlign, 8);
  f->read(back.data(), 8 * kAlign, 0);
  EXPECT_EQ(std::memcmp(back.as<char>() + 2 * kAlign, fixed.data(), kAlign), 0) << "the refused entry was submitted later";
  EXPECT_EQ(std::memcmp(back.as<char>() + 4 * kAlign, second.data(), 4 * kAlign), 0);
  f.reset();
  fs::remove_all(dir);
}

// A kernel that takes fewer entries than it is offered (short of memory): the rest are offered again
// until every block is transferred. The transfer ended when the last taken request completed and
// returned success with blocks never written, and the thread's next submission took them, pointing
// into the finished transfer's freed requests.
TEST(AsyncIo, EntriesTheKernelDidNotTakeAreOfferedAgainUntilDone) {
  if (!io_uring_available()) GTEST_SKIP() << "no io_uring here";
  const std::string dir = test_dir("takes-one");
  auto f = posix_env().open(dir + "/t.swp");
  const AioOptions o = two_in_flight();
  AlignedBuffer data = random_buffer(8 * kAlign, 12), back = random_buffer(8 * kAlign, 13);
  setenv("MT_FAULT", "aio.submit_takes_one", 1);
  f->write_blocks(data.data(), 8 * kAlign, 0, o);
  f->read_blocks(back.data(), 8 * kAlign, 0, o);
  unsetenv("MT_FAULT");
  EXPECT_EQ(thread_ring_unreaped(), 0u);
  EXPECT_EQ(std::memcmp(back.data(), data.data(), 8 * kAlign), 0) << "a block was not transferred";
  AlignedBuffer plain = random_buffer(8 * kAlign, 14);
  f->read(plain.data(), 8 * kAlign, 0);  // through the page-cache-free path, no ring
  EXPECT_EQ(std::memcmp(plain.data(), data.data(), 8 * kAlign), 0) << "a block was not written";
  f.reset();
  fs::remove_all(dir);
}

// Two runs given one nvme_path on a host: the second's start removed the first's swap files and
// created its own, or, between the first's removal and its open, opened the first's new files as
// its own: both trained on each other's moments, without a word. A swap holds its directory; this
// process's checks of it share the hold, another process's is refused naming the directory.
TEST(AsyncIo, ASwapDirectoryAnotherProcessHoldsIsRefused) {
  const std::string dir = test_dir("leased");
  {
    const DirCheck a = check_swap_dir(dir, 0, {}, true), b = check_swap_dir(dir, 0, {}, true);
    ASSERT_TRUE(a.lease);
    EXPECT_EQ(a.lease, b.lease);
    EXPECT_FALSE(check_swap_dir(dir, 0).lease);  // a probe's check: no lease, and no conflict
  }
  const int other = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);  // another open file: another process's flock
  ASSERT_GE(other, 0);
  ASSERT_EQ(::flock(other, LOCK_EX | LOCK_NB), 0);  // free again once this process's checks are gone
  const std::string err = error_of([&] { check_swap_dir(dir, 0, {SwapFile{"exp_avg.swp", 0}}, true); });
  EXPECT_NE(err.find(dir + ": another process is swapping in this directory"), std::string::npos) << err;
  EXPECT_NO_THROW(check_swap_dir(dir, 0));  // a speed probe beside a run (every rank of calibrate --io)
  ::close(other);
  EXPECT_TRUE(check_swap_dir(dir, 0, {}, true).lease);
  fs::remove_all(dir);
}

// The ranks of a host swapping to one filesystem each checked its free space for its own swap:
// all of them passed where the space held one, and together they ran out mid-run. A swap's files
// are now created with their bytes reserved, so the next rank's check sees the space taken, and a
// reservation the filesystem cannot make (here a seam: ENOSPC) fails at start, naming the file.
TEST(AsyncIo, ASwapReservesItsFilesSoTheHostsOtherRanksSeeTheSpaceTaken) {
  const std::string dir = test_dir("reserve");
  constexpr uint64_t kBytes = uint64_t{3} << 20;
  {
    const int fd = ::open((dir + "/probe").c_str(), O_RDWR | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    const bool reserves = ::fallocate(fd, 0, 0, 4096) == 0;
    ::close(fd);
    ::unlink((dir + "/probe").c_str());
    if (!reserves) GTEST_SKIP() << dir << "'s file system has no fallocate";
  }
  {
    const DirCheck c = check_swap_dir(dir, 2 * kBytes, {{"params.swp", kBytes}, {"grads.swp", kBytes}}, true);
    for (const char* name : {"params.swp", "grads.swp"}) {
      struct stat st{};
      ASSERT_EQ(::stat((fs::path(dir) / name).c_str(), &st), 0) << name;
      EXPECT_EQ(static_cast<uint64_t>(st.st_size), kBytes) << name;
      EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, kBytes) << name << ": not reserved";
    }
    // The file reads as zeros where nothing was written (a gradient never reduced).
    auto f = posix_env().open((fs::path(dir) / "grads.swp").string());
    AlignedBuffer b = random_buffer(kAlign, 3);
    f->read(b.data(), kAlign, kBytes - kAlign);
    EXPECT_TRUE(std::all_of(b.as<char>(), b.as<char>() + kAlign, [](char x) { return x == 0; }));
  }
  setenv("MT_FAULT", "aio.reserve_full", 1);
  const std::string err = error_of([&] { check_swap_dir(dir, 2 * kBytes, {{"params.swp", kBytes}, {"grads.swp", kBytes}}, true); });
  unsetenv("MT_FAULT");
  EXPECT_NE(err.find(dir + "/params.swp: cannot reserve the swap's 3 MiB (No space left on device; "), std::string::npos) << err;
  EXPECT_NE(err.find("other processes on this host, such as a run's other ranks, reserved theirs there"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(fs::path(dir) / "params.swp"));  // nothing half-made left behind
  // The second file's reservation refused: the first, reserved, goes too.
  setenv("MT_FAULT", "aio.reserve_full_second", 1);
  const std::string second = error_of([&] { check_swap_dir(dir, 2 * kBytes, {{"params.swp", kBytes}, {"grads.swp", kBytes}}, true); });
  unsetenv("MT_FAULT");
  EXPECT_NE(second.find(dir + "/grads.swp: cannot reserve"), std::string::npos) << second;
  EXPECT_FALSE(fs::exists(fs::path(dir) / "params.swp"));
  EXPECT_FALSE(fs::exists(fs::path(dir) / "grads.swp"));
  fs::remove_all(dir);
}

// A wait for completions that fails while the transfer's requests are in flight: the transfer
// fails naming the file, after reaping them. It threw at once, leaving their completions in the
// thread's ring for its next transfer to take as its own.
TEST(AsyncIo, AFailedWaitReapsTheRequestsInFlight) {
  if (!io_uring_available()) GTEST_SKIP() << "no io_uring here";
  const std::string dir = test_dir("wait");
  auto f = posix_env().open(dir + "/w.swp");
  const AioOptions o = two_in_flight();
  AlignedBuffer first = random_buffer(4 * kAlign, 9), second = random_buffer(4 * kAlign, 10);
  const std::string err = faulted_write(*f, "aio.first_wait_fails", first);
  EXPECT_NE(err.find("w.swp: write of " + std::to_string(4 * kAlign) + " bytes at offset 0: Input/output error"),
            std::string::npos)
      << err;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // whatever was in flight is done
  EXPECT_EQ(thread_ring_unreaped(), 0u) << "the failed transfer's completions were left in the ring";
  f->write_blocks(second.data(), 4 * kAlign, 4 * kAlign, o);
  EXPECT_EQ(thread_ring_unreaped(), 0u);
  AlignedBuffer back = random_buffer(4 * kAlign, 11);
  f->read(back.data(), 4 * kAlign, 4 * kAlign);
  EXPECT_EQ(std::memcmp(back.data(), second.data(), 4 * kAlign), 0);
  f.reset();
  fs::remove_all(dir);
}

// A wait that keeps failing cannot reap the requests in flight, which the kernel may still complete
// into the caller's buffers: the process ends with one line saying so (it threw with them in
// flight, and the caller freed the buffers).
TEST(AsyncIoDeathTest, AWaitThatKeepsFailingEndsTheProcessSayingWhy) {
  if (!io_uring_available()) GTEST_SKIP() << "no io_uring here";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string dir = test_dir("waits");
  EXPECT_EXIT(
      {
        auto f = posix_env().open(dir + "/w.swp");
        faulted_write(*f, "aio.every_wait_fails", random_buffer(4 * kAlign, 14));
      },
      ::testing::ExitedWithCode(1), "w.swp: write of 16384 bytes at offset 0: waiting for 2 io_uring request\\(s\\) in flight failed 8 times");
  // The threadsafe style's child ran this body again under its own pid: its directory too (every
  // run left one in the build tree).
  for (const auto& e : fs::directory_iterator(fs::path(dir).parent_path()))
    if (e.path().filename().string().starts_with("waits-")) fs::remove_all(e.path());
}

// A filesystem that takes O_DIRECT at open and refuses the first aligned write: check_swap_dir's
// probe finds it, and the swap's files there are opened buffered. The probe's finding was unused:
// the files were opened with O_DIRECT and the first block write failed.
TEST(AsyncIo, ADirectoryWhoseO_DirectWritesFailIsSwappedBuffered) {
  const std::string dir = test_dir("nodirect");
  setenv("MT_FAULT", "aio.direct_write_refused", 1);
  const DirCheck c = check_swap_dir(dir, 0);
  unsetenv("MT_FAULT");
  EXPECT_FALSE(c.direct);
  auto f = posix_env().open(dir + "/./s.swp");  // the same directory, spelt another way
  EXPECT_FALSE(f->direct());
  AlignedBuffer b = random_buffer(2 * kAlign, 12), back = random_buffer(2 * kAlign, 13);
  f->write_blocks(b.data(), 2 * kAlign, 0, AioOptions{});
  f->read_blocks(back.data(), 2 * kAlign, 0, AioOptions{});
  EXPECT_EQ(std::memcmp(back.data(), b.data(), 2 * kAlign), 0);
  f.reset();
  fs::remove_all(dir);
}

// A previous run's swap files are this run's scratch: they are removed before the free space is
// counted. A ZeRO-Infinity run that fit its disk could not be resumed there, its own old swap
// counting against the new one ("the swap needs 1 MiB, the filesystem has 0 MiB free").
TEST(AsyncIo, APreviousRunsSwapFilesDoNotCountAgainstTheSwap) {
  const std::string dir = test_dir("scratch");
  constexpr size_t kOld = size_t{256} << 20;
  AlignedBuffer b = random_buffer(kOld, 3);
  // The free space is the machine's: another process writing or freeing 128 MiB between the count
  // and the checks (the fresh-machine check unpacks Debian beside the tests) moves it past the
  // margin, so an attempt that meets that is made again. A check that counts the old file, or
  // never refuses, fails every attempt.
  std::string refused, kept;
  bool removed = false;
  for (int attempt = 0; attempt < 3; ++attempt) {
    {
      auto f = posix_env().open(dir + "/exp_avg.swp");
      f->write(b.data(), kOld, 0);
    }
    std::ofstream(dir + "/keep.txt") << "not the swap's";
    ::sync();
    const uint64_t free_now = check_swap_dir(dir, 0).free_bytes;
    // Half the old file more than is free now: met once the old file is gone, and not before.
    refused = error_of([&] { check_swap_dir(dir, free_now + kOld / 2); });
    kept = error_of([&] { check_swap_dir(dir, free_now + kOld / 2, {SwapFile{"exp_avg.swp", 0}, SwapFile{"exp_avg_sq.swp", 0}}); });
    removed = !fs::exists(dir + "/exp_avg.swp");
    if (refused.find("the swap needs") != std::string::npos && kept.empty()) break;
  }
  EXPECT_NE(refused.find("the swap needs"), std::string::npos) << refused;
  EXPECT_EQ(kept, "");
  EXPECT_TRUE(removed);
  EXPECT_TRUE(fs::exists(dir + "/keep.txt"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mt::io
