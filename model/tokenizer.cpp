// Tokenizers from a GGUF vocabulary: SentencePiece-style BPE with byte fallback and byte-level
// (GPT-2) BPE, following llama.cpp's behaviour so that token ids match it exactly.
#include "model/tokenizer.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <queue>

#include "model/unicode_cats.hpp"

namespace sy {

namespace {

// SentencePiece writes spaces as U+2581 LOWER ONE EIGHTH BLOCK.
constexpr std::string_view kSpmSpace = "\xE2\x96\x81";

// One symbol of a word being merged: a byte range of the word, linked to its neighbours.
// A symbol merged into its left neighbour keeps n == 0.
struct Symbol {
  size_t off;
  size_t n;
  int prev;
  int next;
};

// Splits a word into one symbol per UTF-8 character (a truncated tail is one short symbol).
std::vector<Symbol> split_chars(std::string_view word) {
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  size_t off = 0;
  while (off < word.size()) {
    const size_t n = std::min(word.size() - off, utf8_len(static_cast<uint8_t>(word[off])));
    const int idx = static_cast<int>(syms.size());
    syms.push_back({off, n, idx - 1, off + n == word.size() ? -1 : idx + 1});
    off += n;
  }
  return syms;
}

// Merges the right symbol of a pair into the left one.
void merge_pair(std::vector<Symbol>& syms, int left, int right) {
  Symbol& l = syms[static_cast<size_t>(left)];
  Symbol& r = syms[static_cast<size_t>(right)];
  l.n += r.n;
  r.n = 0;
  l.next = r.next;
  if (r.next >= 0) syms[static_cast<size_t>(r.next)].prev = left;
}

// A candidate merge of two adjacent symbols. `size` is their joint length when the candidate
// was made: symbols only grow, so a changed sum means the candidate is stale.
template <typename Key>
struct Candidate {
  Key key;  // score (SPM, higher first) or rank (BPE, lower first)
  int left;
  int right;
  size_t size;
};

// ---------------------------------------------------------------------------------------------
// SentencePiece-style BPE: merges adjacent pieces by vocabulary score, byte tokens for the rest.

class SpmTokenizer final : public Tokenizer {
 public:
  std::vector<float> scores_;
  std::array<int32_t, 256> byte_ids_{};  // id of each byte's <0xNN> token, -1 when absent

 protected:
  void encode_text(std::string_view text, bool after_special,
                   std::vector<int32_t>& out) const override {
    std::string s;
    s.reserve(text.size() + 16);  // room for the prefix and a few 3-byte "▁" escapes
    if (add_space_prefix_ && after_special) s += kSpmSpace;
    for (char c : text) {
      if (c == ' ') {
        s += kSpmSpace;
      } else {
        s += c;
      }
    }
    std::vector<Symbol> syms = split_chars(s);

    using Cand = Candidate<float>;
    // Best score first; equal scores go leftmost first, as SentencePiece does.
    auto worse = [](const Cand& a, const Cand& b) {
      return a.key < b.key || (a.key == b.key && a.left > b.left);
    };
    std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> queue(worse);
    auto consider = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      const Symbol& l = syms[static_cast<size_t>(left)];
      const size_t size = l.n + syms[static_cast<size_t>(right)].n;
      const int32_t id = find_token(std::string_view(s).substr(l.off, size));
      if (id < 0) return;
      queue.push({scores_[static_cast<size_t>(id)], left, right, size});
    };
    for (size_t i = 1; i < syms.size(); ++i) consider(static_cast<int>(i) - 1, static_cast<int>(i));

    while (!queue.empty()) {
      const Cand c = queue.top();
      queue.pop();
      const Symbol& l = syms[static_cast<size_t>(c.left)];
      const Symbol& r = syms[static_cast<size_t>(c.right)];
      if (l.n == 0 || r.n == 0 || l.n + r.n != c.size) continue;
      merge_pair(syms, c.left, c.right);
      consider(syms[static_cast<size_t>(c.left)].prev, c.left);
      consider(c.left, syms[static_cast<size_t>(c.left)].next);
    }

    // Every merged piece is a vocabulary token; single characters that are not fall back to
    // their bytes.
    for (int i = syms.empty() ? -1 : 0; i >= 0; i = syms[static_cast<size_t>(i)].next) {
      const Symbol& sym = syms[static_cast<size_t>(i)];
      const std::string_view piece = std::string_view(s).substr(sym.off, sym.n);
      const int32_t id = find_token(piece);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      for (char c : piece) {
        const int32_t b = byte_ids_[static_cast<uint8_t>(c)];
        if (b >= 0) {
          out.push_back(b);
        } else if (unk_ >= 0) {
          out.push_back(unk_);
        }
      }
    }
  }

  std::string normal_piece(const std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      if (text.compare(i, kSpmSpace.size(), kSpmSpace) == 0) {
        out += ' ';
        i += kSpmSpace.size();
      } else {
        out += text[i++];
      }
    }
    return out;
  }
};

// ---------------------------------------------------------------------------------------------
// Pre-split rules of byte-level BPE, matched by hand over code points. Each splitter cuts the
// range [begin, end) of `c` and appends the word lengths in code points; positions at or after
// `end` read as no character, so no word crosses the range end.

