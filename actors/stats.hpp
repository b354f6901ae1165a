// The actors' counters as typed records: each actor answers (stats_atom) with its record, and the
// metrics, `ctl stats` and the SIGUSR1 line render the same fields. CAF-free (plain structs).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace sy {

namespace stats_fields {

/// Where a field appears besides its record (a bit mask).
enum Show : unsigned {
  kRecordOnly = 0,
  /// In the server summary: the `ctl stats` reply and the SIGUSR1 line (`switchyard: stats`).
  kSummary = 1u << 0,
  /// In each per-batcher object of the `ctl stats` reply.
  kPerBatcher = 1u << 1,
  /// A moment (a time stamp), not an amount: left out of sums over records.
  kInstant = 1u << 2,
};

/// One field of a record: its exported name (the key in `ctl stats` and the SIGUSR1 line), a
/// reference to it and where it is shown.
template <class T>
struct Field {
  const char* name;
  T& value;
  unsigned show;
};

template <class T>
Field<T> field(const char* name, T& value, unsigned show = kRecordOnly) {
  return {name, value, show};
}

}  // namespace stats_fields

/// Admission's counters (actors/admission.hpp).
struct AdmissionStats {
  int64_t submitted = 0;          ///< submits received
  int64_t admitted = 0;           ///< jobs handed to the router
  int64_t unauthorized = 0;       ///< submits refused: unknown tenant or wrong token
  int64_t rate_limited = 0;       ///< submits refused by the tenant's rate limit
  int64_t overloaded = 0;         ///< submits refused because a class queue was full
  int64_t bad_request = 0;        ///< submits refused as malformed or over a limit
  int64_t deduplicated = 0;       ///< resubmits of a known id answered from its record
  int64_t attached = 0;           ///< resubmits of a running job attached to it
  int64_t finished = 0;           ///< jobs that ended (any outcome)
  int64_t not_found = 0;          ///< cancel/status requests for an unknown job
  int64_t unavailable = 0;        ///< submits refused while draining or the journal fails
  int64_t draining = 0;           ///< 1 while draining (`ctl drain`, shutdown), else 0
  int64_t active = 0;             ///< admitted and not yet ended
  int64_t remembered = 0;         ///< job records kept (live and ended, for resubmits)
  int64_t remembered_bytes = 0;   ///< bytes of the ended jobs' records
  int64_t tenants = 0;            ///< tenant table entries
  int64_t tenants_idle = 0;       ///< of those, with no job (candidates to forget)
  int64_t tenants_forgotten = 0;  ///< idle open-mode tenants dropped from the table
  int64_t replayed = 0;           ///< jobs of the previous run re-queued from the journal
  int64_t restored = 0;           ///< results of the previous run kept for resubmits
  // Programs (docs/programs.md): started (resumed ones too), ended by outcome, running now.
  int64_t programs_started = 0, programs_resumed = 0, programs_done = 0, programs_failed = 0,
          programs_cancelled = 0, programs_active = 0;
  int64_t program_steps = 0;           ///< gen, select and tool steps finished
  int64_t program_steps_restored = 0;  ///< steps a resumed program took from the journal
  int64_t program_prompt_tokens = 0;   ///< prompt tokens of program steps
  int64_t program_cached_tokens = 0;   ///< of those, reused from the prefix cache
  int64_t program_completion_tokens = 0;
  int64_t program_tool_calls = 0, program_tool_timeouts = 0;

