// Regular expressions and choice lists to GBNF: the language of the converted grammars (compiled
// by compile_gbnf) against Python's re.fullmatch on the same strings, and every refusal with its
// position; choices with every kind of byte that needs escaping.
#include <boost/test/unit_test.hpp>
#include <memory>
#include <string>
#include <vector>

#include "constraints/convert.hpp"
#include "constraints/grammar.hpp"

BOOST_AUTO_TEST_SUITE(test_constraints_regex)

using sy::constraints::choices_to_gbnf;
using sy::constraints::compile_gbnf;
using sy::constraints::ConstraintError;
using sy::constraints::Grammar;
using sy::constraints::grammar_accepts;
using sy::constraints::grammar_accepts_prefix;
using sy::constraints::Limits;
using sy::constraints::regex_to_gbnf;

namespace {

struct Case {
  std::string re;
  std::vector<std::string> match, no_match;
};

std::shared_ptr<const Grammar> compile_regex(const std::string& re) {
  return compile_gbnf(regex_to_gbnf(re));
}

// `make()` throws ConstraintError whose message contains `fragment`.
template <typename F>
void check_refusal(F make, const std::string& what, const std::string& fragment) {
  try {
    make();
    BOOST_ERROR(what << " was not refused");
  } catch (const ConstraintError& e) {
    BOOST_CHECK_MESSAGE(std::string(e.what()).find(fragment) != std::string::npos,
                        what << ": message \"" << e.what() << "\" lacks \"" << fragment << "\"");
  }
}

void check_regex_refused(const std::string& re, const std::string& fragment) {
  check_refusal([&] { return regex_to_gbnf(re); }, "regex " + re, fragment);
}

}  // namespace

// Expectations from Python: re.fullmatch(regex, s, re.ASCII) (\d, \w, \s are ASCII here).
BOOST_AUTO_TEST_CASE(language_matches_python_fullmatch) {
  const std::vector<Case> cases = {
      {"a(b|c)*d", {"abd", "ad", "acbcd"}, {"ab", "abcdd", "xad", ""}},
      {"[a-c]{2,3}x?", {"ab", "abc", "abx", "abcx"}, {"a", "abcd", "abxx"}},
      {"\\d+(\\.\\d+)?", {"1", "12.5", "007"}, {"1.", ".5", "a", "1.2.3"}},
      {"(ab|a)(bc|c)", {"abc", "abbc", "ac"}, {"ab", "abcc"}},
      {"[^abc]+", {"xyz", "é", "\n"}, {"", "xa"}},
      {"a{3}", {"aaa"}, {"aa", "aaaa"}},
      {"a{2,}", {"aa", "aaaaaaa"}, {"a"}},
      {"a{,2}", {"", "a", "aa"}, {"aaa"}},
      {"a{0}b", {"b"}, {"ab"}},
      {"(a|)+b", {"b", "ab", "aaab"}, {"a"}},
      {"(a*)*b", {"b", "aab"}, {"ba"}},
      {"(a?b?)+", {"", "a", "ba", "abab"}, {"c"}},
      {"x{1,3}?y", {"xy", "xxxy"}, {"y", "xxxxy"}},
      {"(?:ab)+?", {"ab", "abab"}, {"", "aba"}},
      {"^abc$", {"abc"}, {"ab", "abcc"}},
      {"\\w+@\\w+\\.com", {"a_1@b2.com"}, {"a@b.co", "@b.com", "a@bcom"}},
      {"\\s*-\\s*", {"-", " - ", "\t\n-\x0B\x0C\r "}, {"a-"}},
      {"[\\d\\s]+", {"1 2\t3"}, {"1a"}},
      {"[\\D]", {"a"}, {"1", "ab"}},
      {"\\W\\S+", {"-ab"}, {"a-b", "- "}},
      {"a.c", {"abc", "a c", "a\tc", "aéc", "a😀c"}, {"a\nc", "ac"}},
      {"[.]\\.", {".."}, {"a.", ".a"}},
      {"[-a][a-]", {"--", "aa", "-a"}, {"b-"}},
      {"[]a]+", {"]a]", "]"}, {"b"}},
      {"[^]a]", {"b"}, {"]", "a"}},
      {"a\\-b", {"a-b"}, {"ab"}},
      {"\\x41\\u0042\\101", {"ABA"}, {"AB"}},
      {"[\\x00-\\x1f]+", {std::string("\x00\x01\x1F", 3)}, {" "}},
      {"\\t\\n\\r\\f\\v\\a\\0", {std::string("\t\n\r\x0C\x0B\x07\x00", 7)}, {"\t\n\r\x0C\x0B\x07"}},
      {"[\\0-\\7]", {std::string("\x00", 1), "\x07"}, {"\x08"}},
      {"a{", {"a{"}, {"a"}},
      {"a{x}", {"a{x}"}, {"ax"}},
      {"a{}", {"a{}"}, {"a"}},
      {"{}", {"{}"}, {""}},
      {"a|b|", {"", "a", "b"}, {"ab"}},
      {"(|a)b", {"b", "ab"}, {"aab"}},
      {"(?P<first>a)(b)", {"ab"}, {"a"}},
      {"(?#a comment)ab", {"ab"}, {"a comment"}},
      {"a(?#c)*", {"", "aaa"}, {"a(?#c)"}},
      {"[\\\\\\]]+", {"\\]"}, {"["}},
      {"\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\^\\$\\.", {"*+?()[]{}|^$."}, {"*"}},
      {"[a-z0-9_]{3,8}", {"abc_12"}, {"ab", "abcdefghi", "ABC"}},
      {"(\\d{3})-(\\d{4})", {"123-4567"}, {"12-4567"}},
      {"(red|green|blue)( (red|green|blue))*",
       {"red", "red green blue"},
       {"red  green", "redgreen"}},
      {"日本+", {"日本", "日本本本"}, {"日", "本"}},
      {"[à-ÿ]+", {"àéÿ"}, {"a"}},
      {"\\u00e9", {"é"}, {"e"}},
      {"[😀-😎]!", {"😀!", "😎!"}, {"😏!"}},
      {".", {"😀", "é", std::string("\x00", 1)}, {"\n", ""}},
  };
  for (const auto& c : cases) {
    const auto g = compile_regex(c.re);
    for (const auto& s : c.match)
      BOOST_CHECK_MESSAGE(grammar_accepts(*g, s), "regex " << c.re << " should match " << s);
    for (const auto& s : c.no_match)
      BOOST_CHECK_MESSAGE(!grammar_accepts(*g, s), "regex " << c.re << " should not match " << s);
  }
}

