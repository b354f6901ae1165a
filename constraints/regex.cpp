// Regular expressions (RE2 / Python `re` syntax) converted to GBNF, for whole-output matching and
// for JSON Schema's `pattern` inside a JSON string.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "constraints/convert.hpp"
#include "constraints/gbnf_text.hpp"

namespace sy::constraints {
namespace detail {
namespace {

constexpr int kMaxGroupDepth = 256;  // the parser recurses per group: bounded stack

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};  // \t \n \v \f \r and space, as Python's ASCII \s

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

uint32_t hex_value(char c) {
  if (c >= '0' && c <= '9') return static_cast<uint32_t>(c - '0');
  if (c >= 'a' && c <= 'f') return static_cast<uint32_t>(c - 'a' + 10);
  return static_cast<uint32_t>(c - 'A' + 10);
}

bool is_alnum(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// The characters of `set` as they appear inside a JSON string: `"`, `\` and control characters
// only as their escapes (short form where JSON has one, \u00XX in either case always), `/` also
// as `\/`; other characters as themselves.
NodeP json_spelling(const Ranges& set) {
  static const Ranges kMustEscape = normalize({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
  std::vector<NodeP> options{cls(subtract(set, kMustEscape))};
  std::vector<NodeP> escapes;
  Ranges letters;
  if (contains(set, '"')) letters.emplace_back('"', '"');
  if (contains(set, '\\')) letters.emplace_back('\\', '\\');
  if (contains(set, '/')) letters.emplace_back('/', '/');  // JSON may write "/" as "\/"
  static const std::pair<uint32_t, char> kShort[] = {
      {0x08, 'b'}, {0x09, 't'}, {0x0A, 'n'}, {0x0C, 'f'}, {0x0D, 'r'}};
  for (const auto& [cp, letter] : kShort)
    if (contains(set, cp)) letters.emplace_back(letter, letter);
  escapes.push_back(cls(letters));
  std::vector<NodeP> u;
  for (uint32_t hi = 0; hi < 2; ++hi) {
    Ranges lows;
    for (uint32_t lo = 0; lo < 16; ++lo) {
      if (!contains(set, hi * 16 + lo)) continue;
      if (lo < 10) {
        lows.emplace_back('0' + lo, '0' + lo);
      } else {
        lows.emplace_back('a' + lo - 10, 'a' + lo - 10);
        lows.emplace_back('A' + lo - 10, 'A' + lo - 10);
      }
    }
    u.push_back(seq({lit(hi ? "1" : "0"), cls(lows)}));
  }
  escapes.push_back(seq({lit("u00"), alt(std::move(u))}));
  options.push_back(seq({lit("\\"), alt(std::move(escapes))}));
  return alt(std::move(options));
}

class RegexParser {
 public:
  RegexParser(std::string_view re, const Limits& lim, const NodeP& json_char)
      : s_(re), lim_(lim), json_char_(json_char) {}

  NodeP parse() {
    std::vector<Branch> branches{branch(true)};
    while (i_ < s_.size() && s_[i_] == '|') {
      ++i_;
      branches.push_back(branch(true));
    }
    if (i_ < s_.size()) fail("unbalanced parenthesis", i_);
    std::vector<NodeP> options;
    for (auto& b : branches) {
      if (!json_char_) {
        options.push_back(b.node);
        continue;
      }
      // JSON Schema's pattern searches: an unanchored side may have anything around the match.
      if (!b.start && !b.end && is_epsilon(b.node)) {
        options.push_back(star(json_char_));
        continue;
      }
      options.push_back(seq(
          {b.start ? epsilon() : star(json_char_), b.node, b.end ? epsilon() : star(json_char_)}));
    }
    return alt(std::move(options));
  }

 private:
  struct Branch {
    NodeP node;
    bool start = false, end = false;  // anchored by ^ / \A, by $ / \z / \Z
  };

  struct Item {  // what one escape or class member stands for
    Ranges set;
    bool single = false;  // one code point (a range may end there)
    uint32_t cp = 0;
  };

  [[noreturn]] void fail(const std::string& what, std::size_t pos) const {
    throw ConstraintError("regex: " + what + " at position " + std::to_string(pos));
  }

  [[noreturn]] void refuse(const std::string& what, std::size_t pos) const {
    throw ConstraintError("regex: " + what + " at position " + std::to_string(pos) +
                          " is not supported");
  }

  NodeP char_node(uint32_t cp) const {
    const bool escaped = json_char_ && (cp < 0x20 || cp == '"' || cp == '\\' || cp == '/');
    return escaped ? json_spelling({{cp, cp}}) : lit(utf8(cp));
  }

  NodeP set_node(const Ranges& set) const { return json_char_ ? json_spelling(set) : cls(set); }

  // A quantifier at position p: its counts and its length, or length 0 where there is none
  // (`{` that does not start `{m}`, `{m,}`, `{,n}` or `{m,n}` is a literal, as in Python).
  struct Quant {
    std::size_t len = 0;
    uint64_t min = 0, max = 0;
  };

  Quant quantifier_at(std::size_t p) const {
    if (p >= s_.size()) return {};
    const char c = s_[p];
    if (c == '*') return {1, 0, kUnbounded};
    if (c == '+') return {1, 1, kUnbounded};
    if (c == '?') return {1, 0, 1};
    if (c != '{' || p + 1 >= s_.size() || s_[p + 1] == '}') return {};
    std::size_t q = p + 1;
    auto number = [&](uint64_t& v) {
      bool any = false;
      v = 0;
      for (; q < s_.size() && s_[q] >= '0' && s_[q] <= '9'; ++q) {
        v = std::min<uint64_t>(v * 10 + static_cast<uint64_t>(s_[q] - '0'), 1ull << 40);
        any = true;
      }
      return any;
    };
    Quant out;
    const bool has_lo = number(out.min);
    if (!has_lo) out.min = 0;
    if (q < s_.size() && s_[q] == ',') {
      ++q;
      if (!number(out.max)) out.max = kUnbounded;
    } else {
      out.max = out.min;
    }
    if (q >= s_.size() || s_[q] != '}') return {};
    out.len = q + 1 - p;
    return out;
  }

  Branch branch(bool top) {
    Branch b;
    std::vector<NodeP> parts;
    bool last_quantified = false;
    while (i_ < s_.size() && s_[i_] != '|' && s_[i_] != ')') {
      const std::size_t at = i_;
      const char c = s_[i_];
      const char next = i_ + 1 < s_.size() ? s_[i_ + 1] : '\0';
      const bool start_anchor = c == '^' || (c == '\\' && next == 'A');
      const bool end_anchor = c == '$' || (c == '\\' && (next == 'z' || next == 'Z'));
      if (start_anchor || end_anchor) {
        const std::string name = c == '\\' ? std::string("\\") + next : std::string(1, c);
        i_ += c == '\\' ? 2 : 1;
        if (quantifier_at(i_).len) fail("nothing to repeat", i_);
        if (start_anchor) {
          if (!top || !parts.empty() || b.end)
            refuse("anchor " + name + " away from the start of the expression", at);
          b.start = true;
        } else {
          const bool at_end =
              i_ >= s_.size() || s_[i_] == '|' || s_[i_] == '$' ||
              (s_[i_] == '\\' && i_ + 1 < s_.size() && (s_[i_ + 1] == 'z' || s_[i_ + 1] == 'Z'));
          if (!top || !at_end)
            refuse("anchor " + name + " away from the end of the expression", at);
          b.end = true;
        }
        continue;
      }
      NodeP a = atom();
      if (!a) {  // a comment: as in Python, a quantifier after it applies to the atom before
        if (!parts.empty() && !last_quantified && quantifier_at(i_).len) {
          parts.back() = quantified(parts.back());
          last_quantified = true;
        }
        continue;
      }
      const std::size_t before = i_;
      parts.push_back(quantified(std::move(a)));
      last_quantified = i_ != before;
    }
    b.node = seq(std::move(parts));
    return b;
  }

  NodeP quantified(NodeP a) {
    const std::size_t at = i_;
    const Quant q = quantifier_at(i_);
    if (!q.len) return a;
    i_ += q.len;
    if (q.max != kUnbounded && q.min > q.max) fail("min repeat greater than max repeat", at);
    const uint64_t biggest = q.max == kUnbounded ? q.min : q.max;
    if (biggest > lim_.max_elements)
      fail("repetition count " + std::to_string(biggest) +
               " over the limit max_elements=" + std::to_string(lim_.max_elements),
           at);
    if (i_ < s_.size() && s_[i_] == '?') {
      ++i_;  // lazy: the same language
    } else if (i_ < s_.size() && s_[i_] == '+') {
      refuse("possessive quantifier", i_);
    }
    if (quantifier_at(i_).len) fail("multiple repeat", i_);
    return rep(std::move(a), static_cast<uint32_t>(q.min), static_cast<uint32_t>(q.max));
  }

  // One atom, or nullptr for a comment group.
  NodeP atom() {
    const std::size_t at = i_;
    const char c = s_[i_];
    switch (c) {
      case '(':
        return group();
      case '[':
        return char_class();
      case '.':
        ++i_;
        return set_node(complement({{'\n', '\n'}}));
      case '\\': {
        const char next = i_ + 1 < s_.size() ? s_[i_ + 1] : '\0';
        if (next == 'b' || next == 'B') refuse("word boundary \\" + std::string(1, next), at);
        if (next == 'G') refuse("anchor \\G", at);
        const Item it = escape(false);
        return it.single ? char_node(it.cp) : set_node(it.set);
      }
      case '*':
      case '+':
      case '?':
        fail("nothing to repeat", at);
      case '{':
        if (quantifier_at(at).len) fail("nothing to repeat", at);
        ++i_;
        return char_node('{');
      default:
        return char_node(code_point());
    }
  }

  uint32_t code_point() {
    uint32_t cp = 0;
    const std::size_t at = i_;
    if (!next_code_point(s_, i_, cp)) fail("invalid UTF-8", at);
    return cp;
  }

  NodeP group() {
    const std::size_t open = i_++;
    if (i_ < s_.size() && s_[i_] == '?') {
      const char e = i_ + 1 < s_.size() ? s_[i_ + 1] : '\0';
      const char e2 = i_ + 2 < s_.size() ? s_[i_ + 2] : '\0';
      if (e == ':') {
        i_ += 2;
      } else if ((e == 'P' && e2 == '<') || (e == '<' && e2 != '=' && e2 != '!')) {
        i_ += e == 'P' ? 3 : 2;
        const std::size_t name_at = i_;
        while (i_ < s_.size() && (is_alnum(s_[i_]) || s_[i_] == '_')) ++i_;
        if (i_ == name_at || i_ >= s_.size() || s_[i_] != '>' ||
            (s_[name_at] >= '0' && s_[name_at] <= '9'))
          fail("bad group name", name_at);
        ++i_;
      } else if (e == 'P' && e2 == '=') {
        refuse("back-reference (?P=", open);
      } else if (e == 'P' && e2 == '>') {
        refuse("recursion (?P>", open);
      } else if (e == '=' || e == '!') {
        refuse(std::string("lookahead (?") + e, open);
      } else if (e == '<') {
        refuse(std::string("lookbehind (?<") + e2, open);
      } else if (e == '#') {
        const std::size_t close = s_.find(')', i_);
        if (close == std::string_view::npos) fail("missing ), unterminated comment", open);
        i_ = close + 1;
        return nullptr;
      } else if (e == '>') {
        refuse("atomic group (?>", open);
      } else if (e == '(') {
        refuse("conditional group (?(", open);
      } else if (e != '\0' && std::string_view("aiLmsux-").find(e) != std::string_view::npos) {
        std::size_t end = i_ + 1;
        while (end < s_.size() && s_[end] != ')' && s_[end] != ':') ++end;
        refuse("inline flags (" + std::string(s_.substr(i_, end - i_)) + ")", open);
      } else {
        fail("unknown extension (?" + std::string(1, e), open);
      }
    }
    if (++depth_ > kMaxGroupDepth)
      fail("groups nested deeper than " + std::to_string(kMaxGroupDepth), open);
    std::vector<NodeP> options{branch(false).node};
    while (i_ < s_.size() && s_[i_] == '|') {
      ++i_;
      options.push_back(branch(false).node);
    }
    --depth_;
    if (i_ >= s_.size() || s_[i_] != ')') fail("missing ), unterminated subpattern", open);
    ++i_;
    return alt(std::move(options));
  }

  uint32_t hex_digits(std::size_t count, std::size_t at, const std::string& name) {
    uint32_t v = 0;
    for (std::size_t k = 0; k < count; ++k) {
      if (i_ >= s_.size() || !is_hex(s_[i_])) fail("bad escape " + name, at);
      v = v * 16 + hex_value(s_[i_++]);
    }
    return v;
  }

  // The escape at s_[i_] ('\'), in a character class or outside one.
  Item escape(bool in_class) {
    const std::size_t at = i_;
    if (i_ + 1 >= s_.size()) fail("trailing backslash", at);
    const char c = s_[i_ + 1];
    const std::string name = std::string("\\") + c;
    i_ += 2;
    auto set = [](Ranges r) { return Item{normalize(std::move(r)), false, 0}; };
    uint32_t cp = 0;
    switch (c) {
      case 'd':
        return set(kDigit);
      case 'D':
        return set(complement(kDigit));
      case 'w':
        return set(kWord);
      case 'W':
        return set(complement(normalize(kWord)));
      case 's':
        return set(kSpace);
      case 'S':
        return set(complement(normalize(kSpace)));
      case 'n':
        cp = '\n';
        break;
      case 't':
        cp = '\t';
        break;
      case 'r':
        cp = '\r';
        break;
      case 'f':
        cp = '\f';
        break;
      case 'v':
        cp = '\v';
        break;
      case 'a':
        cp = 0x07;
        break;
      case 'b':  // only reached in a class: backspace
        cp = 0x08;
        break;
      case 'x':
        if (i_ < s_.size() && s_[i_] == '{') {
          ++i_;
          const std::size_t from = i_;
          cp = 0;
          while (i_ < s_.size() && is_hex(s_[i_]) && i_ - from < 8)
            cp = cp * 16 + hex_value(s_[i_++]);
          if (i_ == from || i_ >= s_.size() || s_[i_] != '}') fail("bad escape \\x{", at);
          ++i_;
        } else {
          cp = hex_digits(2, at, name);
        }
        break;
      case 'u':
        cp = hex_digits(4, at, name);
        break;
      case 'U':
        cp = hex_digits(8, at, name);
        break;
      case 'k':
        refuse("back-reference \\k", at);
      case 'p':
      case 'P':
        refuse("Unicode class " + name, at);
      case 'N':
        refuse("named character \\N", at);
      default: {
        const bool three_octal = c >= '0' && c <= '7' && i_ + 1 < s_.size() && s_[i_] >= '0' &&
                                 s_[i_] <= '7' && s_[i_ + 1] >= '0' && s_[i_ + 1] <= '7';
        if (c >= '0' && c <= '7' && (in_class || c == '0' || three_octal)) {  // \0, \0oo, \ooo
          cp = static_cast<uint32_t>(c - '0');
          for (int k = 0; k < 2 && i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '7'; ++k)
            cp = cp * 8 + static_cast<uint32_t>(s_[i_++] - '0');
          break;
        }
        if (c >= '1' && c <= '9' && !in_class) {
          std::size_t end = i_;
          while (end < s_.size() && s_[end] >= '0' && s_[end] <= '9') ++end;
          refuse("back-reference \\" + std::string(s_.substr(at + 1, end - at - 1)), at);
        }
        if (is_alnum(c)) fail("bad escape " + name, at);
        i_ = at + 1;  // an escaped symbol stands for itself (a UTF-8 character too)
        cp = code_point();
      }
    }
    if (cp > kMaxCodePoint) fail("code point out of range in escape " + name, at);
    if (cp >= 0xD800 && cp <= 0xDFFF) refuse("surrogate code point in escape " + name, at);
    return Item{{{cp, cp}}, true, cp};
  }

  Item class_member() {
    if (s_[i_] == '\\') {
      const std::size_t at = i_;
      const char next = i_ + 1 < s_.size() ? s_[i_ + 1] : '\0';
      if (next == 'A' || next == 'Z' || next == 'z' || next == 'B' || next == 'G')
        fail("bad escape \\" + std::string(1, next), at);
      return escape(true);
    }
    if (s_[i_] == '[' && i_ + 1 < s_.size() && s_[i_ + 1] == ':') refuse("POSIX class [:", i_);
    const uint32_t cp = code_point();
    return Item{{{cp, cp}}, true, cp};
  }

  NodeP char_class() {
    const std::size_t open = i_++;
    bool negate = false;
    if (i_ < s_.size() && s_[i_] == '^') {
      negate = true;
      ++i_;
    }
    Ranges set;
    for (bool first = true;; first = false) {
      if (i_ >= s_.size()) fail("unterminated character set", open);
      if (s_[i_] == ']' && !first) {
        ++i_;
        break;
      }
      const std::size_t at = i_;
      const Item a = class_member();
      if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
        ++i_;
        const Item b = class_member();
        if (!a.single || !b.single || b.cp < a.cp)
          fail("bad character range " + std::string(s_.substr(at, i_ - at)), at);
        set.emplace_back(a.cp, b.cp);
      } else {
        set.insert(set.end(), a.set.begin(), a.set.end());
      }
    }
    set = normalize(std::move(set));
    return set_node(negate ? complement(set) : set);
  }

  std::string_view s_;
  const Limits& lim_;
  NodeP json_char_;
  std::size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

NodeP regex_node(std::string_view re, const Limits& lim, const NodeP& json_char) {
  return RegexParser(re, lim, json_char).parse();
}

}  // namespace detail

std::string regex_to_gbnf(std::string_view regex, const Limits& lim) {
  if (regex.size() > lim.max_source_bytes)
    throw ConstraintError(
        "regex: the expression has " + std::to_string(regex.size()) +
        " bytes, over the limit max_source_bytes=" + std::to_string(lim.max_source_bytes));
  const detail::TreeBudget budget("regex", lim);
  detail::RuleSet rules;
  rules.define("root", detail::regex_node(regex, lim, nullptr));
  return rules.finish(lim, "regex", "the expression matches no string",
                      [](const std::string&) { return std::string("recursion"); });
}

}  // namespace sy::constraints
