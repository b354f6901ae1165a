// The supervisor on the deterministic test scheduler: real router and batchers, stand-in
// executors that hold or finish steps as the test says. Scale-up waits for upscale_delay_ms and
// scale-down for downscale_delay_ms on the actor clock, which only the test moves; a crashed
// executor's pair is replaced and its jobs run again. No sleeps, no real threads.
#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <chrono>
#include <deque>
#include <set>
#include <string>
#include <vector>

#include "actors/router.hpp"
#include "actors/supervisor.hpp"
#include "tests/support/executor_stub.hpp"
#include "tests/support/stand_in.hpp"
#include "tests/support/stats_probe.hpp"
#include "tests/support/test_system.hpp"

BOOST_AUTO_TEST_SUITE(test_actors_supervisor_shell)

using namespace sy;
using namespace std::chrono_literals;

namespace {

// What reached the stand-in egress and admission.
struct Seen {
  std::vector<DoneEvent> dones;
  std::vector<ErrorEvent> errors;
  std::vector<JobOutcome> outcomes;
};

caf::actor spawn_world(caf::actor_system& sys, Seen* seen) {
  return sys.spawn([seen](caf::event_based_actor*) -> caf::behavior {
    return {
        [seen](out_atom, DoneEvent& d) { seen->dones.push_back(d); },
        [seen](out_atom, ErrorEvent& e) { seen->errors.push_back(e); },
        [](out_atom, const AcceptedEvent&) {},
        [](out_atom, const TokensEvent&) {},
        [](pull_atom, uint32_t) {},
        [seen](finished_atom, JobOutcome& o) { seen->outcomes.push_back(o); },
    };
  });
}

struct Rig : test::TestSystem {
  Seen seen;
  std::deque<test::StubExecutor> execs;  // one per executor the supervisor built, in order
  std::vector<caf::actor> exec_actors;
  caf::actor world;
  RouterActor router;
  SupervisorActor sup;
  uint64_t next_uid = 1;

  Rig(int min, int max) {
    world = spawn_world(*sys, &seen);
    router = spawn_router(*sys, RouterConfig{}, test::stand_in<EgressActor>(world),
                          test::stand_in<AdmissionActor>(world));
    SupervisorConfig sc;
    sc.batching.max_sequences = 4;
    sc.batching.step_timeout_ms = 0;  // held steps are the test's doing, not a hang
    sc.executor.backend = Backend::null;
    sc.n_blocks = 256;
    sc.knobs.min_executors = min;
    sc.knobs.max_executors = max;
    sc.knobs.target_ongoing_per_executor = 2;
    sc.knobs.target_queue_wait_ms = 1000000;  // only the ongoing count is pressure here
    sc.knobs.upscale_delay_ms = 1000;
    sc.knobs.downscale_delay_ms = 5000;
    sc.interval_ms = 100;
    sc.slots = policy::executor_slots(false, 0, max);
    sc.make_executor = [this](caf::actor_system& s, const ExecutorSpec&, int32_t*) {
      auto& rec = execs.emplace_back();
      rec.mode = test::ExecMode::hang;
      exec_actors.push_back(test::spawn_executor_stub(s, &rec));
      return test::stand_in<ExecutorActor>(exec_actors.back());
    };
    SupervisorWiring w;
    w.router = router;
    w.egress = test::stand_in<EgressActor>(world);
    w.admission = test::stand_in<AdmissionActor>(world);
    sup = spawn_supervisor(*sys, std::move(sc), std::move(w));
    sched->run();
  }
  ~Rig() {
    test::stop_all(sup, router, world);
    for (const auto& e : exec_actors) test::stop_all(e);
    sched->run();
  }

