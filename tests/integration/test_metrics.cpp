// /metrics, /health and /ready of the real server (issue 6, must show 5): jobs of two tenants and
// two classes go through `switchyard serve`, then /metrics is parsed by Debian's
// python3-prometheus-client parser and its counters must agree with what was sent; after an
// executor fault, the supervisor's figures on /metrics agree with its own stats.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "clients/cpp/client.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_metrics)

using namespace std::chrono_literals;

namespace {

// The Debian interpreter: it has the distribution's python3-prometheus-client, which the `python3`
// first on a developer's PATH may lack.
const std::string kPython = "/usr/bin/python3";

using sy::it::http_get;
using sy::it::HttpResult;

// /ready's status once it says 200, or after 30 s: the supervisor announces its first pair to the
// metrics actor by message, which may land just after serve prints "ready".
int wait_ready(const std::string& address) {
  int status = -1;
  for (int i = 0; i < 300; ++i) {
    status = http_get(address, "/ready").status;
    if (status == 200) break;
    std::this_thread::sleep_for(100ms);
  }
  return status;
}

// What the reference parser read: each sample as name + sorted labels -> value, and each
// family's type.
struct Parsed {
  std::map<std::string, double> samples;     // "name{k=v,k=v}" (labels sorted by key), "name"
  std::map<std::string, std::string> types;  // family name -> type
  std::vector<std::pair<std::string, double>> in_order;  // "name{...}" in the text's order
  double at(const std::string& key) const {
    auto it = samples.find(key);
    if (it == samples.end()) throw std::runtime_error("no sample " + key);
    return it->second;
  }
  bool has(const std::string& key) const { return samples.count(key) > 0; }
};

// Parses `text` with prometheus_client.parser (a parse error fails the script, so the test).
Parsed parse_with_python(const std::string& text, const std::string& dir) {
  std::string file = dir + "/metrics.txt";
  std::ofstream(file) << text;
  std::string script = dir + "/parse.py";
  std::ofstream(script) << R"(import sys
from prometheus_client.parser import text_string_to_metric_families
text = open(sys.argv[1], encoding='utf-8').read()
for fam in text_string_to_metric_families(text):
    print('F\t%s\t%s' % (fam.name, fam.type))
    for s in fam.samples:
        labels = ','.join('%s=%s' % (k, s.labels[k]) for k in sorted(s.labels))
        print('S\t%s%s\t%r' % (s.name, '{%s}' % labels if labels else '', float(s.value)))
)";
  sy::it::Run r;
  FILE* p = popen((kPython + " " + script + " " + file + " 2>&1").c_str(), "r");
  BOOST_REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  BOOST_REQUIRE_MESSAGE(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                        "prometheus_client could not parse /metrics: " << r.out);
  Parsed out;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> f;
    std::istringstream ls(line);
    for (std::string x; std::getline(ls, x, '\t');) f.push_back(x);
    if (f.size() != 3) continue;
    if (f[0] == "F") out.types[f[1]] = f[2];
    if (f[0] == "S") {
      double v = f[2] == "inf" ? INFINITY : std::stod(f[2]);
      out.samples[f[1]] = v;
      out.in_order.emplace_back(f[1], v);
    }
  }
  return out;
}

struct Sent {
  std::string tenant, cls;
};

}  // namespace

