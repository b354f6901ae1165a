// A node's link to NATS JetStream (libnats): the connection with reconnects, the jobs and results
// streams, one durable pull consumer per priority class, fetching, acknowledging and publishing.
// Names and subjects are the cluster contract of docs/cluster.md. No CAF, no ZeroMQ.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ingress/cluster_config.hpp"

struct __natsConnection;
struct __natsMsg;
struct __natsSubscription;
struct __jsCtx;

namespace sy::cluster {

inline constexpr const char* kJobsStream = "SWITCHYARD_JOBS";
inline constexpr const char* kResultsStream = "SWITCHYARD_RESULTS";
/// Where cancels are published: every node hears them live, and SWITCHYARD_CANCELS keeps them
/// (cluster.cancels_max_age_s), so that a node that starts or reconnects later reads them too.
inline constexpr const char* kCancelSubject = "switchyard.cancel";
inline constexpr const char* kCancelsStream = "SWITCHYARD_CANCELS";
/// A producer that wants its results (and stream chunks) on a subject of its own names it in
/// this header: JetStream answers a publish's own reply subject with the publish acknowledgement,
/// so the reply subject cannot carry the result.
inline constexpr const char* kReplyHeader = "Switchyard-Reply-To";

std::string jobs_subject(const std::string& class_name);  ///< switchyard.jobs.<class>
std::string results_subject(const std::string& tenant);   ///< switchyard.results.<tenant>
/// The Nats-Msg-Id of a job and of its result: <tenant>/<id>.
std::string job_msg_id(const std::string& tenant, const std::string& id);
/// Empty when `token` can be one token of a subject (no '.', '*', '>', whitespace, not empty),
/// else why not: class names and tenants become subject tokens.
std::string subject_token_problem(const std::string& token);

/// A failure of NATS or JetStream, with libnats's text and JetStream's error code (0: none).
struct NatsError : std::runtime_error {
  NatsError(const std::string& what, int js_code = 0) : std::runtime_error(what), code(js_code) {}
  int code;
};

/// One job as fetched: the submit body, which class's consumer gave it, and what acknowledges it.
struct Delivery {
  std::shared_ptr<__natsMsg> msg;  ///< destroyed with the last copy
  uint32_t class_index = 0;
  std::string data;        ///< the msgpack submit body
  std::string reply_to;    ///< Switchyard-Reply-To; "" = none
  std::string msg_id;      ///< Nats-Msg-Id as published; "" = none
  uint64_t delivered = 1;  ///< JetStream's delivery count: > 1 is a redelivery
  uint64_t stream_seq = 0;
};

/// Consumer state of one class, as an autoscaler reads it.
struct ClassLag {
  uint64_t pending = 0;     ///< queued, not yet delivered to any node
  int64_t ack_pending = 0;  ///< delivered, not yet acknowledged
  int64_t redelivered = 0;  ///< delivered more than once and not yet acknowledged
};

/// Counters of a link (monotonic except `connected`).
struct LinkCounters {
  uint64_t fetched = 0, acked = 0, redelivered = 0, results_published = 0, publish_failures = 0;
  /// Results JetStream dropped as re-publishes of a stored one (a job run again: see
  /// docs/cluster.md, Guarantees).
  uint64_t duplicate_results = 0;
  uint64_t disconnects = 0, reconnects = 0;
  bool connected = false;
};

class NatsLink {
 public:
  /// Connects to cfg.nats (retrying while the servers are down, never giving up on a lost
  /// connection) and gets a JetStream context. `classes` are the priority class names, most
  /// important first as the node ranks them. Throws NatsError when no server answers within
  /// `connect_timeout_ms`.
  NatsLink(const ClusterConfig& cfg, std::vector<std::string> classes,
           int64_t connect_timeout_ms = 10000);
  ~NatsLink();
  NatsLink(const NatsLink&) = delete;
  NatsLink& operator=(const NatsLink&) = delete;

  /// Creates the jobs, results and cancels streams where they are missing. For a stream that exists,
  /// returns one line per setting that differs from the config (the stream is left as it is).
  std::vector<std::string> ensure_streams();
  /// Creates (or binds) the durable pull consumer of each class; returns, per existing consumer,
  /// the settings that differ from the config.
  std::vector<std::string> bind_consumers();