// RE2 spellings that Python does not have.
BOOST_AUTO_TEST_CASE(re2_spellings) {
  const std::vector<Case> cases = {
      {"(?<year>\\d{4})-\\d{2}", {"2024-01"}, {"2024-1"}},
      {"\\x{1F600}\\x{e9}", {"😀é"}, {"😀e"}},
      {"\\Aab\\z", {"ab"}, {"abb"}},
      {"\\Aab\\Z", {"ab"}, {"a"}},
      {"^^a$$", {"a"}, {""}},
  };
  for (const auto& c : cases) {
    const auto g = compile_regex(c.re);
    for (const auto& s : c.match)
      BOOST_CHECK_MESSAGE(grammar_accepts(*g, s), "regex " << c.re << " should match " << s);
    for (const auto& s : c.no_match)
      BOOST_CHECK_MESSAGE(!grammar_accepts(*g, s), "regex " << c.re << " should not match " << s);
  }
}

BOOST_AUTO_TEST_CASE(anchors_are_whole_match) {
  const auto g = compile_regex("^ab|cd$");
  BOOST_CHECK(grammar_accepts(*g, "ab"));
  BOOST_CHECK(grammar_accepts(*g, "cd"));
  BOOST_CHECK(!grammar_accepts(*g, "abx"));
  BOOST_CHECK(!grammar_accepts(*g, "xcd"));
}

BOOST_AUTO_TEST_CASE(prefixes) {
  const auto g = compile_regex("abc|abd|x[0-9]{2}");
  BOOST_CHECK(grammar_accepts_prefix(*g, ""));
  BOOST_CHECK(grammar_accepts_prefix(*g, "ab"));
  BOOST_CHECK(grammar_accepts_prefix(*g, "x1"));
  BOOST_CHECK(!grammar_accepts_prefix(*g, "ac"));
  BOOST_CHECK(!grammar_accepts_prefix(*g, "x123"));
  BOOST_CHECK(!grammar_accepts(*g, "ab"));
}

