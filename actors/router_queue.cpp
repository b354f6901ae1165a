// The router's queue side: enqueue into the fair queue or the pipeline overflow, deadline and
// queue-timeout sweeps on a timer, PULL credit, re-queued jobs, cancellation and status answers.
#include <algorithm>
#include <chrono>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "actors/messages.hpp"
#include "actors/outcomes.hpp"
#include "actors/router_state.hpp"
#include "core/error_code.hpp"

namespace sy::router_detail {

namespace {

double weight_of(RouterState& st, const std::string& tenant) {
  auto i = st.weights.find(tenant);
  return i == st.weights.end() ? 1.0 : i->second;
}

// Deadlines are µs; the queue counts ms. Rounding up means a job is never expired before its
// deadline, at the cost of at most 1 ms of lateness.
int64_t deadline_ms_of(const Job& job) {
  return job.deadline_us > 0 ? (job.deadline_us + 999) / 1000 : 0;
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

policy::PushResult push_queue(Self* self, Job& job, int64_t enqueued_ms) {
  auto& st = self->state;
  policy::QueuedJob q;
  q.handle = job.uid;
  q.tenant = job.tenant;
  q.tenant_weight = weight_of(st, job.tenant);
  q.cost = job_token_cost(job);
  q.enqueued_ms = enqueued_ms;
  q.deadline_ms = deadline_ms_of(job);
  const bool top = st.queue->config(job.class_index).rank == st.queue->top_rank();
  auto r = st.queue->push(job.class_index, std::move(q));
  if (r == policy::PushResult::accepted) {
    if (top) st.top_rank_seen_ms = enqueued_ms;
    st.queued.emplace(job.uid, std::move(job));
  }
  return r;
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

}  // namespace

void report(Self* self, JobOutcome o) {
  if (auto a = caf::actor_cast<AdmissionActor>(self->state.admission))
    self->send(a, finished_atom::value, std::move(o));
}

/// Ends a job the router holds with an error: the ErrorEvent to its client, the JobOutcome to
/// admission.
void fail_job(Self* self, const Job& job, ErrorCode code, std::string message) {
  ErrorEvent e = make_error_event(job, code, std::move(message));
  JobOutcome o = make_outcome(e);
  // A program's step job: its program (in admission) answers the client, not the step.
  if (!job.is_step()) send_out(self, std::move(e));
  report(self, std::move(o));
}

/// A job back from a batcher: ahead of its class's queue (see retry_first), FIFO among its kind.
void push_retry(RouterState& st, Job job) {
  std::size_t ci = std::min<std::size_t>(job.class_index, st.retry.size() - 1);
  st.retry[ci].push_back(std::move(job));
  ++st.retry_total;
  ++st.requeued;
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
  next = std::min(next, st.reserve_until_ms);
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

/// Answers a status request: (queued, jobs ahead, 0), or (running, 0, completion tokens so far)
/// with the count asked of the batcher that runs the job (0 when none answers).
caf::result<JobStatus> job_status(Self* self, uint64_t uid) {
  auto& st = self->state;
  if (auto ahead = jobs_ahead(st, uid)) return JobStatus{JobState::queued, *ahead, 0};
  BatcherActor where;
  for (const auto& b : st.batchers)
    if (b.running.count(uid)) where = b.handle;
  if (!where)
    for (const auto& [addr, jobs] : st.retiring)
      if (jobs.count(uid)) where = caf::actor_cast<BatcherActor>(addr);
  if (!where) return JobStatus{JobState::running, 0, 0};
  auto rp = self->make_response_promise<JobStatus>();
  // A batcher answers from its own state at once; the bound only covers one that is going down.
  self->request(where, std::chrono::seconds(2), status_atom::value, uid)
      .then(
          [rp](uint32_t generated) mutable {
            rp.deliver(JobStatus{JobState::running, 0, generated});
          },
          [rp](caf::error&) mutable {
            rp.deliver(JobStatus{JobState::running, 0, 0});
          });
  return rp;
}

EnqueueReply enqueue(Self* self, Job job) {
  auto& st = self->state;
  const bool pipeline = uses_pull_credit(job.client);  // cluster jobs count like pipeline ones
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
  const bool step = job.is_step();  // a program's step: its program was accepted, not the step
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
    // Sent before any dispatch, by the way and at the priority of the job's chunks, so that it
    // reaches egress ahead of the first one; not for a replayed job whose connection is gone
    // (egress would try that empty address, and a failed delivery cancels the job).
    if (is_connected(acc.to) && !is_orphan(acc.to) && !step) {
      const auto& to = st.opts.direct_egress ? st.opts.direct_egress : st.egress;
      if (to) send_urgent_if(self, urgent_class(ci), to, out_atom::value, std::move(acc));
    }
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
  if (!job->is_step()) send_out(self, std::move(d));
  report(self, std::move(o));
  dispatch(self);
}

}  // namespace sy::router_detail
