// JSON Schema to GBNF: the language of the converted grammars (compiled by compile_gbnf) on valid
// and invalid JSON texts: objects, arrays, enums, numbers at their bounds, strings, patterns,
// formats, recursion, combinators, bounded whitespace; and every refusal, naming its keyword and
// its place in the schema.
#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "constraints/convert.hpp"
#include "constraints/grammar.hpp"

BOOST_AUTO_TEST_SUITE(test_constraints_json_schema)

using sy::constraints::compile_gbnf;
using sy::constraints::ConstraintError;
using sy::constraints::Grammar;
using sy::constraints::grammar_accepts;
using sy::constraints::grammar_accepts_prefix;
using sy::constraints::json_schema_to_gbnf;
using sy::constraints::Limits;

namespace {

std::shared_ptr<const Grammar> compile_schema(const std::string& schema) {
  return compile_gbnf(json_schema_to_gbnf(schema));
}

// Every text of `yes` (each valid JSON) is in the schema's language; no text of `no` is.
void check_language(const std::string& schema, const std::vector<std::string>& yes,
                    const std::vector<std::string>& no) {
  const auto g = compile_schema(schema);
  for (const auto& t : yes) {
    BOOST_CHECK_MESSAGE(nlohmann::json::accept(t), "the test's text is not JSON: " << t);
    BOOST_CHECK_MESSAGE(grammar_accepts(*g, t), schema << "\n    should accept " << t);
  }
  for (const auto& t : no)
    BOOST_CHECK_MESSAGE(!grammar_accepts(*g, t), schema << "\n    should reject " << t);
}

// The schema is refused with a message that contains `fragment`.
void check_refused(const std::string& schema, const std::string& fragment, const Limits& lim = {}) {
  try {
    json_schema_to_gbnf(schema, lim);
    BOOST_ERROR("not refused: " << schema);
  } catch (const ConstraintError& e) {
    BOOST_CHECK_MESSAGE(
        std::string(e.what()).find(fragment) != std::string::npos,
        schema << "\n    message \"" << e.what() << "\" lacks \"" << fragment << "\"");
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(any_json_value) {
  const std::vector<std::string> yes = {"null",
                                        "true",
                                        "false",
                                        "0",
                                        "-0",
                                        "12.5e-3",
                                        "1E+2",
                                        "-7.25",
                                        R"("a\"b\\c\/\b\f\n\r\t\u00e9\uD83D\uDE00")",
                                        R"("é😀")",
                                        "[]",
                                        "[ 1, \"x\" ]",
                                        R"({"a":{"b":[null,{}]}})",
                                        "{ }",
                                        R"({"":0})"};
  const std::vector<std::string> no = {"01",
                                       "1.",
                                       ".5",
                                       "+1",
                                       "-",
                                       "1e",
                                       "1e+",
                                       R"("\q")",
                                       R"("\u12")",
                                       R"("\uD83D")",
                                       R"("\uDE00\uD83D")",
                                       "\"a\tb\"",
                                       "\"a\x01\"",
                                       "[1,]",
                                       R"({"a"})",
                                       "{a:1}",
                                       "nul",
                                       "'x'",
                                       " 1",
                                       "1 ",
                                       "[1] [2]",
                                       "NaN",
                                       "Infinity",
                                       R"("abc)",
                                       ""};
  check_language("{}", yes, no);
  check_language("true", yes, no);
}

BOOST_AUTO_TEST_CASE(whitespace_is_bounded) {
  std::string nl20(21, ' '), nl21(22, ' ');  // a newline, then 20 or 21 spaces
  nl20[0] = nl21[0] = '\n';
  check_language(
      "{}",
      {"[1," + nl20 + "2]", "[1, 2]", "[1,\n\t\t 2]", "[\n1\n]", "[1\n,\n2]", "{\n  \"a\" : 1\n}"},
      {"[1," + nl21 + "2]", "[1,  2]", "[1," + std::string(21, ' ') + "2]", "[1,\n\n2]", "[1,\t2]",
       "[1,\r\n2]"});
  const auto g = compile_schema("{}");
  BOOST_CHECK(grammar_accepts_prefix(*g, "[1," + nl20));
  BOOST_CHECK(!grammar_accepts_prefix(*g, "[1," + nl21));
  BOOST_CHECK(!grammar_accepts_prefix(*g, "[1,   "));
}

BOOST_AUTO_TEST_CASE(properties_required_and_in_order) {
  const std::string schema = R"({
    "type": "object",
    "properties": {
      "name": {"type": "string"},
      "age": {"type": "integer", "minimum": 0, "maximum": 150},
      "email": {"type": "string"}
    },
    "required": ["name"],
    "additionalProperties": false
  })";
  check_language(
      schema,
      {R"({"name":"a"})", R"({"name":"a","age":3})", R"({"name":"a","email":"x"})",
       R"({"name":"a","age":150,"email":"x"})", "{\n  \"name\": \"a\",\n  \"age\": 0\n}"},
      {"{}", R"({"age":3})", R"({"age":3,"name":"a"})", R"({"name":"a","extra":1})",
       R"({"name":"a","name":"b"})", R"({"name":1})", R"({"name":"a","age":151})",
       R"({"name":"a","age":-1})", R"({"name":"a",})"});
  const auto g = compile_schema(schema);
  BOOST_CHECK(grammar_accepts_prefix(*g, R"({"na)"));
  BOOST_CHECK(grammar_accepts_prefix(*g, R"({"name":"a",)"));
  BOOST_CHECK(grammar_accepts_prefix(*g, R"({"name":"a","ag)"));
  BOOST_CHECK(!grammar_accepts_prefix(*g, R"({"name":"a","x)"));
  BOOST_CHECK(!grammar_accepts_prefix(*g, R"({"age":)"));
}

BOOST_AUTO_TEST_CASE(optional_properties_around_a_required_one) {
  check_language(
      R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},
          "c":{"type":"integer"}},"required":["b"],"additionalProperties":false})",
      {R"({"b":1})", R"({"a":1,"b":2})", R"({"b":1,"c":2})", R"({"a":1,"b":2,"c":3})"},
      {"{}", R"({"a":1})", R"({"a":1,"c":2})", R"({"c":1,"b":2})", R"({"b":1,"a":2})"});
  check_language(
      R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},
          "additionalProperties":false})",
      {"{}", R"({"a":1})", R"({"b":1})", R"({"a":1,"b":2})", "{ }"},
      {R"({"b":1,"a":2})", R"({"a":1,"a":1})", R"({,"a":1})", R"({"a":1,})"});
}

