// Router prefix-aware dispatch on CAF's deterministic test_coordinator: two batcher doubles with
// chosen credit, jobs sharing prompt blocks, the slack rule, the switch, and retirement.
#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <memory>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "actors/router.hpp"
#include "tests/support/stand_in.hpp"
#include "tests/support/stats_probe.hpp"
#include "tests/support/test_system.hpp"

BOOST_AUTO_TEST_SUITE(test_actors_router_affinity)

using namespace sy;

namespace {

/// Which batcher double got which job, in order.
struct Trace {
  std::vector<std::pair<char, uint64_t>> runs;  // (batcher name, job uid)
};
using TraceP = std::shared_ptr<Trace>;

caf::behavior sink(caf::event_based_actor*) {
  return {
      [](out_atom, const AcceptedEvent&) {},   [](out_atom, const ErrorEvent&) {},
      [](out_atom, const DoneEvent&) {},       [](pull_atom, uint32_t) {},
      [](finished_atom, const JobOutcome&) {},
  };
}

/// A batcher double: (credit_atom, router, n) from the test makes it grant n credits; it records
/// every job it is given and never gives credit back, so the test sets every credit level.
caf::behavior fake_batcher(caf::event_based_actor* self, TraceP t, char name) {
  return {
      [=](credit_atom, const RouterActor& router, uint32_t n) {
        self->send(router, credit_atom::value, caf::actor_cast<BatcherActor>(self), n);
      },
      [=](run_atom, const Job& j) { t->runs.emplace_back(name, j.uid); },
      [](cancel_atom, uint64_t) {},
  };
}

constexpr int32_t kBlock = 16;

RouterConfig config(bool affinity, uint32_t slack = 8) {
  RouterConfig rc;
  rc.classes = {{"interactive", 0, 1.0, 1000, 0}};
  rc.default_class = "interactive";
  rc.prefix_affinity = affinity;
  rc.prefix_affinity_slack = slack;
  rc.block_size = kBlock;
  return rc;
}

/// A prompt of `shared` tokens common to every conversation `conv`, then `own` tokens only this
/// prompt has (`salt` tells prompts apart).
std::vector<int32_t> prompt(int conv, std::size_t shared, std::size_t own, int salt) {
  std::vector<int32_t> p;
  for (std::size_t i = 0; i < shared; ++i) p.push_back(conv * 1000 + static_cast<int32_t>(i));
  for (std::size_t i = 0; i < own; ++i) p.push_back(100000 + salt * 1000 + static_cast<int32_t>(i));
  return p;
}

struct Rig : test::TestSystem {
  TraceP t = std::make_shared<Trace>();
  caf::actor out, a, b;
  RouterActor router;
  uint64_t next_uid = 1;

