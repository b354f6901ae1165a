// Codec tests for hostile and broken input: random bytes, truncation, huge headers, deep nesting,
// wrong field types, missing fields, out-of-range values — each refused with a message naming it.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <msgpack.hpp>
#include <random>
#include <string>
#include <vector>

#include "ingress/codec.hpp"
#include "tests/support/msgpack_msg.hpp"

BOOST_AUTO_TEST_SUITE(test_codec_malformed)

using namespace sy::wire;
using namespace sy::test;

namespace {

Value Ids(std::vector<int64_t> v) {
  return [v](Packer& p) {
    p.pack_array(static_cast<uint32_t>(v.size()));
    for (auto x : v) p.pack_int64(x);
  };
}

Msg submit() {
  Msg m;
  m.set("v", U(1))
      .set("type", S("submit"))
      .set("id", S("j1"))
      .set("tenant", S("acme"))
      .set("prompt", S("Hello"));
  return m;
}

DecodeError error_of(const std::string& bytes, const DecodeLimits& lim = {}) {
  auto r = decode_client(bytes.data(), bytes.size(), lim);
  BOOST_REQUIRE_MESSAGE(std::holds_alternative<DecodeError>(r), "decoded, expected an error");
  const auto& e = std::get<DecodeError>(r);
  BOOST_TEST((e.code == sy::ErrorCode::bad_request));
  return e;
}

std::string message_of(const std::string& bytes, const DecodeLimits& lim = {}) {
  return error_of(bytes, lim).message;
}

Submit submit_of(const std::string& bytes) {
  auto r = decode_client(bytes.data(), bytes.size());
  if (auto* e = std::get_if<DecodeError>(&r)) BOOST_FAIL("unexpected error: " + e->message);
  return std::get<Submit>(std::get<ClientMessage>(r));
}

}  // namespace

BOOST_AUTO_TEST_CASE(valid_base_message_decodes) {
  const Submit s = submit_of(submit().bytes());
  BOOST_TEST(s.id == "j1");
  BOOST_TEST(s.tenant == "acme");
  BOOST_TEST(std::get<std::string>(s.prompt) == "Hello");
}

BOOST_AUTO_TEST_CASE(random_bytes_never_throw_and_never_pass_as_garbage) {
  std::mt19937_64 rng(12345);
  int errors = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string b(rng() % 64, '\0');
    for (auto& c : b) c = static_cast<char>(rng());
    auto r = decode_client(b.data(), b.size());
    if (auto* e = std::get_if<DecodeError>(&r)) {
      ++errors;
      BOOST_TEST(!e->message.empty());
      BOOST_TEST((e->code == sy::ErrorCode::bad_request));
    }
  }
  BOOST_TEST(errors == 20000);  // random bytes never form a valid v1 message
}

BOOST_AUTO_TEST_CASE(specific_bad_bytes) {
  BOOST_TEST(message_of("") == "bad msgpack: empty message");
  BOOST_TEST(message_of("\xc1") == "bad msgpack: invalid byte 0xc1 at offset 0");
  BOOST_TEST(message_of(std::string("\x82\xa1v\x01\xc1", 5)) ==
             "bad msgpack: invalid byte 0xc1 at offset 4");
  BOOST_TEST(message_of(submit().bytes() + "\xc0") ==
             "bad msgpack: trailing data after the message (1 bytes)");
  BOOST_TEST(message_of("\xcd\x01") ==
             "bad msgpack: truncated value at offset 0 (needs 2 bytes, 1 follow)");
  BOOST_TEST(message_of("\xda\x01") == "bad msgpack: truncated str header at offset 0");
}

BOOST_AUTO_TEST_CASE(every_truncation_of_a_valid_message_is_refused) {
  Submit s;
  s.id = "job-1";
  s.tenant = "acme";
  s.prompt = std::vector<int32_t>{1, 300, 70000};
  s.temperature = 0.25;
  s.stop = {"\n\n", "END"};
  s.seed = 1ull << 40;
  const std::string full = encode_client(s);
  for (size_t n = 0; n < full.size(); ++n) {
    const std::string m = message_of(full.substr(0, n));
    BOOST_TEST(m.rfind("bad msgpack: ", 0) == 0, "prefix " << n << ": " << m);
  }
}

