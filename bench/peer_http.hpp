// A llama-server as the peer of bench_loadgen: starts it on a loopback port and waits for its
// /health; and the closed-loop client of streamed completions (llama-server's POST /completion or
// OpenAI's POST /v1/completions, which drives our HTTP door too) over keep-alive HTTP/1.1
// connections, one thread polling them all (as the ZeroMQ client does ours).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/peer_stream.hpp"

namespace sy::bench {

struct LlamaServerOptions {
  std::string binary;              // the llama-server executable
  std::string model;               // the GGUF file
  int threads = 1;                 // -t and -tb
  int parallel = 1;                // -np: slots, one per request in flight
  int ctx = 0;                     // -c: all slots together (each gets ctx / parallel)
  std::vector<std::string> extra;  // appended to the command line
  // Loading a model on a busy 2-core machine may take a while.
  std::chrono::seconds startup{180};
};

/// A port on 127.0.0.1 that was free a moment ago (bound to 0 and released): a server started
/// next binds it.
int free_loopback_port();

/// The answer of one GET: status 0 when none came (`error` says why).
struct HttpAnswer {
  int status = 0;
  std::string body;
  std::string error;
};

/// GET `path` from host:port on a connection of its own (Connection: close); gives up after
/// `timeout`.
HttpAnswer http_get(const std::string& host, int port, const std::string& path,
                    std::chrono::seconds timeout = std::chrono::seconds(5));

/// A running llama-server child; its stdout and stderr go to a log file in a temporary directory
/// (quoted when it fails). The kernel sends it SIGTERM if this process dies first.
class LlamaServer {
 public:
  /// Starts it and returns once GET /health answers 200 {"status": "ok"}; throws with the tail
  /// of its log when it exits or is not ready within `startup`.
  explicit LlamaServer(const LlamaServerOptions& o);
  LlamaServer(const LlamaServer&) = delete;
  LlamaServer& operator=(const LlamaServer&) = delete;
  ~LlamaServer();

  int port() const { return port_; }
  const std::vector<std::string>& argv() const { return argv_; }
  /// The last `bytes` of its log.
  std::string log_tail(size_t bytes = 4000) const;
  /// SIGTERM, then SIGKILL after 10 s.
  void stop();

 private:
  void wait_ready(std::chrono::seconds startup);
  bool healthy(std::string& why) const;

  pid_t pid_ = -1;
  int port_ = 0;
  std::string dir_, log_;
  std::vector<std::string> argv_;
};

/// Where the client sends its requests, and in which API.
struct HttpTarget {
  std::string host = "127.0.0.1";
  int port = 0;
  PeerApi api = PeerApi::llama_native;
  std::string model;                  // OpenAI's `model` ("": not sent)
  std::string name = "llama-server";  // the server, in error messages
};

/// What the client saw of one request. Times are steady-clock ns; 0 = not seen.
struct PeerJob {
  bool warm = false, finished = false, ok = false;
  std::string error;  // why it failed ("" when ok)
  int64_t t_submit = 0, t_first = 0, t_last = 0, t_done = 0;
  uint32_t streamed_tokens = 0;  // native: ids in the streamed chunks
  uint32_t text_chunks = 0;      // chunks with text (OpenAI: the first one is TTFT)
  // The tokens generated: native, the final chunk's tokens_predicted; OpenAI, the usage's
  // completion_tokens.
  int64_t tokens_predicted = -1;
  int64_t predicted_n = -1;   // llama-server's timings.predicted_n of the final chunk
  std::string finish_reason;  // OpenAI: choices[0].finish_reason ("length" with ignore_eos)
  bool done_marker = false;   // OpenAI: "data: [DONE]" came
  double prompt_ms = 0, predicted_ms = 0;
  std::vector<float> itl_ms;  // gaps between consecutive token chunks
};

struct PeerRun {
  std::vector<PeerJob> jobs;
  int64_t t_start = 0, t_end = 0;  // first counted send, last counted completion
  bool timed_out = false;
  uint64_t connections_opened = 0;
  // Requests sent again on a new connection after the server closed a kept-alive one first.
  uint64_t resent_on_new_connection = 0;
};

/// Sends `requests` to `target` in order, at most `concurrency` in flight; the first `warmup` are
/// not counted. Gives up (timed_out) when no byte arrives for `timeout_s` while requests are open.
/// A request fails unless its answer is 200 and a whole stream: native, up to the final (stop)
/// chunk; OpenAI, a finish_reason, the usage and "data: [DONE]".
PeerRun run_peer(const HttpTarget& target, const std::vector<PeerRequest>& requests, size_t warmup,
                 int concurrency, double timeout_s);

}  // namespace sy::bench
