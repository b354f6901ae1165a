// Cluster scaling on one machine: a nats-server with JetStream, then 1, 2, ... N Switchyard
// nodes on the null backend with a test-only step delay standing in for device time (so that a
// node adds capacity even on 2 cores), and one producer keeping a window of jobs in flight.
// Prints JSON: per node count, jobs/s, output tokens/s and the latency from publish to result.
//
//   bench_cluster [--nodes 1,2,3] [--jobs 2000] [--warmup 200] [--window 192] [--max-tokens 16]
//                 [--step-delay-ms 10] [--max-sequences 16] [--switchyard BIN]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "clients/cpp/cluster_client.hpp"
#include "tests/support/nats_server.hpp"
#include "tests/support/server_process.hpp"
#include "tests/support/temp_dir.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<int> nodes = {1, 2, 3};
  int jobs = 2000;
  int warmup = 200;
  // Jobs in flight: more than the nodes can run at once (max_sequences each), so that they stay
  // busy and the rest waits in JetStream, not in the producer.
  int window = 192;
  uint32_t max_tokens = 16;
  int step_delay_ms = 10;
  int max_sequences = 16;
  std::string switchyard = SY_BINARY_DIR "/switchyard";
};

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoi(item));
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--nodes")
      o.nodes = parse_list(next());
    else if (a == "--jobs")
      o.jobs = std::stoi(next());
    else if (a == "--warmup")
      o.warmup = std::stoi(next());
    else if (a == "--window")
      o.window = std::stoi(next());
    else if (a == "--max-tokens")
      o.max_tokens = static_cast<uint32_t>(std::stoul(next()));
    else if (a == "--step-delay-ms")
      o.step_delay_ms = std::stoi(next());
    else if (a == "--max-sequences")
      o.max_sequences = std::stoi(next());
    else if (a == "--switchyard")
      o.switchyard = next();
    else
      throw std::invalid_argument("unknown option " + a);
  }
  return o;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto k = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(k, v.size() - 1)];
}

// Keeps `window` jobs in flight until `n` have ended; returns each job's publish-to-result
// latency (ms) and counts the output tokens of those that finished.
std::vector<double> drive(sy::client::ClusterClient& c, const std::string& prefix, int n,
                          int window, uint32_t max_tokens, int64_t& tokens, int& failed) {
  std::map<std::string, Clock::time_point> sent;
  std::vector<double> lat;
  int next_job = 0, ended = 0;
  auto publish = [&] {
    sy::wire::Submit s;
    s.id = prefix + std::to_string(next_job++);
    s.tenant = "bench";
    s.prompt = std::vector<int32_t>{1, 2, 3, 4};
    s.max_tokens = max_tokens;
    s.ignore_eos = true;
    s.temperature = 0;
    s.priority = "batch";
    sent[s.id] = Clock::now();
    c.submit(s);
  };
  while (next_job < std::min(n, window)) publish();
  while (ended < n) {
    auto m = c.next(std::chrono::seconds(60));
    if (!m) throw std::runtime_error("no result within 60 s");
    const std::string id = sy::client::message_id(*m);
    auto it = sent.find(id);
    const auto* d = std::get_if<sy::wire::Done>(&*m);
    const bool terminal = d || std::holds_alternative<sy::wire::Error>(*m);
    if (!terminal || it == sent.end()) continue;
    lat.push_back(std::chrono::duration<double, std::milli>(Clock::now() - it->second).count());
    sent.erase(it);
    ++ended;
    if (d)
      tokens += d->usage.completion_tokens;
    else
      ++failed;
    if (next_job < n) publish();
  }
  return lat;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "bench_cluster: " << e.what() << "\n";
    return 2;
  }
  nlohmann::json out;
  out["tool"] = "bench_cluster";
  out["options"] = {{"jobs", o.jobs},
                    {"warmup", o.warmup},
                    {"window", o.window},
                    {"max_tokens", o.max_tokens},
                    {"step_delay_ms", o.step_delay_ms},
                    {"max_sequences", o.max_sequences}};
  for (int n : o.nodes) {
    sy::test::NatsServer ns;
    sy::test::TempDir dir("sy_bench_cluster_");
    const std::string cfg = dir.path() + "/node.yaml";
    std::ofstream(cfg) << "batching:\n  max_sequences: " << o.max_sequences << "\n";
    std::vector<std::unique_ptr<sy::test::ServeProcess>> nodes;
    for (int i = 0; i < n; ++i) {
      sy::test::ServeOptions so;
      so.binary = o.switchyard;
      so.args = {"--backend",
                 "null",
                 "--bind",
                 "tcp://127.0.0.1:0",
                 "--no-journal",
                 "--nats",
                 ns.url(),
                 "--node-name",
                 "n" + std::to_string(i + 1),
                 "--step-delay-ms",
                 std::to_string(o.step_delay_ms),
                 "--config",
                 cfg};
      so.stderr_file = dir.path() + "/node" + std::to_string(i + 1) + ".err";
      nodes.push_back(std::make_unique<sy::test::ServeProcess>(so));
    }
    // The nodes create the streams as they join: until then a publish finds no stream.
    sy::client::ClusterOptions co;
    co.nats = {ns.url()};
    auto client = std::make_unique<sy::client::ClusterClient>(co);
    const auto until = Clock::now() + std::chrono::seconds(30);
    for (;;) {
      sy::wire::Submit probe;
      probe.id = "probe";
      probe.tenant = "bench";
      probe.prompt = std::vector<int32_t>{1};
      probe.max_tokens = 1;
      probe.priority = "batch";
      try {
        client->run(probe, std::chrono::seconds(30));
        break;
      } catch (const sy::client::ClientError&) {
        if (Clock::now() > until) throw;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    int64_t tokens = 0;
    int failed = 0;
    drive(*client, "w", o.warmup, o.window, o.max_tokens, tokens, failed);
    tokens = 0;
    failed = 0;
    const auto t0 = Clock::now();
    auto lat = drive(*client, "j", o.jobs, o.window, o.max_tokens, tokens, failed);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    nlohmann::json r = {
        {"nodes", n},
        {"jobs", o.jobs},
        {"failed", failed},
        {"elapsed_s", secs},
        {"jobs_per_s", o.jobs / secs},
        {"output_tokens_per_s", static_cast<double>(tokens) / secs},
        {"latency_ms", {{"p50", percentile(lat, 0.50)}, {"p99", percentile(lat, 0.99)}}}};
    std::fprintf(stderr,
                 "bench_cluster: %d node(s): %.1f jobs/s, %.0f output tokens/s, publish to result "
                 "p50 %.1f ms p99 %.1f ms (%d failed)\n",
                 n, o.jobs / secs, static_cast<double>(tokens) / secs, percentile(lat, 0.5),
                 percentile(lat, 0.99), failed);
    out["results"].push_back(r);
    client.reset();
    for (auto& node : nodes) node->stop();
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}
