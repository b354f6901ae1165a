// Unicode helpers for the tokenizers: category lookup over the range table in unicode_data.cpp,
// the whitespace set, and UTF-8 conversion.
#include "model/unicode_cats.hpp"

#include <algorithm>

namespace sy {

UnicodeCat unicode_category(uint32_t cp) {
  using unicode_detail::kRangeCount;
  using unicode_detail::kRanges;
  // ASCII is most of real text; answer it without the binary search.
  if (cp < 0x80) {
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return UnicodeCat::Letter;
    if (cp >= '0' && cp <= '9') return UnicodeCat::Number;
  }
  const auto* end = kRanges + kRangeCount;
  const auto* it = std::upper_bound(
      kRanges, end, cp, [](uint32_t c, const unicode_detail::Range& r) { return c < r.first; });
  if (it == kRanges) return UnicodeCat::Other;
  --it;
  return cp <= it->last ? static_cast<UnicodeCat>(it->cat) : UnicodeCat::Other;
}

bool unicode_is_whitespace(uint32_t cp) {
  // Unicode's White_Space property, the \s of llama.cpp's tables and of the Rust regex engine
  // the vocabularies were made with; Python's isspace() would also count U+001C..U+001F.
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

std::string sanitize_utf8(std::string_view s) {
  bool ascii = true;
  for (char c : s) ascii = ascii && (static_cast<uint8_t>(c) & 0x80) == 0;
  if (ascii) return std::string(s);  // the common case costs one scan
  std::string out;
  out.reserve(s.size());
  for (uint32_t cp : utf8_to_cpts(s)) {
    const bool bad = (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF;
    append_utf8(out, bad ? 0xFFFDu : cp);
  }
  return out;
}

std::vector<uint32_t> utf8_to_cpts(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  const size_t n = s.size();
  auto cont = [&](size_t k) { return k < n && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80; };
  while (i < n) {
    const uint8_t b = static_cast<uint8_t>(s[i]);
    const size_t len = (b & 0x80) == 0      ? 1
                       : (b & 0xE0) == 0xC0 ? 2
                       : (b & 0xF0) == 0xE0 ? 3
                       : (b & 0xF8) == 0xF0 ? 4
                                            : 0;
    bool ok = len != 0;
    for (size_t k = 1; ok && k < len; ++k) ok = cont(i + k);
    if (!ok) {
      // Invalid lead byte or truncated sequence: one replacement character per bad byte.
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    uint32_t cp = len == 1 ? b : len == 2 ? (b & 0x1Fu) : len == 3 ? (b & 0x0Fu) : (b & 0x07u);
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3Fu);
    out.push_back(cp);
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | ((cp >> 18) & 0x07));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace sy
