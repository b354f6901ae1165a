// The {{name}} templates of text steps and tool arguments (docs/programs.md, "Variables and
// templates"): one scanner, so that what parse() accepts is exactly what the walk renders.
#pragma once

#include <cstddef>
#include <string_view>

namespace sy::programs::detail {

/// Longest variable or input name, in bytes.
inline constexpr std::size_t kMaxNameBytes = 64;

/// A byte a name may hold: `[A-Za-z0-9_]` (the first one not a digit).
inline bool name_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || (c >= '0' && c <= '9');
}

/// `[A-Za-z_][A-Za-z0-9_]*`, at most kMaxNameBytes bytes.
inline bool valid_name(std::string_view n) {
  if (n.empty() || n.size() > kMaxNameBytes || (n[0] >= '0' && n[0] <= '9')) return false;
  for (char c : n)
    if (!name_char(c)) return false;
  return true;
}

/// Walks template `t`: calls `literal(text)` for each run of literal text (a `{{{{` gives `{{`)
/// and `insert(name)` for each `{{name}}`, in order. Returns the byte offset of the first `{{`
/// that is neither `{{{{` nor `{{name}}` (nothing after it is reported), or npos when all is well.
template <typename Literal, typename Insert>
std::size_t scan_template(std::string_view t, Literal&& literal, Insert&& insert) {
  std::size_t i = 0, from = 0;
  while (i + 1 < t.size()) {
    if (t[i] != '{' || t[i + 1] != '{') {
      ++i;
      continue;
    }
    if (t.substr(i, 4) == "{{{{") {
      literal(t.substr(from, i + 2 - from));  // the escape keeps one "{{"
      i += 4;
      from = i;
      continue;
    }
    std::size_t j = i + 2;
    while (j < t.size() && name_char(t[j])) ++j;
    const std::string_view name = t.substr(i + 2, j - i - 2);
    if (!valid_name(name) || t.substr(j, 2) != "}}") return i;
    if (i > from) literal(t.substr(from, i - from));
    insert(name);
    i = j + 2;
    from = i;
  }
  if (from < t.size()) literal(t.substr(from));
  return std::string_view::npos;
}

}  // namespace sy::programs::detail
