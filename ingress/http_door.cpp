// The OpenAI-compatible HTTP door (http_door.hpp): one Asio thread owns the listener, every
// connection and every request in flight; a second one owns the Batch API's store and the jobs
// of its lines. Egress posts each job's events onto the thread of its exchange.
#include "ingress/http_door.hpp"

#include <algorithm>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <caf/all.hpp>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "actors/log.hpp"
#include "ingress/http_batch.hpp"
#include "ingress/http_listen.hpp"
#include "ingress/submit_request.hpp"

namespace sy {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// A refused request that reached no admission mailbox (intake full) is retried after this long:
// admission drains its mailbox in well under a second.
constexpr int64_t kIntakeRetryAfterMs = 200;
// Pipelined bytes read while a request runs (they wait for their turn in the buffer); past this
// the connection stops reading until the response is out, so one client cannot pile up data.
constexpr std::size_t kMaxPipelined = 64 * 1024;
// A multipart upload carries the file plus a few part headers; this covers those headers.
constexpr std::size_t kUploadOverhead = 64 * 1024;

const char* reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Unknown";
  }
}

std::string random_hex(std::size_t n) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* digits = "0123456789abcdef";
  std::string s(n, '0');
  for (auto& c : s) c = digits[rng() & 15];
  return s;
}

int64_t wall_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The head of a response: status line and headers, ending with the blank line.
std::string head(int status, std::string_view content_type, bool keep_alive,
                 std::optional<std::size_t> length, const std::vector<std::string>& extra = {}) {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " + reason(status) + "\r\n";
  h += "Server: switchyard\r\n";
  h += "Content-Type: ";
  h += content_type;
  h += "\r\n";
  if (length)
    h += "Content-Length: " + std::to_string(*length) + "\r\n";
  else
    h += "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n";
  for (const auto& x : extra) h += x + "\r\n";
  h += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  h += "\r\n";
  return h;
}

std::vector<std::string> retry_headers(int64_t retry_after_ms) {
  if (retry_after_ms < 0) return {};
  // Retry-After has whole seconds (rounded up, so a client never comes back early);
  // retry-after-ms, which the OpenAI SDKs read first, the exact figure.
  return {"Retry-After: " + std::to_string((retry_after_ms + 999) / 1000),
          "retry-after-ms: " + std::to_string(retry_after_ms)};
}

// One HTTP/1.1 chunk of a chunked body.
std::string chunk(std::string_view data) {
  char size[24];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  std::string c = size;
  c.append(data);
  c += "\r\n";
  return c;
}

openai::ApiError api_error(int status, std::string message, std::string type = "",
                           std::string code = "", std::string param = "") {
  openai::ApiError e;
  e.status = status;
  e.message = std::move(message);
  if (!type.empty()) e.type = std::move(type);
  e.code = std::move(code);
  e.param = std::move(param);
  return e;
}

}  // namespace

struct HttpDoor::Impl : std::enable_shared_from_this<HttpDoor::Impl> {
  struct Conn;

  // One generation request in flight: its jobs (one per prompt) and where its answer goes: a
  // connection, or a batch line (ingress/http_batch.hpp).
  struct Exchange {
    uint64_t handle = 0;
    openai::Request req;
    std::string response_id;
    int64_t created = 0;
    std::string tenant, token;
    std::vector<std::string> ids;  // job ids, by job index
    std::vector<bool> accepted, ended;
    std::vector<openai::JobResult> results;
    std::vector<wire::Usage> usage;
    std::set<uint32_t> choice_started;        // stream: choices whose first chunk went out
    std::map<uint32_t, uint32_t> sent_chars;  // stream: characters sent per choice (text_offset)
    bool headers_sent = false;                // stream: the 200 head went out
    std::weak_ptr<Conn> conn;
    std::optional<http_batch::LineJob> line;  // a batch line's exchange
    bool keep_alive = true;
  };

  // One connection: reads a request, answers it, reads the next (pipelined requests wait in
  // the buffer and are answered in order).
  struct Conn : std::enable_shared_from_this<Conn> {
    Conn(Impl& d, tcp::socket s) : door(d), socket(std::move(s)), timer(socket.get_executor()) {}
    Impl& door;
    tcp::socket socket;
    asio::steady_timer timer;
    beast::flat_buffer buf;
    std::optional<bhttp::request_parser<bhttp::string_body>> parser;
    std::string out;      // bytes waiting to be written
    std::string writing;  // bytes being written
    bool write_pending = false;
    bool close_after_write = false;
    bool closed = false;
    bool probing = false;           // a read watching for the client's going away runs
    bool next_after_write = false;  // read the next request once `out` is written
    uint64_t exchange = 0;          // the request in flight (0: none)
    bool first_request = true;

    void arm(uint32_t ms) {
      timer.expires_after(std::chrono::milliseconds(ms));
      timer.async_wait([self = shared_from_this()](beast::error_code ec) {
        if (ec) return;  // re-armed or cancelled
        self->door.counters.timeouts++;
        self->close();
      });
    }
    void disarm() { timer.cancel(); }

    void read_request() {
      if (closed) return;
      parser.emplace();
      parser->header_limit(static_cast<uint32_t>(door.cfg.max_header_bytes));
      // The route's own bound is applied once the headers are read (an upload may be larger
      // than a generation request); here only the largest of them, or Beast would refuse a
      // large Content-Length before the route is known.
      parser->body_limit(std::max<std::uint64_t>(door.cfg.max_body_bytes,
                                                 door.cfg.batch_max_file_bytes + kUploadOverhead));
      arm(first_request ? door.cfg.header_timeout_ms : door.cfg.idle_timeout_ms);
      bhttp::async_read_header(
          socket, buf, *parser,
          [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_header(ec); });
    }

