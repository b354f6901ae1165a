// The CPU engine's Engine::copy_blocks: a sequence forked onto a copied block continues exactly
// as its original (and not as before the copy), in every KV type; bad copies are refused.
#include <boost/test/unit_test.hpp>
#include <stdexcept>

#include "tests/support/kv_copy_check.hpp"
#include "tests/support/reference.hpp"
#include "tests/support/stories.hpp"

BOOST_AUTO_TEST_SUITE(test_engine_kv_copy)

BOOST_AUTO_TEST_CASE(forked_sequence_continues_as_its_original) {
  for (auto kv : {sy::kernels::DType::F32, sy::kernels::DType::F16}) {
    for (bool reference : {false, true}) {
      sy::EngineOptions o;
      o.block_size = 8;
      o.n_blocks = 32;
      o.kv_type = kv;
      o.reference = reference;
      auto e = sy::make_cpu_engine(sy::test::stories_model(), o);
      const sy::test::KvCopyDiffs d = sy::test::kv_copy_check(*e, sy::test::reference_text());
      BOOST_TEST_MESSAGE("fork " << d.fork << " stale " << d.stale << " fresh " << d.fresh);
      BOOST_TEST(d.fork == 0.0f);   // the same KV, the same arithmetic
      BOOST_TEST(d.stale > 1e-2f);  // the copy changed what the fork reads
      BOOST_TEST(d.fresh < 1e-3f);
      BOOST_TEST(e->pool().n_used() == 0);
    }
  }
}

BOOST_AUTO_TEST_CASE(bad_copies_are_refused) {
  sy::EngineOptions o;
  o.block_size = 8;
  o.n_blocks = 4;
  auto e = sy::make_cpu_engine(sy::test::stories_model(), o);
  BOOST_CHECK_THROW(e->copy_blocks({sy::KvBlockCopy{0, 4, false}}), std::invalid_argument);
  BOOST_CHECK_THROW(e->copy_blocks({sy::KvBlockCopy{-1, 2, false}}), std::invalid_argument);
  BOOST_CHECK_THROW(e->copy_blocks({sy::KvBlockCopy{1, 1, false}}), std::invalid_argument);
  BOOST_CHECK_THROW(e->copy_blocks({sy::KvBlockCopy{0, 1, true}}), std::invalid_argument);
  BOOST_CHECK_NO_THROW(e->copy_blocks({}));
}

BOOST_AUTO_TEST_SUITE_END()
