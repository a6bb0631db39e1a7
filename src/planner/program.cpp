#include "planner/program.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>

#include "base/error.h"
#include "base/once_cache.h"
#include "parallel/dp/grad_buckets.h"

namespace mt::planner {
namespace {

// The tp and sp groups' placeholders in a list built for one rank; zero_step_program maps them
// (and group 0, the dp group) to each rank's own groups.
constexpr int kTpGroup = 1;
constexpr int kSpGroup = 2;

// A unit's pass: its compute, split evenly around the blocking tp collectives it makes, then its
// blocking sp (Ulysses) ones.
void emit_pass(std::vector<SimOp>& ops, int& next_tag, double seconds, const std::vector<double>* tp,
               const std::vector<double>* sp, const std::string& name) {
  const size_t kt = tp ? tp->size() : 0, k = kt + (sp ? sp->size() : 0);
  for (size_t i = 0; i <= k; ++i) {
    SimOp op;
    op.seconds = seconds / static_cast<double>(k + 1);
    op.name = name;
    ops.push_back(std::move(op));
    if (i == k) break;
    SimOp c;
    c.kind = SimOpKind::kCollective;
    c.seconds = i < kt ? (*tp)[i] : (*sp)[i - kt];
    c.group = i < kt ? kTpGroup : kSpGroup;
    c.tag = next_tag++;
    c.name = (i < kt ? "tp collective in " : "sp collective in ") + name;
    ops.push_back(std::move(c));
  }
}

const std::vector<double>* tp_of(const std::vector<std::vector<double>>& v, size_t u) {
  return u < v.size() && !v[u].empty() ? &v[u] : nullptr;
}

// parallel::ZeroEffects as instructions of one rank (every rank runs the same list).
class ZeroEmitter : private parallel::ZeroEffects {
 public:
  ZeroEmitter(const ZeroStepSpec& spec, const ZeroStepCosts& costs)
      : spec_(spec), costs_(costs), gather_(spec.units.size(), -1), other_(spec.units.size(), -1), schedule_(spec.units, spec.schedule, *this) {
    const size_t U = spec.units.size();
    MT_CHECK(U > 0 && spec.world >= 1 && spec.micro_batches >= 1, ErrorKind::kInvalidArgument,
             "zero step program: units, world and micro-batches must be positive");
    MT_CHECK(costs.forward.size() == U && costs.backward.size() == U, ErrorKind::kInvalidArgument,
             "zero step program: one forward and one backward time per unit");
    MT_CHECK(costs.all_gather && costs.reduce_scatter, ErrorKind::kInvalidArgument,
             "zero step program: the collectives' costs are missing");
    for (const parallel::Unit& u : spec.units) shard_ += piece(u);
  }

  std::vector<SimOp> run() {
    schedule_.construct();
    ops_.clear();  // construction is not part of a step
    const size_t last = spec_.units.size() - 1, head = spec_.tied_head ? 0 : last;
    if (spec_.param_nvme) {  // the step before's optimizer on its thread, then the refresh (program.h)
      optimizer_thread();
      schedule_.refresh();
    }
    begun_.assign(spec_.units.size(), -1);
    for (int m = 0; m < spec_.micro_batches; ++m) {
      micro_ = m;
      schedule_.set_last_micro_batch(m + 1 == spec_.micro_batches);
      for (size_t u = 0; u <= last; ++u) {
        schedule_.on_hook(u, true, true);
        emit_pass(ops_, next_tag_, costs_.forward[u], tp_of(costs_.tp_forward, u), tp_of(costs_.sp_forward, u),
                  "forward " + spec_.units[u].name);
        schedule_.on_hook(u, false, true);
      }
      schedule_.on_hook(head, true, false);
      emit_pass(ops_, next_tag_, costs_.head_backward, costs_.tp_head_backward.empty() ? nullptr : &costs_.tp_head_backward,
                nullptr, "head backward");
      schedule_.on_hook(head, false, false);
      for (size_t u = last + 1; u-- > 0;) {
        schedule_.on_hook(u, true, false);
        // A slab zeroed at this hook within the cache: the weight gradients accumulate there.
        const bool fresh = begun_.size() == spec_.units.size() && begun_[u] == m && hot(u) && u < costs_.hot_backward_saving.size();
        emit_pass(ops_, next_tag_, std::max(0.0, costs_.backward[u] - (fresh ? costs_.hot_backward_saving[u] : 0.0)),
                  tp_of(costs_.tp_backward, u), tp_of(costs_.sp_backward, u), "backward " + spec_.units[u].name);
        schedule_.on_hook(u, false, false);
      }
      schedule_.finish_backward();
      if (spec_.param_nvme)  // ZeroRuntime::finish_backward: every gradient record on disk
        for (int t : writes_) wait(t, "gradient write");
      writes_.clear();
    }
    if (spec_.param_nvme) {
      wait(optimizer_end_, "the optimizer thread");
      return std::move(ops_);
    }
    compute(costs_.optimizer_seconds(static_cast<double>(shard_)), "optimizer");
    schedule_.refresh();
    return std::move(ops_);
  }