BOOST_AUTO_TEST_CASE(four_gib_headers_refused_before_allocation) {
  // array32 / map32 / str32 / bin32 headers claiming 2^32-1 elements or bytes, nothing after.
  BOOST_TEST(message_of("\xdd\xff\xff\xff\xff") ==
             "bad msgpack: array of 4294967295 elements exceeds limit 131072");
  BOOST_TEST(message_of("\xdf\xff\xff\xff\xff") ==
             "bad msgpack: map of 4294967295 entries exceeds limit 1024");
  BOOST_TEST(message_of("\xdb\xff\xff\xff\xff") ==
             "bad msgpack: str of 4294967295 bytes exceeds limit 1048576");
  BOOST_TEST(message_of("\xc6\xff\xff\xff\xff") ==
             "bad msgpack: bin of 4294967295 bytes exceeds limit 1048576");
  // With the size limits lifted, the claim still cannot fit in the bytes that follow.
  DecodeLimits open;
  open.max_array = open.max_map = open.max_string_bytes = 0xffffffffu;
  BOOST_TEST(
      message_of("\xdd\xff\xff\xff\xff", open) ==
      "bad msgpack: array header at offset 0 claims 4294967295 elements but only 0 bytes follow");
  BOOST_TEST(
      message_of("\xdf\xff\xff\xff\xff", open) ==
      "bad msgpack: map header at offset 0 claims 4294967295 entries but only 0 bytes follow");
  BOOST_TEST(message_of("\xdb\xff\xff\xff\xff", open) ==
             "bad msgpack: truncated value at offset 0 (needs 4294967295 bytes, 0 follow)");
  // Inside an otherwise valid submit: the prompt claims 2^32-1 token ids.
  const std::string inner =
      submit().set("prompt", [](Packer& p) { p.pack_array(0xffffffffu); }).bytes();
  BOOST_TEST(message_of(inner).find("array of 4294967295 elements exceeds limit") !=
             std::string::npos);
  // Nested claims that each fit alone but not together (every outstanding element needs a byte).
  std::string nested("\x93\xdc\x00\x10", 4);  // [ [16 elements...], ... ] with far too few bytes
  nested += std::string(15, '\x01');
  BOOST_TEST(message_of(nested, open) ==
             "bad msgpack: array header at offset 1 claims 16 elements but only 15 bytes follow");
}

BOOST_AUTO_TEST_CASE(adversarial_headers_under_an_address_space_cap) {
  // In a child capped at its current size + 256 MiB, decode headers that would make an unguarded
  // msgpack-c reserve gigabytes; the child reports whether each was refused by the codec.
  std::vector<std::string> inputs = {"\xdd\xff\xff\xff\xff", "\xdf\xff\xff\xff\xff",
                                     "\xdb\xff\xff\xff\xff"};
  std::string chain;
  for (int i = 0; i < 15; ++i) chain += "\xdd\x00\x00\xff\xff";  // 15 nested arrays of 65535
  inputs.push_back(chain);
  const pid_t pid = fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    long pages = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    const rlim_t cap =
        static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + (256ull << 20);
    rlimit rl{cap, cap};
    if (pages == 0 || setrlimit(RLIMIT_AS, &rl) != 0) _exit(3);
    DecodeLimits open;
    open.max_array = open.max_map = open.max_string_bytes = 0xffffffffu;
    for (const auto& in : inputs) {
      auto r = decode_client(in.data(), in.size(), open);
      const auto* e = std::get_if<DecodeError>(&r);
      if (!e || e->message.rfind("bad msgpack: ", 0) != 0 ||
          e->message.find("memory") != std::string::npos)
        _exit(1);
    }
    _exit(0);
  }
  int status = 0;
  BOOST_REQUIRE(waitpid(pid, &status, 0) == pid);
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0);
}

