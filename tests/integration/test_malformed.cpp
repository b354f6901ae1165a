// Must-show 4: malformed input over a real socket — random bytes, truncated msgpack, a 4 GiB array
// header, nesting depth 1000, wrong field types, an oversized frame — each gets its error (the
// oversized frame: a disconnect), the server stays up, and the next valid job succeeds.
#include <boost/test/unit_test.hpp>
#include <random>

#include "clients/cpp/client.hpp"
#include "ingress/codec.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_malformed)

using namespace std::chrono_literals;

namespace {

sy::wire::Submit valid(const std::string& id) {
  sy::wire::Submit s;
  s.id = id;
  s.tenant = "t";
  s.prompt = "Once upon a time";
  s.max_tokens = 8;
  s.temperature = 0;
  return s;
}

// Sends raw bytes and returns the error they earn (fails the test on anything else).
sy::wire::Error error_for(sy::client::Client& cl, const std::string& bytes,
                          const std::string& what) {
  cl.send_raw(bytes.data(), bytes.size());
  auto m = cl.next(10s);
  BOOST_REQUIRE_MESSAGE(m, what << ": no reply");
  auto* e = std::get_if<sy::wire::Error>(&*m);
  BOOST_REQUIRE_MESSAGE(e, what << ": not an error: " << sy::client::describe(*m));
  BOOST_TEST_MESSAGE(what << " -> " << sy::to_string(e->code) << ": " << e->message);
  return *e;
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A valid job completes: the server is still up and serving.
void check_alive(sy::client::Client& cl, const std::string& id) {
  auto r = cl.run(valid(id), 30s);
  BOOST_REQUIRE_MESSAGE(r.ok(),
                        id << ": " << (r.error ? r.error->message : std::string("no done")));
  BOOST_TEST(r.ids.size() == 8u);
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_malformed_message_gets_its_error_and_the_server_stays_up) {
  sy::it::ServerProcess srv({"--model", sy::it::kStories, "--threads", "1"});
  sy::client::Client cl(srv.endpoint());
  check_alive(cl, "before");

  // Random bytes: 50 frames of 1..200 bytes; each must get a bad_request error and nothing else.
  std::mt19937 rng(1234);
  for (int i = 0; i < 50; ++i) {
    std::string b(1 + rng() % 200, '\0');
    for (auto& c : b) c = static_cast<char>(rng());
    // A random frame could by chance be a valid message; a fixmap prefix 0x80|n would be read
    // as a map, so the first byte is forced to something that is not a map (0xc1 is never
    // valid msgpack).
    b[0] = static_cast<char>(0xc1);
    auto e = error_for(cl, b, "random bytes " + std::to_string(i));
    BOOST_TEST(sy::to_string(e.code) == "bad_request");
  }

  // Truncated msgpack: a valid submit cut in half.
  std::string full = sy::wire::encode_client(valid("trunc"));
  auto e = error_for(cl, full.substr(0, full.size() / 2), "truncated");
  BOOST_TEST(sy::to_string(e.code) == "bad_request");
  BOOST_TEST(has(e.message, "bad msgpack"), e.message);

  // A 4 GiB array header (array32 of 0xffffffff elements) with nothing behind it.
  e = error_for(cl, std::string("\xdd\xff\xff\xff\xff", 5), "4 GiB array header");
  BOOST_TEST(sy::to_string(e.code) == "bad_request");
  BOOST_TEST(has(e.message, "bad msgpack"), e.message);

  // The same header as the prompt of an otherwise well-formed map.
  {
    std::string m = std::string("\x83\xa1v\x01\xa4type\xa6submit\xa6prompt") +
                    std::string("\xdd\xff\xff\xff\xff", 5);
    e = error_for(cl, m, "4 GiB prompt array");
    BOOST_TEST(sy::to_string(e.code) == "bad_request");
  }

  // Nesting depth 1000: 1000 one-element arrays around a nil.
  e = error_for(cl, std::string(1000, '\x91') + "\xc0", "depth 1000");
  BOOST_TEST(sy::to_string(e.code) == "bad_request");
  BOOST_TEST(has(e.message, "nesting"), e.message);

  // Wrong field types: max_tokens as a string, prompt as a map, stream as an int.
  {
    // {"v":1,"type":"submit","id":"w1","tenant":"t","prompt":"Hi","max_tokens":"8"}
    std::string m = std::string("\x86\xa1v\x01\xa4type\xa6submit\xa2id\xa2w1\xa6tenant\xa1t") +
                    "\xa6prompt\xa2Hi\xaamax_tokens\xa1"
                    "8";
    e = error_for(cl, m, "max_tokens as string");
    BOOST_TEST(sy::to_string(e.code) == "bad_request");
    BOOST_TEST(has(e.message, "max_tokens"), e.message);
    BOOST_TEST(e.id == "w1");
  }
  {
    std::string m = std::string("\x85\xa1v\x01\xa4type\xa6submit\xa2id\xa2w2\xa6tenant\xa1t") +
                    "\xa6prompt\x80";
    e = error_for(cl, m, "prompt as map");
    BOOST_TEST(sy::to_string(e.code) == "bad_request");
    BOOST_TEST(has(e.message, "prompt"), e.message);
  }
  {
    std::string m = std::string("\x86\xa1v\x01\xa4type\xa6submit\xa2id\xa2w3\xa6tenant\xa1t") +
                    "\xa6prompt\xa2Hi\xa6stream\x05";
    e = error_for(cl, m, "stream as int");
    BOOST_TEST(sy::to_string(e.code) == "bad_request");
    BOOST_TEST(has(e.message, "stream"), e.message);
  }
  // Missing field, a value out of range and a prompt longer than the context (stories260K: 2048).
  {
    auto s = valid("range");
    s.max_tokens = 0;
    e = error_for(cl, sy::wire::encode_client(s), "max_tokens 0");
    BOOST_TEST(sy::to_string(e.code) == "bad_request");
    s = valid("long");
    std::vector<int32_t> ids(3000, 300);
    s.prompt = ids;
    e = error_for(cl, sy::wire::encode_client(s), "prompt of 3000 ids");
    BOOST_TEST(sy::to_string(e.code) == "bad_request");
    BOOST_TEST(has(e.message, "prompt has 3000 tokens"), e.message);
  }
  check_alive(cl, "after-errors");

  // An oversized frame (2 MiB > the 1 MiB ZMQ_MAXMSGSIZE): ZeroMQ drops the connection, so no
  // reply comes on it. The DEALER reconnects by itself; a fresh client works too.
  {
    sy::client::Client big(srv.endpoint());
    BOOST_REQUIRE(big.ping_wait(10s));
    std::string huge(2u << 20, 'x');
    big.send_raw(huge.data(), huge.size());
    auto m = big.next(2s);
    BOOST_TEST(!m.has_value(),
               "a reply to an oversized frame: " << (m ? sy::client::describe(*m) : ""));
  }
  BOOST_TEST(srv.alive());
  sy::client::Client fresh(srv.endpoint());
  check_alive(fresh, "after-oversized");
  check_alive(cl, "old-client-after-oversized");
  auto st = srv.stats();
  BOOST_TEST(st["decode_errors"] >= 57);
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_malformed
