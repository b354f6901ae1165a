// Distributed tracing's plain parts: a job's trace context (from a W3C `traceparent`), the spans
// the actors record from a job's timestamps, and the bounded buffer they append them to, which
// the OTLP exporter (server/otlp_exporter.hpp) drains on its own thread. No I/O here.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sy {

using TraceId = std::array<uint8_t, 16>;
using SpanId = std::array<uint8_t, 8>;

/// A job's place in a distributed trace (docs/tracing.md). Empty (`traced()` false) for a job
/// that produces no spans.
struct TraceContext {
  TraceId trace_id{};       // the traceparent's trace id (or a new one under sampling `all`)
  SpanId parent_span{};     // the caller's span (all zero: the job's span is a root)
  SpanId job_span{};        // the job's own span, parent of every other span of the job
  uint8_t flags = 0;        // the traceparent's trace flags, passed on unchanged
  int64_t arrival_us = 0;   // the job's arrival (steady µs): the job span starts here
  int64_t admitted_us = 0;  // admission's decision (steady µs): ends the `admission` span
  int64_t queued_us = 0;    // handed to the router: the `queue` span starts here
  int64_t ended_us = 0;     // the batcher ended the job: the `delivery` span starts here
  // The request's parameters, for the job span's gen_ai.request.* attributes.
  uint32_t max_tokens = 0;
  float temperature = 0, top_p = 0;
  bool traced() const { return job_span != SpanId{}; }
  bool operator==(const TraceContext&) const = default;
};

/// Parses a W3C `traceparent` ("00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>", lower
/// case; an all-zero id is invalid) into `out`'s trace_id, parent_span and flags. Returns the
/// problem in words, or nullopt when it is valid. A version other than 00 is read as 00 when it
/// has at least those fields (the W3C rule for future versions); ff is invalid.
std::optional<std::string> parse_traceparent(std::string_view text, TraceContext& out);

/// The ids in lower-case hex, as OTLP/JSON and traceparent write them.
std::string to_hex(const uint8_t* p, std::size_t n);
inline std::string to_hex(const TraceId& id) {
  return to_hex(id.data(), id.size());
}
inline std::string to_hex(const SpanId& id) {
  return to_hex(id.data(), id.size());
}

/// A fresh random id that is not all zero (std::random_device seeded per thread).
SpanId new_span_id();
TraceId new_trace_id();

/// One attribute: a string, integer, float or string-array value (`kind` says which).
struct SpanAttr {
  enum Kind : uint8_t { str, i64, f64, strs };
  std::string key;
  Kind kind = str;
  std::string s;
  int64_t i = 0;
  double d = 0;
  std::vector<std::string> list;
};

/// One finished span. Times are steady-clock µs (the actors' clock); the exporter turns them
/// into Unix nanoseconds.
struct Span {
  TraceId trace_id{};
  SpanId span_id{}, parent_id{};  // parent all zero: a root span
  std::string name;
  int64_t start_us = 0, end_us = 0;
  bool error = false;  // status code ERROR (the job failed)
  std::string status_message;
  std::vector<SpanAttr> attrs;

  Span& str(std::string k, std::string v) {
    attrs.push_back(SpanAttr{std::move(k), SpanAttr::str, std::move(v), 0, 0, {}});
    return *this;
  }
  Span& num(std::string k, int64_t v) {
    attrs.push_back(SpanAttr{std::move(k), SpanAttr::i64, {}, v, 0, {}});
    return *this;
  }
  Span& real(std::string k, double v) {
    attrs.push_back(SpanAttr{std::move(k), SpanAttr::f64, {}, 0, v, {}});
    return *this;
  }
  Span& strs(std::string k, std::vector<std::string> v) {
    attrs.push_back(SpanAttr{std::move(k), SpanAttr::strs, {}, 0, 0, std::move(v)});
    return *this;
  }
};

/// A child span of `ctx`'s job span named `name` over [start_us, end_us], with a fresh id.
Span child_span(const TraceContext& ctx, std::string name, int64_t start_us, int64_t end_us);

/// The spans waiting for export: actors append (a short lock, no allocation beyond the span's
/// own), the exporter thread takes them in batches. Bounded: a span that finds it full is
/// dropped and counted, so a slow or absent collector never holds a step back.
class TraceBuffer {
 public:
  explicit TraceBuffer(std::size_t capacity, bool sample_all = false)
      : capacity_(capacity), sample_all_(sample_all) {}
  /// Appends `s`; false (and counted as dropped) when `capacity` spans already wait.
  bool add(Span s);
  /// Takes up to `max` waiting spans, oldest first.
  std::vector<Span> take(std::size_t max);
  std::size_t waiting() const;
  /// Spans the collector accepted / spans lost (buffer full, or their batch's export failed).
  void count_exported(uint64_t n);
  void count_dropped(uint64_t n);
  uint64_t exported() const;
  uint64_t dropped() const;
  /// `tracing.sample: all`: jobs without a traceparent are traced too (a new trace each).
  bool sample_all() const { return sample_all_; }

 private:
  mutable std::mutex mu_;
  std::vector<Span> spans_;
  std::size_t capacity_;
  bool sample_all_;
  uint64_t exported_ = 0, dropped_ = 0;
};

}  // namespace sy
