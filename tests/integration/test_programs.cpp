// Programs (docs/programs.md) through the real server on stories260K, over a DEALER with the wire
// codec: greedy parity with the same steps run one by one as plain jobs (and a select with a
// `score` of its choices), constrained gens that validate, malformed programs refused naming the
// step with nothing run, the tool round trip (a result from a second connection, not_found,
// timeout), cancel, and streamed chunks that name their step.
#include <boost/test/unit_test.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "clients/cpp/client.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_programs)

using namespace std::chrono_literals;
using json = nlohmann::json;

namespace {

const std::string kTenant = "prog";

/// Everything one program sent to its client, in arrival order by kind.
struct Outcome {
  int accepted = 0;
  std::vector<sy::wire::Tokens> chunks;
  std::vector<sy::wire::Step> steps;
  std::vector<sy::wire::ToolCall> calls;
  std::optional<sy::wire::Done> done;
  std::optional<sy::wire::Error> error;
  bool timed_out = false;

  /// Variable `name` of the done (one value; "" with a failed check when absent or a list).
  std::string var(const std::string& name) const {
    BOOST_REQUIRE(done);
    for (const auto& v : done->vars)
      if (v.name == name) {
        BOOST_TEST(!v.list, name);
        BOOST_REQUIRE_EQUAL(v.values.size(), 1u);
        return v.values[0];
      }
    BOOST_FAIL("no variable '" + name + "' in the done");
    return {};
  }
  const sy::wire::Var* list(const std::string& name) const {
    for (const auto& v : done->vars)
      if (v.name == name) return &v;
    return nullptr;
  }
  /// The `step` event of path `path` (null when none came).
  const sy::wire::Step* step(const std::string& path) const {
    for (const auto& s : steps)
      if (s.step == path) return &s;
    return nullptr;
  }
  std::string why() const {
    if (error) return std::string(to_string(error->code)) + ": " + error->message;
    return timed_out ? "timed out" : "no done";
  }
};

/// Reads `c` until program (kTenant, id) ends with done or error (at most `silence` between
/// two of its messages); `on` sees each of its messages first (to answer a tool_call, to cancel).
/// Messages of other keys are dropped.
Outcome collect(sy::client::Client& c, const std::string& id,
                const std::function<void(const sy::wire::ServerMessage&)>& on = {},
                std::chrono::milliseconds silence = 60s) {
  Outcome o;
  for (;;) {
    auto m = c.next(silence);
    if (!m) {
      o.timed_out = true;
      return o;
    }
    if (sy::client::message_id(*m) != id) continue;
    if (on) on(*m);
    if (std::holds_alternative<sy::wire::Accepted>(*m)) {
      ++o.accepted;
    } else if (auto* t = std::get_if<sy::wire::Tokens>(&*m)) {
      o.chunks.push_back(*t);
    } else if (auto* s = std::get_if<sy::wire::Step>(&*m)) {
      o.steps.push_back(*s);
    } else if (auto* k = std::get_if<sy::wire::ToolCall>(&*m)) {
      o.calls.push_back(*k);
    } else if (auto* d = std::get_if<sy::wire::Done>(&*m)) {
      o.done = *d;
      return o;
    } else if (auto* e = std::get_if<sy::wire::Error>(&*m)) {
      o.error = *e;
      return o;
    }
  }
}

sy::wire::Submit program(const std::string& id, const json& steps, double temperature = 0) {
  sy::wire::Submit s = sy::client::program_submit(id, kTenant, steps.dump());
  s.temperature = temperature;
  return s;
}

Outcome run_program(sy::client::Client& c, const sy::wire::Submit& s,
                    const std::function<void(const sy::wire::ServerMessage&)>& on = {}) {
  c.submit(s);
  return collect(c, s.id, on);
}

json text(const std::string& t) {
  return {{"type", "text"}, {"text", t}};
}
json gen(const std::string& name, uint32_t max_tokens, json extra = json::object()) {
  json g = {{"type", "gen"}, {"name", name}, {"max_tokens", max_tokens}, {"temperature", 0}};
  g.update(extra);
  return g;
}

/// A plain greedy job of `prompt` (text, BOS added) and its completion text.
std::string plain(sy::client::Client& c, const std::string& id, const std::string& prompt,
                  uint32_t max_tokens, std::vector<std::string> stop = {}) {
  sy::wire::Submit s;
  s.id = id;
  s.tenant = kTenant;
  s.prompt = prompt;
  s.max_tokens = max_tokens;
  s.temperature = 0;
  s.stop = std::move(stop);
  auto r = c.run(s, 60s);
  BOOST_REQUIRE_MESSAGE(r.ok(), id << ": " << (r.error ? r.error->message : "no done"));
  return r.text;
}

/// The choice a `score` of `choices` after `prompt` ranks first by mean log-probability per
/// token (ties: the earlier one), as a select of token_length_normalized picks it.
std::string best_by_score(sy::client::Client& c, const std::string& id, const std::string& prompt,
                          const std::vector<std::string>& choices) {
  std::vector<std::variant<std::string, std::vector<int32_t>>> cont(choices.begin(), choices.end());
  auto r = c.run(sy::client::score_request(id, kTenant, prompt, cont), 60s);
  BOOST_REQUIRE_MESSAGE(r.ok(), id << ": " << (r.error ? r.error->message : "no done"));
  BOOST_REQUIRE_EQUAL(r.done->scores.size(), choices.size());
  std::size_t best = 0;
  for (std::size_t i = 1; i < choices.size(); ++i) {
    BOOST_REQUIRE_EQUAL(r.done->scores[i].index, i);
    if (r.done->scores[i].mean > r.done->scores[best].mean) best = i;
  }
  BOOST_TEST_MESSAGE(id << ": scores of the choices, best " << choices[best]);
  return choices[best];
}

/// A submit's msgpack written by hand (fields the encoder never puts beside a program).
std::string raw_submit(const std::string& id, const json& steps, const json& extra) {
  json m = {{"v", 1}, {"type", "submit"}, {"id", id}, {"tenant", kTenant}, {"program", steps}};
  if (extra.is_object()) m.update(extra);
  const auto bytes = json::to_msgpack(m);
  return std::string(bytes.begin(), bytes.end());
}

/// Polls the server's counters until `pred` holds (at most `limit`); the last snapshot.
template <class Pred>
std::map<std::string, int64_t> wait_stats(sy::it::ServerProcess& srv, Pred pred,
                                          std::chrono::seconds limit = 30s) {
  auto until = std::chrono::steady_clock::now() + limit;
  auto st = srv.stats();
  while (!pred(st) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(20ms);
    st = srv.stats();
  }
  return st;
}

/// A status request's answer: the state's wire name, or the error code's.
std::string status_of(sy::client::Client& c, const std::string& id) {
  c.status(id, kTenant);
  for (;;) {
    auto m = c.next(20s);
    if (!m) return "no answer";
    if (auto* s = std::get_if<sy::wire::StatusReply>(&*m); s && s->id == id)
      return std::string(to_string(s->state));
    if (auto* e = std::get_if<sy::wire::Error>(&*m); e && e->id == id)
      return std::string(to_string(e->code));
  }
}

std::vector<std::string> server_args() {
  return {"--model", sy::it::kStories, "--threads", "1"};
}

}  // namespace

