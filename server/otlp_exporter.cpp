// OTLP/HTTP JSON export of the spans of traced jobs (server/otlp_exporter.hpp).
#include "server/otlp_exporter.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "actors/log.hpp"
#include "core/wire.hpp"

namespace sy {

namespace {

using json = nlohmann::json;

json attr_value(const SpanAttr& a) {
  switch (a.kind) {
    case SpanAttr::str:
      return {{"stringValue", a.s}};
    case SpanAttr::i64:
      return {{"intValue", std::to_string(a.i)}};  // int64 is a string in OTLP/JSON
    case SpanAttr::f64:
      return {{"doubleValue", a.d}};
    case SpanAttr::strs: {
      json values = json::array();
      for (const std::string& v : a.list) values.push_back({{"stringValue", v}});
      return {{"arrayValue", {{"values", values}}}};
    }
  }
  return {{"stringValue", ""}};
}

std::string unix_nanos(int64_t steady_us, int64_t offset_ns) {
  return std::to_string(steady_us * 1000 + offset_ns);
}

// Closes a socket however the POST ends.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::optional<OtlpEndpoint> parse_otlp_endpoint(const std::string& url, std::string& why) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) {
    why =
        "must start with http:// (OTLP/HTTP without TLS; put a collector on this host or "
        "network in front of a TLS one)";
    return std::nullopt;
  }
  std::string rest = url.substr(scheme.size());
  OtlpEndpoint ep;
  const auto slash = rest.find('/');
  ep.path = slash == std::string::npos ? "/v1/traces" : rest.substr(slash);
  if (ep.path == "/") ep.path = "/v1/traces";
  rest = rest.substr(0, slash);
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size()) {
    why = "must be http://HOST:PORT (the OTLP/HTTP port is usually 4318)";
    return std::nullopt;
  }
  ep.host = rest.substr(0, colon);
  ep.port = rest.substr(colon + 1);
  if (ep.host.size() > 2 && ep.host.front() == '[' && ep.host.back() == ']')
    ep.host = ep.host.substr(1, ep.host.size() - 2);
  for (char c : ep.port)
    if (c < '0' || c > '9') {
      why = "has a port that is not a number";
      return std::nullopt;
    }
  return ep;
}

int64_t steady_to_unix_offset_ns() {
  using namespace std::chrono;
  const int64_t sys = duration_cast<nanoseconds>(system_clock::now().time_since_epoch()).count();
  const int64_t mono = duration_cast<nanoseconds>(steady_clock::now().time_since_epoch()).count();
  return sys - mono;
}

std::string otlp_json(const std::vector<Span>& spans, const std::string& service_name,
                      int64_t unix_offset_ns) {
  json out = json::array();
  for (const Span& s : spans) {
    json j;
    j["traceId"] = to_hex(s.trace_id);
    j["spanId"] = to_hex(s.span_id);
    if (s.parent_id != SpanId{}) j["parentSpanId"] = to_hex(s.parent_id);
    j["name"] = s.name;
    // SPAN_KIND_SERVER for the job span (the server's part of the caller's request), else
    // SPAN_KIND_INTERNAL: its phases.
    j["kind"] = s.name == "llm_request" ? 2 : 1;
    j["startTimeUnixNano"] = unix_nanos(s.start_us, unix_offset_ns);
    j["endTimeUnixNano"] = unix_nanos(s.end_us, unix_offset_ns);
    json attrs = json::array();
    for (const SpanAttr& a : s.attrs) attrs.push_back({{"key", a.key}, {"value", attr_value(a)}});
    j["attributes"] = std::move(attrs);
    if (s.error) {
      j["status"] = {{"code", 2}, {"message", s.status_message}};  // STATUS_CODE_ERROR
    } else if (!s.status_message.empty()) {
      j["status"] = {{"code", 0}, {"message", s.status_message}};
    }
    out.push_back(std::move(j));
  }
  json resource = {{"attributes", json::array({{{"key", "service.name"},
                                                {"value", {{"stringValue", service_name}}}}})}};
  json scope = {{"scope", {{"name", "switchyard"}}}, {"spans", std::move(out)}};
  json body = {{"resourceSpans", json::array({{{"resource", std::move(resource)},
                                               {"scopeSpans", json::array({std::move(scope)})}}})}};
  // Ids and names are ASCII; attribute strings (job ids) may not be valid UTF-8: replace.
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

OtlpExporter::OtlpExporter(TracingConfig cfg, std::shared_ptr<TraceBuffer> buffer)
    : cfg_(std::move(cfg)), buf_(std::move(buffer)), offset_ns_(steady_to_unix_offset_ns()) {
  std::string why;
  auto ep = parse_otlp_endpoint(cfg_.otlp_endpoint, why);
  if (!ep)
    throw std::invalid_argument("tracing.otlp_endpoint (--otlp-endpoint) " +
                                wire::quoted(cfg_.otlp_endpoint) + " " + why);
  ep_ = *ep;
  if (cfg_.batch_spans == 0) cfg_.batch_spans = 1;
}

OtlpExporter::~OtlpExporter() {
  stop();
}

void OtlpExporter::start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { run(); });
}

