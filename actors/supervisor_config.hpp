// Configuration of the supervisor's elastic scaling of batcher+executor pairs.
#pragma once

#include <cstdint>

namespace sy {

/// Elastic pairs (actors/supervisor.hpp, policies/autoscale.hpp): Ray Serve's autoscaling knobs.
/// min/max 0 mean executors.count, so a config without this section runs a fixed count.
struct AutoscaleConfig {
  int min_executors = 0;
  int max_executors = 0;  // CPU executor slots (one per device where devices exist)
  uint32_t target_ongoing_per_executor = 0;  // jobs (running + queued) per executor; 0: off
  int64_t target_queue_wait_ms = 200;        // oldest queued job waiting longer means: add one
  int64_t upscale_delay_ms = 1000;           // the pressure must last this long before adding
  int64_t downscale_delay_ms = 10000;        // an executor idle this long is retired
  int64_t interval_ms = 100;                 // how often the supervisor looks at the load
};

}  // namespace sy
