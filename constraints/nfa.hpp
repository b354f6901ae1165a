// A grammar as the GBNF parser leaves it, internal to constraints/: one byte-level NFA per rule
// with calls to other rules, which build_grammar checks and turns into the matcher's automaton.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "constraints/automaton.hpp"
#include "constraints/error.hpp"

namespace sy::constraints {

/// A transition on any byte in [lo, hi].
struct NfaEdge {
  uint8_t lo = 0;
  uint8_t hi = 0;
  uint32_t to = 0;
};

/// A transition that reads a whole text of `rule` and then goes on at `to`.
struct NfaCall {
  uint32_t rule = 0;
  uint32_t to = 0;
};

/// One NFA state; targets are indices into the same rule's states.
struct NfaState {
  std::vector<NfaEdge> bytes;
  std::vector<NfaCall> calls;
  std::vector<uint32_t> eps;
};

/// One rule: its text is any path from `start` to `accept`.
struct NfaRule {
  std::string name;
  std::vector<NfaState> states;
  uint32_t start = 0;
  uint32_t accept = 1;
};

/// All rules of a grammar and which one is root.
struct Nfa {
  std::vector<NfaRule> rules;
  uint32_t root = 0;
};

/// Checks the rules (left recursion, rules that can never end), inlines small rules that are not
/// recursive and determinizes each remaining rule. Throws ConstraintError naming the rule or the
/// limit of `lim` that is exceeded.
std::shared_ptr<const Grammar> build_grammar(Nfa nfa, const Limits& lim);

}  // namespace sy::constraints