class CptRange {
 public:
  CptRange(const std::vector<uint32_t>& c, size_t end) : c_(c), end_(end) {}
  size_t end() const { return end_; }
  uint32_t at(size_t i) const { return i < end_ ? c_[i] : kNone; }
  bool letter(size_t i) const { return i < end_ && unicode_category(c_[i]) == UnicodeCat::Letter; }
  bool number(size_t i) const { return i < end_ && unicode_category(c_[i]) == UnicodeCat::Number; }
  bool space(size_t i) const { return i < end_ && unicode_is_whitespace(c_[i]); }
  bool newline(size_t i) const { return i < end_ && (c_[i] == '\r' || c_[i] == '\n'); }
  // [^\s\p{L}\p{N}]: any character that is not white space, letter or number.
  bool other(size_t i) const { return i < end_ && !space(i) && !letter(i) && !number(i); }

 private:
  static constexpr uint32_t kNone = 0xFFFFFFFF;  // not a code point: matches no class
  const std::vector<uint32_t>& c_;
  size_t end_;
};

// 's|'t|'re|'ve|'m|'ll|'d at pos: the match length, 0 for none. Llama 3 matches them in any case
// ((?i:...)); like llama.cpp only ASCII letters fold, so U+017F "ſ" is not an "s" here.
size_t match_contraction(const CptRange& r, size_t pos, bool any_case) {
  if (r.at(pos) != '\'') return 0;
  auto low = [&](size_t i) {
    const uint32_t cp = r.at(i);
    return any_case && cp >= 'A' && cp <= 'Z' ? cp + ('a' - 'A') : cp;
  };
  const uint32_t a = low(pos + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  const uint32_t b = low(pos + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// End of the white-space word at pos, \s+(?!\S)|\s+: a run followed by more text leaves its last
// space to lead the next word. A position that is no space (unreachable: every character is a
// letter, number, space or other) becomes a word of its own, as in llama.cpp.
size_t space_word_end(const CptRange& r, size_t pos) {
  size_t ws = 0;
  while (r.space(pos + ws)) ++ws;
  if (ws > 1 && pos + ws < r.end()) return pos + ws - 1;
  return pos + std::max<size_t>(ws, 1);
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void split_gpt2(const std::vector<uint32_t>& c, size_t begin, size_t end,
                std::vector<size_t>& lens) {
  const CptRange r(c, end);
  for (size_t pos = begin; pos < end;) {
    const size_t start = pos;
    if (const size_t n = match_contraction(r, pos, false)) {
      pos += n;
    } else if (const size_t body = r.at(pos) == ' ' ? pos + 1 : pos;
               r.letter(body) || r.number(body) || r.other(body)) {
      // An optional leading space joins one run of letters, of numbers or of "other".
      pos = body;
      if (r.letter(pos)) {
        while (r.letter(pos)) ++pos;
      } else if (r.number(pos)) {
        while (r.number(pos)) ++pos;
      } else {
        while (r.other(pos)) ++pos;
      }
    } else {
      pos = space_word_end(r, pos);
    }
    lens.push_back(pos - start);
  }
}

// Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Qwen2 is the same rule with \p{N} for \p{N}{1,3}: `max_digits` is 3 or 1.
// The first alternative that matches at pos wins, each as long as it goes.
void split_llama3(const std::vector<uint32_t>& c, size_t begin, size_t end, size_t max_digits,
                  std::vector<size_t>& lens) {
  const CptRange r(c, end);
  for (size_t pos = begin; pos < end;) {
    const size_t start = pos;
    if (const size_t n = match_contraction(r, pos, true)) {
      pos += n;
    } else if (r.letter(pos) || (!r.newline(pos) && !r.number(pos) && r.letter(pos + 1))) {
      // A letter run, with one leading character that is no newline, letter or number.
      ++pos;
      while (r.letter(pos)) ++pos;
    } else if (r.number(pos)) {
      // Numbers go in words of at most max_digits digits, counted from the left.
      while (r.number(pos) && pos - start < max_digits) ++pos;
    } else if (const size_t body = r.at(pos) == ' ' ? pos + 1 : pos; r.other(body)) {
      pos = body;
      while (r.other(pos)) ++pos;
      while (r.newline(pos)) ++pos;
    } else {
      // \s*[\r\n]+ reaches the last newline of the white-space run; without one, the GPT-2 rule.
      size_t last_nl = 0;
      for (size_t i = pos; r.space(i); ++i) {
        if (r.newline(i)) last_nl = i + 1;
      }
      pos = last_nl > 0 ? last_nl : space_word_end(r, pos);
    }
    lens.push_back(pos - start);
  }
}

// Cuts every word in `lens` (lengths from position 0 of c) into maximal runs of characters that
// do and do not satisfy `pred`.
template <typename Pred>
std::vector<size_t> split_runs(const std::vector<uint32_t>& c, const std::vector<size_t>& lens,
                               Pred pred) {
  std::vector<size_t> out;
  out.reserve(lens.size());
  size_t start = 0;
  for (size_t len : lens) {
    const size_t end = start + len;
    for (size_t pos = start; pos < end;) {
      const bool kind = pred(c[pos]);
      size_t next = pos + 1;
      while (next < end && pred(c[next]) == kind) ++next;
      out.push_back(next - pos);
      pos = next;
    }
    start = end;
  }
  return out;
}

// One regex of a sequence, applied as llama.cpp applies it (std::regex_iterator over each word):
// within every word of `lens`, each match becomes a word, and so does each stretch of text
// between two matches. `match(r, pos)` gives the length of the regex's match at pos, 0 for none;
// the search goes left to right and matches do not overlap. No regex here matches empty text.
template <typename Match>
std::vector<size_t> split_matches(const std::vector<uint32_t>& c, const std::vector<size_t>& lens,
                                  Match match) {
  std::vector<size_t> out;
  out.reserve(lens.size());
  size_t start = 0;
  for (size_t len : lens) {
    const size_t end = start + len;
    const CptRange r(c, end);
    size_t gap = start;  // start of the text not yet emitted
    for (size_t pos = start; pos < end;) {
      if (const size_t n = match(r, pos)) {
        if (pos > gap) out.push_back(pos - gap);
        out.push_back(n);
        pos += n;
        gap = pos;
      } else {
        ++pos;
      }
    }
    if (end > gap) out.push_back(end - gap);
    start = end;
  }
  return out;
}

// The GPT-2 rule over every word of `lens`. llama.cpp's sequences list it without its final
// \s+, but its hand-coded GPT-2 splitter serves them and ends runs of spaces the same way (and
// with std::regex the unmatched single white-space character would be a word of its own too).
std::vector<size_t> split_gpt2_words(const std::vector<uint32_t>& c,
                                     const std::vector<size_t>& lens) {
  std::vector<size_t> out;
  size_t start = 0;
  for (size_t len : lens) {
    split_gpt2(c, start, start + len, out);
    start += len;
  }
  return out;
}

bool is_number(uint32_t cp) {
  return unicode_category(cp) == UnicodeCat::Number;
}
bool is_newline(uint32_t cp) {
  return cp == '\r' || cp == '\n';
}

// [\p{P}\$\+<=>\^~\|]: punctuation and the ASCII symbols llama.cpp's default rule adds.
bool is_punct_like(uint32_t cp) {
  if (unicode_category(cp) == UnicodeCat::Punct) return true;
  return cp == '$' || cp == '+' || cp == '<' || cp == '=' || cp == '>' || cp == '^' || cp == '~' ||
         cp == '|';
}

// [0-9][0-9][0-9]: three ASCII digits.
size_t match_three_digits(const CptRange& r, size_t pos) {
  auto digit = [&](size_t i) { return r.at(i) >= '0' && r.at(i) <= '9'; };
  return digit(pos) && digit(pos + 1) && digit(pos + 2) ? 3 : 0;
}

// A single character of a class, as a regex: "[\r\n]" or "\p{N}" without a quantifier.
template <typename Pred>
auto match_one(Pred pred) {
  return [pred](const CptRange& r, size_t pos) -> size_t {
    return pos < r.end() && pred(r.at(pos)) ? 1 : 0;
  };
}

// \s?X+ for a class X: one optional white-space character, then a run of X.
template <typename Pred>
auto match_space_run(Pred pred) {
  return [pred](const CptRange& r, size_t pos) -> size_t {
    size_t p = pos;
    if (r.space(p) && p + 1 < r.end() && pred(r.at(p + 1))) ++p;
    if (p >= r.end() || !pred(r.at(p))) return 0;
    while (p < r.end() && pred(r.at(p))) ++p;
    return p - pos;
  };
}

// A code point in a sorted table of inclusive ranges.
struct CpRange {
  uint32_t first;
  uint32_t last;
};
template <size_t N>
bool in_ranges(const CpRange (&table)[N], uint32_t cp) {
  const auto* it = std::upper_bound(table, table + N, cp,
                                    [](uint32_t v, const CpRange& r) { return v < r.first; });
  return it != table && cp <= (it - 1)->last;
}

// The character classes that DeepSeek's rules spell out as code point ranges. llama.cpp matches
// these regexes on the code points themselves, after turning every non-ASCII white-space
// character into U+000B, so no white space ever belongs to them.
//
// The cased letters of deepseek-llm's \s?[A-Za-zµÀ-ÖØ-öø-ƺ...𞤀-𞥃]+ (Lu, Ll and Lt of a subset of
// scripts).
constexpr CpRange kDeepseekLetters[] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},
    {0xD8, 0xF6},       {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},
    {0x295, 0x2AF},     {0x370, 0x373},     {0x376, 0x377},     {0x37B, 0x37D},
    {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},     {0x38C, 0x38C},
    {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},
    {0x1C90, 0x1CBA},   {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},
    {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},   {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},
    {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},   {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB},   {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},
    {0x2102, 0x2102},   {0x2107, 0x2107},   {0x210A, 0x2113},   {0x2115, 0x2115},
    {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},   {0x2128, 0x2128},
    {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},
    {0x2C7E, 0x2CE4},   {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},
    {0xA680, 0xA69B},   {0xA722, 0xA76F},   {0xA771, 0xA787},   {0xA78B, 0xA78E},
    {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},   {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
// deepseek-llm's \s?[!-/:-~！-／：-～‘-‟　-。]+: ASCII punctuation and symbols, their
// full-width forms, curly quotes and the first CJK punctuation (U+3000 itself is white space).
constexpr CpRange kDeepseekPunct[] = {
    {0x21, 0x2F},     {0x3A, 0x7E},     {0x2018, 0x201F},
    {0x3000, 0x3002}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E},
};
// [一-龥ࠀ-一가-퟿]+ of both DeepSeek rules: U+4E00..U+9FA5, U+0800..U+4E00 and U+AC00..U+D7FF.
constexpr CpRange kDeepseekCjk[] = {{0x0800, 0x9FA5}, {0xAC00, 0xD7FF}};

bool deepseek_letter(uint32_t cp) {
  return in_ranges(kDeepseekLetters, cp);
}
bool deepseek_punct(uint32_t cp) {
  return in_ranges(kDeepseekPunct, cp) && !unicode_is_whitespace(cp);
}
bool deepseek_cjk(uint32_t cp) {
  return in_ranges(kDeepseekCjk, cp) && !unicode_is_whitespace(cp);
}

// \s+$: the white space that ends a word (the whole word when it is all white space).
std::vector<size_t> split_trailing_space(const std::vector<uint32_t>& c,
                                         const std::vector<size_t>& lens) {
  std::vector<size_t> out;
  out.reserve(lens.size());
  size_t start = 0;
  for (size_t len : lens) {
    size_t tail = 0;
    while (tail < len && unicode_is_whitespace(c[start + len - 1 - tail])) ++tail;
    if (len > tail) out.push_back(len - tail);
    if (tail > 0) out.push_back(tail);
    start += len;
  }
  return out;
}

// llama.cpp's "default" rules: four regexes applied in turn, each cutting every word of the
// previous one into its matches and the text between them: [\p{P}\$\+<=>\^~\|]+, the GPT-2 rule,
// \p{N}+, then [0-9][0-9][0-9] (ASCII digits only, leftmost matches first).
std::vector<size_t> split_default(const std::vector<uint32_t>& c) {
  std::vector<size_t> lens = split_runs(c, {c.size()}, is_punct_like);
  lens = split_runs(c, split_gpt2_words(c, lens), is_number);
  return split_matches(c, lens, match_three_digits);
}

// "falcon": [\p{P}\$\+<=>\^~\|`]+, the GPT-2 rule, then [0-9][0-9][0-9].
std::vector<size_t> split_falcon(const std::vector<uint32_t>& c) {
  std::vector<size_t> lens =
      split_runs(c, {c.size()}, [](uint32_t cp) { return cp == '`' || is_punct_like(cp); });
  return split_matches(c, split_gpt2_words(c, lens), match_three_digits);
}

// "starcoder" (also "refact", "command-r", "smollm", ...): \p{N} (every digit a word), then the
// GPT-2 rule.
std::vector<size_t> split_starcoder(const std::vector<uint32_t>& c) {
  const std::vector<size_t> lens = split_matches(c, {c.size()}, match_one(is_number));
  return split_gpt2_words(c, lens);
}

// "deepseek-coder": [\r\n], \s?\p{L}+, \s?\p{P}+, [一-龥ࠀ-一가-퟿]+, \p{N}.
std::vector<size_t> split_deepseek_coder(const std::vector<uint32_t>& c) {
  std::vector<size_t> lens = split_matches(c, {c.size()}, match_one(is_newline));
  lens = split_matches(c, lens, match_space_run([](uint32_t cp) {
                         return unicode_category(cp) == UnicodeCat::Letter;
                       }));
  lens = split_matches(c, lens, match_space_run([](uint32_t cp) {
                         return unicode_category(cp) == UnicodeCat::Punct;
                       }));
  lens = split_runs(c, lens, deepseek_cjk);
  return split_matches(c, lens, match_one(is_number));
}

// "deepseek-llm": [\r\n], \s?[cased letters]+, \s?[punctuation]+, \s+$, [一-龥ࠀ-一가-퟿]+,
// \p{N}+.
std::vector<size_t> split_deepseek_llm(const std::vector<uint32_t>& c) {
  std::vector<size_t> lens = split_matches(c, {c.size()}, match_one(is_newline));
  lens = split_matches(c, lens, match_space_run(deepseek_letter));
  lens = split_matches(c, lens, match_space_run(deepseek_punct));
  lens = split_trailing_space(c, lens);
  lens = split_runs(c, lens, deepseek_cjk);
  return split_runs(c, lens, is_number);
}

// The word lengths of `rules` over all of c.
std::vector<size_t> split_words(Tokenizer::PreSplit rules, const std::vector<uint32_t>& c) {
  std::vector<size_t> lens;
  switch (rules) {
    case Tokenizer::PreSplit::Gpt2:
      split_gpt2(c, 0, c.size(), lens);
      break;
    case Tokenizer::PreSplit::Llama3:
      split_llama3(c, 0, c.size(), 3, lens);
      break;
    case Tokenizer::PreSplit::Qwen2:
      split_llama3(c, 0, c.size(), 1, lens);
      break;
    case Tokenizer::PreSplit::Default:
      lens = split_default(c);
      break;
    case Tokenizer::PreSplit::DeepseekLlm:
      lens = split_deepseek_llm(c);
      break;
    case Tokenizer::PreSplit::DeepseekCoder:
      lens = split_deepseek_coder(c);
      break;
    case Tokenizer::PreSplit::Falcon:
      lens = split_falcon(c);
      break;
    case Tokenizer::PreSplit::Starcoder:
      lens = split_starcoder(c);
      break;
    case Tokenizer::PreSplit::None:
      if (!c.empty()) lens.push_back(c.size());
      break;
  }
  return lens;
}

// ---------------------------------------------------------------------------------------------
// Byte-level BPE (GPT-2): pre-split into words, bytes mapped to printable characters, ranked
// merges within each word.

class BpeTokenizer final : public Tokenizer {
 public:
  std::unordered_map<std::string, int32_t, StringViewHash, std::equal_to<>>
      ranks_;                              // "a b" -> rank
  std::array<std::string, 256> byte_enc_;  // UTF-8 of the character standing for each byte
  std::vector<int16_t> cp_to_byte_;        // reverse of byte_enc_, -1 for other code points

  BpeTokenizer() {
    // GPT-2's byte mapping: printable Latin-1 bytes stand for themselves, the other 68 bytes
    // take the code points from U+0100 on, in byte order.
    uint32_t next = 256;
    cp_to_byte_.assign(256 + 68, -1);
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? b : next++;
      append_utf8(byte_enc_[b], cp);
      cp_to_byte_[cp] = static_cast<int16_t>(b);
    }
  }

 protected:
  void encode_text(std::string_view text, bool, std::vector<int32_t>& out) const override {
    const std::vector<uint32_t> cpts = utf8_to_cpts(text);
    std::string word;
    std::string utf8;
    size_t start = 0;
    for (size_t len : split_words(pre_, cpts)) {
      word.clear();
      for (size_t i = start; i < start + len; ++i) {
        utf8.clear();
        append_utf8(utf8, cpts[i]);
        for (char c : utf8) word += byte_enc_[static_cast<uint8_t>(c)];
      }
      start += len;
      // Llama 3 takes a word that is a token as it is, even where its merges would not build it.
      if (ignore_merges_) {
        if (const int32_t id = find_token(word); id >= 0) {
          out.push_back(id);
          continue;
        }
      }
      encode_word(word, out);
    }
  }

  std::string normal_piece(const std::string& text) const override {
    std::string out;
    for (uint32_t cp : utf8_to_cpts(text)) {
      if (cp < cp_to_byte_.size() && cp_to_byte_[cp] >= 0) {
        out += static_cast<char>(cp_to_byte_[cp]);
      } else {
        append_utf8(out, cp);  // not from the byte mapping: keep the character itself
      }
    }
    return out;
  }

 private:
  int32_t rank(std::string_view left, std::string_view right, std::string& key) const {
    key.assign(left);
    key += ' ';
    key += right;
    const auto it = ranks_.find(std::string_view(key));
    return it == ranks_.end() ? -1 : it->second;
  }

  void encode_word(const std::string& word, std::vector<int32_t>& out) const {
    std::vector<Symbol> syms = split_chars(word);
    const std::string_view w(word);
    std::string key;

    using Cand = Candidate<int32_t>;
    // Lowest rank first; equal ranks go leftmost first.
    auto worse = [](const Cand& a, const Cand& b) {
      return a.key > b.key || (a.key == b.key && a.left > b.left);
    };
    std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> queue(worse);
    auto consider = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      const Symbol& l = syms[static_cast<size_t>(left)];
      const Symbol& r = syms[static_cast<size_t>(right)];
      const int32_t rk = rank(w.substr(l.off, l.n), w.substr(r.off, r.n), key);
      if (rk < 0) return;
      queue.push({rk, left, right, l.n + r.n});
    };
    for (size_t i = 1; i < syms.size(); ++i) consider(static_cast<int>(i) - 1, static_cast<int>(i));

    while (!queue.empty()) {
      const Cand c = queue.top();
      queue.pop();
      const Symbol& l = syms[static_cast<size_t>(c.left)];
      const Symbol& r = syms[static_cast<size_t>(c.right)];
      if (l.n == 0 || r.n == 0 || l.n + r.n != c.size) continue;
      merge_pair(syms, c.left, c.right);
      consider(syms[static_cast<size_t>(c.left)].prev, c.left);
      consider(c.left, syms[static_cast<size_t>(c.left)].next);
    }

    for (const Symbol& sym : syms) {
      if (sym.n == 0) continue;
      const std::string_view piece = w.substr(sym.off, sym.n);
      const int32_t id = find_token(piece);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      // Not in the vocabulary (a vocabulary without all 256 byte characters): keep whatever
      // single bytes it has, as llama.cpp does.
      for (char ch : piece) {
        const int32_t b = find_token(std::string_view(&ch, 1));
        if (b >= 0) out.push_back(b);
      }
    }
  }
};

// Reads a token id key; absent or out-of-range values keep the default, as llama.cpp does.
int32_t read_id(const gguf::File& f, std::string_view key, int32_t fallback, int32_t n_vocab) {
  if (fallback >= n_vocab) fallback = -1;
  const auto v = f.get_int(key);
  if (!v || *v < 0 || *v >= n_vocab) return fallback;
  return static_cast<int32_t>(*v);
}

bool read_bool(const gguf::File& f, std::string_view key, bool fallback) {
  const auto v = f.get_int(key);
  return v ? *v != 0 : fallback;
}

// What a tokenizer.ggml.pre name selects: the pre-split rules and the flags llama.cpp sets with
// them (clean_spaces off for some; Llama 3's vocabularies also add BOS and take a pre-split
// word that is a token whole).
struct PreTokenizer {
  std::string_view name;
  Tokenizer::PreSplit rules;
  bool clean_spaces;
  bool llama3_flags;
};

// The names llama.cpp maps to the rule sequences implemented here.
constexpr PreTokenizer kPreTokenizers[] = {
    {"default", Tokenizer::PreSplit::Default, true, false},
    {"gpt-2", Tokenizer::PreSplit::Gpt2, true, false},
    {"phi-2", Tokenizer::PreSplit::Gpt2, true, false},
    {"jina-es", Tokenizer::PreSplit::Gpt2, true, false},
    {"jina-de", Tokenizer::PreSplit::Gpt2, true, false},
    {"jina-v2-es", Tokenizer::PreSplit::Gpt2, true, false},
    {"jina-v2-de", Tokenizer::PreSplit::Gpt2, true, false},
    {"jina-v2-code", Tokenizer::PreSplit::Gpt2, true, false},
    {"mpt", Tokenizer::PreSplit::Gpt2, true, false},
    {"olmo", Tokenizer::PreSplit::Gpt2, true, false},
    {"jais", Tokenizer::PreSplit::Gpt2, true, false},
    {"llama3", Tokenizer::PreSplit::Llama3, true, true},
    {"llama-v3", Tokenizer::PreSplit::Llama3, true, true},
    {"llama-bpe", Tokenizer::PreSplit::Llama3, true, true},
    {"falcon3", Tokenizer::PreSplit::Llama3, true, true},
    {"falcon-h1", Tokenizer::PreSplit::Llama3, true, true},
    {"pixtral", Tokenizer::PreSplit::Llama3, true, true},
    {"midm-2.0", Tokenizer::PreSplit::Llama3, true, true},
    {"lfm2", Tokenizer::PreSplit::Llama3, true, true},
    {"jina-v5-nano", Tokenizer::PreSplit::Llama3, true, true},
    {"dbrx", Tokenizer::PreSplit::Llama3, true, false},
    {"smaug-bpe", Tokenizer::PreSplit::Llama3, true, false},
    {"qwen2", Tokenizer::PreSplit::Qwen2, false, false},
    {"deepseek-r1-qwen", Tokenizer::PreSplit::Qwen2, false, false},
    {"stablelm2", Tokenizer::PreSplit::Qwen2, true, false},
    {"megrez", Tokenizer::PreSplit::Qwen2, true, false},
    {"deepseek-llm", Tokenizer::PreSplit::DeepseekLlm, false, false},
    {"deepseek-coder", Tokenizer::PreSplit::DeepseekCoder, false, false},
    {"falcon", Tokenizer::PreSplit::Falcon, true, false},
    {"starcoder", Tokenizer::PreSplit::Starcoder, true, false},
    {"refact", Tokenizer::PreSplit::Starcoder, true, false},
    {"command-r", Tokenizer::PreSplit::Starcoder, false, false},
    {"smollm", Tokenizer::PreSplit::Starcoder, false, false},
    {"codeshell", Tokenizer::PreSplit::Starcoder, true, false},
    {"exaone", Tokenizer::PreSplit::Starcoder, true, false},
    {"minerva-7b", Tokenizer::PreSplit::Starcoder, true, false},
};

// The pre-tokenizer named by tokenizer.ggml.pre, as llama.cpp maps the names. No key (or an
// empty one) means llama.cpp's "default" rules: llama.cpp does the same, warning that quality
// suffers, and `assumed` lets callers warn too. Any other unknown name is an error, as in current
// llama.cpp: guessing a rule would give ids that silently differ from the model's training.
const PreTokenizer& bpe_pre_tokenizer(const gguf::File& f, bool& assumed) {
  const std::string pre = f.get_string("tokenizer.ggml.pre").value_or("");
  assumed = pre.empty();
  for (const PreTokenizer& p : kPreTokenizers) {
    if (p.name == (assumed ? std::string_view("default") : std::string_view(pre))) return p;
  }
  throw gguf::Error("tokenizer: unsupported BPE pre-tokenizer '" + pre +
                    "' (supported: " + std::string(Tokenizer::supported_pre_tokenizers()) + ")");
}

// llama.cpp's clean_spaces passes of llama_detokenize, done in place as it does them (the
// passes read characters they have already moved, so the order of operations matters): drop the
// space before " ?", " !", " .", " ,"; turn " ' " into "'"; drop the space before " 's", " 'm",
// " 're", " 've" (but not before " 't", " 'd", " 'll").
void clean_spaces_in_place(std::string& t) {
  // Pass 1: a space before ?!.,
  size_t n = t.size();
  size_t total = n > 0 ? 1 : 0;
  for (size_t i = 1; i < n; ++i) {
    const char x = t[i];
    if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --total;
    t[total++] = x;
  }
  // Pass 2: " ' " becomes "'"; the space after is blanked to NUL and skipped.
  n = total;
  total = n > 0 ? 1 : 0;
  for (size_t i = 1; i < n; ++i) {
    const char x = t[i];
    if (x == '\'' && i + 1 < n && t[i - 1] == ' ' && t[i + 1] == ' ') {
      --total;
      t[++i] = '\0';
    }
    t[total++] = x;
  }
  // Pass 3: contractions that llama.cpp glues back to their word.
  n = total;
  total = n > 0 ? 1 : 0;
  for (size_t i = 1; i < n; ++i) {
    const char x = t[i];
    if (t[i - 1] == ' ' && x == '\'' && i + 1 < n) {
      const char x1 = t[i + 1];
      if (x1 == 's' || x1 == 'm') {
        --total;
      } else if (i + 2 < n && ((x1 == 'r' && t[i + 2] == 'e') || (x1 == 'v' && t[i + 2] == 'e'))) {
        --total;
      }
    }
    t[total++] = x;
  }
  t.resize(total);
}

}  // namespace

