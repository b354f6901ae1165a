// `switchyard ctl`: parses the command line (options anywhere, then the command words), sends one
// control message with the C++ client and prints its reply.
#include "cli/ctl.hpp"

#include <iostream>

#include "cli/args.hpp"
#include "clients/cpp/client.hpp"

namespace sy::cli {

const char* const kCtlUsage =
    "  ctl         --server ADDR [--token ADMIN_TOKEN] [--timeout-ms MS] [--server-key FILE]\n"
    "              [--client-key FILE] COMMAND\n"
    "              kv-policy full | kv-policy sliding_window W | kv-policy sinks S W\n"
    "              swaps every batcher's KV-cache policy for new jobs; stats prints the\n"
    "              counters as JSON; drain stops taking new jobs (submits get `unavailable`,\n"
    "              /ready answers 503, queued and running jobs finish) and resume ends that.\n"
    "              Exits 1 with the server's error, or after --timeout-ms\n"
    "              (default 5000) without an answer.\n";

namespace {

bool digits(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

}  // namespace

std::string policy_text(const std::vector<std::string>& w) {
  if (w.empty()) throw UsageError("kv-policy needs a policy: full, sliding_window W or sinks S W");
  const std::string& name = w[0];
  // "sliding_window:512" as one word is the wire form already.
  if (w.size() == 1 && name.find(':') != std::string::npos) return name;
  auto need = [&](size_t n, const char* shape) {
    if (w.size() != n + 1) throw UsageError("kv-policy " + name + " takes " + shape);
    for (size_t i = 1; i < w.size(); ++i)
      if (!digits(w[i]))
        throw UsageError("kv-policy " + name + ": '" + w[i] + "' is not a non-negative integer");
  };
  if (name == "full") {
    need(0, "no parameters");
    return "full";
  }
  if (name == "sliding_window") {
    need(1, "one parameter: W (window tokens)");
    return "sliding_window:" + w[1];
  }
  if (name == "sinks") {
    need(2, "two parameters: S (sink tokens) and W (window tokens)");
    return "sinks:" + w[1] + ":" + w[2];
  }
  throw UsageError("unknown kv policy '" + name + "' (full, sliding_window or sinks)");
}

const std::vector<std::string> kCtlOptions = {"server", "token", "timeout-ms", "server-key",
                                              "client-key"};

int cmd_ctl(const Args& args) {
  // Options may come before or after the command words.
  const std::vector<std::string>& words = args.words();
  if (!args.has("server")) throw UsageError("ctl needs --server ADDR");
  long long timeout = args.integer("timeout-ms", 5000);
  if (timeout < 1) throw UsageError("--timeout-ms must be at least 1");
  if (words.empty()) throw UsageError("ctl needs a command: kv-policy, stats, drain or resume");

  std::string command, policy;
  if (words[0] == "kv-policy" || words[0] == "kv_policy") {
    command = "kv_policy";
    policy = policy_text({words.begin() + 1, words.end()});
  } else if (words[0] == "stats" || words[0] == "drain" || words[0] == "resume") {
    if (words.size() > 1) throw UsageError(words[0] + " takes no parameters");
    command = words[0];
  } else {
    throw UsageError("unknown ctl command '" + words[0] + "' (kv-policy, stats, drain or resume)");
  }

  client::ClientOptions copt;
  // The server's CURVE public key (PREFIX.pub): a server with CURVE on answers nobody without it.
  if (args.has("server-key")) copt.server_key = client::read_server_key(args.str("server-key"));
  // Our own secret key (PREFIX.key), for a server that admits only listed client keys.
  if (args.has("client-key")) {
    if (!args.has("server-key")) throw UsageError("--client-key needs --server-key (CURVE)");
    copt.client_key = client::read_client_key(args.str("client-key"));
  }
  client::Client c(args.str("server"), copt);
  auto r = c.control(command, policy, args.str("token"), std::chrono::milliseconds(timeout));
  if (r.ok()) {
    std::cout << r.reply->result << std::endl;
    return 0;
  }
  if (r.error) {
    std::cerr << "switchyard: " << to_string(r.error->code) << ": " << r.error->message << "\n";
    return 1;
  }
  std::cerr << "switchyard: no answer from " << args.str("server") << " within " << timeout << " ms"
            << (args.has("server-key") ? "" : " (if the server has CURVE on, pass --server-key)")
            << "\n";
  return 1;
}

}  // namespace sy::cli