BOOST_AUTO_TEST_CASE(additional_properties) {
  // Absent (or true): other keys, after the declared ones, with any value.
  for (const char* ap : {"", R"(,"additionalProperties":true)"}) {
    check_language(
        std::string(R"({"type":"object","properties":{"a":{"type":"integer"}})") + ap + "}",
        {"{}", R"({"a":1,"b":"x"})", R"({"b":[1]})", R"({"ab":1,"":2})", R"({"A":{"a":"x"}})",
         R"({"a":1,"b":1,"c":null})"},
        {R"({"a":1,"a":2})", R"({"a":"x"})", R"({"b":1,"a":1})"});
  }
  check_language(R"({"type":"object","additionalProperties":{"type":"integer"}})",
                 {"{}", R"({"x":1,"y":-2})"}, {R"({"x":"s"})", R"({"x":1.5})"});
  check_language(R"({"type":"object","additionalProperties":false})", {"{}", "{ }"},
                 {R"({"b":1})", R"({"":1})"});
  // Extra keys that begin like a declared one, or hold characters JSON escapes.
  check_language(
      R"({"type":"object","properties":{"a\"b":{"type":"integer"},"é":{"type":"null"},
          "a/b":{"type":"integer"}},"additionalProperties":{"type":"boolean"}})",
      {R"({"a\"b":1})", R"({"a\"c":true})", R"({"a\"":true})", R"({"é":null,"éé":false})",
       R"({"a/b":1,"a\\b":true})", R"({"a\"b":1,"e":true})"},
      {R"({"a\"b":1,"a\"b":1})", R"({"é":null,"é":null})", R"({"a\"b":true})", R"({"x":1})"});
}

BOOST_AUTO_TEST_CASE(required_names_without_a_property_schema) {
  check_language(R"({"type":"object","required":["id"]})", {R"({"id":1})", R"({"id":"x","b":2})"},
                 {"{}", R"({"b":2})"});
  check_language(R"({"type":"object","required":["id"],"additionalProperties":{"type":"string"}})",
                 {R"({"id":"x"})"}, {R"({"id":1})"});
  check_refused(R"({"type":"object","required":["id"],"additionalProperties":false})",
                "json_schema: no JSON value validates against the schema");
}

BOOST_AUTO_TEST_CASE(false_property_schemas_forbid_the_key) {
  check_language(R"({"type":"object","properties":{"a":false,"b":{"type":"integer"}}})",
                 {"{}", R"({"b":1})", R"({"b":1,"c":2})"}, {R"({"a":1})", R"({"b":1,"a":1})"});
}

