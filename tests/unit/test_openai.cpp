// The OpenAI HTTP API's plain code (ingress/openai.hpp): every request field into wire submits,
// the errors that name the field, the codec's range checks, and the response objects, stream
// chunks and SSE bytes, read back with nlohmann::json.
#include <boost/test/unit_test.hpp>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ingress/openai.hpp"

BOOST_AUTO_TEST_SUITE(test_openai)

using namespace sy;
using namespace sy::openai;
using nlohmann::json;

namespace {

constexpr Endpoint kCompl = Endpoint::completions;
constexpr Endpoint kChat = Endpoint::chat_completions;

ParseContext context() {
  ParseContext c;
  c.models = {"stories", "alias"};
  c.classes = {"interactive", "standard", "batch"};
  c.chat_default_max_tokens = 1000;
  return c;
}

Request parsed(Endpoint e, const std::string& body, const ParseContext& c = context()) {
  auto r = parse_request(e, body, c);
  if (const auto* err = std::get_if<ApiError>(&r))
    BOOST_FAIL(err->message + " [" + err->param + "]");
  return std::get<Request>(std::move(r));
}

ApiError refused(Endpoint e, const std::string& body, const ParseContext& c = context()) {
  auto r = parse_request(e, body, c);
  if (std::holds_alternative<Request>(r)) BOOST_FAIL("accepted: " + body);
  return std::get<ApiError>(r);
}

const std::string& text_of(const wire::Submit& s) {
  return std::get<std::string>(s.prompt);
}

// A vocabulary for logprobs: id 3 is a two-byte character, id 4 half of a three-byte one.
std::string token_text(int32_t id) {
  switch (id) {
    case 1:
      return "Hello";
    case 2:
      return " world";
    case 3:
      return "\xC3\xA9";  // é
    case 4:
      return "\xE2";
    default:
      return "<" + std::to_string(id) + ">";
  }
}

// Concatenation without `"literal" + std::string`, which GCC 12 misreads under -Wrestrict.
template <class... T>
std::string cat(const T&... parts) {
  std::string s;
  (s.append(parts), ...);
  return s;
}

wire::TokenLogprobs lp(float logprob, std::vector<wire::TopLogprob> top) {
  return wire::TokenLogprobs{logprob, std::move(top)};
}

}  // namespace

// ---- requests -----------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(completions_fields_map_to_the_submit) {
  const Request r = parsed(kCompl, R"({
    "model": "alias", "prompt": "Once upon", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
    "n": 2, "best_of": 2, "stop": ["\n", "END"], "seed": 42, "stream": true,
    "stream_options": {"include_usage": true}, "presence_penalty": 0.5,
    "frequency_penalty": -0.5, "logit_bias": {"50": 10, "7": -100}, "top_k": 40, "min_p": 0.05,
    "repetition_penalty": 1.1, "ignore_eos": true, "priority": "batch", "user": "ann",
    "echo": true, "logprobs": 3, "suffix": ""})");
  BOOST_TEST((r.endpoint == kCompl));
  BOOST_TEST(r.model == "stories");  // the served name, not the alias
  BOOST_TEST(r.n == 2u);
  BOOST_TEST(r.stream);
  BOOST_TEST(r.include_usage);
  BOOST_TEST(r.echo);
  BOOST_TEST(r.completion_logprobs == 3);
  BOOST_TEST(r.user == "ann");
  BOOST_TEST(r.priority == "batch");
  BOOST_TEST(r.ignored.empty());
  BOOST_TEST_REQUIRE(r.jobs.size() == 1u);
  const wire::Submit& s = r.jobs[0];
  BOOST_TEST(s.id == "");
  BOOST_TEST(s.tenant == "");
  BOOST_TEST(text_of(s) == "Once upon");
  BOOST_TEST(s.max_tokens == 7u);
  BOOST_TEST(s.temperature == 0.5);
  BOOST_TEST(s.top_p == 0.9);
  BOOST_TEST(s.n == 2u);
  BOOST_TEST((s.stop == std::vector<std::string>{"\n", "END"}));
  BOOST_TEST(s.seed.value() == 42u);
  BOOST_TEST(s.stream);
  BOOST_TEST(s.controls.presence_penalty == 0.5f);
  BOOST_TEST(s.controls.frequency_penalty == -0.5f);
  BOOST_TEST(
      (s.controls.logit_bias == std::vector<std::pair<int32_t, float>>{{7, -100.f}, {50, 10.f}}));
  BOOST_TEST(s.top_k == 40u);
  BOOST_TEST(s.controls.min_p == 0.05f);
  BOOST_TEST(s.controls.repetition_penalty == 1.1f);
  BOOST_TEST(s.ignore_eos);
  BOOST_TEST(s.priority == "batch");
  BOOST_TEST(s.logprobs == 3u);
  BOOST_TEST(s.constraint.empty());
  BOOST_TEST(!s.has_messages());
}

BOOST_AUTO_TEST_CASE(completions_defaults) {
  const Request r = parsed(kCompl, R"({"prompt": "Hi"})");
  BOOST_TEST(r.model == "stories");
  BOOST_TEST(r.n == 1u);
  BOOST_TEST(!r.stream);
  BOOST_TEST(r.completion_logprobs == -1);
  const wire::Submit& s = r.jobs.at(0);
  BOOST_TEST(s.max_tokens == 16u);  // OpenAI's default
  BOOST_TEST(s.temperature == 1.0);
  BOOST_TEST(s.logprobs == 0u);
  BOOST_TEST(!s.seed.has_value());
  BOOST_TEST(s.priority == "");
  // logprobs 0 asks the job for one, so the chosen token's logprob comes back.
  BOOST_TEST(parsed(kCompl, R"({"prompt": "Hi", "logprobs": 0})").jobs[0].logprobs == 1u);
  // top_k -1 and 0 are both "off".
  BOOST_TEST(parsed(kCompl, R"({"prompt": "Hi", "top_k": -1})").jobs[0].top_k == 0u);
}

