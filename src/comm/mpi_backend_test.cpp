// test_comm_mpi: the MPI backend under `mpirun -np N` (tests/CMakeLists.txt runs N = 2 and 4).
// Rank r holds x_r[i] = 10 r + i; every collective is checked against the result computed by hand,
// bf16 sums against a double reference rounded once. Each rank prints its own failures ("FAIL
// ..."); rank 0 prints the summary. Exit status: 0 when every rank passed.
//
// --timeout-case: the last rank skips all_reduce #1; every other rank must get a CommTimeout naming
// it, the collective and its number. Rank 0 then aborts the job (the way the CLI ends a hung job),
// so ctest passes this case on rank 0's "timeout case: PASS" line, and fails on any "FAIL".
#include <mpi.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/threads.h"
#include "comm/comm_log.h"
#include "comm/mpi_backend.h"
#include "comm/onebit.h"
#include "comm/onebit_reference_test_util.h"
#include "tensor/allocator.h"

using namespace mt;
using namespace mt::comm;

namespace {

int g_failures = 0;
int g_checks = 0;
int g_rank = 0;

#define EXPECT(cond, what)                                                                 \
  do {                                                                                     \
    ++g_checks;                                                                            \
    if (!(cond)) {                                                                         \
      ++g_failures;                                                                        \
      std::printf("FAIL rank %d line %d: %s (%s)\n", g_rank, __LINE__, #cond,            \
                  std::string(what).c_str());                                              \
    }                                                                                      \
  } while (0)

float x(int r, size_t i) { return static_cast<float>(10 * r + static_cast<int>(i)); }

std::vector<float> inputs(int r, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = x(r, i);
  return v;
}

void check_all_reduce(Backend& b) {
  const int n = b.size();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    auto v = inputs(b.rank(), 7);
    AllReduceOptions o;
    o.op = op;
    auto w = b.all_reduce(v.data(), v.size(), DType::kF32, o);
    w->wait();
    EXPECT(w->is_completed(), "all_reduce");
    for (size_t i = 0; i < v.size(); ++i) {
      float sum = 0;
      for (int r = 0; r < n; ++r) sum += x(r, i);
      float expect = op == ReduceOp::kSum ? sum : op == ReduceOp::kAvg ? sum / n
                     : op == ReduceOp::kMax ? x(n - 1, i) : x(0, i);
      EXPECT(v[i] == expect, std::string("all_reduce ") + reduce_op_name(op));
    }
  }
}

void check_bf16_sum(Backend& b) {
  const size_t count = 512;
  const int n = b.size();
  auto make = [&](int r) {  // same data on every rank, seeded by rank
    std::mt19937 rng(100 + r);
    std::uniform_real_distribution<float> u(-4.0f, 4.0f);
    std::vector<bf16_t> v(count);
    for (auto& e : v) e = f32_to_bf16(u(rng));
    return v;
  };
  auto mine = make(b.rank());
  auto rs_in = mine;  // reduce_scatter over count / n blocks
  b.all_reduce(mine.data(), count, DType::kBF16, {})->wait();
  std::vector<bf16_t> rs_out(count / n);
  b.reduce_scatter(rs_out.data(), rs_in.data(), count / n, DType::kBF16, {})->wait();
  std::vector<double> exact(count, 0.0);
  for (int r = 0; r < n; ++r) {
    auto v = make(r);
    for (size_t i = 0; i < count; ++i) exact[i] += bf16_to_f32(v[i]);
  }
  int bad = 0, bad_rs = 0;
  for (size_t i = 0; i < count; ++i)
    bad += mine[i].bits != f32_to_bf16(static_cast<float>(exact[i])).bits;
  for (size_t i = 0; i < count / n; ++i)
    bad_rs += rs_out[i].bits !=
              f32_to_bf16(static_cast<float>(exact[b.rank() * (count / n) + i])).bits;
  EXPECT(bad == 0, std::to_string(bad) + " bf16 all_reduce elements differ from the f32-accumulated sum");
  EXPECT(bad_rs == 0, std::to_string(bad_rs) + " bf16 reduce_scatter elements differ");
}