BOOST_AUTO_TEST_CASE(nested_objects_and_arrays) {
  const std::string schema = R"({
    "type": "object",
    "properties": {
      "user": {
        "type": "object",
        "properties": {
          "id": {"type": "integer"},
          "roles": {"type": "array", "items": {"enum": ["admin", "user"]}}
        },
        "required": ["id", "roles"],
        "additionalProperties": false
      },
      "points": {
        "type": "array",
        "items": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}
      }
    },
    "required": ["user"],
    "additionalProperties": false
  })";
  check_language(
      schema,
      {R"({"user":{"id":1,"roles":[]}})",
       R"({"user":{"id":-4,"roles":["admin","user"]},"points":[[0,1.5],[-2,3e2]]})",
       "{\n  \"user\": {\n    \"id\": 1,\n    \"roles\": [\n      \"admin\"\n    ]\n  },\n"
       "  \"points\": []\n}"},
      {R"({"user":{"id":1,"roles":["root"]}})", R"({"user":{"id":1,"roles":[]},"points":[[1]]})",
       R"({"user":{"id":1,"roles":[]},"points":[[1,2,3]]})", R"({"user":{"roles":[]}})",
       R"({"user":{"id":1.5,"roles":[]}})", R"({"points":[]})"});
}

BOOST_AUTO_TEST_CASE(array_lengths_and_tuples) {
  check_language(R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})",
                 {"[1,2]", "[1,2,3]", "[ 1 , 2 ]"}, {"[]", "[1]", "[1,2,3,4]", R"([1,"a"])"});
  check_language(R"({"type":"array","maxItems":0})", {"[]", "[ ]"}, {"[1]"});
  check_language(R"({"type":"array","minItems":1})", {"[1]", R"([{},"x"])"}, {"[]"});
  check_language(
      R"({"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],"items":false})",
      {"[]", "[1]", R"([1,"a"])"}, {R"([1,"a",2])", R"(["a"])", R"([1,2])"});
  check_language(
      R"({"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],
          "items":{"type":"boolean"},"minItems":3,"maxItems":4})",
      {R"([1,"a",true])", R"([1,"a",true,false])"},
      {R"([1,"a"])", R"([1,"a",true,false,true])", R"([1,"a",1])"});
  check_language(
      R"({"type":"array","prefixItems":[{"type":"integer"},{"type":"integer"},{"type":"integer"}],
          "maxItems":2})",
      {"[]", "[1]", "[1,2]"}, {"[1,2,3]"});
  // Draft 4-2019 tuples: items as a list, additionalItems for the rest.
  check_language(
      R"({"type":"array","items":[{"type":"integer"},{"type":"string"}],
          "additionalItems":{"type":"null"}})",
      {"[]", "[1]", R"([1,"a",null,null])"}, {R"([1,"a",1])", R"(["a"])"});
  check_language(R"({"type":"array","items":[{"type":"integer"}],"additionalItems":false})",
                 {"[]", "[1]"}, {"[1,2]"});
}

BOOST_AUTO_TEST_CASE(enum_and_const) {
  check_language(R"({"enum":["red","green","with \"quote\"","é",1,2.5,null,true,{"a":[1,2]},[]]})",
                 {R"("red")", R"("with \"quote\"")", R"("é")", "1", "2.5", "null", "true",
                  R"({"a":[1,2]})", R"({ "a" : [ 1 , 2 ] })", "[]"},
                 {R"("blue")", R"("Red")", "2", "false", R"({"a":[2,1]})", R"({"a":[1,2],"b":0})",
                  R"("red" )", "[1]"});
  check_language(R"({"const":"x"})", {R"("x")"}, {R"("y")", "null"});
  check_language(R"({"type":"string","enum":["a",1,"b"]})", {R"("a")", R"("b")"}, {"1"});
  check_language(R"({"enum":["a","b"],"const":"b"})", {R"("b")"}, {R"("a")"});
  check_language(R"({"const":"\u0001\n"})", {R"("\u0001\n")"}, {R"("\n\n")"});
}