BOOST_AUTO_TEST_CASE(prompt_forms_make_one_job_each) {
  const Request two = parsed(kCompl, R"({"prompt": ["a", "b"], "max_tokens": 3})");
  BOOST_TEST_REQUIRE(two.jobs.size() == 2u);
  BOOST_TEST(text_of(two.jobs[0]) == "a");
  BOOST_TEST(text_of(two.jobs[1]) == "b");
  BOOST_TEST(two.jobs[1].max_tokens == 3u);  // every field but the prompt is shared

  const Request ids = parsed(kCompl, R"({"prompt": [1, 2, 3]})");
  BOOST_TEST_REQUIRE(ids.jobs.size() == 1u);
  BOOST_TEST((std::get<std::vector<int32_t>>(ids.jobs[0].prompt) == std::vector<int32_t>{1, 2, 3}));

  const Request lists = parsed(kCompl, R"({"prompt": [[5], [6, 7]]})");
  BOOST_TEST_REQUIRE(lists.jobs.size() == 2u);
  BOOST_TEST((std::get<std::vector<int32_t>>(lists.jobs[1].prompt) == std::vector<int32_t>{6, 7}));

  BOOST_TEST(refused(kCompl, R"({"prompt": []})").param == "prompt");
  BOOST_TEST(refused(kCompl, R"({"max_tokens": 3})").message == "missing field 'prompt'");
  const ApiError neg = refused(kCompl, R"({"prompt": [1, -2]})");
  BOOST_TEST(neg.param == "prompt[1]");
  BOOST_TEST(neg.message == "prompt[1] -2 out of range [0, 2147483647]");
  BOOST_TEST(refused(kCompl, R"({"prompt": ["a", 7]})").param == "prompt[1]");
  BOOST_TEST(refused(kCompl, R"({"prompt": [[1], []]})").param == "prompt[1]");  // the codec's

  json many = {{"prompt", json::array()}};
  for (std::size_t i = 0; i <= kMaxPrompts; ++i) many["prompt"].push_back("p");
  const ApiError e = refused(kCompl, many.dump());
  BOOST_TEST(e.param == "prompt");
  BOOST_TEST(e.message.find("limit 64") != std::string::npos);
  many["prompt"].erase(0);
  BOOST_TEST(parsed(kCompl, many.dump()).jobs.size() == kMaxPrompts);
}

BOOST_AUTO_TEST_CASE(chat_fields_map_to_the_submit) {
  const Request r = parsed(kChat, R"({
    "messages": [
      {"role": "system", "content": "Be brief.", "name": "rules"},
      {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null, "tool_calls": []},
      {"role": "user", "content": ""}],
    "max_tokens": 9, "max_completion_tokens": 5, "logprobs": true, "top_logprobs": 2})");
  BOOST_TEST((r.endpoint == kChat));
  BOOST_TEST(r.chat_logprobs);
  BOOST_TEST(r.top_logprobs == 2u);
  BOOST_TEST_REQUIRE(r.jobs.size() == 1u);
  const wire::Submit& s = r.jobs[0];
  BOOST_TEST(s.has_messages());
  BOOST_TEST(text_of(s) == "");
  const std::vector<wire::ChatMessage> want = {
      {"system", "Be brief."}, {"user", "Hi\nthere"}, {"assistant", ""}, {"user", ""}};
  BOOST_TEST((s.messages == want));
  BOOST_TEST(s.max_tokens == 5u);  // max_completion_tokens wins
  BOOST_TEST(s.logprobs == 2u);

  // logprobs without top_logprobs: the job still asks for one (the chosen token's).
  BOOST_TEST(parsed(kChat, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true})")
                 .jobs[0]
                 .logprobs == 1u);
  // No max_tokens: the context's chat default, capped by the edge limit.
  BOOST_TEST(
      parsed(kChat, R"({"messages": [{"role": "user", "content": "x"}]})").jobs[0].max_tokens ==
      1000u);
  ParseContext small = context();
  small.limits.max_new_tokens = 100;
  BOOST_TEST(parsed(kChat, R"({"messages": [{"role": "user", "content": "x"}]})", small)
                 .jobs[0]
                 .max_tokens == 100u);
}

BOOST_AUTO_TEST_CASE(chat_message_errors_name_the_path) {
  const auto param = [](const std::string& messages) {
    return refused(kChat, R"({"messages": )" + messages + "}").param;
  };
  BOOST_TEST(param(R"([])") == "messages");
  BOOST_TEST(param(R"("hi")") == "messages");
  BOOST_TEST(param(R"([{"role": "user", "content": "a"}, 3])") == "messages[1]");
  BOOST_TEST(param(R"([{"content": "a"}])") == "messages[0].role");
  BOOST_TEST(param(R"([{"role": 1, "content": "a"}])") == "messages[0].role");
  BOOST_TEST(param(R"([{"role": "user", "content": null}])") == "messages[0].content");
  BOOST_TEST(param(R"([{"role": "user", "content": 5}])") == "messages[0].content");
  BOOST_TEST(param(R"([{"role": "user", "content": [{"text": "a"}]}])") ==
             "messages[0].content[0].type");
  const ApiError img = refused(kChat, R"({"messages": [{"role": "user", "content": [
      {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}]}]})");
  BOOST_TEST(img.param == "messages[0].content[1].type");
  BOOST_TEST(img.message.find("'image_url'") != std::string::npos);
  // The codec's checks come back with OpenAI's path: an empty role, an oversized message.
  BOOST_TEST(param(R"([{"role": "", "content": "a"}])") == "messages[0].role");
  ParseContext small = context();
  small.limits.max_prompt_bytes = 4;
  const ApiError big = refused(
      kChat,
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "hello"}]})",
      small);
  BOOST_TEST(big.param == "messages[1].content");
  BOOST_TEST(big.message == "field 'messages.1.content' has 5 bytes, limit 4");
}

