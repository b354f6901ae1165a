// A job's constraint as the executor and admission use it: the model's vocabulary indexed once,
// the compiled constraints shared through one cache, and one sequence's matcher seen by the
// sampler as a filter of allowed tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "constraints/filter.hpp"
#include "core/generation.hpp"
#include "model/sampler.hpp"

namespace sy {

class Model;

/// The vocabulary of one model and the compiled constraints over it, shared by admission (which
/// compiles a constraint to check it) and the executors (which then find it compiled).
struct ConstraintSupport {
  std::shared_ptr<const constraints::Vocabulary> vocab;
  std::shared_ptr<constraints::ConstraintCache> cache;
  constraints::Limits limits;
};

/// The vocabulary of `model` as generated text sees it (each token's piece; end-of-generation
/// ids), padded to the model's logits width, with an empty cache.
std::shared_ptr<ConstraintSupport> make_constraint_support(const Model& model);

/// Compiles (or finds compiled) `c` and checks that some token can start it. Returns the
/// refusal's text ("" when it compiles), naming the problem as constraints/ does.
std::string check_constraint(ConstraintSupport& support, const Constraint& c);

/// One sequence's position in its constraint, as the sampler's filter.
using SeqConstraint = constraints::MatcherFilter;

/// The matcher of `c` at its start (compiled through the support's cache). Throws
/// constraints::ConstraintError for a constraint that does not compile.
std::unique_ptr<SeqConstraint> make_seq_constraint(ConstraintSupport& support, const Constraint& c);

}  // namespace sy
