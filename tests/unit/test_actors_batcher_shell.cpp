// The batcher shell on the deterministic test scheduler with a stand-in executor that finishes
// steps, throws, answers with a failed step, or never answers (the watchdog then fires when the
// test moves the clock past step_timeout_ms). No real threads, no sleeps.
#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "actors/batcher.hpp"
#include "actors/messages.hpp"
#include "core/error_code.hpp"
#include "tests/support/enum_print.hpp"
#include "tests/support/executor_stub.hpp"
#include "tests/support/stand_in.hpp"
#include "tests/support/test_system.hpp"

BOOST_AUTO_TEST_SUITE(test_actors_batcher_shell)

using namespace sy;

namespace {

using test::answer_atom;
using test::ExecMode;
using test::spawn_executor_stub;

// Everything the stand-ins saw; the actors run on the test thread, so plain fields do.
struct Record : test::StubExecutor {
  uint64_t credit = 0;
  std::vector<uint64_t> router_finished;
  std::vector<Job> requeued;
  int router_retire = 0;  // the batcher asked the router to stop dispatching to it
  std::vector<DoneEvent> dones;
  std::vector<ErrorEvent> errors;
  std::vector<TokensEvent> chunks;
  std::vector<JobOutcome> outcomes;
  std::vector<PairFailure> failures;
  bool batcher_down = false;
};

// Router, egress, admission and supervisor in one.
caf::actor spawn_world(caf::actor_system& sys, Record* rec) {
  return sys.spawn([rec](caf::event_based_actor*) -> caf::behavior {
    return {
        [rec](credit_atom, const BatcherActor&, uint32_t n) { rec->credit += n; },
        [rec](finished_atom, std::vector<uint64_t>& uids) {
          rec->router_finished.insert(rec->router_finished.end(), uids.begin(), uids.end());
        },
        [rec](requeue_atom, std::vector<Job>& jobs) {
          rec->requeued.insert(rec->requeued.end(), jobs.begin(), jobs.end());
        },
        [rec](retire_atom, const BatcherActor&) -> uint32_t {
          ++rec->router_retire;
          return 0;
        },
        [rec](out_atom, TokensEvent& t) { rec->chunks.push_back(t); },
        [rec](out_atom, DoneEvent& d) { rec->dones.push_back(d); },
        [rec](out_atom, ErrorEvent& e) { rec->errors.push_back(e); },
        [rec](finished_atom, JobOutcome& o) { rec->outcomes.push_back(o); },
        [rec](failed_atom, PairFailure& f) { rec->failures.push_back(f); },
        [](recovered_atom, int64_t, int64_t) {},
        [](kvpolicy_atom, const policy::KvPolicy&) {},
    };
  });
}

struct Rig : test::TestSystem {
  Record rec;
  Record direct;  // what reached the direct egress (with_direct), the journal standing in `world`
  caf::actor exec, world, direct_world;
  BatcherActor batcher;
  caf::actor watcher;  // monitors the batcher (held: an actor nobody references goes away)

  explicit Rig(BatchingConfig bc = {}, int32_t n_blocks = 64, bool with_direct = false) {
    exec = spawn_executor_stub(*sys, &rec);
    world = spawn_world(*sys, &rec);
    BatcherExtras extras;
    extras.supervisor = test::stand_in<SupervisorActor>(world);
    extras.pair = 3;
    if (with_direct) {
      direct_world = spawn_world(*sys, &direct);
      extras.direct_egress = test::stand_in<EgressActor>(direct_world);
    }
    batcher = spawn_batcher(*sys, bc, nullptr, test::stand_in<ExecutorActor>(exec),
                            test::stand_in<RouterActor>(world), test::stand_in<EgressActor>(world),
                            test::stand_in<AdmissionActor>(world), n_blocks, extras);
    Record* r = &rec;
    watcher = sys->spawn([r, b = batcher](caf::event_based_actor* self) -> caf::behavior {
      self->monitor(b);
      self->set_down_handler([r](caf::down_msg&) { r->batcher_down = true; });
      return {[](int32_t) {}};
    });
    sched->run();
  }
  ~Rig() {
    rec.hung.clear();
    test::stop_all(exec, world, batcher, watcher);
    if (direct_world) test::stop_all(direct_world);
    sched->run();
  }

  int64_t now() const {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               sched->clock().now().time_since_epoch())
        .count();
  }

