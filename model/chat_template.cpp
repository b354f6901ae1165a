// A Jinja2-subset interpreter for chat templates (see chat_template.hpp for the language), with
// every output byte marked as coming from the template or from message data, so that control
// tokens are parsed only in the template's own text.
#include "model/chat_template.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "model/tokenizer.hpp"
#include "model/unicode_cats.hpp"

namespace sy::chat {
namespace {

// Statements and loop iterations one render may execute: a real template over a thousand
// messages takes a few tens of thousands, so this stops only runaway loops (in about a second).
constexpr std::size_t kMaxSteps = 1'000'000;
// Nesting of expressions and blocks the parser accepts: real templates nest under 20; the bound
// keeps a hostile template from overflowing the stack.
constexpr int kMaxDepth = 200;

[[noreturn]] void fail(int line, const std::string& what) {
  throw TemplateError("chat template line " + std::to_string(line) + ": " + what);
}

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

// Longest string one value may hold: twice the output limit leaves room for strings that are
// cut down before they are written, and stops a template that doubles a string in a loop.
constexpr std::size_t kMaxStringBytes = std::size_t{32} << 20;

// ---- values --------------------------------------------------------------------------------

// A string with one flag per byte: 1 where the byte came from message data.
struct Str {
  std::string s;
  std::vector<uint8_t> t;

  static Str clean(std::string x) {
    Str r;
    r.t.assign(x.size(), 0);
    r.s = std::move(x);
    return r;
  }
  static Str marked(std::string x, bool from_messages) {
    Str r;
    r.t.assign(x.size(), from_messages ? 1 : 0);
    r.s = std::move(x);
    return r;
  }
  bool any() const { return std::find(t.begin(), t.end(), 1) != t.end(); }
  void append(const Str& o) {
    if (s.size() + o.s.size() > kMaxStringBytes)
      throw TemplateError("chat template: a string longer than " + std::to_string(kMaxStringBytes) +
                          " bytes");
    s += o.s;
    t.insert(t.end(), o.t.begin(), o.t.end());
  }
  Str sub(std::size_t pos, std::size_t n) const {
    Str r;
    if (pos > s.size()) pos = s.size();
    n = std::min(n, s.size() - pos);
    r.s = s.substr(pos, n);
    r.t.assign(t.begin() + static_cast<std::ptrdiff_t>(pos),
               t.begin() + static_cast<std::ptrdiff_t>(pos + n));
    return r;
  }
};

struct Dict;
struct Value;
using List = std::vector<Value>;

enum class K { Undef, None, Bool, Int, Float, Str, List, Dict, Func };

struct Value {
  K k = K::Undef;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  Str str;
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::string fn;  // a global function's name

