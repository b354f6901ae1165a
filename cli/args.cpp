// The command line of `switchyard` (see args.hpp): CLI11 parses, this file maps its results and
// errors onto the commands' option names and the messages users and tests rely on.
#include "cli/args.hpp"

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <memory>

namespace sy::cli {

bool Args::has(const std::string& name) const {
  auto it = values_.find(name);
  return it != values_.end() && !it->second.empty();
}

std::string Args::str(const std::string& name, const std::string& def) const {
  return has(name) ? values_.at(name).back() : def;
}

std::vector<std::string> Args::all(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

long long Args::integer(const std::string& name, long long def) const {
  if (!has(name)) return def;
  std::string s = str(name);
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE)
    throw UsageError("option --" + name + " expects an integer, got '" + s + "'");
  return v;
}

double Args::real(const std::string& name, double def) const {
  if (!has(name)) return def;
  std::string s = str(name);
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || errno == ERANGE)
    throw UsageError("option --" + name + " expects a number, got '" + s + "'");
  return v;
}

namespace {

// What CLI11 collects for one command before it becomes Args.
struct Collected {
  std::map<std::string, std::vector<std::string>> valued;
  std::map<std::string, int> flags;
  std::vector<std::string> words;
};

std::string option_names(const std::string& name) {
  return name.size() == 1 ? "-" + name + ",--" + name : "--" + name;
}

// CLI11's messages for a missing value ("--model: 1 required TEXT missing") and for a value given
// to a flag ("force was given a disallowed flag override"), in the words of the usage text.
std::string usage_message(const CLI::ParseError& e) {
  const std::string what = e.what();
  if (auto at = what.find(": 1 required"); at != std::string::npos)
    return "option " + what.substr(0, at) + " needs a value";
  if (auto at = what.find(" was given a disallowed flag override"); at != std::string::npos)
    return "option --" + what.substr(0, at) + " takes no value";
  return what;
}

std::string command_usage(const Command& c) {
  return "usage: switchyard " + c.name + " [options]\n" + c.usage;
}

}  // namespace

int run_command_line(int argc, char** argv, const std::vector<Command>& commands,
                     const std::string& usage) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    std::cout << usage;
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  const Command* cmd = nullptr;
  for (const auto& c : commands)
    if (c.name == name) cmd = &c;
  if (!cmd) {
    std::cerr << "switchyard: unknown command '" << name << "'\n" << usage;
    return 2;
  }

  CLI::App app("switchyard");
  app.set_help_flag();  // `switchyard --help` is handled above, with every command's usage
  app.allow_extras();   // a stray word may be handed back up from the subcommand
  CLI::App* sub = app.add_subcommand(cmd->name);
  // Unknown options are collected, then refused by name below.
  sub->allow_extras();
  sub->set_help_flag("-h,--help", "this command's usage");
  const std::string text = command_usage(*cmd);
  sub->formatter_fn([text](const CLI::App*, std::string, CLI::AppFormatMode) { return text; });
  Collected got;
  for (const auto& v : cmd->valued)
    sub->add_option(option_names(v), got.valued[v])
        ->expected(1)
        ->allow_extra_args(false)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  for (const auto& f : cmd->flags)
    sub->add_flag(option_names(f), got.flags[f])->disable_flag_override();
  if (cmd->words) sub->add_option("words", got.words);

  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
      return app.exit(e);  // prints this command's usage on stdout, status 0
    } catch (const CLI::ParseError& e) {
      throw UsageError(usage_message(e));
    }
    for (const auto& extra : app.remaining(true)) {
      if (!extra.empty() && extra[0] == '-') throw UsageError("unknown option '" + extra + "'");
      throw UsageError("unexpected argument '" + extra + "'");
    }
    for (const auto& [f, count] : got.flags)
      if (count > 0) got.valued[f].assign(static_cast<size_t>(count), "1");
    return cmd->run(Args(std::move(got.valued), std::move(got.words)));
  } catch (const UsageError& e) {
    std::cerr << "switchyard: " << e.what() << "\n" << text;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "switchyard: error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace sy::cli
