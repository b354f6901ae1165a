// Must-show 3 and 4 (durable jobs): 1,000 pipeline jobs are accepted by a server with a journal,
// the server is killed with SIGKILL while some are done and some are not, a torn record is left
// at the journal's end, and a new server on the same journal delivers every result; how many
// were delivered twice is reported. Also: jobs/s with fsync always against batch, and a replayed
// job whose deadline passed while the server was down.
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <fstream>
#include <map>
#include <thread>

#include "clients/cpp/client.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_durability)

using namespace std::chrono_literals;

namespace {

constexpr uint32_t kTokens = 4;

// One class deep enough for every job, so the whole batch is accepted at once.
const char* kConfig = R"(
router:
  classes:
    - {name: only, rank: 0, queue_limit: 4000}
batching:
  max_sequences: 16
executors:
  backend: "null"
)";

sy::wire::Submit job(int i) {
  sy::wire::Submit s;
  s.id = "job-" + std::to_string(i);
  s.tenant = "pipe";
  s.prompt = std::vector<int32_t>{1, 2, 3, 4, 5};
  s.max_tokens = kTokens;
  s.ignore_eos = true;
  return s;
}

// Pushes jobs [0, n) and waits until ZeroMQ handed them over (linger).
void push_all(const std::string& endpoint, int n) {
  sy::client::Pusher push(endpoint);
  push.socket().set(zmq::sockopt::linger, 30000);
  for (int i = 0; i < n; ++i)
    if (!push.submit(job(i), 30s)) throw std::runtime_error("push blocked for 30 s");
}

// Polls the server's counters until `pred` holds (at most `limit`).
template <class Pred>
std::map<std::string, int64_t> wait_stats(sy::it::ServerProcess& srv, Pred pred,
                                          std::chrono::seconds limit = 30s) {
  auto until = std::chrono::steady_clock::now() + limit;
  auto st = srv.stats();
  while (!pred(st) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(20ms);
    st = srv.stats();
  }
  return st;
}

}  // namespace

