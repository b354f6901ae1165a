// parse(): what a program's steps become (paths, fields, constraints, controls over the defaults,
// n copies of a fork) and every refusal, each naming the step by path and type: unknown types
// and fields, wrong types and ranges, names and scopes, {{name}} templates, forks and joins, limits.
#include <boost/test/unit_test.hpp>
#include <string>
#include <utility>
#include <vector>

#include "programs/program.hpp"

BOOST_AUTO_TEST_SUITE(test_programs)

using sy::Constraint;
using sy::programs::GenDefaults;
using sy::programs::Limits;
using sy::programs::parse;
using sy::programs::Program;
using sy::programs::ProgramError;
using sy::programs::Step;

namespace {

using Inputs = std::vector<std::pair<std::string, std::string>>;

Program parsed(const std::string& json, Inputs inputs = {}, const GenDefaults& d = {},
               const Limits& lim = {}) {
  return parse(json, std::move(inputs), d, lim);
}

// parse() refuses `json` with a message that contains `fragment`.
void check_refused(const std::string& json, const std::string& fragment, Inputs inputs = {},
                   const Limits& lim = {}) {
  try {
    parse(json, std::move(inputs), GenDefaults{}, lim);
    BOOST_ERROR("program " << json << " was not refused (wanted \"" << fragment << "\")");
  } catch (const ProgramError& e) {
    BOOST_CHECK_MESSAGE(
        std::string(e.what()).find(fragment) != std::string::npos,
        "program " << json << ": message \"" << e.what() << "\" lacks \"" << fragment << "\"");
  }
}

// The message parse() refuses `json` with ("" if it does not).
std::string refusal(const std::string& json, Inputs inputs = {}, const Limits& lim = {}) {
  try {
    parse(json, std::move(inputs), GenDefaults{}, lim);
  } catch (const ProgramError& e) {
    return e.what();
  }
  return "";
}

// A one-step program: a gen named "a" with `fields` (JSON members, "" for none).
std::string gen_with(const std::string& fields) {
  return R"([{"type":"gen","name":"a")" + (fields.empty() ? "" : "," + fields) + "}]";
}

// `n` text steps, comma-separated (a JSON array's inside).
std::string texts(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += std::string(i ? "," : "") + R"({"type":"text","text":"x"})";
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(linear_program_fields_and_paths) {
  GenDefaults d;
  d.max_tokens = 16;
  const Program p = parsed(R"([
    {"type":"text","text":"Q: {{q}}\nA:"},
    {"type":"gen","name":"answer","max_tokens":32,"temperature":0,"top_k":5,"top_p":0.5,
     "seed":7,"stop":["\n","END"],"append":false},
    {"type":"select","name":"yes","choices":[" yes"," no"],"method":"greedy_first_token"},
    {"type":"tool","name":"res","tool":"search","arguments":"{{answer}}","tool_timeout_ms":500},
    {"type":"gen","name":"more"}
  ])",
                           {{"q", "why?"}}, d);
  BOOST_REQUIRE_EQUAL(p.steps.size(), 5u);
  BOOST_CHECK(!p.chat);
  BOOST_CHECK_EQUAL(p.n_steps, 5u);
  // 32 of the first gen, the defaults' 16 of the second; select and tool generate nothing
  BOOST_CHECK_EQUAL(p.max_generated, 48u);
  BOOST_CHECK(p.inputs == (Inputs{{"q", "why?"}}));
  for (std::size_t i = 0; i < p.steps.size(); ++i)
    BOOST_CHECK_EQUAL(p.steps[i].path, std::to_string(i));

  const Step& t = p.steps[0];
  BOOST_CHECK(t.kind == Step::Kind::text);
  BOOST_CHECK_EQUAL(t.text, "Q: {{q}}\nA:");
  BOOST_CHECK(t.name.empty());

  const Step& g = p.steps[1];
  BOOST_CHECK(g.kind == Step::Kind::gen);
  BOOST_CHECK_EQUAL(g.name, "answer");
  BOOST_CHECK_EQUAL(*g.gen.max_tokens, 32u);
  BOOST_CHECK_EQUAL(*g.gen.temperature, 0.0);
  BOOST_CHECK_EQUAL(*g.gen.top_k, 5u);
  BOOST_CHECK_EQUAL(*g.gen.top_p, 0.5);
  BOOST_CHECK_EQUAL(*g.gen.seed, 7u);
  BOOST_CHECK(*g.gen.stop == (std::vector<std::string>{"\n", "END"}));
  BOOST_CHECK(!g.gen.controls);  // no control field given
  BOOST_CHECK(g.gen.constraint.empty());
  BOOST_CHECK(!g.append);

