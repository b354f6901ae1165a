// The Prometheus text format writer and the metrics actor (see metrics.hpp). Job counters and
// latency histograms come from the JobOutcomes admission forwards; gauges are asked from the
// actors at scrape time, so no actor shares state with another.
#include "actors/metrics.hpp"

#include <caf/all.hpp>
#include <charconv>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <tuple>

#include "actors/control.hpp"
#include "actors/messages.hpp"
#include "ingress/error_code.hpp"

namespace sy {
namespace prom {

std::string escape_label(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string escape_help(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Counts up to 2^53 are exact in a double: print them as integers, as every parser expects.
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0)
    return std::to_string(static_cast<int64_t>(v));
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest form that reads back exactly
  return std::string(buf, r.ptr);
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && !(bounds_[i - 1] < bounds_[i])))
      throw std::invalid_argument("histogram bounds must be finite and strictly ascending");
  }
  counts_.assign(bounds_.size() + 1, 0);
}

void Histogram::observe(double v) {
  if (std::isnan(v)) return;
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void TextWriter::family(std::string_view name, std::string_view type, std::string_view help) {
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  out_ += escape_help(help);
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += type;
  out_ += '\n';
}

void TextWriter::sample(std::string_view name, const Labels& labels, double value) {
  out_ += name;
  if (!labels.empty()) {
    out_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i) out_ += ',';
      out_ += labels[i].first;
      out_ += "=\"";
      out_ += escape_label(labels[i].second);
      out_ += '"';
    }
    out_ += '}';
  }
  out_ += ' ';
  out_ += format_value(value);
  out_ += '\n';
}

void TextWriter::histogram(std::string_view name, const Labels& labels, const Histogram& h) {
  std::string bucket = std::string(name) + "_bucket";
  Labels l = labels;
  l.emplace_back("le", "");
  uint64_t cum = 0;
  for (size_t i = 0; i < h.bounds().size(); ++i) {
    cum += h.counts()[i];
    l.back().second = format_value(h.bounds()[i]);
    sample(bucket, l, static_cast<double>(cum));
  }
  l.back().second = "+Inf";
  sample(bucket, l, static_cast<double>(h.count()));
  sample(std::string(name) + "_sum", labels, h.sum());
  sample(std::string(name) + "_count", labels, static_cast<double>(h.count()));
}

}  // namespace prom

namespace {

// Latency bounds in seconds: from a millisecond (the demo model's step on CPU) to five minutes
// (a long generation of a large model on CPU), roughly 2.5x apart so a quantile estimate from
// them is within a bucket's width.
const std::vector<double> kLatencyBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                            1,     2.5,    5,     10,   30,    60,   120, 300};
// Per output token: a fraction of a millisecond (tiny models, big batches) to a few seconds (a
// large model on a loaded CPU).
const std::vector<double> kTokenBounds = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                          0.075,  0.1,   0.25,   0.5,   1,    2.5,   5};

// The four per-class latency histograms.
struct ClassHistograms {
  prom::Histogram queue{kLatencyBounds}, ttft{kLatencyBounds}, tpot{kTokenBounds},
      e2e{kLatencyBounds};
};

// One batcher+executor pair and the batcher's last stats (kept so that its counters survive it).
struct Pair {
  caf::actor batcher, executor;
  std::string label;  // its executor="..." label value
  bool batcher_alive = true, executor_alive = true;
  caf::settings last;
};

// Counters of the batchers that are gone, so the totals never go backwards.
struct Retired {
  int64_t preemptions = 0, policy_swaps = 0, seq_failures = 0;
  std::map<std::string, int64_t> preemptions_by;  // by executor label
};

