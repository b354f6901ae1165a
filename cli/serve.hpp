// The server-side subcommands of `switchyard`: serve (run the server) and submit (an offline
// batch of JSONL jobs through a running server).
#pragma once

#include <string>
#include <vector>

#include "cli/args.hpp"

namespace sy::cli {

/// Usage lines of `serve` and `submit` for the command's help text.
extern const char* const kServeUsage;
extern const char* const kSubmitUsage;
/// Valued options of each (no flags).
extern const std::vector<std::string> kServeOptions;
extern const std::vector<std::string> kSubmitOptions;
/// Flags (options without a value) of `serve`.
extern const std::vector<std::string> kServeFlags;

/// Runs the server until SIGINT/SIGTERM; returns the exit status (0 after a clean stop).
int cmd_serve(const Args& a);
/// Runs a JSONL batch through a server; returns 0 when every job ended with `done`.
int cmd_submit(const Args& a);

}  // namespace sy::cli
