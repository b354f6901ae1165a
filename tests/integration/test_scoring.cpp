// Samples, prompt log-probabilities and `score` through the real server on stories260K: scores
// and prompt_logprobs equal llama.cpp's teacher-forced log-probabilities (the reference's
// top1_logprobs of its greedy continuations) within the golden tests' tolerance; n samples come
// back as choices with the prompt counted once; bad values are refused naming the field.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "clients/cpp/client.hpp"
#include "tests/integration/server_process.hpp"
#include "tests/support/reference.hpp"

BOOST_AUTO_TEST_SUITE(test_scoring)

using namespace std::chrono_literals;

namespace {

using Ids = std::vector<int32_t>;

sy::wire::Submit plain(const std::string& id, const Ids& prompt, uint32_t max_tokens) {
  sy::wire::Submit s;
  s.id = id;
  s.tenant = "scoring";
  s.prompt = prompt;
  s.max_tokens = max_tokens;
  s.temperature = 0;
  return s;
}

std::pair<double, double> diffs(const std::vector<double>& got, const std::vector<double>& want) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  double sum = 0, worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    sum += std::abs(got[i] - want[i]);
    worst = std::max(worst, std::abs(got[i] - want[i]));
  }
  return {sum / static_cast<double>(got.size()), worst};
}

}  // namespace

BOOST_AUTO_TEST_CASE(scores_and_prompt_logprobs_match_llamacpp) {
  sy::it::ServerProcess srv({"--model", sy::it::kStories, "--threads", "1"});
  sy::client::Client cl(srv.endpoint());
  BOOST_REQUIRE(cl.ping_wait(10s));
  int k = 0;
  for (const auto& c : sy::test::reference_cases(64)) {
    // score: the golden continuation and its first 16 tokens, after the prompt.
    const Ids half(c.generated_token_ids.begin(), c.generated_token_ids.begin() + 16);
    auto r = cl.run(sy::client::score_request("s" + std::to_string(k), "scoring",
                                              c.prompt_token_ids, {c.generated_token_ids, half}),
                    120s);
    BOOST_REQUIRE_MESSAGE(r.ok(), (r.error ? r.error->message : std::string("no done")));
    const sy::wire::Done& d = *r.done;
    BOOST_REQUIRE_EQUAL(d.scores.size(), 2u);
    const double want = std::accumulate(c.top1_logprobs.begin(), c.top1_logprobs.end(), 0.0);
    const double want_half =
        std::accumulate(c.top1_logprobs.begin(), c.top1_logprobs.begin() + 16, 0.0);
    BOOST_TEST(d.scores[0].index == 0u);
    BOOST_TEST(d.scores[0].tokens == c.generated_token_ids.size());
    BOOST_TEST(std::abs(d.scores[0].logprob - want) < 1e-3 * d.scores[0].tokens);
    BOOST_TEST(std::abs(d.scores[0].mean - want / d.scores[0].tokens) < 1e-3);
    BOOST_TEST(d.scores[1].tokens == 16u);
    BOOST_TEST(std::abs(d.scores[1].logprob - want_half) < 1e-3 * 16);
    BOOST_TEST(d.usage.prompt_tokens == c.prompt_token_ids.size());
    BOOST_TEST(d.usage.completion_tokens == c.generated_token_ids.size() + 16u);
    BOOST_TEST(sy::wire::to_string(d.finish_reason) == "stop");

    // prompt_logprobs over prompt + continuation: the continuation's positions, token by token.
    Ids prompt = c.prompt_token_ids;
    prompt.insert(prompt.end(), c.generated_token_ids.begin(), c.generated_token_ids.end());
    sy::wire::Submit s = plain("p" + std::to_string(k), prompt, 1);
    s.prompt_logprobs = 2;
    auto p = cl.run(s, 120s);
    BOOST_REQUIRE_MESSAGE(p.ok(), (p.error ? p.error->message : std::string("no done")));
    const auto& plp = p.done->prompt_logprobs;
    BOOST_REQUIRE_EQUAL(plp.size(), prompt.size() - 1);
    std::vector<double> got;
    for (size_t i = 0; i < plp.size(); ++i) {
      BOOST_TEST(plp[i].id == prompt[i + 1]);
      BOOST_TEST(plp[i].top.size() == 2u);
      if (i + 1 >= c.prompt_token_ids.size()) got.push_back(plp[i].logprob);
    }
    const auto [mean, worst] = diffs(got, c.top1_logprobs);
    BOOST_TEST_MESSAGE(c.prompt << ": mean |diff| " << mean << ", worst " << worst);
    BOOST_TEST(mean < 1e-3);
    BOOST_TEST(worst < 1e-2);
    ++k;
  }
}

