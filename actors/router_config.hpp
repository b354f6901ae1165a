// Configuration of the router: priority classes and prefix-aware dispatch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "policies/qos.hpp"

namespace sy {

/// The router (config `classes`, `default_class`, `router`).
/// How long after the last job of the most important rank the router keeps its priority reserve.
inline constexpr int64_t kPriorityReserveMs = 10000;

struct RouterConfig {
  std::vector<policy::PriorityClass> classes;  // empty: interactive (rank 0) and batch (rank 1)
  std::string default_class;                   // "" = the lowest-rank... first class
  // Prefix-aware dispatch (policies/prefix_route.hpp): a job goes to the batcher that was last
  // sent its longest prompt prefix, unless that batcher has `prefix_affinity_slack` fewer free
  // credits than the freest one. Off by itself when batching.prefix_cache is off.
  bool prefix_affinity = true;
  uint32_t prefix_affinity_slack = 8;
  // Batcher credits kept for the most important rank's jobs: while such jobs arrived in the last
  // kPriorityReserveMs, a job of a less important rank is dispatched only while more than this
  // many credits are free, so that an interactive job beside a full batch is dispatched at once
  // instead of waiting for a batch job to end (and for the step after that). 0: none.
  uint32_t priority_reserve = 1;
  int32_t block_size = 16;       // set by finalize_config from batching.kv_block_size
  uint32_t max_job_retries = 2;  // set by finalize_config from batching.max_job_retries
};

}  // namespace sy
