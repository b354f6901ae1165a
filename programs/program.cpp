// parse(): a program's steps from their JSON text to the Step tree, checked whole (docs/programs.md,
// "Steps", "Variables and templates", "Limits"); every refusal names the step by path and type.
#include "programs/program.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "programs/template.hpp"

namespace sy::programs {
namespace {

// ordered_json keeps a json_schema's keys in the order they were sent: the order of `properties`
// is the order the constrained output writes them in.
using json = nlohmann::ordered_json;

using detail::kMaxNameBytes;
using detail::valid_name;

// The bounds below match the codec's for a plain submit (ingress/codec.hpp, DecodeLimits), so a
// gen step can ask for nothing a job could not.
// The sampler keeps token ids and top_k in an int32.
constexpr uint64_t kMaxTokenId = std::numeric_limits<int32_t>::max();
constexpr std::size_t kMaxStop = 16;         // stop strings of one gen
constexpr std::size_t kMaxStopBytes = 256;   // bytes of one stop string
constexpr std::size_t kMaxLogitBias = 1024;  // OpenAI's bound on logit_bias entries
constexpr std::size_t kMaxGenChoices = 1024;
// Choices of a select: all scored in one batched step, so bounded like a batch.
constexpr std::size_t kMaxSelectChoices = 64;
constexpr std::size_t kMaxToolNameBytes = 64;
constexpr std::size_t kMaxRoleBytes = 64;
// Far beyond any useful temperature (the distribution is flat long before) yet finite.
constexpr double kMaxTemperature = 100.0;

std::string num(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
std::string num(uint64_t v) {
  return std::to_string(v);
}
std::string num(int64_t v) {
  return std::to_string(v);
}

// A JSON value's type as a message names it.
std::string type_of(const json& v) {
  if (v.is_object()) return "a map";
  if (v.is_array()) return "an array";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  return "null";
}

// A name or key quoted for a message; a long one is cut (the message names it, it need not
// repeat a megabyte of it).
std::string in_quotes(std::string_view s) {
  constexpr std::size_t kShown = 64;
  if (s.size() <= kShown) return "'" + std::string(s) + "'";
  return "'" + std::string(s.substr(0, kShown)) + "...'";
}

const std::string kNameRule = "[A-Za-z_][A-Za-z0-9_]*, at most 64 bytes";

// Arrays and maps nested in the steps' JSON: a json_schema sent as a map is written out again
// (dump()) recursively, so no hostile depth may reach it. Forks 4 deep take about 12 levels; the
// codec lets no message nest deeper than 32 anyway.
constexpr std::size_t kMaxJsonDepth = 128;

// Whether JSON text nests arrays and maps deeper than `max` (strings skipped); checked on the
// text, before the parser builds the tree.
bool nested_deeper(std::string_view t, std::size_t max) {
  std::size_t depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character cannot end the string
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max) return true;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return false;
}

// The fields of one step map, each read with its type and range checked; `where` names the step
// ("step 2.1.0 (gen 'draft')") in every refusal.
class Fields {
 public:
  Fields(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& msg) const { throw ProgramError(where_ + ": " + msg); }

  // Refuses every field not in `allowed`.
  void only(std::initializer_list<std::string_view> allowed) const {
    for (const auto& [key, value] : obj_.items()) {
      if (std::find(allowed.begin(), allowed.end(), std::string_view(key)) == allowed.end())
        fail("unknown field " + in_quotes(key));
    }
  }

  const json* get(std::string_view key) const {
    const auto it = obj_.find(key);
    return it == obj_.end() ? nullptr : &*it;
  }

  [[noreturn]] void wrong_type(std::string_view key, const std::string& want,
                               const json& got) const {
    fail("field '" + std::string(key) + "' must be " + want + ", got " + type_of(got));
  }

  std::optional<std::string> str(std::string_view key, std::size_t max_bytes,
                                 bool allow_empty) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) wrong_type(key, "a string", *v);
    const auto& s = v->get_ref<const std::string&>();
    if (s.empty() && !allow_empty) fail("field '" + std::string(key) + "' must not be empty");
    if (s.size() > max_bytes)
      fail("field '" + std::string(key) + "' has " + num(uint64_t{s.size()}) + " bytes, limit " +
           num(uint64_t{max_bytes}));
    return s;
  }

