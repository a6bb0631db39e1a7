#include "planner/sim.h"

#include <algorithm>
#include <limits>
#include <map>
#include <queue>
#include <tuple>
#include <unordered_map>
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

std::string SimOp::describe() const {
  if (!name.empty() || label == nullptr) return name;
  std::string s = label;
  if (chunk >= 0) s += " c" + std::to_string(chunk);
  if (micro >= 0) s += " m" + std::to_string(micro);
  return s;
}

SimReport simulate(const SimProgram& program, const SimOptions& options) {
  const int P = static_cast<int>(program.ranks.size());
  MT_CHECK(P < 65536, ErrorKind::kInvalidArgument, "simulator: " + std::to_string(P) + " ranks (at most 65535)");
  // One pass over every instruction (a search's programs are millions of them): the waits' tags are
  // checked against the asynchronous operations' after it. The first refusal in a rank's order is
  // the one thrown, as a check op by op would: a wait's, or the first other one found (after which
  // the pass only gathers the tags).
  std::vector<int> async_tags;               // of the rank being checked, sorted after its pass
  std::vector<std::pair<int, size_t>> waits;  // (tag, index)
  bool async_collective = false;
  for (int q = 0; q < P; ++q) {
    const std::vector<SimOp>& list = program.ranks[q];
    async_tags.clear();
    waits.clear();
    size_t refused_at = list.size();  // the first instruction refused other than a wait
    std::string refusal;
    for (size_t i = 0; i < list.size(); ++i) {
      const SimOp& op = list[i];
      if (op.async) async_tags.push_back(op.tag), async_collective = async_collective || op.kind == SimOpKind::kCollective;
      if (op.kind == SimOpKind::kCompute || refused_at < list.size()) continue;
      // The message, built only for a refusal (every op of every layout passes here).
      auto refuse = [&](const std::string& why) {
        refused_at = i;
        refusal = "simulator: rank " + std::to_string(q) + " " + kind_name(op.kind) + " " + op.describe() + ": " + why;
      };
      if (op.kind == SimOpKind::kCollective) {
        if (op.group < 0 || op.group >= static_cast<int>(program.groups.size())) {
          refuse("no group " + std::to_string(op.group));
        } else {
          const auto& g = program.groups[op.group];
          if (std::find(g.begin(), g.end(), q) == g.end()) refuse("the rank is not in group " + std::to_string(op.group));
        }
      }
      if (op.kind == SimOpKind::kStream && op.stream < 1) refuse("a stream's work names stream >= 1");
      if ((op.kind == SimOpKind::kSend || op.kind == SimOpKind::kRecv) && (op.peer < 0 || op.peer >= P || op.peer == q))
        refuse("bad peer");
      if (op.kind == SimOpKind::kWait) waits.emplace_back(op.tag, i);
    }
    std::sort(async_tags.begin(), async_tags.end());
    for (const auto& [tag, i] : waits) {  // a wait names an asynchronous operation of its rank, not itself
      const SimOp& op = list[i];
      const auto [lo, hi] = std::equal_range(async_tags.begin(), async_tags.end(), tag);
      MT_CHECK(hi - lo - (op.async ? 1 : 0) > 0, ErrorKind::kInvalidArgument,
               "simulator: rank " + std::to_string(q) + " " + kind_name(op.kind) + " " + op.describe() + ": waits for tag " +
                   std::to_string(op.tag) + ", never issued");
    }
    MT_CHECK(refused_at == list.size(), ErrorKind::kInvalidArgument, refusal);
  }
  SimReport r;
  r.async_collective = async_collective;
  r.end.assign(P, 0.0);
  r.compute.assign(P, 0.0);
  r.comm.assign(P, 0.0);
  r.blocked.assign(P, 0.0);
  r.streams.assign(P, 0.0);
  std::vector<Rank> st(P);
  const bool shared = program.host_cores > 0;
  MT_CHECK(program.host.empty() || static_cast<int>(program.host.size()) == P, ErrorKind::kInvalidArgument,
           "simulator: SimProgram::host names " + std::to_string(program.host.size()) + " ranks of " + std::to_string(P));
  MT_CHECK(program.demand.empty() || static_cast<int>(program.demand.size()) == P, ErrorKind::kInvalidArgument,
           "simulator: SimProgram::demand names " + std::to_string(program.demand.size()) + " ranks of " + std::to_string(P));
  int hosts = 1;
  for (int h : program.host) {
    MT_CHECK(h >= 0, ErrorKind::kInvalidArgument, "simulator: a negative host");
    hosts = std::max(hosts, h + 1);
  }
  auto host_of = [&](int q) { return shared && !program.host.empty() ? program.host[static_cast<size_t>(q)] : 0; };
  auto demand_of = [&](int q) { return program.demand.empty() ? 1.0 : program.demand[static_cast<size_t>(q)]; };
  // Hashed by their keys (none is iterated): a 64-rank step makes thousands of collectives.
  std::unordered_map<uint64_t, double> arrival;                          // (from, to, tag) -> when
  std::unordered_map<uint64_t, std::vector<std::pair<int, double>>> issued;  // (group, tag) -> (rank, at)
  std::unordered_map<uint64_t, double> coll_end;                         // (group, tag) -> end
  // (rank, tag) -> (group, end): the rank's ended collective of that tag in the lowest group, for
  // its waits (a scan of coll_end at every wait made 64-rank searches quadratic: 15 s).
  std::unordered_map<uint64_t, std::pair<int, double>> rank_end;
  // Keys: (group or rank, tag) in 32 bits each; (rank, rank, tag) with ranks in 16 (checked above).
  auto key2 = [](int a, int tag) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(tag); };
  auto key3 = [](int a, int b, int tag) {
    return (static_cast<uint64_t>(static_cast<uint16_t>(a)) << 48) | (static_cast<uint64_t>(static_cast<uint16_t>(b)) << 32) |
           static_cast<uint32_t>(tag);
  };

  // The ranks whose next step may do something (DESIGN-NOTES 65). At a given time the ranks are
  // stepped in sweeps in rank order until none moves; a rank moves only once something has woken
  // it (a message for it, a collective of its ended, its compute's end, its clock reached), so a
  // sweep steps the woken ranks alone, in rank order, in the order a sweep of every rank would.
  // A rank woken by a lower rank's step joins this sweep; one woken by a higher or the same
  // rank, the next.
  std::priority_queue<int, std::vector<int>, std::greater<int>> sweep;  // this sweep's, lowest first
  std::vector<int> later;                                              // the next sweep's
  std::vector<char> in_sweep(P, 1), in_later(P, 0);
  for (int q = 0; q < P; ++q) sweep.push(q);
  int stepping = -1;  // the rank being stepped (-1: between sweeps)
  auto wake = [&](int q) {
    if (q > stepping) {
      if (!in_sweep[q]) in_sweep[q] = 1, sweep.push(q);
    } else if (!in_later[q]) {
      in_later[q] = 1, later.push_back(q);
    }
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
    arrival[key3(q, op.peer, op.tag)] = st[q].comm;
    wake(op.peer);
    return st[q].comm;
  };
  // Issues q's part of a collective at `at`; when every member is in, it runs on all of them.
  auto issue = [&](int q, const SimOp& op, double at) {
    const uint64_t key = key2(op.group, op.tag);
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
      wake(m);
      auto [it, fresh] = rank_end.try_emplace(key2(m, op.tag), op.group, end);
      if (!fresh && op.group < it->second.first) it->second = {op.group, end};
    }
    coll_end[key] = end;
  };
  // Runs q's blocking collective (issued at its current clock): whether it has ended.
  auto blocking_collective = [&](int q, const SimOp& op) {
    if (!st[q].registered) {
      issue(q, op, st[q].main);
      st[q].registered = true;
    }
    auto it = coll_end.find(key2(op.group, op.tag));
    if (it == coll_end.end()) return false;
    block_until(q, it->second);
    st[q].registered = false;
    return true;
  };

  // Compute in progress, in global time: a rank's compute runs at its host's share of the cores
  // (all of its speed while the ranks computing there need no more cores than the host has) over
  // 1 + k·r for its disk transfers; every start, end and disk boundary re-rates what it touches.
  struct Running {
    bool on = false;
    double start = 0.0, since = 0.0, left = 0.0, rate = 1.0, boundary = 0.0;
    double vend = 0.0;  // fair sharing: the host's work clock at which it ends
  };
  std::vector<Running> run(P);
  std::vector<double> host_demand(hosts, 0.0);
  const double inf = std::numeric_limits<double>::infinity();
  double now = 0.0;
  auto share = [&](int q) {
    if (program.host_cores <= 0) return 1.0;
    const double d = host_demand[host_of(q)];
    return d > program.host_cores ? program.host_cores / d : 1.0;
  };
  auto rerate = [&](int q) {  // at `now`: what q has done at its old rate, and its rate from here
    Running& x = run[q];
    x.left = std::max(0.0, x.left - x.rate * (now - x.since));
    x.since = now;
    double bps = 0.0;
    x.boundary = inf;
    if (program.disk_interference > 0) {
      std::erase_if(st[q].disk, [&](const auto& d) { return std::get<1>(d) <= now; });
      for (const auto& [a, b, v] : st[q].disk) {
        if (a <= now && now < b) bps += v, x.boundary = std::min(x.boundary, b);
        else if (a > now) x.boundary = std::min(x.boundary, a);
      }
    }
    x.rate = share(q) / (1.0 + program.disk_interference * bps);
  };
  auto rerate_host = [&](int h) {
    if (program.host_cores <= 0) return;
    for (int q = 0; q < P; ++q)
      if (run[q].on && host_of(q) == h) rerate(q);
  };
  // Without disk transfers every rank computing on a host runs at the host's one rate, so the host
  // keeps a work clock (a computing rank's seconds done at that rate) and a start or end changes
  // the host's rate alone, not every rank's (re-rating each of 64 ranks at every start and end
  // was most of a 64-rank search on two cores: DESIGN-NOTES 65). A rank ends when the clock has
  // advanced by its seconds.
  const bool fair = program.host_cores > 0 && program.disk_interference <= 0;
  struct HostClock {
    double done = 0.0, since = 0.0, rate = 1.0;
  };
  std::vector<HostClock> clock(static_cast<size_t>(hosts));
  auto host_rate = [&](int h) {
    const double d = host_demand[h];
    return d > program.host_cores ? program.host_cores / d : 1.0;
  };
  auto advance = [&](int h) {  // the host's clock brought to `now` at its rate so far
    HostClock& c = clock[static_cast<size_t>(h)];
    c.done += c.rate * (now - c.since);
    c.since = now;
  };
  auto finish_of = [&](int q) {
    if (!fair) return run[q].since + run[q].left / run[q].rate;
    const HostClock& c = clock[static_cast<size_t>(host_of(q))];
    return c.since + (run[q].vend - c.done) / c.rate;
  };

  std::vector<double> held(P, 0.0);  // a fixed wait's demand on its host, until the rank's clock
  // Runs rank q's instructions at `now` until it blocks, starts a compute, or its clock passes now.
  auto step_rank = [&](int q) {
    Rank& s = st[q];
    const auto& list = program.ranks[q];
    bool moved = false;
    while (s.pc < list.size() && !run[q].on && s.main <= now) {
      const SimOp& op = list[s.pc];
      bool ok = true;
      switch (op.kind) {
        case SimOpKind::kCompute:
          block_until(q, now);
          if (op.fixed && op.seconds > 0) {  // on the rank's clock; its demand held until then
            r.compute[q] += op.seconds;
            s.main = now + op.seconds;
            if (program.host_cores > 0) {
              const int h = host_of(q);
              if (fair) advance(h);
              host_demand[h] += demand_of(q) - held[q];  // one held demand, were the last wait not yet let go
              held[q] = demand_of(q);
              if (fair) clock[static_cast<size_t>(h)].rate = host_rate(h);
              else rerate_host(h);
            }
            break;
          }
          if (op.seconds > 0) {
            run[q].on = true;
            run[q].start = run[q].since = now;
            run[q].left = op.seconds;
            run[q].rate = 1.0;
            if (fair) {
              const int h = host_of(q);
              advance(h);
              host_demand[h] += demand_of(q);
              clock[static_cast<size_t>(h)].rate = host_rate(h);
              run[q].vend = clock[static_cast<size_t>(h)].done + op.seconds;
              run[q].boundary = inf;
              return true;
            }
            host_demand[host_of(q)] += demand_of(q);
            rerate(q);
            rerate_host(host_of(q));
            return true;  // its pc moves on when it ends
          }
          break;
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
          auto it = arrival.find(key3(op.peer, q, op.tag));
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
          auto e = rank_end.find(key2(q, op.tag));
          ok = e != rank_end.end();
          if (ok) block_until(q, e->second.second);
          break;
        }
      }
      if (!ok) break;
      ++s.pc;
      moved = true;
    }
    return moved;
  };

  std::vector<char> touched(static_cast<size_t>(hosts), 0);  // per event: the hosts whose demand changed
  for (;;) {
    // Everything that can happen at `now` (a rank's progress can unblock another's).
    while (!sweep.empty()) {
      while (!sweep.empty()) {
        stepping = sweep.top();
        sweep.pop();
        in_sweep[static_cast<size_t>(stepping)] = 0;
        step_rank(stepping);
      }
      stepping = -1;
      for (int q : later) {
        in_later[static_cast<size_t>(q)] = 0;
        wake(q);
      }
      later.clear();
    }
    // The next event: a compute's end or disk boundary, or a rank's clock.
    double next = inf;
    bool done = true;
    for (int q = 0; q < P; ++q) {
      if (held[q] > 0) next = std::min(next, st[q].main);
      if (run[q].on) next = std::min({next, finish_of(q), run[q].boundary});
      else if (st[q].pc < program.ranks[q].size() && st[q].main > now) next = std::min(next, st[q].main);
      done = done && !run[q].on && st[q].pc >= program.ranks[q].size();
    }
    if (done) break;
    if (next == inf) {
      r.deadlock = true;
      for (int q = 0; q < P; ++q)
        if (st[q].pc < program.ranks[q].size()) {
          const SimOp& op = program.ranks[q][st[q].pc];
          r.where += "rank " + std::to_string(q) + " waits at " + kind_name(op.kind) + " " + op.describe() + " tag " +
                     std::to_string(op.tag) + "; ";
        }
      break;
    }
    const double before = now;
    now = next;
    std::fill(touched.begin(), touched.end(), 0);
    // Every host's clock brought to now, at its rate so far, before any demand leaves and any rank
    // is tested against it: advanced by the first rank to end here, it read the ranks after that
    // one by another rounding, so of a stage's data-parallel replicas, ending together, one could
    // end a hair later than the other (DESIGN-NOTES 134).
    if (fair)
      for (int h = 0; h < hosts; ++h) advance(h);
    for (int q = 0; q < P; ++q)
      if (held[q] > 0 && st[q].main <= now) {  // a fixed wait has ended: its demand leaves
        host_demand[host_of(q)] -= held[q];
        held[q] = 0.0;
        touched[static_cast<size_t>(host_of(q))] = 1;
      }
    for (int q = 0; q < P; ++q) {
      if (!run[q].on) {
        if (st[q].pc < program.ranks[q].size() && st[q].main > before && st[q].main <= now) wake(q);  // its clock reached
        continue;
      }
      if (finish_of(q) <= now) {
        run[q].on = false;
        r.compute[q] += now - run[q].start;
        st[q].main = now;
        ++st[q].pc;
        host_demand[host_of(q)] -= demand_of(q);
        touched[static_cast<size_t>(host_of(q))] = 1;
        wake(q);
      } else if (run[q].boundary <= now) {
        rerate(q);
      }
    }
    for (int h = 0; h < hosts; ++h)
      if (touched[static_cast<size_t>(h)]) {
        if (fair) clock[static_cast<size_t>(h)].rate = host_rate(h);
        else rerate_host(h);
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
  std::vector<std::vector<parallel::pp::Instr>> lists;
  for (int q = 0; q < spec.pp; ++q) lists.push_back(parallel::pp::build_schedule(spec, q));
  for (int q = 0; q < spec.pp; ++q) {
    std::vector<SimOp> ops;
    const std::vector<parallel::pp::Instr>& list = lists[static_cast<size_t>(q)];
    const parallel::pp::GradSendPlan grads = parallel::pp::executor_grad_plan(spec, lists, q);
    for (size_t j = 0; j < list.size(); ++j) {
      const parallel::pp::Instr& i = list[j];
      for (int sent : grads.wait_before[j]) {  // the executor waits for its previous gradient send
        SimOp w;
        w.kind = SimOpKind::kWait;
        w.tag = list[static_cast<size_t>(sent)].tag;
        w.name = "wait send grad m" + std::to_string(list[static_cast<size_t>(sent)].micro);
        ops.push_back(std::move(w));
      }
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
