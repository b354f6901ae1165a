// Codec tests for well-formed traffic: every message type round-trips through encode/decode,
// defaults are left out and restored, and the byte-level examples of docs/protocol.md hold.
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "ingress/codec.hpp"

BOOST_AUTO_TEST_SUITE(test_codec_roundtrip)

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

ClientMessage client_round_trip(const ClientMessage& m) {
  const std::string b = encode_client(m);
  auto r = decode_client(b.data(), b.size());
  if (auto* e = std::get_if<DecodeError>(&r)) BOOST_FAIL("decode failed: " + e->message);
  return std::get<ClientMessage>(r);
}

ServerMessage server_round_trip(const ServerMessage& m) {
  const std::string b = encode_server(m);
  auto r = decode_server(b.data(), b.size());
  if (auto* e = std::get_if<DecodeError>(&r)) BOOST_FAIL("decode failed: " + e->message);
  return std::get<ServerMessage>(r);
}

Submit full_submit() {
  Submit s;
  s.id = "job-42";
  s.tenant = "acme";
  s.token = "s3cret";
  s.prompt = std::string("Once upon a time");
  s.max_tokens = 128;
  s.temperature = 0.7;
  s.top_k = 40;
  s.top_p = 0.9;
  s.seed = 1234567890123ull;
  s.stop = {"\n\n", "The end"};
  s.ignore_eos = true;
  s.speculative = "always";
  s.priority = "interactive";
  s.deadline_ms = 2500;
  s.stream = true;
  s.logprobs = 5;
  return s;
}

}  // namespace

BOOST_AUTO_TEST_CASE(submit_round_trips) {
  const Submit s = full_submit();
  BOOST_TEST((std::get<Submit>(client_round_trip(s)) == s));
  Submit t = s;
  t.prompt = std::vector<int32_t>{1, 2, 3, 32000, 2147483647, 0};
  t.seed = 0;  // present and zero differs from absent
  BOOST_TEST((std::get<Submit>(client_round_trip(t)) == t));
  Submit minimal;
  minimal.id = "a";
  minimal.tenant = "b";
  minimal.prompt = std::string("x");
  BOOST_TEST((std::get<Submit>(client_round_trip(minimal)) == minimal));
}

BOOST_AUTO_TEST_CASE(defaults_are_left_out_and_restored) {
  Submit s;
  s.id = "a";
  s.tenant = "b";
  s.prompt = std::string("x");
  const std::string b = encode_client(s);
  // {v, type, id, tenant, prompt}: a 5-entry fixmap and nothing else.
  BOOST_TEST(static_cast<unsigned char>(b[0]) == 0x85u);
  const Submit d = std::get<Submit>(client_round_trip(s));
  BOOST_TEST(d.max_tokens == 16u);
  BOOST_TEST(d.temperature == 1.0);
  BOOST_TEST(d.top_k == 0u);
  BOOST_TEST(d.top_p == 1.0);
  BOOST_TEST(!d.seed.has_value());
  BOOST_TEST(d.stop.empty());
  BOOST_TEST(!d.ignore_eos);
  BOOST_TEST(d.speculative.empty());  // the server's default
  BOOST_TEST(d.priority.empty());
  BOOST_TEST(d.deadline_ms == 0u);
  BOOST_TEST(!d.stream);
  BOOST_TEST(d.logprobs == 0u);
  BOOST_TEST(d.token.empty());
}

BOOST_AUTO_TEST_CASE(other_client_messages_round_trip) {
  const Cancel c{"job-1", "acme", "tok"};
  BOOST_TEST((std::get<Cancel>(client_round_trip(c)) == c));
  const Status st{"job-1", "acme", ""};
  BOOST_TEST((std::get<Status>(client_round_trip(st)) == st));
  BOOST_TEST((std::get<Ping>(client_round_trip(Ping{0})) == Ping{0}));
  BOOST_TEST((std::get<Ping>(client_round_trip(Ping{~0ull})) == Ping{~0ull}));
  const Control kv{"admin-secret", "kv_policy", "sinks:4:60"};
  BOOST_TEST((std::get<Control>(client_round_trip(kv)) == kv));
  const Control stats{"", "stats", ""};
  BOOST_TEST((std::get<Control>(client_round_trip(stats)) == stats));
}

