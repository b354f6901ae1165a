// The router actor's state and helpers, shared by its pieces: router.cpp (dispatch to batchers,
// recovery of a lost batcher's jobs, stats and the message handlers) and router_queue.cpp
// (enqueue, deadline sweeps, held pipeline jobs, PULL credit, cancellation, status). Internal to
// actors/.
#pragma once

#include <caf/all.hpp>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "actors/messages.hpp"
#include "actors/outcomes.hpp"
#include "actors/protocol.hpp"
#include "actors/router.hpp"
#include "core/error_code.hpp"
#include "policies/prefix_route.hpp"
#include "policies/qos.hpp"
#include "policies/retry.hpp"

namespace sy::router_detail {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

/// A pipeline job held back because its class queue was full when it arrived.
struct Held {
  Job job;
  int64_t enqueued_ms = 0;
  int64_t expiry_ms = kNever;  // the earlier of its deadline and its class queue timeout
  bool by_deadline = true;     // which of the two expiry_ms is
};

struct BatcherCredit {
  BatcherActor handle;
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
  EgressActor egress;
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
  int64_t top_rank_seen_ms = kNever;  // when a job of the most important rank last arrived
  int64_t reserve_until_ms = kNever;  // the priority reserve holds jobs back until then
  // counters (stats_atom)
  uint64_t enqueued = 0, dispatched = 0, expired = 0, cancelled = 0, rejected_full = 0,
           overflowed = 0, pull_granted = 0, requeued = 0, retired = 0, affinity_hits = 0,
           affinity_overruled = 0, lost_requeued = 0, lost_failed = 0;
  // Jobs still running on batchers that retired (they finish them before they exit), by batcher.
  std::unordered_map<caf::actor_addr, std::unordered_map<uint64_t, Job>> retiring;

  static inline const char* name = "sy.router";
};

using Self = RouterActor::stateful_base<RouterState>;

inline int64_t clock_ms(Self* self) {
  return clock_us(self) / 1000;
}

void send_out(Self* self, auto ev) {
  if (self->state.egress) self->send(self->state.egress, out_atom::value, std::move(ev));
}

// Defined in router_queue.cpp.
void report(Self* self, JobOutcome o);
void fail_job(Self* self, const Job& job, ErrorCode code, std::string message);
void push_retry(RouterState& st, Job job);
void sweep(Self* self, int64_t now_ms);
void refill(Self* self, std::size_t ci);
void grant_pull(Self* self);
void arm_timer(Self* self, int64_t now_ms);
std::optional<std::size_t> retry_first(RouterState& st);
caf::result<JobStatus> job_status(Self* self, uint64_t uid);
EnqueueReply enqueue(Self* self, Job job);
void cancel(Self* self, uint64_t uid);

// Defined in router.cpp.
void dispatch(Self* self);

}  // namespace sy::router_detail
