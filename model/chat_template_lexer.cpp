// The chat-template lexer: splits the source into text and tags (with Jinja's whitespace
// control and raw blocks) and the inside of a tag into tokens.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/chat_template_internal.hpp"
#include "model/unicode_cats.hpp"

namespace sy::chat::detail {

// Tokens of one tag's inside.
std::vector<Token> lex_expr(std::string_view src, int line) {
  std::vector<Token> out;
  std::size_t i = 0;
  static const char* kOps[] = {"==", "!=", "<=", ">=", "//", "**", "<", ">", "+",
                               "-",  "*",  "/",  "%",  "~",  "|",  ".", ",", ":",
                               "(",  ")",  "[",  "]",  "{",  "}",  "="};
  while (i < src.size()) {
    const char c = src[i];
    if (is_space(static_cast<unsigned char>(c))) {
      ++i;
      continue;
    }
    Token t;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t j = i;
      while (j < src.size() && (std::isalnum(static_cast<unsigned char>(src[j])) || src[j] == '_'))
        ++j;
      t.kind = Tk::Name;
      t.text = std::string(src.substr(i, j - i));
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      std::size_t j = i;
      bool real = false;
      while (j < src.size() && (std::isdigit(static_cast<unsigned char>(src[j])) || src[j] == '_'))
        ++j;
      if (j + 1 < src.size() && src[j] == '.' &&
          std::isdigit(static_cast<unsigned char>(src[j + 1]))) {
        real = true;
        ++j;
        while (j < src.size() && std::isdigit(static_cast<unsigned char>(src[j]))) ++j;
      }
      if (j < src.size() && (src[j] == 'e' || src[j] == 'E')) {
        std::size_t k = j + 1;
        if (k < src.size() && (src[k] == '+' || src[k] == '-')) ++k;
        if (k < src.size() && std::isdigit(static_cast<unsigned char>(src[k]))) {
          real = true;
          j = k;
          while (j < src.size() && std::isdigit(static_cast<unsigned char>(src[j]))) ++j;
        }
      }
      std::string digits;
      for (char d : src.substr(i, j - i))
        if (d != '_') digits += d;
      if (real) {
        t.kind = Tk::Float;
        t.f = std::strtod(digits.c_str(), nullptr);
      } else {
        t.kind = Tk::Int;
        errno = 0;
        t.i = std::strtoll(digits.c_str(), nullptr, 10);
        if (errno == ERANGE) fail(line, "integer literal " + digits + " is too large");
      }
      i = j;
    } else if (c == '\'' || c == '"') {
      std::size_t j = i + 1;
      std::string s;
      while (j < src.size() && src[j] != c) {
        if (src[j] == '\\' && j + 1 < src.size()) {
          const char e = src[j + 1];
          j += 2;
          switch (e) {
            case 'n':
              s += '\n';
              break;
            case 't':
              s += '\t';
              break;
            case 'r':
              s += '\r';
              break;
            case '0':
              s += '\0';
              break;
            case '\\':
            case '\'':
            case '"':
              s += e;
              break;
            case '\n':
              break;
            case 'x':
            case 'u':
            case 'U': {
              const std::size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
              if (j + n > src.size()) fail(line, "truncated escape in a string literal");
              const std::string hex(src.substr(j, n));
              if (hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
                fail(line, "bad escape \\" + std::string(1, e) + hex + " in a string literal");
              append_utf8(s, static_cast<uint32_t>(std::strtoul(hex.c_str(), nullptr, 16)));
              j += n;
              break;
            }
            default:
              s += '\\';
              s += e;
          }
        } else {
          s += src[j++];
        }
      }
      if (j >= src.size()) fail(line, "unterminated string literal");
      t.kind = Tk::String;
      t.text = std::move(s);
      i = j + 1;
    } else {
      bool found = false;
      for (const char* op : kOps) {
        const std::string_view o(op);
        if (src.substr(i, o.size()) == o) {
          t.kind = Tk::Op;
          t.text = std::string(o);
          i += o.size();
          found = true;
          break;
        }
      }
      if (!found) fail(line, std::string("unexpected character '") + c + "'");
    }
    out.push_back(std::move(t));
  }
  out.push_back(Token{});
  return out;
}

namespace {

// Where the tag that opens at `from` (just after its "{{" / "{%") ends: the offset of its closing
// delimiter; string literals inside may contain the delimiter.
std::size_t tag_end(const std::string& src, std::size_t from, const char* close, int line) {
  std::size_t i = from;
  while (i + 1 < src.size()) {
    const char c = src[i];
    if (c == '\'' || c == '"') {
      std::size_t j = i + 1;
      while (j < src.size() && src[j] != c) j += src[j] == '\\' ? 2 : 1;
      i = j + 1;
      continue;
    }
    if (c == close[0] && src[i + 1] == close[1]) return i;
    ++i;
  }
  fail(line, std::string("tag not closed (missing '") + close + "')");
}

}  // namespace

std::vector<Piece> split_source(std::string src) {
  // Jinja's defaults: newlines become \n and one trailing newline is dropped.
  std::string norm;
  norm.reserve(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      norm += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      norm += src[i];
    }
  }
  if (!norm.empty() && norm.back() == '\n') norm.pop_back();
  src = std::move(norm);