BOOST_AUTO_TEST_CASE(nesting_depth) {
  const std::string deep = std::string(1000, '\x91') + "\xc0";  // [[[...[nil]...]]], depth 1000
  BOOST_TEST(message_of(deep) == "bad msgpack: nesting deeper than 32");
  const std::string deep_maps = [] {
    std::string s;
    for (int i = 0; i < 1000; ++i) s += "\x81\xa1k";
    return s + "\xc0";
  }();
  BOOST_TEST(message_of(deep_maps) == "bad msgpack: nesting deeper than 32");
  // 32 levels are fine for msgpack; the top level then is not a map.
  BOOST_TEST(message_of(std::string(32, '\x91') + "\xc0") == "message must be a map, got array");
  BOOST_TEST(message_of(std::string(33, '\x91') + "\xc0") == "bad msgpack: nesting deeper than 32");
  // Deep nesting inside a field of a valid submit is refused the same way.
  const std::string in_field = submit()
                                   .set("json_schema",
                                        [](Packer& p) {
                                          for (int i = 0; i < 40; ++i) p.pack_array(1);
                                          p.pack_nil();
                                        })
                                   .bytes();
  BOOST_TEST(message_of(in_field) == "bad msgpack: nesting deeper than 32");
}

BOOST_AUTO_TEST_CASE(oversized_message) {
  DecodeLimits lim;
  lim.max_message_bytes = 100;
  const std::string big = submit().set("prompt", S(std::string(200, 'a'))).bytes();
  BOOST_TEST(message_of(big, lim) ==
             "message of " + std::to_string(big.size()) + " bytes exceeds limit 100");
}

BOOST_AUTO_TEST_CASE(shape_errors) {
  BOOST_TEST(message_of("\x05") == "message must be a map, got integer");
  BOOST_TEST(message_of("\x92\x01\x02") == "message must be a map, got array");
  BOOST_TEST(message_of("\x81\x01\x02") == "map keys must be strings, got integer");
  Msg dup = submit();
  dup.fields.emplace_back("id", S("j2"));
  BOOST_TEST(message_of(dup.bytes()) == "duplicate field 'id'");
}

BOOST_AUTO_TEST_CASE(speculative_mode_is_named) {
  BOOST_TEST(message_of(submit().set("speculative", S("fast")).bytes()) ==
             "field 'speculative' must be \"auto\", \"always\" or \"off\", got 'fast'");
  BOOST_TEST(message_of(submit().set("speculative", U(1)).bytes()) ==
             "field 'speculative' must be a string, got integer");
}

BOOST_AUTO_TEST_CASE(header_fields) {
  BOOST_TEST(message_of(submit().drop("v").bytes()) == "missing field 'v'");
  BOOST_TEST(message_of(submit().set("v", U(2)).bytes()) ==
             "unsupported protocol version 2 (this side speaks 1)");
  BOOST_TEST(message_of(submit().set("v", I(-1)).bytes()) ==
             "unsupported protocol version -1 (this side speaks 1)");
  BOOST_TEST(message_of(submit().set("v", S("1")).bytes()) ==
             "field 'v' must be an integer, got string");
  BOOST_TEST(message_of(submit().drop("type").bytes()) == "missing field 'type'");
  BOOST_TEST(message_of(submit().set("type", U(3)).bytes()) ==
             "field 'type' must be a string, got integer");
  BOOST_TEST(message_of(submit().set("type", S("x")).bytes()) == "unknown message type 'x'");
  BOOST_TEST(message_of(submit().set("type", S("done")).bytes()) == "unknown message type 'done'");
  BOOST_TEST(message_of(submit().set("type", S("a'\x01")).bytes()) ==
             "unknown message type 'a\\x27\\x01'");
  BOOST_TEST(message_of(submit().set("type", S(std::string(100, 'z'))).bytes()) ==
             "unknown message type '" + std::string(64, 'z') + "...'");
}

BOOST_AUTO_TEST_CASE(missing_fields_and_partial_key) {
  const DecodeError e = error_of(submit().drop("tenant").bytes());
  BOOST_TEST(e.message == "missing field 'tenant'");
  BOOST_TEST(e.id == "j1");  // the reply can still name the job
  BOOST_TEST(message_of(submit().drop("id").bytes()) == "missing field 'id'");
  BOOST_TEST(message_of(submit().drop("prompt").bytes()) == "missing field 'prompt'");
  BOOST_TEST(message_of(submit().set("tenant", Nil()).bytes()) == "missing field 'tenant'");
  BOOST_TEST(message_of(submit().set("id", S("")).bytes()) == "field 'id' must not be empty");
  const DecodeError c =
      error_of(Msg().set("v", U(1)).set("type", S("cancel")).set("tenant", S("t")).bytes());
  BOOST_TEST(c.message == "missing field 'id'");
  BOOST_TEST(c.tenant == "t");
}