// in_dtype: bf16/f16 summed as 2-byte values (user MPI ops over MPI_UINT16_T), every partial sum
// rounded. Element 0 is 1 on rank 0 and 2^-8 elsewhere: 1 + 2^-8 rounds to 1 (tie to even) while
// 2^-8 + 2^-8 is exact, so on 4 ranks a reduction in bf16 gives 1 or 1 + 2^-7 (by its order),
// never the f32-accumulated sum rounded once, 1 + 2^-6. The other elements are random: within the
// rounding of n - 1 partial sums of the exact sum.
void check_in_dtype(Backend& b) {
  const int n = b.size();
  const size_t count = 64 * static_cast<size_t>(n);
  auto make = [&](int r) {
    std::mt19937 rng(300 + r);
    std::uniform_real_distribution<float> u(-4.0f, 4.0f);
    std::vector<float> v(count);
    for (auto& e : v) e = bf16_to_f32(f32_to_bf16(u(rng)));
    v[0] = r == 0 ? 1.0f : 1.0f / 256.0f;
    return v;
  };
  std::vector<double> exact(count, 0.0);
  for (int r = 0; r < n; ++r) {
    auto v = make(r);
    for (size_t i = 0; i < count; ++i) exact[i] += v[i];
  }
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const double eps = dt == DType::kBF16 ? 1.0 / 256 : 1.0 / 2048;  // half an ulp at 1, relative
    std::vector<float> f = make(b.rank());
    std::vector<uint16_t> mine(count), rs_out(count / n);
    convert(mine.data(), dt, f.data(), DType::kF32, count);
    std::vector<uint16_t> rs_in = mine;
    AllReduceOptions o;
    o.in_dtype = true;
    b.all_reduce(mine.data(), count, dt, o)->wait();
    ReduceScatterOptions ro;
    ro.in_dtype = true;
    ro.op = ReduceOp::kAvg;
    b.reduce_scatter(rs_out.data(), rs_in.data(), count / n, dt, ro)->wait();
    std::vector<float> got(count), got_rs(count / n);
    convert(got.data(), DType::kF32, mine.data(), dt, count);
    convert(got_rs.data(), DType::kF32, rs_out.data(), dt, count / n);
    int bad = 0, bad_rs = 0;
    for (size_t i = 1; i < count; ++i)
      bad += std::fabs(got[i] - exact[i]) > n * eps * 16.0;  // 16: values up to 4 n, sums rounded n - 1 times
    for (size_t i = 0; i < count / n; ++i) {
      const size_t g = b.rank() * (count / n) + i;
      if (g == 0) continue;
      bad_rs += std::fabs(got_rs[i] - exact[g] / n) > eps * 16.0;
    }
    EXPECT(bad == 0, std::to_string(bad) + " in-dtype all_reduce elements off the exact sum");
    EXPECT(bad_rs == 0, std::to_string(bad_rs) + " in-dtype reduce_scatter (avg) elements off");
    if (dt == DType::kBF16 && n == 4)
      EXPECT(got[0] == 1.0f || got[0] == 1.0078125f,
             "element 0 summed in bf16 gave " + std::to_string(got[0]) + ", not 1 or 1 + 2^-7 (1.015625: summed in f32)");
    if (dt == DType::kBF16 && n == 2) EXPECT(got[0] == 1.0f, "1 + 2^-8 in bf16: " + std::to_string(got[0]));
  }
  bool refused = false;
  try {
    AllReduceOptions o;
    o.in_dtype = true;
    o.op = ReduceOp::kMax;
    uint16_t v = 0;
    b.all_reduce(&v, 1, DType::kBF16, o)->wait();
  } catch (const Error& e) {
    refused = std::string(e.what()).find("a sum or an average, not max") != std::string::npos;
  }
  EXPECT(refused, "in_dtype max is refused");
}

void check_rooted(Backend& b) {
  const int n = b.size(), me = b.rank(), root = n - 1;
  auto v = inputs(me, 3);
  BroadcastOptions bo;
  bo.root = root;
  b.broadcast(v.data(), 3, DType::kF32, bo)->wait();
  EXPECT(v == inputs(root, 3), "broadcast");

  auto red = inputs(me, 3);
  ReduceOptions ro;
  ro.root = root;
  b.reduce(red.data(), 3, DType::kF32, ro)->wait();
  if (me == root)
    for (size_t i = 0; i < 3; ++i) {
      float sum = 0;
      for (int r = 0; r < n; ++r) sum += x(r, i);
      EXPECT(red[i] == sum, "reduce");
    }

  auto mine = inputs(me, 2);
  std::vector<float> g(2 * n, -1);
  GatherOptions go;
  go.root = root;
  b.gather(g.data(), mine.data(), 2, DType::kF32, go)->wait();
  if (me == root)
    for (int r = 0; r < n; ++r) EXPECT(g[2 * r] == x(r, 0) && g[2 * r + 1] == x(r, 1), "gather");

  auto src = inputs(100, 2 * n);
  std::vector<float> piece(2);
  ScatterOptions so;
  so.root = root;
  b.scatter(piece.data(), src.data(), 2, DType::kF32, so)->wait();
  EXPECT(piece[0] == 1000.0f + 2 * me && piece[1] == 1001.0f + 2 * me, "scatter");
}