 private:
  size_t piece(const parallel::Unit& u) const { return (u.numel + spec_.world - 1) / spec_.world; }
  double piece_bytes(size_t u) const { return 4.0 * static_cast<double>(piece(spec_.units[u])); }
  double padded_bytes(size_t u) const { return piece_bytes(u) * spec_.world; }
  // ZeroRuntime::image_view: unit u is gathered in the compute dtype straight into its view.
  bool image(size_t u) const {
    return spec_.low_precision && !spec_.param_nvme &&
           parallel::gathers_in_compute_dtype(spec_.units[u], piece(spec_.units[u]), spec_.world);
  }
  double other_bytes(size_t u) const {
    return 4.0 * static_cast<double>(spec_.units[u].numel - spec_.units[u].matrix_numel);
  }
  void compute(double seconds, std::string name) {
    SimOp op;
    op.seconds = seconds;
    op.name = std::move(name);
    ops_.push_back(std::move(op));
  }
  int collective(double seconds, std::string name) {
    SimOp op;
    op.kind = SimOpKind::kCollective;
    op.seconds = seconds;
    op.group = 0;
    op.async = true;  // ZeroRuntime's gathers and reductions are nonblocking
    op.tag = next_tag_++;
    op.name = std::move(name);
    ops_.push_back(op);
    return op.tag;
  }
  void wait(int tag, const std::string& name) {
    SimOp op;
    op.kind = SimOpKind::kWait;
    op.tag = tag;
    op.name = "wait " + name;
    ops_.push_back(std::move(op));
  }

  int stream(int which, double seconds, double bytes, bool async, std::string name) {
    SimOp op;
    op.kind = SimOpKind::kStream;
    op.stream = which;
    op.seconds = seconds;
    op.bytes = bytes;
    op.async = async;
    op.tag = next_tag_++;
    op.name = std::move(name);
    ops_.push_back(op);
    return op.tag;
  }
  // offload_param nvme: records (ZeroRuntime::swap_records), sub-groups of whole records and their
  // order (SwappedAdamW), each as work on the optimizer's thread; unit u's gathers wait for
  // unit_ready_[u], the tag after which every sub-group holding its piece is written.
  void optimizer_thread() {
    const size_t U = spec_.units.size(), sgs = std::max<size_t>(1, spec_.sub_group_size);
    const size_t chunk = std::max<size_t>(1024, sgs / 1024 * 1024);
    struct Record {
      size_t unit, numel;
    };
    std::vector<Record> records;
    for (size_t u = 0; u < U; ++u)
      for (size_t k = 0; k < piece(spec_.units[u]); k += chunk) records.push_back({u, std::min(chunk, piece(spec_.units[u]) - k)});
    std::vector<std::pair<size_t, size_t>> groups;  // [first, last) records
    for (size_t i = 0; i < records.size();) {
      const size_t first = i;
      size_t n = 0;
      while (i < records.size() && (i == first || n + records[i].numel <= sgs)) n += records[i++].numel;
      groups.emplace_back(first, i);
    }
    std::vector<size_t> order;
    std::vector<char> taken(groups.size(), 0);
    for (size_t pass = 0; pass < 2; ++pass)
      for (size_t g = 0; g < groups.size(); ++g) {
        bool first = false;
        for (size_t r = groups[g].first; r < groups[g].second; ++r) first = first || schedule_.persistent(records[r].unit);
        if (!taken[g] && (pass == 1 || first)) order.push_back(g), taken[g] = 1;
      }
    const double u = costs_.update_per_element, rd = costs_.disk_read_per_byte, wr = costs_.disk_write_per_byte;
    std::vector<int> tags;
    for (size_t i = 0; i < order.size(); ++i) {
      double n = 0;
      for (size_t r = groups[order[i]].first; r < groups[order[i]].second; ++r) n += static_cast<double>(records[r].numel);
      // The update beside the disk's traffic, which reads the sub-group's four states and writes
      // three back one after another (one device queue: measured, the mixed rate is not reached).
      const double t = std::max(u * n, 16 * n * rd + 12 * n * wr);
      tags.push_back(stream(2, t, 28 * n, true, "optimizer sub-group " + std::to_string(order[i])));
    }
    optimizer_end_ = tags.back();
    unit_ready_.assign(U, -1);
    std::vector<size_t> rank(groups.size());
    for (size_t i = 0; i < order.size(); ++i) rank[order[i]] = i;
    for (size_t g = 0; g < groups.size(); ++g) {
      // Written once the next sub-group is updated: the next one's tag (the last: its own).
      const int done = tags[std::min(rank[g] + 1, tags.size() - 1)];
      for (size_t r = groups[g].first; r < groups[g].second; ++r) {
        int& t = unit_ready_[records[r].unit];
        if (t < 0 || done > t) t = done;  // tags grow along the thread's order
      }
    }
  }