BOOST_AUTO_TEST_CASE(metrics_agree_with_the_jobs_sent) {
  sy::it::TempDir dir;
  // The metrics address from the config file (port 0: any free one).
  std::string cfg = dir.path() + "/metrics.yaml";
  std::ofstream(cfg) << "metrics:\n  bind: \"127.0.0.1:0\"\n";
  sy::it::ServerProcess srv({"--model", sy::it::kStories, "--threads", "1", "--config", cfg});
  const std::string addr = srv.metrics_endpoint();
  BOOST_REQUIRE_MESSAGE(!addr.empty(), "no 'switchyard: metrics on' line");
  BOOST_TEST(addr.rfind("127.0.0.1:", 0) == 0u);

  BOOST_TEST(http_get(addr, "/health").status == 200);
  BOOST_TEST(wait_ready(addr) == 200);
  BOOST_TEST(http_get(addr, "/nowhere").status == 404);

  // Two tenants x two classes, uneven counts so that a mix-up shows; plus one job of an unknown
  // class, which admission refuses as bad_request.
  const std::map<std::pair<std::string, std::string>, int> plan = {{{"alpha", "interactive"}, 7},
                                                                   {{"alpha", "batch"}, 3},
                                                                   {{"beta", "interactive"}, 4},
                                                                   {{"beta", "batch"}, 6}};
  const uint32_t max_tokens = 5;
  sy::client::Client cl(srv.endpoint());
  std::set<std::string> waiting;
  int total = 0;
  for (const auto& [key, count] : plan) {
    for (int i = 0; i < count; ++i) {
      sy::wire::Submit s;
      s.id = key.first + "-" + key.second + "-" + std::to_string(i);
      s.tenant = key.first;
      s.priority = key.second;
      s.prompt = std::vector<int32_t>{1, 20 + i, 30 + total % 5};
      s.max_tokens = max_tokens;
      s.ignore_eos = true;
      s.temperature = 0;
      cl.submit(s);
      waiting.insert(s.id);
      ++total;
    }
  }
  sy::wire::Submit bad;
  bad.id = "bad-class";
  bad.tenant = "alpha";
  bad.priority = "no-such-class";
  bad.prompt = std::vector<int32_t>{1, 2};
  cl.submit(bad);
  waiting.insert(bad.id);
  int done = 0, errors = 0;
  std::string bad_code;
  while (!waiting.empty()) {
    auto m = cl.next(60s);
    BOOST_REQUIRE_MESSAGE(m.has_value(), "no answer for " << waiting.size() << " jobs");
    if (auto* d = std::get_if<sy::wire::Done>(&*m)) {
      waiting.erase(d->id);
      ++done;
      BOOST_TEST(d->usage.completion_tokens == max_tokens);
    } else if (auto* e = std::get_if<sy::wire::Error>(&*m)) {
      waiting.erase(e->id);
      ++errors;
      if (e->id == "bad-class") bad_code = std::string(sy::to_string(e->code));
    }
  }
  BOOST_TEST(done == total);
  BOOST_TEST(errors == 1);
  BOOST_TEST(bad_code == "bad_request");

  // A client may see its last `done` before admission has counted the job (the two travel
  // separately). Admission forwards each outcome to the metrics actor before it answers that
  // actor's stats request, so a scrape showing no active job has counted every job.
  HttpResult res;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 300; ++i) {
    t0 = std::chrono::steady_clock::now();
    res = http_get(addr, "/metrics");
    if (res.status == 200 && res.body.find("\nswitchyard_jobs_active 0\n") != std::string::npos)
      break;
    std::this_thread::sleep_for(100ms);
  }
  auto scrape_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  BOOST_REQUIRE(res.status == 200);
  BOOST_TEST(res.content_type.find("text/plain; version=0.0.4") == 0u, res.content_type);
  BOOST_TEST_MESSAGE("scrape: " << res.body.size() << " bytes in " << scrape_ms << " ms");
  auto p = parse_with_python(res.body, dir.path());

  // Every job counted once, under its own class and tenant; the refused one is not a job.
  double sum = 0;
  for (const auto& [key, count] : plan) {
    std::string k =
        "switchyard_jobs_total{class=" + key.second + ",outcome=done,tenant=" + key.first + "}";
    BOOST_TEST_CONTEXT(k) {
      BOOST_TEST(p.at(k) == count);
    }
  }
  for (const auto& [k, v] : p.samples)
    if (k.rfind("switchyard_jobs_total{", 0) == 0) sum += v;
  BOOST_TEST(sum == total);
  BOOST_TEST(p.at("switchyard_jobs_rejected_total{reason=bad_request}") == 1);
  BOOST_TEST(p.at("switchyard_jobs_rejected_total{reason=unauthorized}") == 0);
  BOOST_TEST(p.types.at("switchyard_jobs") == "counter");
  BOOST_TEST(p.types.at("switchyard_time_to_first_token_seconds") == "histogram");

  // Histograms: one observation per done job of the class; buckets cumulative; +Inf = count.
  for (const char* cls : {"interactive", "batch"}) {
    int n = 0;
    for (const auto& [key, count] : plan)
      if (key.second == cls) n += count;
    for (const char* h :
         {"switchyard_queue_time_seconds", "switchyard_time_to_first_token_seconds",
          "switchyard_time_per_output_token_seconds", "switchyard_e2e_request_latency_seconds"}) {
      std::string base = std::string(h);
      BOOST_TEST_CONTEXT(base << " " << cls) {
        BOOST_TEST(p.at(base + "_count{class=" + cls + "}") == n);
        BOOST_TEST(p.at(base + "_bucket{class=" + std::string(cls) + ",le=+Inf}") == n);
        BOOST_TEST(p.at(base + "_sum{class=" + std::string(cls) + "}") > 0);
        double prev = 0;
        std::string prefix = base + "_bucket{class=" + cls + ",";
        for (const auto& [k, v] : p.in_order) {
          if (k.rfind(prefix, 0) != 0) continue;
          BOOST_TEST(v >= prev, k);
          prev = v;
        }
      }
    }
  }

  BOOST_TEST(p.at("switchyard_generation_tokens_total") == total * static_cast<double>(max_tokens));
  BOOST_TEST(p.at("switchyard_prompt_tokens_total") == total * 3.0);
  BOOST_TEST(p.at("switchyard_executors_running") == 1);
  BOOST_TEST(p.at("switchyard_jobs_active") == 0);
  BOOST_TEST(p.at("switchyard_jobs_running") == 0);
  BOOST_TEST(p.at("switchyard_queue_depth{class=interactive}") == 0);
  BOOST_TEST(p.at("switchyard_queue_depth{class=batch}") == 0);
  BOOST_TEST(p.at("switchyard_kv_blocks_total") > 0);
  BOOST_TEST(p.at("switchyard_kv_blocks_used") == 0);
  BOOST_TEST(p.has("switchyard_kv_blocks_free"));
  BOOST_TEST(p.has("switchyard_kv_blocks_cached"));
  BOOST_TEST(p.has("switchyard_preemptions_total"));
  BOOST_TEST(p.has("switchyard_prefix_cache_hit_tokens_total"));
  BOOST_TEST(p.has("switchyard_kv_policy_swaps_total"));
  // Every job took at least a step, and steps take time.
  BOOST_TEST(p.at("switchyard_engine_steps_total") >= static_cast<double>(max_tokens));
  BOOST_TEST(p.at("switchyard_engine_step_seconds_total") > 0);
  for (const auto& [k, v] : p.samples)
    if (k.find("_seconds_sum") != std::string::npos) BOOST_TEST_MESSAGE(k << " = " << v);

  BOOST_TEST(http_get(addr, "/ready").status == 200);
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

