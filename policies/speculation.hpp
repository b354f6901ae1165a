// Speculative decoding's policy: n-gram prompt lookup (the drafts), the step cost model the
// batcher measures, and the choice of how many drafts each sequence feeds in a step. Plain value
// types and functions: no CAF, ZeroMQ or CUDA (docs/speculation.md).
#pragma once

#include <cstdint>
#include <vector>

namespace sy::policy {

/// Prompt lookup (vLLM's prompt_lookup_min/max, llama.cpp's lookup): the longest suffix of
/// tokens[0, n) of length in [min_n, max_n] that occurred earlier in the sequence, its most recent
/// earlier occurrence, and up to `k` tokens that followed it there, into `out` (cleared first).
/// Returns the number of tokens drafted (0: no such n-gram, or k <= 0).
int32_t ngram_draft(const int32_t* tokens, int32_t n, int32_t min_n, int32_t max_n, int32_t k,
                    std::vector<int32_t>& out);

/// The batcher's model of a step's duration: t = intercept + b * tokens + c * rows for a step that
/// feeds `tokens` tokens and computes `rows` rows of logits (one per sampling sequence, every fed
/// token of one that verifies drafts or wants prompt logprobs), fitted by least squares over the
/// steps it has seen, older steps weighing less (each new step multiplies the weight of the earlier
/// ones by `decay`). A drafted token is fed and gives a row: it costs b + c (draft_cost()). Where
/// the steps seen never part rows from tokens (no prefill lately), the fit is over tokens alone,
/// whose slope is then that same per-draft cost.
class StepCostModel {
 public:
  explicit StepCostModel(double decay = 0.995) : decay_(decay) {}
  void observe(int64_t tokens, int64_t rows, double micros);
  /// Whether the steps seen tell the cost of a token apart: enough of them, with token counts
  /// that differ.
  bool ready() const;
  /// Predicted microseconds of a step of `tokens` fed tokens and `rows` logit rows (0 until ready).
  double predict(int64_t tokens, int64_t rows) const;
  /// Microseconds one more drafted token adds to a step (0 until ready, or when the fit says a
  /// token costs nothing or less: the cost is then unknown, and no draft is chosen).
  double draft_cost() const;
  /// Microseconds one more fed token (no logit row) adds to a step (0 until ready, or when the
  /// fit says a token costs nothing or less).
  double token_cost() const;
  int64_t steps() const { return steps_; }

 private:
  struct Fit {
    double a = 0, b = 0, c = 0;  // intercept, per token, per row
    bool ok = false;
  };
  Fit fit() const;
  double decay_;
  double w_ = 0, sn_ = 0, sr_ = 0, snn_ = 0, srr_ = 0, snr_ = 0, st_ = 0, snt_ = 0, srt_ = 0;
  int64_t steps_ = 0;
};

/// Auto's check on itself: the tokens a microsecond that pure decode steps (no prompt chunks)
/// really yielded, by batch size (sampling sequences, in buckets 1, 2, 3-4, 5-8, ..., 65+), in
/// steps that fed drafts and in steps that did not (running averages). The cost model predicts;
/// this measures, and vetoes drafts at a batch size where they did not pay.
class SpecGuard {
 public:
  static constexpr int kBuckets = 8;
  static int bucket(int64_t outputs);
  void observe(int64_t outputs, bool drafted, int64_t tokens_out, double micros);
  /// Whether auto may draft at this batch size: yes until both kinds of step were seen there
  /// (4 of each); then only while drafting steps yield at least as many tokens a microsecond as
  /// steps without.
  bool allows(int64_t outputs) const;

 private:
  struct Rate {
    double rate = 0;  // tokens a microsecond, running average
    int64_t n = 0;
  };
  Rate plain_[kBuckets], spec_[kBuckets];
};

/// The draft model's cost, as the executor measures its draft passes in a step: t = per_pass *
/// passes + per_token * tokens (a pass is one batched draft-model forward; its tokens are the
/// catch-ups of the first pass and one a sequence in each later one; no pass, no time), fitted
/// by least squares over the steps seen, older ones weighing less (`decay` a step). Where the
/// steps seen never part passes from tokens, the fit is over tokens alone.
class DraftCostModel {
 public:
  explicit DraftCostModel(double decay = 0.98) : decay_(decay) {}
  void observe(int64_t passes, int64_t tokens, double micros);
  /// Whether 4 steps with draft passes were seen.
  bool ready() const { return steps_ >= 4; }
  /// Microseconds a draft pass costs beyond its tokens, and a token fed to the draft model
  /// (0 until ready; never below 0).
  double per_pass() const;
  double per_token() const;

 private:
  void fit(double& p, double& q) const;
  double decay_;
  double spp_ = 0, spn_ = 0, snn_ = 0, spt_ = 0, snt_ = 0;
  int64_t steps_ = 0;
};

/// A decoding sequence that could feed drafts this step: `available` drafted tokens (in order)
/// and `acceptance`, the estimated probability that each draft token is accepted given the ones
/// before it were. With a draft model, `setup_tokens` is what the draft model must first feed of
/// the sequence (its catch-up: the whole context the first time, then the tokens since it last
/// drafted), paid with the sequence's first draft.
struct SpecCandidate {
  int32_t available = 0;
  double acceptance = 0.0;
  int64_t setup_tokens = 0;
};

/// How many of its drafts each candidate feeds (same order as `cands`). The step already feeds
/// `step_tokens` tokens, computes `rows` logit rows and yields `outputs` sampled tokens; a draft
/// token j (1-based) of a sequence adds acceptance^j expected tokens and costs cost.draft_cost()
/// microseconds in the target's step. With a draft model (`draft` not null and ready) it also
/// costs the draft model's work for it: per_token() (the first draft: per_token() times the
/// sequence's setup_tokens), and per_pass() where it is the first draft at its depth j (the step
/// then needs one more draft pass). Drafts are taken, the most valuable first, while each one's
/// tokens per microsecond exceed the step's (tokens out over predicted time, drafts taken so far
/// included) by the factor (1 + margin), within `budget` more tokens; a sequence's drafts stop at
/// the first that does not pay. Nothing before the cost model is ready(): speculation never runs
/// on a guess of what a token costs.
std::vector<int32_t> choose_drafts(const std::vector<SpecCandidate>& cands, int64_t step_tokens,
                                   int64_t rows, int64_t outputs, const StepCostModel& cost,
                                   int64_t budget, double margin,
                                   const DraftCostModel* draft = nullptr);

/// The acceptance estimate of one sequence: its own accepted / tried draft positions, pulled
/// towards `prior` (the batcher's running estimate) with the weight of `prior_weight` positions.
double acceptance_estimate(int64_t accepted, int64_t tried, double prior, double prior_weight);

}  // namespace sy::policy
