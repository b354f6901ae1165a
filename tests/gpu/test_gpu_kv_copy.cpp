// The CUDA engine's Engine::copy_blocks (copy-on-write of a forked sequence's KV block): a fork
// onto a copied block continues as its original, in the f16 and f32 caches; bad copies are
// refused. The same scenario as the CPU engine's test_engine_kv_copy.
#include <boost/test/unit_test.hpp>
#include <stdexcept>

#include "tests/gpu/gpu_test.hpp"
#include "tests/support/kv_copy_check.hpp"
#include "tests/support/reference.hpp"
#include "tests/support/stories.hpp"

BOOST_AUTO_TEST_SUITE(test_gpu_kv_copy)

using namespace sy::gputest;

BOOST_TEST_GLOBAL_FIXTURE(RequireGpu);

BOOST_AUTO_TEST_CASE(forked_sequence_continues_as_its_original) {
  const std::vector<int32_t> prompt = sy::test::reference_text();
  for (auto kv : {sy::kernels::DType::F16, sy::kernels::DType::F32}) {
    sy::CudaEngineOptions o;
    o.f32_weights = true;
    o.block_size = 8;
    o.n_blocks = 32;
    o.kv_type = kv;
    auto e = sy::make_cuda_engine(sy::test::stories_model(), o);
    const sy::test::KvCopyDiffs d = sy::test::kv_copy_check(*e, prompt);
    BOOST_TEST_MESSAGE("fork " << d.fork << " stale " << d.stale << " fresh " << d.fresh);
    BOOST_TEST(d.fork < 1e-4f);
    BOOST_TEST(d.stale > 1e-2f);
    BOOST_TEST(d.fresh < 2e-2f);
  }
}

BOOST_AUTO_TEST_CASE(bad_copies_are_refused) {
  sy::CudaEngineOptions o;
  o.f32_weights = true;
  o.block_size = 8;
  o.n_blocks = 4;
  auto e = sy::make_cuda_engine(sy::test::stories_model(), o);
  BOOST_CHECK_THROW(e->copy_blocks({sy::KvBlockCopy{0, 4, false}}), std::invalid_argument);
  BOOST_CHECK_THROW(e->copy_blocks({sy::KvBlockCopy{0, 1, true}}), std::invalid_argument);
  BOOST_CHECK_NO_THROW(e->copy_blocks({}));
}

BOOST_AUTO_TEST_SUITE_END()
