// Load generator for a Switchyard server: open-loop Poisson or closed-loop traffic over a pool of
// DEALER sockets; prints TTFT/TPOT/ITL/end-to-end percentiles, throughput, goodput and rejections
// (overall, per class, per tenant) as one JSON object, optionally a PNG of the latency CDFs.
//
//   bench_loadgen (--server ADDR | --spawn [serve flags...]) [--rate R | --concurrency C]
//                 [--jobs N | --duration S] [--mix CLASS:TENANT:WEIGHT[:TOKEN],...]
//                 [--prompt-len N|A..B] [--prompt-kind ids|text] [--vocab N]
//                 [--max-tokens N|A..B] [--no-stream] [--no-ignore-eos] [--temperature T]
//                 [--slo-ttft-ms MS] [--slo-tpot-ms MS] [--sockets K] [--warmup N]
//                 [--plot FILE.png] [--overhead] [--latency-jobs N] [-- more serve args]
//   bench_loadgen ... --multi-turn N_CONVERSATIONS [--turns T] [--user-len N]
//                 [--prefix-cache on|off|both]    (chat sessions resending their history)
//   bench_loadgen --spawn --model FILE --peer-llama-server PATH [--rounds N] [--peer-arg A]...
//                 (the same closed-loop workload against ours and a llama-server, alternating)
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "bench/peer_http.hpp"
#include "clients/cpp/client.hpp"
#include "ingress/codec.hpp"
#include "model/gguf.hpp"
#include "model/llama.hpp"
#include "tests/support/server_process.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---- options ----------------------------------------------------------------------------------

/// A length distribution: fixed (lo == hi) or uniform on [lo, hi].
struct Range {
  uint32_t lo = 1, hi = 1;
};

Range parse_range(const std::string& key, const std::string& s) {
  Range r;
  try {
    auto dots = s.find("..");
    if (dots == std::string::npos) {
      r.lo = r.hi = static_cast<uint32_t>(std::stoul(s));
    } else {
      r.lo = static_cast<uint32_t>(std::stoul(s.substr(0, dots)));
      r.hi = static_cast<uint32_t>(std::stoul(s.substr(dots + 2)));
    }
  } catch (const std::exception&) {
    throw UsageError("--" + key + " must be N or A..B, got '" + s + "'");
  }
  if (r.lo < 1 || r.hi < r.lo) throw UsageError("--" + key + " needs 1 <= A <= B");
  return r;
}

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
  int concurrency = 1;                  // closed loop (when rate == 0)
  uint64_t jobs = 0;                    // 0: use duration
  double duration_s = 0;
  std::vector<MixEntry> mix = {{"", "loadgen", "", 1}};
  Range prompt_len{16, 16};
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
};

// Serve flags that --spawn forwards as they are (the rest of the serve flags go after `--`).
const std::set<std::string> kServeValueFlags = {"model",   "config", "backend",  "executors",
                                                "threads", "kv-mb",  "grace-ms", "step-delay-ms"};

const char* kUsage =
    "usage: bench_loadgen (--server ADDR | --spawn [--backend null|cpu] [--model FILE]\n"
    "         [--executors N] [--threads N] [--config FILE] [--kv-mb MB] ...)\n"
    "       [--rate JOBS_PER_S | --concurrency C] [--jobs N | --duration S]\n"
    "       [--mix CLASS:TENANT:WEIGHT[:TOKEN],...] [--prompt-len N|A..B]\n"
    "       [--prompt-kind ids|text]"
    " [--vocab N] [--max-tokens N|A..B] [--no-stream] [--no-ignore-eos] [--temperature T]\n"
    "       [--slo-ttft-ms MS] [--slo-tpot-ms MS] [--sockets K] [--warmup N] [--seed N]\n"
    "       [--timeout-s S] [--plot FILE.png] [--plot-script FILE.py] [--switchyard BIN]\n"
    "       [--overhead [--latency-jobs N]] [-- extra serve args]\n"
    "--overhead: 1-token jobs; closed loop at --concurrency (default 64) for jobs/s, then\n"
    "concurrency 1 for --latency-jobs jobs: end-to-end latency = the runtime's own overhead\n"
    "(use with the null backend).\n"
    "--multi-turn N [--turns T] [--user-len U] [--prefix-cache on|off|both]: N conversations\n"
    "at once, each resending its whole history (first prompt --prompt-len, then per turn the\n"
    "completion and U new user tokens); TTFT over turns >= 2 and the cached prompt share.\n"
    "--prefix-cache (with --spawn) sets the server's batching.prefix_cache; both: two servers.\n"
    "--peer-llama-server PATH [--rounds N] [--peer-arg ARG]... (with --spawn --model FILE):\n"
    "the same closed-loop workload (--concurrency, --jobs per round, default 4 x concurrency)\n"
    "against ours and a llama-server on the same file, alternating rounds; prints ratios.\n";

double to_double(const std::string& k, const std::string& v) {
  try {
    size_t pos = 0;
    double d = std::stod(v, &pos);
    if (pos != v.size()) throw std::invalid_argument("trailing");
    return d;
  } catch (const std::exception&) {
    throw UsageError("--" + k + " must be a number, got '" + v + "'");
  }
}

