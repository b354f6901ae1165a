// Raw TCP peers of a ZeroMQ endpoint for the integration tests: ZMTP 3.0 spoken by hand
// (greeting, NULL handshake, frames), so that a test can stall mid-frame, flood or reset.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>

namespace sy::it {

// A TCP connection to a ZeroMQ endpoint, driven byte by byte.
class RawPeer {
 public:
  // `source`: the local address to connect from (e.g. "127.0.0.2"; any 127/8 address is this
  // host's loopback), "" for the kernel's choice.
  explicit RawPeer(const std::string& endpoint, const std::string& source = "") {
    // "tcp://127.0.0.1:PORT"
    auto colon = endpoint.rfind(':');
    BOOST_REQUIRE(endpoint.rfind("tcp://", 0) == 0 && colon != std::string::npos);
    std::string host = endpoint.substr(6, colon - 6);
    int port = std::stoi(endpoint.substr(colon + 1));
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    BOOST_REQUIRE(fd_ >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    BOOST_REQUIRE(inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1);
    if (!source.empty()) {
      sockaddr_in local{};
      local.sin_family = AF_INET;
      BOOST_REQUIRE(inet_pton(AF_INET, source.c_str(), &local.sin_addr) == 1);
      BOOST_REQUIRE_MESSAGE(::bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof local) == 0,
                            "bind to " << source << ": " << std::strerror(errno));
    }
    BOOST_REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~RawPeer() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawPeer(const RawPeer&) = delete;
  RawPeer& operator=(const RawPeer&) = delete;

  int fd() const { return fd_; }

  // Sends all of `bytes`; a connection the server reset or closed meanwhile is remembered
  // (closed_within reports it), any other failure fails the test.
  void send(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size() && !server_closed_) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n < 0 && (errno == ECONNRESET || errno == EPIPE)) {
        server_closed_ = true;
        return;
      }
      BOOST_REQUIRE_MESSAGE(n > 0, "send failed: " << std::strerror(errno));
      off += static_cast<size_t>(n);
    }
  }

  // Reads exactly `n` bytes (false when the connection ends or `limit` passes first).
  bool read_exact(size_t n, std::string& out,
                  std::chrono::milliseconds limit = std::chrono::milliseconds(10000)) {
    out.clear();
    auto until = std::chrono::steady_clock::now() + limit;
    while (out.size() < n) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
      char buf[4096];
      ssize_t r = ::recv(fd_, buf, std::min(sizeof buf, n - out.size()), 0);
      if (r <= 0) return false;
      out.append(buf, static_cast<size_t>(r));
    }
    return true;
  }

  // ZMTP 3.0 greeting with `mechanism` (NULL, or CURVE for a peer that never sends its HELLO),
  // as a client (as-server 0).
  void send_greeting_v3(const std::string& mechanism = "NULL") {
    std::string g;
    g += '\xff';
    g += std::string(7, '\0');
    g += '\x01';  // padding: libzmq writes the identity length + 1 here
    g += '\x7f';
    g += '\x03';  // major version
    g += '\x00';  // minor version: 3.0
    BOOST_REQUIRE(mechanism.size() <= 20u);
    g += mechanism + std::string(20 - mechanism.size(), '\0');
    g += '\x00';  // as-server
    g += std::string(31, '\0');
    BOOST_REQUIRE(g.size() == 64u);
    send(g);
  }

  // READY command with one property, Socket-Type.
  void send_ready(const std::string& socket_type) {
    std::string body = "\x05READY";
    body += '\x0b';
    body += "Socket-Type";
    uint32_t len = htonl(static_cast<uint32_t>(socket_type.size()));
    body.append(reinterpret_cast<const char*>(&len), 4);
    body += socket_type;
    std::string frame;
    frame += '\x04';  // command, short
    frame += static_cast<char>(body.size());
    frame += body;
    send(frame);
  }

  // The whole NULL handshake: greeting both ways, READY both ways.
  void handshake_v3(const std::string& socket_type) {
    send_greeting_v3();
    send_ready(socket_type);
    std::string greeting, head, body;
    BOOST_REQUIRE_MESSAGE(read_exact(64, greeting), "no greeting from the server");
    BOOST_REQUIRE(static_cast<unsigned char>(greeting[0]) == 0xff);
    BOOST_REQUIRE(greeting[10] == 3);
    BOOST_REQUIRE_MESSAGE(read_exact(2, head), "no READY from the server");
    BOOST_REQUIRE(head[0] == 0x04);
    BOOST_REQUIRE(read_exact(static_cast<unsigned char>(head[1]), body));
    BOOST_REQUIRE(body.rfind("\x05READY", 0) == 0);
  }

  // Greeting and READY as a DEALER, the server's replies left unread.
  void send_handshake() {
    send_greeting_v3();
    send_ready("DEALER");
  }

  // The header of one long final frame of `size` bytes and its first `sent` bytes.
  void send_frame_start(uint64_t size, size_t sent) {
    std::string h;
    h += '\x02';  // long, last frame
    for (int i = 7; i >= 0; --i) h += static_cast<char>((size >> (8 * i)) & 0xff);
    send(h + std::string(sent, 'x'));
  }

  // `n` small frames, each a `ping` message.
  void send_small_frames(int n) {
    const std::string ping("\x82\xa1v\x01\xa4type\xa4ping", 14);
    std::string frame = std::string(1, '\0') + static_cast<char>(ping.size()) + ping;
    std::string all;
    for (int i = 0; i < n; ++i) all += frame;
    send(all);
  }

  // Ends the connection with a TCP reset instead of a FIN.
  void reset() {
    linger l{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    ::close(fd_);
    fd_ = -1;
  }

  // Waits until the server closes the connection (reading and discarding what it sends, such as
  // its PINGs); false when it is still open after `limit`.
  bool closed_within(std::chrono::milliseconds limit) {
    if (server_closed_) return true;
    auto until = std::chrono::steady_clock::now() + limit;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      char buf[4096];
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n == 0 || (n < 0 && errno != EINTR)) return server_closed_ = true;  // FIN or reset
    }
  }

 private:
  int fd_ = -1;
  bool server_closed_ = false;
};

}  // namespace sy::it
