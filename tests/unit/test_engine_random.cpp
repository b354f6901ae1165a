// Fast path against reference path on random-weight models from make-model, one per weight dtype
// (f32, f16, bf16, q8_0, q4_0): logits agree within the dtype's bound, and f32 greedy tokens are
// identical.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "gpu/engine.hpp"
#include "model/make_model.hpp"
#include "tests/support/temp_dir.hpp"

BOOST_AUTO_TEST_SUITE(test_engine_random)

namespace {

// Named after this test, so that a folder left in /tmp says where it came from.
struct TempDir : sy::test::TempDir {
  TempDir() : sy::test::TempDir("sy_engine_random_") {}
};

std::shared_ptr<sy::LlamaModel> random_model(const TempDir& dir, const std::string& dtype) {
  sy::MakeModelOptions o;
  o.shape = "tiny";
  o.dtype = dtype;
  o.seed = 42;
  o.out = dir.path() + "/tiny-" + dtype + ".gguf";
  sy::make_model(o);
  return sy::LlamaModel::load(o.out);
}

std::unique_ptr<sy::Engine> engine(std::shared_ptr<sy::LlamaModel> m, bool reference) {
  sy::EngineOptions o;
  o.reference = reference;
  o.n_threads = 2;
  o.block_size = 8;
  o.n_blocks = 64;
  return sy::make_cpu_engine(std::move(m), o);
}

int32_t argmax(const float* x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

// Runs two sequences (prompts of 7 and 3 tokens, all logits) then `n_decode` greedy steps on
// both engines in lockstep, both fed the reference path's greedy tokens (so the logits compared
// always share a context). Returns the largest difference relative to the row's largest
// reference logit, and whether the fast path's greedy choices were the same.
struct Compared {
  float worst = 0;
  bool same_tokens = true;
};

Compared compare(sy::Engine& fast, sy::Engine& ref, int n_decode) {
  const int32_t n_vocab = ref.config().n_vocab;
  std::vector<std::vector<int32_t>> tf = {{1, 5, 9, 200, 31, 7, 100}, {1, 77, 3}}, tr = tf;
  std::vector<std::vector<int32_t>> blocks = {{3, 0, 9, 4}, {1, 7, 2, 8, 5}};
  std::vector<int32_t> n_past = {0, 0};
  Compared c;
  for (int step = 0; step <= n_decode; ++step) {
    std::vector<sy::SeqStep> bf, br;
    for (size_t i = 0; i < tf.size(); ++i) {
      for (auto* v : {&tf, &tr}) {
        sy::SeqStep s;
        s.tokens = (*v)[i].data();
        s.n_tokens = static_cast<int32_t>((*v)[i].size());
        s.n_past = n_past[i];
        s.block_table = blocks[i].data();
        s.n_blocks = static_cast<int32_t>(blocks[i].size());
        s.all_logits = step == 0;
        (v == &tf ? bf : br).push_back(s);
      }
    }
    sy::StepOutput a, b;
    fast.step(bf, a);
    ref.step(br, b);
    BOOST_REQUIRE_EQUAL(a.logits.size(), b.logits.size());
    for (size_t r = 0; r * n_vocab < b.logits.size(); ++r) {
      float scale = 1e-6f;
      for (int32_t v = 0; v < n_vocab; ++v)
        scale = std::max(scale, std::abs(b.logits[r * n_vocab + v]));
      for (int32_t v = 0; v < n_vocab; ++v) {
        const size_t k = r * n_vocab + v;
        c.worst = std::max(c.worst, std::abs(a.logits[k] - b.logits[k]) / scale);
      }
    }
    for (size_t i = 0; i < tf.size(); ++i) {
      n_past[i] += static_cast<int32_t>(tf[i].size());
      const int32_t tok = argmax(b.row(i), n_vocab);
      c.same_tokens &= argmax(a.row(i), n_vocab) == tok;
      tf[i].assign(1, tok);
      tr[i].assign(1, tok);
    }
  }
  return c;
}

}  // namespace

BOOST_AUTO_TEST_CASE(fast_matches_reference_for_every_dtype) {
  TempDir dir;
  // Bounds relative to the row's largest logit. For float weights the paths differ only in
  // summation order. For Q8_0/Q4_0 the fast path quantizes activations to Q8_0 (as llama.cpp
  // does) while the reference multiplies them unquantized: about 2% after 2 layers here.
  using sy::kernels::DType;
  struct Case {
    std::string dtype;
    DType type;
    float bound;
  };
  const std::vector<Case> cases = {{"f32", DType::F32, 1e-4f},
                                   {"f16", DType::F16, 1e-4f},
                                   {"bf16", DType::BF16, 1e-4f},
                                   {"q8_0", DType::Q8_0, 5e-2f},
                                   {"q4_0", DType::Q4_0, 5e-2f}};
  for (const auto& [dtype, type, bound] : cases) {
    BOOST_TEST_CONTEXT("dtype " << dtype) {
      auto m = random_model(dir, dtype);
      BOOST_TEST(static_cast<uint32_t>(m->weights().layers[0].wq.type) ==
                 static_cast<uint32_t>(type));
      auto fast = engine(m, false);
      auto ref = engine(m, true);
      const Compared c = compare(*fast, *ref, 24);
      BOOST_TEST_MESSAGE(dtype << ": worst relative logit difference " << c.worst);
      BOOST_TEST(c.worst < bound);
      if (dtype == "f32") BOOST_TEST(c.same_tokens);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()  // test_engine_random
