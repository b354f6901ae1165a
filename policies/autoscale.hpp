// Autoscaling decisions for the supervisor's batcher+executor pairs: a pure function of a load
// snapshot and Ray Serve-style knobs (min, max, target ongoing jobs, upscale and downscale delays).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sy::policy {

/// The knobs (AutoscaleConfig after defaults are filled).
struct AutoscaleKnobs {
  int min_executors = 1;
  int max_executors = 1;
  /// Jobs (running + queued) one executor should carry; more means "add one". 0: off (only the
  /// queue wait counts).
  uint32_t target_ongoing_per_executor = 0;
  /// The oldest queued job waiting longer than this means "add one".
  int64_t target_queue_wait_ms = 200;
  int64_t upscale_delay_ms = 1000;     ///< the pressure must last this long before a pair is added
  int64_t downscale_delay_ms = 10000;  ///< a pair idle this long is retired
};

/// One pair as the supervisor sees it.
struct ExecutorLoad {
  uint64_t id = 0;
  uint32_t ongoing = 0;   ///< jobs inside its batcher (running + waiting there)
  int64_t idle_ms = 0;    ///< how long it has held no job (0 while it holds some)
  bool retiring = false;  ///< already told to retire: finishing, counted as gone
};

/// The load at one moment.
struct AutoscaleSnapshot {
  int64_t now_ms = 0;
  uint64_t queued = 0;        ///< jobs waiting in the router (all classes, re-queued included)
  int64_t queue_wait_ms = 0;  ///< age of the oldest waiting job (0: none waits)
  std::vector<ExecutorLoad> executors;
};

/// What the policy remembers between snapshots.
struct AutoscaleState {
  int64_t pressure_since_ms = -1;  ///< when the current stretch of pressure began; -1: none
};

/// The decision: add `add` pairs, retire the pairs listed; `reason` says why (for the log).
struct AutoscaleDecision {
  int add = 0;
  std::vector<uint64_t> retire;
  std::string reason;
  bool operator==(const AutoscaleDecision&) const = default;
};

/// Decides, updating `state`:
///  - fewer active (not retiring) pairs than min: add up to min at once (start, failures);
///  - pressure = something waits AND (queue wait > target_queue_wait_ms, or target_ongoing is
///    set and (queued + ongoing) > target * active). Pressure that lasted upscale_delay_ms adds
///    pairs, up to max: as many as (queued + ongoing) / target asks for (Ray Serve's rule), at
///    least one; the delay then starts again;
///  - without pressure, pairs idle for downscale_delay_ms are retired down to min, the longest
///    idle first (ties: the newest, highest id);
///  - more active pairs than max (max lowered): the idlest are retired.
AutoscaleDecision decide_autoscale(const AutoscaleSnapshot& snap, const AutoscaleKnobs& knobs,
                                   AutoscaleState& state);

/// Where executors can run: one slot per CUDA device for a device backend when devices exist,
/// otherwise `cpu_slots` CPU slots. A slot's device is its index (-1: CPU).
struct ExecutorSlot {
  int device = -1;
  bool operator==(const ExecutorSlot&) const = default;
};
std::vector<ExecutorSlot> executor_slots(bool device_backend, int device_count, int cpu_slots);

}  // namespace sy::policy
