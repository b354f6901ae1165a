// FairQueue::ahead_of, the queue_position of accepted and status_reply: for every queued job it
// must equal the number of jobs pop() hands out before it, whatever the mix of ranks, class
// weights, tenant weights and costs.
#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <map>
#include <vector>

#include "policies/qos.hpp"

BOOST_AUTO_TEST_SUITE(test_policies_queue_position)

using namespace sy::policy;

namespace {

std::uint64_t lcg(std::uint64_t& s) {
  s = s * 6364136223846793005ULL + 1442695040888963407ULL;
  return s >> 33;
}

std::vector<PriorityClass> classes() {
  // Two classes share rank 0 with different weights; one is less important.
  return {{"a", 0, 1.0, 1000, 0}, {"b", 0, 3.0, 1000, 0}, {"low", 1, 1.0, 1000, 0}};
}

}  // namespace

BOOST_AUTO_TEST_CASE(ahead_of_is_the_pop_order) {
  std::uint64_t seed = 42;
  for (int round = 0; round < 50; ++round) {
    FairQueue q(classes());
    std::uint64_t handle = 1;
    const char* tenants[] = {"x", "y", "z"};
    const double weights[] = {1.0, 2.0, 0.5};
    // Some history first, so that virtual times and last finish tags are not all zero.
    const int n = 5 + static_cast<int>(lcg(seed) % 40);
    for (int i = 0; i < n; ++i) {
      QueuedJob j;
      j.handle = handle++;
      const auto t = lcg(seed) % 3;
      j.tenant = tenants[t];
      j.tenant_weight = weights[t];
      j.cost = 1 + static_cast<std::uint32_t>(lcg(seed) % 50);
      BOOST_REQUIRE(q.push(lcg(seed) % 3, j) == PushResult::accepted);
      if (lcg(seed) % 4 == 0) q.pop();
    }
    std::map<std::uint64_t, std::size_t> predicted;
    for (std::uint64_t h = 1; h < handle; ++h)
      if (auto a = q.ahead_of(h)) predicted[h] = *a;
    std::size_t popped = 0;
    while (auto d = q.pop()) {
      BOOST_REQUIRE(predicted.count(d->job.handle));
      BOOST_CHECK_EQUAL(predicted[d->job.handle], popped);
      ++popped;
    }
    BOOST_CHECK_EQUAL(popped, predicted.size());
  }
}

BOOST_AUTO_TEST_CASE(ahead_of_an_unknown_job_is_nothing) {
  FairQueue q(classes());
  BOOST_CHECK(!q.ahead_of(7).has_value());
  QueuedJob j;
  j.handle = 7;
  j.tenant = "x";
  q.push(0, j);
  BOOST_CHECK_EQUAL(q.ahead_of(7).value_or(99), 0u);
  q.pop();
  BOOST_CHECK(!q.ahead_of(7).has_value());
}

BOOST_AUTO_TEST_SUITE_END()  // test_policies_queue_position
