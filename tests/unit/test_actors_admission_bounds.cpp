// Memory bounds of the admission and metrics actors: idle unknown tenants are forgotten (by age
// and beyond a count), configured ones never; the result cache is bounded by bytes as well as by
// count, oldest first; the metrics actor folds tenant labels beyond its cap into "_other".
#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "actors/admission.hpp"
#include "actors/messages.hpp"
#include "actors/metrics.hpp"
#include "actors/router.hpp"
#include "core/error_code.hpp"
#include "tests/support/stats_probe.hpp"
#include "tests/support/enum_print.hpp"
#include "tests/support/stand_in.hpp"
#include "tests/support/test_system.hpp"

BOOST_AUTO_TEST_SUITE(test_actors_admission_bounds)

using namespace sy;
using namespace std::chrono_literals;

namespace {

/// What the egress and the batcher saw.
struct Trace {
  std::vector<Job> runs;
  std::vector<AcceptedEvent> accepted;
  std::vector<ErrorEvent> errors;
  std::vector<DoneEvent> dones;
  std::string metrics;
};
using TraceP = std::shared_ptr<Trace>;

caf::behavior egress_sink(caf::event_based_actor*, TraceP t) {
  return {
      [t](out_atom, const AcceptedEvent& e) { t->accepted.push_back(e); },
      [t](out_atom, const ErrorEvent& e) { t->errors.push_back(e); },
      [t](out_atom, const DoneEvent& e) { t->dones.push_back(e); },
      [](out_atom, const StatusEvent&) {},
      [](out_atom, const TokensEvent&) {},
      [](pull_atom, uint32_t) {},
  };
}

/// A batcher double: grants credit when asked and records the jobs it is given.
caf::behavior fake_batcher(caf::event_based_actor* self, TraceP t) {
  return {
      [=](credit_atom, const RouterActor& router, uint32_t n) {
        self->send(router, credit_atom::value, caf::actor_cast<BatcherActor>(self), n);
      },
      [=](run_atom, const Job& j) { t->runs.push_back(j); },
      [](cancel_atom, uint64_t) {},
  };
}

caf::behavior prober(caf::event_based_actor* self, TraceP t) {
  return {
      [=](metrics_atom, const MetricsActor& target) {
        self->request(target, caf::infinite, metrics_atom::value).then([t](std::string& s) {
          t->metrics = std::move(s);
        });
      },
  };
}

/// Admission and the real router between test doubles, on the deterministic scheduler.
struct Rig : test::TestSystem {
  TraceP t = std::make_shared<Trace>();
  caf::actor egress, batcher, probe;
  RouterActor router;
  AdmissionActor admission;

  explicit Rig(AdmissionConfig ac) {
    RouterConfig rc;
    rc.classes = {{"interactive", 0, 1.0, 1000, 0}};
    egress = sys->spawn(egress_sink, t);
    router = spawn_router(*sys, rc, test::stand_in<EgressActor>(egress));
    admission = spawn_admission(*sys, std::move(ac), rc.classes, "", nullptr, router,
                                test::stand_in<EgressActor>(egress));
    batcher = sys->spawn(fake_batcher, t);
    probe = sys->spawn(prober, t);
    sched->run();
    caf::anon_send(batcher, credit_atom::value, router, uint32_t{1000});
    sched->run();
  }
  ~Rig() {
    test::stop_all(egress, router, admission, batcher, probe);
    sched->run();
  }

  void submit(const std::string& tenant, const std::string& id) {
    SubmitRequest r;
    r.client.identity = "c1";
    r.tenant = tenant;
    r.id = id;
    r.prompt_text = "hello";
    r.max_tokens = 8;
    caf::anon_send(admission, submit_atom::value, std::move(r));
    sched->run();
  }
  void status(const std::string& tenant, const std::string& id) {
    KeyRequest k;
    k.kind = KeyRequest::status;
    k.client.identity = "c1";
    k.tenant = tenant;
    k.id = id;
    caf::anon_send(admission, status_atom::value, std::move(k));
    sched->run();
  }
  /// The batcher reports `j` done with `completion` token ids.
  void finish(const Job& j, uint32_t completion) {
    JobOutcome o;
    o.uid = j.uid;
    o.id = j.id;
    o.tenant = j.tenant;
    o.outcome = Outcome::done;
    o.tokens_used = static_cast<uint32_t>(j.prompt.size()) + completion;
    o.done.to = j.client;
    o.done.uid = j.uid;
    o.done.id = j.id;
    o.done.tenant = j.tenant;
    o.done.ids.assign(completion, 7);
    o.done.completion_tokens = completion;
    caf::anon_send(admission, finished_atom::value, std::move(o));
    sched->run();
  }
  void advance(std::chrono::milliseconds d) { sched->clock().current_time += d; }
  AdmissionStats stats() { return test::probe_stats<AdmissionStats>(*this, admission); }
};

// prefix + i, built by appending: GCC 12 warns (-Wrestrict, a false positive) on "lit" + string&&.
std::string numbered(std::string prefix, int i) {
  prefix += std::to_string(i);
  return prefix;
}

AdmissionConfig open_mode(int64_t idle_ms, size_t max_idle) {
  AdmissionConfig ac;  // no tenants, allow_anonymous: open-tenant mode
  ac.tenant_idle_ms = idle_ms;
  ac.max_idle_tenants = max_idle;
  return ac;
}

}  // namespace

