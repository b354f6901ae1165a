// Autoscaling decisions (see autoscale.hpp): pressure with an upscale delay, idleness with a
// downscale delay, bounded by min and max.
#include "policies/autoscale.hpp"

#include <algorithm>

namespace sy::policy {

AutoscaleDecision decide_autoscale(const AutoscaleSnapshot& snap, const AutoscaleKnobs& knobs,
                                   AutoscaleState& state) {
  AutoscaleDecision d;
  const int lo = std::max(0, knobs.min_executors);
  const int hi = std::max(lo, knobs.max_executors);
  std::vector<const ExecutorLoad*> active;
  uint64_t ongoing = 0;
  for (const ExecutorLoad& e : snap.executors) {
    if (e.retiring) continue;
    active.push_back(&e);
    ongoing += e.ongoing;
  }
  const int n = static_cast<int>(active.size());
  const uint64_t demand = ongoing + snap.queued;
  const uint32_t target = knobs.target_ongoing_per_executor;

  bool pressure = false;
  if (snap.queued > 0) {
    if (snap.queue_wait_ms > knobs.target_queue_wait_ms) {
      pressure = true;
      d.reason = "queue wait " + std::to_string(snap.queue_wait_ms) + " ms > target " +
                 std::to_string(knobs.target_queue_wait_ms) + " ms";
    } else if (target > 0 && demand > uint64_t{target} * static_cast<uint64_t>(n)) {
      pressure = true;
      d.reason = std::to_string(demand) + " jobs > " + std::to_string(target) + " per executor x " +
                 std::to_string(n);
    }
  }
  if (!pressure)
    state.pressure_since_ms = -1;
  else if (state.pressure_since_ms < 0)
    state.pressure_since_ms = snap.now_ms;

  // The longest idle first; among equals the newest (highest id), so older pairs stay.
  auto idlest_first = [](const ExecutorLoad* a, const ExecutorLoad* b) {
    if (a->idle_ms != b->idle_ms) return a->idle_ms > b->idle_ms;
    return a->id > b->id;
  };

  if (n < lo) {
    d.add = lo - n;
    d.reason = "below min_executors (" + std::to_string(n) + " < " + std::to_string(lo) + ")";
    return d;
  }
  if (n > hi) {
    std::vector<const ExecutorLoad*> order = active;
    std::sort(order.begin(), order.end(), idlest_first);
    for (int i = 0; i < n - hi; ++i) d.retire.push_back(order[static_cast<size_t>(i)]->id);
    d.reason = "above max_executors (" + std::to_string(n) + " > " + std::to_string(hi) + ")";
    return d;
  }
  if (pressure) {
    if (n < hi && snap.now_ms - state.pressure_since_ms >= knobs.upscale_delay_ms) {
      int want = n + 1;
      if (target > 0) {
        const auto desired = static_cast<int64_t>((demand + target - 1) / target);
        want = static_cast<int>(std::max<int64_t>(want, std::min<int64_t>(desired, hi)));
      }
      d.add = std::min(want, hi) - n;
      // The next addition needs the pressure to last another full delay.
      state.pressure_since_ms = snap.now_ms;
    } else {
      d.reason.clear();
    }
    return d;
  }
  std::vector<const ExecutorLoad*> idle;
  for (const ExecutorLoad* e : active)
    if (e->ongoing == 0 && e->idle_ms >= knobs.downscale_delay_ms) idle.push_back(e);
  std::sort(idle.begin(), idle.end(), idlest_first);
  for (const ExecutorLoad* e : idle) {
    if (n - static_cast<int>(d.retire.size()) <= lo) break;
    d.retire.push_back(e->id);
  }
  if (!d.retire.empty())
    d.reason = "idle for " + std::to_string(knobs.downscale_delay_ms) + " ms or more";
  return d;
}

std::vector<ExecutorSlot> executor_slots(bool device_backend, int device_count, int cpu_slots) {
  std::vector<ExecutorSlot> out;
  if (device_backend && device_count > 0) {
    for (int i = 0; i < device_count; ++i) out.push_back({i});
    return out;
  }
  out.assign(static_cast<size_t>(std::max(1, cpu_slots)), ExecutorSlot{-1});
  return out;
}

}  // namespace sy::policy