namespace tokenizer_detail {

std::vector<std::string> pre_split(Tokenizer::PreSplit rules, std::string_view text) {
  const std::vector<uint32_t> cpts = utf8_to_cpts(text);
  std::vector<std::string> words;
  size_t start = 0;
  for (size_t len : split_words(rules, cpts)) {
    std::string& w = words.emplace_back();
    for (size_t i = start; i < start + len; ++i) append_utf8(w, cpts[i]);
    start += len;
  }
  return words;
}

}  // namespace tokenizer_detail

// ---------------------------------------------------------------------------------------------

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::File& f) {
  const auto model = f.get_string("tokenizer.ggml.model");
  if (!model) throw gguf::Error("tokenizer: no tokenizer.ggml.model key");
  auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (!tokens || tokens->empty()) throw gguf::Error("tokenizer: no tokenizer.ggml.tokens array");

  std::unique_ptr<Tokenizer> tok;
  SpmTokenizer* spm = nullptr;
  BpeTokenizer* bpe = nullptr;
  const PreTokenizer* pre = nullptr;
  if (*model == "llama") {
    auto p = std::make_unique<SpmTokenizer>();
    spm = p.get();
    tok = std::move(p);
    tok->kind_ = Kind::Spm;
  } else if (*model == "gpt2") {
    auto p = std::make_unique<BpeTokenizer>();
    bpe = p.get();
    tok = std::move(p);
    tok->kind_ = Kind::Bpe;
    pre = &bpe_pre_tokenizer(f, tok->pre_assumed_);
    tok->pre_ = pre->rules;
  } else {
    throw gguf::Error("tokenizer: unsupported tokenizer.ggml.model '" + *model + "'");
  }

  Tokenizer& t = *tok;
  const size_t n = tokens->size();
  if (n > static_cast<size_t>(INT32_MAX)) throw gguf::Error("tokenizer: vocabulary too large");
  const auto n_vocab = static_cast<int32_t>(n);
  t.tokens_ = std::move(*tokens);
  t.types_.assign(n, TokenType::Normal);
  if (const auto types = f.get_int_array("tokenizer.ggml.token_type")) {
    if (types->size() != n) throw gguf::Error("tokenizer: token_type length differs from tokens");
    for (size_t i = 0; i < n; ++i) {
      const int64_t v = (*types)[i];
      t.types_[i] = v >= 1 && v <= 6 ? static_cast<TokenType>(v) : TokenType::Undefined;
    }
  }
  t.text_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    // An empty token could never be matched; llama.cpp renames it the same way.
    if (t.tokens_[i].empty()) t.tokens_[i] = "[EMPTY_" + std::to_string(i) + "]";
    t.text_to_id_[t.tokens_[i]] = static_cast<int32_t>(i);  // a later duplicate wins
  }

  if (spm) {
    spm->scores_.assign(n, 0.0f);
    if (const auto scores = f.get_float_array("tokenizer.ggml.scores")) {
      if (scores->size() != n) throw gguf::Error("tokenizer: scores length differs from tokens");
      spm->scores_ = *scores;
    }
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      int32_t id = t.find_token(name);
      if (id < 0) id = t.find_token(std::string(1, static_cast<char>(b)));
      spm->byte_ids_[static_cast<size_t>(b)] = id;
    }
    // llama.cpp's defaults for SentencePiece vocabularies.
    t.bos_ = read_id(f, "tokenizer.ggml.bos_token_id", 1, n_vocab);
    t.eos_ = read_id(f, "tokenizer.ggml.eos_token_id", 2, n_vocab);
    t.unk_ = read_id(f, "tokenizer.ggml.unknown_token_id", 0, n_vocab);
    t.add_bos_ = true;
    t.add_space_prefix_ = true;
  } else {
    const auto merges = f.get_string_array("tokenizer.ggml.merges");
    if (!merges) throw gguf::Error("tokenizer: gpt2 vocabulary without tokenizer.ggml.merges");
    bpe->ranks_.reserve(merges->size());
    for (size_t i = 0; i < merges->size(); ++i) {
      // The first merge listed wins if one repeats.
      bpe->ranks_.emplace((*merges)[i], static_cast<int32_t>(i));
    }
    // llama.cpp's defaults for byte-level BPE vocabularies (11 is its historical placeholder).
    t.bos_ = read_id(f, "tokenizer.ggml.bos_token_id", 11, n_vocab);
    t.eos_ = read_id(f, "tokenizer.ggml.eos_token_id", 11, n_vocab);
    t.unk_ = read_id(f, "tokenizer.ggml.unknown_token_id", -1, n_vocab);
    t.add_space_prefix_ = false;
    t.clean_spaces_ = pre->clean_spaces;
    // Llama 3 starts every prompt with <|begin_of_text|> unless add_bos_token says otherwise.
    t.add_bos_ = pre->llama3_flags;
    t.ignore_merges_ = pre->llama3_flags;
  }
  t.add_bos_ = read_bool(f, "tokenizer.ggml.add_bos_token", t.add_bos_);
  t.add_eos_ = read_bool(f, "tokenizer.ggml.add_eos_token", false);
  t.add_space_prefix_ = read_bool(f, "tokenizer.ggml.add_space_prefix", t.add_space_prefix_);
  t.eot_ = read_id(f, "tokenizer.ggml.eot_token_id", -1, n_vocab);
  t.eom_ = read_id(f, "tokenizer.ggml.eom_token_id", -1, n_vocab);

  // End-of-generation tokens: the declared ones plus those llama.cpp recognizes by text, which
  // it also treats as control tokens whatever their declared type. Without an eot_token_id the
  // first of kEotTexts present is the EOT (Llama 3: <|eot_id|> before <|end_of_text|>); llama.cpp
  // takes whichever its hash map yields first, so this order is our choice for vocabularies
  // with several.
  static constexpr std::string_view kEotTexts[] = {
      "<|eot_id|>",      "<|im_end|>", "<|end|>", "<end_of_turn>",      "<|endoftext|>",
      "<|end_of_text|>", "<EOT>",      "_<EOT>",  "<end_of_utterance>",
  };
  static constexpr std::string_view kEogTexts[] = {
      "<|eot_id|>", "<|im_end|>",    "<|end|>",         "<|return|>",
      "<|call|>",   "<end_of_turn>", "<|endoftext|>",   "<|eom_id|>",
      "<EOT>",      "_<EOT>",        "<|end_of_text|>", "<end_of_utterance>",
  };
  for (std::string_view text : kEotTexts) {
    const int32_t id = t.find_token(text);
    if (id >= 0 && t.eot_ < 0) t.eot_ = id;
  }
  if (t.eom_ < 0) t.eom_ = t.find_token("<|eom_id|>");
  for (std::string_view text : kEogTexts) {
    const int32_t id = t.find_token(text);
    if (id < 0) continue;
    t.types_[static_cast<size_t>(id)] = TokenType::Control;
    t.eog_.push_back(id);
  }
  for (int32_t id : {t.eos_, t.eot_, t.eom_}) {
    if (id >= 0) t.eog_.push_back(id);
  }
  std::sort(t.eog_.begin(), t.eog_.end());
  t.eog_.erase(std::unique(t.eog_.begin(), t.eog_.end()), t.eog_.end());

  for (size_t i = 0; i < n; ++i) {
    const TokenType ty = t.types_[i];
    if (ty == TokenType::Control || ty == TokenType::UserDefined || ty == TokenType::Unknown) {
      t.special_.push_back(static_cast<int32_t>(i));
    }
  }
  // Longest first, so that a special token containing another one is matched whole.
  std::stable_sort(t.special_.begin(), t.special_.end(), [&](int32_t a, int32_t b) {
    return t.tokens_[static_cast<size_t>(a)].size() > t.tokens_[static_cast<size_t>(b)].size();
  });
  return tok;
}

