// The OpenAI-compatible HTTP door (docs/http.md): an HTTP/1.1 server on its own thread (Asio and
// Beast) that turns /v1/completions and /v1/chat/completions requests into submits for the same
// admission as ZeroMQ jobs, streams their results back as JSON or Server-Sent Events, and runs
// the Batch API's files and batches on the journal.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/admission_config.hpp"
#include "actors/protocol.hpp"
#include "core/intake_meter.hpp"
#include "core/thread_class.hpp"
#include "ingress/egress.hpp"
#include "ingress/http_config.hpp"
#include "ingress/openai.hpp"

namespace sy {

/// What the door needs to know of the server beyond its own configuration.
struct HttpDoorContext {
  openai::ParseContext parse;         ///< model names, edge limits, priority classes
  openai::TokenText token_text;       ///< a token id's text (logprobs); may be empty
  uint32_t max_model_len = 0;         ///< the context length /v1/models reports
  std::vector<TenantConfig> tenants;  ///< configured tenants (bearer token -> tenant)
  /// Admission's mailbox meter shared with the ZeroMQ gateway (nullptr: not counted) and its
  /// bounds (endpoints.max_waiting_requests/_bytes): past them a request is answered 429.
  std::shared_ptr<IntakeMeter> intake;
  int64_t max_waiting_requests = 4096;
  int64_t max_waiting_bytes = int64_t{64} << 20;
  /// The Batch API's folder ("" = no Batch API: the state directory is off).
  std::string batch_dir;
  /// The class batch lines run in (already resolved from HttpConfig::batch_class).
  std::string batch_class;
  /// The CPU priority of the Batch API's thread (executors.cpu_priority).
  CpuPriority batch_priority = CpuPriority::normal;
  /// Extra /health detail: "" while serving.
  std::function<std::string()> unhealthy;
};

/// Counters (metrics, tests); a snapshot, read from any thread.
struct HttpDoorStats {
  uint64_t connections_accepted = 0;
  uint64_t connections_refused = 0;  ///< over max_connections: answered 503 and closed
  int64_t connections_open = 0;
  uint64_t requests = 0;  ///< requests read whole
  uint64_t responses_2xx = 0, responses_4xx = 0, responses_5xx = 0;
  uint64_t responses_429 = 0;  ///< (also in 4xx)
  uint64_t streams = 0;        ///< SSE responses started
  uint64_t client_gone = 0;    ///< jobs cancelled because their client went away
  uint64_t timeouts = 0;       ///< connections closed by a header, body, idle or write bound
  uint64_t malformed = 0;      ///< requests that could not be parsed as HTTP (closed)
};

/// The door. Hold it in a shared_ptr: egress posts to it (Outbox).
class HttpDoor : public Outbox {
 public:
  /// Nothing is bound yet; opens the Batch API's folder (throws naming it when it cannot).
  HttpDoor(HttpConfig cfg, HttpDoorContext ctx);
  ~HttpDoor() override;
  HttpDoor(const HttpDoor&) = delete;
  HttpDoor& operator=(const HttpDoor&) = delete;

  /// Where submits and cancels go. Until set, requests are answered 503.
  void set_admission(AdmissionActor admission);
  /// Binds (throws std::runtime_error naming the address when it cannot), resumes the batches
  /// that were running, and starts the thread.
  void start();
  /// "HOST:PORT" as bound (the real port when 0 was asked). Valid after start().
  std::string address() const;
  /// Shutdown grace (thread-safe): every new generation request is answered 503; running ones
  /// go on; batches stop submitting lines (they resume at the next start).
  void refuse_submits();
  /// Closes the listener and every connection (their jobs are cancelled by the server's
  /// shutdown) and joins the thread. Idempotent.
  void stop();

  /// Takes an encoded event of an HTTP request's job from egress (thread-safe, never blocks).
  void post(OutMessage m) override;
  /// Unused: HTTP requests use no PULL credit.
  void add_pull_credit(uint32_t) override {}

  HttpDoorStats stats() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

/// The Prometheus text (format 0.0.4) of the door's counters: switchyard_http_* series
/// (docs/metrics.md), appended to /metrics.
std::string http_metrics_text(const HttpDoorStats& s);

}  // namespace sy
