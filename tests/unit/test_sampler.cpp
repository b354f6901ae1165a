// Sampler tests: greedy and its ties, seeded determinism, top-k / top-p filtering, the shape of
// the sampled distribution, reported log-probabilities, parameter validation and logits that
// give no distribution (NaN, +inf, all masked).
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/sampler.hpp"

BOOST_AUTO_TEST_SUITE(test_sampler)

using sy::Sampler;
using sy::SamplingParams;
using sy::TokenLogprob;

namespace {

std::vector<float> random_logits(int n, uint64_t seed, float scale = 3.0f) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v)
    x = scale * (static_cast<float>(rng() >> 40) / static_cast<float>(1 << 24) - 0.5f);
  return v;
}

int argmax(const std::vector<float>& v) {
  int b = 0;
  for (int i = 1; i < static_cast<int>(v.size()); ++i)
    if (v[static_cast<size_t>(i)] > v[static_cast<size_t>(b)]) b = i;
  return b;
}

SamplingParams temp(float t, uint64_t seed, int top_k = 0, float top_p = 1.0f) {
  SamplingParams p;
  p.temperature = t;
  p.seed = seed;
  p.top_k = top_k;
  p.top_p = top_p;
  return p;
}

std::vector<int32_t> draw(const SamplingParams& p, const std::vector<float>& logits, int n) {
  Sampler s(p);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i)
    out.push_back(s.sample(logits.data(), static_cast<int32_t>(logits.size())));
  return out;
}

// True when constructing a sampler from p throws std::invalid_argument mentioning `field`.
bool rejects(const SamplingParams& p, const std::string& field) {
  try {
    Sampler s(p);
  } catch (const std::invalid_argument& e) {
    return std::string(e.what()).find(field) != std::string::npos;
  }
  return false;
}

}  // namespace

BOOST_AUTO_TEST_CASE(greedy_is_argmax) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    auto l = random_logits(1000, seed);
    Sampler s(SamplingParams{});
    BOOST_TEST(s.sample(l.data(), 1000) == argmax(l));
  }
}

BOOST_AUTO_TEST_CASE(greedy_ties_go_to_lowest_id) {
  std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f, 2.0f};
  Sampler s(temp(-1.0f, 0));
  BOOST_TEST(s.sample(l.data(), 5) == 1);
  std::vector<float> flat(64, 0.25f);
  BOOST_TEST(s.sample(flat.data(), 64) == 0);
}

BOOST_AUTO_TEST_CASE(top_k_one_equals_greedy) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    auto l = random_logits(500, seed + 100);
    auto ids = draw(temp(1.5f, seed, 1), l, 10);
    for (int32_t id : ids) BOOST_TEST(id == argmax(l));
  }
  // Ties under top-k = 1 keep the lowest id too.
  std::vector<float> tie = {1.0f, 3.0f, 3.0f};
  BOOST_TEST(draw(temp(1.0f, 7, 1), tie, 5) == std::vector<int32_t>(5, 1));
}

BOOST_AUTO_TEST_CASE(same_seed_same_tokens_different_seed_differs) {
  auto l = random_logits(256, 3, 2.0f);
  auto a = draw(temp(1.0f, 42), l, 64);
  auto b = draw(temp(1.0f, 42), l, 64);
  auto c = draw(temp(1.0f, 43), l, 64);
  BOOST_TEST(a == b);
  BOOST_TEST(a != c);
  // Same with filters on.
  BOOST_TEST(draw(temp(0.8f, 9, 40, 0.9f), l, 64) == draw(temp(0.8f, 9, 40, 0.9f), l, 64));
}

BOOST_AUTO_TEST_CASE(small_top_p_is_argmax) {
  for (uint64_t seed = 0; seed < 10; ++seed) {
    auto l = random_logits(300, seed + 7);
    for (int32_t id : draw(temp(2.0f, seed, 0, 1e-6f), l, 10)) BOOST_TEST(id == argmax(l));
  }
}

BOOST_AUTO_TEST_CASE(top_k_restricts_to_the_k_best) {
  auto l = random_logits(200, 11);
  std::vector<float> sorted = l;
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  const float kth = sorted[4];
  for (int32_t id : draw(temp(5.0f, 1, 5), l, 500)) BOOST_TEST(l[static_cast<size_t>(id)] >= kth);
}

