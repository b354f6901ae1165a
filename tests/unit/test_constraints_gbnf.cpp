// GBNF parsing and compilation: every syntax feature, the refusals (line and column, undefined
// rule, missing root, left recursion, rules that never end, limits), whole-text and prefix
// acceptance on recursive grammars, UTF-8 character classes and repetition bounds.
#include <boost/test/unit_test.hpp>
#include <string>
#include <vector>

#include "constraints/error.hpp"
#include "constraints/grammar.hpp"

BOOST_AUTO_TEST_SUITE(test_constraints_gbnf)

using sy::constraints::compile_gbnf;
using sy::constraints::ConstraintError;
using sy::constraints::grammar_accepts;
using sy::constraints::grammar_accepts_prefix;
using sy::constraints::Limits;

namespace {

// 2: the whole text is in the language; 1: a proper prefix of some text; 0: neither.
int verdict(const sy::constraints::Grammar& g, const std::string& text) {
  if (grammar_accepts(g, text)) return 2;
  return grammar_accepts_prefix(g, text) ? 1 : 0;
}

struct Case {
  std::string text;
  int want;
};

void check(const std::string& grammar, const std::vector<Case>& cases) {
  const auto g = compile_gbnf(grammar);
  for (const Case& c : cases)
    BOOST_TEST(verdict(*g, c.text) == c.want, "grammar " << grammar << "\ntext '" << c.text << "'");
}

// The message of the ConstraintError that compiling `grammar` throws ("" when it compiles).
std::string error_of(const std::string& grammar, const Limits& lim = {}) {
  try {
    compile_gbnf(grammar, lim);
  } catch (const ConstraintError& e) {
    return e.what();
  }
  return "";
}

bool refused_with(const std::string& grammar, const std::string& part, const Limits& lim = {}) {
  const std::string msg = error_of(grammar, lim);
  BOOST_TEST_MESSAGE("'" << grammar.substr(0, 60) << "' -> " << msg);
  return !msg.empty() && msg.find(part) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_CASE(literals_and_escapes) {
  check(R"(root ::= "abc")", {{"", 1}, {"a", 1}, {"ab", 1}, {"abc", 2}, {"abcd", 0}, {"b", 0}});
  check(R"(root ::= "a\n\t\r\\\"\x41\u00e9\U0001F600\[\]")",
        {{"a\n\t\r\\\"A\xC3\xA9\xF0\x9F\x98\x80[]", 2}, {"a\n\t\r\\\"A\xC3", 1}});
  // \xHH is the code point U+00HH, written as UTF-8 (as llama.cpp reads it).
  check(R"(root ::= "\xe9")", {{"\xC3\xA9", 2}, {"\xE9", 0}});
  check(R"(root ::= "")", {{"", 2}, {"a", 0}});
  check("root ::= \"日本\"", {{"日本", 2}, {"日", 1}, {"\xE6\x97", 1}, {"本", 0}});
}

BOOST_AUTO_TEST_CASE(classes_any_and_negation) {
  check(R"(root ::= [a-cx])", {{"a", 2}, {"b", 2}, {"c", 2}, {"x", 2}, {"d", 0}, {"", 1}});
  check(R"(root ::= [a-] [-z])", {{"az", 2}, {"-z", 2}, {"a-", 2}, {"b", 0}});
  check(R"(root ::= [\]\\\n\x20])", {{"]", 2}, {"\\", 2}, {"\n", 2}, {" ", 2}, {"x", 0}});
  check(R"(root ::= [^"\\]+)", {{"abc", 2}, {"a\"", 0}, {"\\", 0}, {"é日本😀", 2}, {"\n", 2}});
  check(R"(root ::= .)", {{"a", 2}, {"\n", 2}, {"é", 2}, {"😀", 2}, {"ab", 0}, {"\xF0\x9F", 1}});
  check(R"(root ::= [^])", {{"a", 2}, {"日", 2}});
  // Negated classes exclude multi-byte characters too, and keep every other code point.
  check("root ::= [^é日]",
        {{"e", 2}, {"é", 0}, {"日", 0}, {"本", 2}, {"\xC3", 1}, {"\xE6\x97", 1}});
}