  const Step& s = p.steps[2];
  BOOST_CHECK(s.kind == Step::Kind::select);
  BOOST_CHECK(s.choices == (std::vector<std::string>{" yes", " no"}));
  BOOST_CHECK(s.method == Step::greedy_first_token);
  BOOST_CHECK(s.append);

  const Step& tool = p.steps[3];
  BOOST_CHECK(tool.kind == Step::Kind::tool);
  BOOST_CHECK_EQUAL(tool.name, "res");
  BOOST_CHECK_EQUAL(tool.tool, "search");
  BOOST_CHECK_EQUAL(tool.arguments, "{{answer}}");
  BOOST_CHECK_EQUAL(tool.timeout_ms, 500u);
  BOOST_CHECK_EQUAL(tool.role, "tool");

  const Step& more = p.steps[4];
  BOOST_CHECK(!more.gen.max_tokens && !more.gen.temperature && !more.gen.seed);
  BOOST_CHECK(more.append);
}

BOOST_AUTO_TEST_CASE(defaults_of_select_and_tool) {
  Limits lim;
  lim.default_tool_timeout_ms = 1234;
  const Program p = parsed(R"([{"type":"select","name":"s","choices":["a"]},
                               {"type":"tool","name":"r","tool":"t"}])",
                           {}, {}, lim);
  BOOST_CHECK(p.steps[0].method == Step::token_length_normalized);
  BOOST_CHECK_EQUAL(p.steps[1].timeout_ms, 1234u);
  BOOST_CHECK_EQUAL(p.steps[1].arguments, "");
  BOOST_CHECK_EQUAL(p.steps[1].role, "tool");
}

BOOST_AUTO_TEST_CASE(controls_are_the_defaults_with_the_step_fields_over_them) {
  GenDefaults d;
  d.controls.min_p = 0.25f;
  d.controls.repeat_last_n = 32;
  d.controls.logit_bias = {{9, 1.0f}};
  const Program p = parsed(gen_with(R"("presence_penalty":0.5,"repeat_last_n":-1)"), {}, d);
  const auto& c = p.steps[0].gen.controls;
  BOOST_REQUIRE(c.has_value());
  BOOST_CHECK_EQUAL(c->min_p, 0.25f);  // the default, kept
  BOOST_CHECK_EQUAL(c->presence_penalty, 0.5f);
  BOOST_CHECK_EQUAL(c->frequency_penalty, 0.0f);
  BOOST_CHECK_EQUAL(c->repetition_penalty, 1.0f);
  BOOST_CHECK_EQUAL(c->repeat_last_n, -1);
  BOOST_CHECK(c->logit_bias == (std::vector<std::pair<int32_t, float>>{{9, 1.0f}}));

  // logit_bias as a map of id strings and as [id, bias] pairs: ascending ids either way
  const Program m = parsed(gen_with(R"("logit_bias":{"300":-5,"12":2.5,"7":100})"));
  const auto want = std::vector<std::pair<int32_t, float>>{{7, 100.0f}, {12, 2.5f}, {300, -5.0f}};
  BOOST_CHECK(m.steps[0].gen.controls->logit_bias == want);
  const Program a = parsed(gen_with(R"("logit_bias":[[300,-5],[7,100],[12,2.5]])"));
  BOOST_CHECK(a.steps[0].gen.controls->logit_bias == want);
  const Program r =
      parsed(gen_with(R"("min_p":0.1,"frequency_penalty":-2,"repetition_penalty":1.3)"));
  BOOST_CHECK_CLOSE(r.steps[0].gen.controls->min_p, 0.1f, 1e-4);
  BOOST_CHECK_EQUAL(r.steps[0].gen.controls->frequency_penalty, -2.0f);
  BOOST_CHECK_CLOSE(r.steps[0].gen.controls->repetition_penalty, 1.3f, 1e-4);
}