int32_t Tokenizer::find_token(std::string_view text) const {
  const auto it = text_to_id_.find(text);
  return it == text_to_id_.end() ? -1 : it->second;
}

std::string Tokenizer::supported_pre_tokenizers() {
  std::string out;
  for (const PreTokenizer& p : kPreTokenizers) {
    if (!out.empty()) out += ", ";
    out += p.name;
  }
  return out;
}

bool Tokenizer::is_eog(int32_t id) const {
  return std::binary_search(eog_.begin(), eog_.end(), id);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  // Cut the text at special tokens first: a fragment is either one token or plain text.
  struct Fragment {
    int32_t id;  // -1 for plain text
    std::string_view text;
  };
  std::vector<Fragment> frags;
  if (!text.empty()) frags.push_back({-1, text});
  for (int32_t sid : special_) {
    const TokenType ty = types_[static_cast<size_t>(sid)];
    if (!parse_special && ty != TokenType::UserDefined) continue;
    const std::string& st = tokens_[static_cast<size_t>(sid)];
    std::vector<Fragment> next;
    next.reserve(frags.size());
    for (const Fragment& fr : frags) {
      if (fr.id >= 0) {
        next.push_back(fr);
        continue;
      }
      std::string_view rest = fr.text;
      for (size_t at; (at = rest.find(st)) != std::string_view::npos;) {
        if (at > 0) next.push_back({-1, rest.substr(0, at)});
        next.push_back({sid, {}});
        rest.remove_prefix(at + st.size());
      }
      if (!rest.empty()) next.push_back({-1, rest});
    }
    frags = std::move(next);
  }

  std::vector<int32_t> out;
  out.reserve(text.size() / 2 + 2);  // a rough guess; real text averages several bytes a token
  if (add_special && add_bos_ && bos_ >= 0) out.push_back(bos_);
  bool after_special = true;
  for (const Fragment& fr : frags) {
    if (fr.id >= 0) {
      out.push_back(fr.id);
      after_special = true;
    } else {
      encode_text(fr.text, after_special, out);
      after_special = false;
    }
  }
  if (add_special && add_eos_ && eos_ >= 0) out.push_back(eos_);
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id, bool special) const {
  if (id < 0 || id >= n_vocab()) return {};
  const std::string& text = tokens_[static_cast<size_t>(id)];
  switch (types_[static_cast<size_t>(id)]) {
    case TokenType::Normal:
      return normal_piece(text);
    case TokenType::UserDefined:
      return text;
    case TokenType::Control:
    case TokenType::Unknown:
      return special ? text : std::string();
    case TokenType::Byte: {
      // "<0xNN>" names the byte; a byte token in another form stands for its own text.
      if (text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>') {
        return std::string(1, static_cast<char>(std::stoi(text.substr(3, 2), nullptr, 16)));
      }
      return normal_piece(text);
    }
    case TokenType::Unused:
    case TokenType::Undefined:
      break;
  }
  return {};
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool strip_leading_space) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string piece = token_to_piece(ids[i]);
    // llama.cpp removes the dummy-prefix space from the very first token only.
    if (i == 0 && strip_leading_space && add_space_prefix_ && !piece.empty() && piece[0] == ' ') {
      piece.erase(0, 1);
    }
    out += piece;
  }
  return out;
}

