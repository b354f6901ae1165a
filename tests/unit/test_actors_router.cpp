// Router actor tests on CAF's deterministic test_coordinator: strict priority, weighted fairness,
// deadline expiry, full queues, cancellation and pipeline backpressure, as message traces.
#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "actors/messages.hpp"
#include "actors/router.hpp"
#include "core/error_code.hpp"
#include "tests/support/enum_print.hpp"
#include "tests/support/stand_in.hpp"
#include "tests/support/stats_probe.hpp"
#include "tests/support/test_system.hpp"

BOOST_AUTO_TEST_SUITE(test_actors_router)

using namespace sy;

namespace {

/// Everything the actors around the router observed, in order.
struct Trace {
  std::vector<Job> runs;
  std::vector<uint64_t> batcher_cancels;
  std::vector<AcceptedEvent> accepted;
  std::vector<ErrorEvent> errors;
  std::vector<DoneEvent> dones;
  std::vector<JobOutcome> outcomes;
  uint64_t pull_credit = 0;  // granted to the gateway so far
  std::vector<EnqueueReply> replies;
};
using TraceP = std::shared_ptr<Trace>;

caf::behavior egress_sink(caf::event_based_actor*, TraceP t) {
  return {
      [t](out_atom, const AcceptedEvent& e) { t->accepted.push_back(e); },
      [t](out_atom, const ErrorEvent& e) { t->errors.push_back(e); },
      [t](out_atom, const DoneEvent& e) { t->dones.push_back(e); },
      [](out_atom, const TokensEvent&) {},
      [](out_atom, const StatusEvent&) {},
      [t](pull_atom, uint32_t n) { t->pull_credit += n; },
  };
}

caf::behavior admission_sink(caf::event_based_actor*, TraceP t) {
  return {
      [t](finished_atom, const JobOutcome& o) { t->outcomes.push_back(o); },
  };
}

/// A batcher double: (credit_atom, n) from the test makes it grant n credits; it records every
/// job it is given and, with `regrant`, gives one credit back per job (finishing jobs one by one).
caf::behavior fake_batcher(caf::event_based_actor* self, TraceP t, bool regrant) {
  return {
      [=](credit_atom, const RouterActor& router, uint32_t n) {
        self->send(router, credit_atom::value, caf::actor_cast<BatcherActor>(self), n);
      },
      [=](run_atom, const Job& j) {
        t->runs.push_back(j);
        if (regrant)
          self->send(caf::actor_cast<RouterActor>(self->current_sender()), credit_atom::value,
                     caf::actor_cast<BatcherActor>(self), uint32_t{1});
      },
      [=](cancel_atom, uint64_t uid) { t->batcher_cancels.push_back(uid); },
      // A status request: every job here has generated 7 tokens.
      [=](status_atom, uint64_t) { return uint32_t{7}; },
  };
}

/// Sends requests for the test and records the answers.
caf::behavior prober(caf::event_based_actor* self, TraceP t) {
  return {
      [=](enqueue_atom, const RouterActor& router, Job& j) {
        self->request(router, caf::infinite, enqueue_atom::value, std::move(j))
            .then([t](const EnqueueReply& r) { t->replies.push_back(r); });
      },
  };
}

RouterConfig two_classes(std::size_t interactive_limit = 1000, std::size_t batch_limit = 1000) {
  RouterConfig rc;
  rc.classes = {{"interactive", 0, 1.0, interactive_limit, 0}, {"batch", 1, 1.0, batch_limit, 0}};
  rc.default_class = "interactive";
  // Every credit for whichever job comes first: the priority reserve has a test of its own.
  rc.priority_reserve = 0;
  return rc;
}

/// A router with test doubles around it, on a deterministic scheduler.
struct Rig : test::TestSystem {
  TraceP t = std::make_shared<Trace>();
  caf::actor egress, admission, batcher, probe;
  caf::actor direct;  // with_direct: the egress actor behind the journal (`egress` here)
  std::shared_ptr<std::vector<std::string>> direct_log =
      std::make_shared<std::vector<std::string>>();
  RouterActor router;
  uint64_t next_uid = 1;

