// The gateway thread: zmq_poll over the ROUTER, the PULL (only while it has credit, or while
// refusing submits during a shutdown), the ZAP handler (with a CURVE client allow-list), the
// connection monitors of the ROUTER and the PULL (endpoints.max_connections and its companions)
// and an eventfd raised by post(); decodes at the edge, answers ping itself, sends what egress
// posts.
#include "ingress/gateway.hpp"

#include <arpa/inet.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <caf/all.hpp>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>
#include <zmq.hpp>

#include "actors/log.hpp"
#include "ingress/curve.hpp"
#include "ingress/submit_request.hpp"

namespace sy {
namespace {

// A visitor made of lambdas, one per alternative (std::visit over the decoded messages).
template <class... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

using Clock = std::chrono::steady_clock;

// Messages read from one socket per wake-up: bounded so that a flood on one socket cannot starve
// the outbound flush or the other socket.
constexpr int kReadBatch = 256;
// TCP keepalive probes after the idle time: one every 10 s, and 3 unanswered ones drop the
// connection, so a dead peer is gone 30 s after probing starts; a lost probe or two on a lossy
// link does not drop a live one.
constexpr int kKeepaliveIntervalS = 10;
constexpr int kKeepaliveProbes = 3;
// retry_after_ms of a request refused because admission's mailbox is full: it drains thousands of
// requests in that time, so a client that waits this long finds room.
constexpr uint32_t kIntakeRetryAfterMs = 20;
// Poll period while some ROUTER peer has a backlog: ROUTER reports no per-peer writability, so a
// deferred send is simply retried this often.
constexpr std::chrono::milliseconds kRetryPeriod{1};
// Upper bound of the socket linger at close: a sink or client that stopped reading must not keep
// the process from exiting.
constexpr int kMaxLingerMs = 1000;
// Largest frame a pipeline sink may send to the results socket: sinks send only ZMTP commands
// (the CURVE INITIATE with its metadata is the largest, a few hundred bytes); 4 KiB leaves room
// for application metadata.
constexpr int64_t kResultsMaxInbound = 4 * 1024;

// A connection refused by a connection cap is logged at once, then at most this often for the
// same cap, with the count since the last line: a refused client reconnects every 100 ms
// (ZeroMQ's default), and many of them must not flood the log.
constexpr std::chrono::seconds kRefusalLogPeriod{10};
// With a client allow-list, a connection still open this long after handshake_timeout_ms from
// its accept has passed the allow-list (libzmq drops one whose handshake is not done by then):
// it counts as passed whatever the gateway guessed at its ZAP answer. The slack covers the time
// between libzmq's drop and the gateway reading its disconnect, normally well under a
// millisecond; a second is ample even for a busy gateway thread.
constexpr std::chrono::seconds kHandshakeSlack{1};
// The ZAP domains of the bound sockets (docs/security.md): with an allow-list they tell the ZAP
// handler which endpoint a handshake is for. Without one, a plain socket has "switchyard" (see
// start(): a ZAP domain makes libzmq refuse ZMTP 1.0/2.0 peers).
constexpr const char* kRequestDomain = "switchyard.request";
constexpr const char* kPipelineDomain = "switchyard.pipeline";
constexpr const char* kResultsDomain = "switchyard.results";
// The ZAP status text of a listed client refused for endpoints.max_connections.
constexpr const char* kTooManyConnections = "too many connections";
// Connection events read per wake-up, bounded like kReadBatch; a burst of connections is read
// over several wake-ups.
constexpr int kEventBatch = 1024;
// Descriptors the process needs besides client connections (model and journal files, the
// metrics listener and its clients, the descriptors of libzmq's and CAF's own threads): a margin
// for the start-up check of `ulimit -n` against endpoints.max_connections.
constexpr int64_t kReservedDescriptors = 256;

enum class SendResult { sent, again, gone };

// Whether `fd` is still a connection accepted on the bound `endpoint` (tcp://HOST:PORT or
// ipc://PATH). libzmq reports a connection's descriptor asynchronously: one it has closed since
// may already name another file or socket of the process, which must not be shut down.
bool accepted_on(int fd, const std::string& endpoint) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return false;
  int listening = 1;
  socklen_t optlen = sizeof listening;
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &optlen) != 0 || listening)
    return false;
  if (endpoint.rfind("tcp://", 0) == 0) {
    const auto port = static_cast<uint16_t>(
        std::strtoul(endpoint.c_str() + endpoint.rfind(':') + 1, nullptr, 10));
    if (ss.ss_family == AF_INET)
      return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port) == port;
    if (ss.ss_family == AF_INET6)
      return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port) == port;
    return false;
  }
  if (endpoint.rfind("ipc://", 0) == 0 && ss.ss_family == AF_UNIX) {
    const auto* un = reinterpret_cast<const sockaddr_un*>(&ss);
    const size_t n =
        len > offsetof(sockaddr_un, sun_path) ? len - offsetof(sockaddr_un, sun_path) : 0;
    std::string path = endpoint.substr(6);
    if (!path.empty() && path[0] == '@') {  // the abstract namespace: a leading NUL, no end mark
      path[0] = '\0';
      return std::string(un->sun_path, n) == path;
    }
    return std::string(un->sun_path, ::strnlen(un->sun_path, n)) == path;
  }
  return false;
}

// The source a connection counts under for endpoints.max_connections_per_address: its IPv4
// address (an IPv4-mapped IPv6 one too), or the /64 network of an IPv6 address ("2001:db8::/64"):
// a host is usually given a whole /64, so single IPv6 addresses would cost a stranger nothing.
// "" when there is no network address (ipc).
std::string source_of(const sockaddr_storage& ss) {
  char text[INET6_ADDRSTRLEN] = "";
  if (ss.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&ss);
    return ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text) ? text : "";
  }
  if (ss.ss_family != AF_INET6) return "";
  in6_addr a = reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr;
  if (IN6_IS_ADDR_V4MAPPED(&a)) {
    in_addr v4{};
    std::memcpy(&v4, a.s6_addr + 12, sizeof v4);
    return ::inet_ntop(AF_INET, &v4, text, sizeof text) ? text : "";
  }
  std::memset(a.s6_addr + 8, 0, 8);
  return ::inet_ntop(AF_INET6, &a, text, sizeof text) ? std::string(text) + "/64" : "";
}

// The source of an accepted connection, from its peer address.
std::string peer_source(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  return source_of(ss);
}

// The source of the address a ZAP request names: libzmq writes the peer's numeric IP there
// (with a "%scope" after an IPv6 link-local one).
std::string source_of_text(const std::string& ip) {
  const std::string host = ip.substr(0, ip.find('%'));
  sockaddr_storage ss{};
  if (::inet_pton(AF_INET, host.c_str(), &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr) == 1)
    ss.ss_family = AF_INET;
  else if (::inet_pton(AF_INET6, host.c_str(), &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr) ==
           1)
    ss.ss_family = AF_INET6;
  else
    return ip;
  return source_of(ss);
}

// Bytes the kernel received on a TCP connection (0 when unknown): a connection whose handshake
// reached the allow-list has sent its greeting, HELLO and INITIATE, several hundred bytes, and
// one idling in its greeting far fewer.
uint64_t bytes_received(int fd) {
  tcp_info info{};
  socklen_t len = sizeof info;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
      len < offsetof(tcp_info, tcpi_bytes_received) + sizeof info.tcpi_bytes_received)
    return 0;
  return info.tcpi_bytes_received;
}

