// Configuration of the ZeroMQ edge: the sockets the gateway binds, their limits and CURVE.
#pragma once

#include <cstdint>
#include <string>

namespace sy {

/// The endpoints a server binds (config `endpoints`, docs/protocol.md Sockets).
struct EndpointConfig {
  std::string bind = "tcp://127.0.0.1:5555";  // ROUTER for DEALER clients
  std::string pull;                           // PULL for pipeline producers ("" = off)
  std::string results;                        // PUSH for pipeline sinks ("" = off)
  int64_t max_message_bytes = 1 << 20;        // ZMQ_MAXMSGSIZE: a bigger frame disconnects
  int sndhwm = 1000, rcvhwm = 1000;           // ZeroMQ high-water marks (messages)
  // Connection liveness (docs/protocol.md, Sockets).
  // A connection that has not completed the ZMTP handshake (greeting, CURVE, READY) within
  // handshake_timeout_ms is dropped (ZMQ_HANDSHAKE_IVL; 0 = never). A real handshake takes a few
  // round trips, well under a second even across continents; 10 s leaves room for a loaded host
  // and is a third of libzmq's default, so strangers that connect and send nothing cost less.
  int64_t handshake_timeout_ms = 10000;
  // TCP keepalive on every connection (ZMQ_TCP_KEEPALIVE): after tcp_keepalive_idle_s without
  // traffic the kernel probes the peer every 10 s and drops the connection after 3 unanswered
  // probes, so a peer whose host died or vanished from the network frees its buffers (a
  // half-received frame included) within idle + 30 s. 0 = off. Probes are answered by the peer's
  // kernel, so a live but stalled peer is not dropped by them: see heartbeat_ivl_ms.
  int64_t tcp_keepalive_idle_s = 60;
  // ZMTP heartbeats on the request endpoint (ROUTER); 0 = off, the default. The server PINGs
  // every connection this often and drops one from which no whole message (a PONG counts) came
  // within heartbeat_timeout_ms of a PING: a dead client, or a live one stalled in the middle of
  // a frame, which otherwise pins the frame's buffer (up to max_message_bytes) for as long as it
  // stays connected. Suggested: 10 s and 30 s.
  // With heartbeats on, the ROUTER takes no receive high-water mark: libzmq 4.3.4 (and libzmq
  // master) aborts the process from its heartbeat timer when a peer resets a connection whose
  // input ZeroMQ had paused at the mark, and without a mark its input is never paused. The price:
  // what clients send faster than the gateway reads then queues in ZeroMQ without a bound, so
  // heartbeats suit endpoints whose clients are trusted (CURVE with an allow-list); that is why
  // they are off by default, where the mark bounds a flood to rcvhwm messages per connection.
  // The pipeline sockets never get heartbeats: a producer held back by backpressure is paused
  // that way in normal operation (the same abort, and a paused producer cannot answer a PING).
  int64_t heartbeat_ivl_ms = 0;
  int64_t heartbeat_timeout_ms = 30000;
  // Sent in each PING: a client drops the connection when it hears nothing from the server for
  // this long, so a dead server host is noticed and the client reconnects. Three intervals, as
  // above; ZMTP carries it in tenths of a second (at most 6553.5 s).
  int64_t heartbeat_ttl_ms = 30000;
  // Requests from the request endpoint handed to admission and not yet taken up by it (its
  // mailbox): past either bound new ones are answered `overloaded` by the gateway, so a flood
  // queues no more than this in front of admission. Admission takes a few hundred thousand small
  // requests a second; 4096 is about 10 ms of its work at that pace and a handful of
  // full-context prompts' bytes, so normal bursts never meet it. 64 MiB bounds what big prompts
  // can hold there.
  int64_t max_waiting_requests = 4096;
  int64_t max_waiting_bytes = int64_t{64} << 20;
  // Concurrent client connections on each listening endpoint (the request endpoint and the
  // pipeline input, counted apart); a connection past it is closed at once, and counted as
  // `connections_refused` (reason `total`). 0 = unlimited. With a client allow-list
  // (curve_allowed_keys) only connections that passed it count here; those still in their
  // handshake have max_handshaking of their own. A live peer stalled in the middle of a frame
  // pins the frame's buffer (up to max_message_bytes) while heartbeats are off, so this is what
  // bounds that memory: max_connections x max_message_bytes per endpoint, 1 GiB with the
  // defaults. 1024 leaves room for a thousand clients each holding its own connection (a client
  // process usually shares one), and that worst case is small beside a model's weights and KV
  // cache. Each connection takes a file descriptor: the gateway raises the soft `ulimit -n` to
  // what the caps need where the hard limit allows, and warns at start where it does not.
  int64_t max_connections = 1024;
  // Connections from one source address on each listening endpoint, checked as a connection is
  // accepted (the accepted socket's peer address; an IPv6 peer counts under its /64 network,
  // which a single host is usually given whole; ipc connections have no address and are not
  // counted). 0 = unlimited. So that strangers from a few addresses cannot take every slot of
  // max_connections: 64 is more than one client host needs (a client process usually shares
  // one connection) and lets 16 addresses at most fill the default cap.
  int64_t max_connections_per_address = 64;
  // With a client allow-list: connections still in their handshake (not yet past the allow-list)
  // on each listening endpoint; one past it is closed at once (reason `handshaking`). 0 =
  // unlimited. Each stays at most handshake_timeout_ms. A listed client's handshake takes a few
  // round trips, so even a reconnect storm of max_connections clients gets through 256 at a time
  // within a few reconnect intervals (100 ms each), while strangers need max_handshaking /
  // max_connections_per_address addresses (4 with the defaults) to fill it, and then only delay
  // new clients: they never take the places of connections that passed.
  int64_t max_handshaking = 256;
  // CURVE (docs/security.md): with a secret key file every bound socket is a CURVE server and
  // clients need the public key; "" = plain TCP. The public key file is optional and only checked
  // against the secret key (a mismatched pair is a deployment error worth catching at start).
  std::string curve_secret_key;  // Z85 secret key file (`switchyard keygen`)
  std::string curve_public_key;  // Z85 public key file
  // With CURVE on: a file of client public keys (Z85, one per line, '#' comments) that may
  // connect; every other key is refused during the handshake (ZAP). "" = any client that knows
  // the server's public key.
  std::string curve_allowed_keys;
};

}  // namespace sy
