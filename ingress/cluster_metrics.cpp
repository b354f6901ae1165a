// The cluster node's series on /metrics (docs/metrics.md, "Cluster"): consumer lag per class as
// an autoscaler reads it, the node's fetch/ack/result counters and its NATS connection.
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "ingress/cluster_node.hpp"

namespace sy::cluster {

namespace pm = prometheus;

std::string metrics_text(const NodeStats& s, const std::vector<std::string>& classes) {
  pm::Registry reg;
  auto gauge = [&](const char* name, const char* help) -> pm::Family<pm::Gauge>& {
    return pm::BuildGauge().Name(name).Help(help).Register(reg);
  };
  // Counters kept by the node: each scrape's registry starts them at their current value.
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    pm::BuildCounter().Name(name).Help(help).Register(reg).Add({}).Increment(
        static_cast<double>(v));
  };
  auto& pending = gauge("switchyard_cluster_consumer_pending",
                        "Jobs queued in SWITCHYARD_JOBS for this class, not yet delivered to any "
                        "node (the durable consumer's lag; an autoscaler's input).");
  auto& ack_pending = gauge("switchyard_cluster_consumer_ack_pending",
                            "Jobs of this class delivered to some node and not yet acknowledged.");
  auto& redelivering = gauge(
      "switchyard_cluster_consumer_redelivered",
      "Jobs of this class delivered more than once and not yet acknowledged (JetStream's count).");
  for (size_t i = 0; i < s.lag.size() && i < classes.size(); ++i) {
    const pm::Labels l{{"class", classes[i]}};
    pending.Add(l).Set(static_cast<double>(s.lag[i].pending));
    ack_pending.Add(l).Set(static_cast<double>(s.lag[i].ack_pending));
    redelivering.Add(l).Set(static_cast<double>(s.lag[i].redelivered));
  }
  gauge("switchyard_cluster_connected", "1 while the node's NATS connection is up, else 0.")
      .Add({})
      .Set(s.link.connected ? 1 : 0);
  gauge("switchyard_cluster_joined",
        "1 once the node has bound the jobs and results streams and its consumers, else 0.")
      .Add({})
      .Set(s.joined ? 1 : 0);
  gauge("switchyard_cluster_in_flight", "Jobs fetched by this node and not yet ended here.")
      .Add({})
      .Set(static_cast<double>(s.in_flight));
  gauge("switchyard_cluster_held",
        "Jobs delivered to this node and not started yet (beyond its credit): kept alive with "
        "in-progress acks.")
      .Add({})
      .Set(static_cast<double>(s.waiting));
  gauge("switchyard_cluster_results_waiting",
        "Results and stream chunks of this node not yet published (NATS away, or behind).")
      .Add({})
      .Set(static_cast<double>(s.results_waiting));
  counter("switchyard_cluster_fetched_total", "Jobs this node fetched from SWITCHYARD_JOBS.",
          s.link.fetched);
  counter("switchyard_cluster_redelivered_total",
          "Jobs this node fetched that JetStream had delivered before (to a node that died, or "
          "that gave them back).",
          s.link.redelivered);
  counter("switchyard_cluster_acked_total",
          "Jobs this node acknowledged, each after its result was stored.", s.link.acked);
  counter("switchyard_cluster_results_published_total",
          "Results stored in SWITCHYARD_RESULTS (JetStream acknowledged the publish).",
          s.link.results_published);
  counter("switchyard_cluster_publish_failures_total",
          "Result publishes that JetStream did not acknowledge (each is retried).",
          s.link.publish_failures);
  counter("switchyard_cluster_duplicate_results_total",
          "Results JetStream dropped as re-publishes of one already stored (a job run twice, or "
          "a redelivered key answered from this node's result cache).",
          s.link.duplicate_results);
  counter("switchyard_cluster_held_total",
          "Jobs delivered to this node that waited in it for credit (more than it could start, "
          "or delivered after their fetch returned), each kept alive by in-progress acks.",
          s.held);
  counter("switchyard_cluster_cancels_heard_total",
          "Cancels this node learned, heard on switchyard.cancel or read from SWITCHYARD_CANCELS "
          "(a key and token once).",
          s.cancels_heard);
  counter("switchyard_cluster_requeued_total",
          "Jobs this node gave back for redelivery (full, over a tenant's rate, shutting down).",
          s.requeued);
  counter("switchyard_cluster_bad_jobs_total",
          "Job bodies that were no valid submit: answered with an error result and acknowledged.",
          s.bad_jobs);
  counter("switchyard_cluster_cancelled_at_fetch_total",
          "Jobs fetched after a cancel of their key: answered done (cancelled), never run.",
          s.cancelled_at_fetch);
  counter("switchyard_cluster_disconnects_total", "Times the NATS connection was lost.",
          s.link.disconnects);
  counter("switchyard_cluster_reconnects_total", "Times the NATS connection was re-established.",
          s.link.reconnects);
  counter("switchyard_cluster_connect_failures_total",
          "Attempts to join the cluster at start that found no NATS server.", s.connect_failures);
  return pm::TextSerializer().Serialize(reg.Collect());
}

}  // namespace sy::cluster
