// The request endpoint's intake under a flood, and the limits on connections: requests that
// would wait in front of admission past endpoints.max_waiting_requests are answered `overloaded`
// by the gateway, every submit still gets exactly one answer; every connection has TCP keepalive
// so that a dead peer's buffers are freed; and a connection past endpoints.max_connections is
// closed as it comes, so that peers stalled mid-frame pin at most max_connections frames (the
// descriptor limit is raised to fit the caps).
#include <sys/resource.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "clients/cpp/client.hpp"
#include "ingress/codec.hpp"
#include "raw_peer.hpp"
#include "server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_intake)

using namespace std::chrono_literals;
using sy::it::RawPeer;

namespace {

std::optional<sy::wire::ServerMessage> recv_message(zmq::socket_t& sock,
                                                    std::chrono::milliseconds wait) {
  zmq::pollitem_t item{sock.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, wait) <= 0) return std::nullopt;
  zmq::message_t msg;
  if (!sock.recv(msg, zmq::recv_flags::dontwait)) return std::nullopt;
  auto d = sy::wire::decode_server(msg.data(), msg.size());
  if (auto* m = std::get_if<sy::wire::ServerMessage>(&d)) return std::move(*m);
  return std::nullopt;
}

// The port of a tcp://HOST:PORT endpoint.
unsigned port_of(const std::string& ep) {
  return static_cast<unsigned>(std::stoul(ep.substr(ep.rfind(':') + 1)));
}

// timer_active of every established IPv4 TCP socket whose local port is `port`, from
// /proc/net/tcp (2: the keepalive timer runs).
std::vector<int> timers_of_local_port(unsigned port) {
  std::ifstream f("/proc/net/tcp");
  std::string line;
  std::getline(f, line);  // header
  std::vector<int> out;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state, queues, timer;
    in >> slot >> local >> remote >> state >> queues >> timer;
    if (state != "01") continue;  // ESTABLISHED
    if (std::stoul(local.substr(local.find(':') + 1), nullptr, 16) != port) continue;
    out.push_back(std::stoi(timer.substr(0, timer.find(':')), nullptr, 16));
  }
  return out;
}

// How long a connection the server must close may stay open: far beyond the few milliseconds a
// refusal takes, and no other timer of these servers closes one (no handshake limit, no
// heartbeats), so only a server that keeps the connection reaches it.
constexpr auto kCloseBound = std::chrono::milliseconds(20000);

