// retry_after_ms for `overloaded` replies: queue depth over the measured drain rate (an EWMA of
// jobs completed per second), clamped. Time is passed in; no clocks inside.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace sy::policy {

/// Constants of the retry estimate.
struct RetryConfig {
  /// Floor: a client told to come back sooner would mostly find the queue still full and add
  /// load; 20 ms is a few batcher steps on a small model.
  std::int64_t min_ms = 20;
  /// Ceiling: beyond 30 s the estimate is too uncertain to be worth more than "try later", and a
  /// waiting client is better served by its own timeout.
  std::int64_t max_ms = 30'000;
  /// Before the first measurement: one second, long enough that a burst of refused clients does
  /// not come straight back, short enough not to idle a server that is merely starting.
  std::int64_t unknown_ms = 1'000;
  /// Length of one rate sample; 500 ms smooths per-step jitter yet follows load changes quickly.
  std::int64_t window_ms = 500;
  /// EWMA weight of one full window's sample (0.3: the last ~3 windows dominate).
  double alpha = 0.3;
};

/// Measures the drain rate: jobs completed per second, as an EWMA over fixed windows. A stretch
/// of k windows without completions counts as k zero samples, so a stalled server's rate decays.
class DrainRate {
 public:
  explicit DrainRate(std::int64_t now_ms, RetryConfig cfg = {})
      : cfg_(cfg), window_start_(now_ms) {}
  /// Records n completions at now_ms.
  void on_completed(std::uint64_t n, std::int64_t now_ms);
  /// The smoothed rate as of now_ms, or nullopt before the first full window.
  std::optional<double> jobs_per_s(std::int64_t now_ms);
  const RetryConfig& config() const { return cfg_; }

 private:
  void roll(std::int64_t now_ms);

  RetryConfig cfg_;
  std::int64_t window_start_;
  std::uint64_t count_ = 0;
  std::optional<double> ewma_;
};

/// How long a refused client should wait: the time to drain `queue_depth` jobs at `jobs_per_s`,
/// clamped to [min_ms, max_ms]; unknown_ms (clamped) without a rate; max_ms for a rate of 0.
std::int64_t retry_after_ms(std::size_t queue_depth, std::optional<double> jobs_per_s,
                            const RetryConfig& cfg = {});

}  // namespace sy::policy