std::vector<MixEntry> parse_mix(const std::string& s) {
  std::vector<MixEntry> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::vector<std::string> f;
    std::stringstream is(item);
    std::string x;
    while (std::getline(is, x, ':')) f.push_back(x);
    if (f.size() < 3 || f.size() > 4 || f[1].empty())
      throw UsageError("--mix entries are CLASS:TENANT:WEIGHT[:TOKEN], got '" + item + "'");
    MixEntry e{f[0], f[1], f.size() == 4 ? f[3] : "", to_double("mix", f[2])};
    if (!(e.weight > 0)) throw UsageError("--mix weights must be > 0");
    out.push_back(e);
  }
  if (out.empty()) throw UsageError("--mix is empty");
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  bool concurrency_set = false, jobs_set = false, peer_flags = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      for (++i; i < argc; ++i) o.serve_args.push_back(argv[i]);
      break;
    }
    if (a.rfind("--", 0) != 0) throw UsageError("unexpected argument '" + a + "'");
    std::string k = a.substr(2);
    if (k == "help") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (k == "spawn") {
      o.spawn = true;
      continue;
    }
    if (k == "stream") {
      o.stream = true;
      continue;
    }
    if (k == "no-stream") {
      o.stream = false;
      continue;
    }
    if (k == "ignore-eos") {
      o.ignore_eos = true;
      continue;
    }
    if (k == "no-ignore-eos") {
      o.ignore_eos = false;
      continue;
    }
    if (k == "overhead") {
      o.overhead = true;
      continue;
    }
    static const std::set<std::string> kValueFlags = {"server",       "switchyard",
                                                      "rate",         "concurrency",
                                                      "jobs",         "duration",
                                                      "mix",          "prompt-len",
                                                      "prompt-kind",  "vocab",
                                                      "max-tokens",   "temperature",
                                                      "slo-ttft-ms",  "slo-tpot-ms",
                                                      "sockets",      "warmup",
                                                      "plot",         "plot-script",
                                                      "latency-jobs", "timeout-s",
                                                      "seed",         "multi-turn",
                                                      "turns",        "user-len",
                                                      "prefix-cache", "peer-llama-server",
                                                      "rounds",       "peer-arg"};
    if (!kValueFlags.count(k) && !kServeValueFlags.count(k))
      throw UsageError("unknown option --" + k);
    if (i + 1 >= argc) throw UsageError("--" + k + " needs a value");
    std::string v = argv[++i];
    if (kServeValueFlags.count(k)) {
      o.serve_args.push_back(a);
      o.serve_args.push_back(v);
      if (k == "model") o.model = v;
      if (k == "threads") o.threads = static_cast<int>(to_double(k, v));
    } else if (k == "server")
      o.server = v;
    else if (k == "switchyard")
      o.switchyard = v;
    else if (k == "rate")
      o.rate = to_double(k, v);
    else if (k == "concurrency") {
      o.concurrency = static_cast<int>(to_double(k, v));
      concurrency_set = true;
    } else if (k == "jobs") {
      o.jobs = static_cast<uint64_t>(to_double(k, v));
      jobs_set = true;
    } else if (k == "duration")
      o.duration_s = to_double(k, v);
    else if (k == "mix")
      o.mix = parse_mix(v);
    else if (k == "prompt-len")
      o.prompt_len = parse_range(k, v);
    else if (k == "prompt-kind") {
      if (v != "ids" && v != "text") throw UsageError("--prompt-kind must be ids or text");
      o.prompt_text = v == "text";
    } else if (k == "vocab")
      o.vocab = static_cast<int>(to_double(k, v));
    else if (k == "max-tokens")
      o.max_tokens = parse_range(k, v);
    else if (k == "temperature")
      o.temperature = to_double(k, v);
    else if (k == "slo-ttft-ms")
      o.slo_ttft_ms = to_double(k, v);
    else if (k == "slo-tpot-ms")
      o.slo_tpot_ms = to_double(k, v);
    else if (k == "sockets")
      o.sockets = static_cast<int>(to_double(k, v));
    else if (k == "warmup")
      o.warmup = static_cast<uint64_t>(to_double(k, v));
    else if (k == "plot")
      o.plot = v;
    else if (k == "plot-script")
      o.plot_script = v;
    else if (k == "latency-jobs")
      o.latency_jobs = static_cast<uint64_t>(to_double(k, v));
    else if (k == "timeout-s")
      o.timeout_s = to_double(k, v);
    else if (k == "seed")
      o.seed = static_cast<uint64_t>(to_double(k, v));
    else if (k == "multi-turn")
      o.multi_turn = static_cast<uint64_t>(to_double(k, v));
    else if (k == "turns")
      o.turns = static_cast<uint32_t>(to_double(k, v));
    else if (k == "user-len")
      o.user_len = static_cast<uint32_t>(to_double(k, v));
    else if (k == "prefix-cache") {
      if (v != "on" && v != "off" && v != "both")
        throw UsageError("--prefix-cache must be on, off or both");
      o.prefix_cache = v;
    } else if (k == "peer-llama-server")
      o.peer_llama_server = v;
    else if (k == "rounds") {
      o.rounds = static_cast<int>(to_double(k, v));
      peer_flags = true;
    } else if (k == "peer-arg") {
      o.peer_args.push_back(v);
      peer_flags = true;
    } else
      throw UsageError("unknown option --" + k);
  }
  if (o.spawn == !o.server.empty()) throw UsageError("give exactly one of --server and --spawn");
  if (!o.spawn && !o.serve_args.empty())
    throw UsageError("serve flags (" + o.serve_args.front() + ") need --spawn");
  if (o.rate < 0) throw UsageError("--rate must be > 0");
  if (o.rate > 0 && concurrency_set) throw UsageError("give --rate or --concurrency, not both");
  if (o.overhead) {
    if (o.rate > 0) throw UsageError("--overhead is closed-loop: no --rate");
    if (!concurrency_set) o.concurrency = 64;
    if (!jobs_set && o.duration_s <= 0) o.jobs = 50000;
    o.max_tokens = {1, 1};
    if (o.prompt_len.lo == 16 && o.prompt_len.hi == 16) o.prompt_len = {4, 4};
    if (o.warmup == 0) o.warmup = 1000;
  }
  if (!o.prefix_cache.empty()) {
    if (!o.spawn)
      throw UsageError("--prefix-cache sets the spawned server's config: needs --spawn");
    for (size_t i = 0; i < o.serve_args.size(); ++i)
      if (o.serve_args[i] == "--config")
        throw UsageError("--prefix-cache writes the server's config file: no --config with it");
  }
  if (o.multi_turn > 0) {
    if (o.overhead || o.rate > 0)
      throw UsageError("--multi-turn is its own closed loop: no --overhead or --rate");
    if (o.turns < 1 || o.turns > 10000) throw UsageError("--turns must be in [1, 10000]");
    if (o.user_len < 1) throw UsageError("--user-len must be >= 1");
    // The next turn needs this one's completion: the mode waits for every turn to finish.
    if (!concurrency_set)
      o.concurrency = static_cast<int>(std::min<uint64_t>(o.multi_turn, 100000));
  }
  if (!o.peer_llama_server.empty()) {
    if (!o.spawn || !o.model)
      throw UsageError("--peer-llama-server runs both servers on one file: needs --spawn --model");
    if (o.rate > 0 || o.overhead || o.multi_turn > 0)
      throw UsageError(
          "--peer-llama-server is a closed loop: no --rate, --overhead or --multi-turn");
    if (o.prompt_text || !o.stream)
      throw UsageError(
          "--peer-llama-server sends token ids and streams: no --prompt-kind text, "
          "no --no-stream");
    if (o.duration_s > 0) throw UsageError("--peer-llama-server counts --jobs per round");
    if (!o.ignore_eos)
      throw UsageError(
          "--peer-llama-server checks that both generate exactly --max-tokens: no "
          "--no-ignore-eos");
    if (o.rounds < 1 || o.rounds > 100) throw UsageError("--rounds must be in [1, 100]");
    if (o.concurrency < 1 || o.concurrency > 1024)
      throw UsageError("--concurrency with --peer-llama-server must be in [1, 1024] (its slots)");
    // A few batches' worth per round: long enough to reach the steady state, short enough for
    // three rounds of a 110M model on two cores.
    if (!jobs_set) o.jobs = 4 * static_cast<uint64_t>(o.concurrency);
    if (o.threads == 0) {
      // Both sides get the same thread count: all cores unless --threads says otherwise.
      o.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      o.serve_args.insert(o.serve_args.end(), {"--threads", std::to_string(o.threads)});
    }
  } else if (peer_flags) {
    throw UsageError("--rounds and --peer-arg belong to --peer-llama-server");
  }
  if (o.concurrency < 1 || o.concurrency > 100000) throw UsageError("--concurrency must be >= 1");
  if (o.jobs == 0 && o.duration_s <= 0) o.jobs = 1000;
  if (o.jobs > 0 && o.duration_s > 0) throw UsageError("give --jobs or --duration, not both");
  if (o.sockets < 0 || o.sockets > 4096) throw UsageError("--sockets must be in [1, 4096]");
  if (o.sockets == 0) o.sockets = o.rate > 0 ? 16 : std::min(o.concurrency, 16);
  return o;
}

// ---- the spawned server -----------------------------------------------------------------------

/// A `switchyard serve` child on a wildcard loopback port (tests/support/server_process.hpp);
/// stopped (SIGTERM, then SIGKILL) at the end, and sent SIGTERM by the kernel if this process dies
/// first (PR_SET_PDEATHSIG).
class Spawned {
 public:
  Spawned(const std::string& bin, const std::vector<std::string>& extra)
      : proc_(options(bin, extra)) {
    std::cerr << "bench_loadgen: " << proc_.ready_line() << "\n";
    if (proc_.endpoint().empty()) throw std::runtime_error("switchyard serve printed no endpoint");
  }
  Spawned(const Spawned&) = delete;
  Spawned& operator=(const Spawned&) = delete;
  ~Spawned() { stop(); }

  const std::string& endpoint() const { return proc_.endpoint(); }

  /// The server's counters (SIGUSR1 → one 'switchyard: stats {json}' line), or "" on timeout.
  std::string stats() {
    // The server answers at once; a second is plenty even under load.
    return proc_.stats_line(std::chrono::milliseconds(2000)).value_or("");
  }

  // The grace period is for in-flight jobs; all of ours are finished, so 10 s is generous.
  void stop() { proc_.stop(SIGTERM, std::chrono::seconds(10)); }

 private:
  static sy::test::ServeOptions options(const std::string& bin,
                                        const std::vector<std::string>& extra) {
    sy::test::ServeOptions o;
    o.binary = bin;
    o.args = {"--bind", "tcp://127.0.0.1:*"};
    o.args.insert(o.args.end(), extra.begin(), extra.end());
    // Loading a model may take a while on a busy 2-core machine.
    o.startup = std::chrono::seconds(180);
    o.death_signal = SIGTERM;
    return o;
  }

  sy::test::ServeProcess proc_;
};

std::string default_switchyard() {
  // bench_loadgen lives in BUILD/bench/, the server binary in BUILD/.
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "./switchyard";
  return (self.parent_path().parent_path() / "switchyard").string();
}

// ---- one run ------------------------------------------------------------------------------------

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

/// What we saw of one job. Times are steady-clock ns; 0 = not seen.
struct Job {
  uint32_t mix = 0;
  bool warm = false;  // a warm-up job: not counted
  bool finished = false, ok = false;
  std::optional<sy::ErrorCode> error;
  std::string failure;  // a peer's failure (the peer has no error codes of ours)
  int64_t t_submit = 0, t_first = 0, t_last = 0, t_done = 0;
  uint32_t tokens = 0;
  std::vector<float> itl_ms;  // gaps between consecutive chunks
  sy::wire::Timings server;
};

struct Phase {
  int concurrency = 1;
  double rate = 0;
  uint64_t jobs = 0;
  double duration_s = 0;
  uint64_t warmup = 0;
};