  explicit Rig(RouterConfig rc, std::vector<TenantConfig> tenants = {}, RouterOptions opts = {},
               bool regrant = false, bool with_direct = false) {
    egress = sys->spawn(egress_sink, t);
    admission = sys->spawn(admission_sink, t);
    if (with_direct) {
      direct = sys->spawn([log = direct_log](caf::event_based_actor*) -> caf::behavior {
        return {
            [log](out_atom, const AcceptedEvent& e) { log->push_back("accepted " + e.id); },
            [log](out_atom, const StatusEvent& e) { log->push_back("status " + e.id); },
        };
      });
      opts.direct_egress = test::stand_in<EgressActor>(direct);
    }
    router = spawn_router(*sys, std::move(rc), test::stand_in<EgressActor>(egress),
                          test::stand_in<AdmissionActor>(admission), std::move(tenants), opts);
    batcher = sys->spawn(fake_batcher, t, regrant);
    probe = sys->spawn(prober, t);
    sched->run();
  }
  ~Rig() {
    test::stop_all(egress, admission, router, batcher, probe);
    if (direct) test::stop_all(direct);
    sched->run();
  }

  int64_t now_us() const {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               sched->clock().now().time_since_epoch())
        .count();
  }
  Job job(const std::string& tenant, uint32_t cls, uint32_t prompt_len = 4, uint32_t max_tokens = 4,
          ClientRef::Kind kind = ClientRef::router) {
    Job j;
    j.uid = next_uid++;
    j.id = "j" + std::to_string(j.uid);
    j.tenant = tenant;
    j.client.kind = kind;
    j.client.identity = kind == ClientRef::router ? "client-" + tenant : "";
    j.class_index = cls;
    j.prompt.assign(prompt_len, 7);
    j.max_tokens = max_tokens;
    j.arrival_us = now_us();
    return j;
  }
  /// Enqueues without looking at the answer (like admission does, answer aside).
  void push(Job j) { caf::anon_send(router, enqueue_atom::value, std::move(j)); }
  /// Enqueues and records the answer in t->replies.
  void push_probed(Job j) { caf::anon_send(probe, enqueue_atom::value, router, std::move(j)); }
  void credit(uint32_t n) { caf::anon_send(batcher, credit_atom::value, router, n); }
  RouterStats stats() { return test::probe_stats<RouterStats>(*this, router); }
};

uint64_t lcg(uint64_t& s) {
  s = s * 6364136223846793005ULL + 1442695040888963407ULL;
  return s >> 33;
}

}  // namespace

BOOST_AUTO_TEST_CASE(interactive_always_before_waiting_batch) {
  Rig rig(two_classes());
  uint64_t seed = 12345;
  std::size_t waiting_interactive = 0, waiting_total = 0, seen = 0;
  const char* tenants[] = {"a", "b", "c"};
  std::size_t batch_dispatched_total = 0;
  for (int round = 0; round < 200; ++round) {
    auto n = lcg(seed) % 6;
    for (uint64_t k = 0; k < n; ++k) {
      uint32_t cls = lcg(seed) % 3 == 0 ? 0 : 1;  // batch work dominates, as it would
      rig.push(rig.job(tenants[lcg(seed) % 3], cls));
      waiting_interactive += cls == 0;
      ++waiting_total;
    }
    // Never more credit than waiting jobs: every dispatch of this round then happens after all
    // of its enqueues, so each dispatched batch job had every waiting interactive job beside it.
    auto c = static_cast<uint32_t>(waiting_total == 0 ? 0 : lcg(seed) % (waiting_total + 1));
    if (c > 0) rig.credit(c);
    rig.sched->run();
    BOOST_REQUIRE_EQUAL(rig.t->runs.size(), seen + c);
    bool batch_seen = false;
    for (std::size_t i = seen; i < rig.t->runs.size(); ++i) {
      bool interactive = rig.t->runs[i].class_index == 0;
      BOOST_CHECK_MESSAGE(
          !(interactive && batch_seen),
          "round " << round << ": a batch job was dispatched before an interactive one");
      batch_seen |= !interactive;
      batch_dispatched_total += !interactive;
      waiting_interactive -= interactive;
      --waiting_total;
    }
    if (batch_seen) BOOST_CHECK_EQUAL(waiting_interactive, 0u);
    BOOST_CHECK_EQUAL(rig.stats().queued_by_class.at("interactive"),
                      static_cast<int64_t>(waiting_interactive));
    seen = rig.t->runs.size();
  }
  BOOST_CHECK_GT(batch_dispatched_total, 50u);  // the test exercised both classes
}

