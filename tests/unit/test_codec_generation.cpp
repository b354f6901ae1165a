// The generation fields of a submit at the edge: sampling controls (min_p, penalties, logit_bias)
// and constraints (grammar, json_schema as a map or JSON text, regex, choices), their ranges and
// limits, their round trip through the encoder, and unknown fields refused by name.
#include <boost/test/unit_test.hpp>
#include <string>
#include <variant>

#include "ingress/codec.hpp"
#include "tests/support/msgpack_msg.hpp"

BOOST_AUTO_TEST_SUITE(test_codec_generation)

using namespace sy::wire;
using namespace sy::test;
using sy::Constraint;

namespace {

Msg submit() {
  Msg m;
  m.set("v", U(1)).set("type", S("submit")).set("id", S("j1")).set("tenant", S("acme"));
  m.set("prompt", S("Hello"));
  return m;
}

// The decoded submit, or the error message ("" when it decoded).
std::string error_of(const std::string& bytes) {
  auto r = decode_client(bytes.data(), bytes.size());
  if (auto* e = std::get_if<sy::wire::DecodeError>(&r)) return e->message;
  return "";
}

Submit submit_of(const std::string& bytes) {
  auto r = decode_client(bytes.data(), bytes.size());
  if (auto* e = std::get_if<sy::wire::DecodeError>(&r)) BOOST_FAIL("refused: " + e->message);
  return std::get<Submit>(std::get<ClientMessage>(r));
}

Value Map(std::vector<std::pair<Value, Value>> entries) {
  return [entries](Packer& p) {
    p.pack_map(static_cast<uint32_t>(entries.size()));
    for (const auto& [k, v] : entries) {
      k(p);
      v(p);
    }
  };
}

Value Strs(std::vector<std::string> xs) {
  return [xs](Packer& p) {
    p.pack_array(static_cast<uint32_t>(xs.size()));
    for (const auto& x : xs) p.pack(x);
  };
}

}  // namespace

