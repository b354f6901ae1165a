// KvManager: block tables over the pools, trimming under a KV policy (and the window group's own
// window), prefix reuse and publishing through the prefix cache, the fit check.
#include <boost/test/unit_test.hpp>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/kv_manager.hpp"

BOOST_AUTO_TEST_SUITE(test_kv_manager)

using sy::KvManager;
using sy::KvTables;
using sy::policy::KvPolicy;

namespace {

std::vector<int32_t> iota(int32_t n, int32_t from = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

// Gives `t` blocks for `n` tokens in the full group (and the window group with `window`), as
// the batcher does for a step, and marks them computed.
void fill(KvManager& kv, KvTables& t, int32_t n, bool window = false) {
  const size_t need = static_cast<size_t>((t.n_past + n + kv.block_size() - 1) / kv.block_size());
  while (t.blocks.size() < need) BOOST_REQUIRE(kv.grow(t, false));
  while (window && t.wblocks.size() < need) BOOST_REQUIRE(kv.grow(t, true));
  t.n_past += n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(trim_releases_blocks_behind_a_sliding_window) {
  KvManager kv(8, 0, 4, true, 0);
  KvTables t;
  t.policy = {KvPolicy::sliding_window, 8, 0};
  fill(kv, t, 16);
  kv.trim(t);
  // Slot 16 attends to (8, 16]: blocks 0 and 1 (slots 0..7) are never seen again.
  BOOST_TEST(t.blocks == std::vector<int32_t>({-1, -1, 2, 3}));
  BOOST_TEST(t.held() == 2);
  BOOST_TEST(kv.pool().n_held() == 2);
  BOOST_TEST(kv.peak() == 4);
  kv.free(t);
  BOOST_TEST(kv.pool().n_held() == 0);
  BOOST_TEST(t.n_past == 0);
  BOOST_TEST(t.blocks.empty());
}

BOOST_AUTO_TEST_CASE(full_attention_keeps_every_block) {
  KvManager kv(8, 0, 4, true, 0);
  KvTables t;
  fill(kv, t, 16);
  kv.trim(t);
  BOOST_TEST(t.held() == 4);
}

BOOST_AUTO_TEST_CASE(published_blocks_are_reused_by_a_later_prompt) {
  KvManager kv(16, 0, 4, true, 0);
  const std::vector<int32_t> a = iota(12);
  KvTables ta;
  fill(kv, ta, 12);
  kv.publish(ta, a);
  BOOST_TEST(ta.hashes.size() == 3u);  // the three full blocks of 12 cached tokens
  const std::vector<int32_t> blocks_a = ta.blocks;
  kv.free(ta);
  BOOST_TEST(kv.pool().n_cached() == 3);

  // Same first 8 tokens, then others: two blocks shared.
  std::vector<int32_t> b = iota(8);
  for (int32_t x : iota(6, 100)) b.push_back(x);
  KvTables tb;
  const std::vector<int32_t> peek = kv.peek_prefix(tb, b);
  BOOST_TEST(peek == std::vector<int32_t>({blocks_a[0], blocks_a[1]}));
  BOOST_TEST(kv.pool().n_cached() == 3);  // a peek takes nothing
  kv.reuse_prefix(tb, b);
  BOOST_TEST(tb.blocks == peek);
  BOOST_TEST(tb.n_past == 8);
  BOOST_TEST(kv.pool().n_cached() == 1);
}

BOOST_AUTO_TEST_CASE(reuse_leaves_the_last_token_to_compute) {
  KvManager kv(16, 0, 4, true, 0);
  const std::vector<int32_t> a = iota(8);
  KvTables ta;
  fill(kv, ta, 8);
  kv.publish(ta, a);
  KvTables tb;
  kv.reuse_prefix(tb, a);  // the same 8 tokens: block 1 would leave nothing to compute
  BOOST_TEST(tb.n_past == 4);
  BOOST_TEST(tb.blocks.size() == 1u);
  BOOST_TEST(kv.pool().ref_count(tb.blocks[0]) == 2);  // shared with ta
}

BOOST_AUTO_TEST_CASE(windowed_sequences_share_only_below_their_horizon) {
  KvManager kv(16, 0, 4, true, 0);
  const std::vector<int32_t> a = iota(16);
  KvTables ta;
  fill(kv, ta, 16);
  kv.publish(ta, a);
  KvTables tb;
  tb.policy = {KvPolicy::sliding_window, 4, 0};
  kv.reuse_prefix(tb, a);
  BOOST_TEST(tb.n_past == 4);  // the window's horizon: 4 slots, one block
  // ... and publishes nothing beyond it.
  KvTables tc;
  tc.policy = {KvPolicy::sliding_window, 4, 0};
  std::vector<int32_t> c = iota(16, 50);
  fill(kv, tc, 16);
  kv.publish(tc, c);
  BOOST_TEST(tc.hashes.size() == 1u);
}

BOOST_AUTO_TEST_CASE(peek_with_known_hashes_matches_a_fresh_lookup) {
  KvManager kv(16, 0, 4, true, 0);
  const std::vector<int32_t> a = iota(13);
  KvTables ta;
  fill(kv, ta, 12);
  kv.publish(ta, a);  // ta.hashes: its own chain
  KvTables fresh;
  BOOST_TEST(kv.peek_prefix(ta, a) == kv.peek_prefix(fresh, a));
  BOOST_TEST(kv.peek_prefix(ta, a).size() == 3u);
}

BOOST_AUTO_TEST_CASE(window_group_trims_under_the_layers_window) {
  // Two groups: windowed layers of window 4; no prefix reuse then.
  KvManager kv(8, 8, 4, true, 4);
  BOOST_TEST(kv.split());
  KvTables t;
  fill(kv, t, 12, /*window=*/true);
  kv.trim(t);
  BOOST_TEST(t.blocks == std::vector<int32_t>({0, 1, 2}));     // full attention: all
  BOOST_TEST(t.wblocks == std::vector<int32_t>({-1, -1, 2}));  // slot 12 sees (8, 12]
  BOOST_TEST(kv.window_pool().n_held() == 1);
  BOOST_TEST(kv.window_peak() == 3);
  kv.publish(t, iota(12));
  KvTables u;
  kv.reuse_prefix(u, iota(12));
  BOOST_TEST(u.n_past == 0);
}

BOOST_AUTO_TEST_CASE(a_narrower_sink_policy_finds_its_window_blocks_lost) {
  KvManager kv(8, 8, 4, false, 8);
  KvTables t;
  fill(kv, t, 16, /*window=*/true);
  kv.trim(t);  // under the layers' window of 8: window blocks 0 and 1 go
  BOOST_TEST(t.wblocks == std::vector<int32_t>({-1, -1, 2, 3}));
  BOOST_TEST(!kv.window_blocks_lost(t));
  t.policy = {KvPolicy::sinks, 4, 4};  // needs the sink block 0 again
  BOOST_TEST(kv.window_blocks_lost(t));
}

BOOST_AUTO_TEST_CASE(grow_reports_a_dry_pool) {
  KvManager kv(2, 0, 4, true, 0);
  KvTables t;
  BOOST_TEST(kv.grow(t, false));
  BOOST_TEST(kv.grow(t, false));
  BOOST_TEST(!kv.grow(t, false));
  BOOST_TEST(t.blocks.size() == 2u);
}

BOOST_AUTO_TEST_CASE(fit_check_names_the_numbers) {
  KvManager kv(4, 0, 4, true, 0);
  BOOST_TEST(kv.check_fits(10, 7, {}, 256) == "");  // 16 slots: 4 blocks
  BOOST_TEST(kv.check_fits(10, 10, {}, 256) ==
             "prompt (10 tokens) + max_tokens (10) needs 5 KV blocks, the executor has 4");
  // A sliding window holds the window plus one chunk: far fewer blocks.
  BOOST_TEST(kv.check_fits(100, 100, {KvPolicy::sliding_window, 4, 0}, 4) == "");
  KvManager split(8, 2, 4, false, 4);
  BOOST_TEST(split.check_fits(20, 1, {}, 8) ==
             "prompt (20 tokens) + max_tokens (1) needs 4 KV blocks of the window group, the "
             "executor has 2");
}

BOOST_AUTO_TEST_CASE(two_groups_need_a_layer_window) {
  BOOST_CHECK_EXCEPTION(KvManager(8, 8, 4, true, 0), std::invalid_argument,
                        [](const std::invalid_argument& e) {
                          return std::string(e.what()) ==
                                 "batcher: window_blocks given for a model whose layers are not "
                                 "of two kinds";
                        });
}

BOOST_AUTO_TEST_SUITE_END()  // test_kv_manager
