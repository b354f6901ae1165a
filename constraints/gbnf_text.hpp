// Internal to the constraint converters (json_schema.cpp, regex.cpp, choices.cpp): UTF-8 and
// code point sets, a small GBNF syntax tree that simplifies as it is built, and its printing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "constraints/error.hpp"
#include "model/unicode_cats.hpp"

namespace sy::constraints::detail {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;
inline constexpr uint32_t kUnbounded = UINT32_MAX;  // the upper count of `*`, `+` and `{m,}`

// ---- UTF-8 ----

/// Appends the UTF-8 bytes of code point `cp` (the tokenizer's encoder: model/unicode_cats.hpp).
using sy::append_utf8;

/// The UTF-8 bytes of one code point.
inline std::string utf8(uint32_t cp) {
  std::string s;
  append_utf8(s, cp);
  return s;
}

/// Decodes the code point at s[i] and advances i past it; false (i unchanged) where the bytes are
/// not well-formed UTF-8 (truncated, overlong, a surrogate, above U+10FFFF).
inline bool next_code_point(std::string_view s, std::size_t& i, uint32_t& cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    cp = b0;
    ++i;
    return true;
  }
  std::size_t n;
  uint32_t min;
  if ((b0 & 0xE0) == 0xC0) {
    n = 1, min = 0x80, cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 2, min = 0x800, cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 3, min = 0x10000, cp = b0 & 0x07;
  } else {
    return false;
  }
  if (i + n >= s.size()) return false;
  for (std::size_t k = 1; k <= n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return false;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
  i += n + 1;
  return true;
}

/// Whether `s` is well-formed UTF-8.
inline bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  uint32_t cp = 0;
  while (i < s.size())
    if (!next_code_point(s, i, cp)) return false;
  return true;
}

// ---- Code point sets ----

/// Inclusive code point ranges; normalized: sorted, disjoint and not adjacent.
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

/// Sorts and merges overlapping or adjacent ranges.
inline Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& x : r) {
    if (!out.empty() && x.first <= out.back().second + 1)
      out.back().second = std::max(out.back().second, x.second);
    else
      out.push_back(x);
  }
  return out;
}

/// The code points (up to kMaxCodePoint) not in normalized `r`.
inline Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [a, b] : r) {
    if (a > next) out.emplace_back(next, a - 1);
    next = b + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

/// The union of two sets.
inline Ranges unite(Ranges a, const Ranges& b) {
  a.insert(a.end(), b.begin(), b.end());
  return normalize(std::move(a));
}

/// The code points of normalized `a` that are not in normalized `b`.
inline Ranges subtract(const Ranges& a, const Ranges& b) {
  Ranges out;
  const Ranges nb = complement(b);
  for (const auto& [a0, a1] : a)
    for (const auto& [b0, b1] : nb) {
      const uint32_t lo = std::max(a0, b0), hi = std::min(a1, b1);
      if (lo <= hi) out.emplace_back(lo, hi);
    }
  return out;
}

/// Whether normalized `r` holds `cp`.
inline bool contains(const Ranges& r, uint32_t cp) {
  for (const auto& [a, b] : r)
    if (cp >= a && cp <= b) return true;
  return false;
}

// ---- GBNF escaping ----

inline void append_hex(std::string& out, uint32_t v, int digits) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int k = digits - 1; k >= 0; --k) out += kHex[(v >> (4 * k)) & 0xF];
}