    void on_header(beast::error_code ec) {
      if (closed) return;
      first_request = false;
      if (ec == bhttp::error::header_limit)
        return fail(431, "the request's headers exceed " +
                             std::to_string(door.cfg.max_header_bytes) +
                             " bytes (http.max_header_bytes)");
      if (ec) {
        if (ec != asio::error::eof && ec != asio::error::operation_aborted &&
            ec != asio::error::connection_reset)
          door.counters.malformed++;
        return close();
      }
      auto& req = parser->get();
      const std::string target(req.target());
      const bool upload = req.method() == bhttp::verb::post && target.rfind("/v1/files", 0) == 0;
      const std::size_t limit =
          upload ? door.cfg.batch_max_file_bytes + kUploadOverhead : door.cfg.max_body_bytes;
      if (auto len = parser->content_length(); len && *len > limit)
        return fail(413, "the request body of " + std::to_string(*len) + " bytes exceeds " +
                             std::to_string(limit) + " bytes" +
                             (upload ? " (http.batch_max_file_bytes)" : " (http.max_body_bytes)"));
      parser->body_limit(limit);
      if (parser->is_done()) return on_body({});
      // curl and the SDKs send "Expect: 100-continue" before a large upload; answer it, or they
      // wait a second before sending the body anyway.
      if (beast::iequals(req[bhttp::field::expect], "100-continue"))
        send("HTTP/1.1 100 Continue\r\n\r\n");
      arm(door.cfg.body_timeout_ms);
      bhttp::async_read(
          socket, buf, *parser,
          [self = shared_from_this()](beast::error_code e, std::size_t) { self->on_body(e); });
    }

    void on_body(beast::error_code ec) {
      if (closed) return;
      if (ec == bhttp::error::body_limit) return fail(413, "the request body is too large");
      if (ec) {
        if (ec != asio::error::eof && ec != asio::error::operation_aborted)
          door.counters.malformed++;
        return close();
      }
      disarm();
      door.counters.requests++;
      auto req = parser->release();
      door.on_request(shared_from_this(), std::move(req));
    }

    // An error answer to a request that could not be read whole: the connection closes after it.
    void fail(int status, std::string message) {
      door.counters.malformed++;
      respond(api_error(status, std::move(message)), false);
    }

    void respond(const openai::ApiError& e, bool keep_alive) {
      respond(e.status, "application/json", openai::error_body(e), keep_alive,
              retry_headers(e.retry_after_ms));
    }

    void respond(int status, std::string_view content_type, const std::string& body,
                 bool keep_alive, const std::vector<std::string>& extra = {}) {
      door.count_status(status);
      send(head(status, content_type, keep_alive, body.size(), extra) + body);
      end_exchange(keep_alive);
    }

    // The request's answer is queued whole: read the next request once it is written, or close.
    void end_exchange(bool keep_alive) {
      exchange = 0;
      if (!keep_alive) {
        close_after_write = true;
        if (!write_pending) close();
        return;
      }
      next_after_write = true;
      if (!write_pending) continue_reading();
    }

    void continue_reading() {
      next_after_write = false;
      // A watching read may still run: stop it first (its handler then reads the request).
      if (probing) {
        beast::error_code ignored;
        socket.cancel(ignored);
        return;
      }
      read_request();
    }

    void send(std::string bytes) {
      if (closed) return;
      out += bytes;
      if (out.size() > door.cfg.max_stream_backlog_bytes) {
        // The client reads slower than its tokens come: give up on it (its job is cancelled).
        return close();
      }
      flush();
    }

    void flush() {
      if (write_pending || out.empty() || closed) return;
      writing.swap(out);
      out.clear();
      write_pending = true;
      arm(door.cfg.write_timeout_ms);
      asio::async_write(
          socket, asio::buffer(writing),
          [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_written(ec); });
    }

    void on_written(beast::error_code ec) {
      write_pending = false;
      writing.clear();
      if (closed) return;
      if (ec) return close();
      if (!out.empty()) return flush();
      disarm();
      if (close_after_write) {
        beast::error_code ignored;
        socket.shutdown(tcp::socket::shutdown_send, ignored);
        return close();
      }
      if (next_after_write)
        continue_reading();
      else if (exchange && !probing)
        probe();
    }

    // While a request runs nothing is written for a long time (a non-streamed job): a read on
    // the socket is how the door learns that its client went away (EOF or a reset), and then
    // cancels the job. Bytes it reads are a pipelined request: they wait in the buffer.
    void probe() {
      if (closed || probing || buf.size() >= kMaxPipelined) return;
      probing = true;
      socket.async_read_some(buf.prepare(4096),
                             [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                               self->probing = false;
                               if (self->closed) return;
                               self->buf.commit(n);
                               if (ec == asio::error::operation_aborted) {
                                 if (self->next_after_write || !self->exchange)
                                   self->read_request();
                                 return;
                               }
                               if (ec) return self->close();  // EOF or reset: the client left
                               if (self->exchange) return self->probe();
                               self->read_request();
                             });
    }

    void close() {
      if (closed) return;
      closed = true;
      beast::error_code ignored;
      timer.cancel();
      socket.shutdown(tcp::socket::shutdown_both, ignored);
      socket.close(ignored);
      door.on_closed(*this);
    }
  };

  Impl(HttpConfig c, HttpDoorContext x) : cfg(std::move(c)), ctx(std::move(x)) {
    for (const auto& t : ctx.tenants)
      if (!t.token.empty()) tenant_of_token[t.token] = t.name;
  }

  HttpConfig cfg;
  HttpDoorContext ctx;
  asio::io_context io;
  std::optional<tcp::acceptor> acceptor;
  std::thread thread;
  // The batch results' fdatasync (http_batch::Hooks::offload): one thread of its own, so that a
  // slow disk never holds up the door's thread and the interactive requests it serves.
  std::optional<asio::thread_pool> sync_pool;
  std::string bound;
  std::unordered_map<std::string, std::string> tenant_of_token;
  std::unique_ptr<http_batch::Store> batches;
  // The Batch API's thread: the store's timers and syncs, and its lines' exchanges and events.
  // A batch's lines end in waves as the engine's steps end; reading each one's events, building
  // its response and appending it to the output file takes the tens of microseconds a line, so
  // a wave on the connections' thread would hold an interactive request's bytes back for
  // milliseconds. The store itself is guarded by store_mu: the door's thread takes it for the
  // /v1/files and /v1/batches calls, this thread for everything else.
  asio::io_context batch_io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> batch_work;
  std::thread batch_thread;
  std::mutex store_mu;