BOOST_AUTO_TEST_CASE(wrong_field_types) {
  struct Case {
    const char* key;
    Value v;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"id", U(5), "field 'id' must be a string, got integer"},
      {"tenant", F(1.5), "field 'tenant' must be a string, got float"},
      {"token", B(true), "field 'token' must be a string, got boolean"},
      {"prompt", U(5), "field 'prompt' must be a string or an array of token ids, got integer"},
      {"prompt", [](Packer& p) { p.pack_map(0); },
       "field 'prompt' must be a string or an array of token ids, got map"},
      {"prompt",
       [](Packer& p) {
         p.pack_array(2);
         p.pack(1);
         p.pack(std::string("a"));
       },
       "prompt token at index 1 must be an integer, got string"},
      {"prompt",
       [](Packer& p) {
         p.pack_array(1);
         p.pack_double(1.5);
       },
       "prompt token at index 0 must be an integer, got float"},
      {"max_tokens", S("10"), "field 'max_tokens' must be an integer, got string"},
      {"max_tokens", F(1.5), "field 'max_tokens' must be an integer, got float"},
      {"temperature", S("hot"), "field 'temperature' must be a number, got string"},
      {"top_k", F(2.5), "field 'top_k' must be an integer, got float"},
      {"top_p", B(false), "field 'top_p' must be a number, got boolean"},
      {"seed", S("x"), "field 'seed' must be an integer, got string"},
      {"stop", U(1), "field 'stop' must be a string or an array of strings, got integer"},
      {"stop", Ids({1}), "stop string at index 0 must be a string, got integer"},
      {"ignore_eos", U(1), "field 'ignore_eos' must be a boolean, got integer"},
      {"priority", U(1), "field 'priority' must be a string, got integer"},
      {"deadline_ms", F(0.5), "field 'deadline_ms' must be an integer, got float"},
      {"stream", S("yes"), "field 'stream' must be a boolean, got string"},
      {"logprobs", B(true), "field 'logprobs' must be an integer, got boolean"},
      {"id",
       [](Packer& p) {
         p.pack_bin(2);
         p.pack_bin_body("ab", 2);
       },
       "field 'id' must be a string, got binary"},
  };
  for (const auto& c : cases)
    BOOST_TEST(message_of(submit().set(c.key, c.v).bytes()) == c.expect, "field " << c.key);
}

BOOST_AUTO_TEST_CASE(out_of_range_values) {
  struct Case {
    const char* key;
    Value v;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"max_tokens", U(0), "max_tokens 0 out of range [1, 4096]"},
      {"max_tokens", U(4097), "max_tokens 4097 out of range [1, 4096]"},
      {"max_tokens", I(-3), "max_tokens -3 out of range [1, 4096]"},
      {"max_tokens", U(~0ull), "max_tokens 18446744073709551615 out of range [1, 4096]"},
      {"temperature", F(-0.5), "temperature -0.5 out of range [0, 100]"},
      {"temperature", F(std::nan("")), "temperature nan out of range [0, 100]"},
      {"temperature", F(std::numeric_limits<double>::infinity()),
       "temperature inf out of range [0, 100]"},
      {"temperature", U(101), "temperature 101 out of range [0, 100]"},
      {"top_p", U(0), "top_p 0 out of range (0, 1]"},
      {"top_p", F(1.5), "top_p 1.5 out of range (0, 1]"},
      {"top_k", I(-1), "top_k -1 out of range [0, 2147483647]"},
      {"seed", I(-1), "seed -1 out of range [0, 18446744073709551615]"},
      {"deadline_ms", U(86'400'001), "deadline_ms 86400001 out of range [0, 86400000]"},
      {"logprobs", U(21), "logprobs 21 out of range [0, 20]"},
      {"prompt", S(""), "field 'prompt' must not be empty"},
      {"prompt", Ids({}), "field 'prompt' must not be empty"},
      {"prompt", Ids({1, -1}), "prompt token at index 1 is -1, must be in [0, 2147483647]"},
      {"prompt", Ids({1ll << 31}),
       "prompt token at index 0 is 2147483648, must be in [0, 2147483647]"},
      {"prompt", Ids(std::vector<int64_t>(70000, 1)), "prompt has 70000 tokens, limit 4096"},
      {"prompt", S(std::string(300000, 'a')), "prompt text has 300000 bytes, limit 262144"},
      {"id", S(std::string(200, 'x')), "field 'id' has 200 bytes, limit 128"},
      {"tenant", S(std::string(65, 'x')), "field 'tenant' has 65 bytes, limit 64"},
      {"stop",
       [](Packer& p) {
         p.pack_array(17);
         for (int i = 0; i < 17; ++i) p.pack(std::string("s"));
       },
       "stop has 17 strings, limit 16"},
      {"stop",
       [](Packer& p) {
         p.pack_array(2);
         p.pack(std::string("a"));
         p.pack(std::string());
       },
       "stop string at index 1 must not be empty"},
      {"stop", S(std::string(257, 's')), "stop string at index 0 has 257 bytes, limit 256"},
  };
  for (const auto& c : cases)
    BOOST_TEST(message_of(submit().set(c.key, c.v).bytes()) == c.expect, "field " << c.key);
}

