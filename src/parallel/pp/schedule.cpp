#include "parallel/pp/schedule.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "base/error.h"
#include "base/once_cache.h"

namespace mt::parallel::pp {

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::k1F1B: return "1f1b";
    case ScheduleKind::kInterleaved: return "interleaved";
  }
  return "?";
}

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b" || name == "1F1B") return ScheduleKind::k1F1B;
  if (name == "interleaved" || name == "interleaved_1f1b") return ScheduleKind::kInterleaved;
  throw Error(ErrorKind::kInvalidArgument,
              "parallel.pipeline_schedule: unknown schedule \"" + name + "\" (gpipe, 1f1b or interleaved)");
}

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::kRecvActivation: return "recv-activation";
    case OpKind::kForward: return "forward";
    case OpKind::kSendActivation: return "send-activation";
    case OpKind::kRecvGrad: return "recv-grad";
    case OpKind::kBackward: return "backward";
    case OpKind::kSendGrad: return "send-grad";
  }
  return "?";
}

long long step_tags(const ScheduleSpec& s) { return 2LL * s.stages() * s.micro_batches; }

void check_schedule_spec(const ScheduleSpec& s, long long max_tag) {
  MT_CHECK(s.pp >= 1, ErrorKind::kInvalidArgument, "parallel.pp must be >= 1");
  MT_CHECK(s.virtual_stages >= 1, ErrorKind::kInvalidArgument, "parallel.virtual_stages must be >= 1");
  MT_CHECK(s.micro_batches >= 1, ErrorKind::kInvalidArgument, "gradient_accumulation_steps (the micro-batches) must be >= 1");
  if (s.virtual_stages > 1)
    MT_CHECK(s.kind == ScheduleKind::kInterleaved, ErrorKind::kInvalidArgument,
             "parallel.virtual_stages = " + std::to_string(s.virtual_stages) + " needs parallel.pipeline_schedule \"interleaved\" (" +
                 schedule_name(s.kind) + " runs one model chunk per rank)");
  if (s.kind == ScheduleKind::kInterleaved && s.virtual_stages > 1 && s.pp > 1)
    MT_CHECK(s.micro_batches % s.pp == 0, ErrorKind::kInvalidArgument,
             "the interleaved schedule runs micro-batches in groups of parallel.pp: gradient_accumulation_steps (" +
                 std::to_string(s.micro_batches) + ") must be a multiple of parallel.pp (" + std::to_string(s.pp) + ")");
  const long long tags = step_tags(s) + 1;  // and the tied embedding's
  MT_CHECK(tags <= max_tag + 1LL, ErrorKind::kInvalidArgument,
           "pipeline stages (" + std::to_string(s.stages()) + ") x micro-batches (" + std::to_string(s.micro_batches) +
               ") need " + std::to_string(tags) + " message tags; the communication backend allows " + std::to_string(max_tag + 1));
}

int message_tag(const ScheduleSpec& s, int stage, int micro, bool grad) {
  return 2 * (stage * s.micro_batches + micro) + (grad ? 1 : 0);
}