BOOST_AUTO_TEST_CASE(strict_priority_with_a_continuous_batcher) {
  // Interactive jobs arrive while batch jobs wait: each new interactive job is the next dispatch.
  Rig rig(two_classes(), {}, {}, /*regrant=*/false);
  for (int i = 0; i < 20; ++i) rig.push(rig.job("b", 1));
  rig.sched->run();
  for (int i = 0; i < 5; ++i) {
    rig.push(rig.job("a", 0));
    rig.push(rig.job("a", 0));
    rig.credit(3);
    rig.sched->run();
    auto n = rig.t->runs.size();
    BOOST_REQUIRE_EQUAL(n, static_cast<std::size_t>(3 * (i + 1)));
    BOOST_CHECK_EQUAL(rig.t->runs[n - 3].class_index, 0u);
    BOOST_CHECK_EQUAL(rig.t->runs[n - 2].class_index, 0u);
    BOOST_CHECK_EQUAL(rig.t->runs[n - 1].class_index, 1u);
  }
}

namespace {
/// Served tokens (prompt + max_tokens) per tenant among the first `n` dispatched jobs.
std::map<std::string, double> served_tokens(const Trace& t, std::size_t n) {
  std::map<std::string, double> m;
  for (std::size_t i = 0; i < n && i < t.runs.size(); ++i)
    m[t.runs[i].tenant] += static_cast<double>(t.runs[i].prompt.size() + t.runs[i].max_tokens);
  return m;
}
}  // namespace

BOOST_AUTO_TEST_CASE(weights_3_to_1_share_tokens_3_to_1) {
  std::vector<TenantConfig> tenants(2);
  tenants[0].name = "heavy";
  tenants[0].weight = 3;
  tenants[1].name = "light";
  tenants[1].weight = 1;
  // A batcher that takes 4 jobs at a time and asks for one more as each finishes: closed loop.
  Rig rig(two_classes(), tenants, {}, /*regrant=*/true);
  uint64_t seed = 99;
  // Both tenants saturate the batch class with jobs of varied size (fairness counts tokens).
  for (int i = 0; i < 400; ++i) {
    rig.push(rig.job("heavy", 1, 1 + lcg(seed) % 40, 1 + lcg(seed) % 60));
    rig.push(rig.job("light", 1, 1 + lcg(seed) % 40, 1 + lcg(seed) % 60));
  }
  rig.credit(4);
  rig.sched->run();
  // Measure while both stay backlogged: after 300 dispatches each tenant still has jobs waiting.
  BOOST_REQUIRE_GE(rig.t->runs.size(), 300u);
  auto m = served_tokens(*rig.t, 300);
  double ratio = m["heavy"] / m["light"];
  BOOST_TEST_MESSAGE("served token ratio heavy:light = " << ratio);
  BOOST_CHECK_GE(ratio, 3.0 * 0.9);
  BOOST_CHECK_LE(ratio, 3.0 * 1.1);
}

BOOST_AUTO_TEST_CASE(weights_count_tokens_not_jobs) {
  // Equal weights, one tenant's jobs four times bigger: equal tokens, so 4x the jobs for the other.
  Rig rig(two_classes(), {}, {});
  for (int i = 0; i < 200; ++i) {
    rig.push(rig.job("big", 1, 40, 40));
    rig.push(rig.job("small", 1, 10, 10));
  }
  rig.credit(100);
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 100u);
  auto m = served_tokens(*rig.t, 100);
  double ratio = m["big"] / m["small"];
  BOOST_CHECK_GE(ratio, 0.9);
  BOOST_CHECK_LE(ratio, 1.1);
}

