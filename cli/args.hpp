// The command line of `switchyard`, parsed with CLI11: one subcommand per command, each with its
// own options and its own --help. Commands read what was given through Args.
#pragma once

#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace sy::cli {

/// Raised for a bad command line; main prints it with the command's usage and exits 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The options one command was given, by name without dashes ("model", "n").
class Args {
 public:
  Args() = default;
  Args(std::map<std::string, std::vector<std::string>> values, std::vector<std::string> words)
      : values_(std::move(values)), words_(std::move(words)) {}

  bool has(const std::string& name) const;
  /// The last value given for `name` (the last occurrence wins), or `def`.
  std::string str(const std::string& name, const std::string& def = "") const;
  /// All values of a repeatable option, in order.
  std::vector<std::string> all(const std::string& name) const;
  long long integer(const std::string& name, long long def) const;
  double real(const std::string& name, double def) const;
  /// The words that are not options, in order (the command words of `ctl`).
  const std::vector<std::string>& words() const { return words_; }

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> words_;
};

/// One command of `switchyard`: its name, its usage lines (what `switchyard NAME --help` prints)
/// and its options, names without dashes (a one-letter name is also accepted as -n).
struct Command {
  std::string name;
  std::string usage;
  std::vector<std::string> valued;  ///< options that take one value each time they are given
  std::vector<std::string> flags;   ///< options without a value
  bool words = false;               ///< takes command words among the options (ctl)
  std::function<int(const Args&)> run;
};

/// Parses argv (argv[1] names the command) and runs the command. `switchyard`, `switchyard
/// --help` and `switchyard help` print `usage` (every command); `switchyard NAME --help` prints
/// only that command's usage. A bad command line prints "switchyard: WHAT" (an unknown option
/// named as given) and the command's usage on stderr and returns 2; an error the command throws
/// prints "switchyard: error: WHAT" and returns 1.
int run_command_line(int argc, char** argv, const std::vector<Command>& commands,
                     const std::string& usage);

}  // namespace sy::cli