// Every connection takes a descriptor, and past the process's limit accepting fails (and so does
// opening any file) before the cap is reached: when the caps need more, the soft limit is raised
// toward the hard one, and a hard limit below them is said at start. `per_endpoint`: the
// connections one endpoint may hold (max_connections, plus max_handshaking with an allow-list).
void fit_descriptor_limit(int64_t per_endpoint, int64_t endpoints) {
  if (per_endpoint <= 0) return;
  const int64_t need = per_endpoint * endpoints + kReservedDescriptors;
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur == RLIM_INFINITY ||
      static_cast<int64_t>(files.rlim_cur) >= need)
    return;
  rlimit raised = files;
  raised.rlim_cur = files.rlim_max == RLIM_INFINITY
                        ? static_cast<rlim_t>(need)
                        : std::min(files.rlim_max, static_cast<rlim_t>(need));
  if (raised.rlim_cur > files.rlim_cur && ::setrlimit(RLIMIT_NOFILE, &raised) == 0) files = raised;
  if (static_cast<int64_t>(files.rlim_cur) < need)
    log::warn("warning: the open file limit (ulimit -n) is " + std::to_string(files.rlim_cur) +
              ", below the " + std::to_string(need) + " descriptors that the connection caps (" +
              std::to_string(per_endpoint) +
              " per endpoint: endpoints.max_connections, and endpoints.max_handshaking with an "
              "allow-list) and the server's own files need: raise the hard limit, or lower the "
              "caps");
}

// Binds, turning ZeroMQ's bare errno text into a message that names the address.
void bind_named(zmq::socket_t& s, const std::string& addr, const char* what) {
  try {
    s.bind(addr);
  } catch (const zmq::error_t& e) {
    throw std::runtime_error(std::string("cannot bind the ") + what + " to '" + addr +
                             "': " + e.what());
  }
}

// The server's Z85 secret key from the configured files ("" when CURVE is off); errors name the
// file. A public key file, when given, must belong to the secret key.
std::string load_curve_secret(const EndpointConfig& ep) {
  if (ep.curve_secret_key.empty()) {
    if (!ep.curve_public_key.empty())
      throw std::runtime_error("a CURVE public key file is set without the secret key file");
    return "";
  }
  curve::require("endpoints.curve_secret_key");
  std::string secret = curve::read_key_file(ep.curve_secret_key, "CURVE secret key");
  // A secret key others can read is no secret: said loudly, not refused (containers often run
  // with loose modes on mounted secrets).
  if (curve::readable_by_others(ep.curve_secret_key))
    log::warn("warning: CURVE secret key file '" + ep.curve_secret_key +
              "' is readable by its group or others (chmod 600 it)");
  std::string derived = curve::public_of(secret);
  if (!ep.curve_public_key.empty()) {
    std::string pub = curve::read_key_file(ep.curve_public_key, "CURVE public key");
    if (pub != derived)
      throw std::runtime_error("CURVE public key file '" + ep.curve_public_key +
                               "' does not belong to the secret key in '" + ep.curve_secret_key +
                               "' (its public key is " + derived + ")");
  }
  return secret;
}

// Where libzmq looks for the ZAP handler of a context (RFC 27): a handshake on a CURVE server
// socket asks whatever REP socket is bound here, in the same context.
constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";
// Distinct refused keys that are logged; beyond this only the counter grows, so a client that
// retries forever (ZeroMQ reconnects every 100 ms) or many strangers cannot flood the log.
constexpr size_t kMaxLoggedRefusals = 64;

// The client public keys (32 binary bytes each) of the allow-list file; errors name the file and
// the line. The file lists Z85 keys, one a line; blank lines and lines starting with '#' are
// skipped.
std::unordered_set<std::string> load_allowed_keys(const EndpointConfig& ep) {
  std::unordered_set<std::string> keys;
  if (ep.curve_allowed_keys.empty()) return keys;
  const std::string& path = ep.curve_allowed_keys;
  if (ep.curve_secret_key.empty())
    throw std::runtime_error("endpoints.curve_allowed_keys ('" + path +
                             "') needs endpoints.curve_secret_key: client keys are checked during "
                             "the CURVE handshake, so CURVE must be on (--curve-secret-key)");
  std::ifstream f(path, std::ios::binary);
  if (!f)
    throw std::runtime_error("CURVE allowed keys file '" + path +
                             "': cannot open: " + std::strerror(errno));
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    auto e = line.find_last_not_of(" \t\r");
    std::string key = line.substr(b, e - b + 1);
    if (!curve::is_z85_key(key))
      throw std::runtime_error(
          "CURVE allowed keys file '" + path + "' line " + std::to_string(n) +
          ": malformed: expected a 40-character Z85 client public key, found " +
          std::to_string(key.size()) + " characters");
    auto bin = curve::decode(key);
    keys.emplace(reinterpret_cast<const char*>(bin.data()), bin.size());
  }
  // An empty list would refuse every client: surely not what the operator meant.
  if (keys.empty())
    throw std::runtime_error("CURVE allowed keys file '" + path +
                             "' lists no key (every client would be refused)");
  return keys;
}

std::string job_key(const std::string& identity, const std::string& id) {
  std::string k;
  k.reserve(identity.size() + 1 + id.size());
  k += identity;
  k += '\0';
  k += id;
  return k;
}

}  // namespace

struct Gateway::Impl {
  EndpointConfig ep;
  GatewayOptions opt;
  std::string curve_secret;  // Z85; "" = plain TCP
  // Binary client public keys that may connect; empty = no allow-list (no ZAP handler).
  std::unordered_set<std::string> allowed_keys;
  zmq::context_t ctx{1};
  zmq::socket_t router, pull, push;
  zmq::socket_t zap;  // the ZAP handler (REP), only with an allow-list
  // Why a connection was refused as it came (docs/protocol.md, Connection limits).
  enum class Refusal { none, per_address, total, handshaking };
  // One accepted client connection of a capped endpoint.
  struct Conn {
    std::string source;       // what it counts under for max_connections_per_address
    Clock::time_point since;  // when the gateway read its accept
    bool passed = false;      // counts toward max_connections (with an allow-list: passed it)
  };
  // The open connections of one source address.
  struct Source {
    size_t open = 0;
    std::vector<int> handshaking;  // descriptors not yet past the allow-list, oldest first
  };
  // The client connections of one bound socket, counted from its libzmq monitor
  // (endpoints.max_connections and its companions). Gateway thread only once started.
  struct ConnectionGate {
    const char* what = "";    // for the log
    const char* domain = "";  // its ZAP domain
    std::string endpoint;     // the bound address, resolved
    bool tcp = false;         // connections have network addresses (not ipc)
    // With an allow-list: a connection counts toward max_connections once it passed it, and
    // until then toward max_handshaking.
    bool checked = false;
    zmq::socket_t events;                // PAIR connected to the socket's monitor
    std::unordered_map<int, Conn> open;  // the accepted connections by descriptor
    std::unordered_set<int> refused;     // shut down here; libzmq's disconnect is to come
    std::unordered_map<std::string, Source> sources;
    size_t passed = 0;  // open connections with `passed`
    // (descriptor, since) of the connections accepted in their handshake, oldest first, for
    // the handshake_timeout_ms rule (kHandshakeSlack); entries of connections gone are skipped.
    std::deque<std::pair<int, Clock::time_point>> handshakes;
    size_t handshaking() const { return open.size() - passed; }
  };
  ConnectionGate router_gate, pull_gate;
  // Per refusal reason (gateway thread only): when the next log line may be written, and the
  // refusals since the last one.
  Clock::time_point next_refusal_log[4]{};
  uint64_t refusals_unlogged[4]{};
  std::unordered_set<std::string> logged_refusals;  // gateway thread only
  std::string router_ep, pull_ep, results_ep;
  int efd = -1;
  std::thread thread;
  bool started = false, joined = false;