BOOST_AUTO_TEST_CASE(deadline_passes_in_queue_never_dispatched) {
  Rig rig(two_classes());
  auto j = rig.job("a", 1);
  j.deadline_us = rig.now_us() + 50'000;
  auto uid = j.uid;
  rig.push(j);
  auto other = rig.job("a", 1);  // no deadline: must survive
  rig.push(other);
  rig.sched->run();
  rig.sched->advance_time(std::chrono::milliseconds(49));
  rig.sched->run();
  BOOST_CHECK(rig.t->errors.empty());
  rig.sched->advance_time(std::chrono::milliseconds(1));
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->errors.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->errors[0].uid, uid);
  BOOST_CHECK_EQUAL(rig.t->errors[0].code, ErrorCode::deadline_exceeded);
  BOOST_CHECK_EQUAL(rig.t->errors[0].to.identity, "client-a");
  BOOST_REQUIRE_EQUAL(rig.t->outcomes.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->outcomes[0].uid, uid);
  BOOST_CHECK_EQUAL(rig.t->outcomes[0].outcome, Outcome::error);
  BOOST_CHECK_EQUAL(rig.t->outcomes[0].code, ErrorCode::deadline_exceeded);
  rig.credit(5);
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->runs[0].uid, other.uid);
  BOOST_CHECK_EQUAL(rig.stats().expired, 1);
}

BOOST_AUTO_TEST_CASE(deadline_checked_at_dispatch_without_timer) {
  // Credit arriving after the deadline (before any timer fired) must not run the job.
  Rig rig(two_classes());
  auto j = rig.job("a", 0);
  j.deadline_us = rig.now_us() + 10'000;
  rig.push(j);
  rig.sched->run();
  rig.sched->clock().current_time += std::chrono::milliseconds(20);  // time passes, no timer run
  rig.credit(1);
  rig.sched->run();
  BOOST_CHECK(rig.t->runs.empty());
  BOOST_REQUIRE_EQUAL(rig.t->errors.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->errors[0].code, ErrorCode::deadline_exceeded);
}

BOOST_AUTO_TEST_CASE(class_queue_timeout_expires) {
  RouterConfig rc = two_classes();
  rc.classes[1].queue_timeout_ms = 100;
  Rig rig(rc);
  rig.push(rig.job("a", 1));
  rig.sched->run();
  rig.sched->advance_time(std::chrono::milliseconds(100));
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->errors.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->errors[0].code, ErrorCode::deadline_exceeded);
  BOOST_CHECK_NE(rig.t->errors[0].message.find("queue timeout"), std::string::npos);
}

BOOST_AUTO_TEST_CASE(full_queue_answers_overloaded_with_retry_after) {
  Rig rig(two_classes(1000, 2));
  for (int i = 0; i < 3; ++i) rig.push_probed(rig.job("a", 1));
  rig.push_probed(rig.job("a", 0));  // another class still has room
  rig.push_probed(rig.job("a", 7));  // no such class
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->replies.size(), 5u);
  BOOST_CHECK_EQUAL(rig.t->replies[0].result, EnqueueResult::accepted);
  BOOST_CHECK_EQUAL(rig.t->replies[1].result, EnqueueResult::accepted);
  BOOST_CHECK_EQUAL(rig.t->replies[1].position, 1u);  // one job ahead
  BOOST_CHECK_EQUAL(rig.t->replies[2].result, EnqueueResult::full);
  BOOST_CHECK_GE(rig.t->replies[2].retry_after_ms, 20);      // RetryConfig floor
  BOOST_CHECK_LE(rig.t->replies[2].retry_after_ms, 30'000);  // and ceiling
  BOOST_CHECK_EQUAL(rig.t->replies[3].result, EnqueueResult::accepted);
  BOOST_CHECK_EQUAL(rig.t->replies[4].result, EnqueueResult::unknown_class);
  BOOST_CHECK_EQUAL(rig.t->accepted.size(), 3u);  // accepted jobs only
  BOOST_CHECK_EQUAL(rig.stats().rejected_full, 1);
  // Room again after a dispatch.
  rig.credit(2);
  rig.sched->run();
  rig.push_probed(rig.job("a", 1));
  rig.sched->run();
  BOOST_CHECK_EQUAL(rig.t->replies.back().result, EnqueueResult::accepted);
}

