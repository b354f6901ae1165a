// Must-show 7 (deadlines): a job with deadline_ms = 50 behind a long queue gets
// `deadline_exceeded` and is never prefilled: no chunk of it ever streams and the router never
// dispatches it to a batcher (dispatched counts only the other jobs).
#include <boost/test/unit_test.hpp>
#include <map>

#include "clients/cpp/client.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_deadline)

using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(deadline_behind_a_long_queue) {
  sy::it::TempDir dir;
  // One sequence at a time and 20 ms per step (TEST ONLY flag): the queue ahead of the deadline
  // job takes seconds to drain, far beyond its 50 ms.
  std::string cfg = dir.write("d.yaml", "batching:\n  max_sequences: 1\n");
  sy::it::ServerProcess srv(
      {"--config", cfg, "--model", sy::it::kStories, "--threads", "1", "--step-delay-ms", "20"});
  sy::client::Client cl(srv.endpoint());
  auto job = [](const std::string& id, uint32_t n) {
    sy::wire::Submit s;
    s.id = id;
    s.tenant = "t";
    s.prompt = "Once upon a time";
    s.max_tokens = n;
    s.ignore_eos = true;
    s.stream = true;
    return s;
  };
  cl.submit(job("long", 60));
  for (int i = 0; i < 3; ++i) cl.submit(job("q" + std::to_string(i), 10));
  auto d = job("late", 10);
  d.prompt = "The cat";
  d.deadline_ms = 50;
  cl.submit(d);

  std::map<std::string, sy::wire::Done> dones;
  std::map<std::string, sy::wire::Error> errors;
  std::map<std::string, int> chunks;
  while (dones.size() + errors.size() < 5) {
    auto m = cl.next(30s);
    BOOST_REQUIRE_MESSAGE(m, "silence with " << 5 - dones.size() - errors.size() << " jobs open");
    if (auto* t = std::get_if<sy::wire::Tokens>(&*m)) ++chunks[t->id];
    if (auto* x = std::get_if<sy::wire::Done>(&*m)) dones[x->id] = *x;
    if (auto* e = std::get_if<sy::wire::Error>(&*m)) errors[e->id] = *e;
  }
  BOOST_REQUIRE(errors.count("late") == 1u);
  BOOST_TEST(sy::to_string(errors["late"].code) == "deadline_exceeded");
  BOOST_TEST_MESSAGE("late: " << errors["late"].message);
  BOOST_TEST(chunks["late"] == 0);
  BOOST_TEST(dones.count("late") == 0u);
  BOOST_TEST(dones.size() == 4u);
  for (auto& [id, x] : dones) BOOST_TEST(sy::wire::to_string(x.finish_reason) == "length", id);
  auto st = srv.stats();
  BOOST_TEST(st["expired"] == 1);
  BOOST_TEST(st["dispatched"] == 4);  // long, q0..q2: never the late one
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_deadline
