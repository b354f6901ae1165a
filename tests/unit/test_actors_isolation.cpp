// A job that fails on its own in the engine step (sampling state the sampler refuses, NaN
// logits) ends alone with its own error; the jobs it shares steps with finish with their exact
// greedy output, and nothing counts as an executor failure. Batcher + real CPU executor.
#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <string>
#include <vector>

#include "actors/batcher.hpp"
#include "actors/executor.hpp"
#include "actors/messages.hpp"
#include "core/error_code.hpp"
#include "model/llama.hpp"
#include "tests/support/batcher_rig.hpp"
#include "tests/support/enum_print.hpp"
#include "tests/support/reference.hpp"

BOOST_AUTO_TEST_SUITE(test_actors_isolation)

using namespace sy;
using namespace sy::test;

namespace {

// Token id that makes the executor's logits NaN (TEST ONLY flag) for a job whose first chunk
// holds it; no reference prompt contains it.
constexpr int32_t kNanToken = 511;

BatchingConfig config_for_sharing() {
  BatchingConfig bc;
  bc.step_token_budget = 64;
  bc.max_sequences = 16;  // every job of the test runs at once
  bc.prefill_chunk = 16;
  bc.kv_block_size = 16;
  bc.kv_memory_mb = 4;
  return bc;
}

}  // namespace

BOOST_AUTO_TEST_CASE(failing_jobs_end_alone_and_their_neighbours_stay_exact) {
  Rig rig;
  const BatchingConfig bc = config_for_sharing();
  ExecutorSpec spec = cpu_spec();
  spec.test_nan_logits_token = kNanToken;
  rig.start(bc, kv_blocks_for(bc, stories()->limits().kv_bytes_per_token()), spec);

  const auto cases = test::reference_cases(64);
  BOOST_REQUIRE(cases.size() == 3u);
  std::vector<uint64_t> good, all;
  for (bool stream : {true, false})
    for (const auto& c : cases) {
      good.push_back(rig.submit(rig.job(c.prompt_token_ids, 64, stream)));
      all.push_back(good.back());
    }
  // Jobs that reach the executor with values the sampler refuses (admission checks them, so
  // these stand for any value that slips through) or whose logits turn NaN.
  Job zero_top_p = rig.job(cases[0].prompt_token_ids, 8, false);
  zero_top_p.temperature = 1.0f;
  zero_top_p.top_p = 0.0f;  // top_p 1e-46 narrowed to a float
  Job nan_top_p = rig.job(cases[1].prompt_token_ids, 8, true);
  nan_top_p.temperature = 0.5f;
  nan_top_p.top_p = NAN;
  Job many_logprobs = rig.job(cases[2].prompt_token_ids, 8, false);
  many_logprobs.logprobs = 1000;
  Job nan_sampled = rig.job({1, 403, kNanToken}, 8, true);
  nan_sampled.temperature = 0.9f;
  nan_sampled.seed = ~uint64_t{0};
  Job nan_greedy = rig.job({1, kNanToken}, 8, false);
  const uint64_t bad_request[] = {rig.submit(zero_top_p), rig.submit(nan_top_p),
                                  rig.submit(many_logprobs)};
  const uint64_t internal[] = {rig.submit(nan_sampled), rig.submit(nan_greedy)};
  all.insert(all.end(), std::begin(bad_request), std::end(bad_request));
  all.insert(all.end(), std::begin(internal), std::end(internal));
  rig.wait_all(all);

  const Tokenizer& tok = stories()->tokenizer();
  for (size_t k = 0; k < good.size(); ++k) {
    const Seen& s = rig.seen[good[k]];
    const auto& c = cases[k % cases.size()];
    BOOST_TEST_CONTEXT("greedy job " << good[k]) {
      BOOST_TEST(s.errors == 0);
      BOOST_TEST(s.dones == 1);
      BOOST_TEST(s.outcome.done.ids == c.generated_token_ids, boost::test_tools::per_element());
      BOOST_TEST(s.outcome.done.text == tok.decode(c.generated_token_ids));
      if (k < cases.size())
        BOOST_TEST(s.stream_ids == c.generated_token_ids, boost::test_tools::per_element());
    }
  }
  for (uint64_t u : bad_request) {
    const Seen& s = rig.seen[u];
    BOOST_TEST_CONTEXT("job " << u << ": " << s.error.message) {
      BOOST_TEST(s.dones == 0);
      BOOST_TEST(s.errors == 1);
      BOOST_TEST(s.error.code == ErrorCode::bad_request);
      BOOST_TEST(s.outcome.code == ErrorCode::bad_request);
      BOOST_TEST(s.error.message.find("sampling") != std::string::npos);
    }
  }
  BOOST_TEST(rig.seen[bad_request[0]].error.message.find("top_p") != std::string::npos);
  BOOST_TEST(rig.seen[bad_request[2]].error.message.find("logprobs") != std::string::npos);
  for (uint64_t u : internal) {
    const Seen& s = rig.seen[u];
    BOOST_TEST_CONTEXT("job " << u << ": " << s.error.message) {
      BOOST_TEST(s.dones == 0);
      BOOST_TEST(s.errors == 1);
      BOOST_TEST(s.error.code == ErrorCode::internal);
      BOOST_TEST(s.error.message.find("NaN") != std::string::npos);
      BOOST_TEST(s.stream_ids.empty());
    }
  }
  const BatcherStats st = rig.stats(rig.batcher);
  BOOST_TEST(st.seq_failures == 5);
  BOOST_TEST(st.executor_failures == 0);
  BOOST_TEST(st.blocks_used == 0);
  BOOST_TEST(st.finished == 11);
  // They did share steps: far fewer steps than the jobs would take one after another.
  BOOST_TEST(st.steps < 2 * 64);
  rig.drain();
  BOOST_TEST(rig.stats<ExecutorStats>(rig.executor).samplers == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_actors_isolation