BOOST_AUTO_TEST_CASE(server_messages_round_trip) {
  const Accepted a{"job-1", 17};
  BOOST_TEST((std::get<Accepted>(server_round_trip(a)) == a));

  Tokens t;
  t.id = "job-1";
  t.index = 3;
  t.ids = {450, 29871};
  t.text = " the";
  BOOST_TEST((std::get<Tokens>(server_round_trip(t)) == t));
  t.logprobs = {{-0.125f, {{450, -0.125f}, {278, -2.5f}}}, {-1.75f, {}}};
  BOOST_TEST((std::get<Tokens>(server_round_trip(t)) == t));

  Done d;
  d.id = "job-1";
  d.tenant = "acme";
  d.finish_reason = FinishReason::length;
  d.text = "Once upon a time there was";
  d.ids = {1, 2, 3};
  d.usage = {5, 3};
  d.timings = {0.25, 12.5, 40.125};
  BOOST_TEST((std::get<Done>(server_round_trip(d)) == d));
  d.finish_reason = FinishReason::cancelled;
  d.ids.clear();
  d.text.clear();
  d.tenant.clear();
  d.timings = {0, 1, 2};  // integral values travel as msgpack integers
  BOOST_TEST((std::get<Done>(server_round_trip(d)) == d));
  d.usage.cached_tokens = 400;
  BOOST_TEST((std::get<Done>(server_round_trip(d)) == d));

  const ControlReply cr{"kv_policy", R"({"kv_policy": "sliding_window:512", "batchers": 2})"};
  BOOST_TEST((std::get<ControlReply>(server_round_trip(cr)) == cr));

  const Error e{"job-1", "acme", sy::ErrorCode::overloaded, "queue 'batch' is full", 250u};
  BOOST_TEST((std::get<Error>(server_round_trip(e)) == e));
  const Error anon{"", "", sy::ErrorCode::bad_request, "bad msgpack: empty message", std::nullopt};
  BOOST_TEST((std::get<Error>(server_round_trip(anon)) == anon));

  BOOST_TEST((std::get<Pong>(server_round_trip(Pong{99})) == Pong{99}));
  const StatusReply sr{"job-1", JobState::running, 0, 12};
  BOOST_TEST((std::get<StatusReply>(server_round_trip(sr)) == sr));
}

BOOST_AUTO_TEST_CASE(cached_tokens_left_out_when_zero) {
  Done d;
  d.id = "j";
  d.usage = {3, 2, 0};
  const std::string without = encode_server(d);
  BOOST_TEST(without.find("cached_tokens") == std::string::npos);
  d.usage.cached_tokens = 2;
  const std::string with = encode_server(d);
  BOOST_TEST(with.find("cached_tokens") != std::string::npos);
  BOOST_TEST(std::get<Done>(server_round_trip(d)).usage.cached_tokens == 2u);
}

BOOST_AUTO_TEST_CASE(every_error_code_round_trips) {
  for (unsigned i = 0; i <= static_cast<unsigned>(sy::ErrorCode::internal); ++i) {
    const auto c = static_cast<sy::ErrorCode>(i);
    BOOST_TEST((sy::error_code_from_string(sy::to_string(c)) == c));
    const Error e{"j", "", c, "m", std::nullopt};
    BOOST_TEST((std::get<Error>(server_round_trip(e)).code == c));
  }
  BOOST_TEST(!sy::error_code_from_string("nope").has_value());
  BOOST_TEST(sy::to_string(sy::ErrorCode::deadline_exceeded) == "deadline_exceeded");
}

BOOST_AUTO_TEST_CASE(unknown_error_code_from_a_newer_server_reads_as_internal) {
  // {"v":1,"type":"error","code":"brand_new","message":"m"}
  const std::string b =
      "\x84\xa1v\x01\xa4type\xa5"
      "error\xa4"
      "code\xa9"
      "brand_new\xa7message\xa1m";
  auto r = decode_server(b.data(), b.size());
  BOOST_REQUIRE(std::holds_alternative<ServerMessage>(r));
  const Error e = std::get<Error>(std::get<ServerMessage>(r));
  BOOST_TEST((e.code == sy::ErrorCode::internal));
  BOOST_TEST(e.message == "m");
}

BOOST_AUTO_TEST_CASE(decode_error_becomes_error_reply) {
  const std::string b = "\xc1";
  auto r = decode_client(b.data(), b.size());
  const Error e = to_error(std::get<DecodeError>(r));
  BOOST_TEST((e.code == sy::ErrorCode::bad_request));
  BOOST_TEST(e.message == "bad msgpack: invalid byte 0xc1 at offset 0");
  BOOST_TEST((std::get<Error>(server_round_trip(e)) == e));
}