BOOST_AUTO_TEST_CASE(constraints_of_a_gen) {
  const Program g = parsed(gen_with(R"("grammar":"root ::= \"a\"")"));
  BOOST_CHECK(g.steps[0].gen.constraint.kind == Constraint::grammar);
  BOOST_CHECK_EQUAL(g.steps[0].gen.constraint.source, "root ::= \"a\"");
  const Program r = parsed(gen_with(R"("regex":"[0-9]+")"));
  BOOST_CHECK(r.steps[0].gen.constraint.kind == Constraint::regex);
  BOOST_CHECK_EQUAL(r.steps[0].gen.constraint.source, "[0-9]+");
  // A schema sent as a map keeps its keys' order: the order the output writes properties in.
  const Program j = parsed(gen_with(
      R"("json_schema":{"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}}})"));
  BOOST_CHECK(j.steps[0].gen.constraint.kind == Constraint::json_schema);
  BOOST_CHECK_EQUAL(
      j.steps[0].gen.constraint.source,
      R"({"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}}})");
  const Program js = parsed(gen_with(R"("json_schema":"{\"type\": \"string\"}")"));
  BOOST_CHECK_EQUAL(js.steps[0].gen.constraint.source, "{\"type\": \"string\"}");
  const Program c = parsed(gen_with(R"("choices":["red","green"])"));
  BOOST_CHECK(c.steps[0].gen.constraint.kind == Constraint::choices);
  BOOST_CHECK(c.steps[0].gen.constraint.options == (std::vector<std::string>{"red", "green"}));

  check_refused(gen_with(R"("grammar":"x","regex":"y")"),
                "step 0 (gen 'a'): fields grammar, regex exclude each other");
  check_refused(gen_with(R"("json_schema":"{not json")"), "'json_schema' is not valid JSON");
  check_refused(gen_with(R"("json_schema":3)"), "field 'json_schema' must be a map");
  check_refused(gen_with(R"("choices":[])"), "field 'choices' must not be empty");
  check_refused(gen_with(R"("choices":["a",1])"), "choice at index 1 must be a string");
  check_refused(gen_with(R"("grammar":"")"), "field 'grammar' must not be empty");
}

BOOST_AUTO_TEST_CASE(errors_name_the_step_by_path_and_type) {
  // The doc's example, exactly.
  BOOST_CHECK_EQUAL(refusal(R"([
    {"type":"text","text":"a"},
    {"type":"text","text":"b"},
    {"type":"fork","branches":[[{"type":"text","text":"c"}],
                               [{"type":"gen","name":"draft","max_token":5}]]},
    {"type":"join"}])"),
                    "step 2.1.0 (gen 'draft'): unknown field 'max_token'");
  BOOST_CHECK_EQUAL(refusal(R"([{"type":"text","text":"a","name":"x"}])"),
                    "step 0 (text): unknown field 'name'");
  BOOST_CHECK_EQUAL(refusal(R"([{"type":"text","text":"a"},{"type":"loop"}])"),
                    "step 1: unknown type 'loop' (text, gen, select, fork, join or tool)");
  check_refused(R"([{"text":"a"}])", "step 0: missing field 'type'");
  check_refused(R"([{"type":3}])", "step 0: field 'type' must be a string, got an integer");
  check_refused(R"([{"type":"text","text":"a"},"gen"])",
                "step 1: a step must be a map, got a string");
  // a named fork and a list join are named in their messages too
  check_refused(R"([{"type":"fork","name":"f","n":2,"steps":[{"type":"text","text":"a"}],"x":1},
                    {"type":"join"}])",
                "step 0 (fork 'f'): unknown field 'x'");
  check_refused(R"([{"type":"fork","n":2,"steps":[{"type":"gen","name":"d"}]},
                    {"type":"join","mode":"list","name":"all","var":"d","sep":","}])",
                "step 1 (join 'all'): unknown field 'sep'");
  // in n copies, the first copy's path is the one named
  check_refused(R"([{"type":"text","text":"a"},
                    {"type":"fork","n":3,"steps":[{"type":"text","text":"a"},{"type":"gen"}]},
                    {"type":"join"}])",
                "step 1.0.1 (gen): missing field 'name'");
}

BOOST_AUTO_TEST_CASE(json_and_shape_refusals) {
  check_refused("[{\"type\":", "program: not valid JSON: ");
  check_refused(R"({"type":"text"})",
                "program: the steps must be an array of step maps, got a map");
  check_refused("[]", "program: no steps");
  // nesting is bounded before the parser builds the tree; brackets inside strings do not count
  const std::string deep = std::string(129, '[') + std::string(129, ']');
  check_refused(deep, "program: arrays and maps nested more than 128 deep");
  std::string schema = "{}";
  for (int i = 0; i < 100; ++i) schema = R"({"items":)" + schema + "}";
  BOOST_CHECK_NO_THROW(parsed(gen_with(R"("json_schema":)" + schema)));
  BOOST_CHECK_NO_THROW(
      parsed(R"([{"type":"text","text":")" + std::string(200, '[') + R"(\"[{"}])"));
}

