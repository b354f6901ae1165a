// FairQueue tests: strict priority between ranks, weighted fairness between tenants and between
// classes of one rank, FIFO per tenant, no banked credit, bounded queues, cancellation, expiry.
#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "policies/qos.hpp"

BOOST_AUTO_TEST_SUITE(test_policies_qos)

using namespace sy::policy;

namespace {

std::vector<PriorityClass> two_classes(std::size_t limit = 1000) {
  return {{"interactive", 0, 1.0, limit, 0}, {"batch", 1, 1.0, limit, 0}};
}

QueuedJob job(std::uint64_t h, std::string tenant, std::uint32_t cost = 1, double weight = 1.0,
              std::int64_t deadline = 0, std::int64_t enqueued = 0) {
  QueuedJob j;
  j.handle = h;
  j.tenant = std::move(tenant);
  j.cost = cost;
  j.tenant_weight = weight;
  j.deadline_ms = deadline;
  j.enqueued_ms = enqueued;
  return j;
}

// "t<i>", built by append: g++ 12 warns falsely (-Wrestrict) on "t" + std::to_string(i).
std::string tenant_name(std::uint64_t i) {
  std::string s = "t";
  s += std::to_string(i);
  return s;
}

}  // namespace

BOOST_AUTO_TEST_CASE(interactive_always_before_batch) {
  // Random interleavings of pushes and pops: whenever an interactive job waits, pop returns one.
  for (std::uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
    FairQueue q(two_classes());
    std::mt19937_64 rng(seed);
    std::uint64_t h = 0;
    int checked = 0;
    for (int step = 0; step < 5000; ++step) {
      if (rng() % 3 != 0) {
        const std::size_t cls = rng() % 4 == 0 ? 0 : 1;
        BOOST_REQUIRE((q.push(cls, job(++h, tenant_name(rng() % 5), 1 + rng() % 100)) ==
                           PushResult::accepted ||
                       q.full(cls)));
      } else if (!q.empty()) {
        const bool interactive_waiting = q.size(0) > 0;
        const auto d = q.pop();
        BOOST_REQUIRE(d.has_value());
        if (interactive_waiting) BOOST_REQUIRE_EQUAL(d->class_index, 0u);
        ++checked;
      }
    }
    BOOST_TEST(checked > 1000);
  }
}

BOOST_AUTO_TEST_CASE(batch_runs_when_no_interactive_waits) {
  FairQueue q(two_classes());
  q.push(1, job(1, "a"));
  q.push(1, job(2, "a"));
  BOOST_TEST(q.pop()->job.handle == 1u);
  q.push(0, job(3, "b"));
  BOOST_TEST(q.pop()->job.handle == 3u);  // overtakes the waiting batch job
  BOOST_TEST(q.pop()->job.handle == 2u);
  BOOST_TEST(!q.pop().has_value());
}

BOOST_AUTO_TEST_CASE(next_rank_is_the_rank_pop_serves) {
  FairQueue q(two_classes());
  BOOST_TEST(q.top_rank() == 0);
  BOOST_TEST(!q.next_rank().has_value());
  q.push(1, job(1, "a"));
  BOOST_TEST(q.next_rank().value() == 1);
  q.push(0, job(2, "b"));
  BOOST_TEST(q.next_rank().value() == 0);
  BOOST_TEST(q.pop()->job.handle == 2u);
  BOOST_TEST(q.next_rank().value() == 1);
  BOOST_TEST(q.pop()->job.handle == 1u);
  BOOST_TEST(!q.next_rank().has_value());
}

BOOST_AUTO_TEST_CASE(tenant_weights_are_honoured_by_served_tokens) {
  struct Case {
    std::vector<double> weights;
    bool random_costs;
  };
  const std::vector<Case> cases = {
      {{3, 1}, true}, {{3, 1}, false}, {{1, 1}, true}, {{1, 2, 5}, true}, {{10, 1}, true}};
  for (const Case& c : cases) {
    FairQueue q({{"default", 0, 1.0, 100000, 0}});
    std::mt19937_64 rng(42);
    std::uint64_t h = 0;
    const std::size_t n = c.weights.size();
    std::vector<std::size_t> queued(n, 0);
    auto refill = [&] {  // keep every tenant saturated: at least 20 jobs waiting
      for (std::size_t t = 0; t < n; ++t)
        while (queued[t] < 20) {
          const std::uint32_t cost =
              c.random_costs ? static_cast<std::uint32_t>(1 + rng() % 256) : 64;
          BOOST_REQUIRE(
              (q.push(0, job(++h, tenant_name(t), cost, c.weights[t])) == PushResult::accepted));
          ++queued[t];
        }
    };
    std::vector<double> served(n, 0);
    for (int i = 0; i < 20000; ++i) {
      refill();
      const auto d = q.pop();
      const std::size_t t = std::stoul(d->job.tenant.substr(1));
      --queued[t];
      served[t] += d->job.cost;
    }
    for (std::size_t t = 1; t < n; ++t) {
      const double want = c.weights[t] / c.weights[0];
      const double got = served[t] / served[0];
      BOOST_TEST(std::abs(got / want - 1.0) < 0.10,
                 "weights case tenant " << t << ": served ratio " << got << ", want " << want);
    }
  }
}

