// The shutdown grace period: after SIGTERM the server still reads both client sockets, answers
// every new submit at once with `unavailable` (on the request endpoint and on the pipeline
// results socket), still answers status and cancel for the jobs that are finishing, and those
// jobs end with their `done`.
#include <boost/test/unit_test.hpp>
#include <map>
#include <set>
#include <thread>

#include "clients/cpp/client.hpp"
#include "ingress/codec.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_shutdown_grace)

using namespace std::chrono_literals;
using sy::ErrorCode;
using sy::wire::Done;
using sy::wire::Error;
using sy::wire::FinishReason;
using sy::wire::JobState;
using sy::wire::StatusReply;

namespace {

constexpr int kLateSubmits = 64;
// Tokens of the job that must finish during the grace: at 20 ms a step it runs for seconds,
// far longer than the refusals below take, and far shorter than the grace.
constexpr uint32_t kLongTokens = 200;

sy::wire::Submit job(const std::string& id, const std::string& tenant, uint32_t tokens) {
  sy::wire::Submit s;
  s.id = id;
  s.tenant = tenant;
  s.prompt = std::vector<int32_t>{1, 2, 3, 4};
  s.max_tokens = tokens;
  s.ignore_eos = true;
  return s;
}

// Asks for a job's status and returns the reply; done messages met on the way are kept.
std::optional<StatusReply> status_of(sy::client::Client& c, const std::string& id,
                                     std::map<std::string, Done>& done) {
  c.status(id, "acme");
  while (auto m = c.next(10s)) {
    if (auto* r = std::get_if<StatusReply>(&*m); r && r->id == id) return *r;
    if (auto* d = std::get_if<Done>(&*m)) done[d->id] = *d;
    if (auto* e = std::get_if<Error>(&*m); e && e->id == id) return std::nullopt;
  }
  return std::nullopt;
}

// Waits until the job is running (status polled: there is no event to wait on for that).
bool wait_running(sy::client::Client& c, const std::string& id, std::map<std::string, Done>& done) {
  for (int i = 0; i < 500; ++i) {
    auto r = status_of(c, id, done);
    if (r && r->state == JobState::running) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

}  // namespace

BOOST_AUTO_TEST_CASE(submits_during_the_grace_get_unavailable_and_running_jobs_finish) {
  sy::it::TempDir dir;
  // A tenant list, so that an unknown tenant is refused `unauthorized` while the server runs
  // normally; the probe below tells the shutdown by the switch to `unavailable`.
  std::string cfg = dir.write("g.yaml", R"(
admission:
  tenants:
    - {name: acme}
executors:
  backend: "null"
)");
  sy::it::ServerProcess srv({"--config", cfg, "--pull", "tcp://127.0.0.1:*", "--results",
                             "tcp://127.0.0.1:*", "--step-delay-ms", "20", "--grace-ms", "60000"});
  sy::client::Client c(srv.endpoint());
  sy::client::Sink sink(srv.results_endpoint());
  sy::client::Pusher push(srv.pull_endpoint());
  std::map<std::string, Done> done;

  // Two long jobs on the request endpoint (one to finish, one to cancel during the grace) and
  // one on the pipeline, all running before SIGTERM.
  c.submit(job("finish", "acme", kLongTokens));
  c.submit(job("cancel-me", "acme", 4000));
  BOOST_REQUIRE(push.submit(job("pipe-finish", "acme", kLongTokens), 10s));
  BOOST_REQUIRE(wait_running(c, "finish", done));
  BOOST_REQUIRE(wait_running(c, "cancel-me", done));
  BOOST_REQUIRE(wait_running(c, "pipe-finish", done));

  BOOST_REQUIRE(::kill(srv.pid(), SIGTERM) == 0);

  // Until the server has begun its shutdown, the probe is refused for its unknown tenant;
  // afterwards with `unavailable`. Every probe gets an answer either way.
  bool shutting_down = false;
  for (int i = 0; i < 1000 && !shutting_down; ++i) {
    auto r = c.run(job("probe-" + std::to_string(i), "nobody", 1), 10s);
    BOOST_REQUIRE_MESSAGE(r.error.has_value(), "no reply to a submit after SIGTERM");
    BOOST_REQUIRE(r.error->code == ErrorCode::unavailable ||
                  r.error->code == ErrorCode::unauthorized);
    shutting_down = r.error->code == ErrorCode::unavailable;
  }
  BOOST_REQUIRE(shutting_down);

  // 64 late submits on a new connection and 64 on the pipeline: real jobs the server would
  // otherwise run.
  sy::client::Client late(srv.endpoint());
  for (int i = 0; i < kLateSubmits; ++i) {
    late.submit(job("late-" + std::to_string(i), "acme", 4));
    BOOST_REQUIRE(push.submit(job("late-pipe-" + std::to_string(i), "acme", 4), 10s));
  }
  std::set<std::string> refused, refused_pipe;
  bool all_hinted = true;
  while (refused.size() < static_cast<size_t>(kLateSubmits)) {
    auto m = late.next(10s);
    BOOST_REQUIRE_MESSAGE(m.has_value(), "only " << refused.size() << " of " << kLateSubmits
                                                 << " late submits were answered");
    auto* e = std::get_if<Error>(&*m);
    BOOST_REQUIRE_MESSAGE(e, "a late submit got " << sy::client::describe(*m));
    BOOST_TEST((e->code == ErrorCode::unavailable));
    BOOST_TEST(e->tenant == "acme");
    BOOST_TEST(e->message.find("shutting down") != std::string::npos);
    all_hinted = all_hinted && e->retry_after_ms.has_value();
    refused.insert(e->id);
  }
  while (refused_pipe.size() < static_cast<size_t>(kLateSubmits)) {
    auto m = sink.next(10s);
    BOOST_REQUIRE_MESSAGE(m.has_value(), "only " << refused_pipe.size() << " of " << kLateSubmits
                                                 << " late pipeline submits were answered");
    if (auto* d = std::get_if<Done>(&*m)) {
      done[d->id] = *d;
      continue;
    }
    auto* e = std::get_if<Error>(&*m);
    BOOST_REQUIRE_MESSAGE(e, "a late pipeline submit got " << sy::client::describe(*m));
    BOOST_TEST((e->code == ErrorCode::unavailable));
    BOOST_TEST(e->id.rfind("late-pipe-", 0) == 0);
    all_hinted = all_hinted && e->retry_after_ms.has_value();
    refused_pipe.insert(e->id);
  }
  BOOST_TEST(refused.size() == static_cast<size_t>(kLateSubmits));
  BOOST_TEST(refused_pipe.size() == static_cast<size_t>(kLateSubmits));
  BOOST_TEST(all_hinted);

  // Status and cancel still work for the jobs of the grace period.
  auto st = status_of(c, "cancel-me", done);
  BOOST_REQUIRE(st.has_value());
  BOOST_TEST((st->state == JobState::running));
  c.cancel("cancel-me", "acme");

  // Every job that was running ends with its done: the cancelled one as cancelled, the others
  // with all their tokens.
  for (const std::string id : {"cancel-me", "finish"}) {
    if (done.count(id)) continue;
    auto r = c.wait(id, 30s, "acme");
    BOOST_REQUIRE_MESSAGE(r.ok(), id << " did not finish");
    done[id] = *r.done;
  }
  while (!done.count("pipe-finish")) {
    auto m = sink.next(30s);
    BOOST_REQUIRE_MESSAGE(m.has_value(), "pipe-finish did not finish");
    if (auto* d = std::get_if<Done>(&*m)) done[d->id] = *d;
  }
  BOOST_TEST((done["cancel-me"].finish_reason == FinishReason::cancelled));
  BOOST_TEST((done["finish"].finish_reason == FinishReason::length));
  BOOST_TEST(done["finish"].ids.size() == kLongTokens);
  BOOST_TEST((done["pipe-finish"].finish_reason == FinishReason::length));
  BOOST_TEST(done["pipe-finish"].ids.size() == kLongTokens);

  // With nothing left to run the server exits well inside its grace, cleanly.
  BOOST_TEST(srv.stop(SIGTERM, 60s) == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_shutdown_grace
