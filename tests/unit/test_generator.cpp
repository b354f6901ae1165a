// Generation driver tests on stories260K: llama.cpp's greedy continuations, batch and chunking
// independence, stop strings, length limits, streaming deltas, seeded sampling and KV accounting.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/engine.hpp"
#include "gpu/generator.hpp"
#include "model/llama.hpp"
#include "tests/support/reference.hpp"

BOOST_AUTO_TEST_SUITE(test_generator)

using namespace sy;

namespace {

const std::string kModels = SY_MODELS_DIR;

// One engine for the whole file: loading is cheap but the pool is shared state worth checking.
struct Fixture {
  std::shared_ptr<LlamaModel> model;
  std::unique_ptr<Engine> engine;
  Fixture() {
    model = LlamaModel::load(kModels + "/stories260K.gguf");
    EngineOptions o;
    o.n_threads = 2;
    engine = make_cpu_engine(model, o);
  }
};

// Forwards to a real engine but makes the end-of-generation token the sure pick of every
// sequence's logits at one chosen step: stories260K itself never emits EOS.
class EosAtStep : public Engine {
 public:
  EosAtStep(Engine& inner, int at_step) : inner_(inner), at_(at_step) {}
  const LlamaConfig& config() const override { return inner_.config(); }
  const LlamaModel& model() const override { return inner_.model(); }
  int32_t block_size() const override { return inner_.block_size(); }
  BlockPool& pool() override { return inner_.pool(); }
  void step(const std::vector<SeqStep>& batch, StepOutput& out) override {
    inner_.step(batch, out);
    if (++n_ != at_) return;
    const int32_t eos = inner_.model().tokenizer().eos();
    for (size_t i = 0; i < batch.size(); ++i) const_cast<float*>(out.row(i))[eos] = 1e9f;
  }