BOOST_AUTO_TEST_CASE(integer_bounds_digit_by_digit) {
  struct Range {
    std::string schema;
    std::optional<int64_t> lo, hi;
  };
  const std::vector<Range> ranges = {
      {R"({"type":"integer","minimum":0,"maximum":150})", 0, 150},
      {R"({"type":"integer","minimum":-10,"maximum":10})", -10, 10},
      {R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":100})", 1, 99},
      {R"({"type":"integer","minimum":5})", 5, std::nullopt},
      {R"({"type":"integer","maximum":-3})", std::nullopt, -3},
      {R"({"type":"integer","minimum":1000,"maximum":1000})", 1000, 1000},
      {R"({"type":"integer","minimum":-123,"maximum":4567})", -123, 4567},
      {R"({"type":"integer","minimum":99,"maximum":1001})", 99, 1001},
      {R"({"type":"integer","minimum":2.5,"maximum":7.9})", 3, 7},
      {R"({"type":"integer","exclusiveMinimum":2.5,"exclusiveMaximum":7.9})", 3, 7},
      {R"({"type":"integer","minimum":5,"exclusiveMinimum":true})", 6, std::nullopt},
      {R"({"type":"integer","maximum":5,"exclusiveMaximum":true})", std::nullopt, 4},
      {R"({"type":"integer","minimum":3,"exclusiveMinimum":3})", 4, std::nullopt},
      {R"({"type":"integer","minimum":0})", 0, std::nullopt},
      {R"({"type":"integer","maximum":0})", std::nullopt, 0},
  };
  for (const auto& r : ranges) {
    const auto g = compile_schema(r.schema);
    for (int64_t v = -1200; v <= 5200; ++v) {
      const bool in = (!r.lo || v >= *r.lo) && (!r.hi || v <= *r.hi);
      BOOST_CHECK_MESSAGE(grammar_accepts(*g, std::to_string(v)) == in,
                          r.schema << ": " << v << (in ? " should" : " should not") << " pass");
    }
    for (const int64_t v : {int64_t{99999}, int64_t{123456789012}, int64_t{-99999}}) {
      const bool in = (!r.lo || v >= *r.lo) && (!r.hi || v <= *r.hi);
      BOOST_CHECK_MESSAGE(grammar_accepts(*g, std::to_string(v)) == in, r.schema << ": " << v);
    }
    const bool zero = (!r.lo || *r.lo <= 0) && (!r.hi || *r.hi >= 0);
    BOOST_CHECK_EQUAL(grammar_accepts(*g, "-0"), zero);  // JSON's -0 is zero
    for (const char* t : {"007", "1.0", "1e2", "+1", "--1", "5.5"})
      BOOST_CHECK_MESSAGE(!grammar_accepts(*g, t), r.schema << ": " << t);
  }
  check_refused(R"({"type":"integer","minimum":5,"maximum":3})",
                "no JSON value validates against the schema");
}

BOOST_AUTO_TEST_CASE(number_bounds) {
  struct Range {
    std::string schema;
    std::optional<double> lo, hi;
    bool lo_excl = false, hi_excl = false;
  };
  const std::vector<Range> ranges = {
      {R"({"type":"number","minimum":0,"maximum":10})", 0, 10},
      {R"({"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1})", 0, 1, true, true},
      {R"({"type":"number","minimum":-3,"maximum":7})", -3, 7},
      {R"({"type":"number","exclusiveMinimum":-1,"exclusiveMaximum":1})", -1, 1, true, true},
      {R"({"type":"number","minimum":-10,"exclusiveMaximum":-9})", -10, -9, false, true},
      {R"({"type":"number","maximum":0})", std::nullopt, 0},
      {R"({"type":"number","exclusiveMaximum":0})", std::nullopt, 0, false, true},
      {R"({"type":"number","exclusiveMinimum":0})", 0, std::nullopt, true},
      {R"({"type":"number","minimum":2,"maximum":2})", 2, 2},
      {R"({"type":"number","minimum":5.0})", 5, std::nullopt},
  };
  std::vector<std::string> texts;
  for (int i = 0; i <= 12; ++i)
    for (const char* frac : {"", ".0", ".00", ".5", ".05", ".001", ".999"})
      for (const char* sign : {"", "-"}) texts.push_back(sign + std::to_string(i) + frac);
  for (const auto& r : ranges) {
    const auto g = compile_schema(r.schema);
    for (const auto& t : texts) {
      const double v = std::stod(t);
      const bool in = (!r.lo || (r.lo_excl ? v > *r.lo : v >= *r.lo)) &&
                      (!r.hi || (r.hi_excl ? v < *r.hi : v <= *r.hi));
      BOOST_CHECK_MESSAGE(grammar_accepts(*g, t) == in,
                          r.schema << ": " << t << (in ? " should" : " should not") << " pass");
    }
    for (const char* t : {"01", "1.", ".5", "1e0", "00.5"})  // bounded numbers: no exponent
      BOOST_CHECK_MESSAGE(!grammar_accepts(*g, t), r.schema << ": " << t);
  }
  check_language(R"({"type":"number"})", {"1e5", "-2.5E-3", "0.0"}, {"01", "1.e5"});
  check_refused(R"({"type":"number","minimum":0.5})",
                "minimum 0.5 at /minimum is not supported: bounds on numbers must be integers");
  check_refused(R"({"type":"integer","maximum":1e30})",
                "maximum 1e+30 at /maximum is outside [-1e18, 1e18]");
  check_refused(R"({"type":"number","minimum":3,"maximum":2})",
                "no JSON value validates against the schema");
}

