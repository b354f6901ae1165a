// Must-show 1: a step load (idle -> saturation -> idle) on the real server makes the supervisor
// add executors from min to max and retire them back to min afterwards; no job is lost or fails.
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <map>
#include <thread>

#include "clients/cpp/client.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_elastic)

using namespace std::chrono_literals;

namespace {

struct Tally {
  int done = 0, errors = 0, duplicates = 0, wrong = 0, lost = 0;
  std::string first_problem;
};

// One load client: `n` jobs of `tokens` tokens with up to `window` in flight.
Tally load(const std::string& endpoint, int client_no, int n, int window, uint32_t tokens) {
  Tally t;
  sy::client::Client cl(endpoint);
  std::map<std::string, int> answers;
  int next = 0, in_flight = 0;
  while (next < n || in_flight > 0) {
    while (next < n && in_flight < window) {
      sy::wire::Submit s;
      s.id = "c" + std::to_string(client_no) + "-" + std::to_string(next++);
      s.tenant = "t" + std::to_string(client_no);
      s.prompt = std::vector<int32_t>{1, 2, 3};
      s.max_tokens = tokens;
      s.ignore_eos = true;
      s.priority = "batch";  // a deep queue: saturation waits instead of being refused
      cl.submit(s);
      ++in_flight;
    }
    auto m = cl.next(30s);  // the null backend answers in ms: 30 s of silence means lost
    if (!m) {
      t.lost = in_flight;
      break;
    }
    if (auto* d = std::get_if<sy::wire::Done>(&*m)) {
      if (++answers[d->id] > 1) {
        ++t.duplicates;
        continue;
      }
      --in_flight;
      ++t.done;
      if (d->ids.size() != tokens) {
        ++t.wrong;
        if (t.first_problem.empty()) t.first_problem = d->id + ": wrong length";
      }
    } else if (auto* e = std::get_if<sy::wire::Error>(&*m)) {
      --in_flight;
      ++t.errors;
      if (t.first_problem.empty()) t.first_problem = e->id + ": " + e->message;
    }
  }
  return t;
}

}  // namespace

BOOST_AUTO_TEST_CASE(step_load_scales_up_and_back_down) {
  sy::it::TempDir dir;
  // Two sequences per pair and 5 ms steps: one pair saturates at once. Small delays keep the
  // test short; the knobs' meaning is the same at production values.
  auto cfg = dir.write("elastic.yaml",
                       "batching:\n"
                       "  max_sequences: 2\n"
                       "autoscale:\n"
                       "  min_executors: 1\n"
                       "  max_executors: 3\n"
                       "  target_queue_wait_ms: 50\n"
                       "  upscale_delay_ms: 200\n"
                       "  downscale_delay_ms: 800\n"
                       "  interval_ms: 50\n");
  sy::it::ServerProcess srv({"--backend", "null", "--step-delay-ms", "5", "--config", cfg});

  // Idle: min executors.
  std::this_thread::sleep_for(500ms);
  auto st = srv.stats();
  BOOST_TEST(st["executors"] == 1);

  // Saturation: 4 clients, 8 jobs in flight each.
  constexpr int kClients = 4, kPerClient = 60;
  constexpr uint32_t kTokens = 20;
  std::vector<Tally> tallies(kClients);
  std::vector<std::thread> clients;
  const auto t0 = std::chrono::steady_clock::now();
  for (int c = 0; c < kClients; ++c)
    clients.emplace_back([&, c] { tallies[c] = load(srv.endpoint(), c, kPerClient, 8, kTokens); });
  std::atomic<bool> running{true};
  int64_t peak = 0;
  std::vector<std::pair<double, int64_t>> trace;  // (s since start, executors)
  std::thread watcher([&] {
    while (running) {
      auto s = srv.stats();
      peak = std::max(peak, s["executors"]);
      trace.push_back({std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                       s["executors"]});
      std::this_thread::sleep_for(100ms);
    }
  });
  for (auto& t : clients) t.join();
  running = false;
  watcher.join();
  const double busy_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  Tally all;
  for (const auto& t : tallies) {
    all.done += t.done;
    all.errors += t.errors;
    all.duplicates += t.duplicates;
    all.wrong += t.wrong;
    all.lost += t.lost;
    if (all.first_problem.empty()) all.first_problem = t.first_problem;
  }
  BOOST_TEST(all.done == kClients * kPerClient, all.first_problem);
  BOOST_TEST(all.errors == 0, all.first_problem);
  BOOST_TEST(all.duplicates == 0);
  BOOST_TEST(all.wrong == 0, all.first_problem);
  BOOST_TEST(all.lost == 0);
  BOOST_TEST(peak == 3);

  // Idle again: back to min once the downscale delay has passed (bounded wait, not asserted).
  int64_t executors = -1;
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < until) {
    st = srv.stats();
    executors = st["executors"];
    if (executors == 1) break;
    std::this_thread::sleep_for(100ms);
  }
  BOOST_TEST(executors == 1);
  BOOST_TEST(st["scale_ups"] >= 2);
  BOOST_TEST(st["scale_downs"] >= 2);
  BOOST_TEST(st["executor_failures"] == 0);
  std::string shape;
  for (const auto& [t, n] : trace) shape += std::to_string(n);
  BOOST_TEST_MESSAGE("step load: " << all.done << " jobs in " << busy_s << " s, peak " << peak
                                   << " executors, scale ups " << st["scale_ups"] << ", downs "
                                   << st["scale_downs"] << "; executors every 100 ms: " << shape);
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_elastic
