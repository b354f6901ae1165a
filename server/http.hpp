// A small HTTP/1.1 server (Boost.Beast on Asio) on its own thread, for the operator endpoints
// (/metrics, /health, /ready): one request per connection, answered by a plain function.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace sy {

/// An answer to one request.
struct HttpReply {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

/// Answers one request: the method ("GET", ...) and the path without its query string. Called on
/// the server's own thread, one request at a time; it may block briefly (it bounds its own waits).
using HttpHandler = std::function<HttpReply(const std::string& method, const std::string& path)>;

/// The server. Not copyable; start() and stop() are called from one thread.
class HttpServer {
 public:
  /// `bind` is "HOST:PORT"; port 0 takes any free port.
  HttpServer(std::string bind, HttpHandler handler);
  /// Stops the thread if it runs.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// Binds (throws std::runtime_error on a bad or busy address) and starts the thread.
  void start();
  /// "HOST:PORT" as bound (the real port when 0 was asked). Valid after start().
  std::string address() const;
  /// Closes the listening socket and the open connections and joins the thread. Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sy