namespace {

// Interleaving with one chunk is 1F1B.
bool interleaved(const ScheduleSpec& s) { return s.kind == ScheduleKind::kInterleaved && s.virtual_stages > 1; }

struct Emitter {
  const ScheduleSpec& s;
  int rank;
  std::vector<Instr> out;
  int stage(int chunk) const { return chunk * s.pp + rank; }
  void forward(int chunk, int micro) {
    const int st = stage(chunk), S = s.stages();
    if (st > 0) out.push_back({OpKind::kRecvActivation, chunk, micro, (st - 1) % s.pp, message_tag(s, st - 1, micro, false)});
    out.push_back({OpKind::kForward, chunk, micro});
    if (st + 1 < S) out.push_back({OpKind::kSendActivation, chunk, micro, (st + 1) % s.pp, message_tag(s, st, micro, false)});
  }
  void backward(int chunk, int micro) {
    const int st = stage(chunk), S = s.stages();
    if (st + 1 < S) out.push_back({OpKind::kRecvGrad, chunk, micro, (st + 1) % s.pp, message_tag(s, st, micro, true)});
    out.push_back({OpKind::kBackward, chunk, micro});
    if (st > 0) out.push_back({OpKind::kSendGrad, chunk, micro, (st - 1) % s.pp, message_tag(s, st - 1, micro, true)});
  }
};

// Megatron's interleaved order: the k-th forward (backward) of a rank runs chunk
// (k mod p·v) / p (reversed for backward) on micro-batch (k / (p·v))·p + k mod p.
int interleaved_chunk(const ScheduleSpec& s, int k, bool forward) {
  int c = (k % (s.pp * s.virtual_stages)) / s.pp;
  return forward ? c : s.virtual_stages - 1 - c;
}
int interleaved_micro(const ScheduleSpec& s, int k) { return (k / (s.pp * s.virtual_stages)) * s.pp + k % s.pp; }

}  // namespace

int warmup_forwards(const ScheduleSpec& s, int rank) {
  const int m = s.micro_batches, p = s.pp, v = s.virtual_stages;
  switch (s.kind) {
    case ScheduleKind::kGPipe: return m * v;
    case ScheduleKind::k1F1B: return std::min(p - rank - 1, m);
    case ScheduleKind::kInterleaved:
      if (v == 1) return std::min(p - rank - 1, m);
      if (m == p) return m * v;
      return std::min((p - rank - 1) * 2 + (v - 1) * p, m * v);
  }
  return 0;
}

double bubble_formula(const ScheduleSpec& s) {
  const double p = s.pp, m = s.micro_batches, v = interleaved(s) ? s.virtual_stages : 1;
  return (p - 1) / (v * m + p - 1);
}

std::vector<Instr> build_schedule(const ScheduleSpec& s, int rank) {
  check_schedule_spec(s);
  MT_CHECK(rank >= 0 && rank < s.pp, ErrorKind::kInvalidArgument, "pipeline rank out of range");
  Emitter e{s, rank, {}};
  const int m = s.micro_batches, v = s.virtual_stages;
  if (s.kind == ScheduleKind::kGPipe) {
    // Every forward (chunk by chunk), then every backward (last chunk first).
    for (int c = 0; c < v; ++c)
      for (int i = 0; i < m; ++i) e.forward(c, i);
    for (int c = v - 1; c >= 0; --c)
      for (int i = 0; i < m; ++i) e.backward(c, i);
    return e.out;
  }
  const int total = m * v;
  const int warm = warmup_forwards(s, rank);
  auto fwd = [&](int k) {
    if (interleaved(s)) e.forward(interleaved_chunk(s, k, true), interleaved_micro(s, k));
    else e.forward(0, k);
  };
  auto bwd = [&](int k) {
    if (interleaved(s)) e.backward(interleaved_chunk(s, k, false), interleaved_micro(s, k));
    else e.backward(0, k);
  };
  // Warm-up forwards, then one forward and one backward alternating (the steady state), then the
  // remaining backwards (cool-down): PipeDream-flush, and Megatron's interleaved variant.
  for (int k = 0; k < warm; ++k) fwd(k);
  for (int k = 0; k < total - warm; ++k) {
    fwd(warm + k);
    bwd(k);
  }
  for (int k = total - warm; k < total; ++k) bwd(k);
  return e.out;
}

int max_in_flight(const std::vector<Instr>& list) {
  int live = 0, most = 0;
  for (const Instr& i : list) {
    if (i.kind == OpKind::kForward) most = std::max(most, ++live);
    if (i.kind == OpKind::kBackward) --live;
  }
  return most;
}