BOOST_AUTO_TEST_CASE(utf8_classes_are_exact_on_bytes) {
  const auto g = compile_gbnf("root ::= [α-ω日-本]*");
  BOOST_TEST(grammar_accepts(*g, "αβγω"));
  BOOST_TEST(grammar_accepts(*g, "日本"));
  BOOST_TEST(!grammar_accepts(*g, "Ω"));           // U+03A9, outside α-ω
  BOOST_TEST(grammar_accepts_prefix(*g, "\xCE"));  // the first byte of α..ο
  BOOST_TEST(!grammar_accepts(*g, "\xCE"));
  // Any code point: invalid UTF-8 is refused, even where the bytes look plausible.
  const auto any = compile_gbnf("root ::= .*");
  BOOST_TEST(grammar_accepts(*any, "héllo 日本 😀 \x7F"));
  BOOST_TEST(!grammar_accepts_prefix(*any, "\xC3\x28"));          // continuation missing
  BOOST_TEST(!grammar_accepts_prefix(*any, "\xC0\xAF"));          // overlong '/'
  BOOST_TEST(!grammar_accepts_prefix(*any, "\xE0\x80\x80"));      // overlong NUL
  BOOST_TEST(!grammar_accepts_prefix(*any, "\xED\xA0\x80"));      // surrogate U+D800
  BOOST_TEST(!grammar_accepts_prefix(*any, "\xF4\x90\x80\x80"));  // above U+10FFFF
  BOOST_TEST(!grammar_accepts_prefix(*any, "\xFF"));
  BOOST_TEST(!grammar_accepts_prefix(*any, "\x80"));
  BOOST_TEST(grammar_accepts_prefix(*any, "ab\xF0\x9F\x98"));  // a character cut by the end
  BOOST_TEST(!grammar_accepts(*any, "ab\xF0\x9F\x98"));
  // Class bounds at the edges of each UTF-8 length.
  check(R"(root ::= [\x7F-\u0080])", {{"\x7F", 2}, {"\xC2\x80", 2}, {"\xC2\x81", 0}});
  check(R"(root ::= [\u07FF-\u0800])", {{"\xDF\xBF", 2}, {"\xE0\xA0\x80", 2}, {"\xE0\xA0\x81", 0}});
  check(R"(root ::= [\uFFFF-\U00010000])",
        {{"\xEF\xBF\xBF", 2}, {"\xF0\x90\x80\x80", 2}, {"\xF0\x90\x80\x81", 0}});
  check(R"(root ::= [\uD7FF-\uE000])",
        {{"\xED\x9F\xBF", 2}, {"\xEE\x80\x80", 2}, {"\xED\xA0\x80", 0}});
}

BOOST_AUTO_TEST_CASE(grouping_alternation_and_operators) {
  check(R"(root ::= "a" | "bc" | "")", {{"", 2}, {"a", 2}, {"bc", 2}, {"b", 1}, {"ab", 0}});
  check(R"(root ::= ("a" | "b")* "c")", {{"c", 2}, {"abbac", 2}, {"ab", 1}, {"cc", 0}});
  check(R"(root ::= "x"+)", {{"", 1}, {"x", 2}, {"xxxx", 2}});
  check(R"(root ::= "x"? "y")", {{"y", 2}, {"xy", 2}, {"xxy", 0}});
  check(R"(root ::= ("ab")* "a")", {{"a", 2}, {"aba", 2}, {"ab", 1}, {"abab", 1}, {"aa", 0}});
  // A repetition applies to the whole literal before it, and repetitions stack.
  check(R"(root ::= "ab"{2})", {{"abab", 2}, {"ab", 1}, {"ababab", 0}});
  check(R"(root ::= ("a"?)*)", {{"", 2}, {"aaa", 2}});
  // An alternative that can be empty inside a loop, and loops next to each other.
  check(R"(root ::= ("a" | "")+ "b"* "c")", {{"c", 2}, {"aabbc", 2}, {"bac", 0}});
}

BOOST_AUTO_TEST_CASE(repetition_bounds) {
  check(R"(root ::= [0-9]{3})", {{"12", 1}, {"123", 2}, {"1234", 0}});
  check(R"(root ::= [0-9]{2,4})", {{"1", 1}, {"12", 2}, {"123", 2}, {"1234", 2}, {"12345", 0}});
  check(R"(root ::= [0-9]{2,})", {{"1", 1}, {"12", 2}, {"1234567890", 2}});
  check(R"(root ::= [0-9]{0,2} "x")", {{"x", 2}, {"1x", 2}, {"12x", 2}, {"123", 0}});
  check(R"(root ::= "a"{0})", {{"", 2}, {"a", 0}});
  check(R"(root ::= "a"{ 1 , 2 })", {{"a", 2}, {"aa", 2}});
  check(R"(root ::= ("a" "b"?){2,3})", {{"aa", 2}, {"abab", 2}, {"ababa", 2}, {"aaaa", 0}});
  // Large bounds stay within max_elements: one state per copy, none per skipped copy.
  const auto g = compile_gbnf(R"(root ::= "x"{1000,5000})");
  BOOST_TEST(grammar_accepts(*g, std::string(1000, 'x')));
  BOOST_TEST(grammar_accepts(*g, std::string(5000, 'x')));
  BOOST_TEST(grammar_accepts_prefix(*g, std::string(999, 'x')));
  BOOST_TEST(!grammar_accepts(*g, std::string(999, 'x')));
  BOOST_TEST(!grammar_accepts_prefix(*g, std::string(5001, 'x')));
  // The whitespace of JSON grammars: bounded indentation.
  check(R"(root ::= "{" ws "}"
ws ::= | " " | "\n" [ \t]{0,20})",
        {{"{}", 2},
         {"{ }", 2},
         {"{\n\t  }", 2},
         {"{  }", 0},
         {"{\n" + std::string(21, ' ') + "}", 0}});
}