  std::mutex admission_mu;  // guards admission and control
  AdmissionActor admission;
  ControlActor control;

  // Shared with other threads.
  std::mutex out_mu;
  std::deque<OutMessage> inbox;
  std::atomic<bool> closed{false};
  std::atomic<bool> reading{true};
  std::atomic<bool> stop_requested{false};
  std::atomic<int64_t> grace_ms{0};
  std::atomic<int64_t> pull_credit{0};
  // Shutdown grace (refuse_submits): submits are answered `unavailable` at the edge, and
  // closing_at_us (steady clock) is when the sockets close, for the retry hint.
  std::atomic<bool> refusing{false};
  std::atomic<int64_t> closing_at_us{0};
  struct Counters {
    std::atomic<uint64_t> received{0}, decode_errors{0}, submits{0}, controls{0}, sent{0},
        dropped{0}, hwm_deferrals{0}, internal_cancels{0}, curve_allowed{0}, curve_refused{0},
        shutdown_refused{0}, intake_refused{0}, connections_refused{0}, refused_per_address{0},
        refused_total{0}, refused_handshaking{0};
    std::atomic<int64_t> connections_open{0}, connections_handshaking{0};
  } c;

  // Gateway thread only.
  struct JobEntry {
    std::string tenant;
    bool cancelled = false;
  };
  std::unordered_map<std::string, JobEntry> jobs;                   // (identity, id) -> tenant
  std::unordered_map<std::string, std::deque<OutMessage>> backlog;  // identity -> deferred sends
  std::deque<OutMessage> results_backlog;

  void wake() {
    uint64_t one = 1;
    // A full counter (EAGAIN) still leaves the fd readable, which is all that is needed.
    [[maybe_unused]] auto n = ::write(efd, &one, sizeof one);
  }

  AdmissionActor get_admission() {
    std::lock_guard<std::mutex> lk(admission_mu);
    return admission;
  }

  ControlActor get_control() {
    std::lock_guard<std::mutex> lk(admission_mu);
    return control;
  }

  // ---- sending ----

  SendResult send_router(const OutMessage& m) {
    try {
      zmq::message_t id(m.to.identity.data(), m.to.identity.size());
      if (!router.send(id, zmq::send_flags::sndmore | zmq::send_flags::dontwait))
        return SendResult::again;
      zmq::message_t body(m.bytes.data(), m.bytes.size());
      // After the identity frame is accepted the body cannot fail for HWM reasons: ROUTER
      // checks the peer's pipe on the first frame only.
      router.send(body, zmq::send_flags::dontwait);
      c.sent++;
      return SendResult::sent;
    } catch (const zmq::error_t& e) {
      if (e.num() == EHOSTUNREACH) return SendResult::gone;
      if (e.num() == EAGAIN) return SendResult::again;
      throw;
    }
  }

  // The tenant of a job, from the message or from what the gateway saw at submit.
  std::string tenant_of(const OutMessage& m, const std::string& key) {
    if (!m.tenant.empty()) return m.tenant;
    auto it = jobs.find(key);
    return it == jobs.end() ? std::string() : it->second.tenant;
  }

  void raise_cancel(const OutMessage& m) {
    if (m.id.empty()) return;
    std::string key = job_key(m.to.identity, m.id);
    auto& entry = jobs[key];
    if (entry.tenant.empty()) entry.tenant = m.tenant;
    if (entry.cancelled) return;
    entry.cancelled = true;
    KeyRequest kr;
    kr.kind = KeyRequest::cancel;
    kr.client = m.to;
    kr.id = m.id;
    kr.tenant = entry.tenant;
    kr.internal = true;
    if (auto adm = get_admission()) {
      caf::anon_send(adm, cancel_atom::value, std::move(kr));
      c.internal_cancels++;
    }
  }

  // An undeliverable message: the job loses its client, so it is cancelled unless this was its
  // last message anyway.
  void undeliverable(const OutMessage& m) {
    c.dropped++;
    if (m.terminal)
      jobs.erase(job_key(m.to.identity, m.id));
    else
      raise_cancel(m);
  }

  void sent_ok(const OutMessage& m) {
    if (m.terminal && !m.id.empty()) jobs.erase(job_key(m.to.identity, m.id));
  }

  void deliver(OutMessage&& m) {
    if (m.to.kind == ClientRef::pipeline) {
      if (!push || !(m.terminal || m.to_sink)) {
        c.dropped++;
        return;
      }
      if (results_backlog.empty() && send_push(m)) return;
      results_backlog.push_back(std::move(m));
      return;
    }
    // Once a job was cancelled for losing its client, its further chunks would only leave a gap
    // in what the client sees: they go; its terminal message is still sent.
    if (!m.terminal && !m.id.empty() && !jobs.empty()) {
      auto j = jobs.find(job_key(m.to.identity, m.id));
      if (j != jobs.end() && j->second.cancelled) {
        c.dropped++;
        return;
      }
    }
    auto bl = backlog.find(m.to.identity);
    if (bl != backlog.end()) {
      defer(bl->second, std::move(m));
      return;
    }
    switch (send_router(m)) {
      case SendResult::sent:
        sent_ok(m);
        break;
      case SendResult::gone:
        undeliverable(m);
        break;
      case SendResult::again:
        c.hwm_deferrals++;
        backlog[m.to.identity].push_back(std::move(m));
        break;
    }
  }

  void defer(std::deque<OutMessage>& q, OutMessage&& m) {
    c.hwm_deferrals++;
    // A peer this far behind is not reading: its streamed chunks go and its job is cancelled;
    // a job's terminal message is kept (one per job, so bounded by the jobs in flight). Refusals
    // that belong to no job (decode errors, `overloaded` at the edge) go too: a peer flooding
    // without reading would otherwise grow this queue for ever.
    if (q.size() >= opt.peer_backlog_limit && (!m.terminal || m.id.empty())) {
      undeliverable(m);
      return;
    }
    q.push_back(std::move(m));
  }

  bool send_push(const OutMessage& m) {
    zmq::message_t body(m.bytes.data(), m.bytes.size());
    if (!push.send(body, zmq::send_flags::dontwait)) return false;
    c.sent++;
    return true;
  }

  void retry_backlogs() {
    for (auto it = backlog.begin(); it != backlog.end();) {
      auto& q = it->second;
      bool gone = false;
      while (!q.empty()) {
        auto r = send_router(q.front());
        if (r == SendResult::again) break;
        if (r == SendResult::gone) {
          gone = true;
          break;
        }
        sent_ok(q.front());
        q.pop_front();
      }
      if (gone) {
        for (auto& m : q) undeliverable(m);
        q.clear();
      }
      it = q.empty() ? backlog.erase(it) : std::next(it);
    }
    while (!results_backlog.empty() && send_push(results_backlog.front()))
      results_backlog.pop_front();
  }

  void drain_inbox() {
    std::deque<OutMessage> batch;
    {
      std::lock_guard<std::mutex> lk(out_mu);
      batch.swap(inbox);
    }
    for (auto& m : batch) deliver(std::move(m));
  }