  static Value none() {
    Value v;
    v.k = K::None;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.k = K::Bool;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.k = K::Int;
    v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v;
    v.k = K::Float;
    v.f = x;
    return v;
  }
  static Value string(Str s) {
    Value v;
    v.k = K::Str;
    v.str = std::move(s);
    return v;
  }
  static Value text(std::string s) { return string(Str::clean(std::move(s))); }
  static Value of_list(List l) {
    Value v;
    v.k = K::List;
    v.list = std::make_shared<List>(std::move(l));
    return v;
  }
  static Value func(std::string name) {
    Value v;
    v.k = K::Func;
    v.fn = std::move(name);
    return v;
  }
  bool is_num() const { return k == K::Int || k == K::Float || k == K::Bool; }
  double num() const { return k == K::Float ? f : k == K::Bool ? (b ? 1.0 : 0.0) : double(i); }
  int64_t as_int() const { return k == K::Bool ? (b ? 1 : 0) : k == K::Float ? trunc(f) : i; }
  // Python's int(x) for a float, saturated instead of undefined outside int64 (NaN: 0).
  static int64_t trunc(double x) {
    if (std::isnan(x)) return 0;
    if (x >= 9.2e18) return std::numeric_limits<int64_t>::max();
    if (x <= -9.2e18) return std::numeric_limits<int64_t>::min();
    return static_cast<int64_t>(x);
  }
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;
  const Value* find(std::string_view key) const {
    for (const auto& kv : items)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }
  void set(const std::string& key, Value v) {
    for (auto& kv : items)
      if (kv.first == key) {
        kv.second = std::move(v);
        return;
      }
    items.emplace_back(key, std::move(v));
  }
};

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
    if (digits.size() > 1) out += "." + digits.substr(1);
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

Str to_str(const Value& v);

// Python's repr() of a value inside a list or dict; strings keep their marks.
Str repr(const Value& v) {
  const DepthGuard guard;
  if (v.k == K::Str) return Str::marked(py_repr_str(v.str.s), v.str.any());
  if (v.k == K::Undef) return Str::clean("Undefined");
  return to_str(v);
}

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

Str strip(const Str& s, bool left, bool right, const std::string* chars = nullptr) {
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

void to_json(const Value& v, int indent, int level, std::string& out, bool& marked, int line) {
  const DepthGuard guard;
  if (out.size() > kMaxStringBytes) fail(line, "tojson output too large");
  auto newline = [&](int lvl) {
    if (indent > 0) out += "\n" + std::string(static_cast<std::size_t>(indent * lvl), ' ');
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

// ---- lexing ----------------------------------------------------------------------------------

enum class Tk { Name, String, Int, Float, Op, End };

struct Token {
  Tk kind = Tk::End;
  std::string text;  // name, operator, or the decoded string literal
  int64_t i = 0;
  double f = 0;
};

// Tokens of one tag's inside.
std::vector<Token> lex_expr(std::string_view src, int line) {
  std::vector<Token> out;
  std::size_t i = 0;
  static const char* kOps[] = {"==", "!=", "<=", ">=", "//", "**", "<", ">", "+",
                               "-",  "*",  "/",  "%",  "~",  "|",  ".", ",", ":",
                               "(",  ")",  "[",  "]",  "{",  "}",  "="};
  while (i < src.size()) {
    const char c = src[i];
    if (is_space(static_cast<unsigned char>(c))) {
      ++i;
      continue;
    }
    Token t;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t j = i;
      while (j < src.size() && (std::isalnum(static_cast<unsigned char>(src[j])) || src[j] == '_'))
        ++j;
      t.kind = Tk::Name;
      t.text = std::string(src.substr(i, j - i));
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      std::size_t j = i;
      bool real = false;
      while (j < src.size() && (std::isdigit(static_cast<unsigned char>(src[j])) || src[j] == '_'))
        ++j;
      if (j + 1 < src.size() && src[j] == '.' &&
          std::isdigit(static_cast<unsigned char>(src[j + 1]))) {
        real = true;
        ++j;
        while (j < src.size() && std::isdigit(static_cast<unsigned char>(src[j]))) ++j;
      }
      if (j < src.size() && (src[j] == 'e' || src[j] == 'E')) {
        std::size_t k = j + 1;
        if (k < src.size() && (src[k] == '+' || src[k] == '-')) ++k;
        if (k < src.size() && std::isdigit(static_cast<unsigned char>(src[k]))) {
          real = true;
          j = k;
          while (j < src.size() && std::isdigit(static_cast<unsigned char>(src[j]))) ++j;
        }
      }
      std::string digits;
      for (char d : src.substr(i, j - i))
        if (d != '_') digits += d;
      if (real) {
        t.kind = Tk::Float;
        t.f = std::strtod(digits.c_str(), nullptr);
      } else {
        t.kind = Tk::Int;
        errno = 0;
        t.i = std::strtoll(digits.c_str(), nullptr, 10);
        if (errno == ERANGE) fail(line, "integer literal " + digits + " is too large");
      }
      i = j;
    } else if (c == '\'' || c == '"') {
      std::size_t j = i + 1;
      std::string s;
      while (j < src.size() && src[j] != c) {
        if (src[j] == '\\' && j + 1 < src.size()) {
          const char e = src[j + 1];
          j += 2;
          switch (e) {
            case 'n':
              s += '\n';
              break;
            case 't':
              s += '\t';
              break;
            case 'r':
              s += '\r';
              break;
            case '0':
              s += '\0';
              break;
            case '\\':
            case '\'':
            case '"':
              s += e;
              break;
            case '\n':
              break;
            case 'x':
            case 'u':
            case 'U': {
              const std::size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
              if (j + n > src.size()) fail(line, "truncated escape in a string literal");
              const std::string hex(src.substr(j, n));
              if (hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
                fail(line, "bad escape \\" + std::string(1, e) + hex + " in a string literal");
              append_utf8(s, static_cast<uint32_t>(std::strtoul(hex.c_str(), nullptr, 16)));
              j += n;
              break;
            }
            default:
              s += '\\';
              s += e;
          }
        } else {
          s += src[j++];
        }
      }
      if (j >= src.size()) fail(line, "unterminated string literal");
      t.kind = Tk::String;
      t.text = std::move(s);
      i = j + 1;
    } else {
      bool found = false;
      for (const char* op : kOps) {
        const std::string_view o(op);
        if (src.substr(i, o.size()) == o) {
          t.kind = Tk::Op;
          t.text = std::string(o);
          i += o.size();
          found = true;
          break;
        }
      }
      if (!found) fail(line, std::string("unexpected character '") + c + "'");
    }
    out.push_back(std::move(t));
  }
  out.push_back(Token{});
  return out;
}

// ---- syntax tree ---------------------------------------------------------------------------

struct Node;
using NodeP = std::unique_ptr<Node>;

struct Node {
  enum Kind {
    Lit,
    Var,
    Attr,
    Index,
    Slice,
    Call,
    Filter,
    Test,
    Unary,
    Binary,
    Compare,
    Cond,
    ListLit,
    DictLit
  };
  Kind kind = Lit;
  int line = 0;
  Value lit;
  std::string name;                // variable, attribute, filter, test, operator
  std::vector<NodeP> kids;         // operands (null entries: absent slice parts)
  std::vector<std::string> names;  // keyword names of call/filter arguments; compare operators
  bool negate = false;             // `is not`
};

struct Stmt;
using Body = std::vector<Stmt>;

struct Stmt {
  enum Kind { Text, Out, If, For, Set, SetBlock, Break, Continue };
  Kind kind = Text;
  int line = 0;
  std::string text;
  NodeP expr;                                    // Out, Set value, For iterable
  std::vector<std::pair<NodeP, Body>> branches;  // If: (condition or null for else, body)
  std::vector<std::string> targets;              // For loop variables; Set: name (and attribute)
  NodeP cond;                                    // For: the `if` filter
  Body body, else_body;
};

// ---- parsing -------------------------------------------------------------------------------

class ExprParser {
 public:
  ExprParser(std::vector<Token> toks, int line) : t_(std::move(toks)), line_(line) {}

  const Token& peek(std::size_t ahead = 0) const {
    return t_[std::min(pos_ + ahead, t_.size() - 1)];
  }
  bool at_end() const { return peek().kind == Tk::End; }
  bool is_op(std::string_view op, std::size_t ahead = 0) const {
    return peek(ahead).kind == Tk::Op && peek(ahead).text == op;
  }
  bool is_name(std::string_view n, std::size_t ahead = 0) const {
    return peek(ahead).kind == Tk::Name && peek(ahead).text == n;
  }
  Token next() { return t_[std::min(pos_++, t_.size() - 1)]; }
  void expect_op(std::string_view op) {
    if (!is_op(op)) fail(line_, "expected '" + std::string(op) + "', got " + describe(peek()));
    ++pos_;
  }
  std::string expect_name() {
    if (peek().kind != Tk::Name) fail(line_, "expected a name, got " + describe(peek()));
    return next().text;
  }
  void expect_end() {
    if (!at_end()) fail(line_, "unexpected " + describe(peek()));
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Tk::End:
        return "end of tag";
      case Tk::String:
        return "string literal";
      case Tk::Int:
      case Tk::Float:
        return "number";
      default:
        return "'" + t.text + "'";
    }
  }

  NodeP expression() {  // conditional expression
    Guard g(*this);
    NodeP e = or_expr();
    if (is_name("if")) {
      ++pos_;
      auto n = make(Node::Cond);
      NodeP cond = or_expr();
      NodeP other;
      if (is_name("else")) {
        ++pos_;
        other = expression();
      }
      n->kids.push_back(std::move(e));
      n->kids.push_back(std::move(cond));
      n->kids.push_back(std::move(other));
      return n;
    }
    return e;
  }

  // A comma list without brackets (for tuples in `for a, b in` iterables and `set`).
  NodeP tuple_or_expression() {
    NodeP first = expression();
    if (!is_op(",")) return first;
    auto n = make(Node::ListLit);
    n->kids.push_back(std::move(first));
    while (is_op(",")) {
      ++pos_;
      if (at_end()) break;
      n->kids.push_back(expression());
    }
    return n;
  }

  NodeP or_expr() {
    NodeP l = and_expr();
    while (is_name("or")) {
      ++pos_;
      l = binary("or", std::move(l), and_expr());
    }
    return l;
  }
  NodeP and_expr() {
    NodeP l = not_expr();
    while (is_name("and")) {
      ++pos_;
      l = binary("and", std::move(l), not_expr());
    }
    return l;
  }
  NodeP not_expr() {
    Guard g(*this);
    if (is_name("not")) {
      ++pos_;
      auto n = make(Node::Unary);
      n->name = "not";
      n->kids.push_back(not_expr());
      return n;
    }
    return compare();
  }
  NodeP compare() {
    NodeP first = math1();
    NodeP chain;
    for (;;) {
      std::string op;
      if (peek().kind == Tk::Op &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
           peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        ++pos_;
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        pos_ += 2;
        op = "not in";
      } else {
        break;
      }
      if (!chain) {
        chain = make(Node::Compare);
        chain->kids.push_back(std::move(first));
      }
      chain->names.push_back(op);
      chain->kids.push_back(math1());
    }
    return chain ? std::move(chain) : std::move(first);
  }
  NodeP math1() {
    NodeP l = concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = next().text;
      l = binary(op, std::move(l), concat());
    }
    return l;
  }
  NodeP concat() {
    NodeP l = math2();
    while (is_op("~")) {
      ++pos_;
      l = binary("~", std::move(l), math2());
    }
    return l;
  }
  NodeP math2() {
    NodeP l = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = next().text;
      l = binary(op, std::move(l), power());
    }
    return l;
  }
  NodeP power() {
    NodeP l = unary(true);
    while (is_op("**")) {
      ++pos_;
      l = binary("**", std::move(l), unary(true));
    }
    return l;
  }
  NodeP unary(bool with_filter) {
    Guard g(*this);
    NodeP n;
    if (is_op("-") || is_op("+")) {
      n = make(Node::Unary);
      n->name = next().text;
      n->kids.push_back(unary(false));
    } else {
      n = postfix(primary());
    }
    if (with_filter) n = filters(std::move(n));
    return n;
  }

  NodeP primary() {
    Guard g(*this);
    const Token t = next();
    switch (t.kind) {
      case Tk::Name: {
        if (t.text == "true" || t.text == "True") return lit(Value::boolean(true));
        if (t.text == "false" || t.text == "False") return lit(Value::boolean(false));
        if (t.text == "none" || t.text == "None") return lit(Value::none());
        auto n = make(Node::Var);
        n->name = t.text;
        return n;
      }
      case Tk::String: {
        std::string s = t.text;
        while (peek().kind == Tk::String) s += next().text;  // adjacent literals join
        return lit(Value::text(std::move(s)));
      }
      case Tk::Int:
        return lit(Value::integer(t.i));
      case Tk::Float:
        return lit(Value::real(t.f));
      case Tk::Op:
        if (t.text == "(") {
          if (is_op(")")) {
            ++pos_;
            return make(Node::ListLit);
          }
          NodeP e = expression();
          if (is_op(",")) {
            auto n = make(Node::ListLit);
            n->kids.push_back(std::move(e));
            while (is_op(",")) {
              ++pos_;
              if (is_op(")")) break;
              n->kids.push_back(expression());
            }
            e = std::move(n);
          }
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          auto n = make(Node::ListLit);
          while (!is_op("]")) {
            n->kids.push_back(expression());
            if (!is_op(",")) break;
            ++pos_;
          }
          expect_op("]");
          return n;
        }
        if (t.text == "{") {
          auto n = make(Node::DictLit);
          while (!is_op("}")) {
            n->kids.push_back(expression());
            expect_op(":");
            n->kids.push_back(expression());
            if (!is_op(",")) break;
            ++pos_;
          }
          expect_op("}");
          return n;
        }
        break;
      default:
        break;
    }
    fail(line_, "unexpected " + describe(t) + " in an expression");
  }

  NodeP postfix(NodeP n) {
    for (;;) {
      if (is_op(".")) {
        ++pos_;
        auto a = make(Node::Attr);
        if (peek().kind == Tk::Int) {  // foo.0 is foo[0]
          a->kind = Node::Index;
          a->kids.push_back(std::move(n));
          a->kids.push_back(lit(Value::integer(next().i)));
        } else {
          a->name = expect_name();
          a->kids.push_back(std::move(n));
        }
        n = std::move(a);
      } else if (is_op("[")) {
        ++pos_;
        NodeP parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) parts[k] = expression();
          if (k < 2 && is_op(":")) {
            ++pos_;
            slice = true;
          } else {
            break;
          }
        }
        expect_op("]");
        auto s = make(slice ? Node::Slice : Node::Index);
        s->kids.push_back(std::move(n));
        if (slice) {
          for (auto& p : parts) s->kids.push_back(std::move(p));
        } else {
          if (!parts[0]) fail(line_, "empty subscript");
          s->kids.push_back(std::move(parts[0]));
        }
        n = std::move(s);
      } else if (is_op("(")) {
        auto c = make(Node::Call);
        c->kids.push_back(std::move(n));
        arguments(*c);
        n = std::move(c);
      } else {
        return n;
      }
    }
  }

