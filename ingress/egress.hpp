// The egress actor: turns the actors' outbound events into wire bytes (ingress/codec) and hands
// them to the gateway's outbox; the gateway thread does the actual ZeroMQ send.
#pragma once

#include <array>
#include <caf/fwd.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "actors/messages.hpp"
#include "actors/protocol.hpp"

namespace sy {

/// One encoded server message on its way out, with the job it belongs to so that a failed
/// delivery (client gone) can cancel that job.
struct OutMessage {
  ClientRef to;
  std::string id;         ///< job id ("" when none, e.g. a decode error)
  std::string tenant;     ///< "" when the event did not carry it (the gateway fills it in)
  bool terminal = false;  ///< done or error: the job's last message
  std::string bytes;      ///< one msgpack server message
  /// Not terminal, yet for the results socket too: a program's tool_call (docs/programs.md).
  bool to_sink = false;
};

/// Where the egress actor delivers; implemented by Gateway, the cluster node and the HTTP door
/// (thread-safe), or by a test double.
class Outbox {
 public:
  virtual ~Outbox() = default;
  /// Queues one message for sending; never blocks on the network.
  virtual void post(OutMessage m) = 0;
  /// Allows the gateway to read `n` more messages from the PULL socket (additive grant).
  virtual void add_pull_credit(uint32_t n) = 0;
};

/// Egress's outbox in a server with more than one door: each client kind's messages go to the
/// door that serves it (the cluster node, the HTTP door); every other message, and the PULL
/// credit, to the ZeroMQ gateway.
class KindOutbox : public Outbox {
 public:
  explicit KindOutbox(std::shared_ptr<Outbox> gateway) : gateway_(std::move(gateway)) {}
  /// Messages for clients of `kind` go to `door` from now on (set before egress runs).
  void route(uint8_t kind, std::shared_ptr<Outbox> door) {
    if (kind < doors_.size()) doors_[kind] = std::move(door);
  }
  void post(OutMessage m) override {
    const auto& door = m.to.kind < doors_.size() ? doors_[m.to.kind] : nullptr;
    (door ? door : gateway_)->post(std::move(m));
  }
  void add_pull_credit(uint32_t n) override { gateway_->add_pull_credit(n); }

 private:
  std::shared_ptr<Outbox> gateway_;
  std::array<std::shared_ptr<Outbox>, 4> doors_;  // by ClientRef::Kind
};

/// Spawns the egress actor. It handles (out_atom, AcceptedEvent|TokensEvent|DoneEvent|ErrorEvent|
/// StatusEvent|ControlEvent) and (pull_atom, uint32 n). Events for pipeline clients other than
/// done/error are dropped (the results socket carries only those); cluster clients get tokens,
/// done and error.
/// `traces` (optional): a traced job's terminal message ends its `delivery` and job spans there
/// (docs/tracing.md).
EgressActor spawn_egress(caf::actor_system& sys, std::shared_ptr<Outbox> outbox,
                         std::shared_ptr<TraceBuffer> traces = nullptr);

/// The encoding the egress applies to each event (exposed for tests and for the fuzz seeds).
OutMessage encode_event(const AcceptedEvent& e);
OutMessage encode_event(const TokensEvent& e);
OutMessage encode_event(const DoneEvent& e);
OutMessage encode_event(const ErrorEvent& e);
OutMessage encode_event(const StatusEvent& e);
OutMessage encode_event(const ControlEvent& e);
OutMessage encode_event(const StepEvent& e);
OutMessage encode_event(const ToolCallEvent& e);

}  // namespace sy
