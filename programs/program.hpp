// A program as plain values (docs/programs.md): the steps a `submit` with `program` carries, parsed
// from their JSON text and checked against limits, and the walk that says which step can run next.
// No CAF, ZeroMQ, msgpack or model here: admission's program manager (actors/admission_programs.cpp)
// turns the walk's actions into jobs and feeds their outputs back.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/generation.hpp"

namespace sy::programs {

/// Bounds on what one program may ask; each is named in the error that enforces it.
struct Limits {
  uint32_t max_steps = 256;                   ///< steps in the whole tree, branches' steps included
  uint32_t max_fork_width = 16;               ///< branches of one fork
  uint32_t max_depth = 4;                     ///< forks nested inside forks' branches
  uint32_t max_input_bytes = 256u << 10;      ///< all inputs' names and values together
  uint32_t max_inputs = 64;                   ///< named inputs
  uint32_t max_text_bytes = 64u << 10;        ///< one step's literal text (before {{name}} inserts)
  uint32_t max_tool_timeout_ms = 3'600'000;   ///< a tool step's wait: one hour at most
  uint32_t default_tool_timeout_ms = 60'000;  ///< a tool step without tool_timeout_ms
};

/// Why a program was refused; `what()` names the step ("step 2 (gen 'answer'): ...").
struct ProgramError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A gen step's sampling fields; each unset one takes the submit's value (GenDefaults).
struct GenParams {
  std::optional<uint32_t> max_tokens;
  std::optional<double> temperature;
  std::optional<uint32_t> top_k;
  std::optional<double> top_p;
  std::optional<uint64_t> seed;
  std::optional<std::vector<std::string>> stop;
  std::optional<SamplingControls> controls;  ///< any of min_p, penalties, logit_bias given
  Constraint constraint;                     ///< grammar, json_schema, regex or choices
};

/// The submit's own sampling fields: the defaults of every gen step.
struct GenDefaults {
  uint32_t max_tokens = 16;
  double temperature = 1.0;
  uint32_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  SamplingControls controls;
};

struct Step;
using Steps = std::vector<Step>;

/// One step of a program.
struct Step {
  /// Scoped (Step::Kind::gen): unscoped, `gen`, `text` and `tool` would clash with the fields.
  enum class Kind : uint8_t { text = 0, gen = 1, select = 2, fork = 3, join = 4, tool = 5 };
  Kind kind = Kind::text;
  std::string path;  ///< "3", "2.1.0" (step index, then branch and step index per fork level)
  std::string name;  ///< the variable it defines ("" : none; a text step defines none)
  std::string role;  ///< chat turns: text steps that start a message, tool results' role
  // text: literal text with {{name}} inserts
  std::string text;
  // gen
  GenParams gen;
  bool append = true;  ///< gen, select, tool: the output is appended to the context
  // select
  std::vector<std::string> choices;
  enum Method : uint8_t { token_length_normalized = 0, greedy_first_token = 1 };
  Method method = token_length_normalized;
  // fork: its branches (a fork of `n` copies of the same steps has them repeated)
  std::vector<Steps> branches;
  // join (right after its fork): `list` gathers variable `var` of every branch into the list
  // variable `name`; `text` appends what each branch appended, in branch order, `separator`
  // between them
  enum JoinMode : uint8_t { join_text = 0, join_list = 1 };
  JoinMode mode = join_text;
  std::string var;
  std::string separator;
  // tool: `name` is its variable (the result); `tool` the tool's name; `arguments` a template
  // ({{name}} inserts, usually "{{args}}" naming a constrained gen's output)
  std::string tool;
  std::string arguments;
  uint32_t timeout_ms = 0;
};

/// A parsed program: its steps, its inputs, and whether its context is chat turns (some text
/// step has a `role`) or one text.
struct Program {
  Steps steps;
  std::vector<std::pair<std::string, std::string>> inputs;
  bool chat = false;
  uint32_t n_steps = 0;  ///< steps in the tree
  /// The generated tokens the program may cost at most (every gen's max_tokens, times the
  /// branches it runs in, with `defaults.max_tokens` for gens without their own): quotas.
  uint64_t max_generated = 0;
  /// The submit's sampling fields parse() was given: what the walk fills a gen's unset fields with.
  GenDefaults defaults;
};

/// Parses the `program` steps (a JSON array, as the codec hands it on) and the inputs, and checks
/// them: known step types and fields, every {{name}} defined by an input or an earlier step in
/// scope, a join right after each fork, names unique in scope, the limits. Throws ProgramError
/// naming the first bad step.
Program parse(std::string_view steps_json, std::vector<std::pair<std::string, std::string>> inputs,
              const GenDefaults& defaults, const Limits& limits = {});

/// One chat message of a context in chat mode.
struct Turn {
  std::string role;
  std::string content;
};

/// Something the walk needs done outside it: a generation, a selection or a tool call (or the
/// prefill of a context before a fork's branches start from it).
struct Action {
  /// Scoped (Action::Kind::gen): unscoped, `tool` would clash with the field.
  enum class Kind : uint8_t { gen = 0, select = 1, tool = 2, prefill = 3 };
  Kind kind = Kind::gen;
  std::string path;  ///< the step's path; the key of its output (a prefill: the fork's path)
  std::string name;  ///< the step's variable name
  const Step* step = nullptr;
  // The context the step runs on: `text` (text mode) or `turns` (chat mode; a gen's or select's
  // prompt is these rendered with the generation prompt).
  std::string text;
  std::vector<Turn> turns;
  // gen: the step's parameters with the submit's defaults filled in; seed is the submit's (or
  // the step's) plus the step's branch salt, so forked branches sample differently and a resumed
  // program samples as it did.
  GenDefaults params;
  Constraint constraint;
  // select: the choices; tool: its name and arguments (templates resolved)
  std::vector<std::string> choices;
  std::string tool;
  std::string arguments;
  uint32_t timeout_ms = 0;
};

/// A variable's value as the program's result lists it.
struct VarValue {
  std::string name;
  std::vector<std::string> values;
  bool list = false;
};

/// The walk of one program: which actions are ready, and their outputs as they come. Steps run as
/// soon as their inputs exist: branches of a fork run side by side.
class Run {
 public:
  explicit Run(std::shared_ptr<const Program> program);
  ~Run();
  Run(Run&&) noexcept;
  Run& operator=(Run&&) noexcept;

  /// An output restored from the journal (before the first ready()): the step at `path` is
  /// done with `output` and is never asked for again (a fork's path: its prefill is done). Later,
  /// an output for a step already handed out completes it.
  void restore(const std::string& path, const std::string& output);
  /// Walks as far as the outputs allow and returns the actions that became ready (each once).
  std::vector<Action> ready();
  /// The output of a ready action: the generated text (gen), the chosen choice (select), the
  /// tool's result (tool), "" (prefill). Unknown or finished paths are ignored (returns false).
  /// The walk goes on at once (finished() is true after the last output); the actions that
  /// frees wait for the next ready().
  bool complete(const std::string& path, const std::string& output);
  /// Every step has run.
  bool finished() const;
  /// Inputs, then the variables in the order they were defined (a branch's as "fork.i.name"):
  /// step order, a fork's branches' variables branch by branch, whatever order they ran in.
  std::vector<VarValue> vars() const;
  /// The output of the last gen, select or tool step of the top level ("" if none).
  std::string last_output() const;
  /// The steps (gen, select, tool) done so far, restored ones included.
  uint32_t steps_done() const;
  /// Paths of the actions handed out and not yet complete.
  std::vector<std::string> pending() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sy::programs
