// The journal actor on a disk that refuses writes, between the real admission and router on the
// deterministic scheduler: a refused job gets `unavailable` (retry hint, no path), returns its
// PULL credit and leaves no record; a finished job's done waits for its result record; write
// errors are counted and the failing state ends with the next good write. The full disk is this
// process's file-size limit (RLIMIT_FSIZE): writes past it fail, as on a full file system.
#include <signal.h>
#include <sys/resource.h>

#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "actors/admission.hpp"
#include "actors/journal.hpp"
#include "actors/messages.hpp"
#include "actors/router.hpp"
#include "core/error_code.hpp"
#include "storage/journal_file.hpp"
#include "tests/support/enum_print.hpp"
#include "tests/support/full_disk.hpp"
#include "tests/support/stand_in.hpp"
#include "tests/support/stats_probe.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/test_system.hpp"

BOOST_AUTO_TEST_SUITE(test_journal_actor)

using namespace sy;

namespace {

using test::FullDisk;

struct Trace {
  std::vector<Job> runs;
  std::vector<AcceptedEvent> accepted;
  std::vector<ErrorEvent> errors;
  std::vector<DoneEvent> dones;
  uint64_t pull_credit = 0;
};
using TraceP = std::shared_ptr<Trace>;

caf::behavior egress_sink(caf::event_based_actor*, TraceP t) {
  return {
      [t](out_atom, const AcceptedEvent& e) { t->accepted.push_back(e); },
      [t](out_atom, const ErrorEvent& e) { t->errors.push_back(e); },
      [t](out_atom, const DoneEvent& e) { t->dones.push_back(e); },
      [](out_atom, const StatusEvent&) {},
      [](out_atom, const TokensEvent&) {},
      [t](pull_atom, uint32_t n) { t->pull_credit += n; },
  };
}

caf::behavior fake_batcher(caf::event_based_actor* self, TraceP t) {
  return {
      [=](credit_atom, const RouterActor& router, uint32_t n) {
        self->send(router, credit_atom::value, caf::actor_cast<BatcherActor>(self), n);
      },
      [=](run_atom, const Job& j) { t->runs.push_back(j); },
      [](cancel_atom, uint64_t) {},
  };
}

/// Admission, the real router and the journal actor over a real file, wired as the server wires
/// them: the journal stands in front of egress for both.
struct Rig : test::TestSystem {
  TraceP t = std::make_shared<Trace>();
  test::TempDir dir{"sy_jactor_"};
  std::string path = dir.file("j.journal");
  JournalConfig jc;
  std::shared_ptr<JournalFile> file;
  caf::actor egress, batcher;
  JournalActor journal;
  RouterActor router;
  AdmissionActor admission;

