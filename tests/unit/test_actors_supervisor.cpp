// The supervisor with a real router and real executors: a crashed or hung executor is replaced and
// its jobs finish elsewhere with the same greedy output, streamed without duplicates; the retry
// limit ends jobs with engine_dead; load makes pairs rise to max and idleness brings them back.
#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <chrono>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "actors/batcher.hpp"
#include "actors/messages.hpp"
#include "actors/router.hpp"
#include "actors/supervisor.hpp"
#include "core/error_code.hpp"
#include "model/llama.hpp"
#include "tests/support/batcher_rig.hpp"
#include "tests/support/enum_print.hpp"

BOOST_AUTO_TEST_SUITE(test_actors_supervisor)

using namespace sy;
using sy::test::kWait;
using sy::test::Seen;  // what the stand-in egress and admission saw for one job

namespace {

// A router and a supervisor; a scoped actor stands in for egress and admission.
struct Fixture {
  caf::actor_system sys{sy::test::config()};
  caf::scoped_actor sink{sys};
  RouterActor router;
  SupervisorActor sup;
  std::map<uint64_t, Seen> seen;
  uint64_t next_uid = 1;

  ~Fixture() {
    if (sup) caf::anon_send_exit(sup, caf::exit_reason::user_shutdown);
    if (router) caf::anon_send_exit(router, caf::exit_reason::user_shutdown);
  }

  static SupervisorConfig cpu_config(int min, int max) {
    SupervisorConfig sc;
    sc.batching.max_sequences = 8;
    sc.batching.step_token_budget = 64;
    sc.batching.prefill_chunk = 64;
    sc.batching.kv_memory_mb = 16;
    auto model = sy::test::stories();
    sc.n_blocks = kv_blocks_for(sc.batching, model->limits().kv_bytes_per_token());
    sc.executor = sy::test::cpu_spec();
    sc.executor.n_blocks = sc.n_blocks;
    sc.executor.block_size = sc.batching.kv_block_size;
    sc.executor.max_batch_tokens = static_cast<int32_t>(sc.batching.step_token_budget);
    sc.knobs.min_executors = min;
    sc.knobs.max_executors = max;
    sc.slots = policy::executor_slots(false, 0, max);
    return sc;
  }

  void start(SupervisorConfig sc, bool with_model = true) {
    router = spawn_router(sys, RouterConfig{}, test::stand_in<EgressActor>(sink),
                          test::stand_in<AdmissionActor>(sink));
    SupervisorWiring w;
    w.router = router;
    w.egress = test::stand_in<EgressActor>(sink);
    w.admission = test::stand_in<AdmissionActor>(sink);
    if (with_model) w.model = sy::test::stories();
    sup = spawn_supervisor(sys, std::move(sc), std::move(w));
  }

  uint64_t submit(std::vector<int32_t> prompt, uint32_t max_tokens, bool stream) {
    Job j;
    j.uid = next_uid++;
    j.id = "job" + std::to_string(j.uid);
    j.tenant = "t";
    j.client.kind = ClientRef::router;
    j.prompt = std::move(prompt);
    j.max_tokens = max_tokens;
    j.temperature = 0.0f;
    j.stream = stream;
    j.arrival_us = now_us();
    sink->send(router, enqueue_atom::value, j);
    return j.uid;
  }

  bool receive_one(caf::duration timeout = caf::duration{kWait}) {
    bool ok = true;
    sink->receive([&](out_atom, const AcceptedEvent&) {}, [&](pull_atom, uint32_t) {},
                  [&](const EnqueueReply&) {},  // enqueue answers
                  [&](out_atom, const TokensEvent& t) {
                    Seen& s = seen[t.uid];
                    if (t.index != s.stream_ids.size()) s.contiguous = false;
                    s.stream_ids.insert(s.stream_ids.end(), t.ids.begin(), t.ids.end());
                  },
                  [&](out_atom, const DoneEvent& d) {
                    seen[d.uid].done = d;
                    ++seen[d.uid].dones;
                  },
                  [&](out_atom, const ErrorEvent& e) {
                    seen[e.uid].error = e;
                    ++seen[e.uid].errors;
                  },
                  [&](finished_atom, const JobOutcome& o) {
                    seen[o.uid].outcome = o;
                    ++seen[o.uid].outcomes;
                  },
                  caf::after(timeout) >> [&] { ok = false; });
    return ok;
  }

