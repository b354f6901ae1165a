// The fair queue's memory under endless new tenant names: empty flows kept for their tags are
// bounded, while a tenant's recent service still counts when it returns soon.
#include <boost/test/unit_test.hpp>
#include <string>

#include "policies/qos.hpp"

BOOST_AUTO_TEST_SUITE(test_policies_qos_flows)

using sy::policy::FairQueue;
using sy::policy::QueuedJob;

namespace {

QueuedJob job(std::uint64_t handle, std::string tenant, std::uint32_t cost = 10) {
  QueuedJob j;
  j.handle = handle;
  j.tenant = std::move(tenant);
  j.cost = cost;
  return j;
}

std::string numbered(std::string prefix, int i) {
  prefix += std::to_string(i);  // appended: GCC 12 warns (-Wrestrict) on "lit" + string&&
  return prefix;
}

}  // namespace

BOOST_AUTO_TEST_CASE(one_job_each_from_endless_new_tenants_keeps_flows_bounded) {
  FairQueue q({{"interactive", 0, 1.0, 1024, 0}});
  // One job at a time, each of a tenant never seen before: virtual time never passes their
  // tags (it stands still while only new tenants arrive), so without a cap every flow stays.
  for (int i = 0; i < 20000; ++i) {
    BOOST_REQUIRE(q.push(0, job(static_cast<std::uint64_t>(i) + 1, numbered("t", i))) ==
                  sy::policy::PushResult::accepted);
    BOOST_REQUIRE(q.pop());
  }
  BOOST_TEST(q.empty());
  BOOST_TEST(q.flows(0) <= 4096u);
}

BOOST_AUTO_TEST_CASE(a_tenant_served_just_before_still_waits_its_turn) {
  FairQueue q({{"interactive", 0, 1.0, 1024, 0}});
  // "a" is served, then "a" and "b" queue together: "b" goes first, "a" having just had a turn.
  q.push(0, job(1, "a"));
  BOOST_REQUIRE(q.pop());
  q.push(0, job(2, "a"));
  q.push(0, job(3, "b"));
  auto first = q.pop();
  BOOST_REQUIRE(first);
  BOOST_TEST(first->job.tenant == "b");
}

BOOST_AUTO_TEST_SUITE_END()  // test_policies_qos_flows
