// Batcher + executor actors in a real actor system: greedy output equals llama.cpp's golden ids
// (streamed, not streamed, concurrent, under KV preemption), cancellation, stop strings,
// max_tokens, chunked prefill plans, executor failure, and the null backend.
#include <algorithm>
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "actors/batcher.hpp"
#include "actors/executor.hpp"
#include "actors/messages.hpp"
#include "core/error_code.hpp"
#include "model/llama.hpp"
#include "tests/support/batcher_rig.hpp"
#include "tests/support/enum_print.hpp"
#include "tests/support/reference.hpp"

BOOST_AUTO_TEST_SUITE(test_actors_batcher)

using namespace sy;
using namespace sy::test;

namespace {

struct Golden {
  std::vector<int32_t> prompt, ids;
};

// The reference cases with 64 generated tokens (one per prompt).
std::vector<Golden> golden64() {
  std::vector<Golden> out;
  for (const auto& c : test::reference_cases(64))
    out.push_back({c.prompt_token_ids, c.generated_token_ids});
  BOOST_REQUIRE_EQUAL(out.size(), 3u);
  for (const auto& g : out) BOOST_REQUIRE_EQUAL(g.ids.size(), 64u);
  return out;
}

BatchingConfig small_config() {
  BatchingConfig bc;
  bc.step_token_budget = 64;
  bc.max_sequences = 8;
  bc.prefill_chunk = 16;
  bc.kv_block_size = 16;
  bc.kv_memory_mb = 4;
  return bc;
}

// Runs the three golden prompts streamed and not, all at once, and checks every job.
void check_golden_run(Rig& rig) {
  const auto gold = golden64();
  const Tokenizer& tok = stories()->tokenizer();
  std::vector<uint64_t> uids;
  std::map<uint64_t, size_t> which;
  for (bool stream : {true, false})
    for (size_t i = 0; i < gold.size(); ++i) {
      const uint64_t u = rig.submit(rig.job(gold[i].prompt, 64, stream));
      uids.push_back(u);
      which[u] = i;
    }
  rig.wait_all(uids);
  for (size_t k = 0; k < uids.size(); ++k) {
    const Seen& s = rig.seen[uids[k]];
    const Golden& g = gold[which[uids[k]]];
    const bool stream = k < gold.size();
    BOOST_TEST_CONTEXT("job " << uids[k] << (stream ? " streamed" : " not streamed")) {
      BOOST_TEST(s.errors == 0);
      BOOST_TEST(s.dones == 1);
      BOOST_TEST(s.outcomes == 1);
      BOOST_TEST(s.done.finish == FinishReason::length);  // length
      BOOST_TEST(s.done.completion_tokens == 64u);
      BOOST_TEST(s.done.prompt_tokens == g.prompt.size());
      BOOST_TEST(s.outcome.outcome == Outcome::done);
      BOOST_TEST(s.outcome.done.ids == g.ids, boost::test_tools::per_element());
      BOOST_TEST(s.outcome.done.text == tok.decode(g.ids));
      if (stream) {
        BOOST_TEST(s.contiguous);
        BOOST_TEST(s.stream_ids == g.ids, boost::test_tools::per_element());
        BOOST_TEST(s.stream_text == tok.decode(g.ids));
        BOOST_TEST(s.done.ids.empty());  // the chunks carried them
        BOOST_TEST(s.done.text.empty());
      } else {
        BOOST_TEST(s.stream_ids.empty());
        BOOST_TEST(s.done.ids == g.ids, boost::test_tools::per_element());
        BOOST_TEST(s.done.text == tok.decode(g.ids));
      }
      BOOST_TEST(s.done.total_ms >= s.done.ttft_ms);
    }
  }
}

// A scripted executor's answer to step plan p: each sequence that samples gets token(uid).
template <class Token>
StepResult answer(const StepPlan& p, Token token) {
  StepResult r;
  r.step = p.step;
  for (const SeqPlan& s : p.seqs)
    if (s.sample) r.seqs.push_back(SeqResult{s.uid, token(s.uid), 0.0f, {}, {}});
  return r;
}

// Answers one step plan as a scripted executor (kept in `plans`): each sequence that samples
// gets token(uid); `error` fails the whole step. Fails the test when no plan comes.
template <class Token>
void serve_step(caf::scoped_actor& exec, std::vector<StepPlan>& plans, Token token,
                const std::string& error = "") {
  exec->receive(
      [&](step_atom, const StepPlan& p) -> StepResult {
        plans.push_back(p);
        StepResult r = answer(p, token);
        r.error = error;
        return r;
      },
      caf::after(kWait) >> [&] { BOOST_FAIL("no step plan"); });
}

}  // namespace

