// Configuration of trace export (`tracing:` in the config, --otlp-endpoint; docs/tracing.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace sy {

/// Where and how the spans of traced jobs are exported (OTLP/HTTP with JSON bodies).
struct TracingConfig {
  // "http://HOST:PORT" (spans go to POST /v1/traces there) or "http://HOST:PORT/PATH"; "" = off:
  // no job is traced, a submit's traceparent is checked and otherwise ignored.
  std::string otlp_endpoint;
  // false: only jobs whose submit carries a traceparent are traced; true (`sample: all`): every
  // job, those without a traceparent in a new trace of their own.
  bool sample_all = false;
  // Spans that may wait for export; more are dropped (counted). A job makes about 6 + its prompt
  // chunks, so 8192 hold over a thousand jobs' worth: several seconds of a busy server.
  std::size_t max_queued_spans = 8192;
  // Spans per POST: bodies of a few hundred KB, well under collectors' default 4 MiB limits.
  std::size_t batch_spans = 512;
  // How often waiting spans are sent (a full batch goes at once).
  int64_t export_interval_ms = 1000;
  // A POST that takes longer (connect included) fails and its spans are dropped: a slow
  // collector costs spans, never the server's time.
  int64_t export_timeout_ms = 2000;
  std::string service_name = "switchyard";  // the resource's service.name
};

}  // namespace sy
