// retry_after tests: the estimate and its bounds, and the drain-rate EWMA over explicit time.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "policies/retry.hpp"

BOOST_AUTO_TEST_SUITE(test_policies_retry)

using namespace sy::policy;

BOOST_AUTO_TEST_CASE(retry_after_table) {
  struct Case {
    std::size_t depth;
    std::optional<double> rate;
    std::int64_t expect;
  };
  const std::vector<Case> cases = {
      {100, 100.0, 1000},     // depth / rate
      {8, 400.0, 20},         // 20 ms: exactly the floor
      {1, 1000.0, 20},        // 1 ms, clamped up to the floor
      {0, 50.0, 20},          // empty queue still waits the floor
      {10'000, 1.0, 30'000},  // 10,000 s clamped to the ceiling
      {30, 1.0, 30'000},      // exactly the ceiling
      {29, 1.0, 29'000},
      {5, 0.0, 30'000},  // stalled: ceiling
      {5, std::numeric_limits<double>::quiet_NaN(), 30'000},
      {5, -3.0, 30'000},
      {5, std::nullopt, 1'000},  // no measurement yet
      {3, 7.0, 429},             // rounded up
  };
  for (const Case& c : cases)
    BOOST_TEST(retry_after_ms(c.depth, c.rate) == c.expect, "depth " << c.depth);
}

BOOST_AUTO_TEST_CASE(retry_after_respects_custom_bounds) {
  RetryConfig cfg;
  cfg.min_ms = 100;
  cfg.max_ms = 2000;
  cfg.unknown_ms = 5000;
  BOOST_TEST(retry_after_ms(1, 1000.0, cfg) == 100);
  BOOST_TEST(retry_after_ms(1000, 1.0, cfg) == 2000);
  BOOST_TEST(retry_after_ms(1, std::nullopt, cfg) == 2000);  // unknown_ms is clamped too
}

BOOST_AUTO_TEST_CASE(drain_rate_tracks_a_steady_rate) {
  DrainRate r(0);
  BOOST_TEST(!r.jobs_per_s(0).has_value());
  for (std::int64_t t = 10; t <= 5000; t += 10) r.on_completed(1, t);  // 100 jobs/s
  BOOST_TEST(!r.jobs_per_s(10).has_value() == false);
  const double rate = *r.jobs_per_s(5000);
  BOOST_TEST(rate > 95.0);
  BOOST_TEST(rate < 105.0);
}

BOOST_AUTO_TEST_CASE(drain_rate_none_before_first_window) {
  DrainRate r(0);
  r.on_completed(50, 100);
  BOOST_TEST(!r.jobs_per_s(499).has_value());
  BOOST_TEST(*r.jobs_per_s(500) == 100.0);  // 50 jobs in 500 ms
}

BOOST_AUTO_TEST_CASE(drain_rate_follows_a_change_and_decays_when_stalled) {
  DrainRate r(0);
  for (std::int64_t t = 1; t <= 5000; ++t) r.on_completed(1, t);  // 1000/s
  BOOST_TEST(*r.jobs_per_s(5000) > 900.0);
  for (std::int64_t t = 5010; t <= 10'000; t += 10) r.on_completed(1, t);  // 100/s
  const double after = *r.jobs_per_s(10'000);
  BOOST_TEST(after < 150.0);
  BOOST_TEST(after > 90.0);
  // Ten seconds with no completions: the rate falls toward zero and retry_after grows to the cap.
  const double stalled = *r.jobs_per_s(20'000);
  BOOST_TEST(stalled < 1.0);
  BOOST_TEST(retry_after_ms(100, stalled) == 30'000);
  // A long gap counts like many empty windows, not like one: same result either way.
  DrainRate a(0), b(0);
  a.on_completed(100, 0);
  b.on_completed(100, 0);
  a.jobs_per_s(500);
  b.jobs_per_s(500);
  for (std::int64_t t = 1000; t <= 5000; t += 500) a.jobs_per_s(t);
  BOOST_TEST(std::abs(*a.jobs_per_s(5000) - *b.jobs_per_s(5000)) < 1e-9);
}

BOOST_AUTO_TEST_SUITE_END()  // test_policies_retry
