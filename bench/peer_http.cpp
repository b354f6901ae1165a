// A llama-server peer for bench_loadgen: the child process and the closed-loop streaming HTTP
// client (POSIX sockets and poll(2); one thread, as the ZeroMQ client of our server).
#include "bench/peer_http.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
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

/// A port that was free a moment ago (bound to 0 and released); llama-server binds it next.
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

/// A blocking TCP connection to 127.0.0.1:port (-1 when refused).
int connect_loopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(sys_error("socket"));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  int one = 1;
  // Requests are small and latency is measured: no Nagle delay.
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

std::string request_head(int port, size_t body_bytes) {
  return "POST /completion HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
         "\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
         "Connection: keep-alive\r\nContent-Length: " +
         std::to_string(body_bytes) + "\r\n\r\n";
}

}  // namespace

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
  int fd = connect_loopback(port_);
  if (fd < 0) {
    why = "connection refused";
    return false;
  }
  // A health answer is immediate; 5 s only guards against a wedged server.
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string req = "GET /health HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port_) +
                          "\r\nConnection: close\r\n\r\n";
  bool ok = ::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size());
  HttpResponseParser p;
  std::string body;
  char buf[4096];
  while (ok && !p.done()) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      ok = false;
      break;
    }
    try {
      p.feed(buf, static_cast<size_t>(n), [&](std::string_view b) { body.append(b); });
    } catch (const HttpError& e) {
      why = e.what();
      ::close(fd);
      return false;
    }
  }
  ::close(fd);
  if (!ok) {
    why = "no complete /health answer";
    return false;
  }
  why = "/health answered " + std::to_string(p.status()) + " " + body.substr(0, 200);
  if (p.status() != 200) return false;
  try {
    auto j = nlohmann::json::parse(body);
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

PeerRun run_peer(int port, const std::vector<PeerRequest>& requests, size_t warmup, int concurrency,
                 double timeout_s) {
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
        broken(c, sys_error("send to llama-server"));
        return;
      }
      c.sent += static_cast<size_t>(n);
    }
  };
  send_request = [&](Conn& c) {
    if (c.fd < 0) {
      c.fd = connect_loopback(port);
      if (c.fd < 0) throw std::runtime_error(sys_error("connect to llama-server"));
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
    const std::string body = completion_body(requests[idx]);
    c.out = request_head(port, body.size()) + body;
    c.job = idx;
    c.retried = false;
    ++inflight;
    send_request(c);
  };
  // One event of the stream of c's request.
  auto on_event = [&](Conn& c, const SseEvent& ev, int64_t t) {
    PeerJob& j = r.jobs[*c.job];
    PeerChunk ch = parse_peer_chunk(ev);
    if (ch.error) {
      if (c.stream_error.empty()) c.stream_error = "llama-server error: " + ch.error_message;
      return;
    }
    if (ch.tokens > 0 || ch.has_content) {
      if (j.t_first == 0)
        j.t_first = t;
      else
        j.itl_ms.push_back(static_cast<float>((t - j.t_last) / 1e6));
      j.t_last = t;
      j.streamed_tokens += ch.tokens;
    }
    if (ch.stop) {
      j.tokens_predicted = ch.tokens_predicted;
      j.predicted_n = ch.predicted_n;
      if (std::isfinite(ch.prompt_ms)) j.prompt_ms = ch.prompt_ms;
      if (std::isfinite(ch.predicted_ms)) j.predicted_ms = ch.predicted_ms;
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
            broken(c, got == 0 ? "llama-server closed the connection mid-response"
                               : sys_error("recv from llama-server"));
          else
            close_conn(c);  // an idle keep-alive connection ended by the server
          break;
        }
        const int64_t t = now_ns();
        last_byte = t;
        if (!c.job) throw std::runtime_error("llama-server sent bytes on an idle connection");
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
          throw std::runtime_error("llama-server sent bytes after the end of a response");
        const bool keep = c.http.keep_alive();
        c.reused = true;
        if (c.http.status() != 200)
          finish(c, "HTTP " + std::to_string(c.http.status()) + ": " + c.error_body);
        else if (!c.stream_error.empty())
          finish(c, c.stream_error);
        else if (c.sse.pending())
          finish(c, "the event stream ended inside an event");
        else if (r.jobs[*c.job].tokens_predicted < 0)
          finish(c, "the event stream ended without a final (stop) chunk");
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
