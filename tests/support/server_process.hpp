// Starts a real `switchyard serve` child process and talks to it the way operators do: reads the
// bound addresses from its stdout, asks for its counters with SIGUSR1, stops it with a signal.
// Header-only and Boost-free: the integration tests and bench_loadgen both use it.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace sy::test {

/// How to start the server.
struct ServeOptions {
  std::string binary;             ///< the `switchyard` executable
  std::vector<std::string> args;  ///< passed after `serve`
  /// How long the server may take to print "switchyard: ready"; a model load on a busy machine
  /// takes a while.
  std::chrono::milliseconds startup = std::chrono::seconds(60);
  /// "" = stderr is inherited; else stderr is appended to this file.
  std::string stderr_file;
  /// Sent to the server by the kernel when this process dies first (PR_SET_PDEATHSIG), so that
  /// no server outlives a crashed test or benchmark.
  int death_signal = SIGKILL;
};

/// A running `switchyard serve`. The constructor returns once the server says "ready" and throws
/// when it exits or stays silent for `startup` first; the destructor kills it.
class ServeProcess {
 public:
  explicit ServeProcess(ServeOptions o) {
    std::vector<std::string> argv = {o.binary, "serve"};
    argv.insert(argv.end(), o.args.begin(), o.args.end());
    int out[2];
    if (pipe(out) != 0) throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, o.death_signal);
      dup2(out[1], 1);
      if (!o.stderr_file.empty()) {
        int e = ::open(o.stderr_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (e >= 0) {
          dup2(e, 2);
          close(e);
        }
      }
      close(out[0]);
      close(out[1]);
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      execv(o.binary.c_str(), cargv.data());
      std::perror(("exec " + o.binary).c_str());
      _exit(127);
    }
    close(out[1]);
    fd_ = out[0];
    auto until = std::chrono::steady_clock::now() + o.startup;
    std::string line;
    while (read_line(line, until)) {
      auto take = [&](const char* prefix, std::string& into) {
        if (line.rfind(prefix, 0) == 0) into = line.substr(std::string(prefix).size());
      };
      take("switchyard: listening on ", endpoint_);
      take("switchyard: pipeline input on ", pull_);
      take("switchyard: pipeline results on ", results_);
      take("switchyard: metrics on http://", metrics_);
      if (line.rfind("switchyard: ready", 0) == 0) {
        ready_ = line;
        return;
      }
    }
    kill_now();
    throw std::runtime_error("switchyard serve did not become ready: " + log_);
  }
  ~ServeProcess() { kill_now(); }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  const std::string& pull_endpoint() const { return pull_; }
  const std::string& results_endpoint() const { return results_; }
  /// The metrics HTTP address "HOST:PORT" (--metrics), "" when off.
  const std::string& metrics_endpoint() const { return metrics_; }
  /// The "switchyard: ready (...)" line.
  const std::string& ready_line() const { return ready_; }
  pid_t pid() const { return pid_; }
  /// Everything the server printed on stdout so far that this object has read.
  const std::string& log() const { return log_; }

  /// True while the process has not exited.
  bool alive() {
    if (pid_ <= 0) return false;
    int st = 0;
    pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = st;
      pid_ = -1;
      return false;
    }
    return true;
  }

  /// Sends `sig` and waits up to `limit` for the exit; returns the exit code (128+signal when
  /// killed by a signal, -1 when it did not exit in time: it is then killed).
  int stop(int sig = SIGTERM, std::chrono::seconds limit = std::chrono::seconds(30)) {
    if (pid_ <= 0) return decode(status_);
    ::kill(pid_, sig);
    auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      if (!alive()) return decode(status_);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill_now();
    return -1;
  }

  /// The JSON of the "switchyard: stats {json}" line the server prints on SIGUSR1 (fields of
  /// sy::ServerSnapshot); nullopt when none comes within `wait` (or the server is gone).
  std::optional<std::string> stats_line(std::chrono::milliseconds wait) {
    if (pid_ <= 0) return std::nullopt;
    ::kill(pid_, SIGUSR1);
    auto until = std::chrono::steady_clock::now() + wait;
    std::string line;
    const std::string prefix = "switchyard: stats ";
    while (read_line(line, until))
      if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
    return std::nullopt;
  }

  /// Kills the server at once (SIGKILL) and reaps it.
  void kill_now() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      waitpid(pid_, &st, 0);
      status_ = st;
      pid_ = -1;
    }
    if (fd_ >= 0) {
      close(fd_);
      fd_ = -1;
    }
  }

 private:
  static int decode(int st) {
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return -1;
  }
  // One stdout line, waiting until `until` at most; false on timeout or end of output.
  bool read_line(std::string& line, std::chrono::steady_clock::time_point until) {
    line.clear();
    while (true) {
      auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        log_ += line + "\n";
        return true;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0 || fd_ < 0) return false;
      pollfd p{fd_, POLLIN, 0};
      int r = poll(&p, 1, static_cast<int>(left.count()));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      char tmp[4096];
      ssize_t n = ::read(fd_, tmp, sizeof tmp);
      if (n <= 0) return false;
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  int status_ = 0;
  std::string buf_, log_, ready_;
  std::string endpoint_, pull_, results_, metrics_;
};

}  // namespace sy::test
