// The operator endpoints of a server process: /metrics (Prometheus text), /health and /ready over
// HTTP, answered by asking the metrics actor (actors/metrics.hpp) with a bounded wait.
#pragma once

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "actors/protocol.hpp"
#include "server/http.hpp"

namespace sy {

/// Routes one request: GET/HEAD /metrics -> 200 with the exposition text (503 when the metrics
/// actor does not answer within `timeout`); /health -> 200 (the process serves); /ready -> 200
/// when the metrics actor says an executor is up, else 503; another method on these paths -> 405;
/// any other path -> 404.
/// `extra`, when set, adds its text to /metrics (the cluster node's series).
HttpReply metrics_route(caf::actor_system& sys, const MetricsActor& metrics,
                        std::chrono::milliseconds timeout, const std::string& method,
                        const std::string& path, const std::function<std::string()>& extra = {});

/// The HTTP thread of the operator endpoints, bound to `bind` ("HOST:PORT").
class MetricsEndpoint {
 public:
  MetricsEndpoint(caf::actor_system& sys, MetricsActor metrics, std::string bind,
                  std::function<std::string()> extra = {});
  /// Binds and starts (throws std::runtime_error on a bad or busy address).
  void start();
  /// "HOST:PORT" as bound.
  std::string address() const;
  /// Stops the thread; idempotent. Must run before the actor system goes away.
  void stop();

 private:
  std::unique_ptr<HttpServer> http_;
};

}  // namespace sy
