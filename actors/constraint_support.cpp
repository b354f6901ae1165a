// The executor's and admission's view of constraints: a model's vocabulary indexed once, and one
// sequence's matcher as the sampler's filter.
#include "actors/constraint_support.hpp"

#include <stdexcept>

#include "model/model.hpp"
#include "model/tokenizer.hpp"

namespace sy {

std::shared_ptr<ConstraintSupport> make_constraint_support(const Model& model) {
  auto s = std::make_shared<ConstraintSupport>();
  s->vocab = constraints::vocabulary_of(model.tokenizer(), model.limits().n_vocab);
  s->cache = std::make_shared<constraints::ConstraintCache>();
  return s;
}

std::string check_constraint(ConstraintSupport& support, const Constraint& c) {
  try {
    support.cache->get(c, support.vocab, support.limits);
    return {};
  } catch (const constraints::ConstraintError& e) {
    return e.what();
  }
}

std::unique_ptr<SeqConstraint> make_seq_constraint(ConstraintSupport& support,
                                                   const Constraint& c) {
  auto compiled = support.cache->get(c, support.vocab, support.limits);
  if (!compiled) throw std::invalid_argument("make_seq_constraint: the job has no constraint");
  return std::make_unique<SeqConstraint>(constraints::Matcher(std::move(compiled)));
}

}  // namespace sy
