// The /metrics series the server writes beside the metrics actor's page: GPU telemetry (NVML,
// gpu/nvml.hpp), the process's CPU time, and the trace exporter's counters (docs/metrics.md).
#pragma once

#include <memory>
#include <string>

#include "core/trace.hpp"
#include "gpu/nvml.hpp"

namespace sy {

class Telemetry {
 public:
  /// `gpu`: read NVML (absent: no switchyard_gpu_* series, one log line saying why);
  /// `fake_nvml`: the test stand-in instead (GpuTelemetry::fake). `traces`: the span buffer
  /// whose counters to write (nullptr: tracing off, no switchyard_trace_* series).
  Telemetry(bool gpu, bool fake_nvml, std::shared_ptr<TraceBuffer> traces);
  /// The Prometheus text of the series, read now.
  std::string text();

 private:
  std::unique_ptr<GpuTelemetry> gpu_;
  std::shared_ptr<TraceBuffer> traces_;
};

/// The process's user + system CPU time in seconds (getrusage).
double process_cpu_seconds();

}  // namespace sy