BOOST_AUTO_TEST_CASE(the_empty_expression) {
  const auto g = compile_regex("");
  BOOST_CHECK(grammar_accepts(*g, ""));
  BOOST_CHECK(!grammar_accepts(*g, "a"));
}

BOOST_AUTO_TEST_CASE(refusals_name_the_construct_and_position) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"(a)\\1", "regex: back-reference \\1 at position 3 is not supported"},
      {"(a)(b)\\12", "back-reference \\12 at position 6 is not supported"},
      {"(?P<x>a)(?P=x)", "back-reference (?P= at position 8 is not supported"},
      {"(?<x>a)\\k<x>", "back-reference \\k at position 7 is not supported"},
      {"a(?=b)", "lookahead (?= at position 1 is not supported"},
      {"a(?!b)", "lookahead (?! at position 1 is not supported"},
      {"(?<=a)b", "lookbehind (?<= at position 0 is not supported"},
      {"(?<!a)b", "lookbehind (?<! at position 0 is not supported"},
      {"(?i)abc", "inline flags (?i) at position 0 is not supported"},
      {"x(?s:.)", "inline flags (?s) at position 1 is not supported"},
      {"(?-i:a)", "inline flags (?-i) at position 0 is not supported"},
      {"a*+", "possessive quantifier at position 2 is not supported"},
      {"(?>a)", "atomic group (?> at position 0 is not supported"},
      {"(?(1)a|b)", "conditional group (?( at position 0 is not supported"},
      {"(?P>x)", "recursion (?P> at position 0 is not supported"},
      {"\\p{L}", "Unicode class \\p at position 0 is not supported"},
      {"\\N{DIGIT ONE}", "named character \\N at position 0 is not supported"},
      {"\\bfoo", "word boundary \\b at position 0 is not supported"},
      {"a\\Bb", "word boundary \\B at position 1 is not supported"},
      {"a^b", "anchor ^ away from the start of the expression at position 1 is not supported"},
      {"a$b", "anchor $ away from the end of the expression at position 1 is not supported"},
      {"(^a)", "anchor ^ away from the start of the expression at position 1"},
      {"[[:alpha:]]", "POSIX class [: at position 1 is not supported"},
      {"\\ud800", "surrogate code point in escape \\u at position 0 is not supported"},
      {"(ab", "regex: missing ), unterminated subpattern at position 0"},
      {"a(b(c)", "missing ), unterminated subpattern at position 1"},
      {"ab)", "regex: unbalanced parenthesis at position 2"},
      {"[z-a]", "regex: bad character range z-a at position 1"},
      {"[\\d-z]", "bad character range \\d-z at position 1"},
      {"*a", "regex: nothing to repeat at position 0"},
      {"a|*", "nothing to repeat at position 2"},
      {"(+)", "nothing to repeat at position 1"},
      {"{2}", "nothing to repeat at position 0"},
      {"^*", "nothing to repeat at position 1"},
      {"a**", "regex: multiple repeat at position 2"},
      {"a{2}{3}", "multiple repeat at position 4"},
      {"a{3,2}", "regex: min repeat greater than max repeat at position 1"},
      {"[abc", "regex: unterminated character set at position 0"},
      {"abc\\", "regex: trailing backslash at position 3"},
      {"\\q", "regex: bad escape \\q at position 0"},
      {"\\xZZ", "bad escape \\x at position 0"},
      {"\\x{110000}", "code point out of range in escape \\x at position 0"},
      {"(?P<1a>x)", "bad group name at position 4"},
      {"(?Q)", "unknown extension (?Q at position 0"},
      {"(?#no end", "missing ), unterminated comment at position 0"},
      {"a\xFF", "regex: invalid UTF-8 at position 1"},
      {"a{1000000}", "repetition count 1000000 over the limit max_elements=262144 at position 1"},
  };
  for (const auto& [re, fragment] : cases) check_regex_refused(re, fragment);
}

BOOST_AUTO_TEST_CASE(deep_groups_are_refused) {
  check_regex_refused(std::string(300, '(') + std::string(300, ')'), "groups nested deeper than");
  const auto g = compile_regex(std::string(100, '(') + "a" + std::string(100, ')'));
  BOOST_CHECK(grammar_accepts(*g, "a"));
}