BOOST_AUTO_TEST_CASE(kv_sizing_follows_the_model) {
  const LlamaConfig& c = stories()->config();
  // K and V of every layer and KV head, f16 (the default) 2 bytes a value, f32 4.
  const int64_t per_token = stories()->limits().kv_bytes_per_token();
  BOOST_TEST(per_token == int64_t{c.n_layers} * c.n_kv_heads * c.head_dim * 2 * 2);
  BOOST_TEST(stories()->limits().kv_bytes_per_token(sy::kernels::DType::F32) == 2 * per_token);
  BatchingConfig bc;
  bc.kv_memory_mb = 1;
  bc.kv_block_size = 16;
  BOOST_TEST(kv_blocks_for(bc, per_token) == (1 << 20) / (per_token * 16));
  BOOST_TEST(kv_blocks_for(bc, 0) >= 1);
  bc.kv_memory_mb = 0;  // auto: the CPU default
  BOOST_TEST(kv_blocks_for(bc, per_token) == kDefaultKvMemoryMb * (1 << 20) / (per_token * 16));
}

BOOST_AUTO_TEST_CASE(golden_ids_streamed_and_not_concurrently) {
  Rig rig;
  const BatchingConfig bc = small_config();
  const int32_t n_blocks = kv_blocks_for(bc, stories()->limits().kv_bytes_per_token());
  rig.start(bc, n_blocks, cpu_spec());
  check_golden_run(rig);
  const BatcherStats st = rig.stats(rig.batcher);
  BOOST_TEST(st.blocks_used == 0);
  BOOST_TEST(st.running == 0);
  BOOST_TEST(st.waiting == 0);
  BOOST_TEST(st.finished == 6);
  BOOST_TEST(st.tokens == 6 * 64);
  BOOST_TEST(st.preemptions == 0);
  // Initial credit plus one per ended job.
  rig.drain();
  BOOST_TEST(rig.credit == bc.max_sequences + 6u);
  // Samplers of ended jobs were released.
  BOOST_TEST(rig.stats<ExecutorStats>(rig.executor).samplers == 0);
}

BOOST_AUTO_TEST_CASE(tiny_kv_pool_preempts_and_still_matches_golden) {
  Rig rig;
  BatchingConfig bc = small_config();
  bc.kv_block_size = 4;
  // One job needs ceil((5 + 64 - 1) / 4) = 17 blocks at its longest; six of them cannot share 20.
  const int32_t n_blocks = 20;
  rig.start(bc, n_blocks, cpu_spec());
  check_golden_run(rig);
  const BatcherStats st = rig.stats(rig.batcher);
  BOOST_TEST(st.preemptions > 0);
  BOOST_TEST(st.blocks_used == 0);
  BOOST_TEST(st.blocks_total == n_blocks);
}

BOOST_AUTO_TEST_CASE(cancel_mid_stream_frees_blocks) {
  Rig rig;
  const BatchingConfig bc = small_config();
  ExecutorSpec spec = cpu_spec();
  spec.step_delay_ms = 5;  // so that 1000 tokens take seconds: the cancel lands mid-stream
  rig.start(bc, kv_blocks_for(bc, stories()->limits().kv_bytes_per_token()), spec);
  Job j = rig.job(golden64()[0].prompt, 1000, true);
  j.ignore_eos = true;
  const uint64_t uid = rig.submit(j);
  while (rig.seen[uid].stream_ids.empty() && !rig.ended(uid)) BOOST_REQUIRE(rig.receive_one());
  BOOST_REQUIRE(!rig.ended(uid));
  BOOST_TEST(rig.stats(rig.batcher).blocks_used > 0);
  rig.sink->send(rig.batcher, cancel_atom::value, uid);
  rig.wait_all({uid});
  const Seen& s = rig.seen[uid];
  BOOST_TEST(s.done.finish == FinishReason::cancelled);  // cancelled
  BOOST_TEST(s.outcome.outcome == Outcome::cancelled);
  BOOST_TEST(s.done.completion_tokens < 1000u);
  BOOST_TEST(s.done.completion_tokens == s.stream_ids.size());
  const BatcherStats st = rig.stats(rig.batcher);
  BOOST_TEST(st.blocks_used == 0);
  BOOST_TEST(st.running == 0);
  // A cancel for a job that ended is ignored; the batcher still answers.
  rig.sink->send(rig.batcher, cancel_atom::value, uid);
  BOOST_TEST(rig.stats(rig.batcher).finished == 1);
}