BOOST_AUTO_TEST_CASE(limits_follow_the_configuration) {
  DecodeLimits lim;
  lim.max_prompt_tokens = 8;
  lim.max_new_tokens = 100;
  BOOST_TEST(message_of(submit().set("prompt", Ids(std::vector<int64_t>(9, 1))).bytes(), lim) ==
             "prompt has 9 tokens, limit 8");
  BOOST_TEST(message_of(submit().set("max_tokens", U(101)).bytes(), lim) ==
             "max_tokens 101 out of range [1, 100]");
  const std::string ok = submit().set("prompt", Ids(std::vector<int64_t>(8, 1))).bytes();
  BOOST_TEST(std::holds_alternative<ClientMessage>(decode_client(ok.data(), ok.size(), lim)));
}

BOOST_AUTO_TEST_CASE(lenient_where_documented) {
  // nil means "default" for optional fields, numbers may be ints or floats.
  Msg m = submit();
  m.set("temperature", Nil()).set("seed", Nil()).set("stop", S("END"));
  m.set("top_p", F32(0.5f)).set("max_tokens", U(7));
  const Submit s = submit_of(m.bytes());
  BOOST_TEST(s.temperature == 1.0);
  BOOST_TEST(!s.seed.has_value());
  BOOST_TEST(s.stop == std::vector<std::string>{"END"});
  BOOST_TEST(s.top_p == 0.5);
  BOOST_TEST(s.max_tokens == 7u);
  const Submit t = submit_of(submit().set("temperature", U(0)).set("top_p", U(1)).bytes());
  BOOST_TEST(t.temperature == 0.0);
  BOOST_TEST(t.top_p == 1.0);
}

BOOST_AUTO_TEST_CASE(server_side_decoder_is_guarded_too) {
  auto err = [](const std::string& b) {
    auto r = decode_server(b.data(), b.size());
    BOOST_REQUIRE(std::holds_alternative<DecodeError>(r));
    return std::get<DecodeError>(r).message;
  };
  BOOST_TEST(err("\xdd\xff\xff\xff\xff") ==
             "bad msgpack: array of 4294967295 elements exceeds limit 131072");
  BOOST_TEST(err(std::string(1000, '\x91') + "\xc0") == "bad msgpack: nesting deeper than 32");
  BOOST_TEST(err(submit().bytes()) == "unknown message type 'submit'");
  Msg done;
  done.set("v", U(1)).set("type", S("done")).set("id", S("j")).set("finish_reason", S("tired"));
  BOOST_TEST(err(done.bytes()) == "unknown finish_reason 'tired'");
  done.set("finish_reason", S("stop")).set("usage", [](Packer& p) {
    p.pack_map(1);
    p.pack(std::string("prompt_tokens"));
    p.pack(std::string("many"));
  });
  BOOST_TEST(err(done.bytes()) == "field 'usage.prompt_tokens' must be an integer, got string");
  Msg tok;
  tok.set("v", U(1)).set("type", S("tokens")).set("id", S("j")).set("logprobs", [](Packer& p) {
    p.pack_array(1);
    p.pack_map(2);
    p.pack(std::string("logprob"));
    p.pack_double(-0.5);
    p.pack(std::string("top"));
    p.pack_array(1);
    p.pack_array(3);
    p.pack(1);
    p.pack(2);
    p.pack(3);
  });
  BOOST_TEST(err(tok.bytes()) == "field 'logprobs.0.top.0' must be an [id, logprob] pair");
}

