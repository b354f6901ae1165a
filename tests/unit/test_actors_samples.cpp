// Several samples of one prompt (Job::n), prompt log-probabilities and score requests through a
// batcher and a real CPU executor on stories260K: the prompt is computed once and shared (fed
// tokens, forks and block copies in the batcher's stats), greedy samples agree with each other
// and with llama.cpp, seeded samples are reproducible one by one, and teacher-forced
// log-probabilities (prompt_logprobs, scores) equal llama.cpp's within the golden tolerance.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <numeric>

#include "tests/support/batcher_rig.hpp"
#include "tests/support/reference.hpp"

BOOST_AUTO_TEST_SUITE(test_actors_samples)

using namespace sy;
using namespace sy::test;

namespace {

BatchingConfig config_for_samples(bool prefix_cache = true) {
  BatchingConfig bc;
  bc.kv_block_size = 16;
  bc.kv_memory_mb = 8;
  bc.max_sequences = 16;
  bc.prefix_cache = prefix_cache;
  return bc;
}

void start(Rig& rig, const BatchingConfig& bc) {
  rig.start(bc, kv_blocks_for(bc, stories()->limits().kv_bytes_per_token()), cpu_spec());
}

ReferenceCase ref32() {
  return reference_cases(32).front();
}

// Mean and worst absolute difference of `got` against `want`.
std::pair<double, double> diffs(const std::vector<double>& got, const std::vector<double>& want) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  double sum = 0, worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(got[i] - want[i]);
    sum += d;
    worst = std::max(worst, d);
  }
  return {got.empty() ? 0.0 : sum / static_cast<double>(got.size()), worst};
}

}  // namespace

BOOST_AUTO_TEST_CASE(greedy_samples_are_identical_and_golden) {
  Rig rig;
  start(rig, config_for_samples());
  const ReferenceCase c = ref32();
  Job j = rig.job(c.prompt_token_ids, 32, false);
  j.n = 4;
  const uint64_t uid = rig.submit(j);
  rig.wait_all({uid});
  const Seen& s = rig.seen[uid];
  BOOST_TEST(s.errors == 0, s.error.message);
  BOOST_TEST(s.dones == 1);
  BOOST_REQUIRE_EQUAL(s.done.choices.size(), 4u);
  BOOST_TEST(s.done.text.empty());
  BOOST_TEST(s.done.ids.empty());
  for (uint32_t i = 0; i < 4; ++i) {
    const ChoiceResult& ch = s.done.choices[i];
    BOOST_TEST(ch.index == i);
    BOOST_TEST(ch.ids == c.generated_token_ids);
    BOOST_TEST(ch.text == c.generated_text);
    BOOST_TEST((ch.finish == FinishReason::length));
  }
  BOOST_TEST((s.done.finish == FinishReason::length));
  BOOST_TEST(s.done.prompt_tokens == c.prompt_token_ids.size());
  BOOST_TEST(s.done.completion_tokens == 4u * 32u);
  BOOST_TEST(s.outcome.tokens_used == c.prompt_token_ids.size() + 4u * 32u);
  rig.drain();
  const BatcherStats st = rig.stats(rig.batcher);
  BOOST_TEST(st.blocks_used == 0);
  BOOST_TEST(st.running == 0);
  BOOST_TEST(rig.credit == 16u + 1u);  // one job: one credit back
}

BOOST_AUTO_TEST_CASE(eight_samples_compute_the_prompt_once) {
  const ReferenceCase c = ref32();
  // A prompt of 2.5 blocks: two full blocks shared, the third copied on write by all but one.
  std::vector<int32_t> prompt = c.prompt_token_ids;
  prompt.insert(prompt.end(), c.generated_token_ids.begin(), c.generated_token_ids.end());
  prompt.resize(41);
  const auto p = static_cast<int64_t>(prompt.size());
  for (uint32_t n : {1u, 8u}) {
    Rig rig;
    start(rig, config_for_samples(false));  // no prefix cache: sharing comes from forking alone
    Job j = rig.job(prompt, 8, false);
    j.n = n;
    j.ignore_eos = true;
    const uint64_t uid = rig.submit(j);
    rig.wait_all({uid});
    const Seen& s = rig.seen[uid];
    const BatcherStats st = rig.stats(rig.batcher);
    BOOST_TEST(s.done.prompt_tokens == static_cast<uint32_t>(p));
    BOOST_TEST(s.done.completion_tokens == n * 8u);
    if (n == 1) {
      BOOST_TEST(st.prompt_fed_tokens == p);
      BOOST_TEST(st.forked_seqs == 0);
      continue;
    }
    // The leader fed p - 1 prompt tokens once; each sample fed the last prompt token itself.
    BOOST_TEST(st.prompt_fed_tokens == p - 1 + 8);
    BOOST_TEST(st.fed_tokens == p - 1 + 8 * 8);
    BOOST_TEST(st.forked_seqs == 8);
    BOOST_TEST(st.kv_block_copies == 7);  // slot 40 lies in the shared third block: 7 copies
    // Two shared prompt blocks plus one block of its own per sample: far below 8 private copies.
    BOOST_TEST(st.blocks_used_peak == 2 + 8);
    BOOST_TEST(st.blocks_used == 0);
    BOOST_REQUIRE_EQUAL(s.done.choices.size(), 8u);
    for (const ChoiceResult& ch : s.done.choices) BOOST_TEST(ch.ids.size() == 8u);
  }
}