struct MetricsState {
  MetricsWiring w;
  // (class, tenant, outcome) -> jobs
  std::map<std::tuple<std::string, std::string, std::string>, uint64_t> jobs;
  std::map<std::string, ClassHistograms> hist;  // by class
  std::set<std::string> configured;             // w.tenants: always a label of their own
  std::set<std::string> labelled;  // other tenants given one, w.max_tenant_labels at most
  uint64_t prompt_tokens = 0, generation_tokens = 0, prefix_hit_tokens = 0;
  std::map<uint64_t, Pair> pairs;  // by registration number
  uint64_t next_pair = 0;
  Retired retired;
  // Fault to first re-queued job running again. The same bounds as job latencies: a crash
  // recovers in milliseconds, a hang only after the step watchdog (30 s by default).
  prom::Histogram recovery{kLatencyBounds};

  static inline const char* name = "sy.metrics";
};

using Self = caf::stateful_actor<MetricsState>;

std::string outcome_name(const JobOutcome& o) {
  if (o.outcome == 0) return "done";
  if (o.outcome == 2) return "cancelled";
  uint8_t code = o.code != 0 ? o.code : o.error.code;
  if (code < detail::error_code_names.size())
    return std::string(to_string(static_cast<ErrorCode>(code)));
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
  ++st.jobs[{cls, tenant_label(st, o.tenant), outcome_name(o)}];
  if (o.outcome == 0 || o.outcome == 2) {
    st.prompt_tokens += o.done.prompt_tokens;
    st.generation_tokens += o.done.completion_tokens;
    st.prefix_hit_tokens += o.done.cached_tokens;
  }
  if (o.outcome != 0) return;  // latencies of finished jobs only: a cancelled one has no end-to-end
  const auto& d = o.done;
  auto& h = st.hist[cls];
  h.queue.observe(d.queue_ms / 1000.0);
  h.e2e.observe(d.total_ms / 1000.0);
  if (d.completion_tokens > 0) h.ttft.observe(d.ttft_ms / 1000.0);
  // The first token's time is TTFT; the rest are spread over the following tokens.
  if (d.completion_tokens > 1 && d.total_ms >= d.ttft_ms)
    h.tpot.observe((d.total_ms - d.ttft_ms) / 1000.0 / (d.completion_tokens - 1));
}

// The answers of one scrape.
struct Scrape {
  caf::response_promise rp;
  size_t owed = 0;
  caf::settings admission, router, supervisor, gateway, journal;
  std::map<uint64_t, caf::settings> batchers;  // answered this time (others: their last stats)
};

