// Run, the walk of a parsed program: the actions it hands out (each once, with the context, the
// sampling and the salted seed), the contexts they see through text, gen, select and tool steps,
// forks (one prefill first), joins of text and of lists, nested forks, chat turns, restored
// outputs from a journal, the variables and the last output.
#include <boost/test/unit_test.hpp>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "programs/program.hpp"

BOOST_AUTO_TEST_SUITE(test_programs_walk)

using sy::Constraint;
using sy::programs::Action;
using sy::programs::GenDefaults;
using sy::programs::parse;
using sy::programs::Program;
using sy::programs::Run;
using sy::programs::Turn;
using sy::programs::VarValue;

namespace {

using Inputs = std::vector<std::pair<std::string, std::string>>;

std::shared_ptr<const Program> program(const std::string& json, Inputs inputs = {},
                                       const GenDefaults& d = {}) {
  return std::make_shared<const Program>(parse(json, std::move(inputs), d));
}

// The one action of `actions` at `path` (fails the test when there is none).
const Action& at(const std::vector<Action>& actions, const std::string& path) {
  for (const Action& a : actions)
    if (a.path == path) return a;
  BOOST_FAIL("no action at path " << path);
  return actions.front();
}

std::set<std::string> paths(const std::vector<Action>& actions) {
  std::set<std::string> out;
  for (const Action& a : actions) out.insert(a.path);
  return out;
}

std::vector<std::string> pending_of(const Run& r) {
  return r.pending();
}

// FNV-1a 64 of the path, written out again here: the seed salt the walk must use.
uint64_t salt(const std::string& path) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : path) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// "name=v1|v2" per variable, "[list]" marking lists: one string to compare.
std::vector<std::string> flat(const std::vector<VarValue>& vars) {
  std::vector<std::string> out;
  for (const VarValue& v : vars) {
    std::string s = v.name + (v.list ? "[list]=" : "=");
    for (std::size_t i = 0; i < v.values.size(); ++i) s += (i ? "|" : "") + v.values[i];
    out.push_back(s);
  }
  return out;
}

bool same_turns(const std::vector<Turn>& got, const std::vector<Turn>& want) {
  if (got.size() != want.size()) return false;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i].role != want[i].role || got[i].content != want[i].content) return false;
  return true;
}

const std::string kLinear = R"([
  {"type":"text","text":"Q: {{q}}\nA:"},
  {"type":"gen","name":"answer","max_tokens":8,"temperature":0,"stop":["\n"]},
  {"type":"text","text":"\nIntent:"},
  {"type":"select","name":"intent","choices":[" a"," b"]},
  {"type":"tool","name":"r","tool":"search","arguments":"{\"q\":\"{{answer}}\"}","append":false},
  {"type":"text","text":" [{{r}}]"},
  {"type":"gen","name":"final","append":false}])";

}  // namespace

