// The ZeroMQ edge of the server: one thread owns every socket (ROUTER for DEALER clients,
// optional PULL for pipeline producers and PUSH for pipeline results, and the ZAP handler that
// checks CURVE client keys against an allow-list), decodes client messages at the edge and hands
// them to the admission actor; sends what the egress actor posts.
#pragma once

#include <caf/actor.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "ingress/codec.hpp"
#include "ingress/endpoint_config.hpp"
#include "core/intake_meter.hpp"
#include "actors/protocol.hpp"
#include "ingress/egress.hpp"

namespace sy {

/// Tunables of the gateway beyond the endpoints.
struct GatewayOptions {
  /// Decode limits; max_message_bytes is overridden by EndpointConfig::max_message_bytes.
  wire::DecodeLimits limits;
  /// PULL messages that may be read before the router grants any (the router normally grants its
  /// queue room at start-up through the egress).
  uint32_t initial_pull_credit = 0;
  /// Messages kept for one ROUTER peer that is at its high-water mark. A peer this far behind is
  /// not reading: its further streamed chunks are dropped and its jobs cancelled.
  size_t peer_backlog_limit = 4096;
  /// Results waiting for a PUSH sink; past this the PULL socket is not read either, so a slow sink
  /// slows the producers instead of growing memory.
  size_t results_backlog_limit = 1024;
  /// Counts request-endpoint requests into admission's mailbox (admission counts them out);
  /// while endpoints.max_waiting_requests or max_waiting_bytes are waiting there, new ones are
  /// answered `overloaded` here. nullptr: not counted, never refused for it.
  std::shared_ptr<IntakeMeter> intake;
};

/// Counters (tests, metrics); a snapshot, read from any thread.
struct GatewayStats {
  uint64_t received = 0;          ///< client frames read (ROUTER + PULL)
  uint64_t decode_errors = 0;     ///< replied with an error
  uint64_t submits = 0;           ///< SubmitRequests handed to admission
  uint64_t controls = 0;          ///< ControlRequests handed to the control actor
  uint64_t sent = 0;              ///< server messages delivered to ZeroMQ
  uint64_t dropped = 0;           ///< undeliverable (peer gone, no results socket, backlog full)
  uint64_t hwm_deferrals = 0;     ///< sends put off because a peer was at its high-water mark
  uint64_t internal_cancels = 0;  ///< KeyRequests raised because a client vanished
  uint64_t curve_allowed = 0;     ///< CURVE handshakes the allow-list let through (ZAP 200)
  uint64_t curve_refused = 0;     ///< CURVE handshakes the allow-list refused (ZAP 400)
  uint64_t shutdown_refused = 0;  ///< submits answered `unavailable` during the shutdown grace
  uint64_t intake_refused = 0;    ///< requests answered `overloaded`: admission's mailbox was full
  /// Client connections closed as they came, for any of the caps below (their sum).
  uint64_t connections_refused = 0;
  /// ... because their source address had endpoints.max_connections_per_address open there.
  uint64_t refused_per_address = 0;
  /// ... because their endpoint had endpoints.max_connections open (with an allow-list: that
  /// had passed it; a listed client refused for it at its handshake counts here too).
  uint64_t refused_total = 0;
  /// ... because their endpoint had endpoints.max_handshaking in their handshake (allow-list).
  uint64_t refused_handshaking = 0;
  int64_t connections_open = 0;  ///< client connections open (request endpoint + pipeline input)
  /// Of those, the ones not yet past the allow-list (0 without one).
  int64_t connections_handshaking = 0;
  int64_t pull_credit = 0;  ///< PULL messages that may be read now
};

/// The gateway thread and its sockets. Hold it in a shared_ptr: the egress actor posts to it.
class Gateway : public Outbox {
 public:
  /// Creates the ZeroMQ context and reads the key files; binds nothing yet. Throws
  /// std::runtime_error naming the file (and line) for a bad key file, and when
  /// curve_allowed_keys is set without curve_secret_key.
  explicit Gateway(EndpointConfig endpoints, GatewayOptions options = {});
  /// Stops (no grace) if still running.
  ~Gateway() override;
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  /// Where decoded requests go: (submit_atom, SubmitRequest), (cancel_atom, KeyRequest),
  /// (status_atom, KeyRequest). May be called before or after start(); until then submits are
  /// answered with `unavailable`.
  void set_admission(AdmissionActor admission);
  /// Where decoded `control` messages go: (control_atom, ControlRequest). Until set, they are
  /// answered with `unavailable`.
  void set_control(ControlActor control);
  /// Binds the sockets and starts the thread; throws std::runtime_error naming the address when
  /// one cannot be bound (malformed, busy).
  void start();
  /// Stops reading client sockets; outbound traffic keeps flowing.
  void stop_reading();
  /// Shutdown grace (thread-safe): both client sockets are still read (the PULL socket whatever
  /// its credit), every new `submit` is answered at once with `unavailable` and `retry_after_ms`
  /// counting to `closing_at` (when the sockets close), and cancel/status still reach admission
  /// for the jobs that are finishing. Lasts until stop(), which keeps refusing while it drains.
  void refuse_submits(std::chrono::steady_clock::time_point closing_at);
  /// Stops reading, sends what is queued for up to `grace`, closes the sockets, joins the
  /// thread and drops the admission and control handles (breaks the actor reference cycle).
  /// Idempotent.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(1000));

  /// Queues an encoded message (thread-safe, never blocks on the network).
  void post(OutMessage m) override;
  /// Grants `n` more PULL reads (thread-safe).
  void add_pull_credit(uint32_t n) override;
  /// Takes up to `max` of that credit for another intake sharing it (the cluster node fetches
  /// only what it took); returns how many it took (thread-safe).
  uint32_t take_pull_credit(uint32_t max);

  /// The bound addresses with wildcard ports resolved (e.g. "tcp://127.0.0.1:41234"); "" when
  /// the socket is off. Valid after start().
  std::string endpoint() const;
  std::string pull_endpoint() const;
  std::string results_endpoint() const;

  /// A snapshot of the counters.
  GatewayStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sy
