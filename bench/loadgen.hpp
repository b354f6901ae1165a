// Internal to bench_loadgen (bench/bench_loadgen.cpp and bench/loadgen_*.cpp): the options, the
// spawned server, the runner of one phase and the statistics that its modes share.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "bench/loadgen_workload.hpp"
#include "bench/peer_http.hpp"
#include "clients/cpp/client.hpp"
#include "ingress/codec.hpp"
#include "tests/support/server_process.hpp"

namespace sy::bench::loadgen {

namespace fs = std::filesystem;

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---- options (loadgen_options.cpp) ---------------------------------------------------------

/// One entry of --mix: jobs of this class and tenant get `weight` of the arrivals.
struct MixEntry {
  std::string cls;  // "" = the server's default class
  std::string tenant;
  std::string token;
  double weight = 1;
};

struct Options {
  std::string server;
  bool spawn = false;
  std::vector<std::string> serve_args;  // forwarded to `switchyard serve`
  std::string switchyard;               // the binary; default: next to this build's bench/
  std::optional<std::string> model;     // --model as forwarded (for the vocabulary size)
  double rate = 0;                      // > 0: open loop
  uint32_t burst = 1;                   // open loop: jobs sent together at each arrival instant
  int concurrency = 1;                  // closed loop (when rate == 0)
  uint64_t jobs = 0;                    // 0: use duration
  double duration_s = 0;
  std::vector<MixEntry> mix = {{"", "loadgen", "", 1}};
  PromptShape prompt;   // --prompt-len bounds, --prompt-dist, --profile
  std::string profile;  // the --profile name, "" for none
  bool prompt_text = false;
  int vocab = 0;  // 0: from the model file, else 256
  Range max_tokens{16, 16};
  bool stream = true;
  bool ignore_eos = true;
  double temperature = 0;
  double slo_ttft_ms = 0, slo_tpot_ms = 0;  // 0: no SLO on that metric
  int sockets = 0;                          // 0: min(concurrency, 16), or 16 open-loop
  uint64_t warmup = 0;
  std::string plot;
  std::string plot_script;
  bool overhead = false;
  uint64_t latency_jobs = 5000;
  double timeout_s = 60;  // no message for this long while jobs are in flight: give up
  uint64_t seed = 1;
  uint64_t multi_turn = 0;             // > 0: conversations of the multi-turn mode
  uint32_t turns = 4;                  // turns per conversation
  uint32_t user_len = 32;              // tokens (ids) or words (text) of each later user turn
  std::string prefix_cache;            // "", "on", "off", "both": batching.prefix_cache of --spawn
  std::string peer_llama_server;       // a llama-server binary: the side-by-side mode
  std::vector<std::string> peer_args;  // extra llama-server flags (--peer-arg, repeatable)
  int rounds = 3;                      // side-by-side rounds (ours, peer, ours, peer, ...)
  int threads = 0;                     // --threads as forwarded (0: not given)
  // --http: drive ours over its OpenAI HTTP door (POST /v1/completions, streamed) with the
  // client of the llama-server peer; with --peer-llama-server, the peer over the same endpoint.
  bool http = false;
  std::string http_host;  // --http --server HOST:PORT: a running HTTP server
  int http_port = 0;
};

/// The usage text, printed for --help and after a UsageError.
extern const char* kUsage;
/// The options of a command line (--help prints kUsage and exits); throws UsageError.
Options parse(int argc, char** argv);

// ---- the spawned server (loadgen_server.cpp) -------------------------------------------------

/// A `switchyard serve` child on a wildcard loopback port (tests/support/server_process.hpp);
/// stopped (SIGTERM, then SIGKILL) at the end, and sent SIGTERM by the kernel if this process dies
/// first (PR_SET_PDEATHSIG).
class Spawned {
 public:
  Spawned(const std::string& bin, const std::vector<std::string>& extra);
  Spawned(const Spawned&) = delete;
  Spawned& operator=(const Spawned&) = delete;
  ~Spawned() { stop(); }

  const std::string& endpoint() const { return proc_.endpoint(); }
  /// False once the server has exited.
  bool alive() { return proc_.alive(); }

  /// The server's counters (SIGUSR1 → one 'switchyard: stats {json}' line), or "" on timeout.
  std::string stats();

  void stop();

 private:
  static sy::test::ServeOptions options(const std::string& bin,
                                        const std::vector<std::string>& extra);

  sy::test::ServeProcess proc_;
};

/// The switchyard binary next to this build's bench/ directory.
std::string default_switchyard();

/// A temporary directory holding a server config that sets only batching.prefix_cache; removed
/// when this goes out of scope.
class CacheConfig {
 public:
  explicit CacheConfig(bool on);
  CacheConfig(const CacheConfig&) = delete;
  CacheConfig& operator=(const CacheConfig&) = delete;
  ~CacheConfig();
  const std::string& path() const { return path_; }