std::string Tokenizer::detokenize(const std::vector<int32_t>& ids, bool remove_special,
                                  bool unparse_special) const {
  size_t first = 0;
  size_t last = ids.size();
  bool remove_space = add_space_prefix_;
  if (remove_special && add_bos_ && last > 0 && ids[0] == bos_) {
    remove_space = false;  // the text after BOS kept its own leading space when encoded
    first = 1;
  }
  if (remove_special && add_eos_ && last > first && ids[last - 1] == eos_) --last;
  std::string out;
  for (size_t i = first; i < last; ++i) {
    std::string piece = token_to_piece(ids[i], unparse_special);
    // Only the first token's dummy-prefix space goes, and only one space of it.
    if (remove_space && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    remove_space = false;
    out += piece;
  }
  if (clean_spaces_) clean_spaces_in_place(out);
  return out;
}

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  const size_t n = pending_.size();
  size_t cut = n;
  // Look back over at most 4 bytes (the longest UTF-8 sequence) for the last lead byte.
  for (size_t k = 1; k <= 4 && k <= n; ++k) {
    const auto b = static_cast<uint8_t>(pending_[n - k]);
    if ((b & 0xC0) == 0x80) continue;
    const size_t need = (b & 0x80) == 0      ? 1
                        : (b & 0xE0) == 0xC0 ? 2
                        : (b & 0xF0) == 0xE0 ? 3
                        : (b & 0xF8) == 0xF0 ? 4
                                             : 1;
    if (need > k) cut = n - k;
    break;
  }
  std::string out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return out;
}

std::string Utf8Stream::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace sy