BOOST_AUTO_TEST_CASE(rules_comments_and_layout) {
  check(R"(# a comment line
root ::= greeting-1 " " name   # trailing comment
greeting-1 ::= "hi" | "hello"
name ::= [A-Z] [a-z]*

)",
        {{"hi Bob", 2}, {"hello Al", 2}, {"hey Bob", 0}, {"hi bob", 0}});
  // Inside parentheses and after '|', newlines continue the rule (as llama.cpp).
  check("root ::= (\n  \"a\"\n  | \"b\"\n  \"c\"\n)\n", {{"a", 2}, {"bc", 2}, {"b", 1}});
  check("root ::= \"a\" |\n  \"b\"\r\nother ::= \"z\"\n", {{"a", 2}, {"b", 2}, {"z", 0}});
  // Rules may come in any order and refer to each other; unused rules are fine.
  check(R"(root ::= x y
y ::= "y"
x ::= "x"
unused ::= "u")",
        {{"xy", 2}, {"u", 0}});
}

BOOST_AUTO_TEST_CASE(recursive_grammars) {
  // Balanced parentheses and brackets, nested to any depth.
  const std::string parens = R"g(root ::= item*
item ::= "(" item* ")" | "[" item* "]")g";
  check(parens, {{"", 2},
                 {"()", 2},
                 {"([])", 2},
                 {"(()[()])()", 2},
                 {"((((((((((()))))))))))", 2},
                 {"(", 1},
                 {"(([]", 1},
                 {"(]", 0},
                 {"())", 0},
                 {"([)]", 0}});
  // Arithmetic with precedence through mutual recursion.
  const std::string expr = R"g(root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")" | "-" factor)g";
  check(expr, {{"1", 2},
               {"1+2*3", 2},
               {"(1+2)*3", 2},
               {"-(4/2)--1", 2},
               {"((1))", 2},
               {"1+", 1},
               {"(1+2", 1},
               {"1+*2", 0},
               {")", 0},
               {"(1))", 0}});
  // Right recursion runs in constant stack: a long text is fine.
  const auto g = compile_gbnf(R"(root ::= "a" root | "")");
  BOOST_TEST(grammar_accepts(*g, std::string(20000, 'a')));
  // Deep nesting: the stack grows with the text, and pops all the way down.
  const auto deep = compile_gbnf(R"g(root ::= "(" root? ")" "!"?)g");
  BOOST_TEST(grammar_accepts(*deep, std::string(3000, '(') + std::string(3000, ')')));
  BOOST_TEST(!grammar_accepts_prefix(*deep, std::string(3000, '(') + std::string(3001, ')')));
}

BOOST_AUTO_TEST_CASE(json_grammar) {
  const std::string json = R"(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws
array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws
string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)";
  check(json, {{R"({"a": 1, "b": [true, null, {"c": "x\"y\u00e9"}], "d": -0.5e3})", 2},
               {"{\"日本\": [[[]]], \"e\": {}}\n", 2},
               {R"({"a": [1, 2)", 1},
               {R"({"a": "\q"})", 0},
               {"{\"a\": \"tab\there\"}", 0},
               {R"({"a": 01})", 0},
               {R"([1])", 0}});
}

BOOST_AUTO_TEST_CASE(syntax_errors_name_line_and_column) {
  BOOST_TEST(refused_with("root ::= \"a\"\nfoo ::= \"b\" @\n", "line 2, column 13"));
  BOOST_TEST(refused_with("root ::= \"a\"\nfoo \"b\"\n", "line 2, column 5: expected '::='"));
  BOOST_TEST(refused_with("root ::= \"abc\n", "line 1, column 10: string literal is never closed"));
  BOOST_TEST(refused_with("root ::= [a-z\n", "line 1, column 10"));
  BOOST_TEST(refused_with("root ::= (\"a\" | \"b\"\n", "line 1, column 10"));
  BOOST_TEST(refused_with("root ::= \"a\")\n", "line 1, column 13"));
  BOOST_TEST(refused_with("\n\n  root ::= * \"a\"\n", "line 3, column 12"));
  BOOST_TEST(refused_with("root ::= \"\\q\"", "unknown escape"));
  BOOST_TEST(refused_with("root ::= \"\\x4\"", "hex digits"));
  BOOST_TEST(refused_with("root ::= [z-a]", "reversed"));
  BOOST_TEST(refused_with("root ::= []", "empty character class"));
  BOOST_TEST(refused_with("root ::= \"a\"{3,2}", "maximum below its minimum"));
  BOOST_TEST(refused_with("root ::= \"a\"{,2}", "expected a number"));
  BOOST_TEST(refused_with("root ::= \"a\"{2", "expected '}'"));
  BOOST_TEST(refused_with("root ::= \"\\uD800\"", "surrogate"));
  BOOST_TEST(refused_with("root ::= \"\xC3\x28\"", "invalid UTF-8"));
  BOOST_TEST(refused_with("root ::= \"a\"\nroot ::= \"b\"",
                          "line 2, column 1: rule 'root' is defined twice"));
  BOOST_TEST(refused_with("::= \"a\"", "expected a rule name"));
}

