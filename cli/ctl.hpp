// `switchyard ctl`: operator commands to a running server over its request endpoint (KV-policy
// swaps, stats), authenticated with the server's admin token.
#pragma once

#include <string>
#include <vector>

#include "cli/args.hpp"

namespace sy::cli {

/// Usage lines of `ctl` for the command's help text.
extern const char* const kCtlUsage;
/// Valued options of `ctl` (no flags); the command words come among them.
extern const std::vector<std::string> kCtlOptions;

/// The policy text of `kv-policy NAME [params...]`: {"full"} -> "full", {"sliding_window", "W"}
/// -> "sliding_window:W", {"sinks", "S", "W"} -> "sinks:S:W"; a single argument already in that
/// form is passed through. Throws UsageError for a wrong count of parameters or an unknown name.
std::string policy_text(const std::vector<std::string>& words);

/// Runs `switchyard ctl` (the command words in args.words()): prints the result JSON on stdout and
/// returns 0, or prints the server's error (or the timeout) on stderr and returns 1.
int cmd_ctl(const Args& args);

}  // namespace sy::cli
