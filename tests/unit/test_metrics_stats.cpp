// The stats records (actors/stats.hpp) rendered three ways from the same fields: the `ctl stats`
// reply (control_stats_json), the SIGUSR1 line (ServerSnapshot::to_json) and /metrics (the
// metrics actor, asked by stand-ins answering the records). Also the field-by-field sum over
// batchers and the records' CAF serialization (what crosses to a remote node).
#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "actors/control.hpp"
#include "actors/messages.hpp"
#include "actors/metrics.hpp"
#include "actors/stats.hpp"
#include "server/server.hpp"
#include "tests/support/stand_in.hpp"

BOOST_AUTO_TEST_SUITE(test_metrics_stats)

using namespace sy;
using namespace std::chrono_literals;

namespace {

struct Config : caf::actor_system_config {
  Config() { register_message_types(*this); }
};

// Every field a distinct value, so that a field read in the wrong place shows.
struct Records {
  AdmissionStats admission;
  RouterStats router;
  BatcherStats b0, b1;
  EdgeStats edge;
  SupervisorStats supervisor;
  JournalStats journal;

  Records() {
    admission.active = 3;
    admission.admitted = 41;
    admission.overloaded = 5;
    admission.unauthorized = 2;
    admission.rate_limited = 8;
    admission.bad_request = 10;
    admission.unavailable = 12;
    router.queued = 7;
    router.dispatched = 40;
    router.expired = 1;
    router.affinity_hits = 9;
    router.affinity_overruled = 4;
    router.lost_requeued = 6;
    router.lost_failed = 13;
    router.queued_by_class = {{"interactive", 7}};
    auto batcher = [](int64_t k) {
      BatcherStats b;
      b.running = 1 * k;
      b.blocks_used = 2 * k;
      b.blocks_free = 3 * k;
      b.blocks_total = 6 * k;
      b.blocks_cached = 4 * k;
      b.preemptions = 5 * k;
      b.policy_swaps = 7 * k;
      b.prefix_hit_tokens = 11 * k;
      b.seq_failures = 13 * k;
      b.steps = 17 * k;
      b.idle_since_us = 1000 * k;
      b.kv_policy = "sliding_window:" + std::to_string(k);
      return b;
    };
    b0 = batcher(1);
    b1 = batcher(100);
    edge.received = 100;
    edge.sent = 99;
    edge.decode_errors = 15;
    edge.curve_refused = 16;
    edge.intake_refused = 18;
    edge.connections_refused = 19;
    edge.connections_refused_per_address = 36;
    edge.connections_refused_total = 37;
    edge.connections_refused_handshaking = 38;
    edge.connections_open = 20;
    edge.connections_handshaking = 39;
    supervisor.executors = 2;
    supervisor.executors_retiring = 21;
    supervisor.scale_ups = 22;
    supervisor.scale_downs = 23;
    supervisor.executor_failures = 24 + 25;
    supervisor.failures_crash = 24;
    supervisor.failures_hang = 25;
    supervisor.requeued = 26;
    supervisor.recoveries = 27;
    supervisor.recovery_ms_last = 28;
    supervisor.recovery_ms_max = 29;
    sum_into(supervisor.batchers, b0);
    sum_into(supervisor.batchers, b1);
    journal.accepted = 30;
    journal.write_errors = 31;
    journal.failing = 1;
    journal.refused = 32;
    journal.unwritten = 33;
    journal.replayed_pending = 34;
    journal.replayed_results = 35;
  }
};

// The value of the sample `series` (name and labels as written) in an exposition text.
double sample(const std::string& text, const std::string& series) {
  const std::string key = "\n" + series + " ";
  auto at = ("\n" + text).find(key);
  BOOST_REQUIRE_MESSAGE(at != std::string::npos, "no sample " << series);
  return std::stod(("\n" + text).substr(at + key.size()));
}

std::string scrape(const Records& r) {
  Config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  MetricsWiring w;
  w.admission = test::stats_double(sys, r.admission);
  w.router = test::stats_double(sys, r.router);
  w.supervisor = test::stats_double(sys, r.supervisor);
  w.journal = test::stats_double(sys, r.journal);
  w.gateway_stats = [e = r.edge] { return e; };
  w.classes = {"interactive"};
  auto m = spawn_metrics(sys, w);
  auto b0 = test::stats_double(sys, r.b0);
  auto b1 = test::stats_double(sys, r.b1);
  auto e0 = test::stats_double(sys, ExecutorStats{});
  auto e1 = test::stats_double(sys, ExecutorStats{});
  self->send(m, observe_atom::value, b0, e0, int32_t{0});
  self->send(m, observe_atom::value, b1, e1, int32_t{1});
  std::string text;
  self->request(m, 5s, metrics_atom::value)
      .receive([&](std::string& t) { text = std::move(t); },
               [&](caf::error& e) { BOOST_FAIL("scrape failed: " << caf::to_string(e)); });
  test::stop_all(w.admission, w.router, w.supervisor, w.journal, m, b0, b1, e0, e1);
  return text;
}

}  // namespace