BOOST_AUTO_TEST_CASE(weights_3_to_1_within_ten_percent) {
  // The figure, stated alone: two saturating tenants, weights 3:1, served tokens 3:1 ±10%.
  FairQueue q({{"default", 0, 1.0, 100000, 0}});
  std::mt19937_64 rng(7);
  std::uint64_t h = 0;
  std::map<std::string, double> served;
  std::map<std::string, int> queued;
  for (int i = 0; i < 10000; ++i) {
    for (const auto& [name, w] : {std::pair<std::string, double>{"heavy", 3.0}, {"light", 1.0}})
      while (queued[name] < 10) {
        q.push(0, job(++h, name, static_cast<std::uint32_t>(16 + rng() % 113), w));
        ++queued[name];
      }
    const auto d = q.pop();
    --queued[d->job.tenant];
    served[d->job.tenant] += d->job.cost;
  }
  const double ratio = served["heavy"] / served["light"];
  BOOST_TEST(ratio > 2.7);
  BOOST_TEST(ratio < 3.3);
}

BOOST_AUTO_TEST_CASE(fifo_within_a_tenant) {
  FairQueue q({{"default", 0, 1.0, 100, 0}});
  for (std::uint64_t h = 1; h <= 10; ++h)
    q.push(0, job(h, h % 2 ? "odd" : "even", static_cast<std::uint32_t>(h * 7 % 5 + 1)));
  std::map<std::string, std::uint64_t> last;
  while (auto d = q.pop()) {
    BOOST_TEST(d->job.handle > last[d->job.tenant]);
    last[d->job.tenant] = d->job.handle;
  }
}

BOOST_AUTO_TEST_CASE(idle_tenant_banks_no_credit) {
  FairQueue q({{"default", 0, 1.0, 100000, 0}});
  std::uint64_t h = 0;
  for (int i = 0; i < 1000; ++i) {  // "a" alone for a long time
    q.push(0, job(++h, "a", 10));
    q.pop();
  }
  for (int i = 0; i < 100; ++i) {
    q.push(0, job(++h, "a", 10));
    q.push(0, job(++h, "b", 10));
  }
  int b_in_first_20 = 0;
  for (int i = 0; i < 20; ++i) b_in_first_20 += q.pop()->job.tenant == "b";
  BOOST_TEST(b_in_first_20 >= 9);  // alternation, not a long run of "b" repaying "a"'s history
  BOOST_TEST(b_in_first_20 <= 11);
}

BOOST_AUTO_TEST_CASE(equal_rank_classes_share_by_class_weight) {
  FairQueue q(
      {{"gold", 0, 2.0, 100000, 0}, {"silver", 0, 1.0, 100000, 0}, {"bulk", 1, 1.0, 100000, 0}});
  std::uint64_t h = 0;
  std::map<std::size_t, int> served;
  for (int i = 0; i < 3000; ++i) {
    for (std::size_t c = 0; c < 3; ++c)
      while (q.size(c) < 5) q.push(c, job(++h, "t", 32));
    ++served[q.pop()->class_index];
  }
  BOOST_TEST(served[2] == 0);  // strict: the lower rank never runs while rank 0 has work
  const double ratio = static_cast<double>(served[0]) / served[1];
  BOOST_TEST(ratio > 1.8);
  BOOST_TEST(ratio < 2.2);
}

BOOST_AUTO_TEST_CASE(queue_full_is_explicit_and_per_class) {
  FairQueue q(two_classes(3));
  for (std::uint64_t h = 1; h <= 3; ++h)
    BOOST_TEST((q.push(1, job(h, "a")) == PushResult::accepted));
  BOOST_TEST(q.full(1));
  BOOST_TEST((q.push(1, job(4, "a")) == PushResult::full));
  BOOST_TEST(!q.contains(4));
  BOOST_TEST(q.size(1) == 3u);
  BOOST_TEST((q.push(0, job(5, "a")) == PushResult::accepted));  // the other class has room
  q.pop();
  q.pop();
  BOOST_TEST((q.push(1, job(4, "a")) == PushResult::accepted));
  BOOST_TEST((q.push(7, job(6, "a")) == PushResult::unknown_class));
  BOOST_TEST((q.push(1, job(4, "b")) == PushResult::duplicate));
}

