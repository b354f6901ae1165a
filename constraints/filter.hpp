// A constraint as the sampler sees it: one sequence's matcher as a filter of allowed tokens, and
// the vocabulary index of a model's tokenizer.
#pragma once

#include <cstdint>
#include <memory>

#include "constraints/matcher.hpp"
#include "model/sampler.hpp"

namespace sy {
class Tokenizer;
}

namespace sy::constraints {

/// The vocabulary as generated text sees it: each token's piece (Tokenizer::token_to_piece, no
/// special text) and the end-of-generation ids, padded with empty pieces to `n_logits` ids (a
/// model's logits may be wider than its tokenizer's vocabulary; padding ids are never allowed).
std::shared_ptr<const Vocabulary> vocabulary_of(const Tokenizer& tok, int32_t n_logits);

/// One sequence's position in its constraint, as the sampler's filter.
class MatcherFilter : public TokenFilter {
 public:
  explicit MatcherFilter(Matcher m) : m_(std::move(m)) {}
  bool allows(int32_t id) override { return m_.allows(id); }
  /// Sets the logits of the tokens the constraint does not allow here to -inf.
  void mask(float* logits, int32_t n_vocab) override;
  /// Moves past an output token; throws std::logic_error when the constraint does not allow it.
  void advance(int32_t id);
  const Matcher& matcher() const { return m_; }

 private:
  Matcher m_;
};

}  // namespace sy::constraints
