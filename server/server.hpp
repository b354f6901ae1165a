// A whole Switchyard server process: the actor system, the model, the actors (egress, admission,
// router, batcher+executor pairs) and the ZeroMQ gateway, wired together and shut down in order.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "actors/stats.hpp"
#include "server/config.hpp"

namespace sy {

/// Counters of a running server, gathered from its actors and gateway (for logs and tests): the
/// gateway's counters (received, sent, ... are fields of the snapshot itself), then each actor's
/// stats record.
struct ServerSnapshot : EdgeStats {
  AdmissionStats admission;
  RouterStats router;
  SupervisorStats supervisor;  ///< its own counters and its live batchers' summed
  JournalStats journal;        ///< all zeros without a journal
  /// One line of JSON: the summary fields (stats_fields::kSummary) of every record, the journal's
  /// prefixed `journal_` (the `serve` command prints it on SIGUSR1).
  std::string to_json() const;
};

/// One server. The constructor loads the model and spawns the actors; start() binds the sockets.
/// Not copyable; all methods are called from one (the main) thread.
class Server {
 public:
  /// `cfg` must be finalized (finalize_config). A cpu backend needs cfg.model set (the CLI puts
  /// the demo model there); the null backend loads none. Throws on a bad model or config.
  explicit Server(ServerConfig cfg);
  /// Stops at once (no grace) if still running.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds the sockets (throws on a bad or busy address) and starts serving.
  void start();
  /// The bound addresses, wildcard ports resolved ("" when off). Valid after start().
  std::string endpoint() const;
  std::string pull_endpoint() const;
  std::string results_endpoint() const;
  /// The HTTP door's address "HOST:PORT" as bound ("" when off). Valid after start().
  std::string http_endpoint() const;
  /// The metrics HTTP address "HOST:PORT" as bound ("" when off). Valid after start().
  std::string metrics_endpoint() const;

  /// Graceful stop: refuse new work (every new submit is answered `unavailable` at once, cancel
  /// and status still work), let in-flight jobs finish for up to `grace`, then cancel the rest (their clients get done "cancelled"), close the sockets and stop every
  /// actor. Idempotent.
  void shutdown(std::chrono::milliseconds grace);
  /// A snapshot of the counters (asks the actors; waits at most a second).
  ServerSnapshot snapshot();

  /// Blocks SIGINT, SIGTERM and SIGUSR1 in the calling thread and every thread started after it. Call at
  /// the top of main, before any thread exists, so the signals reach only wait_for_signal().
  static void block_signals();
  /// Waits for SIGINT, SIGTERM or SIGUSR1 (blocked first with block_signals) and returns its
  /// number.
  static int wait_for_signal();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sy