  bool ended(uint64_t uid) {
    auto it = seen.find(uid);
    return it != seen.end() && it->second.outcomes > 0 && it->second.dones + it->second.errors > 0;
  }

  // Receives until every job has ended; `poll` runs between messages.
  template <class Poll>
  void wait_all(const std::vector<uint64_t>& uids, Poll poll) {
    for (;;) {
      bool all = true;
      for (uint64_t u : uids) all = all && ended(u);
      if (all) return;
      // A short wait keeps `poll` running while the actors work; a job that never ends still
      // fails the test through the overall limit below.
      static constexpr auto kSlice = std::chrono::milliseconds(20);
      auto start = std::chrono::steady_clock::now();
      while (!receive_one(caf::duration{kSlice})) {
        poll();
        BOOST_REQUIRE_MESSAGE(std::chrono::steady_clock::now() - start < kWait,
                              "timed out waiting for jobs to end");
      }
      poll();
    }
  }
  void wait_all(const std::vector<uint64_t>& uids) {
    wait_all(uids, [] {});
  }

  /// The stats record R of `a` (SupervisorStats, RouterStats).
  template <class R>
  R stats(const auto& a) {
    R out;
    sink->request(a, kWait, stats_atom::value)
        .receive([&](R& s) { out = std::move(s); },
                 [&](caf::error& e) { BOOST_FAIL("stats failed: " + sys.render(e)); });
    return out;
  }
};

std::vector<int32_t> prompt_of(int i) {
  return {1, 403 + i % 7, 407, 261 + i % 5, 378};
}

// Greedy ids of every job without faults: the reference.
std::map<int, std::vector<int32_t>> reference(int n, uint32_t max_tokens) {
  Fixture f;
  f.start(Fixture::cpu_config(1, 1));
  std::vector<uint64_t> uids;
  for (int i = 0; i < n; ++i) uids.push_back(f.submit(prompt_of(i), max_tokens, false));
  f.wait_all(uids);
  std::map<int, std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) out[i] = f.seen[uids[static_cast<size_t>(i)]].done.ids;
  return out;
}

constexpr int kJobs = 12;
constexpr uint32_t kTokens = 24;

void run_fault(SupervisorConfig sc, const char* what) {
  static const auto ref = reference(kJobs, kTokens);
  Fixture f;
  f.start(std::move(sc));
  std::vector<uint64_t> uids;
  // Half streamed: their chunks must not repeat after the re-run.
  for (int i = 0; i < kJobs; ++i) uids.push_back(f.submit(prompt_of(i), kTokens, i % 2 == 0));
  f.wait_all(uids);
  for (int i = 0; i < kJobs; ++i) {
    BOOST_TEST_CONTEXT(what << " job " << i) {
      const Seen& s = f.seen[uids[static_cast<size_t>(i)]];
      BOOST_TEST(s.dones == 1);
      BOOST_TEST(s.errors == 0);
      BOOST_TEST(s.outcomes == 1);
      BOOST_TEST(s.outcome.done.ids == ref.at(i), boost::test_tools::per_element());
      if (i % 2 == 0) {
        BOOST_TEST(s.contiguous);
        BOOST_TEST(s.stream_ids == ref.at(i), boost::test_tools::per_element());
      }
    }
  }
  auto st = f.stats<SupervisorStats>(f.sup);
  BOOST_TEST(st.executor_failures == 1);
  BOOST_TEST(st.replacements == 1);
  BOOST_TEST(st.requeued > 0);
  BOOST_TEST(st.recoveries == 1);
  BOOST_TEST(st.executors == 1);
  BOOST_TEST_MESSAGE(what << ": recovery " << st.recovery_ms_last << " ms, detection "
                          << st.detect_ms_last << " ms, " << st.requeued << " jobs re-queued");
  auto r = f.stats<RouterStats>(f.router);
  BOOST_TEST(r.requeued == st.requeued);
}

}  // namespace