  std::mutex admission_mu;
  AdmissionActor admission;
  std::atomic<bool> refusing{false};

  // The requests in flight of one thread: the connections' (door thread) or the batch lines'
  // (batch thread). A job's client identity is "<tag><handle>/<job>", the tag naming the table.
  struct Table {
    explicit Table(char t) : tag(t) {}
    const char tag;
    std::unordered_map<uint64_t, Exchange> exchanges;
    uint64_t next_handle = 1;
  };
  Table requests{'h'}, lines{'b'};
  Table& table_of(const Exchange& ex) { return ex.line ? lines : requests; }

  // Door-thread state.
  std::set<std::shared_ptr<Conn>> conns;
  std::mutex ignored_mu;
  std::set<std::string> ignored_logged;  // unknown request fields, logged once each (both threads)

  struct Counters {
    std::atomic<uint64_t> accepted{0}, refused{0}, requests{0}, r2{0}, r4{0}, r5{0}, r429{0},
        streams{0}, client_gone{0}, timeouts{0}, malformed{0};
    std::atomic<int64_t> open{0};
  } counters;

  AdmissionActor get_admission() {
    std::lock_guard<std::mutex> lock(admission_mu);
    return admission;
  }

  void count_status(int status) {
    if (status < 300)
      counters.r2++;
    else if (status < 500)
      counters.r4++;
    else
      counters.r5++;
    if (status == 429) counters.r429++;
  }

  // ---- accepting ------------------------------------------------------------------------------

  void accept() {
    acceptor->async_accept([self = shared_from_this()](beast::error_code ec, tcp::socket s) {
      if (ec == asio::error::operation_aborted || !self->acceptor->is_open()) return;
      if (!ec) self->on_accept(std::move(s));
      self->accept();
    });
  }

  void on_accept(tcp::socket s) {
    beast::error_code ignored;
    s.set_option(tcp::no_delay(true), ignored);  // stream chunks are small and must leave now
    auto conn = std::make_shared<Conn>(*this, std::move(s));
    if (conns.size() >= cfg.max_connections) {
      counters.refused++;
      conn->respond(api_error(503,
                              "the server has " + std::to_string(cfg.max_connections) +
                                  " connections open (http.max_connections): retry later",
                              "server_error", "too_many_connections"),
                    false);
      return;  // the write holds the connection until it is out
    }
    counters.accepted++;
    counters.open++;
    conns.insert(conn);
    conn->read_request();
  }

  // A connection closed. It may close from deep inside an event's handling (a write that
  // failed, a backlog over its bound) while that handling still holds the connection and its
  // exchange: both are released by a handler posted for later, never here.
  void on_closed(Conn& c) {
    std::shared_ptr<Conn> keep;
    for (auto it = conns.begin(); it != conns.end(); ++it)
      if (it->get() == &c) {
        counters.open--;
        keep = *it;
        conns.erase(it);
        break;
      }
    uint64_t handle = c.exchange;
    c.exchange = 0;
    if (handle) {
      auto it = requests.exchanges.find(handle);
      if (it != requests.exchanges.end()) cancel_jobs(it->second, true);
    }
    asio::post(io, [self = shared_from_this(), keep, handle] {
      if (handle) self->requests.exchanges.erase(handle);
    });
  }

  // ---- requests -------------------------------------------------------------------------------

  struct Who {
    std::string tenant, token;
  };

  // The tenant a request acts for: the one whose token the bearer token is; without a token,
  // the `user` field's or the default tenant (admission refuses a configured tenant that needs
  // a token).
  std::variant<Who, openai::ApiError> who(const bhttp::request<bhttp::string_body>& req,
                                          const std::string& user) {
    std::string auth(req[bhttp::field::authorization]);
    std::string token;
    if (!auth.empty()) {
      if (auth.size() > 7 && beast::iequals(auth.substr(0, 7), "Bearer "))
        token = auth.substr(7);
      else
        return api_error(401, "the Authorization header must be 'Bearer <token>'",
                         "authentication_error", "invalid_api_key");
    }
    if (!token.empty() && !ctx.tenants.empty()) {
      auto it = tenant_of_token.find(token);
      if (it == tenant_of_token.end())
        return api_error(401, "the bearer token names no tenant of this server",
                         "authentication_error", "invalid_api_key");
      return Who{it->second, token};
    }
    // Open-tenant mode (any token is accepted, as a server without keys does) or no token.
    std::string tenant = user.empty() ? cfg.default_tenant : user;
    if (tenant.size() > ctx.parse.limits.max_name_bytes)
      return api_error(400,
                       "'user' is longer than " + std::to_string(ctx.parse.limits.max_name_bytes) +
                           " bytes (it names the tenant)",
                       "", "", "user");
    if (!ctx.tenants.empty()) {
      for (const auto& t : ctx.tenants)
        if (t.name == tenant && t.token.empty()) return Who{tenant, ""};
      return api_error(401, "this server needs a bearer token (Authorization: Bearer <token>)",
                       "authentication_error", "invalid_api_key");
    }
    return Who{tenant, ""};
  }