  bool outbound_empty() {
    std::lock_guard<std::mutex> lk(out_mu);
    return inbox.empty() && backlog.empty() && results_backlog.empty();
  }

  // ---- receiving ----

  void reply_error(const ClientRef& to, const wire::DecodeError& e) {
    c.decode_errors++;
    // id left empty in the envelope: a refused message must not touch the state of a running
    // job that happens to share its id.
    deliver(OutMessage{to, "", "", true, wire::encode_server(wire::to_error(e))});
  }

  // A submit during the shutdown grace: answered here, not by admission, so that it needs no
  // PULL credit (the router grants none while draining) and the client can fail over at once.
  // The envelope has no id, as for decode errors: a refusal must not touch a running job that
  // shares the id.
  void refuse_submit(const ClientRef& to, const wire::Submit& s) {
    c.shutdown_refused++;
    auto now =
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch());
    auto left_ms = (closing_at_us.load() - now.count()) / 1000;
    wire::Error e{s.id, s.tenant, ErrorCode::unavailable,
                  "the server is shutting down: submit to another server, or retry after "
                  "retry_after_ms",
                  static_cast<uint32_t>(std::clamp<int64_t>(left_ms, 1, UINT32_MAX))};
    deliver(OutMessage{to, "", "", true, wire::encode_server(e)});
  }

  // Admission's mailbox is at its bound (EndpointConfig::max_waiting_requests/_bytes): the
  // request is answered `overloaded` here and goes no further. As for decode errors the envelope
  // has no id: a refusal must not touch a running job that shares it.
  bool intake_full(const ClientRef& to, const std::string& id, const std::string& tenant) {
    if (!opt.intake) return false;
    const uint64_t n = opt.intake->waiting();
    if (n < static_cast<uint64_t>(ep.max_waiting_requests) &&
        opt.intake->waiting_bytes() < static_cast<uint64_t>(ep.max_waiting_bytes))
      return false;
    c.intake_refused++;
    wire::Error e{id, tenant, ErrorCode::overloaded,
                  "the server is behind on admitting requests (" + std::to_string(n) +
                      " waiting): retry after retry_after_ms",
                  kIntakeRetryAfterMs};
    deliver(OutMessage{to, "", "", true, wire::encode_server(e)});
    return true;
  }

  // Counts a request about to go to admission into the meter; returns its metered size.
  uint32_t meter_in(size_t wire_bytes) {
    if (!opt.intake) return 0;
    const auto b = static_cast<uint32_t>(std::clamp<size_t>(wire_bytes, 1, UINT32_MAX));
    opt.intake->handed_bytes.fetch_add(b, std::memory_order_relaxed);
    opt.intake->handed.fetch_add(1, std::memory_order_relaxed);
    return b;
  }

  void handle(const ClientRef& from, const void* data, size_t size) {
    auto decoded = wire::decode_client(data, size, opt.limits);
    // One handler per alternative and no catch-all: a client message type added to the wire
    // protocol does not compile here until it is handled.
    std::visit(Overloaded{
                   [&](wire::DecodeError& err) { reply_error(from, err); },
                   [&](wire::ClientMessage& msg) {
                     std::visit(Overloaded{
                                    [&](wire::Ping& p) { on_ping(from, p); },
                                    [&](wire::Control& ctl) { on_control(from, ctl); },
                                    [&](wire::Submit& sub) { on_submit(from, sub, size); },
                                    [&](wire::Cancel& x) { on_cancel(from, x, size); },
                                    [&](wire::Status& st) { on_status(from, st, size); },
                                    [&](wire::ToolResult& t) { on_tool_result(from, t, size); },
                                },
                                msg);
                   },
               },
               decoded);
  }

  void on_ping(const ClientRef& from, const wire::Ping& p) {
    if (from.kind == ClientRef::pipeline) {
      reply_error(from, {ErrorCode::bad_request, "ping needs the request endpoint", "", ""});
      return;
    }
    deliver(OutMessage{from, "", "", false, wire::encode_server(wire::Pong{p.seq})});
  }

  void on_control(const ClientRef& from, wire::Control& ctl) {
    if (from.kind == ClientRef::pipeline) {
      reply_error(from, {ErrorCode::bad_request, "control needs the request endpoint", "", ""});
      return;
    }
    auto target = get_control();
    if (!target) {
      reply_error(from, {ErrorCode::unavailable, "control commands are not available", "", ""});
      return;
    }
    c.controls++;
    ControlRequest req;
    req.client = from;
    req.token = std::move(ctl.token);
    req.command = std::move(ctl.command);
    req.policy = std::move(ctl.policy);
    caf::anon_send(target, control_atom::value, std::move(req));
  }

  void on_submit(const ClientRef& from, wire::Submit& s, size_t size) {
    const bool pipeline = from.kind == ClientRef::pipeline;
    auto adm = get_admission();
    if (refusing) {
      refuse_submit(from, s);
      return;
    }
    if (pipeline) pull_credit--;
    if (!adm) {
      reply_error(from, {ErrorCode::unavailable, "server is starting", s.id, s.tenant});
      return;
    }
    uint32_t metered = 0;
    if (!pipeline) {
      if (intake_full(from, s.id, s.tenant)) return;
      metered = meter_in(size);
      auto& entry = jobs[job_key(from.identity, s.id)];
      entry.tenant = s.tenant;
      entry.cancelled = false;
    }
    c.submits++;
    SubmitRequest req = to_request(std::move(s), from);
    req.metered_bytes = metered;
    caf::anon_send(adm, submit_atom::value, std::move(req));
  }

  void on_cancel(const ClientRef& from, wire::Cancel& x, size_t size) {
    KeyRequest kr;
    kr.client = from;
    kr.kind = KeyRequest::cancel;
    kr.id = std::move(x.id);
    kr.tenant = std::move(x.tenant);
    kr.token = std::move(x.token);
    key_request(std::move(kr), size);
  }

  void on_status(const ClientRef& from, wire::Status& st, size_t size) {
    if (from.kind == ClientRef::pipeline) {
      reply_error(from,
                  {ErrorCode::bad_request, "status needs the request endpoint", st.id, st.tenant});
      return;
    }
    KeyRequest kr;
    kr.client = from;
    kr.kind = KeyRequest::status;
    kr.id = std::move(st.id);
    kr.tenant = std::move(st.tenant);
    kr.token = std::move(st.token);
    key_request(std::move(kr), size);
  }

  // A cancel or status for admission (`size`: its wire size, for the intake meter).
  // A tool's result for a waiting program: from any client, the pipeline's tool workers included.
  void on_tool_result(const ClientRef& from, wire::ToolResult& t, size_t size) {
    auto adm = get_admission();
    if (!adm) {
      reply_error(from, {ErrorCode::unavailable, "server is starting", t.id, t.tenant});
      return;
    }
    ToolResultRequest r;
    r.client = from;
    if (from.kind != ClientRef::pipeline) {
      if (intake_full(from, t.id, t.tenant)) return;
      r.metered_bytes = meter_in(size);
    }
    r.id = std::move(t.id);
    r.tenant = std::move(t.tenant);
    r.token = std::move(t.token);
    r.call = std::move(t.call);
    r.content = std::move(t.content);
    caf::anon_send(adm, tool_atom::value, std::move(r));
  }

  void key_request(KeyRequest kr, size_t size) {
    auto adm = get_admission();
    if (!adm) {
      reply_error(kr.client, {ErrorCode::unavailable, "server is starting", kr.id, kr.tenant});
      return;
    }
    if (kr.client.kind != ClientRef::pipeline) {
      if (intake_full(kr.client, kr.id, kr.tenant)) return;
      kr.metered_bytes = meter_in(size);
    }
    if (kr.kind == KeyRequest::cancel)
      caf::anon_send(adm, cancel_atom::value, std::move(kr));
    else
      caf::anon_send(adm, status_atom::value, std::move(kr));
  }

  void read_router() {
    for (int i = 0; i < kReadBatch && reading; ++i) {
      zmq::message_t ident;
      if (!router.recv(ident, zmq::recv_flags::dontwait)) return;
      if (!ident.more()) continue;  // cannot happen on ROUTER; nothing to answer
      zmq::message_t body;
      if (!router.recv(body, zmq::recv_flags::dontwait)) return;
      bool multipart = false;
      while (body.more()) {
        multipart = true;
        zmq::message_t extra;
        if (!router.recv(extra, zmq::recv_flags::dontwait)) break;
        body.move(extra);
      }
      c.received++;
      ClientRef from{ClientRef::router, ident.to_string()};
      if (multipart) {
        reply_error(from, {ErrorCode::bad_request,
                           "multi-part message: send exactly one frame (REQ sockets are not "
                           "supported)",
                           "", ""});
        continue;
      }
      handle(from, body.data(), body.size());
    }
  }

  void read_pull() {
    static const ClientRef from{ClientRef::pipeline, ""};
    for (int i = 0; i < kReadBatch && reading && (pull_credit > 0 || refusing); ++i) {
      zmq::message_t body;
      if (!pull.recv(body, zmq::recv_flags::dontwait)) return;
      bool multipart = false;
      while (body.more()) {
        multipart = true;
        zmq::message_t extra;
        if (!pull.recv(extra, zmq::recv_flags::dontwait)) break;
        body.move(extra);
      }
      c.received++;
      if (multipart) {
        reply_error(from,
                    {ErrorCode::bad_request, "multi-part message: send exactly one frame", "", ""});
        continue;
      }
      handle(from, body.data(), body.size());
    }
  }

  // ---- the ZAP handler (RFC 27) ----

  // Answers the handshake requests libzmq queued: 200 for a listed CURVE key, 400 otherwise, and
  // for a listed key on an endpoint that has max_connections connections past the allow-list
  // 500 (libzmq sends the client an ERROR, on which the client closes the connection and
  // reconnects later; libzmq 4.3 answers a 300 with silence and keeps the connection until
  // handshake_timeout_ms). Every request gets its reply (a REP socket that skipped one could read
  // no further).
  void serve_zap() {
    // libzmq reported each connection's accept before it asked about its handshake: read those
    // reports first, so that the connection is known here.
    for (auto* g : {&router_gate, &pull_gate})
      if (g->events)
        while (serve_connections(*g) == kEventBatch) {
        }
    for (int i = 0; i < kReadBatch; ++i) {
      std::vector<zmq::message_t> frames;
      zmq::message_t f;
      if (!zap.recv(f, zmq::recv_flags::dontwait)) return;
      bool more = f.more();
      frames.push_back(std::move(f));
      while (more) {
        zmq::message_t x;
        if (!zap.recv(x, zmq::recv_flags::dontwait)) break;
        more = x.more();
        frames.push_back(std::move(x));
      }
      // version, request id, domain, address, identity, mechanism, credentials...
      std::string request_id = frames.size() > 1 ? frames[1].to_string() : std::string();
      std::string status = "400", text = "client key not allowed", user;
      if (frames.size() < 7 || frames[0].to_string() != "1.0") {
        text = "malformed ZAP request";
      } else if (frames[5].to_string() != "CURVE" || frames[6].size() != curve::kKeyBytes) {
        text = "only CURVE clients are allowed";
      } else if (allowed_keys.count(frames[6].to_string())) {
        status = "200";
        text = "OK";
        char z85[curve::kZ85KeyChars + 1];
        if (zmq_z85_encode(z85, static_cast<const uint8_t*>(frames[6].data()), curve::kKeyBytes))
          user = z85;  // the connection's User-Id: the client's public key
        // A listed client still needs room on its endpoint.
        if (auto* g = gate_of(frames[2].to_string()); g && g->checked) {
          if (const char* why = pass(*g, frames[3].to_string())) {
            // A connection refused as it came is ended already (300: no ERROR needed).
            status = why == kTooManyConnections ? "500" : "300";
            text = why;
            user.clear();
          }
        }
      }
      if (status == "200") {
        c.curve_allowed++;
      } else if (status == "400") {
        c.curve_refused++;
        std::string who = frames.size() > 3 ? frames[3].to_string() : std::string("?");
        std::string key = frames.size() > 6 ? frames[6].to_string() : std::string();
        if (logged_refusals.size() < kMaxLoggedRefusals && logged_refusals.insert(key).second) {
          char z85[curve::kZ85KeyChars + 1] = "?";
          if (key.size() == curve::kKeyBytes)
            zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(key.data()), curve::kKeyBytes);
          log::warn("CURVE handshake refused from " + who + " (" + text + "; client key " + z85 +
                    ")");
        }
      }
      const std::string reply[] = {"1.0", request_id, status, text, user, ""};
      for (size_t k = 0; k < 6; ++k)
        zap.send(zmq::buffer(reply[k]),
                 k + 1 < 6 ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }

  // ---- connections (endpoints.max_connections and its companions) ----

  // Watches the connections of `s`, before it binds so that none is missed: libzmq's monitor
  // reports each accepted connection and each disconnect, with the connection's descriptor, on
  // an inproc PAIR that the gateway loop polls.
  void watch_connections(zmq::socket_t& s, ConnectionGate& g, const char* what, const char* name) {
    const std::string addr = std::string("inproc://switchyard.connections.") + name;
    if (zmq_socket_monitor(s.handle(), addr.c_str(), ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) !=
        0)
      throw std::runtime_error(std::string("cannot watch the connections of the ") + what + ": " +
                               zmq_strerror(zmq_errno()));
    g.what = what;
    g.events = zmq::socket_t(ctx, zmq::socket_type::pair);
    // libzmq sends each event from its I/O thread with a blocking send: at a receive mark here
    // every connection of the context would stall until the gateway caught up, so there is none
    // (an event is a few bytes, and every wake-up reads them).
    g.events.set(zmq::sockopt::rcvhwm, 0);
    g.events.set(zmq::sockopt::linger, 0);
    g.events.connect(addr);
  }

  // The gate whose socket has this ZAP domain (nullptr: the results socket, which is not capped).
  ConnectionGate* gate_of(const std::string& domain) {
    for (auto* g : {&router_gate, &pull_gate})
      if (g->events && domain == g->domain) return g;
    return nullptr;
  }

  static size_t cap_of(int64_t limit) { return static_cast<size_t>(std::max<int64_t>(limit, 0)); }

  // Whether a connection from `source` may join `g` now (the caps in the order they are said).
  Refusal admit(const ConnectionGate& g, const std::string& source) const {
    const size_t per_address = cap_of(ep.max_connections_per_address);
    if (per_address != 0 && !source.empty()) {
      auto it = g.sources.find(source);
      if (it != g.sources.end() && it->second.open >= per_address) return Refusal::per_address;
    }
    const size_t cap = cap_of(ep.max_connections);
    if (!g.checked) return cap != 0 && g.open.size() >= cap ? Refusal::total : Refusal::none;
    if (cap != 0 && g.passed >= cap) return Refusal::total;
    const size_t handshaking = cap_of(ep.max_handshaking);
    if (handshaking != 0 && g.handshaking() >= handshaking) return Refusal::handshaking;
    return Refusal::none;
  }

  void add(ConnectionGate& g, int fd, std::string source) {
    const auto now = Clock::now();
    auto& src = g.sources[source];
    ++src.open;
    if (g.checked) {
      src.handshaking.push_back(fd);
      if (ep.handshake_timeout_ms > 0) g.handshakes.emplace_back(fd, now);
    } else {
      ++g.passed;
    }
    g.open[fd] = Conn{std::move(source), now, !g.checked};
  }

  void forget(ConnectionGate& g, int fd) {
    if (g.refused.erase(fd)) return;
    auto it = g.open.find(fd);
    if (it == g.open.end()) return;
    auto src = g.sources.find(it->second.source);
    if (it->second.passed) {
      --g.passed;
    } else {
      auto& h = src->second.handshaking;
      h.erase(std::find(h.begin(), h.end(), fd));
    }
    if (--src->second.open == 0) g.sources.erase(src);
    g.open.erase(it);
  }

  void mark_passed(ConnectionGate& g, int fd) {
    auto it = g.open.find(fd);
    if (it == g.open.end() || it->second.passed) return;
    it->second.passed = true;
    ++g.passed;
    auto& h = g.sources[it->second.source].handshaking;
    h.erase(std::find(h.begin(), h.end(), fd));
  }

  // A connection still open kHandshakeSlack past handshake_timeout_ms has passed the allow-list
  // (libzmq drops one that has not finished its handshake by then): it counts so, which also
  // corrects a wrong guess of pass() among the connections of one source.
  void settle_handshakes(ConnectionGate& g) {
    const auto limit = std::chrono::milliseconds(ep.handshake_timeout_ms) + kHandshakeSlack;
    const auto now = Clock::now();
    while (!g.handshakes.empty() && now - g.handshakes.front().second >= limit) {
      const auto [fd, since] = g.handshakes.front();
      g.handshakes.pop_front();
      auto it = g.open.find(fd);
      if (it != g.open.end() && it->second.since == since) mark_passed(g, fd);
    }
  }

  // A listed client's handshake on a checked endpoint: its connection (one in its handshake from
  // the same source; a ZAP request names no descriptor, so the one that has received the most,
  // else the oldest) now counts toward max_connections. nullptr when it may pass, else why not:
  // the endpoint has max_connections connections that passed (a `total` refusal), or none of
  // the source's connections is in its handshake (the connection was refused as it came, and
  // libzmq read its handshake before it saw the connection end).
  const char* pass(ConnectionGate& g, const std::string& address) {
    settle_handshakes(g);
    const std::string source = g.tcp ? source_of_text(address) : std::string();
    auto src = g.sources.find(source);
    if (src == g.sources.end() || src->second.handshaking.empty()) return "connection refused";
    const size_t cap = cap_of(ep.max_connections);
    if (cap != 0 && g.passed >= cap) {
      count_refusal(g, Refusal::total, source);
      return kTooManyConnections;
    }
    int best = -1;
    uint64_t most = 0;
    for (int fd : src->second.handshaking) {
      const uint64_t n = g.tcp ? bytes_received(fd) : 0;
      if (best < 0 || n > most) {
        best = fd;
        most = n;
      }
    }
    mark_passed(g, best);
    publish_counts();
    return nullptr;
  }

  void publish_counts() {
    c.connections_open = static_cast<int64_t>(router_gate.open.size() + pull_gate.open.size());
    c.connections_handshaking =
        static_cast<int64_t>(router_gate.handshaking() + pull_gate.handshaking());
  }

  // Counts (and logs) a refusal.
  void count_refusal(const ConnectionGate& g, Refusal why, const std::string& source) {
    c.connections_refused++;
    switch (why) {
      case Refusal::per_address:
        c.refused_per_address++;
        break;
      case Refusal::total:
        c.refused_total++;
        break;
      case Refusal::handshaking:
        c.refused_handshaking++;
        break;
      case Refusal::none:
        break;
    }
    log_refusal(g, why, source);
  }

  // Counts what the monitor reported, and shuts down each connection accepted past a cap (the
  // accepted socket's peer address for max_connections_per_address). shutdown(), not close():
  // the descriptor stays libzmq's, which sees the end of the stream, reports the disconnect and
  // frees the connection's buffers and pipe itself. Returns how many reports it read (at most
  // kEventBatch).
  int serve_connections(ConnectionGate& g) {
    struct Event {
      uint16_t what;
      int fd;
    };
    std::vector<Event> events;
    int read = 0;
    for (; read < kEventBatch; ++read) {
      zmq::message_t head;
      if (!g.events.recv(head, zmq::recv_flags::dontwait)) break;
      // [event (16 bits) + value (32 bits: the descriptor), address]; the frames of a message
      // arrive together.
      for (bool more = head.more(); more;) {
        zmq::message_t rest;
        if (!g.events.recv(rest, zmq::recv_flags::dontwait)) break;
        more = rest.more();
      }
      if (head.size() < 6) continue;
      uint16_t what;
      uint32_t value;
      std::memcpy(&what, head.data(), sizeof what);
      std::memcpy(&value, static_cast<const char*>(head.data()) + sizeof what, sizeof value);
      events.push_back({what, static_cast<int>(value)});
    }
    for (size_t i = 0; i < events.size(); ++i) {
      const int fd = events[i].fd;
      if (events[i].what == ZMQ_EVENT_DISCONNECTED) {
        forget(g, fd);
        continue;
      }
      if (events[i].what != ZMQ_EVENT_ACCEPTED) continue;
      // Already gone by itself (its disconnect is in this batch): its descriptor may be reused,
      // and so may one that is no longer a connection of this endpoint.
      const bool gone = std::any_of(
          events.begin() + static_cast<std::ptrdiff_t>(i) + 1, events.end(),
          [fd](const Event& e) { return e.what == ZMQ_EVENT_DISCONNECTED && e.fd == fd; });
      const bool ours = !gone && accepted_on(fd, g.endpoint);
      std::string source = ours && g.tcp ? peer_source(fd) : std::string();
      if (g.checked) settle_handshakes(g);
      const Refusal why = admit(g, source);
      if (why == Refusal::none) {
        add(g, fd, std::move(source));
        continue;
      }
      g.refused.insert(fd);
      if (ours) ::shutdown(fd, SHUT_RDWR);
      count_refusal(g, why, source);
    }
    if (g.checked) settle_handshakes(g);
    publish_counts();
    return read;
  }

  void log_refusal(const ConnectionGate& g, Refusal why, const std::string& source) {
    const auto k = static_cast<size_t>(why);
    ++refusals_unlogged[k];
    const auto now = Clock::now();
    if (now < next_refusal_log[k]) return;
    std::string line = std::string("refused a connection to the ") + g.what + " " + g.endpoint;
    switch (why) {
      case Refusal::per_address:
        line += " from " + source + ": " + std::to_string(g.sources.at(source).open) +
                " connections open from that address, endpoints.max_connections_per_address "
                "is " +
                std::to_string(ep.max_connections_per_address);
        break;
      case Refusal::total:
        line += g.checked ? ": " + std::to_string(g.passed) + " connections past the allow-list"
                          : ": " + std::to_string(g.open.size()) + " connections open";
        line += ", endpoints.max_connections is " + std::to_string(ep.max_connections);
        break;
      case Refusal::handshaking:
        line += ": " + std::to_string(g.handshaking()) +
                " connections in their handshake, endpoints.max_handshaking is " +
                std::to_string(ep.max_handshaking);
        break;
      case Refusal::none:
        break;
    }
    if (refusals_unlogged[k] > 1)
      line += " (" + std::to_string(refusals_unlogged[k]) + " refused since the last report)";
    log::warn(line);
    refusals_unlogged[k] = 0;
    next_refusal_log[k] = now + kRefusalLogPeriod;
  }

  // Closes every socket (idempotent). The monitors stop first: libzmq's I/O thread would block
  // sending an event to a PAIR that is no longer read.
  void close_sockets(int linger) {
    for (auto* s : {&router, &pull})
      if (*s) zmq_socket_monitor(s->handle(), nullptr, 0);
    for (auto* s : {&router, &pull, &push, &zap}) {
      if (*s) {
        s->set(zmq::sockopt::linger, linger);
        s->close();
      }
    }
    router_gate.events.close();
    pull_gate.events.close();
  }

  // ---- the loop ----

  void run() {
    std::optional<Clock::time_point> drain_until;
    for (;;) {
      if (stop_requested && !drain_until) {
        // During a shutdown the sockets are still read while the last replies go out, so that
        // late submits get their `unavailable` instead of silence.
        if (!refusing) reading = false;
        drain_until = Clock::now() + std::chrono::milliseconds(grace_ms.load());
      }
      bool pull_open = pull && reading && (pull_credit > 0 || refusing) &&
                       results_backlog.size() < opt.results_backlog_limit;
      std::vector<zmq::pollitem_t> items;
      items.push_back({nullptr, efd, ZMQ_POLLIN, 0});
      items.push_back({router.handle(), 0, static_cast<short>(reading ? ZMQ_POLLIN : 0), 0});
      int pull_i = -1, push_i = -1, zap_i = -1, router_gate_i = -1, pull_gate_i = -1;
      // Connection events are read whatever else happens (draining included), so that the
      // counts stay right and a connection past the cap is closed as it comes.
      if (router_gate.events) {
        router_gate_i = static_cast<int>(items.size());
        items.push_back({router_gate.events.handle(), 0, ZMQ_POLLIN, 0});
      }
      if (pull_gate.events) {
        pull_gate_i = static_cast<int>(items.size());
        items.push_back({pull_gate.events.handle(), 0, ZMQ_POLLIN, 0});
      }
      // Handshakes are answered even while draining: a sink may still be connecting for results.
      if (zap) {
        zap_i = static_cast<int>(items.size());
        items.push_back({zap.handle(), 0, ZMQ_POLLIN, 0});
      }
      if (pull_open) {
        pull_i = static_cast<int>(items.size());
        items.push_back({pull.handle(), 0, ZMQ_POLLIN, 0});
      }
      if (push && !results_backlog.empty()) {
        push_i = static_cast<int>(items.size());
        items.push_back({push.handle(), 0, ZMQ_POLLOUT, 0});
      }
      std::chrono::milliseconds timeout{-1};
      if (!backlog.empty()) timeout = kRetryPeriod;
      if (drain_until) {
        auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(*drain_until - Clock::now());
        left = std::max(left, std::chrono::milliseconds(0));
        timeout = timeout.count() < 0 ? left : std::min(timeout, left);
      }
      zmq::poll(items.data(), items.size(), timeout);

      if (items[0].revents & ZMQ_POLLIN) {
        uint64_t v;
        [[maybe_unused]] auto n = ::read(efd, &v, sizeof v);
      }
      if (zap_i >= 0 && (items[zap_i].revents & ZMQ_POLLIN)) serve_zap();
      if (router_gate_i >= 0 && (items[router_gate_i].revents & ZMQ_POLLIN))
        serve_connections(router_gate);
      if (pull_gate_i >= 0 && (items[pull_gate_i].revents & ZMQ_POLLIN))
        serve_connections(pull_gate);
      drain_inbox();
      if (!backlog.empty() || (push_i >= 0 && (items[push_i].revents & ZMQ_POLLOUT)))
        retry_backlogs();
      if (items[1].revents & ZMQ_POLLIN) read_router();
      if (pull_i >= 0 && (items[pull_i].revents & ZMQ_POLLIN)) read_pull();

      if (drain_until && (outbound_empty() || Clock::now() >= *drain_until)) break;
    }
    closed = true;
    // What is still queued after the grace period is dropped; ZeroMQ gets a short linger for
    // what it already holds.
    close_sockets(static_cast<int>(std::clamp<int64_t>(grace_ms.load(), 0, kMaxLingerMs)));
  }
};

