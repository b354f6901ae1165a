// KvManager::fork and copy_on_write: forked tables share every block by reference; a fork that
// writes into a shared, partly filled block copies it first (or, with no block free, gives it
// back and recomputes its slots); the last holder writes in place.
#include <boost/test/unit_test.hpp>
#include <vector>

#include "gpu/kv_manager.hpp"

BOOST_AUTO_TEST_SUITE(test_kv_manager_fork)

using sy::KvBlockCopyPlan;
using sy::KvManager;
using sy::KvTables;

namespace {
// A sequence of `n` computed tokens in fresh blocks.
KvTables filled(KvManager& kv, int32_t n) {
  KvTables t;
  while (static_cast<int32_t>(t.blocks.size()) * kv.block_size() < n)
    BOOST_REQUIRE(kv.grow(t, false));
  t.n_past = n;
  return t;
}
}  // namespace

BOOST_AUTO_TEST_CASE(forks_share_blocks_and_copy_the_partly_filled_one) {
  KvManager kv(16, 0, 4, false, 0);
  KvTables lead = filled(kv, 6);  // blocks 0 (full) and 1 (2 of 4 slots)
  BOOST_TEST(kv.pool().n_held() == 2);
  std::vector<KvTables> forks;
  for (int i = 0; i < 3; ++i) forks.push_back(kv.fork(lead));
  BOOST_TEST(kv.pool().ref_count(lead.blocks[0]) == 4);
  kv.free(lead);
  BOOST_TEST(kv.pool().n_held() == 2);  // shared, not copied
  std::vector<KvBlockCopyPlan> copies;
  for (KvTables& f : forks) kv.copy_on_write(f, f.n_past, copies);
  // Two forks copied block 1; the third found it its own and writes in place.
  BOOST_REQUIRE(copies.size() == 2u);
  for (const KvBlockCopyPlan& c : copies) {
    BOOST_TEST(c.src == forks[2].blocks[1]);
    BOOST_TEST(!c.window);
  }
  BOOST_TEST(forks[0].blocks[1] == copies[0].dst);
  BOOST_TEST(forks[1].blocks[1] == copies[1].dst);
  BOOST_TEST(forks[0].blocks[0] == forks[2].blocks[0]);  // the full block stays shared
  BOOST_TEST(kv.pool().ref_count(forks[0].blocks[0]) == 3);
  BOOST_TEST(kv.pool().n_held() == 4);
  for (const KvTables& f : forks) BOOST_TEST(f.n_past == 6);
  for (KvTables& f : forks) kv.free(f);
  BOOST_TEST(kv.pool().n_held() == 0);
}

BOOST_AUTO_TEST_CASE(a_block_boundary_needs_no_copy) {
  KvManager kv(16, 0, 4, false, 0);
  KvTables lead = filled(kv, 8);  // two full blocks: the forks' next slot starts a new one
  KvTables a = kv.fork(lead), b = kv.fork(lead);
  kv.free(lead);
  std::vector<KvBlockCopyPlan> copies;
  BOOST_TEST(!kv.copy_on_write(a, a.n_past, copies));
  BOOST_TEST(!kv.copy_on_write(b, b.n_past, copies));
  BOOST_TEST(copies.empty());
  BOOST_TEST(kv.pool().n_held() == 2);
}

BOOST_AUTO_TEST_CASE(without_a_free_block_a_fork_recomputes_the_shared_block) {
  KvManager kv(2, 0, 4, false, 0);
  KvTables lead = filled(kv, 6);  // the whole pool
  KvTables a = kv.fork(lead);
  kv.free(lead);
  KvTables b = kv.fork(a);
  std::vector<KvBlockCopyPlan> copies;
  BOOST_TEST(!kv.copy_on_write(a, a.n_past, copies));
  BOOST_TEST(copies.empty());
  BOOST_TEST(a.n_past == 4);  // back to the shared full block; slots 4 and 5 computed again
  BOOST_TEST(a.blocks.size() == 1u);
  BOOST_TEST(kv.pool().ref_count(b.blocks[1]) == 1);  // b owns the partly filled block now
  BOOST_TEST(!kv.copy_on_write(b, b.n_past, copies));
  BOOST_TEST(b.n_past == 6);
  kv.free(a);
  kv.free(b);
  BOOST_TEST(kv.pool().n_held() == 0);
}

BOOST_AUTO_TEST_SUITE_END()