BOOST_AUTO_TEST_CASE(text_continuations_and_samples) {
  sy::it::ServerProcess srv({"--model", sy::it::kStories, "--threads", "1"});
  sy::client::Client cl(srv.endpoint());
  BOOST_REQUIRE(cl.ping_wait(10s));
  const sy::test::ReferenceCase c = sy::test::reference_cases(32).front();  // "Once upon a time"

  // Text continuations: SPM's dummy prefix makes "there was" the tokens of " there was".
  auto r = cl.run(sy::client::score_request("t1", "scoring", c.prompt,
                                            {std::string("there was a little girl"),
                                             std::string("purple elephant algebra")}),
                  60s);
  BOOST_REQUIRE_MESSAGE(r.ok(), (r.error ? r.error->message : std::string("no done")));
  BOOST_REQUIRE_EQUAL(r.done->scores.size(), 2u);
  BOOST_TEST(r.done->scores[0].logprob > r.done->scores[1].logprob);
  BOOST_TEST(r.done->usage.prompt_tokens == c.prompt_token_ids.size());

  // Greedy n = 4, streamed and not: four identical golden samples; the prompt counted once.
  for (bool stream : {false, true}) {
    sy::wire::Submit s = plain(stream ? "n4s" : "n4", c.prompt_token_ids, 32);
    s.n = 4;
    s.stream = stream;
    auto n4 = cl.run(s, 60s);
    BOOST_REQUIRE_MESSAGE(n4.ok(), (n4.error ? n4.error->message : std::string("no done")));
    BOOST_REQUIRE_EQUAL(n4.choices.size(), 4u);
    for (uint32_t i = 0; i < 4; ++i) {
      BOOST_TEST(n4.choices[i].index == i);
      BOOST_TEST(n4.choices[i].ids == c.generated_token_ids, boost::test_tools::per_element());
      BOOST_TEST(n4.choices[i].text == c.generated_text);
      BOOST_TEST(sy::wire::to_string(n4.choices[i].finish_reason) == "length");
    }
    BOOST_TEST(n4.done->usage.prompt_tokens == c.prompt_token_ids.size());
    BOOST_TEST(n4.done->usage.completion_tokens == 4u * 32u);
    BOOST_TEST(n4.done->text.empty());
    BOOST_TEST(n4.done->ids.empty());
    if (stream) {
      std::vector<uint32_t> next(4, 0);
      for (const auto& ch : n4.chunks) {
        BOOST_REQUIRE(ch.choice < 4u);
        BOOST_TEST(ch.index == next[ch.choice]);
        next[ch.choice] += static_cast<uint32_t>(ch.ids.size());
      }
    }
  }

  // A plain job's done is unchanged: no choices.
  auto one = cl.run(plain("n1", c.prompt_token_ids, 8), 60s);
  BOOST_REQUIRE(one.ok());
  BOOST_TEST(one.done->choices.empty());
  BOOST_TEST(one.done->prompt_logprobs.empty());
  BOOST_TEST(one.done->ids.size() == 8u);
}

