// Must-show: a mixed-tenant batch. Tenant "a" runs greedy jobs while tenant "b" sends, into the
// same engine steps, jobs with every pathological sampling value we could construct. Each "a"
// job ends with llama.cpp's exact greedy ids; each "b" job is refused at the edge by name, ends
// with its own error, or finishes; the server counts no executor failure, counts each NaN job as
// one sequence failure (stats and /metrics), and stays up.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "clients/cpp/client.hpp"
#include "tests/integration/server_process.hpp"
#include "tests/support/reference.hpp"

BOOST_AUTO_TEST_SUITE(test_sampling_isolation)

using namespace std::chrono_literals;
using sy::ErrorCode;

namespace {

// The server's TEST ONLY flag makes the logits NaN for a job whose first chunk holds this id;
// no reference prompt contains it.
constexpr int32_t kNanToken = 511;
// The admin token of the control `stats` command.
const std::string kAdmin = "adm-secret";

// What a "b" job must end with.
enum class Expect { refused, failed, done, greedy };

struct Case {
  sy::wire::Submit s;
  Expect expect;
  std::string names;  // refused: the field the message names; failed: a word of the message
  const sy::test::ReferenceCase* ref = nullptr;  // greedy: the output it must equal
};

sy::wire::Submit job(const std::string& tenant, const std::string& id,
                     const sy::test::ReferenceCase& c) {
  sy::wire::Submit s;
  s.tenant = tenant;
  s.id = id;
  s.prompt = c.prompt_token_ids;
  s.max_tokens = static_cast<uint32_t>(c.generated_token_ids.size());
  s.temperature = 0;
  return s;
}

// The value of the unlabelled sample `name` on a metrics page; -1 when absent.
double sample(const std::string& page, const std::string& name) {
  auto p = page.find("\n" + name + " ");
  return p == std::string::npos ? -1 : std::stod(page.substr(p + name.size() + 2));
}

}  // namespace