  void start_gather(size_t u) override {
    if (spec_.param_nvme) {  // the piece comes off the disk once the optimizer has written it
      wait(unit_ready_[u], "the optimizer's write of " + spec_.units[u].name);
      gather_[u] = stream(1, costs_.disk_read_per_byte * piece_bytes(u), piece_bytes(u), true, "read piece " + spec_.units[u].name);
      return;
    }
    if (image(u)) {  // the piece converted into its place in the view, then the two all-gathers
      compute(costs_.convert_seconds(piece_bytes(u)), "convert piece " + spec_.units[u].name);
      gather_[u] = collective(costs_.all_gather(piece_bytes(u) / 2.0), "all_gather " + spec_.units[u].name);
      if (other_bytes(u) > 0)
        other_[u] = collective(costs_.all_gather(other_bytes(u)), "all_gather f32 " + spec_.units[u].name);
      return;
    }
    gather_[u] = collective(costs_.all_gather(piece_bytes(u)), "all_gather " + spec_.units[u].name);
  }
  void finish_gather(size_t u) override {
    if (gather_[u] >= 0) wait(gather_[u], (spec_.param_nvme ? "read piece " : "all_gather ") + spec_.units[u].name);
    if (spec_.param_nvme && spec_.world > 1 && gather_[u] >= 0) {
      SimOp op;  // the all_gather of the piece just read, waited for at once
      op.kind = SimOpKind::kCollective;
      op.seconds = costs_.all_gather(piece_bytes(u));
      op.group = 0;
      op.tag = next_tag_++;
      op.name = "all_gather " + spec_.units[u].name;
      ops_.push_back(std::move(op));
    }
    gather_[u] = -1;
    if (image(u)) {  // the GEMM weights are in place; the other elements copied out of their runs
      if (other_[u] >= 0) wait(other_[u], "all_gather f32 " + spec_.units[u].name);
      other_[u] = -1;
      compute(costs_.copy_seconds(other_bytes(u)), "unpack " + spec_.units[u].name);
      return;
    }
    // The conversion reads the f32 unit and writes it in 2 bytes.
    if (spec_.low_precision) compute(costs_.convert_seconds(padded_bytes(u)), "convert " + spec_.units[u].name);
  }
  void cancel_gather(size_t u) override {
    if (gather_[u] >= 0) wait(gather_[u], "all_gather " + spec_.units[u].name);
    if (other_[u] >= 0) wait(other_[u], "all_gather f32 " + spec_.units[u].name);
    gather_[u] = other_[u] = -1;
  }
  void free_view(size_t) override {}
  // One rank's slab within its share of the cache (ZeroStepCosts::cache_bytes): its passes hot.
  bool hot(size_t u) const {
    return spec_.world == 1 && !spec_.param_nvme && costs_.cache_bytes > 0 && padded_bytes(u) <= costs_.cache_bytes;
  }
  void begin_grad_slab(size_t u) override {
    if (begun_.size() == spec_.units.size()) begun_[u] = micro_;
    const double b = padded_bytes(u);
    compute(hot(u) ? costs_.hot_zero_per_byte * b : costs_.zero_seconds(b), "zero grads " + spec_.units[u].name);
  }
  void launch_reduce(size_t u) override {
    const double b = piece_bytes(u);  // one rank: the reduction is a copy (read and written)
    reduce_.push_back(collective(hot(u) ? costs_.hot_copy_per_byte * 2.0 * b : costs_.reduce_scatter(b),
                                 "reduce_scatter " + spec_.units[u].name));
  }
  void complete_reduce(size_t u, bool) override {
    wait(reduce_.front(), "reduce_scatter " + spec_.units[u].name);
    reduce_.erase(reduce_.begin());
    if (spec_.param_nvme) {  // into the unit's record on disk (ZeroRuntime::complete_reduce)
      const std::string name = spec_.units[u].name;
      if (write_of_.count(u)) wait(write_of_[u], "gradient write " + name);
      if (on_disk_.count(u)) {  // the record holds this step's earlier sum: read it back and add
        stream(1, costs_.disk_read_per_byte * piece_bytes(u), piece_bytes(u), false, "read gradient " + name);
        compute(costs_.sum_seconds(piece_bytes(u)), "sum grads " + name);
      }
      on_disk_.insert(u);
      write_of_[u] = stream(1, costs_.disk_write_per_byte * piece_bytes(u), piece_bytes(u), true, "write gradient " + name);
      writes_.push_back(write_of_[u]);
      if (writes_.size() > 2) {  // written behind, at most two in flight
        wait(writes_.front(), "gradient write");
        writes_.erase(writes_.begin());
      }
      return;
    }
    // The sum into the shard reads two pieces and writes one.
    compute(hot(u) ? costs_.hot_sum_per_element * piece_bytes(u) / 4.0 : costs_.sum_seconds(piece_bytes(u)),
            "sum grads " + spec_.units[u].name);
  }

