// bench_loadgen's statistics and report: percentiles and goodput per group of jobs, the JSON
// figures, the latency plot, and the run's context (options, load average, server counters).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "bench/loadgen.hpp"

namespace sy::bench::loadgen {

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

Json dist(std::vector<double> v, double scale) {
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

namespace {

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
  if (j.prompt_sent) g.prompt_sent.push_back(j.prompt_sent);
  if (j.prompt_tokens) g.prompt_tokens.push_back(j.prompt_tokens);
  // As `vllm bench serve --goodput`: a job is good when its TTFT and its time per output token
  // (a 1-token job has none) are within their limits; an unset limit holds for every job.
  const bool ttft_ok = o.slo_ttft_ms <= 0 || ttft <= o.slo_ttft_ms;
  const bool tpot_ok = o.slo_tpot_ms <= 0 || !std::isfinite(tpot) || tpot <= o.slo_tpot_ms;
  g.met_ttft += ttft_ok;
  g.met_tpot += tpot_ok;
  if (ttft_ok && tpot_ok) ++g.good, g.good_tokens += j.tokens;
}

Json group_json(const Options& o, const Group& g, double secs, bool micro) {
  uint64_t overloaded = g.errors.count("overloaded") ? g.errors.at("overloaded") : 0;
  uint64_t limited = g.errors.count("rate_limited") ? g.errors.at("rate_limited") : 0;
  Json errors = Json::object();
  for (auto& [k, v] : g.errors) errors[k] = v;
  // Shares of every submitted job: a failed or unfinished job meets no SLO.
  auto share = [&](uint64_t n) {
    return num(g.submitted ? static_cast<double>(n) / g.submitted : NAN);
  };
  Json j = {{"submitted", g.submitted},
            {"completed", g.completed},
            {"output_tokens", g.out_tokens},
            {"jobs_per_s", num(g.completed / secs)},
            {"output_tokens_per_s", num(g.out_tokens / secs)},
            {"goodput",
             {{"slo_ttft_ms", o.slo_ttft_ms > 0 ? num(o.slo_ttft_ms) : Json(nullptr)},
              {"slo_tpot_ms", o.slo_tpot_ms > 0 ? num(o.slo_tpot_ms) : Json(nullptr)},
              {"jobs", g.good},
              {"jobs_per_s", num(g.good / secs)},
              {"output_tokens_per_s", num(g.good_tokens / secs)},
              {"fraction", share(g.good)},
              {"met_ttft_fraction", share(g.met_ttft)},
              {"met_tpot_fraction", share(g.met_tpot)}}},
            {"rejected", {{"overloaded", overloaded}, {"rate_limited", limited}}},
            {"errors", std::move(errors)},
            {"ttft_ms", dist(g.ttft)},
            {"tpot_ms", dist(g.tpot)},
            {"itl_ms", dist(g.itl)},
            {"e2e_ms", dist(g.e2e)},
            {"prompt_len", dist(g.prompt_sent)},
            {"prompt_tokens", dist(g.prompt_tokens)}};
  if (micro) j["e2e_us"] = dist(g.e2e, 1000.0);
  j["server"] = {
      {"queue_ms", dist(g.s_queue)}, {"ttft_ms", dist(g.s_ttft)}, {"total_ms", dist(g.s_total)}};
  return j;
}

std::string class_name(const Options& o, uint32_t mix) {
  return o.mix[mix].cls.empty() ? "(default)" : o.mix[mix].cls;
}

}  // namespace

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
  Json load = ph.rate > 0 ? Json{{"open_loop_rate", num(ph.rate)},
                                 {"arrival", ph.burst > 1 ? "bursty" : "poisson"},
                                 {"burst", ph.burst}}
                          : Json{{"concurrency", ph.concurrency}};
  load["warmup_jobs"] = ph.warmup;
  Json by_class = Json::object(), tenants = Json::object();
  for (auto& [k, g] : r.by_class) by_class[k] = group_json(o, g, secs, micro);
  for (auto& [k, g] : by_tenant) tenants[k] = group_json(o, g, secs, micro);
  r.json = {{"load", std::move(load)},          {"elapsed_s", num(secs)},
            {"timed_out", d.timed_out},         {"unmatched_messages", d.unmatched},
            {"arrival_lag_ms", dist(d.lag_ms)}, {"overall", group_json(o, r.all, secs, micro)},
            {"by_class", std::move(by_class)},  {"by_tenant", std::move(tenants)}};
  return r;
}

// ---- plot -------------------------------------------------------------------------------------

namespace {

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

}  // namespace

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

// ---- the run's context -----------------------------------------------------------------------

Json options_json(const Options& o, const std::string& endpoint) {
  auto range = [](const Range& r) {
    return r.lo == r.hi ? Json(r.lo) : Json(std::to_string(r.lo) + ".." + std::to_string(r.hi));
  };
  Json j = {{"server", endpoint}, {"spawned", o.spawn}};
  if (o.spawn) j["serve_args"] = o.serve_args;
  j["sockets"] = o.sockets;
  j["stream"] = o.stream;
  j["ignore_eos"] = o.ignore_eos;
  j["prompt_len"] = range(o.prompt.bounds);
  j["profile"] = o.profile.empty() ? Json(nullptr) : Json(o.profile);
  j["prompt_dist"] = len_dist_name(o.prompt.dist);
  if (o.prompt.dist != LenDist::uniform) j["prompt_mean"] = num(o.prompt.mean);
  if (o.prompt.dist == LenDist::normal || o.prompt.dist == LenDist::lognormal)
    j["prompt_cv"] = num(o.prompt.cv);
  if (o.rate > 0) j["arrival"] = o.burst > 1 ? "bursty" : "poisson";
  if (o.burst > 1) j["burst"] = o.burst;
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

}  // namespace sy::bench::loadgen