struct RunData {
  std::vector<Job> jobs;
  int64_t t_start = 0, t_end = 0;  // first counted submit, last counted completion
  uint64_t unmatched = 0;          // server messages naming no job of ours
  std::vector<double> lag_ms;      // open loop: real send time minus the scheduled arrival
  bool timed_out = false;
};

const char* kWords[] = {"once",  "upon", "a",   "time",  "there", "was",  "little", "girl",
                        "named", "lily", "she", "loved", "to",    "play", "in",     "the",
                        "park",  "with", "her", "dog",   "one",   "day",  "saw",    "big",
                        "red",   "ball", "and", "happy", "sun",   "tree", "went",   "home"};

class Runner {
 public:
  Runner(const Options& o, const std::string& endpoint, int vocab)
      : o_(o), vocab_(vocab), rng_(o.seed) {
    for (int i = 0; i < o.sockets; ++i)
      clients_.push_back(std::make_unique<sy::client::Client>(ctx_, endpoint));
    for (auto& c : clients_) items_.push_back({c->socket().handle(), 0, ZMQ_POLLIN, 0});
    std::vector<double> w;
    for (auto& m : o.mix) w.push_back(m.weight);
    pick_mix_ = std::discrete_distribution<uint32_t>(w.begin(), w.end());
    limits_.max_message_bytes = 64u << 20;  // a non-streamed done carries the whole completion
    limits_.max_string_bytes = 64u << 20;
    // Job ids must not collide with keys an external server remembers from earlier runs.
    tag_ = "lg" + std::to_string(std::random_device{}() % 1000000) + "-" +
           std::to_string(getpid()) + "-";
  }

  /// Round trips of `n` pings on one socket (the gateway answers them itself): the share of the
  /// latency that is ZeroMQ and the gateway thread, without any actor.
  std::vector<double> ping_rtt_ms(int n) {
    std::vector<double> out;
    auto& c = *clients_[0];
    for (int i = 0; i < n; ++i) {
      int64_t t = now_ns();
      // A second is far beyond any round trip on loopback: no answer means no server.
      if (!c.ping_wait(std::chrono::milliseconds(1000))) break;
      out.push_back((now_ns() - t) / 1e6);
    }
    return out;
  }

  /// Prompts and lengths to send instead of random ones (job i takes entry i); null: random.
  void set_workload(const std::vector<sy::bench::PeerRequest>* w) { workload_ = w; }

  RunData run(const Phase& ph) {
    RunData d;
    // Ids go on across phases: the server remembers finished keys and would answer a reused one
    // from its result cache without running it.
    base_ = next_base_;
    const uint64_t total = ph.jobs ? ph.jobs + ph.warmup : 0;
    if (total) d.jobs.reserve(total);
    std::exponential_distribution<double> gap(ph.rate > 0 ? ph.rate : 1.0);
    uint64_t inflight = 0;
    int64_t t0 = now_ns();
    int64_t next_arrival = t0;
    int64_t end_issue = ph.duration_s > 0 ? t0 + static_cast<int64_t>(ph.duration_s * 1e9) : 0;
    int64_t last_msg = t0;
    size_t first_counted = ph.warmup;
    auto can_issue = [&](int64_t now) {
      if (total) return d.jobs.size() < total;
      return d.jobs.size() < ph.warmup || now < end_issue;
    };
    auto issue = [&](int64_t now) {
      size_t idx = d.jobs.size();
      Job& j = d.jobs.emplace_back();
      j.mix = pick_mix_(rng_);
      j.warm = idx < ph.warmup;
      if (idx == first_counted) {
        d.t_start = now;
        // Duration runs count from the end of the warm-up.
        if (ph.duration_s > 0) end_issue = now + static_cast<int64_t>(ph.duration_s * 1e9);
      }
      auto& c = *clients_[idx % clients_.size()];
      auto s = make_submit(idx, j.mix);
      j.t_submit = now_ns();
      c.submit(s);
      ++inflight;
    };
    for (;;) {
      int64_t now = now_ns();
      long timeout_ms = 100;
      if (ph.rate > 0) {
        while (next_arrival <= now && can_issue(now)) {
          issue(now);
          if (d.jobs.size() > ph.warmup) d.lag_ms.push_back((now - next_arrival) / 1e6);
          next_arrival += static_cast<int64_t>(gap(rng_) * 1e9);
        }
        // zmq_poll counts whole milliseconds: rounding up wakes us at most 1 ms late (the lag is
        // reported, and latencies count from the real send), rather than spinning a core that
        // the server needs on a small machine.
        if (can_issue(now))
          timeout_ms = std::max<int64_t>(1, (next_arrival - now + 999999) / 1000000);
      } else {
        while (inflight < static_cast<uint64_t>(ph.concurrency) && can_issue(now)) issue(now);
      }
      if (inflight == 0 && !can_issue(now)) break;
      int n = zmq::poll(items_.data(), items_.size(), std::chrono::milliseconds(timeout_ms));
      now = now_ns();
      if (n == 0) {
        if (inflight > 0 && now - last_msg > static_cast<int64_t>(o_.timeout_s * 1e9)) {
          d.timed_out = true;
          break;
        }
        continue;
      }
      last_msg = now;
      for (size_t k = 0; k < items_.size(); ++k) {
        if (!(items_[k].revents & ZMQ_POLLIN)) continue;
        auto& sock = clients_[k]->socket();
        zmq::message_t msg;
        while (sock.recv(msg, zmq::recv_flags::dontwait)) {
          int64_t t = now_ns();
          auto dec = sy::wire::decode_server(msg.data(), msg.size(), limits_);
          if (auto* e = std::get_if<sy::wire::DecodeError>(&dec))
            throw std::runtime_error("undecodable server message: " + e->message);
          if (handle(d, std::get<sy::wire::ServerMessage>(dec), t)) --inflight;
        }
      }
    }
    next_base_ = base_ + d.jobs.size();
    d.t_end = d.t_start;
    for (size_t i = first_counted; i < d.jobs.size(); ++i)
      d.t_end = std::max(d.t_end, d.jobs[i].t_done);
    return d;
  }

 private:
  sy::wire::Submit make_submit(size_t idx, uint32_t mix) {
    const MixEntry& m = o_.mix[mix];
    sy::wire::Submit s;
    s.id = tag_ + std::to_string(base_ + idx);
    s.tenant = m.tenant;
    s.token = m.token;
    s.priority = m.cls;
    if (workload_) {
      const sy::bench::PeerRequest& w = workload_->at(idx);
      s.prompt = w.prompt;
      s.max_tokens = w.max_tokens;
      s.temperature = w.temperature;
      s.seed = w.seed;
      s.ignore_eos = w.ignore_eos;
      s.stream = true;
      return s;
    }
    uint32_t plen = pick(o_.prompt_len);
    if (o_.prompt_text) {
      std::string text;
      std::uniform_int_distribution<size_t> w(0, std::size(kWords) - 1);
      for (uint32_t i = 0; i < plen; ++i) {
        if (i) text += ' ';
        text += kWords[w(rng_)];
      }
      s.prompt = std::move(text);
    } else {
      std::vector<int32_t> ids(plen);
      std::uniform_int_distribution<int32_t> tok(0, vocab_ - 1);
      for (auto& t : ids) t = tok(rng_);
      s.prompt = std::move(ids);
    }
    s.max_tokens = pick(o_.max_tokens);
    s.temperature = o_.temperature;
    s.seed = base_ + idx;
    s.ignore_eos = o_.ignore_eos;
    s.stream = o_.stream;
    return s;
  }

  uint32_t pick(const Range& r) {
    if (r.lo == r.hi) return r.lo;
    return std::uniform_int_distribution<uint32_t>(r.lo, r.hi)(rng_);
  }

  // Records one message; true when it ended its job.
  bool handle(RunData& d, const sy::wire::ServerMessage& m, int64_t t) {
    const std::string id = sy::client::message_id(m);
    if (id.size() <= tag_.size() || id.compare(0, tag_.size(), tag_) != 0) {
      ++d.unmatched;
      return false;
    }
    size_t n = std::strtoull(id.c_str() + tag_.size(), nullptr, 10);
    if (n < base_) {
      ++d.unmatched;
      return false;
    }
    size_t idx = n - base_;
    if (idx >= d.jobs.size() || d.jobs[idx].finished) {
      ++d.unmatched;
      return false;
    }
    Job& j = d.jobs[idx];
    if (auto* tk = std::get_if<sy::wire::Tokens>(&m)) {
      if (j.t_first == 0)
        j.t_first = t;
      else
        j.itl_ms.push_back(static_cast<float>((t - j.t_last) / 1e6));
      j.t_last = t;
      j.tokens += static_cast<uint32_t>(tk->ids.size());
    } else if (auto* dn = std::get_if<sy::wire::Done>(&m)) {
      j.finished = true;
      j.ok = dn->finish_reason != sy::wire::FinishReason::cancelled;
      j.t_done = t;
      j.server = dn->timings;
      j.tokens = dn->usage.completion_tokens;
      return true;
    } else if (auto* er = std::get_if<sy::wire::Error>(&m)) {
      j.finished = true;
      j.error = er->code;
      j.t_done = t;
      return true;
    }
    return false;
  }

