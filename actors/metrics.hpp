// Prometheus metrics: the metrics actor counts finished jobs and gathers the other actors' stats
// records (actors/stats.hpp) when scraped; prometheus-cpp keeps the registry and writes the text.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "actors/protocol.hpp"
#include "actors/stats.hpp"

namespace sy {

namespace prom {

/// The Content-Type of the text format (prometheus-cpp's TextSerializer writes format 0.0.4).
inline constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace prom

/// What the metrics actor reads from. Batcher+executor pairs are added by message (observe_atom),
/// so that pairs spawned later (an elastic supervisor) are counted too.
struct MetricsWiring {
  AdmissionActor admission;
  RouterActor router;
  /// The supervisor, asked for stats_atom at scrape time: executors by state, scale events,
  /// failures by reason, re-queued jobs. May be invalid (then those series read 0).
  SupervisorActor supervisor;
  /// The journal actor (actors/journal.hpp), asked for stats_atom at scrape time: write errors
  /// and whether it is failing now. Invalid without a journal (then those series are left out).
  JournalActor journal;
  /// Reads the gateway's counters (curve_refused, intake_refused, connections_*). The gateway is
  /// no actor; its counters are atomics that any thread may read. Empty: those series read 0.
  std::function<EdgeStats()> gateway_stats;
  /// The priority class names, in the router's order: one queue-depth gauge each.
  std::vector<std::string> classes;
  /// The configured tenants: each keeps a `tenant` label of its own.
  std::vector<std::string> tenants;
  /// Other tenant names (open-tenant mode) labelled as themselves, the first this many seen;
  /// the jobs of later ones are counted under tenant="_other" (metrics.max_tenant_labels).
  std::size_t max_tenant_labels = 1000;
  /// How long one actor may take to answer a scrape: a busy actor answers between messages, well
  /// within this; a stuck one must not hold the scrape (its last known values are used instead).
  std::chrono::milliseconds ask_timeout{1000};
};

/// Spawns the metrics actor. Handles:
///   (finished_atom, JobOutcome, std::string class_name)  one ended job (admission sends them once
///       per job): switchyard_jobs_total{class,tenant,outcome} (tenant: see max_tenant_labels);
///       for outcome done the queue-time, time-to-first-token, time-per-output-token and
///       end-to-end histograms by class; token and prefix-hit counters;
///   (observe_atom, BatcherActor batcher, ExecutorActor executor)  a pair to scrape; both are monitored,
///       a dead batcher's counters stay in the totals, a dead executor stops counting as running;
///       its series carry executor="<registration number>";
///   (observe_atom, BatcherActor batcher, ExecutorActor executor, int32_t slot)  the same from the
///       supervisor: executor="<slot>", so a replacement in the same slot continues its series
///       (per-executor counters keep what the pairs before it counted);
///   (recovered_atom, int64 fault_us, int64 at_us)  one recovery (the supervisor sends the first
///       per fault): switchyard_recovery_seconds observes (at - fault);
///   (metrics_atom) -> std::string  asks admission, router and every batcher for stats_atom (each
///       within ask_timeout) and answers the whole exposition text;
///   (ready_atom) -> bool  whether at least one executor is alive (an executor exists only once its
///       model is loaded: spawn_executor builds the engine before the actor starts) and admission
///       is not draining (`ctl drain`, shutdown).
MetricsActor spawn_metrics(caf::actor_system& sys, MetricsWiring wiring);

}  // namespace sy