BOOST_AUTO_TEST_CASE(type_errors_name_their_field) {
  struct Case {
    Endpoint e;
    const char* fields;
    const char* param;
  };
  const Case cases[] = {
      {kCompl, R"("model": 5)", "model"},
      {kCompl, R"("temperature": "hot")", "temperature"},
      {kCompl, R"("top_p": true)", "top_p"},
      {kCompl, R"("max_tokens": 1.5)", "max_tokens"},
      {kCompl, R"("max_completion_tokens": "9")", "max_completion_tokens"},
      {kCompl, R"("n": [1])", "n"},
      {kCompl, R"("stop": 3)", "stop"},
      {kCompl, R"("stop": ["a", 3])", "stop"},
      {kCompl, R"("seed": -1)", "seed"},
      {kCompl, R"("seed": 1.5)", "seed"},
      {kCompl, R"("stream": 1)", "stream"},
      {kCompl, R"("stream": true, "stream_options": 1)", "stream_options"},
      {kCompl, R"("stream": true, "stream_options": {"include_usage": "yes"})",
       "stream_options.include_usage"},
      {kCompl, R"("presence_penalty": "x")", "presence_penalty"},
      {kCompl, R"("frequency_penalty": {})", "frequency_penalty"},
      {kCompl, R"("logit_bias": [1])", "logit_bias"},
      {kCompl, R"("logit_bias": {"abc": 1})", "logit_bias"},
      {kCompl, R"("logit_bias": {"5": "x"})", "logit_bias"},
      {kCompl, R"("logit_bias": {"99999999999": 1})", "logit_bias"},
      {kCompl, R"("response_format": "json")", "response_format"},
      {kCompl, R"("response_format": {"type": 1})", "response_format.type"},
      {kCompl, R"("response_format": {"type": "xml"})", "response_format.type"},
      {kCompl, R"("response_format": {"type": "json_schema"})", "response_format.json_schema"},
      {kCompl, R"("response_format": {"type": "json_schema", "json_schema": {"name": "x"}})",
       "response_format.json_schema.schema"},
      {kCompl, R"("user": 1)", "user"},
      {kCompl, R"("top_k": -2)", "top_k"},
      {kCompl, R"("top_k": "4")", "top_k"},
      {kCompl, R"("min_p": "x")", "min_p"},
      {kCompl, R"("repetition_penalty": false)", "repetition_penalty"},
      {kCompl, R"("ignore_eos": "no")", "ignore_eos"},
      {kCompl, R"("priority": 1.5)", "priority"},
      {kCompl, R"("priority": 3)", "priority"},
      {kCompl, R"("priority": -1)", "priority"},
      {kCompl, R"("structured_outputs": "json")", "structured_outputs"},
      {kCompl, R"("structured_outputs": {"json": 5})", "structured_outputs.json"},
      {kCompl, R"("structured_outputs": {"regex": 5})", "structured_outputs.regex"},
      {kCompl, R"("structured_outputs": {"choice": "a"})", "structured_outputs.choice"},
      {kCompl, R"("structured_outputs": {"choice": ["a", 1]})", "structured_outputs.choice"},
      {kCompl, R"("structured_outputs": {"grammar": []})", "structured_outputs.grammar"},
      {kCompl, R"("guided_json": 5)", "guided_json"},
      {kCompl, R"("guided_choice": "a")", "guided_choice"},
      {kCompl, R"("echo": "yes")", "echo"},
      {kCompl, R"("logprobs": true)", "logprobs"},
      {kCompl, R"("suffix": 1)", "suffix"},
      {kCompl, R"("suffix": "end")", "suffix"},
      {kCompl, R"("best_of": 3)", "best_of"},
      {kCompl, R"("prompt": {"text": "x"})", "prompt"},
      {kChat, R"("logprobs": 1)", "logprobs"},
      {kChat, R"("logprobs": true, "top_logprobs": "2")", "top_logprobs"},
      {kChat, R"("top_logprobs": 2)", "top_logprobs"},
      {kChat, R"("logprobs": false, "top_logprobs": 2)", "top_logprobs"},
      {kChat, R"("stream_options": {"include_usage": true})", "stream_options"},
      {kChat, R"("stream": false, "stream_options": {"include_usage": true})", "stream_options"},
  };
  for (const Case& c : cases) {
    // A later "prompt"/"messages" key replaces the default one.
    json body = json::parse(cat("{", c.fields, "}"));
    if (!body.contains("prompt") && c.e == kCompl) body["prompt"] = "Hi";
    if (c.e == kChat) body["messages"] = json::array({{{"role", "user"}, {"content", "Hi"}}});
    const ApiError e = refused(c.e, body.dump());
    BOOST_TEST(e.status == 400);
    BOOST_TEST(e.type == "invalid_request_error");
    BOOST_TEST(e.param == c.param, c.fields << ": param " << e.param << " (" << e.message << ")");
    BOOST_TEST(e.message.find(c.param) != std::string::npos, c.fields << ": " << e.message);
  }
  BOOST_TEST(refused(kCompl, R"({"prompt": "x", "temperature": "hot"})").message ==
             "'temperature' must be a number, got string");
  BOOST_TEST(
      refused(kCompl, R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": 1}})")
          .message == "'stream_options.include_usage' must be a boolean, got number");
}

