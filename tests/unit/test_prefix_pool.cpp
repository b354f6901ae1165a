// PrefixBlockPool tests: sharing, reuse after release, LRU eviction order, refused publishes,
// release errors, caching off, hash quality, and a randomized check against a reference model.
#include <algorithm>
#include <bit>
#include <boost/test/unit_test.hpp>
#include <list>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <unordered_set>
#include <vector>

#include "gpu/prefix_pool.hpp"

BOOST_AUTO_TEST_SUITE(test_prefix_pool)

using sy::PrefixBlockPool;

namespace {

constexpr int32_t kBs = 4;

// Allocates and publishes the full blocks of `tokens` as a finished sequence would; returns the
// block ids (still held).
std::vector<int32_t> fill(PrefixBlockPool& pool, const std::vector<int32_t>& tokens) {
  std::vector<int32_t> ids;
  uint64_t parent = 0;
  for (size_t i = 0; i + kBs <= tokens.size(); i += kBs) {
    const auto id = pool.alloc();
    BOOST_TEST_REQUIRE(id.has_value());
    const uint64_t h = pool.block_hash(parent, tokens.data() + i);
    BOOST_TEST(pool.publish(*id, h, parent, tokens.data() + i));
    ids.push_back(*id);
    parent = h;
  }
  return ids;
}

std::vector<int32_t> acquire(PrefixBlockPool& pool, const std::vector<int32_t>& tokens,
                             int64_t max_blocks = 1'000) {
  std::vector<int32_t> ids;
  std::vector<uint64_t> hashes;
  const int32_t n = pool.acquire_prefix(tokens.data(), static_cast<int64_t>(tokens.size()),
                                        max_blocks, ids, hashes);
  BOOST_TEST(static_cast<size_t>(n) == ids.size());
  BOOST_TEST(hashes.size() == ids.size());
  return ids;
}

void check_counts(const PrefixBlockPool& pool) {
  int32_t held = 0, cached = 0;
  for (int32_t id = 0; id < pool.n_total(); ++id) {
    held += pool.ref_count(id) > 0;
    cached += pool.ref_count(id) == 0 && pool.is_published(id);
  }
  BOOST_TEST(pool.n_held() == held);
  BOOST_TEST(pool.n_cached() == cached);
  BOOST_TEST(pool.n_free() == pool.n_total() - held);
}

}  // namespace