// Greedy: a program's gens and select equal the same steps run one by one as plain jobs of the
// whole context (and a score of the select's choices); a fork's branches equal plain jobs of each
// branch's context, and the join appends them in branch order.
BOOST_AUTO_TEST_CASE(greedy_parity_with_plain_jobs) {
  sy::it::ServerProcess srv(server_args());
  sy::client::Client c(srv.endpoint());
  BOOST_REQUIRE(c.ping_wait(10s));

  const std::vector<std::string> choices = {"the cat was happy", "the dog ran away",
                                            "a big red ball"};
  const json steps =
      json::array({text("Once upon a time"), gen("a", 12), text(". One day"),
                   gen("b", 10, {{"stop", json::array({"."})}}), text(". Then "),
                   json{{"type", "select"}, {"name", "c"}, {"choices", choices}}, gen("d", 8)});
  auto p = run_program(c, program("par", steps));
  BOOST_REQUIRE_MESSAGE(p.done, p.why());
  BOOST_TEST(p.accepted == 1);
  BOOST_TEST(p.done->steps == 4u);
  const std::string a = p.var("a"), b = p.var("b"), sel = p.var("c"), d = p.var("d");
  BOOST_TEST_MESSAGE("program: a=" << json(a) << " b=" << json(b) << " c=" << json(sel)
                                   << " d=" << json(d));
  BOOST_TEST(!a.empty());
  BOOST_TEST(b.find('.') == std::string::npos, b);

  // The same steps one by one, each on the whole context so far.
  std::string ctx = "Once upon a time";
  BOOST_TEST(plain(c, "par-a", ctx, 12) == a);
  ctx += a + ". One day";
  BOOST_TEST(plain(c, "par-b", ctx, 10, {"."}) == b);
  ctx += b + ". Then ";
  BOOST_TEST(best_by_score(c, "par-c", ctx, choices) == sel);
  ctx += sel;
  BOOST_TEST(plain(c, "par-d", ctx, 8) == d);

  // The step events: one per gen and select, in order, with the outputs of `vars`.
  BOOST_REQUIRE_EQUAL(p.steps.size(), 4u);
  const std::vector<std::pair<std::string, std::string>> want = {
      {"1", "gen"}, {"3", "gen"}, {"5", "select"}, {"6", "gen"}};
  const std::vector<std::string> outputs = {a, b, sel, d};
  for (std::size_t i = 0; i < want.size(); ++i) {
    BOOST_TEST(p.steps[i].step == want[i].first);
    BOOST_TEST(p.steps[i].kind == want[i].second);
    BOOST_TEST(p.steps[i].output == outputs[i]);
  }
  BOOST_TEST(p.done->text == d);  // the last top-level gen
  BOOST_TEST(p.done->usage.completion_tokens > 0u);

  // A fork of two branches with different text, joined as text; then a list join of another.
  const json forked =
      json::array({text("Once upon a time, there was a"),
                   json{{"type", "fork"},
                        {"name", "f"},
                        {"branches", json::array({json::array({text(" little girl"), gen("x", 8)}),
                                                  json::array({text(" big dog"), gen("x", 8)})})}},
                   json{{"type", "join"}, {"separator", " And"}}, text(". The end"), gen("y", 8),
                   json{{"type", "fork"},
                        {"name", "g"},
                        {"branches", json::array({json::array({text(" Tim"), gen("z", 6)}),
                                                  json::array({text(" Sue"), gen("z", 6)}),
                                                  json::array({text(" Max"), gen("z", 6)})})}},
                   json{{"type", "join"}, {"mode", "list"}, {"name", "all"}, {"var", "z"}}});
  auto f = run_program(c, program("fork", forked));
  BOOST_REQUIRE_MESSAGE(f.done, f.why());
  const std::string base = "Once upon a time, there was a";
  const std::string x0 = f.var("f.0.x"), x1 = f.var("f.1.x"), y = f.var("y");
  BOOST_TEST(plain(c, "fork-x0", base + " little girl", 8) == x0);
  BOOST_TEST(plain(c, "fork-x1", base + " big dog", 8) == x1);
  const std::string joined = base + " little girl" + x0 + " And" + " big dog" + x1 + ". The end";
  BOOST_TEST(plain(c, "fork-y", joined, 8) == y);
  const sy::wire::Var* all = f.list("all");
  BOOST_REQUIRE(all);
  BOOST_TEST(all->list);
  BOOST_REQUIRE_EQUAL(all->values.size(), 3u);
  const char* names[] = {" Tim", " Sue", " Max"};
  for (std::size_t i = 0; i < 3; ++i) {
    const std::string z = f.var("g." + std::to_string(i) + ".z");
    BOOST_TEST(all->values[i] == z);
    BOOST_TEST(plain(c, "fork-z" + std::to_string(i), joined + y + names[i], 6) == z);
  }
  BOOST_TEST(f.done->steps == 6u);  // x twice, y, z three times (prefills do not count)
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

// Each constraint kind on a gen step ends in output that satisfies it.
BOOST_AUTO_TEST_CASE(constrained_gens_validate) {
  sy::it::ServerProcess srv(server_args());
  sy::client::Client c(srv.endpoint());
  BOOST_REQUIRE(c.ping_wait(10s));
  const std::string date = "(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
  const json schema = {{"type", "object"},
                       {"properties",
                        {{"name", {{"type", "string"}, {"maxLength", 10}}},
                         {"n", {{"type", "integer"}, {"minimum", 1}, {"maximum", 9}}},
                         {"ok", {{"type", "boolean"}}}}},
                       {"required", {"name", "n", "ok"}},
                       {"additionalProperties", false}};
  const std::vector<std::string> options = {" a dragon", " a princess", " Tim"};
  const std::string grammar = "root ::= \" there was a \" [a-z]{1,12} \".\"";
  // Greedy and sampled (seeded): both must validate.
  for (double temperature : {0.0, 1.0}) {
    const json steps = json::array(
        {text("Once upon a time"), gen("date", 40, {{"regex", date}, {"temperature", temperature}}),
         text(" Then"), gen("who", 20, {{"choices", options}, {"temperature", temperature}}),
         text(" said:"), gen("obj", 120, {{"json_schema", schema}, {"temperature", temperature}}),
         text(" Once"), gen("g", 40, {{"grammar", grammar}, {"temperature", temperature}})});
    sy::wire::Submit s = program("cons" + std::to_string(int(temperature)), steps, temperature);
    s.seed = 7;
    auto p = run_program(c, s);
    BOOST_TEST_CONTEXT("temperature " << temperature) {
      BOOST_REQUIRE_MESSAGE(p.done, p.why());
      const std::string d = p.var("date"), who = p.var("who"), obj = p.var("obj"), g = p.var("g");
      BOOST_TEST_MESSAGE("date=" << json(d) << " who=" << json(who) << " obj=" << json(obj)
                                 << " g=" << json(g));
      BOOST_TEST(std::regex_match(d, std::regex(date)), d);
      BOOST_TEST((who == options[0] || who == options[1] || who == options[2]), who);
      json j;
      BOOST_REQUIRE_NO_THROW(j = json::parse(obj));
      BOOST_REQUIRE(j.is_object());
      BOOST_TEST(j.size() == 3u, obj);
      BOOST_REQUIRE(j.contains("name"));
      BOOST_REQUIRE(j.contains("n"));
      BOOST_REQUIRE(j.contains("ok"));
      BOOST_TEST(j["name"].is_string());
      BOOST_TEST(j["n"].is_number_integer());
      if (j["n"].is_number_integer()) {
        BOOST_TEST(j["n"].get<int>() >= 1);
        BOOST_TEST(j["n"].get<int>() <= 9);
      }
      BOOST_TEST(j["ok"].is_boolean());
      BOOST_TEST(std::regex_match(g, std::regex(" there was a [a-z]{1,12}\\.")), g);
    }
  }
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

// A malformed program is one bad_request naming the step and its problem; nothing of it runs:
// no accepted, step or tokens message, the admitted and dispatched counters do not move, and the
// key is unknown afterwards.
BOOST_AUTO_TEST_CASE(malformed_programs_are_refused_naming_the_step) {
  sy::it::ServerProcess srv(server_args());
  sy::client::Client c(srv.endpoint());
  BOOST_REQUIRE(c.ping_wait(10s));
  const json ok_text = text("Once upon a time");
  json many = json::array();
  for (int i = 0; i < 257; ++i) many.push_back(text("a"));
  json wide = json::array();
  for (int i = 0; i < 17; ++i) wide.push_back(json::array({gen("x", 2)}));
  struct Bad {
    std::string id;
    std::string bytes;
    std::vector<std::string> says;  // parts of the error message
  };
  const std::vector<Bad> bad = {
      {"bad-type",
       raw_submit("bad-type", json::array({ok_text, {{"type", "magic"}}}), {}),
       {"step 1", "unknown type 'magic'"}},
      {"bad-field",
       raw_submit("bad-field", json::array({ok_text, gen("a", 4, {{"max_token", 4}})}), {}),
       {"step 1 (gen 'a')", "unknown field 'max_token'"}},
      {"bad-var",
       raw_submit("bad-var", json::array({ok_text, gen("a", 4), text("{{nope}}")}), {}),
       {"step 2", "{{nope}} is not defined before this step"}},
      {"bad-later-var",
       raw_submit("bad-later-var", json::array({text("{{a}}"), gen("a", 4)}), {}),
       {"step 0", "{{a}} is not defined before this step"}},
      {"bad-twice",
       raw_submit("bad-twice", json::array({ok_text, gen("a", 4), text("."), gen("a", 4)}), {}),
       {"step 3 (gen 'a')", "name 'a' is already defined"}},
      {"bad-nojoin",
       raw_submit("bad-nojoin",
                  json::array({ok_text,
                               {{"type", "fork"},
                                {"branches", json::array({json::array({gen("x", 2)}),
                                                          json::array({gen("x", 2)})})}},
                               gen("y", 2)}),
                  {}),
       {"step 1 (fork)", "is not followed by its join"}},
      {"bad-wide",
       raw_submit(
           "bad-wide",
           json::array({ok_text, {{"type", "fork"}, {"branches", wide}}, {{"type", "join"}}}), {}),
       {"step 1 (fork)", "17 branches, limit 16"}},
      {"bad-many", raw_submit("bad-many", many, {}), {"program has 257 steps, limit 256"}},
      {"bad-n",
       raw_submit("bad-n", json::array({ok_text, gen("a", 4)}), {{"n", 2}}),
       {"field 'n' does not go with 'program'"}},
      {"bad-prompt",
       raw_submit("bad-prompt", json::array({ok_text, gen("a", 4)}), {{"prompt", "Hello"}}),
       {"fields 'program' and 'prompt' exclude each other"}},
  };
  const auto before = srv.stats();
  for (const Bad& b : bad) c.send_raw(b.bytes.data(), b.bytes.size());
  std::map<std::string, sy::wire::Error> errors;
  std::vector<std::string> unexpected;
  while (errors.size() < bad.size()) {
    auto m = c.next(30s);
    BOOST_REQUIRE_MESSAGE(
        m, "silence with " << errors.size() << " of " << bad.size() << " refusals in");
    if (auto* e = std::get_if<sy::wire::Error>(&*m))
      errors[e->id] = *e;
    else
      unexpected.push_back(sy::client::describe(*m));
  }
  for (const Bad& b : bad) {
    BOOST_TEST_CONTEXT(b.id) {
      BOOST_REQUIRE(errors.count(b.id));
      const auto& e = errors[b.id];
      BOOST_TEST((e.code == sy::ErrorCode::bad_request), to_string(e.code));
      for (const auto& part : b.says)
        BOOST_TEST(e.message.find(part) != std::string::npos, e.message << " lacks " << part);
    }
  }
  // Anything of them that ran would have sent accepted, step or tokens by now (a ping answered
  // after the refusals orders it behind anything already sent).
  BOOST_TEST(c.ping_wait(10s));
  while (auto m = c.next(200ms)) unexpected.push_back(sy::client::describe(*m));
  BOOST_TEST(unexpected.empty(), (unexpected.empty() ? "" : unexpected.front()));
  for (const Bad& b : bad) BOOST_TEST(status_of(c, b.id) == "not_found", b.id);
  const auto after = srv.stats();
  BOOST_TEST(after.at("admitted") == before.at("admitted"));
  BOOST_TEST(after.at("dispatched") == before.at("dispatched"));
  BOOST_TEST(after.at("active_jobs") == 0);
  // The same connection and server still run a good program.
  auto good = run_program(c, program("good", json::array({ok_text, gen("a", 4)})));
  BOOST_REQUIRE_MESSAGE(good.done, good.why());
  BOOST_TEST(good.var("a").size() > 0u);
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

// A tool step: the tool_call carries the resolved arguments; a tool_result from a second
// connection resumes the program, whose vars hold it and whose next gen sees it in the context;
// results for unknown calls are not_found; an unanswered call times out naming its step and the
// server goes on.
BOOST_AUTO_TEST_CASE(tool_calls_results_and_timeouts) {
  sy::it::ServerProcess srv(server_args());
  sy::client::Client c(srv.endpoint()), other(srv.endpoint());
  BOOST_REQUIRE(c.ping_wait(10s));
  BOOST_REQUIRE(other.ping_wait(10s));
  const std::string result = " It was sunny and warm";
  const json steps =
      json::array({text("Once upon a time, the girl went to"), gen("place", 4),
                   json{{"type", "tool"},
                        {"name", "w"},
                        {"tool", "weather"},
                        {"arguments", "{\"where\": \"{{place}}\", \"lit\": \"{{{{x}}\"}"}},
                   text(". Then"), gen("after", 8)});
  std::optional<sy::wire::ToolCall> call;
  std::vector<std::string> refusals;
  int64_t used_while_waiting = 0;
  auto p = run_program(c, program("tool", steps), [&](const sy::wire::ServerMessage& m) {
    auto* t = std::get_if<sy::wire::ToolCall>(&m);
    if (!t) return;
    call = *t;
    // While it waits, the program's context stays pinned in its batcher (docs/programs.md).
    used_while_waiting = srv.stats()["blocks_used"];
    // Wrong calls first, from the second connection: each is not_found there.
    other.send(sy::wire::ToolResult{"tool", kTenant, "", "9", "x"});
    other.send(sy::wire::ToolResult{"no-such-program", kTenant, "", t->call, "x"});
    for (int i = 0; i < 2; ++i) {
      auto e = other.next(20s);
      BOOST_REQUIRE(e);
      auto* err = std::get_if<sy::wire::Error>(&*e);
      BOOST_REQUIRE_MESSAGE(err, sy::client::describe(*e));
      refusals.push_back(std::string(to_string(err->code)) + " " + err->id);
    }
    other.send(sy::wire::ToolResult{t->id, t->tenant, "", t->call, result});
  });
  BOOST_REQUIRE_MESSAGE(p.done, p.why());
  BOOST_REQUIRE(call);
  const std::string place = p.var("place");
  BOOST_TEST(call->id == "tool");
  BOOST_TEST(call->tenant == kTenant);
  BOOST_TEST(call->call == "2");
  BOOST_TEST(call->name == "weather");
  // Templates resolved; "{{{{" kept one literal "{{".
  BOOST_TEST(call->arguments == "{\"where\": \"" + place + "\", \"lit\": \"{{x}}\"}");
  BOOST_TEST(p.calls.size() == 1u);
  BOOST_TEST(refusals == (std::vector<std::string>{"not_found tool", "not_found no-such-program"}),
             boost::test_tools::per_element());
  BOOST_TEST(p.var("w") == result);
  BOOST_TEST(used_while_waiting > 0);
  const auto* ev = p.step("2");
  BOOST_REQUIRE(ev);
  BOOST_TEST(ev->kind == "tool");
  BOOST_TEST(ev->output == result);
  BOOST_TEST(p.done->steps == 3u);
  // The result was appended to the context as plain text: the last gen is the plain job's.
  BOOST_TEST(plain(c, "tool-after",
                   "Once upon a time, the girl went to" + place + result + ". Then",
                   8) == p.var("after"));
  // Answered already: a second result for the call is not_found too.
  other.send(sy::wire::ToolResult{"tool", kTenant, "", "2", "again"});
  auto again = other.next(20s);
  BOOST_REQUIRE(again);
  auto* again_err = std::get_if<sy::wire::Error>(&*again);
  BOOST_REQUIRE_MESSAGE(again_err, sy::client::describe(*again));
  BOOST_TEST((again_err->code == sy::ErrorCode::not_found));

  // No result within tool_timeout_ms: deadline_exceeded naming the tool step.
  const json waits = json::array({text("Once upon a time"), gen("a", 4),
                                  json{{"type", "tool"},
                                       {"name", "never"},
                                       {"tool", "slow"},
                                       {"arguments", "{{a}}"},
                                       {"tool_timeout_ms", 300}},
                                  gen("b", 4)});
  auto t = run_program(c, program("timeout", waits));
  BOOST_REQUIRE_MESSAGE(t.error, "the program ended without error: " << t.why());
  BOOST_TEST((t.error->code == sy::ErrorCode::deadline_exceeded), to_string(t.error->code));
  BOOST_TEST(t.error->message.find("step 2 (tool 'never')") != std::string::npos, t.error->message);
  BOOST_TEST(t.calls.size() == 1u);
  BOOST_TEST(!t.step("3"));  // the gen after the tool never ran
  BOOST_TEST(status_of(c, "timeout") == "failed");
  // Its late result is refused; nothing is left running, and no KV block stays in use: the
  // pinned contexts of both programs were let go when they ended.
  other.send(sy::wire::ToolResult{"timeout", kTenant, "", "2", "late"});
  auto late = other.next(20s);
  BOOST_REQUIRE(late);
  BOOST_TEST(std::holds_alternative<sy::wire::Error>(*late), sy::client::describe(*late));
  auto st = wait_stats(srv, [](auto& s) { return s["active_jobs"] == 0 && s["blocks_used"] == 0; });
  BOOST_TEST(st["active_jobs"] == 0);
  BOOST_TEST(st["blocks_used"] == 0);
  BOOST_TEST(!plain(c, "after-timeout", "Once upon a time", 8).empty());
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

// Cancel while a long gen runs: done, finish_reason cancelled, with the variables finished so far.
// Streamed: every chunk names its gen step, and a step's chunks join to its `step` output.
BOOST_AUTO_TEST_CASE(cancel_and_streamed_steps) {
  // Slowed steps (TEST ONLY flag): the 200-token gen is still running when the cancel comes.
  auto args = server_args();
  args.insert(args.end(), {"--step-delay-ms", "10"});
  sy::it::ServerProcess srv(args);
  sy::client::Client c(srv.endpoint());
  BOOST_REQUIRE(c.ping_wait(10s));
  // End of sequence (id 2) banned in the long gen, so that it cannot end before the cancel.
  const json steps =
      json::array({text("Once upon a time"), gen("a", 3), text(" and"),
                   gen("long", 200, {{"logit_bias", {{"2", -100}}}}), gen("never", 4)});
  bool cancelled = false;
  auto p = run_program(c, program("cancel", steps), [&](const sy::wire::ServerMessage& m) {
    if (std::holds_alternative<sy::wire::Step>(m) && !cancelled) {
      cancelled = true;
      c.cancel("cancel", kTenant);
    }
  });
  BOOST_REQUIRE_MESSAGE(p.done, p.why());
  BOOST_TEST(cancelled);
  BOOST_TEST(sy::wire::to_string(p.done->finish_reason) == "cancelled");
  BOOST_TEST(p.steps.size() == 1u);
  BOOST_TEST(!p.var("a").empty());
  BOOST_TEST(!p.list("long"));
  BOOST_TEST(!p.list("never"));
  BOOST_TEST(status_of(c, "cancel") == "cancelled");
  auto st = wait_stats(srv, [](auto& s) { return s["active_jobs"] == 0 && s["running"] == 0; });
  BOOST_TEST(st["running"] == 0);

  // Streamed: chunks name their step, count from 0 within it, and join to the step's output.
  const json two = json::array({text("Once upon a time"), gen("a", 12), text(". Then"),
                                gen("b", 12), text(" Later"), gen("c", 12)});
  sy::wire::Submit s = program("stream", two);
  s.stream = true;
  auto r = run_program(c, s);
  BOOST_REQUIRE_MESSAGE(r.done, r.why());
  BOOST_REQUIRE_EQUAL(r.steps.size(), 3u);
  BOOST_TEST(!r.chunks.empty());
  std::map<std::string, std::string> joined;
  std::map<std::string, uint32_t> next;
  for (const auto& ch : r.chunks) {
    BOOST_TEST((ch.step == "1" || ch.step == "3" || ch.step == "5"), ch.step);
    BOOST_TEST(ch.index == next[ch.step]);
    next[ch.step] += static_cast<uint32_t>(ch.ids.size());
    joined[ch.step] += ch.text;
  }
  for (const auto& ev : r.steps) {
    BOOST_TEST_CONTEXT("step " << ev.step) {
      BOOST_TEST(ev.kind == "gen");
      BOOST_TEST(joined[ev.step] == ev.output);
      BOOST_TEST(next[ev.step] > 0u);
      BOOST_TEST(r.var(ev.name) == ev.output);
    }
  }
  // The same program unstreamed has the same outputs.
  auto u = run_program(c, program("unstreamed", two));
  BOOST_REQUIRE_MESSAGE(u.done, u.why());
  BOOST_TEST(u.chunks.empty());
  for (const char* v : {"a", "b", "c"}) BOOST_TEST(u.var(v) == r.var(v));
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_SUITE_END()
