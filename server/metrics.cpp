// The operator endpoints (see metrics.hpp): HTTP paths mapped to requests to the metrics actor.
#include "server/metrics.hpp"

#include <caf/all.hpp>

#include "actors/messages.hpp"
#include "actors/metrics.hpp"

namespace sy {

namespace {

// A scrape waits for the slowest actor (metrics' own ask timeout is 1 s); two seconds leave room
// for that and keep a stuck system from hanging the scraper.
constexpr auto kAskTimeout = std::chrono::milliseconds(2000);

HttpReply text(int status, std::string body) {
  HttpReply r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

}  // namespace

HttpReply metrics_route(caf::actor_system& sys, const MetricsActor& metrics,
                        std::chrono::milliseconds timeout, const std::string& method,
                        const std::string& path, const std::function<std::string()>& extra) {
  if (path != "/metrics" && path != "/health" && path != "/ready")
    return text(404, "not found; try /metrics, /health or /ready\n");
  if (method != "GET" && method != "HEAD") return text(405, "only GET and HEAD\n");
  if (path == "/health") return text(200, "ok\n");
  caf::scoped_actor self{sys};
  if (path == "/ready") {
    bool ready = false;
    self->request(metrics, timeout, ready_atom::value)
        .receive([&](bool r) { ready = r; }, [&](caf::error&) {});
    return ready ? text(200, "ready\n")
                 : text(503,
                        "not ready: no executor has its model loaded, or the server is "
                        "draining (ctl drain) or stopping\n");
  }
  HttpReply r = text(503, "metrics unavailable: the server did not answer in time\n");
  self->request(metrics, timeout, metrics_atom::value)
      .receive(
          [&](std::string& body) {
            r.status = 200;
            r.content_type = prom::kContentType;
            r.body = std::move(body);
            if (extra) r.body += extra();
          },
          [&](caf::error&) {});
  return r;
}

MetricsEndpoint::MetricsEndpoint(caf::actor_system& sys, MetricsActor metrics, std::string bind,
                                 std::function<std::string()> extra)
    : http_(std::make_unique<HttpServer>(
          std::move(bind),
          [&sys, metrics, extra = std::move(extra)](const std::string& method,
                                                    const std::string& path) {
            return metrics_route(sys, metrics, kAskTimeout, method, path, extra);
          })) {}

void MetricsEndpoint::start() {
  http_->start();
}
std::string MetricsEndpoint::address() const {
  return http_->address();
}
void MetricsEndpoint::stop() {
  http_->stop();
}

}  // namespace sy