// `ctl drain` with jobs in flight: new submits get `unavailable`, /ready answers 503 so that a
// load balancer looks elsewhere, the jobs already in finish; `ctl resume` undoes it. Only the
// admin token may do either.
BOOST_AUTO_TEST_CASE(drain_and_resume) {
  sy::it::ServerProcess srv({"--backend", "null", "--step-delay-ms", "20", "--admin-token", "adm",
                             "--metrics", "127.0.0.1:0"});
  const std::string addr = srv.metrics_endpoint();
  BOOST_REQUIRE(wait_ready(addr) == 200);
  sy::client::Client cl(srv.endpoint());
  auto submit = [&](const std::string& id, uint32_t max_tokens) {
    sy::wire::Submit s;
    s.id = id;
    s.tenant = "t";
    s.prompt = std::vector<int32_t>{1, 2, 3};
    s.max_tokens = max_tokens;
    s.ignore_eos = true;
    cl.submit(s);
  };
  // The done or error of job `id`. Terminal messages of other jobs that arrive first are kept
  // for their own call: on a loaded machine the early jobs can end before the late refusal.
  std::map<std::string, sy::wire::ServerMessage> ended;
  auto outcome = [&](const std::string& id) -> std::optional<sy::wire::ServerMessage> {
    for (int i = 0; i < 2000; ++i) {
      if (auto it = ended.find(id); it != ended.end()) return it->second;
      auto m = cl.next(50ms);
      if (!m) continue;
      if (std::holds_alternative<sy::wire::Done>(*m) || std::holds_alternative<sy::wire::Error>(*m))
        ended.emplace(std::string(sy::client::message_id(*m)), *m);
    }
    return std::nullopt;
  };
  auto draining = [&](const sy::client::ControlResult& r) {
    BOOST_REQUIRE_MESSAGE(r.ok(), (r.error ? r.error->message : std::string("no answer")));
    return nlohmann::json::parse(r.reply->result).at("draining").get<int64_t>();
  };

  for (int i = 0; i < 3; ++i) submit("early" + std::to_string(i), 30);  // 30 steps of 20 ms
  // The operator's connection is another socket: its drain could overtake the early submits
  // unless they are accepted first.
  for (int accepted = 0, i = 0; accepted < 3 && i < 2000; ++i) {
    auto m = cl.next(50ms);
    if (!m) continue;
    if (std::holds_alternative<sy::wire::Accepted>(*m)) ++accepted;
    if (std::holds_alternative<sy::wire::Done>(*m) || std::holds_alternative<sy::wire::Error>(*m))
      ended.emplace(std::string(sy::client::message_id(*m)), *m);
  }
  sy::client::Client op(srv.endpoint());
  auto refused = op.control("drain", "", "not-the-token", 20s);
  BOOST_REQUIRE(refused.error.has_value());
  BOOST_TEST(to_string(refused.error->code) == "unauthorized");

  BOOST_TEST(draining(op.control("drain", "", "adm", 20s)) == 1);
  BOOST_TEST(http_get(addr, "/ready").status == 503);
  BOOST_TEST(http_get(addr, "/health").status == 200);
  submit("late", 4);
  auto late = outcome("late");
  BOOST_REQUIRE(late.has_value());
  auto* e = std::get_if<sy::wire::Error>(&*late);
  BOOST_REQUIRE_MESSAGE(e, "a submit while draining was not refused");
  BOOST_TEST(to_string(e->code) == "unavailable");
  BOOST_TEST(e->message.find("draining") != std::string::npos, e->message);
  for (int i = 0; i < 3; ++i) {
    auto m = outcome("early" + std::to_string(i));
    BOOST_REQUIRE(m.has_value());
    auto* d = std::get_if<sy::wire::Done>(&*m);
    BOOST_REQUIRE_MESSAGE(d, "a job accepted before the drain did not finish");
    BOOST_TEST(d->ids.size() == 30u);
  }

  BOOST_TEST(draining(op.control("resume", "", "adm", 20s)) == 0);
  BOOST_TEST(http_get(addr, "/ready").status == 200);
  submit("after", 4);
  auto after = outcome("after");
  BOOST_REQUIRE(after.has_value());
  BOOST_TEST(std::holds_alternative<sy::wire::Done>(*after));
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

// An executor fault with jobs in flight (null backend, slow steps): the supervisor's figures on
// /metrics (failures by reason, re-queued jobs, recovery histogram, executors by state,
// per-executor KV series) must agree with its own counters in `switchyard: stats`.
BOOST_AUTO_TEST_CASE(recovery_metrics_agree_with_the_supervisor) {
  struct Fault {
    const char* reason;
    std::vector<std::string> flags;
  } faults[] = {
      {"crash", {"--test-fault-executor-throw-after", "8"}},
      // A short watchdog keeps the test quick; the hang is caught after 300 ms.
      {"hang", {"--test-fault-executor-hang-after", "8", "--step-timeout-ms", "300"}},
  };
  for (const auto& f : faults) {
    BOOST_TEST_CONTEXT(f.reason) {
      sy::it::TempDir dir;
      std::vector<std::string> args = {"--backend", "null",      "--step-delay-ms",
                                       "5",         "--metrics", "127.0.0.1:0"};
      args.insert(args.end(), f.flags.begin(), f.flags.end());
      sy::it::ServerProcess srv(args);
      const std::string addr = srv.metrics_endpoint();
      BOOST_REQUIRE(!addr.empty());
      BOOST_REQUIRE(wait_ready(addr) == 200);
      sy::client::Client cl(srv.endpoint());
      const int jobs = 20;
      const uint32_t max_tokens = 16;
      for (int i = 0; i < jobs; ++i) {
        sy::wire::Submit s;
        s.id = "j" + std::to_string(i);
        s.tenant = "t";
        s.prompt = std::vector<int32_t>{1, 2, 3 + i};
        s.max_tokens = max_tokens;
        s.ignore_eos = true;
        cl.submit(s);
      }
      int done = 0, errors = 0;
      while (done + errors < jobs) {
        auto m = cl.next(60s);
        BOOST_REQUIRE_MESSAGE(m.has_value(), "silence after " << done + errors << " jobs");
        if (std::get_if<sy::wire::Done>(&*m)) ++done;
        if (std::get_if<sy::wire::Error>(&*m)) ++errors;
      }
      BOOST_TEST(done == jobs);

      HttpResult res;
      for (int i = 0; i < 300; ++i) {
        res = http_get(addr, "/metrics");
        if (res.status == 200 && res.body.find("\nswitchyard_jobs_active 0\n") != std::string::npos)
          break;
        std::this_thread::sleep_for(100ms);
      }
      BOOST_REQUIRE(res.status == 200);
      auto st = srv.stats();
      auto p = parse_with_python(res.body, dir.path());

      const bool crash = std::string(f.reason) == "crash";
      BOOST_TEST(p.at("switchyard_executor_failures_total{reason=crash}") == (crash ? 1 : 0));
      BOOST_TEST(p.at("switchyard_executor_failures_total{reason=hang}") == (crash ? 0 : 1));
      BOOST_TEST(st["executor_failures"] == 1);
      BOOST_TEST(st["requeued"] > 0);
      BOOST_TEST(p.at("switchyard_jobs_requeued_total") == st["requeued"]);
      BOOST_TEST(st["recoveries"] == 1);
      BOOST_TEST(p.at("switchyard_recovery_seconds_count") == st["recoveries"]);
      BOOST_TEST(p.at("switchyard_recovery_seconds_bucket{le=+Inf}") == st["recoveries"]);
      // The stats keep whole milliseconds (truncated); the histogram the exact time.
      const double recovery_ms = p.at("switchyard_recovery_seconds_sum") * 1000;
      BOOST_TEST(std::fabs(recovery_ms - static_cast<double>(st["recovery_ms_last"])) < 1.001);
      if (!crash) BOOST_TEST(recovery_ms >= 300);  // no earlier than the watchdog
      BOOST_TEST(p.types.at("switchyard_recovery_seconds") == "histogram");
      BOOST_TEST(p.at("switchyard_executors{state=running}") == st["executors"]);
      BOOST_TEST(p.at("switchyard_executors{state=retiring}") == 0);
      BOOST_TEST(p.at("switchyard_executor_scale_events_total{direction=up}") == st["scale_ups"]);
      BOOST_TEST(p.at("switchyard_executor_scale_events_total{direction=down}") ==
                 st["scale_downs"]);
      BOOST_TEST(p.at("switchyard_executors_running") == 1);
      // The replacement runs in the failed pair's slot: executor="0" carries the whole pool.
      BOOST_TEST(p.at("switchyard_executor_kv_blocks_total{executor=0}") ==
                 p.at("switchyard_kv_blocks_total"));
      BOOST_TEST(p.at("switchyard_executor_kv_blocks_total{executor=0}") == st["blocks_total"]);
      BOOST_TEST(p.at("switchyard_executor_kv_blocks_used{executor=0}") == 0);
      BOOST_TEST(p.at("switchyard_executor_kv_blocks_free{executor=0}") ==
                 p.at("switchyard_kv_blocks_free"));
      BOOST_TEST(p.at("switchyard_executor_preemptions_total{executor=0}") ==
                 p.at("switchyard_preemptions_total"));
      BOOST_TEST(p.at("switchyard_curve_refused_total") == 0);
      BOOST_TEST(p.at("switchyard_prefix_affinity_dispatches_total{result=hit}") ==
                 st["affinity_hits"]);
      BOOST_TEST(p.at("switchyard_batcher_lost_jobs_total{outcome=requeued}") ==
                 st["lost_requeued"]);
      BOOST_TEST(p.at("switchyard_prefix_affinity_dispatches_total{result=overruled}") ==
                 st["affinity_overruled"]);
      BOOST_TEST_MESSAGE(f.reason << ": " << st["requeued"] << " re-queued, recovery "
                                  << recovery_ms << " ms");
      BOOST_TEST(srv.stop(SIGTERM) == 0);
    }
  }
}

BOOST_AUTO_TEST_CASE(flag_and_off_by_default) {
  // --metrics on the command line; the null backend needs no model.
  sy::it::ServerProcess srv({"--backend", "null", "--metrics", "127.0.0.1:0"});
  BOOST_REQUIRE(!srv.metrics_endpoint().empty());
  BOOST_TEST(http_get(srv.metrics_endpoint(), "/health").status == 200);
  BOOST_TEST(wait_ready(srv.metrics_endpoint()) == 200);
  auto m = http_get(srv.metrics_endpoint(), "/metrics");
  BOOST_TEST(m.status == 200);
  BOOST_TEST(m.body.find("switchyard_executors_running 1\n") != std::string::npos);
  BOOST_TEST(srv.stop(SIGTERM) == 0);

  sy::it::ServerProcess off({"--backend", "null"});
  BOOST_TEST(off.metrics_endpoint().empty());
  BOOST_TEST(off.stop(SIGTERM) == 0);

  // A busy port is a startup error naming the address, not a silent server without metrics.
  sy::it::ServerProcess first({"--backend", "null", "--metrics", "127.0.0.1:0"});
  auto run = sy::it::run_binary(
      "serve --backend null --bind tcp://127.0.0.1:* --metrics " + first.metrics_endpoint(),
      "timeout 60 ");
  BOOST_TEST(run.status != 0);
  BOOST_TEST(run.out.find(first.metrics_endpoint()) != std::string::npos, run.out);
  BOOST_TEST(first.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_metrics
