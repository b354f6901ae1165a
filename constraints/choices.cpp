// A list of allowed outputs converted to GBNF: one literal alternative per distinct choice.
#include <string>
#include <vector>

#include "constraints/convert.hpp"
#include "constraints/gbnf_text.hpp"

namespace sy::constraints {

std::string choices_to_gbnf(const std::vector<std::string>& choices, const Limits& lim) {
  if (choices.empty()) throw ConstraintError("choices: the list is empty");
  if (choices.size() > lim.max_choices)
    throw ConstraintError(
        "choices: " + std::to_string(choices.size()) +
        " entries, over the limit max_choices=" + std::to_string(lim.max_choices));
  std::size_t bytes = 0;
  for (const auto& c : choices) bytes += c.size();
  if (bytes > lim.max_source_bytes)
    throw ConstraintError(
        "choices: " + std::to_string(bytes) +
        " bytes in all, over the limit max_source_bytes=" + std::to_string(lim.max_source_bytes));
  const detail::TreeBudget budget("choices", lim);
  std::vector<detail::NodeP> options;
  for (std::size_t i = 0; i < choices.size(); ++i) {
    // A GBNF literal spells characters, not raw bytes: a choice must be text.
    if (!detail::valid_utf8(choices[i]))
      throw ConstraintError("choices: entry " + std::to_string(i) + " is not valid UTF-8");
    options.push_back(detail::lit(choices[i]));  // "" is allowed: the empty output
  }
  detail::RuleSet rules;
  rules.define("root", detail::alt(std::move(options)));
  return rules.finish(lim, "choices", "no choice", [](const std::string&) { return "recursion"; });
}

}  // namespace sy::constraints
