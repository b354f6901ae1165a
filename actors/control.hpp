// The control actor: operator commands that arrive over the request endpoint (switchyard ctl).
// It checks the admin token, swaps the batchers' KV-cache policy and gathers the server's stats.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "actors/protocol.hpp"
#include "actors/stats.hpp"

namespace sy {

/// What the control actor talks to. Any actor handle may be invalid (tests): a command that needs
/// it then fails with `unavailable`, except batchers, which are simply a list (possibly empty).
struct ControlWiring {
  std::string admin_token;  ///< AdmissionConfig::admin_token; "" = every command is refused
  AdmissionActor admission;
  RouterActor router;
  EgressActor egress;
  std::vector<BatcherActor> batchers;
  /// Reads the counters kept outside the actors (the gateway's received, sent, decode_errors, ...)
  /// for a stats reply; called on the control actor's thread, so it must be thread-safe. May be
  /// empty (those fields read 0).
  std::function<EdgeStats()> edge_stats;
  /// How long one actor may take to answer: a busy actor answers between messages, well within
  /// this; a stuck one must not keep the operator waiting forever.
  std::chrono::milliseconds ask_timeout{2000};
};

/// Spawns the control actor. Handles (control_atom, ControlRequest):
///  - the token is compared in constant time with the admin token; none configured, none given or
///    a wrong one -> ErrorEvent unauthorized (id and tenant empty) to egress;
///  - "kv_policy": parses ControlRequest::policy (bad_request naming the problem), sends
///    (kvpolicy_atom, KvPolicy) as a request to every batcher and, once all answered "",
///    ControlEvent {"kv_policy": NAME, "batchers": N}; a refusal -> bad_request with the batcher's
///    reason; no answer in time -> unavailable; another request error -> internal;
///  - "stats": asks admission, router and every batcher (stats_atom) and replies a ControlEvent
///    whose result is control_stats_json of the answers (errors as for kv_policy);
///  - "drain" / "resume": (drain_atom, bool) to admission and the router (no new submits, no PULL
///    credit; queued and running jobs finish), then the "stats" reply, whose "draining" says 1/0;
///  - any other command -> bad_request.
/// (connect_atom, std::vector<BatcherActor>) replaces the batcher list (the supervisor sends it
/// whenever its pairs change).
/// Every reply goes to `egress` as (out_atom, ControlEvent|ErrorEvent); never more than one per
/// request, and always one (timeouts bound every wait).
ControlActor spawn_control(caf::actor_system& sys, ControlWiring wiring);

/// The stats reply as one JSON object (summary_json, actors/stats.hpp): the fields marked
/// stats_fields::kSummary of admission, the router, the batchers summed and the edge, then "batchers":
/// one object per batcher with its stats_fields::kPerBatcher fields (kv_policy, policy_swaps, pressure,
/// blocks_used, blocks_cached, blocks_used_peak, prefix_hit_blocks, prefix_hit_tokens, ...).
std::string control_stats_json(const AdmissionStats& admission, const RouterStats& router,
                               const std::vector<BatcherStats>& batchers, const EdgeStats& edge);

}  // namespace sy