BOOST_AUTO_TEST_CASE(expressions_that_grow_past_the_limit) {
  // A star over 3000 optional parts: without the empty string it is 3000 alternatives of up to
  // 3000 parts each.
  std::string parts;
  for (int i = 0; i < 3000; ++i) parts += "a?";
  check_regex_refused("(" + parts + ")*",
                      "regex: the grammar needs more than max_elements=262144 elements");
  const auto g = compile_regex("(a?b?c?)*");
  for (const char* s : {"", "abc", "cba", "aab", "ccc"}) BOOST_CHECK(grammar_accepts(*g, s));
  BOOST_CHECK(!grammar_accepts(*g, "abd"));
}

BOOST_AUTO_TEST_CASE(source_limit) {
  Limits lim;
  lim.max_source_bytes = 8;
  check_refusal([&] { return regex_to_gbnf("abcdefghi", lim); }, "regex over the limit",
                "regex: the expression has 9 bytes, over the limit max_source_bytes=8");
  BOOST_CHECK_NO_THROW(regex_to_gbnf("abcdefgh", lim));
}

// ---- choices ----

BOOST_AUTO_TEST_CASE(choices_exactly) {
  const auto g = compile_gbnf(choices_to_gbnf({"yes", "no", "maybe", "yes"}));
  for (const char* s : {"yes", "no", "maybe"}) BOOST_CHECK(grammar_accepts(*g, s));
  for (const char* s : {"", "ye", "yesno", "Yes", "no "}) BOOST_CHECK(!grammar_accepts(*g, s));
  BOOST_CHECK(grammar_accepts_prefix(*g, "ma"));
  BOOST_CHECK(!grammar_accepts_prefix(*g, "x"));
}

BOOST_AUTO_TEST_CASE(choices_escape_every_byte) {
  const std::vector<std::string> choices = {"a\"b",
                                            "c\\d",
                                            "line\nbreak",
                                            std::string("nul\0x", 5),
                                            "\x01\x1F\x7F",
                                            "\t\r",
                                            "é",
                                            "日本😀",
                                            "[x-y]",
                                            "\\x41",
                                            "\\u00e9",
                                            "quote\"\\\"",
                                            "a",
                                            "ab"};
  const auto g = compile_gbnf(choices_to_gbnf(choices));
  for (const auto& c : choices) BOOST_CHECK_MESSAGE(grammar_accepts(*g, c), "choice " << c);
  const std::vector<std::string> others = {
      "a\\\"b", "c\\\\d", "line\\nbreak", "nul", std::string("nul\0", 4), "A", "\\u00E9", "e",
      "日本",   "[x-y",   "abc",          "x"};
  for (const auto& o : others) BOOST_CHECK_MESSAGE(!grammar_accepts(*g, o), "not a choice: " << o);
}

BOOST_AUTO_TEST_CASE(choices_empty_string_is_the_empty_output) {
  const auto g = compile_gbnf(choices_to_gbnf({"", "x"}));
  BOOST_CHECK(grammar_accepts(*g, ""));
  BOOST_CHECK(grammar_accepts(*g, "x"));
  BOOST_CHECK(!grammar_accepts(*g, "xx"));
  const auto only = compile_gbnf(choices_to_gbnf({""}));
  BOOST_CHECK(grammar_accepts(*only, ""));
  BOOST_CHECK(!grammar_accepts(*only, "a"));
}

BOOST_AUTO_TEST_CASE(choices_refusals) {
  check_refusal([] { return choices_to_gbnf({}); }, "no choices", "choices: the list is empty");
  check_refusal(
      [] {
        return choices_to_gbnf({"ok", "bad\xC3"});
      },
      "invalid UTF-8", "choices: entry 1 is not valid UTF-8");
  Limits lim;
  lim.max_choices = 3;
  check_refusal(
      [&] {
        return choices_to_gbnf({"a", "b", "c", "d"}, lim);
      },
      "too many", "choices: 4 entries, over the limit max_choices=3");
  lim = Limits{};
  lim.max_source_bytes = 5;
  check_refusal(
      [&] {
        return choices_to_gbnf({"abc", "def"}, lim);
      },
      "too long", "choices: 6 bytes in all, over the limit max_source_bytes=5");
  BOOST_CHECK_NO_THROW(choices_to_gbnf(std::vector<std::string>(1024, "x")));
}

BOOST_AUTO_TEST_SUITE_END()