  // (a, b, key=value) after the opening parenthesis has been seen (it is consumed here).
  void arguments(Node& n) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == Tk::Name && is_op("=", 1)) {
        n.names.push_back(next().text);
        ++pos_;
      } else {
        n.names.emplace_back();
      }
      n.kids.push_back(expression());
      if (!is_op(",")) break;
      ++pos_;
    }
    expect_op(")");
  }

  NodeP filters(NodeP n) {
    for (;;) {
      if (is_op("|")) {
        ++pos_;
        auto f = make(Node::Filter);
        f->name = expect_name();
        check_filter(f->name);
        f->kids.push_back(std::move(n));
        if (is_op("("))
          arguments(*f);
        else
          f->names.clear();
        n = std::move(f);
      } else if (is_name("is")) {
        ++pos_;
        auto t = make(Node::Test);
        if (is_name("not")) {
          ++pos_;
          t->negate = true;
        }
        if (peek().kind == Tk::Name) {
          t->name = next().text;
        } else if (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") ||
                   is_op(">=")) {
          t->name = next().text;
        } else {
          fail(line_, "expected a test name after 'is'");
        }
        if (t->name == "none" || t->name == "None") t->name = "none";
        if (t->name == "true" || t->name == "True") t->name = "true";
        if (t->name == "false" || t->name == "False") t->name = "false";
        check_test(t->name);
        t->kids.push_back(std::move(n));
        if (is_op("(")) {
          arguments(*t);
        } else if (!at_end() && (peek().kind == Tk::String || peek().kind == Tk::Int ||
                                 peek().kind == Tk::Float ||
                                 (peek().kind == Tk::Name && !is_name("and") && !is_name("or") &&
                                  !is_name("if") && !is_name("else") && !is_name("is") &&
                                  !is_name("in") && !is_name("not")))) {
          // `x is divisibleby 3`: a test takes one argument without parentheses
          t->names.emplace_back();
          t->kids.push_back(postfix(primary()));
        }
        n = std::move(t);
      } else {
        return n;
      }
    }
  }

  static void check_filter_name(const std::string& name, int line) {
    static const char* kFilters[] = {
        "trim",    "strip",   "length", "count",      "upper",      "lower",     "capitalize",
        "title",   "default", "d",      "first",      "last",       "join",      "string",
        "int",     "float",   "list",   "replace",    "tojson",     "safe",      "items",
        "reverse", "abs",     "round",  "selectattr", "rejectattr", "map",       "e",
        "escape",  "unique",  "sort",   "dictsort",   "indent",     "wordcount", "sum",
        "min",     "max",     "select", "reject",     "attr"};
    for (const char* f : kFilters)
      if (name == f) return;
    fail(line, "unknown filter '" + name + "'");
  }
  void check_filter(const std::string& name) const { check_filter_name(name, line_); }
  static void check_test_name(const std::string& name, int line) {
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
  void check_test(const std::string& name) const { check_test_name(name, line_); }

 private:
  struct Guard {
    explicit Guard(ExprParser& p) : p_(p) {
      if (++p_.depth_ > kMaxDepth)
        fail(p_.line_, "expression nested deeper than " + std::to_string(kMaxDepth));
    }
    ~Guard() { --p_.depth_; }
    ExprParser& p_;
  };
  NodeP make(Node::Kind k) const {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->line = line_;
    return n;
  }
  NodeP lit(Value v) const {
    auto n = make(Node::Lit);
    n->lit = std::move(v);
    return n;
  }
  NodeP binary(const std::string& op, NodeP l, NodeP r) const {
    auto n = make(Node::Binary);
    n->name = op;
    n->kids.push_back(std::move(l));
    n->kids.push_back(std::move(r));
    return n;
  }

  std::vector<Token> t_;
  std::size_t pos_ = 0;
  int line_;
  int depth_ = 0;
};

// A piece of template source: text, or the inside of a tag.
struct Piece {
  enum Kind { Text, Var, Block, Comment };
  Kind kind = Text;
  std::string text;
  int line = 1;
  bool strip_before = false;  // {%- / {{- / {#-
  bool strip_after = false;   // -%} / -}} / -#}
  bool keep_before = false;   // {%+ : no lstrip_blocks
};