  void on_request(const std::shared_ptr<Conn>& conn, bhttp::request<bhttp::string_body> req) {
    const bool keep = req.keep_alive();
    std::string target(req.target());
    std::string path = target.substr(0, target.find('?'));
    std::string query = target.size() > path.size() ? target.substr(path.size() + 1) : "";
    const auto method = req.method();
    try {
      if (path == "/health") {
        std::string why = ctx.unhealthy ? ctx.unhealthy() : "";
        if (refusing) why = "draining";
        if (why.empty()) return conn->respond(200, "application/json", "{\"status\":\"ok\"}", keep);
        return conn->respond(503, "application/json",
                             "{\"status\":\"unavailable\",\"reason\":\"" + why + "\"}", keep);
      }
      if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) {
        if (method != bhttp::verb::get) return method_not_allowed(*conn, keep);
        const auto& names = ctx.parse.models;
        if (path == "/v1/models")
          return conn->respond(200, "application/json",
                               openai::models_body({names.front()}, started_at, ctx.max_model_len),
                               keep);
        const std::string id = path.substr(11);
        if (std::find(names.begin(), names.end(), id) == names.end())
          return conn->respond(api_error(404, "the model '" + id + "' does not exist",
                                         "invalid_request_error", "model_not_found", "model"),
                               keep);
        auto body = model_object(id);
        return conn->respond(200, "application/json", body, keep);
      }
      if (auto ep = openai::endpoint_from_path(path)) {
        if (method != bhttp::verb::post) return method_not_allowed(*conn, keep);
        return generate(conn, *ep, req, keep);
      }
      if (path.rfind("/v1/files", 0) == 0 || path.rfind("/v1/batches", 0) == 0)
        return batch_api(*conn, req, path, query, keep);
    } catch (const std::exception& e) {
      return conn->respond(
          api_error(500, std::string("internal error: ") + e.what(), "server_error"), keep);
    }
    conn->respond(api_error(404, "no route " + std::string(req.method_string()) + " " + path,
                            "invalid_request_error", "not_found"),
                  keep);
  }

  std::string model_object(const std::string& id) {
    // One entry of the list, as /v1/models/{id} answers.
    std::string list = openai::models_body({id}, started_at, ctx.max_model_len);
    const auto a = list.find("[{"), b = list.rfind("}]");
    return a == std::string::npos || b == std::string::npos ? list : list.substr(a + 1, b - a);
  }

  void method_not_allowed(Conn& c, bool keep) {
    c.respond(api_error(405, "method not allowed on this route", "invalid_request_error",
                        "method_not_allowed"),
              keep);
  }

  int64_t started_at = wall_seconds();

  // ---- generation -----------------------------------------------------------------------------

  void log_ignored(const openai::Request& r) {
    if (r.ignored.empty()) return;
    std::lock_guard<std::mutex> lock(ignored_mu);
    for (const auto& f : r.ignored)
      if (ignored_logged.size() < 1024 && ignored_logged.insert(f).second)
        log::info("http: request field '" + f + "' is not supported and is ignored");
  }

  // Checks the intake bound shared with the ZeroMQ gateway; an error when admission is behind.
  std::optional<openai::ApiError> intake_full() {
    if (!ctx.intake) return std::nullopt;
    const uint64_t n = ctx.intake->waiting();
    if (n < static_cast<uint64_t>(ctx.max_waiting_requests) &&
        ctx.intake->waiting_bytes() < static_cast<uint64_t>(ctx.max_waiting_bytes))
      return std::nullopt;
    auto e = api_error(429,
                       "the server is behind on admitting requests (" + std::to_string(n) +
                           " waiting): retry after the Retry-After delay",
                       "rate_limit_error", "overloaded");
    e.retry_after_ms = kIntakeRetryAfterMs;
    return e;
  }

  void generate(const std::shared_ptr<Conn>& conn, openai::Endpoint ep,
                const bhttp::request<bhttp::string_body>& req, bool keep) {
    auto parsed = openai::parse_request(ep, req.body(), ctx.parse);
    if (auto* e = std::get_if<openai::ApiError>(&parsed)) return conn->respond(*e, keep);
    auto& r = std::get<openai::Request>(parsed);
    log_ignored(r);
    auto w = who(req, r.user);
    if (auto* e = std::get_if<openai::ApiError>(&w)) return conn->respond(*e, keep);
    const Who& id = std::get<Who>(w);
    if (r.priority.empty()) {
      std::string p(req["X-Switchyard-Priority"]);
      if (!p.empty()) {
        r.priority = p;
        for (auto& j : r.jobs) j.priority = p;
      }
    }
    // W3C Trace Context: the jobs' spans join the caller's trace (docs/tracing.md).
    if (std::string tp(req["traceparent"]); !tp.empty()) {
      TraceContext tc;
      if (auto bad = parse_traceparent(tp, tc))
        return conn->respond(
            api_error(400, "the traceparent header " + *bad, "", "", "traceparent"), keep);
      for (auto& j : r.jobs) j.trace = tp;
    }
    std::string key(req["Idempotency-Key"]);
    if (key.empty()) key = std::string(req["X-Request-Id"]);
    // Room for the "/N" suffix of a request with several prompts.
    if (key.size() + 4 > ctx.parse.limits.max_id_bytes)
      return conn->respond(
          api_error(400,
                    "the Idempotency-Key (or X-Request-Id) header is longer "
                    "than " +
                        std::to_string(ctx.parse.limits.max_id_bytes - 4) + " bytes",
                    "", "", "Idempotency-Key"),
          keep);
    Exchange ex;
    ex.conn = conn;
    ex.keep_alive = keep;
    ex.tenant = id.tenant;
    ex.token = id.token;
    if (auto e = start(ex, std::move(r), key)) return conn->respond(*e, keep);
  }

  // Submits an exchange's jobs and registers it; an error when it cannot be sent at all.
  std::optional<openai::ApiError> start(Exchange& ex, openai::Request r, const std::string& key) {
    if (refusing)
      return api_error(503, "the server is shutting down and takes no new requests", "server_error",
                       "unavailable");
    auto adm = get_admission();
    if (!adm) return api_error(503, "the server is starting", "server_error", "unavailable");
    if (auto e = intake_full()) return e;
    Table& table = table_of(ex);
    ex.handle = table.next_handle++;
    ex.req = std::move(r);
    const bool chat = ex.req.endpoint == openai::Endpoint::chat_completions;
    ex.response_id = (chat ? "chatcmpl-" : "cmpl-") + random_hex(24);
    ex.created = wall_seconds();
    const std::string base = key.empty() ? ex.response_id : key;
    const std::size_t n = ex.req.jobs.size();
    ex.accepted.assign(n, false);
    ex.ended.assign(n, false);
    ex.results.resize(n);
    ex.usage.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      wire::Submit s = ex.req.jobs[i];
      s.id = n == 1 ? base : base + "/" + std::to_string(i);
      s.tenant = ex.tenant;
      s.token = ex.token;
      s.stream = ex.req.stream;
      if (auto* text = std::get_if<std::string>(&s.prompt)) ex.results[i].prompt_text = *text;
      ex.ids.push_back(s.id);
      SubmitRequest sr = to_request(std::move(s), ClientRef{ClientRef::http, identity(ex, i)});
      // A batch line is never cut short by a shutdown: it resumes with its batch.
      sr.outlive_shutdown = ex.line.has_value();
      // Without a key of the client's, no retry can attach to it after a restart: not journaled.
      sr.journal = !key.empty() || ex.line.has_value();
      if (ctx.intake) {
        // Counted like a ZeroMQ submit (admission counts it out); its size is its JSON's share.
        const auto b = static_cast<uint32_t>(std::max<std::size_t>(1, sr.prompt_text.size()));
        ctx.intake->handed_bytes.fetch_add(b, std::memory_order_relaxed);
        ctx.intake->handed.fetch_add(1, std::memory_order_relaxed);
        sr.metered_bytes = b;
      }
      // A request on a connection goes ahead of the Batch API's lines in admission's mailbox
      // (a batch submits its next lines in waves, as its earlier ones end).
      if (ex.line)
        caf::anon_send(adm, submit_atom::value, std::move(sr));
      else
        caf::anon_send<caf::message_priority::high>(adm, submit_atom::value, std::move(sr));
    }
    if (auto c = ex.conn.lock()) {
      c->exchange = ex.handle;
      c->probe();
    }
    table.exchanges.emplace(ex.handle, std::move(ex));
    return std::nullopt;
  }

  std::string identity(const Exchange& ex, std::size_t job) {
    return table_of(ex).tag + std::to_string(ex.handle) + "/" + std::to_string(job);
  }

  // Whether an event is for a batch line's job (its client identity names the lines' table).
  bool is_line_event(const OutMessage& m) const {
    return !m.to.identity.empty() && m.to.identity[0] == lines.tag;
  }

  void cancel_jobs(Exchange& ex, bool client_gone) {
    auto adm = get_admission();
    for (std::size_t i = 0; i < ex.ids.size(); ++i) {
      if (ex.ended[i]) continue;
      if (client_gone) counters.client_gone++;
      if (!adm) continue;
      KeyRequest kr;
      kr.kind = KeyRequest::cancel;
      kr.client = ClientRef{ClientRef::http, identity(ex, i)};
      kr.id = ex.ids[i];
      kr.tenant = ex.tenant;
      kr.token = ex.token;
      kr.internal = true;
      caf::anon_send(adm, cancel_atom::value, std::move(kr));
    }
  }

  // ---- events from egress ---------------------------------------------------------------------

  // An event of a job, on the thread of its table (HttpDoor::post).
  void on_event(Table& table, const OutMessage& m) {
    const std::string& to = m.to.identity;
    if (to.empty() || to[0] != table.tag) return;
    const auto slash = to.find('/');
    if (slash == std::string::npos) return;
    uint64_t handle = 0;
    uint32_t job = 0;
    try {
      handle = std::stoull(to.substr(1, slash - 1));
      job = static_cast<uint32_t>(std::stoul(to.substr(slash + 1)));
    } catch (const std::exception&) {
      return;
    }
    auto it = table.exchanges.find(handle);
    if (it == table.exchanges.end()) return;  // its client left; the job was cancelled
    Exchange& ex = it->second;
    if (job >= ex.ids.size()) return;
    auto decoded = wire::decode_server(m.bytes.data(), m.bytes.size(), ctx.parse.limits);
    if (auto* err = std::get_if<wire::DecodeError>(&decoded)) {
      log::warn("http: an event could not be read back: " + err->message);
      return;
    }
    auto& msg = std::get<wire::ServerMessage>(decoded);
    if (auto* a = std::get_if<wire::Accepted>(&msg)) {
      (void)a;
      ex.accepted[job] = true;
      maybe_start_stream(ex);
    } else if (auto* t = std::get_if<wire::Tokens>(&msg)) {
      on_tokens(ex, job, *t);
    } else if (auto* d = std::get_if<wire::Done>(&msg)) {
      on_done(ex, job, std::move(*d));
    } else if (auto* e = std::get_if<wire::Error>(&msg)) {
      on_error(ex, job, *e);
    }
    // Status, step and tool events do not come to HTTP requests.
  }

  Conn* conn_of(Exchange& ex) {
    auto c = ex.conn.lock();
    return c && !c->closed ? c.get() : nullptr;
  }

  // A stream's head goes out once every job of the request is admitted: a refusal is always a
  // status code, never an error inside a 200 stream.
  void maybe_start_stream(Exchange& ex) {
    if (!ex.req.stream || ex.headers_sent || ex.line) return;
    for (std::size_t i = 0; i < ex.accepted.size(); ++i)
      if (!ex.accepted[i] && !ex.ended[i]) return;
    Conn* c = conn_of(ex);
    if (!c) return;
    ex.headers_sent = true;
    counters.streams++;
    count_status(200);
    c->send(head(200, "text/event-stream", ex.keep_alive, std::nullopt));
  }

  void stream_event(Exchange& ex, const std::string& json) {
    if (Conn* c = conn_of(ex)) c->send(chunk(openai::sse_event(json)));
  }

  void on_tokens(Exchange& ex, uint32_t job, const wire::Tokens& t) {
    if (!ex.req.stream) return;
    ex.accepted[job] = true;  // a chunk implies admission (its accepted may come first anyway)
    maybe_start_stream(ex);
    if (!ex.headers_sent) return;
    const uint32_t index = job * ex.req.n + t.choice;
    const bool first = ex.choice_started.insert(index).second;
    uint32_t& sent = ex.sent_chars[index];
    stream_event(ex, openai::chunk_json(ex.req, ex.response_id, ex.created, job, t, first,
                                        ctx.token_text, sent));
    // Characters, not bytes: completions' text_offset counts code points, as OpenAI's does.
    for (unsigned char c : t.text) sent += (c & 0xC0) != 0x80;
  }

  void on_done(Exchange& ex, uint32_t job, wire::Done d) {
    if (ex.ended[job]) return;
    ex.ended[job] = true;
    ex.accepted[job] = true;
    ex.usage[job] = d.usage;
    if (ex.req.stream && !ex.line) {
      maybe_start_stream(ex);
      if (ex.headers_sent) {
        // A job that attached to a finished key gets its text in the done alone: send it as
        // one chunk so the stream still carries the completion.
        auto emit_text = [&](uint32_t sample, const std::string& text,
                             const std::vector<int32_t>& ids) {
          const uint32_t index = job * ex.req.n + sample;
          if (text.empty() || ex.choice_started.count(index)) return;
          wire::Tokens t;
          t.id = d.id;
          t.text = text;
          t.ids = ids;
          t.choice = sample;
          on_tokens(ex, job, t);
        };
        auto finish = [&](uint32_t sample, wire::FinishReason f) {
          const uint32_t index = job * ex.req.n + sample;
          const bool first = ex.choice_started.insert(index).second;
          stream_event(
              ex, openai::finish_chunk_json(ex.req, ex.response_id, ex.created, index, f, first));
        };
        if (d.choices.empty()) {
          emit_text(0, d.text, d.ids);
          finish(0, d.finish_reason);
        } else {
          for (const auto& ch : d.choices) emit_text(ch.index, ch.text, ch.ids);
          for (const auto& ch : d.choices) finish(ch.index, ch.finish_reason);
        }
      }
    }
    ex.results[job].done = std::move(d);
    if (std::all_of(ex.ended.begin(), ex.ended.end(), [](bool b) { return b; })) complete(ex);
  }

  void on_error(Exchange& ex, uint32_t job, const wire::Error& e) {
    if (ex.ended[job]) return;
    ex.ended[job] = true;
    openai::ApiError api = openai::from_wire_error(e);
    // The request fails whole: its other jobs are cancelled.
    cancel_jobs(ex, false);
    if (ex.line) {
      finish_line(ex, api.status, openai::error_body(api), api.retry_after_ms);
      lines.exchanges.erase(ex.handle);
      return;
    }
    Conn* c = conn_of(ex);
    if (c && ex.headers_sent) {
      // The stream had begun (the job failed later, e.g. its engine died): the error goes in
      // the stream, as vLLM sends it, and the stream ends.
      stream_event(ex, openai::error_body(api));
      c->send(chunk(openai::sse_done()) + chunk(""));
      c->end_exchange(ex.keep_alive);
    } else if (c) {
      c->respond(api, ex.keep_alive);
    }
    requests.exchanges.erase(ex.handle);
  }

  void complete(Exchange& ex) {
    const uint64_t handle = ex.handle;
    if (ex.line) {
      finish_line(
          ex, 200,
          openai::response_body(ex.req, ex.response_id, ex.created, ex.results, ctx.token_text),
          -1);
      lines.exchanges.erase(handle);
      return;
    }
    Conn* c = conn_of(ex);
    if (c && ex.req.stream) {
      if (ex.req.include_usage)
        stream_event(ex, openai::usage_chunk_json(ex.req, ex.response_id, ex.created, ex.usage));
      c->send(chunk(openai::sse_done()) + chunk(""));
      c->end_exchange(ex.keep_alive);
    } else if (c) {
      c->respond(
          200, "application/json",
          openai::response_body(ex.req, ex.response_id, ex.created, ex.results, ctx.token_text),
          ex.keep_alive);
    }
    requests.exchanges.erase(handle);
  }

  // ---- the Batch API --------------------------------------------------------------------------

  void finish_line(Exchange& ex, int status, std::string body, int64_t retry_after_ms) {
    if (!batches || !ex.line) return;
    http_batch::LineResult r;
    r.status = status;
    r.body = std::move(body);
    r.request_id = ex.response_id;
    r.retry_after_ms = retry_after_ms;
    line_finished(*ex.line, r);
  }

  // Hands a line's result to the store (batch thread).
  void line_finished(const http_batch::LineJob& line, const http_batch::LineResult& r) {
    std::lock_guard<std::mutex> lock(store_mu);
    batches->finished(line, r);
  }

  // `fn` of the store (a timer's, a sync's end) as a task for the batch thread: under the
  // store's lock, and not at all once the door is gone.
  static std::function<void()> store_task(std::weak_ptr<Impl> weak, std::function<void()> fn) {
    return [weak = std::move(weak), fn = std::move(fn)] {
      if (auto d = weak.lock()) {
        std::lock_guard<std::mutex> lock(d->store_mu);
        fn();
      }
    };
  }

  // Runs one batch line as a non-streamed request of the batch's tenant in the batch class.
  void submit_line(const http_batch::LineJob& line) {
    auto parsed = openai::parse_request(line.endpoint, line.body, ctx.parse);
    if (auto* e = std::get_if<openai::ApiError>(&parsed)) {
      http_batch::LineResult r;
      r.status = e->status;
      r.body = openai::error_body(*e);
      line_finished(line, r);
      return;
    }
    auto& r = std::get<openai::Request>(parsed);
    log_ignored(r);
    r.stream = false;
    r.priority = ctx.batch_class;
    for (auto& j : r.jobs) {
      j.stream = false;
      j.priority = ctx.batch_class;
    }
    Exchange ex;
    ex.line = line;
    ex.tenant = line.tenant;
    for (const auto& t : ctx.tenants)
      if (t.name == line.tenant) ex.token = t.token;
    if (auto e = start(ex, std::move(r), line.key)) {
      http_batch::LineResult res;
      res.status = e->status;
      res.body = openai::error_body(*e);
      res.retry_after_ms = e->retry_after_ms;
      line_finished(line, res);
    }
  }

  void cancel_line(const http_batch::LineJob& line) {
    for (auto& [h, ex] : lines.exchanges)
      if (ex.line && ex.line->batch_id == line.batch_id && ex.line->line == line.line) {
        cancel_jobs(ex, false);
        return;
      }
  }

  void batch_api(Conn& c, const bhttp::request<bhttp::string_body>& req, const std::string& path,
                 const std::string& query, bool keep) {
    if (!batches)
      return c.respond(api_error(404,
                                 "the Batch API needs a state directory (this server runs "
                                 "without one: --state-dir or state_dir)",
                                 "invalid_request_error", "not_found"),
                       keep);
    auto w = who(req, "");
    if (auto* e = std::get_if<openai::ApiError>(&w)) return c.respond(*e, keep);
    const std::string tenant = std::get<Who>(w).tenant;
    const auto m = req.method();
    // The store's calls are short (an upload's write aside); the batch thread waits meanwhile.
    std::lock_guard<std::mutex> lock(store_mu);
    auto reply = [&](const http_batch::Reply& r) {
      c.respond(r.status, r.content_type, r.body, keep);
    };
    auto param = [&](const std::string& name) -> std::string {
      for (std::size_t at = 0; at < query.size();) {
        std::size_t amp = query.find('&', at);
        if (amp == std::string::npos) amp = query.size();
        const std::string kv = query.substr(at, amp - at);
        const auto eq = kv.find('=');
        if (kv.substr(0, eq) == name) return eq == std::string::npos ? "" : kv.substr(eq + 1);
        at = amp + 1;
      }
      return "";
    };
    if (path == "/v1/files") {
      if (m == bhttp::verb::get) return reply(batches->list_files(tenant));
      if (m != bhttp::verb::post) return method_not_allowed(c, keep);
      const auto type = req[bhttp::field::content_type];
      auto parts =
          http_batch::parse_multipart(std::string_view(type.data(), type.size()), req.body());
      if (auto* why = std::get_if<std::string>(&parts))
        return c.respond(api_error(400, "multipart body: " + *why), keep);
      std::string purpose, filename, data;
      bool have_file = false;
      for (auto& p : std::get<std::vector<http_batch::Part>>(parts)) {
        if (p.name == "purpose") purpose = p.data;
        if (p.name == "file") {
          filename = p.filename;
          data = std::move(p.data);
          have_file = true;
        }
      }
      if (!have_file)
        return c.respond(api_error(400, "the upload has no 'file' part", "", "", "file"), keep);
      return reply(batches->upload(tenant, purpose, filename, std::move(data)));
    }
    if (path.rfind("/v1/files/", 0) == 0) {
      std::string rest = path.substr(10);
      const bool content = rest.size() > 8 && rest.substr(rest.size() - 8) == "/content";
      if (content) rest.resize(rest.size() - 8);
      if (m == bhttp::verb::get)
        return reply(content ? batches->file_content(tenant, rest) : batches->file(tenant, rest));
      if (m == bhttp::verb::delete_ && !content) return reply(batches->delete_file(tenant, rest));
      return method_not_allowed(c, keep);
    }
    if (path == "/v1/batches") {
      if (m == bhttp::verb::post) return reply(batches->create_batch(tenant, req.body()));
      if (m != bhttp::verb::get) return method_not_allowed(c, keep);
      uint32_t limit = 20;
      const std::string l = param("limit");
      if (!l.empty()) {
        try {
          limit = static_cast<uint32_t>(std::clamp<long>(std::stol(l), 1, 100));
        } catch (const std::exception&) {
          return c.respond(api_error(400, "'limit' must be an integer", "", "", "limit"), keep);
        }
      }
      return reply(batches->list_batches(tenant, param("after"), limit));
    }
    if (path.rfind("/v1/batches/", 0) == 0) {
      std::string rest = path.substr(12);
      if (rest.size() > 7 && rest.substr(rest.size() - 7) == "/cancel") {
        if (m != bhttp::verb::post) return method_not_allowed(c, keep);
        return reply(batches->cancel_batch(tenant, rest.substr(0, rest.size() - 7)));
      }
      if (m != bhttp::verb::get) return method_not_allowed(c, keep);
      return reply(batches->batch(tenant, rest));
    }
    c.respond(api_error(404, "no route " + std::string(req.method_string()) + " " + path,
                        "invalid_request_error", "not_found"),
              keep);
  }

  void make_batches() {
    if (ctx.batch_dir.empty()) return;
    http_batch::Limits l;
    l.max_file_bytes = cfg.batch_max_file_bytes;
    l.max_lines = cfg.batch_max_lines;
    l.max_open_batches = cfg.batch_max_open;
    l.max_files = cfg.batch_max_files;
    l.max_in_flight = cfg.batch_max_in_flight;
    http_batch::Hooks h;
    std::weak_ptr<Impl> weak = weak_from_this();
    h.submit = [weak](const http_batch::LineJob& j) {
      if (auto d = weak.lock()) {
        // Run from the store's own call stack: defer, so the store finishes its bookkeeping
        // before the line's (possibly immediate) result comes back into it.
        asio::post(d->batch_io, [d, j] {
          if (d->refusing) return;  // the line runs again at the next start (recover)
          d->submit_line(j);
        });
      }
    };
    h.cancel = [weak](const http_batch::LineJob& j) {
      if (auto d = weak.lock()) asio::post(d->batch_io, [d, j] { d->cancel_line(j); });
    };
    h.after = [weak](std::chrono::milliseconds ms, std::function<void()> fn) {
      auto d = weak.lock();
      if (!d) return;
      auto t = std::make_shared<asio::steady_timer>(d->batch_io, ms);
      t->async_wait([t, task = store_task(weak, std::move(fn))](beast::error_code ec) {
        if (!ec) task();
      });
    };
    h.now_s = [] { return wall_seconds(); };
    sync_pool.emplace(1);
    asio::post(*sync_pool, [] { enter_thread_class("sy.http.sync", CpuPriority::normal); });
    h.offload = [weak](std::function<void()> work, std::function<void()> done) {
      auto d = weak.lock();
      if (!d) return;
      asio::post(*d->sync_pool, [weak, work = std::move(work), done = std::move(done)] {
        work();
        if (auto d = weak.lock()) asio::post(d->batch_io, store_task(weak, done));
      });
    };
    batches = std::make_unique<http_batch::Store>(ctx.batch_dir, l, std::move(h));
  }
};

