// HTTP listeners from "HOST:PORT" (http_listen.hpp).
#include "ingress/http_listen.hpp"

#include <stdexcept>

namespace sy {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

void split_host_port(const std::string& address, std::string& host, unsigned short& port,
                     const std::string& what) {
  std::string a = address;
  if (a.rfind("http://", 0) == 0) a = a.substr(7);
  if (!a.empty() && a.back() == '/') a.pop_back();
  auto colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == a.size())
    throw std::invalid_argument(what + " '" + address + "' is not HOST:PORT");
  host = a.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  std::string p = a.substr(colon + 1);
  unsigned long v = 0;
  size_t used = 0;
  try {
    v = std::stoul(p, &used, 10);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != p.size() || v > 65535)
    throw std::invalid_argument(what + " '" + address + "': bad port '" + p + "'");
  port = static_cast<unsigned short>(v);
}

std::string listen_on(tcp::acceptor& acceptor, const std::string& bind, const std::string& what) {
  std::string host;
  unsigned short port = 0;
  split_host_port(bind, host, port, what + " address");
  try {
    tcp::resolver resolver(acceptor.get_executor());
    auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::passive);
    if (results.empty()) throw std::runtime_error("no address");
    tcp::endpoint ep = results.begin()->endpoint();
    acceptor.open(ep.protocol());
    acceptor.set_option(asio::socket_base::reuse_address(true));
    acceptor.bind(ep);
    acceptor.listen(asio::socket_base::max_listen_connections);
    auto local = acceptor.local_endpoint();
    std::string h = local.address().to_string();
    if (local.address().is_v6()) h = "[" + h + "]";
    return h + ":" + std::to_string(local.port());
  } catch (const std::exception& e) {
    throw std::runtime_error(what + ": cannot listen on '" + bind + "': " + e.what());
  }
}

}  // namespace sy