  std::string required_str(std::string_view key, std::size_t max_bytes, bool allow_empty,
                           const std::string& meaning) const {
    if (!get(key)) fail("missing field '" + std::string(key) + "' (" + meaning + ")");
    return *str(key, max_bytes, allow_empty);
  }

  std::optional<uint64_t> uint(std::string_view key, uint64_t lo, uint64_t hi) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    const std::string range = "[" + num(lo) + ", " + num(hi) + "]";
    if (!v->is_number_integer()) wrong_type(key, "an integer in " + range, *v);
    if (!v->is_number_unsigned())
      fail("field '" + std::string(key) + "' is " + num(v->get<int64_t>()) + ", out of range " +
           range);
    const uint64_t x = v->get<uint64_t>();
    if (x < lo || x > hi)
      fail("field '" + std::string(key) + "' is " + num(x) + ", out of range " + range);
    return x;
  }

  std::optional<int64_t> sint(std::string_view key, int64_t lo, int64_t hi) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    const std::string range = "[" + num(lo) + ", " + num(hi) + "]";
    if (!v->is_number_integer()) wrong_type(key, "an integer in " + range, *v);
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi))
      fail("field '" + std::string(key) + "' is " + num(v->get<uint64_t>()) + ", out of range " +
           range);
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi)
      fail("field '" + std::string(key) + "' is " + num(x) + ", out of range " + range);
    return x;
  }

  // A number in [lo, hi] ((lo, hi] when lo_open). The sampler takes these as 32-bit floats: each
  // is checked again as that float, so that no value valid as sent becomes invalid on the way
  // (top_p 1e-46 is > 0 as a double but 0 as a float).
  std::optional<double> number(std::string_view key, double lo, double hi, bool lo_open) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    return number_value(*v, "field '" + std::string(key) + "'", lo, hi, lo_open);
  }

  double number_value(const json& v, const std::string& what, double lo, double hi,
                      bool lo_open) const {
    const std::string range = (lo_open ? "(" : "[") + num(lo) + ", " + num(hi) + "]";
    if (!v.is_number()) fail(what + " must be a number in " + range + ", got " + type_of(v));
    const double x = v.get<double>();
    const auto inside = [&](double y) {
      return std::isfinite(y) && (lo_open ? y > lo : y >= lo) && y <= hi;
    };
    if (!inside(x)) fail(what + " is " + num(x) + ", out of range " + range);
    if (!inside(static_cast<double>(static_cast<float>(x))))
      fail(what + " is " + num(x) + ", out of range " + range +
           " once narrowed to the sampler's 32-bit float");
    return x;
  }

  std::optional<bool> boolean(std::string_view key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) wrong_type(key, "a boolean", *v);
    return v->get<bool>();
  }

 private:
  const json& obj_;
  std::string where_;
};

// The names one scope has defined: inputs (the top level's), variables and fork names. A branch's
// scope sees its fork's scope (as it was at the fork) through `parent`.
struct Scope {
  enum class Kind { input, var, fork };
  const Scope* parent = nullptr;
  std::map<std::string, Kind, std::less<>> names;

  const Kind* find(std::string_view n) const {
    for (const Scope* s = this; s; s = s->parent) {
      const auto it = s->names.find(n);
      if (it != s->names.end()) return &it->second;
    }
    return nullptr;
  }
};

constexpr std::string_view kKinds[] = {"text", "gen", "select", "fork", "join", "tool"};

class Parser {
 public:
  Parser(Program& p, const GenDefaults& d, const Limits& l) : prog_(p), defaults_(d), limits_(l) {}

