// Drain-rate EWMA and the retry_after estimate.
#include "policies/retry.hpp"

#include <algorithm>
#include <cmath>

namespace sy::policy {

void DrainRate::roll(std::int64_t now_ms) {
  const std::int64_t elapsed = now_ms - window_start_;
  if (cfg_.window_ms <= 0 || elapsed < cfg_.window_ms) return;
  const double sample = static_cast<double>(count_) * 1000.0 / static_cast<double>(elapsed);
  // k windows elapsed: weight the sample as k consecutive samples would be, 1 - (1 - alpha)^k.
  const double k = static_cast<double>(elapsed) / static_cast<double>(cfg_.window_ms);
  const double a = 1.0 - std::pow(1.0 - std::clamp(cfg_.alpha, 0.0, 1.0), k);
  ewma_ = ewma_ ? *ewma_ + a * (sample - *ewma_) : sample;
  window_start_ = now_ms;
  count_ = 0;
}

void DrainRate::on_completed(std::uint64_t n, std::int64_t now_ms) {
  roll(now_ms);
  count_ += n;
}

std::optional<double> DrainRate::jobs_per_s(std::int64_t now_ms) {
  roll(now_ms);
  return ewma_;
}

std::int64_t retry_after_ms(std::size_t queue_depth, std::optional<double> jobs_per_s,
                            const RetryConfig& cfg) {
  const std::int64_t lo = cfg.min_ms, hi = std::max(cfg.min_ms, cfg.max_ms);
  if (!jobs_per_s) return std::clamp(cfg.unknown_ms, lo, hi);
  // Rates below one job per max_ms would give more than max_ms anyway; this also covers 0 and NaN.
  if (!(*jobs_per_s * static_cast<double>(hi) / 1000.0 > 1e-12)) return hi;
  const double ms = std::ceil(static_cast<double>(queue_depth) * 1000.0 / *jobs_per_s);
  if (ms >= static_cast<double>(hi)) return hi;
  return std::clamp(static_cast<std::int64_t>(ms), lo, hi);
}

}  // namespace sy::policy
