// Tracing's plain parts (core/trace.hpp, actors/tracing.hpp, server/otlp_exporter.hpp) and the
// telemetry page (server/telemetry.hpp): traceparent parsing, the bounded span buffer, a job's
// spans from its timestamps, the OTLP/JSON encoding, export to a closed port, and the GPU series
// of the NVML stand-in.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "actors/tracing.hpp"
#include "core/trace.hpp"
#include "server/otlp_exporter.hpp"
#include "server/telemetry.hpp"

BOOST_AUTO_TEST_SUITE(test_metrics_tracing)

namespace {

const std::string kTrace = "4bf92f3577b34da6a3ce929d0e0e4736";
const std::string kParent = "00f067aa0ba902b7";
const std::string kTp = "00-" + kTrace + "-" + kParent + "-01";

// A loopback TCP port with nobody listening: bound, then closed.
std::string closed_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return std::to_string(ntohs(a.sin_port));
}

}  // namespace

BOOST_AUTO_TEST_CASE(traceparent_valid_and_invalid) {
  sy::TraceContext c;
  BOOST_TEST(!sy::parse_traceparent(kTp, c).has_value());
  BOOST_TEST(sy::to_hex(c.trace_id) == kTrace);
  BOOST_TEST(sy::to_hex(c.parent_span) == kParent);
  BOOST_TEST(int(c.flags) == 1);
  // A later version is read by its first four fields, extra fields after a dash allowed.
  BOOST_TEST(!sy::parse_traceparent("01-" + kTrace + "-" + kParent + "-00-extra", c).has_value());
  const std::map<std::string, std::string> bad = {
      {"", "too short"},
      {"00-" + kTrace + "-" + kParent + "-0", "too short"},
      {"00-" + kTrace + "-" + kParent + "-01x", "more than"},
      {"00-" + std::string(32, '0') + "-" + kParent + "-01", "all-zero trace id"},
      {"00-" + kTrace + "-" + std::string(16, '0') + "-01", "all-zero parent id"},
      {"00-4BF92F3577B34DA6A3CE929D0E0E4736-" + kParent + "-01", "trace id"},
      {"ff-" + kTrace + "-" + kParent + "-01", "version ff"},
      {"00_" + kTrace + "-" + kParent + "-01", "is not"},
      {"00-" + kTrace + "-" + kParent + "-0g", "flags"},
  };
  for (const auto& [text, why] : bad) {
    auto e = sy::parse_traceparent(text, c);
    BOOST_TEST_REQUIRE(e.has_value(), text);
    BOOST_TEST(e->find(why) != std::string::npos, text + ": " + *e);
  }
}

BOOST_AUTO_TEST_CASE(buffer_is_bounded_and_counts_drops) {
  sy::TraceBuffer b(2);
  for (int i = 0; i < 3; ++i) {
    sy::Span s;
    s.name = "s" + std::to_string(i);
    BOOST_TEST(b.add(s) == (i < 2));
  }
  BOOST_TEST(b.dropped() == 1u);
  auto one = b.take(1);
  BOOST_TEST_REQUIRE(one.size() == 1u);
  BOOST_TEST(one[0].name == "s0");
  auto rest = b.take(10);
  BOOST_TEST_REQUIRE(rest.size() == 1u);
  BOOST_TEST(rest[0].name == "s1");
  BOOST_TEST(b.waiting() == 0u);
}

