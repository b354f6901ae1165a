// Speculative decoding through the real batcher and CPU executor (docs/speculation.md): drafts by
// prompt lookup, verified in the batched step, never change the output. Greedy ids equal
// llama.cpp's golden ids on stories260K and equal the undrafted run on the zoo's files; seeded
// sampling gives the very same tokens, and 2,000 independent samples follow the undrafted
// distribution (chi-square); penalties and logprobs go through verification unchanged; a job's
// own `off` wins over the server's `always`.
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "actors/batcher.hpp"
#include "actors/executor.hpp"
#include "actors/messages.hpp"
#include "model/llama.hpp"
#include "model/make_model.hpp"
#include "tests/support/batcher_rig.hpp"
#include "tests/support/enum_print.hpp"
#include "tests/support/reference.hpp"

BOOST_AUTO_TEST_SUITE(test_actors_speculation)

using namespace sy;
using namespace sy::test;

namespace {

BatchingConfig spec_config(SpecMode m) {
  BatchingConfig bc;
  bc.step_token_budget = 256;
  bc.max_sequences = 64;
  bc.prefill_chunk = 64;
  bc.kv_block_size = 16;
  bc.kv_memory_mb = 16;
  bc.speculative = m;
  return bc;
}

struct Run {
  std::vector<DoneEvent> done;  // per job, in submission order
  std::vector<Seen> seen;
  BatcherStats stats;
};

// Runs the jobs `make` builds (one per prompt) through a fresh batcher and CPU executor on
// `model` with speculation `mode`, all submitted at once.
// With `draft`, the executor drafts with that model instead of prompt lookup.
Run run(SpecMode mode, std::shared_ptr<LlamaModel> model,
        const std::vector<std::vector<int32_t>>& prompts, uint32_t max_tokens,
        const std::function<void(Job&, size_t)>& make = {}, bool stream = false,
        std::shared_ptr<LlamaModel> draft = nullptr) {
  Rig rig;
  rig.model = std::move(model);
  const BatchingConfig bc = spec_config(mode);
  const int32_t n_blocks = kv_blocks_for(bc, rig.model->limits().kv_bytes_per_token());
  ExecutorSpec es = cpu_spec();
  es.draft_model = std::move(draft);
  rig.start(bc, n_blocks, es);
  std::vector<uint64_t> uids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Job j = rig.job(prompts[i], max_tokens, stream);
    if (make) make(j, i);
    uids.push_back(rig.submit(j));
  }
  rig.wait_all(uids);
  Run out;
  for (uint64_t u : uids) {
    const Seen& s = rig.seen[u];
    BOOST_TEST_REQUIRE(s.errors == 0, "job " << u << ": " << s.error.message);
    out.done.push_back(s.outcome.done);
    out.seen.push_back(s);
  }
  out.stats = rig.stats(rig.batcher);
  return out;
}

std::vector<std::vector<int32_t>> golden_prompts(std::vector<std::vector<int32_t>>* ids) {
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& c : test::reference_cases(64)) {
    prompts.push_back(c.prompt_token_ids);
    if (ids) ids->push_back(c.generated_token_ids);
  }
  return prompts;
}

// Prompts a continuation can copy from: a golden prompt, its golden continuation, and the prompt
// again (a story retold), so that prompt lookup finds long matches.
std::vector<std::vector<int32_t>> copy_heavy_prompts() {
  std::vector<std::vector<int32_t>> ids;
  const auto prompts = golden_prompts(&ids);
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> p = prompts[i];
    p.insert(p.end(), ids[i].begin(), ids[i].begin() + 48);
    p.insert(p.end(), prompts[i].begin() + 1, prompts[i].end());  // (no second BOS)
    out.push_back(std::move(p));
  }
  return out;
}

std::string zoo_path(const std::string& name, const char* ext) {
  return std::string(SY_MODELS_DIR) + "/zoo/zoo-" + name + ext;
}