  void submit(int n, uint32_t max_tokens) {
    for (int i = 0; i < n; ++i) {
      Job j;
      j.uid = next_uid++;
      j.id = "j" + std::to_string(j.uid);
      j.tenant = "t";
      j.prompt = {1, 2, 3};
      j.max_tokens = max_tokens;
      caf::anon_send(router, enqueue_atom::value, std::move(j));
    }
    sched->run();
  }
  // Moves the actor clock in supervisor ticks, running what each tick sets off.
  void advance(std::chrono::milliseconds d) {
    for (auto t = 0ms; t < d; t += 100ms) {
      sched->advance_time(100ms);
      sched->run();
    }
  }
  // Every stand-in answers what it holds and finishes later steps at once.
  void release_all() {
    for (auto& e : execs) e.mode = test::ExecMode::finish;
    for (const auto& a : exec_actors) caf::anon_send(a, test::answer_atom::value);
    sched->run();
  }
  SupervisorStats stats() { return test::probe_stats<SupervisorStats>(*this, sup); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(scales_up_after_the_upscale_delay_and_down_after_the_idle_delay) {
  Rig rig(1, 3);
  BOOST_REQUIRE_EQUAL(rig.stats().executors, 1);
  // 8 jobs: 4 run (held) in the one batcher, 4 wait in the router. 8 > 2 per executor.
  rig.submit(8, 4);
  rig.advance(600ms);
  SupervisorStats s = rig.stats();
  BOOST_CHECK_EQUAL(s.scale_ups, 0);  // pressure, but not yet for upscale_delay_ms
  BOOST_CHECK_EQUAL(s.executors, 1);
  rig.advance(900ms);
  s = rig.stats();
  // (queued + ongoing) / target = 4 executors wanted, capped at max 3: two more.
  BOOST_CHECK_EQUAL(s.scale_ups, 2);
  BOOST_CHECK_EQUAL(s.executors, 3);
  BOOST_CHECK_EQUAL(rig.execs.size(), 3u);
  // The new pairs took the 4 waiting jobs: none waits in the router, all 8 are in batchers.
  BOOST_CHECK_EQUAL(test::probe_stats<RouterStats>(rig, rig.router).waiting_total, 0);
  BOOST_CHECK_EQUAL(s.batchers.ongoing, 8);

  rig.release_all();
  BOOST_REQUIRE_EQUAL(rig.seen.dones.size(), 8u);
  for (const auto& d : rig.seen.dones) BOOST_CHECK_EQUAL(d.completion_tokens, 4u);
  rig.advance(4000ms);
  BOOST_CHECK_EQUAL(rig.stats().scale_downs, 0);  // idle, but not for downscale_delay_ms
  rig.advance(2000ms);
  s = rig.stats();
  BOOST_CHECK_EQUAL(s.scale_downs, 2);  // down to min
  BOOST_CHECK_EQUAL(s.executors, 1);
  BOOST_CHECK_EQUAL(s.executors_retiring, 0);
}

BOOST_AUTO_TEST_CASE(a_crashed_executor_is_replaced_and_its_jobs_run_again) {
  Rig rig(1, 1);
  rig.submit(2, 3);
  BOOST_REQUIRE_EQUAL(rig.execs.size(), 1u);
  BOOST_REQUIRE_EQUAL(rig.execs[0].hung.size(), 1u);  // both jobs in the held first step
  caf::anon_send_exit(rig.exec_actors[0], caf::exit_reason::kill);
  rig.sched->run();
  SupervisorStats s = rig.stats();
  BOOST_CHECK_EQUAL(s.executor_failures, 1);
  BOOST_CHECK_EQUAL(s.failures_crash, 1);
  BOOST_CHECK_EQUAL(s.replacements, 1);
  BOOST_CHECK_EQUAL(s.requeued, 2);
  BOOST_CHECK_EQUAL(s.executors, 1);
  BOOST_REQUIRE_EQUAL(rig.execs.size(), 2u);  // the replacement's executor
  // The re-queued jobs went to the replacement, whose first step is held too.
  BOOST_REQUIRE_EQUAL(rig.execs[1].hung.size(), 1u);
  BOOST_CHECK(rig.seen.dones.empty());
  rig.release_all();
  BOOST_REQUIRE_EQUAL(rig.seen.dones.size(), 2u);
  std::set<uint64_t> ran_again;
  for (const StepPlan& p : rig.execs[1].steps)
    for (const SeqPlan& q : p.seqs) ran_again.insert(q.uid);
  BOOST_CHECK((ran_again == std::set<uint64_t>{1, 2}));
  BOOST_CHECK(rig.seen.errors.empty());
  s = rig.stats();
  BOOST_CHECK_EQUAL(s.recoveries, 1);
  // Recovery is measured on the actor clock, which did not move: exactly 0 ms.
  BOOST_CHECK_EQUAL(s.recovery_ms_last, 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_actors_supervisor_shell