BOOST_AUTO_TEST_CASE(field_types_and_ranges) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("max_tokens":"16")",
       "step 0 (gen 'a'): field 'max_tokens' must be an integer in [1, 4294967295], got a string"},
      {R"("max_tokens":0)", "field 'max_tokens' is 0, out of range [1, 4294967295]"},
      {R"("max_tokens":4294967296)", "field 'max_tokens' is 4294967296, out of range"},
      {R"("max_tokens":2.5)", "field 'max_tokens' must be an integer"},
      {R"("temperature":-0.5)", "field 'temperature' is -0.5, out of range [0, 100]"},
      {R"("temperature":"hot")", "field 'temperature' must be a number in [0, 100], got a string"},
      {R"("top_p":0)", "field 'top_p' is 0, out of range (0, 1]"},
      {R"("top_p":1.5)", "field 'top_p' is 1.5, out of range (0, 1]"},
      {R"("top_p":1e-46)", "once narrowed to the sampler's 32-bit float"},
      {R"("top_k":-1)", "field 'top_k' is -1, out of range [0, 2147483647]"},
      {R"("seed":-3)", "field 'seed' is -3, out of range"},
      {R"("stop":[1])", "stop string at index 0 must be a string, got an integer"},
      {R"("stop":["a",""])", "stop string at index 1 must not be empty"},
      {R"("stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"])",
       "stop has 17 strings, limit 16"},
      {R"("stop":{"a":1})", "field 'stop' must be a string or an array of strings, got a map"},
      {R"("min_p":1.5)", "field 'min_p' is 1.5, out of range [0, 1]"},
      {R"("presence_penalty":2.5)", "field 'presence_penalty' is 2.5, out of range [-2, 2]"},
      {R"("frequency_penalty":-3)", "field 'frequency_penalty' is -3, out of range [-2, 2]"},
      {R"("repetition_penalty":0)", "field 'repetition_penalty' is 0, out of range (0, 10]"},
      {R"("repetition_penalty":11)", "field 'repetition_penalty' is 11, out of range (0, 10]"},
      {R"("repeat_last_n":-2)", "field 'repeat_last_n' is -2, out of range [-1, 2147483647]"},
      {R"("logit_bias":{"5":101})", "logit_bias.5 is 101, out of range [-100, 100]"},
      {R"("logit_bias":{"x1":1})", "logit_bias key 'x1' is not a token id"},
      {R"("logit_bias":{"2147483648":1})", "logit_bias token id 2147483648 out of range"},
      {R"("logit_bias":[[5,1],[5,2]])", "logit_bias names token id 5 twice"},
      {R"("logit_bias":[[5]])", "logit_bias entry at index 0 must be a pair [token id, bias]"},
      {R"("logit_bias":3)", "field 'logit_bias' must be a map of token id to bias"},
      {R"("append":"yes")", "field 'append' must be a boolean, got a string"},
  };
  for (const auto& [fields, fragment] : cases) check_refused(gen_with(fields), fragment);

  // 1025 logit_bias entries
  std::string lb;
  for (int i = 0; i < 1025; ++i) lb += std::string(i ? "," : "") + "[" + std::to_string(i) + ",1]";
  check_refused(gen_with(R"("logit_bias":[)" + lb + "]"),
                "logit_bias has 1025 entries, limit 1024");
}

