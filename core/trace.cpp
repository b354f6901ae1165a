// Trace contexts from W3C traceparent strings, span ids, and the bounded span buffer
// (core/trace.hpp).
#include "core/trace.hpp"

#include <algorithm>
#include <random>

namespace sy {

namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // upper case is invalid in a traceparent
}

// Reads 2*N lower-case hex digits into `out`; false on any other character.
template <std::size_t N>
bool read_hex(std::string_view s, std::array<uint8_t, N>& out) {
  if (s.size() != 2 * N) return false;
  for (std::size_t i = 0; i < N; ++i) {
    const int hi = hex_value(s[2 * i]), lo = hex_value(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
}

std::mt19937_64& rng() {
  thread_local std::mt19937_64 g{(uint64_t{std::random_device{}()} << 32) ^ std::random_device{}()};
  return g;
}

template <std::size_t N>
std::array<uint8_t, N> random_id() {
  std::array<uint8_t, N> id{};
  while (id == std::array<uint8_t, N>{}) {
    for (std::size_t i = 0; i < N; i += 8) {
      const uint64_t v = rng()();
      for (std::size_t k = 0; k < 8 && i + k < N; ++k)
        id[i + k] = static_cast<uint8_t>(v >> (8 * k));
    }
  }
  return id;
}

}  // namespace

std::optional<std::string> parse_traceparent(std::string_view t, TraceContext& out) {
  const std::string want =
      "a W3C traceparent \"00-<32 hex digits trace id>-<16 hex digits parent id>-<2 hex digits "
      "flags>\" (lower case)";
  // version "-" trace-id "-" parent-id "-" flags: 2+1+32+1+16+1+2 = 55 characters.
  if (t.size() < 55) return "is too short for " + want;
  std::array<uint8_t, 1> version{}, flags{};
  if (!read_hex(t.substr(0, 2), version) || t[2] != '-' || t[35] != '-' || t[52] != '-')
    return "is not " + want;
  if (version[0] == 0xff) return "has version ff, which is invalid";
  if (version[0] == 0 && t.size() != 55) return "has more than " + want;
  if (version[0] != 0 && t.size() > 55 && t[55] != '-') return "is not " + want;
  TraceContext c;
  if (!read_hex(t.substr(3, 32), c.trace_id)) return "has a trace id that is not 32 hex digits";
  if (!read_hex(t.substr(36, 16), c.parent_span))
    return "has a parent id that is not 16 hex digits";
  if (!read_hex(t.substr(53, 2), flags)) return "has flags that are not 2 hex digits";
  if (c.trace_id == TraceId{}) return "has an all-zero trace id, which is invalid";
  if (c.parent_span == SpanId{}) return "has an all-zero parent id, which is invalid";
  out.trace_id = c.trace_id;
  out.parent_span = c.parent_span;
  out.flags = flags[0];
  return std::nullopt;
}

std::string to_hex(const uint8_t* p, std::size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (std::size_t i = 0; i < n; ++i) {
    s[2 * i] = kDigits[p[i] >> 4];
    s[2 * i + 1] = kDigits[p[i] & 15];
  }
  return s;
}

SpanId new_span_id() {
  return random_id<8>();
}
TraceId new_trace_id() {
  return random_id<16>();
}

Span child_span(const TraceContext& ctx, std::string name, int64_t start_us, int64_t end_us) {
  Span s;
  s.trace_id = ctx.trace_id;
  s.span_id = new_span_id();
  s.parent_id = ctx.job_span;
  s.name = std::move(name);
  s.start_us = start_us;
  s.end_us = std::max(start_us, end_us);
  return s;
}

bool TraceBuffer::add(Span s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (spans_.size() >= capacity_) {
    ++dropped_;
    return false;
  }
  spans_.push_back(std::move(s));
  return true;
}

std::vector<Span> TraceBuffer::take(std::size_t max) {
  std::vector<Span> out;
  std::lock_guard<std::mutex> lock(mu_);
  if (spans_.size() <= max) {
    out.swap(spans_);
  } else {
    out.assign(std::make_move_iterator(spans_.begin()),
               std::make_move_iterator(spans_.begin() + static_cast<std::ptrdiff_t>(max)));
    spans_.erase(spans_.begin(), spans_.begin() + static_cast<std::ptrdiff_t>(max));
  }
  return out;
}

std::size_t TraceBuffer::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spans_.size();
}
void TraceBuffer::count_exported(uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  exported_ += n;
}
void TraceBuffer::count_dropped(uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  dropped_ += n;
}
uint64_t TraceBuffer::exported() const {
  std::lock_guard<std::mutex> lock(mu_);
  return exported_;
}
uint64_t TraceBuffer::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

}  // namespace sy