std::vector<std::vector<int32_t>> zoo_prompts(const std::string& name) {
  std::ifstream f(zoo_path(name, ".json"));
  BOOST_REQUIRE_MESSAGE(f, "cannot open " << zoo_path(name, ".json"));
  std::stringstream ss;
  ss << f.rdbuf();
  const nlohmann::json root = nlohmann::json::parse(ss.str());
  std::vector<std::vector<int32_t>> out;
  for (const auto& c : root.at("cases")) {
    std::vector<int32_t> p;
    for (const auto& v : c.at("prompt_token_ids")) p.push_back(v.get<int32_t>());
    // Repeated once, so that lookup has something to draft from on a random-weight model.
    std::vector<int32_t> twice = p;
    twice.insert(twice.end(), p.begin() + 1, p.end());
    out.push_back(std::move(twice));
  }
  return out;
}

// stories260K cut to its first `layers` layers (make-model --keep-layers), loaded.
std::shared_ptr<LlamaModel> stories_draft(int layers) {
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("sy-draft-" + std::to_string(::getpid()) + "-" + std::to_string(layers) + ".gguf"))
          .string();
  make_model_keep_layers(kModels + "/stories260K.gguf", layers, path);
  auto m = LlamaModel::load(path);
  std::filesystem::remove(path);  // the mapping stays valid
  return m;
}

// The upper 0.1% point of the chi-square distribution with `df` degrees of freedom
// (Wilson-Hilferty: accurate to a few per cent from df = 3 on).
double chi2_critical_999(int df) {
  const double z = 3.090232;  // the standard normal's upper 0.1% point
  const double k = static_cast<double>(df);
  const double t = 1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k));
  return k * t * t * t;
}

}  // namespace

BOOST_AUTO_TEST_CASE(greedy_ids_equal_golden_with_drafts) {
  std::vector<std::vector<int32_t>> gold;
  const auto prompts = golden_prompts(&gold);
  for (bool stream : {false, true}) {
    const Run r = run(SpecMode::always, stories(), prompts, 64, {}, stream);
    for (size_t i = 0; i < prompts.size(); ++i) {
      BOOST_TEST_CONTEXT("prompt " << i << (stream ? " streamed" : "")) {
        const std::vector<int32_t>& got = stream ? r.seen[i].stream_ids : r.done[i].ids;
        BOOST_TEST(got == gold[i], boost::test_tools::per_element());
        BOOST_TEST(r.done[i].completion_tokens == 64u);
        if (stream) BOOST_TEST(r.seen[i].contiguous);
      }
    }
    // Verification really ran, with drafts both accepted and refused.
    BOOST_TEST(r.stats.spec_draft_tokens > 0);
    BOOST_TEST(r.stats.spec_accepted_tokens > 0);
    BOOST_TEST(r.stats.spec_accepted_tokens <= r.stats.spec_draft_tokens);
    BOOST_TEST(r.stats.tokens == static_cast<int64_t>(prompts.size()) * 64);
    BOOST_TEST(r.stats.blocks_used == 0);
  }
}

BOOST_AUTO_TEST_CASE(copy_heavy_prompts_accept_most_drafts_and_keep_the_ids) {
  const auto prompts = copy_heavy_prompts();
  const Run off = run(SpecMode::off, stories(), prompts, 48);
  const Run on = run(SpecMode::always, stories(), prompts, 48);
  BOOST_TEST(off.stats.spec_draft_tokens == 0);
  for (size_t i = 0; i < prompts.size(); ++i)
    BOOST_TEST(on.done[i].ids == off.done[i].ids, boost::test_tools::per_element());
  // Fewer steps for the same tokens: each accepted draft saved one.
  BOOST_TEST(on.stats.spec_accepted_tokens > 0);
  BOOST_TEST(on.stats.steps < off.stats.steps);
  BOOST_TEST_MESSAGE("copy-heavy: drafted " << on.stats.spec_draft_tokens << ", accepted "
                                            << on.stats.spec_accepted_tokens << ", steps "
                                            << on.stats.steps << " vs " << off.stats.steps);
}