BOOST_AUTO_TEST_CASE(linear_program) {
  GenDefaults d;
  d.max_tokens = 16;
  d.top_k = 40;
  d.temperature = 0.7;
  Run run(program(kLinear, {{"q", "Who?"}}, d));
  BOOST_CHECK(!run.finished());

  std::vector<Action> a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  BOOST_CHECK(a[0].kind == Action::Kind::gen);
  BOOST_CHECK_EQUAL(a[0].path, "1");
  BOOST_CHECK_EQUAL(a[0].name, "answer");
  BOOST_REQUIRE(a[0].step);
  BOOST_CHECK_EQUAL(a[0].step->path, "1");
  BOOST_CHECK_EQUAL(a[0].text, "Q: Who?\nA:");
  BOOST_CHECK(a[0].turns.empty());
  BOOST_CHECK_EQUAL(a[0].params.max_tokens, 8u);
  BOOST_CHECK_EQUAL(a[0].params.temperature, 0.0);
  BOOST_CHECK_EQUAL(a[0].params.top_k, 40u);  // the submit's
  BOOST_CHECK(a[0].params.stop == (std::vector<std::string>{"\n"}));
  BOOST_CHECK(a[0].constraint.empty());
  // handed out once; unknown and repeated paths are refused
  BOOST_CHECK(run.ready().empty());
  BOOST_CHECK(pending_of(run) == (std::vector<std::string>{"1"}));
  BOOST_CHECK(!run.complete("3", "x"));
  BOOST_CHECK(!run.complete("0", "x"));
  BOOST_CHECK(run.complete("1", " Frank"));
  BOOST_CHECK(!run.complete("1", " again"));
  BOOST_CHECK_EQUAL(run.steps_done(), 1u);
  BOOST_CHECK_EQUAL(run.last_output(), " Frank");

  a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  BOOST_CHECK(a[0].kind == Action::Kind::select);
  BOOST_CHECK_EQUAL(a[0].text, "Q: Who?\nA: Frank\nIntent:");
  BOOST_CHECK(a[0].choices == (std::vector<std::string>{" a", " b"}));
  BOOST_CHECK(run.complete("3", " b"));

  a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  BOOST_CHECK(a[0].kind == Action::Kind::tool);
  BOOST_CHECK_EQUAL(a[0].tool, "search");
  BOOST_CHECK_EQUAL(a[0].arguments, "{\"q\":\" Frank\"}");
  BOOST_CHECK_EQUAL(a[0].timeout_ms, 60000u);
  BOOST_CHECK(run.complete("4", "RESULT"));

  a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  BOOST_CHECK_EQUAL(a[0].path, "6");
  // the tool's result was not appended (append false), the text step inserted it
  BOOST_CHECK_EQUAL(a[0].text, "Q: Who?\nA: Frank\nIntent: b [RESULT]");
  BOOST_CHECK_EQUAL(a[0].params.max_tokens, 16u);
  BOOST_CHECK(!run.finished());
  BOOST_CHECK(run.complete("6", "the end"));
  BOOST_CHECK(run.finished());  // without another ready()
  BOOST_CHECK(run.ready().empty());
  BOOST_CHECK(run.pending().empty());
  BOOST_CHECK_EQUAL(run.steps_done(), 4u);
  BOOST_CHECK_EQUAL(run.last_output(), "the end");
  BOOST_CHECK(flat(run.vars()) == (std::vector<std::string>{"q=Who?", "answer= Frank", "intent= b",
                                                            "r=RESULT", "final=the end"}));
}

BOOST_AUTO_TEST_CASE(text_only_program_finishes_at_once) {
  Run run(program(R"([{"type":"text","text":"a"},{"type":"text","text":"b"}])"));
  BOOST_CHECK(!run.finished());
  BOOST_CHECK(run.ready().empty());
  BOOST_CHECK(run.finished());
  BOOST_CHECK_EQUAL(run.last_output(), "");
  BOOST_CHECK_EQUAL(run.steps_done(), 0u);
}

BOOST_AUTO_TEST_CASE(params_carry_the_steps_fields_over_the_submits) {
  GenDefaults d;
  d.temperature = 0.7;
  d.top_p = 0.9;
  d.seed = 5;
  d.stop = {"STOP"};
  d.controls.min_p = 0.05f;
  Run run(program(R"([{"type":"gen","name":"g","temperature":0.1,"top_p":0.5,"top_k":3,
                       "presence_penalty":1,"regex":"[a-z]+","seed":9}])",
                  {}, d));
  const std::vector<Action> a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  const GenDefaults& p = a[0].params;
  BOOST_CHECK_EQUAL(p.temperature, 0.1);
  BOOST_CHECK_EQUAL(p.top_p, 0.5);
  BOOST_CHECK_EQUAL(p.top_k, 3u);
  BOOST_CHECK(p.stop == (std::vector<std::string>{"STOP"}));
  BOOST_CHECK_EQUAL(p.controls.min_p, 0.05f);
  BOOST_CHECK_EQUAL(p.controls.presence_penalty, 1.0f);
  BOOST_CHECK_EQUAL(p.seed, 9u + salt("0"));  // the step's seed over the submit's
  BOOST_CHECK(a[0].constraint.kind == Constraint::regex);
  BOOST_CHECK_EQUAL(a[0].constraint.source, "[a-z]+");
}