BOOST_AUTO_TEST_CASE(cancel_of_queued_job_never_runs) {
  Rig rig(two_classes());
  rig.credit(0);  // makes the batcher known to the router without credit
  auto a = rig.job("a", 1);
  auto b = rig.job("a", 1);
  rig.push(a);
  rig.push(b);
  rig.sched->run();
  caf::anon_send(rig.router, cancel_atom::value, a.uid);
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->dones.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->dones[0].uid, a.uid);
  BOOST_CHECK_EQUAL(rig.t->dones[0].finish, FinishReason::cancelled);  // cancelled
  BOOST_CHECK_EQUAL(rig.t->dones[0].prompt_tokens, 4u);
  BOOST_REQUIRE_EQUAL(rig.t->outcomes.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->outcomes[0].outcome, Outcome::cancelled);
  BOOST_CHECK(rig.t->batcher_cancels.empty());
  rig.credit(5);
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->runs[0].uid, b.uid);
  // A running job's cancel goes to the batchers.
  caf::anon_send(rig.router, cancel_atom::value, b.uid);
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->batcher_cancels.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->batcher_cancels[0], b.uid);
  BOOST_CHECK_EQUAL(rig.t->dones.size(), 1u);
}

BOOST_AUTO_TEST_CASE(priority_reserve_keeps_a_credit_for_interactive_jobs) {
  RouterConfig rc = two_classes();
  rc.priority_reserve = 1;
  Rig rig(rc);
  // Batch jobs alone: no interactive job seen, every credit is used.
  for (int i = 0; i < 8; ++i) rig.push(rig.job("b", 1));
  rig.credit(2);
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 2u);
  // An interactive job arrives with no credit free; the next credits go to it first and then to
  // batch jobs, all but one.
  rig.push(rig.job("a", 0));
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 2u);
  rig.credit(3);
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 4u);
  BOOST_CHECK_EQUAL(rig.t->runs[2].class_index, 0u);
  BOOST_CHECK_EQUAL(rig.t->runs[3].class_index, 1u);
  BOOST_CHECK_EQUAL(rig.stats().credit, 1);
  // The next interactive job finds the kept credit: dispatched at once.
  rig.push(rig.job("a", 0));
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 5u);
  BOOST_CHECK_EQUAL(rig.t->runs[4].class_index, 0u);
  rig.credit(2);
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 6u);
  BOOST_CHECK_EQUAL(rig.stats().credit, 1);
  // No interactive job for kPriorityReserveMs: the reserve lapses at the next dispatch.
  rig.sched->advance_time(std::chrono::milliseconds(kPriorityReserveMs));
  rig.credit(1);
  rig.sched->run();
  BOOST_CHECK_EQUAL(rig.t->runs.size(), 8u);
  BOOST_CHECK_EQUAL(rig.stats().credit, 0);
}

BOOST_AUTO_TEST_CASE(dispatch_only_against_credit) {
  Rig rig(two_classes());
  for (int i = 0; i < 10; ++i) rig.push(rig.job("a", 1));
  rig.sched->run();
  BOOST_CHECK(rig.t->runs.empty());
  rig.credit(3);
  rig.sched->run();
  BOOST_CHECK_EQUAL(rig.t->runs.size(), 3u);
  BOOST_CHECK_EQUAL(rig.stats().queued, 7);
  BOOST_CHECK_EQUAL(rig.stats().credit, 0);
  // FIFO within one tenant.
  for (std::size_t i = 0; i < 3; ++i) BOOST_CHECK_EQUAL(rig.t->runs[i].uid, i + 1);
}

BOOST_AUTO_TEST_CASE(pipeline_jobs_wait_instead_of_overloaded) {
  RouterOptions opts;
  opts.pull_window = 8;
  Rig rig(two_classes(1000, 4), {}, opts);
  BOOST_CHECK_EQUAL(rig.t->pull_credit, 8u);  // the initial window
  // A gateway that reads PULL only against credit.
  uint64_t used = 0, sent = 0;
  for (int guard = 0; guard < 100 && used < rig.t->pull_credit; ++guard) {
    while (used < rig.t->pull_credit) {
      rig.push_probed(rig.job("p", 1, 4, 4, ClientRef::pipeline));
      ++used;
      ++sent;
    }
    rig.sched->run();
  }
  // The class queue (4) plus the window (8) and then the gateway is paused.
  BOOST_CHECK_EQUAL(sent, 12u);
  BOOST_CHECK_EQUAL(rig.stats().overflow, 8);
  for (auto& r : rig.t->replies) BOOST_CHECK_EQUAL(r.result, EnqueueResult::accepted);
  BOOST_CHECK(rig.t->accepted.empty());  // pipeline clients get no "accepted"
  // Draining the queue lets the gateway read again; everything runs, nothing refused.
  rig.credit(1000);
  for (int guard = 0; guard < 1000 && sent < 200; ++guard) {
    while (used < rig.t->pull_credit && sent < 200) {
      rig.push_probed(rig.job("p", 1, 4, 4, ClientRef::pipeline));
      ++used;
      ++sent;
    }
    rig.sched->run();
  }
  BOOST_CHECK_EQUAL(sent, 200u);
  BOOST_CHECK_EQUAL(rig.t->runs.size(), 200u);
  BOOST_CHECK_EQUAL(rig.t->replies.size(), 200u);
  for (auto& r : rig.t->replies) BOOST_CHECK_EQUAL(r.result, EnqueueResult::accepted);
  BOOST_CHECK(rig.t->errors.empty());
}

