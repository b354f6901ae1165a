// Constrained jobs through the real server on stories260K: each constraint kind ends in text that
// satisfies it (streamed or not), and every bad constraint is a bad_request at the edge naming
// its problem while a greedy job beside them runs to llama.cpp's exact ids (Must show 5).
#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "clients/cpp/client.hpp"
#include "tests/integration/server_process.hpp"
#include "tests/support/reference.hpp"

BOOST_AUTO_TEST_SUITE(test_constraints)

using namespace std::chrono_literals;
using sy::Constraint;

namespace {

sy::wire::Submit job(const std::string& id, Constraint c, double temperature = 1.0) {
  sy::wire::Submit s;
  s.id = id;
  s.tenant = "c";
  s.prompt = std::string("Once upon a time");
  s.max_tokens = 120;
  s.temperature = temperature;
  s.seed = 42;
  s.constraint = std::move(c);
  return s;
}

Constraint of(uint8_t kind, std::string source, std::vector<std::string> options = {}) {
  Constraint c;
  c.kind = kind;
  c.source = std::move(source);
  c.options = std::move(options);
  return c;
}

}  // namespace

BOOST_AUTO_TEST_CASE(each_kind_ends_in_text_that_satisfies_it) {
  sy::it::ServerProcess srv({"--model", sy::it::kStories, "--threads", "1"});
  sy::client::Client c(srv.endpoint());
  BOOST_REQUIRE(c.ping_wait(10s));
  const std::string schema = R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 10},
      "n": {"type": "integer", "minimum": 1, "maximum": 9},
      "mood": {"enum": ["happy", "sad"]}},
    "required": ["name", "n", "mood"], "additionalProperties": false})";
  for (int i = 0; i < 6; ++i) {
    auto s = job("schema" + std::to_string(i), of(Constraint::json_schema, schema));
    s.seed = static_cast<uint64_t>(i);
    s.stream = i % 2 == 1;  // the streamed chunks join to the same checked text
    auto r = c.run(s, 60s);
    BOOST_REQUIRE_MESSAGE(r.done, s.id << ": " << (r.error ? r.error->message : "timeout"));
    if (r.done->finish_reason != sy::wire::FinishReason::stop) continue;  // length: not complete
    const auto j = nlohmann::json::parse(r.text);
    BOOST_TEST(j.size() == 3u, r.text);
    BOOST_TEST(j.at("name").get<std::string>().size() <= 10u * 4);
    BOOST_TEST(j.at("n").get<int>() >= 1);
    BOOST_TEST(j.at("n").get<int>() <= 9);
    const std::string mood = j.at("mood").get<std::string>();
    BOOST_TEST((mood == "happy" || mood == "sad"));
  }
  const std::string date = "(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
  auto r = c.run(job("regex", of(Constraint::regex, date)), 60s);
  BOOST_REQUIRE(r.done);
  BOOST_TEST((r.done->finish_reason == sy::wire::FinishReason::stop));
  BOOST_TEST(std::regex_match(r.text, std::regex(date)), r.text);

  r = c.run(job("choices", of(Constraint::choices, "", {" a dragon", " a princess", " Tim"})), 60s);
  BOOST_REQUIRE(r.done);
  BOOST_TEST((r.text == " a dragon" || r.text == " a princess" || r.text == " Tim"), r.text);

  r = c.run(job("grammar", of(Constraint::grammar, "root ::= \" there was a \" [a-z]{1,12} \".\"")),
            60s);
  BOOST_REQUIRE(r.done);
  BOOST_TEST(std::regex_match(r.text, std::regex(" there was a [a-z]{1,12}\\.")), r.text);

  // Greedy with a constraint that allows the greedy text: the same ids as without it.
  auto free_job = job("free", {}, 0.0);
  free_job.max_tokens = 24;
  auto free_r = c.run(free_job, 60s);
  auto kept = job("kept", of(Constraint::regex, "[ -~]*"), 0.0);
  kept.max_tokens = 24;
  auto kept_r = c.run(kept, 60s);
  BOOST_REQUIRE(free_r.done);
  BOOST_REQUIRE(kept_r.done);
  BOOST_TEST(kept_r.ids == free_r.ids);
}

BOOST_AUTO_TEST_CASE(bad_constraints_are_refused_at_the_edge_and_hurt_no_one) {
  const auto cases = sy::test::reference_cases(64);
  BOOST_REQUIRE(!cases.empty());
  sy::it::ServerProcess srv(
      {"--model", sy::it::kStories, "--threads", "1", "--step-delay-ms", "10"});
  sy::client::Client c(srv.endpoint());
  BOOST_REQUIRE(c.ping_wait(10s));
  // A greedy reference job running beside the refusals.
  sy::wire::Submit good;
  good.id = "good";
  good.tenant = "c";
  good.prompt = cases[0].prompt_token_ids;
  good.max_tokens = static_cast<uint32_t>(cases[0].generated_token_ids.size());
  good.temperature = 0;
  good.stream = true;
  c.submit(good);

  std::string many_rules;
  for (int i = 0; i < 4200; ++i) {
    // Appended piece by piece: g++ 12 warns (-Wrestrict, a false positive) on "r" + to_string().
    many_rules += 'r';
    many_rules += std::to_string(i);
    many_rules += "::=\"x\"\n";
  }
  many_rules += "root ::= r0\n";
  struct Bad {
    std::string id;
    Constraint c;
    std::string names;  // a part of the refusal's message
    bool ignore_eos = false;
  };
  const std::vector<Bad> bad = {
      {"unparsable", of(Constraint::grammar, "root ::= (\"a\"\n"), "line "},
      {"undefined", of(Constraint::grammar, "root ::= \"a\" missing-rule"), "missing-rule"},
      {"no-root", of(Constraint::grammar, "start ::= \"a\""), "root"},
      {"left-recursive", of(Constraint::grammar, "root ::= root \"a\" | \"a\""), "recursi"},
      {"schema-keyword", of(Constraint::json_schema, R"({"type": "array", "uniqueItems": true})"),
       "uniqueItems"},
      {"schema-json", of(Constraint::json_schema, "{\"type\": "), "json_schema"},
      {"schema-remote-ref", of(Constraint::json_schema, R"({"$ref": "http://x/s.json"})"), "$ref"},
      {"backref", of(Constraint::regex, "(a)\\1"), "back-reference"},
      {"lookahead", of(Constraint::regex, "a(?=b)"), "(?="},
      {"rules", of(Constraint::grammar, many_rules), "max_rules"},
      {"elements", of(Constraint::regex, "(a{1000}){1000}"), "max_elements"},
      {"bytes", of(Constraint::regex, std::string(70000, 'a')), "limit 65536"},
      {"with-ignore-eos", of(Constraint::regex, "a+"), "ignore_eos", true},
  };
  for (const Bad& b : bad) {
    auto s = job(b.id, b.c);
    s.ignore_eos = b.ignore_eos;
    c.submit(s);
  }
  for (const Bad& b : bad) {
    auto r = c.wait(b.id, 30s, "c");
    BOOST_TEST_CONTEXT(b.id) {
      BOOST_REQUIRE(r.error);
      BOOST_TEST(!r.accepted);
      BOOST_TEST((r.error->code == sy::ErrorCode::bad_request));
      BOOST_TEST(r.error->message.find(b.names) != std::string::npos, r.error->message);
    }
  }
  auto g = c.wait("good", 60s, "c");
  BOOST_REQUIRE(g.done);
  BOOST_TEST(g.ids == cases[0].generated_token_ids);
  BOOST_TEST(c.ping_wait(5s));
}

BOOST_AUTO_TEST_SUITE_END()