BOOST_AUTO_TEST_CASE(throwing_executor_is_replaced_and_jobs_match) {
  auto sc = Fixture::cpu_config(1, 1);
  sc.executor.test_fault_throw_after = 5;
  run_fault(std::move(sc), "throw");
}

BOOST_AUTO_TEST_CASE(hung_executor_is_caught_by_the_watchdog) {
  auto sc = Fixture::cpu_config(1, 1);
  sc.executor.test_fault_hang_after = 5;
  sc.batching.step_timeout_ms = 300;
  run_fault(std::move(sc), "hang");
}

BOOST_AUTO_TEST_CASE(retry_limit_ends_jobs_with_engine_dead) {
  auto sc = Fixture::cpu_config(1, 1);
  sc.executor.test_fault_throw_after = 3;
  sc.batching.max_job_retries = 0;
  Fixture f;
  f.start(std::move(sc));
  std::vector<uint64_t> uids;
  for (int i = 0; i < 4; ++i) uids.push_back(f.submit(prompt_of(i), kTokens, false));
  f.wait_all(uids);
  int dead = 0, done = 0;
  for (uint64_t u : uids) {
    const Seen& s = f.seen[u];
    BOOST_TEST(s.dones + s.errors == 1);
    if (s.errors == 1) {
      BOOST_TEST(s.error.code == ErrorCode::engine_dead);
      BOOST_TEST(s.outcome.code == ErrorCode::engine_dead);
      ++dead;
    } else {
      ++done;
    }
  }
  // Jobs that reached the crashed executor (usually all four: max_sequences 8) end engine_dead.
  BOOST_TEST(dead >= 1);
  BOOST_TEST(dead + done == 4);
  BOOST_TEST(f.stats<SupervisorStats>(f.sup).failed_jobs == dead);
  BOOST_TEST_MESSAGE(dead << " engine_dead, " << done << " done");
}