BOOST_AUTO_TEST_CASE(pathological_sampling_never_touches_the_neighbours) {
  const auto cases = sy::test::reference_cases(64);
  BOOST_REQUIRE(cases.size() == 3u);
  // 20 ms per step (TEST ONLY): the greedy jobs need 64 steps, so the "b" jobs, sent once every
  // greedy job has streamed a token, land in steps the greedy jobs are part of.
  sy::it::ServerProcess srv({"--model", sy::it::kStories, "--threads", "1", "--step-delay-ms", "20",
                             "--test-nan-logits-token", std::to_string(kNanToken), "--metrics",
                             "127.0.0.1:0", "--admin-token", kAdmin});
  sy::client::Client ca(srv.endpoint()), cb(srv.endpoint());
  BOOST_REQUIRE(ca.ping_wait(10s));
  BOOST_REQUIRE(cb.ping_wait(10s));

  // Tenant a: the three 64-token reference prompts, streamed and not.
  std::vector<std::pair<std::string, const sy::test::ReferenceCase*>> good;
  for (bool stream : {true, false})
    for (const auto& c : cases) {
      sy::wire::Submit s = job("a", "a" + std::to_string(good.size()), c);
      s.stream = stream;
      ca.submit(s);
      good.push_back({s.id, &c});
    }
  // Wait until each streamed one has a token out: they are running.
  std::map<std::string, sy::client::Result> got;
  for (size_t started = 0; started < cases.size();) {
    auto m = ca.next(30s);
    BOOST_REQUIRE_MESSAGE(m, "no chunk from the greedy jobs");
    if (auto* t = std::get_if<sy::wire::Tokens>(&*m); t && got[t->id].chunks.empty()) ++started;
    if (auto* t = std::get_if<sy::wire::Tokens>(&*m)) got[t->id].chunks.push_back(*t);
  }

  // Tenant b: every pathological value.
  const double fmin = std::numeric_limits<float>::denorm_min();  // ~1.4e-45
  const double dmin = std::numeric_limits<double>::denorm_min();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<Case> bad;
  auto add = [&](Expect e, const std::string& names, auto&& tweak, size_t ref = 0) {
    Case c{job("b", "b" + std::to_string(bad.size()), cases[ref % cases.size()]), e, names};
    c.s.temperature = 1.0;
    tweak(c.s);
    if (e == Expect::greedy) c.ref = &cases[ref % cases.size()];
    bad.push_back(std::move(c));
  };
  using S = sy::wire::Submit;
  // Refused at the edge: values out of range as sent, or once narrowed to the sampler's float.
  add(Expect::refused, "top_p", [](S& s) { s.top_p = 1e-46; });  // 0 as a float
  add(Expect::refused, "top_p", [](S& s) { s.top_p = 7e-46; });
  add(Expect::refused, "top_p", [&](S& s) { s.top_p = dmin; });
  add(Expect::refused, "top_p", [](S& s) { s.top_p = 0.0; });
  add(Expect::refused, "top_p", [](S& s) { s.top_p = -0.0; });
  add(Expect::refused, "top_p", [&](S& s) { s.top_p = nan; });
  add(Expect::refused, "top_p", [](S& s) { s.top_p = 1.0000001; });
  add(Expect::refused, "temperature", [](S& s) { s.temperature = -1e-300; });
  add(Expect::refused, "temperature", [](S& s) { s.temperature = 100.000001; });
  add(Expect::refused, "temperature", [&](S& s) { s.temperature = inf; });
  add(Expect::refused, "temperature", [&](S& s) { s.temperature = nan; });
  add(Expect::refused, "top_k", [](S& s) { s.top_k = 1u << 31; });  // past int32
  add(Expect::refused, "top_k", [](S& s) { s.top_k = ~0u; });
  add(Expect::refused, "logprobs", [](S& s) { s.logprobs = 21; });
  add(Expect::refused, "logprobs", [](S& s) { s.logprobs = ~0u; });
  add(Expect::refused, "max_tokens", [](S& s) { s.max_tokens = 0; });
  // NaN logits (TEST ONLY flag): the job ends alone with internal, whatever else it asks for.
  add(Expect::failed, "NaN", [](S& s) {
    s.prompt = std::vector<int32_t>{1, 403, kNanToken};
    s.temperature = 0;
  });
  add(Expect::failed, "NaN", [](S& s) {
    s.prompt = std::vector<int32_t>{1, kNanToken};
    s.temperature = 100;
    s.top_k = std::numeric_limits<int32_t>::max();
    s.top_p = 1e-40;
    s.seed = ~uint64_t{0};
    s.logprobs = 20;
    s.stream = true;
  });
  // Accepted extremes: each runs to its end.
  add(Expect::done, "", [&](S& s) { s.top_p = fmin; });  // the smallest top_p a float holds
  add(Expect::done, "", [](S& s) {
    s.top_p = 1e-40;  // a float subnormal
    s.temperature = 100;
    s.top_k = std::numeric_limits<int32_t>::max();
    s.seed = ~uint64_t{0};
    s.logprobs = 20;
    s.stream = true;
  });
  add(Expect::done, "", [](S& s) {
    s.temperature = 3e-39;  // 1/T still a finite float
    s.seed = 0;
    s.top_p = 1.0 - 1e-12;  // 1 as a float
    s.logprobs = 20;
  });
  add(Expect::done, "", [](S& s) {
    s.temperature = 100;
    s.top_k = 1u << 30;
    s.ignore_eos = true;
    s.max_tokens = 64;
  });
  // Values that mean greedy: exactly the greedy ids.
  add(
      Expect::greedy, "", [](S& s) { s.temperature = 1e-300; }, 0);  // 0 as a float
  add(
      Expect::greedy, "", [&](S& s) { s.temperature = fmin; }, 1);  // 1/T overflows
  add(
      Expect::greedy, "",
      [](S& s) {
        s.temperature = 2;
        s.top_k = 1;
        s.seed = ~uint64_t{0};
      },
      2);
  add(
      Expect::greedy, "",
      [](S& s) {
        s.temperature = 0;
        s.logprobs = 20;
        s.top_k = std::numeric_limits<int32_t>::max();
        s.top_p = 1e-40;
        s.stream = true;
      },
      0);
  for (const Case& c : bad) cb.submit(c.s);

  auto check = [&](const Case& c) {
    auto r = cb.wait(c.s.id, 60s, "b");
    BOOST_TEST_CONTEXT(c.s.id << (r.error ? ": " + r.error->message : std::string())) {
      BOOST_REQUIRE(!r.timed_out);
      switch (c.expect) {
        case Expect::refused:
          BOOST_REQUIRE(r.error);
          BOOST_TEST(!r.accepted);
          BOOST_TEST((r.error->code == ErrorCode::bad_request));
          BOOST_TEST(r.error->message.find(c.names) != std::string::npos);
          break;
        case Expect::failed:
          BOOST_REQUIRE(r.error);
          BOOST_TEST(r.accepted.has_value());
          BOOST_TEST((r.error->code == ErrorCode::internal));
          BOOST_TEST(r.error->message.find(c.names) != std::string::npos);
          BOOST_TEST(r.ids.empty());
          break;
        case Expect::done:
          BOOST_REQUIRE(r.ok());
          BOOST_TEST(!r.ids.empty());
          if (c.s.logprobs > 0) BOOST_TEST(r.logprobs.size() == r.ids.size());
          break;
        case Expect::greedy:
          BOOST_REQUIRE(r.ok());
          BOOST_TEST(r.ids == c.ref->generated_token_ids, boost::test_tools::per_element());
          break;
      }
    }
  };

  // The refusals and the jobs that fail in their first step come first; the greedy jobs were
  // still running then, so the failing jobs shared steps with them.
  for (const Case& c : bad)
    if (c.expect == Expect::refused || c.expect == Expect::failed) check(c);
  // (Asked on a connection of its own: next() would take the "b" jobs' messages from cb.)
  sy::client::Client cs(srv.endpoint());
  for (const auto& [id, c] : good) cs.send(sy::wire::Status{id, "a", ""});
  std::map<std::string, sy::wire::JobState> states;
  while (states.size() < good.size()) {
    auto m = cs.next(30s);
    BOOST_REQUIRE_MESSAGE(m, "no status reply");
    if (auto* st = std::get_if<sy::wire::StatusReply>(&*m)) states[st->id] = st->state;
  }
  for (const auto& [id, st] : states)
    BOOST_TEST((st == sy::wire::JobState::running), id << " was " << sy::wire::to_string(st));
  for (const Case& c : bad)
    if (c.expect == Expect::done || c.expect == Expect::greedy) check(c);

  // Tenant a: exact greedy output (the chunks read early count too).
  for (const auto& [id, c] : good) {
    auto r = ca.wait(id, 60s, "a");
    BOOST_TEST_CONTEXT(id) {
      BOOST_REQUIRE_MESSAGE(r.ok(), (r.error ? r.error->message : std::string("no done")));
      std::vector<int32_t> ids;
      for (const auto& ch : got[id].chunks) ids.insert(ids.end(), ch.ids.begin(), ch.ids.end());
      ids.insert(ids.end(), r.ids.begin(), r.ids.end());
      BOOST_TEST(ids == c->generated_token_ids, boost::test_tools::per_element());
      BOOST_TEST(sy::wire::to_string(r.done->finish_reason) == "length");
    }
  }

  // Each NaN job, and only those, ended alone: one sequence failure each.
  size_t nan_jobs = 0;
  for (const Case& c : bad) nan_jobs += c.expect == Expect::failed;
  const auto st = srv.stats();
  BOOST_TEST(st.at("executor_failures") == 0);
  BOOST_TEST(st.at("executors") == 1);
  BOOST_TEST(st.at("seq_failures") == static_cast<int64_t>(nan_jobs));
  BOOST_REQUIRE(!srv.metrics_endpoint().empty());
  const std::string page = sy::it::http_get(srv.metrics_endpoint(), "/metrics").body;
  BOOST_TEST(sample(page, "switchyard_sequence_failures_total") == static_cast<double>(nan_jobs));
  // Generous: the server answers within its own 2 s ask timeout.
  auto ctl = sy::client::Client(srv.endpoint()).control("stats", "", kAdmin, 20s);
  BOOST_REQUIRE_MESSAGE(ctl.ok(), "stats failed: " << (ctl.error ? ctl.error->message : "timeout"));
  BOOST_TEST(nlohmann::json::parse(ctl.reply->result).at("seq_failures").get<int64_t>() ==
             static_cast<int64_t>(nan_jobs));
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_sampling_isolation