BOOST_AUTO_TEST_CASE(fresh_pool_hands_out_low_ids_and_runs_dry) {
  PrefixBlockPool pool(3, kBs);
  BOOST_TEST(pool.n_free() == 3);
  BOOST_TEST(*pool.alloc() == 0);
  BOOST_TEST(*pool.alloc() == 1);
  BOOST_TEST(*pool.alloc() == 2);
  BOOST_TEST(!pool.alloc().has_value());
  BOOST_TEST(pool.n_held() == 3);
  BOOST_TEST(pool.n_free() == 0);
  pool.release(1);
  BOOST_TEST(*pool.alloc() == 1);  // unpublished: straight back to the free list
  BOOST_TEST(pool.evictions() == 0);
  BOOST_CHECK_THROW(PrefixBlockPool(-1, 4), std::invalid_argument);
  BOOST_CHECK_THROW(PrefixBlockPool(4, 0), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(two_sequences_share_a_prefix) {
  PrefixBlockPool pool(16, kBs);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // two full blocks + 2
  const std::vector<int32_t> ida = fill(pool, a);
  BOOST_TEST(ida.size() == 2u);
  std::vector<int32_t> b = {1, 2, 3, 4, 5, 6, 7, 8, 42, 43, 44, 45};
  const std::vector<int32_t> idb = acquire(pool, b);
  BOOST_TEST(idb == ida, boost::test_tools::per_element());
  BOOST_TEST(pool.ref_count(ida[0]) == 2);
  BOOST_TEST(pool.ref_count(ida[1]) == 2);
  BOOST_TEST(pool.hits() == 2);
  // A different first block shares nothing, even when later blocks agree.
  const std::vector<int32_t> c = {9, 2, 3, 4, 5, 6, 7, 8};
  BOOST_TEST(acquire(pool, c).empty());
  // max_blocks caps the match (the caller keeps its last prompt token to compute).
  BOOST_TEST(acquire(pool, a, 1).size() == 1u);
  BOOST_TEST(pool.ref_count(ida[0]) == 3);
  // A partial block never matches.
  BOOST_TEST(acquire(pool, {1, 2, 3}).empty());
  check_counts(pool);
}

BOOST_AUTO_TEST_CASE(cached_blocks_are_reused_after_release) {
  PrefixBlockPool pool(8, kBs);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int32_t> ida = fill(pool, a);
  for (int32_t id : ida) pool.release(id);
  BOOST_TEST(pool.n_held() == 0);
  BOOST_TEST(pool.n_cached() == 2);
  BOOST_TEST(pool.n_free() == 8);
  const std::vector<int32_t> again = acquire(pool, a);
  BOOST_TEST(again == ida, boost::test_tools::per_element());
  BOOST_TEST(pool.n_held() == 2);
  BOOST_TEST(pool.n_cached() == 0);
  check_counts(pool);
}

BOOST_AUTO_TEST_CASE(eviction_takes_free_blocks_first_then_lru_order) {
  PrefixBlockPool pool(4, kBs);
  const std::vector<int32_t> x = fill(pool, {1, 1, 1, 1});
  const std::vector<int32_t> y = fill(pool, {2, 2, 2, 2});
  const std::vector<int32_t> z = fill(pool, {3, 3, 3, 3});
  pool.release(y[0]);  // least recently used
  pool.release(x[0]);
  pool.release(z[0]);  // most recently used
  BOOST_TEST(pool.n_cached() == 3);
  BOOST_TEST(*pool.alloc() == 3);  // the never-used block before any eviction
  BOOST_TEST(pool.evictions() == 0);
  // Touching x makes it most recent: the order is now y, z, x.
  BOOST_TEST(acquire(pool, {1, 1, 1, 1}).size() == 1u);
  pool.release(x[0]);
  BOOST_TEST(*pool.alloc() == y[0]);
  BOOST_TEST(!pool.is_published(y[0]));
  BOOST_TEST(acquire(pool, {2, 2, 2, 2}).empty());  // gone from the cache
  BOOST_TEST(*pool.alloc() == z[0]);
  BOOST_TEST(*pool.alloc() == x[0]);
  BOOST_TEST(pool.evictions() == 3);
  BOOST_TEST(!pool.alloc().has_value());  // every block held: nothing to evict
  check_counts(pool);
}

BOOST_AUTO_TEST_CASE(held_published_blocks_are_never_evicted) {
  PrefixBlockPool pool(2, kBs);
  const std::vector<int32_t> x = fill(pool, {1, 2, 3, 4});
  BOOST_TEST(*pool.alloc() == 1);
  BOOST_TEST(!pool.alloc().has_value());  // x is published but held
  BOOST_TEST(pool.is_published(x[0]));
}

BOOST_AUTO_TEST_CASE(publish_refusals) {
  PrefixBlockPool pool(4, kBs);
  const std::vector<int32_t> t = {5, 6, 7, 8};
  const uint64_t h = pool.block_hash(0, t.data());
  const int32_t a = *pool.alloc();
  const int32_t b = *pool.alloc();
  BOOST_TEST(pool.publish(a, h, 0, t.data()));
  BOOST_TEST(pool.publish(a, h, 0, t.data()));   // again, same content: harmless
  BOOST_TEST(!pool.publish(b, h, 0, t.data()));  // duplicate content: b stays private
  BOOST_TEST(!pool.is_published(b));
  const std::vector<int32_t> u = {9, 9, 9, 9};
  BOOST_TEST(!pool.publish(a, pool.block_hash(0, u.data()), 0, u.data()));  // a is published
  BOOST_TEST(!pool.publish(2, pool.block_hash(0, u.data()), 0, u.data()));  // 2 is not held
  BOOST_TEST(!pool.publish(-1, 1, 0, u.data()));
  BOOST_TEST(!pool.publish(99, 1, 0, u.data()));
  pool.release(b);  // private: back to the free list, not cached
  BOOST_TEST(pool.n_cached() == 0);
  pool.release(a);
  BOOST_TEST(pool.n_cached() == 1);
  check_counts(pool);
}

BOOST_AUTO_TEST_CASE(release_errors_change_nothing) {
  PrefixBlockPool pool(3, kBs);
  const int32_t a = *pool.alloc();
  BOOST_CHECK_THROW(pool.release(1), std::logic_error);  // never handed out
  BOOST_CHECK_THROW(pool.release(-1), std::logic_error);
  BOOST_CHECK_THROW(pool.release(3), std::logic_error);
  pool.release(a);
  BOOST_CHECK_THROW(pool.release(a), std::logic_error);  // twice
  const std::vector<int32_t> x = fill(pool, {1, 2, 3, 4});
  pool.release(x[0]);
  BOOST_CHECK_THROW(pool.release(x[0]), std::logic_error);  // cached, not held
  BOOST_TEST(pool.n_held() == 0);
  BOOST_TEST(pool.n_cached() == 1);
  BOOST_CHECK_THROW(pool.ref_count(7), std::out_of_range);
  check_counts(pool);
}

BOOST_AUTO_TEST_CASE(caching_off_shares_nothing) {
  PrefixBlockPool pool(4, kBs, false);
  const std::vector<int32_t> t = {1, 2, 3, 4};
  const int32_t a = *pool.alloc();
  BOOST_TEST(!pool.publish(a, pool.block_hash(0, t.data()), 0, t.data()));
  BOOST_TEST(acquire(pool, t).empty());
  pool.release(a);
  BOOST_TEST(pool.n_cached() == 0);
  BOOST_TEST(pool.n_free() == 4);
  BOOST_TEST(pool.hits() == 0);
}

BOOST_AUTO_TEST_CASE(hash_collisions_never_share) {
  // Simulate a collision: block a is published under the hash of other content.
  PrefixBlockPool pool(4, kBs);
  const std::vector<int32_t> real = {1, 2, 3, 4}, other = {4, 3, 2, 1};
  const int32_t a = *pool.alloc();
  BOOST_TEST(pool.publish(a, pool.block_hash(0, other.data()), 0, real.data()));
  BOOST_TEST(acquire(pool, other).empty());
  // Same content but published as the child of another chain: not a match for a first block.
  const int32_t b = *pool.alloc();
  const std::vector<int32_t> t = {7, 7, 7, 7};
  BOOST_TEST(pool.publish(b, pool.block_hash(0, t.data()), 12345, t.data()));
  BOOST_TEST(acquire(pool, t).empty());
  BOOST_TEST(pool.hits() == 0);
}

BOOST_AUTO_TEST_CASE(hash_mixes_well) {
  PrefixBlockPool pool(1, 16);
  std::mt19937_64 rng(7);
  std::unordered_set<uint64_t> seen;
  std::vector<int32_t> t(16);
  double flipped = 0;
  const int n = 20'000;
  for (int i = 0; i < n; ++i) {
    for (int32_t& v : t) v = static_cast<int32_t>(rng() % 32'000);
    const uint64_t parent = (i % 3 == 0) ? 0 : rng();
    const uint64_t h = pool.block_hash(parent, t.data());
    BOOST_TEST_REQUIRE(h != 0u);
    seen.insert(h);
    // One token changed by one bit, or the parent by one bit: about half the bits change.
    std::vector<int32_t> u = t;
    u[rng() % 16] ^= 1 << (rng() % 15);
    flipped += std::popcount(h ^ pool.block_hash(parent, u.data()));
    flipped += std::popcount(h ^ pool.block_hash(parent ^ (uint64_t{1} << (rng() % 64)), t.data()));
  }
  BOOST_TEST(seen.size() > static_cast<size_t>(n) - 3);  // random blocks: (near-)distinct
  const double mean = flipped / (2.0 * n);
  BOOST_TEST(mean > 31.0);
  BOOST_TEST(mean < 33.0);
  // Order matters, and token 0 is not a no-op.
  const std::vector<int32_t> p = {1, 2, 0, 0}, q = {2, 1, 0, 0}, z = {1, 2, 0, 1};
  PrefixBlockPool four(1, 4);
  BOOST_TEST(four.block_hash(0, p.data()) != four.block_hash(0, q.data()));
  BOOST_TEST(four.block_hash(0, p.data()) !=
             four.block_hash(four.block_hash(0, p.data()), p.data()));
  BOOST_TEST(four.block_hash(0, p.data()) != four.block_hash(0, z.data()));
}

// Randomized model check: a simulated batcher starts sequences (acquire the cached prefix, alloc
// the rest), finishes them (publish their full blocks), releases them, and misuses the pool now
// and then, while a plain reference model predicts every answer.
namespace {

struct Model {
  struct Blk {
    int32_t refs = 0;
    bool published = false;
    std::vector<int32_t> prefix;  // every token up to the end of this block, when published
  };
  std::vector<Blk> b;
  std::list<int32_t> lru;  // cached blocks, front: least recently used
  std::map<std::vector<int32_t>, int32_t> by_prefix;
  int64_t hits = 0, evictions = 0;
  explicit Model(int32_t n) : b(static_cast<size_t>(n)) {}
};

struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
  std::vector<bool> published;
};

}  // namespace

BOOST_AUTO_TEST_CASE(randomized_against_reference_model) {
  for (uint64_t seed : {1u, 2u, 3u, 4u}) {
    const int32_t n_blocks = 24;
    PrefixBlockPool pool(n_blocks, kBs);
    Model m(n_blocks);
    std::mt19937_64 rng(seed);
    auto pick = [&](uint64_t n) { return static_cast<int64_t>(rng() % n); };
    // A few shared "documents" over a tiny alphabet, so prefixes and block contents repeat.
    std::vector<std::vector<int32_t>> docs(4);
    for (auto& d : docs)
      for (int i = 0; i < 32; ++i) d.push_back(static_cast<int32_t>(pick(3)));
    std::vector<Seq> live;
    std::vector<int32_t> loose;  // private blocks held outside any sequence

    auto model_alloc = [&](std::optional<int32_t> got) {
      bool any_free = false;
      for (const auto& x : m.b) any_free |= x.refs == 0 && !x.published;
      if (any_free) {
        BOOST_TEST_REQUIRE(got.has_value());
        const auto& x = m.b[static_cast<size_t>(*got)];
        BOOST_TEST_REQUIRE((x.refs == 0 && !x.published));
      } else if (!m.lru.empty()) {
        BOOST_TEST_REQUIRE(got.has_value());
        BOOST_TEST_REQUIRE(*got == m.lru.front());  // least recently used goes first
        m.lru.pop_front();
        auto& x = m.b[static_cast<size_t>(*got)];
        m.by_prefix.erase(x.prefix);
        x.published = false;
        x.prefix.clear();
        ++m.evictions;
      } else {
        BOOST_TEST_REQUIRE(!got.has_value());  // every block held
        return;
      }
      m.b[static_cast<size_t>(*got)].refs = 1;
    };
    auto model_release = [&](int32_t id) {
      auto& x = m.b[static_cast<size_t>(id)];
      if (--x.refs == 0 && x.published) m.lru.push_back(id);
    };
    auto release_seq = [&](Seq& s) {
      // Release in a random order, as preemption or completion might.
      std::shuffle(s.blocks.begin(), s.blocks.end(), rng);
      for (int32_t id : s.blocks) {
        pool.release(id);
        model_release(id);
      }
    };

    for (int step = 0; step < 6'000; ++step) {
      const int64_t op = pick(100);
      if (op < 35) {  // start a sequence
        Seq s;
        const auto& d = docs[static_cast<size_t>(pick(docs.size()))];
        const int64_t keep = pick(d.size() + 1);
        s.tokens.assign(d.begin(), d.begin() + keep);
        const int64_t extra = pick(12);
        for (int64_t i = 0; i < extra; ++i) s.tokens.push_back(static_cast<int32_t>(pick(3)));
        if (s.tokens.empty()) s.tokens.push_back(0);
        const int64_t n = static_cast<int64_t>(s.tokens.size());
        const int64_t max_blocks = (n - 1) / kBs;
        std::vector<uint64_t> hashes;
        const int32_t found = pool.acquire_prefix(s.tokens.data(), n, max_blocks, s.blocks, hashes);
        // The model's answer: the longest run of leading blocks whose whole prefix is published.
        int32_t expect = 0;
        for (int64_t j = 0; j < max_blocks; ++j) {
          const std::vector<int32_t> key(s.tokens.begin(), s.tokens.begin() + (j + 1) * kBs);
          const auto it = m.by_prefix.find(key);
          if (it == m.by_prefix.end()) break;
          BOOST_TEST_REQUIRE(s.blocks.size() > static_cast<size_t>(j));
          BOOST_TEST_REQUIRE(s.blocks[static_cast<size_t>(j)] == it->second);
          // Only blocks whose stored content equals the request are returned.
          BOOST_TEST_REQUIRE((m.b[static_cast<size_t>(it->second)].prefix == key));
          auto& x = m.b[static_cast<size_t>(it->second)];
          if (x.refs++ == 0) m.lru.remove(it->second);
          ++expect;
        }
        BOOST_TEST_REQUIRE(found == expect);
        m.hits += found;
        s.published.assign(static_cast<size_t>(found), true);
        const int64_t need = (n + kBs - 1) / kBs;
        bool ok = true;
        while (static_cast<int64_t>(s.blocks.size()) < need) {
          const auto got = pool.alloc();
          if (got) {  // a held block is never handed out
            for (const Seq& o : live)
              BOOST_TEST_REQUIRE(
                  (std::find(o.blocks.begin(), o.blocks.end(), *got) == o.blocks.end()));
            BOOST_TEST_REQUIRE((std::find(loose.begin(), loose.end(), *got) == loose.end()));
            BOOST_TEST_REQUIRE(
                (std::find(s.blocks.begin(), s.blocks.end(), *got) == s.blocks.end()));
          }
          model_alloc(got);
          if (!got) {
            ok = false;
            break;
          }
          s.blocks.push_back(*got);
          s.published.push_back(false);
        }
        if (ok)
          live.push_back(std::move(s));
        else
          release_seq(s);                     // out of blocks: give everything back
      } else if (op < 60 && !live.empty()) {  // finish computing: publish the full blocks
        Seq& s = live[static_cast<size_t>(pick(live.size()))];
        uint64_t parent = 0;
        for (size_t j = 0; (j + 1) * kBs <= s.tokens.size(); ++j) {
          const int32_t* t = s.tokens.data() + j * kBs;
          const uint64_t h = pool.block_hash(parent, t);
          if (!s.published[j]) {
            const std::vector<int32_t> key(s.tokens.begin(), s.tokens.begin() + (j + 1) * kBs);
            const int32_t id = s.blocks[j];
            const bool expect = m.by_prefix.count(key) == 0;
            BOOST_TEST_REQUIRE(pool.publish(id, h, parent, t) == expect);
            if (expect) {
              m.by_prefix.emplace(key, id);
              m.b[static_cast<size_t>(id)].published = true;
              m.b[static_cast<size_t>(id)].prefix = key;
            }
            s.published[j] = true;  // published or a private duplicate: done either way
          }
          parent = h;
        }
      } else if (op < 85 && !live.empty()) {  // the sequence ends
        const size_t i = static_cast<size_t>(pick(live.size()));
        release_seq(live[i]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (op < 92) {  // a loose private block comes or goes
        if (!loose.empty() && pick(2) == 0) {
          pool.release(loose.back());
          model_release(loose.back());
          loose.pop_back();
        } else {
          const auto got = pool.alloc();
          model_alloc(got);
          if (got) loose.push_back(*got);
        }
      } else {  // misuse: releasing a block that is not held throws and changes nothing
        const int32_t id = static_cast<int32_t>(pick(n_blocks + 2)) - 1;
        const bool held = id >= 0 && id < n_blocks && m.b[static_cast<size_t>(id)].refs > 0;
        if (!held) BOOST_CHECK_THROW(pool.release(id), std::logic_error);
      }

      // Invariants after every step.
      int32_t held = 0, cached = 0;
      for (int32_t id = 0; id < n_blocks; ++id) {
        const auto& x = m.b[static_cast<size_t>(id)];
        BOOST_TEST_REQUIRE(pool.ref_count(id) == x.refs);
        BOOST_TEST_REQUIRE(pool.is_published(id) == x.published);
        held += x.refs > 0;
        cached += x.refs == 0 && x.published;
      }
      BOOST_TEST_REQUIRE(pool.n_held() == held);
      BOOST_TEST_REQUIRE(pool.n_cached() == cached);
      BOOST_TEST_REQUIRE(pool.n_free() == n_blocks - held);
      BOOST_TEST_REQUIRE(static_cast<size_t>(cached) == m.lru.size());
      BOOST_TEST_REQUIRE(pool.hits() == m.hits);
      BOOST_TEST_REQUIRE(pool.evictions() == m.evictions);
    }
    // The run exercised the interesting paths.
    BOOST_TEST(m.hits > 100);
    BOOST_TEST(m.evictions > 20);
    for (Seq& s : live) release_seq(s);
    for (int32_t id : loose) pool.release(id);
    BOOST_TEST(pool.n_held() == 0);
  }
}

BOOST_AUTO_TEST_SUITE_END()  // test_prefix_pool