BOOST_AUTO_TEST_CASE(a_jobs_spans_nest_under_its_job_span) {
  sy::TraceBuffer b(100);
  sy::SubmitRequest req;
  BOOST_TEST_REQUIRE(!sy::parse_traceparent(kTp, req.trace).has_value());
  sy::Job job;
  job.id = "j1";
  job.prompt = {1, 2, 3, 4};
  job.max_tokens = 9;
  job.arrival_us = 1000;
  sy::trace_admit(&b, req, job, 1100);
  BOOST_TEST_REQUIRE(job.trace.traced());
  sy::trace_enqueue(&b, job, true, 1300);
  sy::trace_prefill(&b, job.trace, 1400, 1500, 0, 4);
  sy::trace_generated(&b, job.trace, 1400, 1500, 1900, 5);
  sy::DoneEvent d = sy::DoneEvent{};
  d.id = "j1";
  d.trace = job.trace;
  d.prompt_tokens = 4;
  d.completion_tokens = 5;
  d.finish = sy::FinishReason::length;
  sy::trace_delivered(&b, d, 2000);
  auto spans = b.take(100);
  std::map<std::string, sy::Span> by;
  for (auto& s : spans) by[s.name] = s;
  BOOST_TEST(by.size() == 7u);  // admission, journal commit, queue, prefill, decode, delivery, job
  const sy::Span& root = by.at("llm_request");
  BOOST_TEST(sy::to_hex(root.parent_id) == kParent);
  BOOST_TEST(root.start_us == 1000);
  BOOST_TEST(root.end_us == 2000);
  const std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> want = {
      {"admission", {1000, 1100}}, {"journal commit", {1100, 1300}}, {"queue", {1300, 1400}},
      {"prefill", {1400, 1500}},   {"decode", {1500, 1900}},         {"delivery", {1900, 2000}}};
  for (const auto& [name, t] : want) {
    const sy::Span& s = by.at(name);
    BOOST_TEST(s.trace_id == root.trace_id, name);
    BOOST_TEST(s.parent_id == root.span_id, name);
    BOOST_TEST(s.span_id != root.span_id, name);
    BOOST_TEST(s.start_us == t.first, name);
    BOOST_TEST(s.end_us == t.second, name);
  }
  // Untraced: no traceparent and no sampling of all jobs.
  sy::Job plain;
  sy::trace_admit(&b, sy::SubmitRequest{}, plain, 1100);
  BOOST_TEST(!plain.trace.traced());
  // Sampling all: a new trace, the job span a root.
  sy::TraceBuffer all(10, true);
  sy::trace_admit(&all, sy::SubmitRequest{}, plain, 1100);
  BOOST_TEST(plain.trace.traced());
  BOOST_TEST((plain.trace.parent_span == sy::SpanId{}));
}

BOOST_AUTO_TEST_CASE(otlp_json_encoding) {
  sy::Span s;
  sy::TraceContext c;
  BOOST_TEST_REQUIRE(!sy::parse_traceparent(kTp, c).has_value());
  s.trace_id = c.trace_id;
  s.span_id = sy::new_span_id();
  s.name = "llm_request";
  s.start_us = 5;
  s.end_us = 7;
  s.num("gen_ai.usage.prompt_tokens", 12).real("gen_ai.latency.e2e", 0.5);
  s.strs("gen_ai.response.finish_reasons", {"stop"}).str("gen_ai.request.id", "a\"b");
  s.error = true;
  s.status_message = "internal: x";
  auto j = nlohmann::json::parse(sy::otlp_json({s}, "svc", 1000));
  const auto& rs = j.at("resourceSpans").at(0);
  BOOST_TEST(rs.at("resource").at("attributes").at(0).at("key") == "service.name");
  BOOST_TEST(rs.at("resource").at("attributes").at(0).at("value").at("stringValue") == "svc");
  const auto& sp = rs.at("scopeSpans").at(0).at("spans").at(0);
  BOOST_TEST(sp.at("traceId") == kTrace);
  BOOST_TEST(sp.at("spanId").get<std::string>().size() == 16u);
  BOOST_TEST(!sp.contains("parentSpanId"));          // a root
  BOOST_TEST(sp.at("startTimeUnixNano") == "6000");  // 5 µs * 1000 + 1000 ns
  BOOST_TEST(sp.at("endTimeUnixNano") == "8000");
  BOOST_TEST(sp.at("kind") == 2);
  BOOST_TEST(sp.at("status").at("code") == 2);
  const auto& a = sp.at("attributes");
  BOOST_TEST(a.at(0).at("value").at("intValue") == "12");
  BOOST_TEST(a.at(1).at("value").at("doubleValue") == 0.5);
  BOOST_TEST(a.at(2).at("value").at("arrayValue").at("values").at(0).at("stringValue") == "stop");
  BOOST_TEST(a.at(3).at("value").at("stringValue") == "a\"b");
}

