// Configuration of the operator HTTP endpoints (/metrics, /health, /ready).
#pragma once

#include <cstdint>
#include <string>
#include <cstddef>

namespace sy {

/// The operator HTTP endpoints (/metrics, /health, /ready: docs/metrics.md).
struct MetricsConfig {
  std::string bind;  // "HOST:PORT" (port 0: any free one); "" = off
  // Tenants that are not configured (open-tenant mode) get a `tenant` label of their own up to
  // this many distinct names; later ones are counted under tenant="_other". A counter's series
  // never goes away, so without a cap every new tenant name would add series for good.
  size_t max_tenant_labels = 1000;
  // GPU telemetry through NVML (docs/metrics.md): read where a driver answers; false: never.
  bool gpu = true;
  // TESTS ONLY (`serve --test-fake-nvml`): a stand-in device with fixed readings and a growing
  // energy counter in place of NVML.
  bool test_fake_nvml = false;
};

}  // namespace sy
