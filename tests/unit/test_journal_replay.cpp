// The journal's records and replay: what a restarted server runs again, remembers and delivers
// again, and that the compacted journal replays to the same state.
#include <boost/test/unit_test.hpp>
#include <cstdlib>

#include "actors/journal.hpp"
#include "storage/journal_codec.hpp"
#include "storage/journal_file.hpp"
#include "tests/support/enum_print.hpp"
#include "tests/support/temp_dir.hpp"

BOOST_AUTO_TEST_SUITE(test_journal_replay)

using namespace sy;

namespace {

Job job(uint64_t uid, const std::string& id, uint8_t kind) {
  Job j;
  j.uid = uid;
  j.id = id;
  j.tenant = "acme";
  j.client.kind = kind;
  j.client.identity = kind == ClientRef::router ? std::string("\0\x8b\x45\x01\x02", 5) : "";
  j.class_index = 1;
  j.prompt = {1, 2, 3, 4};
  j.max_tokens = 8;
  j.temperature = 0.5f;
  j.top_k = 40;
  j.top_p = 0.9f;
  j.seed = 77;
  j.stop = {"\n\n"};
  j.ignore_eos = true;
  j.stream = kind == ClientRef::router;
  j.logprobs = 2;
  j.arrival_us = 123456;
  return j;
}

JobOutcome done(const Job& j, const std::string& text) {
  JobOutcome o;
  o.uid = j.uid;
  o.id = j.id;
  o.tenant = j.tenant;
  o.outcome = Outcome::done;
  o.tokens_used = 12;
  o.done.to = j.client;
  o.done.uid = j.uid;
  o.done.id = j.id;
  o.done.tenant = j.tenant;
  o.done.finish = FinishReason::length;
  o.done.text = text;
  o.done.ids = {9, 8, 7};
  o.done.prompt_tokens = 4;
  o.done.completion_tokens = 3;
  o.done.total_ms = 12.5;
  o.done.logprob = {-0.5f, -1.0f, -2.0f};
  o.done.n_top = 1;
  o.done.top_ids = {9, 8, 7};
  o.done.top_logprobs = {-0.5f, -1.0f, -2.0f};
  return o;
}

JobOutcome failed(const Job& j) {
  JobOutcome o;
  o.uid = j.uid;
  o.id = j.id;
  o.tenant = j.tenant;
  o.outcome = Outcome::error;
  o.code = static_cast<ErrorCode>(10);  // out of the enum's range: kept as it is
  o.error.to = j.client;
  o.error.uid = j.uid;
  o.error.id = j.id;
  o.error.tenant = j.tenant;
  o.error.code = static_cast<ErrorCode>(10);
  o.error.message = "engine_dead";
  return o;
}

}  // namespace

// A program's step records fold into its pending job (each path once, the first record wins), the
// compacted journal carries them in the accept record, and an ended program leaves none.
BOOST_AUTO_TEST_CASE(program_steps_fold_into_the_pending_program) {
  Job p = job(7, "prog", ClientRef::pipeline);
  p.prompt.clear();
  p.program = R"([{"type":"gen","name":"a"},{"type":"gen","name":"b"}])";
  p.inputs = {{"q", "why"}};
  Job ended = job(8, "prog2", ClientRef::pipeline);
  ended.program = p.program;
  const std::vector<std::string> recs = {
      encode_accept(p),
      journal::encode_step(ProgramStep{7, "0", "first"}),
      encode_accept(ended),
      journal::encode_step(ProgramStep{8, "0", "x"}),
      encode_result(done(ended, "x")),
      journal::encode_step(ProgramStep{7, "0", "again"}),   // a second record of a path
      journal::encode_step(ProgramStep{9, "0", "orphan"}),  // no accept: ignored
      journal::encode_step(ProgramStep{7, "1", "second"})};
  JournalReplay r;
  std::vector<std::string> compacted;
  replay_records(recs, 10, r, compacted);
  BOOST_REQUIRE_EQUAL(r.pending.size(), 1u);
  const std::vector<std::pair<std::string, std::string>> want = {{"0", "first"}, {"1", "second"}};
  BOOST_TEST((r.pending[0].program_done == want));
  BOOST_TEST(r.pending[0].program == p.program);
  BOOST_TEST((r.pending[0].inputs == p.inputs));
  JournalReplay again;
  std::vector<std::string> compacted2;
  replay_records(compacted, 10, again, compacted2);
  BOOST_REQUIRE_EQUAL(again.pending.size(), 1u);
  BOOST_TEST((again.pending[0].program_done == want));
}

