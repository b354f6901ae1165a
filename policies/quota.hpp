// Per-tenant quotas: a token bucket for the token rate and a jobs-in-flight counter. Time is
// always passed in (milliseconds on any monotonic clock): no clocks inside, so tests are exact.
#pragma once

#include <cstdint>

namespace sy::policy {

/// Token-rate quota. Starts full. A request of n tokens is let through when the bucket holds
/// min(n, burst) — so a job larger than the burst still runs once the bucket is full — and the
/// level may then go negative: the debt is repaid by refill before the next request passes.
class TokenBucket {
 public:
  /// rate_per_s <= 0 means unlimited; burst <= 0 means one second's worth of rate.
  TokenBucket(double rate_per_s, double burst, std::int64_t now_ms);

  bool unlimited() const { return rate_ <= 0; }
  double rate_per_s() const { return rate_; }
  double burst() const { return burst_; }
  /// Tokens available at now_ms (negative while in debt).
  double level(std::int64_t now_ms);
  /// Takes n tokens if allowed at now_ms; false (and nothing taken) otherwise.
  bool try_take(double n, std::int64_t now_ms);
  /// Milliseconds from now_ms until try_take(n) would succeed; 0 when it would now.
  std::int64_t wait_ms(double n, std::int64_t now_ms);
  /// Gives back tokens charged but not used (a job that stopped before max_tokens); never above burst.
  void refund(double n, std::int64_t now_ms);

 private:
  void refill(std::int64_t now_ms);

  double rate_;
  double burst_;
  double level_;
  std::int64_t last_ms_;
};

/// Jobs in flight for one tenant, at most `limit` (0: unlimited).
class InFlightLimit {
 public:
  explicit InFlightLimit(std::uint32_t limit) : limit_(limit) {}
  /// Counts one more job in flight if under the limit.
  bool try_acquire() {
    if (limit_ != 0 && current_ >= limit_) return false;
    ++current_;
    return true;
  }
  /// One job left (finished, failed or cancelled); extra releases are ignored.
  void release() {
    if (current_ > 0) --current_;
  }
  std::uint32_t current() const { return current_; }
  std::uint32_t limit() const { return limit_; }

 private:
  std::uint32_t limit_;
  std::uint32_t current_ = 0;
};

/// What admission decides for one job under a tenant's quotas.
struct QuotaDecision {
  enum Verdict { admit, too_many_in_flight, rate_limited };
  Verdict verdict = admit;
  std::int64_t retry_after_ms = 0;  ///< for rate_limited: when the bucket will allow it
};

/// A tenant's quotas together. admit() charges both or neither.
class TenantQuota {
 public:
  TenantQuota(double tokens_per_s, double burst, std::uint32_t max_in_flight, std::int64_t now_ms)
      : bucket_(tokens_per_s, burst, now_ms), in_flight_(max_in_flight) {}

  /// Admits a job expected to cost `tokens` (prompt + max_tokens). Jobs in flight are checked
  /// first so a tenant at its limit does not also drain its bucket.
  QuotaDecision admit(double tokens, std::int64_t now_ms);
  /// A job admitted earlier ended; `unused_tokens` of its charge go back to the bucket.
  void finish(double unused_tokens, std::int64_t now_ms);

  TokenBucket& bucket() { return bucket_; }
  const InFlightLimit& in_flight() const { return in_flight_; }

 private:
  TokenBucket bucket_;
  InFlightLimit in_flight_;
};

}  // namespace sy::policy