BOOST_AUTO_TEST_CASE(an_unknown_tenant_is_forgotten_once_idle_for_the_configured_time) {
  Rig rig(open_mode(1000, 100));
  rig.submit("a", "j1");
  rig.submit("b", "j1");
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 2u);
  BOOST_CHECK_EQUAL(rig.stats().tenants, 2);
  BOOST_CHECK_EQUAL(rig.stats().tenants_idle, 0);  // both have a job in flight
  rig.finish(rig.t->runs[0], 4);                   // "a" is idle from now on
  BOOST_CHECK_EQUAL(rig.stats().tenants_idle, 1);
  rig.advance(999ms);
  rig.status("c", "none");  // any use looks at the idle list; "c" itself becomes idle
  BOOST_CHECK_EQUAL(rig.stats().tenants, 3);
  BOOST_CHECK_EQUAL(rig.stats().tenants_forgotten, 0);
  rig.advance(1ms);
  rig.status("d", "none");
  // "a" went after 1000 ms idle; "b" stays however long: its job is still running.
  BOOST_CHECK_EQUAL(rig.stats().tenants_forgotten, 1);
  BOOST_CHECK_EQUAL(rig.stats().tenants, 3);
  rig.advance(10s);
  rig.status("e", "none");
  BOOST_CHECK_EQUAL(rig.stats().tenants, 2);  // "b" and "e": "c" and "d" timed out too
  BOOST_CHECK_EQUAL(rig.stats().tenants_forgotten, 3);
  // A forgotten tenant keeps its stored results and comes back as new on its next submit.
  rig.submit("a", "j1");
  BOOST_REQUIRE_EQUAL(rig.t->dones.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->dones[0].id, "j1");
  BOOST_CHECK_EQUAL(rig.t->runs.size(), 2u);  // answered from the cache, not run again
  rig.submit("a", "j2");
  BOOST_CHECK_EQUAL(rig.t->runs.size(), 3u);
  BOOST_REQUIRE_EQUAL(rig.t->errors.size(), 3u);  // the three status probes only
  for (const auto& e : rig.t->errors) BOOST_CHECK_EQUAL(e.code, ErrorCode::not_found);
  // Its job ends like any other (the tenant entry was made anew by the submit).
  rig.finish(rig.t->runs[2], 2);
  rig.finish(rig.t->runs[1], 2);
  BOOST_CHECK_EQUAL(rig.stats().tenants_idle, 3);
  BOOST_CHECK_EQUAL(rig.stats().active, 0);
}

BOOST_AUTO_TEST_CASE(idle_unknown_tenants_beyond_the_cap_go_longest_idle_first) {
  // An hour of idle time: only the cap forgets here.
  Rig rig(open_mode(3600000, 3));
  for (int i = 0; i < 10; ++i) rig.status(numbered("t", i), "none");
  BOOST_CHECK_EQUAL(rig.stats().tenants, 3);
  BOOST_CHECK_EQUAL(rig.stats().tenants_forgotten, 7);
  // Busy tenants do not count against the cap and are never forgotten.
  for (int i = 0; i < 5; ++i) rig.submit(numbered("busy", i), "j");
  BOOST_CHECK_EQUAL(rig.stats().tenants, 8);
  BOOST_CHECK_EQUAL(rig.stats().tenants_idle, 3);
  BOOST_CHECK_EQUAL(rig.t->runs.size(), 5u);
}

BOOST_AUTO_TEST_CASE(configured_tenants_are_never_forgotten) {
  AdmissionConfig ac;
  ac.allow_anonymous = false;
  TenantConfig t;
  t.name = "acme";
  ac.tenants = {t};
  ac.tenant_idle_ms = 0;
  ac.max_idle_tenants = 0;
  Rig rig(std::move(ac));
  rig.submit("acme", "j1");
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 1u);
  rig.finish(rig.t->runs[0], 1);
  rig.advance(1h);
  rig.status("acme", "j1");
  rig.submit("stranger", "j1");  // refused: not configured, and no entry made for it
  BOOST_CHECK_EQUAL(rig.stats().tenants, 1);
  BOOST_CHECK_EQUAL(rig.stats().tenants_forgotten, 0);
}