BOOST_AUTO_TEST_CASE(select_tool_and_text_refusals) {
  check_refused(R"([{"type":"select","name":"s"}])",
                "step 0 (select 's'): missing field 'choices'");
  check_refused(R"([{"type":"select","name":"s","choices":[]}])",
                "field 'choices' must not be empty");
  check_refused(R"([{"type":"select","name":"s","choices":["a",""]}])",
                "choice at index 1 must not be empty");
  std::string many;
  for (int i = 0; i < 65; ++i) many += std::string(i ? "," : "") + "\"c" + std::to_string(i) + "\"";
  check_refused(R"([{"type":"select","name":"s","choices":[)" + many + "]}]",
                "choices has 65 entries, limit 64");
  check_refused(R"([{"type":"select","name":"s","choices":["a"],"method":"best"}])",
                "field 'method' must be 'token_length_normalized' or 'greedy_first_token'");
  check_refused(R"([{"type":"select","choices":["a"]}])", "step 0 (select): missing field 'name'");

  check_refused(R"([{"type":"tool","name":"r"}])", "step 0 (tool 'r'): missing field 'tool'");
  check_refused(R"([{"type":"tool","name":"r","tool":""}])", "field 'tool' must not be empty");
  check_refused(R"([{"type":"tool","name":"r","tool":")" + std::string(65, 't') + "\"}]",
                "field 'tool' has 65 bytes, limit 64");
  BOOST_CHECK_EQUAL(
      refusal(R"([{"type":"tool","name":"passage","tool":"t","tool_timeout_ms":3600001}])"),
      "step 0 (tool 'passage'): field 'tool_timeout_ms' is 3600001, out of range [1, 3600000]");
  check_refused(R"([{"type":"tool","name":"r","tool":"t","tool_timeout_ms":0}])",
                "field 'tool_timeout_ms' is 0, out of range [1, 3600000]");
  check_refused(R"([{"type":"tool","name":"r","tool":"t","role":""}])",
                "field 'role' must not be empty");
  check_refused(R"([{"type":"tool","name":"r","tool":"t","arguments":5}])",
                "field 'arguments' must be a string");

  check_refused(R"([{"type":"text"}])", "step 0 (text): missing field 'text'");
  check_refused(R"([{"type":"text","text":["a"]}])", "field 'text' must be a string, got an array");
  check_refused(R"([{"type":"text","text":"a","role":""}])", "field 'role' must not be empty");
  Limits lim;
  lim.max_text_bytes = 8;
  check_refused(R"([{"type":"text","text":"123456789"}])",
                "step 0 (text): text has 9 bytes, limit 8", {}, lim);
  BOOST_CHECK_NO_THROW(parse(R"([{"type":"text","text":"12345678"}])", {}, {}, lim));
  check_refused(R"([{"type":"tool","name":"r","tool":"t","arguments":"123456789"}])",
                "arguments have 9 bytes, limit 8", {}, lim);
}

BOOST_AUTO_TEST_CASE(names_and_scopes) {
  check_refused(R"([{"type":"gen","name":"1x"}])",
                "step 0 (gen '1x'): name '1x' is not a valid name ([A-Za-z_][A-Za-z0-9_]*");
  check_refused(R"([{"type":"gen","name":"a-b"}])", "name 'a-b' is not a valid name");
  check_refused(R"([{"type":"gen","name":")" + std::string(65, 'n') + "\"}]",
                "is not a valid name");
  BOOST_CHECK_NO_THROW(parsed(R"([{"type":"gen","name":")" + std::string(64, 'n') + "\"}]"));
  check_refused(R"([{"type":"gen","name":5}])", "field 'name' must be a string");
  check_refused(R"([{"type":"gen","name":"a"},{"type":"select","name":"a","choices":["x"]}])",
                "step 1 (select 'a'): name 'a' is already defined in this scope");
  check_refused(R"([{"type":"gen","name":"q"}])", "step 0 (gen 'q'): name 'q' is already an input",
                {{"q", "v"}});
  check_refused(R"([{"type":"fork","name":"f","n":1,"steps":[{"type":"gen","name":"x"}]},
                    {"type":"join"},{"type":"gen","name":"f"}])",
                "step 2 (gen 'f'): name 'f' already names a fork in this scope");
  // a branch may not reuse a name from before its fork...
  check_refused(R"([{"type":"gen","name":"x"},
                    {"type":"fork","branches":[[{"type":"gen","name":"x"}]]},{"type":"join"}])",
                "step 1.0.0 (gen 'x'): name 'x' is already defined in this scope");
  // ...but sibling branches may share names, and after the join the level may reuse them
  const Program p = parsed(R"([
    {"type":"fork","branches":[[{"type":"gen","name":"x"}],[{"type":"gen","name":"x"}]]},
    {"type":"join","mode":"list","name":"xs","var":"x"},
    {"type":"gen","name":"x"}])");
  BOOST_CHECK_EQUAL(p.n_steps, 5u);
  BOOST_CHECK_EQUAL(p.steps[1].name, "xs");
  BOOST_CHECK_EQUAL(p.steps[1].var, "x");
  BOOST_CHECK(p.steps[1].mode == Step::join_list);
}