void check_gather_scatter_all(Backend& b) {
  const int n = b.size(), me = b.rank();
  auto mine = inputs(me, 2);
  std::vector<float> all(2 * n);
  b.all_gather(all.data(), mine.data(), 2, DType::kF32, {})->wait();
  for (int r = 0; r < n; ++r) EXPECT(all[2 * r] == x(r, 0) && all[2 * r + 1] == x(r, 1), "all_gather");
  // In place: my block of recv is the send buffer.
  std::vector<float> inplace(2 * n, -1);
  inplace[2 * me] = x(me, 0);
  inplace[2 * me + 1] = x(me, 1);
  b.all_gather(inplace.data(), inplace.data() + 2 * me, 2, DType::kF32, {})->wait();
  EXPECT(inplace == all, "all_gather in place");

  auto send = inputs(me, 2 * n);
  std::vector<float> out(2);
  ReduceScatterOptions rso;
  rso.op = ReduceOp::kMax;
  b.reduce_scatter(out.data(), send.data(), 2, DType::kF32, rso)->wait();
  EXPECT(out[0] == x(n - 1, 2 * me) && out[1] == x(n - 1, 2 * me + 1), "reduce_scatter max");

  std::vector<float> a2a(2 * n);
  b.all_to_all(a2a.data(), send.data(), 2, DType::kF32, {})->wait();
  for (int s = 0; s < n; ++s)
    EXPECT(a2a[2 * s] == x(s, 2 * me) && a2a[2 * s + 1] == x(s, 2 * me + 1), "all_to_all");
  b.barrier({})->wait();
}

void check_p2p_and_groups(Backend& b) {
  const int n = b.size(), me = b.rank();
  float out = static_cast<float>(me), in = -1;
  auto rw = b.recv(&in, 1, DType::kF32, (me + n - 1) % n, {});
  auto sw = b.send(&out, 1, DType::kF32, (me + 1) % n, {});
  sw->wait();
  rw->wait();
  EXPECT(in == static_cast<float>((me + n - 1) % n), "ring send/recv");

  // Tagged: two messages to the next rank, received in the other order by tag.
  float t7 = 100.0f + me, t9 = 200.0f + me, r7 = -1, r9 = -1;
  SendOptions s7, s9;
  s7.msg_tag = 7;
  s9.msg_tag = 9;
  auto w7 = b.send(&t7, 1, DType::kF32, (me + 1) % n, s7);
  auto w9 = b.send(&t9, 1, DType::kF32, (me + 1) % n, s9);
  RecvOptions q7, q9;
  q7.msg_tag = 7;
  q9.msg_tag = 9;
  b.recv(&r9, 1, DType::kF32, (me + n - 1) % n, q9)->wait();
  b.recv(&r7, 1, DType::kF32, (me + n - 1) % n, q7)->wait();
  w7->wait();
  w9->wait();
  EXPECT(r9 == 200.0f + static_cast<float>((me + n - 1) % n) && r7 == 100.0f + static_cast<float>((me + n - 1) % n),
         "tagged send/recv matched by tag");
  // Tags past the standard's 32767 where MPI_TAG_UB allows them (long pipelines: 2·stages·m).
  EXPECT(b.max_msg_tag() >= kMaxMsgTag, "MPI_TAG_UB below the standard's minimum");
  if (b.max_msg_tag() >= 1000000) {
    SendOptions sb;
    RecvOptions qb;
    sb.msg_tag = qb.msg_tag = 1000000;
    float big = 7.0f + me, got = -1;
    auto wb = b.send(&big, 1, DType::kF32, (me + 1) % n, sb);
    b.recv(&got, 1, DType::kF32, (me + n - 1) % n, qb)->wait();
    wb->wait();
    EXPECT(got == 7.0f + static_cast<float>((me + n - 1) % n), "a tag of 1000000");
  }

  auto half = b.split(me % 2, me);  // even and odd ranks
  float v = static_cast<float>(me);
  half->all_reduce(&v, 1, DType::kF32, {})->wait();
  float expect = 0;
  for (int r = me % 2; r < n; r += 2) expect += static_cast<float>(r);
  EXPECT(v == expect, "split all_reduce");
  EXPECT(half->rank() == me / 2, "split rank");
  auto solo = b.new_group({0});
  EXPECT((me == 0) == static_cast<bool>(solo), "new_group membership");
  if (solo) EXPECT(solo->size() == 1, "new_group size");
}