BOOST_AUTO_TEST_CASE(an_accepted_job_without_result_is_pending_with_every_field) {
  Job a = job(5, "a", ClientRef::pipeline);
  JournalReplay r;
  std::vector<std::string> compacted;
  replay_records({encode_accept(a)}, 10, r, compacted);
  BOOST_REQUIRE(r.pending.size() == 1u);
  const Job& p = r.pending[0];
  BOOST_TEST(p.uid == 5u);
  BOOST_TEST(p.id == "a");
  BOOST_TEST(p.tenant == "acme");
  BOOST_TEST((p.client == a.client));
  BOOST_TEST(p.class_index == 1u);
  BOOST_TEST(p.prompt == a.prompt);
  BOOST_TEST(p.max_tokens == 8u);
  BOOST_TEST(p.temperature == 0.5f);
  BOOST_TEST(p.top_k == 40);
  BOOST_TEST(p.top_p == 0.9f);
  BOOST_TEST(p.seed == 77u);
  BOOST_TEST(p.stop == a.stop);
  BOOST_TEST(p.ignore_eos);
  BOOST_TEST(p.logprobs == 2u);
  BOOST_TEST(p.deadline_us == 0);  // it had none
  BOOST_TEST(r.next_uid == 6u);
  BOOST_TEST(r.results.empty());
  BOOST_TEST(compacted.size() == 1u);
}

BOOST_AUTO_TEST_CASE(a_replayed_job_keeps_its_deadline_and_a_passed_one_stays_passed) {
  const int64_t minute = 60'000'000;
  Job open = job(1, "open", ClientRef::pipeline), due = job(2, "due", ClientRef::pipeline);
  open.deadline_us = now_us() + minute;
  due.deadline_us = now_us() - 5'000'000;  // passed (as if the server had been down 5 s too long)
  JournalReplay r;
  std::vector<std::string> compacted;
  replay_records({encode_accept(open), encode_accept(due)}, 10, r, compacted);
  BOOST_REQUIRE(r.pending.size() == 2u);
  const int64_t now = now_us();
  // The deadline comes back on this process's clock: about a minute ahead. The bounds allow for
  // a slow machine between the two clock reads, not for a lost or reset deadline.
  BOOST_TEST(r.pending[0].deadline_us > now + minute - 10'000'000);
  BOOST_TEST(r.pending[0].deadline_us <= now + minute);
  // Passed, but not "none": the router expires it (deadline_exceeded) instead of running it.
  BOOST_TEST(r.pending[1].deadline_us > 0);
  BOOST_TEST(r.pending[1].deadline_us <= now - 4'000'000);
  // The compacted journal carries the deadlines on.
  JournalReplay again;
  std::vector<std::string> compacted2;
  replay_records(compacted, 10, again, compacted2);
  BOOST_REQUIRE(again.pending.size() == 2u);
  BOOST_TEST(std::llabs(again.pending[0].deadline_us - r.pending[0].deadline_us) < 1'000'000);
  BOOST_TEST(again.pending[1].deadline_us > 0);
  BOOST_TEST(again.pending[1].deadline_us <= now - 4'000'000);
}

BOOST_AUTO_TEST_CASE(a_replayed_router_job_loses_its_dead_client) {
  Job a = job(7, "r", ClientRef::router);
  JournalReplay r;
  std::vector<std::string> compacted;
  replay_records({encode_accept(a)}, 10, r, compacted);
  BOOST_REQUIRE(r.pending.size() == 1u);
  BOOST_TEST(r.pending[0].client.kind == ClientRef::router);
  BOOST_TEST(r.pending[0].client.identity.empty());  // ZeroMQ may reuse the old id
  BOOST_TEST(r.pending[0].stream);
}