BOOST_AUTO_TEST_CASE(top_p_keeps_the_nucleus) {
  // Probabilities 0.5, 0.3, 0.15, 0.05: top_p = 0.7 keeps {0, 1}; 0.85 adds id 2.
  std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  for (int32_t id : draw(temp(1.0f, 5, 0, 0.7f), l, 400)) BOOST_TEST(id <= 1);
  auto ids = draw(temp(1.0f, 5, 0, 0.85f), l, 2000);
  int n2 = 0;
  for (int32_t id : ids) {
    BOOST_TEST(id <= 2);
    n2 += id == 2;
  }
  BOOST_TEST(n2 > 0);
}

BOOST_AUTO_TEST_CASE(top_p_with_a_wide_nucleus) {
  // Near-flat logits over 2000 ids: the 0.5 nucleus holds ~1000 tokens, far past the first
  // sorted head, so the head must grow. Every draw lies in the brute-force nucleus.
  auto l = random_logits(2000, 21, 0.5f);
  std::vector<std::pair<float, int>> order;
  for (int i = 0; i < 2000; ++i) order.push_back({l[static_cast<size_t>(i)], i});
  std::sort(order.begin(), order.end(), [](auto a, auto b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  double z = 0;
  for (float x : l) z += std::exp(static_cast<double>(x));
  std::vector<bool> in(2000);
  double cum = 0;
  size_t size = 0;
  for (const auto& [x, i] : order) {
    in[static_cast<size_t>(i)] = true;
    ++size;
    cum += std::exp(static_cast<double>(x)) / z;
    if (cum >= 0.5) break;
  }
  BOOST_TEST(size > 500u);
  std::vector<bool> seen(2000);
  size_t distinct = 0;
  for (int32_t id : draw(temp(1.0f, 17, 0, 0.5f), l, 3000)) {
    BOOST_TEST(in[static_cast<size_t>(id)]);
    if (!seen[static_cast<size_t>(id)]) ++distinct, seen[static_cast<size_t>(id)] = true;
  }
  BOOST_TEST(distinct > 256u);
}

BOOST_AUTO_TEST_CASE(frequencies_follow_the_distribution) {
  // p = softmax(l / T) with T = 1: 0.6, 0.3, 0.1. 20000 draws: binomial sd <= 0.0035, so a
  // +-0.03 window is more than 8 sd wide.
  std::vector<float> l = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  const int n = 20000;
  std::vector<int> count(3);
  for (int32_t id : draw(temp(1.0f, 1234), l, n)) ++count[static_cast<size_t>(id)];
  BOOST_TEST(std::abs(count[0] / double(n) - 0.6) < 0.03);
  BOOST_TEST(std::abs(count[1] / double(n) - 0.3) < 0.03);
  BOOST_TEST(std::abs(count[2] / double(n) - 0.1) < 0.03);
  // T = 2 flattens: p ∝ sqrt(0.6), sqrt(0.3), sqrt(0.1) = 0.473, 0.335, 0.193.
  std::fill(count.begin(), count.end(), 0);
  for (int32_t id : draw(temp(2.0f, 99), l, n)) ++count[static_cast<size_t>(id)];
  BOOST_TEST(std::abs(count[0] / double(n) - 0.473) < 0.03);
  BOOST_TEST(std::abs(count[2] / double(n) - 0.193) < 0.03);
}

BOOST_AUTO_TEST_CASE(logprobs_sorted_normalized_and_temperature_free) {
  auto l = random_logits(1000, 77, 8.0f);
  SamplingParams p = temp(0.7f, 3);
  p.n_logprobs = 20;
  Sampler s(p);
  std::vector<TokenLogprob> top;
  float chosen_lp = 1.0f;
  const int32_t id = s.sample(l.data(), 1000, &top, &chosen_lp);
  BOOST_TEST_REQUIRE(top.size() == 20u);
  BOOST_TEST(top[0].id == argmax(l));
  for (size_t i = 1; i < top.size(); ++i) BOOST_TEST(top[i - 1].logprob >= top[i].logprob);
  // Reference log-softmax in double.
  double mx = l[static_cast<size_t>(argmax(l))], z = 0;
  for (float x : l) z += std::exp(x - mx);
  const double log_z = mx + std::log(z);
  for (const auto& t : top)
    BOOST_TEST(std::abs(t.logprob - (l[static_cast<size_t>(t.id)] - log_z)) < 1e-4);
  BOOST_TEST(std::abs(chosen_lp - (l[static_cast<size_t>(id)] - log_z)) < 1e-4);
  // The full distribution sums to one; the top 20 to at most one.
  double sum_top = 0;
  for (const auto& t : top) sum_top += std::exp(t.logprob);
  BOOST_TEST(sum_top <= 1.0 + 1e-5);
  double sum_all = 0;
  for (float x : l) sum_all += std::exp(x - log_z);
  BOOST_TEST(std::abs(sum_all - 1.0) < 1e-6);
  // Every token outside the list is no more likely than the last one in it.
  std::vector<bool> in(1000);
  for (const auto& t : top) in[static_cast<size_t>(t.id)] = true;
  for (int i = 0; i < 1000; ++i)
    if (!in[static_cast<size_t>(i)])
      BOOST_TEST(l[static_cast<size_t>(i)] <= l[static_cast<size_t>(top.back().id)]);
}

BOOST_AUTO_TEST_CASE(logprobs_of_a_uniform_distribution_and_small_vocab) {
  SamplingParams p;
  p.n_logprobs = 5;
  Sampler s(p);
  std::vector<float> flat(4, 1.0f);
  std::vector<TokenLogprob> top;
  float lp = 0;
  BOOST_TEST(s.sample(flat.data(), 4, &top, &lp) == 0);
  BOOST_TEST_REQUIRE(top.size() == 4u);  // capped by the vocabulary
  for (size_t i = 0; i < 4; ++i) {
    BOOST_TEST(top[i].id == static_cast<int32_t>(i));  // ties by id
    BOOST_TEST(std::abs(top[i].logprob - std::log(0.25f)) < 1e-6);
  }
  BOOST_TEST(std::abs(lp - std::log(0.25f)) < 1e-6);
  // n_logprobs = 0 leaves the list empty.
  Sampler none(SamplingParams{});
  top.assign(3, TokenLogprob{});
  none.sample(flat.data(), 4, &top, nullptr);
  BOOST_TEST(top.empty());
}

BOOST_AUTO_TEST_CASE(masked_logits_are_never_drawn) {
  std::vector<float> l = {-INFINITY, 0.0f, -INFINITY, 0.0f};
  for (int32_t id : draw(temp(1.0f, 8), l, 200)) BOOST_TEST((id == 1 || id == 3));
  for (int32_t id : draw(temp(1.0f, 8, 0, 0.5f), l, 50)) BOOST_TEST(id == 1);
}

BOOST_AUTO_TEST_CASE(invalid_params_are_rejected_by_name) {
  SamplingParams p;
  p.top_k = -1;
  BOOST_TEST(rejects(p, "top_k"));
  p = {};
  p.top_p = 0.0f;
  BOOST_TEST(rejects(p, "top_p"));
  p.top_p = 1.5f;
  BOOST_TEST(rejects(p, "top_p"));
  p.top_p = NAN;
  BOOST_TEST(rejects(p, "top_p"));
  p = {};
  p.n_logprobs = 21;
  BOOST_TEST(rejects(p, "n_logprobs"));
  p.n_logprobs = -1;
  BOOST_TEST(rejects(p, "n_logprobs"));
  p = {};
  p.temperature = NAN;
  BOOST_TEST(rejects(p, "temperature"));
  // The limits themselves are accepted.
  p = {};
  p.top_p = 1.0f;
  p.n_logprobs = 20;
  BOOST_CHECK_NO_THROW(Sampler{p});
}

BOOST_AUTO_TEST_CASE(logits_without_a_distribution_are_refused_not_sampled) {
  // A NaN or +inf anywhere, or every logit -inf: SamplingError naming the cause, for greedy and
  // random sampling alike (either would otherwise return an arbitrary token).
  for (float t : {0.0f, 0.8f}) {
    BOOST_TEST_CONTEXT("temperature " << t) {
      for (float bad : {NAN, INFINITY}) {
        for (size_t at : {size_t{0}, size_t{2}}) {
          std::vector<float> l = {0.5f, 1.0f, 0.25f};
          l[at] = bad;
          Sampler s(temp(t, 3));
          try {
            s.sample(l.data(), 3);
            BOOST_FAIL("no SamplingError");
          } catch (const sy::SamplingError& e) {
            const std::string m = e.what();
            BOOST_TEST(m.find(std::isnan(bad) ? "NaN" : "+inf") != std::string::npos, m);
            BOOST_TEST(m.find("token id " + std::to_string(at)) != std::string::npos, m);
          }
        }
      }
      std::vector<float> masked(4, -INFINITY);
      Sampler s(temp(t, 3));
      BOOST_CHECK_THROW(s.sample(masked.data(), 4), sy::SamplingError);
      // After a refusal the sampler still works.
      std::vector<float> ok = {0.0f, 2.0f, -INFINITY};
      if (t == 0.0f)
        BOOST_TEST(s.sample(ok.data(), 3) == 1);
      else
        BOOST_TEST(s.sample(ok.data(), 3) != 2);
    }
  }
}

// ---- sampling controls and filters ----

namespace {

// A filter allowing the ids of a set; counts its calls so a test can see which path ran.
struct SetFilter : sy::TokenFilter {
  std::vector<bool> ok;
  int allows_calls = 0, mask_calls = 0;
  explicit SetFilter(std::vector<bool> allowed) : ok(std::move(allowed)) {}
  bool allows(int32_t id) override {
    ++allows_calls;
    return ok[static_cast<size_t>(id)];
  }
  void mask(float* logits, int32_t n) override {
    ++mask_calls;
    for (int32_t i = 0; i < n; ++i)
      if (!ok[static_cast<size_t>(i)]) logits[i] = -INFINITY;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(logit_bias_moves_the_greedy_choice) {
  std::vector<float> l = {1.0f, 3.0f, 2.0f};
  SamplingParams p;
  p.controls.logit_bias = {{2, 1.5f}};
  Sampler s(p);
  float lp = 0.0f;
  std::vector<TokenLogprob> top;
  p.n_logprobs = 1;
  Sampler with_top(p);
  BOOST_TEST(s.sample(l.data(), 3) == 2);  // 2 + 1.5 > 3
  // The reported log-probabilities stay the model's own: token 1 is still the most likely.
  BOOST_TEST(with_top.sample(l.data(), 3, &top, &lp) == 2);
  BOOST_REQUIRE(top.size() == 1u);
  BOOST_TEST(top[0].id == 1);
  // -100 bans a token; every token banned is an error, not an arbitrary pick.
  SamplingParams ban;
  ban.controls.logit_bias = {{1, -100.0f}};
  Sampler b(ban);
  BOOST_TEST(b.sample(l.data(), 3) == 2);
  std::vector<float> one = {0.0f};
  SamplingParams all;
  all.controls.logit_bias = {{0, -100.0f}};
  Sampler a(all);
  BOOST_TEST(a.sample(one.data(), 1) == 0);  // -100 leaves a finite logit: still drawable
}

BOOST_AUTO_TEST_CASE(penalties_follow_their_definitions) {
  // presence: once per token in the output; frequency: per occurrence; prompt tokens do not count.
  std::vector<float> l = {2.0f, 1.9f, 0.0f};
  SamplingParams p;
  p.controls.presence_penalty = 0.5f;
  Sampler s(p);
  s.accept(0, false);  // prompt: no penalty
  BOOST_TEST(s.sample(l.data(), 3) == 0);
  s.accept(0, true);  // output: 2.0 - 0.5 = 1.5 < 1.9
  BOOST_TEST(s.sample(l.data(), 3) == 1);

  SamplingParams f;
  f.controls.frequency_penalty = 0.06f;
  Sampler fs(f);
  fs.accept(0, true);
  BOOST_TEST(fs.sample(l.data(), 3) == 0);  // 2.0 - 0.06 = 1.94 > 1.9
  fs.accept(0, true);
  BOOST_TEST(fs.sample(l.data(), 3) == 1);  // 2.0 - 0.12 = 1.88 < 1.9

  // repetition (llama.cpp): divide a positive logit, multiply a negative one; over the last
  // repeat_last_n tokens of prompt and output.
  std::vector<float> r = {2.0f, 1.5f, -1.0f, -1.2f};
  SamplingParams rp;
  rp.controls.repetition_penalty = 2.0f;
  rp.controls.repeat_last_n = 2;
  Sampler rs(rp);
  rs.accept(0, false);  // 2.0 / 2 = 1.0 < 1.5
  BOOST_TEST(rs.sample(r.data(), 4) == 1);
  rs.accept(1, true);  // 1.5 / 2 = 0.75: token 0 (1.0) wins again
  BOOST_TEST(rs.sample(r.data(), 4) == 0);
  rs.accept(3, true);  // the window of 2 now holds 1 and 3: token 0 is free again
  BOOST_TEST(rs.sample(r.data(), 4) == 0);
  std::vector<float> neg = {-1.0f, -1.5f};
  SamplingParams np;
  np.controls.repetition_penalty = 2.0f;
  Sampler ns(np);
  ns.accept(0, true);  // -1 * 2 = -2 < -1.5
  BOOST_TEST(ns.sample(neg.data(), 2) == 1);
}

BOOST_AUTO_TEST_CASE(min_p_keeps_tokens_near_the_top) {
  // Probabilities 0.5, 0.3, 0.2 (logits their logs): min_p 0.5 keeps those at >= 0.25.
  std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  SamplingParams p = temp(1.0f, 7);
  p.controls.min_p = 0.5f;
  std::vector<int> count(3, 0);
  for (int32_t id : draw(p, l, 4000)) ++count[static_cast<size_t>(id)];
  BOOST_TEST(count[2] == 0);
  // The two kept, renormalised: 0.625 and 0.375 (4000 draws: 3 sigma is about 0.023).
  BOOST_TEST(std::abs(count[0] / 4000.0 - 0.625) < 0.03);
}

BOOST_AUTO_TEST_CASE(a_filter_keeps_an_allowed_greedy_pick_and_replaces_a_refused_one) {
  std::vector<float> l = {0.0f, 5.0f, 4.0f, 3.0f};
  SetFilter all({true, true, true, true});
  Sampler s(SamplingParams{});
  BOOST_TEST(s.sample(l.data(), 4, nullptr, nullptr, &all) == 1);
  BOOST_TEST(all.mask_calls == 0);  // the drawn token was allowed: no mask made
  SetFilter no1({true, false, true, true});
  BOOST_TEST(s.sample(l.data(), 4, nullptr, nullptr, &no1) == 2);
  BOOST_TEST(no1.mask_calls == 1);
  SetFilter none({false, false, false, false});
  BOOST_CHECK_THROW(s.sample(l.data(), 4, nullptr, nullptr, &none), sy::SamplingError);
}

BOOST_AUTO_TEST_CASE(a_filtered_draw_is_the_allowed_part_of_the_distribution) {
  // Temperature alone: check first, mask on refusal. The result must be the distribution
  // restricted to the allowed tokens: p(1) : p(3) = e^2 : e^0 whatever the refused mass.
  std::vector<float> l = {3.0f, 2.0f, 2.5f, 0.0f};
  SetFilter f({false, true, false, true});
  Sampler s(temp(1.0f, 11));
  int n1 = 0, n3 = 0;
  for (int i = 0; i < 20000; ++i) {
    const int32_t id = s.sample(l.data(), 4, nullptr, nullptr, &f);
    BOOST_REQUIRE((id == 1 || id == 3));
    (id == 1 ? n1 : n3)++;
  }
  const double want = std::exp(2.0) / (std::exp(2.0) + 1.0);  // 0.881
  BOOST_TEST(std::abs(n1 / 20000.0 - want) < 0.01);           // 3 sigma is about 0.007
  BOOST_TEST(n3 > 0);
  // With top-k the mask comes first: top-2 of the allowed tokens, not of all.
  SetFilter g({false, true, false, true});
  Sampler k(temp(1.0f, 5, 2));
  int seen3 = 0;
  for (int i = 0; i < 2000; ++i) seen3 += k.sample(l.data(), 4, nullptr, nullptr, &g) == 3;
  BOOST_TEST(seen3 > 0);  // top-2 of all tokens (0 and 2) would leave nothing allowed
  BOOST_TEST(g.allows_calls == 0);
}

BOOST_AUTO_TEST_CASE(controls_are_validated) {
  SamplingParams p;
  p.controls.min_p = 1.5f;
  BOOST_TEST(rejects(p, "min_p"));
  p = {};
  p.controls.presence_penalty = 2.5f;
  BOOST_TEST(rejects(p, "presence_penalty"));
  p = {};
  p.controls.frequency_penalty = NAN;
  BOOST_TEST(rejects(p, "frequency_penalty"));
  p = {};
  p.controls.repetition_penalty = 0.0f;
  BOOST_TEST(rejects(p, "repetition_penalty"));
  p = {};
  p.controls.repeat_last_n = -2;
  BOOST_TEST(rejects(p, "repeat_last_n"));
  p = {};
  p.controls.logit_bias = {{3, 101.0f}};
  BOOST_TEST(rejects(p, "logit_bias"));
}

BOOST_AUTO_TEST_SUITE_END()  // test_sampler
