#include "planner/sim.h"

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#include "base/error.h"

namespace mt::planner {

namespace {

const char* kind_name(SimOpKind k) {
  switch (k) {
    case SimOpKind::kCompute: return "compute";
    case SimOpKind::kSend: return "send";
    case SimOpKind::kRecv: return "recv";
    case SimOpKind::kCollective: return "collective";
    case SimOpKind::kWait: return "wait";
    case SimOpKind::kStream: return "stream";
  }
  return "?";
}

struct Rank {
  size_t pc = 0;
  double main = 0.0;  // the compute stream's clock
  double comm = 0.0;  // when the communication stream is free
  std::map<int, double> stream;  // kStream: when each of the rank's own streams is free
  std::vector<std::tuple<double, double, double>> disk;  // kStream transfers: (start, end, bytes a second)
  bool registered = false;  // its current collective (or the one its wait issues) has been issued
  std::map<int, double> handle_end;  // async operations whose end is known, by tag
  std::map<int, double> stream_end;  // kStream work by tag: waited for any number of times
  std::map<int, const SimOp*> deferred;  // progress = false: collectives issued at their wait
};

}  // namespace

SimReport simulate(const SimProgram& program, const SimOptions& options) {
  const int P = static_cast<int>(program.ranks.size());
  for (int q = 0; q < P; ++q)
    for (const SimOp& op : program.ranks[q]) {
      const std::string at = "simulator: rank " + std::to_string(q) + " " + kind_name(op.kind) + " " + op.name;
      if (op.kind == SimOpKind::kCollective) {
        MT_CHECK(op.group >= 0 && op.group < static_cast<int>(program.groups.size()), ErrorKind::kInvalidArgument,
                 at + ": no group " + std::to_string(op.group));
        const auto& g = program.groups[op.group];
        MT_CHECK(std::find(g.begin(), g.end(), q) != g.end(), ErrorKind::kInvalidArgument,
                 at + ": the rank is not in group " + std::to_string(op.group));
      }
      if (op.kind == SimOpKind::kStream)
        MT_CHECK(op.stream >= 1, ErrorKind::kInvalidArgument, at + ": a stream's work names stream >= 1");
      if (op.kind == SimOpKind::kSend || op.kind == SimOpKind::kRecv)
        MT_CHECK(op.peer >= 0 && op.peer < P && op.peer != q, ErrorKind::kInvalidArgument, at + ": bad peer");
      if (op.kind == SimOpKind::kWait) {
        bool found = false;
        for (const SimOp& o : program.ranks[q]) found = found || (o.async && o.tag == op.tag && &o != &op);
        MT_CHECK(found, ErrorKind::kInvalidArgument, at + ": waits for tag " + std::to_string(op.tag) + ", never issued");
      }
    }
  SimReport r;
  r.end.assign(P, 0.0);
  r.compute.assign(P, 0.0);
  r.comm.assign(P, 0.0);
  r.blocked.assign(P, 0.0);
  r.streams.assign(P, 0.0);
  std::vector<Rank> st(P);
  std::map<std::tuple<int, int, int>, double> arrival;                         // (from, to, tag) -> when
  std::map<std::pair<int, int>, std::vector<std::pair<int, double>>> issued;   // (group, tag) -> (rank, at)
  std::map<std::pair<int, int>, double> coll_end;                              // (group, tag) -> end

  // Compute of `seconds` from the rank's clock under its disk transfers: its end.
  auto stretched = [&](Rank& s, double seconds) {
    const double k = program.disk_interference;
    std::erase_if(s.disk, [&](const auto& d) { return std::get<1>(d) <= s.main; });
    double t = s.main, left = seconds;
    while (left > 0) {
      double rate = 0.0, next = std::numeric_limits<double>::infinity();
      for (const auto& [a, b, bps] : s.disk) {
        if (a <= t && t < b) rate += bps, next = std::min(next, b);
        else if (a > t) next = std::min(next, a);
      }
      const double speed = 1.0 / (1.0 + k * rate);
      if (t + left / speed <= next) return t + left / speed;
      left -= (next - t) * speed;
      t = next;
    }
    return t;
  };
  auto block_until = [&](int q, double t) {
    if (t > st[q].main) {
      r.blocked[q] += t - st[q].main;
      st[q].main = t;
    }
  };
  // A send's transfer on q's communication stream, issued at `at`: its end.
  auto transfer = [&](int q, const SimOp& op, double at) {
    const double start = std::max(at, st[q].comm);
    st[q].comm = start + op.seconds;
    r.comm[q] += op.seconds;
    arrival[{q, op.peer, op.tag}] = st[q].comm;
    return st[q].comm;
  };
  // Issues q's part of a collective at `at`; when every member is in, it runs on all of them.
  auto issue = [&](int q, const SimOp& op, double at) {
    const std::pair<int, int> key{op.group, op.tag};
    auto& in = issued[key];
    in.emplace_back(q, at);
    const auto& members = program.groups[op.group];
    if (in.size() < members.size()) return;
    double start = 0.0;
    for (const auto& [m, t] : in) start = std::max({start, t, st[m].comm});
    const double end = start + op.seconds;
    for (const auto& [m, t] : in) {
      st[m].comm = end;
      r.comm[m] += op.seconds;
    }
    coll_end[key] = end;
  };
  // Runs q's blocking collective (issued at its current clock): whether it has ended.
  auto blocking_collective = [&](int q, const SimOp& op) {
    if (!st[q].registered) {
      issue(q, op, st[q].main);
      st[q].registered = true;
    }
    auto it = coll_end.find({op.group, op.tag});
    if (it == coll_end.end()) return false;
    block_until(q, it->second);
    st[q].registered = false;
    return true;
  };

  for (;;) {
    bool progressed = false, done = true;
    for (int q = 0; q < P; ++q) {
      Rank& s = st[q];
      const auto& list = program.ranks[q];
      while (s.pc < list.size()) {
        const SimOp& op = list[s.pc];
        bool ok = true;
        switch (op.kind) {
          case SimOpKind::kCompute: {
            const double end = stretched(s, op.seconds);
            r.compute[q] += end - s.main;
            s.main = end;
            break;
          }
          case SimOpKind::kStream: {
            double& free = s.stream[op.stream];
            const double start = std::max(free, s.main);
            free = start + op.seconds;
            if (op.bytes > 0 && op.seconds > 0 && program.disk_interference > 0) s.disk.emplace_back(start, free, op.bytes / op.seconds);
            r.streams[q] += op.seconds;
            if (op.async) s.stream_end[op.tag] = free;
            else block_until(q, free);
            break;
          }
          case SimOpKind::kSend:
            if (!op.async) block_until(q, transfer(q, op, s.main));
            else s.handle_end[op.tag] = transfer(q, op, s.main);  // the receiver's wait moves it
            break;
          case SimOpKind::kRecv: {
            auto it = arrival.find({op.peer, q, op.tag});
            if (it == arrival.end()) {
              ok = false;
            } else {
              block_until(q, it->second);
              arrival.erase(it);
            }
            break;
          }
          case SimOpKind::kCollective:
            if (!op.async) {
              ok = blocking_collective(q, op);
            } else if (options.progress) {
              issue(q, op, s.main);
            } else {
              s.deferred[op.tag] = &op;
            }
            break;
          case SimOpKind::kWait: {
            auto d = s.deferred.find(op.tag);
            if (d != s.deferred.end()) {  // without progress the collective starts here, as a blocking one
              ok = blocking_collective(q, *d->second);
              if (ok) s.deferred.erase(d);
              break;
            }
            if (auto w = s.stream_end.find(op.tag); w != s.stream_end.end()) {
              block_until(q, w->second);
              break;
            }
            auto h = s.handle_end.find(op.tag);
            if (h != s.handle_end.end()) {
              block_until(q, h->second);
              s.handle_end.erase(h);
              break;
            }
            // An asynchronous collective of this rank with this tag: ended yet?
            ok = false;
            for (const auto& [key, end] : coll_end) {
              if (key.second != op.tag) continue;
              const auto& in = issued[key];
              if (std::any_of(in.begin(), in.end(), [&](const auto& e) { return e.first == q; })) {
                block_until(q, end);
                ok = true;
                break;
              }
            }
            break;
          }
        }
        if (!ok) break;
        ++s.pc;
        progressed = true;
      }
      if (s.pc < list.size()) done = false;
    }
    if (done) break;
    if (!progressed) {
      r.deadlock = true;
      for (int q = 0; q < P; ++q)
        if (st[q].pc < program.ranks[q].size()) {
          const SimOp& op = program.ranks[q][st[q].pc];
          r.where += "rank " + std::to_string(q) + " waits at " + kind_name(op.kind) + " " + op.name + " tag " +
                     std::to_string(op.tag) + "; ";
        }
      break;
    }
  }
  for (int q = 0; q < P; ++q) {
    r.end[q] = std::max(st[q].main, st[q].comm);
    for (const auto& [k, t] : st[q].stream) r.end[q] = std::max(r.end[q], t);
    r.makespan = std::max(r.makespan, r.end[q]);
  }
  return r;
}

SimProgram pipeline_program(const parallel::pp::ScheduleSpec& spec, double t_forward, double t_backward,
                            double t_message) {
  using parallel::pp::OpKind;
  SimProgram p;
  const double v = spec.virtual_stages;
  for (int q = 0; q < spec.pp; ++q) {
    std::vector<SimOp> ops;
    for (const parallel::pp::Instr& i : parallel::pp::build_schedule(spec, q)) {
      SimOp op;
      op.name = std::string(parallel::pp::op_name(i.kind)) + " c" + std::to_string(i.chunk) + " m" + std::to_string(i.micro);
      op.peer = i.peer;
      op.tag = i.tag;
      switch (i.kind) {
        case OpKind::kForward:
        case OpKind::kBackward:
          op.kind = SimOpKind::kCompute;
          op.seconds = (i.kind == OpKind::kForward ? t_forward : t_backward) / v;
          op.peer = op.tag = -1;
          break;
        case OpKind::kSendActivation:
        case OpKind::kSendGrad:
          op.kind = SimOpKind::kSend;
          op.seconds = t_message;
          op.async = true;  // the executor posts sends without blocking (schedule.h)
          break;
        case OpKind::kRecvActivation:
        case OpKind::kRecvGrad:
          op.kind = SimOpKind::kRecv;
          break;
      }
      ops.push_back(std::move(op));
    }
    p.ranks.push_back(std::move(ops));
  }
  return p;
}

}  // namespace mt::planner
