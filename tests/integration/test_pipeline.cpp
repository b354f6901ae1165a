// Must-show 6 (pipeline backpressure): a producer PUSHes 5,000 jobs as fast as it can into a server
// whose queue holds 100 and whose executor is slowed (TEST ONLY flag). All 5,000 results reach the
// sink, none is refused, the queue never holds more than its limit, and the server's peak
// resident memory (VmHWM) is reported.
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <set>
#include <thread>

#include "clients/cpp/client.hpp"
#include "ingress/codec.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_pipeline)

using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(five_thousand_pushed_jobs_all_arrive) {
  sy::it::TempDir dir;
  // The server buffers at most 100 unread PULL messages (rcvhwm) beyond its 100-job queue.
  std::string cfg = dir.write("p.yaml", R"(
endpoints:
  rcvhwm: 100
router:
  classes:
    - {name: only, rank: 0, queue_limit: 100}
batching:
  max_sequences: 16
executors:
  backend: "null"
)");
  sy::it::ServerProcess srv({"--config", cfg, "--pull", "tcp://127.0.0.1:*", "--results",
                             "tcp://127.0.0.1:*", "--step-delay-ms", "1"});
  BOOST_REQUIRE(!srv.pull_endpoint().empty());
  BOOST_REQUIRE(!srv.results_endpoint().empty());
  const long start_rss = srv.proc_status_kb("VmRSS");
  BOOST_TEST_MESSAGE("server RSS at start: " << start_rss << " kB");

  constexpr int kJobs = 5000;
  constexpr uint32_t kTokens = 8;
  constexpr size_t kPadStrings = 16;
  sy::client::Sink sink(srv.results_endpoint());
  std::atomic<int> pushed{0};
  std::atomic<long> longest_block_us{0}, push_ms{0};
  auto start = std::chrono::steady_clock::now();
  std::thread producer([&] {
    sy::client::Pusher push(srv.pull_endpoint());
    // The client library closes sockets with linger 0; a producer that exits right after its
    // last push must wait until ZeroMQ has handed the queued messages over, or they are lost.
    push.socket().set(zmq::sockopt::linger, 60000);
    for (int i = 0; i < kJobs; ++i) {
      sy::wire::Submit s;
      s.id = "p" + std::to_string(i);
      s.tenant = "pipe";
      s.prompt = std::vector<int32_t>{1, 2, 3, 4};
      s.max_tokens = kTokens;
      s.ignore_eos = true;
      // 4 KiB of padding as the most stop strings a job may have (16 of 256 bytes; the null
      // backend's text never contains them), so that 5,000 jobs are 20 MB: more than loopback
      // socket buffers and the queues hold. Without backpressure the server would have to buffer
      // them; with it the producer is held back.
      for (size_t k = 0; k < kPadStrings; ++k)
        s.stop.push_back(std::string(256, static_cast<char>('a' + k)));
      std::string m = sy::wire::encode_client(s);
      auto t0 = std::chrono::steady_clock::now();
      // A minute blocked means the server stopped reading.
      if (!push.send_raw(m.data(), m.size(), 60s)) break;
      long us = std::chrono::duration_cast<std::chrono::microseconds>(
                    std::chrono::steady_clock::now() - t0)
                    .count();
      if (us > longest_block_us) longest_block_us = us;
      ++pushed;
    }
    push_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::steady_clock::now() - start)
                  .count();
  });

  std::set<std::string> got;
  size_t errors = 0, duplicates = 0, wrong = 0;
  int64_t max_queued = 0;
  std::string first_error;
  while (static_cast<int>(got.size() + errors) < kJobs) {
    auto m = sink.next(30s);
    if (!m) break;
    if (auto* d = std::get_if<sy::wire::Done>(&*m)) {
      if (!got.insert(d->id).second) ++duplicates;
      if (d->ids.size() != kTokens || d->tenant != "pipe") ++wrong;
    } else if (auto* e = std::get_if<sy::wire::Error>(&*m)) {
      ++errors;
      if (first_error.empty()) first_error = e->id + ": " + e->message;
    }
    // Sample the queue depth now and then: it must stay within the class limit.
    if ((got.size() + errors) % 500 == 0) max_queued = std::max(max_queued, srv.stats()["queued"]);
  }
  producer.join();
  auto all_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::steady_clock::now() - start)
                    .count();
  BOOST_TEST(pushed == kJobs);
  BOOST_TEST(got.size() == static_cast<size_t>(kJobs));
  BOOST_TEST(errors == 0u, first_error);
  BOOST_TEST(duplicates == 0u);
  BOOST_TEST(wrong == 0u);
  BOOST_TEST(max_queued <= 100);
  auto st = srv.stats();
  BOOST_TEST(st["overloaded"] == 0);
  long hwm = srv.proc_status_kb("VmHWM");
  BOOST_TEST_MESSAGE("peak RSS (VmHWM) of the server: "
                     << hwm << " kB; deepest sampled queue " << max_queued
                     << "; longest blocked push " << longest_block_us / 1000
                     << " ms; the producer took " << push_ms
                     << " ms to push all, the sink had every result after " << all_ms
                     << " ms (a producer far slower than free pushing = it was held back)");
  // Bounded memory: the 5,000 frames are 40 MB; the server may hold its queue (100), its PULL
  // buffer (rcvhwm 100) and what it is running, a few MB. Growth near 20 MB would mean the jobs
  // were buffered instead of held back by the high-water marks.
  BOOST_TEST(hwm - start_rss < 20 * 1024);
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_pipeline
