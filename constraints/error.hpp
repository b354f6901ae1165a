// The refusal of a constraint and the size limits every compiled constraint stays within.
#pragma once

#include <cstddef>
#include <stdexcept>

namespace sy::constraints {

/// A constraint that cannot be compiled: the message names the problem (the line and column of
/// a GBNF grammar, the JSON Schema keyword, the regex position, the limit that was exceeded).
class ConstraintError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Bounds on what one constraint may cost to compile and hold (docs/protocol.md names them).
struct Limits {
  std::size_t max_source_bytes = 64 * 1024;  // grammar, schema or regex text; choices together
  std::size_t max_rules = 4096;              // grammar rules after conversion and repetition
  std::size_t max_elements = 256 * 1024;     // grammar elements (automaton states) in all
  std::size_t max_choices = 1024;            // entries of a choices constraint
  // Parse stacks alive at once while matching: an ambiguous grammar can double them per byte,
  // so the matcher refuses to go on past this rather than spend unbounded time and memory.
  std::size_t max_stacks = 1024;
};

}  // namespace sy::constraints
