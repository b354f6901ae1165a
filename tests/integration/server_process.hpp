// Shared by the integration tests: starts the real `switchyard serve` process on loopback (free
// ports chosen by the server itself: `tcp://127.0.0.1:*`) with tests/support/server_process.hpp,
// which reads the bound addresses from its stdout and stops it (SIGTERM, exit status) or kills it
// at the end. Plus small helpers: a temp folder, one-shot runs of the binary, an HTTP GET.
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
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/server_process.hpp"
#include "tests/support/temp_dir.hpp"

namespace sy::it {

/// The server binary (the build's `switchyard`; CTest sets SY_SERVER_BINARY=emu_switchyard for
/// the emu_it_* entries, which run the same suites against the emulated GPU, tests/emu) and the
/// shared models.
inline const std::string kBinary =
    std::string(SY_BINARY_DIR) + "/" +
    (std::getenv("SY_SERVER_BINARY") ? std::getenv("SY_SERVER_BINARY") : "switchyard");
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

namespace detail {
// The --state-dir folder a ServerProcess adds; a base listed before the process, so that it is
// made before the server starts and removed after the server is gone.
struct StateDir {
  explicit StateDir(bool make) : dir(make ? std::make_unique<TempDir>() : nullptr) {}
  std::unique_ptr<TempDir> dir;
};
inline bool has_state_flag(const std::vector<std::string>& args) {
  for (auto& a : args)
    if (a == "--state-dir" || a == "--journal" || a == "--no-journal") return true;
  return false;
}
}  // namespace detail

/// A running `switchyard serve` (tests/support/server_process.hpp). The constructor waits until
/// the server says "ready".
class ServerProcess : private detail::StateDir, public test::ServeProcess {
 public:
  /// `args` are passed after `serve`; `--bind tcp://127.0.0.1:*` is added unless `args` has
  /// --bind, and `--state-dir` (a temp folder of this object) unless `args` has --state-dir,
  /// --journal or --no-journal, so that no test writes a default journal into the real home
  /// folder. A test that restarts a server on its default journal passes its own --state-dir.
  /// Throws when the process exits or stays silent for `startup` before being ready. With
  /// `stderr_file`, the server's stderr is appended to that file (tests that read its messages).
  explicit ServerProcess(std::vector<std::string> args,
                         std::chrono::seconds startup = std::chrono::seconds(60),
                         const std::string& stderr_file = "")
      : detail::StateDir(!detail::has_state_flag(args)),
        test::ServeProcess(options(std::move(args), startup, stderr_file, dir.get())) {}

  /// The server's counters: sends SIGUSR1 and reads the "switchyard: stats {json}" line it
  /// prints (fields of sy::ServerSnapshot). Throws when no answer comes within 10 s.
  std::map<std::string, int64_t> stats() {
    auto line = stats_line(std::chrono::seconds(10));
    if (!line) throw std::runtime_error("no stats line from the server");
    std::map<std::string, int64_t> out;
    const auto j = nlohmann::json::parse(*line);
    for (const auto& [k, v] : j.items())
      out[k] = v.is_number_integer() ? v.get<int64_t>() : 0;
    return out;
  }

  /// A field of /proc/PID/status in kB (e.g. "VmHWM", "VmRSS"); -1 when unreadable.
  long proc_status_kb(const std::string& field) const {
    std::ifstream f("/proc/" + std::to_string(pid()) + "/status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind(field + ":", 0) == 0)
        return std::strtol(line.c_str() + field.size() + 1, nullptr, 10);
    }
    return -1;
  }

 private:
  static test::ServeOptions options(std::vector<std::string> args, std::chrono::seconds startup,
                                    const std::string& stderr_file, const TempDir* state) {
    bool has_bind = false;
    for (auto& a : args) has_bind |= a == "--bind";
    test::ServeOptions o;
    o.binary = kBinary;
    if (!has_bind) o.args = {"--bind", "tcp://127.0.0.1:*"};
    if (state) {
      o.args.push_back("--state-dir");
      o.args.push_back(state->path());
    }
    o.args.insert(o.args.end(), args.begin(), args.end());
    o.startup = startup;
    o.stderr_file = stderr_file;
    return o;
  }
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