BOOST_AUTO_TEST_CASE(seeded_samples_are_reproducible_one_by_one) {
  Rig rig;
  start(rig, config_for_samples());
  const ReferenceCase c = ref32();
  auto sampled = [&](uint32_t n, uint64_t seed) {
    Job j = rig.job(c.prompt_token_ids, 24, false);
    j.temperature = 1.0f;
    j.seed = seed;
    j.n = n;
    j.ignore_eos = true;
    const uint64_t uid = rig.submit(j);
    rig.wait_all({uid});
    return rig.seen[uid].done;
  };
  const DoneEvent a = sampled(4, 1000);
  const DoneEvent b = sampled(4, 1000);
  BOOST_REQUIRE_EQUAL(a.choices.size(), 4u);
  BOOST_REQUIRE_EQUAL(b.choices.size(), 4u);
  bool all_same = true;
  for (size_t i = 0; i < 4; ++i) {
    BOOST_TEST(a.choices[i].ids == b.choices[i].ids);
    // Sample i draws as a single job seeded with seed + i.
    const DoneEvent one = sampled(1, 1000 + i);
    BOOST_TEST(one.choices.empty());
    BOOST_TEST(a.choices[i].ids == one.ids);
    all_same = all_same && a.choices[i].ids == a.choices[0].ids;
  }
  BOOST_TEST(!all_same);  // temperature 1 over 24 tokens: the samples differ
}

BOOST_AUTO_TEST_CASE(streamed_samples_carry_their_choice) {
  Rig rig;
  start(rig, config_for_samples());
  const ReferenceCase c = ref32();
  Job j = rig.job(c.prompt_token_ids, 16, true);
  j.n = 3;
  j.logprobs = 2;
  const uint64_t uid = rig.submit(j);
  rig.wait_all({uid});
  const Seen& s = rig.seen[uid];
  BOOST_TEST(s.contiguous);
  BOOST_TEST(s.stream_logprob_shape);
  BOOST_REQUIRE_EQUAL(s.choice_ids.size(), 3u);
  const std::vector<int32_t> want(c.generated_token_ids.begin(),
                                  c.generated_token_ids.begin() + 16);
  for (const auto& [choice, ids] : s.choice_ids) BOOST_TEST(ids == want);
  // Streamed on the request endpoint: the done's choices carry no text; the outcome keeps it.
  BOOST_REQUIRE_EQUAL(s.done.choices.size(), 3u);
  BOOST_TEST(s.done.choices[1].ids.empty());
  BOOST_REQUIRE_EQUAL(s.outcome.done.choices.size(), 3u);
  BOOST_TEST(s.outcome.done.choices[2].ids == want);
  BOOST_TEST(s.outcome.done.choices[2].logprob.size() == 16u);
}

BOOST_AUTO_TEST_CASE(cancel_ends_every_sample) {
  Rig rig;
  BatchingConfig bc = config_for_samples();
  ExecutorSpec spec = cpu_spec();
  spec.step_delay_ms = 5;
  rig.start(bc, kv_blocks_for(bc, stories()->limits().kv_bytes_per_token()), spec);
  Job j = rig.job(ref32().prompt_token_ids, 1000, true);
  j.n = 4;
  j.ignore_eos = true;
  const uint64_t uid = rig.submit(j);
  while (rig.seen[uid].choice_ids.size() < 4 && !rig.ended(uid)) BOOST_REQUIRE(rig.receive_one());
  rig.sink->send(rig.batcher, cancel_atom::value, uid);
  rig.wait_all({uid});
  const Seen& s = rig.seen[uid];
  BOOST_TEST((s.done.finish == FinishReason::cancelled));
  BOOST_TEST((s.outcome.outcome == Outcome::cancelled));
  BOOST_TEST(s.done.choices.size() == 4u);
  const BatcherStats st = rig.stats(rig.batcher);
  BOOST_TEST(st.blocks_used == 0);
  BOOST_TEST(st.running == 0);
  BOOST_TEST(st.ongoing == 0);
}

