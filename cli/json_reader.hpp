// A small JSON reader (header-only): enough for `switchyard submit`'s JSONL jobs and for tests that
// read reference files. Numbers are kept as double and, when integral, as int64 too.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sy::cli {

/// A parsed JSON value.
struct JsonValue {
  enum Kind { null, boolean, number, string, array, object } kind = null;
  bool b = false;
  double num = 0;
  bool is_int = false;  ///< number written without fraction/exponent that fits int64
  int64_t i = 0;
  std::string str;
  std::vector<JsonValue> arr;
  std::map<std::string, JsonValue> obj;

  /// The member `key` of an object, or nullptr (also when this is not an object).
  const JsonValue* find(const std::string& key) const {
    if (kind != object) return nullptr;
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &it->second;
  }
  /// The member `key`; throws std::runtime_error when absent.
  const JsonValue& at(const std::string& key) const {
    auto v = find(key);
    if (!v) throw std::runtime_error("json: missing key '" + key + "'");
    return *v;
  }
  /// What the kind is called in messages.
  const char* kind_name() const {
    static const char* names[] = {"null", "boolean", "number", "string", "array", "object"};
    return names[kind];
  }
};

/// Parses one JSON text; throws std::runtime_error naming the byte offset and problem.
class JsonReader {
 public:
  static JsonValue parse(std::string_view text) {
    JsonReader r(text);
    JsonValue v = r.value(0);
    r.ws();
    if (r.i_ != r.s_.size()) r.fail("trailing characters");
    return v;
  }

 private:
  // Deeper nesting than this is not a job description but an attack on the stack.
  static constexpr int kMaxDepth = 64;

  explicit JsonReader(std::string_view s) : s_(s) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("json: " + what + " at offset " + std::to_string(i_));
  }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r'))
      ++i_;
  }
  char peek() {
    ws();
    if (i_ >= s_.size()) fail("unexpected end");
    return s_[i_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  bool literal(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  static void put_utf8(std::string& out, uint32_t cp) {
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
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  uint32_t hex4() {
    if (i_ + 4 > s_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= c - '0';
      else if (c >= 'a' && c <= 'f')
        v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        v |= c - 'A' + 10;
      else
        fail("bad \\u escape");
    }
    return v;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      char c = s_[i_++];
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated string");
      char e = s_[i_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(i_, 2) == "\\u") {
            i_ += 2;
            uint32_t lo = hex4();
            if (lo >= 0xDC00 && lo < 0xE000)
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else
              cp = 0xFFFD;
          } else if (cp >= 0xD800 && cp < 0xE000) {
            cp = 0xFFFD;  // a lone surrogate has no UTF-8 form
          }
          put_utf8(out, cp);
          break;
        }
        default:
          fail(std::string("bad escape \\") + e);
      }
    }
    return out;
  }
  JsonValue number() {
    size_t start = i_;
    bool integral = true;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    while (i_ < s_.size()) {
      char c = s_[i_];
      if (c >= '0' && c <= '9') {
        ++i_;
      } else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
        integral = false;
        ++i_;
      } else {
        break;
      }
    }
    std::string t(s_.substr(start, i_ - start));
    JsonValue v;
    v.kind = JsonValue::number;
    size_t used = 0;
    try {
      v.num = std::stod(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (t.empty() || used != t.size()) fail("bad number '" + t + "'");
    if (integral) {
      try {
        v.i = std::stoll(t);
        v.is_int = true;
      } catch (const std::exception&) {
        v.is_int = false;  // out of int64 range: only the double remains
      }
    }
    return v;
  }
  JsonValue value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth));
    JsonValue v;
    char c = peek();
    if (c == '{') {
      ++i_;
      v.kind = JsonValue::object;
      if (peek() == '}') {
        ++i_;
        return v;
      }
      while (true) {
        std::string k = string();
        expect(':');
        v.obj[k] = value(depth + 1);
        char d = peek();
        ++i_;
        if (d == '}') break;
        if (d != ',') fail("expected ',' or '}'");
      }
    } else if (c == '[') {
      ++i_;
      v.kind = JsonValue::array;
      if (peek() == ']') {
        ++i_;
        return v;
      }
      while (true) {
        v.arr.push_back(value(depth + 1));
        char d = peek();
        ++i_;
        if (d == ']') break;
        if (d != ',') fail("expected ',' or ']'");
      }
    } else if (c == '"') {
      v.kind = JsonValue::string;
      v.str = string();
    } else if (literal("true")) {
      v.kind = JsonValue::boolean;
      v.b = true;
    } else if (literal("false")) {
      v.kind = JsonValue::boolean;
    } else if (literal("null")) {
      v.kind = JsonValue::null;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v = number();
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
    return v;
  }

  std::string_view s_;
  size_t i_ = 0;
};

}  // namespace sy::cli