  // The steps of one array (the program's, or one branch's), paths `prefix` + index; `depth`
  // counts the forks they sit in.
  Steps steps(const json& arr, const std::string& prefix, Scope& scope, uint32_t depth) {
    Steps out;
    for (std::size_t i = 0; i < arr.size(); ++i) {
      const std::string path = prefix + std::to_string(i);
      const json& j = arr[i];
      const Step::Kind kind = kind_of(j, path);
      if (kind == Step::Kind::join)
        Fields(j, where(path, kind, j))
            .fail("does not follow a fork (a join comes right after its fork)");
      if (kind != Step::Kind::fork) {
        out.push_back(simple(j, path, kind, scope));
        continue;
      }
      const bool joined = i + 1 < arr.size() && arr[i + 1].is_object() &&
                          arr[i + 1].contains("type") && arr[i + 1]["type"] == "join";
      std::vector<Scope> branch_scopes;
      out.push_back(fork(j, path, scope, depth, joined, branch_scopes));
      out.push_back(join(arr[i + 1], prefix + std::to_string(i + 1), scope, branch_scopes));
      ++i;
    }
    return out;
  }

 private:
  Step::Kind kind_of(const json& j, const std::string& path) const {
    const std::string at = "step " + path;
    if (!j.is_object()) throw ProgramError(at + ": a step must be a map, got " + type_of(j));
    const auto t = j.find("type");
    if (t == j.end())
      throw ProgramError(at + ": missing field 'type' (text, gen, select, fork, join or tool)");
    if (!t->is_string())
      throw ProgramError(at + ": field 'type' must be a string, got " + type_of(*t));
    const auto& s = t->get_ref<const std::string&>();
    for (std::size_t k = 0; k < std::size(kKinds); ++k)
      if (s == kKinds[k]) return static_cast<Step::Kind>(k);
    throw ProgramError(at + ": unknown type " + in_quotes(s) +
                       " (text, gen, select, fork, join or tool)");
  }

  // "step 2.1.0 (gen 'draft')": the path, the type, and the name when it is a usable one (a text
  // step has none: a `name` there is refused as an unknown field).
  static std::string where(const std::string& path, Step::Kind kind, const json& j) {
    std::string w = "step " + path + " (" + std::string(kKinds[static_cast<std::size_t>(kind)]);
    const auto n = j.find("name");
    if (kind != Step::Kind::text && n != j.end() && n->is_string() &&
        !n->get_ref<const std::string&>().empty() &&
        n->get_ref<const std::string&>().size() <= kMaxNameBytes)
      w += " '" + n->get<std::string>() + "'";
    return w + ")";
  }

  // Field `name` (the variable the step defines, or a fork's label), checked; "" when absent
  // and not required.
  static std::string name_of(const Fields& f, bool required, const std::string& meaning) {
    const json* v = f.get("name");
    if (!v) {
      if (required) f.fail("missing field 'name' (" + meaning + ")");
      return "";
    }
    if (!v->is_string()) f.wrong_type("name", "a string", *v);
    const auto& n = v->get_ref<const std::string&>();
    if (!valid_name(n)) f.fail("name " + in_quotes(n) + " is not a valid name (" + kNameRule + ")");
    return n;
  }

  // Defines `name` in `scope`: unique in scope, inputs and outer scopes included.
  static void define(const Fields& f, Scope& scope, const std::string& name, Scope::Kind kind) {
    if (const Scope::Kind* k = scope.find(name)) {
      if (*k == Scope::Kind::input) f.fail("name " + in_quotes(name) + " is already an input");
      if (*k == Scope::Kind::fork)
        f.fail("name " + in_quotes(name) + " already names a fork in this scope");
      f.fail("name " + in_quotes(name) + " is already defined in this scope");
    }
    scope.names.emplace(name, kind);
  }

  // Every {{name}} of `t` names an input or a variable defined before, in scope.
  static void check_template(const Fields& f, const std::string& t, const Scope& scope) {
    std::string bad;
    const std::size_t at = detail::scan_template(
        t, [](std::string_view) {},
        [&](std::string_view n) {
          if (!bad.empty()) return;
          const Scope::Kind* k = scope.find(n);
          if (!k)
            bad = "{{" + std::string(n) + "}} is not defined before this step";
          else if (*k == Scope::Kind::fork)
            bad = "{{" + std::string(n) + "}} names a fork, not a variable";
        });
    if (!bad.empty()) f.fail(bad);
    if (at != std::string_view::npos)
      f.fail("unterminated or malformed {{...}} at byte " + num(uint64_t{at}) +
             " (write {{name}} with a name " + kNameRule + ", or {{{{ for a literal {{)");
  }