BOOST_AUTO_TEST_CASE(ctl_stats_sigusr1_and_metrics_show_the_same_fields) {
  const Records r;
  const auto ctl =
      nlohmann::json::parse(control_stats_json(r.admission, r.router, {r.b0, r.b1}, r.edge));
  ServerSnapshot snap;
  snap.admission = r.admission;
  snap.router = r.router;
  snap.supervisor = r.supervisor;
  static_cast<EdgeStats&>(snap) = r.edge;
  snap.journal = r.journal;
  const auto dump = nlohmann::json::parse(snap.to_json());
  const std::string metrics = scrape(r);
  BOOST_TEST_MESSAGE(ctl.dump() << "\n" << dump.dump() << "\n" << metrics);

  // Every summary field, under its one exported name, in both JSON replies with the record's
  // value (the control actor sums its batchers itself, the supervisor did so for the dump).
  int n = 0;
  for_each_summary_field(r.admission, r.router, r.supervisor.batchers, r.edge, nullptr, nullptr,
                         [&](const std::string& name, int64_t v) {
                           ++n;
                           BOOST_TEST_CONTEXT(name) {
                             BOOST_TEST(ctl.at(name).get<int64_t>() == v);
                             BOOST_TEST(dump.at(name).get<int64_t>() == v);
                           }
                         });
  BOOST_TEST(n == 5 + 7 + 12 + 11);  // admission, router, batchers, edge
  // The supervisor's and the journal's in the dump only (the control actor asks neither).
  BOOST_TEST(dump.at("executors").get<int64_t>() == 2);
  BOOST_TEST(dump.at("requeued").get<int64_t>() == 26);  // the supervisor's, not a batcher's
  BOOST_TEST(dump.at("recovery_ms_max").get<int64_t>() == 29);
  BOOST_TEST(dump.at("journal_accepted").get<int64_t>() == 30);
  BOOST_TEST(dump.at("journal_replayed").get<int64_t>() == 34);
  BOOST_TEST(dump.at("journal_restored").get<int64_t>() == 35);
  BOOST_TEST(dump.at("journal_held_results").get<int64_t>() == 33);
  BOOST_TEST(!ctl.contains("executors"));
  BOOST_TEST(!dump.contains("batchers"));  // per-batcher objects are the control reply's
  BOOST_REQUIRE(ctl.at("batchers").size() == 2u);
  BOOST_TEST(ctl.at("batchers")[1].at("kv_policy").get<std::string>() == "sliding_window:100");
  BOOST_TEST(ctl.at("batchers")[1].at("blocks_used").get<int64_t>() == 200);
  BOOST_TEST(ctl.at("batchers")[0].at("preemptions").get<int64_t>() == 5);

  // The same values on /metrics.
  auto same = [&](const char* field, const std::string& series) {
    BOOST_TEST_CONTEXT(field << " = " << series) {
      const int64_t v = dump.contains(field) ? dump.at(field).get<int64_t>() : -1;
      BOOST_TEST(sample(metrics, series) == static_cast<double>(v));
    }
  };
  same("active_jobs", "switchyard_jobs_active");
  same("overloaded", "switchyard_jobs_rejected_total{reason=\"overloaded\"}");
  same("queued", "switchyard_queue_depth{class=\"interactive\"}");
  same("affinity_hits", "switchyard_prefix_affinity_dispatches_total{result=\"hit\"}");
  same("affinity_overruled", "switchyard_prefix_affinity_dispatches_total{result=\"overruled\"}");
  same("lost_requeued", "switchyard_batcher_lost_jobs_total{outcome=\"requeued\"}");
  same("lost_failed", "switchyard_batcher_lost_jobs_total{outcome=\"failed\"}");
  same("running", "switchyard_jobs_running");
  same("blocks_used", "switchyard_kv_blocks_used");
  same("blocks_total", "switchyard_kv_blocks_total");
  same("blocks_cached", "switchyard_kv_blocks_cached");
  same("preemptions", "switchyard_preemptions_total");
  same("policy_swaps", "switchyard_kv_policy_swaps_total");
  same("seq_failures", "switchyard_sequence_failures_total");
  same("spec_draft_tokens", "switchyard_spec_draft_tokens_total");
  same("spec_accepted_tokens", "switchyard_spec_accepted_tokens_total");
  same("curve_refused", "switchyard_curve_refused_total");
  same("intake_refused", "switchyard_intake_refused_total");
  same("connections_refused_per_address",
       "switchyard_connections_refused_total{reason=\"per_address\"}");
  same("connections_refused_total", "switchyard_connections_refused_total{reason=\"total\"}");
  same("connections_refused_handshaking",
       "switchyard_connections_refused_total{reason=\"handshaking\"}");
  same("connections_open", "switchyard_connections_open");
  same("connections_handshaking", "switchyard_connections_handshaking");
  same("executors", "switchyard_executors{state=\"running\"}");
  same("scale_ups", "switchyard_executor_scale_events_total{direction=\"up\"}");
  same("scale_downs", "switchyard_executor_scale_events_total{direction=\"down\"}");
  same("requeued", "switchyard_jobs_requeued_total");
  same("journal_write_errors", "switchyard_journal_write_errors_total");
  same("journal_failing", "switchyard_journal_failing");
  same("journal_refused", "switchyard_journal_refused_jobs_total");
  same("journal_held_results", "switchyard_journal_held_results");
  // Fields outside the summary, read by /metrics straight from the records.
  BOOST_TEST(sample(metrics, "switchyard_jobs_rejected_total{reason=\"unauthorized\"}") == 2);
  BOOST_TEST(sample(metrics, "switchyard_kv_blocks_free") == 303);
  BOOST_TEST(sample(metrics, "switchyard_executor_kv_blocks_used{executor=\"1\"}") == 200);
  BOOST_TEST(sample(metrics, "switchyard_executor_failures_total{reason=\"hang\"}") == 25);
  BOOST_TEST(sample(metrics, "switchyard_executors{state=\"retiring\"}") == 21);
}

