// A client that vanishes mid-stream: the server's next chunk to it cannot be delivered
// (ZMQ_ROUTER_MANDATORY), so the job is cancelled and its KV blocks come back; other clients
// are not disturbed.
#include <boost/test/unit_test.hpp>
#include <memory>

#include "clients/cpp/client.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_disconnect)

using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(vanished_client_cancels_its_job) {
  // 10 ms per step (TEST ONLY flag): the 2000-token job would run 20 s if nobody stopped it.
  sy::it::ServerProcess srv(
      {"--model", sy::it::kStories, "--threads", "1", "--step-delay-ms", "10"});
  {
    auto gone = std::make_unique<sy::client::Client>(srv.endpoint());
    sy::wire::Submit s;
    s.id = "orphan";
    s.tenant = "t";
    s.prompt = "Once upon a time";
    s.max_tokens = 2000;
    s.ignore_eos = true;
    s.stream = true;
    gone->submit(s);
    bool streaming = false;
    for (int i = 0; i < 100 && !streaming; ++i) {
      auto m = gone->next(1s);
      streaming = m && std::holds_alternative<sy::wire::Tokens>(*m);
    }
    BOOST_REQUIRE(streaming);
    gone.reset();  // the socket closes (linger 0): the peer is gone from the ROUTER's view
  }
  // The job must end long before its 20 s: poll the counters (bounded wait, no timing claim).
  std::map<std::string, int64_t> st;
  for (int i = 0; i < 80; ++i) {
    st = srv.stats();
    if (st["active_jobs"] == 0) break;
    std::this_thread::sleep_for(100ms);
  }
  BOOST_TEST(st["active_jobs"] == 0);
  BOOST_TEST(st["running"] == 0);
  BOOST_TEST(st["blocks_used"] == 0);

  // Another client is served normally.
  sy::client::Client cl(srv.endpoint());
  sy::wire::Submit s;
  s.id = "next";
  s.tenant = "t";
  s.prompt = "The cat";
  s.max_tokens = 8;
  s.temperature = 0;
  auto r = cl.run(s, 30s);
  BOOST_REQUIRE(r.ok());
  BOOST_TEST(r.ids == (std::vector<int32_t>{269, 261, 268, 414, 422, 382, 276, 337}),
             boost::test_tools::per_element());
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_disconnect