BOOST_AUTO_TEST_CASE(templates_must_name_what_is_defined_before) {
  // The doc's example, exactly.
  BOOST_CHECK_EQUAL(refusal(R"([{"type":"text","text":"Q"},{"type":"gen","name":"a"},
                               {"type":"text","text":"x"},{"type":"text","text":"{{answer}}"},
                               {"type":"gen","name":"answer"}])"),
                    "step 3 (text): {{answer}} is not defined before this step");
  // defined later does not count; a tool's own name is not defined in its arguments
  check_refused(R"([{"type":"text","text":"{{a}}"},{"type":"gen","name":"a"}])",
                "step 0 (text): {{a}} is not defined before this step");
  check_refused(R"([{"type":"tool","name":"r","tool":"t","arguments":"{{r}}"}])",
                "step 0 (tool 'r'): {{r}} is not defined before this step");
  // a branch's variables are not seen after the join, nor in a sibling branch
  check_refused(R"([{"type":"fork","branches":[[{"type":"gen","name":"x"}]]},{"type":"join"},
                    {"type":"text","text":"{{x}}"}])",
                "step 2 (text): {{x}} is not defined before this step");
  check_refused(R"([{"type":"fork","branches":[[{"type":"gen","name":"x"}],
                                                [{"type":"text","text":"{{x}}"}]]},
                    {"type":"join"}])",
                "step 0.1.0 (text): {{x}} is not defined before this step");
  check_refused(R"([{"type":"fork","name":"f","n":1,"steps":[{"type":"gen","name":"x"}]},
                    {"type":"join"},{"type":"text","text":"{{f}}"}])",
                "step 2 (text): {{f}} names a fork, not a variable");
  // malformed
  for (const std::string t : {"{{ q }}", "{{q", "{{q}", "{{1q}}", "a {{", "{{}}", "{{{q}}"})
    check_refused(R"([{"type":"text","text":")" + t + "\"}]",
                  "step 0 (text): unterminated or malformed {{...}} at byte", {{"q", "v"}});
  BOOST_CHECK_EQUAL(refusal(R"([{"type":"text","text":"ab {{q}} {{"}])", {{"q", "v"}}),
                    "step 0 (text): unterminated or malformed {{...}} at byte 9 (write {{name}} "
                    "with a name [A-Za-z_][A-Za-z0-9_]*, at most 64 bytes, or {{{{ for a literal "
                    "{{)");
  // well formed: inputs, earlier steps, the outer level from inside a branch, escapes, lone braces
  BOOST_CHECK_NO_THROW(parsed(R"([{"type":"gen","name":"a"},
    {"type":"fork","n":2,"steps":[{"type":"text","text":"{{q}} {{a}}"},{"type":"gen","name":"b"},
                                  {"type":"text","text":"{{b}}"}]},
    {"type":"join","mode":"list","name":"bs","var":"b"},
    {"type":"text","text":"{{bs}} {{{{not_a_var}} {x} }} {{{{"},
    {"type":"tool","name":"r","tool":"t","arguments":"{\"q\": \"{{q}}\"}"}])",
                              {{"q", "v"}}));
}

