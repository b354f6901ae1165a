// bench_loadgen --peer-llama-server and --http: the same closed-loop workload in rounds against our
// server (over ZeroMQ, or over its OpenAI HTTP door) and, with a peer, a llama-server on the same
// model file, alternating, with the ratios of their figures.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/loadgen.hpp"

namespace sy::bench::loadgen {
namespace {

using sy::bench::HttpTarget;
using sy::bench::PeerApi;
using sy::bench::PeerRequest;
using sy::bench::PeerRun;

/// The requests of one round, sent to both servers. Every round draws new prompts (seed and
/// round), so no prefix cache serves a round from an earlier one.
std::vector<PeerRequest> round_workload(const Options& o, int vocab, int round) {
  std::mt19937_64 rng(o.seed * 1000003u + static_cast<uint64_t>(round));
  std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
  std::uniform_int_distribution<size_t> word(0, std::size(kWords) - 1);
  auto pick = [&](const Range& r) {
    return r.lo == r.hi ? r.lo : std::uniform_int_distribution<uint32_t>(r.lo, r.hi)(rng);
  };
  std::vector<PeerRequest> w(o.warmup + o.jobs);
  for (size_t i = 0; i < w.size(); ++i) {
    PeerRequest& q = w[i];
    const uint32_t len = draw_len(o.prompt, rng);
    if (o.prompt_text) {
      // Random words, about a token each (as the load mode's --prompt-kind text).
      for (uint32_t k = 0; k < len; ++k) {
        if (k) q.prompt_text += ' ';
        q.prompt_text += kWords[word(rng)];
      }
    } else {
      q.prompt.resize(len);
      for (int32_t& t : q.prompt) t = tok(rng);
    }
    q.max_tokens = pick(o.max_tokens);
    q.temperature = o.temperature;
    q.seed = static_cast<uint64_t>(round) * w.size() + i + 1;
    q.ignore_eos = true;
  }
  return w;
}

/// An HTTP client's jobs in the shape of the ZeroMQ runner's, so both go through the same
/// statistics.
RunData http_run_data(const PeerRun& p) {
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
  // Native: requests that streamed fewer token ids than they generated (llama-server sends no
  // chunk for a token that ends inside a UTF-8 character, so a random model's byte tokens leave
  // gaps; its TTFT or ITL then spans two tokens). OpenAI: requests with fewer text chunks than
  // tokens (the same gaps, or a server that puts several tokens in one chunk). Not errors.
  uint64_t streamed_fewer = 0;
  bool openai = false;
  std::vector<std::string> examples;
  void add(size_t idx, const std::string& what) {
    ++wrong;
    if (examples.size() < 5) examples.push_back("request " + std::to_string(idx) + ": " + what);
  }
};

LengthCheck check_zmq(const RunData& d, const std::vector<PeerRequest>& w) {
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

/// Native streams: the final chunk's tokens_predicted and timings.predicted_n; OpenAI streams:
/// the usage's completion_tokens, finish_reason "length" and llama-server's timings.predicted_n
/// where it sends them. Neither may stream more chunks than tokens.
LengthCheck check_http(const PeerRun& p, const std::vector<PeerRequest>& w, bool openai) {
  LengthCheck c;
  c.openai = openai;
  for (size_t i = 0; i < p.jobs.size(); ++i) {
    const sy::bench::PeerJob& j = p.jobs[i];
    if (!j.finished || !j.ok) continue;
    const int64_t want = w[i].max_tokens;
    if (openai) {
      if (j.text_chunks < j.tokens_predicted) ++c.streamed_fewer;
      if (j.tokens_predicted != want || (j.predicted_n >= 0 && j.predicted_n != want) ||
          j.text_chunks > want || j.finish_reason != "length")
        c.add(i, "usage.completion_tokens " + std::to_string(j.tokens_predicted) +
                     ", timings.predicted_n " + std::to_string(j.predicted_n) + ", text chunks " +
                     std::to_string(j.text_chunks) + ", finish_reason '" + j.finish_reason +
                     "', asked " + std::to_string(want));
      continue;
    }
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
          {c.openai ? "fewer_text_chunks_than_tokens" : "streamed_fewer_ids", c.streamed_fewer}};
}

/// One round's JSON of a side driven over HTTP: the usual figures (without ours' `server`
/// timings, which no HTTP answer carries), the connections, and the server's own timings where
/// its stream has them (llama-server's `timings`) under `timings_key`.
Json http_round_json(const Report& r, const PeerRun& pr, const LengthCheck& c, int round,
                     size_t warmup, const char* timings_key) {
  Json j = r.json;
  j["round"] = round;
  j["length_check"] = length_json(c);
  j["connections_opened"] = pr.connections_opened;
  j["resent_on_new_connection"] = pr.resent_on_new_connection;
  j["overall"].erase("server");
  for (const char* m : {"by_class", "by_tenant"})
    for (auto& g : j[m].items()) g.value().erase("server");
  std::vector<double> prompt_ms, predicted_ms;
  for (size_t i = warmup; i < pr.jobs.size(); ++i)
    if (pr.jobs[i].ok && pr.jobs[i].predicted_ms > 0) {
      prompt_ms.push_back(pr.jobs[i].prompt_ms);
      predicted_ms.push_back(pr.jobs[i].predicted_ms);
    }
  if (!predicted_ms.empty())
    j[timings_key] = {{"prompt_ms", dist(prompt_ms)}, {"predicted_ms", dist(predicted_ms)}};
  return j;
}

/// The kernel's count of connections a full listen queue turned away (TcpExt ListenOverflows in
/// /proc/net/netstat; -1 when unreadable). A server that closes every streamed connection makes
/// the client reconnect for every request; when more connections arrive at once than its listen
/// backlog holds (llama-server's HTTP library listens with a backlog of 5), the kernel drops the
/// handshake's last ACK and the client's request waits for the SYN-ACK to be resent, a second
/// later: this counter, read around a side's run, says how many of its requests that hit.
int64_t listen_overflows() {
  std::ifstream f("/proc/net/netstat");
  std::string names, values;
  while (std::getline(f, names) && std::getline(f, values)) {
    if (names.rfind("TcpExt:", 0) != 0) continue;
    std::istringstream n(names), v(values);
    std::string name, value;
    while (n >> name && v >> value)
      if (name == "ListenOverflows") return std::stoll(value);
  }
  return -1;
}

/// Runs `requests` against `t`, with the listen overflows of the run in `overflows`.
PeerRun run_http(const HttpTarget& t, const std::vector<PeerRequest>& requests, const Options& o,
                 int64_t& overflows) {
  const int64_t before = listen_overflows();
  PeerRun pr = sy::bench::run_peer(t, requests, o.warmup, o.concurrency, o.timeout_s);
  const int64_t after = listen_overflows();
  overflows = before >= 0 && after >= 0 ? after - before : -1;
  return pr;
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

// A ratio to 3 significant digits (a TTFT ratio may be 0.004).
std::string fmt_ratio(double v) {
  if (!std::isfinite(v)) return "n/a";
  char b[64];
  std::snprintf(b, sizeof b, "%.3g", v);
  return b;
}

/// Waits until the spawned server's HTTP door answers GET /health with 200 (it binds the door
/// while it starts, so "ready" on stdout may come first); throws when the server exits first.
void wait_http_ready(Spawned& server, int port) {
  // As long as a model load may take (Spawned's startup limit): the door comes up with the server.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  std::string why;
  for (;;) {
    if (!server.alive())
      throw std::runtime_error("switchyard serve exited before its HTTP door answered");
    sy::bench::HttpAnswer a = sy::bench::http_get("127.0.0.1", port, "/health");
    if (a.status == 200) return;
    why = a.status
              ? "GET /health answered " + std::to_string(a.status) + " " + a.body.substr(0, 200)
              : a.error;
    if (std::chrono::steady_clock::now() > until)
      throw std::runtime_error("the HTTP door on 127.0.0.1:" + std::to_string(port) +
                               " did not answer GET /health with 200 (" + why + ")");
    // No readiness line names the door: look again shortly (a tenth of a second costs nothing
    // against a start that takes seconds).
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

/// GET /v1/models of an OpenAI server: the answer (parsed, or the error) for the report and the
/// first model's id, which the requests then name (what an OpenAI client does). "" when the
/// answer names none: the requests then name no model and `problem` says why.
std::string first_model(const HttpTarget& t, Json& record, std::string& problem) {
  sy::bench::HttpAnswer a = sy::bench::http_get(t.host, t.port, "/v1/models");
  if (a.status == 0) {
    problem = t.name + ": GET /v1/models failed: " + a.error;
    record = problem;
    return "";
  }
  try {
    record = Json::parse(a.body);
  } catch (const Json::exception&) {
    record = a.body.substr(0, 500);
  }
  if (a.status != 200) {
    problem = t.name + ": GET /v1/models answered " + std::to_string(a.status);
    return "";
  }
  if (record.is_object() && record.value("object", "") == "list" && record.contains("data") &&
      record["data"].is_array() && !record["data"].empty() && record["data"][0].is_object() &&
      record["data"][0].contains("id") && record["data"][0]["id"].is_string())
    return record["data"][0]["id"].get<std::string>();
  problem = t.name + ": GET /v1/models is not a list of models with ids";
  return "";
}

}  // namespace

int peer_main(const Options& o, int vocab) {
  const bool with_peer = !o.peer_llama_server.empty();
  const std::string peer_name = "llama-server";
  std::vector<std::string> problems;
  bool failed = false;

  // Ours: spawned (over ZeroMQ, or over its HTTP door with --http), or an HTTP server that runs
  // already (--http --server HOST:PORT).
  std::unique_ptr<Spawned> server;
  HttpTarget ours_http;
  ours_http.api = PeerApi::openai;
  ours_http.name = o.spawn ? "switchyard" : "the server";
  std::string ours_endpoint;
  if (o.spawn) {
    std::vector<std::string> args = o.serve_args;
    if (o.http) {
      ours_http.port = sy::bench::free_loopback_port();
      args.insert(args.end(), {"--http", "127.0.0.1:" + std::to_string(ours_http.port)});
    }
    std::cerr << "bench_loadgen: starting switchyard serve"
              << (o.http ? " with --http 127.0.0.1:" + std::to_string(ours_http.port) : "") << "\n";
    const std::string bin = o.switchyard.empty() ? default_switchyard() : o.switchyard;
    try {
      server = std::make_unique<Spawned>(bin, args);
    } catch (const std::exception& e) {
      if (!o.http) throw;
      throw std::runtime_error(std::string(e.what()) +
                               " (does this switchyard serve know --http? see `" + bin +
                               " serve --help`)");
    }
    if (o.http) wait_http_ready(*server, ours_http.port);
    ours_endpoint =
        o.http ? "http://127.0.0.1:" + std::to_string(ours_http.port) : server->endpoint();
  } else {
    ours_http.host = o.http_host;
    ours_http.port = o.http_port;
    ours_endpoint = "http://" + o.http_host + ":" + std::to_string(o.http_port);
  }

  std::unique_ptr<sy::bench::LlamaServer> peer;
  HttpTarget peer_http;
  if (with_peer) {
    // Each slot holds one request: its prompt, its completion and a margin, so that neither a
    // context shift nor a truncation can happen inside the workload.
    const int per_slot = static_cast<int>(o.prompt.bounds.hi + o.max_tokens.hi) + 64;
    sy::bench::LlamaServerOptions lo;
    lo.binary = o.peer_llama_server;
    lo.model = *o.model;
    lo.threads = o.threads;
    lo.parallel = o.concurrency;
    lo.ctx = per_slot * o.concurrency;
    lo.extra = o.peer_args;
    std::cerr << "bench_loadgen: starting " << o.peer_llama_server << "\n";
    peer = std::make_unique<sy::bench::LlamaServer>(lo);
    std::cerr << "bench_loadgen: llama-server ready on port " << peer->port() << "\n";
    peer_http.port = peer->port();
    peer_http.api = o.http ? PeerApi::openai : PeerApi::llama_native;
    peer_http.name = peer_name;
  }

  Json out = {{"tool", "bench_loadgen"},
              {"mode", with_peer ? "peer" : "http"},
              {"options", options_json(o, ours_endpoint)},
              {"loadavg_before", loadavg()}};
  out["options"]["concurrency"] = o.concurrency;
  out["options"]["jobs_per_round"] = o.jobs;
  out["options"]["warmup_per_round"] = o.warmup;
  out["options"]["rounds"] = o.rounds;
  out["options"]["threads"] = o.threads;
  out["options"]["vocab"] = vocab;
  out["options"]["http"] = o.http;
  if (o.http) {
    out["api"] = "POST /v1/completions, stream true, stream_options.include_usage";
    out["ttft_definition"] =
        "from the send of a request (its connection already open) to the first chunk whose "
        "choices[0].text is not empty, on both sides";
    Json models = Json::object();
    auto take_model = [&](HttpTarget& t, const char* key) {
      std::string problem;
      Json record;
      t.model = first_model(t, record, problem);
      models[key] = {{"answer", std::move(record)}, {"model_sent", t.model}};
      if (!problem.empty()) {
        failed = true;
        problems.push_back(problem);
        std::cerr << "bench_loadgen: " << problem << " (requests name no model)\n";
      }
    };
    take_model(ours_http, "ours");
    if (with_peer) take_model(peer_http, "peer");
    out["v1_models"] = std::move(models);
  }

  std::optional<Runner> runner;
  if (!o.http) runner.emplace(o, ours_endpoint, vocab);
  Json ours_rounds = Json::array(), peer_rounds = Json::array(), ratio_rounds = Json::array();
  std::vector<Figures> fo, fp;
  const Phase ph{o.concurrency, 0, o.jobs, 0, o.warmup};
  auto note = [&](int round, bool bad, const std::string& what) {
    if (!bad) return;
    failed = true;
    problems.push_back("round " + std::to_string(round + 1) + ": " + what);
  };
  // The problems of one side's round (its name, what it timed out, failed, got wrong).
  auto check_side = [&](int round, const std::string& name, const RunData& d, const Figures& f,
                        const LengthCheck& c) {
    note(round, d.timed_out, name + " timed out");
    note(round, f.failed > 0, name + " failed " + std::to_string(f.failed) + " requests");
    for (const Job& j : d.jobs)
      if (!j.warm && j.finished && !j.failure.empty()) {
        note(round, true, name + ": " + j.failure.substr(0, 300) + " (the first failure)");
        break;
      }
    note(round, c.wrong > 0,
         name + " generated the wrong number of tokens for " + std::to_string(c.wrong) +
             " requests" + (c.examples.empty() ? "" : " (" + c.examples[0] + ")"));
  };
  for (int round = 0; round < o.rounds; ++round) {
    const auto w = round_workload(o, vocab, round);
    std::cerr << "bench_loadgen: round " << round + 1 << "/" << o.rounds << ": ours"
              << (o.http ? " over HTTP" : "") << "\n";
    RunData d_ours;
    Report r_ours;
    Json jo;
    if (o.http) {
      int64_t overflows = 0;
      PeerRun pr = run_http(ours_http, w, o, overflows);
      d_ours = http_run_data(pr);
      r_ours = summarize(o, ph, d_ours);
      LengthCheck c = check_http(pr, w, true);
      jo = http_round_json(r_ours, pr, c, round + 1, o.warmup, "server_timings");
      jo["listen_overflows"] = overflows;
      check_side(round, "ours", d_ours, figures(r_ours.all, d_ours), c);
    } else {
      runner->set_workload(&w);
      d_ours = runner->run(ph);
      r_ours = summarize(o, ph, d_ours);
      LengthCheck c = check_zmq(d_ours, w);
      jo = r_ours.json;
      jo["round"] = round + 1;
      jo["length_check"] = length_json(c);
      check_side(round, "ours", d_ours, figures(r_ours.all, d_ours), c);
    }
    ours_rounds.push_back(std::move(jo));
    fo.push_back(figures(r_ours.all, d_ours));
    if (!with_peer) continue;

    std::cerr << "bench_loadgen: round " << round + 1 << "/" << o.rounds << ": llama-server"
              << (o.http ? " over HTTP (/v1/completions)" : "") << "\n";
    int64_t overflows = 0;
    PeerRun pr = run_http(peer_http, w, o, overflows);
    RunData d_peer = http_run_data(pr);
    Report r_peer = summarize(o, ph, d_peer);
    LengthCheck c_peer = check_http(pr, w, o.http);
    // The peer's own timings (its slot's prompt and generation phases), in place of ours'.
    Json jp = http_round_json(r_peer, pr, c_peer, round + 1, o.warmup, "peer_timings");
    jp["listen_overflows"] = overflows;
    peer_rounds.push_back(std::move(jp));
    Figures a = fo.back(), b = figures(r_peer.all, d_peer);
    fp.push_back(b);
    check_side(round, peer_name, d_peer, b, c_peer);
    ratio_rounds.push_back({{"round", round + 1},
                            {"output_tokens_per_s", num(a.tps / b.tps)},
                            {"ttft_p50", num(a.ttft_p50 / b.ttft_p50)},
                            {"ttft_p99", num(a.ttft_p99 / b.ttft_p99)}});
  }
  auto med = [](const std::vector<Figures>& v, double Figures::*m) {
    std::vector<double> x;
    for (const Figures& f : v) x.push_back(f.*m);
    return median(x);
  };
  auto side_summary = [&](const std::vector<Figures>& v) {
    return Json{{"output_tokens_per_s", num(med(v, &Figures::tps))},
                {"ttft_p50_ms", num(med(v, &Figures::ttft_p50))},
                {"ttft_p99_ms", num(med(v, &Figures::ttft_p99))}};
  };
  std::vector<double> r_tps, r_p50, r_p99;
  for (size_t i = 0; i < fp.size(); ++i) {
    r_tps.push_back(fo[i].tps / fp[i].tps);
    r_p50.push_back(fo[i].ttft_p50 / fp[i].ttft_p50);
    r_p99.push_back(fo[i].ttft_p99 / fp[i].ttft_p99);
  }
  out["ours"] = {{"transport", o.http ? "http" : "zeromq"},
                 {"endpoint", ours_endpoint},
                 {"rounds", std::move(ours_rounds)}};
  if (with_peer)
    out["peer"] = {{"name", peer_name},
                   {"binary", o.peer_llama_server},
                   {"api", sy::bench::api_path(peer_http.api)},
                   {"argv", peer->argv()},
                   {"rounds", std::move(peer_rounds)},
                   {"ours_over_peer",
                    {{"rounds", std::move(ratio_rounds)},
                     {"median",
                      {{"output_tokens_per_s", num(median(r_tps))},
                       {"ttft_p50", num(median(r_p50))},
                       {"ttft_p99", num(median(r_p99))}}}}}};
  out["summary"] = {{"ours", side_summary(fo)}};
  if (with_peer) out["summary"]["peer"] = side_summary(fp);
  out["summary"]["problems"] = problems;
  out["loadavg_after"] = loadavg();
  if (server) {
    std::string st = server->stats();
    if (!st.empty()) out["server_stats"] = server_stats(st);
    server->stop();
  }
  if (peer) peer->stop();
  if (failed && peer)
    std::cerr << "bench_loadgen: the end of llama-server's log:\n" << peer->log_tail(3000);
  std::cout << dump(out) << std::endl;

  // One line per metric on stderr: each round's figure, then the median ratio of the rounds.
  auto line = [&](const char* name, double Figures::*m, int prec, const std::vector<double>& r) {
    std::ostringstream l;
    l << "bench_loadgen: " << name << ": ours";
    for (const Figures& f : fo) l << " " << fmt(f.*m, prec);
    if (with_peer) {
      l << " | llama-server";
      for (const Figures& f : fp) l << " " << fmt(f.*m, prec);
      l << " | ours/llama-server " << fmt_ratio(median(r)) << " (median of " << r.size()
        << " rounds)";
    }
    std::cerr << l.str() << "\n";
  };
  line("output tokens/s", &Figures::tps, 0, r_tps);
  line("TTFT p50 ms", &Figures::ttft_p50, 2, r_p50);
  line("TTFT p99 ms", &Figures::ttft_p99, 2, r_p99);
  {
    std::ostringstream l;
    l << "bench_loadgen: completed/failed: ours";
    for (const Figures& f : fo) l << " " << f.completed << "/" << f.failed;
    if (with_peer) {
      l << " | llama-server";
      for (const Figures& f : fp) l << " " << f.completed << "/" << f.failed;
    }
    std::cerr << l.str() << "\n";
  }
  if (with_peer) {
    // The same figures as one table: a row per round and the medians, both sides and the ratio.
    std::ostringstream t;
    t << "bench_loadgen: | round | ours tokens/s | llama-server tokens/s | ratio | ours TTFT p50 "
         "ms | llama-server TTFT p50 ms | ratio | ours TTFT p99 ms | llama-server TTFT p99 ms | "
         "ratio |\n";
    auto row = [&](const std::string& label, const Figures& a, const Figures& b) {
      t << "bench_loadgen: | " << label << " | " << fmt(a.tps, 0) << " | " << fmt(b.tps, 0) << " | "
        << fmt_ratio(a.tps / b.tps) << " | " << fmt(a.ttft_p50, 2) << " | " << fmt(b.ttft_p50, 2)
        << " | " << fmt_ratio(a.ttft_p50 / b.ttft_p50) << " | " << fmt(a.ttft_p99, 2) << " | "
        << fmt(b.ttft_p99, 2) << " | " << fmt_ratio(a.ttft_p99 / b.ttft_p99) << " |\n";
    };
    for (size_t i = 0; i < fp.size(); ++i) row(std::to_string(i + 1), fo[i], fp[i]);
    if (fp.size() > 1) {
      // The median row's ratios are the medians of the rounds' ratios, not ratios of medians.
      t << "bench_loadgen: | median | " << fmt(med(fo, &Figures::tps), 0) << " | "
        << fmt(med(fp, &Figures::tps), 0) << " | " << fmt_ratio(median(r_tps)) << " | "
        << fmt(med(fo, &Figures::ttft_p50), 2) << " | " << fmt(med(fp, &Figures::ttft_p50), 2)
        << " | " << fmt_ratio(median(r_p50)) << " | " << fmt(med(fo, &Figures::ttft_p99), 2)
        << " | " << fmt(med(fp, &Figures::ttft_p99), 2) << " | " << fmt_ratio(median(r_p99))
        << " |\n";
    }
    std::cerr << t.str();
  }
  for (const std::string& p : problems) std::cerr << "bench_loadgen: FAILED: " << p << "\n";
  return failed ? 1 : 0;
}

}  // namespace sy::bench::loadgen