Gateway::Gateway(EndpointConfig endpoints, GatewayOptions options) : impl_(new Impl) {
  impl_->ep = std::move(endpoints);
  impl_->opt = options;
  impl_->opt.limits.max_message_bytes = static_cast<size_t>(impl_->ep.max_message_bytes);
  impl_->pull_credit = options.initial_pull_credit;
  impl_->curve_secret = load_curve_secret(impl_->ep);
  impl_->allowed_keys = load_allowed_keys(impl_->ep);
  if (!impl_->allowed_keys.empty())
    log::info("CURVE client allow-list '" + impl_->ep.curve_allowed_keys +
              "': " + std::to_string(impl_->allowed_keys.size()) + " keys");
  impl_->efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl_->efd < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
}

Gateway::~Gateway() {
  stop(std::chrono::milliseconds(0));
  impl_->close_sockets(0);  // a start() that threw left some open
  if (impl_->efd >= 0) ::close(impl_->efd);
}

void Gateway::set_admission(AdmissionActor admission) {
  std::lock_guard<std::mutex> lk(impl_->admission_mu);
  impl_->admission = std::move(admission);
}

void Gateway::set_control(ControlActor control) {
  std::lock_guard<std::mutex> lk(impl_->admission_mu);
  impl_->control = std::move(control);
}