BOOST_AUTO_TEST_CASE(forks_and_joins) {
  // n copies: distinct paths, the same fields
  const Program p = parsed(R"([{"type":"text","text":"x"},
    {"type":"fork","name":"f","n":3,"steps":[{"type":"text","text":"y"},
                                             {"type":"gen","name":"d","max_tokens":10}]},
    {"type":"join","separator":"--"},
    {"type":"gen","name":"last"}])");
  BOOST_REQUIRE_EQUAL(p.steps.size(), 4u);
  const Step& f = p.steps[1];
  BOOST_CHECK(f.kind == Step::Kind::fork);
  BOOST_CHECK_EQUAL(f.name, "f");
  BOOST_REQUIRE_EQUAL(f.branches.size(), 3u);
  for (std::size_t b = 0; b < 3; ++b) {
    BOOST_REQUIRE_EQUAL(f.branches[b].size(), 2u);
    BOOST_CHECK_EQUAL(f.branches[b][0].path, "1." + std::to_string(b) + ".0");
    BOOST_CHECK_EQUAL(f.branches[b][1].path, "1." + std::to_string(b) + ".1");
    BOOST_CHECK_EQUAL(*f.branches[b][1].gen.max_tokens, 10u);
  }
  BOOST_CHECK(p.steps[2].kind == Step::Kind::join);
  BOOST_CHECK_EQUAL(p.steps[2].path, "2");
  BOOST_CHECK(p.steps[2].mode == Step::join_text);
  BOOST_CHECK_EQUAL(p.steps[2].separator, "--");
  BOOST_CHECK_EQUAL(p.steps[3].path, "3");
  BOOST_CHECK_EQUAL(p.n_steps, 4u + 6u);
  BOOST_CHECK_EQUAL(p.max_generated, 3u * 10u + 16u);

  // nested: paths through both levels, gens counted once per copy
  const Program n = parsed(R"([
    {"type":"fork","n":2,"steps":[
      {"type":"fork","branches":[[{"type":"gen","name":"x","max_tokens":5}],
                                 [{"type":"gen","name":"x","max_tokens":7}]]},
      {"type":"join"}]},
    {"type":"join"}])");
  BOOST_CHECK_EQUAL(n.steps[0].branches[1][0].branches[1][0].path, "0.1.0.1.0");
  BOOST_CHECK_EQUAL(n.steps[0].branches[1][1].path, "0.1.1");
  BOOST_CHECK_EQUAL(n.max_generated, 2u * (5u + 7u));
  BOOST_CHECK_EQUAL(n.n_steps, 2u + 2u * (2u + 2u));

  const std::string body = R"("steps":[{"type":"gen","name":"d"}])";
  check_refused(R"([{"type":"fork","n":2,)" + body + "}]",
                "step 0 (fork): is not followed by its join");
  check_refused(R"([{"type":"fork","n":2,)" + body + R"(},{"type":"text","text":"x"}])",
                "step 0 (fork): is not followed by its join");
  check_refused(R"([{"type":"text","text":"x"},{"type":"join"}])",
                "step 1 (join): does not follow a fork");
  check_refused(R"([{"type":"fork","n":2,)" + body + R"(},{"type":"join"},{"type":"join"}])",
                "step 2 (join): does not follow a fork");
  check_refused(R"([{"type":"fork","n":0,)" + body + R"(},{"type":"join"}])",
                "step 0 (fork): field 'n' must be at least 1");
  check_refused(R"([{"type":"fork","n":2,"branches":[[]]},{"type":"join"}])",
                "field 'branches' excludes 'n' and 'steps'");
  check_refused(R"([{"type":"fork","n":2},{"type":"join"}])", "field 'n' needs 'steps'");
  check_refused(R"([{"type":"fork",)" + body + R"(},{"type":"join"}])", "field 'steps' needs 'n'");
  check_refused(R"([{"type":"fork"},{"type":"join"}])", "needs 'branches'");
  check_refused(R"([{"type":"fork","branches":[]},{"type":"join"}])",
                "field 'branches' must not be empty");
  check_refused(R"([{"type":"fork","branches":[[{"type":"text","text":"a"}],[]]},{"type":"join"}])",
                "step 0 (fork): branch 1 has no steps");
  check_refused(R"([{"type":"fork","branches":[{"type":"text","text":"a"}]},{"type":"join"}])",
                "step 0 (fork): branch 0 must be an array of steps, got a map");
  check_refused(R"([{"type":"fork","n":2,"steps":[]},{"type":"join"}])",
                "field 'steps' must not be empty");
  // joins
  check_refused(R"([{"type":"fork","n":2,)" + body + R"(},{"type":"join","mode":"all"}])",
                "step 1 (join): field 'mode' must be 'text' or 'list', got 'all'");
  check_refused(R"([{"type":"fork","n":2,)" + body + R"(},{"type":"join","var":"d"}])",
                "step 1 (join): field 'var' goes with mode 'list'");
  check_refused(R"([{"type":"fork","n":2,)" + body +
                    R"(},{"type":"join","mode":"list","name":"l","var":"d","separator":","}])",
                "field 'separator' goes with mode 'text'");
  check_refused(
      R"([{"type":"fork","n":2,)" + body + R"(},{"type":"join","mode":"list","var":"d"}])",
      "step 1 (join): missing field 'name'");
  check_refused(
      R"([{"type":"fork","n":2,)" + body + R"(},{"type":"join","mode":"list","name":"l"}])",
      "step 1 (join 'l'): missing field 'var'");
  check_refused(R"([{"type":"fork","branches":[[{"type":"gen","name":"d"}],
                                                [{"type":"gen","name":"e"}]]},
                    {"type":"join","mode":"list","name":"l","var":"d"}])",
                "step 1 (join 'l'): var 'd' is not defined in branch 1 of the fork");
  check_refused(
      R"([{"type":"gen","name":"d"},{"type":"fork","n":2,"steps":[{"type":"text","text":"a"}]},
                    {"type":"join","mode":"list","name":"l","var":"d"}])",
      "var 'd' is not defined in branch 0");  // the outer 'd' is not a branch's
  check_refused(R"([{"type":"gen","name":"l"},{"type":"fork","n":2,)" + body +
                    R"(},{"type":"join","mode":"list","name":"l","var":"d"}])",
                "step 2 (join 'l'): name 'l' is already defined in this scope");
}

