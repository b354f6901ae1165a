// `switchyard serve`: the server process. Reads the YAML config, applies command-line overrides,
// runs until SIGINT/SIGTERM, then shuts down within the grace period and exits 0.
#include "cli/serve.hpp"

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <iostream>

#include "actors/log.hpp"
#include "cli/demo_model.hpp"
#include "gpu/backend.hpp"
#include "model/chat_template.hpp"
#include "server/config.hpp"
#include "server/server.hpp"

namespace sy::cli {

namespace {

/// The XDG base-directory rule for state that should survive restarts; "" when neither variable
/// is set (then there is no default journal). The command line is the one place that reads the
/// environment: core code gets the result in ServerConfig::state_dir.
std::string default_state_dir() {
  if (const char* x = std::getenv("XDG_STATE_HOME"); x && *x) return std::string(x) + "/switchyard";
  if (const char* h = std::getenv("HOME"); h && *h)
    return std::string(h) + "/.local/state/switchyard";
  return {};
}

}  // namespace

const char* const kServeUsage =
    "  serve       [--model FILE] [--config FILE.yaml] [--bind ADDR] [--pull ADDR]\n"
    "              [--results ADDR] [--backend auto|cpu|cuda|null] [--executors N] [--threads N]\n"
    "              [--kv-mb MB] [--kv-dtype f32|f16|q8_0] [--grace-ms MS] [--step-delay-ms MS]\n"
    "              [--kv-policy P] [--kv-pressure-policy P] [--admin-token T]\n"
    "              [--no-prefix-cache] [--chat-template NAME|FILE]\n"
    "              [--speculative auto|always|off] [--draft-model FILE]: speculative\n"
    "              decoding (batching.speculative; docs/speculation.md) by prompt lookup,\n"
    "              or by a draft model of the same vocabulary (draft_model).\n"
    "              Flags override the config file. --backend auto (the default) runs on\n"
    "              the GPUs where this build has CUDA and a device answers, else the CPU;\n"
    "              cuda insists on GPUs; null runs no model (fixed tokens: measures\n"
    "              overhead). --step-delay-ms is for TESTS ONLY (slows every\n"
    "              engine step). A port of * binds a free port; the bound addresses are\n"
    "              printed on stdout as 'switchyard: listening on ADDR'. SIGUSR1 prints\n"
    "              the counters as 'switchyard: stats {json}'; SIGINT/SIGTERM stop it.\n"
    "              P: full | sliding_window:W | sinks:S:W. --admin-token enables `ctl`.\n"
    "              [--curve-secret-key FILE] [--curve-public-key FILE]: CURVE on every\n"
    "              endpoint (keys from `switchyard keygen`; docs/security.md).\n"
    "              [--metrics HOST:PORT]: Prometheus /metrics, /health, /ready over HTTP\n"
    "              (port 0: any; printed as 'switchyard: metrics on http://HOST:PORT').\n"
    "              [--http HOST:PORT]: the OpenAI-compatible HTTP API (/v1/completions,\n"
    "              /v1/chat/completions, /v1/models, the Batch API; docs/http.md), printed\n"
    "              as 'switchyard: http on http://HOST:PORT'.\n"
    "              [--min-executors N] [--max-executors N] [--target-ongoing N]\n"
    "              [--target-queue-wait-ms MS] [--upscale-delay-ms MS] [--downscale-delay-ms MS]\n"
    "              [--step-timeout-ms MS] [--max-job-retries N]: elastic pairs and crash\n"
    "              recovery (docs/elasticity.md). TESTS ONLY: [--test-fault-executor-throw-after\n"
    "              N] [--test-fault-executor-hang-after N] make the first executor crash or hang\n"
    "              after N steps; [--test-fault-batcher-throw-after N] the first batcher;\n"
    "              [--test-nan-logits-token ID] gives NaN logits to every job whose first\n"
    "              step feeds token ID (the job must fail alone);\n"
    "              [--test-admission-stall-ms MS] admission sleeps MS before each submit it\n"
    "              takes (fills the intake bound, endpoints.max_waiting_requests).\n"
    "              [--journal PATH] [--journal-fsync always|batch|never] [--journal-batch-ms MS]:\n"
    "              durable accepted jobs and results, replayed at start (docs/durability.md).\n"
    "              On by default at STATE/<bind address>/switchyard.journal, STATE being\n"
    "              [--state-dir DIR] or $XDG_STATE_HOME/switchyard or ~/.local/state/switchyard;\n"
    "              [--no-journal] turns it off (a wildcard port gets no default journal).\n"
    "              [--curve-allowed-keys FILE]: only these client public keys may connect.\n"
    "              [--no-prefix-routing]: dispatch by free credit alone, not by cached prefix.\n"
    "              [--heartbeat-ivl-ms MS] [--heartbeat-timeout-ms MS] [--heartbeat-ttl-ms MS]\n"
    "              --chat-template: how `messages` submits are rendered, overriding the\n"
    "              model file's tokenizer.chat_template: chatml, llama3, gemma, mistral,\n"
    "              phi3, or a Jinja template file (docs/protocol.md, Chat messages).\n"
    "              [--handshake-timeout-ms MS]: connection liveness (endpoints.* in the\n"
    "              config; heartbeats are off by default: docs/protocol.md, Sockets).\n"
    "              [--max-waiting-requests N]: requests that may wait for admission before\n"
    "              new ones get `overloaded` at the edge (endpoints.max_waiting_requests,\n"
    "              default 4096; endpoints.max_waiting_bytes, default 64 MiB).\n"
    "              [--max-connections N]: client connections each listening endpoint keeps\n"
    "              open; more are closed at once (endpoints.max_connections, default 1024;\n"
    "              0: unlimited; with an allow-list, those that passed it).\n"
    "              [--max-connections-per-address N]: of those, from one source address\n"
    "              (endpoints.max_connections_per_address, default 64; 0: unlimited).\n"
    "              [--max-handshaking N]: with an allow-list, connections still in their\n"
    "              handshake (endpoints.max_handshaking, default 256; 0: unlimited).\n"
    "              [--log-level trace|debug|info|warn|error|off] [--log-format text|json]:\n"
    "              the log on stderr (log.level, log.format; default info, text lines\n"
    "              'switchyard: MESSAGE'; json: one {\"ts\", \"level\", \"msg\"} object a line).\n"
    "              [--nats URL[,URL...]] (repeatable) [--node-name NAME]: join a cluster on\n"
    "              NATS JetStream: take jobs from switchyard.jobs.<class>, publish results\n"
    "              to switchyard.results.<tenant> (cluster.* in the config; docs/cluster.md).\n"
    "              TESTS ONLY: [--test-overfetch N] the node keeps up to N jobs a class\n"
    "              beyond what it starts in its NATS buffers; [--test-duplicate-results]\n"
    "              every result goes to its job's reply subject twice.\n"
    "              [--otlp-endpoint http://HOST:PORT]: export the spans of jobs that carry a\n"
    "              traceparent as OTLP/HTTP JSON (tracing.* in the config; docs/tracing.md).\n"
    "              TESTS ONLY: [--test-fake-nvml] a made-up GPU for the switchyard_gpu_*\n"
    "              series in place of NVML.\n";

const std::vector<std::string> kServeOptions = {"model",
                                                "chat-template",
                                                "config",
                                                "bind",
                                                "pull",
                                                "results",
                                                "backend",
                                                "executors",
                                                "threads",
                                                "kv-mb",
                                                "kv-dtype",
                                                "speculative",
                                                "draft-model",
                                                "grace-ms",
                                                "step-delay-ms",
                                                "kv-policy",
                                                "kv-pressure-policy",
                                                "admin-token",
                                                "curve-secret-key",
                                                "curve-public-key",
                                                "metrics",
                                                "http",
                                                "min-executors",
                                                "max-executors",
                                                "target-ongoing",
                                                "target-queue-wait-ms",
                                                "upscale-delay-ms",
                                                "downscale-delay-ms",
                                                "step-timeout-ms",
                                                "max-job-retries",
                                                "test-fault-executor-throw-after",
                                                "test-fault-executor-hang-after",
                                                "test-fault-batcher-throw-after",
                                                "test-nan-logits-token",
                                                "test-admission-stall-ms",
                                                "journal",
                                                "journal-fsync",
                                                "journal-batch-ms",
                                                "state-dir",
                                                "curve-allowed-keys",
                                                "heartbeat-ivl-ms",
                                                "heartbeat-timeout-ms",
                                                "heartbeat-ttl-ms",
                                                "handshake-timeout-ms",
                                                "max-waiting-requests",
                                                "max-connections",
                                                "max-connections-per-address",
                                                "max-handshaking",
                                                "log-level",
                                                "log-format",
                                                "nats",
                                                "node-name",
                                                "test-overfetch",
                                                "otlp-endpoint"};
const std::vector<std::string> kServeFlags = {"no-prefix-cache", "no-journal", "no-prefix-routing",
                                              "test-fake-nvml", "test-duplicate-results"};

int cmd_serve(const Args& a) {
  ServerConfig cfg;
  if (a.has("config")) load_config_file(a.str("config"), cfg);
  if (a.has("model")) cfg.model = a.str("model");
  if (a.has("draft-model")) cfg.draft_model = a.str("draft-model");
  if (a.has("chat-template")) cfg.chat_template = a.str("chat-template");
  if (!cfg.chat_template.empty()) {
    // An unreadable file or unknown name is a typo to fix before serving; a template the
    // renderer cannot parse only turns `messages` jobs away (admission says why).
    try {
      cfg.admission.chat_template = chat::load_template_text(cfg.chat_template);
    } catch (const std::runtime_error& e) {
      throw UsageError(e.what());
    }
    cfg.admission.chat_template_source = cfg.chat_template;
  }
  if (a.has("bind")) cfg.endpoints.bind = a.str("bind");
  if (a.has("pull")) cfg.endpoints.pull = a.str("pull");
  if (a.has("results")) cfg.endpoints.results = a.str("results");
  if (a.has("backend")) {
    const auto b = parse_backend(a.str("backend"));
    if (!b) throw UsageError("--backend must be auto, cpu, cuda or null");
    cfg.executors.backend = *b;
  }
  if (a.has("executors")) {
    long long n = a.integer("executors", 1);
    if (n < 1 || n > 256) throw UsageError("--executors must be in [1, 256]");
    cfg.executors.count = static_cast<int>(n);
  }
  if (a.has("threads")) {
    long long n = a.integer("threads", 0);
    if (n < 0 || n > 1024) throw UsageError("--threads must be in [0, 1024]");
    cfg.executors.threads = static_cast<int>(n);
  }
  if (a.has("kv-mb")) {
    long long n = a.integer("kv-mb", 256);
    if (n < 1) throw UsageError("--kv-mb must be at least 1");
    cfg.batching.kv_memory_mb = n;
  }
  if (a.has("kv-dtype")) {
    const auto t = kernels::parse_kv_type(a.str("kv-dtype"));
    if (!t) throw UsageError("--kv-dtype must be f32, f16 or q8_0");
    cfg.batching.kv_dtype = *t;
  }
  if (a.has("grace-ms")) {
    long long n = a.integer("grace-ms", 5000);
    if (n < 0) throw UsageError("--grace-ms must be >= 0");
    cfg.shutdown_grace_ms = n;
  }
  if (a.has("step-delay-ms")) {
    long long n = a.integer("step-delay-ms", 0);
    if (n < 0 || n > 60000) throw UsageError("--step-delay-ms must be in [0, 60000]");
    cfg.batching.step_delay_ms = static_cast<int32_t>(n);
  }
  if (a.has("kv-policy")) cfg.batching.kv_policy = a.str("kv-policy");
  if (a.has("kv-pressure-policy")) cfg.batching.kv_pressure_policy = a.str("kv-pressure-policy");
  if (a.has("admin-token")) cfg.admission.admin_token = a.str("admin-token");
  if (a.has("no-prefix-cache")) cfg.batching.prefix_cache = false;
  if (a.has("speculative")) {
    const auto m = parse_spec_mode(a.str("speculative"));
    if (!m || *m == SpecMode::server_default)
      throw UsageError("--speculative must be auto, always or off");
    cfg.batching.speculative = *m;
  }
  if (a.has("metrics")) cfg.metrics.bind = a.str("metrics");
  if (a.has("http")) cfg.http.bind = a.str("http");
  if (a.has("nats")) {
    cfg.cluster.nats.clear();
    for (const auto& v : a.all("nats")) {
      size_t from = 0;
      while (from <= v.size()) {
        const size_t to = std::min(v.find(',', from), v.size());
        const std::string url = v.substr(from, to - from);
        if (url.empty()) throw UsageError("--nats: an empty URL in '" + v + "'");
        cfg.cluster.nats.push_back(url);
        from = to + 1;
      }
    }
  }
  if (a.has("node-name")) cfg.cluster.node_name = a.str("node-name");
  if (a.has("journal")) cfg.journal.path = a.str("journal");
  if (a.has("no-journal")) {
    if (a.has("journal")) throw UsageError("--journal and --no-journal contradict each other");
    cfg.journal.path = "off";
  }
  if (a.has("state-dir")) cfg.state_dir = a.str("state-dir");
  if (cfg.state_dir.empty()) cfg.state_dir = default_state_dir();
  if (a.has("no-prefix-routing")) cfg.router.prefix_affinity = false;
  if (a.has("otlp-endpoint")) cfg.tracing.otlp_endpoint = a.str("otlp-endpoint");
  if (a.has("test-fake-nvml")) cfg.metrics.test_fake_nvml = true;
  if (a.has("curve-allowed-keys")) cfg.endpoints.curve_allowed_keys = a.str("curve-allowed-keys");
  if (a.has("journal-fsync")) {
    cfg.journal.fsync = a.str("journal-fsync");
    if (cfg.journal.fsync != "always" && cfg.journal.fsync != "batch" &&
        cfg.journal.fsync != "never")
      throw UsageError("--journal-fsync must be always, batch or never");
  }
  if (a.has("journal-batch-ms")) {
    long long n = a.integer("journal-batch-ms", 0);
    // A group commit longer than a second would hold every ack that long.
    if (n < 0 || n > 1000) throw UsageError("--journal-batch-ms must be in [0, 1000]");
    cfg.journal.batch_ms = n;
  }
  if (a.has("curve-secret-key")) cfg.endpoints.curve_secret_key = a.str("curve-secret-key");
  if (a.has("curve-public-key")) cfg.endpoints.curve_public_key = a.str("curve-public-key");
  // Elasticity and crash recovery (docs/elasticity.md). An hour bounds every delay: beyond that
  // a value is a typo, not a policy.
  auto ranged = [&](const char* name, long long lo, long long hi) {
    long long n = a.integer(name, lo);
    if (n < lo || n > hi)
      throw UsageError(std::string("--") + name + " must be in [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "]");
    return n;
  };
  if (a.has("min-executors"))
    cfg.autoscale.min_executors = static_cast<int>(ranged("min-executors", 1, 256));
  if (a.has("max-executors"))
    cfg.autoscale.max_executors = static_cast<int>(ranged("max-executors", 1, 256));
  if (a.has("target-ongoing"))
    cfg.autoscale.target_ongoing_per_executor =
        static_cast<uint32_t>(ranged("target-ongoing", 0, 1 << 20));
  if (a.has("target-queue-wait-ms"))
    cfg.autoscale.target_queue_wait_ms = ranged("target-queue-wait-ms", 0, 3600000);
  if (a.has("upscale-delay-ms"))
    cfg.autoscale.upscale_delay_ms = ranged("upscale-delay-ms", 0, 3600000);
  if (a.has("downscale-delay-ms"))
    cfg.autoscale.downscale_delay_ms = ranged("downscale-delay-ms", 0, 3600000);
  // Connection liveness (EndpointConfig): the same bounds as the config file's.
  if (a.has("heartbeat-ivl-ms"))
    cfg.endpoints.heartbeat_ivl_ms = ranged("heartbeat-ivl-ms", 0, 3600000);
  if (a.has("heartbeat-timeout-ms"))
    cfg.endpoints.heartbeat_timeout_ms = ranged("heartbeat-timeout-ms", 0, 3600000);
  if (a.has("heartbeat-ttl-ms"))
    cfg.endpoints.heartbeat_ttl_ms = ranged("heartbeat-ttl-ms", 0, 6553500);
  if (a.has("handshake-timeout-ms"))
    cfg.endpoints.handshake_timeout_ms = ranged("handshake-timeout-ms", 0, 3600000);
  if (a.has("max-waiting-requests"))
    cfg.endpoints.max_waiting_requests = ranged("max-waiting-requests", 1, INT32_MAX);
  if (a.has("max-connections"))
    cfg.endpoints.max_connections = ranged("max-connections", 0, 1 << 20);
  if (a.has("max-connections-per-address"))
    cfg.endpoints.max_connections_per_address = ranged("max-connections-per-address", 0, 1 << 20);
  if (a.has("max-handshaking"))
    cfg.endpoints.max_handshaking = ranged("max-handshaking", 0, 1 << 20);
  if (a.has("step-timeout-ms"))
    cfg.batching.step_timeout_ms = ranged("step-timeout-ms", 0, 3600000);
  if (a.has("max-job-retries"))
    cfg.batching.max_job_retries = static_cast<uint32_t>(ranged("max-job-retries", 0, 100));
  if (a.has("test-fault-executor-throw-after"))
    cfg.executors.test_fault_throw_after =
        static_cast<int>(ranged("test-fault-executor-throw-after", 1, 1 << 30));
  if (a.has("test-fault-executor-hang-after"))
    cfg.executors.test_fault_hang_after =
        static_cast<int>(ranged("test-fault-executor-hang-after", 1, 1 << 30));
  if (a.has("log-level")) {
    auto l = log::parse_level(a.str("log-level"));
    if (!l) throw UsageError("--log-level must be trace, debug, info, warn, error or off");
    cfg.log.level = *l;
  }
  if (a.has("log-format")) {
    auto f = log::parse_format(a.str("log-format"));
    if (!f) throw UsageError("--log-format must be text or json");
    cfg.log.format = *f;
  }
  // Before the first log line below.
  log::set_level(cfg.log.level);
  log::set_format(cfg.log.format);
  if (a.has("test-fault-batcher-throw-after")) {
    cfg.executors.test_fault_batcher_throw_after =
        static_cast<int>(ranged("test-fault-batcher-throw-after", 1, 1 << 30));
    log::warn("TEST ONLY: the first batcher will throw after " +
              std::to_string(cfg.executors.test_fault_batcher_throw_after) + " steps");
  }
  if (a.has("test-nan-logits-token")) {
    cfg.executors.test_nan_logits_token =
        static_cast<int>(ranged("test-nan-logits-token", 0, INT32_MAX));
    log::warn("TEST ONLY: jobs whose first step feeds token " +
              std::to_string(cfg.executors.test_nan_logits_token) + " get NaN logits");
  }
  if (a.has("test-overfetch")) {
    cfg.cluster.test_overfetch = ranged("test-overfetch", 1, 100000);
    log::warn("TEST ONLY: the cluster node keeps up to " +
              std::to_string(cfg.cluster.test_overfetch) +
              " jobs a class beyond what it starts in its NATS buffers");
  }
  if (a.has("test-duplicate-results")) {
    cfg.cluster.test_duplicate_results = true;
    log::warn("TEST ONLY: every cluster result goes to its job's reply subject twice");
  }
  if (a.has("test-admission-stall-ms")) {
    cfg.admission.test_stall_ms = static_cast<int>(ranged("test-admission-stall-ms", 1, 60000));
    log::warn("TEST ONLY: admission sleeps " + std::to_string(cfg.admission.test_stall_ms) +
              " ms before each submit");
  }
  if (cfg.executors.test_fault_throw_after > 0 || cfg.executors.test_fault_hang_after > 0)
    log::warn(std::string("TEST ONLY: the first executor will ") +
              (cfg.executors.test_fault_throw_after > 0 ? "throw" : "hang") + " after " +
              std::to_string(std::max(cfg.executors.test_fault_throw_after,
                                      cfg.executors.test_fault_hang_after)) +
              " steps");
  finalize_config(cfg);
  {
    // auto becomes cuda or cpu here, so that the log and the banner name what runs.
    std::string why;
    cfg.executors.backend = resolve_backend(cfg.executors.backend, &why);
    log::info(why);
  }
  if (cfg.executors.backend != Backend::null && cfg.model.empty()) cfg.model = demo_model_path();
  if (cfg.executors.backend == Backend::null)
    log::info(
        "backend null: no model, every token is a fixed id (overhead measurements only, the "
        "output is not text)");
  if (cfg.batching.step_delay_ms > 0)
    log::warn("TEST ONLY: every engine step sleeps " + std::to_string(cfg.batching.step_delay_ms) +
              " ms");

  // Before any thread exists, so that only the main thread ever takes SIGINT/SIGTERM.
  Server::block_signals();
  Server server(cfg);
  server.start();
  // Tests and scripts read these lines to find the bound (possibly wildcard) ports.
  if (!server.endpoint().empty())
    std::cout << "switchyard: listening on " << server.endpoint() << "\n";
  if (!server.pull_endpoint().empty())
    std::cout << "switchyard: pipeline input on " << server.pull_endpoint() << "\n";
  if (!server.results_endpoint().empty())
    std::cout << "switchyard: pipeline results on " << server.results_endpoint() << "\n";
  if (!cfg.endpoints.curve_secret_key.empty())
    std::cout << "switchyard: CURVE on every endpoint (secret key "
              << cfg.endpoints.curve_secret_key << ")\n";
  if (!server.metrics_endpoint().empty())
    std::cout << "switchyard: metrics on http://" << server.metrics_endpoint() << "\n";
  if (!server.http_endpoint().empty())
    std::cout << "switchyard: http on http://" << server.http_endpoint() << "\n";
  std::cout << "switchyard: ready (" << cfg.executors.count << " executor"
            << (cfg.executors.count > 1 ? "s" : "") << ", backend "
            << to_string(cfg.executors.backend) << ")" << std::endl;

  int sig = 0;
  // SIGUSR1 prints the counters as one JSON line on stdout (operators, integration tests).
  while ((sig = Server::wait_for_signal()) == SIGUSR1)
    std::cout << "switchyard: stats " << server.snapshot().to_json() << std::endl;
  log::info(std::string(sig == SIGINT ? "SIGINT" : "SIGTERM") + ": stopping (grace " +
            std::to_string(cfg.shutdown_grace_ms) + " ms)");
  auto snap = server.snapshot();
  server.shutdown(std::chrono::milliseconds(cfg.shutdown_grace_ms));
  log::info("stopped (" + std::to_string(snap.received) + " messages in, " +
            std::to_string(snap.sent) + " out)");
  return 0;
}

}  // namespace sy::cli