// The compressed all-reduce of comm/onebit.h over MPI, two steps (errors carried), against
// DeepSpeed's compressed_allreduce evaluated here from every rank's inputs (known: x_r[i] =
// sin(i + 7 r + 3 t)); and the comms logger's exact bytes: 2(n-1)·4N/n for the f32 all-reduce,
// 2(n-1)·4·words compressed.
void check_onebit(Backend& raw) {
  const int n = raw.size(), me = raw.rank();
  const size_t len = 1001;
  auto log = std::make_shared<CommLog>();
  auto b = log_backend(std::shared_ptr<Backend>(&raw, [](Backend*) {}), log);
  const OneBitLayout L(len, n);
  auto input = [&](int r, int t) {
    std::vector<float> v(len);
    for (size_t i = 0; i < len; ++i) v[i] = std::sin(static_cast<float>(i) + 7.0f * r + 3.0f * t);
    return v;
  };
  std::vector<std::vector<float>> we, se;
  std::vector<float> my_we(L.padded, 0.0f), my_se(L.chunk, 0.0f), buf;
  for (int t = 0; t < 2; ++t) {
    buf = input(me, t);
    log->reset();
    compressed_all_reduce(*b, buf.data(), len, my_we.data(), my_se.data());
    EXPECT(log->sent_bytes() == 2 * static_cast<uint64_t>(n - 1) * 4 * L.words(), "compressed bytes");
    std::vector<std::vector<float>> x(n);
    for (int w = 0; w < n; ++w) x[w] = input(w, t);
    testing::ds_compressed_allreduce(x, we, se);  // DeepSpeed's, from every rank's inputs
    size_t bad = 0;
    for (size_t i = 0; i < len; ++i) bad += buf[i] != x[me][i];
    EXPECT(bad == 0, std::to_string(bad) + " elements differ from DeepSpeed's compressed_allreduce at step " + std::to_string(t));
  }
  log->reset();
  std::vector<float> v(4096, 1.0f);
  b->all_reduce(v.data(), v.size(), DType::kF32, {})->wait();
  EXPECT(log->sent_bytes() == 2 * static_cast<uint64_t>(n - 1) * 4096 * 4 / n, "all_reduce bytes");
  EXPECT(log->count(CommOp::kAllReduce) == 1, "all_reduce count");
}

// `what` is all_reduce or reduce_scatter (the ring: its neighbours wait on point-to-point messages
// that never come, and rank 0 still names the rank that never arrived).
int timeout_case(Backend& b, const std::string& what) {
  const int last = b.size() - 1;
  float v = 1;
  b.all_reduce(&v, 1, DType::kF32, {})->wait();  // #0: everyone
  if (b.rank() == last) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // skips #1; ended by the abort
  }
  CommOptions base;
  base.timeout = std::chrono::milliseconds(3000);  // every other rank arrives well within it, even oversubscribed
  base.tag = "timeout-case";
  std::vector<float> send(4 * static_cast<size_t>(b.size()), 1.0f), recv(4);
  std::string msg;
  bool ok = false;
  try {
    if (what == "reduce_scatter") {
      ReduceScatterOptions o;
      static_cast<CommOptions&>(o) = base;
      b.reduce_scatter(recv.data(), send.data(), 4, DType::kF32, o)->wait();
    } else {
      AllReduceOptions o;
      static_cast<CommOptions&>(o) = base;
      b.all_reduce(&v, 1, DType::kF32, o)->wait();
    }
    msg = what + " #1 completed without rank " + std::to_string(last);
  } catch (const CommTimeout& e) {
    msg = e.what();
    const std::string want = "rank " + std::to_string(last) + " has not arrived";
    ok = e.collective() == what && e.seq() == 1 && e.missing_ranks() == std::vector<int>{last} &&
         msg.find(what + " #1 [timeout-case]") != std::string::npos &&
         msg.find(want) != std::string::npos;
  }
  std::printf("timeout case: %s on rank %d: %s\n", ok ? "PASS" : "FAIL", b.rank(), msg.c_str());
  std::fflush(stdout);
  if (b.rank() != 0) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  std::this_thread::sleep_for(std::chrono::seconds(3));  // let the other ranks print
  b.abort(ok ? 3 : 4, "timeout case done (the abort is expected)");
  return 1;  // not reached
}

// The same inside a group numbered otherwise than the world (the odd ranks of 4: world ranks 1 and
// 3 are group ranks 0 and 1): the timeout names world rank 3 (it named group rank 1, which is the
// healthy world rank 1). World rank 1 gathers the group's arrivals and says PASS or FAIL.
int timeout_group_case(Backend& world) {
  std::shared_ptr<Backend> g = world.split(world.rank() % 2, world.rank());
  float v = 1;
  g->all_reduce(&v, 1, DType::kF32, {})->wait();  // #0: everyone
  const int last = world.size() - 1;
  if (world.rank() != 1) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the even group, and world rank 3 skipping #1
  }
  AllReduceOptions o;
  o.timeout = std::chrono::milliseconds(3000);
  o.tag = "group-case";
  std::string msg;
  bool ok = false;
  try {
    g->all_reduce(&v, 1, DType::kF32, o)->wait();
    msg = "all_reduce #1 completed without world rank " + std::to_string(last);
  } catch (const CommTimeout& e) {
    msg = e.what();
    ok = e.missing_ranks() == std::vector<int>{last} &&
         msg.find("on rank 1 of " + std::to_string(world.size())) != std::string::npos &&
         msg.find("rank " + std::to_string(last) + " has not arrived (world ranks; the group is world ranks 1,3)") !=
             std::string::npos;
  }
  std::printf("timeout group case: %s on rank %d: %s\n", ok ? "PASS" : "FAIL", world.rank(), msg.c_str());
  std::fflush(stdout);
  world.abort(ok ? 3 : 4, "timeout group case done (the abort is expected)");
  return 1;  // not reached
}

