// The metrics actor with stand-in admission, router, supervisor, batcher and executor actors: job
// counters by class, tenant and outcome, latency histograms, gauges gathered at scrape time,
// counters that survive a dead batcher, the supervisor's figures and per-executor series, /ready,
// and the HTTP routes over a real loopback socket.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <chrono>
#include <string>
#include <thread>

#include "actors/messages.hpp"
#include "actors/metrics.hpp"
#include "tests/support/stand_in.hpp"
#include "core/error_code.hpp"
#include "server/metrics.hpp"
#include "tests/support/enum_print.hpp"

BOOST_AUTO_TEST_SUITE(test_metrics_actor)

using namespace sy;
using namespace std::chrono_literals;

namespace {

struct Config : caf::actor_system_config {
  Config() { register_message_types(*this); }
};


// A batcher's record with the KV figures the tests set.
BatcherStats kv(int64_t used, int64_t free, int64_t total, int64_t preemptions) {
  BatcherStats b;
  b.blocks_used = used;
  b.blocks_free = free;
  b.blocks_total = total;
  b.preemptions = preemptions;
  return b;
}

JobOutcome done(const std::string& tenant, uint32_t completion, double ttft_ms, double total_ms) {
  JobOutcome o;
  o.tenant = tenant;
  o.outcome = Outcome::done;
  o.done.prompt_tokens = 5;
  o.done.cached_tokens = 2;
  o.done.completion_tokens = completion;
  o.done.queue_ms = 1;
  o.done.ttft_ms = ttft_ms;
  o.done.total_ms = total_ms;
  return o;
}

std::string scrape(caf::scoped_actor& self, const MetricsActor& m) {
  std::string text;
  self->request(m, 5s, metrics_atom::value)
      .receive([&](std::string& t) { text = std::move(t); },
               [&](caf::error& e) { BOOST_FAIL("scrape failed: " << caf::to_string(e)); });
  return text;
}

bool ready(caf::scoped_actor& self, const MetricsActor& m) {
  bool r = false;
  self->request(m, 5s, ready_atom::value).receive([&](bool b) { r = b; }, [&](caf::error&) {});
  return r;
}

bool has_line(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

// One GET over a plain socket: the status line's code and the body.
std::pair<int, std::string> http_get(const std::string& address, const std::string& path) {
  auto colon = address.rfind(':');
  int port = std::stoi(address.substr(colon + 1));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return {-1, ""};
  }
  std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string resp;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  if (resp.size() < 12) return {-1, resp};
  auto body = resp.find("\r\n\r\n");
  return {std::stoi(resp.substr(9, 3)), body == std::string::npos ? "" : resp.substr(body + 4)};
}

}  // namespace