void Gateway::start() {
  auto& d = *impl_;
  if (d.started) return;
  // The handler is bound before any CURVE socket: no handshake may pass before it is there
  // (without a handler libzmq lets every client that knows the server key in).
  if (!d.allowed_keys.empty()) {
    d.zap = zmq::socket_t(d.ctx, zmq::socket_type::rep);
    d.zap.set(zmq::sockopt::linger, 0);
    bind_named(d.zap, kZapEndpoint, "CURVE allow-list (ZAP) handler");
  }
  auto common = [&](zmq::socket_t& s, const char* domain) {
    s.set(zmq::sockopt::sndhwm, d.ep.sndhwm);
    s.set(zmq::sockopt::rcvhwm, d.ep.rcvhwm);
    s.set(zmq::sockopt::linger, 0);
    // A connection that never completes its handshake is dropped (EndpointConfig says why).
    s.set(zmq::sockopt::handshake_ivl, static_cast<int>(d.ep.handshake_timeout_ms));
    // Dead peers' connections are found by the kernel (EndpointConfig::tcp_keepalive_idle_s).
    if (d.ep.tcp_keepalive_idle_s > 0) {
      s.set(zmq::sockopt::tcp_keepalive, 1);
      s.set(zmq::sockopt::tcp_keepalive_idle, static_cast<int>(d.ep.tcp_keepalive_idle_s));
      s.set(zmq::sockopt::tcp_keepalive_intvl, kKeepaliveIntervalS);
      s.set(zmq::sockopt::tcp_keepalive_cnt, kKeepaliveProbes);
    }
    // libzmq 4.3 never runs heartbeats on a ZMTP 1.0/2.0 connection (and newer libzmq no longer
    // drops those after handshake_ivl either), so such a peer could hold a half-sent frame for
    // ever; libzmq refuses those versions on a socket with a ZAP domain. With plain TCP no ZAP
    // handler is bound, and without one (and without ZMQ_ZAP_ENFORCE_DOMAIN) libzmq lets every
    // ZMTP 3 peer in as before. CURVE sockets refuse the old versions anyway.
    if (d.curve_secret.empty()) s.set(zmq::sockopt::zap_domain, "switchyard");
    // With an allow-list each socket names itself to the ZAP handler, which counts a passing
    // connection toward its endpoint's cap.
    if (!d.allowed_keys.empty()) s.set(zmq::sockopt::zap_domain, domain);
    // Every bound socket is the CURVE server, the PUSH results socket too: sinks connect to it
    // as CURVE clients with the same public key (docs/security.md).
    if (!d.curve_secret.empty()) curve::make_server(s.handle(), d.curve_secret);
  };
  d.router = zmq::socket_t(d.ctx, zmq::socket_type::router);
  common(d.router, kRequestDomain);
  // Heartbeats only here (EndpointConfig: libzmq's heartbeat timer aborts the process when a
  // peer resets a connection whose input is paused at the high-water mark; the pipeline sockets
  // are paused by backpressure in normal operation). With them, no receive mark, so that the
  // input of a ROUTER connection is never paused: the gateway reads this socket at full speed.
  if (d.ep.heartbeat_ivl_ms > 0) {
    d.router.set(zmq::sockopt::rcvhwm, 0);
    d.router.set(zmq::sockopt::heartbeat_ivl, static_cast<int>(d.ep.heartbeat_ivl_ms));
    d.router.set(zmq::sockopt::heartbeat_timeout, static_cast<int>(d.ep.heartbeat_timeout_ms));
    d.router.set(zmq::sockopt::heartbeat_ttl, static_cast<int>(d.ep.heartbeat_ttl_ms));
  }
  d.router.set(zmq::sockopt::router_mandatory, 1);
  d.router.set(zmq::sockopt::maxmsgsize, d.ep.max_message_bytes);
  d.watch_connections(d.router, d.router_gate, "request endpoint", "router");
  bind_named(d.router, d.ep.bind, "request endpoint");
  d.router_ep = d.router.get(zmq::sockopt::last_endpoint);
  d.router_gate.endpoint = d.router_ep;
  d.router_gate.domain = kRequestDomain;
  if (!d.ep.pull.empty()) {
    d.pull = zmq::socket_t(d.ctx, zmq::socket_type::pull);
    common(d.pull, kPipelineDomain);
    d.pull.set(zmq::sockopt::maxmsgsize, d.ep.max_message_bytes);
    d.watch_connections(d.pull, d.pull_gate, "pipeline input", "pull");
    bind_named(d.pull, d.ep.pull, "pipeline input");
    d.pull_ep = d.pull.get(zmq::sockopt::last_endpoint);
    d.pull_gate.endpoint = d.pull_ep;
    d.pull_gate.domain = kPipelineDomain;
  }
  for (auto* g : {&d.router_gate, &d.pull_gate}) {
    g->tcp = g->endpoint.rfind("tcp://", 0) == 0;
    g->checked = !d.allowed_keys.empty();
  }
  // With an allow-list an endpoint holds up to max_connections that passed it and
  // max_handshaking in their handshake (0: unbounded, so only the first part is known).
  int64_t per_endpoint = d.ep.max_connections;
  if (!d.allowed_keys.empty() && per_endpoint > 0)
    per_endpoint += std::max<int64_t>(d.ep.max_handshaking, 0);
  fit_descriptor_limit(per_endpoint, d.pull ? 2 : 1);
  if (!d.ep.results.empty()) {
    d.push = zmq::socket_t(d.ctx, zmq::socket_type::push);
    common(d.push, kResultsDomain);
    // Sinks send no messages, only ZMTP commands: what a peer sends here is never read, so
    // it is bounded to one small message per connection instead of rcvhwm frames of up to
    // what the peer claims.
    d.push.set(zmq::sockopt::maxmsgsize, kResultsMaxInbound);
    d.push.set(zmq::sockopt::rcvhwm, 1);
    bind_named(d.push, d.ep.results, "pipeline results");
    d.results_ep = d.push.get(zmq::sockopt::last_endpoint);
  }
  d.started = true;
  d.thread = std::thread([&d] { d.run(); });
}