// Where the tag that opens at `from` (just after its "{{" / "{%") ends: the offset of its closing
// delimiter; string literals inside may contain the delimiter.
std::size_t tag_end(const std::string& src, std::size_t from, const char* close, int line) {
  std::size_t i = from;
  while (i + 1 < src.size()) {
    const char c = src[i];
    if (c == '\'' || c == '"') {
      std::size_t j = i + 1;
      while (j < src.size() && src[j] != c) j += src[j] == '\\' ? 2 : 1;
      i = j + 1;
      continue;
    }
    if (c == close[0] && src[i + 1] == close[1]) return i;
    ++i;
  }
  fail(line, std::string("tag not closed (missing '") + close + "')");
}

std::vector<Piece> split_source(std::string src) {
  // Jinja's defaults: newlines become \n and one trailing newline is dropped.
  std::string norm;
  norm.reserve(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      norm += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      norm += src[i];
    }
  }
  if (!norm.empty() && norm.back() == '\n') norm.pop_back();
  src = std::move(norm);

  std::vector<Piece> out;
  int line = 1;
  std::size_t i = 0;
  auto count_lines = [&](std::size_t a, std::size_t b) {
    line += static_cast<int>(std::count(src.begin() + static_cast<std::ptrdiff_t>(a),
                                        src.begin() + static_cast<std::ptrdiff_t>(b), '\n'));
  };
  while (i < src.size()) {
    std::size_t open = std::string::npos;
    for (std::size_t j = src.find('{', i); j != std::string::npos; j = src.find('{', j + 1)) {
      if (j + 1 < src.size() && (src[j + 1] == '{' || src[j + 1] == '%' || src[j + 1] == '#')) {
        open = j;
        break;
      }
    }
    const std::size_t text_end = open == std::string::npos ? src.size() : open;
    if (text_end > i) {
      Piece p;
      p.text = src.substr(i, text_end - i);
      p.line = line;
      out.push_back(std::move(p));
      count_lines(i, text_end);
    }
    if (open == std::string::npos) break;
    Piece p;
    p.line = line;
    const char kind = src[open + 1];
    std::size_t body = open + 2;
    if (body < src.size() && (src[body] == '-' || src[body] == '+')) {
      (src[body] == '-' ? p.strip_before : p.keep_before) = true;
      ++body;
    }
    std::size_t close;
    if (kind == '#') {
      close = src.find("#}", body);
      if (close == std::string::npos) fail(line, "comment not closed (missing '#}')");
      p.kind = Piece::Comment;
    } else {
      close = tag_end(src, body, kind == '{' ? "}}" : "%}", line);
      p.kind = kind == '{' ? Piece::Var : Piece::Block;
    }
    std::size_t inner_end = close;
    if (inner_end > body && src[inner_end - 1] == '-') {
      p.strip_after = true;
      --inner_end;
    }
    p.text = src.substr(body, inner_end - body);
    count_lines(open, close + 2);
    i = close + 2;
    // {% raw %}...{% endraw %}: the text in between is literal.
    auto keyword_is = [](std::string inner, std::string_view kw) {
      const std::size_t b = inner.find_first_not_of(" \t\n");
      const std::size_t e = inner.find_last_not_of(" \t\n");
      return b != std::string::npos && inner.substr(b, e - b + 1) == kw;
    };
    if (p.kind == Piece::Block && keyword_is(p.text, "raw")) {
      std::size_t j = i;
      for (;;) {
        const std::size_t o = src.find("{%", j);
        if (o == std::string::npos) fail(p.line, "'raw' block not closed");
        std::size_t b = o + 2;
        const bool sb = b < src.size() && src[b] == '-';
        if (sb || (b < src.size() && src[b] == '+')) ++b;
        const std::size_t c = src.find("%}", b);
        if (c == std::string::npos) fail(p.line, "'raw' block not closed");
        std::string inner = src.substr(b, c - b);
        const bool sa = !inner.empty() && inner.back() == '-';
        if (sa) inner.pop_back();
        if (keyword_is(inner, "endraw")) {
          out.push_back(p);  // the raw tag itself, for whitespace handling
          Piece text;
          text.text = src.substr(i, o - i);
          text.line = line;
          out.push_back(text);
          Piece end;
          end.kind = Piece::Block;
          end.text = "endraw";
          end.strip_before = sb;
          end.strip_after = sa;
          end.line = line;
          out.push_back(end);
          count_lines(i, c + 2);
          i = c + 2;
          break;
        }
        j = c + 2;
      }
      continue;
    }
    out.push_back(std::move(p));
  }

  // Whitespace control: '-' strips all whitespace on that side; otherwise a block or comment
  // tag takes the spaces and tabs before it on its line (lstrip_blocks) and the one newline after
  // it (trim_blocks). A line starts after a newline in the text, at the start of the template, or
  // where the previous tag's end took a newline with it (Jinja's lexer counts those too).
  bool newline_taken = false;  // by the tag before the current text piece
  for (std::size_t k = 0; k < out.size(); ++k) {
    Piece& p = out[k];
    if (p.kind == Piece::Text) continue;
    const bool block = p.kind != Piece::Var;
    if (k > 0 && out[k - 1].kind == Piece::Text) {
      std::string& t = out[k - 1].text;
      if (p.strip_before) {
        while (!t.empty() && is_space(static_cast<unsigned char>(t.back()))) t.pop_back();
      } else if (block && !p.keep_before) {
        std::size_t e = t.size();
        while (e > 0 && (t[e - 1] == ' ' || t[e - 1] == '\t')) --e;
        const bool line_start = e == 0 && (k == 1 || newline_taken);
        if (line_start || (e > 0 && t[e - 1] == '\n')) t.resize(e);
      }
    }
    newline_taken = false;
    if (k + 1 < out.size() && out[k + 1].kind == Piece::Text) {
      std::string& t = out[k + 1].text;
      if (p.strip_after) {
        std::size_t b = 0;
        while (b < t.size() && is_space(static_cast<unsigned char>(t[b]))) ++b;
        newline_taken = b > 0 && t[b - 1] == '\n';
        t.erase(0, b);
      } else if (block && !t.empty() && t[0] == '\n') {
        t.erase(0, 1);
        newline_taken = true;
      }
    }
  }
  return out;
}

class StmtParser {
 public:
  explicit StmtParser(std::vector<Piece> pieces) : p_(std::move(pieces)) {}

  Body parse_all() {
    std::string end;
    Body b = body({}, end);
    return b;
  }

