// `switchyard ctl`: operator commands to a running server over its request endpoint (KV-policy
// swaps, stats), authenticated with the server's admin token.
#pragma once

#include <string>
#include <vector>

namespace sy::cli {

/// Usage lines of `ctl` for the command's help text.
extern const char* const kCtlUsage;

/// The policy text of `kv-policy NAME [params...]`: {"full"} -> "full", {"sliding_window", "W"}
/// -> "sliding_window:W", {"sinks", "S", "W"} -> "sinks:S:W"; a single argument already in that
/// form is passed through. Throws UsageError for a wrong count of parameters or an unknown name.
std::string policy_text(const std::vector<std::string>& words);

/// Runs `switchyard ctl` (argv[first] is the first word after "ctl"): prints the result JSON on
/// stdout and returns 0, or prints the server's error (or the timeout) on stderr and returns 1.
int cmd_ctl(int argc, char** argv, int first);

}  // namespace sy::cli
