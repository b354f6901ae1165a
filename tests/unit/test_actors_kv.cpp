// KV-cache policies and prefix reuse in the batcher, with a real CPU executor: memory held under a
// sliding window over 8,192 tokens, windows wider than the sequence equal full attention, swaps by
// command and by watermark, and prefix reuse that changes no output even while blocks are evicted.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "model/make_model.hpp"
#include "tests/support/batcher_rig.hpp"
#include "tests/support/reference.hpp"
#include "tests/support/temp_dir.hpp"

BOOST_AUTO_TEST_SUITE(test_actors_kv)

using namespace sy;
using namespace sy::test;

namespace {

BatchingConfig kv_config(const std::string& policy) {
  BatchingConfig bc;
  bc.step_token_budget = 128;
  bc.max_sequences = 8;
  bc.prefill_chunk = 32;
  bc.kv_block_size = 16;
  bc.kv_memory_mb = 4;
  bc.kv_policy = policy;
  return bc;
}

// Sends a policy swap to the batcher and returns its answer ("" = swapped).
std::string swap(Rig& rig, const policy::KvPolicy& p) {
  std::string out = "no reply";
  rig.sink->request(rig.batcher, kWait, kvpolicy_atom::value, p)
      .receive([&](std::string& why) { out = std::move(why); },
               [&](caf::error& e) { out = "error: " + rig.sys.render(e); });
  return out;
}

// Runs `prompts` (greedy, ignore_eos) all at once and returns each job's completion ids.
std::vector<std::vector<int32_t>> run_all(Rig& rig,
                                          const std::vector<std::vector<int32_t>>& prompts,
                                          uint32_t max_tokens) {
  std::vector<uint64_t> uids;
  for (const auto& p : prompts) {
    Job j = rig.job(p, max_tokens, false);
    j.ignore_eos = true;
    uids.push_back(rig.submit(j));
  }
  rig.wait_all(uids);
  std::vector<std::vector<int32_t>> out;
  for (uint64_t u : uids) {
    const Seen& s = rig.seen[u];
    BOOST_TEST_CONTEXT("job " << u) {
      BOOST_TEST(s.errors == 0, s.error.message);
      BOOST_TEST(s.dones == 1);
      BOOST_TEST(s.done.completion_tokens == max_tokens);
    }
    out.push_back(s.outcome.done.ids);
  }
  return out;
}

// Deterministic pseudo-random token ids of stories260K's vocabulary (BOS first when `bos`).
std::vector<int32_t> some_tokens(size_t n, uint32_t seed, bool bos) {
  std::mt19937 rng(seed);
  // Ids 3.. skip <unk>, <s>, </s>; 512 is the model's vocabulary.
  std::uniform_int_distribution<int32_t> id(3, 511);
  std::vector<int32_t> v;
  if (bos) v.push_back(1);
  while (v.size() < n) v.push_back(id(rng));
  return v;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

// Issue 5, must show 1: 8,192 generated tokens under sliding_window(512) never hold more blocks
// than the window needs plus one partial block; under full the same job needs all of them.
BOOST_AUTO_TEST_CASE(sliding_window_bounds_blocks_held_over_8192_tokens) {
  TempDir dir("sy_kv_");
  MakeModelOptions mo;
  mo.shape = "tiny";
  mo.ctx_len = 8448;  // room for 16 prompt tokens + 8,192 generated ones under full
  mo.seed = 3;
  mo.out = dir.file("tiny8k.gguf");
  make_model(mo);
  auto model = LlamaModel::load(mo.out);

  const uint32_t n_gen = 8192;
  const std::vector<int32_t> prompt = some_tokens(16, 7, true);
  std::map<std::string, int64_t> peak;
  for (const std::string policy : {"sliding_window:512", "full"}) {
    BOOST_TEST_CONTEXT(policy) {
      Rig rig;
      rig.model = model;
      BatchingConfig bc = kv_config(policy);
      bc.kv_memory_mb = 8;
      const int32_t n_blocks = kv_blocks_for(bc, model->limits().kv_bytes_per_token());
      BOOST_REQUIRE_GE(n_blocks, 600);
      ExecutorSpec spec = cpu_spec();
      spec.threads = 2;
      rig.start(bc, n_blocks, spec);
      const auto ids = run_all(rig, {prompt}, n_gen);
      BOOST_TEST(ids.at(0).size() == n_gen);
      const BatcherStats st = rig.stats(rig.batcher);
      peak[policy] = st.blocks_used_peak;
      BOOST_TEST(st.blocks_used == 0);
      BOOST_TEST_MESSAGE(policy << ": peak KV blocks held " << peak[policy] << " of " << n_blocks);
    }
  }
  // The token being written at slot t sees slots (t - 512, t]: 512 slots span at most 33 blocks.
  BOOST_TEST(peak["sliding_window:512"] <= 512 / 16 + 1);
  BOOST_TEST(peak["sliding_window:512"] >= 512 / 16);
  // The cache holds the prompt and every generated token but the last.
  BOOST_TEST(peak["full"] == (16 + n_gen - 1 + 15) / 16);
}

// Issue 5, must show 2 (through the serving path): with W at least the sequence length,
// sliding_window and sinks give exactly full's (llama.cpp's) token ids.
BOOST_AUTO_TEST_CASE(wide_windows_equal_full_attention) {
  const auto cases = reference_cases(64);
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& c : cases) prompts.push_back(c.prompt_token_ids);
  for (const std::string policy : {"sliding_window:512", "sinks:4:500", "sinks:0:100"}) {
    BOOST_TEST_CONTEXT(policy) {
      Rig rig;
      rig.start(kv_config(policy),
                kv_blocks_for(kv_config(policy), stories()->limits().kv_bytes_per_token()),
                cpu_spec());
      const auto ids = run_all(rig, prompts, 64);
      for (size_t i = 0; i < cases.size(); ++i)
        BOOST_TEST(ids[i] == cases[i].generated_token_ids, boost::test_tools::per_element());
      BOOST_TEST(rig.stats(rig.batcher).kv_policy == policy);
    }
  }
}

// A swap by command applies to jobs that arrive afterwards; a policy the model cannot take is
// refused with the reason, and the batcher keeps its policy.
BOOST_AUTO_TEST_CASE(swap_by_command) {
  const auto c = reference_cases(64).at(0);
  // What a batcher that starts under sliding_window:16 generates.
  std::vector<int32_t> windowed;
  {
    Rig rig;
    auto bc = kv_config("sliding_window:16");
    rig.start(bc, kv_blocks_for(bc, stories()->limits().kv_bytes_per_token()), cpu_spec());
    windowed = run_all(rig, {c.prompt_token_ids}, 64).at(0);
  }
  BOOST_TEST(windowed != c.generated_token_ids);  // a 16-token window does change the output

  Rig rig;
  auto bc = kv_config("");
  rig.start(bc, kv_blocks_for(bc, stories()->limits().kv_bytes_per_token()), cpu_spec());
  BOOST_TEST(rig.stats(rig.batcher).kv_policy == "full");
  BOOST_TEST(run_all(rig, {c.prompt_token_ids}, 64).at(0) == c.generated_token_ids,
             boost::test_tools::per_element());

  BOOST_TEST(swap(rig, {policy::KvPolicy::sliding_window, 16, 0}) == "");
  BatcherStats st = rig.stats(rig.batcher);
  BOOST_TEST(st.kv_policy == "sliding_window:16");
  BOOST_TEST(st.policy_swaps == 1);
  BOOST_TEST(run_all(rig, {c.prompt_token_ids}, 64).at(0) == windowed,
             boost::test_tools::per_element());

  // stories260K's GGUF declares a context of 2048: 2000 sinks and a window of 100 cannot be
  // given positions inside it.
  const std::string why = swap(rig, {policy::KvPolicy::sinks, 100, 2000});
  BOOST_TEST(why.find("exceed the model context") != std::string::npos, why);
  BOOST_TEST(rig.stats(rig.batcher).kv_policy == "sliding_window:16");

  BOOST_TEST(swap(rig, {policy::KvPolicy::full, 0, 0}) == "");
  BOOST_TEST(run_all(rig, {c.prompt_token_ids}, 64).at(0) == c.generated_token_ids,
             boost::test_tools::per_element());
  BOOST_TEST(rig.stats(rig.batcher).policy_swaps == 2);
}

// Issue 5, must show 6: a job sharing a 400-token prefix with an earlier one prefills only its
// suffix, and its output equals that of a batcher without the cache.
BOOST_AUTO_TEST_CASE(shared_prefix_prefills_only_the_suffix) {
  const std::vector<int32_t> prefix = some_tokens(400, 11, true);
  const std::vector<int32_t> a = concat(prefix, some_tokens(20, 12, false));
  const std::vector<int32_t> b = concat(prefix, some_tokens(23, 13, false));
  const uint32_t n_gen = 32;

  std::vector<int32_t> b_uncached;
  {
    Rig rig;
    auto bc = kv_config("");
    bc.prefix_cache = false;
    rig.start(bc, kv_blocks_for(bc, stories()->limits().kv_bytes_per_token()), cpu_spec());
    run_all(rig, {a}, n_gen);
    b_uncached = run_all(rig, {b}, n_gen).at(0);
    BOOST_TEST(rig.seen.rbegin()->second.done.cached_tokens == 0u);
  }

  Rig rig;
  auto bc = kv_config("");
  bc.speculative = SpecMode::off;  // fed_tokens counts drafted tokens too
  rig.start(bc, kv_blocks_for(bc, stories()->limits().kv_bytes_per_token()), cpu_spec());
  run_all(rig, {a}, n_gen);
  BOOST_TEST(rig.seen.rbegin()->second.done.cached_tokens == 0u);
  const int64_t fed_before = rig.stats(rig.batcher).fed_tokens;
  const auto b_cached = run_all(rig, {b}, n_gen).at(0);
  const int64_t fed = rig.stats(rig.batcher).fed_tokens - fed_before;

  BOOST_TEST(rig.seen.rbegin()->second.done.cached_tokens == 400u);  // 25 full blocks of 16
  // The suffix, then one token per decode step (the last sampled token is never fed).
  BOOST_TEST(fed == static_cast<int64_t>(b.size() - 400 + n_gen - 1));
  BOOST_TEST(b_cached == b_uncached, boost::test_tools::per_element());
  const BatcherStats st = rig.stats(rig.batcher);
  BOOST_TEST(st.prefix_hit_tokens == 400);
  BOOST_TEST(st.blocks_used == 0);
  BOOST_TEST(st.blocks_cached > 0);
}

// Many jobs over a few shared prefixes in a pool too small for them: blocks are shared, evicted
// and preempted, and every job's output still equals its output without the cache. A block in
// use that was evicted and overwritten would change some output.
BOOST_AUTO_TEST_CASE(eviction_under_pressure_changes_no_output) {
  std::vector<std::vector<int32_t>> prefixes;
  for (uint32_t k = 0; k < 4; ++k) prefixes.push_back(some_tokens(40 + 50 * k, 100 + k, true));
  std::vector<std::vector<int32_t>> prompts;
  for (uint32_t j = 0; j < 20; ++j)
    prompts.push_back(concat(prefixes[j % 4], some_tokens(5 + j % 7, 200 + j, false)));
  const uint32_t n_gen = 24;

  std::vector<std::vector<int32_t>> expected;
  {
    Rig rig;
    auto bc = kv_config("");
    bc.prefix_cache = false;
    rig.start(bc, kv_blocks_for(bc, stories()->limits().kv_bytes_per_token()), cpu_spec());
    expected = run_all(rig, prompts, n_gen);
  }
  Rig rig;
  auto bc = kv_config("");
  // 40 blocks (640 slots): the longest job needs 14, eight running ones would need ~70.
  const int32_t n_blocks = 40;
  rig.start(bc, n_blocks, cpu_spec());
  const auto got = run_all(rig, prompts, n_gen);
  // A second wave finds the first wave's blocks cached (those not evicted since).
  const auto again = run_all(rig, prompts, n_gen);
  for (size_t i = 0; i < prompts.size(); ++i) {
    BOOST_TEST_CONTEXT("prompt " << i) {
      BOOST_TEST(got[i] == expected[i], boost::test_tools::per_element());
      BOOST_TEST(again[i] == expected[i], boost::test_tools::per_element());
    }
  }
  const BatcherStats st = rig.stats(rig.batcher);
  // Read first: a check inside the message stream would interleave with the message itself.
  const int64_t hits = st.prefix_hit_blocks, evictions = st.prefix_evictions,
                preemptions = st.preemptions;
  BOOST_TEST_MESSAGE("prefix hits " << hits << " blocks, evictions " << evictions
                                    << ", preemptions " << preemptions);
  BOOST_TEST(st.prefix_hit_blocks > 0);
  BOOST_TEST(st.prefix_evictions > 0);
  BOOST_TEST(st.blocks_used == 0);
}

// The watermarks: long jobs fill the pool past the high watermark, the batcher swaps to the
// pressure policy (running full jobs move onto it and give blocks back), and swaps back once usage
// falls to the low watermark. Every job completes.
BOOST_AUTO_TEST_CASE(pressure_watermarks_swap_and_swap_back) {
  auto bc = kv_config("full");
  bc.kv_pressure_policy = "sliding_window:32";
  bc.kv_high_watermark = 0.5;
  bc.kv_low_watermark = 0.2;
  Rig rig;
  const int32_t n_blocks = 64;  // 8 jobs of 16 + 150 tokens would need 88 under full
  rig.start(bc, n_blocks, cpu_spec());
  std::vector<std::vector<int32_t>> prompts;
  for (uint32_t j = 0; j < 8; ++j) prompts.push_back(some_tokens(16, 300 + j, true));
  const auto ids = run_all(rig, prompts, 150);
  const BatcherStats st = rig.stats(rig.batcher);
  const int64_t swaps = st.pressure_swaps, preemptions = st.preemptions, peak = st.blocks_used_peak;
  BOOST_TEST_MESSAGE("pressure swaps " << swaps << ", preemptions " << preemptions
                                       << ", peak blocks " << peak);
  BOOST_TEST(st.pressure_swaps >= 2);  // into pressure and back out
  BOOST_TEST(st.pressure == 0);
  BOOST_TEST(st.kv_policy == "full");
  BOOST_TEST(st.blocks_used == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_actors_kv
