// KV layer groups in the batcher, with a real CPU executor on the zoo's gemma2 (a window of 16 on
// its even layers): the window group's blocks held by a decoding sequence stay within what the
// window needs while the full-attention group grows with the sequence, greedy output equals that
// of one group for all layers (batching.layer_window_kv keep), both pools are accounted for at
// admission, and every block goes back when the jobs end.
#include <boost/test/unit_test.hpp>
#include <string>
#include <vector>

#include "policies/kv_policy.hpp"
#include "tests/support/batcher_rig.hpp"

BOOST_AUTO_TEST_SUITE(test_actors_kv_groups)

using namespace sy;
using namespace sy::test;

namespace {

std::shared_ptr<LlamaModel> gemma2() {
  static std::shared_ptr<LlamaModel> m = LlamaModel::load(kModels + "/zoo/zoo-gemma2-f32.gguf");
  return m;
}

constexpr int32_t kWindow = 16;  // the zoo gemma2's attention.sliding_window
constexpr int32_t kBlock = 4;
constexpr uint32_t kChunk = 8;
constexpr uint32_t kGen = 150;  // generated tokens: far past the window

BatchingConfig groups_config() {
  BatchingConfig bc;
  bc.step_token_budget = 64;
  bc.max_sequences = 4;
  bc.prefill_chunk = kChunk;
  bc.kv_block_size = kBlock;
  bc.kv_memory_mb = 4;
  return bc;
}

ExecutorSpec spec() {
  ExecutorSpec e = cpu_spec();
  e.model = gemma2();
  return e;
}

std::vector<int32_t> prompt(int32_t seed) {
  std::vector<int32_t> p = {2};  // BOS
  for (int i = 0; i < 11; ++i) p.push_back((i * 53 + seed * 101 + 7) % gemma2()->limits().n_vocab);
  return p;
}

// The most window-group blocks one sequence of `slots` cached slots can hold.
int64_t window_bound(int64_t slots) {
  const policy::KvPolicy win{policy::KvPolicy::sliding_window, kWindow, 0};
  return policy::max_blocks_held(win, slots, kChunk, kBlock);
}

struct Run {
  std::vector<int32_t> ids;
  int64_t full_peak = 0, window_peak = 0;  // the batcher's blocks_used_peak / window_...
  int64_t most_window_seen = 0;            // window_blocks_used over the stats asked mid-run
  int64_t most_full_seen = 0;              // blocks_used, the same
  BatcherStats end;                        // stats once the job ended
};

// One streamed greedy job; the batcher's stats are asked after every chunk that arrives.
Run run_one(const std::vector<int32_t>& p, bool split) {
  Rig rig;
  rig.model = gemma2();
  const BatchingConfig bc = groups_config();
  const KvPools pools = kv_pools_for(bc, gemma2()->limits(), split);
  rig.window_blocks = pools.n_window_blocks;
  rig.start(bc, pools.n_blocks, spec());
  Job j = rig.job(p, kGen, true);
  j.ignore_eos = true;
  const uint64_t uid = rig.submit(j);
  Run r;
  while (!rig.ended(uid)) {
    BOOST_REQUIRE(rig.receive_one());
    if (rig.ended(uid)) break;
    const BatcherStats s = rig.stats(rig.batcher);
    r.most_window_seen = std::max(r.most_window_seen, s.window_blocks_used);
    r.most_full_seen = std::max(r.most_full_seen, s.blocks_used);
  }
  const Seen& seen = rig.seen[uid];
  BOOST_TEST(seen.errors == 0, seen.error.message);
  r.ids = seen.outcome.done.ids;
  rig.drain();
  r.end = rig.stats(rig.batcher);
  r.full_peak = r.end.blocks_used_peak;
  r.window_peak = r.end.window_blocks_used_peak;
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(pools_are_sized_per_group) {
  const BatchingConfig bc = groups_config();
  const ModelLimits& lim = gemma2()->limits();
  const KvPools one = kv_pools_for(bc, lim, false);
  BOOST_TEST(one.n_window_blocks == 0);
  BOOST_TEST(one.n_blocks == kv_blocks_for(bc, lim.kv_bytes_per_token(bc.kv_dtype)));
  const KvPools two = kv_pools_for(bc, lim, true);
  // max_sequences sequences at the bound of sliding_window:16 over the whole context.
  BOOST_TEST(two.n_window_blocks == 4 * window_bound(lim.ctx_len));
  // The rest of the 4 MiB at the full-attention layers' bytes per block (half of all layers').
  const int64_t full_block = lim.kv_bytes_per_token_full(bc.kv_dtype) * kBlock;
  const int64_t win_block = lim.kv_bytes_per_token_window(bc.kv_dtype) * kBlock;
  BOOST_TEST(two.n_blocks == (4 * 1024 * 1024 - two.n_window_blocks * win_block) / full_block);
  BOOST_TEST(two.n_blocks > one.n_blocks);  // the same memory holds more full-attention blocks
  // One kind of layer: one group even when asked to split.
  BOOST_TEST(kv_pools_for(bc, stories()->limits(), true).n_window_blocks == 0);
}

BOOST_AUTO_TEST_CASE(window_group_stays_bounded_and_output_is_unchanged) {
  const std::vector<int32_t> p = prompt(1);
  const Run keep = run_one(p, false);
  const Run release = run_one(p, true);
  BOOST_REQUIRE_EQUAL(keep.ids.size(), kGen);
  BOOST_TEST(release.ids == keep.ids, boost::test_tools::per_element());

  // The cache holds prompt + kGen - 1 slots at the end (the last sampled token is not fed).
  const int64_t slots = static_cast<int64_t>(p.size()) + kGen - 1;
  const int64_t all_blocks = (slots + kBlock - 1) / kBlock;
  // One group: every block stays, for every layer.
  BOOST_TEST(keep.full_peak == all_blocks);
  BOOST_TEST(keep.end.window_blocks_total == 0);
  // Two groups: the full-attention layers' blocks grow with the sequence as before; the windowed
  // layers' never exceed what the window and one chunk span.
  BOOST_TEST(release.full_peak == all_blocks);
  BOOST_TEST(release.window_peak <= window_bound(slots));
  BOOST_TEST(release.window_peak >= kWindow / kBlock);
  BOOST_TEST(release.most_window_seen <= window_bound(slots));
  BOOST_TEST(release.most_full_seen > 2 * window_bound(slots));  // it did grow meanwhile

  // Everything is back in both pools.
  BOOST_TEST(release.end.blocks_used == 0);
  BOOST_TEST(release.end.window_blocks_used == 0);
  BOOST_TEST(release.end.window_blocks_free == release.end.window_blocks_total);
  BOOST_TEST(release.end.blocks_free == release.end.blocks_total);

  // KV memory of this one sequence at its peak, f16 K/V.
  const ModelLimits& lim = gemma2()->limits();
  const int64_t before = keep.full_peak * kBlock * lim.kv_bytes_per_token();
  const int64_t after = release.full_peak * kBlock * lim.kv_bytes_per_token_full() +
                        release.window_peak * kBlock * lim.kv_bytes_per_token_window();
  BOOST_TEST_MESSAGE("gemma2, " << slots << " slots: KV " << before << " bytes with one group, "
                                << after << " with two");
  BOOST_TEST(after < before);
}

// Admission counts the window pool too: a job that could never fit in it fails at once with a
// message naming it; with room for one sequence's window blocks only, two jobs still both finish
// (one waits or is preempted) with the output each has alone.
BOOST_AUTO_TEST_CASE(admission_accounts_for_the_window_pool) {
  const int64_t per_seq = window_bound(static_cast<int64_t>(prompt(1).size()) + 40 - 1);
  {
    Rig rig;
    rig.model = gemma2();
    rig.window_blocks = static_cast<int32_t>(per_seq - 1);
    rig.start(groups_config(), 200, spec());
    Job j = rig.job(prompt(1), 40, false);
    j.ignore_eos = true;
    const uint64_t uid = rig.submit(j);
    rig.wait_all({uid});
    BOOST_TEST(rig.seen[uid].errors == 1);
    BOOST_TEST(rig.seen[uid].error.message.find("KV blocks of the window group, the executor has " +
                                                std::to_string(per_seq - 1)) != std::string::npos,
               rig.seen[uid].error.message);
  }
  std::vector<std::vector<int32_t>> alone;
  for (int32_t k : {1, 2}) {
    Rig rig;
    rig.model = gemma2();
    rig.window_blocks = static_cast<int32_t>(per_seq);
    rig.start(groups_config(), 200, spec());
    Job j = rig.job(prompt(k), 40, false);
    j.ignore_eos = true;
    const uint64_t uid = rig.submit(j);
    rig.wait_all({uid});
    alone.push_back(rig.seen[uid].outcome.done.ids);
  }
  Rig rig;
  rig.model = gemma2();
  rig.window_blocks = static_cast<int32_t>(per_seq);
  rig.start(groups_config(), 200, spec());
  std::vector<uint64_t> uids;
  for (int32_t k : {1, 2}) {
    Job j = rig.job(prompt(k), 40, false);
    j.ignore_eos = true;
    uids.push_back(rig.submit(j));
  }
  rig.wait_all(uids);
  for (size_t i = 0; i < 2; ++i) {
    BOOST_TEST(rig.seen[uids[i]].errors == 0, rig.seen[uids[i]].error.message);
    BOOST_TEST(rig.seen[uids[i]].outcome.done.ids == alone[i], boost::test_tools::per_element());
  }
  rig.drain();
  const BatcherStats s = rig.stats(rig.batcher);
  BOOST_TEST(s.window_blocks_used_peak <= per_seq);
  BOOST_TEST(s.window_blocks_used == 0);
  BOOST_TEST(s.blocks_used == 0);
}

// Pressure moves a running full job onto sinks:4:8, narrower than the layers' window: the window
// group now needs its sink block, given back earlier under the layers' own window of 16. The job
// is recomputed (a preemption) and finishes; without that the engine would refuse its next step.
BOOST_AUTO_TEST_CASE(pressure_onto_narrow_sinks_recomputes_the_window_group) {
  Rig rig;
  rig.model = gemma2();
  BatchingConfig bc = groups_config();
  bc.kv_pressure_policy = "sinks:4:8";
  // 10 of the 200 full-group blocks held (slot 37 on): far enough for block 0 of the window
  // group to be behind the window of 16.
  bc.kv_high_watermark = 0.05;
  bc.kv_low_watermark = 0.0;
  rig.window_blocks = 28;
  rig.start(bc, 200, spec());
  Job j = rig.job(prompt(1), 80, false);
  j.ignore_eos = true;
  const uint64_t uid = rig.submit(j);
  rig.wait_all({uid});
  BOOST_TEST(rig.seen[uid].errors == 0, rig.seen[uid].error.message);
  BOOST_TEST(rig.seen[uid].outcome.done.ids.size() == 80u);
  rig.drain();
  const BatcherStats s = rig.stats(rig.batcher);
  BOOST_TEST(s.pressure_swaps >= 1);
  BOOST_TEST(s.preemptions == 1);
  BOOST_TEST(s.window_blocks_used == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_actors_kv_groups
