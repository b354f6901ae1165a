// The chat-template built-ins: tests (`is ...`), filters (`| ...`), the str and dict methods and
// the global functions (range, namespace, dict, raise_exception).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "model/chat_template_internal.hpp"

namespace sy::chat::detail {

// The parser checks filter and test names against the lists that run_filter and run_test know,
// so that a template with an unknown one fails when it is loaded, not when a branch first runs.
void check_filter_name(const std::string& name, int line) {
  static const char* kFilters[] = {
      "trim",       "strip",      "length", "count", "upper",  "lower",   "capitalize", "title",
      "default",    "d",          "first",  "last",  "join",   "string",  "int",        "float",
      "list",       "replace",    "tojson", "safe",  "items",  "reverse", "abs",        "round",
      "selectattr", "rejectattr", "map",    "e",     "escape", "unique",  "sort",       "dictsort",
      "indent",     "wordcount",  "sum",    "min",   "max",    "select",  "reject",     "attr"};
  for (const char* f : kFilters)
    if (name == f) return;
  fail(line, "unknown filter '" + name + "'");
}

void check_test_name(const std::string& name, int line) {
  static const char* kTests[] = {
      "defined", "undefined", "none",     "string",      "number",      "integer",
      "float",   "boolean",   "mapping",  "iterable",    "sequence",    "true",
      "false",   "even",      "odd",      "divisibleby", "eq",          "equalto",
      "==",      "!=",        "ne",       "lt",          "le",          "gt",
      "ge",      "<",         "<=",       ">",           ">=",          "in",
      "lower",   "upper",     "callable", "sameas",      "greaterthan", "lessthan"};
  for (const char* t : kTests)
    if (name == t) return;
  fail(line, "unknown test '" + name + "'");
}

namespace {

Str need_str(const Value* v, int line, const char* what) {
  if (!v || v->k != K::Str) fail(line, std::string(what) + " must be a string");
  return v->str;
}

}  // namespace

bool run_test(const std::string& name, const Value& v, const Args& a, int line) {
  auto arg = [&](std::size_t i) -> const Value& {
    const Value* x = a.get(i, "");
    if (!x) fail(line, "test '" + name + "' needs an argument");
    return *x;
  };
  if (name == "defined") return v.k != K::Undef;
  if (name == "undefined") return v.k == K::Undef;
  if (name == "none") return v.k == K::None;
  if (name == "string") return v.k == K::Str;
  if (name == "number") return v.k == K::Int || v.k == K::Float;
  if (name == "integer") return v.k == K::Int;
  if (name == "float") return v.k == K::Float;
  if (name == "boolean") return v.k == K::Bool;
  if (name == "mapping") return v.k == K::Dict;
  if (name == "iterable") return v.k == K::List || v.k == K::Dict || v.k == K::Str;
  if (name == "sequence") return v.k == K::List || v.k == K::Dict || v.k == K::Str;
  if (name == "callable") return v.k == K::Func;
  if (name == "true") return v.k == K::Bool && v.b;
  if (name == "false") return v.k == K::Bool && !v.b;
  if (name == "even" || name == "odd") {
    if (v.k != K::Int) fail(line, "test '" + name + "' needs an integer");
    return (v.i % 2 == 0) == (name == "even");
  }
  if (name == "divisibleby") {
    const int64_t d = arg(0).as_int();
    if (d == 0) fail(line, "division by zero");
    if (d == -1) return true;  // and INT64_MIN % -1 would trap
    return v.as_int() % d == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==" || name == "sameas")
    return equal(v, arg(0));
  if (name == "ne" || name == "!=") return !equal(v, arg(0));
  if (name == "lt" || name == "<" || name == "lessthan") return compare(v, arg(0), line) < 0;
  if (name == "le" || name == "<=") return compare(v, arg(0), line) <= 0;
  if (name == "gt" || name == ">" || name == "greaterthan") return compare(v, arg(0), line) > 0;
  if (name == "ge" || name == ">=") return compare(v, arg(0), line) >= 0;
  if (name == "in") return contains(arg(0), v, line);
  if (name == "lower" || name == "upper") {
    if (v.k != K::Str) return false;
    return map_case(v.str, name == "upper" ? 1 : 0).s == v.str.s;
  }
  fail(line, "unknown test '" + name + "'");
}

namespace {

Value attribute_of(const Value& v, const std::string& path) {
  Value cur = v;
  std::size_t b = 0;
  while (b <= path.size()) {
    const std::size_t e = std::min(path.find('.', b), path.size());
    const std::string part = path.substr(b, e - b);
    if (cur.k == K::Dict) {
      const Value* x = cur.dict->find(part);
      cur = x ? *x : Value{};
    } else if (cur.k == K::List && !part.empty() && part.size() < 10 &&
               part.find_first_not_of("0123456789") == std::string::npos) {
      cur = get_item(cur, Value::integer(std::strtoll(part.c_str(), nullptr, 10)), 0);
    } else {
      return {};
    }
    b = e + 1;
  }
  return cur;
}

}  // namespace

Value run_filter(const std::string& name, const Value& v, const Args& a, int line) {
  auto arg = [&](std::size_t i, std::string_view kw) { return a.get(i, kw); };
  if (name == "trim" || name == "strip") {
    const Value* chars = arg(0, "chars");
    std::string cs;
    if (chars && chars->k == K::Str) cs = chars->str.s;
    return Value::string(strip(to_str(v), true, true, chars && chars->k == K::Str ? &cs : nullptr));
  }
  if (name == "length" || name == "count") {
    switch (v.k) {
      case K::Str:
        return Value::integer(static_cast<int64_t>(code_points(v.str.s).size() - 1));
      case K::List:
        return Value::integer(static_cast<int64_t>(v.list->size()));
      case K::Dict:
        return Value::integer(static_cast<int64_t>(v.dict->items.size()));
      case K::Undef:
        return Value::integer(0);
      default:
        fail(line, std::string("a ") + kind_name(v) + " has no length");
    }
  }
  if (name == "upper") return Value::string(map_case(to_str(v), 1));
  if (name == "lower") return Value::string(map_case(to_str(v), 0));
  if (name == "capitalize") return Value::string(map_case(map_case(to_str(v), 0), 2));
  if (name == "title") return Value::string(map_case(to_str(v), 3));
  if (name == "default" || name == "d") {
    const Value* d = arg(0, "default_value");
    const Value* boolean = arg(1, "boolean");
    const bool use = v.k == K::Undef || (boolean && truthy(*boolean) && !truthy(v));
    return use ? (d ? *d : Value::text("")) : v;
  }
  if (name == "first" || name == "last") {
    List l = iterate(v, line);
    if (l.empty()) return {};
    return name == "first" ? l.front() : l.back();
  }
  if (name == "join") {
    const Value* sep = arg(0, "d");
    const Value* attr = arg(1, "attribute");
    Str out;
    bool first = true;
    for (const Value& x : iterate(v, line)) {
      if (!first && sep) out.append(to_str(*sep));
      first = false;
      out.append(to_str(attr ? attribute_of(x, to_str(*attr).s) : x));
    }
    return Value::string(std::move(out));
  }
  if (name == "string" || name == "safe" || name == "e" || name == "escape") {
    if (name == "e" || name == "escape") {
      const Str s = to_str(v);
      Str out;
      for (std::size_t i = 0; i < s.s.size(); ++i) {
        const char ch = s.s[i];
        const char* rep = ch == '&'    ? "&amp;"
                          : ch == '<'  ? "&lt;"
                          : ch == '>'  ? "&gt;"
                          : ch == '"'  ? "&#34;"
                          : ch == '\'' ? "&#39;"
                                       : nullptr;
        out.append(rep ? Str::marked(rep, s.t[i]) : s.sub(i, 1));
      }
      return Value::string(std::move(out));
    }
    return v.k == K::Str && name == "safe" ? v : Value::string(to_str(v));
  }
  if (name == "int") {
    if (v.k == K::Str) {
      const std::string t = strip(v.str, true, true).s;
      char* end = nullptr;
      const long long x = std::strtoll(t.c_str(), &end, 10);
      if (!t.empty() && end && *end == 0) return Value::integer(x);
      const double d = std::strtod(t.c_str(), &end);
      if (!t.empty() && end && *end == 0) return Value::integer(Value::trunc(d));
      const Value* d0 = arg(0, "default");
      return d0 ? *d0 : Value::integer(0);
    }
    if (v.is_num()) return Value::integer(v.as_int());
    return Value::integer(0);
  }
  if (name == "float") {
    if (v.k == K::Str) {
      const std::string t = strip(v.str, true, true).s;
      char* end = nullptr;
      const double d = std::strtod(t.c_str(), &end);
      if (!t.empty() && end && *end == 0) return Value::real(d);
      return Value::real(0);
    }
    return Value::real(v.is_num() ? v.num() : 0);
  }
  if (name == "list") return Value::of_list(iterate(v, line));
  if (name == "replace") {
    const Value* from = arg(0, "old");
    const Value* to = arg(1, "new");
    const Value* count = arg(2, "count");
    return Value::string(replace(to_str(v), need_str(from, line, "replace's first argument"),
                                 need_str(to, line, "replace's second argument"),
                                 count && count->k != K::None ? count->as_int() : -1));
  }
  if (name == "tojson") {
    const Value* indent = arg(0, "indent");
    std::string out;
    bool marked = false;
    to_json(v, indent && indent->is_num() ? static_cast<int>(indent->as_int()) : 0, 0, out, marked,
            line);
    return Value::string(Str::marked(std::move(out), marked));
  }
  if (name == "items") {
    if (v.k == K::Undef) return Value::of_list({});
    if (v.k != K::Dict) fail(line, "filter 'items' needs a dict");
    List l;
    for (const auto& kv : v.dict->items)
      l.push_back(Value::of_list({Value::text(kv.first), kv.second}));
    return Value::of_list(std::move(l));
  }
  if (name == "reverse") {
    if (v.k == K::Str) {
      const Value step = Value::integer(-1);
      return slice(v, nullptr, nullptr, &step, line);
    }
    List l = iterate(v, line);
    std::reverse(l.begin(), l.end());
    return Value::of_list(std::move(l));
  }
  if (name == "abs") {
    if (v.k == K::Int && v.i == std::numeric_limits<int64_t>::min())
      fail(line, "integer overflow in abs");
    if (v.k == K::Int) return Value::integer(v.i < 0 ? -v.i : v.i);
    if (v.is_num()) return Value::real(std::fabs(v.num()));
    fail(line, "filter 'abs' needs a number");
  }
  if (name == "round") {
    const Value* prec = arg(0, "precision");
    const Value* method = arg(1, "method");
    const double p = std::pow(10.0, prec ? prec->num() : 0.0);
    const std::string m = method ? to_str(*method).s : "common";
    double x = v.num() * p;
    x = m == "floor" ? std::floor(x) : m == "ceil" ? std::ceil(x) : std::round(x);
    return Value::real(x / p);
  }
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep = name == "selectattr" || name == "select";
    List out;
    for (const Value& x : iterate(v, line)) {
      const Value subject =
          by_attr ? attribute_of(x, to_str(a.pos.empty() ? Value{} : a.pos[0]).s) : x;
      const std::size_t t = by_attr ? 1 : 0;
      bool ok;
      if (a.pos.size() > t) {
        const std::string test = to_str(a.pos[t]).s;
        check_test_name(test, line);
        Args rest;
        rest.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(t + 1), a.pos.end());
        ok = run_test(test, subject, rest, line);
      } else {
        ok = truthy(subject);
      }
      if (ok == keep) out.push_back(x);
    }
    return Value::of_list(std::move(out));
  }
  if (name == "map") {
    const Value* attr = arg(99, "attribute");
    List out;
    for (const Value& x : iterate(v, line)) {
      if (attr) {
        Value r = attribute_of(x, to_str(*attr).s);
        const Value* d = arg(99, "default");
        out.push_back(r.k == K::Undef && d ? *d : r);
      } else if (!a.pos.empty()) {
        const std::string f = to_str(a.pos[0]).s;
        check_filter_name(f, line);
        Args rest;
        rest.pos.assign(a.pos.begin() + 1, a.pos.end());
        out.push_back(run_filter(f, x, rest, line));
      } else {
        fail(line, "filter 'map' needs a filter name or attribute=");
      }
    }
    return Value::of_list(std::move(out));
  }
  if (name == "unique") {
    List out;
    for (const Value& x : iterate(v, line)) {
      bool seen = false;
      for (const Value& y : out) seen = seen || equal(x, y);
      if (!seen) out.push_back(x);
    }
    return Value::of_list(std::move(out));
  }
  if (name == "sort" || name == "dictsort") {
    List l = name == "dictsort" ? *run_filter("items", v, {}, line).list : iterate(v, line);
    const Value* rev = arg(0, "reverse");
    const Value* attr = arg(2, "attribute");
    std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
      const Value kx = attr ? attribute_of(x, to_str(*attr).s) : x;
      const Value ky = attr ? attribute_of(y, to_str(*attr).s) : y;
      return compare(kx, ky, line) < 0;
    });
    if (rev && truthy(*rev) && name == "sort") std::reverse(l.begin(), l.end());
    return Value::of_list(std::move(l));
  }
  if (name == "sum" || name == "min" || name == "max") {
    List l = iterate(v, line);
    if (name == "sum") {
      Value acc = Value::integer(0);
      for (const Value& x : l) acc = arith("+", acc, x, line);
      return acc;
    }
    if (l.empty()) return {};
    Value best = l[0];
    for (const Value& x : l) {
      const int c = compare(x, best, line);
      if ((name == "min" && c < 0) || (name == "max" && c > 0)) best = x;
    }
    return best;
  }
  if (name == "indent") {
    const Value* width = arg(0, "width");
    const Value* first = arg(1, "first");
    const Value* blank = arg(2, "blank");
    // 1024 columns: more is no indentation but a way to blow up memory.
    const int64_t w = width ? width->as_int() : 4;
    if (w < 0 || w > 1024) fail(line, "indent width " + std::to_string(w) + " out of [0, 1024]");
    const std::string pad(static_cast<std::size_t>(w), ' ');
    const Str s = to_str(v);
    Str out;
    bool line_start = first && truthy(*first);
    for (std::size_t i = 0; i < s.s.size(); ++i) {
      if (line_start && (s.s[i] != '\n' || (blank && truthy(*blank)))) out.append(Str::clean(pad));
      out.append(s.sub(i, 1));
      line_start = s.s[i] == '\n';
    }
    return Value::string(std::move(out));
  }
  if (name == "wordcount") {
    const Str s = to_str(v);
    int64_t n = 0;
    bool in = false;
    for (char ch : s.s) {
      const bool sp = is_space(static_cast<unsigned char>(ch));
      if (!sp && !in) ++n;
      in = !sp;
    }
    return Value::integer(n);
  }
  if (name == "attr") {
    const Value* nm = arg(0, "name");
    return nm ? attribute_of(v, to_str(*nm).s) : Value{};
  }
  fail(line, "filter '" + name + "' is not supported");
}