BOOST_AUTO_TEST_CASE(stop_string_cuts_text_and_stream) {
  Rig rig;
  const BatchingConfig bc = small_config();
  rig.start(bc, kv_blocks_for(bc, stories()->limits().kv_bytes_per_token()), cpu_spec());
  const auto gold = golden64();
  // Golden text: ", there was a little girl named Lily. She loved to play ..."
  std::vector<uint64_t> uids;
  for (bool stream : {true, false}) {
    Job j = rig.job(gold[0].prompt, 64, stream);
    j.stop = {"Lily", "never appears"};
    uids.push_back(rig.submit(j));
  }
  rig.wait_all(uids);
  const Seen& streamed = rig.seen[uids[0]];
  const Seen& plain = rig.seen[uids[1]];
  BOOST_TEST(streamed.stream_text == ", there was a little girl named ");
  BOOST_TEST(streamed.done.finish == FinishReason::stop);  // stop
  BOOST_TEST(streamed.outcome.done.text == ", there was a little girl named ");
  BOOST_TEST(plain.done.text == ", there was a little girl named ");
  BOOST_TEST(plain.done.finish == FinishReason::stop);
  // The token that completed the stop string is the last id; nothing after it.
  const Tokenizer& tok = stories()->tokenizer();
  size_t k = 1;
  while (tok.decode({gold[0].ids.begin(), gold[0].ids.begin() + k}).find("Lily") ==
         std::string::npos)
    ++k;
  const std::vector<int32_t> want(gold[0].ids.begin(), gold[0].ids.begin() + k);
  BOOST_TEST(plain.done.ids == want, boost::test_tools::per_element());
  BOOST_TEST(streamed.stream_ids == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(max_tokens_ends_with_length) {
  Rig rig;
  const BatchingConfig bc = small_config();
  rig.start(bc, kv_blocks_for(bc, stories()->limits().kv_bytes_per_token()), cpu_spec());
  const auto gold = golden64();
  const uint64_t a = rig.submit(rig.job(gold[1].prompt, 5, false));
  const uint64_t b = rig.submit(rig.job(gold[2].prompt, 1, true));
  rig.wait_all({a, b});
  const std::vector<int32_t> want_a(gold[1].ids.begin(), gold[1].ids.begin() + 5);
  BOOST_TEST(rig.seen[a].done.ids == want_a, boost::test_tools::per_element());
  BOOST_TEST(rig.seen[a].done.finish == FinishReason::length);
  BOOST_TEST(rig.seen[a].done.completion_tokens == 5u);
  BOOST_TEST(rig.seen[a].outcome.tokens_used == gold[1].prompt.size() + 5);
  BOOST_TEST(rig.seen[b].stream_ids == std::vector<int32_t>{gold[2].ids[0]},
             boost::test_tools::per_element());
  BOOST_TEST(rig.seen[b].done.finish == FinishReason::length);
}

BOOST_AUTO_TEST_CASE(job_too_big_for_the_pool_fails_at_once) {
  Rig rig;
  BatchingConfig bc = small_config();
  bc.kv_block_size = 4;
  rig.start(bc, 4, cpu_spec());  // 16 slots in all
  const uint64_t big = rig.submit(rig.job(golden64()[0].prompt, 64, false));
  const uint64_t fits = rig.submit(rig.job(golden64()[0].prompt, 8, false));
  rig.wait_all({big, fits});
  BOOST_TEST(rig.seen[big].errors == 1);
  BOOST_TEST(rig.seen[big].error.code == ErrorCode::bad_request);
  BOOST_TEST(rig.seen[big].outcome.outcome == Outcome::error);
  BOOST_TEST(rig.seen[fits].done.completion_tokens == 8u);
}

BOOST_AUTO_TEST_CASE(chunked_prefill_plans_and_executor_failure) {
  // A scoped actor plays the executor: the plans are visible, and it can fail a step.
  Rig rig;
  caf::scoped_actor exec{rig.sys};
  BatchingConfig bc = small_config();
  bc.prefill_chunk = 2;
  bc.step_token_budget = 3;
  bc.kv_block_size = 4;
  rig.start_with(bc, 64, exec, true);
  std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  const uint64_t a = rig.submit(rig.job(prompt, 4, false));
  const uint64_t b = rig.submit(rig.job(prompt, 4, false));
  std::vector<StepPlan> plans;
  for (int step = 0; step < 3; ++step)
    serve_step(
        exec, plans, [](uint64_t) { return 300; }, step == 2 ? "device lost" : "");
  rig.wait_all({a, b});
  // Step 1 starts a alone (b arrives while it runs): a 2-token chunk. Step 2: a's next chunk,
  // then b gets what is left of the budget of 3. Every chunk stays within the limits.
  BOOST_REQUIRE(plans.size() == 3u);
  BOOST_REQUIRE(plans[0].seqs.size() == 1u);
  BOOST_TEST(plans[0].seqs[0].uid == a);
  BOOST_TEST(plans[0].seqs[0].tokens.size() == 2u);
  BOOST_TEST(plans[0].seqs[0].reset);
  BOOST_TEST(!plans[0].seqs[0].sample);
  BOOST_REQUIRE(plans[1].seqs.size() == 2u);
  BOOST_TEST(plans[1].seqs[0].uid == a);
  BOOST_TEST(!plans[1].seqs[0].reset);
  BOOST_TEST(plans[1].seqs[1].uid == b);
  BOOST_TEST(plans[1].seqs[1].tokens.size() == 1u);
  BOOST_TEST(plans[1].seqs[1].reset);
  int32_t fed_a = 0;
  for (const StepPlan& p : plans) {
    int64_t total = 0;
    for (const SeqPlan& s : p.seqs) {
      total += static_cast<int64_t>(s.tokens.size());
      BOOST_TEST(s.tokens.size() <= 2u);
      BOOST_TEST(s.block_table.size() * 4 >= s.n_past + s.tokens.size());
      if (s.uid == a) {
        BOOST_TEST(s.n_past == fed_a);
        fed_a += static_cast<int32_t>(s.tokens.size());
        BOOST_TEST(s.sample == (fed_a == 5));
      }
    }
    BOOST_TEST(total <= 3);
  }
  // The third step failed: both jobs end with engine_dead, their blocks back.
  for (uint64_t u : {a, b}) {
    BOOST_TEST(rig.seen[u].errors == 1);
    BOOST_TEST(rig.seen[u].error.code == ErrorCode::engine_dead);
    BOOST_TEST(rig.seen[u].outcome.code == ErrorCode::engine_dead);
  }
  BOOST_TEST(rig.stats(rig.batcher).blocks_used == 0);
}

BOOST_AUTO_TEST_CASE(null_backend_gives_exactly_max_tokens) {
  Rig rig;
  BatchingConfig bc = small_config();
  ExecutorSpec spec;
  spec.backend = Backend::null;
  rig.start(bc, kv_blocks_for(bc, 0), spec, /*with_model=*/false);
  std::vector<uint64_t> uids;
  for (int i = 0; i < 40; ++i) {
    Job j = rig.job({1, 2, 3}, static_cast<uint32_t>(1 + i % 9), i % 2 == 0);
    j.logprobs = i % 3 == 0 ? 2 : 0;
    uids.push_back(rig.submit(j));
  }
  rig.wait_all(uids);
  for (int i = 0; i < 40; ++i) {
    const Seen& s = rig.seen[uids[static_cast<size_t>(i)]];
    const uint32_t n = static_cast<uint32_t>(1 + i % 9);
    BOOST_TEST(s.done.finish == FinishReason::length);
    BOOST_TEST(s.done.completion_tokens == n);
    BOOST_TEST(s.outcome.done.ids.size() == n);
    BOOST_TEST(s.outcome.done.text.empty());
    if (i % 2 == 0) {
      BOOST_TEST(s.stream_ids.size() == n);
      BOOST_TEST(s.stream_logprob_shape);
      BOOST_TEST(s.stream_n_top == (i % 3 == 0 ? 2u : 0u));
      BOOST_TEST(s.done.logprob.empty());  // streamed: the chunks carried them
    }
    if (i % 3 == 0) {
      BOOST_TEST(s.outcome.done.n_top == 2u);
      BOOST_TEST(s.outcome.done.logprob.size() == n);
      BOOST_TEST(s.outcome.done.top_ids.size() == 2 * n);
    }
  }
  // More jobs than max_sequences were queued locally and all ran; credit came back for each.
  rig.drain();
  BOOST_TEST(rig.credit == bc.max_sequences + 40u);
  BOOST_TEST(rig.stats(rig.batcher).blocks_used == 0);
}

BOOST_AUTO_TEST_CASE(null_backend_many_one_token_jobs) {
  // Runtime overhead at the actor level: many 1-token jobs through batcher + null executor. The
  // rate is printed for information only.
  Rig rig;
  BatchingConfig bc;
  bc.max_sequences = 64;
  ExecutorSpec spec;
  spec.backend = Backend::null;
  rig.start(bc, kv_blocks_for(bc, 0), spec, /*with_model=*/false);
  constexpr int kJobs = 20000;
  std::vector<uint64_t> uids;
  const int64_t t0 = now_us();
  for (int i = 0; i < kJobs; ++i) uids.push_back(rig.submit(rig.job({1, 2, 3}, 1, false)));
  rig.wait_all(uids);
  const double secs = static_cast<double>(now_us() - t0) / 1e6;
  BOOST_TEST_MESSAGE("null backend: " << kJobs << " one-token jobs in " << secs << " s ("
                                      << kJobs / secs << " jobs/s)");
  int completed = 0;
  for (uint64_t u : uids) completed += rig.seen[u].done.completion_tokens == 1u ? 1 : 0;
  BOOST_TEST(completed == kJobs);
  const BatcherStats st = rig.stats(rig.batcher);
  BOOST_TEST_MESSAGE("steps: " << st.steps);
  BOOST_TEST(st.finished == kJobs);
}

BOOST_AUTO_TEST_CASE(lowest_class_is_preempted_and_recomputed_without_resending) {
  // A scripted executor: each sampled token of a job is 300 + its position, so repeats show.
  Rig rig;
  caf::scoped_actor exec{rig.sys};
  BatchingConfig bc = small_config();
  bc.kv_block_size = 4;
  bc.prefill_chunk = 8;
  // Both jobs share their prompt: with the prefix cache the recomputation would start from the
  // cached blocks (tests/unit/test_actors_kv.cpp covers that); here it starts from slot 0.
  bc.prefix_cache = false;
  // Each job needs up to ceil((5 + 16 - 1) / 4) = 5 blocks: one fits, two do not.
  rig.start_with(bc, 6, exec, true);
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  Job low = rig.job(prompt, 16, true);
  low.class_index = 1;  // batch
  Job high = rig.job(prompt, 16, false);
  high.class_index = 0;  // interactive, arrives later
  const uint64_t a = rig.submit(low);
  std::map<uint64_t, std::vector<int32_t>> given;  // tokens the executor sampled, per job
  std::vector<StepPlan> plans;
  auto serve_one_step = [&] {
    serve_step(exec, plans, [&](uint64_t uid) {
      auto& g = given[uid];
      g.push_back(300 + static_cast<int32_t>(g.size()));
      return g.back();
    });
  };
  serve_one_step();  // the low job starts alone
  const uint64_t b = rig.submit(high);
  while (!(rig.ended(a) && rig.ended(b))) {
    serve_one_step();
    while (rig.receive_one(caf::duration{std::chrono::milliseconds(1)})) {
    }
  }
  BOOST_REQUIRE(rig.seen[a].dones == 1 && rig.seen[b].dones == 1);
  // Both got exactly what the executor sampled for them, each token once.
  BOOST_TEST(rig.seen[a].stream_ids == given[a], boost::test_tools::per_element());
  BOOST_TEST(rig.seen[a].contiguous);
  BOOST_TEST(rig.seen[b].done.ids == given[b], boost::test_tools::per_element());
  BOOST_TEST(given[a].size() == 16u);
  BOOST_TEST(given[b].size() == 16u);
  // The high job was never preempted (its cache only grows); the low one was, and was then
  // recomputed from prompt + its generated tokens without a sampler reset.
  int32_t high_past = -1;
  bool low_recomputed = false;
  size_t low_generated = 0;
  for (const StepPlan& p : plans)
    for (const SeqPlan& s : p.seqs) {
      if (s.uid == b) {
        BOOST_TEST(s.n_past > high_past);
        high_past = s.n_past;
      } else if (s.uid == a && s.n_past == 0 && low_generated > 0) {
        low_recomputed = true;
        BOOST_TEST(!s.reset);
        std::vector<int32_t> want = prompt;
        want.insert(want.end(), given[a].begin(), given[a].begin() + low_generated);
        want.resize(std::min(want.size(), s.tokens.size()));
        BOOST_TEST(s.tokens == want, boost::test_tools::per_element());
      }
      if (s.uid == a && s.sample) ++low_generated;
    }
  BOOST_TEST(low_recomputed);
  const BatcherStats st = rig.stats(rig.batcher);
  BOOST_TEST(st.preemptions > 0);
  BOOST_TEST(st.blocks_used == 0);
}

// Priority pacing (docs/architecture.md): while an interactive job is active, the prompts of the
// batch class feed at most 16 tokens a step together (the floor, before the step cost is
// measured: a scripted executor's steps take no time to fit), where without pacing the three
// 40-token prompts go in whole in one step.
BOOST_AUTO_TEST_CASE(an_active_class_paces_the_prompts_of_less_important_ones) {
  for (int paced = 0; paced < 2; ++paced) {
    BOOST_TEST_CONTEXT("paced " << paced) {
      Rig rig;
      caf::scoped_actor exec{rig.sys};
      BatchingConfig bc = small_config();
      bc.step_token_budget = 256;
      bc.prefill_chunk = 64;
      bc.prefix_cache = false;
      bc.priority_pacing_ms = paced ? 60000 : 0;  // a minute: the whole test runs inside it
      rig.start_with(bc, 200, exec, true);
      Job hi = rig.job({1, 403, 407}, 64, false);
      hi.class_index = 0;
      rig.submit(hi);
      std::vector<StepPlan> plans;
      auto serve_one_step = [&] { serve_step(exec, plans, [](uint64_t) { return 300; }); };
      serve_one_step();  // the interactive job starts alone
      constexpr int32_t kPrompt = 40;
      std::set<uint64_t> batch;
      for (int i = 0; i < 3; ++i) {
        std::vector<int32_t> prompt(kPrompt, 300 + i);
        prompt[0] = 1;
        Job lo = rig.job(prompt, 4, false);
        lo.class_index = 1;
        batch.insert(rig.submit(lo));
      }
      // The batch's prompt tokens in each of the next steps that feed any.
      std::vector<int32_t> fed;
      for (int step = 0; step < 6 && fed.size() < 4; ++step) {
        serve_one_step();
        int32_t n = 0;
        for (const SeqPlan& q : plans.back().seqs)
          if (batch.count(q.uid) && q.n_past < kPrompt)
            n += std::min<int32_t>(q.n_past + static_cast<int32_t>(q.tokens.size()), kPrompt) -
                 q.n_past;
        if (n > 0) fed.push_back(n);
      }
      BOOST_REQUIRE(!fed.empty());
      if (paced) {
        BOOST_TEST(fed.size() == 4u);
        for (int32_t n : fed) BOOST_TEST(n <= 16);
      } else {
        BOOST_TEST(fed.front() == 3 * kPrompt);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(an_interactive_prompt_stops_the_batch_step_in_flight) {
  Rig rig;
  rig.interrupt = std::make_shared<std::atomic<bool>>(false);
  caf::scoped_actor exec{rig.sys};
  BatchingConfig bc = small_config();
  bc.prefix_cache = false;
  bc.priority_pacing_ms = 0;
  rig.start_with(bc, 200, exec, true);
  auto batch_job = [&](int32_t i) {
    Job j = rig.job({1, 300 + i}, 20, false);
    j.class_index = 1;
    return j;
  };
  auto interactive_job = [&] {
    Job j = rig.job({1, 403, 407}, 4, false);
    j.class_index = 0;
    return j;
  };
  std::set<uint64_t> batch;
  for (int32_t i = 0; i < 6; ++i) batch.insert(rig.submit(batch_job(i)));
  std::vector<StepPlan> plans;
  const auto token = [](uint64_t) { return 300; };
  auto decoding = [&](const StepPlan& p) {
    if (p.seqs.size() != batch.size()) return false;
    for (const SeqPlan& q : p.seqs)
      if (q.tokens.size() != 1u || q.n_past < 2) return false;
    return true;
  };
  for (int step = 0; step < 6 && (plans.empty() || !decoding(plans.back())); ++step)
    serve_step(exec, plans, token);
  BOOST_REQUIRE(decoding(plans.back()));
  // The next step (six decodes) is in flight while two jobs arrive. A batch job of the same
  // class does not stop it; an interactive one, whose 3-token prompt is lighter than the six
  // decodes, does. The stats round trip makes sure the batcher has handled each arrival.
  StepPlan stopped;
  bool after_batch = true, after_interactive = false;
  uint64_t hi = 0;
  exec->receive(
      [&](step_atom, const StepPlan& p) -> StepResult {
        stopped = p;
        rig.submit(batch_job(6));
        rig.stats(rig.batcher);
        after_batch = rig.interrupt->load();
        hi = rig.submit(interactive_job());
        rig.stats(rig.batcher);
        after_interactive = rig.interrupt->load();
        StepResult r;
        r.step = p.step;
        r.interrupted = true;
        return r;
      },
      caf::after(kWait) >> [&] { BOOST_FAIL("no step plan"); });
  BOOST_TEST(!after_batch);
  BOOST_REQUIRE(after_interactive);
  BOOST_REQUIRE(decoding(stopped));
  // At once, the interactive prompt alone, in a short step; the flag is down again.
  serve_step(exec, plans, token);
  BOOST_TEST(!rig.interrupt->load());
  BOOST_REQUIRE(plans.back().seqs.size() == 1u);
  BOOST_TEST(plans.back().seqs[0].uid == hi);
  BOOST_TEST(plans.back().seqs[0].n_past == 0);
  BOOST_TEST(plans.back().seqs[0].tokens.size() == 3u);
  // Then the batch's turn: the stopped step's sequences feed the same tokens at the same slots.
  // Another interactive job arriving during it does not stop it (never two short steps in a row).
  StepPlan resumed;
  bool after_second = true;
  exec->receive(
      [&](step_atom, const StepPlan& p) -> StepResult {
        resumed = p;
        rig.submit(interactive_job());
        rig.stats(rig.batcher);
        after_second = rig.interrupt->load();
        return answer(p, token);
      },
      caf::after(kWait) >> [&] { BOOST_FAIL("no step plan"); });
  BOOST_TEST(!after_second);
  for (const SeqPlan& q : stopped.seqs) {
    BOOST_TEST_CONTEXT("uid " << q.uid) {
      auto it = std::find_if(resumed.seqs.begin(), resumed.seqs.end(),
                             [&](const SeqPlan& x) { return x.uid == q.uid; });
      BOOST_REQUIRE(it != resumed.seqs.end());
      BOOST_TEST(it->n_past == q.n_past);
      BOOST_TEST(it->tokens == q.tokens, boost::test_tools::per_element());
      BOOST_TEST(!it->reset);
    }
  }
  const BatcherStats st = rig.stats(rig.batcher);
  BOOST_TEST(st.steps_interrupted == 1);
  BOOST_TEST(st.steps_done == static_cast<int64_t>(plans.size()) + 1);  // the stopped one not
}

// With a real CPU engine: interactive jobs that stop the batch's steps in flight (between two
// layers, K/V of the stopped step's tokens partly written) leave every output as llama.cpp's.
BOOST_AUTO_TEST_CASE(stopped_steps_leave_every_output_golden) {
  Rig rig;
  rig.interrupt = std::make_shared<std::atomic<bool>>(false);
  BatchingConfig bc = small_config();
  bc.max_sequences = 16;
  bc.priority_pacing_ms = 0;
  ExecutorSpec spec = cpu_spec();
  spec.step_delay_ms = 20;  // TEST ONLY: every step is in flight for a while
  const int32_t n_blocks = kv_blocks_for(bc, stories()->limits().kv_bytes_per_token());
  rig.start(bc, n_blocks, spec);
  const auto gold = golden64();
  std::map<uint64_t, size_t> which;
  std::vector<uint64_t> uids;
  for (int round = 0; round < 3; ++round)
    for (size_t i = 0; i < gold.size(); ++i) {
      Job j = rig.job(gold[i].prompt, 64, true);
      j.class_index = 1;
      const uint64_t u = rig.submit(j);
      which[u] = i;
      uids.push_back(u);
    }
  // Once the batch streams (nine decodes a step, more than a 5-token prompt), interactive jobs
  // arrive one after another until one of them has stopped a step (each arrives while a step
  // is in flight but for a moment between two steps; a few tries make that certain).
  while (rig.seen.empty()) BOOST_REQUIRE(rig.receive_one());
  int64_t stopped = 0;
  for (int k = 0; k < 5 && stopped == 0; ++k) {
    const size_t i = static_cast<size_t>(k) % gold.size();
    Job j = rig.job(gold[i].prompt, 8, false);
    j.class_index = 0;
    const uint64_t u = rig.submit(j);
    rig.wait_all({u});
    const std::vector<int32_t> want(gold[i].ids.begin(), gold[i].ids.begin() + 8);
    BOOST_TEST(rig.seen[u].done.ids == want, boost::test_tools::per_element());
    stopped = rig.stats(rig.batcher).steps_interrupted;
  }
  BOOST_TEST(stopped >= 1);
  rig.wait_all(uids);
  for (uint64_t u : uids) {
    BOOST_TEST_CONTEXT("batch job " << u) {
      BOOST_TEST(rig.seen[u].stream_ids == gold[which[u]].ids, boost::test_tools::per_element());
    }
  }
  BOOST_TEST(rig.stats<ExecutorStats>(rig.executor).interrupted == stopped);
}

BOOST_AUTO_TEST_CASE(seeded_sampling_survives_preemption) {
  // Temperature sampling with a seed: the same ids with room to spare and under a pool so small
  // that the jobs keep preempting each other (the executor keeps each job's random stream).
  std::vector<std::vector<int32_t>> runs[2];
  for (int tiny = 0; tiny < 2; ++tiny) {
    Rig rig;
    BatchingConfig bc = small_config();
    bc.kv_block_size = 4;
    const int32_t n_blocks = tiny ? 20 : 200;
    rig.start(bc, n_blocks, cpu_spec());
    std::vector<uint64_t> uids;
    for (const Golden& g : golden64()) {
      Job j = rig.job(g.prompt, 64, false);
      j.temperature = 0.8f;
      j.top_k = 40;
      j.seed = 1234 + g.prompt.size();
      j.ignore_eos = true;
      uids.push_back(rig.submit(j));
    }
    rig.wait_all(uids);
    for (uint64_t u : uids) runs[tiny].push_back(rig.seen[u].done.ids);
    if (tiny) BOOST_TEST(rig.stats(rig.batcher).preemptions > 0);
  }
  for (size_t i = 0; i < runs[0].size(); ++i) {
    BOOST_TEST(runs[0][i].size() == 64u);
    BOOST_TEST(runs[0][i] == runs[1][i], boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(waiting_higher_class_evicts_lower_running_job) {
  // The pool is full of a batch-class job's prompt; an interactive job that arrives next starts
  // at the next step (the batch job is preempted) instead of waiting for the batch job to end.
  Rig rig;
  caf::scoped_actor exec{rig.sys};
  BatchingConfig bc = small_config();
  bc.kv_block_size = 4;
  bc.prefill_chunk = 32;
  rig.start_with(bc, 6, exec, true);
  std::vector<int32_t> long_prompt(17, 300);
  long_prompt[0] = 1;
  Job low = rig.job(long_prompt, 4, false);  // 17 prompt tokens: 5 of the 6 blocks
  low.class_index = 1;
  Job high = rig.job({1, 403, 407, 261, 378}, 4, false);  // needs 2 blocks to start
  high.class_index = 0;
  const uint64_t a = rig.submit(low);
  std::vector<StepPlan> plans;
  uint64_t b = 0;
  auto serve_one_step = [&] {
    exec->receive(
        [&](step_atom, const StepPlan& p) -> StepResult {
          // The interactive job arrives while the first step runs.
          if (plans.empty()) b = rig.submit(high);
          plans.push_back(p);
          return answer(p, [](uint64_t) { return 400; });
        },
        caf::after(kWait) >> [&] { BOOST_FAIL("no step plan"); });
  };
  serve_one_step();  // the low job's prompt fills the pool
  while (!(rig.ended(a) && rig.ended(b))) {
    serve_one_step();
    while (rig.receive_one(caf::duration{std::chrono::milliseconds(1)})) {
    }
  }
  BOOST_REQUIRE(plans.size() >= 2u);
  BOOST_REQUIRE(plans[1].seqs.size() == 1u);
  BOOST_TEST(plans[1].seqs[0].uid == b);  // the interactive job ran at once, alone
  BOOST_TEST(rig.seen[a].done.completion_tokens == 4u);
  BOOST_TEST(rig.seen[b].done.completion_tokens == 4u);
  BOOST_TEST(rig.seen[a].done.ids == std::vector<int32_t>(4, 400),
             boost::test_tools::per_element());
  const BatcherStats st = rig.stats(rig.batcher);
  BOOST_TEST(st.preemptions >= 1);
  BOOST_TEST(st.blocks_used == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_actors_batcher
