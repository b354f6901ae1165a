// Must-show 2: with 100 greedy jobs in flight, an executor that throws (TEST ONLY flag) and,
// separately, one that hangs (caught by the step watchdog) are replaced; all 100 jobs complete
// exactly once with llama.cpp's reference output, streamed ones without a repeated chunk.
// Also a batcher that itself throws: the router runs its jobs again (streamed ones in flight end
// with engine_dead, since their text cannot be resumed), and nothing is lost.
#include <boost/test/unit_test.hpp>
#include <map>
#include <string>
#include <vector>

#include "clients/cpp/client.hpp"
#include "tests/integration/server_process.hpp"
#include "tests/support/reference.hpp"

BOOST_AUTO_TEST_SUITE(test_crash)

using namespace std::chrono_literals;

namespace {

constexpr int kJobs = 100;

struct Seen {
  int dones = 0, errors = 0;
  std::vector<int32_t> streamed;
  bool contiguous = true;
  sy::wire::Done done;
  std::string error;
};

enum class Fault { executor, batcher };

void run_with_fault(const std::vector<std::string>& fault, const char* what,
                    Fault kind = Fault::executor) {
  const auto cases = sy::test::reference_cases(32);
  BOOST_REQUIRE(!cases.empty());
  std::vector<std::string> args = {"--model", sy::it::kStories, "--threads", "1"};
  args.insert(args.end(), fault.begin(), fault.end());
  sy::it::ServerProcess srv(args);
  sy::client::Client cl(srv.endpoint());
  BOOST_REQUIRE(cl.ping_wait(10s));

  std::map<std::string, const sy::test::ReferenceCase*> expect;
  std::map<std::string, bool> streamed;
  for (int i = 0; i < kJobs; ++i) {
    const auto& c = cases[static_cast<size_t>(i) % cases.size()];
    sy::wire::Submit s;
    s.id = "job" + std::to_string(i);
    s.tenant = "t";
    s.prompt = c.prompt_token_ids;
    s.max_tokens = 32;
    s.temperature = 0;
    // Half streamed for an executor fault (no chunk may repeat); a tenth for a batcher fault
    // (those in flight end with engine_dead, so most jobs must run again to show recovery).
    s.stream = kind == Fault::executor ? i % 2 == 0 : i % 10 == 0;
    expect[s.id] = &c;
    streamed[s.id] = s.stream;
    cl.submit(s);
  }
  std::map<std::string, Seen> seen;
  size_t ended = 0;
  // 60 s of silence means a job was lost (the hang is detected within the watchdog's 500 ms).
  while (ended < static_cast<size_t>(kJobs)) {
    auto m = cl.next(60s);
    BOOST_REQUIRE_MESSAGE(m.has_value(), "silence with " << ended << " of " << kJobs << " ended");
    if (auto* t = std::get_if<sy::wire::Tokens>(&*m)) {
      Seen& s = seen[t->id];
      if (t->index != s.streamed.size()) s.contiguous = false;
      s.streamed.insert(s.streamed.end(), t->ids.begin(), t->ids.end());
    } else if (auto* d = std::get_if<sy::wire::Done>(&*m)) {
      Seen& s = seen[d->id];
      if (++s.dones == 1 && s.errors == 0) ++ended;
      s.done = *d;
    } else if (auto* e = std::get_if<sy::wire::Error>(&*m)) {
      Seen& s = seen[e->id];
      if (++s.errors == 1 && s.dones == 0) ++ended;
      s.error = e->message;
    }
  }
  // Anything late (a duplicate) would arrive now.
  while (auto m = cl.next(300ms)) {
    if (auto* d = std::get_if<sy::wire::Done>(&*m)) ++seen[d->id].dones;
    if (auto* t = std::get_if<sy::wire::Tokens>(&*m)) {
      seen[t->id].contiguous = false;  // a chunk after done
    }
  }
  int exact = 0, dead = 0;
  for (const auto& [id, c] : expect) {
    BOOST_TEST_CONTEXT(what << " " << id) {
      const Seen& s = seen[id];
      if (kind == Fault::batcher && streamed[id] && s.errors > 0) {
        // In flight when its batcher died: ended once, with engine_dead, and no done.
        BOOST_TEST(s.errors == 1);
        BOOST_TEST(s.dones == 0);
        BOOST_TEST(s.error.find("cannot be resumed") != std::string::npos, s.error);
        ++dead;
        continue;
      }
      BOOST_TEST(s.dones == 1);
      BOOST_TEST(s.errors == 0, s.error);
      const auto& ids = streamed[id] ? s.streamed : s.done.ids;
      BOOST_TEST(ids == c->generated_token_ids, boost::test_tools::per_element());
      if (streamed[id]) BOOST_TEST(s.contiguous);
      exact += s.dones == 1 && s.errors == 0 && ids == c->generated_token_ids;
    }
  }
  auto st = srv.stats();
  BOOST_TEST(st["executor_failures"] == 1);
  BOOST_TEST(st["executors"] == 1);
  if (kind == Fault::batcher) {
    BOOST_TEST(st["lost_requeued"] > 0);
    BOOST_TEST(st["lost_failed"] == dead);
    BOOST_TEST(exact + dead == kJobs);
    BOOST_TEST_MESSAGE(what << ": " << exact << "/" << kJobs << " exact, " << st["lost_requeued"]
                            << " re-queued by the router, " << dead
                            << " streamed jobs ended with engine_dead");
    BOOST_TEST(srv.stop(SIGTERM) == 0);
    return;
  }
  BOOST_TEST(st["recoveries"] == 1);
  BOOST_TEST(st["requeued"] > 0);
  BOOST_TEST_MESSAGE(what << ": " << exact << "/" << kJobs << " exact, " << st["requeued"]
                          << " re-queued, recovery (fault -> first re-queued job running) "
                          << st["recovery_ms_last"] << " ms");
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

}  // namespace

BOOST_AUTO_TEST_CASE(throwing_executor) {
  run_with_fault({"--test-fault-executor-throw-after", "12"}, "throw");
}

BOOST_AUTO_TEST_CASE(hung_executor) {
  run_with_fault({"--test-fault-executor-hang-after", "12", "--step-timeout-ms", "500"}, "hang");
}

BOOST_AUTO_TEST_CASE(throwing_batcher) {
  run_with_fault({"--test-fault-batcher-throw-after", "12"}, "batcher throw", Fault::batcher);
}

BOOST_AUTO_TEST_SUITE_END()  // test_crash
