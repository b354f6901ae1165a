// A GBNF grammar (llama.cpp's syntax) parsed and compiled into the form the matcher walks.
#pragma once

#include <memory>
#include <string_view>

#include "constraints/error.hpp"

namespace sy::constraints {

/// A compiled grammar: immutable, shared by every job and matcher that uses it.
class Grammar;

/// Parses and compiles GBNF text (rules, `root`, literals, character classes and negated
/// classes, alternation, grouping, `* + ?`, `{m}`, `{m,}`, `{m,n}`). Throws ConstraintError
/// naming the line and column of a syntax error, an undefined rule, a missing `root`, or the
/// limit of `lim` that the grammar exceeds.
std::shared_ptr<const Grammar> compile_gbnf(std::string_view text, const Limits& lim = {});

/// Whether `text` as a whole is in the grammar's language (tests and tools).
bool grammar_accepts(const Grammar& g, std::string_view text);

/// Whether `text` can be continued into a string of the grammar's language.
bool grammar_accepts_prefix(const Grammar& g, std::string_view text);

}  // namespace sy::constraints