BOOST_AUTO_TEST_CASE(unknown_fields_are_ignored_in_request_order) {
  const Request r = parsed(kChat, R"({"tools": [], "messages": [{"role": "user", "content": "x"}],
      "metadata": {"a": 1}, "prompt": "not chat's", "store": null, "echo": true,
      "structured_outputs": {"regex": "a+", "disable_any_whitespace": true}})");
  BOOST_TEST((r.ignored == std::vector<std::string>{"tools", "metadata", "prompt", "store", "echo",
                                                    "structured_outputs.disable_any_whitespace"}));
  BOOST_TEST(!r.echo);
  const Request c = parsed(kCompl, R"({"prompt": "x", "messages": 1, "top_logprobs": 2})");
  BOOST_TEST((c.ignored == std::vector<std::string>{"messages", "top_logprobs"}));
}

BOOST_AUTO_TEST_CASE(null_means_absent) {
  const Request r = parsed(kCompl, R"({"prompt": "x", "model": null, "max_tokens": null,
      "temperature": null, "top_p": null, "n": null, "stop": null, "seed": null, "stream": null,
      "stream_options": null, "logit_bias": null, "logprobs": null, "response_format": null,
      "user": null, "top_k": null, "priority": null, "suffix": null, "best_of": null,
      "echo": null, "structured_outputs": null, "guided_json": null})");
  BOOST_TEST(r.ignored.empty());
  BOOST_TEST(r.model == "stories");
  BOOST_TEST(
      (r.jobs.at(0).max_tokens == 16u && r.jobs[0].temperature == 1.0 && r.jobs[0].stop.empty()));
  BOOST_TEST(r.completion_logprobs == -1);
  const Request c = parsed(kChat, R"({"messages": [{"role": "user", "content": "x"}],
      "logprobs": null, "top_logprobs": null})");
  BOOST_TEST(!c.chat_logprobs);
}

BOOST_AUTO_TEST_CASE(model_names) {
  BOOST_TEST(parsed(kCompl, R"({"prompt": "x", "model": "stories"})").model == "stories");
  const ApiError e = refused(kCompl, R"({"prompt": "x", "model": "gpt-4"})");
  BOOST_TEST(e.status == 404);
  BOOST_TEST(e.type == "invalid_request_error");
  BOOST_TEST(e.code == "model_not_found");
  BOOST_TEST(e.param == "model");
  BOOST_TEST(e.message.find("'gpt-4'") != std::string::npos);
  // A server that names no model answers to any, under the name asked for.
  ParseContext open = context();
  open.models.clear();
  BOOST_TEST(parsed(kCompl, R"({"prompt": "x", "model": "m"})", open).model == "m");
}

BOOST_AUTO_TEST_CASE(priority_as_name_or_index) {
  BOOST_TEST(parsed(kCompl, R"({"prompt": "x", "priority": 0})").jobs[0].priority == "interactive");
  const Request r = parsed(kCompl, R"({"prompt": "x", "priority": 2})");
  BOOST_TEST(r.priority == "batch");
  BOOST_TEST(r.jobs[0].priority == "batch");
  BOOST_TEST(parsed(kCompl, R"({"prompt": "x", "priority": "standard"})").jobs[0].priority ==
             "standard");
  BOOST_TEST(refused(kCompl, R"({"prompt": "x", "priority": 3})").message ==
             "priority 3 is not the index of a priority class (this server has 3)");
  // A class name longer than the edge allows: the codec's check, named priority.
  BOOST_TEST(
      refused(kCompl, R"({"prompt": "x", "priority": ")" + std::string(65, 'p') + R"("})").param ==
      "priority");
}

