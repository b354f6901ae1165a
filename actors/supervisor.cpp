// The supervisor actor (see supervisor.hpp): pair lifecycle (spawn, retire, replace), the
// autoscaling tick, and the crash-recovery bookkeeping (failures, re-queues, recovery times).
#include "actors/supervisor.hpp"

#include <algorithm>
#include <caf/all.hpp>
#include <chrono>
#include <optional>
#include <set>
#include <string>

#include "actors/batcher.hpp"
#include "actors/messages.hpp"
#include "actors/outcomes.hpp"
#include "model/llama.hpp"

namespace sy {
namespace {

struct Pair {
  uint64_t id = 0;
  BatcherActor batcher;
  ExecutorActor executor;
  int slot = 0;
  bool retiring = false;
  bool failed = false;  // its batcher reported an executor failure
};

struct SupervisorState {
  SupervisorConfig cfg;
  SupervisorWiring w;
  ControlActor control;
  std::vector<Pair> pairs;
  policy::AutoscaleState scale;
  uint64_t next_id = 1;
  bool fault_flags_used = false;  // the test fault flags went to the first executor already
  bool tick_busy = false;         // a stats round is in progress
  std::string start_error;        // why the last executor could not be built ("" if none failed)
  std::set<int64_t> recovered;    // faults (by fault_us) whose first re-queued job ran again
  // failures = failures_crash + failures_hang (metrics label them by reason).
  int64_t failures_crash = 0, failures_hang = 0;
  int64_t scale_ups = 0, scale_downs = 0, failures = 0, replacements = 0, requeued = 0,
          failed_jobs = 0, recoveries = 0, recovery_ms_last = -1, recovery_ms_max = -1,
          detect_ms_last = -1;

