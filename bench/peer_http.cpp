// A llama-server peer for bench_loadgen: the child process, and the closed-loop streaming HTTP
// client that drives it and our HTTP door (POSIX sockets and poll(2); one thread, as the ZeroMQ
// client of our server).
#include "bench/peer_http.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "bench/peer_stream.hpp"

namespace sy::bench {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

std::string sys_error(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

/// An address to connect to: host (a name or a numeric address) and port, resolved once.
struct Addr {
  sockaddr_storage sa{};
  socklen_t len = 0;
};

Addr resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || !res)
    throw std::runtime_error("cannot resolve " + host + ": " + ::gai_strerror(rc));
  Addr a;
  std::memcpy(&a.sa, res->ai_addr, res->ai_addrlen);
  a.len = static_cast<socklen_t>(res->ai_addrlen);
  ::freeaddrinfo(res);
  return a;
}

/// A blocking TCP connection to `a` (-1 when refused).
int connect_to(const Addr& a) {
  int fd = ::socket(a.sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(sys_error("socket"));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a.sa), a.len) != 0) {
    ::close(fd);
    return -1;
  }
  int one = 1;
  // Requests are small and latency is measured: no Nagle delay.
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

/// "host:port" for a Host header (an IPv6 literal in brackets).
std::string host_header(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string request_head(const HttpTarget& t, size_t body_bytes) {
  return std::string("POST ") + api_path(t.api) +
         " HTTP/1.1\r\nHost: " + host_header(t.host, t.port) +
         "\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
         "Connection: keep-alive\r\nContent-Length: " +
         std::to_string(body_bytes) + "\r\n\r\n";
}

}  // namespace

int free_loopback_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(sys_error("socket"));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw std::runtime_error(sys_error("bind 127.0.0.1:0"));
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

HttpAnswer http_get(const std::string& host, int port, const std::string& path,
                    std::chrono::seconds timeout) {
  HttpAnswer ans;
  int fd = connect_to(resolve(host, port));
  if (fd < 0) {
    ans.error = "connection refused";
    return ans;
  }
  timeval tv{static_cast<time_t>(timeout.count()), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: " + host_header(host, port) +
                          "\r\nAccept: application/json\r\nConnection: close\r\n\r\n";
  bool ok = ::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size());
  HttpResponseParser p;
  char buf[4096];
  while (ok && !p.done()) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      ok = false;
      break;
    }
    try {
      p.feed(buf, static_cast<size_t>(n), [&](std::string_view b) {
        // A health or model list answer is small; more than 1 MiB of it is not read.
        if (ans.body.size() < (1u << 20)) ans.body.append(b);
      });
    } catch (const HttpError& e) {
      ans.error = e.what();
      ::close(fd);
      return ans;
    }
  }
  ::close(fd);
  if (!ok) {
    ans.error = "no complete answer to GET " + path;
    return ans;
  }
  ans.status = p.status();
  return ans;
}

// ---- the child process -------------------------------------------------------------------------

LlamaServer::LlamaServer(const LlamaServerOptions& o) {
  char tmpl[] = "/tmp/bench_loadgen-peer-XXXXXX";
  if (!mkdtemp(tmpl)) throw std::runtime_error(sys_error("mkdtemp"));
  dir_ = tmpl;
  log_ = dir_ + "/llama-server.log";
  port_ = free_loopback_port();
  argv_ = {o.binary,
           "--model",
           o.model,
           "--host",
           "127.0.0.1",
           "--port",
           std::to_string(port_),
           "--threads",
           std::to_string(o.threads),
           "--threads-batch",
           std::to_string(o.threads),
           "--parallel",
           std::to_string(o.parallel),
           "--ctx-size",
           std::to_string(o.ctx),
           "--cont-batching",
           "--no-webui"};
  argv_.insert(argv_.end(), o.extra.begin(), o.extra.end());
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error(sys_error("fork"));
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      ::close(fd);
    }
    std::vector<char*> cargv;
    for (auto& a : argv_) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    execv(o.binary.c_str(), cargv.data());
    std::perror(("exec " + o.binary).c_str());
    _exit(127);
  }
  try {
    wait_ready(o.startup);
  } catch (...) {
    stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    throw;
  }
}