 private:
  // Statements until one of `ends` (a block keyword) or the end; `found` gets the keyword met.
  Body body(const std::vector<std::string>& ends, std::string& found) {
    if (++depth_ > kMaxDepth) fail(line_, "blocks nested deeper than " + std::to_string(kMaxDepth));
    Body out;
    found.clear();
    while (k_ < p_.size()) {
      Piece& pc = p_[k_];
      line_ = pc.line;
      if (pc.kind == Piece::Text) {
        ++k_;
        if (pc.text.empty()) continue;
        Stmt s;
        s.kind = Stmt::Text;
        s.line = pc.line;
        s.text = pc.text;
        out.push_back(std::move(s));
        continue;
      }
      if (pc.kind == Piece::Comment) {
        ++k_;
        continue;
      }
      ExprParser ep(lex_expr(pc.text, pc.line), pc.line);
      if (pc.kind == Piece::Var) {
        ++k_;
        Stmt s;
        s.kind = Stmt::Out;
        s.line = pc.line;
        s.expr = ep.expression();
        ep.expect_end();
        out.push_back(std::move(s));
        continue;
      }
      if (ep.peek().kind != Tk::Name) fail(pc.line, "a block tag must start with a keyword");
      const std::string kw = ep.peek().text;
      if (std::find(ends.begin(), ends.end(), kw) != ends.end()) {
        found = kw;
        cur_ = std::make_unique<ExprParser>(std::move(ep));
        ++k_;
        --depth_;
        return out;
      }
      ep.next();
      ++k_;
      const int line = pc.line;
      if (kw == "if") {
        out.push_back(parse_if(ep, line));
      } else if (kw == "for") {
        out.push_back(parse_for(ep, line));
      } else if (kw == "set") {
        out.push_back(parse_set(ep, line));
      } else if (kw == "break" || kw == "continue") {
        ep.expect_end();
        if (loops_ == 0) fail(line, "'" + kw + "' outside a loop");
        Stmt s;
        s.kind = kw == "break" ? Stmt::Break : Stmt::Continue;
        s.line = line;
        out.push_back(std::move(s));
      } else if (kw == "raw") {
        // the text piece that follows is literal; its endraw closes it
        std::string f;
        Body inner = body({"endraw"}, f);
        if (f.empty()) fail(line, "'raw' block not closed");
        for (auto& s : inner) out.push_back(std::move(s));
      } else if (kw == "generation") {
        // Hugging Face's marker of assistant text for training masks: renders its body
        std::string f;
        Body inner = body({"endgeneration"}, f);
        if (f.empty()) fail(line, "'generation' block not closed");
        for (auto& s : inner) out.push_back(std::move(s));
      } else if (kw == "elif" || kw == "else" || kw.rfind("end", 0) == 0) {
        fail(line, "unexpected '" + kw + "'");
      } else {
        fail(line, "unsupported tag '" + kw + "'");
      }
    }
    if (!ends.empty())
      fail(line_, "missing '" + ends.back() + "' (end of template reached inside a block)");
    --depth_;
    return out;
  }

  Stmt parse_if(ExprParser& ep, int line) {
    Stmt s;
    s.kind = Stmt::If;
    s.line = line;
    NodeP cond = ep.expression();
    ep.expect_end();
    for (;;) {
      std::string f;
      Body b = body({"elif", "else", "endif"}, f);
      if (f.empty()) fail(line, "'if' block not closed (missing 'endif')");
      s.branches.emplace_back(std::move(cond), std::move(b));
      ExprParser& e = *cur_;
      e.next();
      if (f == "endif") {
        e.expect_end();
        break;
      }
      if (f == "elif") {
        cond = e.expression();
        e.expect_end();
      } else {
        e.expect_end();
        Body eb = body({"endif"}, f);
        if (f.empty()) fail(line, "'if' block not closed (missing 'endif')");
        cur_->next();
        cur_->expect_end();
        s.branches.emplace_back(nullptr, std::move(eb));
        break;
      }
    }
    return s;
  }

  Stmt parse_for(ExprParser& ep, int line) {
    Stmt s;
    s.kind = Stmt::For;
    s.line = line;
    s.targets.push_back(ep.expect_name());
    while (ep.is_op(",")) {
      ep.next();
      s.targets.push_back(ep.expect_name());
    }
    if (!ep.is_name("in")) fail(line, "expected 'in' in a 'for' tag");
    ep.next();
    // The iterable stops before a trailing `if` filter (no inline conditional here).
    s.expr = ep.or_expr();
    if (ep.is_name("if")) {
      ep.next();
      s.cond = ep.expression();
    }
    if (ep.is_name("recursive")) fail(line, "recursive loops are not supported");
    ep.expect_end();
    ++loops_;
    std::string f;
    s.body = body({"else", "endfor"}, f);
    --loops_;
    if (f.empty()) fail(line, "'for' block not closed (missing 'endfor')");
    cur_->next();
    cur_->expect_end();
    if (f == "else") {
      s.else_body = body({"endfor"}, f);
      if (f.empty()) fail(line, "'for' block not closed (missing 'endfor')");
      cur_->next();
      cur_->expect_end();
    }
    return s;
  }

  Stmt parse_set(ExprParser& ep, int line) {
    Stmt s;
    s.line = line;
    s.targets.push_back(ep.expect_name());
    if (ep.is_op(".")) {
      ep.next();
      s.targets.push_back(ep.expect_name());
    } else {
      while (ep.is_op(",")) {  // set a, b = ...
        ep.next();
        s.targets.push_back(ep.expect_name());
        s.cond = std::make_unique<Node>();  // marks a tuple target
      }
    }
    if (ep.at_end()) {
      if (s.targets.size() != 1) fail(line, "a block 'set' takes one name");
      s.kind = Stmt::SetBlock;
      std::string f;
      s.body = body({"endset"}, f);
      if (f.empty()) fail(line, "'set' block not closed (missing 'endset')");
      cur_->next();
      cur_->expect_end();
      return s;
    }
    if (ep.is_op("|")) fail(line, "filtered block 'set' is not supported");
    ep.expect_op("=");
    s.kind = Stmt::Set;
    s.expr = ep.tuple_or_expression();
    ep.expect_end();
    return s;
  }

  std::vector<Piece> p_;
  std::size_t k_ = 0;
  int line_ = 1;
  int depth_ = 0;
  int loops_ = 0;
  std::unique_ptr<ExprParser> cur_;  // the tag that ended the last body, positioned at its keyword
};

// ---- evaluation ------------------------------------------------------------------------------

enum class Flow { Normal, Break, Continue };

struct Ctx {
  std::vector<std::unordered_map<std::string, Value>> frames;
  Str out;
  std::size_t steps = 0;

  const Value* lookup(const std::string& name) const {
    for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return &f->second;
    }
    return nullptr;
  }
  void step(int line) {
    if (++steps > kMaxSteps)
      fail(line, "the template ran more than " + std::to_string(kMaxSteps) + " steps");
  }
};

Value eval(const Node& n, Ctx& c);

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* get(std::size_t i, std::string_view name) const {
    for (const auto& kv : kw)
      if (kv.first == name) return &kv.second;
    return i < pos.size() ? &pos[i] : nullptr;
  }
};

// Arguments of a call, filter or test node: kids from `first` on, names aligned with them.
Args eval_args(const Node& n, std::size_t first, Ctx& c) {
  Args a;
  for (std::size_t i = first; i < n.kids.size(); ++i) {
    const std::string& nm = n.names.size() > i - first ? n.names[i - first] : std::string();
    Value v = eval(*n.kids[i], c);
    if (nm.empty())
      a.pos.push_back(std::move(v));
    else
      a.kw.emplace_back(nm, std::move(v));
  }
  return a;
}

Str need_str(const Value* v, int line, const char* what) {
  if (!v || v->k != K::Str) fail(line, std::string(what) + " must be a string");
  return v->str;
}

// The items a for loop or filter walks: list elements, dict keys, string characters.
List iterate(const Value& v, int line) {
  switch (v.k) {
    case K::List:
      return *v.list;
    case K::Dict: {
      List l;
      for (const auto& kv : v.dict->items) l.push_back(Value::text(kv.first));
      return l;
    }
    case K::Str: {
      List l;
      const auto cps = code_points(v.str.s);
      for (std::size_t i = 0; i + 1 < cps.size(); ++i)
        l.push_back(Value::string(v.str.sub(cps[i], cps[i + 1] - cps[i])));
      return l;
    }
    case K::Undef:
      return {};
    default:
      fail(line, std::string("cannot iterate over a ") + kind_name(v));
  }
}

