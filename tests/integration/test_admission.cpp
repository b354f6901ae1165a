// Admission and QoS through the real server with a YAML config: tenants and tokens from the file,
// strict priority between classes, and a resubmitted job key never running twice.
#include <boost/test/unit_test.hpp>

#include "clients/cpp/client.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_admission)

using namespace std::chrono_literals;

namespace {

sy::wire::Submit job(const std::string& id, const std::string& tenant, const std::string& token,
                     const std::string& priority, uint32_t n) {
  sy::wire::Submit s;
  s.id = id;
  s.tenant = tenant;
  s.token = token;
  s.priority = priority;
  s.prompt = std::vector<int32_t>{1, 2, 3};
  s.max_tokens = n;
  s.ignore_eos = true;
  return s;
}

// One running sequence at a time, 20 ms per step (TEST ONLY flag): queues form.
const char* kConfig = R"(
admission:
  tenants:
    - {name: acme, token: s3cret, weight: 3}
    - {name: open}
router:
  default_class: batch
batching:
  max_sequences: 1
executors:
  backend: "null"
)";

}  // namespace

BOOST_AUTO_TEST_CASE(tenants_from_the_file_are_checked) {
  sy::it::TempDir dir;
  sy::it::ServerProcess srv({"--config", dir.write("a.yaml", kConfig)});
  sy::client::Client cl(srv.endpoint());
  auto r = cl.run(job("1", "acme", "wrong", "", 2), 10s);
  BOOST_REQUIRE(r.error.has_value());
  BOOST_TEST(sy::to_string(r.error->code) == "unauthorized");
  r = cl.run(job("2", "nobody", "", "", 2), 10s);
  BOOST_REQUIRE(r.error.has_value());
  BOOST_TEST(sy::to_string(r.error->code) == "unauthorized");
  r = cl.run(job("3", "acme", "s3cret", "", 2), 10s);
  BOOST_TEST(r.ok());
  r = cl.run(job("4", "open", "", "", 2), 10s);
  BOOST_TEST(r.ok());
  r = cl.run(job("5", "open", "", "no-such-class", 2), 10s);
  BOOST_REQUIRE(r.error.has_value());
  BOOST_TEST(sy::to_string(r.error->code) == "bad_request");
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_CASE(interactive_overtakes_queued_batch_work) {
  sy::it::TempDir dir;
  sy::it::ServerProcess srv({"--config", dir.write("a.yaml", kConfig), "--step-delay-ms", "20"});
  sy::client::Client cl(srv.endpoint());
  // One batch job runs (max_sequences 1), three more wait in the batch class (the default).
  auto first = job("b0", "open", "", "", 20);
  first.stream = true;
  cl.submit(first);
  for (int i = 0; i < 100; ++i) {
    auto m = cl.next(1s);
    if (m && std::holds_alternative<sy::wire::Tokens>(*m)) break;
  }
  for (int i = 1; i <= 3; ++i) cl.submit(job("b" + std::to_string(i), "open", "", "", 5));
  cl.submit(job("i0", "open", "", "interactive", 5));
  std::vector<std::string> order;
  while (order.size() < 5) {
    auto m = cl.next(30s);
    BOOST_REQUIRE(m);
    if (auto* d = std::get_if<sy::wire::Done>(&*m)) order.push_back(d->id);
    BOOST_REQUIRE(!std::holds_alternative<sy::wire::Error>(*m));
  }
  // The running job finishes first; then the interactive one, ahead of the older batch jobs.
  BOOST_TEST(order[0] == "b0");
  BOOST_TEST(order[1] == "i0");
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_CASE(resubmitted_key_never_runs_twice) {
  sy::it::TempDir dir;
  sy::it::ServerProcess srv({"--config", dir.write("a.yaml", kConfig)});
  sy::client::Client cl(srv.endpoint());
  auto r1 = cl.run(job("same", "acme", "s3cret", "", 6), 10s);
  BOOST_REQUIRE(r1.ok());
  auto before = srv.stats();
  auto r2 = cl.run(job("same", "acme", "s3cret", "", 6), 10s);
  BOOST_REQUIRE(r2.ok());
  BOOST_TEST(r2.ids == r1.ids, boost::test_tools::per_element());
  auto after = srv.stats();
  BOOST_TEST(after["dispatched"] == before["dispatched"]);  // the stored result, not a new run
  // The same id under another tenant is another job.
  auto r3 = cl.run(job("same", "open", "", "", 6), 10s);
  BOOST_TEST(r3.ok());
  BOOST_TEST(srv.stats()["dispatched"] == before["dispatched"] + 1);
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_admission
