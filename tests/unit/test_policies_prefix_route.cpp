// Prefix-aware dispatch policy: block chain hashing, the bounded LRU hash index and the
// choice among batchers, table-driven.
#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "policies/prefix_route.hpp"

BOOST_AUTO_TEST_SUITE(test_policies_prefix_route)

using namespace sy::policy;

namespace {

std::vector<int32_t> seq(int32_t from, std::size_t n) {
  std::vector<int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = from + static_cast<int32_t>(i);
  return v;
}

}  // namespace

BOOST_AUTO_TEST_CASE(hashes_cover_full_blocks_only) {
  struct Row {
    std::size_t tokens;
    int32_t block;
    std::size_t max_blocks;
    std::size_t want;
  };
  const Row rows[] = {
      {0, 16, SIZE_MAX, 0},  {15, 16, SIZE_MAX, 0},  {16, 16, SIZE_MAX, 1}, {31, 16, SIZE_MAX, 1},
      {32, 16, SIZE_MAX, 2}, {100, 16, SIZE_MAX, 6}, {100, 16, 3, 3},       {100, 1, SIZE_MAX, 100},
      {100, 0, SIZE_MAX, 0}, {100, -4, SIZE_MAX, 0},
  };
  for (const auto& r : rows) {
    auto t = seq(5, r.tokens);
    BOOST_TEST_CONTEXT("tokens " << r.tokens << " block " << r.block << " max " << r.max_blocks) {
      auto h = prefix_block_hashes(t, r.block, r.max_blocks);
      BOOST_TEST(h.size() == r.want);
      for (auto x : h) BOOST_TEST(x != 0u);
    }
  }
}

BOOST_AUTO_TEST_CASE(hashes_chain_their_prefix) {
  auto a = seq(0, 64);
  auto b = a;
  b[40] = 999;  // third block differs
  auto c = a;
  c[0] = 999;  // first block differs: every later hash must differ too
  auto ha = prefix_block_hashes(a, 16), hb = prefix_block_hashes(b, 16),
       hc = prefix_block_hashes(c, 16);
  BOOST_REQUIRE_EQUAL(ha.size(), 4u);
  BOOST_TEST(ha[0] == hb[0]);
  BOOST_TEST(ha[1] == hb[1]);
  BOOST_TEST(ha[2] != hb[2]);
  BOOST_TEST(ha[3] != hb[3]);  // same tokens, other parent
  for (std::size_t i = 0; i < 4; ++i) BOOST_TEST(ha[i] != hc[i]);
  // Deterministic, and a block's hash depends on its position in the chain.
  BOOST_TEST(prefix_block_hashes(a, 16) == ha);
  std::vector<int32_t> rep(32, 7);
  auto hr = prefix_block_hashes(rep, 16);
  BOOST_TEST(hr[0] != hr[1]);
  // Zero tokens and negative ids hash like any other (no fixed point of the mix).
  std::vector<int32_t> z(16, 0), m(16, -1);
  BOOST_TEST(prefix_block_hashes(z, 16)[0] != prefix_block_hashes(m, 16)[0]);
}

BOOST_AUTO_TEST_CASE(hashes_rarely_collide) {
  std::set<uint64_t> seen;
  for (int32_t s = 0; s < 5000; ++s) {
    auto h = prefix_block_hashes(seq(s, 16), 16);
    seen.insert(h[0]);
  }
  BOOST_TEST(seen.size() == 5000u);
}

BOOST_AUTO_TEST_CASE(index_matches_leading_run) {
  PrefixIndex ix(100);
  auto h = prefix_block_hashes(seq(0, 80), 16);  // 5 blocks
  BOOST_TEST(ix.match(h) == 0u);
  ix.record(std::span<const uint64_t>(h).first(3));
  BOOST_TEST(ix.size() == 3u);
  BOOST_TEST(ix.match(h) == 3u);
  // A prompt that diverges in block 2 matches 2; one that diverges in block 0 matches none.
  auto t = seq(0, 80);
  t[33] = -5;
  BOOST_TEST(ix.match(prefix_block_hashes(t, 16)) == 2u);
  t[0] = -5;
  BOOST_TEST(ix.match(prefix_block_hashes(t, 16)) == 0u);
  // A gap stops the run: holding blocks 1.. but not 0 matches nothing.
  PrefixIndex gap(100);
  gap.record(std::span<const uint64_t>(h).subspan(1));
  BOOST_TEST(gap.match(h) == 0u);
  // Recording again does not duplicate.
  ix.record(h);
  ix.record(h);
  BOOST_TEST(ix.size() == 5u);
  BOOST_TEST(ix.match(h) == 5u);
  ix.clear();
  BOOST_TEST(ix.size() == 0u);
  BOOST_TEST(ix.match(h) == 0u);
}