  static inline const char* name = "sy.supervisor";
};

using Self = SupervisorActor::stateful_base<SupervisorState>;

int active_count(const SupervisorState& st) {
  return static_cast<int>(
      std::count_if(st.pairs.begin(), st.pairs.end(), [](const Pair& p) { return !p.retiring; }));
}

void notify_control(Self* self) {
  auto& st = self->state;
  if (!st.control) return;
  std::vector<BatcherActor> bs;
  for (const Pair& p : st.pairs)
    if (!p.retiring) bs.push_back(p.batcher);
  self->send(st.control, connect_atom::value, std::move(bs));
}

// A free slot index (slots are where pairs may run: CPU slots or one per device).
int free_slot(const SupervisorState& st) {
  for (size_t i = 0; i < st.cfg.slots.size(); ++i) {
    const bool used = std::any_of(st.pairs.begin(), st.pairs.end(),
                                  [&](const Pair& p) { return p.slot == static_cast<int>(i); });
    if (!used) return static_cast<int>(i);
  }
  return -1;
}

void log(Self* self, const std::string& line) {
  (void)self;
  log_line("supervisor: " + line);
}

bool spawn_pair(Self* self) {
  auto& st = self->state;
  const int slot = free_slot(st);
  if (slot < 0) return false;  // every slot busy (retiring pairs still hold theirs)
  ExecutorSpec spec = st.cfg.executor;
  const bool first = !st.fault_flags_used;
  if (st.fault_flags_used) {
    spec.test_fault_throw_after = 0;
    spec.test_fault_hang_after = 0;
  }
  st.fault_flags_used = true;
  // A device slot names its device; the CPU backend ignores it (slot.device is -1 there).
  spec.device = st.cfg.slots[static_cast<size_t>(slot)].device;
  // The pair's own flag for stopping the step in flight (BatchingConfig::urgent_interrupt).
  spec.interrupt = std::make_shared<std::atomic<bool>>(false);
  Pair p;
  p.id = st.next_id++;
  p.slot = slot;
  spec.thread_name = "sy.exec." + std::to_string(p.id);
  int32_t n_blocks = st.cfg.n_blocks;  // 0: the engine sizes its pool from device memory
  try {
    p.executor = st.cfg.make_executor ? st.cfg.make_executor(self->system(), spec, &n_blocks)
                                      : spawn_executor(self->system(), spec, &n_blocks);
  } catch (const std::exception& e) {
    // An engine that cannot be built (the model or its KV cache does not fit the device, no
    // device) must not take the supervisor down: at start-up the server reports it and exits,
    // later (a scale-up, a replacement) it is logged and the pair is simply not added.
    st.start_error = e.what();
    log(self, std::string("executor could not start: ") + e.what());
    return false;
  }
  if (st.cfg.n_blocks == 0)
    log(self, "executor on device " + std::to_string(spec.device) + ": " +
                  std::to_string(n_blocks) + " KV blocks of " +
                  std::to_string(st.cfg.batching.kv_block_size) + " tokens, K/V " +
                  kernels::kv_type_name(st.cfg.batching.kv_dtype) +
                  " (sized from the device's free memory)");
  BatcherExtras extras;
  extras.supervisor = SupervisorActor(self);
  extras.pair = p.id;
  extras.window_blocks = spec.n_window_blocks;  // the engine's window group, if it has one
  extras.draft_model = spec.draft_model != nullptr;
  extras.direct_egress = st.w.direct_egress;
  extras.interrupt = spec.interrupt;
  if (first) extras.test_fault_throw_after = st.cfg.test_fault_batcher_throw_after;
  p.batcher = spawn_batcher(self->system(), st.cfg.batching, st.w.model, p.executor, st.w.router,
                            st.w.egress, st.w.admission, n_blocks, extras);
  self->monitor(p.batcher);
  // With its slot: the metrics label a replacement like the pair it replaces.
  if (st.w.metrics)
    self->send(st.w.metrics, observe_atom::value, p.batcher, p.executor,
               static_cast<int32_t>(p.slot));
  st.pairs.push_back(std::move(p));
  return true;
}

void add_pairs(Self* self, int n, const std::string& reason, bool count_as_scale) {
  int added = 0;
  for (int i = 0; i < n; ++i)
    if (spawn_pair(self)) ++added;
  if (added == 0) return;
  if (count_as_scale) self->state.scale_ups += added;
  log(self, std::string(count_as_scale ? "scale up +" : "started +") + std::to_string(added) +
                " -> " + std::to_string(active_count(self->state)) + " executors (" + reason + ")");
  notify_control(self);
}

void retire_pair(Self* self, uint64_t id, const std::string& reason) {
  auto& st = self->state;
  auto it =
      std::find_if(st.pairs.begin(), st.pairs.end(), [&](const Pair& p) { return p.id == id; });
  if (it == st.pairs.end() || it->retiring) return;
  it->retiring = true;
  ++st.scale_downs;
  self->send(it->batcher, retire_atom::value);
  log(self, "scale down: retiring executor " + std::to_string(id) + " -> " +
                std::to_string(active_count(st)) + " executors (" + reason + ")");
  notify_control(self);
}

// Asks every batcher in `to` for its stats; `done` gets the answers (nullopt for failures and
// timeouts) once all are in.
template <class F>
void gather(Self* self, std::vector<BatcherActor> to, F done) {
  struct Round {
    std::vector<std::optional<BatcherStats>> out;
    size_t owed = 0;
    F done;
  };
  auto r = std::make_shared<Round>(
      Round{std::vector<std::optional<BatcherStats>>(to.size()), to.size(), done});
  if (to.empty()) {
    r->done(r->out);
    return;
  }
  const auto timeout = std::chrono::milliseconds(self->state.cfg.ask_timeout_ms);
  for (size_t i = 0; i < to.size(); ++i) {
    self->request(to[i], timeout, stats_atom::value)
        .then(
            [r, i](BatcherStats& s) {
              r->out[i] = std::move(s);
              if (--r->owed == 0) r->done(r->out);
            },
            [r](caf::error&) {
              if (--r->owed == 0) r->done(r->out);
            });
  }
}

void arm_tick(Self* self) {
  self->delayed_send(self,
                     std::chrono::milliseconds(std::max<int64_t>(1, self->state.cfg.interval_ms)),
                     scale_atom::value);
}

void decide_scale(Self* self, const RouterStats& router, const std::vector<uint64_t>& ids,
                  const std::vector<std::optional<BatcherStats>>& s);

void tick(Self* self) {
  auto& st = self->state;
  if (st.tick_busy) return;
  st.tick_busy = true;
  std::vector<BatcherActor> to;
  std::vector<uint64_t> ids;
  for (const Pair& p : st.pairs) {
    to.push_back(p.batcher);
    ids.push_back(p.id);
  }
  // The router first (its queue is the scale-up signal), then every batcher.
  const auto timeout = std::chrono::milliseconds(st.cfg.ask_timeout_ms);
  auto decide = [self, to, ids](const RouterStats& r) {
    gather(self, to, [self, ids, r](const std::vector<std::optional<BatcherStats>>& s) {
      decide_scale(self, r, ids, s);
    });
  };
  self->request(st.w.router, timeout, stats_atom::value)
      .then([decide](RouterStats& r) { decide(r); },
            // No answer: an empty queue as far as this round knows.
            [decide](caf::error&) { decide(RouterStats{}); });
}

void decide_scale(Self* self, const RouterStats& router, const std::vector<uint64_t>& ids,
                  const std::vector<std::optional<BatcherStats>>& s) {
  auto& st = self->state;
  st.tick_busy = false;
  const int64_t now = clock_us(self);
  policy::AutoscaleSnapshot snap;
  snap.now_ms = now / 1000;
  snap.queued = static_cast<uint64_t>(std::max<int64_t>(0, router.waiting_total));
  snap.queue_wait_ms = router.oldest_wait_ms;
  for (size_t i = 0; i < ids.size(); ++i) {
    // A pair gone meanwhile, or one that did not answer, is left out of this decision.
    auto it = std::find_if(st.pairs.begin(), st.pairs.end(),
                           [&](const Pair& p) { return p.id == ids[i]; });
    if (it == st.pairs.end()) continue;
    policy::ExecutorLoad l;
    l.id = ids[i];
    l.retiring = it->retiring;
    const std::optional<BatcherStats>& b = s[i];
    if (!b) {
      l.ongoing = 1;  // unknown: treated as busy, never retired on a missing answer
    } else {
      l.ongoing = static_cast<uint32_t>(b->ongoing);
      const int64_t idle_since = b->idle_since_us;
      l.idle_ms = l.ongoing == 0 && idle_since > 0 ? (now - idle_since) / 1000 : 0;
    }
    snap.executors.push_back(l);
  }
  // Pairs spawned since the round began count as active and busy (nothing known yet).
  for (const Pair& p : st.pairs)
    if (std::find(ids.begin(), ids.end(), p.id) == ids.end())
      snap.executors.push_back({p.id, 1, 0, p.retiring});
  auto d = policy::decide_autoscale(snap, st.cfg.knobs, st.scale);
  if (d.add > 0) add_pairs(self, d.add, d.reason, true);
  for (uint64_t id : d.retire) retire_pair(self, id, d.reason);
  arm_tick(self);
}

SupervisorStats own_stats(const SupervisorState& st) {
  SupervisorStats s;
  s.executors = active_count(st);
  s.executors_retiring = static_cast<int64_t>(st.pairs.size()) - active_count(st);
  s.scale_ups = st.scale_ups;
  s.scale_downs = st.scale_downs;
  s.executor_failures = st.failures;
  s.failures_crash = st.failures_crash;
  s.failures_hang = st.failures_hang;
  s.replacements = st.replacements;
  s.requeued = st.requeued;
  s.failed_jobs = st.failed_jobs;
  s.recoveries = st.recoveries;
  s.recovery_ms_last = st.recovery_ms_last;
  s.recovery_ms_max = st.recovery_ms_max;
  s.detect_ms_last = st.detect_ms_last;
  return s;
}

SupervisorActor::behavior_type supervisor_actor(Self* self, SupervisorConfig cfg,
                                                SupervisorWiring wiring) {
  auto& st = self->state;
  cfg.knobs.max_executors =
      std::min<int>(std::max(cfg.knobs.max_executors, 1), static_cast<int>(cfg.slots.size()));
  cfg.knobs.min_executors = std::clamp(cfg.knobs.min_executors, 0, cfg.knobs.max_executors);
  st.cfg = std::move(cfg);
  st.w = std::move(wiring);

  self->set_down_handler([self](caf::down_msg& dm) {
    auto& s = self->state;
    auto it = std::find_if(s.pairs.begin(), s.pairs.end(),
                           [&](const Pair& p) { return p.batcher.address() == dm.source; });
    if (it == s.pairs.end()) return;
    Pair p = std::move(*it);
    s.pairs.erase(it);
    // The executor goes with its batcher (a crashed one is gone already).
    self->send_exit(p.executor, caf::exit_reason::user_shutdown);
    if (p.retiring) {  // scaled down (a failure while retiring re-queued its jobs: no stand-in)
      log(self, "executor " + std::to_string(p.id) + " retired");
      notify_control(self);
      return;
    }
    if (!p.failed) {
      ++s.failures;  // the batcher itself died; the router runs its jobs again
      ++s.failures_crash;
      log(self, "batcher " + std::to_string(p.id) + " down: " + self->system().render(dm.reason));
    }
    // Replace at once: re-queued jobs are waiting for credit.
    ++s.replacements;
    add_pairs(self, 1, "replacing failed executor " + std::to_string(p.id), false);
    if (active_count(s) < s.cfg.knobs.min_executors)
      add_pairs(self, s.cfg.knobs.min_executors - active_count(s), "min_executors", false);
    notify_control(self);
  });
  self->set_exit_handler([self](caf::exit_msg& em) {
    // Only the batchers: each stops its own executor when it ends, so no batcher sees its
    // executor go first and mistakes the shutdown for a crash.
    for (const Pair& p : self->state.pairs) self->send_exit(p.batcher, em.reason);
    self->state.pairs.clear();
    self->quit(em.reason);
  });

  add_pairs(self, st.cfg.knobs.min_executors, "start", false);
  arm_tick(self);
  return {
      [self](observe_atom, const MetricsActor& metrics) {
        auto& s = self->state;
        s.w.metrics = metrics;
        for (const Pair& p : s.pairs)
          self->send(metrics, observe_atom::value, p.batcher, p.executor,
                     static_cast<int32_t>(p.slot));
      },
      [self](connect_atom, const ControlActor& control) -> std::string {
        self->state.control = control;
        notify_control(self);
        // The control actor has the batcher list before this answer arrives. With no pair
        // running, the answer says why the first could not start.
        return active_count(self->state) == 0 ? self->state.start_error : std::string();
      },
      [self](failed_atom, const PairFailure& f) {
        auto& s = self->state;
        ++s.failures;
        // The batcher's watchdog names a hang in its reason; every other failure is a crash.
        if (f.why.find("hung") != std::string::npos)
          ++s.failures_hang;
        else
          ++s.failures_crash;
        s.requeued += f.requeued;
        s.failed_jobs += f.failed;
        s.detect_ms_last = (f.detected_us - f.fault_us) / 1000;
        for (Pair& p : s.pairs)
          if (p.id == f.pair) p.failed = true;
        log(self, "executor " + std::to_string(f.pair) + " failed (" + f.why +
                      "), detected after " + std::to_string(s.detect_ms_last) + " ms; " +
                      std::to_string(f.requeued) + " jobs re-queued, " + std::to_string(f.failed) +
                      " ended engine_dead");
      },
      [self](recovered_atom, int64_t fault_us, int64_t at_us) {
        auto& s = self->state;
        if (!s.recovered.insert(fault_us).second) return;
        ++s.recoveries;
        s.recovery_ms_last = (at_us - fault_us) / 1000;
        s.recovery_ms_max = std::max(s.recovery_ms_max, s.recovery_ms_last);
        // The metrics keep every recovery time (a histogram); the stats keep the last and worst.
        if (s.w.metrics) self->send(s.w.metrics, recovered_atom::value, fault_us, at_us);
        log(self, "recovered: first re-queued job running again " +
                      std::to_string((at_us - fault_us) / 1000.0) + " ms after the fault");
      },
      [self](kvpolicy_atom, const policy::KvPolicy& p) {
        self->state.cfg.batching.kv_policy = policy::to_string(p);
      },
      [self](scale_atom) { tick(self); },
      [self](stats_atom) -> caf::result<SupervisorStats> {
        auto rp = self->make_response_promise<SupervisorStats>();
        std::vector<BatcherActor> to;
        for (const Pair& p : self->state.pairs) to.push_back(p.batcher);
        gather(self, to, [self, rp](const std::vector<std::optional<BatcherStats>>& all) mutable {
          SupervisorStats s = own_stats(self->state);
          // A batcher that did not answer in time adds nothing.
          for (const auto& b : all)
            if (b) sum_into(s.batchers, *b);
          rp.deliver(std::move(s));
        });
        return rp;
      },
  };
}

}  // namespace

SupervisorActor spawn_supervisor(caf::actor_system& sys, SupervisorConfig cfg,
                                 SupervisorWiring wiring) {
  if (cfg.slots.empty()) cfg.slots = policy::executor_slots(false, 0, cfg.knobs.max_executors);
  return sys.spawn(supervisor_actor, std::move(cfg), std::move(wiring));
}

}  // namespace sy