BOOST_AUTO_TEST_CASE(constraints) {
  const auto constraint = [](const std::string& fields) {
    return parsed(kCompl, R"({"prompt": "x", )" + fields + "}").jobs.at(0).constraint;
  };
  BOOST_TEST(constraint(R"("response_format": {"type": "text"})").empty());
  Constraint c = constraint(R"("response_format": {"type": "json_object"})");
  BOOST_TEST(c.kind == Constraint::json_schema);
  BOOST_TEST(c.source == R"({"type":"object"})");
  c = constraint(R"("response_format": {"type": "json_schema", "json_schema": {"name": "p",
      "strict": true, "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}})");
  BOOST_TEST(c.kind == Constraint::json_schema);
  BOOST_TEST(c.source == R"({"type":"object","properties":{"a":{"type":"integer"}}})");
  c = constraint(R"("structured_outputs": {"json": {"type": "string"}})");
  BOOST_TEST((c.kind == Constraint::json_schema && c.source == R"({"type":"string"})"));
  c = constraint(R"("structured_outputs": {"json": "{\"type\": \"number\"}"})");
  BOOST_TEST((c.kind == Constraint::json_schema && c.source == R"({"type": "number"})"));
  c = constraint(R"("structured_outputs": {"regex": "[0-9]+"})");
  BOOST_TEST((c.kind == Constraint::regex && c.source == "[0-9]+"));
  c = constraint(R"("structured_outputs": {"choice": ["yes", "no"]})");
  BOOST_TEST(c.kind == Constraint::choices);
  BOOST_TEST((c.options == std::vector<std::string>{"yes", "no"}));
  c = constraint(R"("structured_outputs": {"grammar": "root ::= \"a\""})");
  BOOST_TEST((c.kind == Constraint::grammar && c.source == R"(root ::= "a")"));
  c = constraint(R"("structured_outputs": {"json_object": true})");
  BOOST_TEST((c.kind == Constraint::json_schema && c.source == R"({"type":"object"})"));
  c = constraint(R"("guided_json": {"type": "boolean"})");
  BOOST_TEST((c.kind == Constraint::json_schema && c.source == R"({"type":"boolean"})"));
  c = constraint(R"("guided_regex": "a|b")");
  BOOST_TEST((c.kind == Constraint::regex && c.source == "a|b"));
  c = constraint(R"("guided_choice": ["x"])");
  BOOST_TEST((c.kind == Constraint::choices && c.options.size() == 1u));
  c = constraint(R"("guided_grammar": "root ::= \"b\"")");
  BOOST_TEST(c.kind == Constraint::grammar);

  // One constraint per request.
  const ApiError two =
      refused(kCompl, R"({"prompt": "x", "response_format": {"type": "json_object"},
      "structured_outputs": {"regex": "a"}})");
  BOOST_TEST(two.param == "structured_outputs.regex");
  BOOST_TEST(two.message ==
             "'response_format' and 'structured_outputs.regex' exclude each other: a request "
             "takes one constraint");
  BOOST_TEST(
      refused(kCompl, R"({"prompt": "x", "structured_outputs": {"regex": "a", "choice": ["b"]}})")
          .param == "structured_outputs.choice");
  BOOST_TEST(refused(kCompl, R"({"prompt": "x", "guided_regex": "a", "guided_json": {}})").param ==
             "guided_regex");
  // The codec's checks name the field that carried the constraint.
  BOOST_TEST(refused(kCompl, R"({"prompt": "x", "structured_outputs": {"choice": []}})").param ==
             "structured_outputs.choice");
  BOOST_TEST(refused(kCompl, R"({"prompt": "x", "guided_regex": ""})").param == "guided_regex");
  ParseContext small = context();
  small.limits.max_constraint_bytes = 10;
  const ApiError big = refused(kCompl, R"({"prompt": "x", "response_format": {"type": "json_schema",
      "json_schema": {"schema": {"type": "object", "title": "long enough"}}}})",
                               small);
  BOOST_TEST(big.param == "response_format");
  BOOST_TEST(big.message.find("json_schema") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(codec_range_checks_surface_with_the_field) {
  struct Case {
    Endpoint e;
    const char* fields;
    const char* param;
    const char* message;
  };
  const Case cases[] = {
      {kCompl, R"("n": 17)", "n", "n 17 out of range [1, 16]"},
      {kCompl, R"("n": 0)", "n", "n 0 out of range [1, 16]"},
      {kCompl, R"("best_of": 17, "n": 17)", "n", "n 17 out of range [1, 16]"},
      {kCompl, R"("max_tokens": 5000)", "max_tokens", "max_tokens 5000 out of range [1, 4096]"},
      {kCompl, R"("max_tokens": 0)", "max_tokens", "max_tokens 0 out of range [1, 4096]"},
      {kChat, R"("max_completion_tokens": 99999999999)", "max_completion_tokens",
       "max_completion_tokens 99999999999 out of range [1, 4096]"},
      {kCompl, R"("logprobs": 21)", "logprobs", "logprobs 21 out of range [0, 20]"},
      {kChat, R"("logprobs": true, "top_logprobs": 21)", "top_logprobs",
       "top_logprobs 21 out of range [0, 20]"},
      {kCompl, R"("temperature": 150)", "temperature", "temperature 150 out of range [0, 100]"},
      {kCompl, R"("top_p": 0)", "top_p", "top_p 0 out of range (0, 1]"},
      {kCompl, R"("presence_penalty": 3)", "presence_penalty",
       "presence_penalty 3 out of range [-2, 2]"},
      {kCompl, R"("repetition_penalty": 0)", "repetition_penalty",
       "repetition_penalty 0 out of range (0, 10]"},
      {kCompl, R"("min_p": 1e300)", "min_p", nullptr},
      {kCompl, R"("logit_bias": {"5": 150})", "logit_bias",
       "logit_bias.5 150 out of range [-100, 100]"},
      {kCompl, R"("logit_bias": {"5": 1, "05": 2})", "logit_bias",
       "logit_bias names token id 5 twice"},
      {kCompl, R"("stop": "")", "stop", "stop string at index 0 must not be empty"},
      {kCompl, R"("top_k": 3000000000)", "top_k", "top_k 3000000000 out of range [-1, 2147483647]"},
      {kCompl, R"("prompt": "")", "prompt", "field 'prompt' must not be empty"},
  };
  for (const Case& c : cases) {
    json body = json::parse(cat("{", c.fields, "}"));
    if (!body.contains("prompt") && c.e == kCompl) body["prompt"] = "Hi";
    if (c.e == kChat) body["messages"] = json::array({{{"role", "user"}, {"content", "Hi"}}});
    const ApiError e = refused(c.e, body.dump());
    BOOST_TEST(e.status == 400);
    BOOST_TEST(e.param == c.param, c.fields << ": param " << e.param << " (" << e.message << ")");
    if (c.message) BOOST_TEST(e.message == c.message, c.fields);
  }
  json stops = {{"prompt", "x"}, {"stop", json::array()}};
  for (int i = 0; i < 17; ++i) stops["stop"].push_back(cat("s", std::to_string(i)));
  BOOST_TEST(refused(kCompl, stops.dump()).message == "stop has 17 strings, limit 16");

  // The server's own caps: logprobs, prompt tokens and bytes.
  ParseContext small = context();
  small.limits.max_logprobs = 5;
  BOOST_TEST(refused(kCompl, R"({"prompt": "x", "logprobs": 6})", small).message ==
             "logprobs 6 out of range [0, 5]");
  const ApiError top = refused(
      kChat,
      R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 6})",
      small);
  small.limits.max_prompt_tokens = 2;
  small.limits.max_prompt_bytes = 3;
  BOOST_TEST(top.param == "top_logprobs");
  BOOST_TEST(top.message == "logprobs 6 out of range [0, 5]");  // the codec's words
  BOOST_TEST(refused(kCompl, R"({"prompt": [1, 2, 3]})", small).message ==
             "prompt has 3 tokens, limit 2");
  const ApiError bytes = refused(kCompl, R"({"prompt": ["ab", "abcd"]})", small);
  BOOST_TEST(bytes.param == "prompt[1]");
  BOOST_TEST(bytes.message == "prompt text has 4 bytes, limit 3");
}

