// GBNF (llama.cpp's grammar syntax) parsed into rules, and the rules built into byte-level NFAs:
// character classes over code points become UTF-8 byte sequences, so tokens that end inside a
// character need no special state.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "constraints/automaton.hpp"
#include "constraints/grammar.hpp"
#include "constraints/nfa.hpp"

namespace sy::constraints {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
// Parentheses nest by recursion in the parser and the builder; this bounds the native stack a
// hostile grammar can make us use (real grammars nest a handful of levels).
constexpr int kMaxNesting = 256;
// Repetition bounds are read into 32 bits; anything near this is refused by max_elements anyway.
constexpr uint64_t kMaxCount = 1u << 30;

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code point ranges, inclusive

// One item of a rule body.
struct Node {
  enum class Kind : uint8_t { Literal, Class, Ref, Group, Repeat };
  Kind kind = Kind::Literal;
  std::size_t pos = 0;                  // where it starts in the source (errors)
  int depth = 1;                        // nesting of groups and repetitions, this one included
  std::string bytes;                    // Literal: UTF-8
  Ranges ranges;                        // Class: sorted, merged, no surrogates
  uint32_t rule = 0;                    // Ref
  std::vector<std::vector<Node>> alts;  // Group
  std::vector<Node> child;              // Repeat: one node
  uint32_t min = 0;                     // Repeat
  uint32_t max = 0;                     // Repeat, unless unbounded
  bool unbounded = false;
};

using Alternatives = std::vector<std::vector<Node>>;

struct RuleDef {
  std::string name;
  bool defined = false;
  std::size_t def_pos = 0;
  std::size_t ref_pos = 0;  // first reference, for "undefined rule"
  Alternatives body;
};

bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_surrogate(uint32_t cp) {
  return cp >= 0xD800 && cp <= 0xDFFF;
}

// Sorts and merges ranges, then removes the surrogates (they are not characters, and UTF-8
// cannot encode them).
Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges merged;
  for (const auto& [lo, hi] : r) {
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.emplace_back(lo, hi);
    }
  }
  Ranges out;
  for (const auto& [lo, hi] : merged) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      out.emplace_back(lo, hi);
      continue;
    }
    if (lo < 0xD800) out.emplace_back(lo, 0xD7FF);
    if (hi > 0xDFFF) out.emplace_back(0xE000, hi);
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : r) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return normalize(out);
}

// A run of byte ranges that together spell the UTF-8 encodings of a range of code points.
struct Utf8Seq {
  int n = 0;
  uint8_t lo[4] = {0, 0, 0, 0};
  uint8_t hi[4] = {0, 0, 0, 0};
};

// Splits [lo, hi] (no surrogates) into byte-range sequences, each the cross product of its byte
// ranges: first by encoded length, then wherever a continuation byte would not span 80..BF
// (the method of RE2 and Rust's regex-syntax).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<Utf8Seq>& out) {
  std::vector<std::pair<uint32_t, uint32_t>> todo{{lo, hi}};
  while (!todo.empty()) {
    auto [s, e] = todo.back();
    todo.pop_back();
    bool again = true;
    while (again) {
      again = false;
      for (uint32_t max : {0x7Fu, 0x7FFu, 0xFFFFu}) {
        if (s <= max && max < e) {
          todo.emplace_back(max + 1, e);
          e = max;
          again = true;
          break;
        }
      }
      if (again) continue;
      if (e <= 0x7F) break;
      for (int i = 1; i < 4 && !again; ++i) {
        const uint32_t m = (1u << (6 * i)) - 1;
        if ((s & ~m) != (e & ~m)) {
          if ((s & m) != 0) {
            todo.emplace_back((s | m) + 1, e);
            e = s | m;
            again = true;
          } else if ((e & m) != m) {
            todo.emplace_back(e & ~m, e);
            e = (e & ~m) - 1;
            again = true;
          }
        }
      }
    }
    std::string a, b;
    append_utf8(a, s);
    append_utf8(b, e);
    Utf8Seq seq;
    seq.n = static_cast<int>(a.size());
    for (int i = 0; i < seq.n; ++i) {
      seq.lo[i] = static_cast<uint8_t>(a[static_cast<std::size_t>(i)]);
      seq.hi[i] = static_cast<uint8_t>(b[static_cast<std::size_t>(i)]);
    }
    out.push_back(seq);
  }
}