 private:
  Engine& inner_;
  int at_;
  int n_ = 0;
};

GenRequest greedy(const std::vector<int32_t>& prompt, int n) {
  GenRequest r;
  r.prompt = prompt;
  r.max_tokens = n;
  return r;
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(generator, Fixture)

BOOST_AUTO_TEST_CASE(greedy_matches_llamacpp) {
  for (const auto& c : test::reference_cases()) {
    const int n = c.n_predict;
    BOOST_TEST_CONTEXT(c.prompt << " n=" << n) {
      auto res = generate(*engine, {greedy(c.prompt_token_ids, n)});
      BOOST_TEST_REQUIRE(res.size() == 1u);
      BOOST_TEST(res[0].tokens == c.generated_token_ids, boost::test_tools::per_element());
      BOOST_TEST(res[0].text == c.generated_text);
      BOOST_TEST(res[0].finish_reason == "length");
      BOOST_TEST(res[0].prompt_tokens == static_cast<int>(c.prompt_token_ids.size()));
      // llama.cpp's log-probabilities of the chosen tokens. Its KV cache is f16 (ours f32), which
      // moves them by up to ~6e-3 here; a wrong normalization would be off by far more.
      const auto& lp = c.top1_logprobs;
      BOOST_TEST_REQUIRE(res[0].token_logprob.size() == lp.size());
      for (size_t i = 0; i < lp.size(); ++i)
        BOOST_TEST(std::abs(res[0].token_logprob[i] - lp[i]) < 1e-2);
    }
  }
  BOOST_TEST(engine->pool().n_used() == 0);
}

BOOST_AUTO_TEST_CASE(batch_and_chunking_change_nothing) {
  std::vector<GenRequest> reqs;
  std::vector<std::vector<int32_t>> expect;
  for (const char* p : {"Once upon a time", "Lily and Tom", "The cat"}) {
    const auto& c = test::reference_case(p, 64);
    reqs.push_back(greedy(c.prompt_token_ids, 64));
    expect.push_back(c.generated_token_ids);
  }
  // Different lengths so sequences finish at different steps and the batch shrinks.
  reqs[1].max_tokens = 40;
  expect[1].resize(40);
  auto together = generate(*engine, reqs);
  GenOptions chunk3;
  chunk3.prefill_chunk = 3;
  auto chunked = generate(*engine, reqs, chunk3);
  BOOST_TEST_REQUIRE(together.size() == 3u);
  for (size_t i = 0; i < 3; ++i) {
    auto alone = generate(*engine, {reqs[i]});
    BOOST_TEST(together[i].tokens == expect[i], boost::test_tools::per_element());
    BOOST_TEST(together[i].tokens == alone[0].tokens, boost::test_tools::per_element());
    BOOST_TEST(together[i].text == alone[0].text);
    BOOST_TEST(chunked[i].tokens == alone[0].tokens, boost::test_tools::per_element());
    for (size_t k = 0; k < alone[0].token_logprob.size(); ++k)
      BOOST_TEST(std::abs(together[i].token_logprob[k] - alone[0].token_logprob[k]) < 1e-4);
  }
  BOOST_TEST(engine->pool().n_used() == 0);
}

BOOST_AUTO_TEST_CASE(stop_string_cuts_the_text) {
  const auto& c = test::reference_case("Once upon a time", 64);
  const std::string full = c.generated_text;
  // " little" appears once, mid-text; "Lily. She" spans several tokens.
  for (const std::string stop : {" little", "Lily. She", "park"}) {
    BOOST_TEST_CONTEXT("stop " << stop) {
      GenRequest r = greedy(c.prompt_token_ids, 64);
      r.stop = {"never-appears", stop};
      std::string streamed;
      auto res = generate(*engine, {r}, {}, [&](size_t i, int32_t, std::string_view d) {
        BOOST_TEST(i == 0u);
        streamed += d;
      });
      const size_t at = full.find(stop);
      BOOST_TEST_REQUIRE(at != std::string::npos);
      BOOST_TEST(res[0].text == full.substr(0, at));
      BOOST_TEST(res[0].finish_reason == "stop");
      BOOST_TEST(streamed == res[0].text);
      BOOST_TEST(res[0].tokens.size() < 64u);
      // The tokens are a prefix of the full greedy run.
      const auto all = c.generated_token_ids;
      BOOST_TEST(std::equal(res[0].tokens.begin(), res[0].tokens.end(), all.begin()));
    }
  }
  BOOST_TEST(engine->pool().n_used() == 0);
}

BOOST_AUTO_TEST_CASE(max_tokens_ends_with_length) {
  const auto& c = test::reference_case("The cat", 32);
  auto res = generate(*engine, {greedy(c.prompt_token_ids, 5)});
  BOOST_TEST(res[0].tokens.size() == 5u);
  BOOST_TEST(res[0].finish_reason == "length");
  auto one = generate(*engine, {greedy(c.prompt_token_ids, 1)});
  BOOST_TEST_REQUIRE(one[0].tokens.size() == 1u);
  BOOST_TEST(one[0].tokens[0] == c.generated_token_ids[0]);
}

BOOST_AUTO_TEST_CASE(callback_deltas_concatenate_to_the_text) {
  std::vector<GenRequest> reqs;
  for (const char* p : {"Once upon a time", "Lily and Tom", "The cat"})
    reqs.push_back(greedy(test::reference_case(p, 64).prompt_token_ids, 64));
  reqs[2].stop = {"box"};  // never in that text, but "b" prefixes get held back and released
  std::vector<std::string> streamed(3);
  std::vector<size_t> calls(3);
  auto res = generate(*engine, reqs, {}, [&](size_t i, int32_t, std::string_view d) {
    BOOST_TEST_REQUIRE(i < 3u);
    streamed[i] += d;
    ++calls[i];
  });
  for (size_t i = 0; i < 3; ++i) {
    BOOST_TEST(streamed[i] == res[i].text);
    BOOST_TEST(calls[i] == res[i].tokens.size());
  }
  BOOST_TEST(res[0].text == test::reference_case("Once upon a time", 64).generated_text);
}

BOOST_AUTO_TEST_CASE(seeded_sampling_is_reproducible_and_batch_independent) {
  const auto p0 = test::reference_case("Once upon a time", 32).prompt_token_ids;
  const auto p1 = test::reference_case("Lily and Tom", 32).prompt_token_ids;
  GenRequest r = greedy(p0, 48);
  r.sampling.temperature = 1.0f;
  r.sampling.top_k = 40;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = 1234;
  r.sampling.n_logprobs = 3;
  auto a = generate(*engine, {r});
  auto b = generate(*engine, {r});
  BOOST_TEST(a[0].tokens == b[0].tokens, boost::test_tools::per_element());
  BOOST_TEST(a[0].text == b[0].text);
  // In a batch, beside other sampled requests, with chunked prefill: same tokens.
  GenRequest other = r;
  other.prompt = p1;
  other.sampling.seed = 99;
  GenRequest same_prompt_other_seed = r;
  same_prompt_other_seed.sampling.seed = 1235;
  GenOptions o;
  o.prefill_chunk = 2;
  auto batch = generate(*engine, {other, r, same_prompt_other_seed}, o);
  BOOST_TEST(batch[1].tokens == a[0].tokens, boost::test_tools::per_element());
  BOOST_TEST(batch[2].tokens != a[0].tokens);  // another seed goes another way
  BOOST_TEST(a[0].tokens != test::reference_case("Once upon a time", 64).generated_token_ids);
  // Logprobs: 3 per token, best first, the chosen one's logprob at most the best.
  for (size_t k = 0; k < a[0].tokens.size(); ++k) {
    BOOST_TEST_REQUIRE(a[0].logprobs[k].size() == 3u);
    BOOST_TEST(a[0].logprobs[k][0].logprob >= a[0].logprobs[k][1].logprob);
    BOOST_TEST(a[0].token_logprob[k] <= a[0].logprobs[k][0].logprob + 1e-6f);
  }
  BOOST_TEST(engine->pool().n_used() == 0);
}

BOOST_AUTO_TEST_CASE(eos_stops_unless_ignored) {
  const auto& c = test::reference_case("Once upon a time", 32);
  const auto expect = c.generated_token_ids;
  // Step 1 is the prefill (first token), so step 6 samples the 6th token: EOS.
  GenRequest r = greedy(c.prompt_token_ids, 12);
  // The text at EOS ends in " little", a prefix of this stop string: held back, then released.
  r.stop = {" little girl!"};
  std::string streamed;
  std::vector<int32_t> called;
  EosAtStep forced(*engine, 6);
  auto res = generate(forced, {r}, {}, [&](size_t, int32_t t, std::string_view d) {
    streamed += d;
    called.push_back(t);
  });
  BOOST_TEST(res[0].finish_reason == "stop");
  BOOST_TEST(res[0].tokens == std::vector<int32_t>(expect.begin(), expect.begin() + 5),
             boost::test_tools::per_element());
  BOOST_TEST(res[0].text == ", there was a little");
  BOOST_TEST(streamed == res[0].text);
  BOOST_TEST_REQUIRE(called.size() == 6u);  // 5 tokens, then the release on EOS
  BOOST_TEST(called.back() == -1);
  // ignore_eos: the EOS token is kept (no text) and generation runs to max_tokens.
  r.ignore_eos = true;
  EosAtStep forced2(*engine, 6);
  auto kept = generate(forced2, {r});
  BOOST_TEST(kept[0].finish_reason == "length");
  BOOST_TEST_REQUIRE(kept[0].tokens.size() == 12u);
  BOOST_TEST(kept[0].tokens[5] == model->tokenizer().eos());
  BOOST_TEST(kept[0].text.substr(0, 20) == ", there was a little");
  BOOST_TEST(engine->pool().n_used() == 0);
}

BOOST_AUTO_TEST_CASE(bad_requests_are_rejected) {
  const auto p = test::reference_case("The cat", 32).prompt_token_ids;
  const int ctx = engine->config().ctx_len;
  auto message_of = [&](const std::vector<GenRequest>& reqs) -> std::string {
    try {
      generate(*engine, reqs);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  const std::string too_long = message_of({greedy(p, ctx)});
  BOOST_TEST(too_long.find(std::to_string(ctx)) != std::string::npos);
  BOOST_TEST(too_long.find("max_tokens") != std::string::npos);
  BOOST_TEST(message_of({greedy({}, 4)}).find("empty") != std::string::npos);
  BOOST_TEST(message_of({greedy({1, 100000}, 4)}).find("100000") != std::string::npos);
  BOOST_TEST(message_of({greedy(p, 0)}).find("max_tokens") != std::string::npos);
  GenRequest bad = greedy(p, 4);
  bad.sampling.top_p = 2.0f;
  BOOST_TEST(message_of({bad}).find("top_p") != std::string::npos);
  // Exactly the context is fine.
  BOOST_CHECK_NO_THROW(generate(*engine, {greedy(p, ctx - static_cast<int>(p.size()))}));
  BOOST_TEST(engine->pool().n_used() == 0);
}

BOOST_AUTO_TEST_CASE(a_small_pool_refuses_a_batch_it_cannot_hold) {
  EngineOptions o;
  o.n_threads = 1;
  o.n_blocks = 4;  // 64 tokens of 16
  auto small = make_cpu_engine(model, o);
  const auto p = test::reference_case("The cat", 32).prompt_token_ids;
  // 4 + 40 - 1 = 43 cached tokens: 3 blocks fit; two such requests need 6.
  auto one = generate(*small, {greedy(p, 40)});
  BOOST_TEST(one[0].tokens.size() == 40u);
  try {
    generate(*small, {greedy(p, 40), greedy(p, 40)});
    BOOST_FAIL("expected out of KV blocks");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(std::string(e.what()).find("out of KV blocks") != std::string::npos);
  }
  BOOST_TEST(small->pool().n_used() == 0);
  // An exception thrown from inside the loop (the callback here) still returns the blocks.
  BOOST_CHECK_THROW(
      generate(*small, {greedy(p, 40)}, {},
               [](size_t, int32_t, std::string_view) { throw std::logic_error("x"); }),
      std::logic_error);
  BOOST_TEST(small->pool().n_used() == 0);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE_END()  // test_generator