HttpDoor::HttpDoor(HttpConfig cfg, HttpDoorContext ctx)
    : impl_(std::make_shared<Impl>(std::move(cfg), std::move(ctx))) {
  if (impl_->ctx.parse.models.empty()) impl_->ctx.parse.models.push_back("switchyard");
  impl_->make_batches();
}

HttpDoor::~HttpDoor() {
  stop();
}

void HttpDoor::set_admission(AdmissionActor admission) {
  std::lock_guard<std::mutex> lock(impl_->admission_mu);
  impl_->admission = std::move(admission);
}

void HttpDoor::start() {
  auto& d = *impl_;
  d.acceptor.emplace(d.io);
  d.bound = listen_on(*d.acceptor, d.cfg.bind, "http");
  if (d.batches) {
    {
      std::lock_guard<std::mutex> lock(d.store_mu);
      d.batches->recover();
    }
    d.batch_work.emplace(d.batch_io.get_executor());
    d.batch_thread = std::thread([impl = impl_] {
      const std::string why = enter_thread_class("sy.http.batch", impl->ctx.batch_priority);
      if (!why.empty()) log::warn("http: the Batch API's thread keeps its CPU priority: " + why);
      impl->batch_io.run();
    });
  }
  d.accept();
  d.thread = std::thread([impl = impl_] {
    enter_thread_class("sy.http", CpuPriority::normal);
    impl->io.run();
  });
}