BOOST_AUTO_TEST_CASE(fork_prefills_once_then_joins_text_in_branch_order) {
  Run run(program(R"([
    {"type":"text","text":"Story:"},
    {"type":"fork","name":"f","branches":[
      [{"type":"text","text":" A:"},{"type":"gen","name":"x"}],
      [{"type":"text","text":" B:"},{"type":"gen","name":"x"}]]},
    {"type":"join","separator":" | "},
    {"type":"gen","name":"end"}])"));
  std::vector<Action> a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  BOOST_CHECK(a[0].kind == Action::Kind::prefill);
  BOOST_CHECK_EQUAL(a[0].path, "1");
  BOOST_CHECK_EQUAL(a[0].text, "Story:");
  BOOST_CHECK_EQUAL(a[0].params.max_tokens, 1u);
  BOOST_CHECK(run.ready().empty());  // no branch starts before the prefill is in
  BOOST_CHECK(run.complete("1", ""));
  BOOST_CHECK_EQUAL(run.steps_done(), 0u);  // a prefill is not a step

  a = run.ready();
  BOOST_CHECK(paths(a) == (std::set<std::string>{"1.0.1", "1.1.1"}));
  BOOST_CHECK_EQUAL(at(a, "1.0.1").text, "Story: A:");
  BOOST_CHECK_EQUAL(at(a, "1.1.1").text, "Story: B:");
  // the later branch finishes first: the join still waits, then keeps branch order
  BOOST_CHECK(run.complete("1.1.1", "bbb"));
  BOOST_CHECK(run.ready().empty());
  BOOST_CHECK(!run.finished());
  BOOST_CHECK(run.complete("1.0.1", "aaa"));
  a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  BOOST_CHECK_EQUAL(a[0].path, "3");
  BOOST_CHECK_EQUAL(a[0].text, "Story: A:aaa |  B:bbb");
  BOOST_CHECK(run.complete("3", "!"));
  BOOST_CHECK(run.finished());
  // branch variables by fork name, in step order (not completion order)
  BOOST_CHECK(flat(run.vars()) == (std::vector<std::string>{"f.0.x=aaa", "f.1.x=bbb", "end=!"}));
  BOOST_CHECK_EQUAL(run.last_output(), "!");
  BOOST_CHECK_EQUAL(run.steps_done(), 3u);
}

BOOST_AUTO_TEST_CASE(join_list_gathers_a_variable_of_every_branch) {
  Run run(program(R"([
    {"type":"text","text":"T: {{topic}}"},
    {"type":"fork","n":3,"steps":[{"type":"gen","name":"idea","max_tokens":4}]},
    {"type":"join","mode":"list","name":"ideas","var":"idea"},
    {"type":"text","text":"\nIdeas:\n{{ideas}}\nBest:"},
    {"type":"gen","name":"best"}])",
                  {{"topic", "tea"}}));
  std::vector<Action> a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  BOOST_CHECK(a[0].kind == Action::Kind::prefill);
  BOOST_CHECK(run.complete("1", ""));
  a = run.ready();
  BOOST_CHECK(paths(a) == (std::set<std::string>{"1.0.0", "1.1.0", "1.2.0"}));
  for (const Action& g : a) BOOST_CHECK_EQUAL(g.text, "T: tea");
  BOOST_CHECK(run.complete("1.2.0", "i2"));
  BOOST_CHECK(run.complete("1.0.0", "i0"));
  BOOST_CHECK(run.complete("1.1.0", "i1"));
  a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  // a list join appends nothing; its variable inserts the items joined by "\n"
  BOOST_CHECK_EQUAL(a[0].text, "T: tea\nIdeas:\ni0\ni1\ni2\nBest:");
  BOOST_CHECK(flat(run.vars()) ==
              (std::vector<std::string>{"topic=tea", "1.0.idea=i0", "1.1.idea=i1", "1.2.idea=i2",
                                        "ideas[list]=i0|i1|i2"}));
  BOOST_CHECK_EQUAL(run.last_output(), "");  // no top-level gen, select or tool done yet
}