std::vector<std::vector<int>> grad_send_releases(const std::vector<std::vector<Instr>>& ranks, int rank) {
  MT_CHECK(rank >= 0 && rank < static_cast<int>(ranks.size()), ErrorKind::kInvalidArgument, "pipeline rank out of range");
  const std::vector<Instr>& mine = ranks[rank];
  auto is_recv = [](const Instr& i) { return i.kind == OpKind::kRecvActivation || i.kind == OpKind::kRecvGrad; };
  auto is_send = [](const Instr& i) { return i.kind == OpKind::kSendActivation || i.kind == OpKind::kSendGrad; };
  // (peer, tag) in one word -> index in my list (hashed: lists of hundreds of thousands).
  auto key = [](int peer, int tag) { return (static_cast<uint64_t>(static_cast<uint32_t>(peer)) << 32) | static_cast<uint32_t>(tag); };
  std::unordered_map<uint64_t, int> my_recv;
  my_recv.reserve(mine.size() / 2);
  for (size_t j = 0; j < mine.size(); ++j)
    if (is_recv(mine[j])) my_recv[key(mine[j].peer, mine[j].tag)] = static_cast<int>(j);
  constexpr int kNone = std::numeric_limits<int>::max();
  struct Peer {
    std::unordered_map<int, int> recv_from_me;  // tag -> index in the peer's list
    std::vector<int> first_reply;     // [b]: my earliest receive of a message the peer sends at b or later
  };
  std::map<int, Peer> peers;
  auto peer = [&](int q) -> Peer& {
    auto it = peers.find(q);
    if (it != peers.end()) return it->second;
    Peer& p = peers[q];
    const std::vector<Instr>& theirs = ranks.at(q);
    p.first_reply.assign(theirs.size() + 1, kNone);
    for (size_t b = theirs.size(); b-- > 0;) {
      p.first_reply[b] = p.first_reply[b + 1];
      const Instr& i = theirs[b];
      if (i.peer != rank) continue;
      if (is_recv(i)) p.recv_from_me[i.tag] = static_cast<int>(b);
      if (is_send(i)) {
        auto r = my_recv.find(key(q, i.tag));
        MT_CHECK(r != my_recv.end(), ErrorKind::kInternal, "pipeline schedule: a message to rank " + std::to_string(rank) + " has no receive");
        p.first_reply[b] = std::min(p.first_reply[b], r->second);
      }
    }
    return p;
  };
  std::vector<std::vector<int>> out(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    if (mine[i].kind != OpKind::kSendGrad) continue;
    Peer& p = peer(mine[i].peer);
    auto a = p.recv_from_me.find(mine[i].tag);
    MT_CHECK(a != p.recv_from_me.end(), ErrorKind::kInternal, "pipeline schedule: a gradient sent has no receive");
    const int j = p.first_reply[static_cast<size_t>(a->second) + 1];
    if (j == kNone) continue;
    MT_CHECK(j > static_cast<int>(i), ErrorKind::kInternal, "pipeline schedule: a reply received before its cause was sent");
    out[static_cast<size_t>(j)].push_back(static_cast<int>(i));
  }
  return out;
}