  const Options& o_;
  int vocab_;
  std::mt19937_64 rng_;
  zmq::context_t ctx_{1};
  std::vector<std::unique_ptr<sy::client::Client>> clients_;
  std::vector<zmq::pollitem_t> items_;
  std::discrete_distribution<uint32_t> pick_mix_;
  sy::wire::DecodeLimits limits_;
  std::string tag_;
  size_t base_ = 0, next_base_ = 0;
  const std::vector<sy::bench::PeerRequest>* workload_ = nullptr;
};

// ---- statistics -------------------------------------------------------------------------------

using Json = nlohmann::ordered_json;  // keys in the order written

// A figure for the JSON: 6 significant digits (what %.6g shows; no reader needs more), null
// when not finite.
Json num(double v) {
  if (!std::isfinite(v)) return nullptr;
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return std::strtod(b, nullptr);
}

// The report as one line (invalid UTF-8 in a name becomes U+FFFD).
std::string dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

double pct(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return NAN;
  // Nearest rank: the smallest value with at least p of the samples at or below it.
  size_t r = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(r, 1, sorted.size()) - 1];
}

Json dist(std::vector<double> v, double scale = 1) {
  if (v.empty()) return nullptr;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  return {{"n", v.size()},
          {"mean", num(sum / v.size() * scale)},
          {"p50", num(pct(v, 0.5) * scale)},
          {"p90", num(pct(v, 0.9) * scale)},
          {"p99", num(pct(v, 0.99) * scale)},
          {"min", num(v.front() * scale)},
          {"max", num(v.back() * scale)}};
}

/// The samples of one group of jobs (all, a class, a tenant).
struct Group {
  uint64_t submitted = 0, completed = 0, good = 0, out_tokens = 0, good_tokens = 0;
  std::map<std::string, uint64_t> errors;
  std::vector<double> ttft, tpot, itl, e2e, s_queue, s_ttft, s_total;
};

void add(Group& g, const Job& j, const Options& o) {
  ++g.submitted;
  if (!j.finished) return;
  if (j.error) {
    ++g.errors[std::string(sy::to_string(*j.error))];
    return;
  }
  if (!j.failure.empty()) {
    ++g.errors[j.failure.substr(0, 120)];
    return;
  }
  if (!j.ok) {
    ++g.errors["cancelled"];
    return;
  }
  ++g.completed;
  g.out_tokens += j.tokens;
  double e2e = (j.t_done - j.t_submit) / 1e6;
  // Without streaming the client sees no first token: TTFT is the server's own figure.
  double ttft = j.t_first ? (j.t_first - j.t_submit) / 1e6 : j.server.ttft_ms;
  double tpot = j.tokens > 1 ? (e2e - ttft) / (j.tokens - 1) : NAN;
  g.e2e.push_back(e2e);
  g.ttft.push_back(ttft);
  if (std::isfinite(tpot)) g.tpot.push_back(tpot);
  for (float x : j.itl_ms) g.itl.push_back(x);
  g.s_queue.push_back(j.server.queue_ms);
  g.s_ttft.push_back(j.server.ttft_ms);
  g.s_total.push_back(j.server.total_ms);
  bool good = (o.slo_ttft_ms <= 0 || ttft <= o.slo_ttft_ms) &&
              (o.slo_tpot_ms <= 0 || !std::isfinite(tpot) || tpot <= o.slo_tpot_ms);
  if (good) ++g.good, g.good_tokens += j.tokens;
}

Json group_json(const Group& g, double secs, bool micro) {
  uint64_t overloaded = g.errors.count("overloaded") ? g.errors.at("overloaded") : 0;
  uint64_t limited = g.errors.count("rate_limited") ? g.errors.at("rate_limited") : 0;
  Json errors = Json::object();
  for (auto& [k, v] : g.errors) errors[k] = v;
  Json j = {{"submitted", g.submitted},
            {"completed", g.completed},
            {"output_tokens", g.out_tokens},
            {"jobs_per_s", num(g.completed / secs)},
            {"output_tokens_per_s", num(g.out_tokens / secs)},
            {"goodput",
             {{"jobs", g.good},
              {"jobs_per_s", num(g.good / secs)},
              {"output_tokens_per_s", num(g.good_tokens / secs)},
              {"fraction", num(g.submitted ? static_cast<double>(g.good) / g.submitted : NAN)}}},
            {"rejected", {{"overloaded", overloaded}, {"rate_limited", limited}}},
            {"errors", std::move(errors)},
            {"ttft_ms", dist(g.ttft)},
            {"tpot_ms", dist(g.tpot)},
            {"itl_ms", dist(g.itl)},
            {"e2e_ms", dist(g.e2e)}};
  if (micro) j["e2e_us"] = dist(g.e2e, 1000.0);
  j["server"] = {
      {"queue_ms", dist(g.s_queue)}, {"ttft_ms", dist(g.s_ttft)}, {"total_ms", dist(g.s_total)}};
  return j;
}

struct Report {
  Json json;
  Group all;
  std::map<std::string, Group> by_class;
};

std::string class_name(const Options& o, uint32_t mix) {
  return o.mix[mix].cls.empty() ? "(default)" : o.mix[mix].cls;
}

Report summarize(const Options& o, const Phase& ph, const RunData& d) {
  Report r;
  std::map<std::string, Group> by_tenant;
  for (const Job& j : d.jobs) {
    if (j.warm) continue;
    add(r.all, j, o);
    add(r.by_class[class_name(o, j.mix)], j, o);
    add(by_tenant[o.mix[j.mix].tenant], j, o);
  }
  double secs = std::max(1e-9, (d.t_end - d.t_start) / 1e9);
  bool micro = o.max_tokens.hi == 1;
  Json load =
      ph.rate > 0 ? Json{{"open_loop_rate", num(ph.rate)}} : Json{{"concurrency", ph.concurrency}};
  load["warmup_jobs"] = ph.warmup;
  Json by_class = Json::object(), tenants = Json::object();
  for (auto& [k, g] : r.by_class) by_class[k] = group_json(g, secs, micro);
  for (auto& [k, g] : by_tenant) tenants[k] = group_json(g, secs, micro);
  r.json = {{"load", std::move(load)},          {"elapsed_s", num(secs)},
            {"timed_out", d.timed_out},         {"unmatched_messages", d.unmatched},
            {"arrival_lag_ms", dist(d.lag_ms)}, {"overall", group_json(r.all, secs, micro)},
            {"by_class", std::move(by_class)},  {"by_tenant", std::move(tenants)}};
  return r;
}

// ---- plot -------------------------------------------------------------------------------------

Json samples(const Report& r, std::vector<double> Group::*field) {
  auto values = [](const std::vector<double>& v) {
    Json a = Json::array();
    for (double x : v) a.push_back(num(x));
    return a;
  };
  Json j = {{"all", values(r.all.*field)}};
  if (r.by_class.size() > 1)
    for (auto& [k, g] : r.by_class) j[k] = values(g.*field);
  return j;
}

void plot(const Options& o, const Report& r, const std::string& title) {
  std::string data = o.plot + ".samples.json";
  {
    std::ofstream f(data);
    f << dump({{"title", title},
               {"TTFT (ms)", samples(r, &Group::ttft)},
               {"TPOT (ms)", samples(r, &Group::tpot)},
               {"ITL (ms)", samples(r, &Group::itl)},
               {"end-to-end (ms)", samples(r, &Group::e2e)}})
      << "\n";
    if (!f) {
      std::cerr << "bench_loadgen: warning: cannot write " << data << ", no plot\n";
      return;
    }
  }
  std::string script = o.plot_script.empty() ? SY_BENCH_DIR "/plot_latency.py" : o.plot_script;
  std::string cmd = "/usr/bin/python3 '" + script + "' '" + data + "' '" + o.plot + "' 1>&2";
  int rc = std::system(cmd.c_str());
  if (rc != 0)
    std::cerr << "bench_loadgen: warning: plotting failed (" << cmd << "), no PNG\n";
  else
    std::remove(data.c_str());
}

