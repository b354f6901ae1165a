// Minimal JSON output helpers for the CLI's --json modes.
#pragma once

#include <string>
#include <string_view>

namespace sy::cli {

/// `s` as a JSON string literal. Invalid UTF-8 bytes (a random model can emit any byte) become
/// U+FFFD so the output always parses.
std::string json_string(std::string_view s);
/// A float as JSON (finite values only; non-finite become null).
std::string json_number(double v);

}  // namespace sy::cli