BOOST_AUTO_TEST_CASE(strings_escapes_and_lengths) {
  check_language(
      R"({"type":"string","minLength":2,"maxLength":3})",
      {R"("ab")", R"("abc")", R"("é😀")", R"("\n\t")", R"("\u00e9x")", R"("\uD83D\uDE00x")",
       R"("\"\\")", R"("\/\/\/")"},
      {R"("a")", R"("abcd")", R"("😀")", R"("\uD83D\uDE00")", R"("\u00e9")", "ab", R"("\x41b")"});
  check_language(R"({"type":"string","maxLength":0})", {R"("")"}, {R"("a")"});
  check_language(R"({"type":"string"})", {R"("")", R"("日本語")", "\"\x7F\""},
                 {"\"\n\"", "\"\x1F\"", R"("\a")", "1"});
  check_refused(R"({"type":"string","minLength":-1})",
                "minLength at /minLength must be a non-negative integer");
  check_refused(R"({"type":"string","minLength":1.5})", "must be a non-negative integer");
}

BOOST_AUTO_TEST_CASE(string_patterns) {
  check_language(R"({"type":"string","pattern":"^[a-z]+\\d{2}$"})", {R"("ab12")"},
                 {R"("ab1")", R"("Ab12")", R"("ab12x")", R"("1ab12")"});
  // Unanchored, as JSON Schema means it: the pattern is searched for.
  check_language(R"({"type":"string","pattern":"ab"})", {R"("xxabyy")", R"("ab")", R"("a\nab")"},
                 {R"("a b")", R"("")"});
  check_language(R"({"type":"string","pattern":"^ab"})", {R"("abzz")"}, {R"("zab")"});
  check_language(R"({"type":"string","pattern":"b$"})", {R"("aab")"}, {R"("ba")"});
  // What the pattern allows goes into the JSON string escaped where JSON requires it.
  check_language(R"({"type":"string","pattern":"^a.b$"})",
                 {R"("axb")", R"("a\"b")", R"("a\\b")", R"("a\u0001b")", R"("a\tb")",
                  R"("a\u0009b")", R"("a/b")", R"("a\/b")", R"("aéb")"},
                 {R"("a\nb")", R"("a\u000ab")", R"("ab")", "\"a\tb\"", R"("a"b")"});
  check_language(R"({"type":"string","pattern":"^\"[^\"]*\"$"})", {R"("\"x\"")", R"("\"\"")"},
                 {R"("x")", R"(""x"")"});
  check_language(R"({"type":"string","pattern":"^[\\\\]+$"})", {R"("\\")", R"("\\\\")"},
                 {R"("")", R"("a")", R"("/")"});
  check_refused(R"({"type":"string","pattern":"^(a"})",
                "pattern at /pattern: regex: missing ), unterminated subpattern at position 1");
  check_refused(R"js({"properties":{"p":{"type":"string","pattern":"a(?=b)"}}})js",
                "pattern at /properties/p/pattern: regex: lookahead (?= at position 1 is not "
                "supported");
  check_refused(R"({"type":"string","pattern":"a","maxLength":3})",
                "pattern beside minLength or maxLength at (root) is not supported");
}

BOOST_AUTO_TEST_CASE(formats) {
  check_language(R"({"type":"string","format":"date"})",
                 {R"("2024-02-29")", R"("1999-12-31")", R"("2024-04-30")", R"("0001-01-01")"},
                 {R"("2024-02-30")", R"("2024-04-31")", R"("2024-13-01")", R"("2024-00-10")",
                  R"("2024-1-01")", R"("24-01-01")", R"("2024-01-01T")"});
  check_language(
      R"({"type":"string","format":"time"})",
      {R"("12:30:00Z")", R"("23:59:60.123+05:30")", R"("00:00:00z")", R"("08:15:30-07:00")"},
      {R"("24:00:00Z")", R"("12:60:00Z")", R"("12:30:00")", R"("12:30Z")", R"("12:30:00+5:00")"});
  check_language(R"({"type":"string","format":"date-time"})",
                 {R"("2024-01-01T00:00:00+01:00")", R"("2024-01-01t23:59:59.5Z")"},
                 {R"("2024-01-01 00:00:00Z")", R"("2024-01-01")", R"("2024-01-01T00:00:00")"});
  check_language(
      R"({"type":"string","format":"uuid"})",
      {R"("123e4567-e89b-12d3-a456-426614174000")", R"("123E4567-E89B-12D3-A456-426614174000")"},
      {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400")",
       R"("g23e4567-e89b-12d3-a456-426614174000")"});
  check_refused(R"({"type":"string","format":"email"})",
                "json_schema: format \"email\" at (root) is not supported");
  check_refused(R"({"type":"string","format":"date","minLength":3})",
                "format beside pattern, minLength or maxLength at (root) is not supported");
}