Value get_item(const Value& obj, const Value& key, int line) {
  if (obj.k == K::Dict) {
    if (key.k == K::Str) {
      const Value* v = obj.dict->find(key.str.s);
      return v ? *v : Value{};
    }
    if (key.is_num()) {
      const Value* v = obj.dict->find(to_str(key).s);
      return v ? *v : Value{};
    }
    return {};
  }
  if ((obj.k == K::List || obj.k == K::Str) && (key.k == K::Int || key.k == K::Bool)) {
    if (obj.k == K::List) {
      const int64_t n = static_cast<int64_t>(obj.list->size());
      int64_t i = key.as_int();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return {};
      return (*obj.list)[static_cast<std::size_t>(i)];
    }
    const auto cps = code_points(obj.str.s);
    const int64_t n = static_cast<int64_t>(cps.size()) - 1;
    int64_t i = key.as_int();
    if (i < 0) i += n;
    if (i < 0 || i >= n) return {};
    return Value::string(
        obj.str.sub(cps[static_cast<std::size_t>(i)],
                    cps[static_cast<std::size_t>(i) + 1] - cps[static_cast<std::size_t>(i)]));
  }
  if (obj.k == K::Undef || obj.k == K::None) return {};
  (void)line;
  return {};
}

Value slice(const Value& obj, const Value* a, const Value* b, const Value* st, int line) {
  const int64_t step = st && st->k != K::None && st->k != K::Undef ? st->as_int() : 1;
  if (step == 0) fail(line, "slice step cannot be zero");
  std::vector<std::size_t> cps;
  int64_t n = 0;
  if (obj.k == K::List) {
    n = static_cast<int64_t>(obj.list->size());
  } else if (obj.k == K::Str) {
    cps = code_points(obj.str.s);
    n = static_cast<int64_t>(cps.size()) - 1;
  } else {
    fail(line, std::string("cannot slice a ") + kind_name(obj));
  }
  auto bound = [&](const Value* v, int64_t def) {
    if (!v || v->k == K::None || v->k == K::Undef) return def;
    int64_t i = v->as_int();
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t lo = bound(a, step > 0 ? 0 : n - 1);
  const int64_t hi = bound(b, step > 0 ? n : -1);
  std::vector<int64_t> idx;
  for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) idx.push_back(i);
  if (obj.k == K::List) {
    List l;
    for (int64_t i : idx) l.push_back((*obj.list)[static_cast<std::size_t>(i)]);
    return Value::of_list(std::move(l));
  }
  Str s;
  for (int64_t i : idx)
    s.append(obj.str.sub(cps[static_cast<std::size_t>(i)],
                         cps[static_cast<std::size_t>(i) + 1] - cps[static_cast<std::size_t>(i)]));
  return Value::string(std::move(s));
}

Value arith(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "~") {
    Str s = to_str(a);
    s.append(to_str(b));
    return Value::string(std::move(s));
  }
  if (op == "+") {
    if (a.k == K::Str && b.k == K::Str) {
      Str s = a.str;
      s.append(b.str);
      return Value::string(std::move(s));
    }
    if (a.k == K::List && b.k == K::List) {
      List l = *a.list;
      l.insert(l.end(), b.list->begin(), b.list->end());
      return Value::of_list(std::move(l));
    }
  }
  if (op == "*") {
    const Value* s = a.k == K::Str || a.k == K::List   ? &a
                     : b.k == K::Str || b.k == K::List ? &b
                                                       : nullptr;
    const Value* n = s == &a ? &b : &a;
    if (s && (n->k == K::Int || n->k == K::Bool)) {
      const int64_t times = std::max<int64_t>(0, n->as_int());
      const std::size_t unit = s->k == K::Str ? s->str.s.size() : s->list->size();
      if (unit > 0 && static_cast<std::size_t>(times) > ChatTemplate::kMaxOutputBytes / unit)
        fail(line, "repetition too large");
      if (s->k == K::Str) {
        Str r;
        for (int64_t i = 0; i < times; ++i) r.append(s->str);
        return Value::string(std::move(r));
      }
      List l;
      for (int64_t i = 0; i < times; ++i) l.insert(l.end(), s->list->begin(), s->list->end());
      return Value::of_list(std::move(l));
    }
  }
  if (!a.is_num() || !b.is_num())
    fail(line,
         "unsupported operand types for " + op + ": " + kind_name(a) + " and " + kind_name(b));
  const bool ints = a.k != K::Float && b.k != K::Float;
  if (op == "/") {
    if (b.num() == 0) fail(line, "division by zero");
    return Value::real(a.num() / b.num());
  }
  if (ints) {
    const int64_t x = a.as_int(), y = b.as_int();
    int64_t r = 0;
    const auto checked = [&](bool overflow) {
      if (overflow) fail(line, "integer overflow in " + op);
      return Value::integer(r);
    };
    if (op == "+") return checked(__builtin_add_overflow(x, y, &r));
    if (op == "-") return checked(__builtin_sub_overflow(x, y, &r));
    if (op == "*") return checked(__builtin_mul_overflow(x, y, &r));
    if (op == "//" || op == "%") {
      if (y == 0) fail(line, "division by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1)
        fail(line, "integer overflow in " + op);
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return Value::integer(op == "//" ? q : r);
    }
    if (op == "**") {
      if (y >= 0) {
        int64_t p = 1;
        for (int64_t i = 0; i < y; ++i) {
          if (__builtin_mul_overflow(p, x, &p)) fail(line, "integer overflow in **");
          if (p == 0 || p == 1) break;  // stays there
          if (p == -1 && i > 0) {
            p = (y % 2 == 0) ? 1 : -1;
            break;
          }
        }
        return Value::integer(p);
      }
      return Value::real(std::pow(double(x), double(y)));
    }
  } else {
    const double x = a.num(), y = b.num();
    if (op == "+") return Value::real(x + y);
    if (op == "-") return Value::real(x - y);
    if (op == "*") return Value::real(x * y);
    if (op == "//" || op == "%") {
      if (y == 0) fail(line, "division by zero");
      const double q = std::floor(x / y);
      return Value::real(op == "//" ? q : x - q * y);
    }
    if (op == "**") return Value::real(std::pow(x, y));
  }
  fail(line, "unknown operator " + op);
}

bool contains(const Value& hay, const Value& needle, int line) {
  switch (hay.k) {
    case K::Str:
      if (needle.k != K::Str) fail(line, "'in <string>' needs a string on the left");
      return hay.str.s.find(needle.str.s) != std::string::npos;
    case K::List:
      for (const auto& v : *hay.list)
        if (equal(v, needle)) return true;
      return false;
    case K::Dict:
      return needle.k == K::Str && hay.dict->find(needle.str.s) != nullptr;
    case K::Undef:
      return false;
    default:
      fail(line, std::string("'in' needs a string, list or dict, got ") + kind_name(hay));
  }
}

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
        ExprParser::check_test_name(test, line);
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
        ExprParser::check_filter_name(f, line);
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

