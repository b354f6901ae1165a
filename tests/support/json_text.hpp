// A JSON string literal for test inputs handed to Python references (quotes, backslashes and
// control bytes escaped; other bytes, UTF-8 included, passed through).
#pragma once

#include <cstdio>
#include <string>

namespace sy::test {

inline std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace sy::test