BOOST_AUTO_TEST_CASE(undefined_rule_missing_root_left_recursion) {
  BOOST_TEST(refused_with("root ::= \"a\" item\n", "line 1, column 14: undefined rule 'item'"));
  BOOST_TEST(refused_with("start ::= \"a\"\n", "no rule named 'root'"));
  BOOST_TEST(refused_with("", "no rule named 'root'"));
  // Direct, indirect and hidden behind a rule that can be empty.
  BOOST_TEST(
      refused_with("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"", "'expr' is left-recursive"));
  BOOST_TEST(refused_with("root ::= a\na ::= b \"x\" | \"y\"\nb ::= a \"z\"", "left-recursive"));
  BOOST_TEST(refused_with("root ::= a\na ::= opt a \"x\" | \"y\"\nopt ::= \"o\"?",
                          "left-recursive (a -> a)"));
  BOOST_TEST(refused_with("root ::= (\"x\" | root)*", "left-recursive"));
  // Right recursion and recursion after a byte are fine.
  BOOST_TEST(error_of("root ::= \"1\" (\"+\" root)?") == "");
  // A rule with no way out: it could never end, so stacks would never finish.
  BOOST_TEST(refused_with("root ::= \"a\" | b\nb ::= \"x\" b", "rule 'b' can never end"));
}

BOOST_AUTO_TEST_CASE(limits_are_named) {
  Limits lim;
  lim.max_source_bytes = 20;
  BOOST_TEST(refused_with("root ::= \"aaaaaaaaaaaaaaaaaaaa\"", "max_source_bytes", lim));
  lim = Limits{};
  lim.max_rules = 3;
  BOOST_TEST(refused_with("root ::= a b c\na ::= \"a\"\nb ::= \"b\"\nc ::= \"c\"",
                          "grammar has more than 3 rules (max_rules)", lim));
  BOOST_TEST(error_of("root ::= a b\na ::= \"a\"\nb ::= \"b\"", lim) == "");
  lim = Limits{};
  lim.max_elements = 100;
  BOOST_TEST(refused_with("root ::= [a-z]{200}", "(max_elements)", lim));
  BOOST_TEST(refused_with("root ::= (\"ab\"{50}){50}", "(max_elements)", lim));
  // Bounds so large that they are refused before any expansion.
  BOOST_TEST(refused_with("root ::= \"a\"{0,100000000}", "max_elements"));
  BOOST_TEST(refused_with("root ::= \"a\"{99999999999999999999}", "too large"));
  BOOST_TEST(refused_with("root ::= ((\"a\"{1000}){1000}){1000}", "max_elements"));
  // Nesting deep enough to hurt the native stack is refused.
  BOOST_TEST(refused_with("root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')'),
                          "nested more than"));
  BOOST_TEST(refused_with("root ::= \"a\"" + std::string(300, '*'), "nested more than"));
}

BOOST_AUTO_TEST_CASE(ambiguity_is_bounded) {
  // Two rules that read the same openings double the live parse stacks per '(' read.
  Limits lim;
  lim.max_stacks = 64;
  const auto g = compile_gbnf(R"g(root ::= r
r ::= a | b
a ::= "(" r ")" | "x"
b ::= "(" r "]" | "x")g",
                              lim);
  BOOST_TEST(grammar_accepts(*g, "((x)]"));
  BOOST_TEST(!grammar_accepts_prefix(*g, "((x))]"));
  BOOST_CHECK_EXCEPTION(grammar_accepts_prefix(*g, std::string(12, '(')), ConstraintError,
                        [](const ConstraintError& e) {
                          return std::string(e.what()).find("max_stacks") != std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(info_reports_sizes) {
  const auto g = compile_gbnf(R"(root ::= "a" b
b ::= [0-9]+)");
  const auto info = sy::constraints::grammar_info(*g);
  BOOST_TEST(info.rules == 2u);
  BOOST_TEST(info.states >= 3u);
  BOOST_TEST(info.elements >= 3u);
  BOOST_TEST(info.byte_classes >= 3u);
}

BOOST_AUTO_TEST_SUITE_END()
