// The Prometheus text format as /metrics writes it (prometheus-cpp's registry and TextSerializer):
// label escaping, number formatting, family headers and histograms (cumulative buckets with
// inclusive bounds, +Inf equal to _count, _sum), so that a library upgrade that changed any of it
// fails here rather than in a scraper.
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "actors/metrics.hpp"

BOOST_AUTO_TEST_SUITE(test_metrics_text)

namespace pm = prometheus;

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

bool has_line(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

// One gauge sample with value `v`, as written.
std::string gauge_line(double v) {
  pm::Registry r;
  pm::BuildGauge().Name("g").Help("G.").Register(r).Add({}).Set(v);
  return lines_of(pm::TextSerializer().Serialize(r.Collect())).at(2);
}

}  // namespace

BOOST_AUTO_TEST_CASE(label_values_are_escaped) {
  pm::Registry r;
  auto& f = pm::BuildCounter().Name("x_total").Help("Things.").Register(r);
  f.Add({{"tenant", "plain"}}).Increment(1);
  f.Add({{"tenant", "a\"b"}}).Increment(2);
  f.Add({{"tenant", "a\\b"}}).Increment(3);
  f.Add({{"tenant", "a\nb"}}).Increment(4);
  f.Add({{"tenant", "t\xc3\xa9nant"}}).Increment(5);  // UTF-8 passes through untouched
  const std::string t = pm::TextSerializer().Serialize(r.Collect());
  BOOST_TEST_MESSAGE(t);
  BOOST_TEST(has_line(t, "# HELP x_total Things."));
  BOOST_TEST(has_line(t, "# TYPE x_total counter"));
  BOOST_TEST(has_line(t, "x_total{tenant=\"plain\"} 1"));
  BOOST_TEST(has_line(t, "x_total{tenant=\"a\\\"b\"} 2"));
  BOOST_TEST(has_line(t, "x_total{tenant=\"a\\\\b\"} 3"));
  BOOST_TEST(has_line(t, "x_total{tenant=\"a\\nb\"} 4"));
  BOOST_TEST(has_line(t, "x_total{tenant=\"t\xc3\xa9nant\"} 5"));
  BOOST_TEST(t.back() == '\n');
}

BOOST_AUTO_TEST_CASE(values_are_formatted) {
  BOOST_TEST(gauge_line(0) == "g 0");
  BOOST_TEST(gauge_line(42) == "g 42");
  BOOST_TEST(gauge_line(-3) == "g -3");
  BOOST_TEST(gauge_line(0.25) == "g 0.25");
  BOOST_TEST(gauge_line(0.001) == "g 0.001");
  BOOST_TEST(gauge_line(1e20) == "g 1e+20");
  BOOST_TEST(gauge_line(std::numeric_limits<double>::infinity()) == "g +Inf");
  BOOST_TEST(gauge_line(-std::numeric_limits<double>::infinity()) == "g -Inf");
  // Counts of the size the metrics reach are written as integers, exactly.
  BOOST_TEST(gauge_line(9007199254740992.0) == "g 9007199254740992");
  // A value reads back to the same double (to the last digit the format keeps).
  const double third = 1.0 / 3.0;
  BOOST_TEST(std::stod(gauge_line(third).substr(2)) == third, boost::test_tools::tolerance(1e-15));
}

BOOST_AUTO_TEST_CASE(histogram_buckets_are_cumulative) {
  pm::Registry r;
  auto& h = pm::BuildHistogram()
                .Name("lat_seconds")
                .Help("Latency.")
                .Register(r)
                .Add({{"class", "interactive"}}, pm::Histogram::BucketBoundaries{0.1, 0.5, 1.0});
  for (double v : {0.05, 0.1, 0.3, 0.7, 0.9, 2.0, 5.0}) h.Observe(v);
  const std::string t = pm::TextSerializer().Serialize(r.Collect());
  BOOST_TEST_MESSAGE(t);
  BOOST_TEST(has_line(t, "# TYPE lat_seconds histogram"));
  // le 0.1 holds 0.05 and 0.1 (the bound is inclusive).
  BOOST_TEST(has_line(t, "lat_seconds_bucket{class=\"interactive\",le=\"0.1\"} 2"));
  BOOST_TEST(has_line(t, "lat_seconds_bucket{class=\"interactive\",le=\"0.5\"} 3"));
  BOOST_TEST(has_line(t, "lat_seconds_bucket{class=\"interactive\",le=\"1\"} 5"));
  BOOST_TEST(has_line(t, "lat_seconds_bucket{class=\"interactive\",le=\"+Inf\"} 7"));
  // The sum is the float sum of the observations (9.050000000000001 here).
  BOOST_TEST(t.find("\nlat_seconds_sum{class=\"interactive\"} 9.05") != std::string::npos);
  BOOST_TEST(has_line(t, "lat_seconds_count{class=\"interactive\"} 7"));
}

BOOST_AUTO_TEST_CASE(empty_histogram) {
  pm::Registry r;
  pm::BuildHistogram().Name("h").Help("H.").Register(r).Add({},
                                                            pm::Histogram::BucketBoundaries{1, 2});
  const std::string t = pm::TextSerializer().Serialize(r.Collect());
  BOOST_TEST(has_line(t, "h_bucket{le=\"1\"} 0"));
  BOOST_TEST(has_line(t, "h_bucket{le=\"2\"} 0"));
  BOOST_TEST(has_line(t, "h_bucket{le=\"+Inf\"} 0"));
  BOOST_TEST(has_line(t, "h_sum 0"));
  BOOST_TEST(has_line(t, "h_count 0"));
}

BOOST_AUTO_TEST_CASE(content_type_is_the_text_format) {
  BOOST_TEST(std::string(sy::prom::kContentType).rfind("text/plain; version=0.0.4", 0) == 0u);
}

BOOST_AUTO_TEST_SUITE_END()  // test_metrics_text
