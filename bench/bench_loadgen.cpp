// Load generator for a Switchyard server: open-loop (Poisson or bursty) or closed-loop traffic
// over a pool of DEALER sockets; prints TTFT/TPOT/ITL/end-to-end percentiles, throughput, goodput
// and rejections (overall, per class, per tenant) as one JSON object, optionally a PNG of the
// latency CDFs.
//
//   bench_loadgen (--server ADDR | --spawn [serve flags...]) [--rate R | --concurrency C]
//                 [--jobs N | --duration S] [--mix CLASS:TENANT:WEIGHT[:TOKEN],...]
//                 [--arrival poisson|bursty --burst N] [--profile short|long]
//                 [--prompt-len N|A..B] [--prompt-dist fixed|uniform|normal|lognormal]
//                 [--prompt-mean M] [--prompt-cv C] [--prompt-kind ids|text] [--vocab N]
//                 [--max-tokens N|A..B] [--no-stream] [--no-ignore-eos] [--temperature T]
//                 [--slo-ttft-ms MS] [--slo-tpot-ms MS] [--sockets K] [--warmup N]
//                 [--plot FILE.png] [--overhead] [--latency-jobs N] [-- more serve args]
//   bench_loadgen ... --multi-turn N_CONVERSATIONS [--turns T] [--user-len N]
//                 [--prefix-cache on|off|both]    (chat sessions resending their history)
//   bench_loadgen --spawn --model FILE --peer-llama-server PATH [--rounds N] [--peer-arg A]...
//                 (the same closed-loop workload against ours and a llama-server, alternating)
//   bench_loadgen --http (--spawn ... | --server HOST:PORT) [--peer-llama-server PATH] ...
//                 (ours over its OpenAI HTTP door, POST /v1/completions streamed; the peer too)
//
// The parts: loadgen_options.cpp (command line), loadgen_server.cpp (the spawned server),
// loadgen_runner.cpp (one phase of load), loadgen_report.cpp (statistics), loadgen_multi_turn.cpp
// and loadgen_peer.cpp (the other modes); bench/loadgen.hpp declares what they share.
#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench/loadgen.hpp"
#include "model/gguf.hpp"
#include "model/llama.hpp"

namespace sy::bench::loadgen {
namespace {

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

// A drawn prompt longer than the model's context comes back as an error: say so before the run.
void warn_context(const Options& o) {
  if (!o.model || o.prompt_text) return;
  try {
    const auto ctx = sy::read_llama_config(sy::gguf::File::open(*o.model)).ctx_len;
    const uint64_t longest = uint64_t{o.prompt.bounds.hi} + o.max_tokens.hi;
    if (longest > static_cast<uint64_t>(ctx))
      std::cerr << "bench_loadgen: warning: prompts of up to " << o.prompt.bounds.hi << " and "
                << o.max_tokens.hi << " output tokens exceed the context of " << *o.model << " ("
                << ctx << "); the server refuses such jobs\n";
  } catch (const std::exception&) {
    // vocab_size() reports an unreadable model
  }
}

int main_impl(int argc, char** argv) {
  Options o = parse(argc, argv);
  warn_context(o);
  if (o.multi_turn > 0) return multi_turn_main(o, vocab_size(o));
  if (!o.peer_llama_server.empty() || o.http) return peer_main(o, vocab_size(o));
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
    Phase ph{o.concurrency, o.rate, o.jobs, o.duration_s, o.warmup, o.burst};
    RunData d = runner.run(ph);
    main_report = summarize(o, ph, d);
    out["result"] = main_report.json;
    failed = d.timed_out;
    std::ostringstream t;
    t << (o.rate > 0 ? "rate " + dump(num(o.rate)) + " jobs/s" +
                           (o.burst > 1 ? " in bursts of " + std::to_string(o.burst) : "")
                     : "concurrency " + std::to_string(o.concurrency))
      << ", max_tokens " << o.max_tokens.lo
      << (o.max_tokens.lo != o.max_tokens.hi ? ".." + std::to_string(o.max_tokens.hi) : "") << ", "
      << main_report.all.completed << " jobs";
    if (!o.profile.empty()) t << ", profile " << o.profile;
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
}  // namespace sy::bench::loadgen

int main(int argc, char** argv) {
  using namespace sy::bench::loadgen;
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