BOOST_AUTO_TEST_CASE(jobs_histograms_and_gauges) {
  Config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  AdmissionStats as;
  as.unauthorized = 2;
  as.active = 1;
  auto admission = test::stats_double(sys, as);
  RouterStats rs;
  rs.queued_by_class = {{"interactive", 3}, {"batch", 0}};
  auto router = test::stats_double(sys, rs);
  BatcherStats bs = kv(10, 20, 32, 6);
  bs.running = 4;
  bs.blocks_cached = 2;
  bs.policy_swaps = 1;
  bs.steps_done = 7;
  bs.step_us = 2500000;
  auto batcher = test::stats_double(sys, bs);
  auto executor = test::stats_double(sys, ExecutorStats{});
  MetricsWiring w;
  w.admission = admission;
  w.router = router;
  w.classes = {"interactive", "batch"};
  auto m = spawn_metrics(sys, w);

  BOOST_TEST(!ready(self, m));  // no executor yet
  self->send(m, observe_atom::value, batcher, executor);
  self->send(m, finished_atom::value, done("a", 11, 20, 120), std::string("interactive"));
  self->send(m, finished_atom::value, done("a", 1, 3000, 3000), std::string("interactive"));
  self->send(m, finished_atom::value, done("b", 4, 5, 35), std::string("batch"));
  JobOutcome err;
  err.tenant = "we\"ird";
  err.outcome = Outcome::error;
  err.code = ErrorCode::deadline_exceeded;
  self->send(m, finished_atom::value, err, std::string("batch"));
  JobOutcome cancelled = done("b", 2, 1, 2);
  cancelled.outcome = Outcome::cancelled;
  self->send(m, finished_atom::value, cancelled, std::string("batch"));
  BOOST_TEST(ready(self, m));

  auto t = scrape(self, m);
  BOOST_TEST_MESSAGE(t);
  BOOST_TEST(
      has_line(t, "switchyard_jobs_total{class=\"interactive\",tenant=\"a\",outcome=\"done\"} 2"));
  BOOST_TEST(has_line(t, "switchyard_jobs_total{class=\"batch\",tenant=\"b\",outcome=\"done\"} 1"));
  BOOST_TEST(
      has_line(t, "switchyard_jobs_total{class=\"batch\",tenant=\"b\",outcome=\"cancelled\"} 1"));
  BOOST_TEST(has_line(t,
                      "switchyard_jobs_total{class=\"batch\",tenant=\"we\\\"ird\",outcome="
                      "\"deadline_exceeded\"} 1"));
  BOOST_TEST(has_line(t, "switchyard_jobs_rejected_total{reason=\"unauthorized\"} 2"));
  BOOST_TEST(has_line(t, "switchyard_jobs_active 1"));
  BOOST_TEST(has_line(t, "switchyard_queue_depth{class=\"interactive\"} 3"));
  BOOST_TEST(has_line(t, "switchyard_queue_depth{class=\"batch\"} 0"));
  BOOST_TEST(has_line(t, "switchyard_jobs_running 4"));
  BOOST_TEST(has_line(t, "switchyard_kv_blocks_used 10"));
  BOOST_TEST(has_line(t, "switchyard_kv_blocks_free 20"));
  BOOST_TEST(has_line(t, "switchyard_kv_blocks_cached 2"));
  BOOST_TEST(has_line(t, "switchyard_kv_blocks_total 32"));
  BOOST_TEST(has_line(t, "switchyard_preemptions_total 6"));
  BOOST_TEST(has_line(t, "switchyard_kv_policy_swaps_total 1"));
  BOOST_TEST(has_line(t, "switchyard_engine_steps_total 7"));
  BOOST_TEST(has_line(t, "switchyard_engine_step_seconds_total 2.5"));
  BOOST_TEST(has_line(t, "switchyard_executors_running 1"));
  // Tokens of done and cancelled jobs: 11 + 1 + 4 + 2 generated, 4 x 5 prompt, 4 x 2 cached.
  BOOST_TEST(has_line(t, "switchyard_generation_tokens_total 18"));
  BOOST_TEST(has_line(t, "switchyard_prompt_tokens_total 20"));
  BOOST_TEST(has_line(t, "switchyard_prefix_cache_hit_tokens_total 8"));
  // Histograms of done jobs only: 2 interactive, 1 batch.
  BOOST_TEST(has_line(t, "switchyard_e2e_request_latency_seconds_count{class=\"interactive\"} 2"));
  BOOST_TEST(has_line(
      t, "switchyard_e2e_request_latency_seconds_bucket{class=\"interactive\",le=\"0.25\"} 1"));
  BOOST_TEST(has_line(
      t, "switchyard_e2e_request_latency_seconds_bucket{class=\"interactive\",le=\"+Inf\"} 2"));
  BOOST_TEST(has_line(t, "switchyard_e2e_request_latency_seconds_count{class=\"batch\"} 1"));
  BOOST_TEST(has_line(
      t, "switchyard_time_to_first_token_seconds_bucket{class=\"interactive\",le=\"0.025\"} 1"));
  // TPOT: (120 - 20) ms over 10 tokens = 10 ms; the one-token job has none.
  BOOST_TEST(
      has_line(t, "switchyard_time_per_output_token_seconds_count{class=\"interactive\"} 1"));
  BOOST_TEST(has_line(
      t, "switchyard_time_per_output_token_seconds_bucket{class=\"interactive\",le=\"0.01\"} 1"));
  BOOST_TEST(has_line(
      t, "switchyard_time_per_output_token_seconds_bucket{class=\"interactive\",le=\"0.005\"} 0"));
  BOOST_TEST(has_line(t, "# TYPE switchyard_queue_time_seconds histogram"));

  // The pair dies: its counters stay, its gauges go, nothing is ready any more.
  self->send_exit(batcher, caf::exit_reason::user_shutdown);
  self->send_exit(executor, caf::exit_reason::user_shutdown);
  for (int i = 0; i < 500 && ready(self, m); ++i) std::this_thread::sleep_for(10ms);
  BOOST_TEST(!ready(self, m));
  t = scrape(self, m);
  BOOST_TEST(has_line(t, "switchyard_preemptions_total 6"));
  BOOST_TEST(has_line(t, "switchyard_kv_policy_swaps_total 1"));
  BOOST_TEST(has_line(t, "switchyard_engine_steps_total 7"));
  BOOST_TEST(has_line(t, "switchyard_engine_step_seconds_total 2.5"));
  BOOST_TEST(has_line(t, "switchyard_kv_blocks_total 0"));
  BOOST_TEST(has_line(t, "switchyard_executors_running 0"));
  test::stop_all(admission, router, m);
}

