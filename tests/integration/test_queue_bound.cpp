// Must-show 2 (the queue bound, as Triton tests it): queue limit 8, the executor slowed by the
// TEST ONLY --step-delay-ms flag, 8 + 10 submissions -> exactly 2 `overloaded` replies with
// retry_after_ms; the other 16 complete.
//
// Why exactly 2: the batcher grants the router credit for max_sequences = 8 jobs at start, and
// gives credit back only when a job ends. The first 8 submissions are therefore dispatched at once
// and run (we wait for a streamed chunk of each, so they are surely out of the queue). Each then
// needs 40 steps of >= 50 ms, so none ends — and no credit returns — while the next 10 arrive
// within milliseconds: the first 8 of those fill the class queue (limit 8), the last 2 find it full.
#include <boost/test/unit_test.hpp>
#include <set>

#include "clients/cpp/client.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_queue_bound)

using namespace std::chrono_literals;

namespace {

sy::wire::Submit job(int i) {
  sy::wire::Submit s;
  s.id = "q" + std::to_string(i);
  s.tenant = "t";
  s.prompt = std::vector<int32_t>{1, 2, 3};
  s.max_tokens = 40;
  s.ignore_eos = true;
  s.stream = true;
  return s;
}

}  // namespace

BOOST_AUTO_TEST_CASE(eight_plus_ten_gives_exactly_two_overloaded) {
  sy::it::TempDir dir;
  std::string cfg = dir.write("q.yaml", R"(
router:
  classes:
    - {name: only, rank: 0, queue_limit: 8}
batching:
  max_sequences: 8
executors:
  backend: "null"
)");
  sy::it::ServerProcess srv({"--config", cfg, "--step-delay-ms", "50"});
  sy::client::Client cl(srv.endpoint());

  // 8 jobs that occupy the batcher: wait until each has streamed its first chunk.
  for (int i = 0; i < 8; ++i) cl.submit(job(i));
  std::set<std::string> started;
  std::vector<sy::wire::ServerMessage> seen;
  while (started.size() < 8) {
    auto m = cl.next(20s);
    BOOST_REQUIRE_MESSAGE(m, "the first 8 jobs did not start");
    if (auto* t = std::get_if<sy::wire::Tokens>(&*m)) started.insert(t->id);
    BOOST_REQUIRE(!std::holds_alternative<sy::wire::Error>(*m));
    BOOST_REQUIRE(!std::holds_alternative<sy::wire::Done>(*m));
  }
  // 10 more, back to back.
  for (int i = 8; i < 18; ++i) cl.submit(job(i));

  std::map<std::string, sy::wire::Error> errors;
  std::map<std::string, sy::wire::Done> dones;
  std::map<std::string, uint32_t> streamed;
  while (errors.size() + dones.size() < 18) {
    auto m = cl.next(30s);
    BOOST_REQUIRE_MESSAGE(m, "silence with " << 18 - errors.size() - dones.size() << " jobs open");
    if (auto* e = std::get_if<sy::wire::Error>(&*m)) errors[e->id] = *e;
    if (auto* d = std::get_if<sy::wire::Done>(&*m)) dones[d->id] = *d;
  }
  BOOST_TEST(errors.size() == 2u);
  for (auto& [id, e] : errors) {
    BOOST_TEST_CONTEXT(id << ": " << e.message) {
      BOOST_TEST(sy::to_string(e.code) == "overloaded");
      BOOST_TEST(e.retry_after_ms.has_value());
      BOOST_TEST(e.retry_after_ms.value_or(0) > 0u);
    }
  }
  // The refused ones are the last two sent.
  BOOST_TEST(errors.count("q16") == 1u);
  BOOST_TEST(errors.count("q17") == 1u);
  BOOST_TEST(dones.size() == 16u);
  for (auto& [id, d] : dones) {
    BOOST_TEST_CONTEXT(id) {
      BOOST_TEST(d.usage.completion_tokens == 40u);
      BOOST_TEST(sy::wire::to_string(d.finish_reason) == "length");
    }
  }
  auto st = srv.stats();
  BOOST_TEST(st["overloaded"] == 2);
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_queue_bound
