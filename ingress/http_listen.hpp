// Opening an HTTP listener from a "HOST:PORT" address: shared by the HTTP door and the
// operator endpoints (/metrics), so that both read addresses and report bind errors alike.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <string>

namespace sy {

/// Splits "HOST:PORT" (an optional "http://" in front is accepted; "[::1]:80" for IPv6) into its
/// parts; throws std::invalid_argument naming `what` and the problem.
void split_host_port(const std::string& address, std::string& host, unsigned short& port,
                     const std::string& what = "address");

/// Resolves `bind`, opens `acceptor` on it (reuse_address: a restarted server binds at once, not
/// after TIME_WAIT) and listens; returns "HOST:PORT" as bound (the real port when 0 was asked).
/// Throws std::runtime_error "<what>: cannot listen on '<bind>': <why>".
std::string listen_on(boost::asio::ip::tcp::acceptor& acceptor, const std::string& bind,
                      const std::string& what);

}  // namespace sy