BOOST_AUTO_TEST_CASE(load_scales_up_to_max_and_idleness_back_to_min) {
  SupervisorConfig sc;
  sc.batching.max_sequences = 2;
  sc.n_blocks = 64;
  sc.executor.backend = Backend::null;
  sc.executor.n_blocks = 64;
  sc.executor.block_size = sc.batching.kv_block_size;
  sc.executor.step_delay_ms = 10;  // TEST ONLY: makes the null backend slow enough to queue
  sc.knobs.min_executors = 1;
  sc.knobs.max_executors = 3;
  sc.knobs.target_queue_wait_ms = 30;
  sc.knobs.upscale_delay_ms = 60;
  sc.knobs.downscale_delay_ms = 200;
  sc.interval_ms = 20;
  sc.slots = policy::executor_slots(false, 0, 3);
  Fixture f;
  f.start(std::move(sc), false);
  std::vector<uint64_t> uids;
  for (int i = 0; i < 40; ++i) uids.push_back(f.submit({1, 2, 3}, 12, i % 3 == 0));
  int64_t peak = 0;
  auto poll = [&] { peak = std::max(peak, f.stats<SupervisorStats>(f.sup).executors); };
  f.wait_all(uids, poll);
  for (uint64_t u : uids) {
    BOOST_TEST(f.seen[u].dones == 1);
    BOOST_TEST(f.seen[u].errors == 0);
    BOOST_TEST(f.seen[u].outcome.done.ids.size() == 12u);
  }
  BOOST_TEST(peak == 3);
  // Idle now: back to min (waits for the downscale delay; bounded by kWait, not asserted on).
  int64_t executors = -1;
  auto until = std::chrono::steady_clock::now() + kWait;
  while (std::chrono::steady_clock::now() < until) {
    auto st = f.stats<SupervisorStats>(f.sup);
    executors = st.executors;
    if (executors == 1 && st.executors_retiring == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  BOOST_TEST(executors == 1);
  auto st = f.stats<SupervisorStats>(f.sup);
  BOOST_TEST(st.scale_ups >= 2);
  BOOST_TEST(st.scale_downs >= 2);
  BOOST_TEST(st.executor_failures == 0);
  BOOST_TEST(f.stats<RouterStats>(f.router).batchers == 1);
  // New work after the scale-down still runs.
  auto late = f.submit({1, 2, 3}, 4, false);
  f.wait_all({late});
  BOOST_TEST(f.seen[late].dones == 1);
}

BOOST_AUTO_TEST_CASE(router_puts_requeued_jobs_first_and_honours_retire) {
  caf::actor_system sys{sy::test::config()};
  caf::scoped_actor sink{sys};
  caf::scoped_actor batcher{sys};
  RouterConfig rc;
  rc.classes.push_back({"interactive", 0, 1.0, 2, 0});  // a queue limit of 2
  auto router = spawn_router(sys, rc, EgressActor{}, AdmissionActor{});
  auto job = [](uint64_t uid) {
    Job j;
    j.uid = uid;
    j.id = "j" + std::to_string(uid);
    j.tenant = "t";
    j.prompt = {1, 2};
    j.arrival_us = now_us();
    return j;
  };
  for (uint64_t u : {1, 2})
    sink->request(router, kWait, enqueue_atom::value, job(u))
        .receive([](const EnqueueReply& r) { BOOST_TEST(r.result == EnqueueResult::accepted); },
                 [](caf::error&) { BOOST_FAIL("enqueue failed"); });
  // The class is full, yet re-queued jobs go in (not counted) and ahead of the queue.
  sink->send(router, requeue_atom::value, std::vector<Job>{job(7), job(8)});
  auto st = [&] {
    RouterStats s;
    sink->request(router, kWait, stats_atom::value)
        .receive([&](RouterStats& x) { s = x; }, [](caf::error&) {});
    return s;
  };
  BOOST_TEST(st().retry_queued == 2);
  BOOST_TEST(st().waiting_total == 4);
  auto b = test::stand_in<BatcherActor>(batcher);
  sink->send(router, credit_atom::value, b, uint32_t{3});
  std::vector<uint64_t> order;
  for (int i = 0; i < 3; ++i)
    batcher->receive([&](run_atom, const Job& j) { order.push_back(j.uid); },
                     caf::after(kWait) >> [] { BOOST_FAIL("no run"); });
  BOOST_TEST(order == (std::vector<uint64_t>{7, 8, 1}), boost::test_tools::per_element());
  // Retired: its remaining credit is revoked and nothing more is dispatched to it.
  uint32_t revoked = 99;
  sink->request(router, kWait, retire_atom::value, b)
      .receive([&](uint32_t n) { revoked = n; }, [](caf::error&) {});
  BOOST_TEST(revoked == 0u);
  sink->send(router, requeue_atom::value, std::vector<Job>{job(9)});
  BOOST_TEST(st().batchers == 0);
  BOOST_TEST(st().waiting_total == 2);  // job 2 and job 9 wait for a batcher
  caf::anon_send_exit(router, caf::exit_reason::user_shutdown);
}

BOOST_AUTO_TEST_CASE(an_executor_that_cannot_be_built_is_reported_not_fatal) {
  Fixture f;
  SupervisorConfig sc = Fixture::cpu_config(1, 1);
  sc.executor.model = nullptr;  // the engine cannot be built: no model
  f.start(std::move(sc));
  std::string why = "no answer";
  f.sink->request(f.sup, kWait, connect_atom::value, test::stand_in<ControlActor>(f.sink))
      .receive([&](std::string& e) { why = std::move(e); }, [&](caf::error&) {});
  BOOST_TEST(why.find("needs a model") != std::string::npos, why);
  // The supervisor outlived the failure: it still answers.
  SupervisorStats st;
  st.executors = -1;  // stays -1 when no answer comes
  f.sink->request(f.sup, kWait, stats_atom::value)
      .receive([&](SupervisorStats& s) { st = std::move(s); }, [&](caf::error&) {});
  BOOST_TEST(st.executors == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_actors_supervisor
