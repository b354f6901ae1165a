// What a job asks of generation beyond the basic sampling fields: a constraint on the output
// (grammar, JSON Schema, regex or a list of choices), the sampling controls of OpenAI and vLLM
// (min_p, penalties, logit bias), several samples of one prompt and the prompt's log-probabilities.
// Plain values, carried unchanged from the wire to the executor.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sy {

/// A constraint on a job's generated text (at most one per job). `source` is the GBNF grammar,
/// the JSON Schema as JSON text, or the regular expression; `choices` the allowed outputs.
struct Constraint {
  enum Kind : uint8_t { none = 0, grammar = 1, json_schema = 2, regex = 3, choices = 4 };
  uint8_t kind = none;
  std::string source;
  std::vector<std::string> options;  // kind choices: the allowed outputs
  bool empty() const { return kind == none; }
  bool operator==(const Constraint&) const = default;
};

/// The wire name of a constraint kind ("grammar", "json_schema", "regex", "choices"; "" for none).
inline const char* constraint_kind_name(uint8_t kind) {
  switch (kind) {
    case Constraint::grammar:
      return "grammar";
    case Constraint::json_schema:
      return "json_schema";
    case Constraint::regex:
      return "regex";
    case Constraint::choices:
      return "choices";
    default:
      return "";
  }
}

/// Sampling controls past temperature/top-k/top-p, with OpenAI's and vLLM's names and meanings.
/// The defaults change nothing.
struct SamplingControls {
  float min_p = 0.0f;               // drop tokens below min_p × the top token's probability
  float presence_penalty = 0.0f;    // subtracted once from a token that appeared in the output
  float frequency_penalty = 0.0f;   // subtracted per occurrence in the output
  float repetition_penalty = 1.0f;  // llama.cpp's: logit / p if > 0 else logit × p, last n tokens
  int32_t repeat_last_n = 64;       // window of repetition_penalty (prompt and output); -1: all
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id -> bias, ascending ids
  bool any() const {
    return min_p != 0.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f ||
           repetition_penalty != 1.0f || !logit_bias.empty();
  }
  bool operator==(const SamplingControls&) const = default;
};

}  // namespace sy