BOOST_AUTO_TEST_CASE(nested_forks) {
  Run run(program(R"([
    {"type":"text","text":"S"},
    {"type":"fork","name":"outer","branches":[
      [{"type":"text","text":"a"},{"type":"gen","name":"x"}],
      [{"type":"text","text":"b"},
       {"type":"fork","name":"inner","n":2,"steps":[{"type":"text","text":"c"},
                                                    {"type":"gen","name":"y"}]},
       {"type":"join","separator":","},
       {"type":"gen","name":"z"}]]},
    {"type":"join","separator":"|"},
    {"type":"gen","name":"end"}])"));
  std::vector<Action> a = run.ready();
  BOOST_CHECK(paths(a) == (std::set<std::string>{"1"}));
  BOOST_CHECK(run.complete("1", ""));
  a = run.ready();
  // branch 0 generates while branch 1 prefills its own fork's context
  BOOST_CHECK(paths(a) == (std::set<std::string>{"1.0.1", "1.1.1"}));
  BOOST_CHECK(at(a, "1.1.1").kind == Action::Kind::prefill);
  BOOST_CHECK_EQUAL(at(a, "1.1.1").text, "Sb");
  BOOST_CHECK_EQUAL(at(a, "1.0.1").text, "Sa");
  BOOST_CHECK(run.complete("1.1.1", ""));
  a = run.ready();
  BOOST_CHECK(paths(a) == (std::set<std::string>{"1.1.1.0.1", "1.1.1.1.1"}));
  BOOST_CHECK_EQUAL(at(a, "1.1.1.1.1").text, "Sbc");
  BOOST_CHECK(run.complete("1.1.1.1.1", "Y1"));
  BOOST_CHECK(run.complete("1.1.1.0.1", "Y0"));
  a = run.ready();
  BOOST_CHECK(paths(a) == (std::set<std::string>{"1.1.3"}));
  BOOST_CHECK_EQUAL(a[0].text, "SbcY0,cY1");
  BOOST_CHECK(run.complete("1.1.3", "Z"));
  BOOST_CHECK(run.ready().empty());  // branch 0 still generates
  BOOST_CHECK(run.complete("1.0.1", "X"));
  a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  BOOST_CHECK_EQUAL(a[0].text, "SaX|bcY0,cY1Z");
  BOOST_CHECK(run.complete("3", "E"));
  BOOST_CHECK(run.finished());
  BOOST_CHECK(flat(run.vars()) ==
              (std::vector<std::string>{"outer.0.x=X", "outer.1.inner.0.y=Y0",
                                        "outer.1.inner.1.y=Y1", "outer.1.z=Z", "end=E"}));
  BOOST_CHECK_EQUAL(run.steps_done(), 5u);
}

BOOST_AUTO_TEST_CASE(a_fork_of_one_branch_needs_no_prefill) {
  Run run(program(R"([{"type":"text","text":"p"},
                      {"type":"fork","n":1,"steps":[{"type":"gen","name":"x"}]},
                      {"type":"join"}])"));
  const std::vector<Action> a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  BOOST_CHECK(a[0].kind == Action::Kind::gen);
  BOOST_CHECK_EQUAL(a[0].path, "1.0.0");
  BOOST_CHECK(run.complete("1.0.0", "y"));
  BOOST_CHECK(run.finished());
  BOOST_CHECK(flat(run.vars()) == (std::vector<std::string>{"1.0.x=y"}));
}

BOOST_AUTO_TEST_CASE(seeds_differ_across_forked_copies_and_repeat_across_runs) {
  GenDefaults d;
  d.seed = 42;
  const auto p = program(R"([{"type":"fork","n":3,"steps":[{"type":"gen","name":"x"}]},
                             {"type":"join"},
                             {"type":"gen","name":"y","seed":100}])",
                         {}, d);
  const auto seeds = [&](Run& run) {
    std::vector<uint64_t> out;
    std::vector<Action> a = run.ready();
    BOOST_REQUIRE_EQUAL(a.size(), 1u);
    BOOST_CHECK_EQUAL(a[0].params.seed, 42u + salt("0"));
    run.complete("0", "");
    a = run.ready();
    BOOST_REQUIRE_EQUAL(a.size(), 3u);
    for (const std::string path : {"0.0.0", "0.1.0", "0.2.0"}) {
      out.push_back(at(a, path).params.seed);
      BOOST_CHECK_EQUAL(at(a, path).params.seed, 42u + salt(path));
      run.complete(path, "o");
    }
    a = run.ready();
    BOOST_REQUIRE_EQUAL(a.size(), 1u);
    BOOST_CHECK_EQUAL(a[0].params.seed, 100u + salt("2"));
    out.push_back(a[0].params.seed);
    return out;
  };
  Run first(p), second(p);
  const std::vector<uint64_t> s1 = seeds(first), s2 = seeds(second);
  BOOST_CHECK(s1 == s2);
  BOOST_CHECK_EQUAL(std::set<uint64_t>(s1.begin(), s1.end()).size(), s1.size());
}