std::string rendezvous_check(const std::vector<std::vector<Instr>>& ranks,
                             const std::vector<std::vector<std::vector<int>>>& waits) {
  const int P = static_cast<int>(ranks.size());
  // (from, to, tag) in one word, hashed: a search checks schedules of hundreds of thousands of
  // messages, and an ordered set of tuples was most of a 512-process search's time.
  auto key = [](int from, int to, int tag) {
    return (static_cast<uint64_t>(static_cast<uint16_t>(from)) << 48) | (static_cast<uint64_t>(static_cast<uint16_t>(to)) << 32) |
           static_cast<uint32_t>(tag);
  };
  MT_CHECK(P < 65536, ErrorKind::kInvalidArgument, "pipeline schedule: " + std::to_string(P) + " ranks (at most 65535)");
  size_t messages = 0;
  for (int q = 0; q < P; ++q) {
    messages += ranks[q].size();
    for (const Instr& i : ranks[q])  // the key holds ranks in 16 bits
      MT_CHECK(i.kind == OpKind::kForward || i.kind == OpKind::kBackward || (i.peer >= 0 && i.peer < P),
               ErrorKind::kInvalidArgument,
               "pipeline schedule: rank " + std::to_string(q) + " names peer " + std::to_string(i.peer) + " of " + std::to_string(P));
  }
  std::unordered_set<uint64_t> posted_sends, reached_recvs;
  posted_sends.reserve(messages / 2);
  reached_recvs.reserve(messages / 2);
  std::vector<size_t> pc(static_cast<size_t>(P), 0);
  auto waits_of = [&](int q, size_t j) -> const std::vector<int>* {
    if (q >= static_cast<int>(waits.size()) || j >= waits[q].size()) return nullptr;
    return &waits[q][j];
  };
  for (;;) {
    bool progressed = false, done = true;
    for (int q = 0; q < P; ++q) {
      const std::vector<Instr>& list = ranks[q];
      while (pc[q] < list.size()) {
        bool blocked = false;
        if (const std::vector<int>* w = waits_of(q, pc[q]))
          for (int s : *w) {
            const Instr& send = list.at(static_cast<size_t>(s));
            if (!reached_recvs.count(key(q, send.peer, send.tag))) blocked = true;
          }
        if (blocked) break;
        const Instr& i = list[pc[q]];
        if (i.kind == OpKind::kRecvActivation || i.kind == OpKind::kRecvGrad) {
          reached_recvs.insert(key(i.peer, q, i.tag));  // posted: its sender's wait may end
          if (!posted_sends.count(key(i.peer, q, i.tag))) break;
        } else if (i.kind == OpKind::kSendActivation || i.kind == OpKind::kSendGrad) {
          posted_sends.insert(key(q, i.peer, i.tag));
        }
        ++pc[q];
        progressed = true;
      }
      if (pc[q] < list.size()) done = false;
    }
    if (done) return "";
    if (!progressed) {
      std::string where;
      for (int q = 0; q < P; ++q)
        if (pc[q] < ranks[q].size()) {
          const Instr& i = ranks[q][pc[q]];
          where += "rank " + std::to_string(q) + " waits at instruction " + std::to_string(pc[q]) + " (" + op_name(i.kind) +
                   " chunk " + std::to_string(i.chunk) + " micro " + std::to_string(i.micro) + "); ";
        }
      return where;
    }
  }
}

GradSendPlan grad_send_plan(const std::vector<std::vector<Instr>>& ranks, int rank, bool wait) {
  GradSendPlan plan;
  plan.release_after = grad_send_releases(ranks, rank);
  plan.wait_before.assign(plan.release_after.size(), {});
  if (!wait) return plan;
  const std::vector<Instr>& mine = ranks[rank];
  std::set<int> outstanding;
  for (size_t j = 0; j < mine.size(); ++j) {
    if (mine[j].kind == OpKind::kSendGrad) {
      plan.wait_before[j].assign(outstanding.begin(), outstanding.end());
      outstanding.clear();
      outstanding.insert(static_cast<int>(j));
    }
    std::vector<int> kept;  // a send already waited for is not released again
    for (int s : plan.release_after[j])
      if (outstanding.erase(s)) kept.push_back(s);
    plan.release_after[j] = std::move(kept);
  }
  return plan;
}

bool gradient_waits_safe(const ScheduleSpec& s) {
  static OnceCache<std::tuple<int, int, int, int>, bool> known(4096);
  return known.get({static_cast<int>(s.kind), s.pp, s.virtual_stages, s.micro_batches}, [&] {
    std::vector<std::vector<Instr>> ranks;
    for (int q = 0; q < s.pp; ++q) ranks.push_back(build_schedule(s, q));
    std::vector<std::vector<std::vector<int>>> waits;
    for (int q = 0; q < s.pp; ++q) waits.push_back(grad_send_plan(ranks, q, true).wait_before);
    return rendezvous_check(ranks, waits).empty();
  });
}

