// Connection liveness: raw TCP peers that speak ZMTP by hand (greeting, NULL handshake, then the
// start of a large frame) and stall are disconnected by the server's heartbeat and handshake
// timeouts (endpoints.heartbeat_*, handshake_timeout_ms), which frees the frame buffer they pin;
// well-behaved idle clients stay connected.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cerrno>
#include <cstring>

#include "clients/cpp/client.hpp"
#include "tests/integration/raw_peer.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_stalled_peers)

using namespace std::chrono_literals;
using sy::it::RawPeer;

namespace {

// Far beyond the timeouts the servers below are given (a few hundred ms): only a server that
// never drops the peer reaches it. libzmq's own handshake default (30 s) lies beyond it too.
constexpr auto kCloseBound = 20s;
// The frame a stalled peer announces: under the server's 1 MiB message limit, so that the size
// alone is no reason to disconnect; libzmq allocates it whole when it reads the header.
constexpr uint64_t kFrameBytes = 900 * 1024;
// What the peer sends of it before stalling.
constexpr size_t kSentBytes = 64 * 1024;

// Small liveness timers, so that a drop comes within a second. Heartbeats are off by default
// (server/config.hpp says why); these tests turn them on.
std::vector<std::string> liveness_args() {
  return {"--backend",
          "null",
          "--heartbeat-ivl-ms",
          "100",
          "--heartbeat-timeout-ms",
          "300",
          "--heartbeat-ttl-ms",
          "300",
          "--handshake-timeout-ms",
          "300"};
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_request_peer_stalled_mid_frame_is_dropped) {
  sy::it::ServerProcess srv(liveness_args());
  sy::client::Client idle(srv.endpoint());
  BOOST_REQUIRE(idle.ping_wait(10s));

  RawPeer peer(srv.endpoint());
  peer.handshake_v3("DEALER");
  peer.send_frame_start(kFrameBytes, kSentBytes);
  BOOST_TEST(peer.closed_within(kCloseBound),
             "the server kept a peer stalled in the middle of a frame connected");

  // A client that sent nothing for as long answers the PINGs (its ZeroMQ does) and stays.
  BOOST_TEST(idle.ping_wait(10s));
  BOOST_TEST(srv.alive());
}

BOOST_AUTO_TEST_CASE(a_peer_that_never_completes_the_handshake_is_dropped) {
  sy::it::ServerProcess srv(liveness_args());
  {
    // Connects and sends nothing at all.
    RawPeer silent(srv.endpoint());
    BOOST_TEST(silent.closed_within(kCloseBound), "a peer that sent no greeting stayed connected");
  }
  {
    // Sends the greeting but never its READY.
    RawPeer half(srv.endpoint());
    half.send_greeting_v3();
    BOOST_TEST(half.closed_within(kCloseBound), "a peer that never sent READY stayed connected");
  }
  sy::client::Client c(srv.endpoint());
  BOOST_TEST(c.ping_wait(10s));
}

BOOST_AUTO_TEST_CASE(a_zmtp2_peer_cannot_escape_the_heartbeats) {
  // libzmq runs heartbeats only after a ZMTP 3 handshake; a ZMTP 2.0 peer would hold a frame
  // for ever (libzmq 4.3 happens to drop it when the handshake timer fires, which newer libzmq
  // and handshake_timeout_ms 0 do not). The server refuses the old protocol outright.
  auto args = liveness_args();
  args.back() = "0";  // --handshake-timeout-ms 0: only the refusal can end the connection
  sy::it::ServerProcess srv(args);
  RawPeer peer(srv.endpoint());
  std::string g;
  g += '\xff';
  g += std::string(7, '\0');
  g += '\x01';
  g += '\x7f';
  g += '\x01';                      // revision 1: ZMTP 2.0
  g += '\x05';                      // socket type DEALER
  g += std::string("\x00\x00", 2);  // empty identity frame
  peer.send(g);
  // A ZMTP 2.0 frame: flags (long, last), 8-byte size, then part of the body.
  peer.send_frame_start(kFrameBytes, kSentBytes);
  BOOST_TEST(peer.closed_within(kCloseBound), "a ZMTP 2.0 peer stalled mid-frame stayed connected");
  sy::client::Client c(srv.endpoint());
  BOOST_TEST(c.ping_wait(10s));
}

BOOST_AUTO_TEST_CASE(a_results_sink_cannot_send_large_frames) {
  // Sinks only receive; a frame sent to the results socket beyond a small limit disconnects.
  auto args = liveness_args();
  for (const char* a : {"--pull", "tcp://127.0.0.1:*", "--results", "tcp://127.0.0.1:*"})
    args.push_back(a);
  sy::it::ServerProcess srv(args);
  RawPeer peer(srv.results_endpoint());
  peer.handshake_v3("PULL");
  peer.send_frame_start(kFrameBytes, kSentBytes);
  BOOST_TEST(peer.closed_within(kCloseBound), "a sink sending a large frame stayed connected");
}

BOOST_AUTO_TEST_CASE(peers_that_flood_and_reset_do_not_kill_the_server) {
  // Peers that send more than ZeroMQ would buffer under a high-water mark (it would stop reading
  // their connections: the results socket never reads, the others only as fast as the server
  // works) and then reset. libzmq 4.3.4 aborts from its heartbeat timer when that happens on a
  // connection whose input it paused, so the request endpoint with heartbeats on takes no
  // receive mark (with the mark this test aborted the server in each of 3 runs); the pipeline
  // sockets have no heartbeats.
  std::vector<std::string> args = liveness_args();
  for (const char* a : {"--pull", "tcp://127.0.0.1:*", "--results", "tcp://127.0.0.1:*"})
    args.push_back(a);
  sy::it::ServerProcess srv(args);
  for (int round = 0; round < 3; ++round) {
    std::vector<std::unique_ptr<RawPeer>> peers;
    for (int i = 0; i < 32; ++i) {
      peers.push_back(std::make_unique<RawPeer>(srv.results_endpoint()));
      peers.back()->handshake_v3("PULL");
      peers.push_back(std::make_unique<RawPeer>(srv.endpoint()));
      peers.back()->handshake_v3("DEALER");
    }
    for (auto& p : peers) p->send_small_frames(20000);
    for (auto& p : peers) p->reset();
  }
  // The abort would come from a timer, so the server is watched for a while: a second and a
  // half of ping round trips (enough for a heartbeat interval of a second or less).
  sy::client::Client c(srv.endpoint());
  auto until = std::chrono::steady_clock::now() + 1500ms;
  while (std::chrono::steady_clock::now() < until) {
    BOOST_REQUIRE(c.ping_wait(10s));
    std::this_thread::sleep_for(50ms);
  }
  BOOST_TEST(srv.alive());
}

BOOST_AUTO_TEST_SUITE_END()  // test_stalled_peers