// Large collectives fault their temporary buffers in by huge pages (mpi_prepare_process). libnbc's
// all-reduce of P x 16 MiB mallocs 16 MiB on every call, and it is mapped afresh each time: 4097
// faults a call in 4 KiB pages (measured with GLIBC_TUNABLES=glibc.malloc.hugetlb=0), 10-11 with
// huge pages. (This used reduce_scatter until it became a ring that needs no such buffer.)
void check_huge_page_buffers(Backend& b) {
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode((std::istreambuf_iterator<char>(thp)), std::istreambuf_iterator<char>());
  if (mode.empty() || mode.find("[never]") != std::string::npos) {
    if (b.rank() == 0) std::printf("huge page buffers: skipped (transparent huge pages: %s)\n", mode.empty() ? "absent" : "never");
    return;
  }
  EXPECT(mpi_malloc_huge_pages(), "the rank was not re-executed with GLIBC_TUNABLES=glibc.malloc.hugetlb=1");
  const size_t count = size_t{4} << 20;  // 16 MiB of f32 per rank
  std::vector<float> send(count * static_cast<size_t>(b.size()), 1.0f);
  AllReduceOptions avg;
  avg.op = ReduceOp::kAvg;  // ones stay ones, call after call
  auto call = [&] { b.all_reduce(send.data(), send.size(), DType::kF32, avg)->wait(); };
  call();
  call();
  // The kernel's count of huge-page faults it served with small pages (no free 2 MiB block, memory
  // fragmented by what ran before): then the small pages are the machine's, not the buffers'.
  auto thp_fallbacks = [] {
    std::ifstream vm("/proc/vmstat");
    std::string key;
    long long v = 0;
    while (vm >> key >> v)
      if (key == "thp_fault_fallback") return v;
    return -1LL;
  };
  const long long fallbacks = thp_fallbacks();
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  const int calls = 4;
  for (int i = 0; i < calls; ++i) call();
  getrusage(RUSAGE_SELF, &after);
  const double faults = static_cast<double>(after.ru_minflt - before.ru_minflt) / calls;
  const double small_pages = static_cast<double>(send.size() * sizeof(float)) / 4096.0;  // one buffer's 4 KiB pages
  if (faults >= small_pages / 8 && fallbacks >= 0 && thp_fallbacks() > fallbacks) {
    std::printf("huge page buffers: rank %d skipped (the kernel served %lld huge-page faults with small pages meanwhile)\n",
                b.rank(), thp_fallbacks() - fallbacks);
    return;
  }
  EXPECT(faults < small_pages / 8, "all_reduce of " + std::to_string(b.size()) + " x 16 MiB: " + std::to_string(faults) +
                                         " page faults a call (4 KiB pages of the buffer: " + std::to_string(small_pages) + ")");
  EXPECT(send[0] == 1.0f && send.back() == 1.0f, "all_reduce average of ones");
}

// A send driven after it is posted (comm::drive) reaches a receiver that already waits, though its
// sender then computes without calling MPI. Rank 1 waits for 1 MiB from rank 0 and answers with a
// small message, which MPI sends at once (eagerly). Rank 0 drives its send, "computes" for two seconds
// without MPI, and then finds the answer there at its first look. Without the drive, over a
// transport with no single-copy path (ctest runs this binary with OpenMPI's CMA off as well), the
// 1 MiB would still be waiting for rank 0 when its compute ended, and the answer with it.
void check_driven_send(Backend& b) {
  const size_t n = size_t{1} << 18;  // f32: 1 MiB, far past the eager limit
  BarrierOptions bo;
  if (b.rank() > 1) {
    b.barrier(bo)->wait();
    b.barrier(bo)->wait();
    return;
  }
  std::vector<float> big(n, b.rank() == 0 ? 3.0f : 0.0f);
  float answer = 0.0f;
  SendOptions so;
  RecvOptions ro;
  so.msg_tag = ro.msg_tag = 77;
  if (b.rank() == 1) {
    auto w = b.recv(big.data(), n, DType::kF32, 0, ro);
    b.barrier(bo)->wait();  // posted, and waiting from here
    w->wait();
    answer = big[n - 1];
    so.msg_tag = 78;
    b.send(&answer, 1, DType::kF32, 0, so)->wait();
  } else {
    b.barrier(bo)->wait();
    auto w = b.send(big.data(), n, DType::kF32, 1, so);
    EXPECT(drive(*w, std::chrono::seconds(5)), "the driven send completes while its receiver waits");
    std::this_thread::sleep_for(std::chrono::seconds(2));  // compute: no MPI call (rank 1 may wait its turn on a core)
    ro.msg_tag = 78;
    auto a = b.recv(&answer, 1, DType::kF32, 1, ro);
    EXPECT(a->is_completed(), "the receiver had the message before the sender's compute ended");
    a->wait();
    EXPECT(answer == 3.0f, "the message's last element");
    w->wait();
  }
  b.barrier(bo)->wait();
}

