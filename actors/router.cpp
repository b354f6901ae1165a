// The router actor: policy::FairQueue plus the actor plumbing around it — batcher credit,
// deadline sweeps on a timer, cancellation of queued jobs, and PULL credit for pipelines.
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
#include "ingress/error_code.hpp"
#include "policies/prefix_route.hpp"

namespace sy {

std::vector<policy::PriorityClass> effective_classes(std::vector<policy::PriorityClass> classes) {
  if (classes.empty()) classes = policy::default_classes();
  return classes;
}

namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

/// A pipeline job held back because its class queue was full when it arrived.
struct Held {
  Job job;
  int64_t enqueued_ms = 0;
  int64_t expiry_ms = kNever;  // the earlier of its deadline and its class queue timeout
  bool by_deadline = true;     // which of the two expiry_ms is
};

struct BatcherCredit {
  caf::actor handle;
  uint64_t credit = 0;
  // Leading prompt blocks sent to this batcher; it goes with the entry when the batcher retires
  // or goes down, so a replacement starts cold like its real cache.
  policy::PrefixIndex index;
  // The jobs dispatched here that have not ended (finished_atom) or come back (requeue_atom):
  // what the router runs again should the batcher itself go down, since its own records die
  // with it.
  std::unordered_map<uint64_t, Job> running;
};

struct RouterState {
  RouterConfig cfg;
  RouterOptions opts;
  std::optional<policy::FairQueue> queue;
  std::unordered_map<std::string, double> weights;
  caf::actor egress;
  // Weak: admission holds the router strongly, so a strong handle back would make a cycle that
  // keeps both alive past shutdown.
  caf::actor_addr admission;
  std::unordered_map<uint64_t, Job> queued;  // jobs inside `queue`, by uid (= queue handle)
  std::vector<std::deque<Held>> overflow;    // per class, pipeline jobs only
  // Per class, jobs re-queued after an executor failure: served before the class's queue (they
  // were admitted and started long ago), never counted against its limit, never expired.
  std::vector<std::deque<Job>> retry;
  std::size_t retry_total = 0;
  std::size_t overflow_total = 0;
  std::vector<BatcherCredit> batchers;
  uint64_t credit_total = 0;
  std::optional<policy::DrainRate> drain;  // dispatches per second: how fast queues empty
  int64_t timer_at = kNever;               // earliest pending sweep tick (ms)
  uint64_t pull_outstanding = 0;
  bool draining = false;
  // counters (stats_atom)
  uint64_t enqueued = 0, dispatched = 0, expired = 0, cancelled = 0, rejected_full = 0,
           overflowed = 0, pull_granted = 0, requeued = 0, retired = 0, affinity_hits = 0,
           affinity_overruled = 0, lost_requeued = 0, lost_failed = 0;
  // Jobs still running on batchers that retired (they finish them before they exit), by batcher.
  std::unordered_map<caf::actor_addr, std::unordered_map<uint64_t, Job>> retiring;