Value eval(const Node& n, Ctx& c) {
  switch (n.kind) {
    case Node::Lit:
      return n.lit;
    case Node::Var: {
      if (const Value* v = c.lookup(n.name)) return *v;
      return {};
    }
    case Node::Attr: {
      const Value obj = eval(*n.kids[0], c);
      if (obj.k == K::Dict) {
        const Value* v = obj.dict->find(n.name);
        return v ? *v : Value{};
      }
      return {};
    }
    case Node::Index:
      return get_item(eval(*n.kids[0], c), eval(*n.kids[1], c), n.line);
    case Node::Slice: {
      const Value obj = eval(*n.kids[0], c);
      Value parts[3];
      const Value* p[3] = {nullptr, nullptr, nullptr};
      for (int k = 0; k < 3; ++k)
        if (n.kids[static_cast<std::size_t>(k) + 1]) {
          parts[k] = eval(*n.kids[static_cast<std::size_t>(k) + 1], c);
          p[k] = &parts[k];
        }
      return slice(obj, p[0], p[1], p[2], n.line);
    }
    case Node::Call: {
      const Node& callee = *n.kids[0];
      const Args a = eval_args(n, 1, c);
      if (callee.kind == Node::Attr) {
        const Value obj = eval(*callee.kids[0], c);
        if (obj.k == K::Dict) {
          if (const Value* f = obj.dict->find(callee.name); f && f->k == K::Func)
            return call_global(f->fn, a, n.line);
        }
        return call_method(obj, callee.name, a, n.line);
      }
      const Value f = eval(callee, c);
      if (f.k == K::Func) return call_global(f.fn, a, n.line);
      if (callee.kind == Node::Var)
        fail(n.line, "'" + callee.name + "' is " +
                         (f.k == K::Undef ? std::string("undefined") : "not callable"));
      fail(n.line, std::string("a ") + kind_name(f) + " is not callable");
    }
    case Node::Filter: {
      const Value v = eval(*n.kids[0], c);
      return run_filter(n.name, v, eval_args(n, 1, c), n.line);
    }
    case Node::Test: {
      const Value v = eval(*n.kids[0], c);
      const bool r = run_test(n.name, v, eval_args(n, 1, c), n.line);
      return Value::boolean(r != n.negate);
    }
    case Node::Unary: {
      const Value v = eval(*n.kids[0], c);
      if (n.name == "not") return Value::boolean(!truthy(v));
      if (!v.is_num()) fail(n.line, "unary " + n.name + " needs a number");
      if (n.name == "-") {
        if (v.k == K::Float) return Value::real(-v.f);
        if (v.as_int() == std::numeric_limits<int64_t>::min())
          fail(n.line, "integer overflow in unary -");
        return Value::integer(-v.as_int());
      }
      return v.k == K::Bool ? Value::integer(v.as_int()) : v;
    }
    case Node::Binary: {
      if (n.name == "and") {
        Value l = eval(*n.kids[0], c);
        return truthy(l) ? eval(*n.kids[1], c) : l;
      }
      if (n.name == "or") {
        Value l = eval(*n.kids[0], c);
        return truthy(l) ? l : eval(*n.kids[1], c);
      }
      const Value l = eval(*n.kids[0], c);
      const Value r = eval(*n.kids[1], c);
      return arith(n.name, l, r, n.line);
    }
    case Node::Compare: {
      Value l = eval(*n.kids[0], c);
      for (std::size_t i = 0; i < n.names.size(); ++i) {
        Value r = eval(*n.kids[i + 1], c);
        const std::string& op = n.names[i];
        bool ok;
        if (op == "==")
          ok = equal(l, r);
        else if (op == "!=")
          ok = !equal(l, r);
        else if (op == "in")
          ok = contains(r, l, n.line);
        else if (op == "not in")
          ok = !contains(r, l, n.line);
        else {
          const int cmp = compare(l, r, n.line);
          ok = op == "<" ? cmp < 0 : op == "<=" ? cmp <= 0 : op == ">" ? cmp > 0 : cmp >= 0;
        }
        if (!ok) return Value::boolean(false);
        l = std::move(r);
      }
      return Value::boolean(true);
    }
    case Node::Cond:
      if (truthy(eval(*n.kids[1], c))) return eval(*n.kids[0], c);
      return n.kids[2] ? eval(*n.kids[2], c) : Value{};
    case Node::ListLit: {
      List l;
      for (const auto& k : n.kids) l.push_back(eval(*k, c));
      return Value::of_list(std::move(l));
    }
    case Node::DictLit: {
      Dict d;
      for (std::size_t i = 0; i + 1 < n.kids.size(); i += 2)
        d.set(to_str(eval(*n.kids[i], c)).s, eval(*n.kids[i + 1], c));
      return of_dict(std::move(d));
    }
  }
  return {};
}

void emit(Ctx& c, const Str& s, int line) {
  if (c.out.s.size() + s.s.size() > ChatTemplate::kMaxOutputBytes)
    fail(line, "output exceeds " + std::to_string(ChatTemplate::kMaxOutputBytes) + " bytes");
  c.out.append(s);
}

void assign(Ctx& c, const Stmt& s, Value v) {
  auto& top = c.frames.back();
  if (s.targets.size() == 2 && !s.cond) {  // ns.attr
    const Value* ns = c.lookup(s.targets[0]);
    if (!ns || ns->k != K::Dict || !ns->dict->is_namespace)
      fail(s.line, "cannot set an attribute of '" + s.targets[0] + "' (not a namespace)");
    ns->dict->set(s.targets[1], std::move(v));
    return;
  }
  if (s.targets.size() == 1) {
    top[s.targets[0]] = std::move(v);
    return;
  }
  List items = iterate(v, s.line);
  if (items.size() != s.targets.size())
    fail(s.line, "cannot unpack " + std::to_string(items.size()) + " values into " +
                     std::to_string(s.targets.size()) + " names");
  for (std::size_t i = 0; i < items.size(); ++i) top[s.targets[i]] = items[i];
}

Flow exec(const Body& body, Ctx& c);

Flow exec_for(const Stmt& s, Ctx& c) {
  List all = iterate(eval(*s.expr, c), s.line);
  List items;
  if (s.cond) {
    for (Value& x : all) {
      c.frames.emplace_back();
      if (s.targets.size() == 1) {
        c.frames.back()[s.targets[0]] = x;
      } else {
        List parts = iterate(x, s.line);
        for (std::size_t i = 0; i < s.targets.size() && i < parts.size(); ++i)
          c.frames.back()[s.targets[i]] = parts[i];
      }
      const bool keep = truthy(eval(*s.cond, c));
      c.frames.pop_back();
      if (keep) items.push_back(std::move(x));
    }
  } else {
    items = std::move(all);
  }
  // Jinja runs the `else` body unless some iteration ran to its end: an iteration left by break
  // or continue does not count.
  bool completed = false;
  Value loop;
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    c.step(s.line);
    c.frames.emplace_back();
    auto& f = c.frames.back();
    const Value& x = items[static_cast<std::size_t>(i)];
    if (s.targets.size() == 1) {
      f[s.targets[0]] = x;
    } else {
      List parts = iterate(x, s.line);
      if (parts.size() != s.targets.size())
        fail(s.line, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                         std::to_string(s.targets.size()) + " loop variables");
      for (std::size_t k = 0; k < parts.size(); ++k) f[s.targets[k]] = parts[k];
    }
    // One `loop` object per loop, its fields updated in place (cheaper than a new one per
    // iteration; a template that keeps `loop` past its iteration sees the later values).
    if (i == 0) {
      Dict d;
      for (const char* k : {"index", "index0", "revindex", "revindex0", "first", "last", "length",
                            "depth", "depth0", "previtem", "nextitem"})
        d.items.emplace_back(k, Value{});
      loop = of_dict(std::move(d));
    }
    auto& li = loop.dict->items;
    li[0].second = Value::integer(i + 1);
    li[1].second = Value::integer(i);
    li[2].second = Value::integer(n - i);
    li[3].second = Value::integer(n - i - 1);
    li[4].second = Value::boolean(i == 0);
    li[5].second = Value::boolean(i == n - 1);
    li[6].second = Value::integer(n);
    li[7].second = Value::integer(1);
    li[8].second = Value::integer(0);
    li[9].second = i > 0 ? items[static_cast<std::size_t>(i - 1)] : Value{};
    li[10].second = i + 1 < n ? items[static_cast<std::size_t>(i + 1)] : Value{};
    f["loop"] = loop;
    const Flow fl = exec(s.body, c);
    c.frames.pop_back();
    completed = completed || fl == Flow::Normal;
    if (fl == Flow::Break) break;
  }
  if (!completed) return exec(s.else_body, c);
  return Flow::Normal;
}

