// `switchyard keygen`: writes a CURVE keypair (PREFIX.key secret, PREFIX.pub public) in Z85 for
// the server's endpoints.curve_secret_key and the clients' --server-key.
#pragma once

#include <string>
#include <vector>

#include "cli/args.hpp"

namespace sy::cli {

/// Usage lines of `keygen` for the command's help text.
extern const char* const kKeygenUsage;
/// Valued options and flags of `keygen`.
extern const std::vector<std::string> kKeygenOptions;
extern const std::vector<std::string> kKeygenFlags;

/// Writes the pair and prints the public key on stdout; returns the exit status.
int cmd_keygen(const Args& a);

}  // namespace sy::cli
