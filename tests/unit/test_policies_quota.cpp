// Quota tests: token bucket refill, burst cap, debt for jobs larger than the burst, wait times,
// jobs-in-flight limits, and the combined tenant decision. All times are explicit.
#include <boost/test/unit_test.hpp>
#include <vector>

#include "policies/quota.hpp"

BOOST_AUTO_TEST_SUITE(test_policies_quota)

using namespace sy::policy;

BOOST_AUTO_TEST_CASE(token_bucket_table) {
  struct Op {
    std::int64_t t;
    double n;
    bool ok;
    double level_after;
  };
  struct Case {
    const char* what;
    double rate, burst;
    std::vector<Op> ops;
  };
  const std::vector<Case> cases = {
      {"starts full, drains, refills at rate",
       100,
       200,
       {{0, 150, true, 50}, {0, 60, false, 50}, {100, 60, true, 0}, {1000, 0, true, 90}}},
      {"refill caps at burst",
       100,
       200,
       {{0, 200, true, 0}, {10'000, 0, true, 200}, {10'000, 201, true, -1}}},
      {"larger than burst runs when full, then debt",
       10,
       50,
       {{0, 500, true, -450}, {1000, 1, false, -440}, {50'000, 10, true, 40}}},
      {"clock stepping back adds nothing",
       100,
       100,
       {{1000, 100, true, 0}, {500, 1, false, 0}, {1010, 1, true, 0}}},
      {"burst defaults to one second of rate", 40, 0, {{0, 40, true, 0}, {0, 1, false, 0}}},
  };
  for (const Case& c : cases) {
    TokenBucket b(c.rate, c.burst, 0);
    for (const Op& op : c.ops) {
      BOOST_TEST(b.try_take(op.n, op.t) == op.ok, c.what << " at t=" << op.t);
      BOOST_TEST(b.level(op.t) == op.level_after, c.what << " at t=" << op.t);
    }
  }
}

BOOST_AUTO_TEST_CASE(wait_ms_matches_refill) {
  TokenBucket b(100, 100, 0);  // 0.1 token per ms
  BOOST_TEST(b.wait_ms(50, 0) == 0);
  BOOST_TEST(b.try_take(100, 0));
  BOOST_TEST(b.wait_ms(50, 0) == 500);
  BOOST_TEST(b.wait_ms(50, 200) == 300);
  BOOST_TEST(b.wait_ms(1000, 200) == 800);  // capped at burst: a full bucket lets it through
  BOOST_TEST(!b.try_take(50, 499));
  BOOST_TEST(b.try_take(50, 500));
}

BOOST_AUTO_TEST_CASE(refund_never_exceeds_burst) {
  TokenBucket b(10, 100, 0);
  BOOST_TEST(b.try_take(80, 0));
  b.refund(30, 0);
  BOOST_TEST(b.level(0) == 50);
  b.refund(1000, 0);
  BOOST_TEST(b.level(0) == 100);
}

BOOST_AUTO_TEST_CASE(unlimited_bucket) {
  TokenBucket b(0, 0, 0);
  BOOST_TEST(b.unlimited());
  for (int i = 0; i < 100; ++i) BOOST_TEST(b.try_take(1e9, 0));
  BOOST_TEST(b.wait_ms(1e9, 0) == 0);
}

BOOST_AUTO_TEST_CASE(in_flight_limit) {
  InFlightLimit l(2);
  BOOST_TEST(l.try_acquire());
  BOOST_TEST(l.try_acquire());
  BOOST_TEST(!l.try_acquire());
  l.release();
  BOOST_TEST(l.try_acquire());
  l.release();
  l.release();
  l.release();  // extra releases do not go below zero
  BOOST_TEST(l.current() == 0u);
  InFlightLimit unlimited(0);
  for (int i = 0; i < 1000; ++i) BOOST_TEST(unlimited.try_acquire());
}

BOOST_AUTO_TEST_CASE(tenant_quota_decisions) {
  TenantQuota q(100, 300, 2, 0);
  BOOST_TEST((q.admit(100, 0).verdict == QuotaDecision::admit));
  BOOST_TEST((q.admit(100, 0).verdict == QuotaDecision::admit));
  // At the in-flight limit: refused without spending tokens.
  BOOST_TEST((q.admit(100, 0).verdict == QuotaDecision::too_many_in_flight));
  BOOST_TEST(q.bucket().level(0) == 100);
  q.finish(0, 0);
  q.finish(0, 0);
  BOOST_TEST((q.admit(100, 0).verdict == QuotaDecision::admit));
  const QuotaDecision d = q.admit(100, 0);  // bucket empty: rate limited, with the wait
  BOOST_TEST((d.verdict == QuotaDecision::rate_limited));
  BOOST_TEST(d.retry_after_ms == 1000);
  BOOST_TEST(q.in_flight().current() == 1u);  // the refused job holds no slot
  q.finish(60, 0);                            // stopped early: 60 unused tokens come back
  BOOST_TEST(q.bucket().level(0) == 60);
  BOOST_TEST((q.admit(100, 400).verdict == QuotaDecision::admit));
}

BOOST_AUTO_TEST_SUITE_END()  // test_policies_quota
