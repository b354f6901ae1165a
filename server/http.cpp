// The operator HTTP server (see http.hpp): an Asio acceptor and Beast sessions, all on one thread.
#include "server/http.hpp"

#include "ingress/http_listen.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <thread>

namespace sy {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

namespace {

// A client has this long to send its request and take the answer: a scraper sends one at once;
// a stalled peer must not keep its connection forever.
constexpr auto kIoTimeout = std::chrono::seconds(10);
// The endpoints take no request body; a few KiB covers any sane header block and body.
constexpr std::uint64_t kBodyLimit = 8 * 1024;

// One connection: read one request, answer it, close.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const HttpHandler& handler)
      : stream_(std::move(socket)), handler_(handler) {}

  void run() {
    parser_.emplace();
    parser_->body_limit(kBodyLimit);
    stream_.expires_after(kIoTimeout);
    http::async_read(
        stream_, buf_, *parser_,
        [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

 private:
  void on_read(beast::error_code ec) {
    if (ec) return close();  // timeout, a closed peer or a malformed request: nothing to answer
    const auto& req = parser_->get();
    std::string target(req.target());
    std::string path = target.substr(0, target.find('?'));
    HttpReply r;
    try {
      r = handler_(std::string(req.method_string()), path);
    } catch (const std::exception& e) {
      r.status = 500;
      r.body = std::string("internal error: ") + e.what() + "\n";
    }
    res_.version(req.version());
    res_.result(static_cast<http::status>(r.status));
    res_.set(http::field::server, "switchyard");
    res_.set(http::field::content_type, r.content_type);
    res_.keep_alive(false);
    if (req.method() != http::verb::head) res_.body() = std::move(r.body);
    res_.prepare_payload();
    if (req.method() == http::verb::head) res_.content_length(r.body.size());
    stream_.expires_after(kIoTimeout);
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code, std::size_t) {
      self->close();
    });
  }

  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.socket().close(ec);
  }

  beast::tcp_stream stream_;
  const HttpHandler& handler_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> res_;
};

}  // namespace

struct HttpServer::Impl {
  std::string bind;
  HttpHandler handler;
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::thread thread;
  std::string address;
  bool running = false;

  void accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (!acceptor.is_open()) return;  // stopped
      if (!ec) std::make_shared<Session>(std::move(socket), handler)->run();
      accept();
    });
  }
};

HttpServer::HttpServer(std::string bind, HttpHandler handler) : impl_(new Impl) {
  impl_->bind = std::move(bind);
  impl_->handler = std::move(handler);
}

HttpServer::~HttpServer() {
  stop();
}

void HttpServer::start() {
  auto& d = *impl_;
  d.address = listen_on(d.acceptor, d.bind, "metrics");
  d.accept();
  d.running = true;
  d.thread = std::thread([&d] { d.io.run(); });
}

std::string HttpServer::address() const {
  return impl_->address;
}

void HttpServer::stop() {
  auto& d = *impl_;
  if (!d.running) return;
  d.running = false;
  d.io.stop();
  if (d.thread.joinable()) d.thread.join();
  beast::error_code ec;
  d.acceptor.close(ec);
}

}  // namespace sy
