// Speculation's policy (policies/speculation.hpp): prompt lookup finds the longest earlier n-gram
// and its most recent occurrence; the step cost model recovers a line; drafts are chosen only
// where they raise the step's tokens per microsecond: many at batch 1 where a token costs little
// beside the step's fixed cost, none in a large batch where every token costs its full share.
#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <vector>

#include "policies/speculation.hpp"

BOOST_AUTO_TEST_SUITE(test_policies_speculation)

using namespace sy::policy;

namespace {

// Steps whose every fed token gives a logit row (decodes, verifications): rows never part from
// tokens, so the fit is over tokens alone.
StepCostModel line(double intercept, double slope) {
  StepCostModel m;
  for (int k = 0; k < 40; ++k) {
    const int64_t n = 1 + (k % 8) * 9;
    m.observe(n, n, intercept + slope * static_cast<double>(n));
  }
  return m;
}

}  // namespace

BOOST_AUTO_TEST_CASE(lookup_takes_the_longest_suffix_and_its_latest_occurrence) {
  std::vector<int32_t> out;
  // ... 1 2 3 [9 9] ... 1 2 3 [7 7 7] ... 1 2 3: the latest earlier "1 2 3" is followed by 7s.
  const std::vector<int32_t> t = {1, 2, 3, 9, 9, 5, 1, 2, 3, 7, 7, 7, 4, 1, 2, 3};
  BOOST_TEST(ngram_draft(t.data(), static_cast<int32_t>(t.size()), 2, 4, 2, out) == 2);
  BOOST_TEST(out == (std::vector<int32_t>{7, 7}), boost::test_tools::per_element());
  // The longest n-gram wins over a more recent shorter one: "5 1 2 3" occurs once earlier.
  const std::vector<int32_t> u = {5, 1, 2, 3, 8, 8, 1, 2, 3, 6, 0, 5, 1, 2, 3};
  BOOST_TEST(ngram_draft(u.data(), static_cast<int32_t>(u.size()), 2, 4, 3, out) == 3);
  BOOST_TEST(out == (std::vector<int32_t>{8, 8, 1}), boost::test_tools::per_element());
  // A match near the end offers only what follows it, up to the suffix itself.
  const std::vector<int32_t> v = {4, 4, 4, 4};
  BOOST_TEST(ngram_draft(v.data(), 4, 2, 3, 8, out) == 1);
  BOOST_TEST(out == (std::vector<int32_t>{4}), boost::test_tools::per_element());
  // No n-gram of the allowed lengths repeats: nothing.
  const std::vector<int32_t> w = {1, 2, 3, 4, 5, 1};
  BOOST_TEST(ngram_draft(w.data(), 6, 2, 4, 5, out) == 0);
  BOOST_TEST(out.empty());
  BOOST_TEST(ngram_draft(w.data(), 6, 1, 4, 5, out) == 5);  // unigram "1"
  BOOST_TEST(ngram_draft(w.data(), 6, 1, 4, 0, out) == 0);  // k = 0
  BOOST_TEST(ngram_draft(w.data(), 1, 1, 4, 3, out) == 0);
}