// reduce_scatter runs a ring (mpi_backend.cpp, class Ring): block r is summed from rank r+1 round
// to rank r, r's own block added last. In bf16 (in_dtype) the order shows: each block's element 0
// is 1 on its owner and 2^-8 on the n-1 others, whose partial sums stay exact, so the ring gives
// 1 + (n-1)·2^-8 rounded once: 1 on 2 ranks (a tie, to even), 1 + 2^-7 on 3, 1 + 2^-6 on 4.
// libnbc's MPI_Ireduce_scatter_block sums over a binomial tree rooted at rank 0 (1 + 2^-8 rounds
// to 1 at its first step): 1 on 3 ranks, 1 + 2^-7 on 4. Also: several in flight at once, waited in
// reverse order, one of them in place, and blocks of 1M floats (many MPI messages' worth).
void check_ring_reduce_scatter(Backend& b) {
  const int n = b.size(), me = b.rank();
  {
    const size_t count = 8;
    std::vector<float> f(count * n);
    for (int blk = 0; blk < n; ++blk)
      for (size_t i = 0; i < count; ++i) f[blk * count + i] = i == 0 ? (blk == me ? 1.0f : 1.0f / 256.0f) : static_cast<float>(me + 1);
    std::vector<bf16_t> in(count * n), out(count);
    convert(in.data(), DType::kBF16, f.data(), DType::kF32, f.size());
    ReduceScatterOptions o;
    o.in_dtype = true;
    b.reduce_scatter(out.data(), in.data(), count, DType::kBF16, o)->wait();
    const float want = bf16_to_f32(f32_to_bf16(1.0f + static_cast<float>(n - 1) / 256.0f));
    EXPECT(bf16_to_f32(out[0]) == want, "bf16 reduce_scatter of block " + std::to_string(me) + " gave " +
                                            std::to_string(bf16_to_f32(out[0])) + ", not the ring's " + std::to_string(want));
    EXPECT(bf16_to_f32(out[1]) == static_cast<float>(n * (n + 1) / 2), "bf16 reduce_scatter of rank numbers");
    // MT_REDUCE_SCATTER=mpi hands the same call to libnbc, whose tree shows on 3 and 4 ranks: it adds
    // (x0 + x1) + x2 on 3 and (x0 + x1) + (x2 + x3) on 4, so a block gives 1 + 2^-7 where its 1 is
    // not in the first pair's sum (rank 2's on 3 ranks, every block on 4), else 1.
    ::setenv("MT_REDUCE_SCATTER", "mpi", 1);
    b.reduce_scatter(out.data(), in.data(), count, DType::kBF16, o)->wait();
    ::unsetenv("MT_REDUCE_SCATTER");
    if (n <= 4) {
      const float tree = n == 4 || (n == 3 && me == 2) ? 1.0078125f : 1.0f;
      EXPECT(bf16_to_f32(out[0]) == tree, "MT_REDUCE_SCATTER=mpi: block " + std::to_string(me) + " gave " +
                                              std::to_string(bf16_to_f32(out[0])) + ", not libnbc's " + std::to_string(tree));
    }
    EXPECT(bf16_to_f32(out[1]) == static_cast<float>(n * (n + 1) / 2), "MT_REDUCE_SCATTER=mpi: rank numbers");
  }
  {
    // The ring's scratch is accounted as comm while it runs: none on 2 ranks, a block on more; in
    // place, a block on 2 and two on more. A ring moves only when polled, so right after the call
    // its scratch is all there.
    const size_t count = 1000, block = count * sizeof(float);
    EXPECT(ring_reduce_scatter_scratch_bytes(n, block, false) == (n >= 3 ? block : 0) &&
               ring_reduce_scatter_scratch_bytes(n, block, true) == (n >= 3 ? 2 : 1) * block,
           "ring scratch bytes on " + std::to_string(n) + " ranks");
    std::vector<float> in(count * n, 1.0f), out(count);
    for (bool in_place : {false, true}) {
      const size_t before = Allocator::global().stats().current[static_cast<int>(MemCategory::kComm)];
      float* dst = in_place ? in.data() + me * count : out.data();
      auto w = b.reduce_scatter(dst, in.data(), count, DType::kF32, {});
      const size_t during = Allocator::global().stats().current[static_cast<int>(MemCategory::kComm)];
      w->wait();
      const size_t after = Allocator::global().stats().current[static_cast<int>(MemCategory::kComm)];
      EXPECT(during - before == ring_reduce_scatter_scratch_bytes(n, block, in_place) && after == before,
             std::string("ring scratch accounted") + (in_place ? " (in place)" : "") + ": " + std::to_string(during - before) +
                 " bytes while running, " + std::to_string(after - before) + " after");
      EXPECT(dst[count - 1] == static_cast<float>(n), "ring scratch check's sum");
      std::fill(in.begin(), in.end(), 1.0f);
    }
  }
  const size_t counts[] = {size_t{1} << 20, 3, 1000};
  std::vector<std::vector<float>> send(3), recv(3);
  std::vector<std::unique_ptr<Work>> works;
  for (int k = 0; k < 3; ++k) {
    const size_t c = counts[k];
    send[k].resize(c * n);
    for (size_t i = 0; i < c * n; ++i) send[k][i] = static_cast<float>((i * 7 + me * 3 + k) % 101);
    recv[k].assign(c, -1.0f);
    float* out = k == 1 ? send[k].data() + me * c : recv[k].data();  // the second in place
    works.push_back(b.reduce_scatter(out, send[k].data(), c, DType::kF32, {}));
  }
  for (int k = 2; k >= 0; --k) works[k]->wait();
  for (int k = 0; k < 3; ++k) {
    const size_t c = counts[k];
    const float* got = k == 1 ? send[k].data() + me * c : recv[k].data();
    size_t bad = 0;
    for (size_t i = 0; i < c; ++i) {
      const size_t g = me * c + i;
      float want = 0;
      for (int r = 0; r < n; ++r) want += static_cast<float>((g * 7 + r * 3 + k) % 101);
      bad += got[i] != want;
    }
    EXPECT(bad == 0, std::to_string(bad) + " of " + std::to_string(c) + " elements wrong in reduce_scatter #" + std::to_string(k) +
                         (k == 1 ? " (in place)" : ""));
  }
}