BOOST_AUTO_TEST_CASE(chat_turns) {
  Run run(program(R"([
    {"type":"text","text":"You are terse.","role":"system"},
    {"type":"text","text":"Q: {{q}}","role":"user"},
    {"type":"text","text":" Please."},
    {"type":"gen","name":"a"},
    {"type":"tool","name":"r","tool":"t","arguments":"{{a}}","role":"ipython"},
    {"type":"fork","n":2,"steps":[{"type":"text","text":"again","role":"user"},
                                  {"type":"gen","name":"b"}]},
    {"type":"join","separator":"ignored in chat mode"},
    {"type":"select","name":"s","choices":["x","y"],"append":false},
    {"type":"gen","name":"end"}])",
                  {{"q", "2+2?"}}));
  std::vector<Action> a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  BOOST_CHECK(a[0].text.empty());
  BOOST_CHECK(same_turns(a[0].turns, {{"system", "You are terse."}, {"user", "Q: 2+2? Please."}}));
  BOOST_CHECK(run.complete("3", "4"));
  a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  BOOST_CHECK_EQUAL(a[0].arguments, "4");
  BOOST_CHECK(run.complete("4", "checked"));
  a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  BOOST_CHECK(a[0].kind == Action::Kind::prefill);
  const std::vector<Turn> before = {{"system", "You are terse."},
                                    {"user", "Q: 2+2? Please."},
                                    {"assistant", "4"},
                                    {"ipython", "checked"}};
  BOOST_CHECK(same_turns(a[0].turns, before));
  BOOST_CHECK(run.complete("5", ""));
  a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 2u);
  std::vector<Turn> branch = before;
  branch.push_back({"user", "again"});
  BOOST_CHECK(same_turns(at(a, "5.1.1").turns, branch));
  BOOST_CHECK(run.complete("5.1.1", "B1"));
  BOOST_CHECK(run.complete("5.0.1", "B0"));
  a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  BOOST_CHECK(a[0].kind == Action::Kind::select);
  std::vector<Turn> joined = before;
  joined.insert(joined.end(),
                {{"user", "again"}, {"assistant", "B0"}, {"user", "again"}, {"assistant", "B1"}});
  BOOST_CHECK(same_turns(a[0].turns, joined));
  BOOST_CHECK(run.complete("7", "y"));
  a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  BOOST_CHECK(same_turns(a[0].turns, joined));  // the select's output was not appended
}

BOOST_AUTO_TEST_CASE(chat_text_without_role_starts_or_extends_a_turn) {
  Run run(program(R"([
    {"type":"text","text":"Hello"},
    {"type":"text","text":"Sys","role":"system"},
    {"type":"text","text":"Q","role":"user"},
    {"type":"fork","n":2,"steps":[{"type":"text","text":" more"},{"type":"gen","name":"b"}]},
    {"type":"join"},
    {"type":"gen","name":"end"}])"));
  std::vector<Action> a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);  // the prefill
  BOOST_CHECK(same_turns(a[0].turns, {{"user", "Hello"}, {"system", "Sys"}, {"user", "Q"}}));
  run.complete("3", "");
  a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 2u);
  BOOST_CHECK(
      same_turns(at(a, "3.0.1").turns, {{"user", "Hello"}, {"system", "Sys"}, {"user", "Q more"}}));
  run.complete("3.0.1", "B0");
  run.complete("3.1.1", "B1");
  a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  // what branches added to the inherited turn goes there (branch order), then their new turns
  BOOST_CHECK(same_turns(a[0].turns, {{"user", "Hello"},
                                      {"system", "Sys"},
                                      {"user", "Q more more"},
                                      {"assistant", "B0"},
                                      {"assistant", "B1"}}));
}