std::string render(Self* self, const Scrape& s) {
  auto& st = self->state;
  prom::TextWriter w;
  using prom::Labels;

  w.family("switchyard_jobs_total", "counter",
           "Jobs that ended, by priority class, tenant and outcome (done, cancelled or the error "
           "code).");
  for (const auto& [k, n] : st.jobs)
    w.sample(
        "switchyard_jobs_total",
        Labels{{"class", std::get<0>(k)}, {"tenant", std::get<1>(k)}, {"outcome", std::get<2>(k)}},
        static_cast<double>(n));

  w.family("switchyard_jobs_rejected_total", "counter",
           "Submits refused by admission before they were queued, by reason.");
  for (const char* r : {"unauthorized", "rate_limited", "overloaded", "bad_request", "unavailable"})
    w.sample("switchyard_jobs_rejected_total", Labels{{"reason", r}},
             static_cast<double>(stats_counter(s.admission, r)));

  w.family("switchyard_jobs_active", "gauge", "Jobs admitted and not yet ended.");
  w.sample("switchyard_jobs_active", {}, static_cast<double>(stats_counter(s.admission, "active")));

  w.family("switchyard_queue_depth", "gauge",
           "Jobs waiting in the router's queues, by priority class.");
  for (const auto& c : st.w.classes)
    w.sample("switchyard_queue_depth", Labels{{"class", c}},
             static_cast<double>(stats_counter(s.router, "queued_" + c)));
  w.family("switchyard_prefix_affinity_dispatches_total", "counter",
           "Jobs whose prompt prefix had gone to a batcher before: result hit (sent there again) "
           "or overruled (sent to a freer batcher, the other being too busy).");
  w.sample("switchyard_prefix_affinity_dispatches_total", Labels{{"result", "hit"}},
           static_cast<double>(stats_counter(s.router, "affinity_hits")));
  w.sample("switchyard_prefix_affinity_dispatches_total", Labels{{"result", "overruled"}},
           static_cast<double>(stats_counter(s.router, "affinity_overruled")));

  // Gauges and counters summed over the pairs: this scrape's answers, else the last known ones.
  int64_t running = 0, used = 0, freeb = 0, cached = 0, total = 0, preempt = 0, swaps = 0;
  int64_t seq_failures = 0;
  int64_t executors = 0;
  int64_t wused = 0, wfree = 0, wtotal = 0;  // window-group blocks (two-group models)
  // The same per executor label. A label may hold two pairs for a moment (a replacement spawned
  // before the metrics actor saw its predecessor go): their figures add up.
  struct PerExecutor {
    int64_t used = 0, freeb = 0, cached = 0, total = 0, preempt = 0;
    bool live = false;  // a live batcher: its gauges are written
  };
  std::map<std::string, PerExecutor> by;
  for (const auto& [label, n] : st.retired.preemptions_by) by[label].preempt += n;
  for (const auto& [id, p] : st.pairs) {
    if (p.executor_alive) ++executors;
    auto it = s.batchers.find(id);
    const caf::settings& b = it != s.batchers.end() ? it->second : p.last;
    auto& e = by[p.label];
    preempt += stats_counter(b, "preemptions");
    e.preempt += stats_counter(b, "preemptions");
    swaps += stats_counter(b, "policy_swaps");
    seq_failures += stats_counter(b, "seq_failures");
    if (!p.batcher_alive) continue;
    e.live = true;
    running += stats_counter(b, "running");
    used += stats_counter(b, "blocks_used");
    freeb += stats_counter(b, "blocks_free");
    cached += stats_counter(b, "blocks_cached");
    total += stats_counter(b, "blocks_total");
    wused += stats_counter(b, "window_blocks_used");
    wfree += stats_counter(b, "window_blocks_free");
    wtotal += stats_counter(b, "window_blocks_total");
    e.used += stats_counter(b, "blocks_used");
    e.freeb += stats_counter(b, "blocks_free");
    e.cached += stats_counter(b, "blocks_cached");
    e.total += stats_counter(b, "blocks_total");
  }
  // Per-executor series live in families of their own (switchyard_executor_*), so that a sum()
  // over any family counts each block once. Gauges of live executors only; counters of every
  // executor label ever seen (they never go backwards, so a label stays once it has appeared).
  auto per_executor = [&](const char* name, const std::string& help, int64_t PerExecutor::*field,
                          bool counter) {
    w.family(name, counter ? "counter" : "gauge", help + " (by executor slot).");
    for (const auto& [label, e] : by)
      if (counter || e.live)
        w.sample(name, Labels{{"executor", label}}, static_cast<double>(e.*field));
  };
  w.family("switchyard_jobs_running", "gauge", "Sequences running in the batchers.");
  w.sample("switchyard_jobs_running", {}, static_cast<double>(running));

  const std::string kv = "Paged KV-cache blocks";
  w.family("switchyard_kv_blocks_used", "gauge", kv + " held by running sequences, all executors.");
  w.sample("switchyard_kv_blocks_used", {}, static_cast<double>(used));
  w.family("switchyard_kv_blocks_free", "gauge", kv + " free, all executors.");
  w.sample("switchyard_kv_blocks_free", {}, static_cast<double>(freeb));
  w.family("switchyard_kv_blocks_cached", "gauge",
           kv + " unreferenced but kept for prefix reuse, all executors.");
  w.sample("switchyard_kv_blocks_cached", {}, static_cast<double>(cached));
  w.family("switchyard_kv_blocks_total", "gauge", kv + " in all, all executors.");
  w.sample("switchyard_kv_blocks_total", {}, static_cast<double>(total));
  w.family("switchyard_kv_cache_usage_ratio", "gauge", "Fraction of KV blocks held by sequences.");
  w.sample("switchyard_kv_cache_usage_ratio", {},
           total > 0 ? static_cast<double>(used) / static_cast<double>(total) : 0.0);
  // A model whose layers are of two kinds keeps its windowed layers' K/V in a pool of its own
  // (docs/kv_policies.md); the kv_blocks_* families above are then the full-attention layers'.
  const std::string kvw = "KV-cache blocks of the layers with a window of their own";
  w.family("switchyard_kv_window_blocks_used", "gauge",
           kvw + " held by running sequences, all executors (0 with one group).");
  w.sample("switchyard_kv_window_blocks_used", {}, static_cast<double>(wused));
  w.family("switchyard_kv_window_blocks_free", "gauge", kvw + " free, all executors.");
  w.sample("switchyard_kv_window_blocks_free", {}, static_cast<double>(wfree));
  w.family("switchyard_kv_window_blocks_total", "gauge", kvw + " in all, all executors.");
  w.sample("switchyard_kv_window_blocks_total", {}, static_cast<double>(wtotal));
  per_executor("switchyard_executor_kv_blocks_used", kv + " held by running sequences",
               &PerExecutor::used, false);
  per_executor("switchyard_executor_kv_blocks_free", kv + " free", &PerExecutor::freeb, false);
  per_executor("switchyard_executor_kv_blocks_cached", kv + " kept for prefix reuse",
               &PerExecutor::cached, false);
  per_executor("switchyard_executor_kv_blocks_total", kv + " in all", &PerExecutor::total, false);

  w.family("switchyard_preemptions_total", "counter",
           "Sequences preempted under KV pressure, all executors.");
  w.sample("switchyard_preemptions_total", {},
           static_cast<double>(preempt + st.retired.preemptions));
  per_executor("switchyard_executor_preemptions_total", "Sequences preempted under KV pressure",
               &PerExecutor::preempt, true);
  w.family("switchyard_sequence_failures_total", "counter",
           "Sequences ended alone by their executor (refused sampling state, non-finite logits); "
           "the other sequences of their step went on.");
  w.sample("switchyard_sequence_failures_total", {},
           static_cast<double>(seq_failures + st.retired.seq_failures));
  w.family("switchyard_kv_policy_swaps_total", "counter",
           "KV-cache policy swaps, by command and by watermark.");
  w.sample("switchyard_kv_policy_swaps_total", {},
           static_cast<double>(swaps + st.retired.policy_swaps));
  w.family("switchyard_executors_running", "gauge",
           "Executors alive (each with its model loaded).");
  w.sample("switchyard_executors_running", {}, static_cast<double>(executors));

  // The supervisor's view: pairs by state, scale events, failures, re-queues, recoveries.
  const caf::settings& sv = s.supervisor;
  w.family(
      "switchyard_executors", "gauge",
      "Batcher+executor pairs by state: running (taking work) or retiring (finishing, then gone).");
  w.sample("switchyard_executors", Labels{{"state", "running"}},
           static_cast<double>(stats_counter(sv, "executors")));
  w.sample("switchyard_executors", Labels{{"state", "retiring"}},
           static_cast<double>(stats_counter(sv, "executors_retiring")));
  w.family("switchyard_executor_scale_events_total", "counter",
           "Pairs added under load (up) and retired when idle (down).");
  w.sample("switchyard_executor_scale_events_total", Labels{{"direction", "up"}},
           static_cast<double>(stats_counter(sv, "scale_ups")));
  w.sample("switchyard_executor_scale_events_total", Labels{{"direction", "down"}},
           static_cast<double>(stats_counter(sv, "scale_downs")));
  w.family("switchyard_executor_failures_total", "counter",
           "Executors that failed and were replaced: crash (threw, or its batcher died) or hang "
           "(caught by the step watchdog).");
  w.sample("switchyard_executor_failures_total", Labels{{"reason", "crash"}},
           static_cast<double>(stats_counter(sv, "failures_crash")));
  w.sample("switchyard_executor_failures_total", Labels{{"reason", "hang"}},
           static_cast<double>(stats_counter(sv, "failures_hang")));
  w.family("switchyard_jobs_requeued_total", "counter",
           "Jobs sent back to the router after their executor failed, to run elsewhere.");
  w.sample("switchyard_jobs_requeued_total", {},
           static_cast<double>(stats_counter(sv, "requeued")));
  w.family("switchyard_batcher_lost_jobs_total", "counter",
           "Jobs held by a batcher that itself went down: re-queued by the router, or failed "
           "(streamed, or past their retries).");
  w.sample("switchyard_batcher_lost_jobs_total", Labels{{"outcome", "requeued"}},
           static_cast<double>(stats_counter(s.router, "lost_requeued")));
  w.sample("switchyard_batcher_lost_jobs_total", Labels{{"outcome", "failed"}},
           static_cast<double>(stats_counter(s.router, "lost_failed")));
  w.family("switchyard_recovery_seconds", "histogram",
           "Time from an executor fault to the first of its re-queued jobs running again.");
  w.histogram("switchyard_recovery_seconds", {}, st.recovery);

  w.family("switchyard_curve_refused_total", "counter",
           "CURVE handshakes refused because the client key is not in the allow-list.");
  w.sample("switchyard_curve_refused_total", {},
           static_cast<double>(stats_counter(s.gateway, "curve_refused")));
  w.family("switchyard_intake_refused_total", "counter",
           "Requests answered overloaded at the edge because admission had "
           "endpoints.max_waiting_requests (or _bytes) waiting.");
  w.sample("switchyard_intake_refused_total", {},
           static_cast<double>(stats_counter(s.gateway, "intake_refused")));
  w.family("switchyard_connections_refused_total", "counter",
           "Client connections closed as they came because their endpoint had "
           "endpoints.max_connections open.");
  w.sample("switchyard_connections_refused_total", {},
           static_cast<double>(stats_counter(s.gateway, "connections_refused")));
  w.family("switchyard_connections_open", "gauge",
           "Client connections open on the request endpoint and the pipeline input.");
  w.sample("switchyard_connections_open", {},
           static_cast<double>(stats_counter(s.gateway, "connections_open")));

  if (st.w.journal) {
    // Journal health (docs/durability.md, "A full disk"): refused writes, and whether the journal
    // refuses now (new jobs then get `unavailable`, finished jobs' results wait).
    w.family("switchyard_journal_write_errors_total", "counter",
             "Journal writes, syncs and compactions the file system refused (disk full, I/O).");
    w.sample("switchyard_journal_write_errors_total", {},
             static_cast<double>(stats_counter(s.journal, "write_errors")));
    w.family("switchyard_journal_failing", "gauge",
             "1 from a refused journal write until the next good one, else 0.");
    w.sample("switchyard_journal_failing", {},
             static_cast<double>(stats_counter(s.journal, "failing")));
    w.family("switchyard_journal_refused_jobs_total", "counter",
             "Submits refused (unavailable) because the journal could not write them.");
    w.sample("switchyard_journal_refused_jobs_total", {},
             static_cast<double>(stats_counter(s.journal, "refused")));
    w.family("switchyard_journal_held_results", "gauge",
             "Finished jobs whose result record waits for room in the journal (replies held).");
    w.sample("switchyard_journal_held_results", {},
             static_cast<double>(stats_counter(s.journal, "unwritten")));
  }

  w.family("switchyard_prompt_tokens_total", "counter", "Prompt tokens of ended jobs.");
  w.sample("switchyard_prompt_tokens_total", {}, static_cast<double>(st.prompt_tokens));
  w.family("switchyard_generation_tokens_total", "counter",
           "Tokens generated for ended jobs (tokens per second: rate() of this).");
  w.sample("switchyard_generation_tokens_total", {}, static_cast<double>(st.generation_tokens));
  w.family("switchyard_prefix_cache_hit_tokens_total", "counter",
           "Prompt tokens whose KV came from the prefix cache.");
  w.sample("switchyard_prefix_cache_hit_tokens_total", {},
           static_cast<double>(st.prefix_hit_tokens));

  auto hist = [&](const char* name, const char* help, prom::Histogram ClassHistograms::*field) {
    w.family(name, "histogram", help);
    for (const auto& [cls, h] : st.hist) w.histogram(name, Labels{{"class", cls}}, h.*field);
  };
  hist("switchyard_queue_time_seconds",
       "Time from arrival to the first scheduled step (done jobs).", &ClassHistograms::queue);
  hist("switchyard_time_to_first_token_seconds",
       "Time from arrival to the first token (done jobs).", &ClassHistograms::ttft);
  hist("switchyard_time_per_output_token_seconds",
       "Time per output token after the first (done jobs with two or more tokens).",
       &ClassHistograms::tpot);
  hist("switchyard_e2e_request_latency_seconds", "Time from arrival to the end (done jobs).",
       &ClassHistograms::e2e);
  return w.str();
}