  explicit Rig(const std::string& fsync) {
    jc.path = path;
    jc.fsync = fsync;
    JournalReplay replay;
    file = open_journal(jc, 100, replay);
    RouterConfig rc;
    rc.classes = {{"interactive", 0, 1.0, 1000, 0}};
    egress = sys->spawn(egress_sink, t);
    journal = spawn_journal(*sys, jc, file, replay, 100, test::stand_in<EgressActor>(egress));
    router = spawn_router(*sys, rc, journal);
    AdmissionConfig ac;
    admission =
        spawn_admission(*sys, ac, rc.classes, "", nullptr, router, journal, journal, replay);
    batcher = sys->spawn(fake_batcher, t);
    sched->run();
  }
  ~Rig() {
    test::stop_all(egress, journal, router, admission, batcher);
    sched->run();
  }
  void submit(const std::string& id, bool pipeline) {
    SubmitRequest r;
    if (pipeline)
      r.client.kind = ClientRef::pipeline;
    else
      r.client.identity = "c1";
    r.tenant = "acme";
    r.id = id;
    r.prompt_text = "hello";
    r.max_tokens = 8;
    caf::anon_send(admission, submit_atom::value, std::move(r));
    sched->run();
  }
  /// Lets the journal's timers (group commit, retries) fire.
  void wait_ms(int ms) {
    sched->advance_time(std::chrono::milliseconds(ms));
    sched->run();
  }
  /// The batcher's end of a job: the done to egress (through the journal), the outcome to
  /// admission (which journals it).
  void finish(const Job& j) {
    DoneEvent d;
    d.to = j.client;
    d.uid = j.uid;
    d.id = j.id;
    d.tenant = j.tenant;
    d.finish = FinishReason::length;
    d.text = "done-text";
    JobOutcome o;
    o.uid = j.uid;
    o.id = j.id;
    o.tenant = j.tenant;
    o.outcome = Outcome::done;
    o.done = d;
    caf::anon_send(journal, out_atom::value, std::move(d));
    caf::anon_send(admission, finished_atom::value, std::move(o));
    sched->run();
  }
  template <class R>
  R stats_of(const auto& who) {
    return test::probe_stats<R>(*this, who);
  }
  /// Where the journal's records end (its file goes on with preallocated zeros).
  uint64_t size() const { return file->size(); }
  /// What a restart would find in the journal.
  JournalReplay replay_now() const {
    JournalReplay r;
    std::vector<std::string> compacted;
    replay_records(scan_journal(path).records, 100, r, compacted);
    return r;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(refused_jobs_get_unavailable_return_their_credit_and_leave_no_record) {
  Rig rig("batch");
  const uint64_t window = rig.t->pull_credit;
  BOOST_REQUIRE_GT(window, 0u);
  constexpr int kRefused = 100;  // more than the PULL window
  {
    FullDisk full(rig.size());
    BOOST_REQUIRE(full.ok());
    for (int i = 0; i < kRefused; ++i) rig.submit("refused-" + std::to_string(i), true);
    rig.submit("refused-router", false);
    rig.wait_ms(10);  // group commits and retries, were any armed
  }
  BOOST_REQUIRE_EQUAL(rig.t->errors.size(), static_cast<size_t>(kRefused + 1));
  for (const auto& e : rig.t->errors) {
    BOOST_TEST(e.code == ErrorCode::unavailable);
    BOOST_TEST(e.retry_after_ms > 0);
    BOOST_TEST(e.message.find("journal") != std::string::npos, e.message);
    BOOST_TEST(e.message.find(rig.dir.path()) == std::string::npos, e.message);
    BOOST_TEST(e.message.find(std::strerror(EFBIG)) != std::string::npos, e.message);  // why
  }
  BOOST_TEST(rig.t->accepted.empty());
  BOOST_TEST(rig.t->runs.empty());
  // Every refused pipeline job gave its credit back: the gateway still has credit to read more
  // (granted minus read), and the router agrees on how much.
  BOOST_TEST(rig.t->pull_credit > static_cast<uint64_t>(kRefused));
  BOOST_TEST(static_cast<int64_t>(rig.t->pull_credit - kRefused) ==
             rig.stats_of<RouterStats>(rig.router).pull_outstanding);
  BOOST_TEST(rig.stats_of<JournalStats>(rig.journal).write_errors >= kRefused);
  BOOST_TEST(rig.stats_of<JournalStats>(rig.journal).refused == kRefused + 1);
  BOOST_TEST(rig.stats_of<JournalStats>(rig.journal).failing == 1);

  // Room again: the next job is accepted and runs; the failing state ends.
  rig.submit("after", true);
  rig.wait_ms(10);  // its group commit
  BOOST_TEST(rig.stats_of<JournalStats>(rig.journal).failing == 0);
  caf::anon_send(rig.batcher, credit_atom::value, rig.router, uint32_t{8});
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 1u);
  BOOST_TEST(rig.t->runs[0].id == "after");
  // A restart finds that job alone: none of the refused ones, nothing torn.
  auto scan = scan_journal(rig.path);
  BOOST_TEST(scan.warning.empty(), scan.warning);
  auto replay = rig.replay_now();
  BOOST_REQUIRE_EQUAL(replay.pending.size(), 1u);
  BOOST_TEST(replay.pending[0].id == "after");
  // And the refused keys were not kept: resubmitted, they are admitted as new jobs.
  rig.submit("refused-0", true);
  rig.wait_ms(10);
  caf::anon_send(rig.batcher, credit_atom::value, rig.router, uint32_t{8});
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 2u);
  BOOST_TEST(rig.t->runs[1].id == "refused-0");
}

BOOST_AUTO_TEST_CASE(a_done_waits_for_its_result_record_while_the_disk_is_full) {
  Rig rig("always");
  rig.submit("a", false);
  BOOST_REQUIRE_EQUAL(rig.t->accepted.size(), 1u);
  caf::anon_send(rig.batcher, credit_atom::value, rig.router, uint32_t{4});
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 1u);
  const Job job = rig.t->runs[0];
  size_t dones_while_full = 0;
  int64_t held_while_full = 0, failing_while_full = 0;
  {
    FullDisk full(rig.size());
    BOOST_REQUIRE(full.ok());
    rig.finish(job);
    for (int i = 0; i < 5; ++i) rig.wait_ms(200);  // five retries, all refused
    dones_while_full = rig.t->dones.size();
    held_while_full = rig.stats_of<JournalStats>(rig.journal).unwritten;
    failing_while_full = rig.stats_of<JournalStats>(rig.journal).failing;
  }
  // The done did not leave: its result record is not on disk, and a restart would run the job.
  BOOST_TEST(dones_while_full == 0u);
  BOOST_TEST(held_while_full == 1);
  BOOST_TEST(failing_while_full == 1);
  BOOST_TEST(rig.replay_now().pending.size() == 1u);
  // Room again: the next retry writes the record, then the done goes out.
  rig.wait_ms(200);
  BOOST_REQUIRE_EQUAL(rig.t->dones.size(), 1u);
  BOOST_TEST(rig.t->dones[0].id == "a");
  BOOST_TEST(rig.stats_of<JournalStats>(rig.journal).unwritten == 0);
  BOOST_TEST(rig.stats_of<JournalStats>(rig.journal).failing == 0);
  auto replay = rig.replay_now();
  BOOST_TEST(replay.pending.empty());
  BOOST_REQUIRE_EQUAL(replay.results.size(), 1u);
  BOOST_TEST(replay.results[0].id == "a");
}

BOOST_AUTO_TEST_SUITE_END()  // test_journal_actor
