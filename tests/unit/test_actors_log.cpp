// The log module (actors/log.hpp): the level filter, the text line shape that operators and tests
// grep for, and the JSON-lines format (valid JSON with ts, level, msg).
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "actors/log.hpp"
#include "actors/messages.hpp"

BOOST_AUTO_TEST_SUITE(test_actors_log)

namespace {

namespace sylog = sy::log;

// Points the log at a temporary file for one test and reads back what was written; restores the
// defaults (stderr, info, text) afterwards so that tests do not leak settings into each other.
struct Capture {
  std::FILE* f = std::tmpfile();
  Capture() {
    BOOST_REQUIRE(f);
    sylog::set_output(f);
  }
  ~Capture() {
    sylog::set_output(stderr);
    sylog::set_level(sylog::Level::info);
    sylog::set_format(sylog::Format::text);
    std::fclose(f);
  }
  std::string text() {
    std::fflush(f);
    std::rewind(f);
    std::string out;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    return out;
  }
  std::vector<std::string> lines() {
    std::vector<std::string> out;
    std::istringstream in(text());
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(text_lines_keep_their_shape) {
  Capture c;
  sylog::info("listening elsewhere");
  sylog::warn("warning: the open file limit is low");
  sy::log_line("from an actor");  // the older entry point is info as well
  BOOST_TEST(c.text() ==
             "switchyard: listening elsewhere\n"
             "switchyard: warning: the open file limit is low\n"
             "switchyard: from an actor\n");
}

BOOST_AUTO_TEST_CASE(levels_filter) {
  Capture c;
  sylog::set_level(sylog::Level::warn);
  BOOST_TEST(!sylog::enabled(sylog::Level::info));
  BOOST_TEST(sylog::enabled(sylog::Level::error));
  sylog::trace("t");
  sylog::debug("d");
  sylog::info("i");
  sylog::warn("w");
  sylog::error("e");
  BOOST_TEST(c.text() == "switchyard: w\nswitchyard: e\n");

  sylog::set_level(sylog::Level::trace);
  sylog::trace("t2");
  sylog::set_level(sylog::Level::off);
  sylog::error("never");
  BOOST_TEST(!sylog::enabled(sylog::Level::error));
  BOOST_TEST(c.text() == "switchyard: w\nswitchyard: e\nswitchyard: t2\n");
}

BOOST_AUTO_TEST_CASE(json_lines_parse_with_ts_level_msg) {
  Capture c;
  sylog::set_format(sylog::Format::json);
  sylog::set_level(sylog::Level::debug);
  const std::string tricky = "quote \" backslash \\ newline \n tab \t bad byte \xff end";
  sylog::debug("first");
  sylog::warn(tricky);
  const auto lines = c.lines();
  BOOST_REQUIRE(lines.size() == 2u);  // the newline inside the message is escaped: one line each
  const auto a = nlohmann::json::parse(lines[0]);
  const auto b = nlohmann::json::parse(lines[1]);
  BOOST_TEST(a.size() == 3u);
  BOOST_TEST(a.at("level").get<std::string>() == "debug");
  BOOST_TEST(a.at("msg").get<std::string>() == "first");
  BOOST_TEST(b.at("level").get<std::string>() == "warn");
  // Everything but the invalid byte comes back as written; that byte is U+FFFD.
  BOOST_TEST(b.at("msg").get<std::string>() ==
             "quote \" backslash \\ newline \n tab \t bad byte \xef\xbf\xbd end");
  // ts: 2026-01-02T03:04:05.678Z (UTC, milliseconds).
  const std::string ts = a.at("ts").get<std::string>();
  BOOST_TEST(ts.size() == 24u, ts);
  BOOST_TEST(ts[4] == '-');
  BOOST_TEST(ts[10] == 'T');
  BOOST_TEST(ts[19] == '.');
  BOOST_TEST(ts.back() == 'Z');
}

BOOST_AUTO_TEST_CASE(format_line_is_what_is_written) {
  // 2021-01-01T00:00:00.250Z
  const auto at = std::chrono::system_clock::time_point(std::chrono::milliseconds(1609459200250));
  BOOST_TEST(sylog::format_line(sylog::Format::text, sylog::Level::warn, "x y", at) ==
             "switchyard: x y\n");
  BOOST_TEST(sylog::format_line(sylog::Format::json, sylog::Level::error, "x y", at) ==
             "{\"ts\":\"2021-01-01T00:00:00.250Z\",\"level\":\"error\",\"msg\":\"x y\"}\n");
}

BOOST_AUTO_TEST_CASE(names_parse) {
  BOOST_TEST((sylog::parse_level("trace") == sylog::Level::trace));
  BOOST_TEST((sylog::parse_level("warn") == sylog::Level::warn));
  BOOST_TEST((sylog::parse_level("off") == sylog::Level::off));
  BOOST_TEST(!sylog::parse_level("warning"));
  BOOST_TEST(!sylog::parse_level("INFO"));
  BOOST_TEST((sylog::parse_format("json") == sylog::Format::json));
  BOOST_TEST(!sylog::parse_format("yaml"));
}

BOOST_AUTO_TEST_SUITE_END()  // test_actors_log