  explicit Rig(RouterConfig rc) {
    out = sys->spawn(sink);
    router = spawn_router(*sys, std::move(rc), test::stand_in<EgressActor>(out),
                          test::stand_in<AdmissionActor>(out));
    a = sys->spawn(fake_batcher, t, 'A');
    b = sys->spawn(fake_batcher, t, 'B');
    sched->run();
  }
  ~Rig() {
    test::stop_all(out, router, a, b);
    sched->run();
  }
  void credit(const caf::actor& batcher, uint32_t n) {
    caf::anon_send(batcher, credit_atom::value, router, n);
    sched->run();
  }
  /// Enqueues a job with this prompt; returns the name of the batcher it was dispatched to.
  char run(std::vector<int32_t> p) {
    Job j;
    j.uid = next_uid++;
    j.id = "j" + std::to_string(j.uid);
    j.tenant = "t";
    j.client.kind = ClientRef::router;
    j.client.identity = "c";
    j.prompt = std::move(p);
    j.max_tokens = 4;
    auto before = t->runs.size();
    caf::anon_send(router, enqueue_atom::value, std::move(j));
    sched->run();
    BOOST_REQUIRE_EQUAL(t->runs.size(), before + 1);
    BOOST_REQUIRE_EQUAL(t->runs.back().second, next_uid - 1);
    return t->runs.back().first;
  }
  RouterStats stats() { return test::probe_stats<RouterStats>(*this, router); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(shared_prefix_follows_its_batcher_within_slack) {
  Rig rig(config(true));
  rig.credit(rig.a, 10);
  rig.credit(rig.b, 11);
  // First turn: no batcher has anything, so the freest (B) takes it and is remembered.
  BOOST_TEST(rig.run(prompt(1, 3 * kBlock, 5, 1)) == 'B');  // A 10, B 10
  rig.credit(rig.a, 3);                                     // A 13, B 10: A is freer
  // Next turn shares the 3 blocks: B, 3 credits behind (slack 8), still gets it.
  BOOST_TEST(rig.run(prompt(1, 3 * kBlock, 40, 2)) == 'B');  // A 13, B 9
  BOOST_TEST(rig.stats().affinity_hits == 1);
  BOOST_TEST(rig.stats().affinity_overruled == 0);
  // Another conversation has no match: the freest (A).
  BOOST_TEST(rig.run(prompt(2, 3 * kBlock, 5, 3)) == 'A');  // A 12, B 9
  // And its continuation stays on A even though A is no longer much freer.
  rig.credit(rig.b, 5);  // A 12, B 14
  BOOST_TEST(rig.run(prompt(2, 3 * kBlock, 9, 4)) == 'A');
  BOOST_TEST(rig.stats().affinity_hits == 2);
  // A prompt shorter than a block carries no prefix: plain rule (B has more credit).
  BOOST_TEST(rig.run(prompt(1, kBlock - 1, 0, 5)) == 'B');
  BOOST_TEST(rig.stats().affinity_hits == 2);
  BOOST_TEST(rig.stats().affinity_indexed > 0);
}

BOOST_AUTO_TEST_CASE(too_busy_prefix_holder_is_overruled) {
  Rig rig(config(true, 8));
  rig.credit(rig.a, 10);
  rig.credit(rig.b, 11);
  BOOST_TEST(rig.run(prompt(1, 3 * kBlock, 5, 1)) == 'B');  // A 10, B 10
  rig.credit(rig.a, 9);                                     // A 19, B 10: 9 behind > slack 8
  BOOST_TEST(rig.run(prompt(1, 3 * kBlock, 40, 2)) == 'A');
  BOOST_TEST(rig.stats().affinity_hits == 0);
  BOOST_TEST(rig.stats().affinity_overruled == 1);
  // A now holds the prefix as well (it was sent it), and is the freest: a hit on A.
  BOOST_TEST(rig.run(prompt(1, 3 * kBlock, 60, 3)) == 'A');
  BOOST_TEST(rig.stats().affinity_hits == 1);
}

BOOST_AUTO_TEST_CASE(affinity_off_always_takes_most_credit) {
  Rig rig(config(false));
  rig.credit(rig.a, 10);
  rig.credit(rig.b, 11);
  BOOST_TEST(rig.run(prompt(1, 3 * kBlock, 5, 1)) == 'B');  // A 10, B 10
  rig.credit(rig.a, 1);                                     // A 11, B 10
  BOOST_TEST(rig.run(prompt(1, 3 * kBlock, 40, 2)) == 'A');
  BOOST_TEST(rig.run(prompt(1, 3 * kBlock, 40, 2)) == 'A');  // A 10, B 10: tie, first
  BOOST_TEST(rig.run(prompt(1, 3 * kBlock, 40, 2)) == 'B');  // A 9, B 10
  BOOST_TEST(rig.stats().affinity_hits == 0);
  BOOST_TEST(rig.stats().affinity_overruled == 0);
  BOOST_TEST(rig.stats().affinity_indexed == 0);
}

BOOST_AUTO_TEST_CASE(retired_batcher_index_is_dropped) {
  Rig rig(config(true));
  rig.credit(rig.a, 10);
  rig.credit(rig.b, 11);
  BOOST_TEST(rig.run(prompt(1, 3 * kBlock, 5, 1)) == 'B');  // A 10, B 10
  // Control: with B still there, the continuation follows it.
  rig.credit(rig.a, 2);                                     // A 12, B 10
  BOOST_TEST(rig.run(prompt(1, 3 * kBlock, 7, 2)) == 'B');  // A 12, B 9
  caf::anon_send(rig.router, retire_atom::value, test::stand_in<BatcherActor>(rig.b));
  rig.sched->run();
  BOOST_TEST(rig.stats().batchers == 1);
  // The same actor granting credit again counts as a new batcher with an empty index (a real
  // replacement pair starts with an empty cache), so the prefix no longer pulls jobs to it.
  rig.credit(rig.b, 10);  // A 12, B 10
  BOOST_TEST(rig.run(prompt(1, 3 * kBlock, 9, 3)) == 'A');
  BOOST_TEST(rig.stats().affinity_hits == 1);
  // A batcher that goes down loses its index with its entry too.
  caf::anon_send_exit(rig.a, caf::exit_reason::user_shutdown);
  rig.sched->run();
  BOOST_TEST(rig.stats().batchers == 1);
  BOOST_TEST(rig.run(prompt(1, 3 * kBlock, 11, 4)) == 'B');
}

BOOST_AUTO_TEST_SUITE_END()  // test_actors_router_affinity
