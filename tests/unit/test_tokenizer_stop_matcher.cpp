// StopMatcher, find_stop and held_back: where a completion is cut, what is held back from
// streaming, and UTF-8 characters split across tokens.
#include <boost/test/unit_test.hpp>
#include <string>
#include <vector>

#include "model/stop_matcher.hpp"

BOOST_AUTO_TEST_SUITE(test_tokenizer_stop_matcher)

using sy::find_stop;
using sy::held_back;
using sy::StopMatcher;

BOOST_AUTO_TEST_CASE(find_stop_table) {
  struct Row {
    std::string text;
    size_t from;
    std::vector<std::string> stops;
    size_t want;
  };
  const size_t npos = std::string::npos;
  const std::vector<Row> rows = {
      {"hello world", 0, {"world"}, 6},
      {"hello world", 10, {"world"}, 6},     // the match ends after byte 10
      {"hello world", 11, {"world"}, npos},  // ... but not after byte 11: searched before
      {"abcabc", 0, {"bc", "ca"}, 1},        // the earliest start wins
      {"abcabc", 3, {"bc", "ca"}, 2},        // "ca" at 2 ends at 4 > 3
      {"abc", 0, {""}, npos},                // empty stop strings are ignored
      {"abc", 0, {}, npos},
      {"xx</s>", 5, {"</s>"}, 2},
  };
  for (const Row& r : rows)
    BOOST_TEST(find_stop(r.text, r.from, r.stops) == r.want, r.text << " from " << r.from);
}

BOOST_AUTO_TEST_CASE(held_back_table) {
  struct Row {
    std::string text;
    std::vector<std::string> stops;
    size_t want;
  };
  const std::vector<Row> rows = {
      {"hello wor", {"world"}, 3},  // "wor" may become "world"
      {"hello w", {"world"}, 1},
      {"hello", {"world"}, 0},
      {"hello world", {"world"}, 0},  // a whole match is not a proper prefix
      {"ab", {"b"}, 0},               // one-byte stops never hold anything back
      {"xab", {"abc", "bq"}, 2},      // the longest suffix counts
      {"x</", {"</s>", "<|end|>"}, 2},
  };
  for (const Row& r : rows) {
    size_t max_stop = 0;
    for (const auto& s : r.stops) max_stop = std::max(max_stop, s.size());
    BOOST_TEST(held_back(r.text, r.stops, max_stop) == r.want, r.text);
  }
}

BOOST_AUTO_TEST_CASE(stop_across_tokens_is_cut_at_its_start) {
  StopMatcher m({"END"});
  BOOST_TEST(!m.push("The E", false, 0));
  BOOST_TEST(m.text() == "The E");
  BOOST_TEST(m.stable() == 4u);  // "E" waits
  BOOST_TEST(!m.push("N", false, 4));
  BOOST_TEST(m.stable() == 4u);
  BOOST_TEST(m.push("D!", false, 4));
  BOOST_TEST(m.text() == "The ");
}

BOOST_AUTO_TEST_CASE(a_false_start_is_released) {
  StopMatcher m({"END"});
  BOOST_TEST(!m.push("EN", false, 0));
  BOOST_TEST(m.stable() == 0u);
  BOOST_TEST(!m.push("X", false, 0));
  BOOST_TEST(m.stable() == 3u);
  BOOST_TEST(m.text() == "ENX");
}

BOOST_AUTO_TEST_CASE(split_character_waits_for_its_last_byte) {
  StopMatcher m;
  const std::string euro = "\xE2\x82\xAC";  // U+20AC, three bytes
  BOOST_TEST(!m.push(euro.substr(0, 2), false, 0));
  BOOST_TEST(m.text().empty());
  BOOST_TEST(!m.push(euro.substr(2), false, 0));
  BOOST_TEST(m.text() == euro);
  // The last token flushes an incomplete character as it is.
  BOOST_TEST(!m.push("\xE2", true, 3));
  BOOST_TEST(m.text() == euro + "\xE2");
}

BOOST_AUTO_TEST_CASE(end_flushes_and_matches_what_the_flush_completes) {
  StopMatcher m({"\xE2\x82"});
  BOOST_TEST(!m.push("a\xE2\x82", false, 0));  // the character is incomplete: nothing to match
  BOOST_TEST(m.text() == "a");
  BOOST_TEST(m.end(1));
  BOOST_TEST(m.text() == "a");
  StopMatcher n({"zz"});
  BOOST_TEST(!n.push("ab", false, 0));
  BOOST_TEST(!n.end(2));
  BOOST_TEST(n.text() == "ab");
}

BOOST_AUTO_TEST_CASE(cut_never_drops_streamed_bytes) {
  // A caller that streamed more than stable() allowed keeps those bytes.
  StopMatcher m({"bc"});
  BOOST_TEST(!m.push("ab", false, 0));
  BOOST_TEST(m.push("c", false, 2));
  BOOST_TEST(m.text() == "ab");
}

BOOST_AUTO_TEST_SUITE_END()  // test_tokenizer_stop_matcher
