// The metrics actor (see metrics.hpp). Job counters and latency histograms come from the
// JobOutcomes admission forwards and live in a prometheus-cpp registry of the actor's own; the
// other actors' stats records are asked at scrape time and written through a registry built for
// that scrape, so no actor shares state with another.
#include "actors/metrics.hpp"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <caf/all.hpp>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "actors/messages.hpp"
#include "core/error_code.hpp"

namespace sy {
namespace {

namespace pm = prometheus;

// Latency bounds in seconds: from a millisecond (the demo model's step on CPU) to five minutes
// (a long generation of a large model on CPU), roughly 2.5x apart so a quantile estimate from
// them is within a bucket's width.
const pm::Histogram::BucketBoundaries kLatencyBounds = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
// Per output token: a fraction of a millisecond (tiny models, big batches) to a few seconds (a
// large model on a loaded CPU).
// Steps of a program: from a single gen to the 256 a program may hold.
const pm::Histogram::BucketBoundaries kStepBounds = {1, 2, 4, 8, 16, 32, 64, 128, 256};
const pm::Histogram::BucketBoundaries kTokenBounds = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5};

// One observation; NaN (a malformed timing) is left out rather than poisoning the sum.
void observe(pm::Histogram& h, double v) {
  if (!std::isnan(v)) h.Observe(v);
}

// What the actor counts itself, in a registry that lives as long as the actor.
struct OwnMetrics {
  pm::Registry reg;
  pm::Family<pm::Counter>& jobs =
      pm::BuildCounter()
          .Name("switchyard_jobs_total")
          .Help(
              "Jobs that ended, by priority class, tenant and outcome (done, cancelled or the "
              "error code).")
          .Register(reg);
  pm::Counter& prompt_tokens = pm::BuildCounter()
                                   .Name("switchyard_prompt_tokens_total")
                                   .Help("Prompt tokens of ended jobs.")
                                   .Register(reg)
                                   .Add({});
  pm::Counter& generation_tokens =
      pm::BuildCounter()
          .Name("switchyard_generation_tokens_total")
          .Help("Tokens generated for ended jobs (tokens per second: rate() of this).")
          .Register(reg)
          .Add({});
  pm::Counter& prefix_hit_tokens = pm::BuildCounter()
                                       .Name("switchyard_prefix_cache_hit_tokens_total")
                                       .Help("Prompt tokens whose KV came from the prefix cache.")
                                       .Register(reg)
                                       .Add({});
  pm::Family<pm::Histogram>& queue =
      pm::BuildHistogram()
          .Name("switchyard_queue_time_seconds")
          .Help("Time from arrival to the first scheduled step (done jobs).")
          .Register(reg);
  pm::Family<pm::Histogram>& ttft = pm::BuildHistogram()
                                        .Name("switchyard_time_to_first_token_seconds")
                                        .Help("Time from arrival to the first token (done jobs).")
                                        .Register(reg);
  pm::Family<pm::Histogram>& tpot =
      pm::BuildHistogram()
          .Name("switchyard_time_per_output_token_seconds")
          .Help("Time per output token after the first (done jobs with two or more tokens).")
          .Register(reg);
  pm::Family<pm::Histogram>& program_e2e =
      pm::BuildHistogram()
          .Name("switchyard_program_duration_seconds")
          .Help("Time from a program's arrival to its end (done programs), by priority class.")
          .Register(reg);
  pm::Family<pm::Histogram>& program_steps =
      pm::BuildHistogram()
          .Name("switchyard_program_steps")
          .Help("Gen, select and tool steps of each done program.")
          .Register(reg);
  pm::Family<pm::Histogram>& e2e = pm::BuildHistogram()
                                       .Name("switchyard_e2e_request_latency_seconds")
                                       .Help("Time from arrival to the end (done jobs).")
                                       .Register(reg);
  // Fault to first re-queued job running again. The same bounds as job latencies: a crash
  // recovers in milliseconds, a hang only after the step watchdog (30 s by default).
  pm::Histogram& recovery =
      pm::BuildHistogram()
          .Name("switchyard_recovery_seconds")
          .Help("Time from an executor fault to the first of its re-queued jobs running again.")
          .Register(reg)
          .Add({}, kLatencyBounds);
};

// One batcher+executor pair and the batcher's last stats (kept so that its counters survive it).
struct Pair {
  BatcherActor batcher;
  ExecutorActor executor;
  std::string label;  // its executor="..." label value
  bool batcher_alive = true, executor_alive = true;
  BatcherStats last;
};

// Counters of the batchers that are gone, so the totals never go backwards.
struct Retired {
  int64_t preemptions = 0, policy_swaps = 0, seq_failures = 0;
  int64_t spec_draft_tokens = 0, spec_accepted_tokens = 0, spec_seq_steps = 0, spec_steps = 0;
  int64_t steps_done = 0, step_us = 0, steps_interrupted = 0;
  std::map<std::string, int64_t> preemptions_by;  // by executor label
};

struct MetricsState {
  MetricsWiring w;
  std::unique_ptr<OwnMetrics> own = std::make_unique<OwnMetrics>();
  std::set<std::string> configured;  // w.tenants: always a label of their own
  std::set<std::string> labelled;    // other tenants given one, w.max_tenant_labels at most
  std::map<uint64_t, Pair> pairs;    // by registration number
  uint64_t next_pair = 0;
  Retired retired;