  static inline const char* name = "sy.router";
};

using Self = caf::stateful_actor<RouterState>;

int64_t clock_ms(Self* self) {
  return clock_us(self) / 1000;
}

double weight_of(RouterState& st, const std::string& tenant) {
  auto i = st.weights.find(tenant);
  return i == st.weights.end() ? 1.0 : i->second;
}

// Deadlines are µs; the queue counts ms. Rounding up means a job is never expired before its
// deadline, at the cost of at most 1 ms of lateness.
int64_t deadline_ms_of(const Job& job) {
  return job.deadline_us > 0 ? (job.deadline_us + 999) / 1000 : 0;
}

void send_out(Self* self, auto ev) {
  if (self->state.egress) self->send(self->state.egress, out_atom::value, std::move(ev));
}

void report(Self* self, JobOutcome o) {
  if (auto a = caf::actor_cast<caf::actor>(self->state.admission))
    self->send(a, finished_atom::value, std::move(o));
}

/// Ends a job the router holds with an error: the ErrorEvent to its client, the JobOutcome to
/// admission.
void fail_job(Self* self, const Job& job, ErrorCode code, std::string message) {
  ErrorEvent e = make_error_event(job, code, std::move(message));
  JobOutcome o = make_outcome(e);
  send_out(self, std::move(e));
  report(self, std::move(o));
}

/// A job back from a batcher: ahead of its class's queue (see retry_first), FIFO among its kind.
void push_retry(RouterState& st, Job job) {
  std::size_t ci = std::min<std::size_t>(job.class_index, st.retry.size() - 1);
  st.retry[ci].push_back(std::move(job));
  ++st.retry_total;
  ++st.requeued;
}

/// A job left the queue without running: deadline_exceeded to the client and to admission.
void expire_job(Self* self, Job job, bool by_deadline, int64_t enqueued_ms, int64_t now_ms) {
  auto& st = self->state;
  ++st.expired;
  auto waited = std::max<int64_t>(0, now_ms - enqueued_ms);
  fail_job(self, job, ErrorCode::deadline_exceeded,
           by_deadline
               ? "deadline passed after " + std::to_string(waited) + " ms in the queue"
               : "queue timeout of class '" + st.queue->config(job.class_index).name + "' (" +
                     std::to_string(st.queue->config(job.class_index).queue_timeout_ms) +
                     " ms) passed");
}

/// Removes every queued or held job whose deadline or queue timeout has passed.
void sweep(Self* self, int64_t now_ms) {
  auto& st = self->state;
  for (auto& x : st.queue->expire(now_ms)) {
    auto i = st.queued.find(x.job.handle);
    if (i == st.queued.end()) continue;
    Job job = std::move(i->second);
    st.queued.erase(i);
    expire_job(self, std::move(job), x.reason == policy::ExpiryReason::deadline, x.job.enqueued_ms,
               now_ms);
  }
  if (st.overflow_total == 0) return;
  for (auto& q : st.overflow) {
    for (auto it = q.begin(); it != q.end();) {
      if (it->expiry_ms <= now_ms) {
        Held h = std::move(*it);
        it = q.erase(it);
        --st.overflow_total;
        expire_job(self, std::move(h.job), h.by_deadline, h.enqueued_ms, now_ms);
      } else {
        ++it;
      }
    }
  }
}

policy::PushResult push_queue(Self* self, Job& job, int64_t enqueued_ms) {
  auto& st = self->state;
  policy::QueuedJob q;
  q.handle = job.uid;
  q.tenant = job.tenant;
  q.tenant_weight = weight_of(st, job.tenant);
  q.cost = static_cast<uint32_t>(std::min<std::size_t>(job.prompt.size() + job.max_tokens,
                                                       std::numeric_limits<uint32_t>::max()));
  q.enqueued_ms = enqueued_ms;
  q.deadline_ms = deadline_ms_of(job);
  auto r = st.queue->push(job.class_index, std::move(q));
  if (r == policy::PushResult::accepted) st.queued.emplace(job.uid, std::move(job));
  return r;
}

/// Moves held pipeline jobs of class `ci` into its queue while there is room, oldest first.
void refill(Self* self, std::size_t ci) {
  auto& st = self->state;
  auto& q = st.overflow[ci];
  while (!q.empty() && !st.queue->full(ci)) {
    Held h = std::move(q.front());
    q.pop_front();
    --st.overflow_total;
    push_queue(self, h.job, h.enqueued_ms);
  }
}

/// Grants PULL credit so that outstanding credit plus held pipeline jobs stay within the window:
/// when class queues fill, held jobs use up the window and the gateway stops reading.
void grant_pull(Self* self) {
  auto& st = self->state;
  if (!st.egress || st.draining) return;
  uint64_t used = st.pull_outstanding + st.overflow_total;
  if (used >= st.opts.pull_window) return;
  uint64_t deficit = st.opts.pull_window - used;
  // Grant in quarter-window lumps (one message per several jobs), but never leave the gateway
  // with no credit at all.
  uint64_t lump = std::max<uint64_t>(1, st.opts.pull_window / 4);
  if (deficit < lump && st.pull_outstanding > 0) return;
  st.pull_outstanding += deficit;
  st.pull_granted += deficit;
  self->send(st.egress, pull_atom::value, static_cast<uint32_t>(deficit));
}

/// Arms the sweep timer for the earliest expiry unless an earlier tick is already pending.
void arm_timer(Self* self, int64_t now_ms) {
  auto& st = self->state;
  int64_t next = st.queue->next_expiry().value_or(kNever);
  if (st.overflow_total > 0)
    for (auto& q : st.overflow)
      for (auto& h : q) next = std::min(next, h.expiry_ms);
  if (next == kNever || next >= st.timer_at) return;
  st.timer_at = next;
  self->delayed_send(self, std::chrono::milliseconds(std::max<int64_t>(0, next - now_ms)),
                     tick_atom::value);
}

/// The class whose re-queued jobs go next: they precede every queued job of their own or a less
/// important rank. nullopt when the fair queue's next job is more important (or none waits).
std::optional<std::size_t> retry_first(RouterState& st) {
  if (st.retry_total == 0) return std::nullopt;
  std::optional<std::size_t> best;
  for (std::size_t ci = 0; ci < st.retry.size(); ++ci)
    if (!st.retry[ci].empty() &&
        (!best || st.queue->config(ci).rank < st.queue->config(*best).rank))
      best = ci;
  const int rank = st.queue->config(*best).rank;
  for (std::size_t ci = 0; ci < st.queue->class_count(); ++ci)
    if (st.queue->size(ci) > 0 && st.queue->config(ci).rank < rank) return std::nullopt;
  return best;
}

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
  self->send(best->handle, run_atom::value, std::move(job));
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
    const bool streamed = j.stream && j.client.kind == ClientRef::router;
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

uint32_t to_u32(std::size_t n) {
  return static_cast<uint32_t>(std::min<std::size_t>(n, std::numeric_limits<uint32_t>::max()));
}

/// Re-queued jobs that dispatch() serves before any queued job of rank `rank` (retry_first):
/// those of classes of that rank or a more important one.
std::size_t retries_before(const RouterState& st, int rank) {
  std::size_t n = 0;
  for (std::size_t ci = 0; ci < st.retry.size(); ++ci)
    if (st.queue->config(ci).rank <= rank) n += st.retry[ci].size();
  return n;
}

/// Jobs that will be dispatched before the waiting job `uid` were no more to arrive, or nullopt
/// when it does not wait here (it runs, or it ended). Queued: the fair queue's own order after
/// the re-queued jobs that precede it. Held (a pipeline job over its class limit): after the
/// whole class queue and the held jobs before it. Re-queued: after the jobs of more important
/// ranks and the re-queued jobs before it in its class.
std::optional<uint32_t> jobs_ahead(const RouterState& st, uint64_t uid) {
  if (auto i = st.queued.find(uid); i != st.queued.end()) {
    const int rank = st.queue->config(i->second.class_index).rank;
    return to_u32(st.queue->ahead_of(uid).value_or(0) + retries_before(st, rank));
  }
  for (std::size_t ci = 0; ci < st.overflow.size(); ++ci)
    for (std::size_t k = 0; k < st.overflow[ci].size(); ++k)
      if (st.overflow[ci][k].job.uid == uid)
        return to_u32(st.queue->position_estimate(ci) + k +
                      retries_before(st, st.queue->config(ci).rank));
  for (std::size_t ci = 0; ci < st.retry.size(); ++ci)
    for (std::size_t k = 0; k < st.retry[ci].size(); ++k)
      if (st.retry[ci][k].uid == uid) {
        const int rank = st.queue->config(ci).rank;
        std::size_t n = k;
        for (std::size_t c = 0; c < st.queue->class_count(); ++c)
          if (st.queue->config(c).rank < rank) n += st.queue->size(c) + st.retry[c].size();
        return to_u32(n);
      }
  return std::nullopt;
}

/// Answers a status request: (queued, jobs ahead, 0), or (running, 0, completion tokens so far)
/// with the count asked of the batcher that runs the job (0 when none answers).
caf::result<JobState, uint32_t, uint32_t> job_status(Self* self, uint64_t uid) {
  auto& st = self->state;
  if (auto ahead = jobs_ahead(st, uid)) return {JobState::queued, *ahead, uint32_t{0}};
  caf::actor where;
  for (const auto& b : st.batchers)
    if (b.running.count(uid)) where = b.handle;
  if (!where)
    for (const auto& [addr, jobs] : st.retiring)
      if (jobs.count(uid)) where = caf::actor_cast<caf::actor>(addr);
  if (!where) return {JobState::running, uint32_t{0}, uint32_t{0}};
  auto rp = self->make_response_promise<JobState, uint32_t, uint32_t>();
  // A batcher answers from its own state at once; the bound only covers one that is going down.
  self->request(where, std::chrono::seconds(2), status_atom::value, uid)
      .then(
          [rp](uint32_t generated) mutable {
            rp.deliver(JobState::running, uint32_t{0}, generated);
          },
          [rp](caf::error&) mutable { rp.deliver(JobState::running, uint32_t{0}, uint32_t{0}); });
  return rp;
}

/// Sweeps expired jobs, then hands out queued jobs against batcher credit, highest priority first.
void dispatch(Self* self) {
  auto& st = self->state;
  auto now_ms = clock_ms(self);
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

EnqueueReply enqueue(Self* self, Job job) {
  auto& st = self->state;
  const bool pipeline = job.client.kind == ClientRef::pipeline;
  // Every pipeline submit that reaches the router used one PULL credit, whatever the outcome.
  if (pipeline && st.pull_outstanding > 0) --st.pull_outstanding;
  if (job.class_index >= st.queue->class_count()) {
    grant_pull(self);
    return {EnqueueResult::unknown_class, 0, -1};
  }
  auto now_ms = clock_ms(self);
  auto ci = job.class_index;
  if (st.queued.count(job.uid) != 0) return {EnqueueResult::accepted, 0, -1};
  auto position = to_u32(st.queue->position_estimate(ci) + st.overflow[ci].size() +
                         retries_before(st, st.queue->config(ci).rank));
  AcceptedEvent acc;
  acc.to = job.client;
  acc.id = job.id;
  acc.tenant = job.tenant;
  const uint64_t uid = job.uid;
  if (pipeline && (st.queue->full(ci) || !st.overflow[ci].empty()) &&
      st.overflow_total < st.opts.pipeline_overflow_cap) {
    // Pipelines wait instead of being refused: the gateway read this before its credit ran out.
    Held h;
    h.enqueued_ms = now_ms;
    const auto& pc = st.queue->config(ci);
    int64_t timeout_at = pc.queue_timeout_ms > 0 ? now_ms + pc.queue_timeout_ms : kNever;
    int64_t dl = deadline_ms_of(job) > 0 ? deadline_ms_of(job) : kNever;
    h.expiry_ms = std::min(timeout_at, dl);
    h.by_deadline = dl <= timeout_at;
    h.job = std::move(job);
    st.overflow[ci].push_back(std::move(h));
    ++st.overflow_total;
    ++st.overflowed;
    ++st.enqueued;
    dispatch(self);
    return {EnqueueResult::accepted, position, -1};
  }
  auto r = push_queue(self, job, now_ms);
  if (r == policy::PushResult::accepted) {
    ++st.enqueued;
    // Where the fair queue put it, as a status request would tell (jobs_ahead).
    position = jobs_ahead(st, uid).value_or(position);
    acc.queue_position = position;
    // Sent before any dispatch so that it reaches egress ahead of the job's first chunk.
    if (acc.to.kind == ClientRef::router) send_out(self, std::move(acc));
    dispatch(self);
    return {EnqueueResult::accepted, position, -1};
  }
  if (r == policy::PushResult::duplicate) return {EnqueueResult::accepted, position, -1};
  ++st.rejected_full;
  auto retry = policy::retry_after_ms(st.queue->position_estimate(ci), st.drain->jobs_per_s(now_ms),
                                      st.opts.retry);
  grant_pull(self);
  return {EnqueueResult::full, 0, retry};
}

void cancel(Self* self, uint64_t uid) {
  auto& st = self->state;
  std::optional<Job> job;
  if (auto i = st.queued.find(uid); i != st.queued.end()) {
    st.queue->remove(uid);
    job = std::move(i->second);
    st.queued.erase(i);
  } else {
    for (auto& q : st.overflow) {
      auto it = std::find_if(q.begin(), q.end(), [&](const Held& h) { return h.job.uid == uid; });
      if (it != q.end()) {
        job = std::move(it->job);
        q.erase(it);
        --st.overflow_total;
        break;
      }
    }
  }
  if (!job) {
    for (auto& q : st.retry) {
      auto it = std::find_if(q.begin(), q.end(), [&](const Job& j) { return j.uid == uid; });
      if (it != q.end()) {
        job = std::move(*it);
        q.erase(it);
        --st.retry_total;
        break;
      }
    }
  }
  if (!job) {
    // Not queued here: running (or already ended); the batcher holding it stops it.
    for (auto& b : st.batchers) self->send(b.handle, cancel_atom::value, uid);
    return;
  }
  ++st.cancelled;
  auto now_us = clock_us(self);
  DoneEvent d = make_done(*job, FinishReason::cancelled);
  if (job->arrival_us > 0)
    d.queue_ms = d.total_ms = std::max<int64_t>(0, now_us - job->arrival_us) / 1000.0;
  JobOutcome o = make_outcome(d);
  send_out(self, std::move(d));
  report(self, std::move(o));
  dispatch(self);
}

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

caf::behavior router_actor(Self* self, RouterConfig cfg, caf::actor egress, caf::actor admission,
                           std::vector<TenantConfig> tenants, RouterOptions opts) {
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
      [self](credit_atom, const caf::actor& batcher, uint32_t n) {
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
      [self](retire_atom, const caf::actor& batcher) -> uint32_t {
        auto& s = self->state;
        auto it = std::find_if(s.batchers.begin(), s.batchers.end(),
                               [&](const BatcherCredit& b) { return b.handle == batcher; });
        if (it == s.batchers.end()) return 0;
        auto revoked = static_cast<uint32_t>(it->credit);
        s.credit_total -= it->credit;
        // Still monitored: a retiring batcher finishes its jobs first, and should it go down
        // before that, they are recovered like any other batcher's.
        if (it->running.empty())
          self->demonitor(batcher);
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
      [self](connect_atom, caf::actor& adm, const TenantWeights& w) {
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

caf::actor spawn_router(caf::actor_system& sys, RouterConfig cfg, caf::actor egress,
                        caf::actor admission, std::vector<TenantConfig> tenants,
                        RouterOptions opts) {
  // Validate here so that a bad class list throws at the caller instead of killing the actor.
  policy::FairQueue check(effective_classes(cfg.classes));
  (void)check;
  return sys.spawn(router_actor, std::move(cfg), std::move(egress), std::move(admission),
                   std::move(tenants), opts);
}

}  // namespace sy