BOOST_AUTO_TEST_CASE(cost_model_recovers_a_line_and_waits_for_spread) {
  const StepCostModel m = line(2000.0, 15.0);
  BOOST_TEST(m.ready());
  BOOST_TEST(m.draft_cost() == 15.0, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(m.predict(10, 10) == 2150.0, boost::test_tools::tolerance(1e-6));
  StepCostModel flat;
  for (int k = 0; k < 100; ++k) flat.observe(4, 4, 900.0);  // one token count: nothing to see
  BOOST_TEST(!flat.ready());
  BOOST_TEST(flat.draft_cost() == 0.0);
  StepCostModel few;
  for (int k = 0; k < 5; ++k) few.observe(1 + 50 * k, 1, 100.0 + k);
  BOOST_TEST(!few.ready());
}

BOOST_AUTO_TEST_CASE(cost_model_parts_logit_rows_from_fed_tokens) {
  // A step costs 1 ms, 10 us a fed token and 40 us a logit row (a large vocabulary): prefill
  // chunks feed many tokens for one row, decodes one token a row. A draft is both: 50 us, five
  // times what a prefill token costs; a fit over tokens alone would price it near 10 us.
  StepCostModel m;
  for (int k = 0; k < 60; ++k) {
    const int64_t seqs = 1 + k % 7;                  // decodes: one token and one row each
    const int64_t prefill = (k % 3 == 0) ? 200 : 0;  // and, some steps, a prompt chunk
    const int64_t n = seqs + prefill, r = seqs + (prefill ? 1 : 0);
    m.observe(n, r, 1000.0 + 10.0 * static_cast<double>(n) + 40.0 * static_cast<double>(r));
  }
  BOOST_TEST(m.ready());
  BOOST_TEST(m.draft_cost() == 50.0, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(m.predict(100, 4) == 2160.0, boost::test_tools::tolerance(1e-6));
}

BOOST_AUTO_TEST_CASE(drafts_pay_at_batch_one_and_not_in_a_busy_batch) {
  // A step costs 2 ms plus 15 us a token (a small model on a CPU: reading the weights dominates).
  const StepCostModel m = line(2000.0, 15.0);
  // Batch 1, acceptance 0.8, 6 drafts: each draft token j adds 0.8^j tokens at 15 us, against
  // 1 token per 2.015 ms now: all 6 pay (0.8^6 / 15 = 0.017 > 1.1 * 1/2015).
  auto one = choose_drafts({{6, 0.8}}, 1, 1, 1, m, 512, 0.1);
  BOOST_TEST(one == (std::vector<int32_t>{6}), boost::test_tools::per_element());
  // 64 decodes, 2 ms + 64 * 15 us: 64 tokens per 2.96 ms = 0.0216 per us; a draft at 0.8 gives
  // 0.8 / 15 = 0.053 per us: still worth it. At acceptance 0.2: 0.2/15 = 0.0133 < 0.0216: none.
  std::vector<SpecCandidate> busy(64, {6, 0.2});
  auto none = choose_drafts(busy, 64, 64, 64, m, 512, 0.1);
  for (int32_t d : none) BOOST_TEST(d == 0);
  // A compute-bound step (100 us fixed, 100 us a token): at batch 32 the step gives 32 tokens
  // per 3.3 ms, about 1/103 per us, and a draft at most 0.9/100: none.
  const StepCostModel compute = line(100.0, 100.0);
  std::vector<SpecCandidate> b32(32, {6, 0.9});
  for (int32_t d : choose_drafts(b32, 32, 32, 32, compute, 512, 0.1)) BOOST_TEST(d == 0);
  // ... while at batch 1 the same model takes some: the step gives 1/200 per us, the first draft
  // 0.9/100; each draft taken raises the step's own rate (1.9 tokens in 300 us, then 2.71 in
  // 400 us), so that the third (0.729/100 < 1.1 * 2.71/400) no longer pays.
  auto b1 = choose_drafts({{6, 0.9}}, 1, 1, 1, compute, 512, 0.1);
  BOOST_TEST(b1[0] >= 1);
  BOOST_TEST(b1[0] < 6);
}

BOOST_AUTO_TEST_CASE(drafts_go_to_the_likeliest_and_within_the_budget) {
  const StepCostModel m = line(2000.0, 15.0);
  auto t = choose_drafts({{4, 0.1}, {4, 0.9}, {0, 0.9}}, 3, 3, 3, m, 5, 0.1);
  BOOST_TEST(t[1] == 4);  // the likely one first
  BOOST_TEST(t[0] == 1);  // the budget's last token
  BOOST_TEST(t[2] == 0);  // nothing to draft
  // Not before the cost model is ready: no drafts on a guess.
  StepCostModel cold;
  auto c = choose_drafts({{4, 0.99}}, 1, 1, 1, cold, 100, 0.1);
  BOOST_TEST(c[0] == 0);
}

// Draft-model steps whose passes and tokens vary apart: p microseconds a pass, q a token.
DraftCostModel draft_line(double p, double q) {
  DraftCostModel m;
  for (int k = 0; k < 30; ++k) {
    const int64_t passes = 1 + k % 6, tokens = passes * (1 + k % 4) + (k % 5 == 0 ? 200 : 0);
    m.observe(passes, tokens, p * static_cast<double>(passes) + q * static_cast<double>(tokens));
  }
  return m;
}

BOOST_AUTO_TEST_CASE(draft_cost_model_parts_passes_from_tokens) {
  const DraftCostModel m = draft_line(300.0, 20.0);
  BOOST_TEST(m.ready());
  BOOST_TEST(m.per_pass() == 300.0, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(m.per_token() == 20.0, boost::test_tools::tolerance(1e-6));
  DraftCostModel few;
  for (int k = 0; k < 3; ++k) few.observe(1 + k, 5, 400.0);
  BOOST_TEST(!few.ready());
  BOOST_TEST(few.per_pass() == 0.0);
  // One token a pass always: the two cannot be parted, and a token carries the pass's cost.
  DraftCostModel tied;
  for (int k = 0; k < 10; ++k) tied.observe(1 + k, 1 + k, 120.0 * (1 + k));
  BOOST_TEST(tied.per_pass() == 0.0);
  BOOST_TEST(tied.per_token() == 120.0, boost::test_tools::tolerance(1e-6));
}

BOOST_AUTO_TEST_CASE(a_draft_model_prices_its_passes_and_catch_ups) {
  const StepCostModel target = line(2000.0, 15.0);
  // A cheap draft model (100 us a pass, 5 a token) at batch 1, acceptance 0.8, caught up: the
  // first draft costs 15 + 5 + 100 us for 0.8 tokens against 1 token per 2.015 ms: all 6 pay.
  const DraftCostModel cheap = draft_line(100.0, 5.0);
  auto one = choose_drafts({{6, 0.8, 1}}, 1, 1, 1, target, 512, 0.1, &cheap);
  BOOST_TEST(one[0] == 6);
  // The same sequence with 500 tokens to catch up: its first draft costs 2.6 ms for 0.8 tokens,
  // less than the step's 1 token per 2.015 ms: no drafts. A caught-up neighbour still drafts;
  // without the draft model's cost both would.
  auto two = choose_drafts({{6, 0.8, 500}, {6, 0.8, 1}}, 2, 2, 2, target, 512, 0.1, &cheap);
  BOOST_TEST(two[0] == 0);
  BOOST_TEST(two[1] == 6);
  auto blind = choose_drafts({{6, 0.8, 500}, {6, 0.8, 1}}, 2, 2, 2, target, 512, 0.1);
  BOOST_TEST(blind[0] == 6);
  // A draft model whose pass costs as much as a target step: at batch 4 and acceptance 0.6 even
  // all four first drafts together (2 ms + 4 x 35 us for 2.4 tokens) yield less than the step's
  // 4 tokens per 2.06 ms: none. Lookup at the same acceptance (15 us a draft) would take some.
  const DraftCostModel heavy = draft_line(2000.0, 20.0);
  std::vector<SpecCandidate> four(4, {6, 0.6, 1});
  for (int32_t d : choose_drafts(four, 4, 4, 4, target, 512, 0.1, &heavy)) BOOST_TEST(d == 0);
  int32_t lookup = 0;
  for (int32_t d : choose_drafts(four, 4, 4, 4, target, 512, 0.1)) lookup += d;
  BOOST_TEST(lookup > 0);
  // Until the draft model's cost is measured, only the target's is counted (as lookup).
  const DraftCostModel cold;
  BOOST_TEST(choose_drafts({{6, 0.8, 500}}, 1, 1, 1, target, 512, 0.1, &cold)[0] == 6);
}

BOOST_AUTO_TEST_CASE(guard_vetoes_drafts_where_they_measured_slower_by_batch_size) {
  BOOST_TEST(SpecGuard::bucket(1) == 0);
  BOOST_TEST(SpecGuard::bucket(2) == 1);
  BOOST_TEST(SpecGuard::bucket(3) == 2);
  BOOST_TEST(SpecGuard::bucket(4) == 2);
  BOOST_TEST(SpecGuard::bucket(5) == 3);
  BOOST_TEST(SpecGuard::bucket(64) == 6);
  BOOST_TEST(SpecGuard::bucket(65) == 7);
  BOOST_TEST(SpecGuard::bucket(100000) == 7);
  SpecGuard g;
  // Batch 16: plain steps give 16 tokens in 2 ms; drafting steps 20 tokens in 3 ms: slower.
  for (int k = 0; k < 3; ++k) {
    g.observe(16, false, 16, 2000.0);
    g.observe(16, true, 20, 3000.0);
  }
  BOOST_TEST(g.allows(16));  // not seen enough of either yet
  g.observe(16, false, 16, 2000.0);
  g.observe(16, true, 20, 3000.0);
  BOOST_TEST(!g.allows(16));
  BOOST_TEST(!g.allows(9));  // the same bucket (9-16)
  // Batch 1: drafting steps give 5 tokens in 2 ms against 1 in 1 ms: allowed.
  for (int k = 0; k < 4; ++k) {
    g.observe(1, false, 1, 1000.0);
    g.observe(1, true, 5, 2000.0);
  }
  BOOST_TEST(g.allows(1));
  // The load changes: drafting steps at batch 16 now pay; the running average follows.
  for (int k = 0; k < 40; ++k) g.observe(16, true, 40, 3000.0);
  BOOST_TEST(g.allows(16));
}

BOOST_AUTO_TEST_CASE(acceptance_estimate_moves_from_the_prior_to_the_sequence) {
  BOOST_TEST(acceptance_estimate(0, 0, 0.5, 4) == 0.5);
  BOOST_TEST(acceptance_estimate(8, 8, 0.5, 4) == 10.0 / 12.0, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(acceptance_estimate(0, 96, 0.5, 4) == 0.02, boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_SUITE_END()  // test_policies_speculation
