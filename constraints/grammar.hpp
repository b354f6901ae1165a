// A GBNF grammar (llama.cpp's syntax) parsed and compiled into the form the matcher walks.
#pragma once

#include <cstddef>
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

/// The size of a compiled grammar (logs, benchmarks, tests).
struct GrammarInfo {
  std::size_t rules = 0;         // named rules of the source
  std::size_t elements = 0;      // NFA states after repetition and inlining
  std::size_t states = 0;        // automaton (DFA) states the matcher walks
  std::size_t byte_classes = 0;  // bytes that no edge tells apart share a class
};

/// Sizes of `g`.
GrammarInfo grammar_info(const Grammar& g);

}  // namespace sy::constraints