BOOST_AUTO_TEST_CASE(zoo_greedy_ids_equal_with_and_without_drafts) {
  for (const char* name : {"llama3-f32", "qwen2-f32", "gemma2-f32", "phi3-f32", "mixtral-f32",
                           "qwen2moe-f32", "olmoe-f32", "llama3-q4_k_m", "mixtral-q4_k_m"}) {
    BOOST_TEST_CONTEXT("zoo-" << name) {
      auto model = LlamaModel::load(zoo_path(name, ".gguf"));
      const auto prompts = zoo_prompts(name);
      const Run off = run(SpecMode::off, model, prompts, 24);
      const Run on = run(SpecMode::always, model, prompts, 24);
      for (size_t i = 0; i < prompts.size(); ++i)
        BOOST_TEST(on.done[i].ids == off.done[i].ids, boost::test_tools::per_element());
      BOOST_TEST(on.stats.spec_draft_tokens > 0);
      BOOST_TEST_MESSAGE("zoo-" << name << ": drafted " << on.stats.spec_draft_tokens
                                << ", accepted " << on.stats.spec_accepted_tokens);
    }
  }
}

BOOST_AUTO_TEST_CASE(seeded_sampling_gives_the_same_tokens_with_drafts) {
  // Each row is sampled with the draws an undrafted decode would make there, so a seed gives the
  // same tokens whether drafts ran or not: penalties and logprobs included.
  const auto base = copy_heavy_prompts();
  std::vector<std::vector<int32_t>> prompts;
  for (int k = 0; k < 40; ++k) prompts.push_back(base[static_cast<size_t>(k) % base.size()]);
  auto make = [](Job& j, size_t i) {
    j.temperature = 0.7f;
    j.top_k = 40;
    j.top_p = 0.95f;
    j.seed = 1000 + i;
    j.logprobs = 3;
    if (i % 2) j.controls.repetition_penalty = 1.2f;
  };
  const Run off = run(SpecMode::off, stories(), prompts, 32, make);
  const Run on = run(SpecMode::always, stories(), prompts, 32, make);
  BOOST_TEST(on.stats.spec_accepted_tokens > 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    BOOST_TEST_CONTEXT("job " << i) {
      BOOST_TEST(on.done[i].ids == off.done[i].ids, boost::test_tools::per_element());
      BOOST_TEST_REQUIRE(on.done[i].logprob.size() == off.done[i].logprob.size());
      BOOST_TEST(on.done[i].top_ids == off.done[i].top_ids, boost::test_tools::per_element());
      // Rows of a verification step and of a one-token decode sum in different orders: f32
      // rounding over stories260K's 64-wide dot products and 512-entry softmax stays far below
      // 1e-3; a wrong row (another position's) moves a logprob by tenths.
      for (size_t k = 0; k < on.done[i].logprob.size(); ++k)
        BOOST_TEST(std::abs(on.done[i].logprob[k] - off.done[i].logprob[k]) < 1e-3f);
    }
  }
}

BOOST_AUTO_TEST_CASE(sampled_distribution_matches_undrafted_chi_square) {
  // 2,000 samples each, independent seeds: the tokens at a few positions, drafted against
  // undrafted, in a two-sample chi-square test at the 0.1% level.
  const auto base = copy_heavy_prompts();
  const std::vector<int32_t> prompt = base[0];
  constexpr size_t kSamples = 2000;
  constexpr uint32_t kTokens = 8;
  const std::vector<std::vector<int32_t>> prompts(kSamples, prompt);
  auto seeded = [](uint64_t from) {
    return [from](Job& j, size_t i) {
      j.temperature = 1.0f;
      j.seed = from + i;
    };
  };
  const Run off = run(SpecMode::off, stories(), prompts, kTokens, seeded(1));
  const Run on = run(SpecMode::always, stories(), prompts, kTokens, seeded(1'000'001));
  BOOST_TEST(on.stats.spec_accepted_tokens > 0);
  for (uint32_t pos : {1u, 4u, 7u}) {
    std::map<int32_t, std::pair<double, double>> counts;  // token -> (off, on)
    double n_off = 0, n_on = 0;
    for (size_t i = 0; i < kSamples; ++i) {
      if (off.done[i].ids.size() > pos) {
        counts[off.done[i].ids[pos]].first += 1;
        n_off += 1;
      }
      if (on.done[i].ids.size() > pos) {
        counts[on.done[i].ids[pos]].second += 1;
        n_on += 1;
      }
    }
    // Tokens seen fewer than 10 times in both runs together share one bin, so that every bin's
    // expected count is large enough for the chi-square approximation.
    std::vector<std::pair<double, double>> bins;
    std::pair<double, double> rare{0, 0};
    for (const auto& [id, c] : counts) {
      if (c.first + c.second >= 10)
        bins.push_back(c);
      else {
        rare.first += c.first;
        rare.second += c.second;
      }
    }
    if (rare.first + rare.second > 0) bins.push_back(rare);
    BOOST_TEST_REQUIRE(bins.size() >= 4u, "position " << pos << " has too few outcomes to test");
    const double total = n_off + n_on;
    double chi2 = 0;
    for (const auto& [a, b] : bins) {
      const double row = a + b;
      const double ea = row * n_off / total, eb = row * n_on / total;
      chi2 += (a - ea) * (a - ea) / ea + (b - eb) * (b - eb) / eb;
    }
    const int df = static_cast<int>(bins.size()) - 1;
    BOOST_TEST_MESSAGE("position " << pos << ": chi-square " << chi2 << " on " << df
                                   << " degrees of freedom (critical " << chi2_critical_999(df)
                                   << ")");
    BOOST_TEST(chi2 < chi2_critical_999(df), "position " << pos);
  }
}