  /// Up to `n` jobs of class `class_index`: those already in the pull subscription's buffer
  /// first, then what JetStream has, waiting up to `wait_ms` (10 at least) for the first; none
  /// on a timeout or while disconnected. The request expires at JetStream `wait_ms` after it was
  /// sent and the call waits 10 ms longer, so what JetStream delivers for it is normally here
  /// before the call returns; a delivery later than that stays in the buffer (buffered()).
  std::vector<Delivery> fetch(uint32_t class_index, int n, int64_t wait_ms);
  /// Messages waiting in the class's pull subscription (jobs delivered after their fetch
  /// returned, and JetStream's status messages): JetStream counts their ack_wait already.
  int buffered(uint32_t class_index) const;
  /// Takes the jobs in the class's buffer (buffered() of them at most; when some of those were
  /// status messages, JetStream may add as many jobs as are queued, up to that count).
  std::vector<Delivery> take_buffered(uint32_t class_index);
  /// TESTS ONLY: asks JetStream for up to `n` jobs of the class into the pull subscription's
  /// buffer without waiting for them, as a fetch that returned before its jobs came leaves them.
  void request_into_buffer(uint32_t class_index, int n);
  /// Reads SWITCHYARD_CANCELS from stream sequence `from` to its end, calling `on_cancel` with
  /// each body and its stored time (unix ms); returns the sequence to read from next. Throws
  /// NatsError when JetStream does not answer.
  uint64_t read_cancels(uint64_t from,
                        const std::function<void(const std::string&, int64_t)>& on_cancel);
  /// Acknowledges a job (its result is stored): JetStream removes it from the work queue. True
  /// when the server confirmed it.
  bool ack(const Delivery& d);
  /// Tells JetStream the job is still running, so ack_wait starts over.
  void in_progress(const Delivery& d);
  /// Gives the job back for redelivery after `delay_ms`.
  void nak(const Delivery& d, int64_t delay_ms = 0);

  /// Publishes a result to switchyard.results.<tenant> with Nats-Msg-Id `msg_id` and waits for
  /// JetStream's acknowledgement; throws NatsError when it is refused or times out. `headers`
  /// go on the message as NATS headers (the body stays the results socket's bytes).
  void publish_result(const std::string& tenant, const std::string& msg_id, const std::string& body,
                      const std::vector<std::pair<std::string, std::string>>& headers = {});
  /// Subscribes to a core NATS subject; `on_msg` runs on libnats's delivery thread with each
  /// message's data. Kept across reconnects; ends with the link.
  void subscribe(const std::string& subject, std::function<void(const std::string&)> on_msg);
  /// A plain publish (a producer's reply subject, stream chunks); false when not sent.
  bool publish(const std::string& subject, const std::string& body);
  /// Publishes a job as a producer does: switchyard.jobs.<class> with Nats-Msg-Id <tenant>/<id>
  /// (and the reply header when `reply_to` is set). Returns the stream sequence; `duplicate` is
  /// set when JetStream dropped it as a re-publish. Throws NatsError when refused (a full
  /// stream: the cluster is overloaded).
  uint64_t publish_job(const std::string& class_name, const std::string& tenant,
                       const std::string& id, const std::string& body,
                       const std::string& reply_to = {}, bool* duplicate = nullptr);

  /// Publishes a cancel body on switchyard.cancel and waits for SWITCHYARD_CANCELS to store it;
  /// where no node has created that stream yet, a plain publish that only live nodes hear.
  /// Throws NatsError when it could not be sent.
  void publish_cancel(const std::string& body);

  ClassLag lag(uint32_t class_index);
  LinkCounters counters() const;
  const std::vector<std::string>& classes() const { return classes_; }
  __natsConnection* connection() const { return nc_; }

 private:
  struct Callbacks;
  // One fetch request's answer as deliveries (counted as fetched and redelivered).
  std::vector<Delivery> request(uint32_t class_index, int n, int64_t expires_ms);
  ClusterConfig cfg_;
  std::vector<std::string> classes_;
  __natsConnection* nc_ = nullptr;
  __jsCtx* js_ = nullptr;
  std::vector<__natsSubscription*> subs_;
  struct Listener {
    __natsSubscription* sub = nullptr;
    std::function<void(const std::string&)> fn;
  };
  std::vector<std::unique_ptr<Listener>> listeners_;
  std::atomic<uint64_t> fetched_{0}, acked_{0}, redelivered_{0}, published_{0}, pub_failed_{0},
      duplicates_{0};
  std::atomic<uint64_t> disconnects_{0}, reconnects_{0};
};

}  // namespace sy::cluster
