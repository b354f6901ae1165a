// The CUDA engine on stories260K: greedy continuations equal llama.cpp's token ids (f32 weights,
// alone and batched, prefill kernel and decode kernel), bf16 logits stay close to the CPU
// engine's, on-device greedy sampling agrees with the logits, malformed batches are refused;
// on a random 15M-shaped model (head_dim 48: tensor-core prefill) logits match the CPU engine.
#define BOOST_TEST_MODULE gpu_engine
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <string>

#include "model/make_model.hpp"
#include "tests/gpu/gpu_test.hpp"
#include "tests/support/reference.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/stories.hpp"

using namespace sy::gputest;

BOOST_TEST_GLOBAL_FIXTURE(RequireGpu);

namespace {

struct Case {
  std::vector<int32_t> prompt, generated;
};

// Every case of reference-llamacpp.json (32- and 64-token continuations).
std::vector<Case> load_cases() {
  std::vector<Case> cases;
  for (const auto& c : sy::test::reference_cases())
    cases.push_back({c.prompt_token_ids, c.generated_token_ids});
  BOOST_REQUIRE(!cases.empty());
  return cases;
}

std::shared_ptr<sy::LlamaModel> stories() { return sy::test::stories_model(); }

int32_t argmax(const float* x, int32_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

// Greedy generation of all prompts in one engine, every sequence in every step; prompts are fed
// `chunk` tokens at a time. Returns the generated ids per prompt.
std::vector<std::vector<int32_t>> greedy(sy::Engine& e, const std::vector<Case>& cases, int chunk) {
  std::vector<sy::test::FedSeq> seqs(cases.size());
  std::vector<std::vector<int32_t>> gen(cases.size());
  sy::StepOutput out;
  for (;;) {
    std::vector<sy::SeqStep> batch;
    std::vector<size_t> who;
    for (size_t i = 0; i < cases.size(); ++i) {
      if (gen[i].size() >= cases[i].generated.size()) continue;
      sy::SeqStep st;
      BOOST_REQUIRE(
          seqs[i].next_step(e, cases[i].prompt, chunk, gen[i].empty() ? 0 : gen[i].back(), st));
      batch.push_back(st);
      who.push_back(i);
    }
    if (batch.empty()) break;
    e.step(batch, out);
    for (size_t b = 0; b < who.size(); ++b) {
      if (seqs[who[b]].stepped(cases[who[b]].prompt))
        gen[who[b]].push_back(argmax(out.row(b), out.n_vocab));
    }
  }
  for (auto& s : seqs) s.release(e);
  return gen;
}

sy::CudaEngineOptions f32_opts() {
  sy::CudaEngineOptions o;
  o.f32_weights = true;
  o.n_blocks = 512;
  return o;
}

}  // namespace

BOOST_AUTO_TEST_CASE(stories_greedy_matches_llamacpp_each_alone) {
  const auto cases = load_cases();
  auto e = sy::make_cuda_engine(stories(), f32_opts());
  for (const Case& c : cases) {
    const auto got = greedy(*e, {c}, 1 << 20);
    BOOST_TEST(got[0] == c.generated, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(stories_greedy_matches_llamacpp_batched) {
  const auto cases = load_cases();
  auto e = sy::make_cuda_engine(stories(), f32_opts());
  // whole prompts (prefill kernel for the longer ones) and one token at a time (decode kernel)
  for (int chunk : {1 << 20, 1, 3}) {
    const auto got = greedy(*e, cases, chunk);
    for (size_t i = 0; i < cases.size(); ++i) {
      BOOST_TEST(got[i] == cases[i].generated, "case " << i << " chunk " << chunk);
    }
  }
  BOOST_TEST(e->pool().n_used() == 0);
}

BOOST_AUTO_TEST_CASE(bf16_logits_close_to_cpu) {
  const auto cases = load_cases();
  sy::EngineOptions co;
  co.reference = true;
  auto cpu = sy::make_cpu_engine(stories(), co);
  sy::CudaEngineOptions go;
  go.n_blocks = 64;  // explicit: taken as asked
  auto gpu = sy::make_cuda_engine(stories(), go);
  const auto& p = cases[0].prompt;
  std::vector<int32_t> bt_cpu, bt_gpu;
  for (size_t i = 0; i * 16 < p.size(); ++i) {
    bt_cpu.push_back(*cpu->pool().alloc());
    bt_gpu.push_back(*gpu->pool().alloc());
  }
  sy::SeqStep s;
  s.tokens = p.data();
  s.n_tokens = static_cast<int32_t>(p.size());
  s.all_logits = true;
  s.block_table = bt_cpu.data();
  s.n_blocks = static_cast<int32_t>(bt_cpu.size());
  sy::StepOutput oc, og;
  cpu->step({s}, oc);
  s.block_table = bt_gpu.data();
  gpu->step({s}, og);
  BOOST_REQUIRE(og.logits.size() == oc.logits.size());
  // bf16 weights and activations through 5 layers: a few bf16 roundings, compounded
  BOOST_TEST(rel_err(og.logits, oc.logits) < 5e-2);
}

BOOST_AUTO_TEST_CASE(device_sampling_greedy_agrees_with_logits) {
  auto any = sy::make_cuda_engine(stories(), f32_opts());
  auto* e = dynamic_cast<sy::CudaEngine*>(any.get());
  BOOST_REQUIRE(e);
  const auto cases = load_cases();
  std::vector<std::vector<int32_t>> bts;
  std::vector<sy::SeqStep> batch;
  for (const Case& c : cases) {
    std::vector<int32_t> bt;
    for (size_t i = 0; i * 16 < c.prompt.size(); ++i) bt.push_back(*e->pool().alloc());
    bts.push_back(bt);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    sy::SeqStep s;
    s.tokens = cases[i].prompt.data();
    s.n_tokens = static_cast<int32_t>(cases[i].prompt.size());
    s.block_table = bts[i].data();
    s.n_blocks = static_cast<int32_t>(bts[i].size());
    batch.push_back(s);
  }
  std::vector<int32_t> ids;
  e->step_sample(batch, std::vector<sy::SampleControl>(batch.size()), ids);
  for (size_t i = 0; i < cases.size(); ++i) BOOST_TEST(ids[i] == cases[i].generated[0]);
}

BOOST_AUTO_TEST_CASE(malformed_batches_are_refused) {
  auto e = sy::make_cuda_engine(stories(), f32_opts());
  const std::vector<int32_t> toks = {1, 2, 3};
  std::vector<int32_t> bt = {0};
  sy::SeqStep s;
  s.tokens = toks.data();
  s.n_tokens = 3;
  s.n_past = 15;  // needs 2 blocks
  s.block_table = bt.data();
  s.n_blocks = 1;
  sy::StepOutput out;
  BOOST_CHECK_THROW(e->step({s}, out), std::invalid_argument);
  const std::vector<int32_t> bad = {1, 100000};
  s.tokens = bad.data();
  s.n_tokens = 2;
  s.n_past = 0;
  BOOST_CHECK_THROW(e->step({s}, out), std::invalid_argument);
  s.tokens = toks.data();
  s.n_tokens = 3;
  e->step({s}, out);  // still usable
  BOOST_TEST(out.logits.size() == static_cast<size_t>(out.n_vocab));
}

BOOST_AUTO_TEST_CASE(kv_request_that_does_not_fit_is_a_clear_error) {
  sy::CudaEngineOptions o = f32_opts();
  o.n_blocks = 2000000000 / 16;  // far more KV than any device holds
  try {
    sy::make_cuda_engine(stories(), o);
    BOOST_FAIL("no error");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(std::string(e.what()).find("does not fit") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_CASE(random_15m_model_matches_cpu_engine) {
  std::shared_ptr<sy::LlamaModel> model;
  {
    const sy::test::TempDir dir("sy_gpu_engine_");  // gone at the brace: the model is loaded
    sy::MakeModelOptions mo;
    mo.shape = "15m";
    mo.dtype = "bf16";
    mo.seed = rng()();
    mo.out = dir.file("m.gguf");
    sy::make_model(mo);
    model = sy::LlamaModel::load(mo.out);
  }
  const int32_t n_vocab = model->config().n_vocab;

  // a 150-token prompt (10 prefill tiles), then one decode step, in every engine
  std::vector<int32_t> prompt(150);
  for (int32_t& t : prompt) t = std::uniform_int_distribution<int32_t>(3, n_vocab - 1)(rng());
  const auto run = [&](sy::Engine& e) {
    std::vector<int32_t> bt;
    for (int i = 0; i < 10; ++i) bt.push_back(*e.pool().alloc());
    sy::SeqStep s;
    s.tokens = prompt.data();
    s.n_tokens = static_cast<int32_t>(prompt.size());
    s.all_logits = true;
    s.block_table = bt.data();
    s.n_blocks = static_cast<int32_t>(bt.size());
    sy::StepOutput o1, o2;
    e.step({s}, o1);
    const int32_t next = 7;
    s.tokens = &next;
    s.n_tokens = 1;
    s.n_past = static_cast<int32_t>(prompt.size());
    s.all_logits = false;
    e.step({s}, o2);
    std::vector<float> all = o1.logits;
    all.insert(all.end(), o2.logits.begin(), o2.logits.end());
    for (int32_t b : bt) e.pool().free(b);
    return all;
  };
  auto cpu = sy::make_cpu_engine(model, sy::EngineOptions{});
  const std::vector<float> want = run(*cpu);
  sy::CudaEngineOptions o;
  o.n_blocks = 64;
  o.f32_weights = true;  // bf16 file weights widen exactly: only summation order differs
  const std::vector<float> f32 = run(*sy::make_cuda_engine(model, o));
  BOOST_TEST(rel_err(f32, want) < 1e-3);
  o.f32_weights = false;
  const std::vector<float> tc = run(*sy::make_cuda_engine(model, o));
  o.tensor_core_attention = false;
  const std::vector<float> plain = run(*sy::make_cuda_engine(model, o));
  // bf16 activations and KV entries: roundings of 2^-9, compounded over 6 layers
  BOOST_TEST(rel_err(plain, want) < 5e-2);
  BOOST_TEST(rel_err(tc, want) < 5e-2);
  BOOST_TEST(rel_err(tc, plain) < 2e-2);
}

// Per-sequence sliding windows (SeqStep::window): logits of every token of a 69-token prompt
// equal the CPU reference engine's, in one step (prefill kernel) and one token per step (decode
// kernel, blocks behind the window released as -1). Sinks are refused for now.
BOOST_AUTO_TEST_CASE(sequence_windows_match_cpu_engine) {
  const auto cases = load_cases();
  std::vector<int32_t> p = cases[0].prompt;
  p.insert(p.end(), cases[0].generated.begin(), cases[0].generated.end());
  sy::EngineOptions co;
  co.reference = true;
  co.block_size = 4;
  auto cpu = sy::make_cpu_engine(stories(), co);
  sy::CudaEngineOptions go = f32_opts();
  go.block_size = 4;
  auto gpu = sy::make_cuda_engine(stories(), go);
  const auto run = [&](sy::Engine& e, int32_t window, int chunk, bool release) {
    std::vector<int32_t> bt;
    for (size_t i = 0; i * 4 < p.size(); ++i) bt.push_back(*e.pool().alloc());
    std::vector<float> logits;
    sy::StepOutput o;
    for (size_t at = 0; at < p.size(); at += static_cast<size_t>(chunk)) {
      if (release) {
        // blocks wholly before the window of the step's first token (slot `at`)
        for (size_t b = 0; (b + 1) * 4 + window <= at + 1; ++b) {
          if (bt[b] >= 0) e.pool().free(bt[b]);
          bt[b] = -1;
        }
      }
      sy::SeqStep s;
      s.tokens = p.data() + at;
      s.n_tokens = static_cast<int32_t>(std::min(p.size() - at, static_cast<size_t>(chunk)));
      s.n_past = static_cast<int32_t>(at);
      s.block_table = bt.data();
      s.n_blocks = static_cast<int32_t>(bt.size());
      s.all_logits = true;
      s.window = window;
      e.step({s}, o);
      logits.insert(logits.end(), o.logits.begin(), o.logits.end());
    }
    for (int32_t b : bt)
      if (b >= 0) e.pool().free(b);
    return logits;
  };
  for (int32_t w : {16, 5}) {
    const auto want = run(*cpu, w, 1 << 20, false);
    for (int chunk : {1 << 20, 1}) {
      const auto got = run(*gpu, w, chunk, chunk == 1);
      BOOST_REQUIRE(got.size() == want.size());
      // f32 weights and cache on both sides: only summation order differs
      BOOST_TEST(rel_err(got, want) < 1e-3, "window " << w << " chunk " << chunk);
    }
  }
  BOOST_TEST(gpu->pool().n_used() == 0);

  std::vector<int32_t> bt(18, -1);
  for (size_t b = 10; b < bt.size(); ++b) bt[b] = *gpu->pool().alloc();
  sy::SeqStep s;
  s.tokens = p.data() + 60;
  s.n_tokens = 1;
  s.n_past = 60;
  s.block_table = bt.data();
  s.n_blocks = static_cast<int32_t>(bt.size());
  s.window = 16;  // sees (44, 60]: blocks 11.. are needed, 0..10 not
  sy::StepOutput o;
  gpu->step({s}, o);
  s.window = 30;  // sees (30, 60]: block 7 is needed but released
  BOOST_CHECK_THROW(gpu->step({s}, o), std::invalid_argument);
  s.window = 16;
  s.sinks = 4;
  BOOST_CHECK_THROW(gpu->step({s}, o), std::invalid_argument);
  for (size_t b = 10; b < bt.size(); ++b) gpu->pool().free(bt[b]);
}
