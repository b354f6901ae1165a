// bench_loadgen's command line: the flags, their checks and defaults, and the usage text.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/loadgen.hpp"

namespace sy::bench::loadgen {
namespace {

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

// Serve flags that --spawn forwards as they are (the rest of the serve flags go after `--`).
const std::set<std::string> kServeValueFlags = {"model",   "config", "backend",  "executors",
                                                "threads", "kv-mb",  "grace-ms", "step-delay-ms"};

}  // namespace

const char* kUsage =
    "usage: bench_loadgen (--server ADDR | --spawn [--backend null|cpu] [--model FILE]\n"
    "         [--executors N] [--threads N] [--config FILE] [--kv-mb MB] ...)\n"
    "       [--rate JOBS_PER_S | --concurrency C] [--jobs N | --duration S]\n"
    "       [--arrival poisson|bursty [--burst N]]\n"
    "       [--mix CLASS:TENANT:WEIGHT[:TOKEN],...] [--prompt-len N|A..B]\n"
    "       [--profile short|long] [--prompt-dist fixed|uniform|normal|lognormal]\n"
    "       [--prompt-mean M] [--prompt-cv C] [--prompt-kind ids|text]"
    " [--vocab N] [--max-tokens N|A..B] [--no-stream] [--no-ignore-eos] [--temperature T]\n"
    "       [--slo-ttft-ms MS] [--slo-tpot-ms MS] [--sockets K] [--warmup N] [--seed N]\n"
    "       [--timeout-s S] [--plot FILE.png] [--plot-script FILE.py] [--switchyard BIN]\n"
    "       [--overhead [--latency-jobs N]] [-- extra serve args]\n"
    "--profile short (~128 tokens, SQuAD-like) | long (~2048, BookCorpus-like): lognormal\n"
    "prompt lengths (short: cv 0.5 in 16..512; long: cv 0.25 in 512..3072); --prompt-len,\n"
    "--prompt-dist, --prompt-mean, --prompt-cv given as well override its parts. normal and\n"
    "lognormal draw around --prompt-mean (default: N, or the middle of A..B) with standard\n"
    "deviation cv x mean, clamped to A..B (N alone: N/4..4N); fixed sends the mean.\n"
    "--arrival bursty --burst N (with --rate R): bursts of N jobs sent together at Poisson\n"
    "instants, R/N bursts a second (R jobs a second on average).\n"
    "--overhead: 1-token jobs; closed loop at --concurrency (default 64) for jobs/s, then\n"
    "concurrency 1 for --latency-jobs jobs: end-to-end latency = the runtime's own overhead\n"
    "(use with the null backend).\n"
    "--multi-turn N [--turns T] [--user-len U] [--prefix-cache on|off|both]: N conversations\n"
    "at once, each resending its whole history (first prompt --prompt-len, then per turn the\n"
    "completion and U new user tokens); TTFT over turns >= 2 and the cached prompt share.\n"
    "--prefix-cache (with --spawn) sets the server's batching.prefix_cache; both: two servers.\n"
    "--peer-llama-server PATH [--rounds N] [--peer-arg ARG]... (with --spawn --model FILE):\n"
    "the same closed-loop workload (--concurrency, --jobs per round, default 4 x concurrency)\n"
    "against ours and a llama-server on the same file, alternating rounds; prints ratios.\n"
    "--http [--rounds N] (with --spawn, or --server HOST:PORT for a running server): ours over\n"
    "its OpenAI HTTP door (`serve --http 127.0.0.1:PORT`), streamed POST /v1/completions, by\n"
    "the same closed loop in rounds (default 1); with --peer-llama-server the peer over its\n"
    "/v1/completions too (default 3 rounds). --prompt-kind text sends text prompts.\n";

namespace {

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

}  // namespace

Options parse(int argc, char** argv) {
  Options o;
  bool concurrency_set = false, jobs_set = false, peer_flags = false, rounds_set = false,
       mix_set = false;
  // The prompt's parts as given; a --profile fills the ones not given.
  std::optional<Range> prompt_len;
  std::optional<LenDist> prompt_dist;
  std::optional<double> prompt_mean, prompt_cv;
  std::string arrival = "poisson";
  bool burst_set = false;
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
    if (k == "http") {
      o.http = true;
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
                                                      "rounds",       "peer-arg",
                                                      "profile",      "prompt-dist",
                                                      "prompt-mean",  "prompt-cv",
                                                      "arrival",      "burst"};
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
    else if (k == "mix") {
      o.mix = parse_mix(v);
      mix_set = true;
    } else if (k == "prompt-len")
      prompt_len = parse_range(k, v);
    else if (k == "profile") {
      if (!find_profile(v)) throw UsageError("--profile must be short or long, got '" + v + "'");
      o.profile = v;
    } else if (k == "prompt-dist") {
      prompt_dist = parse_len_dist(v);
      if (!prompt_dist)
        throw UsageError("--prompt-dist must be fixed, uniform, normal or lognormal, got '" + v +
                         "'");
    } else if (k == "prompt-mean")
      prompt_mean = to_double(k, v);
    else if (k == "prompt-cv")
      prompt_cv = to_double(k, v);
    else if (k == "arrival") {
      if (v != "poisson" && v != "bursty")
        throw UsageError("--arrival must be poisson or bursty, got '" + v + "'");
      arrival = v;
    } else if (k == "burst") {
      const double b = to_double(k, v);
      if (!(b >= 1 && b <= 100000) || b != std::floor(b))
        throw UsageError("--burst must be an integer in [1, 100000], got '" + v + "'");
      o.burst = static_cast<uint32_t>(b);
      burst_set = true;
    } else if (k == "prompt-kind") {
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
      rounds_set = true;
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
  try {
    o.prompt = resolve_prompt(o.profile, prompt_len, prompt_dist, prompt_mean, prompt_cv);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if (arrival == "bursty") {
    if (o.rate <= 0) throw UsageError("--arrival bursty is open-loop: needs --rate");
    if (!burst_set) throw UsageError("--arrival bursty needs --burst N (jobs per burst)");
    if (o.burst < 2) throw UsageError("--arrival bursty needs --burst >= 2 (1 is Poisson)");
  } else if (burst_set) {
    throw UsageError("--burst belongs to --arrival bursty");
  }
  if (o.overhead) {
    if (o.rate > 0) throw UsageError("--overhead is closed-loop: no --rate");
    if (!concurrency_set) o.concurrency = 64;
    if (!jobs_set && o.duration_s <= 0) o.jobs = 50000;
    o.max_tokens = {1, 1};
    // 4-token prompts unless the prompt was given.
    if (!prompt_len && o.profile.empty() && !prompt_mean && !prompt_dist)
      o.prompt = {LenDist::fixed, {4, 4}, 4, 0.5};
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
  const bool peer = !o.peer_llama_server.empty();
  if (peer || o.http) {
    // The rounds of one closed-loop workload (loadgen_peer.cpp); `mode` names it in messages.
    const std::string mode = peer ? "--peer-llama-server" : "--http";
    if (peer && (!o.spawn || !o.model))
      throw UsageError("--peer-llama-server runs both servers on one file: needs --spawn --model");
    if (o.rate > 0 || o.overhead || o.multi_turn > 0)
      throw UsageError(mode + " is a closed loop: no --rate, --overhead or --multi-turn");
    if (o.prompt_text && !o.http)
      throw UsageError(
          "--peer-llama-server sends token ids (text prompts over --http): no --prompt-kind "
          "text");
    if (!o.stream) throw UsageError(mode + " streams: no --no-stream");
    if (o.duration_s > 0) throw UsageError(mode + " counts --jobs per round");
    if (!o.ignore_eos)
      throw UsageError(mode +
                       " checks that both generate exactly --max-tokens: no --no-ignore-eos");
    if (!o.prefix_cache.empty())
      throw UsageError(mode + " starts the server without a config of its own: no --prefix-cache");
    if (o.http && mix_set)
      throw UsageError("--mix names classes and tenants of the ZeroMQ door: not with --http");
    if (!rounds_set) o.rounds = peer ? 3 : 1;
    if (o.rounds < 1 || o.rounds > 100) throw UsageError("--rounds must be in [1, 100]");
    if (o.concurrency < 1 || o.concurrency > 1024)
      throw UsageError("--concurrency with " + mode +
                       " must be in [1, 1024] (llama-server's slots, HTTP connections)");
    // A few batches' worth per round: long enough to reach the steady state, short enough for
    // three rounds of a 110M model on two cores.
    if (!jobs_set) o.jobs = 4 * static_cast<uint64_t>(o.concurrency);
    if (peer && o.threads == 0) {
      // Both sides get the same thread count: all cores unless --threads says otherwise.
      o.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      o.serve_args.insert(o.serve_args.end(), {"--threads", std::to_string(o.threads)});
    }
    if (o.http && !o.spawn) {
      // HOST:PORT of a running server (http://HOST:PORT/ too; an IPv6 host in brackets).
      std::string a = o.server;
      if (a.rfind("http://", 0) == 0) a.erase(0, 7);
      while (!a.empty() && a.back() == '/') a.pop_back();
      const size_t colon = a.rfind(':');
      if (colon == std::string::npos || colon == 0 || colon + 1 == a.size())
        throw UsageError("--http --server takes HOST:PORT, got '" + o.server + "'");
      o.http_host = a.substr(0, colon);
      if (o.http_host.size() > 2 && o.http_host.front() == '[' && o.http_host.back() == ']')
        o.http_host = o.http_host.substr(1, o.http_host.size() - 2);
      o.http_port = static_cast<int>(to_double("server", a.substr(colon + 1)));
      if (o.http_port < 1 || o.http_port > 65535)
        throw UsageError("--http --server: the port must be in [1, 65535]");
    }
  } else if (rounds_set) {
    throw UsageError("--rounds belongs to --peer-llama-server and --http");
  }
  if (!peer && peer_flags) throw UsageError("--peer-arg belongs to --peer-llama-server");
  if (o.concurrency < 1 || o.concurrency > 100000) throw UsageError("--concurrency must be >= 1");
  if (o.jobs == 0 && o.duration_s <= 0) o.jobs = 1000;
  if (o.jobs > 0 && o.duration_s > 0) throw UsageError("give --jobs or --duration, not both");
  if (o.sockets < 0 || o.sockets > 4096) throw UsageError("--sockets must be in [1, 4096]");
  if (o.sockets == 0) o.sockets = o.rate > 0 ? 16 : std::min(o.concurrency, 16);
  return o;
}

}  // namespace sy::bench::loadgen
