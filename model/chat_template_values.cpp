// The values of the chat-template interpreter: marked strings and Python-like printing (str,
// repr, JSON), equality and ordering, and the string helpers the built-ins share.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/chat_template_internal.hpp"

namespace sy::chat::detail {

[[noreturn]] void fail(int line, const std::string& what) {
  throw TemplateError("chat template line " + std::to_string(line) + ": " + what);
}

namespace {

// Nesting of values walked recursively (printing, JSON, comparing): a namespace can be made to
// hold itself, and the walk must end in an error instead of a stack overflow.
constexpr int kMaxValueDepth = 100;
thread_local int value_depth = 0;
struct DepthGuard {
  DepthGuard() {
    if (++value_depth > kMaxValueDepth) {
      value_depth = 0;
      throw TemplateError("chat template: values nested deeper than " +
                          std::to_string(kMaxValueDepth));
    }
  }
  ~DepthGuard() {
    if (value_depth > 0) --value_depth;
  }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;
};

}  // namespace

Value of_dict(Dict d) {
  Value v;
  v.k = K::Dict;
  v.dict = std::make_shared<Dict>(std::move(d));
  return v;
}

const char* kind_name(const Value& v) {
  switch (v.k) {
    case K::Undef:
      return "undefined";
    case K::None:
      return "none";
    case K::Bool:
      return "boolean";
    case K::Int:
      return "integer";
    case K::Float:
      return "float";
    case K::Str:
      return "string";
    case K::List:
      return "list";
    case K::Dict:
      return "dict";
    case K::Func:
      return "function";
  }
  return "value";
}

bool truthy(const Value& v) {
  switch (v.k) {
    case K::Undef:
    case K::None:
      return false;
    case K::Bool:
      return v.b;
    case K::Int:
      return v.i != 0;
    case K::Float:
      return v.f != 0;
    case K::Str:
      return !v.str.s.empty();
    case K::List:
      return !v.list->empty();
    case K::Dict:
      return !v.dict->items.empty();
    case K::Func:
      return true;
  }
  return false;
}

namespace {

// Python's repr() of a float: the shortest digits that read back the same, in fixed notation for
// exponents in [-4, 16), else as d.ddde+XX.
std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string m(buf);
  const bool neg = m[0] == '-';
  if (neg) m.erase(0, 1);
  const std::size_t e = m.find('e');
  const int exp = std::atoi(m.c_str() + e + 1);
  std::string digits;
  for (std::size_t i = 0; i < e; ++i)
    if (m[i] != '.') digits += m[i];
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      std::string ip = digits.substr(0, std::min<std::size_t>(digits.size(), exp + 1));
      while (ip.size() < static_cast<std::size_t>(exp + 1)) ip += '0';
      std::string fp =
          digits.size() > static_cast<std::size_t>(exp + 1) ? digits.substr(exp + 1) : "0";
      out = ip + "." + fp;
    } else {
      out = "0." + std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    // append, not "." + substr: GCC 12 at -O3 reports a false -Wrestrict in the latter here
    if (digits.size() > 1) out.append(".").append(digits, 1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return neg ? "-" + out : out;
}

std::string py_repr_str(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == q)
      out += std::string("\\") + static_cast<char>(q);
    else if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else
      out += static_cast<char>(c);
  }
  return out + q;
}

// Python's repr() of a value inside a list or dict; strings keep their marks.
Str repr(const Value& v) {
  const DepthGuard guard;
  if (v.k == K::Str) return Str::marked(py_repr_str(v.str.s), v.str.any());
  if (v.k == K::Undef) return Str::clean("Undefined");
  return to_str(v);
}

}  // namespace

// Python's str() of a value as Jinja prints it.
Str to_str(const Value& v) {
  const DepthGuard guard;
  switch (v.k) {
    case K::Undef:
      return {};
    case K::None:
      return Str::clean("None");
    case K::Bool:
      return Str::clean(v.b ? "True" : "False");
    case K::Int:
      return Str::clean(std::to_string(v.i));
    case K::Float:
      return Str::clean(float_repr(v.f));
    case K::Str:
      return v.str;
    case K::List: {
      Str out = Str::clean("[");
      for (std::size_t i = 0; i < v.list->size(); ++i) {
        if (i) out.append(Str::clean(", "));
        out.append(repr((*v.list)[i]));
      }
      out.append(Str::clean("]"));
      return out;
    }
    case K::Dict: {
      Str out = Str::clean("{");
      bool first = true;
      for (const auto& kv : v.dict->items) {
        if (!first) out.append(Str::clean(", "));
        first = false;
        out.append(Str::clean(py_repr_str(kv.first)));
        out.append(Str::clean(": "));
        out.append(repr(kv.second));
      }
      out.append(Str::clean("}"));
      return out;
    }
    case K::Func:
      return Str::clean("<function " + v.fn + ">");
  }
  return {};
}

