// `switchyard submit` against the real server: a JSONL batch runs to completion with one result
// line per job; an interrupted output (some lines plus a torn one) resumes without rerunning the
// jobs already there; a bad input line is refused before anything is sent.
#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>
#include <set>

#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_submit_cmd)

namespace {

using sy::it::Run;

Run run(const std::string& args) {
  return sy::it::run_binary(args);
}

std::vector<std::string> lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> out;
  std::string l;
  while (std::getline(f, l)) out.push_back(l);
  return out;
}

// The ids of a results file, each checked to be a done line with `tokens` completion tokens.
std::multiset<std::string> result_ids(const std::string& path, int64_t tokens) {
  std::multiset<std::string> ids;
  for (const auto& l : lines(path)) {
    auto j = nlohmann::json::parse(l);
    ids.insert(j.at("id").get<std::string>());
    BOOST_TEST(j.at("usage").at("completion_tokens").get<int64_t>() == tokens, l);
    BOOST_TEST(j.at("ids").size() == static_cast<size_t>(tokens), l);
  }
  return ids;
}

}  // namespace

BOOST_AUTO_TEST_CASE(batch_runs_and_resumes) {
  sy::it::TempDir dir;
  sy::it::ServerProcess srv({"--backend", "null"});
  std::string jobs;
  for (int i = 0; i < 300; ++i)
    jobs += "{\"id\": \"j" + std::to_string(i) + "\", \"prompt\": [1, 2, 3], \"max_tokens\": 5, " +
            "\"ignore_eos\": true, \"meta\": {\"note\": \"not sent\"}}\n";
  std::string in = dir.write("jobs.jsonl", jobs);
  std::string out = dir.path() + "/results.jsonl";
  std::string common = "submit --input " + in + " --output " + out + " --server " + srv.endpoint();

  auto r = run(common + " --window 7");
  BOOST_TEST(r.status == 0, r.out);
  BOOST_TEST(r.out.find("300 done") != std::string::npos, r.out);
  auto ids = result_ids(out, 5);
  BOOST_TEST(ids.size() == 300u);
  BOOST_TEST(std::set<std::string>(ids.begin(), ids.end()).size() == 300u);

  // Interrupted: keep 120 lines and half of the next one.
  auto all = lines(out);
  std::string kept;
  for (int i = 0; i < 120; ++i) kept += all[i] + "\n";
  kept += all[120].substr(0, all[120].size() / 2);
  dir.write("results.jsonl", kept);
  r = run(common);
  BOOST_TEST(r.status == 0, r.out);
  BOOST_TEST(r.out.find("120 skipped") != std::string::npos, r.out);
  BOOST_TEST(r.out.find("180 done") != std::string::npos, r.out);
  ids = result_ids(out, 5);
  BOOST_TEST(ids.size() == 300u);
  BOOST_TEST(std::set<std::string>(ids.begin(), ids.end()).size() == 300u);

  // Everything there: nothing runs.
  r = run(common);
  BOOST_TEST(r.status == 0, r.out);
  BOOST_TEST(r.out.find("0 done") != std::string::npos, r.out);
  BOOST_TEST(r.out.find("300 skipped") != std::string::npos, r.out);
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_CASE(bad_input_line_is_named) {
  sy::it::TempDir dir;
  std::string in = dir.write("bad.jsonl",
                             "{\"id\": \"a\", \"prompt\": \"x\"}\n{\"id\": \"b\", \"max_tokens\": "
                             "\"many\", \"prompt\": \"x\"}\n");
  // No server needed: the input is checked before connecting.
  auto r = run("submit --input " + in + " --output " + dir.path() +
               "/o.jsonl --server tcp://127.0.0.1:1");
  BOOST_TEST(r.status == 2, r.out);
  BOOST_TEST(r.out.find("input line 2: 'max_tokens' must be an integer") != std::string::npos,
             r.out);
  // An unknown key is refused by name (a misspelt field never silently drops out).
  in = dir.write("typo.jsonl", "{\"id\": \"a\", \"prompt\": \"x\", \"temprature\": 0}\n");
  r = run("submit --input " + in + " --output " + dir.path() +
          "/o.jsonl --server tcp://127.0.0.1:1");
  BOOST_TEST(r.status == 2, r.out);
  BOOST_TEST(r.out.find("input line 1: unknown field 'temprature'") != std::string::npos, r.out);
  r = run("submit --output x");
  BOOST_TEST(r.status == 2);
  BOOST_TEST(r.out.find("submit needs --input") != std::string::npos, r.out);
}

// Constraints and sampling controls travel in a job line: the results satisfy the constraints.
BOOST_AUTO_TEST_CASE(constrained_lines_run) {
  sy::it::TempDir dir;
  sy::it::ServerProcess srv({"--model", sy::it::kStories, "--threads", "1"});
  const std::string in = dir.write(
      "c.jsonl",
      "{\"id\": \"choice\", \"prompt\": \"Lily\", \"choices\": [\" ran\", \" sat down\"], "
      "\"temperature\": 1, \"seed\": 3, \"meta\": {\"row\": 1}}\n"
      "{\"id\": \"schema\", \"prompt\": \"Lily\", \"max_tokens\": 60, \"json_schema\": "
      "{\"type\": \"object\", \"properties\": {\"age\": {\"type\": \"integer\", \"minimum\": 1, "
      "\"maximum\": 9}}, \"required\": [\"age\"], \"additionalProperties\": false}, "
      "\"min_p\": 0.05, \"presence_penalty\": 0.5, \"frequency_penalty\": 0.1, "
      "\"repetition_penalty\": 1.1, \"repeat_last_n\": 16, \"logit_bias\": {\"2\": -100}}\n");
  const std::string out = dir.path() + "/r.jsonl";
  auto r = run("submit --input " + in + " --output " + out + " --server " + srv.endpoint());
  BOOST_TEST(r.status == 0, r.out);
  const auto got = lines(out);
  BOOST_REQUIRE(got.size() == 2u);
  for (const auto& line : got) {
    const auto j = nlohmann::json::parse(line);
    BOOST_TEST_CONTEXT(line) {
      BOOST_REQUIRE(j.contains("text"));
      const std::string text = j["text"].get<std::string>();
      if (j["id"] == "choice") BOOST_TEST((text == " ran" || text == " sat down"));
      if (j["id"] == "schema" && j["finish_reason"] == "stop") {
        const auto v = nlohmann::json::parse(text);
        BOOST_TEST(v["age"].get<int>() >= 1);
        BOOST_TEST(v["age"].get<int>() <= 9);
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()  // test_submit_cmd