BOOST_AUTO_TEST_CASE(restored_steps_are_not_asked_for_again) {
  Run run(program(kLinear, {{"q", "Who?"}}));
  run.restore("1", " Frank");
  run.restore("3", " a");
  run.restore("99", "ignored");  // no such step
  std::vector<Action> a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  BOOST_CHECK(a[0].kind == Action::Kind::tool);
  BOOST_CHECK_EQUAL(a[0].arguments, "{\"q\":\" Frank\"}");
  BOOST_CHECK_EQUAL(a[0].text, "Q: Who?\nA: Frank\nIntent: a");
  BOOST_CHECK_EQUAL(run.steps_done(), 2u);
  BOOST_CHECK_EQUAL(run.last_output(), " a");
  BOOST_CHECK(!run.complete("1", "x"));  // done, not pending
  BOOST_CHECK(pending_of(run) == (std::vector<std::string>{"4"}));
  // an output restored for a step already handed out completes it
  run.restore("4", "R");
  BOOST_CHECK(run.pending().empty());
  a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  BOOST_CHECK_EQUAL(a[0].path, "6");
  BOOST_CHECK_EQUAL(run.steps_done(), 3u);
}

BOOST_AUTO_TEST_CASE(a_restored_step_inside_a_fork_skips_its_prefill) {
  const std::string json = R"([
    {"type":"text","text":"S"},
    {"type":"fork","branches":[[{"type":"gen","name":"x"}],[{"type":"gen","name":"x"}]]},
    {"type":"join"},
    {"type":"gen","name":"end"}])";
  {
    Run run(program(json));
    run.restore("1.1.0", "B");
    const std::vector<Action> a = run.ready();
    BOOST_CHECK(paths(a) == (std::set<std::string>{"1.0.0"}));  // no prefill, branch 1 done
    BOOST_CHECK_EQUAL(a[0].text, "S");
    BOOST_CHECK_EQUAL(run.steps_done(), 1u);
    run.complete("1.0.0", "A");
    const std::vector<Action> b = run.ready();
    BOOST_REQUIRE_EQUAL(b.size(), 1u);
    BOOST_CHECK_EQUAL(b[0].text, "SAB");
  }
  {
    Run run(program(json));
    run.restore("1", "");  // the prefill itself was journaled
    BOOST_CHECK(paths(run.ready()) == (std::set<std::string>{"1.0.0", "1.1.0"}));
  }
  {
    Run run(program(json));
    run.restore("11", "");  // "1" is not a prefix of "11": the prefill still runs
    BOOST_CHECK(paths(run.ready()) == (std::set<std::string>{"1"}));
  }
  {
    // everything restored: a resumed program that was complete runs nothing
    Run run(program(json));
    for (const std::string path : {"1.0.0", "1.1.0", "3"}) run.restore(path, path);
    BOOST_CHECK(run.ready().empty());
    BOOST_CHECK(run.finished());
    BOOST_CHECK_EQUAL(run.last_output(), "3");
    BOOST_CHECK_EQUAL(run.steps_done(), 3u);
  }
}

BOOST_AUTO_TEST_CASE(templates_render_escapes_literally) {
  Run run(
      program(R"([{"type":"text","text":"{{{{q}} is {{q}}, {x} }}"},{"type":"gen","name":"g"}])",
              {{"q", "v {{q}}"}}));
  const std::vector<Action> a = run.ready();
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  // an inserted value is never read as a template again
  BOOST_CHECK_EQUAL(a[0].text, "{{q}} is v {{q}}, {x} }}");
}

BOOST_AUTO_TEST_CASE(a_moved_run_keeps_walking) {
  Run first(program(kLinear, {{"q", "Who?"}}));
  BOOST_REQUIRE_EQUAL(first.ready().size(), 1u);
  Run run = std::move(first);
  BOOST_CHECK(run.complete("1", "x"));
  BOOST_CHECK_EQUAL(run.ready().size(), 1u);
  BOOST_CHECK_EQUAL(run.steps_done(), 1u);
}

BOOST_AUTO_TEST_SUITE_END()