BOOST_AUTO_TEST_CASE(bad_values_are_refused_naming_the_field) {
  sy::it::ServerProcess srv({"--model", sy::it::kStories, "--threads", "1"});
  sy::client::Client cl(srv.endpoint());
  BOOST_REQUIRE(cl.ping_wait(10s));
  const Ids prompt = {1, 403, 407};
  auto refused = [&](sy::wire::Submit s, const std::string& part) {
    auto r = cl.run(s, 20s);
    BOOST_REQUIRE_MESSAGE(r.error.has_value(), "accepted: " + s.id);
    BOOST_TEST((r.error->code == sy::ErrorCode::bad_request));
    BOOST_TEST(r.error->message.find(part) != std::string::npos, r.error->message);
  };
  sy::wire::Submit n17 = plain("b1", prompt, 4);
  n17.n = 17;
  refused(n17, "n 17 out of range [1, 16]");
  sy::wire::Submit n0 = plain("b2", prompt, 4);
  n0.n = 0;
  refused(n0, "n 0 out of range [1, 16]");
  sy::wire::Submit plp = plain("b3", prompt, 4);
  plp.prompt_logprobs = 21;
  refused(plp, "prompt_logprobs 21 out of range [0, 20]");
  std::vector<std::variant<std::string, Ids>> many(65, std::string("x"));
  refused(sy::client::score_request("b4", "scoring", prompt, many),
          "continuations has 65 entries, limit 64");
  refused(sy::client::score_request("b5", "scoring", prompt, {Ids{}}),
          "continuation at index 0 must not be empty");
  refused(sy::client::score_request("b6", "scoring", prompt, {Ids{99999}}),
          "continuation at index 0: token id 99999 is outside the vocabulary");
  refused(sy::client::score_request("b7", "scoring", prompt, {}),
          "field 'continuations' must not be empty");
}

// The Python client and `switchyard submit` (JSONL) speak the same fields.
BOOST_AUTO_TEST_CASE(python_client_and_submit_command) {
  sy::it::ServerProcess srv({"--model", sy::it::kStories, "--threads", "1"});
  sy::client::Client cl(srv.endpoint());
  BOOST_REQUIRE(cl.ping_wait(10s));
  const sy::test::ReferenceCase c = sy::test::reference_cases(32).front();
  sy::it::TempDir dir;
  const std::string py = dir.write(
      "client.py",
      "import sys\nsys.path.insert(0, '" + std::string(SY_SOURCE_DIR) +
          "/clients/python')\n"
          "from switchyard_client import Client\n"
          "with Client(sys.argv[1]) as c:\n"
          "    r = c.run('py1', 'py', [1, 403, 407, 261, 378], max_tokens=4, temperature=0, n=2,\n"
          "              prompt_logprobs=1)\n"
          "    print(len(r.choices), r.choices[0]['ids'] == r.choices[1]['ids'],\n"
          "          len(r.done['prompt_logprobs']), len(r.done['prompt_logprobs'][0]['top']))\n"
          "    s = c.run_score('py2', 'py', [[432, 383], 'there'], prompt=[1, 403, 407, 261, "
          "378])\n"
          "    print(len(s.scores), s.scores[0]['tokens'], s.scores[0]['logprob'] < 0)\n");
  FILE* p = ::popen(("/usr/bin/python3 " + py + " " + srv.endpoint() + " 2>&1").c_str(), "r");
  BOOST_REQUIRE(p);
  char buf[4096];
  std::string out;
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  BOOST_TEST(::pclose(p) == 0, out);
  BOOST_TEST(out == "2 True 4 1\n2 2 True\n");

  const std::string in = dir.write(
      "jobs.jsonl",
      "{\"id\": \"a\", \"prompt\": [1, 403, 407, 261, 378], \"max_tokens\": 4, "
      "\"temperature\": 0, \"n\": 3}\n"
      "{\"id\": \"b\", \"prompt\": [1, 403, 407, 261, 378], \"continuations\": [[432, 383]]}\n");
  auto r = sy::it::run_binary("submit --input " + in + " --output " + dir.path() +
                              "/out.jsonl --server " + srv.endpoint());
  BOOST_TEST(r.status == 0, r.out);
  std::ifstream f(dir.path() + "/out.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("id") == "a") {
      BOOST_TEST(j.at("choices").size() == 3u);
      BOOST_TEST(j.at("choices")[2].at("ids").size() == 4u);
      BOOST_TEST(j.at("usage").at("completion_tokens") == 12);
    } else {
      BOOST_TEST(j.at("scores").size() == 1u);
      BOOST_TEST(j.at("scores")[0].at("tokens") == 2);
      const double want = c.top1_logprobs[0] + c.top1_logprobs[1];
      BOOST_TEST(std::abs(j.at("scores")[0].at("logprob").get<double>() - want) < 2e-3);
    }
    ++lines;
  }
  BOOST_TEST(lines == 2);
}

BOOST_AUTO_TEST_SUITE_END()
