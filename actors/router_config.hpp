// Configuration of the router: priority classes and prefix-aware dispatch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "policies/qos.hpp"

namespace sy {

/// The router (config `classes`, `default_class`, `router`).
struct RouterConfig {
  std::vector<policy::PriorityClass> classes;  // empty: interactive (rank 0) and batch (rank 1)
  std::string default_class;                   // "" = the lowest-rank... first class
  // Prefix-aware dispatch (policies/prefix_route.hpp): a job goes to the batcher that was last
  // sent its longest prompt prefix, unless that batcher has `prefix_affinity_slack` fewer free
  // credits than the freest one. Off by itself when batching.prefix_cache is off.
  bool prefix_affinity = true;
  uint32_t prefix_affinity_slack = 8;
  int32_t block_size = 16;       // set by finalize_config from batching.kv_block_size
  uint32_t max_job_retries = 2;  // set by finalize_config from batching.max_job_retries
};

}  // namespace sy