  std::vector<Piece> out;
  int line = 1;
  std::size_t i = 0;
  auto count_lines = [&](std::size_t a, std::size_t b) {
    line += static_cast<int>(std::count(src.begin() + static_cast<std::ptrdiff_t>(a),
                                        src.begin() + static_cast<std::ptrdiff_t>(b), '\n'));
  };
  while (i < src.size()) {
    std::size_t open = std::string::npos;
    for (std::size_t j = src.find('{', i); j != std::string::npos; j = src.find('{', j + 1)) {
      if (j + 1 < src.size() && (src[j + 1] == '{' || src[j + 1] == '%' || src[j + 1] == '#')) {
        open = j;
        break;
      }
    }
    const std::size_t text_end = open == std::string::npos ? src.size() : open;
    if (text_end > i) {
      Piece p;
      p.text = src.substr(i, text_end - i);
      p.line = line;
      out.push_back(std::move(p));
      count_lines(i, text_end);
    }
    if (open == std::string::npos) break;
    Piece p;
    p.line = line;
    const char kind = src[open + 1];
    std::size_t body = open + 2;
    if (body < src.size() && (src[body] == '-' || src[body] == '+')) {
      (src[body] == '-' ? p.strip_before : p.keep_before) = true;
      ++body;
    }
    std::size_t close;
    if (kind == '#') {
      close = src.find("#}", body);
      if (close == std::string::npos) fail(line, "comment not closed (missing '#}')");
      p.kind = Piece::Comment;
    } else {
      close = tag_end(src, body, kind == '{' ? "}}" : "%}", line);
      p.kind = kind == '{' ? Piece::Var : Piece::Block;
    }
    std::size_t inner_end = close;
    if (inner_end > body && src[inner_end - 1] == '-') {
      p.strip_after = true;
      --inner_end;
    }
    p.text = src.substr(body, inner_end - body);
    count_lines(open, close + 2);
    i = close + 2;
    // {% raw %}...{% endraw %}: the text in between is literal.
    auto keyword_is = [](std::string inner, std::string_view kw) {
      const std::size_t b = inner.find_first_not_of(" \t\n");
      const std::size_t e = inner.find_last_not_of(" \t\n");
      return b != std::string::npos && inner.substr(b, e - b + 1) == kw;
    };
    if (p.kind == Piece::Block && keyword_is(p.text, "raw")) {
      std::size_t j = i;
      for (;;) {
        const std::size_t o = src.find("{%", j);
        if (o == std::string::npos) fail(p.line, "'raw' block not closed");
        std::size_t b = o + 2;
        const bool sb = b < src.size() && src[b] == '-';
        if (sb || (b < src.size() && src[b] == '+')) ++b;
        const std::size_t c = src.find("%}", b);
        if (c == std::string::npos) fail(p.line, "'raw' block not closed");
        std::string inner = src.substr(b, c - b);
        const bool sa = !inner.empty() && inner.back() == '-';
        if (sa) inner.pop_back();
        if (keyword_is(inner, "endraw")) {
          out.push_back(p);  // the raw tag itself, for whitespace handling
          Piece text;
          text.text = src.substr(i, o - i);
          text.line = line;
          out.push_back(text);
          Piece end;
          end.kind = Piece::Block;
          end.text = "endraw";
          end.strip_before = sb;
          end.strip_after = sa;
          end.line = line;
          out.push_back(end);
          count_lines(i, c + 2);
          i = c + 2;
          break;
        }
        j = c + 2;
      }
      continue;
    }
    out.push_back(std::move(p));
  }

  // Whitespace control: '-' strips all whitespace on that side; otherwise a block or comment
  // tag takes the spaces and tabs before it on its line (lstrip_blocks) and the one newline after
  // it (trim_blocks). A line starts after a newline in the text, at the start of the template, or
  // where the previous tag's end took a newline with it (Jinja's lexer counts those too).
  bool newline_taken = false;  // by the tag before the current text piece
  for (std::size_t k = 0; k < out.size(); ++k) {
    Piece& p = out[k];
    if (p.kind == Piece::Text) continue;
    const bool block = p.kind != Piece::Var;
    if (k > 0 && out[k - 1].kind == Piece::Text) {
      std::string& t = out[k - 1].text;
      if (p.strip_before) {
        while (!t.empty() && is_space(static_cast<unsigned char>(t.back()))) t.pop_back();
      } else if (block && !p.keep_before) {
        std::size_t e = t.size();
        while (e > 0 && (t[e - 1] == ' ' || t[e - 1] == '\t')) --e;
        const bool line_start = e == 0 && (k == 1 || newline_taken);
        if (line_start || (e > 0 && t[e - 1] == '\n')) t.resize(e);
      }
    }
    newline_taken = false;
    if (k + 1 < out.size() && out[k + 1].kind == Piece::Text) {
      std::string& t = out[k + 1].text;
      if (p.strip_after) {
        std::size_t b = 0;
        while (b < t.size() && is_space(static_cast<unsigned char>(t[b]))) ++b;
        newline_taken = b > 0 && t[b - 1] == '\n';
        t.erase(0, b);
      } else if (block && !t.empty() && t[0] == '\n') {
        t.erase(0, 1);
        newline_taken = true;
      }
    }
  }
  return out;
}

}  // namespace sy::chat::detail
