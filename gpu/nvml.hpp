// GPU telemetry through NVML, loaded at run time (dlopen "libnvidia-ml.so.1"), so one build runs
// on machines with and without an NVIDIA driver; or a fixed stand-in for tests (docs/metrics.md,
// GPU telemetry).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sy {

/// One device's readings at one moment. A reading the device does not support is < 0.
struct GpuSample {
  uint32_t index = 0;
  std::string uuid, name;
  double utilization = -1;          // share of the last sample period a kernel ran, 0..1
  int64_t memory_used = -1;         // bytes
  int64_t memory_total = -1;        // bytes
  double power_watts = -1;          // current draw
  int64_t energy_millijoules = -1;  // since the driver loaded (monotonic)
};

/// Reads the devices. Thread-safe (one scrape at a time is the expected use).
class GpuTelemetry {
 public:
  virtual ~GpuTelemetry() = default;
  virtual std::vector<GpuSample> sample() = 0;

  /// NVML's view of the GPUs; nullptr, with the reason in `why`, where the library is missing,
  /// does not initialize, or finds no device.
  static std::unique_ptr<GpuTelemetry> open_nvml(std::string& why);
  /// TEST ONLY (`--test-fake-nvml`): one device "fake-gpu-0" at 50% utilization, 1 GiB of
  /// 80 GiB used, 300 W, its energy counter growing by 300 J per second of wall time from
  /// 1,000,000 mJ at the start, as a driver's would.
  static std::unique_ptr<GpuTelemetry> fake();
};

}  // namespace sy