  Step simple(const json& j, const std::string& path, Step::Kind kind, Scope& scope) {
    Fields f(j, where(path, kind, j));
    Step s;
    s.kind = kind;
    s.path = path;
    ++prog_.n_steps;
    switch (kind) {
      case Step::Kind::text: {
        f.only({"type", "text", "role"});
        s.text = f.required_str("text", std::numeric_limits<std::size_t>::max(), true,
                                "the text it appends");
        if (s.text.size() > limits_.max_text_bytes)
          f.fail("text has " + num(uint64_t{s.text.size()}) + " bytes, limit " +
                 num(uint64_t{limits_.max_text_bytes}));
        check_template(f, s.text, scope);
        if (auto r = f.str("role", kMaxRoleBytes, false)) {
          s.role = *r;
          prog_.chat = true;
        }
        break;
      }
      case Step::Kind::gen:
        f.only({"type", "name", "max_tokens", "temperature", "top_k", "top_p", "seed", "stop",
                "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
                "repeat_last_n", "logit_bias", "grammar", "json_schema", "regex", "choices",
                "append"});
        s.name = name_of(f, true, "the variable it generates into");
        gen(f, s.gen);
        s.append = f.boolean("append").value_or(true);
        define(f, scope, s.name, Scope::Kind::var);
        prog_.max_generated += s.gen.max_tokens.value_or(defaults_.max_tokens);
        break;
      case Step::Kind::select:
        f.only({"type", "name", "choices", "method", "append"});
        s.name = name_of(f, true, "the variable it selects into");
        s.choices = select_choices(f);
        if (auto m = f.str("method", 64, false)) {
          if (*m == "token_length_normalized")
            s.method = Step::token_length_normalized;
          else if (*m == "greedy_first_token")
            s.method = Step::greedy_first_token;
          else
            f.fail(
                "field 'method' must be 'token_length_normalized' or 'greedy_first_token', got " +
                in_quotes(*m));
        }
        s.append = f.boolean("append").value_or(true);
        define(f, scope, s.name, Scope::Kind::var);
        break;
      case Step::Kind::tool: {
        f.only({"type", "name", "tool", "arguments", "tool_timeout_ms", "role", "append"});
        s.name = name_of(f, true, "the variable its result goes into");
        s.tool = f.required_str("tool", kMaxToolNameBytes, false, "the tool's name");
        s.arguments =
            f.str("arguments", std::numeric_limits<std::size_t>::max(), true).value_or("");
        if (s.arguments.size() > limits_.max_text_bytes)
          f.fail("arguments have " + num(uint64_t{s.arguments.size()}) + " bytes, limit " +
                 num(uint64_t{limits_.max_text_bytes}));
        check_template(f, s.arguments, scope);
        s.timeout_ms =
            static_cast<uint32_t>(f.uint("tool_timeout_ms", 1, limits_.max_tool_timeout_ms)
                                      .value_or(limits_.default_tool_timeout_ms));
        s.role = f.str("role", kMaxRoleBytes, false).value_or("tool");
        s.append = f.boolean("append").value_or(true);
        define(f, scope, s.name, Scope::Kind::var);
        break;
      }
      default:
        break;  // fork and join are parsed by fork() and join()
    }
    return s;
  }