// prompt_logprobs over prompt + llama.cpp's greedy continuation: the continuation's positions
// are teacher-forced there, so their log-probabilities are llama.cpp's top1_logprobs.
BOOST_AUTO_TEST_CASE(prompt_logprobs_match_llamacpp) {
  for (uint32_t n : {1u, 3u}) {
    Rig rig;
    start(rig, config_for_samples());
    // A first job leaves the prompt in the prefix cache: the second must not take it.
    std::vector<uint64_t> uids;
    for (const ReferenceCase& c : reference_cases(32)) {
      std::vector<int32_t> prompt = c.prompt_token_ids;
      prompt.insert(prompt.end(), c.generated_token_ids.begin(), c.generated_token_ids.end());
      Job warm = rig.job(prompt, 1, false);
      rig.wait_all({rig.submit(warm)});
      Job j = rig.job(prompt, 2, false);
      j.prompt_logprobs = 3;
      j.n = n;
      const uint64_t uid = rig.submit(j);
      rig.wait_all({uid});
      const DoneEvent& d = rig.seen[uid].done;
      const size_t p = c.prompt_token_ids.size();
      BOOST_REQUIRE_EQUAL(d.prompt_logprob.size(), prompt.size() - 1);
      BOOST_TEST(d.cached_tokens == 0u);
      BOOST_TEST(d.prompt_n_top == 3u);
      BOOST_TEST(d.prompt_top_ids.size() == 3 * d.prompt_logprob.size());
      BOOST_TEST(std::vector<int32_t>(d.prompt_ids) ==
                 std::vector<int32_t>(prompt.begin() + 1, prompt.end()));
      std::vector<double> got;
      for (size_t k = p - 1; k < d.prompt_logprob.size(); ++k) {
        got.push_back(d.prompt_logprob[k]);
        // Greedy continuation: the token is the most likely one there.
        BOOST_TEST(d.prompt_top_ids[3 * k] == prompt[k + 1]);
        BOOST_TEST(std::abs(d.prompt_top_logprobs[3 * k] - d.prompt_logprob[k]) < 1e-6);
      }
      const auto [mean, worst] = diffs(got, c.top1_logprobs);
      BOOST_TEST_MESSAGE("n " << n << ": mean |diff| " << mean << ", worst " << worst);
      BOOST_TEST(mean < 1e-3);
      BOOST_TEST(worst < 1e-2);
      for (float lp : d.prompt_logprob) BOOST_TEST(lp <= 0.0f);
    }
  }
}

BOOST_AUTO_TEST_CASE(scores_match_llamacpp) {
  Rig rig;
  start(rig, config_for_samples());
  const auto cases = reference_cases(32);
  for (const ReferenceCase& c : cases) {
    Job j = rig.job(c.prompt_token_ids, 1, false);
    // The golden continuation, a prefix of it, and a continuation the model finds unlikely.
    std::vector<int32_t> half(c.generated_token_ids.begin(), c.generated_token_ids.begin() + 10);
    std::vector<int32_t> odd(c.generated_token_ids.rbegin(), c.generated_token_ids.rbegin() + 10);
    j.continuations = {c.generated_token_ids, half, odd};
    j.max_tokens = static_cast<uint32_t>(c.generated_token_ids.size());
    const uint64_t uid = rig.submit(j);
    rig.wait_all({uid});
    const DoneEvent& d = rig.seen[uid].done;
    BOOST_REQUIRE_EQUAL(d.scores.size(), 3u);
    const double want_all = std::accumulate(c.top1_logprobs.begin(), c.top1_logprobs.end(), 0.0);
    const double want_half =
        std::accumulate(c.top1_logprobs.begin(), c.top1_logprobs.begin() + 10, 0.0);
    BOOST_TEST(d.scores[0].tokens == c.generated_token_ids.size());
    BOOST_TEST(d.scores[1].tokens == 10u);
    // Within the golden tests' mean tolerance per token, summed.
    BOOST_TEST(std::abs(d.scores[0].logprob - want_all) < 1e-3 * d.scores[0].tokens);
    BOOST_TEST(std::abs(d.scores[1].logprob - want_half) < 1e-3 * 10);
    BOOST_TEST(d.scores[2].logprob < d.scores[1].logprob - 5.0);
    BOOST_TEST(d.prompt_tokens == c.prompt_token_ids.size());
    BOOST_TEST(d.completion_tokens == c.generated_token_ids.size() + 20u);
    BOOST_TEST((d.finish == FinishReason::stop));
    BOOST_TEST(d.choices.empty());
  }
  rig.drain();
  const BatcherStats st = rig.stats(rig.batcher);
  BOOST_TEST(st.blocks_used == 0);
  BOOST_TEST(st.forked_seqs == static_cast<int64_t>(3 * cases.size()));
}

BOOST_AUTO_TEST_CASE(one_token_prompt_forks_at_once) {
  Rig rig;
  start(rig, config_for_samples());
  Job j = rig.job({1}, 4, false);
  j.n = 2;
  const uint64_t uid = rig.submit(j);
  Job k = rig.job({1}, 1, false);
  k.continuations = {{403, 407}, {378}};
  k.max_tokens = 2;
  const uint64_t sid = rig.submit(k);
  rig.wait_all({uid, sid});
  BOOST_TEST(rig.seen[uid].done.choices.size() == 2u);
  BOOST_TEST(rig.seen[uid].done.choices[0].ids == rig.seen[uid].done.choices[1].ids);
  BOOST_REQUIRE_EQUAL(rig.seen[sid].done.scores.size(), 2u);
  BOOST_TEST(rig.seen[sid].done.scores[0].tokens == 2u);
  BOOST_TEST(rig.seen[sid].done.scores[0].logprob < 0.0);
}

BOOST_AUTO_TEST_SUITE_END()