BOOST_AUTO_TEST_CASE(recursive_definitions) {
  const std::string tree = R"({
    "$defs": {
      "node": {
        "type": "object",
        "properties": {
          "value": {"type": "integer"},
          "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
        },
        "required": ["value", "children"],
        "additionalProperties": false
      }
    },
    "$ref": "#/$defs/node"
  })";
  check_language(
      tree,
      {R"({"value":1,"children":[]})",
       R"({"value":1,"children":[{"value":2,"children":[{"value":3,"children":[]}]},
           {"value":4,"children":[]}]})"},
      {R"({"value":1})", R"({"value":1,"children":[{"value":2}]})",
       R"({"value":1,"children":[{"value":2,"children":[],"x":0}]})",
       R"({"value":1,"children":[{"value":2,"children":[{"value":"3","children":[]}]}]})"});
  const auto g = compile_schema(tree);
  BOOST_CHECK(grammar_accepts_prefix(*g, R"({"value":1,"children":[{"value":2,"children":[{)"));
  BOOST_CHECK(!grammar_accepts_prefix(*g, R"({"value":1,"children":[{"x)"));

  // "definitions" and a reference to the root itself.
  check_language(
      R"({"definitions":{"s":{"type":"string","maxLength":2}},"type":"array",
          "items":{"$ref":"#/definitions/s"}})",
      {R"(["ab",""])"}, {R"(["abc"])"});
  check_language(
      R"({"type":"object","properties":{"v":{"type":"integer"},"next":{"$ref":"#"}},
          "required":["v"],"additionalProperties":false})",
      {R"({"v":1})", R"({"v":1,"next":{"v":2,"next":{"v":3}}})"},
      {R"({"v":1,"next":{}})", R"({"v":1,"next":null})"});
  // A percent-encoded name in the pointer, and ~1 for '/'.
  check_language(R"({"$defs":{"a b":{"const":1},"c/d":{"const":2}},
                     "anyOf":[{"$ref":"#/$defs/a%20b"},{"$ref":"#/$defs/c~1d"}]})",
                 {"1", "2"}, {"3"});
}

BOOST_AUTO_TEST_CASE(recursion_that_cannot_end) {
  // Every node must hold another: no finite JSON validates.
  check_refused(R"({"$defs":{"t":{"type":"object","properties":{"c":{"$ref":"#/$defs/t"}},
                     "required":["c"]}},"$ref":"#/$defs/t"})",
                "json_schema: no JSON value validates against the schema");
  // The same node with `c` optional ends: the alternative that cannot end is dropped.
  check_language(R"({"$defs":{"t":{"type":"object","properties":{"c":{"$ref":"#/$defs/t"}},
                     "additionalProperties":false}},"$ref":"#/$defs/t"})",
                 {"{}", R"({"c":{"c":{}}})"}, {R"({"c":1})"});
  check_refused(R"({"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"},{"type":"null"}]}},
                     "$ref":"#/$defs/a"})",
                "$ref cycle through #/$defs/a that reaches itself before any text (left "
                "recursion) is not supported");
}

BOOST_AUTO_TEST_CASE(any_of_one_of_and_type_lists) {
  check_language(R"({"anyOf":[{"type":"string","maxLength":2},{"type":"integer","minimum":5}]})",
                 {R"("ab")", "5", "100"}, {R"("abc")", "4", "null"});
  check_language(
      R"({"oneOf":[{"type":"null"},{"type":"array","items":{"type":"boolean"},"minItems":1}]})",
      {"null", "[true]"}, {"[]", "[1]", "false"});
  check_language(R"({"type":["string","null"]})", {R"("x")", "null"}, {"1", "{}"});
  check_language(R"({"type":["integer","string"],"minimum":1,"maxLength":1})",
                 {"1", "99", R"("a")"}, {"0", R"("ab")"});
  check_language(R"({"type":["number","integer"],"maximum":5})", {"5", "-1.5", "4.99"},
                 {"5.5", "6"});
  // Pydantic's Optional[str].
  check_language(
      R"({"anyOf":[{"type":"string"},{"type":"null"}],"default":null,"title":"Nickname"})",
      {R"("x")", "null"}, {"1"});
  // Keywords beside anyOf hold in every branch.
  check_language(
      R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},
          "additionalProperties":false,"anyOf":[{"required":["a"]},{"required":["b"]}]})",
      {R"({"a":1})", R"({"b":1})", R"({"a":1,"b":2})"}, {"{}"});
  check_language(R"({"type":"integer","anyOf":[{"minimum":10},{"maximum":-10}]})",
                 {"10", "-10", "99"}, {"0", "9", "-9"});
}