// The hex dumps in docs/protocol.md; a change here means the document must change too.
BOOST_AUTO_TEST_CASE(documented_byte_examples) {
  Submit s;
  s.id = "j1";
  s.tenant = "acme";
  s.prompt = std::string("Hi");
  s.max_tokens = 8;
  s.temperature = 0;
  BOOST_TEST(
      hex(encode_client(s)) ==
      "87a17601a474797065a67375626d6974a26964a26a31a674656e616e74a461636d65a670726f6d7074a24869"
      "aa6d61785f746f6b656e7308ab74656d706572617475726500");
  Submit t;
  t.id = "j2";
  t.tenant = "acme";
  t.prompt = std::vector<int32_t>{1, 15043};
  t.stream = true;
  t.priority = "batch";
  BOOST_TEST(hex(encode_client(t)) ==
             "87a17601a474797065a67375626d6974a26964a26a32a674656e616e74a461636d65a670726f6d707492"
             "01cd3ac3a87072696f72697479a56261746368a673747265616dc3");
  BOOST_TEST(hex(encode_client(Ping{7})) == "83a17601a474797065a470696e67a373657107");
  BOOST_TEST(hex(encode_server(Accepted{"j1", 3, "acme"})) ==
             "85a17601a474797065a86163636570746564a26964a26a31a674656e616e74a461636d65ae717565756"
             "55f706f736974696f6e03");
  Tokens tk;
  tk.id = "j2";
  tk.tenant = "acme";
  tk.index = 0;
  tk.ids = {6028};
  tk.text = " Hi";
  BOOST_TEST(hex(encode_server(tk)) ==
             "87a17601a474797065a6746f6b656e73a26964a26a32a674656e616e74a461636d65a5696e646578"
             "00a369647391cd178ca474657874a3204869");
  Done d;
  d.id = "j1";
  d.tenant = "acme";
  d.finish_reason = FinishReason::length;
  d.text = " there";
  d.ids = {727};
  d.usage = {2, 1};
  d.timings = {0.5, 3.25, 3.25};
  BOOST_TEST(
      hex(encode_server(d)) ==
      "89a17601a474797065a4646f6e65a26964a26a31a674656e616e74a461636d65ad66696e6973685f726561736f6e"
      "a66c656e677468a474657874a6207468657265a3696473"
      "91cd02d7a5757361676582ad70726f6d70745f746f6b656e7302"
      "b1636f6d706c6574696f6e5f746f6b656e7301a774696d696e677383a8717565756"
      "55f6d73cb3fe0000000000000a7747466745f6d73cb400a000000000000a8746f74616c5f6d73cb400a000000000"
      "000");
  const Error e{"j1", "acme", sy::ErrorCode::overloaded, "queue full", 120u};
  BOOST_TEST(hex(encode_server(e)) ==
             "87a17601a474797065a56572726f72a26964a26a31a674656e616e74a461636d65a4636f6465aa6f76657"
             "26c6f61646564"
             "a76d657373616765aa717565756520"
             "66756c6cae72657472795f61667465725f6d7378");
  BOOST_TEST(hex(encode_client(Control{"adm", "kv_policy", "sliding_window:32"})) ==
             "85a17601a474797065a7636f6e74726f6ca5746f6b656ea361646da7636f6d6d616e64a96b765f706f6c"
             "696379a6706f6c696379b1736c6964696e675f77696e646f773a3332");
  // The text of a real kv_policy reply (actors/control.cpp writes ", " and ": ").
  BOOST_TEST(
      hex(encode_server(ControlReply{"kv_policy", R"({"kv_policy": "full", "batchers": 1})"})) ==
      "84a17601a474797065ad636f6e74726f6c5f7265706c79a7636f6d6d616e64a96b765f706f6c696379"
      "a6726573756c74d9247b226b765f706f6c696379223a202266756c6c222c20226261746368657273223a"
      "20317d");
  Done dc;
  dc.id = "j3";
  dc.finish_reason = FinishReason::stop;
  dc.usage = {20, 1, 16};
  dc.timings = {0, 1, 2};
  BOOST_TEST(
      hex(encode_server(dc)) ==
      "87a17601a474797065a4646f6e65a26964a26a33ad66696e6973685f726561736f6ea473746f70a474657874a0"
      "a5757361676583ad70726f6d70745f746f6b656e7314b1636f6d706c6574696f6e5f746f6b656e7301ad636163"
      "6865645f746f6b656e7310a774696d696e677383a871756575655f6d7300a7747466745f6d7301a8746f74616c"
      "5f6d7302");
  // The reply to the hostile 5-byte array32 header.
  const std::string hostile("\xdd\xff\xff\xff\xff", 5);
  auto r = decode_client(hostile.data(), hostile.size());
  BOOST_TEST(
      hex(encode_server(to_error(std::get<DecodeError>(r)))) ==
      "84a17601a474797065a56572726f72a4636f6465ab6261645f72657175657374a76d657373616765d93e62616420"
      "6d73"
      "677061636b3a206172726179206f66203432393439363732393520656c656d656e7473206578636565647320"
      "6c696d697420313331303732");
}

BOOST_AUTO_TEST_SUITE_END()  // test_codec_roundtrip