// ---- main -------------------------------------------------------------------------------------

int vocab_size(const Options& o) {
  if (o.vocab > 0) return o.vocab;
  if (o.model) {
    try {
      return sy::read_llama_config(sy::gguf::File::open(*o.model)).n_vocab;
    } catch (const std::exception& e) {
      std::cerr << "bench_loadgen: warning: cannot read the vocabulary size of " << *o.model << " ("
                << e.what() << "), using 256\n";
    }
  }
  // Small enough for any llama vocabulary; pass --vocab for the real one.
  return 256;
}

Json options_json(const Options& o, const std::string& endpoint) {
  auto range = [](const Range& r) {
    return r.lo == r.hi ? Json(r.lo) : Json(std::to_string(r.lo) + ".." + std::to_string(r.hi));
  };
  Json j = {{"server", endpoint}, {"spawned", o.spawn}};
  if (o.spawn) j["serve_args"] = o.serve_args;
  j["sockets"] = o.sockets;
  j["stream"] = o.stream;
  j["ignore_eos"] = o.ignore_eos;
  j["prompt_len"] = range(o.prompt_len);
  j["prompt_kind"] = o.prompt_text ? "text" : "ids";
  j["max_tokens"] = range(o.max_tokens);
  j["temperature"] = num(o.temperature);
  j["slo_ttft_ms"] = o.slo_ttft_ms > 0 ? num(o.slo_ttft_ms) : Json(nullptr);
  j["slo_tpot_ms"] = o.slo_tpot_ms > 0 ? num(o.slo_tpot_ms) : Json(nullptr);
  Json mix = Json::array();
  for (const auto& m : o.mix)
    mix.push_back({{"class", m.cls}, {"tenant", m.tenant}, {"weight", num(m.weight)}});
  j["mix"] = std::move(mix);
  return j;
}

Json loadavg() {
  std::ifstream f("/proc/loadavg");
  double a = 0, b = 0, c = 0;
  f >> a >> b >> c;
  return {num(a), num(b), num(c)};
}

// The server's counters line as JSON (kept as text if it does not parse).
Json server_stats(const std::string& line) {
  try {
    return Json::parse(line);
  } catch (const Json::exception&) {
    return line;
  }
}

// ---- multi-turn conversations -------------------------------------------------------------------

/// One turn as the client saw it.
struct Turn {
  uint32_t conv = 0, turn = 0;  // turn counts from 1
  int64_t t_submit = 0, t_first = 0, t_done = 0;
  bool ok = false;
  std::optional<sy::ErrorCode> error;
  sy::wire::Usage usage;
  double server_ttft_ms = 0;
};

/// Chat sessions: each conversation sends turn 1 (a --prompt-len prompt), waits for its
/// completion, then sends its whole history (previous prompt + completion + --user-len new user
/// tokens) as the next prompt, --turns times. All conversations run at once, each with at most
/// one turn in flight, so a prefix cache can serve everything but the newest tokens.
class MultiTurn {
 public:
  MultiTurn(const Options& o, const std::string& endpoint, int vocab)
      : o_(o), vocab_(vocab), rng_(o.seed) {
    const int n_sockets = std::min<int>(o.sockets, static_cast<int>(o.multi_turn));
    for (int i = 0; i < n_sockets; ++i)
      clients_.push_back(std::make_unique<sy::client::Client>(ctx_, endpoint));
    for (auto& c : clients_) items_.push_back({c->socket().handle(), 0, ZMQ_POLLIN, 0});
    limits_.max_message_bytes = 64u << 20;
    limits_.max_string_bytes = 64u << 20;
    tag_ = "mt" + std::to_string(std::random_device{}() % 1000000) + "-" +
           std::to_string(getpid()) + "-";
  }

  struct Result {
    std::vector<Turn> turns;
    int64_t t_start = 0, t_end = 0;
    uint64_t unmatched = 0;
    bool timed_out = false;
  };

  Result run() {
    Result r;
    struct Conv {
      std::vector<int32_t> ids;  // the history (ids mode)
      std::string text;          // the history (text mode)
      uint32_t turn = 0;         // turns sent
      size_t current = 0;        // index into r.turns of the turn in flight
      std::vector<int32_t> out_ids;
      std::string out_text;
    };
    std::vector<Conv> convs(o_.multi_turn);
    std::map<std::string, size_t> inflight;  // job id -> conversation
    size_t next_conv = 0;                    // conversations not started yet begin here
    std::vector<size_t> ready;               // conversations whose next turn can go
    r.t_start = now_ns();
    auto send = [&](size_t ci) {
      Conv& c = convs[ci];
      if (c.turn == 0) {
        append_user(c.ids, c.text, pick(o_.prompt_len));
      } else {
        // The history grows by what the model said and a new user message.
        c.ids.insert(c.ids.end(), c.out_ids.begin(), c.out_ids.end());
        c.text += c.out_text;
        append_user(c.ids, c.text, o_.user_len);
      }
      c.out_ids.clear();
      c.out_text.clear();
      ++c.turn;
      sy::wire::Submit s;
      s.id = tag_ + std::to_string(ci) + "-" + std::to_string(c.turn);
      const MixEntry& m = o_.mix[ci % o_.mix.size()];
      s.tenant = m.tenant;
      s.token = m.token;
      s.priority = m.cls;
      if (o_.prompt_text)
        s.prompt = c.text;
      else
        s.prompt = c.ids;
      s.max_tokens = pick(o_.max_tokens);
      s.temperature = o_.temperature;
      s.seed = ci * 1000003u + c.turn;
      s.ignore_eos = o_.ignore_eos;
      s.stream = o_.stream;
      c.current = r.turns.size();
      Turn& t = r.turns.emplace_back();
      t.conv = static_cast<uint32_t>(ci);
      t.turn = c.turn;
      inflight.emplace(s.id, ci);
      t.t_submit = now_ns();
      clients_[ci % clients_.size()]->submit(s);
    };
    int64_t last_msg = now_ns();
    for (;;) {
      while (inflight.size() < static_cast<size_t>(o_.concurrency) &&
             (!ready.empty() || next_conv < convs.size())) {
        size_t ci;
        if (!ready.empty()) {
          ci = ready.back();
          ready.pop_back();
        } else {
          ci = next_conv++;
        }
        send(ci);
      }
      if (inflight.empty()) break;
      int n = zmq::poll(items_.data(), items_.size(), std::chrono::milliseconds(100));
      int64_t now = now_ns();
      if (n == 0) {
        if (now - last_msg > static_cast<int64_t>(o_.timeout_s * 1e9)) {
          r.timed_out = true;
          break;
        }
        continue;
      }
      last_msg = now;
      for (size_t k = 0; k < items_.size(); ++k) {
        if (!(items_[k].revents & ZMQ_POLLIN)) continue;
        zmq::message_t msg;
        while (clients_[k]->socket().recv(msg, zmq::recv_flags::dontwait)) {
          const int64_t t = now_ns();
          auto dec = sy::wire::decode_server(msg.data(), msg.size(), limits_);
          if (auto* e = std::get_if<sy::wire::DecodeError>(&dec))
            throw std::runtime_error("undecodable server message: " + e->message);
          const auto& m = std::get<sy::wire::ServerMessage>(dec);
          auto it = inflight.find(sy::client::message_id(m));
          if (it == inflight.end()) {
            ++r.unmatched;
            continue;
          }
          const size_t ci = it->second;
          Conv& c = convs[ci];
          Turn& turn = r.turns[c.current];
          bool ended = false;
          if (auto* tk = std::get_if<sy::wire::Tokens>(&m)) {
            if (turn.t_first == 0) turn.t_first = t;
            c.out_ids.insert(c.out_ids.end(), tk->ids.begin(), tk->ids.end());
            c.out_text += tk->text;
          } else if (auto* dn = std::get_if<sy::wire::Done>(&m)) {
            ended = true;
            turn.ok = dn->finish_reason != sy::wire::FinishReason::cancelled;
            turn.usage = dn->usage;
            turn.server_ttft_ms = dn->timings.ttft_ms;
            if (!dn->ids.empty()) c.out_ids = dn->ids;  // not streamed: the whole completion
            if (!dn->text.empty()) c.out_text = dn->text;
          } else if (auto* er = std::get_if<sy::wire::Error>(&m)) {
            ended = true;
            turn.error = er->code;
          }
          if (!ended) continue;
          turn.t_done = t;
          inflight.erase(it);
          // A failed turn ends its conversation: the next prompt would lack the completion.
          if (turn.ok && c.turn < o_.turns) ready.push_back(ci);
        }
      }
    }
    r.t_end = now_ns();
    return r;
  }

