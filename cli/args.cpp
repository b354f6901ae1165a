// Implementation of the command-line parser (see args.hpp).
#include "cli/args.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace sy::cli {

Args::Args(int argc, char** argv, int first, const std::vector<std::string>& valued,
           const std::vector<std::string>& flags) {
  auto contains = [](const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    std::string name;
    if (a.rfind("--", 0) == 0) {
      name = a.substr(2);
    } else if (a.size() == 2 && a[0] == '-') {
      name = a.substr(1);
    } else {
      throw UsageError("unexpected argument '" + a + "'");
    }
    std::string value;
    auto eq = name.find('=');
    bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (contains(flags, name)) {
      if (inline_value) throw UsageError("option --" + name + " takes no value");
      values_.emplace(name, "1");
    } else if (contains(valued, name)) {
      if (!inline_value) {
        if (i + 1 >= argc) throw UsageError("option --" + name + " needs a value");
        value = argv[++i];
      }
      values_.emplace(name, value);
    } else {
      throw UsageError("unknown option '" + a + "'");
    }
  }
}

std::string Args::str(const std::string& name, const std::string& def) const {
  auto it = values_.find(name);
  if (it == values_.end()) return def;
  // The last occurrence wins for single-valued options.
  auto range = values_.equal_range(name);
  std::string v;
  for (auto i = range.first; i != range.second; ++i) v = i->second;
  return v;
}

std::vector<std::string> Args::all(const std::string& name) const {
  std::vector<std::string> out;
  auto range = values_.equal_range(name);
  for (auto i = range.first; i != range.second; ++i) out.push_back(i->second);
  return out;
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

}  // namespace sy::cli
