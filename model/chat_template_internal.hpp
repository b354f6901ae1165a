// Internal to the chat-template interpreter (model/chat_template_*.cpp): the marked-string
// values, the tokens and syntax tree, and the functions its parts call across files.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/chat_template.hpp"

namespace sy::chat::detail {

// Statements and loop iterations one render may execute: a real template over a thousand
// messages takes a few tens of thousands, so this stops only runaway loops (in about a second).
constexpr std::size_t kMaxSteps = 1'000'000;

// Throws TemplateError naming the template line.
[[noreturn]] void fail(int line, const std::string& what);

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

// chat_template_values.cpp: making, printing, comparing values; string helpers.
Value of_dict(Dict d);
const char* kind_name(const Value& v);
bool truthy(const Value& v);
Str to_str(const Value& v);
bool equal(const Value& a, const Value& b);
int compare(const Value& a, const Value& b, int line);
std::vector<std::size_t> code_points(const std::string& s);
bool is_space(unsigned char c);
Str strip(const Str& s, bool left, bool right, const std::string* chars = nullptr);
Str map_case(const Str& s, int mode);  // 0 lower, 1 upper, 2 capitalize, 3 title
Str replace(const Str& s, const Str& from, const Str& to, int64_t count);
void to_json(const Value& v, int indent, int level, std::string& out, bool& marked, int line);

// ---- lexing ----------------------------------------------------------------------------------

enum class Tk { Name, String, Int, Float, Op, End };

struct Token {
  Tk kind = Tk::End;
  std::string text;  // name, operator, or the decoded string literal
  int64_t i = 0;
  double f = 0;
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

// chat_template_lexer.cpp: the pieces of a template source, the tokens of one tag.
std::vector<Token> lex_expr(std::string_view src, int line);
std::vector<Piece> split_source(std::string src);

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

// chat_template_parser.cpp: the statements of a whole template.
Body parse_template(std::string_view source);

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

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* get(std::size_t i, std::string_view name) const {
    for (const auto& kv : kw)
      if (kv.first == name) return &kv.second;
    return i < pos.size() ? &pos[i] : nullptr;
  }
};

// chat_template_eval.cpp: expressions, statements, and the value operations they share with
// the built-ins.
Value eval(const Node& n, Ctx& c);
Flow exec(const Body& body, Ctx& c);
List iterate(const Value& v, int line);
Value get_item(const Value& obj, const Value& key, int line);
Value slice(const Value& obj, const Value* a, const Value* b, const Value* st, int line);
Value arith(const std::string& op, const Value& a, const Value& b, int line);
bool contains(const Value& hay, const Value& needle, int line);

// chat_template_builtins.cpp: name checks (for the parser) and the built-ins themselves.
void check_filter_name(const std::string& name, int line);
void check_test_name(const std::string& name, int line);
bool run_test(const std::string& name, const Value& v, const Args& a, int line);
Value run_filter(const std::string& name, const Value& v, const Args& a, int line);
Value call_method(const Value& obj, const std::string& m, const Args& a, int line);
Value call_global(const std::string& fn, const Args& a, int line);

}  // namespace sy::chat::detail