  const ZeroStepSpec& spec_;
  const ZeroStepCosts& costs_;
  std::vector<int> gather_;  // per unit: the gather in flight, or -1
  std::vector<int> other_;   // per unit: image(u)'s f32 gather in flight, or -1
  std::vector<int> reduce_;  // reductions in flight, oldest first
  std::vector<int> begun_;   // per unit: the micro-batch whose hooks last zeroed its slab (-1: construction)
  int micro_ = -1;
  // offload_param nvme
  std::vector<int> unit_ready_;     // per unit: the optimizer thread's tag after which its piece is written
  int optimizer_end_ = -1;
  std::map<size_t, int> write_of_;  // per unit: its latest gradient write
  std::set<size_t> on_disk_;        // units whose record holds a sum of this step (ZeroRuntime's grad_on_disk)
  std::vector<int> writes_;         // gradient writes in flight, oldest first
  int next_tag_ = 0;
  size_t shard_ = 0;
  std::vector<SimOp> ops_;
  parallel::ZeroSchedule schedule_;
};

}  // namespace

// Stage 0 (parallel/grad_sync.cpp's LocalSync and BucketedSync over GradBuckets).
std::vector<SimOp> bucketed_step(const ZeroStepSpec& spec, const ZeroStepCosts& costs) {
  const size_t U = spec.units.size();
  MT_CHECK(U > 0 && spec.micro_batches >= 1 && costs.forward.size() == U && costs.backward.size() == U,
           ErrorKind::kInvalidArgument, "step program: units, micro-batches and one time per unit");
  MT_CHECK(spec.world == 1 || costs.all_reduce, ErrorKind::kInvalidArgument, "step program: the all_reduce's cost is missing");
  size_t P = 0;
  for (const parallel::Unit& u : spec.units) P += u.numel;
  const std::vector<std::pair<size_t, size_t>> ranges = parallel::grad_bucket_ranges(P, spec.bucket_elems);
  std::vector<SimOp> ops;
  auto compute = [&ops](double s, std::string name) {
    SimOp op;
    op.seconds = s;
    op.name = std::move(name);
    ops.push_back(std::move(op));
  };
  size_t next = 0;
  std::vector<int> inflight;
  auto ready_from = [&](size_t offset) {  // GradBuckets::ready_from
    while (next < ranges.size() && ranges[next].first >= offset) {
      SimOp op;
      op.kind = SimOpKind::kCollective;
      op.group = 0;
      op.async = true;
      op.tag = static_cast<int>(next);
      op.seconds = costs.all_reduce(4.0 * static_cast<double>(ranges[next].second - ranges[next].first));
      op.name = "all_reduce bucket " + std::to_string(next);
      ops.push_back(op);
      inflight.push_back(op.tag);
      if (!spec.schedule.overlap_comm) {
        ops.push_back(SimOp{SimOpKind::kWait, 0.0, -1, op.tag, -1, false, "wait " + op.name});
        inflight.pop_back();
      }
      ++next;
    }
  };
  // A 1-bit optimizer past its warm-up keeps its gradients local (OneBitSync::grads_local) and
  // exchanges its momentum, compressed, inside the update (0/1 Adam: its gradient, or at a sync its
  // accumulated update; nothing in a local step).
  const bool onebit = spec.world > 1 && static_cast<bool>(costs.onebit_exchange);
  const bool reduce = spec.world > 1 && !onebit && !costs.local_gradients;
  const size_t last = U - 1, head = spec.tied_head ? 0 : last;
  int tp_tag = 1 << 20;  // the tp collectives' tags, apart from the buckets'
  for (int m = 0; m < spec.micro_batches; ++m) {
    const bool armed = reduce && m + 1 == spec.micro_batches;
    for (size_t u = 0; u <= last; ++u)
      emit_pass(ops, tp_tag, costs.forward[u], tp_of(costs.tp_forward, u), tp_of(costs.sp_forward, u), "forward " + spec.units[u].name);
    emit_pass(ops, tp_tag, costs.head_backward, costs.tp_head_backward.empty() ? nullptr : &costs.tp_head_backward, nullptr,
              "head backward");
    if (armed && head > 0) ready_from(spec.units[head].offset);  // the head's module hook (units past the first)
    for (size_t u = last + 1; u-- > 0;) {
      emit_pass(ops, tp_tag, costs.backward[u], tp_of(costs.tp_backward, u), tp_of(costs.sp_backward, u),
                "backward " + spec.units[u].name);
      if (armed && u > 0) ready_from(spec.units[u].offset);
    }
    if (armed) {  // GradBuckets::finish
      ready_from(0);
      for (int t : inflight) ops.push_back(SimOp{SimOpKind::kWait, 0.0, -1, t, -1, false, "wait all_reduce bucket " + std::to_string(t)});
      inflight.clear();
    }
  }
  // Gradients kept local: the ranks agree on an overflow (the engine's one-float max all-reduce)
  // before the update.
  if (spec.world > 1 && costs.local_gradients) {
    constexpr int kOverflowTag = (1 << 21) + 1;
    ops.push_back(SimOp{SimOpKind::kCollective, costs.all_reduce(4.0), -1, kOverflowTag, 0, true, "overflow all_reduce"});
    ops.push_back(SimOp{SimOpKind::kWait, 0.0, -1, kOverflowTag, -1, false, "wait overflow all_reduce"});
  }
  compute(costs.optimizer_seconds(static_cast<double>(P)), "optimizer");
  if (onebit) {
    constexpr int kExchangeTag = 1 << 21;
    ops.push_back(SimOp{SimOpKind::kCollective, costs.onebit_exchange(4.0 * static_cast<double>(P)), -1, kExchangeTag, 0, true,
                        "onebit exchange"});
    ops.push_back(SimOp{SimOpKind::kWait, 0.0, -1, kExchangeTag, -1, false, "wait onebit exchange"});
  }
  return ops;
}

SimProgram zero_step_program(const ZeroStepSpec& spec, const ZeroStepCosts& costs) {
  MT_CHECK(spec.tp >= 1, ErrorKind::kInvalidArgument, "step program: tp must be positive");
  SimProgram p;
  const std::vector<SimOp> ops = spec.schedule.stage == 0 ? bucketed_step(spec, costs) : ZeroEmitter(spec, costs).run();
  const int D = spec.world, T = spec.tp;
  p.disk_interference = costs.disk_interference;
  if (spec.one_rank) {
    p.ranks.assign(1, ops);
    for (SimOp& op : p.ranks[0])
      if (op.kind == SimOpKind::kCollective) op.group = 0;
    p.groups.push_back({0});
    return p;
  }
  // Ulysses: sp groups of S adjacent dp coordinates.
  const int S = spec.usp;
  MT_CHECK(S >= 1 && D % S == 0, ErrorKind::kInvalidArgument, "step program: Ulysses' sp must divide the world");
  // Rank d·T + t: its dp group is groups[t], its tp group groups[T + d] (T > 1), its sp group
  // groups[T + D + t·(D/S) + d/S] (S > 1; T + D counted as 1 without tp).
  for (int t = 0; t < T; ++t) {
    std::vector<int> g;
    for (int d = 0; d < D; ++d) g.push_back(d * T + t);
    p.groups.push_back(g);
  }
  const int tp_base = T, sp_base = T > 1 ? T + D : 1;
  if (T > 1)
    for (int d = 0; d < D; ++d) {
      std::vector<int> g;
      for (int t = 0; t < T; ++t) g.push_back(d * T + t);
      p.groups.push_back(g);
    }
  if (S > 1)
    for (int t = 0; t < T; ++t)
      for (int g = 0; g < D / S; ++g) {
        std::vector<int> members;
        for (int j = 0; j < S; ++j) members.push_back((g * S + j) * T + t);
        p.groups.push_back(members);
      }
  for (int d = 0; d < D; ++d)
    for (int t = 0; t < T; ++t) {
      std::vector<SimOp> mine = ops;
      for (SimOp& op : mine)
        if (op.kind == SimOpKind::kCollective)
          op.group = op.group == kTpGroup ? tp_base + d : op.group == kSpGroup ? sp_base + t * (D / S) + d / S : t;
      p.ranks.push_back(std::move(mine));
    }
  return p;
}

namespace {

// Every rank's instruction list and gradient plan (executor_grad_plan) of a pipeline's step. A
// search prices each schedule at every ZeRO stage, recompute and tp setting, and building them
// was a third of its time at thousands of micro-batches: the last few specs are remembered.
struct StepLists {
  std::vector<std::vector<parallel::pp::Instr>> lists;
  std::vector<parallel::pp::GradSendPlan> grads;
};

std::shared_ptr<const StepLists> step_lists(const parallel::pp::ScheduleSpec& s) {
  static OnceCache<std::tuple<int, int, int, int>, std::shared_ptr<const StepLists>> known(8);
  return known.get({static_cast<int>(s.kind), s.pp, s.virtual_stages, s.micro_batches}, [&] {
    auto step = std::make_shared<StepLists>();
    for (int q = 0; q < s.pp; ++q) step->lists.push_back(parallel::pp::build_schedule(s, q));
    for (int q = 0; q < s.pp; ++q) step->grads.push_back(parallel::pp::executor_grad_plan(s, step->lists, q));
    return std::shared_ptr<const StepLists>(std::move(step));
  });
}

}  // namespace

SimProgram pipeline_step_program(const PipelineStepSpec& spec, const ZeroStepCosts& costs) {
  SimProgram p;
  pipeline_step_program(spec, costs, p);
  return p;
}

void pipeline_step_program(const PipelineStepSpec& spec, const ZeroStepCosts& costs, SimProgram& p) {
  using parallel::pp::OpKind;
  const int P = spec.schedule.pp, D = spec.dp, S = static_cast<int>(spec.bounds.size()) - 1;
  const int L = static_cast<int>(costs.forward.size()) - 2;
  MT_CHECK(P >= 1 && D >= 1 && S == spec.schedule.stages() && L >= 1 && spec.bounds.front() == 0 && spec.bounds.back() == L &&
               static_cast<int>(spec.stage_params.size()) == P && costs.backward.size() == costs.forward.size(),
           ErrorKind::kInvalidArgument, "pipeline step program: bounds, stage parameters and unit costs disagree");
  MT_CHECK(spec.zero_stage == 0 || spec.zero_stage == 1, ErrorKind::kInvalidArgument,
           "pipeline step program: ZeRO stage 0 or 1");
  MT_CHECK(P == 1 || costs.send_recv, ErrorKind::kInvalidArgument, "pipeline step program: the send_recv cost is missing");
  // A unit's pass with its tensor-parallel collectives: they block the compute stream of every tp
  // rank of the stage alike, so a stage's tp ranks run one timeline and the collectives add to it.
  auto sum = [](const std::vector<double>& v) {
    double x = 0.0;
    for (double c : v) x += c;
    return x;
  };
  auto unit_seconds = [&](int u, bool backward) {
    const std::vector<double>& t = backward ? costs.backward : costs.forward;
    const std::vector<std::vector<double>>& tp = backward ? costs.tp_backward : costs.tp_forward;
    const std::vector<std::vector<double>>& sp = backward ? costs.sp_backward : costs.sp_forward;  // Ulysses
    return t[u] + (static_cast<size_t>(u) < tp.size() ? sum(tp[u]) : 0.0) + (static_cast<size_t>(u) < sp.size() ? sum(sp[u]) : 0.0);
  };
  auto chunk_seconds = [&](int q, int chunk, bool backward) {
    const int st = chunk * P + q;
    double s = 0.0;
    for (int l = spec.bounds[st]; l < spec.bounds[st + 1]; ++l) s += unit_seconds(1 + l, backward);
    if (st == 0) s += unit_seconds(0, backward);
    if (st == S - 1)
      s += unit_seconds(L + 1, backward) + (backward ? 0.0 : costs.head_backward + sum(costs.tp_head_backward));
    return s;
  };
  // The same pass as instructions: compute pieces and the tp collectives' waits (fixed), in the
  // order a zero program's emit_pass gives them, adjacent pieces of one kind merged. The same for
  // every micro-batch: built once a (rank, chunk, pass), each copy given its chunk and micro-batch.
  auto chunk_ops = [&](int q, int chunk, bool backward) {
    std::vector<SimOp> out;
    const char* name = backward ? "backward" : "forward";
    auto add = [&](double seconds, bool wait) {
      if (seconds <= 0) return;
      if (!out.empty() && out.back().fixed == wait) {
        out.back().seconds += seconds;
        return;
      }
      SimOp op;
      op.seconds = seconds;
      op.fixed = wait;
      op.label = wait ? (backward ? "tp collectives in backward" : "tp collectives in forward") : name;
      out.push_back(op);
    };
    // (The tp collectives, then Ulysses' sp ones, as emit_pass orders them.)
    auto pass = [&](double seconds, const std::vector<double>* tp, const std::vector<double>* sp = nullptr) {
      const size_t kt = tp ? tp->size() : 0, k = kt + (sp ? sp->size() : 0);
      for (size_t i = 0; i <= k; ++i) {
        add(seconds / static_cast<double>(k + 1), false);
        if (i < k) add(i < kt ? (*tp)[i] : (*sp)[i - kt], true);
      }
    };
    const std::vector<double>& t = backward ? costs.backward : costs.forward;
    const std::vector<std::vector<double>>& tp = backward ? costs.tp_backward : costs.tp_forward;
    const std::vector<std::vector<double>>& sp = backward ? costs.sp_backward : costs.sp_forward;
    auto unit = [&](int u) { pass(t[u], tp_of(tp, static_cast<size_t>(u)), tp_of(sp, static_cast<size_t>(u))); };
    const int st = chunk * P + q;
    if (st == 0 && !backward) unit(0);
    if (backward && st == S - 1) unit(L + 1);
    for (int l = 0; l < spec.bounds[st + 1] - spec.bounds[st]; ++l)
      unit(backward ? spec.bounds[st + 1] - l : 1 + spec.bounds[st] + l);
    if (!backward && st == S - 1) {
      unit(L + 1);
      pass(costs.head_backward, costs.tp_head_backward.empty() ? nullptr : &costs.tp_head_backward);
    }
    if (backward && st == 0) unit(0);
    if (out.empty()) {  // a pass of no time, as one instruction
      out.emplace_back();
      out.back().label = name;
    }
    return out;
  };
  const double message = P > 1 ? costs.send_recv(spec.boundary_bytes) : 0.0;
  const int R = spec.one_replica ? 1 : D;  // replicas simulated: rank q·R + d
  p.groups.clear();
  p.host.clear();
  p.demand.clear();
  p.host_cores = p.disk_interference = 0.0;
  for (int q = 0; q < P; ++q) {
    std::vector<int> g;
    for (int d = 0; d < R; ++d) g.push_back(q * R + d);
    p.groups.push_back(g);
  }
  p.ranks.resize(static_cast<size_t>(P) * R);
  for (std::vector<SimOp>& ops : p.ranks) ops.clear();  // their capacity kept
  const int tied_tag = 1 << 24;  // beyond the schedule's tags
  const std::shared_ptr<const StepLists> step = step_lists(spec.schedule);
  for (int q = 0; q < P; ++q) {
    const std::vector<parallel::pp::Instr>& list = step->lists[static_cast<size_t>(q)];
    const parallel::pp::GradSendPlan& grads = step->grads[static_cast<size_t>(q)];
    // [chunk][backward]: the pass's pieces (shared cores) or its one compute's time.
    const int V = spec.schedule.virtual_stages;
    std::vector<std::vector<SimOp>> pieces(static_cast<size_t>(2 * V));
    std::vector<double> pass_seconds(static_cast<size_t>(2 * V));
    size_t most = 1;
    for (int c = 0; c < V; ++c)
      for (int b = 0; b < 2; ++b) {
        pass_seconds[static_cast<size_t>(2 * c + b)] = chunk_seconds(q, c, b == 1);
        if (spec.shared_cores) {
          pieces[static_cast<size_t>(2 * c + b)] = chunk_ops(q, c, b == 1);
          most = std::max(most, pieces[static_cast<size_t>(2 * c + b)].size());
        }
      }
    for (int d = 0; d < R; ++d) {
      std::vector<SimOp>& ops = p.ranks[static_cast<size_t>(q) * R + d];
      ops.reserve(list.size() * (most + 1) + 16);
      auto compute = [&ops](double seconds, std::string name) {
        SimOp op;
        op.seconds = seconds;
        op.name = std::move(name);
        ops.push_back(std::move(op));
      };
      auto collective = [&](double seconds, std::string name) {  // blocking, over the stage's dp group
        SimOp op;
        op.kind = SimOpKind::kCollective;
        op.seconds = seconds;
        op.group = q;
        op.tag = static_cast<int>(ops.size());
        op.name = std::move(name);
        ops.push_back(std::move(op));
      };
      for (size_t j = 0; j < list.size(); ++j) {
        const parallel::pp::Instr& i = list[j];
        for (int sent : grads.wait_before[j]) {  // the executor waits for its previous gradient send
          SimOp w;
          w.kind = SimOpKind::kWait;
          w.tag = list[static_cast<size_t>(sent)].tag;
          w.label = "wait send grad";
          w.micro = list[static_cast<size_t>(sent)].micro;
          ops.push_back(w);
        }
        SimOp op;
        op.label = parallel::pp::op_name(i.kind);
        op.chunk = i.chunk;
        op.micro = i.micro;
        switch (i.kind) {
          case OpKind::kForward:
          case OpKind::kBackward: {
            const size_t at = static_cast<size_t>(2 * i.chunk + (i.kind == OpKind::kBackward ? 1 : 0));
            if (spec.shared_cores) {
              for (const SimOp& piece : pieces[at]) {
                ops.push_back(piece);
                ops.back().chunk = i.chunk;
                ops.back().micro = i.micro;
              }
              continue;
            }
            op.seconds = pass_seconds[at];
            break;
          }
          case OpKind::kSendActivation:
          case OpKind::kSendGrad:
            op.kind = SimOpKind::kSend;
            op.seconds = message;
            op.async = true;  // posted without blocking; waited for at the step's end
            op.peer = i.peer * R + d;
            op.tag = i.tag;
            break;
          case OpKind::kRecvActivation:
          case OpKind::kRecvGrad:
            op.kind = SimOpKind::kRecv;
            op.peer = i.peer * R + d;
            op.tag = i.tag;
            break;
        }
        ops.push_back(std::move(op));
      }
      if (spec.tied_elems > 0 && P > 1 && (q == 0 || q == P - 1)) {
        const int other = (q == 0 ? P - 1 : 0) * R + d;
        const double bytes = 4.0 * static_cast<double>(spec.tied_elems);
        ops.push_back(SimOp{SimOpKind::kSend, costs.send_recv(bytes), other, tied_tag, -1, true, "send tied embedding grad"});
        ops.push_back(SimOp{SimOpKind::kRecv, 0.0, other, tied_tag, -1, false, "recv tied embedding grad"});
        ops.push_back(SimOp{SimOpKind::kWait, 0.0, -1, tied_tag, -1, false, "wait send tied embedding grad"});
        compute(costs.sum_seconds(bytes), "sum tied embedding grad");
      }
      const size_t n = spec.stage_params[q], shard = (n + D - 1) / D;
      if (D > 1 && spec.zero_stage == 0) {
        const auto ranges = parallel::grad_bucket_ranges(n, spec.bucket_elems);
        for (size_t b = 0; b < ranges.size(); ++b)
          collective(costs.all_reduce(4.0 * static_cast<double>(ranges[b].second - ranges[b].first)),
                     "all_reduce bucket " + std::to_string(b));
      } else if (D > 1) {
        collective(costs.reduce_scatter(4.0 * static_cast<double>(shard)), "reduce_scatter");
      }
      compute(costs.optimizer_seconds(static_cast<double>(spec.zero_stage == 1 ? shard : n)), "optimizer");
      if (D > 1 && spec.zero_stage == 1 && spec.low_precision) {
        // The refresh in the compute dtype (parallel::gathers_in_compute_dtype; a block's norms
        // and biases, a few thousandths of it, and their f32 gathers are left out): each rank's
        // piece converted into the views, gathered in 2 bytes.
        compute(costs.convert_seconds(4.0 * static_cast<double>(shard)), "convert");
        collective(costs.all_gather(2.0 * static_cast<double>(shard)), "all_gather");
      } else {
        if (D > 1 && spec.zero_stage == 1) collective(costs.all_gather(4.0 * static_cast<double>(shard)), "all_gather");
        if (spec.zero_stage == 1 && spec.low_precision)  // the refresh's views in the compute dtype
          compute(costs.convert_seconds(4.0 * static_cast<double>(n)), "convert");
      }
    }
  }
}

}  // namespace mt::planner