 private:
  void append_user(std::vector<int32_t>& ids, std::string& text, uint32_t n) {
    if (o_.prompt_text) {
      std::uniform_int_distribution<size_t> w(0, std::size(kWords) - 1);
      for (uint32_t i = 0; i < n; ++i) {
        if (!text.empty()) text += ' ';
        text += kWords[w(rng_)];
      }
    } else {
      std::uniform_int_distribution<int32_t> tok(0, vocab_ - 1);
      for (uint32_t i = 0; i < n; ++i) ids.push_back(tok(rng_));
    }
  }

  uint32_t pick(const Range& r) {
    if (r.lo == r.hi) return r.lo;
    return std::uniform_int_distribution<uint32_t>(r.lo, r.hi)(rng_);
  }

  const Options& o_;
  int vocab_;
  std::mt19937_64 rng_;
  zmq::context_t ctx_{1};
  std::vector<std::unique_ptr<sy::client::Client>> clients_;
  std::vector<zmq::pollitem_t> items_;
  sy::wire::DecodeLimits limits_;
  std::string tag_;
};

/// The JSON of one multi-turn run: TTFT of turn 1 and of later turns, the share of later turns'
/// prompts served from the prefix cache (done.usage.cached_tokens / prompt_tokens), per turn too.
Json multi_turn_json(const Options& o, const MultiTurn::Result& r) {
  struct Acc {
    std::vector<double> ttft, e2e, server_ttft, prompt, cached_frac;
    uint64_t prompt_sum = 0, cached_sum = 0, completed = 0;
  };
  Acc first, later;
  std::vector<Acc> by_turn(o.turns);
  std::map<std::string, uint64_t> errors;
  for (const Turn& t : r.turns) {
    if (t.error) {
      ++errors[std::string(sy::to_string(*t.error))];
      continue;
    }
    if (!t.ok) {
      ++errors[t.t_done ? "cancelled" : "unfinished"];
      continue;
    }
    for (Acc* a : {t.turn == 1 ? &first : &later, &by_turn[t.turn - 1]}) {
      ++a->completed;
      const double e2e = (t.t_done - t.t_submit) / 1e6;
      a->ttft.push_back(t.t_first ? (t.t_first - t.t_submit) / 1e6 : t.server_ttft_ms);
      a->e2e.push_back(e2e);
      a->server_ttft.push_back(t.server_ttft_ms);
      a->prompt.push_back(t.usage.prompt_tokens);
      a->prompt_sum += t.usage.prompt_tokens;
      a->cached_sum += t.usage.cached_tokens;
      if (t.usage.prompt_tokens > 0)
        a->cached_frac.push_back(static_cast<double>(t.usage.cached_tokens) /
                                 t.usage.prompt_tokens);
    }
  }
  auto mean = [](const std::vector<double>& v) -> double {
    if (v.empty()) return NAN;
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
  };
  auto acc_json = [&](const Acc& a) {
    return Json{
        {"completed", a.completed},        {"ttft_ms", dist(a.ttft)},
        {"e2e_ms", dist(a.e2e)},           {"server_ttft_ms", dist(a.server_ttft)},
        {"prompt_tokens", dist(a.prompt)}, {"cached_fraction_mean", num(mean(a.cached_frac))},
        {"cached_tokens", a.cached_sum},   {"prompt_tokens_total", a.prompt_sum}};
  };
  Json errs = Json::object();
  for (auto& [k, v] : errors) errs[k] = v;
  Json turns = Json::array();
  for (const Acc& a : by_turn) turns.push_back(acc_json(a));
  return {{"elapsed_s", num((r.t_end - r.t_start) / 1e9)},
          {"timed_out", r.timed_out},
          {"unmatched_messages", r.unmatched},
          {"turns_sent", r.turns.size()},
          {"errors", std::move(errs)},
          {"turn1", acc_json(first)},
          {"later_turns", acc_json(later)},
          {"by_turn", std::move(turns)}};
}

/// A temporary directory holding a server config that sets only batching.prefix_cache; removed
/// when this goes out of scope.
class CacheConfig {
 public:
  explicit CacheConfig(bool on) {
    char tmpl[] = "/tmp/bench_loadgen-XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    path_ = (dir_ / "prefix_cache.yaml").string();
    std::ofstream f(path_);
    f << "batching: {prefix_cache: " << (on ? "true" : "false") << "}\n";
    if (!f) throw std::runtime_error("cannot write " + path_);
  }
  CacheConfig(const CacheConfig&) = delete;
  CacheConfig& operator=(const CacheConfig&) = delete;
  ~CacheConfig() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  fs::path dir_;
  std::string path_;
};

// Longest prompt and context the multi-turn mode will need: the last turn's prompt is the first
// prompt plus, per earlier turn, a completion and a user message.
uint64_t multi_turn_max_prompt(const Options& o) {
  return o.prompt_len.hi + uint64_t{o.turns - 1} * (o.max_tokens.hi + o.user_len);
}

int multi_turn_main(const Options& o, int vocab) {
  if (o.model && !o.prompt_text) {
    try {
      const int ctx = sy::read_llama_config(sy::gguf::File::open(*o.model)).ctx_len;
      const uint64_t need = multi_turn_max_prompt(o) + o.max_tokens.hi;
      if (ctx > 0 && need > static_cast<uint64_t>(ctx))
        throw UsageError("--multi-turn: the last turn needs " + std::to_string(need) +
                         " slots, more than the model's context of " + std::to_string(ctx) +
                         " (lower --turns, --max-tokens, --user-len or --prompt-len)");
    } catch (const UsageError&) {
      throw;
    } catch (const std::exception&) {
      // An unreadable model is the server's problem to report.
    }
  }
  std::vector<std::string> settings;
  if (o.prefix_cache == "both")
    settings = {"on", "off"};
  else
    settings = {o.prefix_cache};  // "" = whatever the server is configured with
  Json out = {{"tool", "bench_loadgen"},
              {"mode", "multi_turn"},
              {"options",
               {{"conversations", o.multi_turn},
                {"turns", o.turns},
                {"user_len", o.user_len},
                {"concurrency", o.concurrency},
                {"max_prompt_tokens", multi_turn_max_prompt(o)},
                {"load", options_json(o, o.server)}}},
              {"loadavg_before", loadavg()},
              {"runs", Json::array()}};
  bool failed = false;
  std::vector<double> p50;  // later turns' client TTFT p50, per setting
  for (size_t i = 0; i < settings.size(); ++i) {
    std::optional<CacheConfig> cfg;
    std::unique_ptr<Spawned> server;
    std::string endpoint = o.server;
    if (o.spawn) {
      std::vector<std::string> args = o.serve_args;
      if (!settings[i].empty()) {
        cfg.emplace(settings[i] == "on");
        args.insert(args.end(), {"--config", cfg->path()});
      }
      server = std::make_unique<Spawned>(o.switchyard.empty() ? default_switchyard() : o.switchyard,
                                         args);
      endpoint = server->endpoint();
    }
    MultiTurn mt(o, endpoint, vocab);
    MultiTurn::Result r = mt.run();
    failed |= r.timed_out;
    std::vector<double> later;
    for (const Turn& t : r.turns)
      if (t.turn >= 2 && t.ok && t.t_first) later.push_back((t.t_first - t.t_submit) / 1e6);
    std::sort(later.begin(), later.end());
    p50.push_back(pct(later, 0.5));
    Json run = {{"prefix_cache", settings[i].empty() ? "server default" : settings[i]},
                {"endpoint", endpoint},
                {"result", multi_turn_json(o, r)}};
    if (server) {
      std::string st = server->stats();
      if (!st.empty()) run["server_stats"] = server_stats(st);
      server->stop();
    }
    out["runs"].push_back(std::move(run));
  }
  if (settings.size() == 2) out["ttft_later_p50_off_over_on"] = num(p50[1] / p50[0]);
  out["loadavg_after"] = loadavg();
  std::cout << dump(out) << std::endl;
  if (failed) std::cerr << "bench_loadgen: timed out waiting for the server\n";
  return failed ? 1 : 0;
}

// ---- side by side with llama-server ------------------------------------------------------------