BOOST_AUTO_TEST_CASE(status_reports_queued_or_running) {
  Rig rig(two_classes());
  auto a = rig.job("a", 1);
  auto b = rig.job("a", 1);
  rig.push(a);
  rig.push(b);
  rig.credit(1);
  rig.sched->run();
  std::vector<std::tuple<JobState, uint32_t, uint32_t>> got;
  auto asker = rig.sys->spawn([&](caf::event_based_actor* self) -> caf::behavior {
    return {[&, self](status_atom, uint64_t uid) {
      self->request(rig.router, caf::infinite, status_atom::value, uid)
          .then([&](const JobStatus& s) {
            got.emplace_back(s.state, s.position, s.completion_tokens);
          });
    }};
  });
  caf::anon_send(asker, status_atom::value, a.uid);
  rig.sched->run();
  caf::anon_send(asker, status_atom::value, b.uid);
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(got.size(), 2u);
  BOOST_CHECK_EQUAL(std::get<0>(got[0]), JobState::running);  // a is running
  BOOST_CHECK_EQUAL(std::get<2>(got[0]), 7u);                 // with the count its batcher reports
  BOOST_CHECK_EQUAL(std::get<0>(got[1]), JobState::queued);   // b still queued
  BOOST_CHECK_EQUAL(std::get<1>(got[1]), 0u);                 // with nothing ahead of it
  caf::anon_send_exit(asker, caf::exit_reason::user_shutdown);
  rig.sched->run();
}

// queue_position counts the jobs that will run first, in the fair queue's order: not the depth.
// Where the journal stands in front of egress, `accepted` goes straight to the egress actor
// (RouterOptions::direct_egress), the way the batchers send the job's chunks, so that it reaches
// egress ahead of them; for the most important class as an urgent message, as its chunks are, so
// that a normal message already waiting in egress's mailbox holds it back no more than it holds
// back the chunks. A job that expires in the queue still ends through the journal.
BOOST_AUTO_TEST_CASE(accepted_goes_straight_to_egress_at_the_priority_of_the_chunks) {
  RouterConfig rc = two_classes();
  rc.classes[1].queue_timeout_ms = 50;
  Rig rig(rc, {}, {}, false, /*with_direct=*/true);
  auto enqueue_behind_a_normal_message = [&](Job j) {
    StatusEvent waiting;
    waiting.id = "waiting";
    caf::anon_send(rig.direct, out_atom::value, std::move(waiting));
    rig.push(std::move(j));
    // The router handles the job while the normal message still waits in the sink's mailbox.
    BOOST_REQUIRE(rig.sched->prioritize(rig.router));
    rig.sched->run_once();
    rig.sched->run();
  };
  Job interactive = rig.job("x", 0), batch = rig.job("x", 1);
  enqueue_behind_a_normal_message(interactive);
  enqueue_behind_a_normal_message(batch);
  // A job replayed from the journal whose connection is gone gets no `accepted` (egress would
  // try the empty address, and a failed delivery cancels the job).
  Job orphan = rig.job("x", 0);
  orphan.client.identity.clear();
  rig.push(orphan);
  rig.sched->run();
  BOOST_TEST(*rig.direct_log ==
             std::vector<std::string>({"accepted " + interactive.id, "status waiting",
                                       "status waiting", "accepted " + batch.id}));
  BOOST_TEST(rig.t->accepted.empty());  // nothing went the journal's way
  // No credit: the batch job expires in its queue; its error goes through the journal.
  rig.sched->clock().current_time += std::chrono::milliseconds(60);
  rig.sched->trigger_timeouts();
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->errors.size(), 1u);
  BOOST_TEST(rig.t->errors[0].id == batch.id);
}

