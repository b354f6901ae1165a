// Job keys must be UTF-8: an `id` or `tenant` that is not is refused with bad_request in submit,
// cancel and status, and the refusal neither echoes the bytes raw nor carries them as its id.
#include <boost/test/unit_test.hpp>
#include <string>
#include <vector>

#include "ingress/codec.hpp"

BOOST_AUTO_TEST_SUITE(test_codec_utf8_keys)

using namespace sy::wire;

namespace {

// Malformed UTF-8 of every kind the decoder must catch.
const std::vector<std::string> kInvalid = {
    "\xff",              // never valid
    "job-\x80",          // continuation without a lead
    "\xc3",              // truncated two-byte sequence
    "\xe2\x82",          // truncated three-byte sequence
    "\xc0\xaf",          // overlong '/'
    "\xe0\x80\xaf",      // overlong, three bytes
    "\xf0\x80\x80\xaf",  // overlong, four bytes
    "\xed\xa0\x80",      // a UTF-16 surrogate (U+D800)
    "\xf4\x90\x80\x80",  // above U+10FFFF
    "ok\xc3\x28",        // a lead followed by a non-continuation byte
};

Submit submit(const std::string& id, const std::string& tenant) {
  Submit s;
  s.id = id;
  s.tenant = tenant;
  s.prompt = std::string("Hi");
  return s;
}

DecodeError refused(const std::string& bytes) {
  auto d = decode_client(bytes.data(), bytes.size());
  BOOST_REQUIRE(std::holds_alternative<DecodeError>(d));
  return std::get<DecodeError>(d);
}

bool ascii_only(const std::string& s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

}  // namespace

BOOST_AUTO_TEST_CASE(valid_multibyte_keys_are_accepted) {
  const std::string id =
      "j\xc3\xb6"
      "b-\xe2\x82\xac-\xf0\x9d\x84\x9e";                  // jöb-€-𝄞
  const std::string tenant = "\xe6\x97\xa5\xe6\x9c\xac";  // 日本
  const std::string bytes = encode_client(submit(id, tenant));
  auto d = decode_client(bytes.data(), bytes.size());
  BOOST_REQUIRE(std::holds_alternative<ClientMessage>(d));
  const auto& s = std::get<Submit>(std::get<ClientMessage>(d));
  BOOST_CHECK_EQUAL(s.id, id);
  BOOST_CHECK_EQUAL(s.tenant, tenant);
}

BOOST_AUTO_TEST_CASE(invalid_id_is_refused_without_echoing_it_raw) {
  for (const auto& bad : kInvalid) {
    BOOST_TEST_CONTEXT("id bytes of length " << bad.size()) {
      DecodeError e = refused(encode_client(submit(bad, "acme")));
      BOOST_CHECK(e.code == sy::ErrorCode::bad_request);
      BOOST_CHECK_EQUAL(e.message.rfind("field 'id' is not valid UTF-8 (byte ", 0), 0u);
      BOOST_CHECK(ascii_only(e.message));
      BOOST_CHECK(e.id.empty());            // the reply must not carry it as its id
      BOOST_CHECK_EQUAL(e.tenant, "acme");  // the valid tenant still names the refusal
      // The encoded error reply is itself valid for a strict decoder.
      const std::string reply = encode_server(to_error(e));
      auto back = decode_server(reply.data(), reply.size());
      BOOST_CHECK(std::holds_alternative<ServerMessage>(back));
    }
  }
  DecodeError e = refused(encode_client(submit("ab\xff", "acme")));
  BOOST_CHECK_EQUAL(e.message, "field 'id' is not valid UTF-8 (byte 2): 'ab\\xff'");
}

BOOST_AUTO_TEST_CASE(invalid_tenant_is_refused_in_submit_cancel_and_status) {
  for (const auto& bad : kInvalid) {
    BOOST_TEST_CONTEXT("tenant bytes of length " << bad.size()) {
      Cancel c{"j1", bad, ""};
      Status st{"j1", bad, ""};
      for (const std::string& bytes :
           {encode_client(submit("j1", bad)), encode_client(c), encode_client(st)}) {
        DecodeError e = refused(bytes);
        BOOST_CHECK(e.code == sy::ErrorCode::bad_request);
        BOOST_CHECK_EQUAL(e.message.rfind("field 'tenant' is not valid UTF-8 (byte ", 0), 0u);
        BOOST_CHECK(ascii_only(e.message));
        BOOST_CHECK(e.tenant.empty());
        BOOST_CHECK_EQUAL(e.id, "j1");
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(invalid_id_in_cancel_and_status_is_refused) {
  Cancel c{"\xed\xa0\x80", "acme", ""};
  Status st{"x\xf5", "acme", ""};
  for (const std::string& bytes : {encode_client(c), encode_client(st)}) {
    DecodeError e = refused(bytes);
    BOOST_CHECK(e.code == sy::ErrorCode::bad_request);
    BOOST_CHECK_EQUAL(e.message.rfind("field 'id' is not valid UTF-8", 0), 0u);
    BOOST_CHECK(e.id.empty());
  }
}

BOOST_AUTO_TEST_SUITE_END()  // test_codec_utf8_keys