void LlamaServer::wait_ready(std::chrono::seconds startup) {
  const auto until = Clock::now() + startup;
  std::string why = "not started";
  for (;;) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      const std::string how = WIFEXITED(status)
                                  ? "exit status " + std::to_string(WEXITSTATUS(status))
                                  : "signal " + std::to_string(WTERMSIG(status));
      throw std::runtime_error("llama-server ended during startup (" + how + "); its log:\n" +
                               log_tail());
    }
    if (healthy(why)) break;
    if (Clock::now() > until)
      throw std::runtime_error("llama-server not ready after " + std::to_string(startup.count()) +
                               " s (" + why + "); its log:\n" + log_tail());
    // llama-server has no readiness signal other than /health: look again shortly (the model
    // load takes seconds, so a tenth of a second costs nothing).
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

LlamaServer::~LlamaServer() {
  stop();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

bool LlamaServer::healthy(std::string& why) const {
  // A health answer is immediate; 5 s only guards against a wedged server.
  HttpAnswer a = http_get("127.0.0.1", port_, "/health", std::chrono::seconds(5));
  if (a.status == 0) {
    why = a.error;
    return false;
  }
  why = "/health answered " + std::to_string(a.status) + " " + a.body.substr(0, 200);
  if (a.status != 200) return false;
  try {
    auto j = nlohmann::json::parse(a.body);
    return j.is_object() && j.value("status", "") == "ok";
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

std::string LlamaServer::log_tail(size_t bytes) const {
  std::ifstream f(log_, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  return s.size() > bytes ? s.substr(s.size() - bytes) : s;
}

void LlamaServer::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  // llama-server finishes its slots and exits within a second or two; 10 s is generous.
  const auto until = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) break;
    if (Clock::now() > until) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  pid_ = -1;
}

// ---- the client --------------------------------------------------------------------------------

namespace {

struct Conn {
  int fd = -1;
  std::optional<size_t> job;  // the request in flight
  std::string out;            // bytes still to send
  size_t sent = 0;
  HttpResponseParser http;
  SseParser sse;
  std::string error_body;    // a non-200 answer's body
  std::string stream_error;  // an error event of the stream
  size_t received = 0;       // bytes of the current answer
  bool reused = false;       // the connection has carried a whole response
  bool retried = false;      // the current request was sent again on a new connection
};

void close_conn(Conn& c) {
  if (c.fd >= 0) ::close(c.fd);
  c.fd = -1;
}

}  // namespace

PeerRun run_peer(const HttpTarget& target, const std::vector<PeerRequest>& requests, size_t warmup,
                 int concurrency, double timeout_s) {
  const std::string& name = target.name;
  const Addr addr = resolve(target.host, target.port);
  const bool openai = target.api == PeerApi::openai;
  PeerRun r;
  r.jobs.resize(requests.size());
  std::vector<Conn> conns(static_cast<size_t>(concurrency));
  size_t next = 0, inflight = 0;
  int64_t last_byte = now_ns();

  auto finish = [&](Conn& c, const std::string& error) {
    PeerJob& j = r.jobs[*c.job];
    j.finished = true;
    j.t_done = now_ns();
    j.ok = error.empty();
    j.error = error;
    c.job.reset();
    --inflight;
  };
  // (Re)sends c's request, on a new connection when c has none. The clock starts at the send,
  // after the connection exists: ours are connected before the run too.
  std::function<void(Conn&)> send_request;
  // The connection broke. llama-server closes a connection after every streamed response
  // (without saying so in a Connection header), so a request sent on a reused connection can
  // meet that close before any byte of its answer: it is sent again, once, on a new connection
  // (what keep-alive clients do for a request the server never saw). Anything else fails it.
  auto broken = [&](Conn& c, const std::string& why) {
    close_conn(c);
    if (c.received == 0 && c.reused && !c.retried) {
      c.retried = true;
      ++r.resent_on_new_connection;
      send_request(c);
      return;
    }
    finish(c, why);
  };
  auto flush = [&](Conn& c) {
    while (c.sent < c.out.size()) {
      ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        broken(c, sys_error("send to " + name));
        return;
      }
      c.sent += static_cast<size_t>(n);
    }
  };
  send_request = [&](Conn& c) {
    if (c.fd < 0) {
      c.fd = connect_to(addr);
      if (c.fd < 0)
        throw std::runtime_error(
            sys_error("connect to " + name + " at " + host_header(target.host, target.port)));
      ::fcntl(c.fd, F_SETFL, ::fcntl(c.fd, F_GETFL) | O_NONBLOCK);
      ++r.connections_opened;
      c.reused = false;
    }
    c.sent = 0;
    c.received = 0;
    c.http.reset();
    c.sse = SseParser();
    c.error_body.clear();
    c.stream_error.clear();
    PeerJob& j = r.jobs[*c.job];
    j.t_submit = now_ns();
    if (*c.job == warmup) r.t_start = j.t_submit;
    flush(c);
  };
  auto issue = [&](Conn& c) {
    const size_t idx = next++;
    r.jobs[idx].warm = idx < warmup;
    const std::string body = openai ? openai_completion_body(requests[idx], target.model)
                                    : completion_body(requests[idx]);
    c.out = request_head(target, body.size()) + body;
    c.job = idx;
    c.retried = false;
    ++inflight;
    send_request(c);
  };
  // A chunk that streams output: the first is TTFT, the gaps between them ITL.
  auto on_output = [&](PeerJob& j, int64_t t) {
    if (j.t_first == 0)
      j.t_first = t;
    else
      j.itl_ms.push_back(static_cast<float>((t - j.t_last) / 1e6));
    j.t_last = t;
  };
  auto stream_failed = [&](Conn& c, const std::string& why) {
    if (c.stream_error.empty()) c.stream_error = why;
  };
  // One event of an OpenAI stream: text chunks, then (after the finish_reason) the usage, then
  // [DONE]; llama-server puts the usage on the finishing chunk, OpenAI on a chunk of its own.
  auto on_openai_event = [&](Conn& c, const SseEvent& ev, int64_t t) {
    PeerJob& j = r.jobs[*c.job];
    OpenAiChunk ch = parse_openai_chunk(ev);
    if (ch.error) return stream_failed(c, name + " error: " + ch.error_message);
    if (j.done_marker) return stream_failed(c, "an event after data: [DONE]");
    if (ch.done_marker) {
      j.done_marker = true;
      return;
    }
    if (ch.has_choice && !j.finish_reason.empty())
      return stream_failed(c, "a choice chunk after its finish_reason");
    if (ch.has_text) {
      on_output(j, t);
      ++j.text_chunks;
    }
    if (!ch.finish_reason.empty()) j.finish_reason = ch.finish_reason;
    if (ch.completion_tokens >= 0) {
      if (j.tokens_predicted >= 0) return stream_failed(c, "a second usage in one stream");
      j.tokens_predicted = ch.completion_tokens;
    }
    if (ch.predicted_n >= 0) j.predicted_n = ch.predicted_n;
    if (std::isfinite(ch.prompt_ms)) j.prompt_ms = ch.prompt_ms;
    if (std::isfinite(ch.predicted_ms)) j.predicted_ms = ch.predicted_ms;
  };
  // One event of the stream of c's request.
  auto on_event = [&](Conn& c, const SseEvent& ev, int64_t t) {
    PeerJob& j = r.jobs[*c.job];
    // A server that breaks the protocol fails this request (the run goes on and reports it).
    try {
      if (openai) return on_openai_event(c, ev, t);
      PeerChunk ch = parse_peer_chunk(ev);
      if (ch.error) return stream_failed(c, name + " error: " + ch.error_message);
      if (ch.tokens > 0 || ch.has_content) {
        on_output(j, t);
        j.streamed_tokens += ch.tokens;
        if (ch.has_content) ++j.text_chunks;
      }
      if (ch.stop) {
        j.tokens_predicted = ch.tokens_predicted;
        j.predicted_n = ch.predicted_n;
        if (std::isfinite(ch.prompt_ms)) j.prompt_ms = ch.prompt_ms;
        if (std::isfinite(ch.predicted_ms)) j.predicted_ms = ch.predicted_ms;
      }
    } catch (const std::runtime_error& e) {
      // parse_peer_chunk's words name llama-server already; parse_openai_chunk's name no sender.
      stream_failed(c, openai ? name + " sent " + e.what() : std::string(e.what()));
    }
  };

  std::vector<pollfd> fds;
  std::vector<size_t> which;
  char buf[64 * 1024];
  for (;;) {
    for (auto& c : conns)
      if (!c.job && next < requests.size() && inflight < static_cast<size_t>(concurrency)) issue(c);
    if (inflight == 0 && next >= requests.size()) break;
    fds.clear();
    which.clear();
    for (size_t k = 0; k < conns.size(); ++k) {
      Conn& c = conns[k];
      if (c.fd < 0) continue;
      // Idle connections too: a keep-alive connection the server closed is seen (EOF) here.
      short ev = POLLIN;
      if (c.job && c.sent < c.out.size()) ev |= POLLOUT;
      fds.push_back({c.fd, ev, 0});
      which.push_back(k);
    }
    int n = ::poll(fds.data(), fds.size(), 100);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(sys_error("poll"));
    }
    const int64_t now = now_ns();
    if (n == 0) {
      if (inflight > 0 && now - last_byte > static_cast<int64_t>(timeout_s * 1e9)) {
        r.timed_out = true;
        break;
      }
      continue;
    }
    for (size_t f = 0; f < fds.size(); ++f) {
      if (!fds[f].revents) continue;
      Conn& c = conns[which[f]];
      if (c.job && (fds[f].revents & POLLOUT)) flush(c);
      if (c.fd < 0 || !(fds[f].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      for (;;) {
        ssize_t got = ::recv(c.fd, buf, sizeof buf, 0);
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (got <= 0) {
          if (c.job)
            broken(c, got == 0 ? name + " closed the connection mid-response"
                               : sys_error("recv from " + name));
          else
            close_conn(c);  // an idle keep-alive connection ended by the server
          break;
        }
        const int64_t t = now_ns();
        last_byte = t;
        if (!c.job) throw std::runtime_error(name + " sent bytes on an idle connection");
        c.received += static_cast<size_t>(got);
        size_t used = c.http.feed(buf, static_cast<size_t>(got), [&](std::string_view body) {
          if (c.http.status() != 200) {
            c.error_body.append(body.substr(0, 4096 - std::min<size_t>(4096, c.error_body.size())));
            return;
          }
          for (const SseEvent& ev : c.sse.feed(body)) on_event(c, ev, t);
        });
        if (!c.http.done()) continue;
        if (used != static_cast<size_t>(got))
          throw std::runtime_error(name + " sent bytes after the end of a response");
        const bool keep = c.http.keep_alive();
        c.reused = true;
        const PeerJob& j = r.jobs[*c.job];
        if (c.http.status() != 200)
          finish(c, "HTTP " + std::to_string(c.http.status()) + ": " + c.error_body);
        else if (!c.stream_error.empty())
          finish(c, c.stream_error);
        else if (c.sse.pending())
          finish(c, "the event stream ended inside an event");
        else if (!openai && j.tokens_predicted < 0)
          finish(c, "the event stream ended without a final (stop) chunk");
        else if (openai && j.finish_reason.empty())
          finish(c, "the event stream ended without a finish_reason");
        else if (openai && j.tokens_predicted < 0)
          finish(c, "the event stream ended without usage (stream_options.include_usage)");
        else if (openai && !j.done_marker)
          finish(c, "the event stream ended without data: [DONE]");
        else
          finish(c, "");
        if (!keep) close_conn(c);
        break;
      }
    }
  }
  for (auto& c : conns) close_conn(c);
  r.t_end = r.t_start;
  for (size_t i = warmup; i < r.jobs.size(); ++i) r.t_end = std::max(r.t_end, r.jobs[i].t_done);
  return r;
}

}  // namespace sy::bench