bool equal(const Value& a, const Value& b) {
  const DepthGuard guard;
  if (a.is_num() && b.is_num()) return a.num() == b.num();
  if (a.k != b.k) return false;
  switch (a.k) {
    case K::Undef:
    case K::None:
      return true;
    case K::Str:
      return a.str.s == b.str.s;
    case K::List:
      if (a.list->size() != b.list->size()) return false;
      for (std::size_t i = 0; i < a.list->size(); ++i)
        if (!equal((*a.list)[i], (*b.list)[i])) return false;
      return true;
    case K::Dict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& kv : a.dict->items) {
        const Value* o = b.dict->find(kv.first);
        if (!o || !equal(kv.second, *o)) return false;
      }
      return true;
    case K::Func:
      return a.fn == b.fn;
    default:
      return false;
  }
}

// -1, 0, 1 for a < b, a == b, a > b; throws for values Python cannot order.
int compare(const Value& a, const Value& b, int line) {
  const DepthGuard guard;
  if (a.is_num() && b.is_num()) return a.num() < b.num() ? -1 : a.num() > b.num() ? 1 : 0;
  if (a.k == K::Str && b.k == K::Str) return a.str.s < b.str.s ? -1 : a.str.s > b.str.s ? 1 : 0;
  if (a.k == K::List && b.k == K::List) {
    const std::size_t n = std::min(a.list->size(), b.list->size());
    for (std::size_t i = 0; i < n; ++i)
      if (int c = compare((*a.list)[i], (*b.list)[i], line)) return c;
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  fail(line, std::string("cannot order ") + kind_name(a) + " and " + kind_name(b));
}

// Byte offsets of the UTF-8 code points of s (and s.size() at the end).
std::vector<std::size_t> code_points(const std::string& s) {
  std::vector<std::size_t> at;
  for (std::size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) at.push_back(i);
  at.push_back(s.size());
  return at;
}

bool is_space(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

Str strip(const Str& s, bool left, bool right, const std::string* chars) {
  auto drop = [&](unsigned char c) {
    return chars ? chars->find(static_cast<char>(c)) != std::string::npos : is_space(c);
  };
  std::size_t b = 0, e = s.s.size();
  if (left)
    while (b < e && drop(static_cast<unsigned char>(s.s[b]))) ++b;
  if (right)
    while (e > b && drop(static_cast<unsigned char>(s.s[e - 1]))) --e;
  return s.sub(b, e - b);
}

// ASCII case mapping, one byte for one, so the marks stay in place.
// Letters other than ASCII keep their case (Python would map them too).
Str map_case(const Str& s, int mode) {  // 0 lower, 1 upper, 2 capitalize, 3 title
  Str r = s;
  bool word_start = true;
  for (std::size_t i = 0; i < r.s.size(); ++i) {
    char& c = r.s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    bool up = mode == 1 || (mode == 2 && i == 0) || (mode == 3 && word_start);
    if (alpha) c = up ? static_cast<char>(std::toupper(c)) : static_cast<char>(std::tolower(c));
    // Jinja's title starts a word after whitespace and after any of - ( { [ <.
    if (mode == 3)
      word_start = is_space(static_cast<unsigned char>(c)) || c == '-' || c == '(' || c == '{' ||
                   c == '[' || c == '<';
  }
  return r;
}

Str replace(const Str& s, const Str& from, const Str& to, int64_t count) {
  if (from.s.empty()) return s;
  Str out;
  std::size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const std::size_t at = s.s.find(from.s, pos);
    if (at == std::string::npos) break;
    out.append(s.sub(pos, at - pos));
    out.append(to);
    pos = at + from.s.size();
    ++done;
  }
  out.append(s.sub(pos, std::string::npos));
  return out;
}

namespace {

// JSON text as Hugging Face's tojson writes it (json.dumps with ensure_ascii=False): ", " and
// ": " separators, keys in their order.
void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    if (c == '"')
      out += "\\\"";
    else if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\b')
      out += "\\b";
    else if (c == '\f')
      out += "\\f";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    } else
      out += static_cast<char>(c);
  }
  out += '"';
}

}  // namespace

void to_json(const Value& v, int indent, int level, std::string& out, bool& marked, int line) {
  const DepthGuard guard;
  if (out.size() > kMaxStringBytes) fail(line, "tojson output too large");
  auto newline = [&](int lvl) {
    // append, not "\n" + std::string: GCC 12 at -O3 reports a false -Wrestrict in the latter
    if (indent > 0) out.append("\n").append(static_cast<std::size_t>(indent * lvl), ' ');
  };
  switch (v.k) {
    case K::Undef:
    case K::None:
      out += "null";
      return;
    case K::Bool:
      out += v.b ? "true" : "false";
      return;
    case K::Int:
      out += std::to_string(v.i);
      return;
    case K::Float:
      out += float_repr(v.f);
      return;
    case K::Str:
      marked = marked || v.str.any();
      json_string(v.str.s, out);
      return;
    case K::List: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += indent > 0 ? "," : ", ";
        newline(level + 1);
        to_json((*v.list)[i], indent, level + 1, out, marked, line);
      }
      newline(level);
      out += ']';
      return;
    }
    case K::Dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& kv : v.dict->items) {
        if (!first) out += indent > 0 ? "," : ", ";
        first = false;
        newline(level + 1);
        json_string(kv.first, out);
        out += ": ";
        to_json(kv.second, indent, level + 1, out, marked, line);
      }
      newline(level);
      out += '}';
      return;
    }
    case K::Func:
      fail(line, "cannot write a function as JSON");
  }
}

}  // namespace sy::chat::detail
