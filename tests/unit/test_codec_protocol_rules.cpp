// Codec rules of docs/protocol.md that replies must follow: every job reply names its tenant, a
// non-streamed done carries the logprobs, client text is echoed one way only (wire::quoted), and
// the byte dumps of those messages in the document.
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "ingress/codec.hpp"

BOOST_AUTO_TEST_SUITE(test_codec_protocol_rules)

using namespace sy::wire;

namespace {

std::string hex(const std::string& b) {
  std::string out;
  char buf[4];
  for (unsigned char c : b) {
    std::snprintf(buf, sizeof buf, "%02x", c);
    out += buf;
  }
  return out;
}

ServerMessage round_trip(const ServerMessage& m) {
  const std::string b = encode_server(m);
  auto r = decode_server(b.data(), b.size());
  if (auto* e = std::get_if<DecodeError>(&r)) BOOST_FAIL("decode failed: " + e->message);
  return std::get<ServerMessage>(r);
}

bool has_key(const std::string& bytes, const std::string& key) {
  // A fixstr key: its header byte, then the bytes.
  const std::string k = std::string(1, static_cast<char>(0xa0 | key.size())) + key;
  return bytes.find(k) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_CASE(job_replies_carry_their_tenant) {
  const Accepted a{"j1", 3, "acme"};
  BOOST_TEST(has_key(encode_server(a), "tenant"));
  BOOST_TEST((std::get<Accepted>(round_trip(a)) == a));

  Tokens t;
  t.id = "j2";
  t.tenant = "beta";
  t.index = 4;
  t.ids = {9};
  t.text = "x";
  BOOST_TEST(has_key(encode_server(t), "tenant"));
  BOOST_TEST((std::get<Tokens>(round_trip(t)) == t));

  const StatusReply s{"j3", JobState::running, 0, 12, "gamma"};
  BOOST_TEST(has_key(encode_server(s), "tenant"));
  BOOST_TEST((std::get<StatusReply>(round_trip(s)) == s));

  // Left out when empty, like every optional field at its default; older replies still decode.
  BOOST_TEST(!has_key(encode_server(Accepted{"j1", 3}), "tenant"));
  BOOST_TEST(std::get<Accepted>(round_trip(Accepted{"j1", 3})).tenant.empty());
}

BOOST_AUTO_TEST_CASE(done_carries_logprobs_when_it_has_them) {
  Done d;
  d.id = "j4";
  d.tenant = "acme";
  d.finish_reason = FinishReason::length;
  d.text = " the";
  d.ids = {727, 11};
  d.usage = {2, 2};
  d.logprobs = {TokenLogprobs{-0.25f, {{727, -0.25f}, {11, -1.5f}}},
                TokenLogprobs{-0.75f, {{9, -0.5f}, {11, -0.75f}}}};
  const std::string b = encode_server(d);
  BOOST_TEST(has_key(b, "logprobs"));
  const Done back = std::get<Done>(round_trip(d));
  BOOST_TEST((back == d));
  BOOST_REQUIRE(back.logprobs.size() == 2u);
  BOOST_TEST(back.logprobs[0].top[1].id == 11);
  BOOST_TEST(back.logprobs[0].top[1].logprob == -1.5f);

  d.logprobs.clear();
  BOOST_TEST(!has_key(encode_server(d), "logprobs"));
}

BOOST_AUTO_TEST_CASE(done_logprobs_are_checked_like_tokens_logprobs) {
  // {"v":1,"type":"done","id":"j","finish_reason":"stop","logprobs":[{"logprob":1}]}: a positive
  // log-probability is refused, naming the entry.
  const std::string b =
      "\x85\xa1v\x01\xa4type\xa4"
      "done\xa2id\xa1j\xad"
      "finish_reason\xa4stop\xa8logprobs\x91\x81\xa7logprob\x01";
  auto r = decode_server(b.data(), b.size());
  BOOST_REQUIRE(std::holds_alternative<DecodeError>(r));
  BOOST_TEST(std::get<DecodeError>(r).message.find("logprobs.0.logprob") != std::string::npos,
             std::get<DecodeError>(r).message);
}

BOOST_AUTO_TEST_CASE(quoted_is_the_one_echo_rule) {
  BOOST_TEST(sy::wire::quoted("batch") == "'batch'");
  BOOST_TEST(sy::wire::quoted(std::string("a\x01", 2)) == "'a\\x01'");
  BOOST_TEST(sy::wire::quoted("it's") == "'it\\x27s'");
  BOOST_TEST(sy::wire::quoted("a\\b") == "'a\\x5cb'");
  BOOST_TEST(sy::wire::quoted("caf\xc3\xa9") == "'caf\\xc3\\xa9'");
  BOOST_TEST(sy::wire::quoted(std::string(70, 'x')) == "'" + std::string(64, 'x') + "...'");
  // The decoder's own echoes follow it too.
  const std::string b = "\x82\xa1v\x01\xa4type\xa3\x01\x02x";
  auto r = decode_client(b.data(), b.size());
  BOOST_REQUIRE(std::holds_alternative<DecodeError>(r));
  BOOST_TEST(std::get<DecodeError>(r).message == "unknown message type '\\x01\\x02x'");
}

// The dumps in docs/protocol.md of replies these rules added fields to (test_codec_roundtrip pins
// the others, accepted and tokens with their tenant included).
BOOST_AUTO_TEST_CASE(documented_byte_examples_of_replies) {
  BOOST_TEST(hex(encode_server(StatusReply{"j1", JobState::running, 0, 5, "acme"})) ==
             "87a17601a474797065ac7374617475735f7265706c79a26964a26a31a674656e616e74a461636d65a5"
             "7374617465a772756e6e696e67ae71756575655f706f736974696f6e00b1636f6d706c6574696f6e5f"
             "746f6b656e7305");
  Done d;
  d.id = "j4";
  d.tenant = "acme";
  d.finish_reason = FinishReason::length;
  d.text = " the";
  d.ids = {727};
  d.usage = {2, 1};
  d.timings = {0, 1, 2};
  d.logprobs = {TokenLogprobs{-0.25f, {{727, -0.25f}, {11, -1.5f}}}};
  BOOST_TEST(hex(encode_server(d)) ==
             "8aa17601a474797065a4646f6e65a26964a26a34a674656e616e74a461636d65ad66696e6973685f7265"
             "61736f6ea66c656e677468a474657874a420746865a369647391cd02d7a5757361676582ad70726f6d70"
             "745f746f6b656e7302b1636f6d706c6574696f6e5f746f6b656e7301a774696d696e677383a871756575"
             "655f6d7300a7747466745f6d7301a8746f74616c5f6d7302a86c6f6770726f62739182a76c6f6770726f"
             "62cabe800000a3746f709292cd02d7cabe800000920bcabfc00000");
}

BOOST_AUTO_TEST_SUITE_END()  // test_codec_protocol_rules