void Gateway::stop_reading() {
  impl_->reading = false;
  impl_->wake();
}

void Gateway::refuse_submits(std::chrono::steady_clock::time_point closing_at) {
  auto& d = *impl_;
  d.closing_at_us =
      std::chrono::duration_cast<std::chrono::microseconds>(closing_at.time_since_epoch()).count();
  d.refusing = true;
  d.wake();
}

void Gateway::stop(std::chrono::milliseconds grace) {
  auto& d = *impl_;
  if (d.started && !d.joined) {
    d.grace_ms = grace.count();
    d.stop_requested = true;
    d.wake();
    d.thread.join();
    d.joined = true;
  }
  d.closed = true;
  set_admission(AdmissionActor());
  set_control(ControlActor());
  std::lock_guard<std::mutex> lk(d.out_mu);
  d.inbox.clear();
}

void Gateway::post(OutMessage m) {
  auto& d = *impl_;
  if (d.closed) return;
  bool was_empty;
  {
    std::lock_guard<std::mutex> lk(d.out_mu);
    was_empty = d.inbox.empty();
    d.inbox.push_back(std::move(m));
  }
  // One wake-up per batch: the loop drains the whole inbox each time it wakes.
  if (was_empty) d.wake();
}

void Gateway::add_pull_credit(uint32_t n) {
  impl_->pull_credit += n;
  impl_->wake();
}

