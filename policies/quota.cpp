// Token bucket and tenant quota arithmetic.
#include "policies/quota.hpp"

#include <algorithm>
#include <cmath>

namespace sy::policy {

TokenBucket::TokenBucket(double rate_per_s, double burst, std::int64_t now_ms)
    : rate_(rate_per_s > 0 ? rate_per_s : 0),
      burst_(burst > 0 ? burst : std::max(rate_per_s, 0.0)),
      level_(burst_),
      last_ms_(now_ms) {}

void TokenBucket::refill(std::int64_t now_ms) {
  // A clock that steps back (or calls out of order) adds nothing rather than draining the bucket.
  if (now_ms <= last_ms_) return;
  level_ = std::min(burst_, level_ + rate_ * static_cast<double>(now_ms - last_ms_) / 1000.0);
  last_ms_ = now_ms;
}

double TokenBucket::level(std::int64_t now_ms) {
  refill(now_ms);
  return level_;
}

bool TokenBucket::try_take(double n, std::int64_t now_ms) {
  if (unlimited()) return true;
  refill(now_ms);
  if (level_ < std::min(n, burst_)) return false;
  level_ -= n;
  return true;
}

std::int64_t TokenBucket::wait_ms(double n, std::int64_t now_ms) {
  if (unlimited()) return 0;
  refill(now_ms);
  const double missing = std::min(n, burst_) - level_;
  if (missing <= 0) return 0;
  return static_cast<std::int64_t>(std::ceil(missing * 1000.0 / rate_));
}

void TokenBucket::refund(double n, std::int64_t now_ms) {
  if (unlimited() || n <= 0) return;
  refill(now_ms);
  level_ = std::min(burst_, level_ + n);
}

QuotaDecision TenantQuota::admit(double tokens, std::int64_t now_ms) {
  if (in_flight_.limit() != 0 && in_flight_.current() >= in_flight_.limit())
    return {QuotaDecision::too_many_in_flight, 0};
  if (!bucket_.try_take(tokens, now_ms))
    return {QuotaDecision::rate_limited, bucket_.wait_ms(tokens, now_ms)};
  in_flight_.try_acquire();
  return {QuotaDecision::admit, 0};
}

void TenantQuota::finish(double unused_tokens, std::int64_t now_ms) {
  in_flight_.release();
  bucket_.refund(unused_tokens, now_ms);
}

}  // namespace sy::policy