BOOST_AUTO_TEST_CASE(result_cache_is_bounded_by_bytes_oldest_first) {
  AdmissionConfig ac = open_mode(60000, 10000);
  ac.result_cache = 1000;             // the count would keep all 40
  ac.result_cache_bytes = 64u << 10;  // 64 KiB: room for about a dozen results of 1,024 ids
  Rig rig(std::move(ac));
  for (int i = 0; i < 40; ++i) rig.submit("t", numbered("j", i));
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 40u);
  for (int i = 0; i < 40; ++i) {
    rig.finish(rig.t->runs[i], 1024);
    BOOST_CHECK_LE(rig.stats().remembered_bytes, 64 << 10);
  }
  const int64_t kept = rig.stats().remembered;
  BOOST_TEST_MESSAGE("results kept: " << kept << ", bytes " << rig.stats().remembered_bytes);
  // Each holds at least its 4 KiB of ids, and the budget is not wasted either.
  BOOST_CHECK_LE(kept, 16);
  BOOST_CHECK_GE(kept, 10);
  // The newest is still answered from the cache; the oldest was forgotten and runs again.
  rig.submit("t", "j39");
  BOOST_REQUIRE_EQUAL(rig.t->dones.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->dones[0].ids.size(), 1024u);
  BOOST_CHECK_EQUAL(rig.t->runs.size(), 40u);
  rig.submit("t", "j0");
  BOOST_CHECK_EQUAL(rig.t->runs.size(), 41u);
  BOOST_CHECK_EQUAL(rig.t->dones.size(), 1u);
}

BOOST_AUTO_TEST_CASE(a_result_larger_than_the_byte_limit_is_not_kept) {
  AdmissionConfig ac = open_mode(60000, 10000);
  ac.result_cache_bytes = 1024;
  Rig rig(std::move(ac));
  rig.submit("t", "big");
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 1u);
  rig.finish(rig.t->runs[0], 1024);
  BOOST_CHECK_EQUAL(rig.stats().remembered, 0);
  BOOST_CHECK_EQUAL(rig.stats().remembered_bytes, 0);
}

BOOST_AUTO_TEST_CASE(tenant_labels_beyond_the_cap_are_folded_into_other) {
  test::TestSystem ts;
  auto t = std::make_shared<Trace>();
  MetricsWiring w;
  w.classes = {"interactive"};
  w.tenants = {"acme"};
  w.max_tenant_labels = 2;
  w.ask_timeout = 1ms;
  auto m = spawn_metrics(*ts.sys, w);
  auto probe = ts.sys->spawn(prober, t);
  ts.sched->run();
  auto job = [&](const std::string& tenant) {
    JobOutcome o;
    o.tenant = tenant;
    o.outcome = Outcome::done;
    caf::anon_send(m, finished_atom::value, o, std::string("interactive"));
    ts.sched->run();
  };
  for (int i = 0; i < 50; ++i) job(numbered("anon", i));
  job("anon0");  // labelled before the cap was reached: keeps its label
  job("acme");   // configured: always its own label
  caf::anon_send(probe, metrics_atom::value, m);
  ts.sched->run();
  // Stand-ins are absent (no admission, router): the scrape must not wait for them.
  ts.sched->trigger_timeouts();
  ts.sched->run();
  const std::string& text = t->metrics;
  BOOST_REQUIRE(!text.empty());
  auto count = [&](const std::string& needle) {
    size_t n = 0;
    for (auto p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
    return n;
  };
  BOOST_CHECK_EQUAL(count("switchyard_jobs_total{"), 4u);  // anon0, anon1, _other, acme
  BOOST_CHECK_NE(text.find("tenant=\"anon0\",outcome=\"done\"} 2\n"), std::string::npos);
  BOOST_CHECK_NE(text.find("tenant=\"anon1\",outcome=\"done\"} 1\n"), std::string::npos);
  BOOST_CHECK_NE(text.find("tenant=\"_other\",outcome=\"done\"} 48\n"), std::string::npos);
  BOOST_CHECK_NE(text.find("tenant=\"acme\",outcome=\"done\"} 1\n"), std::string::npos);
  caf::anon_send_exit(m, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(probe, caf::exit_reason::user_shutdown);
  ts.sched->run();
}

BOOST_AUTO_TEST_SUITE_END()  // test_actors_admission_bounds