BOOST_AUTO_TEST_CASE(all_of_and_ref_beside_keywords_merge) {
  check_language(
      R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
                   {"properties":{"b":{"type":"string"}},"required":["b"]}]})",
      {R"({"a":1,"b":"x"})", R"({"a":1,"b":"x","c":null})"}, {R"({"a":1})", R"({"b":"x"})"});
  // Pydantic v1 wraps a $ref in allOf to give it a description.
  check_language(R"({"definitions":{"c":{"enum":["r","g"]}},"type":"object",
                     "properties":{"color":{"allOf":[{"$ref":"#/definitions/c"}],
                                            "description":"a color"}},
                     "required":["color"],"additionalProperties":false})",
                 {R"({"color":"r"})"}, {R"({"color":"b"})"});
  check_language(R"({"$ref":"#/$defs/a","$defs":{"a":{"type":"integer","minimum":1}},
                     "maximum":3})",
                 {"1", "3"}, {"0", "4"});
  check_language(R"({"allOf":[{"type":["integer","string"]},{"type":"number"}],"minimum":0})",
                 {"0", "7"}, {R"("a")", "-1", "1.5"});
  check_refused(R"({"allOf":[{"minimum":1},{"minimum":2}]})",
                "keyword \"minimum\" at /allOf/1/minimum differs from the one at "
                "/allOf/0/minimum");
  check_refused(R"({"allOf":[{"properties":{"a":{"type":"integer"}}},
                             {"additionalProperties":false}]})",
                "additionalProperties at /allOf/1/additionalProperties and properties at "
                "/allOf/0 from different allOf parts are not supported");
  check_refused(R"({"$defs":{"a":{"allOf":[{"$ref":"#/$defs/a"}],"minimum":1}},
                    "$ref":"#/$defs/a"})",
                "merges a schema that contains it");
  check_refused(R"({"anyOf":[{"type":"null"}],"oneOf":[{"type":"null"}]})",
                "anyOf beside oneOf at (root) is not supported");
}

BOOST_AUTO_TEST_CASE(annotations_are_ignored) {
  check_language(R"({"$schema":"https://json-schema.org/draft/2020-12/schema","$id":"x",
                     "title":"T","description":"D","default":1,"examples":[1],"$comment":"c",
                     "readOnly":true,"writeOnly":false,"deprecated":false,"type":"integer"})",
                 {"1"}, {R"("1")"});
}

BOOST_AUTO_TEST_CASE(keywords_without_a_type_constrain_their_own_type) {
  check_language(R"({"properties":{"a":{"type":"integer"}}})", {"5", R"("x")", R"({"a":1})", "[]"},
                 {R"({"a":"x"})"});
  check_language(R"({"minLength":2})", {"1", R"("ab")", "null"}, {R"("a")"});
}

BOOST_AUTO_TEST_CASE(unsupported_keywords_are_refused_with_their_place) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type":"object","properties":{"tags":{"type":"array","uniqueItems":true}}})",
       "json_schema: keyword \"uniqueItems\" at /properties/tags is not supported"},
      {R"({"type":"object","patternProperties":{"^x":{}}})",
       "json_schema: keyword \"patternProperties\" at (root) is not supported"},
      {R"({"if":{"type":"string"},"then":{"minLength":1}})", "keyword \"if\" at (root)"},
      {R"({"not":{"type":"null"}})", "keyword \"not\" at (root)"},
      {R"({"properties":{"a":{"dependentRequired":{"x":["y"]}}}})",
       "keyword \"dependentRequired\" at /properties/a is not supported"},
      {R"({"type":"array","items":{"contains":{"const":1}}})",
       "keyword \"contains\" at /items is not supported"},
      {R"({"anyOf":[{"type":"null"},{"type":"number","multipleOf":2}]})",
       "keyword \"multipleOf\" at /anyOf/1 is not supported"},
      {R"({"$defs":{"x":{"minProperties":1}},"properties":{"a":{"$ref":"#/$defs/x"}}})",
       "keyword \"minProperties\" at /$defs/x is not supported"},
      {R"({"properties":{"a/b~":{"maxProperties":1}}})",
       "keyword \"maxProperties\" at /properties/a~1b~0 is not supported"},
      {R"({"propertyNames":{"maxLength":3}})", "keyword \"propertyNames\""},
      {R"({"unevaluatedProperties":false})", "keyword \"unevaluatedProperties\""},
      {R"({"type":"string","nullable":true})", "keyword \"nullable\""},
      {R"({"type":"array","prefixItems":[{"type":"integer"}],"items":{"minContains":1}})",
       "keyword \"minContains\" at /items"},
      {R"({"properties":{"a":{"$ref":"https://example.com/s.json"}}})",
       "json_schema: $ref \"https://example.com/s.json\" at /properties/a/$ref is not "
       "supported: only local references (#/...) are"},
      {R"({"$ref":"other.json#/x"})", "$ref \"other.json#/x\" at /$ref is not supported"},
      {R"({"$ref":"#anchor"})", "$ref \"#anchor\" at /$ref is not supported"},
      {R"({"$ref":"#/$defs/missing"})",
       "$ref \"#/$defs/missing\" at /$ref points to nothing in the schema"},
      {R"({"type":"float"})", "type at /type must be a JSON Schema type name"},
      {R"({"properties":{"a":[1]}})", "the schema at /properties/a must be an object or a boolean"},
      {"[1]", "the schema at (root) must be an object or a boolean"},
      {"{", "json_schema: the schema is not valid JSON"},
      {"false", "json_schema: no JSON value validates against the schema"},
      {R"({"enum":[]})", "no JSON value validates against the schema"},
      {R"({"enum":["a"],"maxLength":3})",
       "keyword \"maxLength\" beside enum or const at (root) is not supported"},
      {R"({"type":"array","prefixItems":[{}],"items":[{}]})",
       "items as a list beside prefixItems at /items is not supported"},
  };
  for (const auto& [schema, fragment] : cases) check_refused(schema, fragment);
}