/// The requests of one round, sent to both servers. Every round draws new prompts (seed and
/// round), so no prefix cache serves a round from an earlier one.
std::vector<sy::bench::PeerRequest> round_workload(const Options& o, int vocab, int round) {
  std::mt19937_64 rng(o.seed * 1000003u + static_cast<uint64_t>(round));
  std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
  auto pick = [&](const Range& r) {
    return r.lo == r.hi ? r.lo : std::uniform_int_distribution<uint32_t>(r.lo, r.hi)(rng);
  };
  std::vector<sy::bench::PeerRequest> w(o.warmup + o.jobs);
  for (size_t i = 0; i < w.size(); ++i) {
    sy::bench::PeerRequest& q = w[i];
    q.prompt.resize(pick(o.prompt_len));
    for (int32_t& t : q.prompt) t = tok(rng);
    q.max_tokens = pick(o.max_tokens);
    q.temperature = o.temperature;
    q.seed = static_cast<uint64_t>(round) * w.size() + i + 1;
    q.ignore_eos = true;
  }
  return w;
}

/// The peer's jobs in the shape of ours, so both go through the same statistics.
RunData peer_run_data(const sy::bench::PeerRun& p) {
  RunData d;
  d.t_start = p.t_start;
  d.t_end = p.t_end;
  d.timed_out = p.timed_out;
  for (const sy::bench::PeerJob& pj : p.jobs) {
    Job& j = d.jobs.emplace_back();
    j.warm = pj.warm;
    j.finished = pj.finished;
    j.ok = pj.ok;
    if (pj.finished && !pj.ok) j.failure = pj.error;
    j.t_submit = pj.t_submit;
    j.t_first = pj.t_first;
    j.t_last = pj.t_last;
    j.t_done = pj.t_done;
    j.tokens = static_cast<uint32_t>(pj.tokens_predicted >= 0 ? pj.tokens_predicted : 0);
    j.itl_ms = pj.itl_ms;
  }
  return d;
}

/// Completed requests whose output is not exactly the asked length; the first few described.
struct LengthCheck {
  uint64_t wrong = 0;
  // The peer's requests that streamed fewer token ids than they generated: llama-server sends no
  // chunk for a token that ends inside a UTF-8 character (its id is never streamed), so a random
  // model's byte tokens leave gaps. Not an error; its TTFT or ITL then spans two tokens.
  uint64_t streamed_fewer = 0;
  std::vector<std::string> examples;
  void add(size_t idx, const std::string& what) {
    ++wrong;
    if (examples.size() < 5) examples.push_back("request " + std::to_string(idx) + ": " + what);
  }
};

LengthCheck check_ours(const RunData& d, const std::vector<sy::bench::PeerRequest>& w) {
  LengthCheck c;
  for (size_t i = 0; i < d.jobs.size(); ++i) {
    const Job& j = d.jobs[i];
    if (!j.finished || j.error || !j.ok) continue;
    if (j.tokens != w[i].max_tokens)
      c.add(i, std::to_string(j.tokens) + " completion tokens, asked " +
                   std::to_string(w[i].max_tokens));
  }
  return c;
}

LengthCheck check_peer(const sy::bench::PeerRun& p, const std::vector<sy::bench::PeerRequest>& w) {
  LengthCheck c;
  for (size_t i = 0; i < p.jobs.size(); ++i) {
    const sy::bench::PeerJob& j = p.jobs[i];
    if (!j.finished || !j.ok) continue;
    const int64_t want = w[i].max_tokens;
    if (j.streamed_tokens < j.tokens_predicted) ++c.streamed_fewer;
    if (j.tokens_predicted != want || (j.predicted_n >= 0 && j.predicted_n != want) ||
        j.streamed_tokens > want)
      c.add(i, "tokens_predicted " + std::to_string(j.tokens_predicted) + ", timings.predicted_n " +
                   std::to_string(j.predicted_n) + ", streamed " +
                   std::to_string(j.streamed_tokens) + ", asked " + std::to_string(want));
  }
  return c;
}

Json length_json(const LengthCheck& c) {
  return {{"wrong_length", c.wrong},
          {"examples", c.examples},
          {"streamed_fewer_ids", c.streamed_fewer}};
}

double median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// A figure of a group: output tokens/s, TTFT p50 and p99 (ms).
struct Figures {
  double tps = NAN, ttft_p50 = NAN, ttft_p99 = NAN;
  uint64_t completed = 0, failed = 0;
};

Figures figures(const Group& g, const RunData& d) {
  Figures f;
  double secs = std::max(1e-9, (d.t_end - d.t_start) / 1e9);
  f.tps = g.out_tokens / secs;
  std::vector<double> t = g.ttft;
  std::sort(t.begin(), t.end());
  f.ttft_p50 = pct(t, 0.5);
  f.ttft_p99 = pct(t, 0.99);
  f.completed = g.completed;
  f.failed = g.submitted - g.completed;
  return f;
}

std::string fmt(double v, int prec) {
  if (!std::isfinite(v)) return "n/a";
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}