/// A GBNF literal matching exactly `bytes` (well-formed UTF-8): quotes and backslashes escaped,
/// control characters as \n \r \t or \xHH, other characters as themselves.
inline std::string gbnf_literal(std::string_view bytes) {
  std::string out = "\"";
  for (const char ch : bytes) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      out += "\\x";
      append_hex(out, c, 2);
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// One member of a character class. Letters, digits and harmless punctuation stay as they are;
// the class's own syntax characters go as \xHH, which every GBNF reader takes the same way.
inline void append_class_char(std::string& out, uint32_t cp) {
  static constexpr std::string_view kSyntax = "\\]-^[\"";
  if (cp >= 0x20 && cp < 0x7F && kSyntax.find(static_cast<char>(cp)) == std::string_view::npos) {
    out += static_cast<char>(cp);
  } else if (cp < 0x80) {
    out += "\\x";
    append_hex(out, cp, 2);
  } else if (cp <= 0xFFFF) {
    out += "\\u";
    append_hex(out, cp, 4);
  } else {
    append_utf8(out, cp);  // GBNF has no shorter escape above U+FFFF that every reader takes
  }
}

/// A GBNF character class for the non-empty normalized set `r`: `.` for every code point, the
/// negated form when the set reaches U+10FFFF (so the text never spells that far).
inline std::string gbnf_class(const Ranges& r) {
  Ranges shown = r;
  // Surrogates never occur in UTF-8 text, so a set that spans them reads shorter with them in.
  if (contains(shown, 0xD7FF) && contains(shown, 0xE000)) shown = unite(shown, {{0xD800, 0xDFFF}});
  const bool negate = !shown.empty() && shown.back().second == kMaxCodePoint;
  if (negate) shown = complement(shown);
  if (negate && shown.empty()) return ".";
  std::string out = negate ? "[^" : "[";
  for (const auto& [a, b] : shown) {
    append_class_char(out, a);
    if (b == a) continue;
    if (b > a + 1) out += '-';
    append_class_char(out, b);
  }
  return out + "]";
}

// ---- The syntax tree ----

struct Node;
using NodeP = std::shared_ptr<const Node>;

/// One GBNF expression. Built only through the functions below, which keep it simplified: an
/// empty language (`none`) never sits inside another node, an alternation is never nullable (it
/// becomes an optional one), a repetition's operand is never nullable, a sequence holds no
/// empty-string parts and no two literals next to each other.
struct Node {
  enum class Kind : uint8_t { none, seq, alt, lit, cls, ref, rep };
  Kind kind = Kind::none;
  bool nullable = false;      // derives the empty string
  std::string text;           // lit: the bytes; ref: the rule name
  Ranges ranges;              // cls: the code points (normalized, non-empty)
  std::vector<NodeP> kids;    // seq, alt: the parts; rep: the one operand
  uint32_t min = 0, max = 0;  // rep: the counts (max kUnbounded for no bound)
  NodeP body;                 // ref to a nullable rule: its body (for non_nullable)
};

/// What the syntax trees of one conversion may cost, counted in nodes and their parts: a limit on
/// time and memory that stops an expression whose simplification grows past what any grammar
/// within lim.max_elements could hold. One is in force per thread while it lives.
class TreeBudget {
 public:
  TreeBudget(std::string who, const Limits& lim)
      : who_(std::move(who)),
        max_(lim.max_elements),
        left_(2 * lim.max_elements),
        outer_(current()) {
    current() = this;
  }
  ~TreeBudget() { current() = outer_; }
  TreeBudget(const TreeBudget&) = delete;
  TreeBudget& operator=(const TreeBudget&) = delete;

  /// Charges the budget in force, if any, for a node of `parts` parts.
  static void charge(std::size_t parts) {
    TreeBudget* b = current();
    if (!b) return;
    if (parts + 1 > b->left_)
      throw ConstraintError(b->who_ + ": the grammar needs more than max_elements=" +
                            std::to_string(b->max_) + " elements");
    b->left_ -= parts + 1;
  }

 private:
  static TreeBudget*& current() {
    thread_local TreeBudget* b = nullptr;
    return b;
  }

  std::string who_;
  std::size_t max_, left_;
  TreeBudget* outer_;
};

inline NodeP make_node(Node n) {
  TreeBudget::charge(n.kids.size() + n.ranges.size());
  return std::make_shared<const Node>(std::move(n));
}

/// The empty language: no string at all.
inline NodeP nothing() {
  static const NodeP n = make_node(Node{});
  return n;
}

/// The empty string.
inline NodeP epsilon() {
  static const NodeP n = make_node(Node{Node::Kind::seq, true, {}, {}, {}, 0, 0, nullptr});
  return n;
}

inline bool is_nothing(const NodeP& n) {
  return n->kind == Node::Kind::none;
}
inline bool is_epsilon(const NodeP& n) {
  return n->kind == Node::Kind::seq && n->kids.empty();
}

/// Exactly the bytes `s` (well-formed UTF-8).
inline NodeP lit(std::string_view s) {
  if (s.empty()) return epsilon();
  Node n;
  n.kind = Node::Kind::lit;
  n.text = std::string(s);
  return make_node(std::move(n));
}

/// One code point of the set `r` (any ranges; an empty set is the empty language).
inline NodeP cls(Ranges r) {
  r = normalize(std::move(r));
  if (r.empty()) return nothing();
  Node n;
  n.kind = Node::Kind::cls;
  n.ranges = std::move(r);
  return make_node(std::move(n));
}

/// A reference to rule `name`; `nullable_body` is the rule's body where it derives the empty
/// string (and must then be known when the reference is made).
inline NodeP ref(std::string name, NodeP nullable_body = nullptr) {
  Node n;
  n.kind = Node::Kind::ref;
  n.text = std::move(name);
  n.nullable = nullable_body != nullptr;
  n.body = std::move(nullable_body);
  return make_node(std::move(n));
}

/// Structural equality.
inline bool same(const NodeP& a, const NodeP& b) {
  if (a == b) return true;
  if (a->kind != b->kind || a->text != b->text || a->ranges != b->ranges || a->min != b->min ||
      a->max != b->max || a->kids.size() != b->kids.size())
    return false;
  for (std::size_t i = 0; i < a->kids.size(); ++i)
    if (!same(a->kids[i], b->kids[i])) return false;
  return true;
}

inline NodeP seq(std::vector<NodeP> parts);
inline NodeP alt(std::vector<NodeP> options);
inline NodeP rep(NodeP x, uint32_t min, uint32_t max);

/// The language of nullable `x` without the empty string.
inline NodeP non_nullable(const NodeP& x) {
  if (!x->nullable) return x;
  switch (x->kind) {
    case Node::Kind::ref:
      return non_nullable(x->body);
    case Node::Kind::alt: {
      std::vector<NodeP> v;
      for (const auto& k : x->kids) v.push_back(non_nullable(k));
      return alt(std::move(v));
    }
    case Node::Kind::rep:  // the operand is never nullable: take at least one
      return seq({x->kids[0], rep(x->kids[0], 0, x->max == kUnbounded ? kUnbounded : x->max - 1)});
    case Node::Kind::seq: {  // every part is nullable: the first non-empty part starts the rest
      std::vector<NodeP> v;
      for (std::size_t i = 0; i < x->kids.size(); ++i) {
        std::vector<NodeP> s{non_nullable(x->kids[i])};
        s.insert(s.end(), x->kids.begin() + static_cast<std::ptrdiff_t>(i) + 1, x->kids.end());
        v.push_back(seq(std::move(s)));
      }
      return alt(std::move(v));
    }
    default:
      return nothing();
  }
}

/// The concatenation of `parts`.
inline NodeP seq(std::vector<NodeP> parts) {
  std::vector<NodeP> flat;
  for (auto& p : parts) {
    if (is_nothing(p)) return nothing();
    if (p->kind == Node::Kind::seq) {
      flat.insert(flat.end(), p->kids.begin(), p->kids.end());
    } else {
      flat.push_back(std::move(p));
    }
  }
  std::vector<NodeP> merged;
  for (auto& p : flat) {
    if (p->kind == Node::Kind::lit && !merged.empty() && merged.back()->kind == Node::Kind::lit)
      merged.back() = lit(merged.back()->text + p->text);
    else
      merged.push_back(std::move(p));
  }
  if (merged.empty()) return epsilon();
  if (merged.size() == 1) return merged[0];
  Node n;
  n.kind = Node::Kind::seq;
  n.nullable =
      std::all_of(merged.begin(), merged.end(), [](const NodeP& k) { return k->nullable; });
  n.kids = std::move(merged);
  return make_node(std::move(n));
}

/// Any one of `options`.
inline NodeP alt(std::vector<NodeP> options) {
  std::vector<NodeP> flat;
  bool empty_string = false;
  for (auto& o : options) {
    if (is_nothing(o)) continue;
    if (o->nullable) {
      empty_string = true;
      o = non_nullable(o);
      if (is_nothing(o)) continue;
    }
    const auto& group = o->kind == Node::Kind::alt ? o->kids : std::vector<NodeP>{o};
    for (const auto& g : group)
      if (std::none_of(flat.begin(), flat.end(), [&](const NodeP& f) { return same(f, g); }))
        flat.push_back(g);
  }
  NodeP out;
  if (flat.empty()) {
    out = nothing();
  } else if (flat.size() == 1) {
    out = flat[0];
  } else {
    Node n;
    n.kind = Node::Kind::alt;
    n.kids = std::move(flat);
    out = make_node(std::move(n));
  }
  return empty_string ? rep(out, 0, 1) : out;
}

/// `x` repeated min to max times (max kUnbounded: no bound).
inline NodeP rep(NodeP x, uint32_t min, uint32_t max) {
  if (max < min) return nothing();
  if (is_nothing(x)) return min == 0 ? epsilon() : nothing();
  if (is_epsilon(x) || max == 0) return epsilon();
  if (x->nullable) {  // (x){m,n} = (x without "")·{0,n} when x derives ""
    x = non_nullable(x);
    min = 0;
    if (is_nothing(x)) return epsilon();
  }
  if (min == 1 && max == 1) return x;
  Node n;
  n.kind = Node::Kind::rep;
  n.nullable = min == 0;
  n.kids = {std::move(x)};
  n.min = min;
  n.max = max;
  return make_node(std::move(n));
}

/// `x` or the empty string.
inline NodeP opt(NodeP x) {
  return rep(std::move(x), 0, 1);
}

/// Any number of `x`.
inline NodeP star(NodeP x) {
  return rep(std::move(x), 0, kUnbounded);
}

// prec 0: a rule body; 1: a part of a sequence; 2: the operand of a repetition.
inline void print_node(std::string& out, const NodeP& n, int prec) {
  switch (n->kind) {
    case Node::Kind::none:
      throw std::logic_error("gbnf: the empty language has no text");
    case Node::Kind::lit: {
      std::size_t i = 0, count = 0;
      uint32_t cp = 0;
      while (i < n->text.size() && next_code_point(n->text, i, cp)) ++count;
      const bool wrap = prec == 2 && count > 1;
      if (wrap) out += "( ";
      out += gbnf_literal(n->text);
      if (wrap) out += " )";
      return;
    }
    case Node::Kind::cls:
      out += gbnf_class(n->ranges);
      return;
    case Node::Kind::ref:
      out += n->text;
      return;
    case Node::Kind::seq: {
      if (n->kids.empty()) {
        out += "\"\"";
        return;
      }
      if (prec == 2) out += "( ";
      for (std::size_t i = 0; i < n->kids.size(); ++i) {
        if (i) out += ' ';
        print_node(out, n->kids[i], 1);
      }
      if (prec == 2) out += " )";
      return;
    }
    case Node::Kind::alt: {
      if (prec > 0) out += "( ";
      for (std::size_t i = 0; i < n->kids.size(); ++i) {
        if (i) out += " | ";
        print_node(out, n->kids[i], 1);
      }
      if (prec > 0) out += " )";
      return;
    }
    case Node::Kind::rep: {
      const NodeP& x = n->kids[0];
      const bool wrap = x->kind == Node::Kind::rep;
      if (wrap) out += "( ";
      print_node(out, x, 2);
      if (wrap) out += " )";
      const uint32_t a = n->min, b = n->max;
      if (a == 0 && b == 1) {
        out += '?';
      } else if (a == 0 && b == kUnbounded) {
        out += '*';
      } else if (a == 1 && b == kUnbounded) {
        out += '+';
      } else if (a == b) {
        out += '{' + std::to_string(a) + '}';
      } else if (b == kUnbounded) {
        out += '{' + std::to_string(a) + ",}";
      } else {
        out += '{' + std::to_string(a) + ',' + std::to_string(b) + '}';
      }
      return;
    }
  }
}

/// The GBNF text of one expression.
inline std::string print(const NodeP& n) {
  std::string s;
  print_node(s, n, 0);
  return s;
}

// ---- Rules ----

/// The rules of one grammar under construction, and their checks when it is printed.
class RuleSet {
 public:
  /// Reserves a rule name made from `hint` (letters, digits and `-` kept), unique in this set.
  std::string fresh(std::string_view hint) {
    std::string base;
    for (const char c : hint) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
      if (ok)
        base += c;
      else if (!base.empty() && base.back() != '-')
        base += '-';
    }
    while (!base.empty() && base.back() == '-') base.pop_back();
    if (base.size() > 40) base.resize(40);
    if (base.empty()) base = "r";
    std::string name = base;
    for (int k = 2; names_.count(name); ++k) name = base + "-" + std::to_string(k);
    names_.insert(name);
    return name;
  }

  /// Gives a reserved rule its body.
  void define(const std::string& name, NodeP body) {
    names_.insert(name);
    rules_.emplace_back(name, std::move(body));
  }

  /// `x` itself when it is short, else a reference to a rule holding it (one rule per distinct
  /// text): for expressions that would otherwise be written out in several places.
  NodeP share(const NodeP& x, std::string_view hint) {
    if (is_nothing(x)) return x;
    const std::string text = print(x);
    if (text.size() <= 24) return x;
    auto it = shared_.find(text);
    if (it == shared_.end()) {
      const std::string name = fresh(hint);
      define(name, x);
      it = shared_.emplace(text, name).first;
    }
    return ref(it->second, x->nullable ? x : nullptr);
  }

  /// The grammar text, rule `root` first. Rules that derive no finite string are dropped (and the
  /// alternatives that use them) so that generation can always finish; throws ConstraintError with
  /// `empty_message` if root goes with them, with what `cycle_message(rule)` says for a rule that
  /// reaches itself without consuming input (left recursion), and for more than lim.max_rules.
  std::string finish(const Limits& lim, const std::string& who, const std::string& empty_message,
                     const std::function<std::string(const std::string&)>& cycle_message) const {
    std::map<std::string, NodeP> body;
    for (const auto& [name, b] : rules_) body[name] = b;
    if (!body.count("root")) throw std::logic_error("gbnf: no root rule");

    std::set<std::string> live;  // rules that derive some finite string
    for (bool grew = true; grew;) {
      grew = false;
      for (const auto& [name, b] : rules_)
        if (!live.count(name) && productive(b, live)) grew = live.insert(name).second || grew;
    }
    if (!live.count("root")) throw ConstraintError(who + ": " + empty_message);
    for (auto& [name, b] : body) b = live.count(name) ? prune(b, live) : nothing();

    std::vector<std::string> order;  // reachable from root, in definition order
    std::set<std::string> seen{"root"};
    std::vector<std::string> todo{"root"};
    while (!todo.empty()) {
      const std::string r = todo.back();
      todo.pop_back();
      std::vector<std::string> refs;
      collect_refs(body[r], refs);
      for (const auto& x : refs)
        if (seen.insert(x).second) todo.push_back(x);
    }
    order.push_back("root");
    for (const auto& [name, b] : rules_)
      if (seen.count(name) && std::find(order.begin(), order.end(), name) == order.end())
        order.push_back(name);
    if (order.size() > lim.max_rules)
      throw ConstraintError(who + ": the grammar needs " + std::to_string(order.size()) +
                            " rules, over the limit max_rules=" + std::to_string(lim.max_rules));

    // Left recursion: rule A can start with rule B when B sits at the left edge of A's body
    // after parts that may be empty.
    std::set<std::string> empty_ok;
    for (bool grew = true; grew;) {
      grew = false;
      for (const auto& name : order)
        if (!empty_ok.count(name) && derives_empty(body[name], empty_ok))
          grew = empty_ok.insert(name).second || grew;
    }
    std::map<std::string, std::vector<std::string>> starts;
    for (const auto& name : order) left_refs(body[name], empty_ok, starts[name]);
    std::map<std::string, int> state;  // 1 on the path, 2 done
    std::function<void(const std::string&)> visit = [&](const std::string& r) {
      state[r] = 1;
      for (const auto& s : starts[r]) {
        if (state[s] == 1) throw ConstraintError(who + ": " + cycle_message(s));
        if (state[s] == 0) visit(s);
      }
      state[r] = 2;
    };
    for (const auto& name : order)
      if (state[name] == 0) visit(name);

    std::string out;
    for (const auto& name : order) {
      out += name;
      out += " ::= ";
      out += print(body[name]);
      out += '\n';
    }
    return out;
  }

 private:
  static bool productive(const NodeP& n, const std::set<std::string>& live) {
    switch (n->kind) {
      case Node::Kind::none:
        return false;
      case Node::Kind::ref:
        return live.count(n->text) > 0;
      case Node::Kind::seq:
        return std::all_of(n->kids.begin(), n->kids.end(),
                           [&](const NodeP& k) { return productive(k, live); });
      case Node::Kind::alt:
        return std::any_of(n->kids.begin(), n->kids.end(),
                           [&](const NodeP& k) { return productive(k, live); });
      case Node::Kind::rep:
        return n->min == 0 || productive(n->kids[0], live);
      default:
        return true;
    }
  }

  static NodeP prune(const NodeP& n, const std::set<std::string>& live) {
    switch (n->kind) {
      case Node::Kind::ref:
        return live.count(n->text) ? n : nothing();
      case Node::Kind::seq:
      case Node::Kind::alt: {
        std::vector<NodeP> v;
        for (const auto& k : n->kids) v.push_back(prune(k, live));
        return n->kind == Node::Kind::seq ? seq(std::move(v)) : alt(std::move(v));
      }
      case Node::Kind::rep:
        return rep(prune(n->kids[0], live), n->min, n->max);
      default:
        return n;
    }
  }

  static void collect_refs(const NodeP& n, std::vector<std::string>& out) {
    if (n->kind == Node::Kind::ref) out.push_back(n->text);
    for (const auto& k : n->kids) collect_refs(k, out);
  }

  static bool derives_empty(const NodeP& n, const std::set<std::string>& empty_ok) {
    switch (n->kind) {
      case Node::Kind::ref:
        return empty_ok.count(n->text) > 0;
      case Node::Kind::seq:
        return std::all_of(n->kids.begin(), n->kids.end(),
                           [&](const NodeP& k) { return derives_empty(k, empty_ok); });
      case Node::Kind::alt:
        return std::any_of(n->kids.begin(), n->kids.end(),
                           [&](const NodeP& k) { return derives_empty(k, empty_ok); });
      case Node::Kind::rep:
        return n->min == 0 || derives_empty(n->kids[0], empty_ok);
      default:
        return false;
    }
  }

  static void left_refs(const NodeP& n, const std::set<std::string>& empty_ok,
                        std::vector<std::string>& out) {
    switch (n->kind) {
      case Node::Kind::ref:
        out.push_back(n->text);
        return;
      case Node::Kind::seq:
        for (const auto& k : n->kids) {
          left_refs(k, empty_ok, out);
          if (!derives_empty(k, empty_ok)) return;
        }
        return;
      case Node::Kind::alt:
        for (const auto& k : n->kids) left_refs(k, empty_ok, out);
        return;
      case Node::Kind::rep:
        left_refs(n->kids[0], empty_ok, out);
        return;
      default:
        return;
    }
  }

  std::vector<std::pair<std::string, NodeP>> rules_;
  std::set<std::string> names_{"root"};
  std::map<std::string, std::string> shared_;  // printed body -> rule name
};

// ---- Shared between the converters ----

/// The expression for the strings regular expression `re` matches as a whole. With `json_char`
/// (the rule for one character of a JSON string's content) it is instead the content of a JSON
/// string (between the quotes) whose decoded text contains a match, as JSON Schema's `pattern`
/// asks: `^` and `$` anchor, characters that JSON must escape are spelled as JSON escapes.
/// Throws ConstraintError ("regex: ... at position N").
NodeP regex_node(std::string_view re, const Limits& lim, const NodeP& json_char);

}  // namespace sy::constraints::detail