BOOST_AUTO_TEST_CASE(deadline_and_queue_timeout_expiry) {
  FairQueue q({{"interactive", 0, 1.0, 100, 0}, {"batch", 1, 1.0, 100, 500}});
  q.push(0, job(1, "a", 1, 1.0, 100));      // deadline 100
  q.push(0, job(2, "a", 1, 1.0, 0));        // none
  q.push(0, job(3, "b", 1, 1.0, 250));      // deadline 250
  q.push(1, job(4, "a", 1, 1.0, 0, 10));    // queue timeout at 510
  q.push(1, job(5, "a", 1, 1.0, 400, 10));  // deadline 400 comes first
  BOOST_TEST(*q.next_expiry() == 100);
  BOOST_TEST(q.expire(99).empty());
  auto e = q.expire(100);  // at the deadline counts as passed
  BOOST_REQUIRE(e.size() == 1u);
  BOOST_TEST(e[0].job.handle == 1u);
  BOOST_TEST((e[0].reason == ExpiryReason::deadline));
  e = q.expire(1000);
  BOOST_REQUIRE(e.size() == 3u);
  BOOST_TEST(e[0].job.handle == 3u);
  BOOST_TEST(e[1].job.handle == 5u);
  BOOST_TEST((e[1].reason == ExpiryReason::deadline));
  BOOST_TEST(e[2].job.handle == 4u);
  BOOST_TEST((e[2].reason == ExpiryReason::queue_timeout));
  BOOST_TEST(e[2].class_index == 1u);
  // Only the job without a deadline is left, and it is the only one that ever runs.
  BOOST_TEST(q.size() == 1u);
  BOOST_TEST(q.pop()->job.handle == 2u);
  BOOST_TEST(!q.pop().has_value());
  BOOST_TEST(!q.next_expiry().has_value());
}

BOOST_AUTO_TEST_CASE(popped_jobs_do_not_expire_later) {
  FairQueue q(two_classes());
  q.push(0, job(1, "a", 1, 1.0, 50));
  BOOST_TEST(q.pop()->job.handle == 1u);
  BOOST_TEST(q.expire(1000).empty());
}

BOOST_AUTO_TEST_CASE(cancel_removes_head_or_middle) {
  FairQueue q({{"default", 0, 1.0, 100, 0}});
  for (std::uint64_t h = 1; h <= 5; ++h) q.push(0, job(h, "a", 1, 1.0, 1000));
  BOOST_TEST(q.remove(1));  // the head
  BOOST_TEST(q.remove(3));  // the middle
  BOOST_TEST(!q.remove(3));
  BOOST_TEST(!q.remove(99));
  std::vector<std::uint64_t> order;
  while (auto d = q.pop()) order.push_back(d->job.handle);
  BOOST_TEST(order == (std::vector<std::uint64_t>{2, 4, 5}));
  BOOST_TEST(q.expire(5000).empty());  // removed jobs left the expiry index too
}

BOOST_AUTO_TEST_CASE(position_estimate_counts_higher_ranks_and_own_class) {
  FairQueue q(two_classes());
  q.push(0, job(1, "a"));
  q.push(1, job(2, "a"));
  q.push(1, job(3, "b"));
  BOOST_TEST(q.position_estimate(0) == 1u);
  BOOST_TEST(q.position_estimate(1) == 3u);
  BOOST_TEST(*q.find_class("batch") == 1u);
  BOOST_TEST(!q.find_class("nope").has_value());
}

BOOST_AUTO_TEST_CASE(invalid_configurations_throw) {
  BOOST_CHECK_THROW(FairQueue({}), std::invalid_argument);
  BOOST_CHECK_THROW(FairQueue({{"a", 0, 1, 1, 0}, {"a", 1, 1, 1, 0}}), std::invalid_argument);
  BOOST_CHECK_THROW(FairQueue({{"", 0, 1, 1, 0}}), std::invalid_argument);
  BOOST_CHECK_THROW(FairQueue({{"a", 0, 0, 1, 0}}), std::invalid_argument);
  BOOST_CHECK_THROW(FairQueue({{"a", 0, 1, 0, 0}}), std::invalid_argument);
  BOOST_CHECK_THROW(FairQueue({{"a", 0, 1, 1, -5}}), std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()  // test_policies_qos