  static inline const char* name = "sy.metrics";
};

using Self = MetricsActor::stateful_base<MetricsState>;

std::string outcome_name(const JobOutcome& o) {
  if (o.outcome == Outcome::done) return "done";
  if (o.outcome == Outcome::cancelled) return "cancelled";
  const ErrorCode code = o.code != ErrorCode{} ? o.code : o.error.code;
  if (static_cast<std::size_t>(code) < detail::error_code_names.size())
    return std::string(to_string(code));
  return "internal";
}

// The `tenant` label of a job: its tenant while that is configured or among the first
// max_tenant_labels other names seen, else the one shared label for the rest.
const std::string& tenant_label(MetricsState& st, const std::string& tenant) {
  static const std::string kOther = "_other";
  if (st.configured.count(tenant) || st.labelled.count(tenant)) return tenant;
  if (st.labelled.size() >= st.w.max_tenant_labels) return kOther;
  st.labelled.insert(tenant);
  return tenant;
}

void record(Self* self, const JobOutcome& o, const std::string& cls) {
  auto& st = self->state;
  auto& m = *st.own;
  m.jobs.Add({{"class", cls}, {"tenant", tenant_label(st, o.tenant)}, {"outcome", outcome_name(o)}})
      .Increment();
  if (o.outcome == Outcome::done || o.outcome == Outcome::cancelled) {
    m.prompt_tokens.Increment(o.done.prompt_tokens);
    m.generation_tokens.Increment(o.done.completion_tokens);
    m.prefix_hit_tokens.Increment(o.done.cached_tokens);
  }
  // Latencies of finished jobs only: a cancelled one has no end-to-end
  if (o.outcome != Outcome::done) return;
  const auto& d = o.done;
  const pm::Labels by_class{{"class", cls}};
  if (o.program) {
    // A program's latency spans many steps: its own histogram, not the jobs' ones.
    observe(m.program_e2e.Add(by_class, kLatencyBounds), d.total_ms / 1000.0);
    observe(m.program_steps.Add(by_class, kStepBounds), d.steps);
    return;
  }
  observe(m.queue.Add(by_class, kLatencyBounds), d.queue_ms / 1000.0);
  observe(m.e2e.Add(by_class, kLatencyBounds), d.total_ms / 1000.0);
  if (d.completion_tokens > 0) observe(m.ttft.Add(by_class, kLatencyBounds), d.ttft_ms / 1000.0);
  // The first token's time is TTFT; the rest are spread over the following tokens.
  if (d.completion_tokens > 1 && d.total_ms >= d.ttft_ms)
    observe(m.tpot.Add(by_class, kTokenBounds),
            (d.total_ms - d.ttft_ms) / 1000.0 / (d.completion_tokens - 1));
}

// The answers of one scrape.
struct Scrape {
  caf::typed_response_promise<std::string> rp;
  size_t owed = 0;
  AdmissionStats admission;
  RouterStats router;
  SupervisorStats supervisor;
  EdgeStats gateway;
  JournalStats journal;
  std::map<uint64_t, BatcherStats> batchers;  // answered this time (others: their last stats)
};

// prometheus-cpp keeps a series' labels in a std::map, so they are written sorted by name. The
// text format does not fix an order, but switchyard_jobs_total has always been written (and is
// documented and matched line by line) as class, tenant, outcome: the collected labels are put
// back in that order before the text is written. The one hand-written step of the exposition.
void order_labels(std::vector<pm::MetricFamily>& families) {
  static const std::vector<std::string> kJobsOrder = {"class", "tenant", "outcome"};
  for (auto& f : families) {
    if (f.name != "switchyard_jobs_total") continue;
    for (auto& m : f.metric) {
      auto rank = [](const pm::ClientMetric::Label& l) {
        return std::find(kJobsOrder.begin(), kJobsOrder.end(), l.name) - kJobsOrder.begin();
      };
      std::stable_sort(m.label.begin(), m.label.end(),
                       [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
    }
  }
}

// Registers the scrape-time series: the stats records' fields, each under its documented name.
void scraped_series(Self* self, const Scrape& s, pm::Registry& reg) {
  auto& st = self->state;
  auto gauge = [&](const char* name, const std::string& help) -> pm::Family<pm::Gauge>& {
    return pm::BuildGauge().Name(name).Help(help).Register(reg);
  };
  // A counter kept by another actor: this scrape's registry starts it at its current value.
  auto counter = [&](const char* name, const std::string& help) -> pm::Family<pm::Counter>& {
    return pm::BuildCounter().Name(name).Help(help).Register(reg);
  };
  auto set = [](pm::Family<pm::Gauge>& f, const pm::Labels& l, int64_t v) {
    f.Add(l).Set(static_cast<double>(v));
  };
  auto add = [](pm::Family<pm::Counter>& f, const pm::Labels& l, int64_t v) {
    f.Add(l).Increment(static_cast<double>(v));
  };

  const AdmissionStats& a = s.admission;
  auto& rejected = counter("switchyard_jobs_rejected_total",
                           "Submits refused by admission before they were queued, by reason.");
  add(rejected, {{"reason", "unauthorized"}}, a.unauthorized);
  add(rejected, {{"reason", "rate_limited"}}, a.rate_limited);
  add(rejected, {{"reason", "overloaded"}}, a.overloaded);
  add(rejected, {{"reason", "bad_request"}}, a.bad_request);
  add(rejected, {{"reason", "unavailable"}}, a.unavailable);
  set(gauge("switchyard_jobs_active", "Jobs admitted and not yet ended."), {}, a.active);
  auto& programs = counter("switchyard_programs_total",
                           "Programs that ended, by outcome (done, failed, cancelled).");
  add(programs, {{"outcome", "done"}}, a.programs_done);
  add(programs, {{"outcome", "failed"}}, a.programs_failed);
  add(programs, {{"outcome", "cancelled"}}, a.programs_cancelled);
  set(gauge("switchyard_programs_active", "Programs running (their walk held by admission)."), {},
      a.programs_active);
  add(counter("switchyard_programs_resumed_total",
              "Programs resumed from the journal after a restart."),
      {}, a.programs_resumed);
  auto& psteps = counter("switchyard_program_steps_total",
                         "Program steps (gen, select, tool) finished here (run) or taken from the "
                         "journal by a resumed program (restored).");
  add(psteps, {{"source", "run"}}, a.program_steps);
  add(psteps, {{"source", "restored"}}, a.program_steps_restored);
  auto& ptok =
      counter("switchyard_program_prompt_tokens_total",
              "Prompt tokens of program steps: computed, or reused from the prefix cache.");
  add(ptok, {{"kind", "computed"}}, a.program_prompt_tokens - a.program_cached_tokens);
  add(ptok, {{"kind", "reused"}}, a.program_cached_tokens);
  add(counter("switchyard_program_generated_tokens_total", "Tokens generated by program steps."),
      {}, a.program_completion_tokens);
  auto& tools = counter("switchyard_program_tool_calls_total",
                        "Tool calls programs made, and those whose result never came in time.");
  add(tools, {{"result", "called"}}, a.program_tool_calls);
  add(tools, {{"result", "timed_out"}}, a.program_tool_timeouts);

  const RouterStats& r = s.router;
  auto& depth =
      gauge("switchyard_queue_depth", "Jobs waiting in the router's queues, by priority class.");
  for (const auto& c : st.w.classes) {
    auto it = r.queued_by_class.find(c);
    set(depth, {{"class", c}}, it == r.queued_by_class.end() ? 0 : it->second);
  }
  auto& affinity = counter(
      "switchyard_prefix_affinity_dispatches_total",
      "Jobs whose prompt prefix had gone to a batcher before: result hit (sent there again) "
      "or overruled (sent to a freer batcher, the other being too busy).");
  add(affinity, {{"result", "hit"}}, r.affinity_hits);
  add(affinity, {{"result", "overruled"}}, r.affinity_overruled);

  // Gauges and counters summed over the pairs: this scrape's answers, else the last known ones.
  // Counters of every pair (and of the retired ones); gauges of live batchers only.
  BatcherStats counted, live;
  int64_t executors = 0;
  // The same per executor label. A label may hold two pairs for a moment (a replacement spawned
  // before the metrics actor saw its predecessor go): their figures add up.
  std::map<std::string, BatcherStats> by_label;
  std::set<std::string> live_labels;
  std::map<std::string, int64_t> preempt_by = st.retired.preemptions_by;
  for (const auto& [id, p] : st.pairs) {
    if (p.executor_alive) ++executors;
    auto it = s.batchers.find(id);
    const BatcherStats& b = it != s.batchers.end() ? it->second : p.last;
    sum_into(counted, b);
    preempt_by[p.label] += b.preemptions;
    if (!p.batcher_alive) continue;
    live_labels.insert(p.label);
    sum_into(live, b);
    sum_into(by_label[p.label], b);
  }
  set(gauge("switchyard_jobs_running", "Sequences running in the batchers."), {}, live.running);
  const std::string kv = "Paged KV-cache blocks";
  set(gauge("switchyard_kv_blocks_used", kv + " held by running sequences, all executors."), {},
      live.blocks_used);
  set(gauge("switchyard_kv_blocks_free", kv + " free, all executors."), {}, live.blocks_free);
  set(gauge("switchyard_kv_blocks_cached",
            kv + " unreferenced but kept for prefix reuse, all executors."),
      {}, live.blocks_cached);
  set(gauge("switchyard_kv_blocks_total", kv + " in all, all executors."), {}, live.blocks_total);
  gauge("switchyard_kv_cache_usage_ratio", "Fraction of KV blocks held by sequences.")
      .Add({})
      .Set(live.blocks_total > 0
               ? static_cast<double>(live.blocks_used) / static_cast<double>(live.blocks_total)
               : 0.0);
  // A model whose layers are of two kinds keeps its windowed layers' K/V in a pool of its own
  // (docs/kv_policies.md); the kv_blocks_* families above are then the full-attention layers'.
  const std::string kvw = "KV-cache blocks of the layers with a window of their own";
  set(gauge("switchyard_kv_window_blocks_used",
            kvw + " held by running sequences, all executors (0 with one group)."),
      {}, live.window_blocks_used);
  set(gauge("switchyard_kv_window_blocks_free", kvw + " free, all executors."), {},
      live.window_blocks_free);
  set(gauge("switchyard_kv_window_blocks_total", kvw + " in all, all executors."), {},
      live.window_blocks_total);
  // Per-executor series live in families of their own (switchyard_executor_*), so that a sum()
  // over any family counts each block once. Gauges of live executors only; counters of every
  // executor label ever seen (they never go backwards, so a label stays once it has appeared).
  auto per_executor = [&](const char* name, const std::string& help, int64_t BatcherStats::*f) {
    auto& fam = gauge(name, help + " (by executor slot).");
    for (const auto& label : live_labels) set(fam, {{"executor", label}}, by_label[label].*f);
  };
  per_executor("switchyard_executor_kv_blocks_used", kv + " held by running sequences",
               &BatcherStats::blocks_used);
  per_executor("switchyard_executor_kv_blocks_free", kv + " free", &BatcherStats::blocks_free);
  per_executor("switchyard_executor_kv_blocks_cached", kv + " kept for prefix reuse",
               &BatcherStats::blocks_cached);
  per_executor("switchyard_executor_kv_blocks_total", kv + " in all", &BatcherStats::blocks_total);

  add(counter("switchyard_preemptions_total",
              "Sequences preempted under KV pressure, all executors."),
      {}, counted.preemptions + st.retired.preemptions);
  auto& preempt_fam = counter("switchyard_executor_preemptions_total",
                              "Sequences preempted under KV pressure (by executor slot).");
  for (const auto& [label, n] : preempt_by) add(preempt_fam, {{"executor", label}}, n);
  add(counter("switchyard_sequence_failures_total",
              "Sequences ended alone by their executor (refused sampling state, non-finite "
              "logits); the other sequences of their step went on."),
      {}, counted.seq_failures + st.retired.seq_failures);
  add(counter("switchyard_kv_policy_swaps_total",
              "KV-cache policy swaps, by command and by watermark."),
      {}, counted.policy_swaps + st.retired.policy_swaps);
  // Speculative decoding (docs/speculation.md).
  const int64_t drafted = counted.spec_draft_tokens + st.retired.spec_draft_tokens;
  const int64_t accepted = counted.spec_accepted_tokens + st.retired.spec_accepted_tokens;
  add(counter("switchyard_spec_draft_tokens_total",
              "Drafted tokens fed for verification (speculative decoding), all executors."),
      {}, drafted);
  add(counter("switchyard_spec_accepted_tokens_total",
              "Drafted tokens accepted by verification: decode steps saved, all executors."),
      {}, accepted);
  add(counter("switchyard_spec_sequence_steps_total",
              "Sequence-steps that fed drafts, all executors."),
      {}, counted.spec_seq_steps + st.retired.spec_seq_steps);
  add(counter("switchyard_spec_steps_total",
              "Engine steps in which some sequence fed drafts, all executors."),
      {}, counted.spec_steps + st.retired.spec_steps);
  // The engine's steps: their mean time over a window is rate(seconds) / rate(steps), the time
  // a job arriving at a busy batcher waits at most for the step in flight.
  add(counter("switchyard_engine_steps_total",
              "Engine steps that came back from the executors, all executors."),
      {}, counted.steps_done + st.retired.steps_done);
  counter("switchyard_engine_step_seconds_total",
          "Time of those steps, from sending each to its result, all executors.")
      .Add({})
      .Increment(static_cast<double>(counted.step_us + st.retired.step_us) / 1e6);
  add(counter("switchyard_engine_steps_interrupted_total",
              "Engine steps stopped inside their layers so that a more important job's prompt "
              "runs at once (batching.urgent_interrupt; not in switchyard_engine_steps_total), "
              "all executors."),
      {}, counted.steps_interrupted + st.retired.steps_interrupted);
  gauge("switchyard_spec_acceptance_ratio",
        "Accepted over drafted tokens since the start (0 before any draft).")
      .Add({})
      .Set(drafted > 0 ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0.0);
  set(gauge("switchyard_executors_running", "Executors alive (each with its model loaded)."), {},
      executors);

  // The supervisor's view: pairs by state, scale events, failures, re-queues.
  const SupervisorStats& sv = s.supervisor;
  auto& pairs = gauge(
      "switchyard_executors",
      "Batcher+executor pairs by state: running (taking work) or retiring (finishing, then gone).");
  set(pairs, {{"state", "running"}}, sv.executors);
  set(pairs, {{"state", "retiring"}}, sv.executors_retiring);
  auto& scale = counter("switchyard_executor_scale_events_total",
                        "Pairs added under load (up) and retired when idle (down).");
  add(scale, {{"direction", "up"}}, sv.scale_ups);
  add(scale, {{"direction", "down"}}, sv.scale_downs);
  auto& failures = counter("switchyard_executor_failures_total",
                           "Executors that failed and were replaced: crash (threw, or its batcher "
                           "died) or hang (caught by the step watchdog).");
  add(failures, {{"reason", "crash"}}, sv.failures_crash);
  add(failures, {{"reason", "hang"}}, sv.failures_hang);
  add(counter("switchyard_jobs_requeued_total",
              "Jobs sent back to the router after their executor failed, to run elsewhere."),
      {}, sv.requeued);
  auto& lost = counter("switchyard_batcher_lost_jobs_total",
                       "Jobs held by a batcher that itself went down: re-queued by the router, or "
                       "failed (streamed, or past their retries).");
  add(lost, {{"outcome", "requeued"}}, r.lost_requeued);
  add(lost, {{"outcome", "failed"}}, r.lost_failed);

  const EdgeStats& g = s.gateway;
  add(counter("switchyard_curve_refused_total",
              "CURVE handshakes refused because the client key is not in the allow-list."),
      {}, g.curve_refused);
  add(counter("switchyard_intake_refused_total",
              "Requests answered overloaded at the edge because admission had "
              "endpoints.max_waiting_requests (or _bytes) waiting."),
      {}, g.intake_refused);
  auto& refused = counter(
      "switchyard_connections_refused_total",
      "Client connections closed as they came, by the cap they met: per_address "
      "(endpoints.max_connections_per_address), total (endpoints.max_connections), handshaking "
      "(endpoints.max_handshaking).");
  add(refused, {{"reason", "per_address"}}, g.connections_refused_per_address);
  add(refused, {{"reason", "total"}}, g.connections_refused_total);
  add(refused, {{"reason", "handshaking"}}, g.connections_refused_handshaking);
  set(gauge("switchyard_connections_open",
            "Client connections open on the request endpoint and the pipeline input."),
      {}, g.connections_open);
  set(gauge("switchyard_connections_handshaking",
            "Of the open client connections, those not yet past the CURVE allow-list."),
      {}, g.connections_handshaking);

  if (st.w.journal) {
    // Journal health (docs/durability.md, "A full disk"): refused writes, and whether the journal
    // refuses now (new jobs then get `unavailable`, finished jobs' results wait).
    const JournalStats& j = s.journal;
    add(counter("switchyard_journal_write_errors_total",
                "Journal writes, syncs and compactions the file system refused (disk full, I/O)."),
        {}, j.write_errors);
    set(gauge("switchyard_journal_failing",
              "1 from a refused journal write until the next good one, else 0."),
        {}, j.failing);
    add(counter("switchyard_journal_refused_jobs_total",
                "Submits refused (unavailable) because the journal could not write them."),
        {}, j.refused);
    set(gauge("switchyard_journal_held_results",
              "Finished jobs whose result record waits for room in the journal (replies held)."),
        {}, j.unwritten);
  }
}

std::string render(Self* self, const Scrape& s) {
  pm::Registry scraped;
  scraped_series(self, s, scraped);
  auto families = self->state.own->reg.Collect();
  auto more = scraped.Collect();
  families.insert(families.end(), std::make_move_iterator(more.begin()),
                  std::make_move_iterator(more.end()));
  order_labels(families);
  return pm::TextSerializer().Serialize(families);
}

void answered(Self* self, const std::shared_ptr<Scrape>& s) {
  if (--s->owed == 0) s->rp.deliver(render(self, *s));
}

// Asks `a` for its stats record R; `keep` stores the answer. No answer in time: the scrape goes
// on with what it has (zeros, or a batcher's last values).
template <class R, class Handle, class Keep>
void ask(Self* self, const std::shared_ptr<Scrape>& s, const Handle& a, Keep keep) {
  ++s->owed;
  self->request(a, self->state.w.ask_timeout, stats_atom::value)
      .then(
          [=](R& r) {
            keep(r);
            answered(self, s);
          },
          [=](caf::error&) { answered(self, s); });
}

caf::typed_response_promise<std::string> scrape(Self* self) {
  auto s = std::make_shared<Scrape>();
  s->rp = self->make_response_promise<std::string>();
  auto& st = self->state;
  ++s->owed;  // held until every request is out, so an early answer cannot complete the scrape
  if (st.w.admission)
    ask<AdmissionStats>(self, s, st.w.admission, [s](AdmissionStats& r) { s->admission = r; });
  if (st.w.router)
    ask<RouterStats>(self, s, st.w.router, [s](RouterStats& r) { s->router = std::move(r); });
  if (st.w.supervisor)
    ask<SupervisorStats>(self, s, st.w.supervisor,
                         [s](SupervisorStats& r) { s->supervisor = std::move(r); });
  if (st.w.journal)
    ask<JournalStats>(self, s, st.w.journal, [s](JournalStats& r) { s->journal = r; });
  if (st.w.gateway_stats) s->gateway = st.w.gateway_stats();
  for (auto& [id, p] : st.pairs) {
    if (!p.batcher_alive) continue;
    ask<BatcherStats>(self, s, p.batcher, [self, s, id = id](BatcherStats& r) {
      auto it = self->state.pairs.find(id);
      if (it != self->state.pairs.end()) it->second.last = r;
      s->batchers[id] = std::move(r);
    });
  }
  answered(self, s);
  return s->rp;
}

void on_down(Self* self, const caf::down_msg& dm) {
  auto& st = self->state;
  for (auto it = st.pairs.begin(); it != st.pairs.end();) {
    auto& p = it->second;
    if (p.batcher_alive && p.batcher && p.batcher.address() == dm.source) {
      p.batcher_alive = false;
    }
    if (p.executor_alive && p.executor && p.executor.address() == dm.source)
      p.executor_alive = false;
    if (!p.batcher_alive && !p.executor_alive) {
      // Its counters move into the retired totals so that they never go backwards.
      st.retired.preemptions += p.last.preemptions;
      st.retired.preemptions_by[p.label] += p.last.preemptions;
      st.retired.policy_swaps += p.last.policy_swaps;
      st.retired.seq_failures += p.last.seq_failures;
      st.retired.spec_draft_tokens += p.last.spec_draft_tokens;
      st.retired.spec_accepted_tokens += p.last.spec_accepted_tokens;
      st.retired.spec_seq_steps += p.last.spec_seq_steps;
      st.retired.spec_steps += p.last.spec_steps;
      st.retired.steps_done += p.last.steps_done;
      st.retired.step_us += p.last.step_us;
      st.retired.steps_interrupted += p.last.steps_interrupted;
      it = st.pairs.erase(it);
    } else {
      ++it;
    }
  }
}

void add_pair(Self* self, const BatcherActor& batcher, const ExecutorActor& executor,
              std::string label) {
  auto& st = self->state;
  Pair p;
  p.batcher = batcher;
  p.executor = executor;
  p.label = std::move(label);
  p.batcher_alive = static_cast<bool>(batcher);
  p.executor_alive = static_cast<bool>(executor);
  if (batcher) self->monitor(batcher);
  if (executor) self->monitor(executor);
  st.pairs.emplace(st.next_pair++, std::move(p));
}

MetricsActor::behavior_type metrics_actor(Self* self, MetricsWiring w) {
  self->state.w = std::move(w);
  self->state.configured.insert(self->state.w.tenants.begin(), self->state.w.tenants.end());
  self->set_down_handler([self](caf::down_msg& dm) { on_down(self, dm); });
  return {
      [self](finished_atom, const JobOutcome& o, const std::string& cls) { record(self, o, cls); },
      [self](observe_atom, const BatcherActor& batcher, const ExecutorActor& executor) {
        add_pair(self, batcher, executor, std::to_string(self->state.next_pair));
      },
      [self](observe_atom, const BatcherActor& batcher, const ExecutorActor& executor,
             int32_t slot) { add_pair(self, batcher, executor, std::to_string(slot)); },
      [self](recovered_atom, int64_t fault_us, int64_t at_us) {
        observe(self->state.own->recovery, static_cast<double>(at_us - fault_us) / 1e6);
      },
      [self](metrics_atom) { return scrape(self); },
      // Ready: an executor has its model loaded and admission takes work (not draining, by
      // `ctl drain` or at shutdown), so that a load balancer stops sending to a draining server.
      [self](ready_atom) -> caf::result<bool> {
        bool alive = false;
        for (const auto& [id, p] : self->state.pairs) alive = alive || p.executor_alive;
        if (!alive || !self->state.w.admission) return alive;
        auto rp = self->make_response_promise<bool>();
        self->request(self->state.w.admission, self->state.w.ask_timeout, stats_atom::value)
            .then([rp](AdmissionStats& s) mutable { rp.deliver(s.draining == 0); },
                  // An admission that cannot answer in time is not taking work either.
                  [rp](caf::error&) mutable { rp.deliver(false); });
        return rp;
      },
  };
}

}  // namespace

MetricsActor spawn_metrics(caf::actor_system& sys, MetricsWiring wiring) {
  return sys.spawn(metrics_actor, std::move(wiring));
}

}  // namespace sy