BOOST_AUTO_TEST_CASE(samples_of_one_prompt_draft_each_on_their_own) {
  // n samples share the prompt's KV and fork: each sample drafts and verifies in its own blocks;
  // every choice equals the undrafted run's.
  const auto prompts = copy_heavy_prompts();
  auto make = [](Job& j, size_t i) {
    j.n = 3;
    j.temperature = 0.8f;
    j.seed = 77 + i;
  };
  const Run off = run(SpecMode::off, stories(), prompts, 24, make);
  const Run on = run(SpecMode::always, stories(), prompts, 24, make);
  BOOST_TEST(on.stats.spec_draft_tokens > 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    BOOST_TEST_REQUIRE(on.done[i].choices.size() == 3u);
    BOOST_TEST_REQUIRE(off.done[i].choices.size() == 3u);
    for (size_t c = 0; c < 3; ++c)
      BOOST_TEST(on.done[i].choices[c].ids == off.done[i].choices[c].ids,
                 boost::test_tools::per_element());
  }
  BOOST_TEST(on.stats.blocks_used == 0);
}

BOOST_AUTO_TEST_CASE(a_jobs_off_wins_over_the_servers_always) {
  const auto prompts = copy_heavy_prompts();
  const Run r = run(SpecMode::always, stories(), prompts, 32,
                    [](Job& j, size_t) { j.speculative = SpecMode::off; });
  BOOST_TEST(r.stats.spec_draft_tokens == 0);
  const Run a = run(SpecMode::off, stories(), prompts, 32,
                    [](Job& j, size_t) { j.speculative = SpecMode::always; });
  BOOST_TEST(a.stats.spec_draft_tokens > 0);
  for (size_t i = 0; i < prompts.size(); ++i)
    BOOST_TEST(a.done[i].ids == r.done[i].ids, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(drafts_stop_at_max_tokens_and_stop_strings) {
  // Drafts never carry a job past max_tokens; a stop string inside accepted drafts ends the job
  // where the undrafted run ends it.
  const auto prompts = copy_heavy_prompts();
  const Tokenizer& tok = stories()->tokenizer();
  for (uint32_t max_tokens : {1u, 2u, 5u, 13u}) {
    const Run off = run(SpecMode::off, stories(), prompts, max_tokens);
    const Run on = run(SpecMode::always, stories(), prompts, max_tokens);
    for (size_t i = 0; i < prompts.size(); ++i) {
      BOOST_TEST(on.done[i].ids == off.done[i].ids, boost::test_tools::per_element());
      BOOST_TEST(on.done[i].completion_tokens == max_tokens);
    }
  }
  const Run full = run(SpecMode::off, stories(), prompts, 40);
  std::vector<std::string> stops;
  for (const DoneEvent& d : full.done) {
    const std::string text = tok.decode(d.ids);
    stops.push_back(text.substr(text.size() / 2, 6));
  }
  auto with_stop = [&](Job& j, size_t i) { j.stop = {stops[i]}; };
  const Run off = run(SpecMode::off, stories(), prompts, 40, with_stop, true);
  const Run on = run(SpecMode::always, stories(), prompts, 40, with_stop, true);
  for (size_t i = 0; i < prompts.size(); ++i) {
    BOOST_TEST(on.done[i].text == off.done[i].text);
    BOOST_TEST(on.seen[i].stream_text == off.seen[i].stream_text);
    BOOST_TEST(on.done[i].finish == FinishReason::stop);
  }
}

BOOST_AUTO_TEST_CASE(a_draft_model_keeps_the_golden_greedy_ids) {
  // Drafts from stories260K's first two layers: whatever they draft, the ids are the target's.
  std::vector<std::vector<int32_t>> gold;
  const auto prompts = golden_prompts(&gold);
  const auto draft = stories_draft(2);
  BOOST_TEST(draft->config().n_layers == 2);
  BOOST_TEST(draft_vocabulary_mismatch(*stories(), *draft).empty());
  const Run r = run(SpecMode::always, stories(), prompts, 64, {}, true, draft);
  for (size_t i = 0; i < prompts.size(); ++i) {
    BOOST_TEST_CONTEXT("prompt " << i) {
      BOOST_TEST(r.done[i].ids == gold[i], boost::test_tools::per_element());
      BOOST_TEST(r.seen[i].stream_ids == gold[i], boost::test_tools::per_element());
      BOOST_TEST(r.seen[i].contiguous);
    }
  }
  BOOST_TEST(r.stats.spec_draft_tokens > 0);
  BOOST_TEST(r.stats.spec_accepted_tokens <= r.stats.spec_draft_tokens);
  BOOST_TEST(r.stats.tokens == static_cast<int64_t>(prompts.size()) * 64);
  BOOST_TEST(r.stats.blocks_used == 0);
  BOOST_TEST_MESSAGE("two-layer draft: drafted " << r.stats.spec_draft_tokens << ", accepted "
                                                 << r.stats.spec_accepted_tokens);
}

BOOST_AUTO_TEST_CASE(a_draft_model_equal_to_the_target_has_its_drafts_accepted) {
  // The target as its own draft computes the same function: its greedy drafts are the target's
  // greedy tokens but where the sums of a one-token step and of a verification step round a
  // near tie differently, which is rare. A draft written into the wrong slot, fed at the wrong
  // position or drafted from a stale cache would be refused most of the time.
  std::vector<std::vector<int32_t>> gold;
  const auto prompts = golden_prompts(&gold);
  const Run r = run(SpecMode::always, stories(), prompts, 64, {}, false, stories());
  for (size_t i = 0; i < prompts.size(); ++i)
    BOOST_TEST(r.done[i].ids == gold[i], boost::test_tools::per_element());
  BOOST_TEST_REQUIRE(r.stats.spec_draft_tokens > 0);
  BOOST_TEST(r.stats.spec_accepted_tokens >= r.stats.spec_draft_tokens * 9 / 10);
  // Fewer steps than tokens: each accepted draft saved a step.
  BOOST_TEST(r.stats.steps < static_cast<int64_t>(64));
}

BOOST_AUTO_TEST_CASE(a_draft_model_keeps_seeded_samples) {
  const auto base = copy_heavy_prompts();
  std::vector<std::vector<int32_t>> prompts;
  for (int k = 0; k < 12; ++k) prompts.push_back(base[static_cast<size_t>(k) % base.size()]);
  auto make = [](Job& j, size_t i) {
    j.temperature = 0.8f;
    j.seed = 500 + i;
    if (i % 3 == 0) j.controls.repetition_penalty = 1.1f;
  };
  const Run off = run(SpecMode::off, stories(), prompts, 32, make);
  const Run on = run(SpecMode::always, stories(), prompts, 32, make, false, stories_draft(3));
  BOOST_TEST(on.stats.spec_draft_tokens > 0);
  for (size_t i = 0; i < prompts.size(); ++i)
    BOOST_TEST(on.done[i].ids == off.done[i].ids, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_draft_of_another_vocabulary_is_named) {
  // (The zoo's other files share stories260K's vocabulary; phi3 has its own.)
  const auto other = LlamaModel::load(zoo_path("phi3-f32", ".gguf"));
  const std::string why = draft_vocabulary_mismatch(*stories(), *other);
  BOOST_TEST(why.find("tokenizer.ggml.tokens") != std::string::npos, why);
  BOOST_TEST(draft_vocabulary_mismatch(*stories(), *stories()).empty());
}

BOOST_AUTO_TEST_SUITE_END()  // test_actors_speculation