BOOST_AUTO_TEST_CASE(queue_position_counts_the_jobs_ahead) {
  Rig rig(two_classes());
  // No credit: everything waits. x1 x2 x3 of tenant x, then y1 of tenant y, all interactive,
  // then one batch job b1 (a less important rank).
  std::vector<Job> jobs = {rig.job("x", 0), rig.job("x", 0), rig.job("x", 0), rig.job("y", 0),
                           rig.job("x", 1)};
  for (const Job& j : jobs) rig.push(j);
  rig.sched->run();
  std::map<uint64_t, uint32_t> position;
  auto asker = rig.sys->spawn([&](caf::event_based_actor* self) -> caf::behavior {
    return {[&, self](status_atom, uint64_t uid) {
      self->request(rig.router, caf::infinite, status_atom::value, uid)
          .then([&, uid](const JobStatus& s) { position[uid] = s.position; });
    }};
  });
  for (const Job& j : jobs) caf::anon_send(asker, status_atom::value, j.uid);
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(position.size(), jobs.size());
  // Equal costs and weights: x1, then y1 (its tenant had no service yet), then x2, x3; b1 last.
  BOOST_CHECK_EQUAL(position[jobs[0].uid], 0u);
  BOOST_CHECK_EQUAL(position[jobs[3].uid], 1u);
  BOOST_CHECK_EQUAL(position[jobs[1].uid], 2u);
  BOOST_CHECK_EQUAL(position[jobs[2].uid], 3u);
  BOOST_CHECK_EQUAL(position[jobs[4].uid], 4u);
  // accepted said the same at the time (y1 had x1 ahead of it then, x2 and x3 too).
  BOOST_REQUIRE_EQUAL(rig.t->accepted.size(), jobs.size());
  BOOST_CHECK_EQUAL(rig.t->accepted[0].queue_position, 0u);
  BOOST_CHECK_EQUAL(rig.t->accepted[1].queue_position, 1u);
  BOOST_CHECK_EQUAL(rig.t->accepted[3].queue_position, 1u);
  BOOST_CHECK_EQUAL(rig.t->accepted[3].tenant, "y");
  BOOST_CHECK_EQUAL(rig.t->accepted[4].queue_position, 4u);
  // And the order is what dispatch then does.
  rig.credit(5);
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), jobs.size());
  for (const auto& [uid, p] : position) BOOST_CHECK_EQUAL(rig.t->runs[p].uid, uid);
  caf::anon_send_exit(asker, caf::exit_reason::user_shutdown);
  rig.sched->run();
}

BOOST_AUTO_TEST_CASE(batcher_going_down_loses_its_credit) {
  Rig rig(two_classes());
  rig.credit(5);
  rig.sched->run();
  BOOST_CHECK_EQUAL(rig.stats().credit, 5);
  caf::anon_send_exit(rig.batcher, caf::exit_reason::user_shutdown);
  rig.sched->run();
  BOOST_CHECK_EQUAL(rig.stats().credit, 0);
  BOOST_CHECK_EQUAL(rig.stats().batchers, 0);
  rig.push(rig.job("a", 0));
  rig.sched->run();
  BOOST_CHECK(rig.t->runs.empty());
  BOOST_CHECK_EQUAL(rig.stats().queued, 1);
}