BOOST_AUTO_TEST_CASE(index_is_bounded_lru) {
  // Capacity 6: two 3-block prompts fit; a third evicts the least recently recorded one.
  PrefixIndex ix(6);
  auto a = prefix_block_hashes(seq(0, 48), 16);
  auto b = prefix_block_hashes(seq(1000, 48), 16);
  auto c = prefix_block_hashes(seq(2000, 48), 16);
  ix.record(a);
  ix.record(b);
  ix.record(a);  // a is fresh again, b is the oldest
  ix.record(c);
  BOOST_TEST(ix.size() == 6u);
  BOOST_TEST(ix.match(a) == 3u);
  BOOST_TEST(ix.match(c) == 3u);
  BOOST_TEST(ix.match(b) == 0u);
  // A long prompt over capacity keeps its leading blocks (the ones every continuation shares).
  PrefixIndex small(4);
  auto d = prefix_block_hashes(seq(0, 160), 16);  // 10 blocks
  small.record(d);
  BOOST_TEST(small.size() == 4u);
  BOOST_TEST(small.match(d) == 4u);
  // Capacity 0 is treated as 1.
  PrefixIndex one(0);
  one.record(d);
  BOOST_TEST(one.capacity() == 1u);
  BOOST_TEST(one.match(d) == 1u);
}

BOOST_AUTO_TEST_CASE(choose_table) {
  struct Row {
    std::string name;
    std::vector<RouteCandidate> cands;
    uint64_t slack;
    std::size_t want;
    bool by_prefix, overruled;
  };
  const std::vector<Row> rows = {
      {"no match: most credit", {{3, 0}, {5, 0}, {4, 0}}, 8, 1, false, false},
      {"no match, tie: first", {{5, 0}, {5, 0}}, 8, 0, false, false},
      {"match within slack", {{10, 0}, {4, 3}}, 8, 1, true, false},
      {"match exactly at slack", {{12, 0}, {4, 3}}, 8, 1, true, false},
      {"match one beyond slack", {{13, 0}, {4, 3}}, 8, 0, false, true},
      {"match but no credit", {{2, 0}, {0, 3}}, 8, 0, false, true},
      {"match on the freest", {{2, 0}, {9, 1}}, 0, 1, true, false},
      {"slack 0: only the freest may win", {{5, 0}, {4, 5}}, 0, 0, false, true},
      {"slack 0, tie in credit", {{5, 0}, {5, 5}}, 0, 1, true, false},
      {"longest match wins", {{6, 1}, {4, 3}, {8, 2}}, 8, 1, true, false},
      {"equal match: more credit", {{4, 2}, {6, 2}, {5, 2}}, 8, 1, true, false},
      {"equal match and credit: first", {{6, 2}, {6, 2}}, 8, 0, true, false},
      {"longest too busy: next longest", {{20, 0}, {1, 9}, {15, 2}}, 8, 2, true, false},
      {"all matches too busy", {{20, 0}, {1, 9}, {11, 2}}, 8, 0, false, true},
      {"huge slack, no underflow", {{1, 0}, {1, 4}}, UINT64_MAX, 1, true, false},
      {"single candidate", {{1, 2}}, 8, 0, true, false},
  };
  for (const auto& r : rows) {
    BOOST_TEST_CONTEXT(r.name) {
      auto d = choose(r.cands, r.slack);
      BOOST_TEST(d.index == r.want);
      BOOST_TEST(d.by_prefix == r.by_prefix);
      BOOST_TEST(d.overruled == r.overruled);
    }
  }
  BOOST_CHECK_THROW(choose(std::vector<RouteCandidate>{}, 8), std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()  // test_policies_prefix_route