Value call_method(const Value& obj, const std::string& m, const Args& a, int line) {
  if (obj.k == K::Str) {
    const Str& s = obj.str;
    if (m == "strip" || m == "lstrip" || m == "rstrip") {
      const Value* chars = a.get(0, "chars");
      std::string cs;
      const bool has = chars && chars->k == K::Str;
      if (has) cs = chars->str.s;
      return Value::string(strip(s, m != "rstrip", m != "lstrip", has ? &cs : nullptr));
    }
    if (m == "upper") return Value::string(map_case(s, 1));
    if (m == "lower") return Value::string(map_case(s, 0));
    if (m == "title") return Value::string(map_case(s, 3));
    if (m == "capitalize") return Value::string(map_case(map_case(s, 0), 2));
    if (m == "startswith" || m == "endswith") {
      const Value* p = a.get(0, "prefix");
      if (!p) fail(line, m + " needs an argument");
      List options = p->k == K::List ? *p->list : List{*p};
      for (const Value& o : options) {
        if (o.k != K::Str) fail(line, m + " needs a string");
        const std::string& x = o.str.s;
        if (m == "startswith"
                ? s.s.rfind(x, 0) == 0
                : s.s.size() >= x.size() && s.s.compare(s.s.size() - x.size(), x.size(), x) == 0)
          return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (m == "split" || m == "rsplit") {
      const Value* sep = a.get(0, "sep");
      const Value* maxv = a.get(1, "maxsplit");
      int64_t maxsplit = maxv ? maxv->as_int() : -1;
      List out;
      if (!sep || sep->k == K::None) {
        std::size_t i = 0;
        int64_t n = 0;
        while (i < s.s.size()) {
          while (i < s.s.size() && is_space(static_cast<unsigned char>(s.s[i]))) ++i;
          if (i >= s.s.size()) break;
          if (maxsplit >= 0 && n >= maxsplit) {
            out.push_back(Value::string(strip(s.sub(i, std::string::npos), false, true)));
            break;
          }
          std::size_t j = i;
          while (j < s.s.size() && !is_space(static_cast<unsigned char>(s.s[j]))) ++j;
          out.push_back(Value::string(s.sub(i, j - i)));
          ++n;
          i = j;
        }
        return Value::of_list(std::move(out));
      }
      const std::string d = need_str(sep, line, "split's separator").s;
      if (d.empty()) fail(line, "empty separator");
      std::size_t pos = 0;
      int64_t n = 0;
      for (;;) {
        const std::size_t at = s.s.find(d, pos);
        if (at == std::string::npos || (maxsplit >= 0 && n >= maxsplit)) break;
        out.push_back(Value::string(s.sub(pos, at - pos)));
        pos = at + d.size();
        ++n;
      }
      out.push_back(Value::string(s.sub(pos, std::string::npos)));
      return Value::of_list(std::move(out));
    }
    if (m == "replace") {
      const Value* c = a.get(2, "count");
      return Value::string(replace(s, need_str(a.get(0, "old"), line, "replace's argument"),
                                   need_str(a.get(1, "new"), line, "replace's argument"),
                                   c ? c->as_int() : -1));
    }
    if (m == "join") {
      Str out;
      bool first = true;
      const Value* seq = a.get(0, "iterable");
      if (!seq) fail(line, "join needs an argument");
      for (const Value& x : iterate(*seq, line)) {
        if (!first) out.append(s);
        first = false;
        out.append(to_str(x));
      }
      return Value::string(std::move(out));
    }
    if (m == "find") {
      const std::size_t at = s.s.find(need_str(a.get(0, "sub"), line, "find's argument").s);
      return Value::integer(at == std::string::npos ? -1 : static_cast<int64_t>(at));
    }
  }
  if (obj.k == K::Dict) {
    const Dict& d = *obj.dict;
    if (m == "items") return run_filter("items", obj, {}, line);
    if (m == "keys") {
      List l;
      for (const auto& kv : d.items) l.push_back(Value::text(kv.first));
      return Value::of_list(std::move(l));
    }
    if (m == "values") {
      List l;
      for (const auto& kv : d.items) l.push_back(kv.second);
      return Value::of_list(std::move(l));
    }
    if (m == "get") {
      const Value* k = a.get(0, "key");
      if (!k) fail(line, "get needs a key");
      Value r = get_item(obj, *k, line);
      if (r.k == K::Undef) {
        const Value* def = a.get(1, "default");
        return def ? *def : Value::none();
      }
      return r;
    }
  }
  fail(line, "a " + std::string(kind_name(obj)) + " has no method '" + m + "' here");
}

Value call_global(const std::string& fn, const Args& a, int line) {
  if (fn == "raise_exception") {
    const Value* msg = a.get(0, "message");
    throw TemplateRaised(msg ? to_str(*msg).s : std::string("raise_exception"));
  }
  if (fn == "range") {
    int64_t start = 0, stop = 0, step = 1;
    if (a.pos.size() == 1) {
      stop = a.pos[0].as_int();
    } else if (a.pos.size() >= 2) {
      start = a.pos[0].as_int();
      stop = a.pos[1].as_int();
      if (a.pos.size() >= 3) step = a.pos[2].as_int();
    } else {
      fail(line, "range needs an argument");
    }
    if (step == 0) fail(line, "range step cannot be zero");
    List l;
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      if (l.size() >= kMaxSteps) fail(line, "range too large");
      l.push_back(Value::integer(i));
      if (__builtin_add_overflow(i, step, &i)) break;
    }
    return Value::of_list(std::move(l));
  }
  if (fn == "namespace" || fn == "dict") {
    Dict d;
    d.is_namespace = fn == "namespace";
    for (const auto& kv : a.kw) d.set(kv.first, kv.second);
    return of_dict(std::move(d));
  }
  fail(line, "unknown function '" + fn + "'");
}

}  // namespace sy::chat::detail