BOOST_AUTO_TEST_CASE(controls_decode_and_round_trip) {
  Msg m = submit();
  m.set("min_p", F(0.05)).set("presence_penalty", F(-0.5)).set("frequency_penalty", U(1));
  m.set("repetition_penalty", F(1.1)).set("repeat_last_n", I(-1));
  m.set("logit_bias", Map({{U(7), F(-100.0)}, {S("3"), F(2.5)}}));
  const Submit s = submit_of(m.bytes());
  BOOST_TEST(s.controls.min_p == 0.05f);
  BOOST_TEST(s.controls.presence_penalty == -0.5f);
  BOOST_TEST(s.controls.frequency_penalty == 1.0f);
  BOOST_TEST(s.controls.repetition_penalty == 1.1f);
  BOOST_TEST(s.controls.repeat_last_n == -1);
  BOOST_REQUIRE(s.controls.logit_bias.size() == 2u);
  BOOST_TEST(s.controls.logit_bias[0].first == 3);  // ascending ids
  BOOST_TEST(s.controls.logit_bias[1].second == -100.0f);
  const std::string again = encode_client(ClientMessage{s});
  BOOST_TEST((submit_of(again) == s));
  // Defaults change nothing and are not sent.
  const Submit plain = submit_of(submit().bytes());
  BOOST_TEST(!plain.controls.any());
  BOOST_TEST(encode_client(ClientMessage{plain}).find("min_p") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(controls_out_of_range_are_named) {
  auto err = [](const std::string& k, Value v) { return error_of(submit().set(k, v).bytes()); };
  BOOST_TEST(err("min_p", F(1.5)).find("min_p") != std::string::npos);
  BOOST_TEST(err("presence_penalty", F(2.01)).find("presence_penalty") != std::string::npos);
  BOOST_TEST(err("frequency_penalty", F(-3)).find("frequency_penalty") != std::string::npos);
  BOOST_TEST(err("repetition_penalty", U(0)).find("repetition_penalty") != std::string::npos);
  BOOST_TEST(err("repetition_penalty", F(1e-46)).find("repetition_penalty") != std::string::npos);
  BOOST_TEST(err("repeat_last_n", I(-2)).find("repeat_last_n") != std::string::npos);
  BOOST_TEST(err("repeat_last_n", U(1ull << 40)).find("repeat_last_n") != std::string::npos);
  BOOST_TEST(err("logit_bias", Map({{U(1), F(100.5)}})).find("logit_bias.1") != std::string::npos);
  BOOST_TEST(err("logit_bias", Map({{S("x1"), F(1)}})) == "logit_bias key 'x1' is not a token id");
  BOOST_TEST(err("logit_bias", Map({{U(3), F(1)}, {S("3"), F(2)}})) ==
             "logit_bias names token id 3 twice");
  BOOST_TEST(err("logit_bias", Map({{U(1u << 31), F(1)}})).find("out of range") !=
             std::string::npos);
  BOOST_TEST(err("logit_bias", S("x")) == "field 'logit_bias' must be a map, got string");
  std::vector<std::pair<Value, Value>> many;
  for (uint64_t i = 0; i < 1025; ++i) many.emplace_back(U(i), F(1));
  // The edge's map limit (1024 entries, docs/protocol.md) refuses it before the field is read.
  BOOST_TEST(err("logit_bias", Map(many)) == "bad msgpack: map of 1025 entries exceeds limit 1024");
}

BOOST_AUTO_TEST_CASE(constraints_decode_in_each_form) {
  Submit g = submit_of(submit().set("grammar", S("root ::= \"a\"")).bytes());
  BOOST_TEST(g.constraint.kind == Constraint::grammar);
  BOOST_TEST(g.constraint.source == "root ::= \"a\"");
  Submit r = submit_of(submit().set("regex", S("[0-9]+")).bytes());
  BOOST_TEST(r.constraint.kind == Constraint::regex);
  Submit c = submit_of(submit().set("choices", Strs({"yes", "no"})).bytes());
  BOOST_TEST(c.constraint.kind == Constraint::choices);
  BOOST_TEST((c.constraint.options == std::vector<std::string>{"yes", "no"}));
  // A schema as JSON text is kept as sent; as a map it becomes the same JSON.
  Submit t = submit_of(submit().set("json_schema", S("{\"type\": \"integer\"}")).bytes());
  BOOST_TEST(t.constraint.kind == Constraint::json_schema);
  BOOST_TEST(t.constraint.source == "{\"type\": \"integer\"}");
  Submit m =
      submit_of(submit()
                    .set("json_schema",
                         Map({{S("type"), S("object")},
                              {S("properties"), Map({{S("a\"b"), Map({{S("maximum"), F(2.5)}})}})},
                              {S("required"), Strs({"a\"b"})},
                              {S("additionalProperties"), B(false)}}))
                    .bytes());
  BOOST_TEST(m.constraint.source ==
             "{\"type\":\"object\",\"properties\":{\"a\\\"b\":{\"maximum\":2.5}},"
             "\"required\":[\"a\\\"b\"],\"additionalProperties\":false}");
  for (const Submit& s : {g, r, c, t, m})
    BOOST_TEST((submit_of(encode_client(ClientMessage{s})) == s));
}

BOOST_AUTO_TEST_CASE(constraint_form_errors_are_named) {
  auto err = [](Msg m) { return error_of(m.bytes()); };
  BOOST_TEST(err(submit().set("grammar", S("root ::= \"a\"")).set("regex", S("a"))) ==
             "fields grammar, regex exclude each other: a job takes one constraint");
  BOOST_TEST(err(submit().set("grammar", S(""))) == "field 'grammar' must not be empty");
  BOOST_TEST(err(submit().set("regex", S(std::string(65537, 'a')))) ==
             "field 'regex' has 65537 bytes, limit 65536");
  BOOST_TEST(err(submit().set("choices", Strs({}))) == "field 'choices' must not be empty");
  BOOST_TEST(err(submit().set("choices", Value([](Packer& p) {
                                p.pack_array(1);
                                p.pack(3);
                              }))) == "choice at index 0 must be a string, got integer");
  BOOST_TEST(err(submit().set("json_schema", U(3))) ==
             "field 'json_schema' must be a map or a string of JSON, got integer");
  BOOST_TEST(err(submit().set("json_schema", Map({{S("x"), Value([](Packer& p) {
                                                     const char b[2] = {1, 2};
                                                     p.pack_bin(2);
                                                     p.pack_bin_body(b, 2);
                                                   })}}))) ==
             "json_schema/x: a binary value has no JSON form");
}

BOOST_AUTO_TEST_CASE(unknown_fields_are_refused_by_name) {
  BOOST_TEST(error_of(submit().set("temprature", F(0.5)).bytes()) ==
             "unknown field 'temprature' in a submit (docs/protocol.md lists the fields this "
             "server knows)");
  Msg cancel;
  cancel.set("v", U(1)).set("type", S("cancel")).set("id", S("j")).set("tenant", S("t"));
  BOOST_TEST(error_of(cancel.bytes()) == "");
  BOOST_TEST(error_of(cancel.set("reason", S("x")).bytes())
                 .find("unknown field 'reason' in a "
                       "cancel") == 0);
  Msg ping;
  ping.set("v", U(1)).set("type", S("ping")).set("sq", U(1));
  BOOST_TEST(error_of(ping.bytes()).find("unknown field 'sq' in a ping") == 0);
  // The refusal names the job, like every other refusal of a readable submit.
  const std::string b = submit().set("json_schemaa", S("{}")).bytes();
  auto r = decode_client(b.data(), b.size());
  BOOST_REQUIRE(std::holds_alternative<sy::wire::DecodeError>(r));
  BOOST_TEST(std::get<sy::wire::DecodeError>(r).id == "j1");
}

BOOST_AUTO_TEST_SUITE_END()