std::string HttpDoor::address() const {
  return impl_->bound;
}

void HttpDoor::refuse_submits() {
  impl_->refusing = true;
}

void HttpDoor::stop() {
  auto& d = *impl_;
  if (!d.thread.joinable()) return;
  asio::post(d.io, [impl = impl_] {
    beast::error_code ignored;
    if (impl->acceptor) impl->acceptor->close(ignored);
    auto conns = impl->conns;
    for (const auto& c : conns) c->close();
    impl->io.stop();
  });
  d.thread.join();
  if (d.batch_thread.joinable()) {
    d.batch_work.reset();
    d.batch_io.stop();
    d.batch_thread.join();
  }
  // Syncs under way finish (their results would be posted to a stopped thread, and dropped).
  if (d.sync_pool) d.sync_pool->join();
  d.requests.exchanges.clear();
  d.lines.exchanges.clear();
  d.conns.clear();
  std::lock_guard<std::mutex> lock(d.admission_mu);
  d.admission = AdmissionActor{};
}

void HttpDoor::post(OutMessage m) {
  if (impl_->is_line_event(m))
    asio::post(impl_->batch_io,
               [impl = impl_, m = std::move(m)] { impl->on_event(impl->lines, m); });
  else
    asio::post(impl_->io, [impl = impl_, m = std::move(m)] { impl->on_event(impl->requests, m); });
}