int peer_main(const Options& o, int vocab) {
  std::cerr << "bench_loadgen: starting switchyard serve\n";
  Spawned server(o.switchyard.empty() ? default_switchyard() : o.switchyard, o.serve_args);
  // Each slot holds one request: its prompt, its completion and a margin, so that neither a
  // context shift nor a truncation can happen inside the workload.
  const int per_slot = static_cast<int>(o.prompt_len.hi + o.max_tokens.hi) + 64;
  sy::bench::LlamaServerOptions lo;
  lo.binary = o.peer_llama_server;
  lo.model = *o.model;
  lo.threads = o.threads;
  lo.parallel = o.concurrency;
  lo.ctx = per_slot * o.concurrency;
  lo.extra = o.peer_args;
  std::cerr << "bench_loadgen: starting " << o.peer_llama_server << "\n";
  sy::bench::LlamaServer peer(lo);
  std::cerr << "bench_loadgen: llama-server ready on port " << peer.port() << "\n";

  Runner runner(o, server.endpoint(), vocab);
  Json out = {{"tool", "bench_loadgen"},
              {"mode", "peer"},
              {"options", options_json(o, server.endpoint())},
              {"loadavg_before", loadavg()}};
  out["options"]["concurrency"] = o.concurrency;
  out["options"]["jobs_per_round"] = o.jobs;
  out["options"]["warmup_per_round"] = o.warmup;
  out["options"]["rounds"] = o.rounds;
  out["options"]["threads"] = o.threads;
  out["options"]["vocab"] = vocab;
  Json ours_rounds = Json::array(), peer_rounds = Json::array(), ratio_rounds = Json::array();
  std::vector<Figures> fo, fp;
  bool failed = false;
  std::vector<std::string> problems;
  const Phase ph{o.concurrency, 0, o.jobs, 0, o.warmup};
  for (int round = 0; round < o.rounds; ++round) {
    const auto w = round_workload(o, vocab, round);
    std::cerr << "bench_loadgen: round " << round + 1 << "/" << o.rounds << ": ours\n";
    runner.set_workload(&w);
    RunData d_ours = runner.run(ph);
    Report r_ours = summarize(o, ph, d_ours);
    LengthCheck c_ours = check_ours(d_ours, w);
    std::cerr << "bench_loadgen: round " << round + 1 << "/" << o.rounds << ": llama-server\n";
    sy::bench::PeerRun pr =
        sy::bench::run_peer(peer.port(), w, o.warmup, o.concurrency, o.timeout_s);
    RunData d_peer = peer_run_data(pr);
    Report r_peer = summarize(o, ph, d_peer);
    LengthCheck c_peer = check_peer(pr, w);

    Json jo = r_ours.json;
    jo["round"] = round + 1;
    jo["length_check"] = length_json(c_ours);
    ours_rounds.push_back(std::move(jo));
    Json jp = r_peer.json;
    jp["round"] = round + 1;
    jp["length_check"] = length_json(c_peer);
    jp["connections_opened"] = pr.connections_opened;
    jp["resent_on_new_connection"] = pr.resent_on_new_connection;
    std::vector<double> prompt_ms, predicted_ms;
    for (size_t i = o.warmup; i < pr.jobs.size(); ++i)
      if (pr.jobs[i].ok) {
        prompt_ms.push_back(pr.jobs[i].prompt_ms);
        predicted_ms.push_back(pr.jobs[i].predicted_ms);
      }
    // The peer's own timings (its slot's prompt and generation phases), in place of ours'.
    jp["overall"].erase("server");
    for (const char* m : {"by_class", "by_tenant"})
      for (auto& g : jp[m].items()) g.value().erase("server");
    jp["peer_timings"] = {{"prompt_ms", dist(prompt_ms)}, {"predicted_ms", dist(predicted_ms)}};
    peer_rounds.push_back(std::move(jp));

    Figures a = figures(r_ours.all, d_ours), b = figures(r_peer.all, d_peer);
    fo.push_back(a);
    fp.push_back(b);
    ratio_rounds.push_back({{"round", round + 1},
                            {"output_tokens_per_s", num(a.tps / b.tps)},
                            {"ttft_p50", num(a.ttft_p50 / b.ttft_p50)},
                            {"ttft_p99", num(a.ttft_p99 / b.ttft_p99)}});
    auto note = [&](bool bad, const std::string& what) {
      if (!bad) return;
      failed = true;
      problems.push_back("round " + std::to_string(round + 1) + ": " + what);
    };
    note(d_ours.timed_out, "ours timed out");
    note(d_peer.timed_out, "llama-server timed out");
    note(a.failed > 0, "ours failed " + std::to_string(a.failed) + " requests");
    note(b.failed > 0, "llama-server failed " + std::to_string(b.failed) + " requests");
    note(c_ours.wrong > 0, "ours generated the wrong number of tokens for " +
                               std::to_string(c_ours.wrong) + " requests" +
                               (c_ours.examples.empty() ? "" : " (" + c_ours.examples[0] + ")"));
    note(c_peer.wrong > 0, "llama-server generated the wrong number of tokens for " +
                               std::to_string(c_peer.wrong) + " requests" +
                               (c_peer.examples.empty() ? "" : " (" + c_peer.examples[0] + ")"));
  }
  auto med = [](const std::vector<Figures>& v, double Figures::*m) {
    std::vector<double> x;
    for (const Figures& f : v) x.push_back(f.*m);
    return median(x);
  };
  std::vector<double> r_tps, r_p50, r_p99;
  for (size_t i = 0; i < fo.size(); ++i) {
    r_tps.push_back(fo[i].tps / fp[i].tps);
    r_p50.push_back(fo[i].ttft_p50 / fp[i].ttft_p50);
    r_p99.push_back(fo[i].ttft_p99 / fp[i].ttft_p99);
  }
  out["ours"] = {{"rounds", std::move(ours_rounds)}};
  out["peer"] = {{"name", "llama-server"},
                 {"binary", o.peer_llama_server},
                 {"argv", peer.argv()},
                 {"rounds", std::move(peer_rounds)},
                 {"ours_over_peer",
                  {{"rounds", std::move(ratio_rounds)},
                   {"median",
                    {{"output_tokens_per_s", num(median(r_tps))},
                     {"ttft_p50", num(median(r_p50))},
                     {"ttft_p99", num(median(r_p99))}}}}}};
  out["summary"] = {{"ours",
                     {{"output_tokens_per_s", num(med(fo, &Figures::tps))},
                      {"ttft_p50_ms", num(med(fo, &Figures::ttft_p50))},
                      {"ttft_p99_ms", num(med(fo, &Figures::ttft_p99))}}},
                    {"peer",
                     {{"output_tokens_per_s", num(med(fp, &Figures::tps))},
                      {"ttft_p50_ms", num(med(fp, &Figures::ttft_p50))},
                      {"ttft_p99_ms", num(med(fp, &Figures::ttft_p99))}}},
                    {"problems", problems}};
  out["loadavg_after"] = loadavg();
  std::string st = server.stats();
  if (!st.empty()) out["server_stats"] = server_stats(st);
  server.stop();
  peer.stop();
  if (failed) std::cerr << "bench_loadgen: the end of llama-server's log:\n" << peer.log_tail(3000);
  std::cout << dump(out) << std::endl;

  // One line per metric on stderr: each round's figure, then the median ratio of the rounds.
  auto line = [&](const char* name, double Figures::*m, int prec, const std::vector<double>& r) {
    std::ostringstream l;
    l << "bench_loadgen: " << name << ": ours";
    for (const Figures& f : fo) l << " " << fmt(f.*m, prec);
    l << " | llama-server";
    for (const Figures& f : fp) l << " " << fmt(f.*m, prec);
    l << " | ours/llama-server " << fmt(median(r), 2) << " (median of " << r.size() << " rounds)\n";
    std::cerr << l.str();
  };
  line("output tokens/s", &Figures::tps, 0, r_tps);
  line("TTFT p50 ms", &Figures::ttft_p50, 2, r_p50);
  line("TTFT p99 ms", &Figures::ttft_p99, 2, r_p99);
  {
    std::ostringstream l;
    l << "bench_loadgen: completed/failed: ours";
    for (const Figures& f : fo) l << " " << f.completed << "/" << f.failed;
    l << " | llama-server";
    for (const Figures& f : fp) l << " " << f.completed << "/" << f.failed;
    std::cerr << l.str() << "\n";
  }
  for (const std::string& p : problems) std::cerr << "bench_loadgen: FAILED: " << p << "\n";
  return failed ? 1 : 0;
}

int main_impl(int argc, char** argv) {
  Options o = parse(argc, argv);
  if (o.multi_turn > 0) return multi_turn_main(o, vocab_size(o));
  if (!o.peer_llama_server.empty()) return peer_main(o, vocab_size(o));
  std::optional<CacheConfig> cache_cfg;
  if (!o.prefix_cache.empty()) {
    if (o.prefix_cache == "both") throw UsageError("--prefix-cache both needs --multi-turn");
    cache_cfg.emplace(o.prefix_cache == "on");
    o.serve_args.insert(o.serve_args.end(), {"--config", cache_cfg->path()});
  }
  std::unique_ptr<Spawned> server;
  std::string endpoint = o.server;
  if (o.spawn) {
    server = std::make_unique<Spawned>(o.switchyard.empty() ? default_switchyard() : o.switchyard,
                                       o.serve_args);
    endpoint = server->endpoint();
  }
  Runner runner(o, endpoint, vocab_size(o));
  Json out = {{"tool", "bench_loadgen"},
              {"mode", o.overhead ? "overhead" : "load"},
              {"options", options_json(o, endpoint)},
              {"loadavg_before", loadavg()}};
  Report main_report;
  std::string title;
  bool failed = false;
  if (o.overhead) {
    auto pings = runner.ping_rtt_ms(2000);
    Phase tp{o.concurrency, 0, o.jobs, o.duration_s, o.warmup};
    RunData d1 = runner.run(tp);
    Report r1 = summarize(o, tp, d1);
    Phase lp{1, 0, o.latency_jobs, 0, std::min<uint64_t>(o.warmup, 200)};
    RunData d2 = runner.run(lp);
    Report r2 = summarize(o, lp, d2);
    std::vector<double> e2e = r2.all.e2e;
    std::sort(e2e.begin(), e2e.end());
    double secs = std::max(1e-9, (d1.t_end - d1.t_start) / 1e9);
    out["summary"] = {{"jobs_per_s", num(r1.all.completed / secs)},
                      {"concurrency", o.concurrency},
                      {"latency_c1_us",
                       {{"p50", num(pct(e2e, 0.5) * 1000)},
                        {"p90", num(pct(e2e, 0.9) * 1000)},
                        {"p99", num(pct(e2e, 0.99) * 1000)}}},
                      {"ping_rtt_us", dist(pings, 1000.0)}};
    out["throughput_phase"] = r1.json;
    out["latency_phase"] = r2.json;
    failed = d1.timed_out || d2.timed_out;
    main_report = std::move(r2);
    title = "overhead: 1-token jobs at concurrency 1";
  } else {
    Phase ph{o.concurrency, o.rate, o.jobs, o.duration_s, o.warmup};
    RunData d = runner.run(ph);
    main_report = summarize(o, ph, d);
    out["result"] = main_report.json;
    failed = d.timed_out;
    std::ostringstream t;
    t << (o.rate > 0 ? "rate " + dump(num(o.rate)) + " jobs/s"
                     : "concurrency " + std::to_string(o.concurrency))
      << ", max_tokens " << o.max_tokens.lo
      << (o.max_tokens.lo != o.max_tokens.hi ? ".." + std::to_string(o.max_tokens.hi) : "") << ", "
      << main_report.all.completed << " jobs";
    if (o.model) t << ", " << fs::path(*o.model).filename().string();
    title = t.str();
  }
  out["loadavg_after"] = loadavg();
  if (server) {
    std::string st = server->stats();
    if (!st.empty()) out["server_stats"] = server_stats(st);
    server->stop();
  }
  std::cout << dump(out) << std::endl;
  if (!o.plot.empty()) plot(o, main_report, title);
  if (failed) std::cerr << "bench_loadgen: timed out waiting for the server\n";
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A server that vanished must not kill us with SIGPIPE while we print.
  signal(SIGPIPE, SIG_IGN);
  try {
    return main_impl(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "bench_loadgen: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "bench_loadgen: " << e.what() << "\n";
    return 1;
  }
}