Flow exec(const Body& body, Ctx& c) {
  for (const Stmt& s : body) {
    c.step(s.line);
    switch (s.kind) {
      case Stmt::Text:
        emit(c, Str::clean(s.text), s.line);
        break;
      case Stmt::Out:
        emit(c, to_str(eval(*s.expr, c)), s.line);
        break;
      case Stmt::If:
        for (const auto& br : s.branches) {
          if (!br.first || truthy(eval(*br.first, c))) {
            const Flow f = exec(br.second, c);
            if (f != Flow::Normal) return f;
            break;
          }
        }
        break;
      case Stmt::For:
        exec_for(s, c);
        break;
      case Stmt::Set:
        assign(c, s, eval(*s.expr, c));
        break;
      case Stmt::SetBlock: {
        Str saved = std::move(c.out);
        c.out = Str{};
        exec(s.body, c);
        Str captured = std::move(c.out);
        c.out = std::move(saved);
        c.frames.back()[s.targets[0]] = Value::string(std::move(captured));
        break;
      }
      case Stmt::Break:
        return Flow::Break;
      case Stmt::Continue:
        return Flow::Continue;
    }
  }
  return Flow::Normal;
}

}  // namespace

struct ChatTemplate::Impl {
  Body body;
};

ChatTemplate::ChatTemplate(std::string_view source) : impl_(std::make_unique<Impl>()) {
  StmtParser p(split_source(std::string(source)));
  impl_->body = p.parse_all();
}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

Rendered ChatTemplate::render(const std::vector<Message>& messages,
                              const RenderOptions& opts) const {
  Ctx c;
  c.frames.emplace_back();
  auto& g = c.frames.back();
  List msgs;
  for (const Message& m : messages) {
    Dict d;
    d.set("role", Value::string(Str::marked(m.role, true)));
    d.set("content", Value::string(Str::marked(m.content, true)));
    msgs.push_back(of_dict(std::move(d)));
  }
  g["messages"] = Value::of_list(std::move(msgs));
  g["bos_token"] = Value::text(opts.bos_token);
  g["eos_token"] = Value::text(opts.eos_token);
  g["add_generation_prompt"] = Value::boolean(opts.add_generation_prompt);
  g["raise_exception"] = Value::func("raise_exception");
  g["range"] = Value::func("range");
  g["namespace"] = Value::func("namespace");
  g["dict"] = Value::func("dict");
  c.frames.emplace_back();  // the template's own top-level variables
  exec(impl_->body, c);
  return Rendered{std::move(c.out.s), std::move(c.out.t)};
}

// ---- built-in templates ----------------------------------------------------------------------

namespace {
// The chat templates these model families publish in their tokenizer configs.
const std::pair<const char*, const char*> kBuiltins[] = {
    {"chatml",
     "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
     "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
     "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
     "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"},
    {"llama3",
     "{% set loop_messages = messages %}{% for message in loop_messages %}"
     "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ "
     "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
     "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
     "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
     "{% endif %}"},
    {"gemma",
     "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
     "{{ raise_exception('System role not supported') }}{% endif %}"
     "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
     "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}"
     "{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + "
     "message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
     "{{'<start_of_turn>model\n'}}{% endif %}"},
    {"mistral",
     "{{ bos_token }}{% for message in messages %}"
     "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
     "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' "
     "}}"
     "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}"
     "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor "
     "%}"},
    {"phi3",
     "{% for message in messages %}{% if message['role'] == 'system' %}"
     "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
     "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
     "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
     "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"},
};
}  // namespace

std::optional<std::string> builtin_template(std::string_view name) {
  for (const auto& [n, t] : kBuiltins)
    if (name == n) return std::string(t);
  return std::nullopt;
}

std::vector<std::string> builtin_template_names() {
  std::vector<std::string> out;
  for (const auto& b : kBuiltins) out.emplace_back(b.first);
  return out;
}

std::string load_template_text(const std::string& name_or_file) {
  if (auto t = builtin_template(name_or_file)) return *t;
  std::ifstream in(name_or_file, std::ios::binary);
  if (!in) {
    std::string names;
    for (const auto& n : builtin_template_names()) names += (names.empty() ? "" : ", ") + n;
    throw std::runtime_error("chat template '" + name_or_file + "' is neither a built-in name (" +
                             names + ") nor a readable file");
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- tokenizing a rendered prompt ------------------------------------------------------------

PromptTokenizer::PromptTokenizer(const Tokenizer& tok) : tok_(&tok) {
  // The tokens that parse_special would match (control, user-defined, unknown), longest first,
  // as llama.cpp's special-token pass orders them.
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    const auto t = tok.token_type(id);
    if (t != Tokenizer::TokenType::Control && t != Tokenizer::TokenType::UserDefined &&
        t != Tokenizer::TokenType::Unknown)
      continue;
    const std::string& text = tok.token_text(id);
    if (!text.empty()) specials_.emplace_back(text, id);
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

std::vector<int32_t> tokenize_rendered(const Tokenizer& tok, const Rendered& r) {
  return PromptTokenizer(tok)(r);
}

std::vector<int32_t> PromptTokenizer::operator()(const Rendered& r) const {
  const Tokenizer& tok = *tok_;

  struct Frag {
    int32_t id;  // -1: text [off, off + len)
    std::size_t off, len;
  };
  std::vector<Frag> frags{{-1, 0, r.text.size()}};
  const auto clean = [&](std::size_t off, std::size_t len) {
    for (std::size_t i = off; i < off + len; ++i)
      if (i < r.from_messages.size() && r.from_messages[i]) return false;
    return true;
  };
  for (const auto& [text, id] : specials_) {
    std::vector<Frag> next;
    next.reserve(frags.size());
    for (const Frag& f : frags) {
      if (f.id >= 0) {
        next.push_back(f);
        continue;
      }
      std::size_t pos = f.off;
      const std::size_t end = f.off + f.len;
      std::size_t start = f.off;
      while (pos < end) {
        const std::size_t at = r.text.find(text, pos);
        if (at == std::string::npos || at + text.size() > end) break;
        if (!clean(at, text.size())) {
          pos = at + 1;
          continue;
        }
        if (at > start) next.push_back({-1, start, at - start});
        next.push_back({id, at, text.size()});
        start = pos = at + text.size();
      }
      if (start < end) next.push_back({-1, start, end - start});
    }
    frags = std::move(next);
  }

  std::vector<int32_t> ids;
  if (tok.add_bos() && tok.bos() >= 0 && !(frags.size() > 0 && frags[0].id == tok.bos()))
    ids.push_back(tok.bos());
  for (const Frag& f : frags) {
    if (f.id >= 0) {
      ids.push_back(f.id);
      continue;
    }
    const auto part = tok.encode(std::string_view(r.text).substr(f.off, f.len), false, false);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

}  // namespace sy::chat
