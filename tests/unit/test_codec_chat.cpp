// Codec rules of chat submits: `messages` in place of `prompt` (exactly one of the two), each
// message's role and content, the limits on them, and `parse_special` (text prompts only); the
// byte dump of docs/protocol.md.
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <functional>
#include <msgpack.hpp>
#include <string>
#include <vector>

#include "ingress/codec.hpp"
#include "tests/support/msgpack_msg.hpp"

BOOST_AUTO_TEST_SUITE(test_codec_chat)

using namespace sy::wire;
using namespace sy::test;

namespace {

// An array of message maps given as (key, value) string pairs each.
Value Msgs(std::vector<std::vector<std::pair<std::string, std::string>>> ms) {
  return [ms](Packer& p) {
    p.pack_array(static_cast<uint32_t>(ms.size()));
    for (const auto& m : ms) {
      p.pack_map(static_cast<uint32_t>(m.size()));
      for (const auto& [k, v] : m) {
        p.pack(k);
        p.pack(v);
      }
    }
  };
}

Msg chat() {
  Msg m;
  m.set("v", U(1)).set("type", S("submit")).set("id", S("c1")).set("tenant", S("acme"));
  m.set("messages", Msgs({{{"role", "user"}, {"content", "Hi"}}}));
  return m;
}

std::string error_of(const std::string& bytes, const DecodeLimits& lim = {}) {
  auto r = decode_client(bytes.data(), bytes.size(), lim);
  if (const auto* e = std::get_if<DecodeError>(&r)) return e->message;
  return "accepted";
}

Submit decoded(const std::string& bytes) {
  auto r = decode_client(bytes.data(), bytes.size());
  if (const auto* e = std::get_if<DecodeError>(&r)) BOOST_FAIL(e->message);
  return std::get<Submit>(std::get<ClientMessage>(r));
}

std::string hex(const std::string& b) {
  std::string out;
  char buf[4];
  for (unsigned char c : b) {
    std::snprintf(buf, sizeof buf, "%02x ", c);
    out += buf;
  }
  if (!out.empty()) out.pop_back();
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(messages_round_trip) {
  Submit s;
  s.id = "c1";
  s.tenant = "acme";
  s.messages = {{"system", "Be brief."}, {"user", "<|im_start|>Hi"}, {"assistant", ""}};
  s.max_tokens = 8;
  const std::string bytes = encode_client(s);
  const Submit d = decoded(bytes);
  BOOST_TEST((d == s));
  BOOST_TEST(d.has_messages());
  BOOST_TEST(!d.prompt_is_tokens());
  BOOST_TEST(std::get<std::string>(d.prompt) == "");

  Submit t;
  t.id = "t1";
  t.tenant = "acme";
  t.prompt = std::string("<s>Hi");
  t.parse_special = true;
  BOOST_TEST((decoded(encode_client(t)) == t));
  // The default (false) is left out.
  t.parse_special = false;
  BOOST_TEST(encode_client(t).find("parse_special") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(messages_bytes_as_documented) {
  // {"v":1,"type":"submit","id":"c1","tenant":"acme","messages":[{"role":"user","content":"Hi"}]}
  Submit s;
  s.id = "c1";
  s.tenant = "acme";
  s.messages = {{"user", "Hi"}};
  BOOST_TEST(hex(encode_client(s)) ==
             "85 a1 76 01 a4 74 79 70 65 a6 73 75 62 6d 69 74 a2 69 64 a2 63 31 a6 74 65 6e 61 6e "
             "74 a4 61 63 6d 65 a8 6d 65 73 73 61 67 65 73 91 82 a4 72 6f 6c 65 a4 75 73 65 72 a7 "
             "63 6f 6e 74 65 6e 74 a2 48 69");
}

BOOST_AUTO_TEST_CASE(exactly_one_of_prompt_and_messages) {
  BOOST_TEST(error_of(chat().bytes()) == "accepted");
  BOOST_TEST(error_of(chat().set("prompt", S("Hi")).bytes()) ==
             "fields 'prompt' and 'messages' exclude each other: send one of them");
  BOOST_TEST(error_of(chat().drop("messages").bytes()) == "missing field 'prompt'");
  // nil means absent: a nil prompt next to messages is fine.
  BOOST_TEST(error_of(chat().set("prompt", [](Packer& p) { p.pack_nil(); }).bytes()) == "accepted");
}

BOOST_AUTO_TEST_CASE(message_fields_are_checked) {
  BOOST_TEST(error_of(chat().set("messages", S("Hi")).bytes()) ==
             "field 'messages' must be an array of maps, got string");
  BOOST_TEST(error_of(chat().set("messages", Msgs({})).bytes()) ==
             "field 'messages' must not be empty");
  BOOST_TEST(error_of(chat()
                          .set("messages",
                               [](Packer& p) {
                                 p.pack_array(1);
                                 p.pack("x");
                               })
                          .bytes()) == "message at index 0 must be a map, got string");
  BOOST_TEST(error_of(chat()
                          .set("messages",
                               Msgs({{{"role", "user"}, {"content", "a"}}, {{"content", "b"}}}))
                          .bytes()) == "missing field 'messages.1.role'");
  BOOST_TEST(error_of(chat().set("messages", Msgs({{{"role", "user"}}})).bytes()) ==
             "missing field 'messages.0.content'");
  BOOST_TEST(error_of(chat().set("messages", Msgs({{{"role", ""}, {"content", "a"}}})).bytes()) ==
             "field 'messages.0.role' must not be empty");
  BOOST_TEST(error_of(chat()
                          .set("messages",
                               [](Packer& p) {
                                 p.pack_array(1);
                                 p.pack_map(2);
                                 p.pack("role");
                                 p.pack(7);
                                 p.pack("content");
                                 p.pack("a");
                               })
                          .bytes()) == "field 'messages.0.role' must be a string, got integer");
  // An empty content is a message too (an assistant turn to continue, say); an unknown key in a
  // message is refused like unknown keys anywhere.
  BOOST_TEST(
      error_of(chat().set("messages", Msgs({{{"role", "user"}, {"content", ""}}})).bytes()) ==
      "accepted");
  BOOST_TEST(
      error_of(chat()
                   .set("messages", Msgs({{{"role", "user"}, {"content", ""}, {"name", "bob"}}}))
                   .bytes()) ==
      "unknown field 'messages.0.name' in a message (docs/protocol.md lists the fields this server "
      "knows)");
  BOOST_TEST(
      error_of(chat()
                   .set("messages", Msgs({{{"role", std::string(65, 'r')}, {"content", "a"}}}))
                   .bytes()) == "field 'messages.0.role' has 65 bytes, limit 64");
}

BOOST_AUTO_TEST_CASE(message_limits) {
  DecodeLimits lim;
  lim.max_messages = 2;
  lim.max_prompt_bytes = 10;
  const auto three = Msgs({{{"role", "u"}, {"content", "a"}},
                           {{"role", "u"}, {"content", "b"}},
                           {{"role", "u"}, {"content", "c"}}});
  BOOST_TEST(error_of(chat().set("messages", three).bytes(), lim) ==
             "messages has 3 entries, limit 2");
  // Roles and contents together: 4 + 7 bytes.
  BOOST_TEST(
      error_of(chat().set("messages", Msgs({{{"role", "user"}, {"content", "1234567"}}})).bytes(),
               lim) == "messages have 11 bytes of text, limit 10");
  BOOST_TEST(
      error_of(chat().set("messages", Msgs({{{"role", "user"}, {"content", "123456"}}})).bytes(),
               lim) == "accepted");
  BOOST_TEST(DecodeLimits{}.max_messages == 1024u);
}

BOOST_AUTO_TEST_CASE(parse_special_is_for_text_prompts) {
  Msg text = chat().drop("messages").set("prompt", S("<s>Hi"));
  BOOST_TEST(decoded(text.set("parse_special", B(true)).bytes()).parse_special);
  BOOST_TEST(!decoded(text.set("parse_special", B(false)).bytes()).parse_special);
  BOOST_TEST(error_of(text.set("parse_special", S("yes")).bytes()) ==
             "field 'parse_special' must be a boolean, got string");
  BOOST_TEST(error_of(chat().set("parse_special", B(true)).bytes()) ==
             "field 'parse_special' applies to a text 'prompt' only (a chat template's control "
             "tokens are always parsed, message text never is)");
  BOOST_TEST(error_of(chat()
                          .drop("messages")
                          .set("prompt",
                               [](Packer& p) {
                                 p.pack_array(1);
                                 p.pack(1);
                               })
                          .set("parse_special", B(true))
                          .bytes()) ==
             "field 'parse_special' applies to a text 'prompt' only (token ids are used as given)");
  // false is the default and fine with anything.
  BOOST_TEST(error_of(chat().set("parse_special", B(false)).bytes()) == "accepted");
}

BOOST_AUTO_TEST_SUITE_END()  // test_codec_chat
