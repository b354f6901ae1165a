// Shared by the integration tests: starts the real `switchyard serve` process on loopback (free
// ports chosen by the server itself: `tcp://127.0.0.1:*`), reads the bound addresses from its
// stdout, and stops it (SIGTERM, exit status) or kills it at the end. Plus small helpers: a temp
// folder and one-shot runs of the binary.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cli/json_reader.hpp"
#include "tests/support/temp_dir.hpp"

namespace sy::it {

#ifndef SY_SERVER_BINARY
#define SY_SERVER_BINARY "switchyard"  // emu_it_* tests run emu_switchyard (tests/emu)
#endif
/// The server binary and the shared models.
inline const std::string kBinary = std::string(SY_BINARY_DIR) + "/" + SY_SERVER_BINARY;
inline const std::string kStories = std::string(SY_MODELS_DIR) + "/stories260K.gguf";

/// A temp folder for config files and outputs; removed at destruction.
struct TempDir : test::TempDir {
  TempDir() : test::TempDir("sy_it_") {}
};

/// How a command run to its end went.
struct Run {
  int status = -1;  ///< exit status; -1 when it did not exit normally
  std::string out;  ///< stdout and stderr together
};

/// Runs `prefix kBinary args` through the shell to its end (for commands that are not servers);
/// `prefix` may bound it, e.g. "timeout 60 ". Throws when the command cannot be started.
inline Run run_binary(const std::string& args, const std::string& prefix = "") {
  Run r;
  FILE* p = popen((prefix + kBinary + " " + args + " 2>&1").c_str(), "r");
  if (!p) throw std::runtime_error("popen failed for " + args);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

/// A running `switchyard serve`. The constructor waits until the server says "ready".
class ServerProcess {
 public:
  /// `args` are passed after `serve`; `--bind tcp://127.0.0.1:*` is added unless `args` has
  /// --bind, and `--state-dir` (a temp folder of this object) unless `args` has --state-dir,
  /// --journal or --no-journal, so that no test writes a default journal into the real home
  /// folder. A test that restarts a server on its default journal passes its own --state-dir.
  /// Throws when the process exits or stays silent for `startup` before being ready. With
  /// `stderr_file`, the server's stderr is appended to that file (tests that read its messages).
  explicit ServerProcess(std::vector<std::string> args,
                         std::chrono::seconds startup = std::chrono::seconds(60),
                         const std::string& stderr_file = "") {
    bool has_bind = false, has_state = false;
    for (auto& a : args) {
      has_bind |= a == "--bind";
      has_state |= a == "--state-dir" || a == "--journal" || a == "--no-journal";
    }
    std::vector<std::string> argv = {kBinary, "serve"};
    if (!has_bind) {
      argv.push_back("--bind");
      argv.push_back("tcp://127.0.0.1:*");
    }
    if (!has_state) {
      state_ = std::make_unique<TempDir>();
      argv.push_back("--state-dir");
      argv.push_back(state_->path());
    }
    argv.insert(argv.end(), args.begin(), args.end());
    int out[2];
    if (pipe(out) != 0) throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      // The server dies with the test, even when the test crashes before its destructors run.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      dup2(out[1], 1);
      if (!stderr_file.empty()) {
        int e = ::open(stderr_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
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
      execv(kBinary.c_str(), cargv.data());
      _exit(127);
    }
    close(out[1]);
    fd_ = out[0];
    auto until = std::chrono::steady_clock::now() + startup;
    std::string line;
    while (read_line(line, until)) {
      auto take = [&](const char* prefix, std::string& into) {
        if (line.rfind(prefix, 0) == 0) into = line.substr(std::string(prefix).size());
      };
      take("switchyard: listening on ", endpoint_);
      take("switchyard: pipeline input on ", pull_);
      take("switchyard: pipeline results on ", results_);
      take("switchyard: metrics on http://", metrics_);
      if (line.rfind("switchyard: ready", 0) == 0) return;
    }
    kill_now();
    throw std::runtime_error("switchyard serve did not become ready: " + log_);
  }
  ~ServerProcess() { kill_now(); }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  const std::string& pull_endpoint() const { return pull_; }
  const std::string& results_endpoint() const { return results_; }
  /// The metrics HTTP address "HOST:PORT" (--metrics), "" when off.
  const std::string& metrics_endpoint() const { return metrics_; }
  pid_t pid() const { return pid_; }
  /// Everything the server printed so far (stdout and stderr) that this object has read.
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

  /// The server's counters: sends SIGUSR1 and reads the "switchyard: stats {json}" line it
  /// prints (fields of sy::ServerSnapshot). Throws when no answer comes within 10 s.
  std::map<std::string, int64_t> stats() {
    ::kill(pid_, SIGUSR1);
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    std::string line;
    const std::string prefix = "switchyard: stats ";
    while (read_line(line, until)) {
      if (line.rfind(prefix, 0) != 0) continue;
      std::map<std::string, int64_t> out;
      auto j = cli::JsonReader::parse(line.substr(prefix.size()));
      for (const auto& [k, v] : j.obj) out[k] = v.i;
      return out;
    }
    throw std::runtime_error("no stats line from the server");
  }

  /// A field of /proc/PID/status in kB (e.g. "VmHWM", "VmRSS"); -1 when unreadable.
  long proc_status_kb(const std::string& field) const {
    std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind(field + ":", 0) == 0)
        return std::strtol(line.c_str() + field.size() + 1, nullptr, 10);
    }
    return -1;
  }

 private:
  static int decode(int st) {
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return -1;
  }
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
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
      char tmp[4096];
      ssize_t n = ::read(fd_, tmp, sizeof tmp);
      if (n <= 0) return false;
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }
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

  std::unique_ptr<TempDir> state_;  // the added --state-dir; outlives the process (declared first)
  pid_t pid_ = -1;
  int fd_ = -1;
  int status_ = 0;
  std::string buf_, log_;
  std::string endpoint_, pull_, results_;
  std::string metrics_;
};

/// What one HTTP GET answered: the status (-1 when the server did not answer), the
/// Content-Type and the body.
struct HttpResult {
  int status = -1;
  std::string content_type, body;
};

/// One GET to "HOST:PORT" over a plain loopback socket (HTTP/1.0 semantics: the server closes
/// when done); the /metrics, /health and /ready endpoints of a test's server.
inline HttpResult http_get(const std::string& address, const std::string& path) {
  HttpResult r;
  auto colon = address.rfind(':');
  if (colon == std::string::npos) return r;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  // A scrape answers within the server's own 2 s bound; 20 s only guards against a hang.
  timeval tv{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return r;
  }
  std::string req =
      "GET " + path + " HTTP/1.1\r\nHost: " + address + "\r\nConnection: close\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string resp;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  auto head_end = resp.find("\r\n\r\n");
  if (resp.size() < 12 || head_end == std::string::npos) return r;
  r.status = std::stoi(resp.substr(9, 3));
  std::string head = resp.substr(0, head_end);
  for (const char* key : {"Content-Type: ", "content-type: "}) {
    auto p = head.find(key);
    if (p != std::string::npos) r.content_type = head.substr(p + 14, head.find("\r\n", p) - p - 14);
  }
  r.body = resp.substr(head_end + 4);
  return r;
}

}  // namespace sy::it
