// A whole Switchyard server process: the actor system, the model, the actors (egress, admission,
// router, batcher+executor pairs) and the ZeroMQ gateway, wired together and shut down in order.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "server/config.hpp"

namespace sy {

/// Counters of a running server, gathered from its actors and gateway (for logs and tests).
struct ServerSnapshot {
  int64_t active_jobs = 0;           ///< admitted and not yet finished (admission's view)
  int64_t admitted = 0;              ///< jobs admission handed to the router
  int64_t overloaded = 0;            ///< submits refused because a class queue was full
  int64_t queued = 0;                ///< waiting in the router's queues
  int64_t dispatched = 0;            ///< jobs the router gave to batchers
  int64_t affinity_hits = 0;         ///< of those, sent where their prompt prefix went before
  int64_t affinity_overruled = 0;    ///< a prefix match lost to the balance rule (slack)
  int64_t lost_requeued = 0;         ///< jobs of a batcher that went down, run again elsewhere
  int64_t lost_failed = 0;           ///< jobs of a batcher that went down, ended with engine_dead
  int64_t expired = 0;               ///< jobs whose deadline passed in the queue (never dispatched)
  int64_t running = 0;               ///< sequences running in the batchers (all pairs)
  int64_t blocks_used = 0;           ///< KV blocks held by sequences (all pairs)
  int64_t blocks_total = 0;          ///< KV blocks in the pools (all pairs)
  int64_t blocks_cached = 0;         ///< unreferenced KV blocks kept for prefix reuse (all pairs)
  int64_t policy_swaps = 0;          ///< KV-policy swaps, by command and by watermark (all pairs)
  int64_t prefix_hit_tokens = 0;     ///< prompt tokens whose KV came from the prefix cache
  int64_t preemptions = 0;           ///< sequences preempted under KV pressure
  int64_t steps = 0;                 ///< engine steps planned by the batchers
  uint64_t received = 0;             ///< client frames the gateway read
  uint64_t sent = 0;                 ///< server messages the gateway delivered
  uint64_t decode_errors = 0;        ///< malformed client messages answered with an error
  uint64_t curve_refused = 0;        ///< CURVE handshakes the client allow-list refused
  uint64_t intake_refused = 0;       ///< requests refused: admission's mailbox was at its bound
  uint64_t connections_refused = 0;  ///< connections closed at once: endpoints.max_connections
  int64_t connections_open = 0;      ///< client connections open (request + pipeline input)
  int64_t executors = 0;             ///< active batcher+executor pairs (supervisor)
  int64_t scale_ups = 0;             ///< pairs added under load
  int64_t scale_downs = 0;           ///< pairs retired when idle
  int64_t executor_failures = 0;     ///< executors that crashed or hung (replaced)
  int64_t seq_failures = 0;          ///< sequences ended alone (bad sampling state, NaN logits)
  int64_t requeued = 0;              ///< jobs re-queued after executor failures
  int64_t recoveries = 0;            ///< faults whose first re-queued job ran again
  int64_t recovery_ms_last = -1;     ///< fault -> first re-queued job running, last fault (ms)
  int64_t recovery_ms_max = -1;      ///< the same, worst so far
  int64_t journal_accepted = 0;      ///< accept records written by this process (journal on)
  int64_t journal_results = 0;       ///< result records written by this process: jobs completed
  int64_t journal_syncs = 0;         ///< fdatasync calls (group commit: far fewer than records)
  int64_t journal_replayed = 0;      ///< jobs of the previous run re-queued at start
  int64_t journal_restored = 0;      ///< results of the previous run kept for resubmissions
  int64_t journal_redelivered = 0;   ///< results of the previous run delivered again at start
  int64_t journal_write_errors = 0;  ///< writes, syncs, compactions the file system refused
  int64_t journal_failing = 0;       ///< 1 from a refused write until the next good one
  int64_t journal_refused = 0;       ///< submits refused (unavailable): the journal could not write
  int64_t journal_held_results = 0;  ///< results waiting for room in the journal (replies held)
  /// One line of JSON with every field (the `serve` command prints it on SIGUSR1).
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
