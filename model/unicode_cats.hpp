// Unicode helpers for the tokenizers: lenient UTF-8 decoding and the character classes the
// pre-split rules use (\p{L}, \p{N}, \p{P}, \s), with llama.cpp's handling of invalid input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sy {

/// Major Unicode category as the tokenizers need it (values are the table's tags).
enum class UnicodeCat : uint8_t { Other = 0, Letter = 1, Number = 2, Punct = 3 };

/// Category of a code point (Other for unassigned, marks, symbols, separators, controls).
UnicodeCat unicode_category(uint32_t cp);
/// The \s class of the tokenizer regexes (Unicode White_Space, without U+001C..U+001F).
bool unicode_is_whitespace(uint32_t cp);

/// Length of the UTF-8 sequence a lead byte announces (1 for stray continuation bytes).
inline size_t utf8_len(uint8_t lead) {
  // Indexed by the high nibble: 0x0-0xB one byte (ASCII or stray), 0xC/0xD two, 0xE three, 0xF
  // four.
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

/// Decodes UTF-8 into code points; each undecodable byte becomes U+FFFD, as llama.cpp does.
std::vector<uint32_t> utf8_to_cpts(std::string_view s);
/// `s` as valid UTF-8: undecodable bytes, surrogates and code points past U+10FFFF become U+FFFD
/// (a model may emit any byte; the wire and JSON need well-formed text). Valid input comes back
/// unchanged.
std::string sanitize_utf8(std::string_view s);
/// Appends the UTF-8 encoding of one code point.
void append_utf8(std::string& out, uint32_t cp);

namespace unicode_detail {
/// One run of code points sharing a category tag.
struct Range {
  uint32_t first;
  uint32_t last;
  uint8_t cat;
};
extern const Range kRanges[];
extern const size_t kRangeCount;
}  // namespace unicode_detail

}  // namespace sy