BOOST_AUTO_TEST_CASE(control_messages_are_checked) {
  Msg c;
  c.set("v", U(1))
      .set("type", S("control"))
      .set("token", S("adm"))
      .set("command", S("kv_policy"))
      .set("policy", S("sliding_window:32"));
  {
    auto r = decode_client(c.bytes().data(), c.bytes().size());
    BOOST_REQUIRE(std::holds_alternative<ClientMessage>(r));
    const Control got = std::get<Control>(std::get<ClientMessage>(r));
    BOOST_TEST(got.policy == "sliding_window:32");
  }
  BOOST_TEST(message_of(Msg(c).drop("policy").bytes()) == "missing field 'policy'");
  BOOST_TEST(message_of(Msg(c).set("policy", Nil()).bytes()) == "missing field 'policy'");
  BOOST_TEST(message_of(Msg(c).set("policy", S("")).bytes()) == "field 'policy' must not be empty");
  BOOST_TEST(message_of(Msg(c).set("policy", U(3)).bytes()) ==
             "field 'policy' must be a string, got integer");
  BOOST_TEST(message_of(Msg(c).set("policy", S(std::string(65, 'x'))).bytes()) ==
             "field 'policy' has 65 bytes, limit 64");
  BOOST_TEST(message_of(Msg(c).drop("command").bytes()) == "missing field 'command'");
  BOOST_TEST(message_of(Msg(c).set("command", S("reboot")).bytes()) ==
             "unknown control command 'reboot' (kv_policy, stats, drain or resume)");
  BOOST_TEST(message_of(Msg(c).set("command", B(true)).bytes()) ==
             "field 'command' must be a string, got boolean");
  BOOST_TEST(message_of(Msg(c).set("token", I(-1)).bytes()) ==
             "field 'token' must be a string, got integer");
  // stats needs no policy; an empty one is ignored rather than refused.
  Msg st;
  st.set("v", U(1)).set("type", S("control")).set("command", S("stats")).set("policy", S(""));
  auto r = decode_client(st.bytes().data(), st.bytes().size());
  BOOST_REQUIRE(std::holds_alternative<ClientMessage>(r));
  BOOST_TEST(std::get<Control>(std::get<ClientMessage>(r)).command == "stats");
}

BOOST_AUTO_TEST_CASE(control_reply_and_cached_tokens_are_checked_client_side) {
  Msg cr;
  cr.set("v", U(1))
      .set("type", S("control_reply"))
      .set("command", S("stats"))
      .set("result", S("{}"));
  auto ok = decode_server(cr.bytes().data(), cr.bytes().size());
  BOOST_REQUIRE(std::holds_alternative<ServerMessage>(ok));
  auto bad =
      decode_server(Msg(cr).drop("command").bytes().data(), Msg(cr).drop("command").bytes().size());
  BOOST_REQUIRE(std::holds_alternative<DecodeError>(bad));
  BOOST_TEST(std::get<DecodeError>(bad).message == "missing field 'command'");
  const std::string bytes = Msg(cr).set("result", U(1)).bytes();
  auto bad2 = decode_server(bytes.data(), bytes.size());
  BOOST_REQUIRE(std::holds_alternative<DecodeError>(bad2));
  BOOST_TEST(std::get<DecodeError>(bad2).message == "field 'result' must be a string, got integer");

  Msg d;
  d.set("v", U(1))
      .set("type", S("done"))
      .set("id", S("j"))
      .set("finish_reason", S("stop"))
      .set("usage", [](Packer& p) {
        p.pack_map(1);
        p.pack(std::string("cached_tokens"));
        p.pack_int64(-4);
      });
  const std::string db = d.bytes();
  auto bad3 = decode_server(db.data(), db.size());
  BOOST_REQUIRE(std::holds_alternative<DecodeError>(bad3));
  BOOST_TEST(std::get<DecodeError>(bad3).message ==
             "usage.cached_tokens -4 out of range [0, 4294967295]");
}

BOOST_AUTO_TEST_SUITE_END()  // test_codec_malformed