  // A gen step's sampling fields and constraint.
  void gen(const Fields& f, GenParams& g) const {
    if (auto v = f.uint("max_tokens", 1, std::numeric_limits<uint32_t>::max()))
      g.max_tokens = static_cast<uint32_t>(*v);
    g.temperature = f.number("temperature", 0.0, kMaxTemperature, false);
    if (auto v = f.uint("top_k", 0, kMaxTokenId)) g.top_k = static_cast<uint32_t>(*v);
    g.top_p = f.number("top_p", 0.0, 1.0, true);
    g.seed = f.uint("seed", 0, std::numeric_limits<uint64_t>::max());
    if (const json* v = f.get("stop")) g.stop = stop(f, *v);

    // Any of the controls given: the defaults' controls with those replaced, as a job with the
    // submit's controls and these fields would have.
    SamplingControls c = defaults_.controls;
    bool any = false;
    const auto control = [&](std::string_view key, double lo, double hi, bool lo_open, float& out) {
      if (auto v = f.number(key, lo, hi, lo_open)) {
        out = static_cast<float>(*v);
        any = true;
      }
    };
    control("min_p", 0.0, 1.0, false, c.min_p);
    control("presence_penalty", -2.0, 2.0, false, c.presence_penalty);
    control("frequency_penalty", -2.0, 2.0, false, c.frequency_penalty);
    // (0, 10]: 1 is off; beyond 10 a penalised token is as good as banned, which logit_bias says
    // more plainly (the codec's bound for a submit).
    control("repetition_penalty", 0.0, 10.0, true, c.repetition_penalty);
    if (auto v = f.sint("repeat_last_n", -1, static_cast<int64_t>(kMaxTokenId))) {
      c.repeat_last_n = static_cast<int32_t>(*v);
      any = true;
    }
    if (const json* v = f.get("logit_bias")) {
      c.logit_bias = logit_bias(f, *v);
      any = true;
    }
    if (any) g.controls = c;

    g.constraint = constraint(f);
  }

  static std::vector<std::string> stop(const Fields& f, const json& v) {
    std::vector<std::string> out;
    const auto one = [&](const json& e, std::size_t i) {
      const std::string at = "stop string at index " + num(uint64_t{i});
      if (!e.is_string()) f.fail(at + " must be a string, got " + type_of(e));
      const auto& s = e.get_ref<const std::string&>();
      if (s.empty()) f.fail(at + " must not be empty");
      if (s.size() > kMaxStopBytes)
        f.fail(at + " has " + num(uint64_t{s.size()}) + " bytes, limit " +
               num(uint64_t{kMaxStopBytes}));
      out.push_back(s);
    };
    if (v.is_string()) {
      one(v, 0);  // a single string is a list of one, as in a submit
    } else if (v.is_array()) {
      if (v.size() > kMaxStop)
        f.fail("stop has " + num(uint64_t{v.size()}) + " strings, limit " +
               num(uint64_t{kMaxStop}));
      for (std::size_t i = 0; i < v.size(); ++i) one(v[i], i);
    } else {
      f.wrong_type("stop", "a string or an array of strings", v);
    }
    return out;
  }