HttpDoorStats HttpDoor::stats() const {
  const auto& c = impl_->counters;
  HttpDoorStats s;
  s.connections_accepted = c.accepted;
  s.connections_refused = c.refused;
  s.connections_open = c.open;
  s.requests = c.requests;
  s.responses_2xx = c.r2;
  s.responses_4xx = c.r4;
  s.responses_5xx = c.r5;
  s.responses_429 = c.r429;
  s.streams = c.streams;
  s.client_gone = c.client_gone;
  s.timeouts = c.timeouts;
  s.malformed = c.malformed;
  return s;
}

std::string http_metrics_text(const HttpDoorStats& s) {
  std::string t;
  auto counter = [&](const char* name, const char* help, const std::string& labels, uint64_t v) {
    t += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n";
    t += std::string(name) + labels + " " + std::to_string(v) + "\n";
  };
  t += "# HELP switchyard_http_responses_total HTTP door responses by status class.\n"
       "# TYPE switchyard_http_responses_total counter\n";
  t += "switchyard_http_responses_total{code=\"2xx\"} " + std::to_string(s.responses_2xx) + "\n";
  t += "switchyard_http_responses_total{code=\"4xx\"} " + std::to_string(s.responses_4xx) + "\n";
  t += "switchyard_http_responses_total{code=\"5xx\"} " + std::to_string(s.responses_5xx) + "\n";
  counter("switchyard_http_overload_responses_total",
          "HTTP door 429 answers (overloaded or rate limited).", "", s.responses_429);
  counter("switchyard_http_requests_total", "HTTP requests read whole.", "", s.requests);
  counter("switchyard_http_streams_total", "Server-Sent Event streams started.", "", s.streams);
  counter("switchyard_http_client_gone_total",
          "Jobs cancelled because their HTTP client went away.", "", s.client_gone);
  counter("switchyard_http_connections_refused_total",
          "Connections answered 503: http.max_connections were open.", "", s.connections_refused);
  counter("switchyard_http_timeouts_total",
          "Connections closed by a header, body, idle or write time bound.", "", s.timeouts);
  counter("switchyard_http_malformed_total", "Requests refused as unreadable HTTP.", "",
          s.malformed);
  t += "# HELP switchyard_http_connections_open HTTP door connections open.\n"
       "# TYPE switchyard_http_connections_open gauge\n";
  t += "switchyard_http_connections_open " + std::to_string(s.connections_open) + "\n";
  return t;
}

}  // namespace sy
