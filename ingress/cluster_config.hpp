// Configuration of a node's membership in a cluster: the NATS servers it joins and the JetStream
// streams and consumers that hold the cluster's jobs and results (docs/cluster.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sy {

/// A node's cluster settings (config `cluster`, flag `--nats URL`). Empty `nats`: no cluster.
struct ClusterConfig {
  /// NATS server URLs (nats://HOST:PORT); several for a NATS cluster, tried in turn.
  std::vector<std::string> nats;
  std::string node_name;  ///< the connection's name in NATS (logs, monitoring); "" = host:pid
  /// Copies of each stream across a NATS cluster (1 to 5); 3 survives the loss of one server.
  int replicas = 1;
  /// SWITCHYARD_JOBS holds at most this many queued jobs and bytes. Past either, a producer's
  /// publish is refused (discard new): that refusal is the cluster's "overloaded". A million
  /// jobs is an offline queue's night; 1 GiB is its prompts at about 1 KiB each.
  int64_t max_jobs = 1000000;
  int64_t max_job_bytes = int64_t{1} << 30;
  /// SWITCHYARD_RESULTS keeps results this long (s) and this many bytes at most (oldest go
  /// first): sinks that read within a day lose nothing.
  int64_t results_max_age_s = 86400;
  int64_t results_max_bytes = int64_t{1} << 30;
  /// A job not acknowledged within this long is delivered again (to any node). Running jobs are
  /// kept alive by in-progress acks every ack_wait_ms / 3, so a dead node's jobs come back
  /// after at most this long.
  int64_t ack_wait_ms = 30000;
  /// Jobs fetched and not yet acknowledged, per class, across the whole cluster: the bound on
  /// the work in flight.
  int64_t max_ack_pending = 1024;
  /// JetStream drops a re-published job with the same Nats-Msg-Id (<tenant>/<id>) within this
  /// window (JetStream's own default, two minutes).
  int64_t duplicate_window_ms = 120000;
  /// Jobs this node holds at once (fetched, not yet ended), on top of the router's PULL credit:
  /// work beyond what its batchers run soon stays in JetStream, where any node (one started
  /// later too) can take it, instead of waiting in this node's queues. 0: credit alone.
  int64_t max_in_flight = 64;
  /// Reconnection: the first retry waits this long, doubling up to reconnect_max_ms, for ever.
  int64_t reconnect_wait_ms = 100;
  int64_t reconnect_max_ms = 5000;
  /// SWITCHYARD_CANCELS keeps each cancel this long (s), so that a node started or reconnected
  /// later still refuses to run the cancelled job. At least a day, the longest deadline a job
  /// may name (wire::DecodeLimits::max_deadline_ms): a job that waits longer than that has no
  /// deadline, and its producer can cancel it again.
  int64_t cancels_max_age_s = 86400;
  /// SWITCHYARD_CANCELS holds at most this many cancels (the oldest go first), and each node
  /// remembers as many keys: 100,000 keys of about 150 bytes are 15 MiB a node.
  int64_t max_cancels = 100000;

  /// TESTS ONLY (flag --test-overfetch, no config key): the node keeps up to this many jobs
  /// beyond what it starts in its pull subscriptions' buffers, asked for with pull requests it
  /// does not wait on: what a fetch that returned before its jobs arrived leaves behind.
  int64_t test_overfetch = 0;
  /// TESTS ONLY (flag --test-duplicate-results, no config key): every result goes to the job's
  /// reply subject twice, as a job run twice would send it.
  bool test_duplicate_results = false;
};

}  // namespace sy