BOOST_AUTO_TEST_CASE(otlp_endpoints) {
  std::string why;
  auto e = sy::parse_otlp_endpoint("http://127.0.0.1:4318", why);
  BOOST_TEST_REQUIRE(e.has_value());
  BOOST_TEST(e->host == "127.0.0.1");
  BOOST_TEST(e->port == "4318");
  BOOST_TEST(e->path == "/v1/traces");
  e = sy::parse_otlp_endpoint("http://collector:9000/otlp/v1/traces", why);
  BOOST_TEST_REQUIRE(e.has_value());
  BOOST_TEST(e->path == "/otlp/v1/traces");
  BOOST_TEST(!sy::parse_otlp_endpoint("https://c:4318", why).has_value());
  BOOST_TEST(why.find("http://") != std::string::npos);
  BOOST_TEST(!sy::parse_otlp_endpoint("http://c", why).has_value());
  BOOST_TEST(!sy::parse_otlp_endpoint("http://c:x1", why).has_value());
  sy::TracingConfig tc;
  tc.otlp_endpoint = "grpc://c:4317";
  BOOST_CHECK_THROW(sy::OtlpExporter(tc, std::make_shared<sy::TraceBuffer>(4)),
                    std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(export_to_a_closed_port_drops_and_counts) {
  auto buf = std::make_shared<sy::TraceBuffer>(100);
  sy::TracingConfig tc;
  tc.otlp_endpoint = "http://127.0.0.1:" + closed_port();
  tc.export_interval_ms = 10;
  tc.export_timeout_ms = 1000;
  sy::OtlpExporter ex(tc, buf);
  for (int i = 0; i < 5; ++i) buf->add(sy::Span{});
  ex.start();
  // Waits for the exporter's thread (bounded by the ctest timeout, no figure asserted).
  while (buf->dropped() < 5) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ex.stop();
  BOOST_TEST(buf->dropped() == 5u);
  BOOST_TEST(buf->exported() == 0u);
}

BOOST_AUTO_TEST_CASE(telemetry_page_with_the_stand_in) {
  auto buf = std::make_shared<sy::TraceBuffer>(4);
  buf->count_dropped(3);
  sy::Telemetry t(true, true, buf);
  const std::string page = t.text();
  for (const char* want :
       {"# TYPE switchyard_gpu_utilization_ratio gauge", "# TYPE switchyard_gpu_power_watts gauge",
        "# TYPE switchyard_gpu_energy_joules_total counter",
        "switchyard_gpu_power_watts{gpu=\"0\",uuid=\"GPU-00000000-0000-0000-0000-000000000000\"} "
        "300",
        "switchyard_gpu_memory_capacity_bytes{gpu=\"0\",uuid=",
        "switchyard_trace_spans_dropped_total 3",
        "# TYPE switchyard_process_cpu_seconds_total counter"})
    BOOST_TEST(page.find(want) != std::string::npos, want);
  // Without tracing and without a GPU: neither family (NVML is absent on machines without a
  // driver; where it is present this only checks the trace series).
  sy::Telemetry none(false, false, nullptr);
  const std::string p2 = none.text();
  BOOST_TEST(p2.find("switchyard_gpu_") == std::string::npos);
  BOOST_TEST(p2.find("switchyard_trace_") == std::string::npos);
  BOOST_TEST(p2.find("switchyard_process_cpu_seconds_total ") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