  template <class S, class F>
  static decltype(auto) fields(S& s, F&& f) {
    using stats_fields::field;
    using stats_fields::kSummary;
    return f(field("submitted", s.submitted), field("admitted", s.admitted, kSummary),
             field("unauthorized", s.unauthorized), field("rate_limited", s.rate_limited),
             field("overloaded", s.overloaded, kSummary), field("bad_request", s.bad_request),
             field("deduplicated", s.deduplicated), field("attached", s.attached),
             field("finished", s.finished), field("not_found", s.not_found),
             field("unavailable", s.unavailable), field("draining", s.draining, kSummary),
             field("active_jobs", s.active, kSummary), field("remembered", s.remembered),
             field("remembered_bytes", s.remembered_bytes), field("tenants", s.tenants),
             field("tenants_idle", s.tenants_idle), field("tenants_forgotten", s.tenants_forgotten),
             field("replayed", s.replayed), field("restored", s.restored),
             field("programs_started", s.programs_started),
             field("programs_resumed", s.programs_resumed), field("programs_done", s.programs_done),
             field("programs_failed", s.programs_failed),
             field("programs_cancelled", s.programs_cancelled),
             field("programs_active", s.programs_active, kSummary),
             field("program_steps", s.program_steps),
             field("program_steps_restored", s.program_steps_restored),
             field("program_prompt_tokens", s.program_prompt_tokens),
             field("program_cached_tokens", s.program_cached_tokens),
             field("program_completion_tokens", s.program_completion_tokens),
             field("program_tool_calls", s.program_tool_calls),
             field("program_tool_timeouts", s.program_tool_timeouts));
  }
};

/// The router's counters (actors/router.hpp).
struct RouterStats {
  int64_t enqueued = 0;            ///< jobs taken into the queues
  int64_t dispatched = 0;          ///< jobs given to batchers
  int64_t expired = 0;             ///< jobs whose deadline passed in the queue
  int64_t cancelled = 0;           ///< jobs cancelled while queued
  int64_t rejected_full = 0;       ///< enqueues refused: the class queue was full
  int64_t overflowed = 0;          ///< jobs parked in a class's overflow (weighted fairness)
  int64_t queued = 0;              ///< waiting in the class queues now
  int64_t overflow = 0;            ///< waiting in the overflow now
  int64_t credit = 0;              ///< dispatch credit the batchers hold
  int64_t pull_outstanding = 0;    ///< PULL credit granted and not yet used
  int64_t pull_granted = 0;        ///< PULL credit granted in all
  int64_t batchers = 0;            ///< batchers known
  int64_t requeued = 0;            ///< jobs sent back by a failed executor's batcher
  int64_t retry_queued = 0;        ///< re-queued jobs waiting now
  int64_t retired = 0;             ///< batchers that retired (scale down)
  int64_t lost_requeued = 0;       ///< jobs of a batcher that went down, run again elsewhere
  int64_t lost_failed = 0;         ///< jobs of a batcher that went down, ended engine_dead
  int64_t running_tracked = 0;     ///< jobs the router knows to be running in batchers
  int64_t waiting_total = 0;       ///< queued + overflow + retry (the autoscaler's signal)
  int64_t oldest_wait_ms = 0;      ///< age of the oldest waiting job (ms), 0 when none
  int64_t affinity_hits = 0;       ///< jobs sent where their prompt prefix went before
  int64_t affinity_overruled = 0;  ///< prefix matches that lost to the balance rule
  int64_t affinity_indexed = 0;    ///< prompt prefixes in the affinity index
  /// Waiting per priority class (queue and overflow), by class name.
  std::map<std::string, int64_t> queued_by_class;

  template <class S, class F>
  static decltype(auto) fields(S& s, F&& f) {
    using stats_fields::field;
    using stats_fields::kSummary;
    return f(
        field("enqueued", s.enqueued), field("dispatched", s.dispatched, kSummary),
        field("expired", s.expired, kSummary), field("cancelled", s.cancelled),
        field("rejected_full", s.rejected_full), field("overflowed", s.overflowed),
        field("queued", s.queued, kSummary), field("overflow", s.overflow),
        field("credit", s.credit), field("pull_outstanding", s.pull_outstanding),
        field("pull_granted", s.pull_granted), field("batchers", s.batchers),
        field("requeued", s.requeued), field("retry_queued", s.retry_queued),
        field("retired", s.retired), field("lost_requeued", s.lost_requeued, kSummary),
        field("lost_failed", s.lost_failed, kSummary), field("running_tracked", s.running_tracked),
        field("waiting_total", s.waiting_total), field("oldest_wait_ms", s.oldest_wait_ms),
        field("affinity_hits", s.affinity_hits, kSummary),
        field("affinity_overruled", s.affinity_overruled, kSummary),
        field("affinity_indexed", s.affinity_indexed), field("queued_by_class", s.queued_by_class));
  }
};