  // A map of token id (as a string of digits: JSON keys are strings) to bias, or an array of
  // [id, bias] pairs; ascending ids, each once.
  static std::vector<std::pair<int32_t, float>> logit_bias(const Fields& f, const json& v) {
    std::vector<std::pair<int32_t, float>> out;
    if (!v.is_object() && !v.is_array())
      f.wrong_type("logit_bias", "a map of token id to bias or an array of [id, bias] pairs", v);
    if (v.size() > kMaxLogitBias)
      f.fail("logit_bias has " + num(uint64_t{v.size()}) + " entries, limit " +
             num(uint64_t{kMaxLogitBias}));
    const auto add = [&](uint64_t id, const json& bias) {
      if (id > kMaxTokenId)
        f.fail("logit_bias token id " + num(id) + " out of range [0, " + num(kMaxTokenId) + "]");
      const double b = f.number_value(bias, "logit_bias." + num(id), -100.0, 100.0, false);
      out.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
    };
    if (v.is_object()) {
      for (const auto& [key, bias] : v.items()) {
        if (key.empty() || key.size() > 10 ||
            !std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }))
          f.fail("logit_bias key " + in_quotes(key) + " is not a token id");
        add(std::stoull(key), bias);
      }
    } else {
      for (std::size_t i = 0; i < v.size(); ++i) {
        const json& e = v[i];
        if (!e.is_array() || e.size() != 2 || !e[0].is_number_unsigned())
          f.fail("logit_bias entry at index " + num(uint64_t{i}) +
                 " must be a pair [token id, bias]");
        add(e[0].get<uint64_t>(), e[1]);
      }
    }
    std::sort(out.begin(), out.end());
    for (std::size_t i = 1; i < out.size(); ++i)
      if (out[i].first == out[i - 1].first)
        f.fail("logit_bias names token id " + num(int64_t{out[i].first}) + " twice");
    return out;
  }

  // At most one of grammar, json_schema, regex, choices. Only its form and size are checked here;
  // admission compiles it and refuses what does not compile.
  Constraint constraint(const Fields& f) const {
    Constraint c;
    std::string given;
    for (std::string_view k : {"grammar", "json_schema", "regex", "choices"})
      if (f.get(k)) given += (given.empty() ? "" : ", ") + std::string(k);
    if (given.find(',') != std::string::npos)
      f.fail("fields " + given + " exclude each other: a gen takes one constraint");
    const std::size_t max = limits_.max_text_bytes;
    if (auto g = f.str("grammar", max, false)) {
      c.kind = Constraint::grammar;
      c.source = *g;
    } else if (auto r = f.str("regex", max, false)) {
      c.kind = Constraint::regex;
      c.source = *r;
    } else if (const json* js = f.get("json_schema")) {
      c.kind = Constraint::json_schema;
      if (js->is_string()) {
        c.source = *f.str("json_schema", max, false);
        if (!json::accept(c.source)) f.fail("field 'json_schema' is not valid JSON text");
      } else if (js->is_object() || js->is_boolean()) {
        c.source = js->dump();
        if (c.source.size() > max)
          f.fail("field 'json_schema' has " + num(uint64_t{c.source.size()}) +
                 " bytes as JSON, limit " + num(uint64_t{max}));
      } else {
        f.wrong_type("json_schema", "a map or a string of JSON", *js);
      }
    } else if (const json* ch = f.get("choices")) {
      c.kind = Constraint::choices;
      if (!ch->is_array()) f.wrong_type("choices", "an array of strings", *ch);
      if (ch->empty()) f.fail("field 'choices' must not be empty");
      if (ch->size() > kMaxGenChoices)
        f.fail("choices has " + num(uint64_t{ch->size()}) + " entries, limit " +
               num(uint64_t{kMaxGenChoices}));
      std::size_t bytes = 0;
      for (std::size_t i = 0; i < ch->size(); ++i) {
        const json& e = (*ch)[i];
        if (!e.is_string())
          f.fail("choice at index " + num(uint64_t{i}) + " must be a string, got " + type_of(e));
        bytes += e.get_ref<const std::string&>().size();
        if (bytes > max) f.fail("choices have more than " + num(uint64_t{max}) + " bytes in all");
        c.options.push_back(e.get<std::string>());
      }
    }
    return c;
  }

  std::vector<std::string> select_choices(const Fields& f) const {
    const json* ch = f.get("choices");
    if (!ch) f.fail("missing field 'choices' (the strings it selects among)");
    if (!ch->is_array()) f.wrong_type("choices", "an array of strings", *ch);
    if (ch->empty()) f.fail("field 'choices' must not be empty");
    if (ch->size() > kMaxSelectChoices)
      f.fail("choices has " + num(uint64_t{ch->size()}) + " entries, limit " +
             num(uint64_t{kMaxSelectChoices}));
    std::vector<std::string> out;
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < ch->size(); ++i) {
      const json& e = (*ch)[i];
      const std::string at = "choice at index " + num(uint64_t{i});
      if (!e.is_string()) f.fail(at + " must be a string, got " + type_of(e));
      if (e.get_ref<const std::string&>().empty()) f.fail(at + " must not be empty");
      bytes += e.get_ref<const std::string&>().size();
      if (bytes > limits_.max_text_bytes)
        f.fail("choices have more than " + num(uint64_t{limits_.max_text_bytes}) + " bytes in all");
      out.push_back(e.get<std::string>());
    }
    return out;
  }

  // A fork and its branches (each from the JSON of `branches`, or `n` copies of `steps` with
  // their own paths). `joined`: a join follows it. The branches' scopes are left in
  // `branch_scopes` for the join to check its `var` against.
  Step fork(const json& j, const std::string& path, Scope& scope, uint32_t depth, bool joined,
            std::vector<Scope>& branch_scopes) {
    Fields f(j, where(path, Step::Kind::fork, j));
    f.only({"type", "name", "branches", "n", "steps"});
    Step s;
    s.kind = Step::Kind::fork;
    s.path = path;
    ++prog_.n_steps;
    s.name = name_of(f, false, "");
    if (depth + 1 > limits_.max_depth)
      f.fail("forks nested " + num(uint64_t{depth + 1}) + " deep, limit " +
             num(uint64_t{limits_.max_depth}));
    const json* branches = f.get("branches");
    const json* n = f.get("n");
    const json* body = f.get("steps");
    if (branches && (n || body))
      f.fail("field 'branches' excludes 'n' and 'steps' (give the branches, or n copies of steps)");
    if (!branches && !n && !body)
      f.fail("needs 'branches' (an array of step arrays) or 'n' with 'steps'");
    if (n && !body) f.fail("field 'n' needs 'steps' (the steps each of the n branches runs)");
    if (body && !n) f.fail("field 'steps' needs 'n' (how many branches run them)");
    uint64_t width = 0;
    if (branches) {
      if (!branches->is_array()) f.wrong_type("branches", "an array of step arrays", *branches);
      width = branches->size();
      if (width == 0) f.fail("field 'branches' must not be empty");
    } else {
      if (!n->is_number_integer()) f.wrong_type("n", "an integer", *n);
      if (!n->is_number_unsigned() || n->get<uint64_t>() == 0)
        f.fail("field 'n' must be at least 1");
      width = n->get<uint64_t>();
      if (!body->is_array()) f.wrong_type("steps", "an array of steps", *body);
      if (body->empty()) f.fail("field 'steps' must not be empty");
    }
    if (width > limits_.max_fork_width)
      f.fail(num(width) + " branches, limit " + num(uint64_t{limits_.max_fork_width}));
    if (!joined) f.fail("is not followed by its join (a join comes right after each fork)");
    if (!s.name.empty()) define(f, scope, s.name, Scope::Kind::fork);

    branch_scopes.resize(width);  // sized once: the branches' nested scopes point into it
    for (uint64_t b = 0; b < width; ++b) {
      const json& arr = branches ? (*branches)[b] : *body;
      if (branches && !arr.is_array())
        f.fail("branch " + num(b) + " must be an array of steps, got " + type_of(arr));
      if (branches && arr.empty()) f.fail("branch " + num(b) + " has no steps");
      branch_scopes[b].parent = &scope;
      s.branches.push_back(
          steps(arr, path + "." + std::to_string(b) + ".", branch_scopes[b], depth + 1));
    }
    return s;
  }

  Step join(const json& j, const std::string& path, Scope& scope,
            const std::vector<Scope>& branch_scopes) {
    Fields f(j, where(path, Step::Kind::join, j));
    f.only({"type", "mode", "separator", "name", "var"});
    Step s;
    s.kind = Step::Kind::join;
    s.path = path;
    ++prog_.n_steps;
    const std::string mode = f.str("mode", 64, false).value_or("text");
    if (mode == "text") {
      s.mode = Step::join_text;
      for (std::string_view k : {"name", "var"})
        if (f.get(k)) f.fail("field '" + std::string(k) + "' goes with mode 'list'");
      s.separator = f.str("separator", limits_.max_text_bytes, true).value_or("");
    } else if (mode == "list") {
      s.mode = Step::join_list;
      if (f.get("separator")) f.fail("field 'separator' goes with mode 'text'");
      s.name = name_of(f, true, "the list variable it makes");
      const json* var = f.get("var");
      if (!var) f.fail("missing field 'var' (the variable of every branch it gathers)");
      if (!var->is_string()) f.wrong_type("var", "a string", *var);
      s.var = var->get<std::string>();
      if (!valid_name(s.var))
        f.fail("var " + in_quotes(s.var) + " is not a valid name (" + kNameRule + ")");
      for (std::size_t b = 0; b < branch_scopes.size(); ++b) {
        const auto it = branch_scopes[b].names.find(s.var);
        if (it == branch_scopes[b].names.end() || it->second != Scope::Kind::var)
          f.fail("var " + in_quotes(s.var) + " is not defined in branch " + num(uint64_t{b}) +
                 " of the fork");
      }
      define(f, scope, s.name, Scope::Kind::var);
    } else {
      f.fail("field 'mode' must be 'text' or 'list', got " + in_quotes(mode));
    }
    return s;
  }

  Program& prog_;
  const GenDefaults& defaults_;
  const Limits& limits_;
};

