// The Prometheus text format writer: escaping, number formatting, family headers and histograms
// (cumulative buckets, +Inf equal to _count, _sum).
#define BOOST_TEST_MODULE metrics_text
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "actors/metrics.hpp"

using namespace sy::prom;

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(label_values_are_escaped) {
  BOOST_TEST(escape_label("plain") == "plain");
  BOOST_TEST(escape_label("a\"b") == "a\\\"b");
  BOOST_TEST(escape_label("a\\b") == "a\\\\b");
  BOOST_TEST(escape_label("a\nb") == "a\\nb");
  BOOST_TEST(escape_label("\\\"\n") == "\\\\\\\"\\n");
  // UTF-8 passes through untouched.
  BOOST_TEST(escape_label("t\xc3\xa9nant") == "t\xc3\xa9nant");
  // In HELP only backslash and newline are special.
  BOOST_TEST(escape_help("say \"hi\"\\\n") == "say \"hi\"\\\\\\n");
}

BOOST_AUTO_TEST_CASE(values_are_formatted) {
  BOOST_TEST(format_value(0) == "0");
  BOOST_TEST(format_value(42) == "42");
  BOOST_TEST(format_value(-3) == "-3");
  BOOST_TEST(format_value(0.25) == "0.25");
  BOOST_TEST(format_value(0.001) == "0.001");
  BOOST_TEST(format_value(1e20) == "1e+20");
  BOOST_TEST(format_value(std::numeric_limits<double>::infinity()) == "+Inf");
  BOOST_TEST(format_value(-std::numeric_limits<double>::infinity()) == "-Inf");
  BOOST_TEST(format_value(std::nan("")) == "NaN");
  // Shortest form that reads back to the same double.
  double third = 1.0 / 3.0;
  BOOST_TEST(std::stod(format_value(third)) == third);
}

BOOST_AUTO_TEST_CASE(samples_with_and_without_labels) {
  TextWriter w;
  w.family("x_total", "counter", "Things.\nMore");
  w.sample("x_total", {}, 7);
  w.sample("x_total", Labels{{"tenant", "a\"b"}, {"class", "batch"}}, 2);
  auto l = lines_of(w.str());
  BOOST_REQUIRE(l.size() == 4u);
  BOOST_TEST(l[0] == "# HELP x_total Things.\\nMore");
  BOOST_TEST(l[1] == "# TYPE x_total counter");
  BOOST_TEST(l[2] == "x_total 7");
  BOOST_TEST(l[3] == "x_total{tenant=\"a\\\"b\",class=\"batch\"} 2");
  BOOST_TEST(w.str().back() == '\n');
}

BOOST_AUTO_TEST_CASE(histogram_buckets_are_cumulative) {
  Histogram h({0.1, 0.5, 1.0});
  for (double v : {0.05, 0.1, 0.3, 0.7, 0.9, 2.0, 5.0}) h.observe(v);
  h.observe(std::nan(""));  // ignored
  BOOST_TEST(h.count() == 7u);
  BOOST_TEST(h.sum() == 0.05 + 0.1 + 0.3 + 0.7 + 0.9 + 2.0 + 5.0,
             boost::test_tools::tolerance(1e-12));
  // Per bucket: le 0.1 holds 0.05 and 0.1 (the bound is inclusive).
  BOOST_TEST(h.counts() == (std::vector<uint64_t>{2, 1, 2, 2}), boost::test_tools::per_element());

  TextWriter w;
  w.family("lat_seconds", "histogram", "Latency.");
  w.histogram("lat_seconds", Labels{{"class", "interactive"}}, h);
  auto l = lines_of(w.str());
  BOOST_REQUIRE(l.size() == 2u + 4u + 2u);
  BOOST_TEST(l[2] == "lat_seconds_bucket{class=\"interactive\",le=\"0.1\"} 2");
  BOOST_TEST(l[3] == "lat_seconds_bucket{class=\"interactive\",le=\"0.5\"} 3");
  BOOST_TEST(l[4] == "lat_seconds_bucket{class=\"interactive\",le=\"1\"} 5");
  BOOST_TEST(l[5] == "lat_seconds_bucket{class=\"interactive\",le=\"+Inf\"} 7");
  BOOST_TEST(l[6].rfind("lat_seconds_sum{class=\"interactive\"} 9.05", 0) == 0u);
  BOOST_TEST(l[7] == "lat_seconds_count{class=\"interactive\"} 7");
}

BOOST_AUTO_TEST_CASE(empty_histogram_and_bad_bounds) {
  Histogram h({1, 2});
  TextWriter w;
  w.histogram("h", {}, h);
  auto l = lines_of(w.str());
  BOOST_REQUIRE(l.size() == 5u);
  BOOST_TEST(l[0] == "h_bucket{le=\"1\"} 0");
  BOOST_TEST(l[2] == "h_bucket{le=\"+Inf\"} 0");
  BOOST_TEST(l[3] == "h_sum 0");
  BOOST_TEST(l[4] == "h_count 0");
  BOOST_CHECK_THROW(Histogram({1, 1}), std::invalid_argument);
  BOOST_CHECK_THROW(Histogram({2, 1}), std::invalid_argument);
  BOOST_CHECK_THROW(Histogram({1, std::numeric_limits<double>::infinity()}), std::invalid_argument);
}