/// One batcher's counters (actors/batcher.hpp); the supervisor sums them over its pairs.
struct BatcherStats {
  int64_t running = 0;                  ///< sequences in the running set
  int64_t waiting = 0;                  ///< sequences waiting for KV blocks
  int64_t blocks_used = 0;              ///< KV blocks held by sequences
  int64_t blocks_free = 0;              ///< KV blocks free
  int64_t blocks_total = 0;             ///< KV blocks in the pool
  int64_t blocks_cached = 0;            ///< unreferenced blocks kept for prefix reuse
  int64_t blocks_pinned = 0;            ///< blocks programs' contexts hold between steps
  int64_t blocks_used_peak = 0;         ///< most blocks held at once
  int64_t window_blocks_used = 0;       ///< window-group blocks held (0 with one group)
  int64_t window_blocks_free = 0;       ///< window-group blocks free
  int64_t window_blocks_total = 0;      ///< window-group blocks in the pool
  int64_t window_blocks_used_peak = 0;  ///< most window-group blocks held at once
  int64_t fed_tokens = 0;               ///< prompt and generated tokens fed to the engine
  int64_t prefix_hit_blocks = 0;        ///< blocks taken from the prefix cache
  int64_t prefix_hit_tokens = 0;        ///< prompt tokens whose KV came from the prefix cache
  int64_t prefix_evictions = 0;         ///< cached blocks evicted for new ones
  std::string kv_policy;                ///< the KV policy new jobs get now
  std::string kv_base_policy;           ///< the policy outside KV pressure
  int64_t policy_swaps = 0;             ///< KV-policy swaps, by command and by watermark
  int64_t pressure_swaps = 0;           ///< of those, by the pressure watermarks
  int64_t pressure = 0;                 ///< 1 while under KV pressure, else 0
  int64_t preemptions = 0;              ///< sequences preempted under KV pressure
  int64_t steps = 0;                    ///< engine steps planned
  int64_t tokens = 0;                   ///< tokens generated
  int64_t finished = 0;                 ///< sequences that ended
  int64_t ongoing = 0;                  ///< running + waiting (the autoscaler's load signal)
  int64_t idle_since_us = 0;            ///< when it last became idle (now_us), 0 while busy
  int64_t retiring = 0;                 ///< 1 once told to retire, else 0
  int64_t executor_failures = 0;        ///< 1 once its executor failed, else 0
  int64_t requeued = 0;                 ///< jobs it sent back after its executor failed
  int64_t seq_failures = 0;             ///< sequences ended alone with their own error
  int64_t prompt_fed_tokens = 0;        ///< prompt tokens fed to the engine (fed_tokens' part)
  int64_t forked_seqs = 0;              ///< samples and continuations forked from a prompt
  int64_t kv_block_copies = 0;          ///< KV blocks copied on write by forked sequences
  int64_t spec_draft_tokens = 0;        ///< drafted tokens fed for verification
  int64_t spec_accepted_tokens = 0;     ///< of those, accepted (each saved a decode step)
  int64_t spec_seq_steps = 0;           ///< sequence-steps that fed drafts
  int64_t spec_steps = 0;               ///< engine steps in which some sequence fed drafts
  int64_t steps_done = 0;               ///< engine steps whose results came back
  int64_t step_us = 0;                  ///< their time, from sending each to its result
  int64_t steps_interrupted = 0;        ///< steps stopped for a more important job (not above)

