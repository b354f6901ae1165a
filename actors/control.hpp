// The control actor: operator commands that arrive over the request endpoint (switchyard ctl).
// It checks the admin token, swaps the batchers' KV-cache policy and gathers the server's stats.
#pragma once

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <caf/settings.hpp>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace sy {

/// What the control actor talks to. Any actor handle may be invalid (tests): a command that needs
/// it then fails with `unavailable`, except batchers, which are simply a list (possibly empty).
struct ControlWiring {
  std::string admin_token;  ///< AdmissionConfig::admin_token; "" = every command is refused
  caf::actor admission, router, egress;
  std::vector<caf::actor> batchers;
  /// Adds counters kept outside the actors (the gateway's received, sent, decode_errors) to a
  /// stats reply; called on the control actor's thread, so it must be thread-safe. May be empty.
  std::function<void(caf::settings&)> extra_stats;
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
/// (connect_atom, std::vector<caf::actor>) replaces the batcher list (the supervisor sends it
/// whenever its pairs change).
/// Every reply goes to `egress` as (out_atom, ControlEvent|ErrorEvent); never more than one per
/// request, and always one (timeouts bound every wait).
caf::actor spawn_control(caf::actor_system& sys, ControlWiring wiring);

/// The stats reply as one JSON object: the server counters (ServerSnapshot's fields: active_jobs,
/// admitted, overloaded from admission; queued, dispatched, expired from the router; running,
/// blocks_used, blocks_total, blocks_cached, preemptions, steps, policy_swaps, prefix_hit_tokens
/// summed over the batchers; whatever `extra` holds as integers) and "batchers": one object per
/// batcher with kv_policy (string), policy_swaps, pressure, blocks_used, blocks_cached,
/// blocks_used_peak, prefix_hit_blocks, prefix_hit_tokens, preemptions. Absent counters read 0,
/// an absent kv_policy "".
std::string control_stats_json(const caf::settings& admission, const caf::settings& router,
                               const std::vector<caf::settings>& batchers,
                               const caf::settings& extra);

/// An integer counter of a stats dictionary (int64, bool or a real, truncated); 0 when absent.
int64_t stats_counter(const caf::settings& s, const std::string& name);

}  // namespace sy
