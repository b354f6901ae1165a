// The executor actor on its own: one step of the CPU engine gives llama.cpp's first greedy token,
// samplers live until released, a sequence that fails (malformed, bad sampling state, NaN logits)
// fails alone while a malformed batch fails the step, and the null backend's output.
#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <chrono>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>

#include "actors/executor.hpp"
#include "actors/messages.hpp"
#include "core/error_code.hpp"
#include "model/llama.hpp"
#include "tests/support/enum_print.hpp"
#include "tests/support/reference.hpp"

BOOST_AUTO_TEST_SUITE(test_actors_executor)

using namespace sy;

namespace {

constexpr auto kWait = std::chrono::seconds(60);  // a lost reply fails, never hangs

caf::actor_system_config& config() {
  static caf::actor_system_config cfg = [] {
    caf::actor_system_config c;
    register_message_types(c);
    return c;
  }();
  return cfg;
}

std::shared_ptr<LlamaModel> stories() {
  static std::shared_ptr<LlamaModel> m =
      LlamaModel::load(std::string(SY_MODELS_DIR) + "/stories260K.gguf");
  return m;
}

struct Rig {
  caf::actor_system sys{config()};
  caf::scoped_actor self{sys};
  ExecutorActor exec;
  explicit Rig(ExecutorSpec spec) { exec = spawn_executor(sys, spec); }
  ~Rig() { caf::anon_send_exit(exec, caf::exit_reason::user_shutdown); }
  StepResult step(const StepPlan& p) {
    StepResult out;
    self->request(exec, kWait, step_atom::value, p)
        .receive([&](StepResult& r) { out = std::move(r); },
                 [&](caf::error& e) { BOOST_FAIL("step failed: " + sys.render(e)); });
    return out;
  }
  ExecutorStats stats() {
    ExecutorStats out;
    self->request(exec, kWait, stats_atom::value)
        .receive([&](ExecutorStats& s) { out = s; },
                 [&](caf::error& e) { BOOST_FAIL("stats failed: " + sys.render(e)); });
    return out;
  }
  int64_t samplers() { return stats().samplers; }
};

ExecutorSpec cpu(int32_t n_blocks) {
  ExecutorSpec s;
  s.model = stories();
  s.threads = 1;
  s.n_blocks = n_blocks;
  s.block_size = 4;
  return s;
}

SeqPlan prefill(uint64_t uid, std::vector<int32_t> tokens, std::vector<int32_t> blocks) {
  SeqPlan p;
  p.uid = uid;
  p.tokens = std::move(tokens);
  p.block_table = std::move(blocks);
  p.sample = true;
  p.reset = true;
  p.temperature = 0.0f;
  return p;
}

}  // namespace

