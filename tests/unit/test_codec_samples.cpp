// The codec's parts for several samples, prompt log-probabilities and `score`: submit's `n` and
// `prompt_logprobs`, the `score` message, a chunk's `choice`, a done's `choices`,
// `prompt_logprobs` and `scores` round-trip, are left out at their defaults, and bad values are
// refused naming the field.
#include <boost/test/unit_test.hpp>
#include <msgpack.hpp>
#include <string>
#include <vector>

#include "ingress/codec.hpp"

BOOST_AUTO_TEST_SUITE(test_codec_samples)

using namespace sy::wire;

namespace {

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

// The error decoding a map given as (key, value) msgpack-ready pairs gets, or "" when it decodes.
template <class F>
std::string refusal(F&& fill) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  fill(p);
  auto r = decode_client(buf.data(), buf.size());
  if (auto* e = std::get_if<DecodeError>(&r)) return e->message;
  return "";
}

bool has(const std::string& bytes, const std::string& key) {
  return bytes.find(key) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_CASE(submit_n_and_prompt_logprobs_round_trip) {
  Submit s;
  s.id = "j";
  s.tenant = "t";
  s.prompt = std::string("Hi");
  s.n = 4;
  s.prompt_logprobs = 0;  // present with 0: the actual tokens' logprobs only
  const auto back = std::get<Submit>(client_round_trip(s));
  BOOST_TEST(back.n == 4u);
  BOOST_REQUIRE(back.prompt_logprobs.has_value());
  BOOST_TEST(*back.prompt_logprobs == 0u);
  BOOST_TEST(!back.score);
  // Defaults are left out: a plain submit's bytes are what they always were.
  Submit plain = s;
  plain.n = 1;
  plain.prompt_logprobs.reset();
  const std::string b = encode_client(plain);
  BOOST_TEST(!has(b, "prompt_logprobs"));
  BOOST_TEST((std::get<Submit>(client_round_trip(plain)) == plain));
}

BOOST_AUTO_TEST_CASE(score_round_trips) {
  Submit s;
  s.score = true;
  s.id = "sc";
  s.tenant = "t";
  s.prompt = std::vector<int32_t>{1, 403};
  s.continuations = {std::string("there"), std::vector<int32_t>{407, 261}};
  s.priority = "batch";
  s.deadline_ms = 500;
  const std::string b = encode_client(s);
  BOOST_TEST(has(b, "score"));
  BOOST_TEST(!has(b, "max_tokens"));
  const auto back = std::get<Submit>(client_round_trip(s));
  BOOST_TEST((back == s));
}

BOOST_AUTO_TEST_CASE(bad_values_are_refused_naming_the_field) {
  auto submit_with = [](const char* key, auto value) {
    return refusal([&](auto& p) {
      p.pack_map(6);
      p.pack("v"), p.pack(1), p.pack("type"), p.pack("submit");
      p.pack("id"), p.pack("j"), p.pack("tenant"), p.pack("t");
      p.pack("prompt"), p.pack("Hi");
      p.pack(key), p.pack(value);
    });
  };
  BOOST_TEST(submit_with("n", 17) == "n 17 out of range [1, 16]");
  BOOST_TEST(submit_with("n", 0) == "n 0 out of range [1, 16]");
  BOOST_TEST(submit_with("n", -1) == "n -1 out of range [1, 16]");
  BOOST_TEST(submit_with("n", 2.5) == "field 'n' must be an integer, got float");
  BOOST_TEST(submit_with("prompt_logprobs", 21) == "prompt_logprobs 21 out of range [0, 20]");
  BOOST_TEST(submit_with("n", 16) == "");
  BOOST_TEST(submit_with("continuations", 1).find("unknown field 'continuations' in a submit") ==
             0u);

  auto score_with = [](int extra, auto&& more) {
    return refusal([&](auto& p) {
      p.pack_map(static_cast<uint32_t>(5 + extra));
      p.pack("v"), p.pack(1), p.pack("type"), p.pack("score");
      p.pack("id"), p.pack("s"), p.pack("tenant"), p.pack("t");
      p.pack("prompt"), p.pack("Once");
      more(p);
    });
  };
  BOOST_TEST(score_with(0, [](auto&) {}) == "missing field 'continuations'");
  BOOST_TEST(score_with(1, [](auto& p) {
               p.pack("continuations");
               p.pack_array(0);
             }) == "field 'continuations' must not be empty");
  BOOST_TEST(score_with(1, [](auto& p) {
               p.pack("continuations");
               p.pack_array(65);
               for (int i = 0; i < 65; ++i) p.pack("x");
             }) == "continuations has 65 entries, limit 64");
  BOOST_TEST(score_with(1, [](auto& p) {
               p.pack("continuations");
               p.pack_array(2);
               p.pack("x");
               p.pack("");
             }) == "continuation at index 1 must not be empty");
  BOOST_TEST(
      score_with(1, [](auto& p) {
        p.pack("continuations");
        p.pack_array(1);
        p.pack(7);
      }) == "continuation at index 0 must be a string or an array of token ids, got integer");
  BOOST_TEST(score_with(2, [](auto& p) {
               p.pack("continuations");
               p.pack_array(1);
               p.pack("x");
               p.pack("max_tokens");
               p.pack(4);
             }).find("unknown field 'max_tokens' in a score") == 0u);
  BOOST_TEST(score_with(1, [](auto& p) {
               p.pack("continuations");
               p.pack_array(1);
               p.pack_array(2);
               p.pack(1);
               p.pack(2);
             }) == "");
}

BOOST_AUTO_TEST_CASE(server_side_round_trips) {
  Tokens t;
  t.id = "j";
  t.ids = {5};
  t.text = "x";
  t.choice = 3;
  BOOST_TEST((std::get<Tokens>(server_round_trip(t)) == t));
  t.choice = 0;  // left out at its default
  BOOST_TEST(!has(encode_server(t), "choice"));

  Done d;
  d.id = "j";
  d.finish_reason = FinishReason::length;
  d.usage = {5, 8, 0};
  Choice c;
  c.index = 1;
  c.finish_reason = FinishReason::stop;
  c.text = "hi";
  c.ids = {7, 8};
  c.logprobs = {{-0.5f, {{7, -0.5f}}}, {-0.25f, {{8, -0.25f}}}};
  d.choices = {Choice{0, FinishReason::length, "a", {4}, {}}, c};
  d.prompt_logprobs = {{403, -1.5f, {{403, -1.5f}, {9, -2.0f}}}, {407, -0.125f, {}}};
  d.scores = {{0, -3.5, -1.75, 2}, {1, -10.0, -5.0, 2}};
  const Done back = std::get<Done>(server_round_trip(d));
  BOOST_TEST((back == d));
  // A plain done has none of these keys.
  Done plain;
  plain.id = "j";
  const std::string b = encode_server(plain);
  BOOST_TEST(!has(b, "choices"));
  BOOST_TEST(!has(b, "prompt_logprobs"));
  BOOST_TEST(!has(b, "scores"));
}

BOOST_AUTO_TEST_SUITE_END()