BOOST_AUTO_TEST_CASE(kill_9_with_a_thousand_accepted_jobs_loses_none) {
  sy::it::TempDir dir;
  // Results are marked delivered 200 ms after they left (default 2 s), so that a kill after a
  // second of work shows how the marks bound the duplicates.
  std::string cfg =
      dir.write("d.yaml", std::string(kConfig) + "journal: {delivered_lag_ms: 200}\n");
  const std::string journal = dir.path() + "/journal/";
  constexpr int kJobs = 1000;

  // Run 1: slowed executor (TEST ONLY flag) so that the kill finds jobs in every state.
  auto srv = std::make_unique<sy::it::ServerProcess>(std::vector<std::string>{
      "--config", cfg, "--pull", "tcp://127.0.0.1:*", "--results", "tcp://127.0.0.1:*", "--journal",
      journal, "--journal-fsync", "batch", "--step-delay-ms", "10"});
  const std::string pull = srv->pull_endpoint(), results = srv->results_endpoint();
  BOOST_REQUIRE(!pull.empty());
  BOOST_REQUIRE(!results.empty());

  sy::client::Sink sink(results);
  std::map<std::string, int> seen;  // job id -> deliveries
  size_t errors = 0, wrong = 0;
  std::string first_error;
  auto take = [&](std::chrono::milliseconds wait) {
    auto m = sink.next(wait);
    if (!m) return false;
    if (auto* d = std::get_if<sy::wire::Done>(&*m)) {
      ++seen[d->id];
      if (d->ids.size() != kTokens) ++wrong;
    } else if (auto* e = std::get_if<sy::wire::Error>(&*m)) {
      ++errors;
      if (first_error.empty()) first_error = e->id + ": " + e->message;
    }
    return true;
  };

  auto t0 = std::chrono::steady_clock::now();
  push_all(pull, kJobs);
  auto st1 = wait_stats(*srv, [&](auto& s) { return s["journal_accepted"] >= kJobs; });
  BOOST_REQUIRE(st1["journal_accepted"] == kJobs);
  // Some done: wait for 40% of the results at the sink, then kill at once.
  while (seen.size() < kJobs * 4 / 10 && take(10s)) {
  }
  auto before = srv->stats();
  BOOST_TEST(srv->stop(SIGKILL) == 128 + SIGKILL);
  srv.reset();
  // Drain what was already on its way to the sink before the kill.
  while (take(200ms)) {
  }
  const size_t delivered_before = seen.size();
  BOOST_TEST_MESSAGE("killed with " << before["journal_accepted"] << " accepted, "
                                    << before["journal_results"] << " results journaled, "
                                    << delivered_before << " results at the sink");
  BOOST_TEST(delivered_before < static_cast<size_t>(kJobs));

  // A torn write at the end of the journal, as a crash in the middle of an append leaves it:
  // a record header promising 64 bytes, and 6 of them.
  {
    std::ofstream f(journal + "switchyard.journal", std::ios::binary | std::ios::app);
    f << std::string("\x40\0\0\0\x11\x22\x33\x44partia", 14);
  }

  // Run 2: the same journal and endpoints (the sink reconnects by itself), full speed.
  srv = std::make_unique<sy::it::ServerProcess>(
      std::vector<std::string>{"--config", cfg, "--pull", pull, "--results", results, "--journal",
                               journal, "--journal-fsync", "batch"});
  while (seen.size() < static_cast<size_t>(kJobs) && take(30s)) {
  }
  // Late duplicates (redelivered results) may trail the last new one.
  while (take(300ms)) {
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto st2 = wait_stats(*srv, [&](auto& s) { return s["active_jobs"] == 0; });

  size_t twice = 0, more = 0;
  for (auto& [id, n] : seen) {
    if (n == 2) ++twice;
    if (n > 2) ++more;
  }
  BOOST_TEST(seen.size() == static_cast<size_t>(kJobs));  // every key delivered at least once
  BOOST_TEST(errors == 0u, first_error);
  BOOST_TEST(wrong == 0u);
  BOOST_TEST(more == 0u);
  // Executed to completion once: the results of run 1 (restored from the journal) and those of
  // run 2 add up to the jobs, and run 2 completed exactly the jobs it replayed.
  BOOST_TEST(st2["journal_restored"] + st2["journal_results"] == kJobs);
  BOOST_TEST(st2["journal_results"] == st2["journal_replayed"]);
  // A duplicate can only be a result of run 1 delivered again after the restart.
  BOOST_TEST(twice <= static_cast<size_t>(st2["journal_redelivered"]));
  BOOST_TEST_MESSAGE("after restart: "
                     << st2["journal_replayed"] << " jobs re-run, " << st2["journal_restored"]
                     << " results restored, " << st2["journal_redelivered"]
                     << " results sent again; at the sink: " << seen.size() << " keys, " << twice
                     << " delivered twice (results of run 1 whose delivery the journal had not yet "
                        "marked when the server was killed: sent again because ZeroMQ gives no "
                        "receipt); whole run "
                     << secs << " s");
  BOOST_TEST(srv->stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_CASE(jobs_per_second_with_fsync_always_and_batch) {
  constexpr int kJobs = 300;
  double rate[2] = {0, 0};
  int64_t syncs[2] = {0, 0};
  const char* policies[2] = {"always", "batch"};
  for (int p = 0; p < 2; ++p) {
    sy::it::TempDir dir;
    std::string cfg = dir.write("d.yaml", kConfig);
    sy::it::ServerProcess srv({"--config", cfg, "--pull", "tcp://127.0.0.1:*", "--results",
                               "tcp://127.0.0.1:*", "--journal", dir.path() + "/j.journal",
                               "--journal-fsync", policies[p]});
    sy::client::Sink sink(srv.results_endpoint());
    auto t0 = std::chrono::steady_clock::now();
    push_all(srv.pull_endpoint(), kJobs);
    int got = 0;
    while (got < kJobs && sink.next(30s)) ++got;
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    BOOST_TEST(got == kJobs);
    rate[p] = got / secs;
    syncs[p] = srv.stats()["journal_syncs"];
    BOOST_TEST(srv.stop(SIGTERM) == 0);
  }
  // Always: one fdatasync per record (an accept and a result per job); batch: one per window.
  BOOST_TEST(syncs[0] >= 2 * kJobs);
  BOOST_TEST(syncs[1] < syncs[0]);
  BOOST_TEST_MESSAGE("jobs/s end to end (null backend, "
                     << kJobs << " jobs): fsync always " << rate[0] << " (" << syncs[0]
                     << " syncs), batch " << rate[1] << " (" << syncs[1] << " syncs)");
}

BOOST_AUTO_TEST_CASE(router_clients_resubmit_by_key_after_a_kill) {
  sy::it::TempDir dir;
  std::string cfg = dir.write("d.yaml", kConfig);
  const std::string journal = dir.path() + "/j.journal";
  auto srv = std::make_unique<sy::it::ServerProcess>(
      std::vector<std::string>{"--config", cfg, "--journal", journal, "--step-delay-ms", "20"});
  sy::wire::Submit quick = job(1), streamed = job(2), slow = job(3);
  quick.id = "quick";
  streamed.id = "streamed";
  streamed.stream = true;
  slow.id = "slow";
  slow.max_tokens = 200;  // 200 steps of 20 ms: still running when the server is killed
  sy::wire::Done quick_done;
  {
    sy::client::Client c(srv->endpoint());
    auto r = c.run(quick, 30s);
    BOOST_REQUIRE(r.ok());
    quick_done = *r.done;
    auto s = c.run(streamed, 30s);
    BOOST_REQUIRE(s.ok());
    BOOST_TEST(s.chunks.size() == kTokens);  // chunks pass through the journal actor unheld
    BOOST_TEST(s.ids.size() == kTokens);
    c.submit(slow);
    auto m = c.next(10s);
    BOOST_REQUIRE(m.has_value());
    BOOST_TEST(std::holds_alternative<sy::wire::Accepted>(*m));
  }
  BOOST_TEST(srv->stop(SIGKILL) == 128 + SIGKILL);
  srv = std::make_unique<sy::it::ServerProcess>(
      std::vector<std::string>{"--config", cfg, "--journal", journal});
  sy::client::Client c(srv->endpoint());
  // A finished key answers from the journal's results, without running again.
  auto again = c.run(quick, 30s);
  BOOST_REQUIRE(again.ok());
  BOOST_TEST(again.done->ids == quick_done.ids);
  BOOST_TEST(again.done->text == quick_done.text);
  // The job that was running: re-run from the journal; resubmitting its key attaches to it.
  auto resumed = c.run(slow, 60s);
  BOOST_REQUIRE_MESSAGE(resumed.ok(), (resumed.error ? resumed.error->message : "no answer")
                                          << (resumed.timed_out ? " (timed out)" : ""));
  BOOST_TEST(resumed.done->ids.size() == 200u);
  auto st = srv->stats();
  BOOST_TEST(st["journal_replayed"] == 1);
  BOOST_TEST(st["journal_results"] == 1);  // only "slow" ran in the second server
  BOOST_TEST(srv->stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_CASE(a_replayed_job_whose_deadline_passed_while_down_is_not_run) {
  sy::it::TempDir dir;
  std::string cfg = dir.write("d.yaml", kConfig);
  const std::string journal = dir.path() + "/j.journal";
  // 200 steps of 20 ms: neither job can finish before the kill.
  auto srv = std::make_unique<sy::it::ServerProcess>(
      std::vector<std::string>{"--config", cfg, "--pull", "tcp://127.0.0.1:*", "--results",
                               "tcp://127.0.0.1:*", "--journal", journal, "--step-delay-ms", "20"});
  const std::string pull = srv->pull_endpoint(), results = srv->results_endpoint();
  // Connected before the restart and reconnecting by itself, as a pipeline's sink is.
  sy::client::Sink sink(results);
  sy::wire::Submit open = job(1), due = job(2);
  open.id = "open";
  due.id = "due";
  open.max_tokens = due.max_tokens = 200;
  due.deadline_ms = 1500;  // passes while the server is down
  {
    sy::client::Pusher push(pull);
    push.socket().set(zmq::sockopt::linger, 30000);
    BOOST_REQUIRE(push.submit(open, 30s));
    BOOST_REQUIRE(push.submit(due, 30s));
  }
  auto st = wait_stats(*srv, [](auto& s) { return s["journal_accepted"] >= 2; });
  BOOST_REQUIRE(st["journal_accepted"] == 2);
  BOOST_TEST(srv->stop(SIGKILL) == 128 + SIGKILL);
  srv.reset();
  std::this_thread::sleep_for(2000ms);
  srv = std::make_unique<sy::it::ServerProcess>(std::vector<std::string>{
      "--config", cfg, "--pull", pull, "--results", results, "--journal", journal});
  std::map<std::string, std::string> outcome;  // id -> "done" or the error code
  while (outcome.size() < 2) {
    auto m = sink.next(30s);
    BOOST_REQUIRE(m.has_value());
    if (auto* d = std::get_if<sy::wire::Done>(&*m))
      outcome[d->id] = "done";
    else if (auto* e = std::get_if<sy::wire::Error>(&*m))
      outcome[e->id] = std::string(to_string(e->code));
  }
  BOOST_TEST(outcome["open"] == "done");
  BOOST_TEST(outcome["due"] == "deadline_exceeded");
  auto st2 = srv->stats();
  BOOST_TEST(st2["journal_replayed"] == 2);
  BOOST_TEST(srv->stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_durability
