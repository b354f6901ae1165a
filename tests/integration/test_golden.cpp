// Must-show 8: greedy output through the real server equals llama.cpp's token ids for the prompts
// of reference-llamacpp.json, streamed and not, one at a time and all at once; and the server
// exits 0 on SIGTERM.
#include <boost/test/unit_test.hpp>

#include "clients/cpp/client.hpp"
#include "tests/integration/server_process.hpp"
#include "tests/support/reference.hpp"

BOOST_AUTO_TEST_SUITE(test_golden)

using namespace std::chrono_literals;

namespace {

// A reference case; its expected ids are the generated_token_ids.
using Case = sy::test::ReferenceCase;

sy::wire::Submit greedy(const std::string& id, const Case& c, bool stream, bool as_ids) {
  sy::wire::Submit s;
  s.id = id;
  s.tenant = "golden";
  if (as_ids)
    s.prompt = c.prompt_token_ids;
  else
    s.prompt = c.prompt;
  s.max_tokens = static_cast<uint32_t>(c.generated_token_ids.size());
  s.temperature = 0;
  s.stream = stream;
  return s;
}

// Checks one job's result: ids equal, streamed chunks contiguous, done says length.
void check(const sy::client::Result& r, const Case& c, bool stream, const std::string& what) {
  BOOST_TEST_CONTEXT(what) {
    BOOST_REQUIRE_MESSAGE(r.ok(), (r.error ? r.error->message : std::string("no done")));
    BOOST_TEST(r.ids == c.generated_token_ids, boost::test_tools::per_element());
    BOOST_TEST(r.done->usage.completion_tokens == c.generated_token_ids.size());
    BOOST_TEST(r.done->usage.prompt_tokens == c.prompt_token_ids.size());
    BOOST_TEST(sy::wire::to_string(r.done->finish_reason) == "length");
    if (stream) {
      BOOST_TEST(!r.chunks.empty());
      uint32_t next = 0;
      for (const auto& ch : r.chunks) {
        BOOST_TEST(ch.index == next);
        next += static_cast<uint32_t>(ch.ids.size());
      }
      BOOST_TEST(r.done->ids.empty());  // a streamed done carries no ids (the chunks did)
    } else {
      BOOST_TEST(r.chunks.empty());
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(greedy_matches_llamacpp_streamed_and_not) {
  const auto& cases = sy::test::reference_cases();
  BOOST_REQUIRE(cases.size() >= 6u);
  sy::it::ServerProcess srv({"--model", sy::it::kStories, "--threads", "1"});
  sy::client::Client cl(srv.endpoint());
  BOOST_REQUIRE(cl.ping_wait(10s));

  // One at a time: text prompt and id prompt, streamed and not.
  int n = 0;
  for (const auto& c : cases) {
    for (bool stream : {false, true}) {
      for (bool as_ids : {false, true}) {
        std::string id = "seq" + std::to_string(n++);
        auto r = cl.run(greedy(id, c, stream, as_ids), 60s);
        check(r, c, stream, c.prompt + (stream ? " streamed" : "") + (as_ids ? " ids" : " text"));
      }
    }
  }

  // All at once: the batcher runs them in one continuous batch; greedy output must not change.
  std::vector<std::pair<std::string, std::pair<const Case*, bool>>> sent;
  for (const auto& c : cases) {
    for (bool stream : {false, true}) {
      std::string id = "par" + std::to_string(n++);
      cl.submit(greedy(id, c, stream, false));
      sent.push_back({id, {&c, stream}});
    }
  }
  for (auto& [id, cs] : sent) {
    auto r = cl.wait(id, 60s);
    check(r, *cs.first, cs.second, cs.first->prompt + " batched " + id);
  }

  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

// Speculation with a draft model on whatever backend the server picks (on the emulated device
// in emu_it_test_golden: the draft model's CUDA engine and its KV pool beside the target's): the
// target as its own draft, every decode drafting, gives llama.cpp's ids, and drafts were fed.
BOOST_AUTO_TEST_CASE(a_draft_model_keeps_the_greedy_ids) {
  const auto& cases = sy::test::reference_cases();
  BOOST_REQUIRE(cases.size() >= 2u);
  sy::it::TempDir dir;
  const std::string cfg = dir.write("m.yaml", "metrics:\n  bind: \"127.0.0.1:0\"\n");
  sy::it::ServerProcess srv({"--model", sy::it::kStories, "--draft-model", sy::it::kStories,
                             "--speculative", "always", "--threads", "1", "--config", cfg});
  sy::client::Client cl(srv.endpoint());
  BOOST_REQUIRE(cl.ping_wait(10s));
  for (size_t i = 0; i < 2; ++i) {
    const Case& c = cases[i];
    check(cl.run(greedy("draft" + std::to_string(i), c, false, true), 120s), c, false,
          c.prompt + " with a draft model");
  }
  const std::string page = sy::it::http_get(srv.metrics_endpoint(), "/metrics").body;
  const auto at = page.find("\nswitchyard_spec_draft_tokens_total ");
  BOOST_REQUIRE_MESSAGE(at != std::string::npos, page);
  BOOST_TEST(std::stod(page.substr(at + 36)) > 0.0, page.substr(at, 60));
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_CASE(sigterm_and_sigint_exit_zero) {
  for (int sig : {SIGTERM, SIGINT}) {
    sy::it::ServerProcess srv({"--backend", "null", "--grace-ms", "2000"});
    sy::client::Client cl(srv.endpoint());
    sy::wire::Submit s;
    s.id = "one";
    s.tenant = "t";
    s.prompt = std::vector<int32_t>{1, 2, 3};
    s.max_tokens = 4;
    auto r = cl.run(s, 30s);
    BOOST_TEST(r.ok());
    BOOST_TEST(srv.stop(sig) == 0);
  }
}

BOOST_AUTO_TEST_CASE(sigterm_lets_a_running_job_finish_within_grace) {
  // A slowed executor (TEST ONLY flag): 40 steps of 20 ms. SIGTERM arrives mid-job; the grace
  // period (10 s) is long enough, so the job still ends with done and all its tokens.
  sy::it::ServerProcess srv({"--backend", "null", "--step-delay-ms", "20", "--grace-ms", "10000"});
  sy::client::Client cl(srv.endpoint());
  sy::wire::Submit s;
  s.id = "long";
  s.tenant = "t";
  s.prompt = std::vector<int32_t>{1, 2, 3};
  s.max_tokens = 40;
  s.stream = true;
  cl.submit(s);
  // Wait for the first chunk: the job is running.
  bool running = false;
  std::vector<sy::wire::ServerMessage> early;
  for (int i = 0; i < 100 && !running; ++i) {
    auto m = cl.next(1s);
    if (!m) continue;
    running = std::holds_alternative<sy::wire::Tokens>(*m);
    early.push_back(*m);
  }
  BOOST_REQUIRE(running);
  ::kill(srv.pid(), SIGTERM);
  auto r = cl.wait("long", 30s);
  BOOST_REQUIRE_MESSAGE(r.ok(), (r.error ? r.error->message : std::string("no done")));
  BOOST_TEST(r.done->usage.completion_tokens == 40u);
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_CASE(sigterm_stops_within_grace_when_a_job_runs_longer) {
  // A job of 1000 steps of 50 ms (50 s) against a grace period of 300 ms: the server must not
  // wait for it, and still exits 0.
  sy::it::ServerProcess srv({"--backend", "null", "--step-delay-ms", "50", "--grace-ms", "300"});
  sy::client::Client cl(srv.endpoint());
  sy::wire::Submit s;
  s.id = "endless";
  s.tenant = "t";
  s.prompt = std::vector<int32_t>{1, 2, 3};
  s.max_tokens = 1000;
  s.stream = true;
  cl.submit(s);
  bool running = false;
  for (int i = 0; i < 100 && !running; ++i) {
    auto m = cl.next(1s);
    running = m && std::holds_alternative<sy::wire::Tokens>(*m);
  }
  BOOST_REQUIRE(running);
  // A queued job behind it (max_sequences is 64, so it runs too) and the signal, once the server
  // has accepted it: a submit still on its way when the drain starts is answered `unavailable`.
  s.id = "endless2";
  cl.submit(s);
  bool accepted = false;
  for (int i = 0; i < 200 && !accepted; ++i) {
    auto m = cl.next(1s);
    if (!m) continue;
    if (auto* a = std::get_if<sy::wire::Accepted>(&*m)) accepted = a->id == "endless2";
    if (auto* t = std::get_if<sy::wire::Tokens>(&*m)) accepted = t->id == "endless2";
  }
  BOOST_REQUIRE(accepted);
  ::kill(srv.pid(), SIGTERM);
  // Both end with done "cancelled" once the grace period is over, not with silence.
  for (const char* id : {"endless", "endless2"}) {
    auto r = cl.wait(id, 20s);
    BOOST_REQUIRE_MESSAGE(r.ok(),
                          id << ": " << (r.error ? r.error->message : std::string("no done")));
    BOOST_TEST(sy::wire::to_string(r.done->finish_reason) == "cancelled");
    BOOST_TEST(r.done->usage.completion_tokens < 1000u);
  }
  // 20 s is far beyond 300 ms of grace yet far below the job's 50 s.
  BOOST_TEST(srv.stop(SIGTERM, std::chrono::seconds(20)) == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_golden