BOOST_AUTO_TEST_CASE(malformed_bodies) {
  const ApiError bad = refused(kCompl, R"({"prompt": "x",})");
  BOOST_TEST(bad.status == 400);
  BOOST_TEST(bad.param == "");
  BOOST_TEST(bad.message.find("not valid JSON") != std::string::npos);
  BOOST_TEST(bad.message.find("column 16") != std::string::npos, bad.message);
  BOOST_TEST(bad.message.find("(byte 16)") != std::string::npos, bad.message);
  BOOST_TEST(refused(kCompl, "").message.find("not valid JSON") != std::string::npos);
  BOOST_TEST(refused(kCompl, R"(["prompt"])").message ==
             "request body must be a JSON object, got array");
  BOOST_TEST(refused(kCompl, "\"\xff\"").message.find("not valid JSON") != std::string::npos);
  BOOST_TEST(refused(kCompl, R"({"prompt": "x", "n": 1e400})").message ==
             "request body is not valid JSON: number overflow parsing '1e400'");
  // Deep nesting is refused before anything recurses over it.
  const std::string deep =
      R"({"prompt": "x", "guided_json": )" + std::string(200, '[') + std::string(200, ']') + "}";
  BOOST_TEST(refused(kCompl, deep).message == "request body nests deeper than 128 levels");
}

// ---- responses ----------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(completions_response_n1_with_echo_and_logprobs) {
  const Request req = parsed(kCompl, R"({"prompt": "Say", "echo": true, "logprobs": 1})");
  JobResult r;
  r.prompt_text = "Say";
  r.done.text = "Hello world";
  r.done.ids = {1, 2};
  r.done.finish_reason = wire::FinishReason::length;
  r.done.logprobs = {lp(-0.5f, {{1, -0.5f}, {2, -1.0f}}), lp(-0.25f, {{3, -0.125f}, {2, -0.25f}})};
  r.done.usage = {3, 2, 1};
  const json j = json::parse(response_body(req, "cmpl-1", 1700000000, {r}, token_text));
  BOOST_TEST(j["id"] == "cmpl-1");
  BOOST_TEST(j["object"] == "text_completion");
  BOOST_TEST(j["created"] == 1700000000);
  BOOST_TEST(j["model"] == "stories");
  BOOST_TEST_REQUIRE(j["choices"].size() == 1u);
  const json& c = j["choices"][0];
  BOOST_TEST(c["index"] == 0);
  BOOST_TEST(c["text"] == "SayHello world");
  BOOST_TEST(c["finish_reason"] == "length");
  const json& l = c["logprobs"];
  BOOST_TEST(l["tokens"] == json({"Hello", " world"}));
  BOOST_TEST(l["token_logprobs"] == json({-0.5, -0.25}));
  // logprobs 1: the top entry, plus the chosen token when it is not the top one.
  BOOST_TEST(l["top_logprobs"][0] == json({{"Hello", -0.5}}));
  BOOST_TEST(l["top_logprobs"][1] == json({{"\xC3\xA9", -0.125}, {" world", -0.25}}));
  BOOST_TEST(l["text_offset"] == json({3, 8}));  // after the echoed prompt
  BOOST_TEST(j["usage"] == json({{"prompt_tokens", 3},
                                 {"completion_tokens", 2},
                                 {"total_tokens", 5},
                                 {"prompt_tokens_details", {{"cached_tokens", 1}}}}));

  // logprobs 0: the chosen token's alone; no logprobs: null.
  const Request zero = parsed(kCompl, R"({"prompt": "Say", "logprobs": 0})");
  const json z = json::parse(response_body(zero, "c", 1, {r}, token_text));
  BOOST_TEST(z["choices"][0]["text"] == "Hello world");  // no echo
  BOOST_TEST(z["choices"][0]["logprobs"]["top_logprobs"] ==
             json({{{"Hello", -0.5}}, {{" world", -0.25}}}));
  BOOST_TEST(z["choices"][0]["logprobs"]["text_offset"] == json({0, 5}));
  const json none =
      json::parse(response_body(parsed(kCompl, R"({"prompt": "Say"})"), "c", 1, {r}, nullptr));
  BOOST_TEST(none["choices"][0]["logprobs"].is_null());
}

BOOST_AUTO_TEST_CASE(completions_response_two_prompts_two_samples) {
  const Request req = parsed(kCompl, R"({"prompt": ["a", "b"], "n": 2})");
  std::vector<JobResult> results(2);
  for (uint32_t job = 0; job < 2; ++job) {
    wire::Done& d = results[job].done;
    d.usage = {4, 6, 0};
    for (uint32_t s = 0; s < 2; ++s) {
      wire::Choice c;
      c.index = s;
      c.text = cat("j", std::to_string(job), "s", std::to_string(s));
      c.finish_reason = s == 0 ? wire::FinishReason::stop : wire::FinishReason::cancelled;
      d.choices.push_back(c);
    }
  }
  const json j = json::parse(response_body(req, "cmpl-2", 5, results, nullptr));
  BOOST_TEST_REQUIRE(j["choices"].size() == 4u);
  for (int i = 0; i < 4; ++i) {
    BOOST_TEST(j["choices"][i]["index"] == i);
    BOOST_TEST(j["choices"][i]["text"] ==
               cat("j", std::to_string(i / 2), "s", std::to_string(i % 2)));
    BOOST_TEST(j["choices"][i]["finish_reason"] == (i % 2 ? "abort" : "stop"));
    BOOST_TEST(j["choices"][i]["logprobs"].is_null());
  }
  // The prompt counted once per job, not per sample.
  BOOST_TEST(j["usage"]["prompt_tokens"] == 8);
  BOOST_TEST(j["usage"]["completion_tokens"] == 12);
  BOOST_TEST(j["usage"]["total_tokens"] == 20);
}

