// Table-driven tests of policy::decide_autoscale (elastic pairs) and policy::executor_slots.
#include <boost/test/unit_test.hpp>
#include <string>
#include <vector>

#include "policies/autoscale.hpp"

BOOST_AUTO_TEST_SUITE(test_policies_autoscale)

using namespace sy::policy;

namespace {

AutoscaleKnobs knobs() {
  AutoscaleKnobs k;
  k.min_executors = 1;
  k.max_executors = 3;
  k.target_ongoing_per_executor = 4;
  k.target_queue_wait_ms = 100;
  k.upscale_delay_ms = 500;
  k.downscale_delay_ms = 1000;
  return k;
}

ExecutorLoad busy(uint64_t id, uint32_t ongoing) {
  return {id, ongoing, 0, false};
}
ExecutorLoad idle(uint64_t id, int64_t idle_ms) {
  return {id, 0, idle_ms, false};
}

struct Case {
  std::string name;
  int64_t pressure_since;  // state before
  AutoscaleSnapshot snap;
  int add;
  std::vector<uint64_t> retire;
  int64_t pressure_after;  // state after
};

}  // namespace

BOOST_AUTO_TEST_CASE(decisions_table) {
  std::vector<Case> cases;
  // One row: name, pressure clock before, (now, queued, oldest wait, pairs), adds, retires,
  // pressure clock after.
  auto row = [&](std::string name, int64_t since, int64_t now, uint64_t queued, int64_t wait,
                 std::vector<ExecutorLoad> ex, int add, std::vector<uint64_t> retire,
                 int64_t after) {
    Case c;
    c.name = std::move(name);
    c.pressure_since = since;
    c.snap.now_ms = now;
    c.snap.queued = queued;
    c.snap.queue_wait_ms = wait;
    c.snap.executors = std::move(ex);
    c.add = add;
    c.retire = std::move(retire);
    c.pressure_after = after;
    cases.push_back(std::move(c));
  };
  row("nothing to do", -1, 1000, 0, 0, {busy(1, 2)}, 0, {}, -1);
  row("below min adds at once", -1, 1000, 0, 0, {}, 1, {}, -1);
  row("pressure starts the clock", -1, 1000, 5, 300, {busy(1, 4)}, 0, {}, 1000);
  row("pressure not long enough", 1000, 1400, 5, 300, {busy(1, 4)}, 0, {}, 1000);
  // demand 4 + 5 = 9 jobs at 4 per executor asks for 3, the max.
  row("pressure long enough: Ray's rule", 1000, 1500, 5, 300, {busy(1, 4)}, 2, {}, 1500);
  row("wait under target but too many ongoing", 1000, 1600, 2, 10, {busy(1, 4)}, 1, {}, 1600);
  row("already at max", 0, 5000, 50, 900, {busy(1, 4), busy(2, 4), busy(3, 4)}, 0, {}, 0);
  row("queue empty: no pressure, clock reset", 700, 1000, 0, 0, {busy(1, 9)}, 0, {}, -1);
  row("idle long enough is retired", -1, 9000, 0, 0, {busy(1, 1), idle(2, 1500)}, 0, {2}, -1);
  row("idle not long enough stays", -1, 9000, 0, 0, {busy(1, 1), idle(2, 900)}, 0, {}, -1);
  row("never below min", -1, 9000, 0, 0, {idle(1, 5000)}, 0, {}, -1);
  row("longest idle first, down to min", -1, 9000, 0, 0,
      {idle(1, 2000), idle(2, 3000), idle(3, 2500)}, 0, {2, 3}, -1);
  row("retiring pairs do not count", -1, 9000, 0, 0, {idle(1, 2000), {2, 0, 3000, true}}, 0, {},
      -1);
  row("no retirement under pressure", 900, 1000, 3, 200, {busy(1, 4), idle(2, 5000)}, 0, {}, 900);
  row("above max retires the idlest", -1, 9000, 0, 0,
      {busy(1, 1), busy(2, 1), idle(3, 10), busy(4, 2)}, 0, {3}, -1);

  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.name) {
      AutoscaleState st;
      st.pressure_since_ms = c.pressure_since;
      auto d = decide_autoscale(c.snap, knobs(), st);
      BOOST_TEST(d.add == c.add);
      BOOST_TEST(d.retire == c.retire, boost::test_tools::per_element());
      BOOST_TEST(st.pressure_since_ms == c.pressure_after);
      if (d.add > 0 || !d.retire.empty()) BOOST_TEST(!d.reason.empty());
    }
  }
}

BOOST_AUTO_TEST_CASE(queue_wait_alone_scales_one_at_a_time) {
  // Without a target per executor only the wait counts, and each addition waits a full delay.
  AutoscaleKnobs k = knobs();
  k.target_ongoing_per_executor = 0;
  k.max_executors = 4;
  AutoscaleState st;
  std::vector<ExecutorLoad> ex = {busy(1, 64)};
  int total = 1;
  for (int64_t t = 0; t <= 2000; t += 100) {
    auto d = decide_autoscale({t, 100, 500, ex}, k, st);
    BOOST_TEST(d.add <= 1);
    for (int i = 0; i < d.add; ++i) ex.push_back(busy(static_cast<uint64_t>(++total), 64));
  }
  // Additions at 500, 1000 and 1500 ms (the clock starts at 0): then max.
  BOOST_TEST(total == 4);
}

BOOST_AUTO_TEST_CASE(slots_follow_devices) {
  BOOST_TEST(executor_slots(false, 0, 3).size() == 3u);
  BOOST_TEST(executor_slots(false, 4, 2).size() == 2u);  // CPU backend ignores devices
  auto gpu = executor_slots(true, 2, 8);
  BOOST_REQUIRE(gpu.size() == 2u);
  BOOST_TEST(gpu[1].device == 1);
  BOOST_TEST(executor_slots(true, 0, 2).size() == 2u);   // a device backend without devices: CPU
  BOOST_TEST(executor_slots(false, 0, 0).size() == 1u);  // at least one
}

BOOST_AUTO_TEST_SUITE_END()  // test_policies_autoscale
