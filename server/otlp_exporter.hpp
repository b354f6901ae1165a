// The OTLP/HTTP trace exporter: a thread of its own drains the server's TraceBuffer
// (core/trace.hpp) and POSTs the spans as OTLP JSON to the collector (docs/tracing.md). A
// collector that is slow or down costs the spans of the failed batches (counted as dropped),
// never a step: the actors only append to the bounded buffer.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/trace.hpp"
#include "server/tracing_config.hpp"

namespace sy {

/// An `http://HOST:PORT[/PATH]` endpoint split up; PATH defaults to /v1/traces.
struct OtlpEndpoint {
  std::string host, port, path;
};
/// Parses `url`; nullopt with the problem in `why` (only http:// is spoken).
std::optional<OtlpEndpoint> parse_otlp_endpoint(const std::string& url, std::string& why);

/// The OTLP/JSON ExportTraceServiceRequest of `spans` (resourceSpans / scopeSpans / spans,
/// lower-case hex ids, times as decimal strings of Unix nanoseconds). `unix_offset_ns` turns the
/// spans' steady-clock µs into Unix time.
std::string otlp_json(const std::vector<Span>& spans, const std::string& service_name,
                      int64_t unix_offset_ns);

/// Nanoseconds to add to a steady-clock time to get Unix time, measured now.
int64_t steady_to_unix_offset_ns();

class OtlpExporter {
 public:
  /// Throws std::invalid_argument when cfg.otlp_endpoint is not a usable URL.
  OtlpExporter(TracingConfig cfg, std::shared_ptr<TraceBuffer> buffer);
  ~OtlpExporter();
  void start();
  /// Sends what waits (one last try, bounded by export_timeout_ms per batch) and joins.
  void stop();

 private:
  void run();
  bool post(const std::string& body, std::string& why);

  TracingConfig cfg_;
  OtlpEndpoint ep_;
  std::shared_ptr<TraceBuffer> buf_;
  int64_t offset_ns_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace sy