void OtlpExporter::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void OtlpExporter::run() {
  bool failing = false;
  for (;;) {
    bool last = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Woken early only to stop: a full batch waits at most one interval, which keeps this
      // thread off the actors' path entirely (they never signal it).
      cv_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(1, cfg_.export_interval_ms)),
                   [&] { return stopping_; });
      last = stopping_;
    }
    // Every full batch now, then the rest; at stop, one pass over what waits.
    while (buf_->waiting() > 0) {
      std::vector<Span> batch = buf_->take(cfg_.batch_spans);
      if (batch.empty()) break;
      std::string why;
      if (post(otlp_json(batch, cfg_.service_name, offset_ns_), why)) {
        buf_->count_exported(batch.size());
        if (failing) log::info("trace export to " + cfg_.otlp_endpoint + " works again");
        failing = false;
      } else {
        buf_->count_dropped(batch.size());
        if (!failing)
          log::warn("trace export to " + cfg_.otlp_endpoint + " failed (" + why +
                    "): spans are dropped until it answers (switchyard_trace_spans_dropped_total)");
        failing = true;
        break;  // the rest waits for the next interval (or is dropped when the buffer is full)
      }
      if (!last && buf_->waiting() < cfg_.batch_spans) break;
    }
    if (last) return;
  }
}

bool OtlpExporter::post(const std::string& body, std::string& why) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::milliseconds(cfg_.export_timeout_ms);
  auto left_ms = [&] {
    return static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count()));
  };
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(ep_.host.c_str(), ep_.port.c_str(), &hints, &res); rc != 0) {
    why = std::string("cannot resolve the host: ") + ::gai_strerror(rc);
    return false;
  }
  Fd sock;
  why = "no address answered";
  for (addrinfo* a = res; a && sock.fd < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc < 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, left_ms()) == 1) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      sock.fd = fd;
    } else {
      why = std::string("connect: ") + std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  if (sock.fd < 0) return false;
  // Waits for the socket to be ready for `events` within the export's time; false (and why) when
  // the collector is too slow.
  auto wait_for = [&](short events) {
    pollfd p{sock.fd, events, 0};
    if (::poll(&p, 1, left_ms()) == 1) return true;
    why = "the collector took longer than " + std::to_string(cfg_.export_timeout_ms) +
          " ms (tracing.export_timeout_ms)";
    return false;
  };
  const std::string head =
      "POST " + ep_.path + " HTTP/1.1\r\nHost: " + ep_.host + ":" + ep_.port +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\nConnection: close\r\n\r\n";
  for (const std::string* part : {&head, &body}) {
    std::size_t sent = 0;
    while (sent < part->size()) {
      ssize_t n = ::send(sock.fd, part->data() + sent, part->size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (wait_for(POLLOUT)) continue;
        return false;
      }
      why = std::string("send: ") + std::strerror(errno);
      return false;
    }
  }
  // The status line is all that is read: "HTTP/1.1 200 OK".
  std::string reply;
  while (reply.find("\r\n") == std::string::npos && reply.size() < 1024) {
    char b[512];
    ssize_t n = ::recv(sock.fd, b, sizeof b, 0);
    if (n > 0) {
      reply.append(b, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (wait_for(POLLIN)) continue;
      return false;
    }
    why = n == 0 ? "the collector closed the connection without an answer"
                 : std::string("recv: ") + std::strerror(errno);
    return false;
  }
  const auto sp = reply.find(' ');
  if (reply.rfind("HTTP/1.", 0) != 0 || sp == std::string::npos || reply.size() < sp + 4) {
    why = "the answer is not HTTP";
    return false;
  }
  if (reply[sp + 1] != '2') {
    why = "the collector answered " + reply.substr(sp + 1, 3);
    return false;
  }
  return true;
}

}  // namespace sy
