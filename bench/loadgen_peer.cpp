// bench_loadgen --peer-llama-server: the same closed-loop workload against our server and a
// llama-server on the same model file, in alternating rounds, with the ratios of their figures.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/loadgen.hpp"

namespace sy::bench::loadgen {
namespace {

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

}  // namespace

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

}  // namespace sy::bench::loadgen
