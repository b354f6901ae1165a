// The request endpoint's intake under a flood, and the kernel's liveness checks on connections:
// requests that would wait in front of admission past endpoints.max_waiting_requests are
// answered `overloaded` by the gateway, every submit still gets exactly one answer, and every
// connection has TCP keepalive so that a dead peer's buffers are freed.
#define BOOST_TEST_MODULE it_intake
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "ingress/codec.hpp"
#include "server_process.hpp"

using namespace std::chrono_literals;

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
    s.id = "j" + std::to_string(i);
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
