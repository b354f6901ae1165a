// Token sampling from logits: greedy, temperature, top-k, top-p and min-p with a per-request seed,
// logit bias and the presence, frequency and repetition penalties, an optional filter of allowed
// tokens (a constraint), and the top-N log-probabilities of the chosen position.
#pragma once

#include <cstdint>
#include <random>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "core/generation.hpp"

namespace sy {

struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  uint64_t seed = 0;
  int n_logprobs = 0;         // top-N logprobs to report per generated token
  SamplingControls controls;  // min_p, penalties, logit bias (defaults: off)
};

/// Which tokens may come next (a constraint's matcher, seen by the sampler). allows() is asked
/// first for the drawn token; mask() only when it is refused or when the filters need the whole
/// allowed set before the draw.
class TokenFilter {
 public:
  virtual ~TokenFilter() = default;
  /// Whether token `id` may come next.
  virtual bool allows(int32_t id) = 0;
  /// Sets logits[i] to -inf for every token i that may not come next.
  virtual void mask(float* logits, int32_t n_vocab) = 0;
};

/// A sample() call whose logits give no distribution (a NaN, +inf, or every logit -inf): a fault
/// of that sequence's numbers, not of its parameters (those the constructor checks).
class SamplingError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

/// Samples one sequence's tokens; same params and seed give the same tokens.
class Sampler {
 public:
  /// Throws std::invalid_argument naming the parameter that is out of range.
  explicit Sampler(const SamplingParams& p);
  /// Picks a token. When `top` is given and n_logprobs > 0 it receives the n_logprobs most likely
  /// tokens with their log-probabilities under the unmodified distribution (softmax of logits).
  /// The logit bias, penalties and `filter` change what is drawn, never the reported
  /// log-probabilities. Throws SamplingError for logits with a NaN or +inf, or with every entry
  /// -inf (also after the filter: no allowed token is left).
  int32_t sample(const float* logits, int32_t n_vocab, std::vector<TokenLogprob>* top = nullptr,
                 float* chosen_logprob = nullptr, TokenFilter* filter = nullptr);
  /// Records a token of the sequence, in order: prompt tokens (output = false) count for the
  /// repetition penalty, output tokens for all three penalties. Cheap no-op without penalties.
  void accept(int32_t id, bool output);
  const SamplingParams& params() const { return p_; }

 private:
  bool penalties() const;
  int32_t draw(const float* logits, int32_t n_vocab, int32_t best);
  void apply_controls(float* logits, int32_t n_vocab) const;

  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> scratch_;  // reused: no per-token allocation
  std::vector<float> work_;                         // logits after bias, penalties and filter
  // Penalty state: output token counts (presence, frequency) and the last repeat_last_n tokens
  // of prompt and output (repetition), as a ring.
  std::unordered_map<int32_t, uint32_t> out_counts_;
  std::vector<int32_t> recent_;
  size_t recent_next_ = 0;
  std::unordered_map<int32_t, uint32_t> recent_counts_;
};

}  // namespace sy
