// JSON Schema, regular expressions and choice lists, each converted to a GBNF grammar (the one
// form constraints/grammar.hpp compiles), so that every constraint kind runs on one matcher.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "constraints/error.hpp"

namespace sy::constraints {

/// A GBNF grammar whose language is the JSON texts that validate against `schema_json` (a JSON
/// Schema as JSON text), with bounded whitespace between JSON tokens. Throws ConstraintError
/// naming the keyword for a schema outside the supported subset (docs/protocol.md lists it),
/// and for JSON that does not parse or a schema over `lim`.
std::string json_schema_to_gbnf(std::string_view schema_json, const Limits& lim = {});

/// A GBNF grammar whose language is the strings the regular expression matches as a whole
/// (RE2-like syntax without back-references or lookaround). Throws ConstraintError naming the
/// position and the construct it refuses.
std::string regex_to_gbnf(std::string_view regex, const Limits& lim = {});

/// A GBNF grammar whose language is exactly the given strings. Throws ConstraintError for an
/// empty list, or one over lim.max_choices or lim.max_source_bytes.
std::string choices_to_gbnf(const std::vector<std::string>& choices, const Limits& lim = {});

}  // namespace sy::constraints