BOOST_AUTO_TEST_CASE(spec_errors) {
  caf::actor_system sys{config()};
  ExecutorSpec s;
  s.backend = Backend::automatic;  // unresolved: an executor runs cpu, cuda or null
  BOOST_CHECK_THROW(spawn_executor(sys, s), std::invalid_argument);
  s.backend = Backend::cpu;  // without a model
  BOOST_CHECK_THROW(spawn_executor(sys, s), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(cpu_step_gives_the_golden_first_tokens) {
  Rig rig(cpu(16));
  StepPlan plan;
  plan.step = 7;
  // "Once upon a time" -> ',' (432); "The cat" -> ' and' (269) in reference-llamacpp.json.
  const auto& once = test::reference_case("Once upon a time", 32);
  const auto& cat = test::reference_case("The cat", 32);
  plan.seqs.push_back(prefill(1, once.prompt_token_ids, {0, 1}));
  plan.seqs.push_back(prefill(2, cat.prompt_token_ids, {2}));
  plan.seqs[1].logprobs = 3;
  StepResult r = rig.step(plan);
  BOOST_TEST(r.error.empty());
  BOOST_TEST(r.step == 7u);
  BOOST_REQUIRE(r.seqs.size() == 2u);
  BOOST_TEST(r.seqs[0].uid == 1u);
  BOOST_TEST(r.seqs[0].token == once.generated_token_ids[0]);
  BOOST_TEST(r.seqs[0].top_ids.empty());
  BOOST_TEST(r.seqs[1].token == cat.generated_token_ids[0]);
  BOOST_TEST(r.seqs[1].top_ids.size() == 3u);
  BOOST_TEST(r.seqs[1].top_ids[0] == cat.generated_token_ids[0]);
  BOOST_TEST(r.seqs[1].logprob == static_cast<float>(cat.top1_logprobs[0]),
             boost::test_tools::tolerance(1e-2f));
  BOOST_TEST(rig.samplers() == 2);
  // A decode continues the first sequence: ' there' (383).
  StepPlan next;
  SeqPlan d;
  d.uid = 1;
  d.tokens = {once.generated_token_ids[0]};
  d.n_past = static_cast<int32_t>(once.prompt_token_ids.size());
  d.block_table = {0, 1};
  d.sample = true;
  d.temperature = 0.0f;
  next.seqs.push_back(d);
  r = rig.step(next);
  BOOST_REQUIRE(r.seqs.size() == 1u);
  BOOST_TEST(r.seqs[0].token == once.generated_token_ids[1]);
  rig.self->send(rig.exec, release_atom::value, std::vector<uint64_t>{1, 2});
  BOOST_TEST(rig.samplers() == 0);
}

BOOST_AUTO_TEST_CASE(malformed_sequence_fails_alone_and_a_malformed_step_fails_whole) {
  Rig rig(cpu(4));
  StepPlan plan;
  plan.seqs.push_back(prefill(1, {1, 403, 407, 261, 378}, {0}));  // 5 tokens, one 4-slot block
  plan.seqs.push_back(prefill(2, {1, 403, 407, 261, 378}, {2, 3}));
  StepResult r = rig.step(plan);
  // The malformed sequence ends alone (internal: its plan, not a client, is at fault); the other
  // one gets its token.
  BOOST_TEST(r.error.empty());
  BOOST_REQUIRE(r.seqs.size() == 2u);
  BOOST_TEST(r.seqs[0].uid == 1u);
  BOOST_TEST(r.seqs[0].code == ErrorCode::internal);
  BOOST_TEST(r.seqs[0].error.find("block table") != std::string::npos, r.seqs[0].error);
  BOOST_TEST(r.seqs[1].uid == 2u);
  BOOST_TEST(r.seqs[1].error.empty());
  BOOST_TEST(r.seqs[1].token == 432);
  plan.seqs.resize(1);
  plan.seqs[0].block_table = {0, 9};  // a block id outside the pool
  r = rig.step(plan);
  BOOST_REQUIRE(r.seqs.size() == 1u);
  BOOST_TEST(r.seqs[0].error.find("out of range") != std::string::npos, r.seqs[0].error);
  // The executor goes on.
  plan.seqs[0].block_table = {0, 1};
  r = rig.step(plan);
  BOOST_TEST(r.error.empty());
  BOOST_REQUIRE(r.seqs.size() == 1u);
  BOOST_TEST(r.seqs[0].error.empty());
  BOOST_TEST(r.seqs[0].token == 432);
  BOOST_TEST(rig.stats().seq_failures == 2);
}

BOOST_AUTO_TEST_CASE(a_step_over_the_token_budget_fails_whole) {
  ExecutorSpec spec = cpu(4);
  spec.max_batch_tokens = 4;  // no single sequence is at fault: the batch as a whole is too big
  Rig rig(spec);
  StepPlan plan;
  plan.seqs.push_back(prefill(1, {1, 403, 407}, {0}));
  plan.seqs.push_back(prefill(2, {1, 403, 407}, {1}));
  StepResult r = rig.step(plan);
  BOOST_TEST(!r.error.empty());
  BOOST_TEST(r.seqs.empty());
}

// Must-show: one sequence's bad sampling state or NaN logits end that sequence alone; the others
// of the step get exactly their greedy tokens, and go on in the next step.
BOOST_AUTO_TEST_CASE(per_sequence_failures_leave_the_rest_of_the_step_exact) {
  ExecutorSpec spec = cpu(32);
  spec.test_nan_logits_token = 511;  // TEST ONLY: a sequence starting with 511 gets NaN logits
  Rig rig(spec);
  const auto& once = test::reference_case("Once upon a time", 32);
  const auto& cat = test::reference_case("The cat", 32);
  StepPlan plan;
  plan.seqs.push_back(prefill(1, once.prompt_token_ids, {0, 1}));
  SeqPlan bad_top_p = prefill(2, once.prompt_token_ids, {2, 3});
  bad_top_p.top_p = 0.0f;  // what top_p 1e-46 became once narrowed
  bad_top_p.temperature = 1.0f;
  plan.seqs.push_back(bad_top_p);
  SeqPlan nan_logits = prefill(3, {1, 403, 511}, {4});
  nan_logits.temperature = 0.7f;
  plan.seqs.push_back(nan_logits);
  SeqPlan nan_greedy = prefill(4, {1, 511}, {5});  // greedy too: no fast path hides the NaN
  plan.seqs.push_back(nan_greedy);
  SeqPlan bad_logprobs = prefill(5, cat.prompt_token_ids, {6});
  bad_logprobs.logprobs = 21;   // over the sampler's cap
  bad_logprobs.sample = false;  // a first prefill chunk: no token, yet it fails here already
  plan.seqs.push_back(bad_logprobs);
  plan.seqs.push_back(prefill(6, cat.prompt_token_ids, {7}));
  plan.seqs.back().logprobs = 20;
  plan.seqs.back().top_k = std::numeric_limits<int32_t>::max();
  StepResult r = rig.step(plan);
  BOOST_TEST(r.error.empty());
  std::map<uint64_t, SeqResult> by;
  for (const SeqResult& x : r.seqs) by[x.uid] = x;
  BOOST_REQUIRE(by.size() == 6u);
  BOOST_TEST(by[1].error.empty());
  BOOST_TEST(by[1].token == once.generated_token_ids[0]);
  BOOST_TEST(by[2].code == ErrorCode::bad_request);
  BOOST_TEST(by[2].error.find("top_p") != std::string::npos, by[2].error);
  for (uint64_t u : {3u, 4u}) {
    BOOST_TEST(by[u].code == ErrorCode::internal);
    BOOST_TEST(by[u].error.find("NaN") != std::string::npos, by[u].error);
  }
  BOOST_TEST(by[5].code == ErrorCode::bad_request);
  BOOST_TEST(by[5].error.find("n_logprobs") != std::string::npos, by[5].error);
  BOOST_TEST(by[6].error.empty());
  BOOST_TEST(by[6].token == cat.generated_token_ids[0]);
  BOOST_TEST(by[6].top_ids.size() == 20u);
  BOOST_TEST(rig.stats().seq_failures == 4);
  BOOST_TEST(rig.stats().tokens == 2);
  // The survivors decode on; the NaN sequence keeps failing while it is planned (until released).
  StepPlan next;
  SeqPlan d = prefill(1, {once.generated_token_ids[0]}, {0, 1});
  d.n_past = static_cast<int32_t>(once.prompt_token_ids.size());
  d.reset = false;
  next.seqs.push_back(d);
  SeqPlan n3 = prefill(3, {300}, {4});
  n3.n_past = 3;
  n3.reset = false;
  next.seqs.push_back(n3);
  r = rig.step(next);
  BOOST_REQUIRE(r.seqs.size() == 2u);
  BOOST_TEST(r.seqs[0].token == once.generated_token_ids[1]);
  BOOST_TEST(!r.seqs[1].error.empty());
}

BOOST_AUTO_TEST_CASE(null_backend_returns_its_fixed_token) {
  ExecutorSpec s;
  s.backend = Backend::null;
  s.null_token = 5;
  Rig rig(s);
  StepPlan plan;
  plan.seqs.push_back(prefill(1, {1, 2, 3}, {0}));
  plan.seqs.push_back(prefill(2, {1, 2, 3}, {1}));
  plan.seqs[1].sample = false;  // a prefill chunk that is not the last: no token
  plan.seqs[0].logprobs = 2;
  StepResult r = rig.step(plan);
  BOOST_TEST(r.error.empty());
  BOOST_REQUIRE(r.seqs.size() == 1u);
  BOOST_TEST(r.seqs[0].token == 5);
  BOOST_TEST(r.seqs[0].top_ids.size() == 2u);
  BOOST_TEST(r.seqs[0].top_logprobs.size() == 2u);
}

BOOST_AUTO_TEST_SUITE_END()  // test_actors_executor