BOOST_AUTO_TEST_CASE(results_are_kept_redelivered_until_marked_and_never_run_again) {
  Job a = job(1, "a", ClientRef::pipeline), b = job(2, "b", ClientRef::pipeline),
      c = job(3, "c", ClientRef::router), d = job(4, "d", ClientRef::pipeline);
  std::vector<std::string> recs = {encode_accept(a),
                                   encode_accept(b),
                                   encode_accept(c),
                                   encode_accept(d),
                                   encode_result(done(a, "alpha")),
                                   encode_result(done(b, "beta")),
                                   encode_delivered(2),
                                   encode_result(done(c, "gamma")),
                                   encode_result(failed(d))};
  JournalReplay r;
  std::vector<std::string> compacted;
  replay_records(recs, 100, r, compacted);
  BOOST_TEST(r.pending.empty());
  BOOST_REQUIRE(r.results.size() == 3u);  // a, b, c done (d failed: not cached)
  BOOST_TEST(r.results[0].done.text == "alpha");
  BOOST_TEST(r.results[0].done.ids == (std::vector<int32_t>{9, 8, 7}));
  BOOST_TEST(r.results[0].done.logprob.size() == 3u);
  BOOST_TEST(r.results[2].done.to.identity == c.client.identity);
  // a (not marked) and d (its error) go to the sink again; b was marked delivered; c's client
  // (ROUTER) is gone after a restart: its result only answers resubmissions.
  BOOST_REQUIRE(r.redeliver.size() == 2u);
  BOOST_TEST(r.redeliver[0].uid == 1u);
  BOOST_TEST(r.redeliver[1].uid == 4u);
  BOOST_TEST(r.redeliver[1].error.message == "engine_dead");
  BOOST_TEST(r.next_uid == 5u);

  // The compacted journal replays to the same state.
  JournalReplay again;
  std::vector<std::string> compacted2;
  replay_records(compacted, 100, again, compacted2);
  BOOST_TEST(again.pending.size() == r.pending.size());
  BOOST_TEST(again.results.size() == r.results.size());
  BOOST_TEST(again.redeliver.size() == r.redeliver.size());
  BOOST_TEST(compacted2 == compacted);
  BOOST_TEST(compacted.size() < recs.size());
}

BOOST_AUTO_TEST_CASE(keep_results_bounds_the_cache_but_not_undelivered_results) {
  std::vector<std::string> recs;
  for (uint64_t u = 1; u <= 10; ++u) {
    Job j = job(u, std::string("k").append(std::to_string(u)), ClientRef::pipeline);
    recs.push_back(encode_accept(j));
    recs.push_back(encode_result(done(j, "t")));
    if (u <= 8) recs.push_back(encode_delivered(u));
  }
  JournalReplay r;
  std::vector<std::string> compacted;
  replay_records(recs, 3, r, compacted);
  // The 3 newest done results are cached; 9 and 10 are also undelivered (among them).
  BOOST_REQUIRE(r.results.size() == 3u);
  BOOST_TEST(r.results[0].uid == 8u);
  BOOST_TEST(r.results[2].uid == 10u);
  BOOST_TEST(r.redeliver.size() == 2u);
  BOOST_TEST(r.next_uid == 11u);
}

BOOST_AUTO_TEST_CASE(an_undecodable_record_is_skipped_and_counted) {
  Job a = job(1, "a", ClientRef::pipeline);
  JournalReplay r;
  std::vector<std::string> compacted;
  replay_records({"not msgpack \xc1", encode_accept(a)}, 10, r, compacted);
  BOOST_TEST(r.undecodable == 1u);
  BOOST_TEST(r.pending.size() == 1u);
}

BOOST_AUTO_TEST_CASE(open_journal_recovers_replays_and_compacts_a_file) {
  test::TempDir dir("sy_jr_");
  JournalConfig cfg;
  cfg.path = dir.path() + "/";  // a folder: FOLDER/switchyard.journal
  const std::string file = journal_file_path(cfg.path);
  BOOST_TEST(file == dir.path() + "/switchyard.journal");
  Job a = job(1, "a", ClientRef::pipeline), b = job(2, "b", ClientRef::pipeline);
  {
    JournalScan s;
    JournalFile f(file, s);
    f.append(encode_accept(a));
    f.append(encode_accept(b));
    f.append(encode_result(done(a, "alpha")));
    f.append(encode_delivered(1));
    f.sync();
  }
  // A crash in the middle of b's result record.
  std::string half = encode_result(done(b, "beta"));
  {
    std::string framed;
    frame_record(framed, half);
    std::FILE* fp = std::fopen(file.c_str(), "ab");
    std::fwrite(framed.data(), 1, framed.size() / 2, fp);
    std::fclose(fp);
  }
  JournalReplay r;
  auto jf = open_journal(cfg, 100, r);
  BOOST_TEST(!r.warning.empty());
  BOOST_TEST_MESSAGE("warning: " << r.warning);
  BOOST_REQUIRE(r.pending.size() == 1u);  // b runs again: its result never became durable
  BOOST_TEST(r.pending[0].uid == 2u);
  BOOST_REQUIRE(r.results.size() == 1u);
  BOOST_TEST(r.redeliver.empty());  // a was marked delivered
  jf.reset();
  auto scan = scan_journal(file);
  BOOST_TEST(scan.warning.empty());
  BOOST_TEST(scan.records.size() == 3u);  // accept b, result a, delivered a
}

BOOST_AUTO_TEST_SUITE_END()  // test_journal_replay
