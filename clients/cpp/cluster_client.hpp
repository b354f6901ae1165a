// The cluster side of the C++ client: publishes jobs to a Switchyard cluster's JetStream queue
// and reads their results from a reply subject of its own or from SWITCHYARD_RESULTS
// (docs/cluster.md). The messages are the same wire structs as on ZeroMQ (docs/protocol.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "clients/cpp/client.hpp"

namespace sy::client {

/// The cluster refused a job because SWITCHYARD_JOBS is full (the nodes' cluster.max_jobs or
/// cluster.max_job_bytes, discard-new): the cluster's "overloaded". Nothing was queued; publish
/// it again later.
struct ClusterOverloaded : ClientError {
  using ClientError::ClientError;
};

/// How a ClusterClient connects and where its jobs go.
struct ClusterOptions {
  /// NATS server URLs (nats://HOST:PORT); several for a NATS cluster, tried in turn.
  std::vector<std::string> nats;
  /// The class (subject switchyard.jobs.<class>) of a job whose `priority` is empty: the
  /// nodes' built-in default class. Set it to the nodes' `router.default_class` when that differs.
  std::string default_class = "interactive";
  /// The connection's name in NATS monitoring; "" = "switchyard-client".
  std::string name;
  /// The first connection is retried for this long (a producer started with its NATS server);
  /// then the constructor throws ClientError.
  std::int64_t connect_timeout_ms = 5000;
  /// Give every job this client's reply subject (header Switchyard-Reply-To), so that its
  /// result, and a streamed job's chunks, come back to next()/wait(). false: results are only
  /// in SWITCHYARD_RESULTS (follow_results).
  bool reply = true;
};

/// What JetStream said to one published job.
struct Published {
  std::string subject;           ///< switchyard.jobs.<class>
  std::uint64_t stream_seq = 0;  ///< its sequence in SWITCHYARD_JOBS
  /// JetStream dropped it: a job of the same key (<tenant>/<id>) was published within the
  /// duplicate window. Its result is the earlier job's (follow_results with from_start).
  bool duplicate = false;
};

/// A producer of a Switchyard cluster over NATS JetStream. Jobs are queued in SWITCHYARD_JOBS
/// for whichever node fetches them; results come back on this client's reply subject and are
/// stored in SWITCHYARD_RESULTS. Call it from one thread (libnats delivers in the background).
class ClusterClient {
 public:
  /// Connects (retrying up to connect_timeout_ms) and subscribes to the reply subject; throws
  /// ClientError naming the servers when none answers.
  explicit ClusterClient(const ClusterOptions& options);
  ~ClusterClient();
  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;

  /// Publishes `s` to switchyard.jobs.<class> (class: s.priority, else default_class; the body
  /// carries that class as its priority) with Nats-Msg-Id <tenant>/<id>, and waits for
  /// JetStream's acknowledgement. Throws ClusterOverloaded when the stream is full, ClientError
  /// when the class cannot be a subject token, no stream takes the subject (no node has joined,
  /// or the class is not one of the cluster's), or NATS fails.
  Published submit(const wire::Submit& s);
  /// Publishes a cancel of (tenant, id) to switchyard.cancel and waits until SWITCHYARD_CANCELS
  /// stored it: the node running the job stops it; a queued job ends `cancelled` when fetched,
  /// also by a node that starts later. Throws ClientError when it cannot be sent.
  void cancel(const std::string& id, const std::string& tenant, const std::string& token = "");

  /// Also delivers to next()/wait() the results stored in SWITCHYARD_RESULTS for `tenant`
  /// (switchyard.results.<tenant>, an ordered consumer of this client): from the start of the
  /// stream (results of earlier runs and of duplicates), or only those stored from now on.
  /// A result that also comes on the reply subject is delivered once (below).
  void follow_results(const std::string& tenant, bool from_start);

  /// The next message (done, error, tokens) from the reply subject or a followed results
  /// stream, first those set aside by wait(); nullopt after `timeout`. Throws ClientError on
  /// undecodable bytes. At most one done or error per job key (<tenant>/<id>) comes out of
  /// next() and wait(): a later one of a key already delivered (the same result on the reply
  /// subject and a followed stream, or a job the cluster ran twice) is dropped, with any chunk
  /// after it, until the key is submitted again.
  std::optional<wire::ServerMessage> next(milliseconds timeout);
  /// Waits for the job's done or error (at most `timeout` between two of its messages),
  /// collecting streamed chunks; messages of other jobs are kept for next(). With `tenant`,
  /// only messages naming that tenant (or none) count.
  Result wait(const std::string& id, milliseconds timeout = milliseconds(60000),
              const std::string& tenant = "");
  /// submit() and wait(). A duplicate key needs follow_results(tenant, true) first to see its
  /// earlier result.
  Result run(const wire::Submit& s, milliseconds timeout = milliseconds(60000));

  /// Results dropped as a second done or error of a key already delivered.
  std::uint64_t repeated_results() const;

  /// This client's reply subject (a NATS inbox); "" when options.reply is false.
  const std::string& reply_subject() const;
  /// The class a job is published under: s.priority, or default_class.
  std::string class_of(const wire::Submit& s) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sy::client