BOOST_AUTO_TEST_CASE(chat_response_n1_and_n2) {
  const Request one = parsed(kChat, R"({"messages": [{"role": "user", "content": "x"}]})");
  JobResult r;
  r.done.text = "Hi!";
  r.done.usage = {10, 3, 4};
  const json j = json::parse(response_body(one, "chatcmpl-1", 7, {r}, nullptr));
  BOOST_TEST(j["object"] == "chat.completion");
  BOOST_TEST(j["model"] == "stories");
  BOOST_TEST_REQUIRE(j["choices"].size() == 1u);
  BOOST_TEST(j["choices"][0] == json({{"index", 0},
                                      {"message", {{"role", "assistant"}, {"content", "Hi!"}}},
                                      {"logprobs", nullptr},
                                      {"finish_reason", "stop"}}));
  BOOST_TEST(j["usage"]["prompt_tokens_details"]["cached_tokens"] == 4);

  const Request two = parsed(kChat, R"({"messages": [{"role": "user", "content": "x"}], "n": 2})");
  JobResult r2;
  r2.done.choices = {wire::Choice{0, wire::FinishReason::stop, "a", {}, {}},
                     wire::Choice{1, wire::FinishReason::length, "b", {}, {}}};
  const json k = json::parse(response_body(two, "chatcmpl-2", 7, {r2}, nullptr));
  BOOST_TEST_REQUIRE(k["choices"].size() == 2u);
  BOOST_TEST(k["choices"][1]["index"] == 1);
  BOOST_TEST(k["choices"][1]["message"]["content"] == "b");
  BOOST_TEST(k["choices"][1]["finish_reason"] == "length");
}

