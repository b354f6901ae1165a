// The cluster side of a node (docs/cluster.md): takes jobs from NATS JetStream as far as the
// router's PULL credit allows, highest class first, hands them to admission like submits, publishes
// each result with a publish-ack before acknowledging its job, and hears cluster-wide cancels.
// Plain C++ (std::function hooks): the server wires it to its actors.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ingress/cluster_config.hpp"
#include "ingress/codec.hpp"
#include "ingress/egress.hpp"
#include "ingress/nats_link.hpp"

namespace sy::cluster {

/// What the node calls in the rest of the server. Set before start(); cleared by stop().
struct NodeHooks {
  /// Takes up to `n` of the PULL credit that the pipeline input shares; returns how many it took.
  std::function<uint32_t(uint32_t n)> take_credit;
  /// Gives back credit taken and not used.
  std::function<void(uint32_t n)> return_credit;
  /// A fetched job for admission (client kind cluster, identity: the delivery's handle).
  std::function<void(SubmitRequest)> submit;
  /// A cancel heard on switchyard.cancel for a job running here, for admission.
  std::function<void(KeyRequest)> cancel;
};

/// The node's settings.
struct NodeOptions {
  ClusterConfig cluster;
  /// Priority class names in fetch order, most important first (the router's ranks).
  std::vector<std::string> classes;
  /// The gateway's decode limits: a job body is checked exactly as a ZeroMQ submit.
  wire::DecodeLimits limits;
  /// One connection attempt waits this long for a NATS server; the node then retries with the
  /// reconnect backoff (0: a single try per attempt, each failure counted).
  int64_t connect_timeout_ms = 0;
};

/// The node's counters (metrics, tests); a snapshot.
struct NodeStats {
  LinkCounters link;              ///< fetched, acked, redelivered, results, reconnects, connected
  std::vector<ClassLag> lag;      ///< per class in NodeOptions::classes order (empty: not joined)
  bool joined = false;            ///< streams and consumers are bound
  uint64_t connect_failures = 0;  ///< connection attempts that found no NATS server
  uint64_t bad_jobs = 0;          ///< bodies that were no valid submit: error result, acked
  /// Cancels this node learned, heard on switchyard.cancel or read from SWITCHYARD_CANCELS (a
  /// key and token counted once).
  uint64_t cancels_heard = 0;
  uint64_t cancelled_at_fetch = 0;  ///< jobs fetched after their cancel: done cancelled, acked
  /// Jobs JetStream delivered that the node could not start at once (more than its credit, or
  /// still in its pull subscription's buffer after their fetch returned): held, kept alive with
  /// in-progress acks, and started first when credit comes.
  uint64_t held = 0;
  int64_t waiting = 0;          ///< jobs held now
  uint64_t requeued = 0;        ///< jobs given back (nak) for another node or a later try
  uint64_t result_retries = 0;  ///< result publishes retried (NATS down, no pub-ack)
  uint64_t ack_failures = 0;    ///< stored results whose job ack never got through
  int64_t in_flight = 0;        ///< fetched jobs not yet ended here
  int64_t results_waiting = 0;  ///< results and chunks not yet published
};

/// The NATS headers a node puts on every result it publishes (the body is the results socket's
/// msgpack done/error, unchanged).
inline constexpr const char* kNodeHeader = "Switchyard-Node";           ///< the node's name
inline constexpr const char* kFetchedHeader = "Switchyard-Fetched-At";  ///< unix ms
inline constexpr const char* kStartedHeader = "Switchyard-Started-At";  ///< unix ms (done only)
inline constexpr const char* kDeliveryHeader = "Switchyard-Delivery";   ///< JetStream's count

class ClusterNode : public Outbox {
 public:
  explicit ClusterNode(NodeOptions options);
  /// stop() with no grace when still running.
  ~ClusterNode() override;
  ClusterNode(const ClusterNode&) = delete;
  ClusterNode& operator=(const ClusterNode&) = delete;

  void set_hooks(NodeHooks hooks);
  /// Starts the threads. The connection is made in the background, retried with backoff until
  /// a NATS server answers: the node serves its ZeroMQ endpoints meanwhile.
  void start();
  /// Takes no more jobs (shutdown's first phase) and gives the held ones back; what runs goes on.
  void stop_fetching();
  /// Gives every job still running back to JetStream for another node (shutdown, grace over):
  /// their later events are dropped instead of published as results.
  void release_running();
  /// Publishes what is queued for up to `grace`, gives back what is left, closes the link and
  /// joins the threads. Idempotent.
  void stop(std::chrono::milliseconds grace);

  /// Takes an encoded event of a cluster client from egress (thread-safe, never blocks on NATS).
  void post(OutMessage m) override;
  /// Unused: the node takes its credit through NodeHooks::take_credit.
  void add_pull_credit(uint32_t) override {}

  /// A snapshot; `with_lag` asks JetStream for each class's consumer state (a request each).
  NodeStats stats(bool with_lag = true) const;

  /// The node's name in results and logs (ClusterConfig::node_name, or host:pid).
  const std::string& name() const;
  /// The class names in fetch order (NodeOptions::classes).
  const std::vector<std::string>& classes() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

/// The Prometheus text (format 0.0.4) of a node's counters: switchyard_cluster_* series
/// (docs/metrics.md), appended to /metrics.
std::string metrics_text(const NodeStats& s, const std::vector<std::string>& classes);

}  // namespace sy::cluster
