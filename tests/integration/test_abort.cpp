// Must-show 3 (abort, as vLLM tests it): 21 streamed jobs of 200 tokens on stories260K, one
// cancelled after its first chunk; the other 20 finish with exactly 200 tokens, the cancelled one
// ends with finish_reason "cancelled" well before 200, and its KV blocks are back in the pool.
#include <boost/test/unit_test.hpp>
#include <map>

#include "clients/cpp/client.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_abort)

using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(cancel_one_of_21_streams) {
  // 2 ms per step (TEST ONLY flag) keeps the 200 steps long enough that the cancel surely
  // lands mid-stream.
  sy::it::ServerProcess srv(
      {"--model", sy::it::kStories, "--threads", "1", "--step-delay-ms", "2"});
  sy::client::Client cl(srv.endpoint());
  const std::string victim = "a10";
  for (int i = 0; i < 21; ++i) {
    sy::wire::Submit s;
    s.id = "a" + std::to_string(i);
    s.tenant = "t";
    s.prompt = "Once upon a time";
    s.max_tokens = 200;
    s.ignore_eos = true;
    s.stream = true;
    s.seed = static_cast<uint64_t>(i);
    cl.submit(s);
  }
  std::map<std::string, uint32_t> tokens;  // streamed ids per job
  std::map<std::string, sy::wire::Done> dones;
  std::map<std::string, sy::wire::Error> errors;
  bool cancel_sent = false;
  while (dones.size() + errors.size() < 21) {
    auto m = cl.next(30s);
    BOOST_REQUIRE_MESSAGE(m, "silence with " << 21 - dones.size() - errors.size() << " jobs open");
    if (auto* t = std::get_if<sy::wire::Tokens>(&*m)) {
      BOOST_TEST(t->index == tokens[t->id]);  // contiguous chunks
      tokens[t->id] += static_cast<uint32_t>(t->ids.size());
      if (t->id == victim && !cancel_sent) {
        cl.cancel(victim, "t");
        cancel_sent = true;
      }
    } else if (auto* d = std::get_if<sy::wire::Done>(&*m)) {
      dones[d->id] = *d;
    } else if (auto* e = std::get_if<sy::wire::Error>(&*m)) {
      errors[e->id] = *e;
    }
  }
  BOOST_TEST(errors.empty());
  BOOST_REQUIRE(dones.count(victim) == 1u);
  BOOST_TEST(sy::wire::to_string(dones[victim].finish_reason) == "cancelled");
  BOOST_TEST(tokens[victim] < 200u);
  BOOST_TEST(dones[victim].usage.completion_tokens == tokens[victim]);
  BOOST_TEST_MESSAGE("the cancelled job streamed " << tokens[victim] << " tokens");
  for (auto& [id, d] : dones) {
    if (id == victim) continue;
    BOOST_TEST_CONTEXT(id) {
      BOOST_TEST(sy::wire::to_string(d.finish_reason) == "length");
      BOOST_TEST(d.usage.completion_tokens == 200u);
      BOOST_TEST(tokens[id] == 200u);
    }
  }
  BOOST_TEST(dones.size() == 21u);
  // Every job has ended: a pool with any block still held would mean the cancelled job's (or
  // another's) blocks never came back.
  auto st = srv.stats();
  BOOST_TEST(st["blocks_total"] > 0);
  BOOST_TEST(st["blocks_used"] == 0);
  BOOST_TEST(st["running"] == 0);
  BOOST_TEST(st["active_jobs"] == 0);
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_abort