BOOST_AUTO_TEST_CASE(limits) {
  // steps in the tree, n copies included
  check_refused("[" + texts(257) + "]", "program has 257 steps, limit 256");
  BOOST_CHECK_EQUAL(parsed("[" + texts(256) + "]").n_steps, 256u);
  check_refused(R"([{"type":"fork","n":16,"steps":[)" + texts(16) + R"(]},{"type":"join"}])",
                "program has 258 steps, limit 256");
  Limits small;
  small.max_steps = 5;
  check_refused(R"([{"type":"fork","n":2,"steps":[)" + texts(2) + R"(]},{"type":"join"}])",
                "program has 6 steps, limit 5", {}, small);

  // fork width, by branches and by n
  const std::string one = R"([{"type":"text","text":"a"}])";
  std::string wide;
  for (int i = 0; i < 17; ++i) wide += (i ? "," : "") + one;
  BOOST_CHECK_EQUAL(refusal(R"([{"type":"text","text":"a"},{"type":"text","text":"a"},
                               {"type":"fork","n":20,"steps":)" +
                            one + R"(},{"type":"join"}])"),
                    "step 2 (fork): 20 branches, limit 16");
  check_refused(R"([{"type":"fork","branches":[)" + wide + R"(]},{"type":"join"}])",
                "step 0 (fork): 17 branches, limit 16");

  // nesting: a fork at the top is 1 deep
  const auto nested = [&](int depth) {
    std::string s = one;
    for (int i = 0; i < depth; ++i)
      s = R"([{"type":"fork","n":1,"steps":)" + s + R"(},{"type":"join"}])";
    return s;
  };
  BOOST_CHECK_NO_THROW(parsed(nested(4)));
  BOOST_CHECK_EQUAL(refusal(nested(5)),
                    "step 0.0.0.0.0.0.0.0.0 (fork): forks nested 5 deep, limit 4");
  Limits shallow;
  shallow.max_depth = 1;
  check_refused(nested(2), "step 0.0.0 (fork): forks nested 2 deep, limit 1", {}, shallow);

  // inputs: count, bytes, names
  Inputs many;
  for (int i = 0; i < 65; ++i) {
    std::string name = "i";  // (not "i" + to_string: g++ 12 warns -Wrestrict on that, wrongly)
    name += std::to_string(i);
    many.emplace_back(name, "v");
  }
  check_refused(one, "inputs: 65 inputs, limit 64", many);
  Limits tiny;
  tiny.max_input_bytes = 10;
  check_refused(one, "inputs: 11 bytes (names and values), limit 10", {{"ab", "123456789"}}, tiny);
  BOOST_CHECK_NO_THROW(parse(one, {{"ab", "12345678"}}, {}, tiny));
  check_refused(one, "inputs: name '9a' is not a valid name", {{"9a", "v"}});
  check_refused(one, "inputs: name 'q' is given twice", {{"q", "v"}, {"q", "w"}});
}

BOOST_AUTO_TEST_CASE(chat_mode_is_set_by_a_text_role) {
  BOOST_CHECK(!parsed(R"([{"type":"text","text":"a"},{"type":"tool","name":"r","tool":"t",
                          "role":"ipython"}])")
                   .chat);
  const Program p = parsed(R"([{"type":"fork","n":2,"steps":[
                                {"type":"text","text":"hi","role":"user"}]},{"type":"join"}])");
  BOOST_CHECK(p.chat);
  BOOST_CHECK_EQUAL(p.steps[0].branches[1][0].role, "user");
}

BOOST_AUTO_TEST_SUITE_END()
