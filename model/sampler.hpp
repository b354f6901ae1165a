// Token sampling from logits: greedy, temperature, top-k, top-p with a per-request seed, and the
// top-N log-probabilities of the chosen position.
#pragma once

#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

namespace sy {

struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  uint64_t seed = 0;
  int n_logprobs = 0;  // top-N logprobs to report per generated token
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
  /// Throws SamplingError for logits with a NaN or +inf, or with every entry -inf.
  int32_t sample(const float* logits, int32_t n_vocab, std::vector<TokenLogprob>* top = nullptr,
                 float* chosen_logprob = nullptr);
  const SamplingParams& params() const { return p_; }

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> scratch_;  // reused: no per-token allocation
};

}  // namespace sy
