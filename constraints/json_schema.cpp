// JSON Schema converted to GBNF: the JSON texts that validate against a schema, for the subset of
// JSON Schema that structured output uses (docs/protocol.md lists what is refused and why).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "constraints/convert.hpp"
#include "constraints/gbnf_text.hpp"

namespace sy::constraints {
namespace {

using detail::alt;
using detail::cls;
using detail::epsilon;
using detail::is_nothing;
using detail::kUnbounded;
using detail::lit;
using detail::NodeP;
using detail::nothing;
using detail::opt;
using detail::Ranges;
using detail::rep;
using detail::seq;
using detail::star;

using Json = nlohmann::ordered_json;  // keeps `properties` in the order the schema wrote them

constexpr int kMaxDepth = 100;             // nested subschemas converted inline (the stack)
constexpr int kMaxJsonDepth = 512;         // nesting of the schema document itself
constexpr std::size_t kKeyRuleEvery = 32;  // trie levels of an extra-key rule before a new rule

const std::set<std::string, std::less<>> kAnnotations = {
    "title",    "description", "$schema",   "$id",        "default", "examples",
    "$comment", "readOnly",    "writeOnly", "deprecated", "$defs",   "definitions"};

// The keywords converted, by the type they constrain (uniqueItems: only `false`).
// clang-format off
const std::set<std::string, std::less<>> kSupported = {
    "type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",                       // any
    "properties", "required", "additionalProperties",                                 // objects
    "items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems",  // arrays
    "minLength", "maxLength", "pattern", "format",                                    // strings
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};                    // numbers
// clang-format on

const std::vector<std::string> kTypes = {"object",  "array",   "string", "number",
                                         "integer", "boolean", "null"};

// The primitive rules, named as the JSON grammar names its parts.
const std::vector<std::string> kPrimitives = {"ws",      "esc-u",   "char", "string",    "number",
                                              "integer", "boolean", "null", "value",     "object",
                                              "array",   "date",    "time", "date-time", "uuid"};

std::string pointer_token(std::string_view key) {
  std::string out;
  for (const char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

std::string where(const std::string& ptr) {
  return ptr.empty() ? "(root)" : ptr;
}

[[noreturn]] void fail(const std::string& what) {
  throw ConstraintError("json_schema: " + what);
}

// A keyword's value, its JSON pointer and the pointer of the schema object that holds it.
struct Kw {
  const Json* v = nullptr;
  std::string ptr;
  std::string part;
};

// One schema with the parts that allOf and a $ref beside other keywords merge into it; every
// keyword keeps the pointer it came from, for messages.
struct View {
  std::string ptr;
  bool never = false;  // a `false` schema among the parts
  std::map<std::string, Kw> kw;
  std::vector<std::pair<std::string, Kw>> props;  // `properties`, in order
  std::set<std::string> props_parts;              // the parts that have `properties`
  std::vector<std::string> required;
  std::optional<std::set<std::string>> types;
  std::set<std::string> merging;  // the $ref targets being merged (a cycle through them stops)

  bool constrained() const {
    return never || !kw.empty() || !props_parts.empty() || !required.empty() || types;
  }
  const Kw* find(const std::string& k) const {
    auto it = kw.find(k);
    return it == kw.end() ? nullptr : &it->second;
  }
};

// Whether a JSON value has the JSON Schema type `t`.
bool has_type(const Json& v, const std::string& t) {
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (v.is_number_integer()) return true;
  return v.is_number_float() && std::floor(v.get<double>()) == v.get<double>();
}

// The nesting depth of a JSON document, counted without recursion.
int json_depth(const Json& root) {
  int deepest = 0;
  std::vector<std::pair<const Json*, int>> todo{{&root, 1}};
  while (!todo.empty()) {
    auto [j, d] = todo.back();
    todo.pop_back();
    deepest = std::max(deepest, d);
    if (deepest > kMaxJsonDepth) break;
    if (j->is_structured())
      for (const auto& x : *j) todo.emplace_back(&x, d + 1);
  }
  return deepest;
}

std::string percent_decode(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// A JSON string's characters spelled as JSON writes them shortest (nlohmann's dump): the spelling
// an extra-key trie compares against.
std::vector<std::string> json_chars(const std::string& s) {
  std::vector<std::string> out;
  const std::string dumped = Json(s).dump();  // "..." with escapes
  for (std::size_t i = 1; i + 1 < dumped.size();) {
    std::size_t n = 1;
    if (dumped[i] == '\\') {
      n = dumped[i + 1] == 'u' ? 6 : 2;
    } else {
      uint32_t cp = 0;
      std::size_t j = i;
      detail::next_code_point(dumped, j, cp);
      n = j - i;
    }
    out.push_back(dumped.substr(i, n));
    i += n;
  }
  return out;
}

// The decimal digit strings of [a, b] (both of one length): digit by digit, each position a
// class where the bounds leave it free.
NodeP same_length_range(const std::string& a, const std::string& b) {
  if (a.empty()) return epsilon();
  if (a == b) return lit(a);
  const std::string ar = a.substr(1), br = b.substr(1);
  if (a[0] == b[0]) return seq({lit(a.substr(0, 1)), same_length_range(ar, br)});
  const std::size_t rest = ar.size();
  const NodeP digit = cls({{'0', '9'}});
  std::vector<NodeP> options;
  char low = a[0], high = b[0];
  if (ar.find_first_not_of('0') != std::string::npos) {
    options.push_back(seq({lit(a.substr(0, 1)), same_length_range(ar, std::string(rest, '9'))}));
    ++low;
  }
  NodeP top;
  if (br.find_first_not_of('9') != std::string::npos) {
    top = seq({lit(b.substr(0, 1)), same_length_range(std::string(rest, '0'), br)});
    --high;
  }
  if (low <= high)
    options.push_back(seq({cls({{static_cast<uint32_t>(low), static_cast<uint32_t>(high)}}),
                           rep(digit, static_cast<uint32_t>(rest), static_cast<uint32_t>(rest))}));
  if (top) options.push_back(top);
  return alt(std::move(options));
}

// Unsigned decimal integers (no leading zeros) in [lo, hi], hi absent for no upper bound.
NodeP uint_range(int64_t lo, std::optional<int64_t> hi) {
  if (hi && lo > *hi) return nothing();
  const std::string a = std::to_string(lo);
  std::vector<NodeP> options;
  if (!hi) {
    options.push_back(same_length_range(a, std::string(a.size(), '9')));
    options.push_back(seq(
        {cls({{'1', '9'}}), rep(cls({{'0', '9'}}), static_cast<uint32_t>(a.size()), kUnbounded)}));
    return alt(std::move(options));
  }
  const std::string b = std::to_string(*hi);
  for (std::size_t len = a.size(); len <= b.size(); ++len) {
    const std::string from = len == a.size() ? a : "1" + std::string(len - 1, '0');
    const std::string to = len == b.size() ? b : std::string(len, '9');
    options.push_back(same_length_range(from, to));
  }
  return alt(std::move(options));
}

struct Bound {
  int64_t v = 0;
  bool excl = false;
};

class SchemaConverter {
 public:
  SchemaConverter(const Json& root, const Limits& lim) : root_(root), lim_(lim) {
    for (const auto& p : kPrimitives) rules_.fresh(p);
  }

  std::string run() {
    rules_.define("root", convert(root_, "", 0));
    while (!pending_.empty()) {
      const auto [name, ptr] = pending_.front();
      pending_.pop_front();
      rules_.define(name, convert(root_.at(Json::json_pointer(ptr)), ptr, 0));
    }
    return rules_.finish(lim_, "json_schema", "no JSON value validates against the schema",
                         [this](const std::string& rule) {
                           auto it = ref_of_rule_.find(rule);
                           const std::string what =
                               it == ref_of_rule_.end() ? "rule " + rule : "#" + it->second;
                           return "$ref cycle through " + what +
                                  " that reaches itself before any text (left recursion) is not "
                                  "supported";
                         });
  }

 private:
  // ---- Primitive rules ----

  NodeP prim(const std::string& name) {
    auto it = prims_.find(name);
    if (it != prims_.end()) return it->second;
    // Every primitive but ws may be reached again while its body is built (value, object).
    if (name != "ws") prims_[name] = detail::ref(name);
    NodeP body;
    const NodeP none;
    // The fixed grammars are not the user's: the default limits hold them.
    auto re = [&](std::string_view r) { return detail::regex_node(r, Limits{}, none); };
    if (name == "ws") {
      body = re("( |\\n[ \\t]{0,20})?");
    } else if (name == "esc-u") {  // \u escapes: surrogates only as a high-low pair
      body =
          re("u([0-9a-cA-CeEfF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}|"
             "[dD][89abAB][0-9a-fA-F]{2}\\\\u[dD][c-fC-F][0-9a-fA-F]{2})");
    } else if (name == "char") {
      body = alt({cls(detail::complement({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}})),
                  seq({lit("\\"), alt({re("[\"\\\\/bfnrt]"), prim("esc-u")})})});
    } else if (name == "string") {
      body = seq({lit("\""), star(prim("char")), lit("\"")});
    } else if (name == "number") {
      body = re("-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][-+]?[0-9]+)?");
    } else if (name == "integer") {
      body = re("-?(0|[1-9][0-9]*)");
    } else if (name == "boolean") {
      body = alt({lit("true"), lit("false")});
    } else if (name == "null") {
      body = lit("null");
    } else if (name == "value") {
      body = alt({prim("object"), prim("array"), prim("string"), prim("number"), prim("boolean"),
                  prim("null")});
    } else if (name == "object") {
      const NodeP kv = seq({prim("string"), ws(), lit(":"), ws(), prim("value")});
      body = seq({lit("{"), ws(), opt(seq({kv, star(seq({sep(), kv})), ws()})), lit("}")});
    } else if (name == "array") {
      const NodeP v = prim("value");
      body = seq({lit("["), ws(), opt(seq({v, star(seq({sep(), v})), ws()})), lit("]")});
    } else if (name == "date") {  // day numbers by month; 29 February in any year
      body = re(
          "[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|"
          "02-(0[1-9]|[12][0-9]))");
    } else if (name == "time") {  // RFC 3339 full-time: the offset is required
      body = re(
          "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?([zZ]|[-+]([01][0-9]|2[0-3]):"
          "[0-5][0-9])");
    } else if (name == "date-time") {
      body = seq({prim("date"), cls({{'T', 'T'}, {'t', 't'}}), prim("time")});
    } else if (name == "uuid") {
      body = re("[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}");
    } else {
      throw std::logic_error("json_schema: no primitive " + name);
    }
    rules_.define(name, body);
    return prims_[name] = detail::ref(name, body->nullable ? body : nullptr);
  }

  NodeP ws() { return prim("ws"); }
  NodeP sep() { return seq({ws(), lit(","), ws()}); }

  // ---- Schemas ----

  void check_keywords(const Json& s, const std::string& ptr) {
    for (const auto& [k, v] : s.items()) {
      if (kAnnotations.count(k)) continue;
      if (!kSupported.count(k) || (k == "uniqueItems" && v != Json(false)))
        fail("keyword \"" + k + "\" at " + where(ptr) + " is not supported");
    }
  }

  static bool only_ref(const Json& s) {
    for (const auto& [k, v] : s.items())
      if (k != "$ref" && !kAnnotations.count(k)) return false;
    return true;
  }

  // The pointer (without '#') of a local $ref's target.
  std::string ref_target(const Json& r, const std::string& at) {
    if (!r.is_string()) fail("$ref at " + where(at) + " must be a string");
    const std::string uri = r.get<std::string>();
    if (uri != "#" && uri.rfind("#/", 0) != 0)
      fail("$ref \"" + uri + "\" at " + where(at) +
           " is not supported: only local references (#/...) are");
    const std::string p = percent_decode(std::string_view(uri).substr(1));
    try {
      (void)root_.at(Json::json_pointer(p));
    } catch (const nlohmann::json::exception&) {
      fail("$ref \"" + uri + "\" at " + where(at) + " points to nothing in the schema");
    }
    return p;
  }

  NodeP ref_to(const Json& r, const std::string& at) {
    const std::string p = ref_target(r, at);
    auto it = rule_of_ref_.find(p);
    if (it == rule_of_ref_.end()) {
      const std::size_t slash = p.rfind('/');
      std::string hint = slash == std::string::npos ? "schema" : p.substr(slash + 1);
      const std::string name = rules_.fresh(hint.empty() ? "schema" : hint);
      it = rule_of_ref_.emplace(p, name).first;
      ref_of_rule_[name] = p;
      pending_.emplace_back(name, p);
    }
    return detail::ref(it->second);  // a JSON value is never empty: the rule is not nullable
  }

  NodeP convert(const Json& s, const std::string& ptr, int depth) {
    if (depth > kMaxDepth)
      fail("subschemas nested deeper than " + std::to_string(kMaxDepth) + " at " + where(ptr));
    if (s.is_boolean()) return s.get<bool>() ? prim("value") : nothing();
    if (!s.is_object()) fail("the schema at " + where(ptr) + " must be an object or a boolean");
    check_keywords(s, ptr);
    // A $ref alone stays a rule reference: that is how recursive schemas terminate.
    if (s.contains("$ref") && only_ref(s)) return ref_to(s["$ref"], ptr + "/$ref");
    View v;
    v.ptr = ptr;
    add_part(v, s, ptr, depth);
    return convert_view(v, depth);
  }

  static std::set<std::string> type_set(const Json& t, const std::string& at) {
    std::set<std::string> out;
    auto add = [&](const Json& name) {
      if (!name.is_string() ||
          std::find(kTypes.begin(), kTypes.end(), name.get<std::string>()) == kTypes.end())
        fail("type at " + at + " must be a JSON Schema type name or a list of them");
      out.insert(name.get<std::string>());
    };
    if (t.is_array()) {
      for (const auto& x : t) add(x);
    } else {
      add(t);
    }
    return out;
  }

  // Merges schema `s` (at `ptr`) into `v`: its keywords, its $ref target and its allOf parts.
  void add_part(View& v, const Json& s, const std::string& ptr, int depth) {
    if (depth > kMaxDepth)
      fail("subschemas nested deeper than " + std::to_string(kMaxDepth) + " at " + where(ptr));
    if (s.is_boolean()) {
      if (!s.get<bool>()) v.never = true;
      return;
    }
    if (!s.is_object()) fail("the schema at " + where(ptr) + " must be an object or a boolean");
    check_keywords(s, ptr);
    for (const auto& [k, val] : s.items()) {
      if (kAnnotations.count(k) || k == "$ref" || k == "allOf" || k == "uniqueItems") continue;
      const std::string kp = ptr + "/" + pointer_token(k);
      if (k == "properties") {
        if (!val.is_object()) fail("properties at " + kp + " must be an object");
        v.props_parts.insert(ptr);
        for (const auto& [name, sub] : val.items()) {
          const std::string sp = kp + "/" + pointer_token(name);
          auto it = std::find_if(v.props.begin(), v.props.end(),
                                 [&](const auto& p) { return p.first == name; });
          if (it == v.props.end())
            v.props.emplace_back(name, Kw{&sub, sp, ptr});
          else if (*it->second.v != sub)
            fail("property \"" + name + "\" at " + sp + " differs from the one at " +
                 it->second.ptr + " (allOf parts are merged) and is not supported");
        }
      } else if (k == "required") {
        if (!val.is_array()) fail("required at " + kp + " must be a list of names");
        for (const auto& n : val) {
          if (!n.is_string()) fail("required at " + kp + " must be a list of names");
          const auto name = n.get<std::string>();
          if (std::find(v.required.begin(), v.required.end(), name) == v.required.end())
            v.required.push_back(name);
        }
      } else if (k == "type") {
        const auto t = type_set(val, kp);
        if (!v.types) {
          v.types = t;
          continue;
        }
        std::set<std::string> both;
        for (const auto& x : *v.types)
          if (t.count(x) || (x == "integer" && t.count("number"))) both.insert(x);
        if (t.count("integer") && v.types->count("number")) both.insert("integer");
        v.types = both;
      } else {
        auto it = v.kw.find(k);
        if (it == v.kw.end())
          v.kw.emplace(k, Kw{&val, kp, ptr});
        else if (*it->second.v != val)
          fail("keyword \"" + k + "\" at " + kp + " differs from the one at " + it->second.ptr +
               " (allOf and $ref beside other keywords merge their parts) and is not supported");
      }
    }
    if (s.contains("$ref")) {
      const std::string target = ref_target(s["$ref"], ptr + "/$ref");
      if (!v.merging.insert(target).second)
        fail("$ref at " + ptr + "/$ref merges a schema that contains it (a cycle through " +
             "allOf or a $ref beside other keywords) and is not supported");
      add_part(v, root_.at(Json::json_pointer(target)), target, depth + 1);
      v.merging.erase(target);
    }
    if (s.contains("allOf")) {
      const Json& all = s["allOf"];
      const std::string ap = ptr + "/allOf";
      if (!all.is_array() || all.empty()) fail("allOf at " + ap + " must be a non-empty list");
      for (std::size_t i = 0; i < all.size(); ++i)
        add_part(v, all[i], ap + "/" + std::to_string(i), depth + 1);
    }
  }

  NodeP convert_view(const View& v, int depth) {
    if (v.never) return nothing();
    if (const Kw* ap = v.find("additionalProperties"))
      for (const auto& part : v.props_parts)
        if (part != ap->part)
          fail("additionalProperties at " + ap->ptr + " and properties at " + where(part) +
               " from different allOf parts are not supported");
    if (const Kw* items = v.find("items"))
      for (const char* other : {"prefixItems", "additionalItems"})
        if (const Kw* o = v.find(other); o && o->part != items->part)
          fail(std::string(other) + " at " + o->ptr + " and items at " + items->ptr +
               " from different allOf parts are not supported");

    const Kw* any = v.find("anyOf");
    const Kw* one = v.find("oneOf");
    if (any && one) fail("anyOf beside oneOf at " + where(one->part) + " is not supported");
    if (any || one) {
      // oneOf is taken as anyOf: a text valid against several branches is accepted.
      const Kw& list = any ? *any : *one;
      const std::string key = any ? "anyOf" : "oneOf";
      if (!list.v->is_array() || list.v->empty())
        fail(key + " at " + list.ptr + " must be a non-empty list");
      View rest = v;
      rest.kw.erase(key);
      std::vector<NodeP> options;
      for (std::size_t i = 0; i < list.v->size(); ++i) {
        const std::string bp = list.ptr + "/" + std::to_string(i);
        if (!rest.constrained()) {
          options.push_back(convert((*list.v)[i], bp, depth + 1));
        } else {  // the keywords beside anyOf hold in every branch
          View b = rest;
          add_part(b, (*list.v)[i], bp, depth + 1);
          options.push_back(convert_view(b, depth + 1));
        }
      }
      return alt(std::move(options));
    }

    const Kw* en = v.find("enum");
    const Kw* co = v.find("const");
    if (en || co) return enum_node(v, en, co);

    if (!v.constrained()) return prim("value");
    const std::set<std::string> types =
        v.types ? *v.types : std::set<std::string>(kTypes.begin(), kTypes.end());
    std::vector<NodeP> options;
    if (types.count("object")) options.push_back(object_node(v, depth));
    if (types.count("array")) options.push_back(array_node(v, depth));
    if (types.count("string")) options.push_back(string_node(v));
    if (types.count("number")) {
      options.push_back(number_node(v, false));
    } else if (types.count("integer")) {
      options.push_back(number_node(v, true));
    }
    if (types.count("boolean")) options.push_back(prim("boolean"));
    if (types.count("null")) options.push_back(prim("null"));
    return alt(std::move(options));
  }

  // ---- enum and const ----

  NodeP enum_node(const View& v, const Kw* en, const Kw* co) {
    for (const auto& [k, kw] : v.kw)
      if (k != "enum" && k != "const")
        fail("keyword \"" + k + "\" beside enum or const at " + where(kw.part) +
             " is not supported");
    if (!v.props_parts.empty() || !v.required.empty())
      fail("properties or required beside enum or const at " + where(v.ptr) + " is not supported");
    if (en && !en->v->is_array()) fail("enum at " + en->ptr + " must be a list");
    std::vector<const Json*> values;
    if (co) {
      if (!en || std::find(en->v->begin(), en->v->end(), *co->v) != en->v->end())
        values.push_back(co->v);
    } else {
      for (const auto& x : *en->v) values.push_back(&x);
    }
    std::vector<NodeP> options;
    for (const Json* x : values) {
      bool typed = !v.types;
      for (const auto& t : v.types ? *v.types : std::set<std::string>{})
        typed = typed || has_type(*x, t);
      if (typed) options.push_back(const_node(*x));
    }
    return alt(std::move(options));
  }

  // Exactly one JSON value, as nlohmann writes its scalars, with the bounded whitespace between
  // the tokens of arrays and objects (keys in the order written).
  NodeP const_node(const Json& x) {
    if (x.is_object() || x.is_array()) {
      std::vector<NodeP> members;
      if (x.is_object()) {
        for (const auto& [k, val] : x.items())
          members.push_back(seq({lit(Json(k).dump()), ws(), lit(":"), ws(), const_node(val)}));
      } else {
        for (const auto& val : x) members.push_back(const_node(val));
      }
      std::vector<NodeP> parts{lit(x.is_object() ? "{" : "["), ws()};
      for (std::size_t i = 0; i < members.size(); ++i) {
        if (i) parts.push_back(sep());
        parts.push_back(members[i]);
      }
      if (!members.empty()) parts.push_back(ws());
      parts.push_back(lit(x.is_object() ? "}" : "]"));
      return seq(std::move(parts));
    }
    return lit(x.dump());
  }

  // ---- Strings ----

  // A count keyword's value: a non-negative integer, within lim.max_elements.
  uint32_t count(const Kw& kw, const std::string& name) {
    const Json& x = *kw.v;
    const bool integral = x.is_number_integer() ||
                          (x.is_number_float() && std::floor(x.get<double>()) == x.get<double>());
    if (!integral || x.get<double>() < 0)
      fail(name + " at " + kw.ptr + " must be a non-negative integer");
    if (x.get<double>() > static_cast<double>(lim_.max_elements))
      fail(name + " " + x.dump() + " at " + kw.ptr +
           " is over the limit max_elements=" + std::to_string(lim_.max_elements));
    return static_cast<uint32_t>(x.get<double>());
  }

  NodeP string_node(const View& v) {
    const Kw* format = v.find("format");
    const Kw* pattern = v.find("pattern");
    const Kw* min = v.find("minLength");
    const Kw* max = v.find("maxLength");
    const NodeP quote = lit("\"");
    if (format) {
      if (!format->v->is_string()) fail("format at " + format->ptr + " must be a string");
      if (pattern || min || max)
        fail("format beside pattern, minLength or maxLength at " + where(format->part) +
             " is not supported");
      const auto f = format->v->get<std::string>();
      if (f != "date" && f != "time" && f != "date-time" && f != "uuid")
        fail("format \"" + f + "\" at " + where(format->part) + " is not supported");
      return seq({quote, prim(f), quote});
    }
    if (pattern) {
      if (!pattern->v->is_string()) fail("pattern at " + pattern->ptr + " must be a string");
      if (min || max)
        fail("pattern beside minLength or maxLength at " + where(pattern->part) +
             " is not supported");
      NodeP body;
      try {
        body = detail::regex_node(pattern->v->get<std::string>(), lim_, prim("char"));
      } catch (const ConstraintError& e) {
        fail("pattern at " + pattern->ptr + ": " + e.what());
      }
      return seq({quote, body, quote});
    }
    if (!min && !max) return prim("string");
    const uint32_t lo = min ? count(*min, "minLength") : 0;
    const uint32_t hi = max ? count(*max, "maxLength") : kUnbounded;
    return seq({quote, rep(prim("char"), lo, hi), quote});
  }

  // ---- Numbers ----

  // A bound's value as an integer: rounded toward the inside for integers (`up` for lower
  // bounds); numbers take integer bounds only.
  int64_t bound_value(const Kw& kw, const std::string& name, bool integer, bool up) {
    const Json& x = *kw.v;
    if (!x.is_number()) fail(name + " at " + kw.ptr + " must be a number");
    constexpr double kMax = 1e18;
    if (x.is_number_unsigned()) {
      if (x.get<uint64_t>() > static_cast<uint64_t>(kMax))
        fail(name + " " + x.dump() + " at " + kw.ptr +
             " is outside [-1e18, 1e18] and is not supported");
      return static_cast<int64_t>(x.get<uint64_t>());
    }
    if (x.is_number_integer()) {
      const auto i = x.get<int64_t>();
      if (i < -static_cast<int64_t>(kMax) || i > static_cast<int64_t>(kMax))
        fail(name + " " + x.dump() + " at " + kw.ptr +
             " is outside [-1e18, 1e18] and is not supported");
      return i;
    }
    const double d = x.get<double>();
    if (!(std::fabs(d) <= kMax))
      fail(name + " " + x.dump() + " at " + kw.ptr +
           " is outside [-1e18, 1e18] and is not supported");
    if (std::floor(d) != d && !integer)
      fail(name + " " + x.dump() + " at " + kw.ptr +
           " is not supported: bounds on numbers must be integers");
    return static_cast<int64_t>(up ? std::ceil(d) : std::floor(d));
  }

  NodeP number_node(const View& v, bool integer) {
    std::optional<Bound> lo, hi;
    auto tighten = [](std::optional<Bound>& b, Bound nb, bool lower) {
      if (!b || (lower ? nb.v > b->v : nb.v < b->v) || (nb.v == b->v && nb.excl)) b = nb;
    };
    const Kw* min = v.find("minimum");
    const Kw* max = v.find("maximum");
    const Kw* xmin = v.find("exclusiveMinimum");
    const Kw* xmax = v.find("exclusiveMaximum");
    // Draft 4 wrote exclusiveMinimum/Maximum as a flag on minimum/maximum.
    const bool min_flag = xmin && xmin->v->is_boolean() && xmin->v->get<bool>();
    const bool max_flag = xmax && xmax->v->is_boolean() && xmax->v->get<bool>();
    if (min) tighten(lo, {bound_value(*min, "minimum", integer, !min_flag), min_flag}, true);
    if (max) tighten(hi, {bound_value(*max, "maximum", integer, max_flag), max_flag}, false);
    if (xmin && !xmin->v->is_boolean())
      tighten(lo, {bound_value(*xmin, "exclusiveMinimum", integer, false), true}, true);
    if (xmax && !xmax->v->is_boolean())
      tighten(hi, {bound_value(*xmax, "exclusiveMaximum", integer, true), true}, false);
    if (!lo && !hi) return prim(integer ? "integer" : "number");

    if (integer) {  // inclusive integer bounds
      std::optional<int64_t> a, b;
      if (lo) a = lo->v + (lo->excl ? 1 : 0);
      if (hi) b = hi->v - (hi->excl ? 1 : 0);
      if (a && b && *a > *b) return nothing();
      std::vector<NodeP> options;
      if (!b || *b >= 0) options.push_back(uint_range(a ? std::max<int64_t>(*a, 0) : 0, b));
      if (!a || *a <= 0)  // "-0" is zero, as JSON reads it
        options.push_back(
            seq({lit("-"), uint_range(b && *b < 0 ? -*b : 0,
                                      a ? std::optional<int64_t>(-*a) : std::nullopt)}));
      return alt(std::move(options));
    }

    if (lo && hi && (lo->v > hi->v || (lo->v == hi->v && (lo->excl || hi->excl)))) return nothing();
    // Sign and magnitude M = I.F (no exponent): bounds on the value become bounds on M.
    std::vector<NodeP> options;
    {  // no sign: value = M
      Bound mlo{0, false};
      if (lo && lo->v >= 0) mlo = *lo;
      if (!(hi && (hi->v < 0 || (hi->v == 0 && hi->excl)))) options.push_back(magnitude(mlo, hi));
    }
    {  // "-": value = -M
      const bool possible = !(lo && (lo->v > 0 || (lo->v == 0 && lo->excl)));
      if (possible) {
        std::optional<Bound> mhi;
        if (lo) mhi = Bound{-lo->v, lo->excl};
        Bound mlo{0, false};
        if (hi && hi->v < 0) mlo = Bound{-hi->v, hi->excl};
        if (hi && hi->v == 0 && hi->excl) mlo = Bound{0, true};
        options.push_back(seq({lit("-"), magnitude(mlo, mhi)}));
      }
    }
    return alt(std::move(options));
  }

  // Non-negative decimals I or I.F (I without leading zeros) between the bounds: M ≥ a is I ≥ a;
  // M > a is I > a, or I = a with a non-zero fraction; M ≤ b is I < b, or I = b with a zero one.
  NodeP magnitude(Bound lo, std::optional<Bound> hi) {
    const NodeP digit = cls({{'0', '9'}});
    const NodeP any_fraction = opt(seq({lit("."), rep(digit, 1, kUnbounded)}));
    const NodeP zero_fraction = opt(seq({lit("."), rep(lit("0"), 1, kUnbounded)}));
    const NodeP some_fraction = seq({lit("."), star(lit("0")), cls({{'1', '9'}}), star(digit)});
    std::vector<NodeP> options;
    const int64_t first = lo.excl ? lo.v + 1 : lo.v;
    if (!hi || first <= hi->v - 1)
      options.push_back(
          seq({uint_range(first, hi ? std::optional<int64_t>(hi->v - 1) : std::nullopt),
               any_fraction}));
    if (lo.excl && (!hi || lo.v < hi->v))
      options.push_back(seq({lit(std::to_string(lo.v)), some_fraction}));
    if (hi && !hi->excl && (lo.excl ? hi->v > lo.v : hi->v >= lo.v))
      options.push_back(seq({lit(std::to_string(hi->v)), zero_fraction}));
    return alt(std::move(options));
  }

  // ---- Objects ----

  // A JSON object key (with its quotes) other than `names` as JSON spells them shortest: a trie
  // of the names, where leaving it (or ending early) frees the rest of the key.
  NodeP key_except(const std::vector<std::string>& names) {
    if (names.empty()) return prim("string");
    struct Trie {
      bool terminal = false;
      std::size_t depth = 0;
      std::vector<std::pair<std::string, std::size_t>> kids;
    };
    std::vector<Trie> trie(1);
    for (const auto& name : names) {
      std::size_t at = 0;
      for (const auto& c : json_chars(name)) {
        auto it = std::find_if(trie[at].kids.begin(), trie[at].kids.end(),
                               [&](const auto& k) { return k.first == c; });
        if (it == trie[at].kids.end()) {
          trie.push_back({false, trie[at].depth + 1, {}});
          trie[at].kids.emplace_back(c, trie.size() - 1);
          at = trie.size() - 1;
        } else {
          at = it->second;
        }
      }
      trie[at].terminal = true;
    }
    static const Ranges kRaw = detail::complement({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
    static const Ranges kEscapes = [] {  // the letters after `\` of JSON's short escapes
      Ranges r;
      for (const char c : std::string_view("\"\\/bfnrt")) r.emplace_back(c, c);
      return detail::normalize(r);
    }();
    const NodeP rest = seq({star(prim("char")), lit("\"")});
    // Children come after their parents in `trie`: built from the back, without recursion.
    std::vector<NodeP> node(trie.size());
    for (std::size_t i = trie.size(); i-- > 0;) {
      std::vector<NodeP> options;
      if (!trie[i].terminal) options.push_back(lit("\""));
      Ranges raw_taken, esc_taken;
      for (const auto& [c, k] : trie[i].kids) {
        options.push_back(seq({lit(c), node[k]}));
        if (c[0] != '\\') {
          std::size_t j = 0;
          uint32_t cp = 0;
          detail::next_code_point(c, j, cp);
          raw_taken.emplace_back(cp, cp);
        } else if (c.size() == 2) {
          esc_taken.emplace_back(static_cast<unsigned char>(c[1]),
                                 static_cast<unsigned char>(c[1]));
        }
      }
      // \u spellings always leave the trie: a name spelled with them is not caught.
      const NodeP other =
          raw_taken.empty() && esc_taken.empty()
              ? prim("char")
              : alt({cls(detail::subtract(kRaw, detail::normalize(raw_taken))),
                     seq({lit("\\"),
                          alt({cls(detail::subtract(kEscapes, detail::normalize(esc_taken))),
                               prim("esc-u")})})});
      options.push_back(seq({other, rest}));
      node[i] = alt(std::move(options));
      if (trie[i].depth % kKeyRuleEvery == 0 && i != 0) {  // bounded nesting in the text
        const std::string name = rules_.fresh("key");
        rules_.define(name, node[i]);
        node[i] = detail::ref(name);
      }
    }
    return seq({lit("\""), node[0]});
  }

  static std::string hint_of(const std::string& ptr) {
    const std::size_t slash = ptr.rfind('/');
    const std::string last = slash == std::string::npos ? "" : ptr.substr(slash + 1);
    return last.empty() ? "obj" : last;
  }

  NodeP object_node(const View& v, int depth) {
    const Kw* ap = v.find("additionalProperties");
    NodeP extra_value = prim("value");  // absent or true: any other key, any value
    if (ap) {
      if (!ap->v->is_boolean() && !ap->v->is_object())
        fail("additionalProperties at " + ap->ptr + " must be a schema");
      extra_value = convert(*ap->v, ap->ptr, depth + 1);
    }
    struct Prop {
      std::string name;
      NodeP value;
      bool required;
    };
    std::vector<Prop> props;
    std::vector<std::string> names;
    auto is_required = [&](const std::string& n) {
      return std::find(v.required.begin(), v.required.end(), n) != v.required.end();
    };
    for (const auto& [name, kw] : v.props) {
      props.push_back({name, convert(*kw.v, kw.ptr, depth + 1), is_required(name)});
      names.push_back(name);
    }
    for (const auto& name : v.required)  // required but not in properties: additionalProperties
      if (std::find(names.begin(), names.end(), name) == names.end()) {
        props.push_back({name, extra_value, true});
        names.push_back(name);
      }

    std::vector<NodeP> kv;
    std::vector<bool> req;
    for (const auto& p : props) {
      if (is_nothing(p.value)) {
        if (p.required) return nothing();
        continue;  // a property whose schema is false must be absent
      }
      kv.push_back(seq({lit(Json(p.name).dump()), ws(), lit(":"), ws(), p.value}));
      req.push_back(p.required);
    }
    // An extra member may come first and again after it; where several members may come first,
    // each of them also appears in two places: rules keep the text linear.
    const std::string hint = hint_of(v.ptr);
    const NodeP extra =
        is_nothing(extra_value)
            ? nothing()
            : rules_.share(seq({key_except(names), ws(), lit(":"), ws(), extra_value}),
                           hint + "-extra-kv");
    const auto first_required = std::find(req.begin(), req.end(), true);
    const bool shared = first_required - req.begin() + (first_required == req.end() ? 1 : 0) > 1;
    if (shared)
      for (auto& x : kv) x = rules_.share(x, hint + "-kv");

    // The members in `properties` order, extra keys after them; tail[i]: the members after
    // member i-1 is written, each with its comma.
    const std::size_t n = kv.size();
    std::vector<NodeP> tail(n + 1);
    tail[n] = star(seq({sep(), extra}));
    for (std::size_t i = n; i-- > 0;) {
      const NodeP item = seq({sep(), kv[i]});
      tail[i] = seq({req[i] ? item : opt(item), tail[i + 1]});
      if (shared && i > 0) tail[i] = rules_.share(tail[i], hint + "-rest");
    }
    std::vector<NodeP> first;  // by the first member written
    bool any_required = false;
    for (std::size_t j = 0; j < n && !any_required; ++j) {
      any_required = req[j];
      first.push_back(seq({kv[j], tail[j + 1]}));
    }
    if (!any_required) first.push_back(seq({extra, tail[n]}));
    const NodeP members = alt(std::move(first));
    if (any_required) return seq({lit("{"), ws(), members, ws(), lit("}")});
    return seq({lit("{"), ws(), opt(seq({members, ws()})), lit("}")});
  }

  // ---- Arrays ----

  NodeP array_node(const View& v, int depth) {
    const Kw* items = v.find("items");
    const Kw* prefix = v.find("prefixItems");
    const Kw* additional = v.find("additionalItems");
    std::vector<std::pair<const Json*, std::string>> pre;
    const Kw* rest = nullptr;  // nullptr: any value
    auto take = [&](const Kw& list) {
      for (std::size_t i = 0; i < list.v->size(); ++i)
        pre.emplace_back(&(*list.v)[i], list.ptr + "/" + std::to_string(i));
    };
    if (prefix) {
      if (!prefix->v->is_array()) fail("prefixItems at " + prefix->ptr + " must be a list");
      if (items && items->v->is_array())
        fail("items as a list beside prefixItems at " + items->ptr + " is not supported");
      take(*prefix);
      rest = items;
    } else if (items && items->v->is_array()) {  // draft 4-2019 tuples
      take(*items);
      rest = additional;
    } else {
      rest = items;
    }
    const uint32_t min = v.find("minItems") ? count(*v.find("minItems"), "minItems") : 0;
    const uint32_t max = v.find("maxItems") ? count(*v.find("maxItems"), "maxItems") : kUnbounded;
    if (min > max) return nothing();
    const std::size_t k = pre.size();
    const NodeP r = rules_.share(rest ? convert(*rest->v, rest->ptr, depth + 1) : prim("value"),
                                 hint_of(v.ptr) + "-item");

    // Items j+1.. after item j (1-based) is written.
    std::vector<NodeP> after(k + 2);
    {
      const uint32_t a = min > k ? static_cast<uint32_t>(min - k) : 0;
      const uint32_t b =
          max == kUnbounded ? kUnbounded : (max > k ? static_cast<uint32_t>(max - k) : 0);
      after[k + 1] = k == 0 ? epsilon() : rep(seq({sep(), r}), a, b);
    }
    for (std::size_t j = k; j >= 2; --j) {
      if (j > max) {
        after[j] = epsilon();
        continue;
      }
      const NodeP item =
          seq({sep(), convert(*pre[j - 1].first, pre[j - 1].second, depth + 1), after[j + 1]});
      after[j] = j > min ? opt(item) : item;
    }
    NodeP nonempty;  // the items when there is at least one
    if (max == 0) {
      nonempty = nothing();
    } else if (k == 0) {
      nonempty = seq({r, rep(seq({sep(), r}), min > 0 ? min - 1 : 0,
                             max == kUnbounded ? kUnbounded : max - 1)});
    } else {
      nonempty = seq({convert(*pre[0].first, pre[0].second, depth + 1), after[2]});
    }
    if (min > 0) return seq({lit("["), ws(), nonempty, ws(), lit("]")});
    return seq({lit("["), ws(), opt(seq({nonempty, ws()})), lit("]")});
  }

  const Json& root_;
  const Limits& lim_;
  detail::RuleSet rules_;
  std::map<std::string, NodeP> prims_;
  std::map<std::string, std::string> rule_of_ref_;  // target pointer -> rule
  std::map<std::string, std::string> ref_of_rule_;
  std::deque<std::pair<std::string, std::string>> pending_;  // $ref rules still to convert
};

}  // namespace

std::string json_schema_to_gbnf(std::string_view schema_json, const Limits& lim) {
  if (schema_json.size() > lim.max_source_bytes)
    throw ConstraintError(
        "json_schema: the schema has " + std::to_string(schema_json.size()) +
        " bytes, over the limit max_source_bytes=" + std::to_string(lim.max_source_bytes));
  Json root;
  try {
    root = Json::parse(schema_json);
  } catch (const nlohmann::json::parse_error& e) {
    std::string what = e.what();
    if (const auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    fail("the schema is not valid JSON: " + what);
  }
  if (json_depth(root) > kMaxJsonDepth)
    fail("the schema nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  // A $ref beside other keywords copies its target each time: the budget bounds what that costs.
  const detail::TreeBudget budget("json_schema", lim);
  return SchemaConverter(root, lim).run();
}

}  // namespace sy::constraints