GradSendPlan executor_grad_plan(const ScheduleSpec& s, const std::vector<std::vector<Instr>>& ranks, int rank) {
  return grad_send_plan(ranks, rank, gradient_waits_safe(s));
}

int max_grads_in_flight(const std::vector<std::vector<Instr>>& ranks, int rank, const GradSendPlan& plan) {
  int live = 0, most = 0;
  for (size_t j = 0; j < ranks[rank].size(); ++j) {
    live -= static_cast<int>(plan.wait_before[j].size());
    if (ranks[rank][j].kind == OpKind::kSendGrad) most = std::max(most, ++live);
    live -= static_cast<int>(plan.release_after[j].size());
  }
  return most;
}

int max_grads_in_flight(const ScheduleSpec& s, const std::vector<std::vector<Instr>>& ranks, int rank) {
  return max_grads_in_flight(ranks, rank, executor_grad_plan(s, ranks, rank));
}

RankBuffers rank_buffers(const ScheduleSpec& s, int rank) {
  MT_CHECK(rank >= 0 && rank < s.pp, ErrorKind::kInvalidArgument, "pipeline rank out of range");
  // A bound for a long-lived process; a search asks for far fewer.
  static OnceCache<std::tuple<int, int, int, int>, std::shared_ptr<const std::vector<RankBuffers>>> known(4096);
  return known
      .get({static_cast<int>(s.kind), s.pp, s.virtual_stages, s.micro_batches},
           [&] {
             std::vector<std::vector<Instr>> ranks;
             for (int q = 0; q < s.pp; ++q) ranks.push_back(build_schedule(s, q));
             auto all = std::make_shared<std::vector<RankBuffers>>();
             for (int q = 0; q < s.pp; ++q)
               all->push_back({max_in_flight(ranks[static_cast<size_t>(q)]), max_grads_in_flight(s, ranks, q)});
             return std::shared_ptr<const std::vector<RankBuffers>>(std::move(all));
           })
      ->at(static_cast<size_t>(rank));
}

SimResult simulate(const ScheduleSpec& s, const std::vector<std::vector<Instr>>& ranks, double t_forward, double t_backward) {
  const int P = static_cast<int>(ranks.size());
  const double v = s.virtual_stages;
  SimResult r;
  r.busy.assign(P, 0.0);
  std::vector<double> clock(P, 0.0);
  std::vector<size_t> pc(P, 0);
  std::map<std::tuple<int, int, int>, double> sent;  // (from, to, tag) -> arrival time
  for (;;) {
    bool progressed = false, done = true;
    for (int q = 0; q < P; ++q) {
      while (pc[q] < ranks[q].size()) {
        const Instr& i = ranks[q][pc[q]];
        if (i.kind == OpKind::kRecvActivation || i.kind == OpKind::kRecvGrad) {
          auto it = sent.find({i.peer, q, i.tag});
          if (it == sent.end()) break;
          clock[q] = std::max(clock[q], it->second);
          sent.erase(it);
        } else if (i.kind == OpKind::kSendActivation || i.kind == OpKind::kSendGrad) {
          sent[{q, i.peer, i.tag}] = clock[q];
        } else {
          double t = (i.kind == OpKind::kForward ? t_forward : t_backward) / v;
          clock[q] += t;
          r.busy[q] += t;
        }
        ++pc[q];
        progressed = true;
      }
      if (pc[q] < ranks[q].size()) done = false;
    }
    if (done) break;
    if (!progressed) {
      r.deadlock = true;
      for (int q = 0; q < P; ++q)
        if (pc[q] < ranks[q].size()) {
          const Instr& i = ranks[q][pc[q]];
          r.where += "rank " + std::to_string(q) + " waits at " + op_name(i.kind) + " chunk " + std::to_string(i.chunk) +
                     " micro " + std::to_string(i.micro) + " tag " + std::to_string(i.tag) + "; ";
        }
      break;
    }
  }
  r.makespan = *std::max_element(clock.begin(), clock.end());
  return r;
}

