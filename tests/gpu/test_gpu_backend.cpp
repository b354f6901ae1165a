// The serving backend with a device present: auto resolves to cuda, make_engine builds the CUDA
// engine the executors use (f32 for stories260K's F32 file, the KV cache of
// EngineOptions::kv_type), and its greedy step, which picks the ids on the device, gives
// llama.cpp's ids for every reference prompt in one batch, the prompts fed in chunks as a batcher
// would.
#include <boost/test/unit_test.hpp>
#include <string>

#include "gpu/backend.hpp"
#include "tests/gpu/gpu_test.hpp"
#include "tests/support/reference.hpp"
#include "tests/support/stories.hpp"

BOOST_AUTO_TEST_SUITE(test_gpu_backend)

using namespace sy::gputest;

BOOST_TEST_GLOBAL_FIXTURE(RequireGpu);

BOOST_AUTO_TEST_CASE(auto_resolves_to_cuda_with_a_device) {
  std::string why;
  BOOST_TEST((sy::resolve_backend(sy::Backend::automatic, &why) == sy::Backend::cuda));
  BOOST_TEST(why.find("cuda") != std::string::npos, why);
  BOOST_TEST((sy::resolve_backend(sy::Backend::cuda) == sy::Backend::cuda));
  BOOST_TEST((sy::resolve_backend(sy::Backend::cpu) == sy::Backend::cpu));
  BOOST_CHECK_THROW(sy::resolve_backend(static_cast<sy::Backend>(7)), std::invalid_argument);
}

// batching.kv_dtype reaches the CUDA engine: f32 entries take twice the bytes of f16 (the
// default) ones, and q8_0, which only the CPU engine stores, stops the executor with its name.
BOOST_AUTO_TEST_CASE(make_engine_passes_the_kv_type) {
  sy::EngineOptions o;
  o.n_blocks = 64;
  const auto kv_bytes = [&](sy::kernels::DType t) {
    o.kv_type = t;
    const auto e = sy::make_engine(sy::Backend::cuda, sy::test::stories_model(), o, 0);
    return dynamic_cast<const sy::CudaEngine&>(*e).kv_bytes();
  };
  const size_t f16 = kv_bytes(sy::kernels::DType::F16);
  BOOST_TEST(f16 > 0u);
  BOOST_TEST(kv_bytes(sy::kernels::DType::F32) == 2 * f16);
  try {
    kv_bytes(sy::kernels::DType::Q8_0);
    BOOST_FAIL("q8_0 accepted");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(std::string(e.what()).find("batching.kv_dtype q8_0") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_CASE(greedy_steps_on_the_device_give_llamacpp_ids) {
  const auto& cases = sy::test::reference_cases();
  sy::EngineOptions o;
  o.block_size = 16;
  o.n_blocks = 256;
  auto e = sy::make_engine(sy::Backend::cuda, sy::test::stories_model(), o, 0);
  auto cpu = sy::make_engine(sy::Backend::cpu, sy::test::stories_model(), o, 0);
  std::vector<int32_t> unused;
  BOOST_TEST(!cpu->step_greedy({}, unused));  // the CPU engine leaves greedy picks to the host

  std::vector<std::vector<int32_t>> prompts;
  std::vector<size_t> lengths;
  for (const auto& c : cases) {
    prompts.push_back(c.prompt_token_ids);
    lengths.push_back(c.generated_token_ids.size());
  }
  const auto gen =
      sy::test::generate_all(*e, prompts, lengths, 3,
                             [&](const std::vector<sy::SeqStep>& batch, std::vector<int32_t>& ids) {
                               BOOST_REQUIRE(e->step_greedy(batch, ids));
                               BOOST_REQUIRE(ids.size() == batch.size());
                             });
  for (size_t i = 0; i < cases.size(); ++i) {
    BOOST_TEST(gen[i] == cases[i].generated_token_ids, boost::test_tools::per_element());
  }
  BOOST_TEST(e->pool().n_used() == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_gpu_backend