BOOST_AUTO_TEST_CASE(supervisor_figures_and_per_executor_series) {
  Config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  SupervisorStats ss;
  ss.executors = 2;
  ss.executors_retiring = 1;
  ss.scale_ups = 3;
  ss.scale_downs = 1;
  ss.failures_crash = 2;
  ss.failures_hang = 1;
  ss.requeued = 17;
  auto supervisor = test::stats_double(sys, ss);
  auto b0 = test::stats_double(sys, kv(3, 5, 8, 4));
  auto e0 = test::stats_double(sys, ExecutorStats{});
  auto b1 = test::stats_double(sys, kv(1, 7, 8, 2));
  auto e1 = test::stats_double(sys, ExecutorStats{});
  MetricsWiring w;
  w.supervisor = supervisor;
  w.gateway_stats = [] {
    EdgeStats e;
    e.curve_refused = 9;
    return e;
  };
  auto m = spawn_metrics(sys, w);
  self->send(m, observe_atom::value, b0, e0, int32_t{0});
  self->send(m, observe_atom::value, b1, e1, int32_t{1});
  // Two recoveries: 4 ms (a crash) and 0.6 s (a hang caught by the watchdog).
  self->send(m, recovered_atom::value, int64_t{1'000'000}, int64_t{1'004'000});
  self->send(m, recovered_atom::value, int64_t{2'000'000}, int64_t{2'600'000});

  auto t = scrape(self, m);
  BOOST_TEST_MESSAGE(t);
  BOOST_TEST(has_line(t, "switchyard_executors{state=\"running\"} 2"));
  BOOST_TEST(has_line(t, "switchyard_executors{state=\"retiring\"} 1"));
  BOOST_TEST(has_line(t, "switchyard_executor_scale_events_total{direction=\"up\"} 3"));
  BOOST_TEST(has_line(t, "switchyard_executor_scale_events_total{direction=\"down\"} 1"));
  BOOST_TEST(has_line(t, "switchyard_executor_failures_total{reason=\"crash\"} 2"));
  BOOST_TEST(has_line(t, "switchyard_executor_failures_total{reason=\"hang\"} 1"));
  BOOST_TEST(has_line(t, "switchyard_jobs_requeued_total 17"));
  BOOST_TEST(has_line(t, "switchyard_curve_refused_total 9"));
  BOOST_TEST(has_line(t, "# TYPE switchyard_recovery_seconds histogram"));
  BOOST_TEST(has_line(t, "switchyard_recovery_seconds_bucket{le=\"0.005\"} 1"));
  BOOST_TEST(has_line(t, "switchyard_recovery_seconds_bucket{le=\"0.5\"} 1"));
  BOOST_TEST(has_line(t, "switchyard_recovery_seconds_bucket{le=\"1\"} 2"));
  BOOST_TEST(has_line(t, "switchyard_recovery_seconds_count 2"));
  BOOST_TEST(has_line(t, "switchyard_recovery_seconds_sum 0.604"));
  // Per executor, and the unlabeled sums beside them.
  BOOST_TEST(has_line(t, "switchyard_kv_blocks_used 4"));
  BOOST_TEST(has_line(t, "switchyard_executor_kv_blocks_used{executor=\"0\"} 3"));
  BOOST_TEST(has_line(t, "switchyard_executor_kv_blocks_used{executor=\"1\"} 1"));
  BOOST_TEST(has_line(t, "switchyard_executor_kv_blocks_free{executor=\"1\"} 7"));
  BOOST_TEST(has_line(t, "switchyard_executor_kv_blocks_total{executor=\"0\"} 8"));
  BOOST_TEST(has_line(t, "switchyard_preemptions_total 6"));
  BOOST_TEST(has_line(t, "switchyard_executor_preemptions_total{executor=\"0\"} 4"));
  BOOST_TEST(has_line(t, "switchyard_executor_preemptions_total{executor=\"1\"} 2"));

  // Slot 0's pair fails and a replacement takes the slot: its gauges are the new pair's, its
  // preemption counter goes on from what the old pair counted.
  self->send_exit(b0, caf::exit_reason::user_shutdown);
  self->send_exit(e0, caf::exit_reason::user_shutdown);
  auto b2 = test::stats_double(sys, kv(0, 8, 8, 1));
  auto e2 = test::stats_double(sys, ExecutorStats{});
  // The old pair must be gone from the metrics actor's view before the new one comes (else the
  // two would add up for a moment): wait until neither its executor nor its blocks count.
  auto gone = [&] {
    auto x = scrape(self, m);
    return has_line(x, "switchyard_executors_running 1") &&
           has_line(x, "switchyard_kv_blocks_total 8");
  };
  for (int i = 0; i < 500 && !gone(); ++i) std::this_thread::sleep_for(10ms);
  self->send(m, observe_atom::value, b2, e2, int32_t{0});
  t = scrape(self, m);
  BOOST_TEST(has_line(t, "switchyard_executors_running 2"));
  BOOST_TEST(has_line(t, "switchyard_executor_kv_blocks_used{executor=\"0\"} 0"));
  BOOST_TEST(has_line(t, "switchyard_executor_kv_blocks_free{executor=\"0\"} 8"));
  BOOST_TEST(has_line(t, "switchyard_executor_preemptions_total{executor=\"0\"} 5"));
  BOOST_TEST(has_line(t, "switchyard_preemptions_total 7"));
  test::stop_all(supervisor, b1, e1, b2, e2, m);
}