// The steps a program's JSON holds, forks' copies included, counted before anything is built, so
// that a program over the limit is refused as such before n copies of n copies are made. Forks
// deeper than the limit are not looked into (the parse refuses them).
uint64_t count_steps(const json& arr, uint32_t depth, const Limits& lim) {
  if (!arr.is_array()) return 0;
  uint64_t total = 0;
  for (const json& j : arr) {
    ++total;
    if (!j.is_object() || depth >= lim.max_depth) continue;
    const auto t = j.find("type");
    if (t == j.end() || *t != "fork") continue;
    const auto b = j.find("branches");
    const auto n = j.find("n");
    const auto body = j.find("steps");
    if (b != j.end() && b->is_array()) {
      for (const json& branch : *b) total += count_steps(branch, depth + 1, lim);
    } else if (n != j.end() && n->is_number_unsigned() &&
               n->get<uint64_t>() <= lim.max_fork_width && body != j.end()) {
      total += n->get<uint64_t>() * count_steps(*body, depth + 1, lim);
    }
  }
  return total;
}

void check_inputs(const std::vector<std::pair<std::string, std::string>>& inputs,
                  const Limits& lim) {
  if (inputs.size() > lim.max_inputs)
    throw ProgramError("inputs: " + num(uint64_t{inputs.size()}) + " inputs, limit " +
                       num(uint64_t{lim.max_inputs}));
  uint64_t bytes = 0;
  for (const auto& [name, value] : inputs) bytes += name.size() + value.size();
  if (bytes > lim.max_input_bytes)
    throw ProgramError("inputs: " + num(bytes) + " bytes (names and values), limit " +
                       num(uint64_t{lim.max_input_bytes}));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::string& name = inputs[i].first;
    if (!valid_name(name))
      throw ProgramError("inputs: name " + in_quotes(name) + " is not a valid name (" + kNameRule +
                         ")");
    for (std::size_t k = 0; k < i; ++k)
      if (inputs[k].first == name)
        throw ProgramError("inputs: name " + in_quotes(name) + " is given twice");
  }
}

}  // namespace

