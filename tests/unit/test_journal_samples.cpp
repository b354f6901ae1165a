// The journal's fields for several samples, prompt log-probabilities and score requests: a job's
// n, prompt_logprobs and continuations and a result's choices, prompt log-probabilities and
// scores survive a record round trip; a record written before them reads with their defaults.
#include <boost/test/unit_test.hpp>
#include <msgpack.hpp>

#include "storage/journal_codec.hpp"

BOOST_AUTO_TEST_SUITE(test_journal_samples)

using namespace sy;

BOOST_AUTO_TEST_CASE(job_fields_round_trip) {
  Job j;
  j.uid = 7;
  j.id.assign(1, 'j');  // (literal assignments trip a GCC 12 -Wrestrict false positive)
  j.tenant.assign(1, 't');
  j.prompt = {1, 2, 3};
  j.n = 5;
  j.prompt_logprobs = 3;
  j.continuations = {{4, 5}, {6}};
  const journal::Record r = journal::decode(journal::encode_accept(j, 0));
  BOOST_TEST(r.job.n == 5u);
  BOOST_TEST(r.job.prompt_logprobs == 3);
  BOOST_TEST(r.job.continuations == j.continuations);
  BOOST_TEST(r.job.is_score());
}

BOOST_AUTO_TEST_CASE(result_fields_round_trip) {
  JobOutcome o;
  o.uid = 9;
  o.id.assign(1, 'j');
  o.tenant.assign(1, 't');
  o.outcome = Outcome::done;
  o.done.choices = {ChoiceResult{0, FinishReason::length, "ab", {1, 2}, {-0.5f, -1.0f}, {}, {}},
                    ChoiceResult{1, FinishReason::stop, "c", {3}, {-0.25f}, {3}, {-0.25f}}};
  o.done.prompt_ids = {10, 11};
  o.done.prompt_logprob = {-1.5f, -2.5f};
  o.done.prompt_n_top = 1;
  o.done.prompt_top_ids = {10, 12};
  o.done.prompt_top_logprobs = {-1.5f, -0.5f};
  o.done.scores = {ScoreResult{0, -3.25, 2}, ScoreResult{1, -7.5, 3}};
  const journal::Record r = journal::decode(journal::encode_result(o));
  const DoneEvent& d = r.outcome.done;
  BOOST_REQUIRE_EQUAL(d.choices.size(), 2u);
  BOOST_TEST(d.choices[1].index == 1u);
  BOOST_TEST((d.choices[1].finish == FinishReason::stop));
  BOOST_TEST(d.choices[1].text == "c");
  BOOST_TEST(d.choices[1].top_logprobs == std::vector<float>{-0.25f});
  BOOST_TEST(d.choices[0].ids == (std::vector<int32_t>{1, 2}));
  BOOST_TEST(d.prompt_ids == o.done.prompt_ids);
  BOOST_TEST(d.prompt_logprob == o.done.prompt_logprob);
  BOOST_TEST(d.prompt_n_top == 1u);
  BOOST_TEST(d.prompt_top_ids == o.done.prompt_top_ids);
  BOOST_REQUIRE_EQUAL(d.scores.size(), 2u);
  BOOST_TEST(d.scores[1].logprob == -7.5);
  BOOST_TEST(d.scores[1].tokens == 3u);
}

BOOST_AUTO_TEST_CASE(records_without_the_fields_read_with_defaults) {
  // An accept record as an older server wrote it: no n, prompt_logprobs or continuations.
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_map(4);
  p.pack("t"), p.pack(std::string(1, static_cast<char>(journal::RecordKind::accept)));
  p.pack("uid"), p.pack(3);
  p.pack("id"), p.pack("old");
  p.pack("prompt"), p.pack(std::vector<int32_t>{1, 2});
  const journal::Record r = journal::decode(std::string(buf.data(), buf.size()));
  BOOST_TEST(r.job.id == "old");
  BOOST_TEST(r.job.n == 1u);
  BOOST_TEST(r.job.prompt_logprobs == -1);
  BOOST_TEST(!r.job.is_score());
}

BOOST_AUTO_TEST_SUITE_END()