  template <class S, class F>
  static decltype(auto) fields(S& s, F&& f) {
    using stats_fields::field;
    using stats_fields::kPerBatcher;
    using stats_fields::kSummary;
    return f(field("running", s.running, kSummary), field("waiting", s.waiting),
             field("blocks_used", s.blocks_used, kSummary | kPerBatcher),
             field("blocks_free", s.blocks_free), field("blocks_total", s.blocks_total, kSummary),
             field("blocks_cached", s.blocks_cached, kSummary | kPerBatcher),
             field("blocks_pinned", s.blocks_pinned, kSummary),
             field("blocks_used_peak", s.blocks_used_peak, kPerBatcher),
             field("window_blocks_used", s.window_blocks_used, kPerBatcher),
             field("window_blocks_free", s.window_blocks_free),
             field("window_blocks_total", s.window_blocks_total),
             field("window_blocks_used_peak", s.window_blocks_used_peak, kPerBatcher),
             field("fed_tokens", s.fed_tokens),
             field("prefix_hit_blocks", s.prefix_hit_blocks, kPerBatcher),
             field("prefix_hit_tokens", s.prefix_hit_tokens, kSummary | kPerBatcher),
             field("prefix_evictions", s.prefix_evictions),
             field("kv_policy", s.kv_policy, kPerBatcher),
             field("kv_base_policy", s.kv_base_policy),
             field("policy_swaps", s.policy_swaps, kSummary | kPerBatcher),
             field("pressure_swaps", s.pressure_swaps, kPerBatcher),
             field("pressure", s.pressure, kPerBatcher),
             field("preemptions", s.preemptions, kSummary | kPerBatcher),
             field("steps", s.steps, kSummary), field("tokens", s.tokens),
             field("finished", s.finished), field("ongoing", s.ongoing),
             field("idle_since_us", s.idle_since_us, stats_fields::kInstant),
             field("retiring", s.retiring), field("executor_failures", s.executor_failures),
             field("requeued", s.requeued), field("seq_failures", s.seq_failures, kSummary),
             field("prompt_fed_tokens", s.prompt_fed_tokens), field("forked_seqs", s.forked_seqs),
             field("kv_block_copies", s.kv_block_copies),
             field("spec_draft_tokens", s.spec_draft_tokens, kSummary),
             field("spec_accepted_tokens", s.spec_accepted_tokens, kSummary),
             field("spec_seq_steps", s.spec_seq_steps), field("spec_steps", s.spec_steps),
             field("steps_done", s.steps_done), field("step_us", s.step_us),
             field("steps_interrupted", s.steps_interrupted));
  }
};

/// The supervisor's own counters and the sum of its live batchers' (actors/supervisor.hpp).
struct SupervisorStats {
  int64_t executors = 0;           ///< active batcher+executor pairs
  int64_t executors_retiring = 0;  ///< pairs finishing their jobs before they go
  int64_t scale_ups = 0;           ///< pairs added under load
  int64_t scale_downs = 0;         ///< pairs retired when idle
  int64_t executor_failures = 0;   ///< failures_crash + failures_hang
  int64_t failures_crash = 0;      ///< executors that threw, or whose batcher died
  int64_t failures_hang = 0;       ///< executors the step watchdog caught
  int64_t replacements = 0;        ///< pairs spawned in place of failed ones
  int64_t requeued = 0;            ///< jobs re-queued after executor failures
  int64_t failed_jobs = 0;         ///< jobs ended engine_dead by executor failures
  int64_t recoveries = 0;          ///< faults whose first re-queued job ran again
  int64_t recovery_ms_last = -1;   ///< fault -> first re-queued job running, last fault (ms)
  int64_t recovery_ms_max = -1;    ///< the same, worst so far (-1: none yet)
  int64_t detect_ms_last = -1;     ///< fault -> detection, last fault (ms)
  BatcherStats batchers;           ///< the live batchers' records summed (sum_into)

  template <class S, class F>
  static decltype(auto) fields(S& s, F&& f) {
    using stats_fields::field;
    using stats_fields::kSummary;
    return f(field("executors", s.executors, kSummary),
             field("executors_retiring", s.executors_retiring),
             field("scale_ups", s.scale_ups, kSummary),
             field("scale_downs", s.scale_downs, kSummary),
             field("executor_failures", s.executor_failures, kSummary),
             field("failures_crash", s.failures_crash), field("failures_hang", s.failures_hang),
             field("replacements", s.replacements), field("requeued", s.requeued, kSummary),
             field("failed_jobs", s.failed_jobs), field("recoveries", s.recoveries, kSummary),
             field("recovery_ms_last", s.recovery_ms_last, kSummary),
             field("recovery_ms_max", s.recovery_ms_max, kSummary),
             field("detect_ms_last", s.detect_ms_last), field("batchers", s.batchers));
  }
};

