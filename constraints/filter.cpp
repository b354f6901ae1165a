// The sampler's view of a constraint: masks applied to logits, and the vocabulary of a tokenizer.
#include "constraints/filter.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "model/tokenizer.hpp"

namespace sy::constraints {

std::shared_ptr<const Vocabulary> vocabulary_of(const Tokenizer& tok, int32_t n_logits) {
  const int32_t n = std::max(n_logits, tok.n_vocab());
  std::vector<std::string> pieces(static_cast<size_t>(n));
  for (int32_t id = 0; id < tok.n_vocab(); ++id)
    pieces[static_cast<size_t>(id)] = tok.token_to_piece(id);
  return std::make_shared<const Vocabulary>(std::move(pieces), tok.eog_ids());
}

void MatcherFilter::mask(float* logits, int32_t n_vocab) {
  const std::vector<uint64_t>& words = m_.mask();
  const int32_t covered = std::min<int32_t>(n_vocab, static_cast<int32_t>(words.size() * 64));
  constexpr float kOff = -std::numeric_limits<float>::infinity();
  for (int32_t w = 0; w * 64 < covered; ++w) {
    const uint64_t bits = words[static_cast<size_t>(w)];
    if (bits == ~uint64_t{0}) continue;  // a whole word allowed: nothing to clear
    const int32_t end = std::min(covered, (w + 1) * 64);
    for (int32_t id = w * 64; id < end; ++id)
      if (!((bits >> (id & 63)) & 1)) logits[id] = kOff;
  }
  for (int32_t id = covered; id < n_vocab; ++id) logits[id] = kOff;
}

void MatcherFilter::advance(int32_t id) {
  if (!m_.allows(id))
    throw std::logic_error("the constraint does not allow token " + std::to_string(id) +
                           " here (the sequence's tokens disagree with its constraint)");
  m_.advance(id);
}

}  // namespace sy::constraints
