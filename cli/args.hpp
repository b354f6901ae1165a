// A small command-line parser for the `switchyard` subcommands: --name value, --flag, -n value.
// Unknown options and missing values are errors that name the option.
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace sy::cli {

/// Raised for a bad command line; main prints it with the usage hint and exits 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Parsed options of one subcommand.
class Args {
 public:
  /// `valued` lists options that take a value, `flags` those that do not; both without dashes.
  Args(int argc, char** argv, int first, const std::vector<std::string>& valued,
       const std::vector<std::string>& flags);

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string str(const std::string& name, const std::string& def = "") const;
  /// All values of a repeatable option, in order.
  std::vector<std::string> all(const std::string& name) const;
  long long integer(const std::string& name, long long def) const;
  double real(const std::string& name, double def) const;

 private:
  std::multimap<std::string, std::string> values_;
};

}  // namespace sy::cli