// A batcher that itself goes down (not its executor) takes its records with it: the router runs
// again what it had dispatched there and not heard of as ended — except a streamed job, whose
// text cannot be resumed, and a job past its retries; those end with engine_dead.
BOOST_AUTO_TEST_CASE(batcher_going_down_reruns_the_jobs_it_had_not_ended) {
  RouterConfig rc = two_classes();
  rc.max_job_retries = 2;
  Rig rig(rc);
  rig.credit(4);
  Job plain = rig.job("a", 1, 4, 4, ClientRef::pipeline);
  Job ended = rig.job("a", 1, 4, 4, ClientRef::pipeline);
  Job streamed = rig.job("a", 0);
  streamed.stream = true;
  Job worn = rig.job("a", 1, 4, 4, ClientRef::pipeline);
  worn.attempt = 2;  // two failures already: one more is past max_job_retries
  for (const Job* j : {&plain, &ended, &streamed, &worn}) rig.push(*j);
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 4u);
  BOOST_CHECK_EQUAL(rig.stats().running_tracked, 4);
  caf::anon_send(rig.router, finished_atom::value, std::vector<uint64_t>{ended.uid});
  rig.sched->run();
  BOOST_CHECK_EQUAL(rig.stats().running_tracked, 3);

  caf::anon_send_exit(rig.batcher, caf::exit_reason::kill);
  rig.sched->run();
  BOOST_CHECK_EQUAL(rig.stats().lost_requeued, 1);
  BOOST_CHECK_EQUAL(rig.stats().lost_failed, 2);
  BOOST_CHECK_EQUAL(rig.stats().retry_queued, 1);
  std::set<uint64_t> dead;
  for (const auto& e : rig.t->errors) {
    BOOST_CHECK_EQUAL(e.code, ErrorCode::engine_dead);
    dead.insert(e.uid);
  }
  BOOST_CHECK((dead == std::set<uint64_t>{streamed.uid, worn.uid}));
  BOOST_CHECK_EQUAL(rig.t->outcomes.size(), 2u);

  // A replacement batcher gets the re-queued job, one attempt further on.
  auto other = rig.sys->spawn(fake_batcher, rig.t, false);
  caf::anon_send(other, credit_atom::value, rig.router, uint32_t{3});
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 5u);
  BOOST_CHECK_EQUAL(rig.t->runs.back().uid, plain.uid);
  BOOST_CHECK_EQUAL(rig.t->runs.back().attempt, 1u);
  BOOST_CHECK_EQUAL(rig.stats().running_tracked, 1);
  caf::anon_send_exit(other, caf::exit_reason::user_shutdown);
  rig.sched->run();
}

// A retiring batcher is still watched until it has ended its jobs.
BOOST_AUTO_TEST_CASE(retiring_batcher_that_goes_down_loses_nothing) {
  Rig rig(two_classes());
  rig.credit(2);
  rig.push(rig.job("a", 1, 4, 4, ClientRef::pipeline));
  rig.push(rig.job("a", 1, 4, 4, ClientRef::pipeline));
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 2u);
  caf::anon_send(rig.router, retire_atom::value, test::stand_in<BatcherActor>(rig.batcher));
  caf::anon_send(rig.router, finished_atom::value, std::vector<uint64_t>{rig.t->runs[0].uid});
  rig.sched->run();
  BOOST_CHECK_EQUAL(rig.stats().batchers, 0);
  BOOST_CHECK_EQUAL(rig.stats().running_tracked, 1);
  caf::anon_send_exit(rig.batcher, caf::exit_reason::kill);
  rig.sched->run();
  BOOST_CHECK_EQUAL(rig.stats().lost_requeued, 1);
  BOOST_CHECK_EQUAL(rig.stats().retry_queued, 1);
  BOOST_CHECK_EQUAL(rig.stats().running_tracked, 0);
}

BOOST_AUTO_TEST_CASE(held_pipeline_job_expires_and_cancels_too) {
  Rig rig(two_classes(1000, 1));
  rig.push(rig.job("p", 1, 4, 4, ClientRef::pipeline));  // fills the class queue
  auto late = rig.job("p", 1, 4, 4, ClientRef::pipeline);
  late.deadline_us = rig.now_us() + 30'000;
  auto gone = rig.job("p", 1, 4, 4, ClientRef::pipeline);
  rig.push(late);
  rig.push(gone);
  rig.sched->run();
  BOOST_CHECK_EQUAL(rig.stats().overflow, 2);
  caf::anon_send(rig.router, cancel_atom::value, gone.uid);
  rig.sched->advance_time(std::chrono::milliseconds(30));
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->errors.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->errors[0].uid, late.uid);
  BOOST_CHECK_EQUAL(rig.t->errors[0].code, ErrorCode::deadline_exceeded);
  BOOST_REQUIRE_EQUAL(rig.t->dones.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->dones[0].uid, gone.uid);
  BOOST_CHECK_EQUAL(rig.stats().overflow, 0);
  rig.credit(5);
  rig.sched->run();
  BOOST_CHECK_EQUAL(rig.t->runs.size(), 1u);
}

BOOST_AUTO_TEST_SUITE_END()  // test_actors_router