 private:
  fs::path dir_;
  std::string path_;
};

// ---- one run (loadgen_runner.cpp) ------------------------------------------------------------

int64_t now_ns();

/// What we saw of one job. Times are steady-clock ns; 0 = not seen.
struct Job {
  uint32_t mix = 0;
  bool warm = false;  // a warm-up job: not counted
  bool finished = false, ok = false;
  std::optional<sy::ErrorCode> error;
  std::string failure;  // a peer's failure (the peer has no error codes of ours)
  int64_t t_submit = 0, t_first = 0, t_last = 0, t_done = 0;
  uint32_t tokens = 0;
  uint32_t prompt_sent = 0;    // prompt length drawn (ids, or words of a text prompt)
  uint32_t prompt_tokens = 0;  // the server's count (done.usage.prompt_tokens)
  std::vector<float> itl_ms;   // gaps between consecutive chunks
  sy::wire::Timings server;
};

struct Phase {
  int concurrency = 1;
  double rate = 0;
  uint64_t jobs = 0;
  double duration_s = 0;
  uint64_t warmup = 0;
  uint32_t burst = 1;  // open loop: jobs per arrival instant (1: Poisson)
};

struct RunData {
  std::vector<Job> jobs;
  int64_t t_start = 0, t_end = 0;  // first counted submit, last counted completion
  uint64_t unmatched = 0;          // server messages naming no job of ours
  std::vector<double> lag_ms;      // open loop: real send time minus the scheduled arrival
  bool timed_out = false;
};

// The words of --prompt-kind text prompts (inline: the runner and the multi-turn mode draw them).
inline const char* kWords[] = {"once",  "upon", "a",   "time",  "there", "was",  "little", "girl",
                               "named", "lily", "she", "loved", "to",    "play", "in",     "the",
                               "park",  "with", "her", "dog",   "one",   "day",  "saw",    "big",
                               "red",   "ball", "and", "happy", "sun",   "tree", "went",   "home"};

/// The load generator's client sockets on one ZeroMQ context, polled together, and the limits
/// their replies are decoded under (a non-streamed done carries the whole completion).
struct ClientSockets {
  ClientSockets(const std::string& endpoint, int n);
  zmq::context_t ctx{1};
  std::vector<std::unique_ptr<sy::client::Client>> clients;
  std::vector<zmq::pollitem_t> items;  // clients[k]'s socket is items[k]
  sy::wire::DecodeLimits limits;
};

class Runner {
 public:
  Runner(const Options& o, const std::string& endpoint, int vocab);

  /// Round trips of `n` pings on one socket (the gateway answers them itself): the share of the
  /// latency that is ZeroMQ and the gateway thread, without any actor.
  std::vector<double> ping_rtt_ms(int n);

  /// Prompts and lengths to send instead of random ones (job i takes entry i); null: random.
  void set_workload(const std::vector<sy::bench::PeerRequest>* w) { workload_ = w; }

  RunData run(const Phase& ph);

 private:
  sy::wire::Submit make_submit(size_t idx, uint32_t mix);
  uint32_t pick(const Range& r);
  // Records one message; true when it ended its job.
  bool handle(RunData& d, const sy::wire::ServerMessage& m, int64_t t);

  const Options& o_;
  int vocab_;
  std::mt19937_64 rng_;
  ClientSockets net_;
  std::discrete_distribution<uint32_t> pick_mix_;
  std::string tag_;
  size_t base_ = 0, next_base_ = 0;
  const std::vector<sy::bench::PeerRequest>* workload_ = nullptr;
  uint32_t last_prompt_len_ = 0;  // the length make_submit drew last
};

// ---- statistics (loadgen_report.cpp) ---------------------------------------------------------

using Json = nlohmann::ordered_json;  // keys in the order written

Json num(double v);
std::string dump(const Json& j);
double pct(const std::vector<double>& sorted, double p);
Json dist(std::vector<double> v, double scale = 1);

/// The samples of one group of jobs (all, a class, a tenant).
struct Group {
  uint64_t submitted = 0, completed = 0, good = 0, out_tokens = 0, good_tokens = 0;
  std::map<std::string, uint64_t> errors;
  uint64_t met_ttft = 0, met_tpot = 0;  // completed jobs within each SLO on its own
  std::vector<double> ttft, tpot, itl, e2e, s_queue, s_ttft, s_total, prompt_sent, prompt_tokens;
};

struct Report {
  Json json;
  Group all;
  std::map<std::string, Group> by_class;
};

Report summarize(const Options& o, const Phase& ph, const RunData& d);
/// Writes the latency CDFs of `r` to o.plot (a PNG, by bench/plot_latency.py).
void plot(const Options& o, const Report& r, const std::string& title);
Json options_json(const Options& o, const std::string& endpoint);
Json loadavg();
Json server_stats(const std::string& line);

// ---- the other modes -------------------------------------------------------------------------

/// --multi-turn (loadgen_multi_turn.cpp): prints its JSON; returns the exit status.
int multi_turn_main(const Options& o, int vocab);
/// --peer-llama-server and --http (loadgen_peer.cpp): rounds of one closed-loop workload against
/// ours (and the peer); prints its JSON; returns the exit status.
int peer_main(const Options& o, int vocab);

}  // namespace sy::bench::loadgen