  Job job(uint64_t uid, std::vector<int32_t> prompt, uint32_t max_tokens) const {
    Job j;
    j.uid = uid;
    j.id = "job-" + std::to_string(uid);
    j.tenant = "t";
    j.prompt = std::move(prompt);
    j.max_tokens = max_tokens;
    j.arrival_us = now() - 2500;  // 2.5 ms before the test clock's now, which stays put
    return j;
  }

  void run(Job j) {
    caf::anon_send(batcher, run_atom::value, std::move(j));
    sched->run();
  }
};

BatchingConfig config(int64_t step_timeout_ms = 0) {
  BatchingConfig bc;
  bc.kv_block_size = 4;
  bc.max_sequences = 4;
  bc.step_timeout_ms = step_timeout_ms;
  bc.max_job_retries = 2;
  return bc;
}

}  // namespace

BOOST_AUTO_TEST_CASE(steps_finish_a_job_by_length) {
  Rig rig(config());
  BOOST_TEST(rig.rec.credit == 4u);  // max_sequences at start
  rig.run(rig.job(1, {1, 2, 3}, 3));
  // Prefill of the prompt (sampling the first token), then one decode per further token.
  BOOST_REQUIRE_EQUAL(rig.rec.steps.size(), 3u);
  const SeqPlan& first = rig.rec.steps[0].seqs.at(0);
  BOOST_TEST(first.tokens == std::vector<int32_t>({1, 2, 3}));
  BOOST_TEST(first.n_past == 0);
  BOOST_TEST(first.reset);
  BOOST_TEST(first.block_table == std::vector<int32_t>({0}));
  const SeqPlan& third = rig.rec.steps[2].seqs.at(0);
  BOOST_TEST(third.tokens == std::vector<int32_t>({7}));
  BOOST_TEST(third.n_past == 4);
  BOOST_TEST(!third.reset);
  BOOST_TEST(third.block_table == std::vector<int32_t>({0, 1}));
  BOOST_REQUIRE_EQUAL(rig.rec.dones.size(), 1u);
  const DoneEvent& d = rig.rec.dones[0];
  BOOST_TEST(d.uid == 1u);
  BOOST_TEST(d.finish == FinishReason::length);
  BOOST_TEST(d.ids == std::vector<int32_t>({7, 7, 7}));
  BOOST_TEST(d.completion_tokens == 3u);
  // Read from the actor clock: the test clock did not move, so exactly the 2.5 ms the job
  // had waited when it arrived.
  BOOST_TEST(d.total_ms == 2.5);
  BOOST_TEST(d.queue_ms == 2.5);
  BOOST_REQUIRE_EQUAL(rig.rec.outcomes.size(), 1u);
  BOOST_TEST(rig.rec.outcomes[0].outcome == Outcome::done);
  BOOST_TEST(rig.rec.router_finished == std::vector<uint64_t>({1}));
  BOOST_TEST(rig.rec.released == std::vector<uint64_t>({1}));
  BOOST_TEST(rig.rec.credit == 5u);  // one more for the ended job
  BOOST_TEST(rig.rec.failures.empty());
}

// With the journal standing in front of egress (`world` here), what needs no journal record goes
// straight to egress (BatcherExtras::direct_egress), so that it never waits behind the journal's
// fsync: every chunk, and the done of a job that is not journaled. A journaled job's done goes
// through the journal, which holds it until its result is durable; the chunks of a job replayed
// from the journal whose connection is gone (empty identity) go nowhere, as the journal would
// have dropped them.
BOOST_AUTO_TEST_CASE(chunks_and_the_end_of_an_unjournaled_job_go_straight_to_egress) {
  Rig rig(config(), 64, /*with_direct=*/true);
  Job kept = rig.job(1, {1, 2, 3}, 2);  // journaled (the default)
  kept.stream = true;
  kept.client = ClientRef{ClientRef::http, "h1/0"};
  rig.run(kept);
  Job keyless = rig.job(2, {1, 2}, 2);
  keyless.stream = true;
  keyless.client = ClientRef{ClientRef::http, "h2/0"};
  keyless.journaled = false;
  rig.run(keyless);
  Job orphan = rig.job(3, {1, 2}, 2);
  orphan.stream = true;
  orphan.client = ClientRef{ClientRef::http, ""};
  rig.run(orphan);

  BOOST_REQUIRE_EQUAL(rig.rec.dones.size(), 2u);  // through the journal: the journaled ones
  BOOST_TEST(rig.rec.dones[0].uid == 1u);
  BOOST_TEST(rig.rec.dones[1].uid == 3u);
  BOOST_TEST(rig.rec.chunks.empty());
  BOOST_REQUIRE_EQUAL(rig.direct.dones.size(), 1u);
  BOOST_TEST(rig.direct.dones[0].uid == 2u);
  std::vector<uint64_t> chunk_uids;
  for (const auto& c : rig.direct.chunks) chunk_uids.push_back(c.uid);
  BOOST_TEST(chunk_uids == std::vector<uint64_t>({1, 1, 2, 2}));  // one per token, none for 3
}