Program parse(std::string_view steps_json, std::vector<std::pair<std::string, std::string>> inputs,
              const GenDefaults& defaults, const Limits& limits) {
  if (nested_deeper(steps_json, kMaxJsonDepth))
    throw ProgramError("program: arrays and maps nested more than " + num(uint64_t{kMaxJsonDepth}) +
                       " deep");
  json arr;
  try {
    arr = json::parse(steps_json);
  } catch (const json::exception& e) {
    throw ProgramError(std::string("program: not valid JSON: ") + e.what());
  }
  if (!arr.is_array())
    throw ProgramError("program: the steps must be an array of step maps, got " + type_of(arr));
  if (arr.empty()) throw ProgramError("program: no steps (an empty program does nothing)");
  check_inputs(inputs, limits);
  const uint64_t total = count_steps(arr, 0, limits);
  if (total > limits.max_steps)
    throw ProgramError("program has " + num(total) + " steps, limit " +
                       num(uint64_t{limits.max_steps}));

  Program p;
  p.defaults = defaults;
  Scope top;
  for (const auto& [name, value] : inputs) top.names.emplace(name, Scope::Kind::input);
  p.inputs = std::move(inputs);
  Parser parser(p, defaults, limits);
  p.steps = parser.steps(arr, "", top, 0);
  return p;
}

}  // namespace sy::programs