/// The journal's counters (actors/journal.hpp). In the SIGUSR1 line each summary field is
/// prefixed `journal_`.
struct JournalStats {
  int64_t accepted = 0;          ///< accept records written by this process
  int64_t results = 0;           ///< result records written by this process
  int64_t syncs = 0;             ///< fdatasync calls (group commit: far fewer than records)
  int64_t live = 0;              ///< journaled jobs not yet ended
  int64_t held = 0;              ///< jobs whose events wait for their accept record
  int64_t dropped = 0;           ///< events for jobs the journal no longer knows
  int64_t redelivered = 0;       ///< results of the previous run delivered again at start
  int64_t delivered_marks = 0;   ///< delivery marks written
  int64_t compactions = 0;       ///< file compactions
  int64_t bytes = 0;             ///< the file's size
  int64_t replayed_pending = 0;  ///< jobs of the previous run re-queued at start
  int64_t replayed_results = 0;  ///< results of the previous run kept for resubmissions
  int64_t write_errors = 0;      ///< writes, syncs, compactions the file system refused
  int64_t failing = 0;           ///< 1 from a refused write until the next good one
  int64_t refused = 0;           ///< submits refused (unavailable): the journal could not write
  int64_t unwritten = 0;         ///< results waiting for room in the journal (replies held)

  template <class S, class F>
  static decltype(auto) fields(S& s, F&& f) {
    using stats_fields::field;
    using stats_fields::kSummary;
    return f(field("accepted", s.accepted, kSummary), field("results", s.results, kSummary),
             field("syncs", s.syncs, kSummary), field("live", s.live), field("held", s.held),
             field("dropped", s.dropped), field("redelivered", s.redelivered, kSummary),
             field("delivered_marks", s.delivered_marks), field("compactions", s.compactions),
             field("bytes", s.bytes), field("replayed", s.replayed_pending, kSummary),
             field("restored", s.replayed_results, kSummary),
             field("write_errors", s.write_errors, kSummary), field("failing", s.failing, kSummary),
             field("refused", s.refused, kSummary), field("held_results", s.unwritten, kSummary));
  }
};

/// An executor's counters (actors/executor.hpp).
struct ExecutorStats {
  int64_t steps = 0;         ///< engine steps run
  int64_t tokens = 0;        ///< tokens sampled (sequences without an error)
  int64_t samplers = 0;      ///< per-sequence samplers held
  int64_t seq_failures = 0;  ///< sequences ended alone with their own error
  int64_t interrupted = 0;   ///< steps stopped inside their layers for an urgent job (not in steps)

  template <class S, class F>
  static decltype(auto) fields(S& s, F&& f) {
    using stats_fields::field;
    return f(field("steps", s.steps), field("tokens", s.tokens), field("samplers", s.samplers),
             field("seq_failures", s.seq_failures), field("interrupted", s.interrupted));
  }
};

/// The edge's counters (the ZeroMQ gateway and its intake bound). The gateway is no actor: these
/// are read from its atomics (ingress/gateway.hpp, GatewayStats) by whoever owns it.
struct EdgeStats {
  int64_t received = 0;             ///< client frames the gateway read
  int64_t sent = 0;                 ///< server messages the gateway delivered
  int64_t decode_errors = 0;        ///< malformed client messages answered with an error
  int64_t curve_refused = 0;        ///< CURVE handshakes the client allow-list refused
  int64_t intake_refused = 0;       ///< requests refused: admission had its bound waiting
  int64_t connections_refused = 0;  ///< connections closed at once, for any connection cap
  /// ... by reason: endpoints.max_connections_per_address, max_connections, max_handshaking
  int64_t connections_refused_per_address = 0;
  int64_t connections_refused_total = 0;
  int64_t connections_refused_handshaking = 0;
  int64_t connections_open = 0;         ///< client connections open (request + pipeline input)
  int64_t connections_handshaking = 0;  ///< of those, not yet past the allow-list