BOOST_AUTO_TEST_CASE(two_jobs_share_steps_under_the_budget) {
  BatchingConfig bc = config();
  bc.step_token_budget = 6;
  bc.prefill_chunk = 4;
  Rig rig(bc);
  caf::anon_send(rig.batcher, run_atom::value, rig.job(1, {1, 2, 3, 4, 5}, 2));
  caf::anon_send(rig.batcher, run_atom::value, rig.job(2, {1, 2, 3}, 1));
  rig.sched->run();
  BOOST_REQUIRE_GE(rig.rec.steps.size(), 2u);
  // Job 1 arrived alone: its first chunk of 4 tokens. Then job 1's last prompt token and
  // job 2's prompt (1 + 3 <= 6).
  const StepPlan& s1 = rig.rec.steps[0];
  BOOST_REQUIRE_EQUAL(s1.seqs.size(), 1u);
  BOOST_TEST(s1.seqs[0].tokens.size() == 4u);
  BOOST_TEST(!s1.seqs[0].sample);
  const StepPlan& s2 = rig.rec.steps[1];
  BOOST_REQUIRE_EQUAL(s2.seqs.size(), 2u);
  BOOST_TEST(s2.seqs[0].uid == 1u);
  BOOST_TEST(s2.seqs[0].tokens == std::vector<int32_t>({5}));
  BOOST_TEST(s2.seqs[1].uid == 2u);
  BOOST_TEST(s2.seqs[1].tokens == std::vector<int32_t>({1, 2, 3}));
  BOOST_TEST(rig.rec.dones.size() == 2u);
}

BOOST_AUTO_TEST_CASE(a_throwing_executor_sends_the_jobs_back_to_the_router) {
  Rig rig(config());
  rig.rec.mode = ExecMode::throw_step;
  Job veteran = rig.job(2, {4, 5}, 4);
  veteran.attempt = 2;  // already through max_job_retries failures
  caf::anon_send(rig.batcher, run_atom::value, std::move(veteran));
  caf::anon_send(rig.batcher, run_atom::value, rig.job(1, {1, 2, 3}, 4));
  rig.sched->run();
  // The veteran was in the failed step: its third failure ends it with engine_dead. Job 1 was
  // waiting (a step was in flight): it goes back without an attempt counted.
  BOOST_REQUIRE_EQUAL(rig.rec.steps.size(), 1u);
  BOOST_TEST(rig.rec.steps[0].seqs.size() == 1u);
  BOOST_REQUIRE_EQUAL(rig.rec.requeued.size(), 1u);
  BOOST_TEST(rig.rec.requeued[0].uid == 1u);
  BOOST_TEST(rig.rec.requeued[0].attempt == 0u);
  BOOST_REQUIRE_EQUAL(rig.rec.errors.size(), 1u);
  BOOST_TEST(rig.rec.errors[0].uid == 2u);
  BOOST_TEST(rig.rec.errors[0].code == ErrorCode::engine_dead);
  BOOST_TEST(
      rig.rec.errors[0].message.rfind("executor failed 3 times while running the job (", 0) == 0u);
  BOOST_REQUIRE_EQUAL(rig.rec.failures.size(), 1u);
  BOOST_TEST(rig.rec.failures[0].pair == 3u);
  BOOST_TEST(rig.rec.failures[0].requeued == 1u);
  BOOST_TEST(rig.rec.failures[0].failed == 1u);
  BOOST_TEST(rig.rec.requeued[0].fault_us == rig.rec.failures[0].fault_us);
  // It asked the router to stop dispatching here, and left once the router answered.
  BOOST_TEST(rig.rec.router_retire == 1);
  BOOST_TEST(rig.rec.batcher_down);
  BOOST_TEST(rig.rec.credit == 4u);  // no credit for the failed job: the batcher is gone
}

