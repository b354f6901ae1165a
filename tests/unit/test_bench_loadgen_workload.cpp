// bench_loadgen's workload shapes (bench/loadgen_workload.hpp): the prompt profiles and length
// distributions its flags resolve to, the draws they make, and bursty open-loop arrivals.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "bench/loadgen_workload.hpp"

BOOST_AUTO_TEST_SUITE(test_bench_loadgen_workload)

using namespace sy::bench::loadgen;

namespace {

struct Sample {
  double mean = 0, median = 0;
  uint32_t lo = UINT32_MAX, hi = 0;
  size_t at_hi = 0;
};

Sample draw(const PromptShape& s, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> v(n);
  Sample r;
  for (auto& x : v) {
    x = draw_len(s, rng);
    r.mean += x;
    r.lo = std::min(r.lo, x);
    r.hi = std::max(r.hi, x);
    r.at_hi += x == s.bounds.hi;
  }
  r.mean /= static_cast<double>(n);
  std::sort(v.begin(), v.end());
  r.median = v[n / 2];
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(flags_without_a_profile_keep_their_old_meaning) {
  // No flag: 16 tokens. N: fixed. A..B: uniform, drawing exactly what the earlier
  // uniform_int_distribution did, so a seed reproduces an earlier run's prompts.
  PromptShape d = resolve_prompt("", {}, {}, {}, {});
  BOOST_TEST((d.dist == LenDist::fixed));
  BOOST_TEST(d.bounds.lo == 16u);
  BOOST_TEST(d.bounds.hi == 16u);
  PromptShape n = resolve_prompt("", Range{64, 64}, {}, {}, {});
  BOOST_TEST((n.dist == LenDist::fixed));
  std::mt19937_64 rng(3);
  BOOST_TEST(draw_len(n, rng) == 64u);
  PromptShape u = resolve_prompt("", Range{10, 20}, {}, {}, {});
  BOOST_TEST((u.dist == LenDist::uniform));
  std::mt19937_64 a(5), b(5);
  for (int i = 0; i < 100; ++i)
    BOOST_TEST(draw_len(u, a) == std::uniform_int_distribution<uint32_t>(10, 20)(b));
}

BOOST_AUTO_TEST_CASE(short_profile_is_lognormal_around_128) {
  PromptShape s = resolve_prompt("short", {}, {}, {}, {});
  BOOST_TEST((s.dist == LenDist::lognormal));
  BOOST_TEST(s.mean == 128.0);
  const Sample r = draw(s, 20000, 1);
  BOOST_TEST(r.lo >= s.bounds.lo);
  BOOST_TEST(r.hi <= s.bounds.hi);
  // Standard deviation 64: the mean of 20000 draws has a standard error of 0.45; the clamp at
  // 512 (3.2 sigma of the log) moves it by less than 0.1.
  BOOST_TEST(std::abs(r.mean - 128) < 4);
  // A lognormal's median is mean / sqrt(1 + cv^2) = 114.5 (a normal's would be 128).
  BOOST_TEST(std::abs(r.median - 114.5) < 4);
  BOOST_TEST(r.at_hi < 100u);  // expected 0.08% of 20000 = 16
}

BOOST_AUTO_TEST_CASE(long_profile_is_lognormal_around_2048) {
  PromptShape s = resolve_prompt("long", {}, {}, {}, {});
  BOOST_TEST(s.mean == 2048.0);
  BOOST_TEST(s.bounds.hi <= 3072u);  // leaves output room in a 4096-token context
  const Sample r = draw(s, 20000, 2);
  BOOST_TEST(r.lo >= s.bounds.lo);
  BOOST_TEST(r.hi <= s.bounds.hi);
  // cv 0.25: 3072 is 1.77 sigma of the log above the median, so 3.8% of draws are clamped
  // there, which lowers the mean by about 13; the standard error is 3.6.
  BOOST_TEST(std::abs(r.mean - 2048) < 60);
  BOOST_TEST(std::abs(r.median - 2048 / std::sqrt(1 + 0.25 * 0.25)) < 40);
  BOOST_TEST(r.at_hi > 20000u * 2 / 100);
  BOOST_TEST(r.at_hi < 20000u * 6 / 100);
}

BOOST_AUTO_TEST_CASE(flags_override_a_profile) {
  // fixed sends the mean.
  PromptShape f = resolve_prompt("short", {}, LenDist::fixed, {}, {});
  std::mt19937_64 rng(1);
  BOOST_TEST(draw_len(f, rng) == 128u);
  BOOST_TEST(f.bounds.lo == 128u);
  BOOST_TEST(f.bounds.hi == 128u);
  // normal around the profile's mean, in its bounds: symmetric, so the median is near the mean.
  PromptShape n = resolve_prompt("long", {}, LenDist::normal, {}, 0.1);
  const Sample r = draw(n, 20000, 4);
  BOOST_TEST(std::abs(r.median - 2048) < 20);  // sd 205: standard error of the median 1.8
  // New bounds keep the profile's distribution; their middle becomes the mean.
  PromptShape b = resolve_prompt("short", Range{100, 200}, {}, {}, {});
  BOOST_TEST((b.dist == LenDist::lognormal));
  BOOST_TEST(b.mean == 150.0);
  const Sample rb = draw(b, 5000, 5);
  BOOST_TEST(rb.lo >= 100u);
  BOOST_TEST(rb.hi <= 200u);
  // N with a drawn distribution: N is the mean, draws stay within N/4..4N.
  PromptShape g = resolve_prompt("", Range{100, 100}, LenDist::lognormal, {}, {});
  BOOST_TEST(g.mean == 100.0);
  BOOST_TEST(g.bounds.lo == 25u);
  BOOST_TEST(g.bounds.hi == 400u);
}

BOOST_AUTO_TEST_CASE(contradictory_prompt_flags_are_refused) {
  BOOST_CHECK_THROW(resolve_prompt("medium", {}, {}, {}, {}), std::invalid_argument);
  // A cv means nothing to uniform or fixed lengths.
  BOOST_CHECK_THROW(resolve_prompt("", Range{1, 9}, {}, {}, 0.3), std::invalid_argument);
  // uniform draws on its bounds: a mean would be ignored.
  BOOST_CHECK_THROW(resolve_prompt("", Range{1, 9}, {}, 5.0, {}), std::invalid_argument);
  // A mean outside the clamp bounds.
  BOOST_CHECK_THROW(resolve_prompt("short", {}, {}, 4000.0, {}), std::invalid_argument);
  BOOST_CHECK_THROW(resolve_prompt("", {}, LenDist::normal, {}, 0.0), std::invalid_argument);
  BOOST_CHECK_THROW(resolve_prompt("", {}, {}, 0.5, {}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(bursts_come_n_at_a_time_at_the_mean_rate) {
  // 100 jobs/s in bursts of 4: 25 bursts a second, 40 ms apart on average.
  std::mt19937_64 rng(9);
  ArrivalClock clock(100, 4, 0);
  std::vector<int64_t> due;
  for (int i = 0; i < 4000; ++i) {
    due.push_back(clock.next_ns());
    clock.advance(rng);
  }
  for (size_t i = 0; i < due.size(); i += 4)
    for (size_t k = 1; k < 4; ++k) BOOST_TEST(due[i + k] == due[i]);
  std::set<int64_t> instants(due.begin(), due.end());
  BOOST_TEST(instants.size() == 1000u);
  // 999 exponential gaps of mean 40 ms: standard error 1.3 ms.
  const double mean_gap_ms = (due.back() - due.front()) / 1e6 / 999;
  BOOST_TEST(std::abs(mean_gap_ms - 40) < 6);
}

BOOST_AUTO_TEST_CASE(burst_of_one_is_poisson) {
  std::mt19937_64 rng(11);
  ArrivalClock clock(100, 1, 0);
  int64_t first = clock.next_ns(), prev = first;
  size_t repeats = 0;
  for (int i = 0; i < 4000; ++i) {
    clock.advance(rng);
    repeats += clock.next_ns() == prev;
    prev = clock.next_ns();
  }
  BOOST_TEST(repeats == 0u);
  // 4000 gaps of mean 10 ms: standard error 0.16 ms.
  BOOST_TEST(std::abs((prev - first) / 1e6 / 4000 - 10) < 1);
}

BOOST_AUTO_TEST_SUITE_END()