std::string validate(const ScheduleSpec& s, const std::vector<std::vector<Instr>>& ranks) {
  const int P = static_cast<int>(ranks.size());
  if (P != s.pp) return "expected " + std::to_string(s.pp) + " rank lists";
  // (from, to, tag) -> (stage boundary, micro, grad) of each send; receives must match one each.
  std::map<std::tuple<int, int, int>, int> sends;
  std::map<std::tuple<int, int, int>, int> recvs;
  for (int q = 0; q < P; ++q) {
    std::set<std::pair<int, int>> fwd, bwd;
    const std::vector<Instr>& list = ranks[q];
    for (size_t n = 0; n < list.size(); ++n) {
      const Instr& i = list[n];
      const std::string at = "rank " + std::to_string(q) + " instruction " + std::to_string(n) + " (" + op_name(i.kind) +
                             " chunk " + std::to_string(i.chunk) + " micro " + std::to_string(i.micro) + ")";
      const int st = i.chunk * s.pp + q;
      std::pair<int, int> key{i.chunk, i.micro};
      switch (i.kind) {
        case OpKind::kForward:
          if (!fwd.insert(key).second) return at + ": second forward";
          if (st > 0 && (n == 0 || list[n - 1].kind != OpKind::kRecvActivation || list[n - 1].micro != i.micro ||
                         list[n - 1].chunk != i.chunk))
            return at + ": forward without its activation received just before";
          break;
        case OpKind::kBackward:
          if (!fwd.count(key)) return at + ": backward before its forward";
          if (!bwd.insert(key).second) return at + ": second backward";
          if (st + 1 < s.stages() && (n == 0 || list[n - 1].kind != OpKind::kRecvGrad || list[n - 1].micro != i.micro ||
                                      list[n - 1].chunk != i.chunk))
            return at + ": backward without its gradient received just before";
          break;
        case OpKind::kSendActivation:
        case OpKind::kSendGrad: {
          const bool grad = i.kind == OpKind::kSendGrad;
          const int boundary = grad ? st - 1 : st;
          const int to = grad ? (st - 1) % s.pp : (st + 1) % s.pp;
          if (boundary < 0 || boundary + 1 >= s.stages()) return at + ": send past the pipeline's end";
          if (i.peer != to || i.tag != message_tag(s, boundary, i.micro, grad)) return at + ": wrong peer or tag";
          if (!sends.emplace(std::tuple{q, i.peer, i.tag}, 1).second) return at + ": tag sent twice";
          break;
        }
        case OpKind::kRecvActivation:
        case OpKind::kRecvGrad: {
          if (!recvs.emplace(std::tuple{i.peer, q, i.tag}, 1).second) return at + ": tag received twice";
          break;
        }
      }
    }
    const size_t want = static_cast<size_t>(s.virtual_stages) * s.micro_batches;
    if (fwd.size() != want || bwd.size() != want)
      return "rank " + std::to_string(q) + ": " + std::to_string(fwd.size()) + " forwards and " + std::to_string(bwd.size()) +
             " backwards, expected " + std::to_string(want) + " each";
  }
  for (const auto& [k, n] : sends)
    if (!recvs.count(k))
      return "send from rank " + std::to_string(std::get<0>(k)) + " to " + std::to_string(std::get<1>(k)) + " tag " +
             std::to_string(std::get<2>(k)) + " has no receive";
  for (const auto& [k, n] : recvs)
    if (!sends.count(k))
      return "receive on rank " + std::to_string(std::get<1>(k)) + " from " + std::to_string(std::get<0>(k)) + " tag " +
             std::to_string(std::get<2>(k)) + " has no send";
  return "";
}

}  // namespace mt::parallel::pp