BOOST_AUTO_TEST_CASE(a_failed_step_fails_its_jobs_and_the_batcher_goes_on) {
  Rig rig(config());
  rig.rec.mode = ExecMode::fail_step;
  rig.run(rig.job(1, {1, 2, 3}, 4));
  BOOST_REQUIRE_EQUAL(rig.rec.errors.size(), 1u);
  BOOST_TEST(rig.rec.errors[0].code == ErrorCode::engine_dead);
  BOOST_TEST(rig.rec.errors[0].message == "device lost");
  BOOST_TEST(rig.rec.requeued.empty());
  BOOST_TEST(rig.rec.failures.empty());
  BOOST_TEST(!rig.rec.batcher_down);
  BOOST_TEST(rig.rec.credit == 5u);
  rig.rec.mode = ExecMode::finish;
  rig.run(rig.job(2, {1, 2}, 1));
  BOOST_REQUIRE_EQUAL(rig.rec.dones.size(), 1u);
  BOOST_TEST(rig.rec.dones[0].uid == 2u);
}

BOOST_AUTO_TEST_CASE(the_watchdog_gives_up_on_a_hung_executor_when_time_passes) {
  Rig rig(config(/*step_timeout_ms=*/50));
  rig.rec.mode = ExecMode::hang;
  const int64_t sent = rig.now();
  rig.run(rig.job(1, {1, 2, 3}, 4));
  BOOST_REQUIRE_EQUAL(rig.rec.hung.size(), 1u);
  rig.sched->advance_time(std::chrono::milliseconds(49));
  rig.sched->run();
  BOOST_TEST(rig.rec.failures.empty());  // not yet
  BOOST_TEST(rig.rec.requeued.empty());
  rig.sched->advance_time(std::chrono::milliseconds(1));
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.rec.failures.size(), 1u);
  const PairFailure& f = rig.rec.failures[0];
  BOOST_TEST(f.why == "no step result within 50 ms (hung executor)");
  BOOST_TEST(f.fault_us == sent);                   // when the step went out
  BOOST_TEST(f.detected_us - f.fault_us == 50000);  // the actor clock, moved by the test
  BOOST_REQUIRE_EQUAL(rig.rec.requeued.size(), 1u);
  BOOST_TEST(rig.rec.requeued[0].attempt == 1u);
  BOOST_TEST(rig.rec.requeued[0].fault_us == sent);
  BOOST_TEST(rig.rec.router_retire == 1);
  BOOST_TEST(rig.rec.batcher_down);
}

BOOST_AUTO_TEST_CASE(a_slow_step_within_the_timeout_is_not_a_failure) {
  Rig rig(config(/*step_timeout_ms=*/50));
  rig.rec.mode = ExecMode::hang;
  rig.run(rig.job(1, {1, 2, 3}, 1));
  rig.sched->advance_time(std::chrono::milliseconds(30));
  rig.sched->run();
  // The answer comes late but in time.
  BOOST_REQUIRE_EQUAL(rig.rec.hung.size(), 1u);
  rig.rec.token = 9;
  caf::anon_send(rig.exec, answer_atom::value);
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.rec.dones.size(), 1u);
  BOOST_TEST(rig.rec.dones[0].ids == std::vector<int32_t>({9}));
  rig.sched->advance_time(std::chrono::milliseconds(100));  // the armed timer fires: no step out
  rig.sched->run();
  BOOST_TEST(rig.rec.failures.empty());
  BOOST_TEST(!rig.rec.batcher_down);
}

BOOST_AUTO_TEST_CASE(scale_down_finishes_the_jobs_then_exits) {
  Rig rig(config());
  rig.rec.mode = ExecMode::hang;
  rig.run(rig.job(1, {1, 2}, 1));
  caf::anon_send(rig.batcher, retire_atom::value);
  rig.sched->run();
  BOOST_TEST(rig.rec.router_retire == 1);
  BOOST_TEST(!rig.rec.batcher_down);  // a job is still here
  caf::anon_send(rig.exec, answer_atom::value);
  rig.sched->run();
  BOOST_TEST(rig.rec.dones.size() == 1u);
  BOOST_TEST(rig.rec.credit == 4u);  // no credit while scaling down
  BOOST_TEST(rig.rec.batcher_down);
}

BOOST_AUTO_TEST_SUITE_END()  // test_actors_batcher_shell