uint32_t Gateway::take_pull_credit(uint32_t max) {
  int64_t have = impl_->pull_credit.load();
  int64_t take = 0;
  do {
    take = std::clamp<int64_t>(have, 0, max);
    if (take == 0) return 0;
  } while (!impl_->pull_credit.compare_exchange_weak(have, have - take));
  return static_cast<uint32_t>(take);
}

std::string Gateway::endpoint() const {
  return impl_->router_ep;
}
std::string Gateway::pull_endpoint() const {
  return impl_->pull_ep;
}
std::string Gateway::results_endpoint() const {
  return impl_->results_ep;
}

GatewayStats Gateway::stats() const {
  auto& c = impl_->c;
  GatewayStats s;
  s.received = c.received;
  s.decode_errors = c.decode_errors;
  s.submits = c.submits;
  s.controls = c.controls;
  s.sent = c.sent;
  s.dropped = c.dropped;
  s.hwm_deferrals = c.hwm_deferrals;
  s.internal_cancels = c.internal_cancels;
  s.curve_allowed = c.curve_allowed;
  s.curve_refused = c.curve_refused;
  s.shutdown_refused = c.shutdown_refused;
  s.intake_refused = c.intake_refused;
  s.connections_refused = c.connections_refused;
  s.refused_per_address = c.refused_per_address;
  s.refused_total = c.refused_total;
  s.refused_handshaking = c.refused_handshaking;
  s.connections_open = c.connections_open;
  s.connections_handshaking = c.connections_handshaking;
  s.pull_credit = impl_->pull_credit;
  return s;
}

}  // namespace sy