BOOST_AUTO_TEST_CASE(a_silent_actor_does_not_hold_the_scrape) {
  Config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  // Takes stats_atom and never answers.
  auto mute = sys.spawn([](caf::event_based_actor* s) -> caf::behavior {
    return {[s](stats_atom) { s->make_response_promise(); }};
  });
  MetricsWiring w;
  w.admission = test::stand_in<AdmissionActor>(mute);
  w.classes = {"interactive"};
  w.ask_timeout = 50ms;
  auto m = spawn_metrics(sys, w);
  auto t = scrape(self, m);
  BOOST_TEST(has_line(t, "switchyard_jobs_active 0"));
  test::stop_all(mute, m);
}

BOOST_AUTO_TEST_CASE(http_routes) {
  Config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto executor = test::stats_double(sys, ExecutorStats{});
  auto batcher = test::stats_double(sys, kv(0, 0, 8, 0));
  MetricsWiring w;
  w.classes = {"interactive"};
  auto m = spawn_metrics(sys, w);
  MetricsEndpoint ep(sys, m, "127.0.0.1:0");
  ep.start();
  BOOST_TEST(ep.address().rfind("127.0.0.1:", 0) == 0u);
  BOOST_TEST(ep.address() != "127.0.0.1:0");

  BOOST_TEST(http_get(ep.address(), "/health").first == 200);
  BOOST_TEST(http_get(ep.address(), "/ready").first == 503);
  BOOST_TEST(http_get(ep.address(), "/nope").first == 404);
  self->send(m, observe_atom::value, batcher, executor);
  BOOST_TEST(http_get(ep.address(), "/ready").first == 200);
  auto [code, body] = http_get(ep.address(), "/metrics?x=1");
  BOOST_TEST(code == 200);
  BOOST_TEST(has_line(body, "switchyard_kv_blocks_total 8"));
  BOOST_TEST(has_line(body, "switchyard_executors_running 1"));
  ep.stop();
  ep.stop();                                                  // idempotent
  BOOST_TEST(http_get(ep.address(), "/health").first == -1);  // nothing listens any more

  // A busy port is refused with the address in the message.
  MetricsEndpoint first(sys, m, "127.0.0.1:0");
  first.start();
  MetricsEndpoint second(sys, m, first.address());
  BOOST_CHECK_EXCEPTION(second.start(), std::runtime_error, [&](const std::runtime_error& e) {
    return std::string(e.what()).find(first.address()) != std::string::npos;
  });
  first.stop();
  BOOST_CHECK_THROW(MetricsEndpoint(sys, m, "nonsense").start(), std::exception);
  test::stop_all(executor, batcher, m);
}

BOOST_AUTO_TEST_SUITE_END()  // test_metrics_actor
