// Job keys that are not UTF-8, against the real server: a submit, cancel or status whose `id` or
// `tenant` is malformed UTF-8 is refused with bad_request on the request endpoint and on the
// pipeline, the reply carries none of those bytes, nothing runs, and valid jobs around it do.
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <string>

#include "clients/cpp/client.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_utf8_keys)

using namespace std::chrono_literals;

namespace {

sy::wire::Submit job(const std::string& id, const std::string& tenant) {
  sy::wire::Submit s;
  s.id = id;
  s.tenant = tenant;
  s.prompt = std::vector<int32_t>{1, 2};
  s.max_tokens = 2;
  s.ignore_eos = true;
  return s;
}

bool ascii_only(const std::string& s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

// The next error or done on `next`, skipping `accepted` (a generous 30 s: the null backend
// answers in milliseconds).
template <class Next>
std::optional<sy::wire::ServerMessage> terminal(Next&& next) {
  while (auto m = next(30s)) {
    if (std::holds_alternative<sy::wire::Error>(*m) || std::holds_alternative<sy::wire::Done>(*m))
      return m;
  }
  return std::nullopt;
}

}  // namespace

BOOST_AUTO_TEST_CASE(malformed_keys_are_refused_on_both_endpoints) {
  sy::it::ServerProcess srv({"--backend", "null", "--no-journal", "--pull", "tcp://127.0.0.1:*",
                             "--results", "tcp://127.0.0.1:*"});
  sy::client::Client cl(srv.endpoint());
  auto next = [&](std::chrono::milliseconds t) { return cl.next(t); };

  struct Case {
    sy::wire::ClientMessage msg;
    std::string field;
  };
  const std::vector<Case> cases = {
      {job("ab\xff", "acme"), "id"},
      {job("j1", "acm\xed\xa0\x80"), "tenant"},  // a surrogate
      {sy::wire::Cancel{"\xc0\xaf", "acme", ""}, "id"},
      {sy::wire::Status{"j1", "\xf4\x90\x80\x80", ""}, "tenant"},
  };
  for (const auto& c : cases) {
    cl.send(c.msg);
    auto m = terminal(next);
    BOOST_REQUIRE(m);
    const auto* e = std::get_if<sy::wire::Error>(&*m);
    BOOST_REQUIRE(e);
    BOOST_TEST_CONTEXT(e->message) {
      BOOST_TEST((e->code == sy::ErrorCode::bad_request));
      BOOST_TEST(e->message.rfind("field '" + c.field + "' is not valid UTF-8", 0) == 0u);
      BOOST_TEST(ascii_only(e->message));
      BOOST_TEST(ascii_only(e->id));
      BOOST_TEST(ascii_only(e->tenant));
    }
  }
  // A valid key with multibyte characters still runs.
  cl.submit(job("j\xc3\xb6", "\xe6\x97\xa5"));
  auto ok = terminal(next);
  BOOST_REQUIRE(ok);
  BOOST_TEST(std::holds_alternative<sy::wire::Done>(*ok));

  // The pipeline: the refusal reaches the shared sink without the malformed bytes, and the
  // valid job pushed after it is answered too.
  sy::client::Sink sink(srv.results_endpoint());
  sy::client::Pusher push(srv.pull_endpoint());
  BOOST_REQUIRE(push.submit(job("p\x80", "pipe"), 10s));
  BOOST_REQUIRE(push.submit(job("p2", "pipe"), 10s));
  auto snext = [&](std::chrono::milliseconds t) { return sink.next(t); };
  auto first = terminal(snext);
  BOOST_REQUIRE(first);
  const auto* e = std::get_if<sy::wire::Error>(&*first);
  BOOST_REQUIRE(e);
  BOOST_TEST((e->code == sy::ErrorCode::bad_request));
  BOOST_TEST(e->id.empty());
  BOOST_TEST(e->tenant == "pipe");
  BOOST_TEST(ascii_only(e->message));
  auto second = terminal(snext);
  BOOST_REQUIRE(second);
  const auto* d = std::get_if<sy::wire::Done>(&*second);
  BOOST_REQUIRE(d);
  BOOST_TEST(d->id == "p2");
  BOOST_TEST(srv.stats().at("admitted") == 2);  // j\xc3\xb6 and p2 only
  BOOST_TEST(srv.stop() == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_utf8_keys