// A dead peer's socket must not kill a rank: after mpi_init a write to a pipe nobody reads fails
// with EPIPE instead of ending the process with SIGPIPE (which mpirun would report as this rank's
// death, ahead of the peer that really died).
void check_a_broken_pipe_does_not_kill(Backend&) {
  int fds[2];
  EXPECT(::pipe(fds) == 0, "pipe");
  ::close(fds[0]);
  const char byte = 0;
  const ssize_t n = ::write(fds[1], &byte, 1);
  const int err = errno;
  ::close(fds[1]);
  EXPECT(n == -1 && err == EPIPE, "a write to a closed pipe fails with EPIPE and the rank lives on");
}

// A rank stopped inside a wait for longer than the timeout, whose peers arrive after it is
// continued, completes the collective. Its SIGCONT count is made to miss (SIGCONT ignored: the stop
// still ends, no handler runs), as when the counting handler runs late on another of the process's
// threads: rank 0 found its deadline passed before the count and ended a suspended job naming a
// healthy rank (Launch.AJobSuspendedLongerThanItsTimeoutRunsOn, in a full ctest). A child stops
// rank 0 0.3 s after it begins to wait (told through a pipe) and continues it 3.5 s later; the
// others arrive 4.1 s after they left the barrier before: past the 3 s timeout counted from the
// wait's start, within it counted without the stop (at most one timeout of it).
void check_a_stop_inside_a_wait(Backend& b) {
  float v = 1;
  b.all_reduce(&v, 1, DType::kF32, {})->wait();  // together
  struct sigaction saved {}, ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGCONT, &ignore, &saved);
  pid_t child = -1;
  int go[2] = {-1, -1};
  if (b.rank() == 0) {
    EXPECT(::pipe(go) == 0, "pipe");
    const pid_t parent = ::getpid();
    child = ::fork();
    if (child == 0) {  // only async-signal-safe calls
      ::close(go[1]);  // a parent that never writes (it failed first) ends the read
      char byte = 0;
      ssize_t got;
      while ((got = ::read(go[0], &byte, 1)) < 0 && errno == EINTR) {
      }
      if (got != 1) ::_exit(0);
      struct timespec before{0, 300'000'000}, stopped{3, 500'000'000};
      ::nanosleep(&before, nullptr);
      ::kill(parent, SIGSTOP);
      ::nanosleep(&stopped, nullptr);
      ::kill(parent, SIGCONT);
      ::_exit(0);
    }
    EXPECT(child > 0, "fork");
    ::close(go[0]);
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(4100));
  }
  AllReduceOptions o;
  o.timeout = std::chrono::milliseconds(3000);
  o.tag = "stopped";
  v = static_cast<float>(b.rank() + 1);
  std::unique_ptr<Work> w = b.all_reduce(&v, 1, DType::kF32, o);
  if (go[1] >= 0) {
    const char byte = 1;
    EXPECT(::write(go[1], &byte, 1) == 1, "the child told to start");
    ::close(go[1]);
  }
  w->wait();  // a CommTimeout is a FAIL (main aborts the job)
  EXPECT(v == static_cast<float>(b.size() * (b.size() + 1) / 2), "the sum after the stop");
  ::sigaction(SIGCONT, &saved, nullptr);
  if (child > 0) {
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

// libnbc's all-reduce algorithm: the ring that mpi_init chooses (1), or the one the user gave in
// OMPI_MCA_coll_libnbc_iallreduce_algorithm before it (ctest runs this binary both ways).
int g_user_iallreduce = -1;
void check_iallreduce_algorithm(Backend&) {
  const int want = g_user_iallreduce >= 0 ? g_user_iallreduce : 1;
  const int got = mpi_iallreduce_algorithm();
  EXPECT(got == want, "libnbc runs iallreduce algorithm " + std::to_string(got) + ", not " + std::to_string(want));
}

// A waiting rank's nap between polls: 1 ms where the host has fewer cores than its ranks' threads
// (every rank of this test runs on one host), 50 us where each has its core, or MT_WAIT_NAP_US's.
void check_wait_sleep(Backend& b) {
  EXPECT(mpi_idle_sleep_us(4, 1, 2) == 1000, "4 ranks x 1 thread on 2 cores");
  EXPECT(mpi_idle_sleep_us(2, 2, 2) == 1000, "2 ranks x 2 threads on 2 cores");
  EXPECT(mpi_idle_sleep_us(2, 1, 2) == 50, "2 ranks x 1 thread on 2 cores");
  EXPECT(mpi_idle_sleep_us(8, 2, 16) == 50, "8 ranks x 2 threads on 16 cores");
  EXPECT(mpi_idle_sleep_us(0, 0, 0) == 50, "no count is read as one");
  // The host's cores: its ranks' masks together (mpirun binds each of 2 ranks to a core of its own).
  const int cores = mpi_host_cores();
  EXPECT(cores >= host_cores() && cores <= static_cast<int>(std::thread::hardware_concurrency()),
         "the ranks' cores " + std::to_string(cores) + ": at least this rank's own " + std::to_string(host_cores()));
  const char* user = std::getenv("MT_WAIT_NAP_US");  // ctest's comm_mpi_nap_np2 sets 300
  const int want = user ? std::atoi(user) : b.size() * threads_get() > std::max(1, cores) ? 1000 : 50;
  EXPECT(mpi_wait_sleep_us() == want, "this process naps " + std::to_string(mpi_wait_sleep_us()) + " us, not " +
                                          std::to_string(want) + " (" + std::to_string(b.size()) + " ranks x " +
                                          std::to_string(threads_get()) + " thread(s), " + std::to_string(cores) +
                                          " cores)");
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* user = std::getenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm")) g_user_iallreduce = std::atoi(user);
  mpi_prepare_process(argv);
  std::shared_ptr<Backend> world;
  try {
    world = mpi_init(&argc, &argv);
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  g_rank = world->rank();
  if (argc > 1 && std::strcmp(argv[1], "--timeout-group-case") == 0) return timeout_group_case(*world);
  if (argc > 1 && std::strcmp(argv[1], "--timeout-case") == 0)
    return timeout_case(*world, argc > 2 ? argv[2] : "all_reduce");
  for (auto check : {check_all_reduce, check_bf16_sum, check_in_dtype, check_rooted, check_gather_scatter_all,
                     check_p2p_and_groups, check_onebit, check_a_broken_pipe_does_not_kill, check_huge_page_buffers, check_driven_send, check_iallreduce_algorithm,
                     check_ring_reduce_scatter, check_a_stop_inside_a_wait, check_wait_sleep}) {
    try {
      check(*world);
    } catch (const std::exception& e) {
      ++g_failures;
      std::printf("FAIL rank %d: %s\n", g_rank, e.what());
      std::fflush(stdout);
      world->abort(2, "test_comm_mpi: a check threw");
    }
  }
  float failures = static_cast<float>(g_failures);
  world->all_reduce(&failures, 1, DType::kF32, {})->wait();
  if (g_rank == 0)
    std::printf("test_comm_mpi: %d ranks (thread level %s), %d checks on rank 0, %d failures in all\n",
                world->size(), mpi_thread_level(), g_checks, static_cast<int>(failures));
  world.reset();
  mpi_finalize();
  return failures == 0 ? 0 : 1;
}
