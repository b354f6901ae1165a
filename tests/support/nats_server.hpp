// A real nats-server with JetStream for tests: started on loopback with a store in a temporary
// folder (a free port of its choosing, or a given one to come back on after a stop), stopped
// with SIGKILL or SIGTERM. Header-only and Boost-free.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/temp_dir.hpp"

namespace sy::test {

class NatsServer {
 public:
  /// Starts `nats-server -js` storing under a fresh folder; port 0: one the server picks.
  explicit NatsServer(int port = 0) : dir_("sy_nats_") { start(port); }
  ~NatsServer() { stop(SIGKILL); }
  NatsServer(const NatsServer&) = delete;
  NatsServer& operator=(const NatsServer&) = delete;

  /// nats://127.0.0.1:PORT
  std::string url() const { return "nats://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  bool running() const { return pid_ > 0; }

  /// Stops the server with `sig` and waits for it.
  void stop(int sig = SIGTERM) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
  }
  /// Starts it again on the same port over the same store (what JetStream had is still there).
  void restart() {
    stop(SIGTERM);
    start(port_);
  }

 private:
  void start(int port) {
    const std::string log = dir_.path() + "/nats.log";
    std::remove(log.c_str());
    const std::string store = dir_.path() + "/store";
    const std::string p = port > 0 ? std::to_string(port) : "-1";
    std::vector<std::string> args = {"nats-server", "-js", "-a", "127.0.0.1", "-p", p, "-sd", store,
                                     "-l", log};
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execvp("nats-server", argv.data());
      _exit(127);
    }
    // The server writes its client port to the log once it listens; JetStream is ready by then
    // ("Server is ready" comes after both). A slow machine takes well under a second; 30 s
    // only bounds a broken installation.
    const std::regex listening(R"(Listening for client connections on 127\.0\.0\.1:(\d+))");
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < until) {
      std::ifstream in(log);
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string text = ss.str();
      std::smatch m;
      if (text.find("Server is ready") != std::string::npos &&
          std::regex_search(text, m, listening)) {
        port_ = std::stoi(m[1]);
        return;
      }
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("nats-server exited at start: " + text);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    stop(SIGKILL);
    throw std::runtime_error("nats-server did not get ready within 30 s");
  }

  TempDir dir_;
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace sy::test