  template <class S, class F>
  static decltype(auto) fields(S& s, F&& f) {
    using stats_fields::field;
    using stats_fields::kSummary;
    return f(field("received", s.received, kSummary), field("sent", s.sent, kSummary),
             field("decode_errors", s.decode_errors, kSummary),
             field("curve_refused", s.curve_refused, kSummary),
             field("intake_refused", s.intake_refused, kSummary),
             field("connections_refused", s.connections_refused, kSummary),
             field("connections_refused_per_address", s.connections_refused_per_address, kSummary),
             field("connections_refused_total", s.connections_refused_total, kSummary),
             field("connections_refused_handshaking", s.connections_refused_handshaking, kSummary),
             field("connections_open", s.connections_open, kSummary),
             field("connections_handshaking", s.connections_handshaking, kSummary));
  }
};

/// A type with a field list (the records above).
template <class T>
concept StatsRecord = requires(T& t) {
  T::fields(t, [](auto&&...) {});
};

/// Calls `f(Field)` for each field of `s`, in the record's order.
template <class S, class F>
requires StatsRecord<std::remove_const_t<S>>
void for_each_field(S& s, F&& f) {
  std::remove_const_t<S>::fields(s, [&](auto... fl) { (f(fl), ...); });
}

/// CAF's inspection (serialization, to_string) of any record: its fields in order.
template <class Inspector, class S>
requires StatsRecord<S>
typename Inspector::result_type inspect(Inspector& f, S& x) {
  return S::fields(x, [&](auto... fl) { return f(fl.value...); });
}

/// Adds every integer field of `in` to `out`'s, except moments (kInstant, left as they are in
/// `out`); strings and maps are left as they are too. The supervisor's and the control actor's
/// sum over batchers.
template <class S>
requires StatsRecord<S>
void sum_into(S& out, const S& in) {
  S::fields(out, [&](auto... o) {
    S::fields(in, [&](auto... i) {
      auto add = [](auto& a, const auto& b) {
        if constexpr (std::is_integral_v<std::remove_cvref_t<decltype(a.value)>>)
          if (!(a.show & stats_fields::kInstant)) a.value += b.value;
      };
      (add(o, i), ...);
    });
  });
}

/// The sum of `all` (sum_into over each).
template <class S>
requires StatsRecord<S> S sum_of(const std::vector<S>& all) {
  S out{};
  for (const S& s : all) sum_into(out, s);
  return out;
}

/// The server summary's fields, in order, as (exported name, value): what `ctl stats` and the
/// SIGUSR1 line show. `supervisor` and `journal` may be null (left out); `journal`'s names get
/// the prefix `journal_`.
template <class F>
void for_each_summary_field(const AdmissionStats& admission, const RouterStats& router,
                            const BatcherStats& batchers, const EdgeStats& edge,
                            const SupervisorStats* supervisor, const JournalStats* journal, F&& f) {
  auto emit = [&](const char* prefix) {
    return [&f, prefix](const auto& fl) {
      if constexpr (std::is_integral_v<std::remove_cvref_t<decltype(fl.value)>>)
        if (fl.show & stats_fields::kSummary) f(std::string(prefix) + fl.name, int64_t(fl.value));
    };
  };
  for_each_field(admission, emit(""));
  for_each_field(router, emit(""));
  for_each_field(batchers, emit(""));
  for_each_field(edge, emit(""));
  if (supervisor) for_each_field(*supervisor, emit(""));
  if (journal) for_each_field(*journal, emit("journal_"));
}

/// The summary as one JSON line, `{"name": value, ...}` (nlohmann-json; the separators are
/// ", " and ": " as the reply has always had them). With `per_batcher`, a "batchers" array of
/// one object per batcher with its kPerBatcher fields.
std::string summary_json(const AdmissionStats& admission, const RouterStats& router,
                         const BatcherStats& batchers, const EdgeStats& edge,
                         const SupervisorStats* supervisor, const JournalStats* journal,
                         const std::vector<BatcherStats>* per_batcher);

}  // namespace sy