void answered(Self* self, const std::shared_ptr<Scrape>& s) {
  if (--s->owed == 0) s->rp.deliver(render(self, *s));
}

caf::response_promise scrape(Self* self) {
  auto s = std::make_shared<Scrape>();
  s->rp = self->make_response_promise();
  auto& st = self->state;
  auto ask = [&](const caf::actor& a, std::function<void(caf::settings&)> keep) {
    ++s->owed;
    self->request(a, st.w.ask_timeout, stats_atom::value)
        .then(
            [=](caf::settings& r) {
              keep(r);
              answered(self, s);
            },
            // No answer in time: the scrape goes on with what it has (zeros or last values).
            [=](caf::error&) { answered(self, s); });
  };
  ++s->owed;  // held until every request is out, so an early answer cannot complete the scrape
  if (st.w.admission) ask(st.w.admission, [s](caf::settings& r) { s->admission = std::move(r); });
  if (st.w.router) ask(st.w.router, [s](caf::settings& r) { s->router = std::move(r); });
  if (st.w.supervisor)
    ask(st.w.supervisor, [s](caf::settings& r) { s->supervisor = std::move(r); });
  if (st.w.journal) ask(st.w.journal, [s](caf::settings& r) { s->journal = std::move(r); });
  if (st.w.gateway_stats) s->gateway = st.w.gateway_stats();
  for (auto& [id, p] : st.pairs) {
    if (!p.batcher_alive) continue;
    ask(p.batcher, [self, s, id = id](caf::settings& r) {
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
      st.retired.preemptions += stats_counter(p.last, "preemptions");
      st.retired.preemptions_by[p.label] += stats_counter(p.last, "preemptions");
      st.retired.policy_swaps += stats_counter(p.last, "policy_swaps");
      st.retired.seq_failures += stats_counter(p.last, "seq_failures");
      it = st.pairs.erase(it);
    } else {
      ++it;
    }
  }
}

void add_pair(Self* self, const caf::actor& batcher, const caf::actor& executor,
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

caf::behavior metrics_actor(Self* self, MetricsWiring w) {
  self->state.w = std::move(w);
  self->state.configured.insert(self->state.w.tenants.begin(), self->state.w.tenants.end());
  self->set_down_handler([self](caf::down_msg& dm) { on_down(self, dm); });
  return {
      [self](finished_atom, const JobOutcome& o, const std::string& cls) { record(self, o, cls); },
      [self](observe_atom, caf::actor& batcher, caf::actor& executor) {
        add_pair(self, batcher, executor, std::to_string(self->state.next_pair));
      },
      [self](observe_atom, caf::actor& batcher, caf::actor& executor, int32_t slot) {
        add_pair(self, batcher, executor, std::to_string(slot));
      },
      [self](recovered_atom, int64_t fault_us, int64_t at_us) {
        self->state.recovery.observe(static_cast<double>(at_us - fault_us) / 1e6);
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
            .then([rp](caf::settings& s) mutable { rp.deliver(stats_counter(s, "draining") == 0); },
                  // An admission that cannot answer in time is not taking work either.
                  [rp](caf::error&) mutable { rp.deliver(false); });
        return rp;
      },
  };
}

}  // namespace

caf::actor spawn_metrics(caf::actor_system& sys, MetricsWiring wiring) {
  return sys.spawn(metrics_actor, std::move(wiring));
}

}  // namespace sy