BOOST_AUTO_TEST_CASE(batchers_are_summed_field_by_field) {
  const Records r;
  const BatcherStats s = sum_of(std::vector<BatcherStats>{r.b0, r.b1});
  // Each integer field is the sum; a moment (idle_since_us) and strings are not added.
  for_each_field(s, [&](const auto& f) {
    BOOST_TEST_CONTEXT(f.name) {
      using T = std::remove_cvref_t<decltype(f.value)>;
      if constexpr (std::is_integral_v<T>) {
        int64_t want = 0;
        for (const BatcherStats* b : {&r.b0, &r.b1})
          for_each_field(*b, [&](const auto& g) {
            if constexpr (std::is_integral_v<std::remove_cvref_t<decltype(g.value)>>)
              if (std::string(g.name) == f.name) want += g.value;
          });
        if (f.show & stats_fields::kInstant) want = 0;
        BOOST_TEST(f.value == want);
      }
    }
  });
  BOOST_TEST(s.running == 101);
  BOOST_TEST(s.blocks_total == 606);
  BOOST_TEST(s.idle_since_us == 0);
  BOOST_TEST(s.kv_policy.empty());
}

BOOST_AUTO_TEST_CASE(records_cross_caf_serialization) {
  Config cfg;
  caf::actor_system sys{cfg};
  const Records r;
  std::vector<char> buf;
  {
    caf::binary_serializer out{sys, buf};
    auto x = r.supervisor;
    auto y = r.router;
    auto z = r.b1;
    BOOST_REQUIRE(!out(x, y, z));
  }
  SupervisorStats x;
  RouterStats y;
  BatcherStats z;
  caf::binary_deserializer in{sys, buf};
  BOOST_REQUIRE(!in(x, y, z));
  BOOST_TEST(x.failures_hang == 25);
  BOOST_TEST(x.batchers.blocks_total == 606);
  BOOST_TEST(y.lost_failed == 13);
  BOOST_TEST(y.queued_by_class.at("interactive") == 7);
  BOOST_TEST(z.kv_policy == "sliding_window:100");
  BOOST_TEST(z.idle_since_us == 100000);
  // A record also prints through CAF (messages in logs and test failures).
  BOOST_TEST(caf::deep_to_string(r.b0).find("sliding_window:1") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()  // test_metrics_stats