class Parser {
 public:
  Parser(std::string_view src, const Limits& lim) : s_(src), lim_(lim) {}

  Nfa parse() {
    if (s_.size() > lim_.max_source_bytes)
      throw ConstraintError("grammar is " + std::to_string(s_.size()) +
                            " bytes, more than max_source_bytes (" +
                            std::to_string(lim_.max_source_bytes) + ")");
    skip_space(true);
    while (p_ < s_.size()) parse_rule();
    const auto root = ids_.find("root");
    if (root == ids_.end() || !rules_[root->second].defined)
      throw ConstraintError("grammar has no rule named 'root'");
    for (const RuleDef& r : rules_)
      if (!r.defined) fail(r.ref_pos, "undefined rule '" + r.name + "'");
    return build(root->second);
  }

 private:
  [[noreturn]] void fail(std::size_t pos, const std::string& what) const {
    std::size_t line = 1, col = 1;
    for (std::size_t i = 0; i < pos && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw ConstraintError("GBNF line " + std::to_string(line) + ", column " + std::to_string(col) +
                          ": " + what);
  }

  static std::string show(char c) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7F) return std::string("'") + c + "'";
    static const char* hex = "0123456789ABCDEF";
    return std::string("byte 0x") + hex[u >> 4] + hex[u & 15];
  }

  bool at_end() const { return p_ >= s_.size(); }
  char peek(std::size_t ahead = 0) const { return p_ + ahead < s_.size() ? s_[p_ + ahead] : '\0'; }

  // Spaces, tabs and comments; newlines too where the syntax allows them.
  void skip_space(bool newlines) {
    while (p_ < s_.size()) {
      const char c = s_[p_];
      if (c == ' ' || c == '\t') {
        ++p_;
      } else if (c == '#') {
        while (p_ < s_.size() && s_[p_] != '\n' && s_[p_] != '\r') ++p_;
      } else if (newlines && (c == '\n' || c == '\r')) {
        ++p_;
      } else {
        break;
      }
    }
  }

  uint32_t rule_id(const std::string& name, std::size_t pos) {
    const auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    if (rules_.size() >= lim_.max_rules)
      throw ConstraintError("grammar has more than " + std::to_string(lim_.max_rules) +
                            " rules (max_rules)");
    const auto id = static_cast<uint32_t>(rules_.size());
    ids_.emplace(name, id);
    RuleDef def;
    def.name = name;
    def.ref_pos = pos;
    rules_.push_back(std::move(def));
    return id;
  }

  std::string parse_name() {
    const std::size_t b = p_;
    while (p_ < s_.size() && is_word_char(s_[p_])) ++p_;
    return std::string(s_.substr(b, p_ - b));
  }

  void parse_rule() {
    const std::size_t at = p_;
    const std::string name = parse_name();
    if (name.empty()) fail(at, "expected a rule name, found " + show(peek()));
    skip_space(false);
    if (s_.substr(p_, 3) != "::=") fail(p_, "expected '::=' after the rule name '" + name + "'");
    p_ += 3;
    skip_space(true);
    const uint32_t id = rule_id(name, at);
    if (rules_[id].defined) fail(at, "rule '" + name + "' is defined twice");
    rules_[id].defined = true;
    rules_[id].def_pos = at;
    rules_[id].body = parse_alternatives(false, 0);
    if (!at_end()) {
      if (peek() == '\r') ++p_;
      if (peek() != '\n')
        fail(p_, "expected the end of rule '" + name + "', found " + show(peek()));
      ++p_;
    }
    skip_space(true);
  }

  Alternatives parse_alternatives(bool nested, int depth) {
    Alternatives alts;
    alts.push_back(parse_sequence(nested, depth));
    while (peek() == '|') {
      ++p_;
      skip_space(true);
      alts.push_back(parse_sequence(nested, depth));
    }
    return alts;
  }

  std::vector<Node> parse_sequence(bool nested, int depth) {
    std::vector<Node> seq;
    while (!at_end()) {
      const char c = peek();
      const std::size_t at = p_;
      if (c == '"') {
        seq.push_back(parse_literal());
      } else if (c == '[') {
        seq.push_back(parse_class());
      } else if (c == '.') {
        ++p_;
        Node n;
        n.kind = Node::Kind::Class;
        n.pos = at;
        n.ranges = normalize({{0, kMaxCodePoint}});
        seq.push_back(std::move(n));
      } else if (is_word_char(c)) {
        Node n;
        n.kind = Node::Kind::Ref;
        n.pos = at;
        n.rule = rule_id(parse_name(), at);
        seq.push_back(std::move(n));
      } else if (c == '(') {
        if (depth >= kMaxNesting)
          fail(at, "groups nested more than " + std::to_string(kMaxNesting) + " deep");
        ++p_;
        skip_space(true);
        Node n;
        n.kind = Node::Kind::Group;
        n.pos = at;
        n.alts = parse_alternatives(true, depth + 1);
        for (const auto& alt : n.alts)
          for (const Node& item : alt) n.depth = std::max(n.depth, item.depth + 1);
        if (n.depth > kMaxNesting)
          fail(at,
               "groups and repetitions nested more than " + std::to_string(kMaxNesting) + " deep");
        if (peek() != ')') {
          if (at_end()) fail(at, "the group opened here is never closed with ')'");
          fail(p_, "expected ')' or '|', found " + show(peek()));
        }
        ++p_;
        seq.push_back(std::move(n));
      } else if (c == '*' || c == '+' || c == '?') {
        if (seq.empty()) fail(at, std::string("'") + c + "' must follow an item to repeat");
        ++p_;
        repeat(seq, at, c == '+' ? 1 : 0, c == '?' ? 1 : 0, c != '?');
      } else if (c == '{') {
        if (seq.empty()) fail(at, "'{' must follow an item to repeat");
        parse_braces(seq);
      } else if (c == '|' || c == ')' || c == '\n' || c == '\r') {
        break;
      } else {
        fail(at, "unexpected " + show(c));
      }
      skip_space(nested);
    }
    return seq;
  }

  void repeat(std::vector<Node>& seq, std::size_t at, uint64_t min, uint64_t max, bool unbounded) {
    if (seq.back().depth >= kMaxNesting)
      fail(at, "groups and repetitions nested more than " + std::to_string(kMaxNesting) + " deep");
    Node n;
    n.kind = Node::Kind::Repeat;
    n.pos = at;
    n.depth = seq.back().depth + 1;
    n.min = static_cast<uint32_t>(min);
    n.max = static_cast<uint32_t>(max);
    n.unbounded = unbounded;
    n.child.push_back(std::move(seq.back()));
    seq.back() = std::move(n);
  }

  uint64_t parse_count() {
    const std::size_t at = p_;
    uint64_t v = 0;
    if (!(peek() >= '0' && peek() <= '9')) fail(at, "expected a number in the repetition");
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + static_cast<uint64_t>(peek() - '0');
      if (v > kMaxCount) fail(at, "repetition count is too large");
      ++p_;
    }
    return v;
  }

  void parse_braces(std::vector<Node>& seq) {
    const std::size_t at = p_;
    ++p_;
    skip_space(false);
    const uint64_t min = parse_count();
    skip_space(false);
    uint64_t max = min;
    bool unbounded = false;
    if (peek() == ',') {
      ++p_;
      skip_space(false);
      if (peek() == '}') {
        unbounded = true;
      } else {
        max = parse_count();
        skip_space(false);
      }
    }
    if (peek() != '}') fail(p_, "expected '}' to close the repetition");
    ++p_;
    if (!unbounded && max < min)
      fail(at, "repetition {" + std::to_string(min) + "," + std::to_string(max) +
                   "} has its maximum below its minimum");
    const uint64_t copies = unbounded ? min + 1 : max;
    if (copies > lim_.max_elements)
      fail(at, "repetition needs more than " + std::to_string(lim_.max_elements) +
                   " elements (max_elements)");
    repeat(seq, at, min, max, unbounded);
  }

  // Decodes one UTF-8 character of the source (the grammar text must be valid UTF-8).
  uint32_t source_char() {
    const std::size_t at = p_;
    const auto b0 = static_cast<unsigned char>(s_[p_]);
    int n = 0;
    uint32_t cp = 0;
    if (b0 < 0x80) {
      ++p_;
      return b0;
    } else if (b0 >= 0xC2 && b0 <= 0xDF) {
      n = 1;
      cp = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      n = 2;
      cp = b0 & 0x0F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      n = 3;
      cp = b0 & 0x07;
    } else {
      fail(at, "invalid UTF-8 in the grammar text");
    }
    ++p_;
    for (int i = 0; i < n; ++i) {
      const auto b = static_cast<unsigned char>(peek());
      if (at_end() || (b & 0xC0) != 0x80) fail(at, "invalid UTF-8 in the grammar text");
      cp = (cp << 6) | (b & 0x3F);
      ++p_;
    }
    const uint32_t least[] = {0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > kMaxCodePoint || is_surrogate(cp))
      fail(at, "invalid UTF-8 in the grammar text");
    return cp;
  }

  uint32_t parse_hex(int digits, std::size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = peek();
      int d;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        d = c - 'A' + 10;
      } else {
        fail(at, "escape needs " + std::to_string(digits) + " hex digits");
      }
      v = v * 16 + static_cast<uint32_t>(d);
      ++p_;
    }
    return v;
  }

  // One character of a literal or class, escapes included; \xHH names code point U+00HH, as in
  // llama.cpp, so that every grammar describes valid UTF-8 text.
  uint32_t parse_char() {
    if (peek() != '\\') return source_char();
    const std::size_t at = p_;
    ++p_;
    if (at_end()) fail(at, "unfinished escape at the end of the grammar");
    const char c = s_[p_++];
    uint32_t cp = 0;
    switch (c) {
      case 'n':
        return '\n';
      case 't':
        return '\t';
      case 'r':
        return '\r';
      case 'x':
        cp = parse_hex(2, at);
        break;
      case 'u':
        cp = parse_hex(4, at);
        break;
      case 'U':
        cp = parse_hex(8, at);
        break;
      default:
        // Any ASCII punctuation stands for itself: \\ \" \[ \] \- \^ and friends.
        if (static_cast<unsigned char>(c) < 0x80 && !is_word_char(c) && c > 0x20) return c;
        if (c == '-') return c;
        fail(at, std::string("unknown escape '\\") + c + "'");
    }
    if (cp > kMaxCodePoint || is_surrogate(cp))
      fail(at, "escape names no character (surrogate or above U+10FFFF)");
    return cp;
  }

  Node parse_literal() {
    Node n;
    n.kind = Node::Kind::Literal;
    n.pos = p_;
    ++p_;
    while (peek() != '"') {
      if (at_end()) fail(n.pos, "string literal is never closed");
      append_utf8(n.bytes, parse_char());
    }
    ++p_;
    return n;
  }

  Node parse_class() {
    Node n;
    n.kind = Node::Kind::Class;
    n.pos = p_;
    ++p_;
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++p_;
    }
    Ranges r;
    while (peek() != ']') {
      if (at_end()) fail(n.pos, "character class is never closed with ']'");
      const std::size_t at = p_;
      const uint32_t lo = parse_char();
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && p_ + 1 < s_.size()) {
        ++p_;
        hi = parse_char();
        if (hi < lo) fail(at, "character range is reversed (its end comes before its start)");
      }
      r.emplace_back(lo, hi);
    }
    ++p_;
    if (r.empty() && !negated) fail(n.pos, "empty character class");
    n.ranges = normalize(std::move(r));
    if (negated) n.ranges = complement(n.ranges);
    if (n.ranges.empty()) fail(n.pos, "character class matches no character");
    return n;
  }

  // ---- NFA construction (Thompson, with fresh loop heads so a loop never re-enters a state
  // that other paths lead into) ----

  uint32_t new_state(NfaRule& r) {
    if (++elements_ > lim_.max_elements)
      throw ConstraintError("grammar has more than " + std::to_string(lim_.max_elements) +
                            " elements (max_elements)");
    r.states.emplace_back();
    return static_cast<uint32_t>(r.states.size() - 1);
  }

  static void eps(NfaRule& r, uint32_t from, uint32_t to) { r.states[from].eps.push_back(to); }

  uint32_t build_seq(NfaRule& r, const std::vector<Node>& seq, uint32_t from) {
    for (const Node& n : seq) from = build_node(r, n, from);
    return from;
  }

  uint32_t build_alts(NfaRule& r, const Alternatives& alts, uint32_t from) {
    if (alts.size() == 1) return build_seq(r, alts[0], from);
    const uint32_t end = new_state(r);
    for (const auto& seq : alts) eps(r, build_seq(r, seq, from), end);
    return end;
  }

  uint32_t build_node(NfaRule& r, const Node& n, uint32_t from) {
    switch (n.kind) {
      case Node::Kind::Literal:
        for (const char ch : n.bytes) {
          const uint32_t t = new_state(r);
          const auto b = static_cast<uint8_t>(ch);
          r.states[from].bytes.push_back({b, b, t});
          from = t;
        }
        return from;
      case Node::Kind::Class: {
        const uint32_t end = new_state(r);
        seqs_.clear();
        for (const auto& [lo, hi] : n.ranges) utf8_sequences(lo, hi, seqs_);
        const std::vector<Utf8Seq> seqs = seqs_;
        for (const Utf8Seq& q : seqs) {
          uint32_t x = from;
          for (int i = 0; i + 1 < q.n; ++i) {
            const uint32_t t = new_state(r);
            r.states[x].bytes.push_back({q.lo[i], q.hi[i], t});
            x = t;
          }
          r.states[x].bytes.push_back({q.lo[q.n - 1], q.hi[q.n - 1], end});
        }
        return end;
      }
      case Node::Kind::Ref: {
        const uint32_t t = new_state(r);
        r.states[from].calls.push_back({n.rule, t});
        return t;
      }
      case Node::Kind::Group:
        return build_alts(r, n.alts, from);
      case Node::Kind::Repeat: {
        const Node& c = n.child[0];
        uint32_t x = from;
        if (n.unbounded) {
          // x{m,}: m - 1 copies, then one copy that loops back to its own fresh head.
          for (uint32_t i = 1; i < n.min; ++i) x = build_node(r, c, x);
          const uint32_t head = new_state(r);
          eps(r, x, head);
          const uint32_t body = build_node(r, c, head);
          eps(r, body, head);
          return n.min == 0 ? head : body;
        }
        for (uint32_t i = 0; i < n.min; ++i) x = build_node(r, c, x);
        if (n.max == n.min) return x;
        // x{0,k} as (x(x(x)?)?)?: after j copies there is one state, not j ways to have
        // skipped copies.
        const uint32_t end = new_state(r);
        for (uint32_t i = n.min; i < n.max; ++i) {
          eps(r, x, end);
          x = build_node(r, c, x);
        }
        eps(r, x, end);
        return end;
      }
    }
    return from;
  }

  Nfa build(uint32_t root) {
    Nfa nfa;
    nfa.root = root;
    nfa.rules.resize(rules_.size());
    for (std::size_t i = 0; i < rules_.size(); ++i) {
      NfaRule& r = nfa.rules[i];
      r.name = rules_[i].name;
      r.start = new_state(r);
      r.accept = new_state(r);
      eps(r, build_alts(r, rules_[i].body, r.start), r.accept);
    }
    return nfa;
  }

  std::string_view s_;
  const Limits& lim_;
  std::size_t p_ = 0;
  std::size_t elements_ = 0;
  std::unordered_map<std::string, uint32_t> ids_;
  std::vector<RuleDef> rules_;
  std::vector<Utf8Seq> seqs_;
};

}  // namespace

std::shared_ptr<const Grammar> compile_gbnf(std::string_view text, const Limits& lim) {
  return build_grammar(Parser(text, lim).parse(), lim);
}

}  // namespace sy::constraints
