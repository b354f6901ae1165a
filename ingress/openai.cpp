// The OpenAI HTTP API as plain code (openai.hpp): request JSON in, wire submits out (each run
// through the wire codec, so both doors refuse the same values in the same words), results out
// as OpenAI's response objects and stream chunks.
#include "ingress/openai.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

namespace sy::openai {
namespace {

// Ordered: `ignored` lists fields in the request's order, and responses keep OpenAI's key order.
using json = nlohmann::ordered_json;
using Prompt = decltype(wire::Submit::prompt);

// Nesting a request body may have. The request's own fields nest 4 deep
// (messages[i].content[j].text); the rest is a JSON schema's, and one deeper than this is no
// schema a model follows in its context. The bound also keeps dump()'s recursion shallow.
constexpr int kMaxJsonDepth = 128;
// Samples per prompt: the codec's bound on n, checked here too so the message names n as sent.
constexpr int64_t kMaxSamples = 16;
// OpenAI's bound on chat's top_logprobs.
constexpr int64_t kMaxTopLogprobs = 20;
// OpenAI's max_tokens when a completions request names none.
constexpr uint32_t kCompletionsMaxTokens = 16;
// JSON has no -infinity: a token masked out (logprob -inf) is written as vLLM writes it.
constexpr double kMinLogprob = -9999.0;

struct Failure {
  ApiError error;
};

[[noreturn]] void fail(std::string param, std::string message) {
  throw Failure{
      ApiError{400, std::move(message), "invalid_request_error", std::move(param), "", -1}};
}

[[noreturn]] void type_error(const std::string& name, const char* what, const json& v) {
  fail(name, "'" + name + "' must be " + what + ", got " + v.type_name());
}

std::string dump(const json& j) {
  // Token text may split a UTF-8 sequence: replace, rather than throw on, invalid bytes.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// ---- reading the request ------------------------------------------------------------------------

// A field of an object, or nullptr when absent or null (null means "the default").
const json* get(const json& obj, const std::string& key) {
  const auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

const json& need(const json& obj, const std::string& key, const std::string& name) {
  const json* v = get(obj, key);
  if (!v) fail(name, "missing field '" + name + "'");
  return *v;
}

bool boolean(const json& v, const std::string& name) {
  if (!v.is_boolean()) type_error(name, "a boolean", v);
  return v.get<bool>();
}

double number(const json& v, const std::string& name) {
  if (!v.is_number()) type_error(name, "a number", v);
  return v.get<double>();
}

const std::string& string(const json& v, const std::string& name) {
  if (!v.is_string()) type_error(name, "a string", v);
  return v.get_ref<const std::string&>();
}

const json& object(const json& v, const std::string& name) {
  if (!v.is_object()) type_error(name, "an object", v);
  return v;
}

// An integer in [lo, hi], refused in the codec's words ("n 17 out of range [1, 16]").
int64_t integer(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) type_error(name, "an integer", v);
  const bool huge =
      v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max());
  const int64_t x = huge ? std::numeric_limits<int64_t>::max() : v.get<int64_t>();
  if (huge || x < lo || x > hi)
    fail(name, name + " " + v.dump() + " out of range [" + std::to_string(lo) + ", " +
                   std::to_string(hi) + "]");
  return x;
}

// The sampler's floats: a double beyond float's range becomes an infinity (which the codec
// refuses with the value's name) rather than undefined behaviour.
float to_float(double v) {
  constexpr double m = std::numeric_limits<float>::max();
  return v > m    ? std::numeric_limits<float>::infinity()
         : v < -m ? -std::numeric_limits<float>::infinity()
                  : static_cast<float>(v);
}

json parse_body(std::string_view body) {
  struct TooDeep {};
  const json::parser_callback_t depth = [](int d, json::parse_event_t e, json&) {
    if ((e == json::parse_event_t::object_start || e == json::parse_event_t::array_start) &&
        d >= kMaxJsonDepth)
      throw TooDeep{};
    return true;
  };
  json j;
  try {
    j = json::parse(body.begin(), body.end(), depth);
  } catch (const TooDeep&) {
    fail("", "request body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  } catch (const json::exception& e) {
    // what(): "[json.exception.parse_error.101] parse error at line 1, column 9: ...; last read:
    // '...'" (or out_of_range.406, "number overflow parsing '1e400'"): the prefix is noise, and
    // the token echoed can be the rest of the body, so at most 200 bytes are kept.
    std::string_view m = e.what();
    if (const std::size_t at = m.find("] "); at != std::string_view::npos) m.remove_prefix(at + 2);
    m = m.substr(0, m.find("; last read"));
    constexpr std::size_t kKept = 200;
    std::string message = "request body is not valid JSON: " + std::string(m.substr(0, kKept));
    if (m.size() > kKept) message += "...";
    if (const auto* p = dynamic_cast<const json::parse_error*>(&e))
      message += " (byte " + std::to_string(p->byte) + ")";
    fail("", std::move(message));
  }
  if (!j.is_object())
    fail("", std::string("request body must be a JSON object, got ") + j.type_name());
  return j;
}

std::vector<int32_t> token_ids(const json& a, const std::string& name) {
  std::vector<int32_t> ids;
  ids.reserve(a.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    ids.push_back(static_cast<int32_t>(integer(a[i], name + "[" + std::to_string(i) + "]", 0,
                                               std::numeric_limits<int32_t>::max())));
  return ids;
}

// `prompt`: a string, a list of strings, a list of token ids or a list of such lists.
std::vector<Prompt> read_prompts(const json& v) {
  if (v.is_string()) return {v.get<std::string>()};
  if (!v.is_array())
    type_error("prompt", "a string, an array of strings or an array of token ids", v);
  if (v.empty()) fail("prompt", "'prompt' must not be empty");
  if (v.front().is_number()) return {token_ids(v, "prompt")};
  if (v.size() > kMaxPrompts)
    fail("prompt", "'prompt' has " + std::to_string(v.size()) + " prompts, limit " +
                       std::to_string(kMaxPrompts) + " (the Batch API takes more)");
  std::vector<Prompt> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string name = "prompt[" + std::to_string(i) + "]";
    if (v[i].is_string())
      out.emplace_back(v[i].get<std::string>());
    else if (v[i].is_array())
      out.emplace_back(token_ids(v[i], name));
    else
      type_error(name, "a string or an array of token ids", v[i]);
  }
  return out;
}

// A message's content as an array of parts: text only, the parts joined by newlines (as vLLM
// joins them); an image or audio part is refused, never dropped silently.
std::string text_parts(const json& parts, const std::string& at) {
  std::string text;
  for (std::size_t j = 0; j < parts.size(); ++j) {
    const std::string part = at + "[" + std::to_string(j) + "]";
    const json& p = object(parts[j], part);
    const std::string& type = string(need(p, "type", part + ".type"), part + ".type");
    if (type != "text")
      fail(part + ".type", "content part type " + wire::quoted(type) + " of '" + part +
                               "' is not supported: this server takes text only");
    if (j) text += '\n';
    text += string(need(p, "text", part + ".text"), part + ".text");
  }
  return text;
}

std::vector<wire::ChatMessage> read_messages(const json& v) {
  if (!v.is_array()) type_error("messages", "an array of messages", v);
  if (v.empty()) fail("messages", "'messages' must not be empty");
  std::vector<wire::ChatMessage> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string at = "messages[" + std::to_string(i) + "]";
    const json& m = object(v[i], at);
    wire::ChatMessage cm;
    cm.role = string(need(m, "role", at + ".role"), at + ".role");
    // `name`, `tool_calls` and the like are left out: the chat template takes role and text.
    if (const json* c = get(m, "content")) {
      if (c->is_string())
        cm.content = c->get<std::string>();
      else if (c->is_array())
        cm.content = text_parts(*c, at + ".content");
      else
        type_error(at + ".content", "a string or an array of content parts", *c);
    } else if (cm.role != "assistant") {  // an assistant turn that only called tools has none
      fail(at + ".content", "missing field '" + at + ".content'");
    }
    out.push_back(std::move(cm));
  }
  return out;
}

std::vector<std::string> read_stop(const json& v) {
  if (v.is_string()) return {v.get<std::string>()};
  if (!v.is_array()) type_error("stop", "a string or an array of strings", v);
  std::vector<std::string> out;
  for (const json& e : v) out.push_back(string(e, "stop"));
  return out;
}

std::vector<std::pair<int32_t, float>> read_logit_bias(const json& v) {
  object(v, "logit_bias");
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, bias] : v.items()) {
    // JSON keys are strings: OpenAI's token ids are decimal ones.
    const bool digits =
        !key.empty() && key.size() <= 10 &&
        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    const uint64_t id = digits ? std::stoull(key) : 0;
    if (!digits || id > uint64_t(std::numeric_limits<int32_t>::max()))
      fail("logit_bias", "logit_bias key " + wire::quoted(key) + " is not a token id");
    if (!bias.is_number())
      fail("logit_bias",
           "logit_bias value of token " + key + " must be a number, got " + bias.type_name());
    out.emplace_back(static_cast<int32_t>(id), to_float(bias.get<double>()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The request field each wire field came from, where the names differ (max_completion_tokens,
// top_logprobs, the field that set the constraint), so that a codec error names what was sent.
using Renames = std::map<std::string, std::string, std::less<>>;

// The one constraint of a request: response_format, vLLM's structured_outputs or its older
// guided_* fields. Two are refused, as the codec refuses two constraint fields of a submit.
struct ConstraintReader {
  wire::Submit& s;
  Renames& renames;
  std::string from;  // the field that set it

  void set(const std::string& param, uint8_t kind, std::string source,
           std::vector<std::string> options = {}) {
    if (!s.constraint.empty())
      fail(param,
           "'" + from + "' and '" + param + "' exclude each other: a request takes one constraint");
    s.constraint = Constraint{kind, std::move(source), std::move(options)};
    from = param;
    for (const char* wire : {"json_schema", "grammar", "regex", "choices"}) renames[wire] = param;
  }

  void schema(const json& v, const std::string& param) {
    if (v.is_object())
      set(param, Constraint::json_schema, dump(v));
    else if (v.is_string())
      set(param, Constraint::json_schema, v.get<std::string>());
    else
      type_error(param, "an object or a string (a JSON schema)", v);
  }

  void response_format(const json& v) {
    object(v, "response_format");
    const std::string& type =
        string(need(v, "type", "response_format.type"), "response_format.type");
    if (type == "json_object") {
      set("response_format", Constraint::json_schema, R"({"type":"object"})");
    } else if (type == "json_schema") {
      const json& js = object(need(v, "json_schema", "response_format.json_schema"),
                              "response_format.json_schema");
      const std::string at = "response_format.json_schema.schema";
      set("response_format", Constraint::json_schema, dump(object(need(js, "schema", at), at)));
    } else if (type != "text") {
      fail("response_format.type", "response_format.type " + wire::quoted(type) +
                                       " is not supported (text, json_object, json_schema)");
    }
  }

  // vLLM's fields: structured_outputs.{json,regex,choice,grammar} or the top-level guided_*.
  void vllm(const json& obj, const std::string& prefix) {
    if (const json* v = get(obj, "json")) schema(*v, prefix + "json");
    for (auto [key, kind] :
         {std::pair{"regex", Constraint::regex}, {"grammar", Constraint::grammar}})
      if (const json* v = get(obj, key)) set(prefix + key, kind, string(*v, prefix + key));
    if (const json* v = get(obj, "choice")) {
      const std::string name = prefix + "choice";
      if (!v->is_array()) type_error(name, "an array of strings", *v);
      std::vector<std::string> options;
      for (const json& e : *v) options.push_back(string(e, name));
      set(name, Constraint::choices, "", std::move(options));
    }
  }

  void guided(const json& j) {
    for (const char* key : {"guided_json", "guided_regex", "guided_choice", "guided_grammar"})
      if (const json* v = get(j, key)) {
        json one = json::object();
        one[std::string(key).substr(7)] = *v;
        vllm(one, "guided_");
      }
  }
};

// The top-level fields this server reads; any other is ignored and reported.
bool known(std::string_view k, bool chat) {
  // clang-format off
  static constexpr std::string_view common[] = {
      "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop", "seed",
      "stream", "stream_options", "presence_penalty", "frequency_penalty", "logit_bias",
      "logprobs", "response_format", "user", "top_k", "min_p", "repetition_penalty",
      "ignore_eos", "priority", "structured_outputs", "guided_json", "guided_regex",
      "guided_choice", "guided_grammar", "speculative"};
  // clang-format on
  static constexpr std::string_view completions[] = {"prompt", "echo", "suffix", "best_of"};
  static constexpr std::string_view chat_only[] = {"messages", "top_logprobs"};
  const auto in = [&](const auto& list) {
    return std::find(std::begin(list), std::end(list), k) != std::end(list);
  };
  return in(common) || (chat ? in(chat_only) : in(completions));
}

// The wire fields of a submit that a codec message can start with ("field 'stop' ...",
// "max_tokens 0 out of range ...", "stop string at index 2 ...", "logit_bias.7 ...").
// clang-format off
constexpr std::string_view kWireFields[] = {
    "prompt", "messages", "max_tokens", "temperature", "top_k", "top_p", "seed", "stop",
    "priority", "logprobs", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "logit_bias", "grammar", "json_schema", "regex", "choices", "n"};
// clang-format on

// The request field a codec message is about; "" when it names none.
std::string codec_param(std::string_view msg, const Renames& renames) {
  if (msg.starts_with("field '")) msg = msg.substr(7, msg.find('\'', 7) - 7);
  if (msg.starts_with("messages.")) {  // "messages.2.content" is OpenAI's "messages[2].content"
    const std::string_view rest = msg.substr(9);
    const std::size_t dot = rest.find('.');
    if (dot != std::string_view::npos)
      return "messages[" + std::string(rest.substr(0, dot)) + "]" +
             std::string(rest.substr(dot, rest.find(' ', dot) - dot));
  }
  const std::string_view word = msg.substr(0, msg.find_first_of(" ."));
  if (std::find(std::begin(kWireFields), std::end(kWireFields), word) == std::end(kWireFields))
    return "";
  const auto it = renames.find(word);
  return it == renames.end() ? std::string(word) : it->second;
}

// One set of range checks for both doors: the job goes through the wire codec as a ZeroMQ
// submit would (with placeholder key fields, which the door sets later).
void check_with_codec(wire::Submit& s, const ParseContext& ctx, const Renames& renames) {
  s.id = "x";
  s.tenant = "t";
  const std::string bytes = wire::encode_client(wire::ClientMessage{s});
  const auto r = wire::decode_client(bytes.data(), bytes.size(), ctx.limits);
  if (const auto* e = std::get_if<wire::DecodeError>(&r))
    fail(codec_param(e->message, renames), e->message);
  s.id.clear();
  s.tenant.clear();
}

Request parse(Endpoint endpoint, std::string_view body, const ParseContext& ctx) {
  const json j = parse_body(body);
  const bool chat = endpoint == Endpoint::chat_completions;
  Request r;
  r.endpoint = endpoint;
  wire::Submit s;
  Renames renames;

  r.model = ctx.models.empty() ? "" : ctx.models.front();
  if (const json* v = get(j, "model")) {
    const std::string& name = string(*v, "model");
    if (ctx.models.empty())
      r.model = name;
    else if (std::find(ctx.models.begin(), ctx.models.end(), name) == ctx.models.end())
      throw Failure{ApiError{404,
                             "model " + wire::quoted(name) +
                                 " does not exist (this server serves " +
                                 wire::quoted(ctx.models.front()) + ")",
                             "invalid_request_error", "model", "model_not_found", -1}};
  }

  std::vector<Prompt> prompts{std::string()};
  if (chat)
    s.messages = read_messages(need(j, "messages", "messages"));
  else
    prompts = read_prompts(need(j, "prompt", "prompt"));

  s.max_tokens = std::min(chat ? ctx.chat_default_max_tokens : kCompletionsMaxTokens,
                          ctx.limits.max_new_tokens);
  for (const char* k : {"max_tokens", "max_completion_tokens"})  // the latter wins, as in OpenAI
    if (const json* v = get(j, k)) {
      s.max_tokens = static_cast<uint32_t>(integer(*v, k, 1, ctx.limits.max_new_tokens));
      renames["max_tokens"] = k;
    }
  if (const json* v = get(j, "n"))
    r.n = s.n = static_cast<uint32_t>(integer(*v, "n", 1, kMaxSamples));
  for (auto [k, p] : {std::pair{"temperature", &s.temperature}, {"top_p", &s.top_p}})
    if (const json* v = get(j, k)) *p = number(*v, k);
  SamplingControls& c = s.controls;
  for (auto [k, p] : {std::pair{"min_p", &c.min_p},
                      {"presence_penalty", &c.presence_penalty},
                      {"frequency_penalty", &c.frequency_penalty},
                      {"repetition_penalty", &c.repetition_penalty}})
    if (const json* v = get(j, k)) *p = to_float(number(*v, k));
  if (const json* v = get(j, "logit_bias")) c.logit_bias = read_logit_bias(*v);
  if (const json* v = get(j, "top_k"))  // -1 is vLLM's "off", 0 the wire's
    s.top_k = static_cast<uint32_t>(
        std::max<int64_t>(0, integer(*v, "top_k", -1, std::numeric_limits<int32_t>::max())));
  if (const json* v = get(j, "seed"))
    s.seed = v->is_number_unsigned() ? v->get<uint64_t>()
                                     : integer(*v, "seed", 0, std::numeric_limits<int64_t>::max());
  if (const json* v = get(j, "stop")) s.stop = read_stop(*v);
  if (const json* v = get(j, "ignore_eos")) s.ignore_eos = boolean(*v, "ignore_eos");
  if (const json* v = get(j, "speculative")) {  // Switchyard's own (docs/speculation.md)
    if (!v->is_string() || (*v != "auto" && *v != "always" && *v != "off"))
      fail("speculative", "'speculative' must be \"auto\", \"always\" or \"off\"");
    s.speculative = v->get<std::string>();
  }

  if (const json* v = get(j, "priority")) {
    if (v->is_number_integer()) {
      const int64_t i = integer(*v, "priority", std::numeric_limits<int64_t>::min(),
                                std::numeric_limits<int64_t>::max());
      if (i < 0 || i >= static_cast<int64_t>(ctx.classes.size()))
        fail("priority", "priority " + std::to_string(i) +
                             " is not the index of a priority class (this server has " +
                             std::to_string(ctx.classes.size()) + ")");
      r.priority = ctx.classes[static_cast<std::size_t>(i)];
    } else if (v->is_string()) {
      r.priority = v->get<std::string>();
    } else {
      type_error("priority", "a string (a priority class) or an integer (its index)", *v);
    }
    s.priority = r.priority;
  }

  if (const json* v = get(j, "stream")) r.stream = s.stream = boolean(*v, "stream");
  if (const json* v = get(j, "stream_options")) {
    // Refused without stream, as OpenAI does: a client waiting for a usage chunk hears why none
    // comes instead of getting a body without one.
    if (!r.stream) fail("stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (const json* u = get(object(*v, "stream_options"), "include_usage"))
      r.include_usage = boolean(*u, "stream_options.include_usage");
  }

  if (chat) {
    if (const json* v = get(j, "logprobs")) r.chat_logprobs = boolean(*v, "logprobs");
    if (const json* v = get(j, "top_logprobs")) {
      if (!r.chat_logprobs) fail("top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
      r.top_logprobs = static_cast<uint32_t>(integer(*v, "top_logprobs", 0, kMaxTopLogprobs));
      renames["logprobs"] = "top_logprobs";
    }
    // At least 1: the wire's 0 means no logprobs at all, not the chosen token's alone.
    if (r.chat_logprobs) s.logprobs = std::max(r.top_logprobs, 1u);
  } else {
    if (const json* v = get(j, "logprobs")) {
      r.completion_logprobs =
          static_cast<int32_t>(integer(*v, "logprobs", 0, ctx.limits.max_logprobs));
      s.logprobs = std::max<uint32_t>(static_cast<uint32_t>(r.completion_logprobs), 1);
    }
    if (const json* v = get(j, "echo")) r.echo = boolean(*v, "echo");
    if (const json* v = get(j, "suffix"); v && !string(*v, "suffix").empty())
      fail("suffix", "'suffix' is not supported (this server does not fill in the middle)");
    if (const json* v = get(j, "best_of"))
      if (integer(*v, "best_of", 1, kMaxSamples) != r.n)
        fail("best_of", "'best_of' other than 'n' is not supported (every sample is returned)");
  }

  ConstraintReader constraint{s, renames, ""};
  if (const json* v = get(j, "response_format")) constraint.response_format(*v);
  if (const json* v = get(j, "structured_outputs")) {
    constraint.vllm(object(*v, "structured_outputs"), "structured_outputs.");
    if (const json* o = get(*v, "json_object"); o && boolean(*o, "structured_outputs.json_object"))
      constraint.set("structured_outputs.json_object", Constraint::json_schema,
                     R"({"type":"object"})");
  }
  constraint.guided(j);
  if (const json* v = get(j, "user")) r.user = string(*v, "user");

  for (const auto& [k, v] : j.items()) {
    if (!known(k, chat)) r.ignored.push_back(k);
    if (k != "structured_outputs" || !v.is_object()) continue;
    for (const auto& [sub, _] : v.items())
      if (sub != "json" && sub != "regex" && sub != "choice" && sub != "grammar" &&
          sub != "json_object")
        r.ignored.push_back("structured_outputs." + sub);
  }

  for (std::size_t i = 0; i < prompts.size(); ++i) {
    wire::Submit job = s;
    job.prompt = std::move(prompts[i]);
    renames["prompt"] = prompts.size() > 1 ? "prompt[" + std::to_string(i) + "]" : "prompt";
    check_with_codec(job, ctx, renames);
    r.jobs.push_back(std::move(job));
  }
  return r;
}

// ---- writing the response -----------------------------------------------------------------------

// A float logprob as the shortest decimal that reads back as that float (0.1f is written 0.1,
// not 0.10000000149011612); non-finite ones as kMinLogprob.
double logprob(float x) {
  if (!std::isfinite(x)) return kMinLogprob;
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof buf, x).ptr;
  double d = 0;
  std::from_chars(buf, end, d);
  return d;
}

// Unicode code points of UTF-8 text: text_offset counts characters, as OpenAI and vLLM do.
uint32_t code_points(std::string_view s) {
  return static_cast<uint32_t>(std::count_if(
      s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

const char* finish_name(wire::FinishReason r) {
  switch (r) {
    case wire::FinishReason::length:
      return "length";
    case wire::FinishReason::cancelled:
      return "abort";  // vLLM's name; OpenAI has none for a cancelled request
    default:
      return "stop";
  }
}

json head(const Request& req, const std::string& id, int64_t created, bool chunk) {
  const bool chat = req.endpoint == Endpoint::chat_completions;
  return json{{"id", id},
              {"object", !chat   ? "text_completion"
                         : chunk ? "chat.completion.chunk"
                                 : "chat.completion"},
              {"created", created},
              {"model", req.model}};
}

json usage_json(const std::vector<wire::Usage>& usage) {
  uint64_t prompt = 0, completion = 0, cached = 0;
  for (const wire::Usage& u : usage) {
    prompt += u.prompt_tokens;
    completion += u.completion_tokens;
    cached += u.cached_tokens;
  }
  return json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion},
              {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

// Chat's logprob entry: {"token", "logprob", "bytes"}.
json chat_token(int32_t id, float lp, const TokenText& token_text) {
  const std::string text = token_text(id);
  json bytes = json::array();
  for (unsigned char b : text) bytes.push_back(b);
  return json{{"token", text}, {"logprob", logprob(lp)}, {"bytes", std::move(bytes)}};
}

// The logprobs of one choice's tokens (or one chunk's), or null when the request asked none.
// `offset`: completions' text_offset of the first token.
json logprobs_json(const Request& req, const std::vector<int32_t>& ids,
                   const std::vector<wire::TokenLogprobs>& lps, const TokenText& token_text,
                   uint32_t offset) {
  const std::size_t n = std::min(ids.size(), lps.size());
  if (req.endpoint == Endpoint::chat_completions) {
    if (!req.chat_logprobs) return nullptr;
    json content = json::array();
    for (std::size_t i = 0; i < n; ++i) {
      json e = chat_token(ids[i], lps[i].logprob, token_text);
      json& top = e["top_logprobs"] = json::array();
      for (std::size_t k = 0; k < std::min<std::size_t>(req.top_logprobs, lps[i].top.size()); ++k)
        top.push_back(chat_token(lps[i].top[k].id, lps[i].top[k].logprob, token_text));
      content.push_back(std::move(e));
    }
    return json{{"content", std::move(content)}};
  }
  if (req.completion_logprobs < 0) return nullptr;
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array();
  for (std::size_t i = 0; i < n; ++i) {
    const std::string text = token_text(ids[i]);
    tokens.push_back(text);
    token_logprobs.push_back(logprob(lps[i].logprob));
    // The N most likely tokens, and the chosen one when not among them: OpenAI's "up to
    // logprobs + 1" entries (logprobs 0: the chosen token's alone).
    json top = json::object();
    const std::size_t shown =
        std::min<std::size_t>(uint32_t(req.completion_logprobs), lps[i].top.size());
    for (std::size_t k = 0; k < shown; ++k) {
      const std::string t = token_text(lps[i].top[k].id);
      if (!top.contains(t))
        top[t] = logprob(lps[i].top[k].logprob);  // the likelier of two spellings
    }
    if (!top.contains(text)) top[text] = logprob(lps[i].logprob);
    top_logprobs.push_back(std::move(top));
    text_offset.push_back(offset);
    offset += code_points(text);
  }
  return json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(top_logprobs)},
              {"text_offset", std::move(text_offset)}};
}

// One sample of a job: a Choice of a job with n > 1, or the job's own fields.
struct Sample {
  uint32_t index;
  wire::FinishReason finish;
  const std::string& text;
  const std::vector<int32_t>& ids;
  const std::vector<wire::TokenLogprobs>& logprobs;
};

std::vector<Sample> samples(const wire::Done& d) {
  if (d.choices.empty()) return {Sample{0, d.finish_reason, d.text, d.ids, d.logprobs}};
  std::vector<Sample> out;
  for (const wire::Choice& c : d.choices)
    out.push_back(Sample{c.index, c.finish_reason, c.text, c.ids, c.logprobs});
  return out;
}

}  // namespace

std::string_view endpoint_path(Endpoint e) {
  return e == Endpoint::chat_completions ? "/v1/chat/completions" : "/v1/completions";
}

std::optional<Endpoint> endpoint_from_path(std::string_view path) {
  path = path.substr(0, path.find('?'));  // a query string names no other endpoint
  for (Endpoint e : {Endpoint::completions, Endpoint::chat_completions})
    if (path == endpoint_path(e)) return e;
  return std::nullopt;
}

std::string error_body(const ApiError& e) {
  const auto or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  return dump(json{{"error",
                    {{"message", e.message},
                     {"type", e.type},
                     {"param", or_null(e.param)},
                     {"code", or_null(e.code)}}}});
}

ApiError from_wire_error(const wire::Error& e) {
  ApiError a;
  a.message = e.message;
  const auto set = [&](int status, const char* type, const char* code) {
    a.status = status;
    a.type = type;
    a.code = code;
  };
  switch (e.code) {
    case ErrorCode::bad_request:
      set(400, "invalid_request_error", "");
      break;
    case ErrorCode::unauthorized:
      set(401, "authentication_error", "invalid_api_key");
      break;
    case ErrorCode::not_found:
      set(404, "invalid_request_error", "not_found");
      break;
    case ErrorCode::rate_limited:
      set(429, "rate_limit_error", "rate_limit_exceeded");
      break;
    case ErrorCode::overloaded:
      set(429, "rate_limit_error", "overloaded");
      break;
    case ErrorCode::unavailable:
      set(503, "server_error", "service_unavailable");
      break;
    case ErrorCode::deadline_exceeded:
      set(504, "server_error", "timeout");
      break;
    case ErrorCode::cancelled:  // nginx's "client closed request": the client cancelled
      set(499, "invalid_request_error", "cancelled");
      break;
    case ErrorCode::engine_dead:
    case ErrorCode::internal:
      set(500, "server_error", "");
      break;
  }
  if (e.retry_after_ms) a.retry_after_ms = *e.retry_after_ms;
  return a;
}

std::variant<Request, ApiError> parse_request(Endpoint endpoint, std::string_view body,
                                              const ParseContext& ctx) {
  try {
    return parse(endpoint, body, ctx);
  } catch (Failure& f) {
    return std::move(f.error);
  }
}

std::string response_body(const Request& req, const std::string& response_id, int64_t created,
                          const std::vector<JobResult>& results, const TokenText& token_text) {
  const bool chat = req.endpoint == Endpoint::chat_completions;
  json out = head(req, response_id, created, false);
  json choices = json::array();
  std::vector<wire::Usage> usage;
  for (std::size_t job = 0; job < results.size(); ++job) {
    const JobResult& res = results[job];
    usage.push_back(res.done.usage);  // once per job: its samples share the prompt
    const std::string& prefix = req.echo && !chat ? res.prompt_text : std::string();
    for (const Sample& s : samples(res.done)) {
      json c{{"index", job * req.n + s.index}};
      if (chat)
        c["message"] = {{"role", "assistant"}, {"content", s.text}};
      else
        c["text"] = prefix + s.text;
      c["logprobs"] = logprobs_json(req, s.ids, s.logprobs, token_text, code_points(prefix));
      c["finish_reason"] = finish_name(s.finish);
      choices.push_back(std::move(c));
    }
  }
  out["choices"] = std::move(choices);
  out["usage"] = usage_json(usage);
  return dump(out);
}

std::string chunk_json(const Request& req, const std::string& response_id, int64_t created,
                       uint32_t job, const wire::Tokens& t, bool first, const TokenText& token_text,
                       uint32_t text_offset) {
  json c{{"index", job * req.n + t.choice}};
  if (req.endpoint == Endpoint::chat_completions) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    delta["content"] = t.text;
    c["delta"] = std::move(delta);
  } else {
    c["text"] = t.text;
  }
  c["logprobs"] = logprobs_json(req, t.ids, t.logprobs, token_text, text_offset);
  c["finish_reason"] = nullptr;
  json out = head(req, response_id, created, true);
  out["choices"] = json::array({std::move(c)});
  if (req.include_usage) out["usage"] = nullptr;  // as OpenAI: only the last chunk has usage
  return dump(out);
}

std::string finish_chunk_json(const Request& req, const std::string& response_id, int64_t created,
                              uint32_t choice_index, wire::FinishReason finish, bool first) {
  json c{{"index", choice_index}};
  if (req.endpoint == Endpoint::chat_completions)
    c["delta"] = first ? json{{"role", "assistant"}} : json::object();
  else
    c["text"] = "";
  c["logprobs"] = nullptr;
  c["finish_reason"] = finish_name(finish);
  json out = head(req, response_id, created, true);
  out["choices"] = json::array({std::move(c)});
  if (req.include_usage) out["usage"] = nullptr;
  return dump(out);
}

std::string usage_chunk_json(const Request& req, const std::string& response_id, int64_t created,
                             const std::vector<wire::Usage>& usage) {
  json out = head(req, response_id, created, true);
  out["choices"] = json::array();
  out["usage"] = usage_json(usage);
  return dump(out);
}

std::string sse_event(std::string_view json_text) {
  std::string out;
  out.reserve(json_text.size() + 8);
  out.append("data: ").append(json_text).append("\n\n");
  return out;
}

std::string_view sse_done() {
  return "data: [DONE]\n\n";
}

std::string models_body(const std::vector<std::string>& models, int64_t created,
                        uint32_t max_model_len) {
  json data = json::array();
  for (const std::string& m : models)
    data.push_back(json{{"id", m},
                        {"object", "model"},
                        {"created", created},
                        {"owned_by", "switchyard"},
                        {"max_model_len", max_model_len}});
  return dump(json{{"object", "list"}, {"data", std::move(data)}});
}

}  // namespace sy::openai