// Asks the server's counters until `key` equals `want`; false when it still differs after
// `bound` (the last value seen is in `seen`).
bool stat_reaches(sy::it::ServerProcess& srv, const std::string& key, int64_t want, int64_t& seen,
                  std::chrono::seconds bound = std::chrono::seconds(20)) {
  auto until = std::chrono::steady_clock::now() + bound;
  for (;;) {
    seen = srv.stats()[key];
    if (seen == want) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Open descriptors of process `pid`.
int64_t open_descriptors(pid_t pid) {
  int64_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

// A frame a stalled peer announces: under the 1 MiB message limit, so that its size alone is no
// reason to disconnect; and what it sends of it before stalling.
constexpr uint64_t kFrameBytes = 900 * 1024;
constexpr size_t kSentBytes = 64 * 1024;

}  // namespace

BOOST_AUTO_TEST_CASE(a_flood_is_refused_at_the_edge_and_every_submit_is_answered_once) {
  sy::it::ServerProcess srv({"--backend", "null", "--max-waiting-requests", "4"});
  zmq::context_t ctx;
  zmq::socket_t sock(ctx, zmq::socket_type::dealer);
  // Neither side of this client holds back: all submits go out at once, as from a flood, and
  // every reply can come in.
  sock.set(zmq::sockopt::sndhwm, 0);
  sock.set(zmq::sockopt::rcvhwm, 0);
  sock.set(zmq::sockopt::linger, 0);
  sock.connect(srv.endpoint());

  constexpr int kSubmits = 20000;
  for (int i = 0; i < kSubmits; ++i) {
    sy::wire::Submit s;
    s.id = "j";
    s.id += std::to_string(i);  // (not "j" + ...: g++ 12 warns falsely, -Wrestrict)
    s.tenant = "flood";
    s.prompt = std::string("one two three four");
    s.max_tokens = 1;
    std::string bytes = sy::wire::encode_client(sy::wire::ClientMessage{s});
    BOOST_REQUIRE(sock.send(zmq::buffer(bytes), zmq::send_flags::none).has_value());
  }

  std::map<std::string, int> terminal;  // id -> terminal messages seen
  std::set<std::string> accepted, refused_at_edge;
  int answered = 0;
  auto until = std::chrono::steady_clock::now() + 120s;
  while (answered < kSubmits && std::chrono::steady_clock::now() < until) {
    auto m = recv_message(sock, 500ms);
    if (!m) continue;
    if (auto* a = std::get_if<sy::wire::Accepted>(&*m)) {
      accepted.insert(a->id);
    } else if (auto* d = std::get_if<sy::wire::Done>(&*m)) {
      if (terminal[d->id]++ == 0) ++answered;
    } else if (auto* e = std::get_if<sy::wire::Error>(&*m)) {
      if (terminal[e->id]++ == 0) ++answered;
      if (e->code == sy::ErrorCode::overloaded &&
          e->message.find("behind on admitting requests") != std::string::npos) {
        BOOST_TEST(e->retry_after_ms.value_or(0) > 0u);
        refused_at_edge.insert(e->id);
      }
    }
  }
  BOOST_TEST(answered == kSubmits);
  for (const auto& [id, n] : terminal) BOOST_TEST(n == 1, id << " got " << n << " answers");
  // Four may wait in front of admission; a burst of 20,000 outruns it many times over.
  BOOST_TEST(!refused_at_edge.empty());
  for (const auto& id : refused_at_edge) BOOST_TEST(!accepted.count(id), id);
  BOOST_TEST(srv.stats()["intake_refused"] == static_cast<int64_t>(refused_at_edge.size()));

  // Once the burst is over, a submit goes through as usual.
  sy::wire::Submit s;
  s.id = "after";
  s.tenant = "flood";
  s.prompt = std::string("one two");
  s.max_tokens = 1;
  std::string bytes = sy::wire::encode_client(sy::wire::ClientMessage{s});
  BOOST_REQUIRE(sock.send(zmq::buffer(bytes), zmq::send_flags::none).has_value());
  bool done = false;
  until = std::chrono::steady_clock::now() + 30s;
  while (!done && std::chrono::steady_clock::now() < until) {
    auto m = recv_message(sock, 500ms);
    if (!m) continue;
    if (auto* d = std::get_if<sy::wire::Done>(&*m)) done = d->id == "after";
  }
  BOOST_TEST(done);
  BOOST_TEST(srv.alive());
}

BOOST_AUTO_TEST_CASE(connections_have_tcp_keepalive) {
  sy::it::ServerProcess srv({"--backend", "null"});
  zmq::context_t ctx;
  zmq::socket_t sock(ctx, zmq::socket_type::dealer);
  sock.set(zmq::sockopt::linger, 0);
  sock.connect(srv.endpoint());
  // A round trip: the connection is accepted and handshaken.
  std::string ping = sy::wire::encode_client(sy::wire::ClientMessage{sy::wire::Ping{}});
  BOOST_REQUIRE(sock.send(zmq::buffer(ping), zmq::send_flags::none).has_value());
  BOOST_REQUIRE(recv_message(sock, 10s).has_value());
  // Both ends of a loopback connection are listed; the server's end has the server's port. Its
  // timer is the keepalive one (2) once no segment waits for an acknowledgement (1: the
  // retransmission timer of the reply just sent, until the ACK comes).
  std::vector<int> timers;
  auto until = std::chrono::steady_clock::now() + 10s;
  do {
    timers = timers_of_local_port(port_of(srv.endpoint()));
    if (!timers.empty() && std::all_of(timers.begin(), timers.end(), [](int t) { return t == 2; }))
      break;
    std::this_thread::sleep_for(50ms);
  } while (std::chrono::steady_clock::now() < until);
  BOOST_REQUIRE(!timers.empty());
  for (int t : timers) BOOST_TEST(t == 2, "timer_active " << t << " (2: keepalive)");
}

BOOST_AUTO_TEST_CASE(connections_past_max_connections_are_closed_and_room_comes_back) {
  sy::it::TempDir dir;
  const std::string log = dir.path() + "/stderr.log";
  // No handshake limit and no heartbeats (the default): only the cap can close a connection.
  sy::it::ServerProcess srv({"--backend", "null", "--max-connections", "4",
                             "--handshake-timeout-ms", "0", "--metrics", "127.0.0.1:0"},
                            std::chrono::seconds(60), log);
  // Four connections fill the cap: two peers stalled in the middle of a big frame (what the cap
  // bounds: each pins the frame's buffer for as long as it stays connected) and two clients.
  std::vector<std::unique_ptr<RawPeer>> stalled;
  for (int i = 0; i < 2; ++i) {
    stalled.push_back(std::make_unique<RawPeer>(srv.endpoint()));
    stalled.back()->send_handshake();
    stalled.back()->send_frame_start(kFrameBytes, kSentBytes);
  }
  sy::client::Client a(srv.endpoint()), b(srv.endpoint());
  BOOST_REQUIRE(a.ping_wait(10s));
  BOOST_REQUIRE(b.ping_wait(10s));
  int64_t seen = -1;
  BOOST_REQUIRE_MESSAGE(stat_reaches(srv, "connections_open", 4, seen),
                        "connections_open " << seen);
  const int64_t descriptors = open_descriptors(srv.pid());

  // Past the cap a connection is closed as it comes: a silent one, and one that starts the same
  // stall (it never holds its frame).
  RawPeer silent(srv.endpoint());
  BOOST_TEST(silent.closed_within(kCloseBound), "a fifth connection was kept open");
  RawPeer staller(srv.endpoint());
  staller.send_handshake();
  staller.send_frame_start(kFrameBytes, kSentBytes);
  BOOST_TEST(staller.closed_within(kCloseBound), "a sixth connection was kept open");
  // The peer can see its connection end before the gateway's thread has counted the refusal.
  BOOST_TEST(stat_reaches(srv, "connections_refused", 2, seen), "connections_refused " << seen);
  auto st = srv.stats();
  BOOST_TEST(st["connections_open"] == 4);
  auto page = sy::it::http_get(srv.metrics_endpoint(), "/metrics");
  BOOST_TEST(page.status == 200);
  BOOST_TEST(page.body.find("\nswitchyard_connections_refused_total{reason=\"total\"} 2\n") !=
                 std::string::npos,
             page.body);
  BOOST_TEST(page.body.find("\nswitchyard_connections_open 4\n") != std::string::npos, page.body);
  // libzmq saw the end of each refused connection and closed its descriptor (and pipe) itself.
  auto until = std::chrono::steady_clock::now() + 20s;
  while (open_descriptors(srv.pid()) > descriptors && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(20ms);
  BOOST_TEST(open_descriptors(srv.pid()) <= descriptors);
  // The four are untouched.
  for (auto& p : stalled) BOOST_TEST(!p->closed_within(std::chrono::milliseconds(0)));
  BOOST_TEST(a.ping_wait(10s));

  // Once the stalled peers leave there is room again: a new client connects and runs a job.
  stalled.clear();
  BOOST_REQUIRE_MESSAGE(stat_reaches(srv, "connections_open", 2, seen),
                        "connections_open " << seen);
  sy::client::Client c(srv.endpoint());
  sy::wire::Submit s;
  s.id = "after-the-cap";
  s.tenant = "conn";
  s.prompt = std::string("one two");
  s.max_tokens = 2;
  auto r = c.run(s, 30s);
  BOOST_REQUIRE(r.ok());
  BOOST_TEST(r.done->id == "after-the-cap");
  BOOST_TEST(srv.stats()["connections_refused"] == 2);
  BOOST_TEST(srv.alive());

  // The first refusal is logged, naming the limit.
  std::ifstream f(log);
  std::stringstream text;
  text << f.rdbuf();
  const std::string line = "switchyard: refused a connection to the request endpoint " +
                           srv.endpoint() + ": 4 connections open, endpoints.max_connections is 4";
  BOOST_TEST(text.str().find(line) != std::string::npos, text.str());
}

BOOST_AUTO_TEST_CASE(the_pipeline_input_has_its_own_cap) {
  sy::it::ServerProcess srv({"--backend", "null", "--max-connections", "1",
                             "--handshake-timeout-ms", "0", "--pull", "tcp://127.0.0.1:*",
                             "--results", "tcp://127.0.0.1:*"});
  // One request client and one producer: each endpoint is at its cap of one.
  sy::client::Client client(srv.endpoint());
  BOOST_REQUIRE(client.ping_wait(10s));
  sy::client::Sink sink(srv.results_endpoint());
  sy::client::Pusher producer(srv.pull_endpoint());
  int64_t seen = -1;
  BOOST_REQUIRE_MESSAGE(stat_reaches(srv, "connections_open", 2, seen),
                        "connections_open " << seen);

  RawPeer extra(srv.pull_endpoint());
  BOOST_TEST(extra.closed_within(kCloseBound), "a second producer connection was kept open");
  // The peer can see its connection end before the gateway's thread has counted the refusal.
  BOOST_TEST(stat_reaches(srv, "connections_refused", 1, seen), "connections_refused " << seen);

  // The producer's connection was not the one closed: its job comes back on the results socket.
  sy::wire::Submit s;
  s.id = "piped";
  s.tenant = "conn";
  s.prompt = std::string("one two");
  s.max_tokens = 2;
  BOOST_REQUIRE(producer.submit(s, 10s));
  bool done = false;
  auto until = std::chrono::steady_clock::now() + 30s;
  while (!done && std::chrono::steady_clock::now() < until) {
    auto m = sink.next(500ms);
    if (!m) continue;
    if (auto* d = std::get_if<sy::wire::Done>(&*m)) done = d->id == "piped";
  }
  BOOST_TEST(done);
  BOOST_TEST(client.ping_wait(10s));
  BOOST_TEST(srv.stats()["connections_open"] == 2);
  BOOST_TEST(srv.alive());
}

BOOST_AUTO_TEST_CASE(the_descriptor_limit_is_raised_to_fit_the_caps) {
  // Two endpoints of 1000 connections need 2000 descriptors, plus 256 for the server's own files.
  constexpr rlim_t kNeed = 2 * 1000 + 256;
  rlimit saved{};
  BOOST_REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < kNeed) {
    BOOST_TEST_MESSAGE("skipped: the hard descriptor limit " << saved.rlim_max << " is below "
                                                             << kNeed);
    return;
  }
  // The server inherits a low soft limit from this process, restored once it has started.
  struct Restore {
    rlimit r;
    ~Restore() { ::setrlimit(RLIMIT_NOFILE, &r); }
  } restore{saved};
  rlimit low = saved;
  low.rlim_cur = 512;
  BOOST_REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  sy::it::TempDir dir;
  const std::string log = dir.path() + "/stderr.log";
  sy::it::ServerProcess srv({"--backend", "null", "--max-connections", "1000", "--pull",
                             "tcp://127.0.0.1:*", "--results", "tcp://127.0.0.1:*"},
                            std::chrono::seconds(60), log);
  ::setrlimit(RLIMIT_NOFILE, &saved);
  std::ifstream f("/proc/" + std::to_string(srv.pid()) + "/limits");
  std::string line;
  long long soft = -1;
  while (std::getline(f, line))
    if (line.rfind("Max open files", 0) == 0) std::istringstream(line.substr(14)) >> soft;
  BOOST_TEST(soft == static_cast<long long>(kNeed));
  // Raised, so nothing to warn about.
  std::ifstream err(log);
  std::stringstream text;
  text << err.rdbuf();
  BOOST_TEST(text.str().find("open file limit") == std::string::npos, text.str());
}

BOOST_AUTO_TEST_SUITE_END()  // test_intake
