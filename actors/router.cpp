// The router actor: policy::FairQueue plus the actor plumbing around it — batcher credit,
// deadline sweeps on a timer, cancellation of queued jobs, and PULL credit for pipelines.
// Here: dispatch to batchers, recovery of a lost batcher's jobs, stats and the message
// handlers; the queue side is router_queue.cpp, the shared state router_state.hpp.
#include "actors/router.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <limits>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "actors/messages.hpp"
#include "actors/outcomes.hpp"
#include "actors/router_state.hpp"
#include "core/error_code.hpp"
#include "policies/prefix_route.hpp"

namespace sy {

std::vector<policy::PriorityClass> effective_classes(std::vector<policy::PriorityClass> classes) {
  if (classes.empty()) classes = policy::default_classes();
  return classes;
}

namespace router_detail {

namespace {

/// Picks the batcher for `job`: the one with the most free credit (an idle pair before a busy
/// one), or with prefix affinity the one already sent the job's prefix if it is not much busier.
std::vector<BatcherCredit>::iterator pick_batcher(RouterState& st, const Job& job) {
  auto freest = std::max_element(
      st.batchers.begin(), st.batchers.end(),
      [](const BatcherCredit& a, const BatcherCredit& b) { return a.credit < b.credit; });
  if (!st.cfg.prefix_affinity) return freest;
  const auto hashes = policy::prefix_block_hashes(job.prompt, st.cfg.block_size);
  if (hashes.empty()) return freest;  // shorter than a block: nothing a cache could share
  std::vector<policy::RouteCandidate> cands;
  cands.reserve(st.batchers.size());
  for (const auto& b : st.batchers) cands.push_back({b.credit, b.index.match(hashes)});
  const auto d = policy::choose(cands, st.cfg.prefix_affinity_slack);
  st.affinity_hits += d.by_prefix;
  st.affinity_overruled += d.overruled;
  auto best = st.batchers.begin() + static_cast<std::ptrdiff_t>(d.index);
  best->index.record(hashes);
  return best;
}

/// Sends a job to the batcher pick_batcher chooses.
void send_to_best(Self* self, Job job, int64_t now_ms) {
  auto& st = self->state;
  auto best = pick_batcher(st, job);
  --best->credit;
  --st.credit_total;
  ++st.dispatched;
  st.drain->on_completed(1, now_ms);
  best->running.insert_or_assign(job.uid, job);
  const bool urgent = urgent_class(job.class_index);
  send_urgent_if(self, urgent, best->handle, run_atom::value, std::move(job));
}

/// Forgets `uid` as running anywhere (it ended, or it is back in the router).
void forget_running(RouterState& st, uint64_t uid) {
  for (auto& b : st.batchers)
    if (b.running.erase(uid)) return;
  for (auto& [addr, jobs] : st.retiring)
    if (jobs.erase(uid)) return;
}

/// A batcher went down with jobs it had neither ended nor sent back (it crashed itself; an
/// executor failure sends them back first). Jobs whose client saw no streamed chunk run again
/// ahead of their class, as after an executor failure; a streamed job cannot be resumed without
/// repeating or losing text the client may already have, so it ends with engine_dead, as does a
/// job past its retries.
void recover_lost(Self* self, std::unordered_map<uint64_t, Job> jobs, const caf::error& reason) {
  auto& st = self->state;
  if (jobs.empty()) return;
  std::vector<Job> order;
  order.reserve(jobs.size());
  for (auto& [uid, j] : jobs) order.push_back(std::move(j));
  // Oldest first, so that re-queued jobs keep their arrival order.
  std::sort(order.begin(), order.end(),
            [](const Job& a, const Job& b) { return a.arrival_us < b.arrival_us; });
  const std::string why = self->system().render(reason);
  uint64_t back = 0, failed = 0;
  for (Job& j : order) {
    const bool streamed = j.stream && is_connected(j.client);
    ++j.attempt;
    if (streamed || j.attempt > st.cfg.max_job_retries) {
      fail_job(self, j, ErrorCode::engine_dead,
               streamed ? "the batcher running this streamed job stopped (" + why +
                              "); output already streamed cannot be resumed"
                        : "the batcher running this job stopped (" + why + ") " +
                              std::to_string(j.attempt) + " times");
      ++failed;
      continue;
    }
    push_retry(st, std::move(j));
    ++back;
  }
  st.lost_requeued += back;
  st.lost_failed += failed;
  log_line("router: a batcher went down (" + why + ") holding " + std::to_string(order.size()) +
           " jobs: " + std::to_string(back) + " re-queued, " + std::to_string(failed) +
           " ended with engine_dead");
}

}  // namespace

namespace {
bool anything_running(const RouterState& st) {
  for (const auto& b : st.batchers)
    if (!b.running.empty()) return true;
  for (const auto& [addr, jobs] : st.retiring)
    if (!jobs.empty()) return true;
  return false;
}
}  // namespace

/// Sweeps expired jobs, then hands out queued jobs against batcher credit, highest priority first.
void dispatch(Self* self) {
  auto& st = self->state;
  auto now_ms = clock_ms(self);
  st.reserve_until_ms = kNever;
  sweep(self, now_ms);
  for (std::size_t ci = 0; ci < st.overflow.size(); ++ci) refill(self, ci);
  while (st.credit_total > 0 && (st.retry_total > 0 || !st.queue->empty())) {
    if (auto ci = retry_first(st)) {
      Job job = std::move(st.retry[*ci].front());
      st.retry[*ci].pop_front();
      --st.retry_total;
      send_to_best(self, std::move(job), now_ms);
      continue;
    }
    // The priority reserve: while the most important rank is in use, a less important job
    // leaves the last priority_reserve credits free for it; never on an idle server (nothing
    // running), and a tick comes when the reserve lapses.
    if (const auto rank = st.queue->next_rank();
        rank && *rank != st.queue->top_rank() && st.credit_total <= st.cfg.priority_reserve &&
        st.top_rank_seen_ms != kNever && now_ms - st.top_rank_seen_ms < kPriorityReserveMs &&
        anything_running(st)) {
      st.reserve_until_ms = st.top_rank_seen_ms + kPriorityReserveMs;
      break;
    }
    auto d = st.queue->pop();
    if (!d) break;
    auto i = st.queued.find(d->job.handle);
    if (i == st.queued.end()) continue;
    Job job = std::move(i->second);
    st.queued.erase(i);
    send_to_best(self, std::move(job), now_ms);
    refill(self, d->class_index);
  }
  arm_timer(self, now_ms);
  grant_pull(self);
}

namespace {

RouterStats stats(Self* self) {
  auto& st = self->state;
  RouterStats s;
  auto n = [](auto v) { return static_cast<int64_t>(v); };
  s.enqueued = n(st.enqueued);
  s.dispatched = n(st.dispatched);
  s.expired = n(st.expired);
  s.cancelled = n(st.cancelled);
  s.rejected_full = n(st.rejected_full);
  s.overflowed = n(st.overflowed);
  s.queued = n(st.queue->size());
  s.overflow = n(st.overflow_total);
  s.credit = n(st.credit_total);
  s.pull_outstanding = n(st.pull_outstanding);
  s.pull_granted = n(st.pull_granted);
  s.batchers = n(st.batchers.size());
  s.requeued = n(st.requeued);
  s.retry_queued = n(st.retry_total);
  s.retired = n(st.retired);
  s.lost_requeued = n(st.lost_requeued);
  s.lost_failed = n(st.lost_failed);
  std::size_t tracked = 0;
  for (const auto& b : st.batchers) tracked += b.running.size();
  for (const auto& [addr, jobs] : st.retiring) tracked += jobs.size();
  s.running_tracked = n(tracked);
  s.waiting_total = n(st.queue->size() + st.overflow_total + st.retry_total);
  // The age of the oldest waiting job (the autoscaler's queue-wait signal). arrival_us is the
  // gateway's steady clock, the same as now_us().
  int64_t oldest = 0;
  auto see = [&](const Job& j) {
    if (j.arrival_us > 0 && (oldest == 0 || j.arrival_us < oldest)) oldest = j.arrival_us;
  };
  for (const auto& kv : st.queued) see(kv.second);
  for (const auto& q : st.overflow)
    for (const auto& h : q) see(h.job);
  for (const auto& q : st.retry)
    for (const auto& j : q) see(j);
  s.oldest_wait_ms = oldest ? std::max<int64_t>(0, now_us() - oldest) / 1000 : 0;
  for (std::size_t ci = 0; ci < st.queue->class_count(); ++ci)
    s.queued_by_class[st.queue->config(ci).name] = n(st.queue->size(ci) + st.overflow[ci].size());
  s.affinity_hits = n(st.affinity_hits);
  s.affinity_overruled = n(st.affinity_overruled);
  std::size_t indexed = 0;
  for (const auto& b : st.batchers) indexed += b.index.size();
  s.affinity_indexed = n(indexed);
  return s;
}

RouterActor::behavior_type router_actor(Self* self, RouterConfig cfg, EgressActor egress,
                                        AdmissionActor admission, std::vector<TenantConfig> tenants,
                                        RouterOptions opts) {
  auto& st = self->state;
  cfg.classes = effective_classes(std::move(cfg.classes));
  st.queue.emplace(cfg.classes);
  st.overflow.resize(cfg.classes.size());
  st.retry.resize(cfg.classes.size());
  st.cfg = std::move(cfg);
  st.opts = opts;
  st.egress = std::move(egress);
  st.admission = admission.address();
  for (auto& t : tenants)
    if (t.weight > 0) st.weights[t.name] = t.weight;
  st.drain.emplace(clock_ms(self), opts.retry);
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& s = self->state;
    std::unordered_map<uint64_t, Job> lost;
    auto it = std::find_if(s.batchers.begin(), s.batchers.end(),
                           [&](const BatcherCredit& b) { return b.handle.address() == dm.source; });
    if (it != s.batchers.end()) {
      s.credit_total -= it->credit;
      lost = std::move(it->running);
      s.batchers.erase(it);
    } else if (auto r = s.retiring.find(dm.source); r != s.retiring.end()) {
      lost = std::move(r->second);
      s.retiring.erase(r);
    } else {
      return;
    }
    // Whatever is left was neither ended nor sent back before the batcher went: its notices to
    // the router precede its down message (one sender, one receiver: CAF keeps their order).
    recover_lost(self, std::move(lost), dm.reason);
    dispatch(self);
  });
  grant_pull(self);
  return {
      [self](enqueue_atom, Job& job) { return enqueue(self, std::move(job)); },
      [self](credit_atom, const BatcherActor& batcher, uint32_t n) {
        auto& s = self->state;
        if (!batcher) return;
        auto it = std::find_if(s.batchers.begin(), s.batchers.end(),
                               [&](const BatcherCredit& b) { return b.handle == batcher; });
        if (it == s.batchers.end()) {
          self->monitor(batcher);
          s.batchers.push_back({batcher, 0, policy::PrefixIndex(s.opts.prefix_index_capacity), {}});
          it = s.batchers.end() - 1;
        }
        it->credit += n;
        s.credit_total += n;
        dispatch(self);
      },
      [self](cancel_atom, uint64_t uid) { cancel(self, uid); },
      [self](release_atom, uint64_t program) {
        for (auto& b : self->state.batchers) self->send(b.handle, release_atom::value, program);
      },
      [self](finished_atom, const std::vector<uint64_t>& uids) {
        for (uint64_t uid : uids) forget_running(self->state, uid);
      },
      [self](requeue_atom, std::vector<Job>& jobs) {
        auto& s = self->state;
        for (Job& j : jobs) {
          forget_running(s, j.uid);
          if (s.queued.count(j.uid)) continue;  // already back (a duplicate requeue)
          push_retry(s, std::move(j));
        }
        dispatch(self);
      },
      [self](retire_atom, const BatcherActor& batcher) -> uint32_t {
        auto& s = self->state;
        auto it = std::find_if(s.batchers.begin(), s.batchers.end(),
                               [&](const BatcherCredit& b) { return b.handle == batcher; });
        if (it == s.batchers.end()) return 0;
        auto revoked = static_cast<uint32_t>(it->credit);
        s.credit_total -= it->credit;
        // Still monitored: a retiring batcher finishes its jobs first, and should it go down
        // before that, they are recovered like any other batcher's.
        if (it->running.empty())
          self->demonitor(batcher.address());
        else
          s.retiring[batcher.address()] = std::move(it->running);
        s.batchers.erase(it);
        ++s.retired;
        return revoked;
      },
      [self](status_atom, uint64_t uid) { return job_status(self, uid); },
      [self](pull_atom, uint32_t n) {
        auto& s = self->state;
        s.pull_outstanding -= std::min<uint64_t>(n, s.pull_outstanding);
        grant_pull(self);
      },
      [self](connect_atom, const AdmissionActor& adm, const TenantWeights& w) {
        auto& s = self->state;
        s.admission = adm.address();
        for (std::size_t i = 0; i < w.names.size() && i < w.weights.size(); ++i)
          if (w.weights[i] > 0) s.weights[w.names[i]] = w.weights[i];
      },
      [self](drain_atom) { self->state.draining = true; },
      // The operator's drain and resume: PULL credit stops, or starts again.
      [self](drain_atom, bool on) {
        self->state.draining = on;
        if (!on) grant_pull(self);
      },
      [self](tick_atom) {
        self->state.timer_at = kNever;
        dispatch(self);
      },
      [self](stats_atom) { return stats(self); },
  };
}

}  // namespace

}  // namespace router_detail

RouterActor spawn_router(caf::actor_system& sys, RouterConfig cfg, EgressActor egress,
                         AdmissionActor admission, std::vector<TenantConfig> tenants,
                         RouterOptions opts) {
  // Validate here so that a bad class list throws at the caller instead of killing the actor.
  policy::FairQueue check(effective_classes(cfg.classes));
  (void)check;
  return sys.spawn(router_detail::router_actor, std::move(cfg), std::move(egress),
                   std::move(admission), std::move(tenants), opts);
}

}  // namespace sy