BOOST_AUTO_TEST_CASE(limits) {
  Limits lim;
  lim.max_source_bytes = 10;
  check_refused(R"({"type":"integer"})",
                "json_schema: the schema has 18 bytes, over the limit max_source_bytes=10", lim);
  lim = Limits{};
  lim.max_rules = 3;
  check_refused("{}", "json_schema: the grammar needs 11 rules, over the limit max_rules=3", lim);
  lim = Limits{};
  lim.max_elements = 100;
  check_refused(R"({"type":"string","maxLength":1000})",
                "maxLength 1000 at /maxLength is over the limit max_elements=100", lim);
  check_refused(R"({"type":"array","minItems":1000})",
                "minItems 1000 at /minItems is over the limit max_elements=100", lim);
  std::string deep_items;
  for (int i = 0; i < 150; ++i) deep_items += R"({"type":"array","items":)";
  deep_items += "{}" + std::string(150, '}');
  check_refused(deep_items, "subschemas nested deeper than 100");
  check_refused(R"({"const":)" + std::string(600, '[') + std::string(600, ']') + "}",
                "the schema nests deeper than 512 levels");
  // Each level holds two copies of the next ($ref beside another keyword): 2^20 subschemas.
  nlohmann::json defs;
  for (int i = 0; i < 20; ++i) {
    std::string target = "#/$defs/d", name = "d";
    target += std::to_string(i + 1);
    name += std::to_string(i);
    const nlohmann::json next = {{"$ref", target}, {"maxItems", 5}};
    defs[name] = {{"type", "array"}, {"prefixItems", {next, next}}};
  }
  defs["d20"] = {{"type", "integer"}};
  lim = Limits{};
  lim.max_elements = 1000;
  check_refused(nlohmann::json{{"$defs", defs}, {"$ref", "#/$defs/d0"}}.dump(),
                "json_schema: the grammar needs more than max_elements=1000 elements", lim);
}

BOOST_AUTO_TEST_CASE(nested_schemas_give_linear_text) {
  // Extra members and optional ones appear in two places each: shared rules keep the grammar
  // from doubling per level.
  nlohmann::json maps = {{"type", "integer"}}, objects = maps;
  for (int i = 0; i < 30; ++i) {
    maps = {{"type", "object"}, {"additionalProperties", maps}};
    objects = {{"type", "object"}, {"properties", {{"a", objects}, {"b", {{"type", "null"}}}}}};
  }
  BOOST_CHECK_LT(json_schema_to_gbnf(maps.dump()).size(), 20000u);
  BOOST_CHECK_LT(json_schema_to_gbnf(objects.dump()).size(), 20000u);
  const auto g = compile_schema(maps.dump());
  BOOST_CHECK(grammar_accepts(*g, R"({"x":{"y":{}},"z":{}})"));
  BOOST_CHECK(!grammar_accepts(*g, R"({"x":1})"));
}

BOOST_AUTO_TEST_CASE(long_property_names) {
  const std::string name(100, 'k');
  const std::string schema = R"({"type":"object","properties":{")" + name +
                             R"(":{"type":"integer"},"k":{"type":"integer"}}})";
  check_language(
      schema,
      {"{\"" + name + "\":1}", "{\"" + name + "\":1,\"" + name + "k\":2}",
       "{\"" + name.substr(1) + "\":true}", R"({"k":1,"kk":[]})"},
      {"{\"" + name + "\":1,\"" + name + "\":2}", R"({"k":1,"k":2})", "{\"" + name + "\":\"x\"}"});
}

BOOST_AUTO_TEST_CASE(the_text_is_deterministic) {
  const std::string schema =
      R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"$ref":"#/$defs/b"}},
          "$defs":{"b":{"type":"array","items":{"$ref":"#/$defs/b"}}}})";
  BOOST_CHECK_EQUAL(json_schema_to_gbnf(schema), json_schema_to_gbnf(schema));
}

BOOST_AUTO_TEST_SUITE_END()
