#include "parallel/zero/schedule.h"

#include <algorithm>

namespace mt::parallel {

ZeroSchedule::ZeroSchedule(const std::vector<Unit>& units, const ZeroScheduleOptions& options, ZeroEffects& effects)
    : units_(units), opts_(options), fx_(effects), state_(units.size()) {}

bool ZeroSchedule::persistent(size_t u) const {
  return opts_.stage < 3 || units_[u].numel <= opts_.persistence_threshold;
}

void ZeroSchedule::construct() {
  for (size_t u = 0; u < units_.size(); ++u) {
    if (persistent(u)) {
      finish_gather(u);
    } else {
      fx_.free_view(u);
    }
    if (opts_.stage == 1) fx_.begin_grad_slab(u);  // stage 1 keeps every slab
  }
}

void ZeroSchedule::count_live(size_t u) {
  if (state_[u].counted) return;
  state_[u].counted = true;
  live_elems_ += units_[u].numel;
  peak_live_elems_ = std::max(peak_live_elems_, live_elems_);
}

void ZeroSchedule::start_gather(size_t u) {
  if (state_[u].gathering) return;
  fx_.start_gather(u);
  state_[u].gathering = true;
  count_live(u);
}

void ZeroSchedule::finish_gather(size_t u) {
  fx_.finish_gather(u);
  state_[u].gathering = false;
  count_live(u);
  state_[u].live = true;
}

void ZeroSchedule::acquire(size_t u) {
  State& s = state_[u];
  ++s.refs;
  if (!s.live) {
    start_gather(u);
    finish_gather(u);
  } else if (s.gathering) {
    finish_gather(u);
  }
  maybe_prefetch(u);
}

void ZeroSchedule::release(size_t u) {
  State& s = state_[u];
  if (s.refs > 0) --s.refs;
  if (s.refs > 0 || persistent(u)) return;
  fx_.free_view(u);
  s.live = false;
  if (s.counted) live_elems_ -= units_[u].numel;
  s.counted = false;
}

// Stage 3: the next unit in the pass's direction, when it fits the prefetch size and the window.
void ZeroSchedule::maybe_prefetch(size_t u) {
  if (opts_.stage < 3) return;
  size_t next;
  if (backward_phase_) {
    if (u == 0) return;
    next = u - 1;
  } else {
    next = u + 1;
    if (next >= units_.size()) return;
  }
  const State& s = state_[next];
  if (persistent(next) || s.live || s.gathering) return;
  size_t n = units_[next].numel;
  if (n > opts_.prefetch_elems || live_elems_ + n > opts_.max_live_elems) return;
  start_gather(next);  // bound when acquire() completes it
}

void ZeroSchedule::begin_grads(size_t u) {
  // A unit used twice in a pass (a tied or untied head and its norm/embedding): its previous
  // reduction must finish before the slab is reused.
  for (size_t i = pending_.size(); i-- > 0;)
    if (pending_[i] == u) {
      wait_reductions(pending_.size() - i - 1);
      break;
    }
  fx_.begin_grad_slab(u);
}

void ZeroSchedule::reduce_grads(size_t u) {
  if (reduced_.size() != units_.size()) reduced_.assign(units_.size(), false);
  reduced_[u] = true;
  fx_.launch_reduce(u);
  pending_.push_back(u);
  wait_reductions(opts_.overlap_comm ? 1 : 0);
}

void ZeroSchedule::wait_reductions(size_t keep) {
  while (pending_.size() > keep) {
    fx_.complete_reduce(pending_.front(), opts_.stage >= 2);
    pending_.pop_front();
  }
}

void ZeroSchedule::on_hook(size_t u, bool pre, bool forward) {
  fx_.progress();
  while (!pending_.empty() && fx_.oldest_reduce_done()) {
    fx_.complete_reduce(pending_.front(), opts_.stage >= 2);
    pending_.pop_front();
  }
  const size_t last = units_.size() - 1;
  if (forward && pre) {
    if (u == 0) backward_phase_ = false;
    if (opts_.stage == 3) acquire(u);
  } else if (forward) {
    if (opts_.stage == 3) {
      // A forward inside backward (recompute) keeps the view for the backward that follows.
      if (backward_phase_) {
        if (state_[u].refs > 0) --state_[u].refs;
      } else {
        release(u);
      }
    }
  } else if (pre) {
    backward_phase_ = true;
    if (opts_.stage >= 2) reduce_deferred_tail(u);
    if (opts_.stage == 3) acquire(u);
    if (deferred_.size() != units_.size()) deferred_.assign(units_.size(), false);
    // A unit's second use in this backward adds to the slab its first use filled.
    if (opts_.stage >= 2 && !deferred_[u]) begin_grads(u);
  } else {
    // Stage 1 reduces a block's gradients during the last micro-batch's backward (used once);
    // the embeddings and tail (used twice when tied) wait for finish_backward(). Stages 2-3 reduce
    // a block at once, and the embeddings and tail once their uses are done: they reduced at every
    // use, the embeddings' unit twice a micro-batch with a tied head, the tail twice with an
    // untied one (the same sums, 16 % more gradient traffic on a probe's model, stop 74).
    if (opts_.stage >= 2) {
      if (u == 0 || u == last) {
        if (deferred_.size() != units_.size()) deferred_.assign(units_.size(), false);
        deferred_[u] = true;
      } else {
        reduce_grads(u);
      }
    } else if (last_micro_ && u != 0 && u != last) {
      reduce_grads(u);
    }
    if (opts_.stage == 3) release(u);
  }
}

void ZeroSchedule::reduce_deferred_tail(size_t now) {
  const size_t last = units_.size() - 1;
  if (last == 0 || now == last || deferred_.size() != units_.size() || !deferred_[last]) return;
  deferred_[last] = false;
  reduce_grads(last);
}

void ZeroSchedule::finish_backward() {
  if (opts_.stage >= 2 && deferred_.size() == units_.size())
    for (size_t u = units_.size(); u-- > 0;)
      if (deferred_[u]) {
        deferred_[u] = false;
        reduce_grads(u);
      }
  // Stage 1: whatever the last micro-batch's backward did not reduce (the embeddings and tail,
  // used twice when tied; every unit when the caller ends a pipeline step without a backward).
  if (opts_.stage == 1 && last_micro_) {
    if (reduced_.size() != units_.size()) reduced_.assign(units_.size(), false);
    for (size_t u = units_.size(); u-- > 0;)
      if (!reduced_[u]) reduce_grads(u);
  }
  wait_reductions(0);
  reduced_.assign(units_.size(), false);
}

void ZeroSchedule::refresh() {
  wait_reductions(0);
  // Stage 3: views gathered before this step (prefetched, unused) hold old values: drop them.
  for (size_t u = 0; u < units_.size(); ++u) {
    State& s = state_[u];
    if (persistent(u)) continue;
    if (s.gathering) {
      fx_.cancel_gather(u);
      s.gathering = false;
    }
    if (s.live || s.counted) {
      s.refs = 0;
      release(u);
    }
  }
  // Two gathers in flight at a time: the next one overlaps the unpacking of this one, and the
  // f32 staging never holds more than two units.
  std::vector<size_t> order;
  for (size_t u = 0; u < units_.size(); ++u)
    if (persistent(u)) order.push_back(u);
  for (size_t i = 0; i < order.size(); ++i) {
    start_gather(order[i]);
    if (i > 0) finish_gather(order[i - 1]);
  }
  if (!order.empty()) finish_gather(order.back());
}

}  // namespace mt::parallel