BOOST_AUTO_TEST_CASE(chat_logprobs_shape) {
  const Request req = parsed(
      kChat,
      R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 1})");
  JobResult r;
  r.done.text = "\xC3\xA9!";
  r.done.ids = {3, 4};
  r.done.logprobs = {lp(-0.1f, {{3, -0.1f}, {1, -3.f}}),
                     lp(-std::numeric_limits<float>::infinity(), {{1, -1.f}})};
  const json j = json::parse(response_body(req, "c", 1, {r}, token_text));
  const json& content = j["choices"][0]["logprobs"]["content"];
  BOOST_TEST_REQUIRE(content.size() == 2u);
  BOOST_TEST(content[0] ==
             json({{"token", "\xC3\xA9"},
                   {"logprob", -0.1},  // the float's shortest decimal
                   {"bytes", {195, 169}},
                   {"top_logprobs",
                    {{{"token", "\xC3\xA9"}, {"logprob", -0.1}, {"bytes", {195, 169}}}}}}));
  // Half a character: the token is written with U+FFFD, its bytes as they are; -inf as -9999.
  BOOST_TEST(content[1]["token"] == "\xEF\xBF\xBD");
  BOOST_TEST(content[1]["bytes"] == json({226}));
  BOOST_TEST(content[1]["logprob"] == -9999.0);
  BOOST_TEST(content[1]["top_logprobs"].size() == 1u);

  // logprobs true, top_logprobs absent: entries with an empty top list.
  const Request bare =
      parsed(kChat, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true})");
  const json b = json::parse(response_body(bare, "c", 1, {r}, token_text));
  BOOST_TEST(b["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == json::array());
}

BOOST_AUTO_TEST_CASE(chat_chunks) {
  const Request req = parsed(kChat, R"({"messages": [{"role": "user", "content": "x"}], "n": 2,
      "stream": true, "stream_options": {"include_usage": true}})");
  wire::Tokens t;
  t.ids = {1};
  t.text = "Hello";
  t.choice = 1;
  const json first = json::parse(chunk_json(req, "chatcmpl-9", 11, 1, t, true, token_text));
  BOOST_TEST(first == json({{"id", "chatcmpl-9"},
                            {"object", "chat.completion.chunk"},
                            {"created", 11},
                            {"model", "stories"},
                            {"choices",
                             {{{"index", 3},
                               {"delta", {{"role", "assistant"}, {"content", "Hello"}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}}},
                            {"usage", nullptr}}));
  const json later = json::parse(chunk_json(req, "chatcmpl-9", 11, 0, t, false, token_text));
  BOOST_TEST(later["choices"][0]["index"] == 1);
  BOOST_TEST(later["choices"][0]["delta"] == json({{"content", "Hello"}}));

  const json fin =
      json::parse(finish_chunk_json(req, "chatcmpl-9", 11, 3, wire::FinishReason::stop, false));
  BOOST_TEST(fin["choices"][0]["delta"] == json::object());
  BOOST_TEST(fin["choices"][0]["finish_reason"] == "stop");
  BOOST_TEST(fin["usage"].is_null());
  const json fin_first =
      json::parse(finish_chunk_json(req, "chatcmpl-9", 11, 2, wire::FinishReason::length, true));
  BOOST_TEST(fin_first["choices"][0]["delta"] == json({{"role", "assistant"}}));
  BOOST_TEST(fin_first["choices"][0]["finish_reason"] == "length");

  const json usage = json::parse(usage_chunk_json(req, "chatcmpl-9", 11, {{5, 2, 0}, {5, 3, 1}}));
  BOOST_TEST(usage["object"] == "chat.completion.chunk");
  BOOST_TEST(usage["choices"] == json::array());
  BOOST_TEST(usage["usage"] == json({{"prompt_tokens", 10},
                                     {"completion_tokens", 5},
                                     {"total_tokens", 15},
                                     {"prompt_tokens_details", {{"cached_tokens", 1}}}}));

  // Without include_usage, chunks carry no usage key at all; with logprobs, their entries.
  const Request lp_req = parsed(kChat, R"({"messages": [{"role": "user", "content": "x"}],
      "stream": true, "logprobs": true})");
  t.logprobs = {lp(-0.5f, {})};
  const json l = json::parse(chunk_json(lp_req, "c", 1, 0, t, false, token_text));
  BOOST_TEST(!l.contains("usage"));
  BOOST_TEST(l["choices"][0]["logprobs"]["content"][0]["token"] == "Hello");
  BOOST_TEST(l["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.5);
}

BOOST_AUTO_TEST_CASE(completions_chunks) {
  const Request req = parsed(kCompl, R"({"prompt": ["a", "b"], "stream": true, "logprobs": 0})");
  wire::Tokens t;
  t.ids = {2, 3};
  t.text = " world\xC3\xA9";
  t.logprobs = {lp(-1.f, {}), lp(-2.f, {})};
  const json c = json::parse(chunk_json(req, "cmpl-3", 2, 1, t, true, token_text, 5));
  BOOST_TEST(c["object"] == "text_completion");
  BOOST_TEST(!c.contains("usage"));
  const json& choice = c["choices"][0];
  BOOST_TEST(choice["index"] == 1);
  BOOST_TEST(choice["text"] == " world\xC3\xA9");
  BOOST_TEST(choice["finish_reason"].is_null());
  BOOST_TEST(choice["logprobs"]["tokens"] == json({" world", "\xC3\xA9"}));
  BOOST_TEST(choice["logprobs"]["text_offset"] == json({5, 11}));
  const json fin =
      json::parse(finish_chunk_json(req, "cmpl-3", 2, 1, wire::FinishReason::cancelled, true));
  BOOST_TEST(fin["choices"][0] ==
             json({{"index", 1}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", "abort"}}));
  const json usage = json::parse(usage_chunk_json(req, "cmpl-3", 2, {{1, 2, 0}}));
  BOOST_TEST(usage["object"] == "text_completion");
  BOOST_TEST(usage["choices"] == json::array());
  BOOST_TEST(usage["usage"]["total_tokens"] == 3);
}

BOOST_AUTO_TEST_CASE(sse_bytes) {
  BOOST_TEST(sse_event(R"({"a":1})") == "data: {\"a\":1}\n\n");
  BOOST_TEST(sse_done() == "data: [DONE]\n\n");
  const Request req = parsed(kCompl, R"({"prompt": "x", "stream": true})");
  wire::Tokens t;
  t.text = "hi";
  BOOST_TEST(sse_event(chunk_json(req, "cmpl-1", 3, 0, t, true, nullptr)) ==
             "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":3,\"model\":"
             "\"stories\",\"choices\":[{\"index\":0,\"text\":\"hi\",\"logprobs\":null,"
             "\"finish_reason\":null}]}\n\n");
}

// ---- errors, paths, models ----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(error_bodies) {
  ApiError e;
  e.message = "'n' must be an integer";
  e.param = "n";
  BOOST_TEST(json::parse(error_body(e)) == json({{"error",
                                                  {{"message", "'n' must be an integer"},
                                                   {"type", "invalid_request_error"},
                                                   {"param", "n"},
                                                   {"code", nullptr}}}}));
  e.param = "";
  e.code = "x";
  e.message = "bad \xff byte";  // never throws on what a message echoes
  const json j = json::parse(error_body(e));
  BOOST_TEST(j["error"]["param"].is_null());
  BOOST_TEST(j["error"]["code"] == "x");
  BOOST_TEST(j["error"]["message"] == "bad \xEF\xBF\xBD byte");
}

BOOST_AUTO_TEST_CASE(wire_errors_map_to_http) {
  struct Case {
    ErrorCode code;
    int status;
    const char* type;
    const char* code_name;
  };
  const Case cases[] = {
      {ErrorCode::bad_request, 400, "invalid_request_error", ""},
      {ErrorCode::unauthorized, 401, "authentication_error", "invalid_api_key"},
      {ErrorCode::not_found, 404, "invalid_request_error", "not_found"},
      {ErrorCode::rate_limited, 429, "rate_limit_error", "rate_limit_exceeded"},
      {ErrorCode::overloaded, 429, "rate_limit_error", "overloaded"},
      {ErrorCode::unavailable, 503, "server_error", "service_unavailable"},
      {ErrorCode::deadline_exceeded, 504, "server_error", "timeout"},
      {ErrorCode::cancelled, 499, "invalid_request_error", "cancelled"},
      {ErrorCode::engine_dead, 500, "server_error", ""},
      {ErrorCode::internal, 500, "server_error", ""},
  };
  for (const Case& c : cases) {
    const ApiError a = from_wire_error(wire::Error{"j", "t", c.code, "why", std::nullopt});
    BOOST_TEST(a.status == c.status, to_string(c.code));
    BOOST_TEST(a.type == c.type, to_string(c.code));
    BOOST_TEST(a.code == c.code_name, to_string(c.code));
    BOOST_TEST(a.message == "why");
    BOOST_TEST(a.param == "");
    BOOST_TEST(a.retry_after_ms == -1);
  }
  BOOST_TEST(
      from_wire_error(wire::Error{"", "", ErrorCode::overloaded, "full", 250}).retry_after_ms ==
      250);
}

BOOST_AUTO_TEST_CASE(paths_and_models) {
  BOOST_TEST(endpoint_path(kCompl) == "/v1/completions");
  BOOST_TEST(endpoint_path(kChat) == "/v1/chat/completions");
  BOOST_TEST((endpoint_from_path("/v1/completions") == kCompl));
  BOOST_TEST((endpoint_from_path("/v1/chat/completions?x=1") == kChat));
  BOOST_TEST(!endpoint_from_path("/v1/models").has_value());
  BOOST_TEST(!endpoint_from_path("/v1/completions/").has_value());
  const json m = json::parse(models_body({"stories"}, 99, 512));
  BOOST_TEST(m == json({{"object", "list"},
                        {"data",
                         {{{"id", "stories"},
                           {"object", "model"},
                           {"created", 99},
                           {"owned_by", "switchyard"},
                           {"max_model_len", 512}}}}}));
}

BOOST_AUTO_TEST_SUITE_END()
